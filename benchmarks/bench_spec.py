"""Spec mode (docs/reproducible.md) against the default (freshest) mode, with
the same generators:

- overhead: the store's cost per sample of a claim and a put at a position,
  against a plain put, on shm and on the MongoDB test server (the two
  interleaved, medians of --reps rounds of --n samples each);
- keepup: the trainer's rate (WireheadLoader batches per second) when
  generators keep up, spec mode (REUSE epochs per generation) against the
  freshest mode, interleaved, medians of --reps rounds;
- slow: the trainer's wait when generators cannot keep up: generators that
  take --slow-ms per sample, and the trainer's seconds waiting per epoch
  (stats()["spec_wait_s"]) against what the generators' rate predicts.

    .venv/bin/python benchmarks/bench_spec.py --out benchmarks/results_spec.json

Nothing is asserted: tests/store/test_spec_*.py and tests/spec/
hold the guarantees.
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests", "helpers"))
import wirehead_torch as wt  # noqa: E402
from wirehead_torch import _C  # noqa: E402
from wirehead_torch._store_args import store_kwargs  # noqa: E402
from wirehead_torch.config import resolve  # noqa: E402


def _cfg(store, cap, spec, **extra):
    cfg = {"STORE": store, "SWAP_CAP": cap, "SAMPLE": ["x"], "READ_TIMEOUT": 120,
           "CONNECT_TIMEOUT": 10, **extra}
    if spec:
        cfg["RUN_SEED"] = 1
    return cfg


def _overhead_round(store_uri, n, nbytes, spec):
    """Seconds per sample of n puts (spec: claim + put at the position)."""
    cfg = resolve(_cfg(store_uri, n, spec, BYTE_BUDGET=max(4096, 2 * n * (nbytes + 4096))
                       if store_uri.startswith("shm://") else "auto"))
    wt.clean(cfg)
    st = _C.Store(**store_kwargs(cfg))
    arrays = [(np.zeros(nbytes, np.uint8), _C.DTYPES["uint8"])]
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            if spec:
                _, claim = _C.spec_claim(st, lease_s=30, max_attempts=3)
                _C.spec_put(st, claim, arrays)
            else:
                st.put(arrays)
        return (time.perf_counter() - t0) / n
    finally:
        st.close()
        wt.clean(cfg)


def overhead(a, mongo_uri):
    out = {}
    stores = [("shm", lambda k: f"shm://bench-spec-{os.getpid()}-{k}")]
    if mongo_uri:
        stores.append(("mongo", lambda k: f"{mongo_uri}/bench_spec_{os.getpid()}_{k}"))
    for name, uri in stores:
        for nbytes in (1024, 4 << 20):
            n = a.n if nbytes < 65536 else max(8, a.n // 16)
            plain, spec = [], []
            for r in range(a.reps):  # interleaved: the same drift on both sides
                plain.append(_overhead_round(uri(f"p{r}"), n, nbytes, False))
                spec.append(_overhead_round(uri(f"s{r}"), n, nbytes, True))
            row = {"plain_us": statistics.median(plain) * 1e6,
                   "spec_us": statistics.median(spec) * 1e6}
            row["claim_us"] = row["spec_us"] - row["plain_us"]
            out[f"{name} {nbytes}B"] = row
            print(f"overhead {name} {nbytes:>8} B: put {row['plain_us']:8.1f} us, claim+put "
                  f"{row['spec_us']:8.1f} us (claim {row['claim_us']:+.1f} us)", flush=True)
    return out


def _generator(cfg, size, slow_ms, seed):
    rng = np.random.default_rng(seed)
    # the same pool in every generator: fn(spec) is a function of the spec alone
    pool = [np.random.default_rng(k).random((size,), dtype=np.float32) for k in range(8)]
    if cfg.get("RUN_SEED") is not None:
        def fn(spec):
            if slow_ms:
                time.sleep(slow_ms / 1000)
            return (pool[spec.index % len(pool)],)
        wt.WireheadGenerator(fn, config=cfg, quiet=True).run()
    else:
        def items():
            while True:
                if slow_ms:
                    time.sleep(slow_ms / 1000)
                yield (pool[int(rng.integers(len(pool)))],)
        wt.WireheadGenerator(items(), config=cfg, quiet=True).run()


def _train(cfg, a, epochs, slow_ms=0):
    """(batches per second over the epochs, seconds waited per epoch)."""
    gens = [mp.Process(target=_generator, args=(cfg, a.size, slow_ms, k))
            for k in range(a.generators)]
    for p in gens:
        p.start()
    try:
        loader = wt.WireheadLoader(config=cfg, batch_size=a.batch, timeout=120)
        for _ in loader:  # the first generation, before the clock starts
            break
        t0, batches = time.perf_counter(), 0
        for _ in range(epochs):
            for b in loader:
                batches += 1
                del b
        took = time.perf_counter() - t0
        wait = loader.stats().get("spec_wait_s", 0.0)
        loader.close()
        return batches / took, wait / epochs
    finally:
        for p in gens:
            p.terminate()
        for p in gens:
            p.join()
        wt.clean(cfg)


def keepup(a):
    fresh, spec = [], []
    for r in range(a.reps):
        store = f"shm://bench-spec-k-{os.getpid()}-{r}"
        fresh.append(_train(_cfg(store + "f", a.swap_cap, False), a, a.epochs)[0])
        spec.append(_train(_cfg(store + "s", a.swap_cap, True, REUSE=a.reuse), a, a.epochs)[0])
    row = {"freshest_bps": statistics.median(fresh), "spec_bps": statistics.median(spec)}
    row["ratio"] = row["spec_bps"] / row["freshest_bps"]
    print(f"keepup: freshest {row['freshest_bps']:.1f} batches/s, spec {row['spec_bps']:.1f} "
          f"batches/s: {row['ratio']:.3f}x", flush=True)
    return row


def slow(a):
    cfg = _cfg(f"shm://bench-spec-w-{os.getpid()}", a.swap_cap, True, REUSE=1)
    bps, wait = _train(cfg, a, 4, slow_ms=a.slow_ms)
    made = a.swap_cap * a.slow_ms / 1000 / a.generators  # seconds to make one generation
    row = {"slow_ms": a.slow_ms, "wait_s_per_epoch": wait, "generation_s": made,
           "bps": bps}
    print(f"slow: generators make a generation in {made:.2f} s; the trainer waited "
          f"{wait:.2f} s per epoch", flush=True)
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="overhead,keepup,slow")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--n", type=int, default=256, help="samples per overhead round")
    p.add_argument("--generators", type=int, default=2)
    p.add_argument("--size", type=int, default=1 << 20, help="float32 values per sample")
    p.add_argument("--swap-cap", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--reuse", type=int, default=4)
    p.add_argument("--slow-ms", type=float, default=100)
    p.add_argument("--no-mongo", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    parts = a.parts.split(",")
    res = {"args": vars(a)}
    if "overhead" in parts:
        if a.no_mongo:
            res["overhead"] = overhead(a, None)
        else:
            from mongo_server import MongoTestServer
            with MongoTestServer() as srv:
                res["overhead"] = overhead(a, srv.uri)
    if "keepup" in parts:
        res["keepup"] = keepup(a)
    if "slow" in parts:
        res["slow"] = slow(a)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
