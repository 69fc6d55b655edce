"""Soak test: 3 generators, a manager, a corrupter and one verifying reader
of each kind on one store for SOAK_SECONDS (default 300). Every sample
carries (generator, counter, seed); each reader recomputes its bytes from the
seed and counts wrong ones. The corrupter flips a data byte of one sample of
the write generation every CORRUPT_EVERY seconds (shm only), so every reader
meets corrupt samples (skipped as padding, or for an indexed read a
CorruptSampleError it counts) besides generations reclaimed under it.
Readers: the C loader (WireheadLoader), map-style copies and views,
WireheadIterableDataset in-process (copies and views) and under DataLoader
workers. Prints verified/wrong counts and each process's RSS over time (every
SOAK_RSS_EVERY seconds, default 60) with its start, end and peak; exits
non-zero if any sample was wrong or a process died.

    make soak                       # shm store, 5 minutes
    SOAK_SECONDS=60 SOAK_STORE=mongodb://127.0.0.1:27017/soak make soak
    SOAK_DATA_BYTES=4194304 SOAK_SWAP_CAP=16 python benchmarks/soak.py   # 4 MiB samples
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

N_GENERATORS = 3
DATA_BYTES = int(os.environ.get("SOAK_DATA_BYTES", str(16 << 10)))
RSS_TICK = 5.0
CORRUPT_EVERY = 0.2
PY_READERS = ["map", "map_views", "iterable", "iterable_views", "dataloader"]


def seed_of(gid, counter):
    return (gid * 1_000_003 + counter * 7919 + 17) & 0x7FFFFFFF


def content(seed):
    return np.random.default_rng(seed).integers(0, 256, DATA_BYTES, dtype=np.uint8)


def run_generator(cfg, gid):
    import wirehead_torch as wt

    def samples():
        counter = 0
        while True:
            seed = seed_of(gid, counter)
            yield np.array([gid, counter, seed], np.int64), content(seed)
            counter += 1

    print(f"generator {gid}: wrote {wt.WireheadGenerator(samples(), config=cfg, quiet=True).run()}",
          flush=True)


def run_manager(cfg):
    import wirehead_torch as wt
    print(f"manager: {wt.WireheadManager(config=cfg, quiet=True).run()} swaps", flush=True)


def run_reader(cfg):
    """Reads every epoch with the C loader and checks every byte; prints a
    JSON summary on SIGTERM."""
    import wirehead_torch as wt
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    res = {"verified": 0, "wrong": 0, "pad_rows": 0, "epochs": 0, "generations": 0,
           "per_generator": [0] * N_GENERATORS}
    gens = set()
    loader = wt.WireheadLoader(config=cfg, batch_size=16, num_threads=2, timeout=120)
    print("reader: started", flush=True)
    while not stop:
        for batch in loader:
            ids, data = batch["id"].numpy(), batch["data"].numpy()
            for row, pad, gen in zip(range(len(ids)), batch["is_pad"].tolist(),
                                     batch["generation"].tolist()):
                gid, counter, seed = (int(x) for x in ids[row])
                ok = (0 <= gid < N_GENERATORS and seed == seed_of(gid, counter)
                      and np.array_equal(data[row], content(seed)))
                if not ok:
                    res["wrong"] += 1
                elif pad:
                    res["pad_rows"] += 1
                else:
                    res["verified"] += 1
                    res["per_generator"][gid] += 1
                gens.add(gen)
            if stop:
                break
        res["epochs"] += 1
    res["generations"] = len(gens)
    loader.close()
    print("reader: " + json.dumps(res), flush=True)


def sample_ok(ident, data):
    gid, counter, seed = (int(x) for x in ident)
    return (0 <= gid < N_GENERATORS and seed == seed_of(gid, counter)
            and np.array_equal(np.asarray(data), content(seed))), gid


def one_flip(ident, data):
    """Whether data is its sample with exactly one bit flipped, as the
    corrupter flips it (rather than another sample's bytes)."""
    gid, counter, seed = (int(x) for x in ident)
    if not (0 <= gid < N_GENERATORS and seed == seed_of(gid, counter)):
        return False
    diff = np.flatnonzero(np.asarray(data) != content(seed))
    return len(diff) == 1 and (int(np.asarray(data)[diff[0]]) ^ int(content(seed)[diff[0]])) == 1


def run_py_reader(cfg, kind):
    """One Python reader of `kind` reading and checking every byte until
    SIGTERM; prints a JSON summary. Map-style readers index random
    positions (a corrupt one is a counted CorruptSampleError) and, like a
    training step, keep the last item until the next."""
    import logging

    import torch

    import wirehead_torch as wt
    # each skip is logged; the summary counts them instead
    logging.getLogger("wirehead_torch").setLevel(logging.ERROR)
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    res = {"verified": 0, "wrong": 0, "pad_rows": 0, "corrupt_errors": 0, "epochs": 0}
    if kind.endswith("_views"):
        res["flipped_after_check"] = 0
    rng = np.random.default_rng(os.getpid())

    def check(ident, data, pad=False):
        ok, _ = sample_ok(ident.numpy(), data.numpy())
        key = "pad_rows" if ok and pad else "verified" if ok else "wrong"
        if not ok and kind.endswith("_views") and one_flip(ident.numpy(), data.numpy()):
            # a view shows the segment's bytes as they are now: the corrupter
            # lost the race with a seal and flipped a sample already checked
            key = "flipped_after_check"
        res[key] += 1

    print(f"{kind}: started", flush=True)
    if kind in ("map", "map_views"):
        ds = wt.MongoTupleheadDataset(config=cfg, views=kind == "map_views", timeout=120)
        held = None
        while not stop:
            try:
                x, y = ds[int(rng.integers(cfg["SWAP_CAP"]))]
            except wt.CorruptSampleError:
                res["corrupt_errors"] += 1
                continue
            check(x, y)
            held = (x, y)
        del held
    else:
        ds = wt.WireheadIterableDataset(config=cfg, views=kind == "iterable_views", timeout=120)
        it = (torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
              if kind == "dataloader" else ds)
        while not stop:
            for item in it:
                check(item["id"], item["data"], bool(item["is_pad"]))
                if stop:
                    break
            res["epochs"] += 1
    print(f"{kind}: " + json.dumps(res), flush=True)


def run_corrupter(cfg):
    """Flips one data byte of a committed sample of the write generation
    every CORRUPT_EVERY seconds until SIGTERM (shm only). The generation is
    checked again just before the flip, but a seal can still come in
    between: then a sealed sample a view reader has already checked shows
    the flip (counted apart as flipped_after_check, not as wrong)."""
    import mmap

    from wirehead_torch import _C
    from wirehead_torch._store_args import store_kwargs
    from wirehead_torch.config import resolve
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    st = _C.Store(**store_kwargs(resolve(cfg)))
    path = f"/dev/shm/wirehead.{cfg['STORE'][len('shm://'):]}"
    flips = 0
    print("corrupter: started", flush=True)
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        words = np.frombuffer(mm, dtype="<u4")
        rng = np.random.default_rng(1)
        while not stop:
            time.sleep(CORRUPT_EVERY)
            s = st.status()
            starts = np.flatnonzero(words[::16] == 0x31534857) * 64  # sample magic, 64-aligned
            mine = [a for a in starts.tolist() if a + 64 <= len(mm) and
                    int.from_bytes(mm[a + 40:a + 48], "little") == s["write_gen"]]
            if not mine:
                continue
            a = mine[int(rng.integers(len(mine)))]
            total = int.from_bytes(mm[a + 16:a + 24], "little")
            at = a + total - DATA_BYTES // 2  # inside the data field
            # the scan above is slow: a seal may have come meanwhile
            if st.status()["write_gen"] != s["write_gen"]:
                continue
            if total > DATA_BYTES and at < len(mm):
                mm[at] ^= 0x01
                flips += 1
        del words
        mm.close()
    print(f"corrupter: {flips} flips", flush=True)


def rss_kib(pid):
    """(VmRSS, RssAnon) in KiB; RssAnon leaves out the mapped store pages."""
    got = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":")[0]
                if key in ("VmRSS", "RssAnon"):
                    got[key] = int(line.split()[1])
    except OSError:
        return None
    return (got["VmRSS"], got["RssAnon"]) if len(got) == 2 else None


def mib(kib):
    return "-" if kib is None else f"{kib / 1024:.0f}"


def main():
    seconds = float(os.environ.get("SOAK_SECONDS", "300"))
    rss_every = float(os.environ.get("SOAK_RSS_EVERY", "60"))
    store = os.environ.get("SOAK_STORE") or f"shm://soak-{os.getpid()}"
    swap_cap = int(os.environ.get("SOAK_SWAP_CAP", "256"))
    budget = max(32 << 20, int(swap_cap * (DATA_BYTES + 4096) * 1.5))
    cfg = {"STORE": store, "SWAP_CAP": swap_cap, "SAMPLE": ["id", "data"],
           "BYTE_BUDGET": budget, "READ_TIMEOUT": 120, "LEASE_SECONDS": 5}
    import wirehead_torch as wt
    wt.clean(cfg)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def spawn(*args):
        return subprocess.Popen([sys.executable, os.path.abspath(__file__), *args,
                                 json.dumps(cfg)], env=env, stdout=subprocess.PIPE, text=True)

    procs = {"manager": spawn("manager")}
    for g in range(N_GENERATORS):
        procs[f"generator{g}"] = spawn("generator", str(g))
    readers = ["reader"] + [k for k in PY_READERS
                            if store.startswith("shm://") or "views" not in k]
    for name in readers:
        procs[name] = spawn(*(["reader"] if name == "reader" else ["py_reader", name]))
        assert procs[name].stdout.readline().startswith(f"{name}: started")
    if store.startswith("shm://"):
        procs["corrupter"] = spawn("corrupter")
        assert procs["corrupter"].stdout.readline().startswith("corrupter: started")
    t0 = time.monotonic()
    rss = {name: [] for name in procs}  # (seconds, (VmRSS, RssAnon) or None)
    died = []
    while time.monotonic() - t0 < seconds and not died:
        now = time.monotonic() - t0
        for name, p in procs.items():
            rss[name].append((now, rss_kib(p.pid)))
            if p.poll() is not None:
                died.append(f"{name} exited with {p.returncode}")
        time.sleep(min(RSS_TICK, max(0.0, seconds - (time.monotonic() - t0))))
    for name, p in procs.items():
        rss[name].append((time.monotonic() - t0, rss_kib(p.pid)))
    elapsed = time.monotonic() - t0
    order = readers + ["manager"] + [f"generator{g}" for g in range(N_GENERATORS)]
    order += ["corrupter"] if "corrupter" in procs else []
    outs = {}
    for name in order:  # readers first: they report before the writers stop
        p = procs[name]
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            outs[name] = p.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            outs[name] = p.communicate()[0]
            died.append(f"{name} did not stop on SIGTERM")
    wt.clean(cfg)
    results = {}
    for name in readers:
        for line in outs[name].splitlines():
            if line.startswith(f"{name}: {{"):
                results[name] = json.loads(line[len(name) + 2:])
    print(f"soak: {elapsed:.0f} s on {store}, SWAP_CAP {cfg['SWAP_CAP']}, "
          f"{N_GENERATORS} generators, {DATA_BYTES} B samples"
          + (f", a corrupt sample every {CORRUPT_EVERY} s" if "corrupter" in procs else ""))
    marks = [k * rss_every for k in range(1, int(elapsed // rss_every) + 1)]
    print(f"  RSS in MiB (VmRSS) at start (warmed up), every {rss_every:g} s, end; peak")
    for name in order:
        tail = [line for line in outs[name].splitlines() if not line.startswith(f"{name}: {{")]
        series = [(t, r) for t, r in rss[name] if r is not None]
        if not series:
            print(f"  {name:14s} no RSS  {' '.join(tail)}")
            continue
        start = series[min(1, len(series) - 1)][1]  # warmed up
        at_marks = [next((r for t, r in series if t >= m), series[-1][1]) for m in marks]
        peak = max(r[0] for _, r in series)
        line = " ".join(mib(r[0]) for r in [start] + at_marks[:-1] + [series[-1][1]])
        print(f"  {name:14s} {line}; peak {mib(peak)} (anon start {mib(start[1])}, end "
              f"{mib(series[-1][1][1])})  {' '.join(tail)}")
    wrong = 0
    for name in readers:
        print(f"  {name}: {json.dumps(results.get(name))}")
        res = results.get(name)
        if res is None or res["wrong"] or not res["verified"]:
            died.append(f"{name}: {'no summary' if res is None else 'wrong or no samples'}")
        else:
            wrong += res["wrong"]
    for d in died:
        print(f"  FAILED: {d}")
    if died:
        print("soak: FAILED")
        return 1
    total = sum(results[n]["verified"] for n in readers)
    print(f"soak: OK, {total} samples verified, {wrong} wrong")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] != "main":
        role, args, cfg = sys.argv[1], sys.argv[2:-1], json.loads(sys.argv[-1])
        {"generator": lambda: run_generator(cfg, int(args[0])),
         "manager": lambda: run_manager(cfg),
         "reader": lambda: run_reader(cfg),
         "py_reader": lambda: run_py_reader(cfg, args[0]),
         "corrupter": lambda: run_corrupter(cfg)}[role]()
    else:
        sys.exit(main())
