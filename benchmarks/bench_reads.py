"""In-process sample reads on the shm store against raw warm reads, at 4 and
64 MiB samples, interleaved repetition by repetition.

    .venv/bin/python benchmarks/bench_reads.py [--sizes 4,64] [--reps 5] [--swap-cap 4]

Each sample is one float32 field of SIZE MiB plus an int64 label. Every
reader's consumer touches every byte it receives (a sum over a uint64
view), the baseline included. Readers:
  raw        Store.read_into one warm numpy buffer (one copy, nothing allocated)
  read       Store.read: a pooled buffer per sample, handed out as a tensor
  map        MongoTupleheadDataset[i] (the same read through the map-style reader)
  views      MongoTupleheadDataset(views=True)[i]: tensors viewing the store (no copy)
For each size and repetition every reader reads the whole generation (as
many passes as make 512 MiB) in a rotating order; the table gives medians over the repetitions of GB/s,
the ratio to raw in the same repetition, CPU-ms and minor faults per sample.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import wirehead_torch as wt  # noqa: E402
from wirehead_torch import _C  # noqa: E402
from wirehead_torch._store_args import store_kwargs  # noqa: E402
from wirehead_torch.config import resolve  # noqa: E402


def touch(x):
    a = x.numpy() if isinstance(x, torch.Tensor) else x
    return int(a.reshape(-1).view(np.uint64).sum())


def fill(cfg, mib, n):
    elems = mib * (1 << 20) // 4
    base = np.arange(elems, dtype=np.float32)
    items = ((base + i, np.array([i], dtype=np.int64)) for i in range(n))
    # SELF_SEAL off: the manager below makes the one seal
    assert wt.WireheadGenerator(items, config=dict(cfg, SELF_SEAL=False), quiet=True).run() == n
    assert wt.WireheadManager(config=cfg, quiet=True).run(max_swaps=1) == 1


def readers(cfg, st, gen, mib, n):
    elems = mib * (1 << 20) // 4
    xbuf = np.empty(elems, dtype=np.float32)
    ybuf = np.empty(1, dtype=np.int64)
    xbuf.fill(0)  # warm
    ds = wt.MongoTupleheadDataset(config=cfg)
    dv = wt.MongoTupleheadDataset(config=cfg, views=True)

    def raw(i):
        st.read_into(gen, i, [xbuf, ybuf])
        return touch(xbuf)

    def read(i):
        x, _ = st.read(gen, i)
        return touch(torch.from_dlpack(x))

    def mapstyle(i):
        x, _ = ds[i]
        return touch(x)

    def views(i):
        x, _ = dv[i]
        return touch(x)

    return {"raw": raw, "read": read, "map": mapstyle, "views": views}


def measure(fn, n, passes):
    ru0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
    for i in range(n * passes):
        fn(i % n)
    t, c, ru = time.perf_counter() - t0, time.process_time() - c0, resource.getrusage(resource.RUSAGE_SELF)
    return t, c, ru.ru_minflt - ru0.ru_minflt


def run_size(mib, reps, n, tag):
    name = f"benchreads-{os.getpid()}-{tag}"
    cfg = {"STORE": f"shm://{name}", "SWAP_CAP": n, "SAMPLE": ["x", "y"],
           "BYTE_BUDGET": str(n * (mib * (1 << 20) + 8192)), "READ_TIMEOUT": 60}
    wt.clean(cfg)
    try:
        fill(cfg, mib, n)
        st = _C.Store(**store_kwargs(resolve(cfg)))
        gen = st.current()
        rs = readers(cfg, st, gen, mib, n)
        passes = max(1, -(-512 // (n * mib)))  # at least 512 MiB per measurement
        for fn in rs.values():  # warm: first touches of the store, pools filled
            measure(fn, n, 1)
        names = list(rs)
        res = {k: [] for k in names}
        for rep in range(reps):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for k in order:
                res[k].append(measure(rs[k], n, passes))
        n *= passes  # samples per measurement
        nbytes = n * mib * (1 << 20)
        out = {}
        for k in names:
            gbs = [nbytes / t / 1e9 for t, _, _ in res[k]]
            ratio = [res["raw"][r][0] / res[k][r][0] for r in range(reps)]
            out[k] = {"gb_s": statistics.median(gbs), "vs_raw": statistics.median(ratio),
                      "cpu_ms_per_sample": statistics.median(c for _, c, _ in res[k]) * 1e3 / n,
                      "minflt_per_sample": statistics.median(f for _, _, f in res[k]) / n}
        st.close()
        return out
    finally:
        wt.clean(cfg)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4,64", help="sample sizes in MiB")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--swap-cap", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    allres = {}
    for mib in (int(s) for s in a.sizes.split(",")):
        allres[mib] = r = run_size(mib, a.reps, a.swap_cap, mib)
        if not a.json:
            print(f"{mib} MiB samples, median of {a.reps} interleaved reps, SWAP_CAP={a.swap_cap}")
            print(f"  {'reader':8} {'GB/s':>7} {'vs raw':>7} {'CPU-ms/sample':>14} {'minflt/sample':>14}")
            for k, v in r.items():
                print(f"  {k:8} {v['gb_s']:7.2f} {v['vs_raw']:7.0%} {v['cpu_ms_per_sample']:14.1f} "
                      f"{v['minflt_per_sample']:14.1f}")
    if a.json:
        print(json.dumps(allres))


if __name__ == "__main__":
    main()
