"""The node-local tier (docs/relay.md): MongoDB bytes per generation with
and without a relay, and a rank's read throughput from the relay's copy
against reads of an ordinary shm store and of MongoDB itself.

    .venv/bin/python benchmarks/bench_relay.py [--uri mongodb://HOST:PORT]
        [--ranks 4] [--swap-cap 16] [--sample-mib 4] [--reps 5]
        [--out benchmarks/results_relay.json]

Against one server (the in-memory test server, started here, unless --uri
names another), one generation of SWAP_CAP samples of --sample-mib MiB
(64 MiB at the defaults) is sealed in MongoDB, and the same samples in a
plain shm:// store. Then, in one process:

  bytes       the client's copy counters (wirehead_torch._C.counters(),
              bytes copied out of a store) while --ranks store handles each
              read the whole generation from MongoDB (no tier: every rank
              pulls it), and while a relay copies it once into the node's
              local store (the tier: the ranks then read local memory)
  pull        the relay's time to copy the generation and seal it locally
  read GB/s   one handle reading every position (Store.read into fresh
              arrays, checksums verified) of: the relay's local copy, the
              plain shm store (the baseline), and MongoDB; interleaved
              repetition by repetition, medians of --reps
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "helpers"))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

import wirehead_torch as wt  # noqa: E402
from wirehead_torch import _C  # noqa: E402
from wirehead_torch._arrays import to_store_arrays  # noqa: E402

import whlib  # noqa: E402


def _fill(store, swap_cap, floats):
    """One sealed generation of swap_cap samples."""
    assert store.lead()
    rng = np.random.default_rng(0)
    for i in range(swap_cap):
        data = rng.random(floats, dtype=np.float32)
        status, _ = store.put(to_store_arrays((np.array([i, 0], np.int64), data), ("id", "data")))
        assert status == 0, status
    info = store.seal()
    assert info and info.get("generation"), info
    return info["generation"]


def _read_all(store, gen, swap_cap):
    t0 = time.perf_counter()
    n = 0
    for pos in range(swap_cap):
        arrs = store.read(gen, pos)
        n += sum(np.from_dlpack(a).nbytes for a in arrs)
        del arrs
    return n, time.perf_counter() - t0


def _copied():
    return _C.counters()["bytes_copied_out"]


def run(uri, ranks, swap_cap, sample_mib, reps):
    floats = sample_mib * (1 << 20) // 4
    base = {"SWAP_CAP": swap_cap, "SAMPLE": ["id", "data"], "LEASE_SECONDS": 30,
            "SELF_SEAL": False, "CONNECT_TIMEOUT": 10, "READ_TIMEOUT": 60}
    mcfg = dict(base, STORE=f"{uri}/{whlib.unique_name('whbench')}",
                LOCAL_CACHE=f"shm://{whlib.unique_name('whbench-local')}")
    scfg = dict(base, STORE=f"shm://{whlib.unique_name('whbench-shm')}",
                BYTE_BUDGET=(swap_cap * sample_mib * 5 // 4 + 2) << 20)
    mongo, plain = whlib.open_store(mcfg), whlib.open_store(scfg)
    relay = None
    try:
        gen = _fill(mongo, swap_cap, floats)
        _fill(plain, swap_cap, floats)
        plain_gen = plain.current()
        # no tier: every rank pulls the generation from MongoDB
        before = _copied()
        handles = [whlib.open_store(dict(mcfg, LOCAL_CACHE=None)) for _ in range(ranks)]
        for h in handles:
            _read_all(h, gen, swap_cap)
            h.close()
        direct_bytes = _copied() - before
        # the tier: the relay pulls it once
        relay = wt.WireheadRelay(config=mcfg)
        before = _copied()
        info = relay.step()
        relay_bytes = _copied() - before
        assert info["generation"] == gen
        local = relay._dst.get()
        rows = {"local copy": [], "plain shm": [], "mongodb": []}
        for _ in range(reps):  # interleaved
            for name, st, g in (("local copy", local, gen), ("plain shm", plain, plain_gen),
                                ("mongodb", mongo, gen)):
                n, dt = _read_all(st, g, swap_cap)
                rows[name].append(n / dt / 1e9)
        med = {k: statistics.median(v) for k, v in rows.items()}
        return {
            "ranks": ranks, "swap_cap": swap_cap, "sample_mib": sample_mib, "reps": reps,
            "generation_mib": swap_cap * sample_mib,
            "mongo_bytes_per_generation": {"no tier": direct_bytes, "tier": relay_bytes},
            "pull_s": info["pull_s"], "pulled_bytes": info["bytes"],
            "read_gbps_median": med, "read_gbps_all": rows,
            "local_vs_plain_shm": med["local copy"] / med["plain shm"],
        }
    finally:
        if relay is not None:
            relay.close()
        mongo.close()
        plain.close()
        wt.clean(mcfg)
        wt.clean(scfg)
        try:
            os.unlink(f"/dev/shm/wirehead-relay.{mcfg['LOCAL_CACHE'][6:]}.lock")
        except FileNotFoundError:
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", default=None)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--swap-cap", type=int, default=16)
    ap.add_argument("--sample-mib", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.uri:
        res = run(a.uri, a.ranks, a.swap_cap, a.sample_mib, a.reps)
    else:
        from mongo_server import MongoTestServer
        with MongoTestServer() as srv:
            res = run(srv.uri, a.ranks, a.swap_cap, a.sample_mib, a.reps)
    b = res["mongo_bytes_per_generation"]
    print(f"generation: {res['swap_cap']} x {res['sample_mib']} MiB; {res['ranks']} ranks")
    print(f"MongoDB bytes per generation: no tier {b['no tier'] / 2**20:.1f} MiB, "
          f"tier {b['tier'] / 2**20:.1f} MiB ({b['no tier'] / b['tier']:.1f}x less)")
    print(f"relay pull + seal: {res['pull_s']:.3f}s")
    for k, v in res["read_gbps_median"].items():
        print(f"read {k:<11} {v:6.2f} GB/s (median of {res['reps']})")
    print(f"local copy vs plain shm: {res['local_vs_plain_shm'] * 100:.0f}%")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
