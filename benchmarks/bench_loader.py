"""Trainer-side throughput on the shm store, against raw store reads in the
same run.

    .venv/bin/python benchmarks/bench_loader.py [--size 96] [--swap-cap 24] [--epochs 3]

Each sample is a SynthSeg-sized pair: float32 image size^3 + uint8 labels
size^3. One generation is filled once and no manager runs during the timing,
so every contender reads the same bytes. The consumer touches every byte it
receives (a sum over a uint64 view) in every contender, the baseline included.

Contenders (samples/s and GB/s of sample bytes delivered):
  raw store reads        Store.read_into a warm, reused buffer: one copy, one thread
  WireheadLoader         2 C threads assemble batches into a ring of buffers
  WireheadIterableDataset iterated in-process: one copy into a fresh buffer per sample
  DataLoader(WireheadIterableDataset, num_workers=2)
  DataLoader(MongoTupleheadDataset, num_workers=2)   a plain map-style reader
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import wirehead_torch as wt  # noqa: E402
from wirehead_torch import _C  # noqa: E402
from wirehead_torch.config import resolve, store_kwargs  # noqa: E402


def touch(*arrays):
    s = 0
    for a in arrays:
        a = np.ascontiguousarray(a)
        s += int(a.view(np.uint8)[: a.nbytes - a.nbytes % 8].view(np.uint64).sum())
    return s


def fill(cfg, size, n):
    rng = np.random.default_rng(0)
    img = rng.standard_normal((size,) * 3).astype(np.float32)
    lab = rng.integers(0, 8, (size,) * 3).astype(np.uint8)
    items = ((img + i, lab) for i in range(n))
    # SELF_SEAL off: the manager below makes the one seal
    assert wt.WireheadGenerator(items, config=dict(cfg, SELF_SEAL=False), quiet=True).run() == n
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1


def bench_raw(cfg, size, n, epochs):
    st = _C.Store(**store_kwargs(resolve(cfg)))
    gen = st.current()
    img = np.ones((size,) * 3, np.float32)
    lab = np.ones((size,) * 3, np.uint8)
    st.read_into(gen, 0, [img, lab])  # warm
    t0 = time.perf_counter()
    for _ in range(epochs):
        for pos in range(n):
            st.read_into(gen, pos, [img, lab])
            touch(img, lab)
    return n * epochs, time.perf_counter() - t0


def bench_loader(cfg, n, epochs, batch):
    ld = wt.WireheadLoader(config=cfg, batch_size=batch, num_threads=2, prefetch=2)
    for b in ld:  # warm: ring buffers allocated and faulted in
        touch(b["input"].numpy(), b["label"].numpy())
    items = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for b in ld:
            touch(b["input"].numpy(), b["label"].numpy())
            items += len(b["input"])
    dt = time.perf_counter() - t0
    ld.close()
    return items, dt


def bench_dataset_in_process(cfg, epochs):
    """WireheadIterableDataset iterated directly: the dataset's own cost
    (one read into a fresh buffer per sample), without DataLoader workers."""
    ds = wt.WireheadIterableDataset(config=cfg)
    for it in ds:
        pass
    items = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for it in ds:
            touch(it["input"].numpy(), it["label"].numpy())
            items += 1
    return items, time.perf_counter() - t0


def bench_dataloader(ds, n, epochs, batch):
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=2, persistent_workers=True,
                                     shuffle=not isinstance(ds, torch.utils.data.IterableDataset))
    for b in dl:
        pass
    items = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for b in dl:
            x, y = (b["input"], b["label"]) if isinstance(b, dict) else b
            touch(x.numpy(), y.numpy())
            items += len(x)
    return items, time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--swap-cap", type=int, default=24)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    item_bytes = a.size ** 3 * 5
    cfg = {"STORE": f"shm://bench-loader-{os.getpid()}", "SWAP_CAP": a.swap_cap,
           "SAMPLE": ["input", "label"], "BYTE_BUDGET": item_bytes * a.swap_cap + (8 << 20)}
    wt.clean(cfg)
    try:
        fill(cfg, a.size, a.swap_cap)
        rows = []
        for name, fn in [
            ("raw store reads (1 copy, warm buffer)", lambda: bench_raw(cfg, a.size, a.swap_cap, a.epochs)),
            ("WireheadLoader (2 C threads)", lambda: bench_loader(cfg, a.swap_cap, a.epochs, a.batch)),
            ("WireheadIterableDataset in-process (no DataLoader)",
             lambda: bench_dataset_in_process(cfg, a.epochs)),
            ("DataLoader(WireheadIterableDataset, num_workers=2)",
             lambda: bench_dataloader(wt.WireheadIterableDataset(config=cfg, batch_size=a.batch,
                                                                 num_workers=2),
                                      a.swap_cap, a.epochs, a.batch)),
            ("DataLoader(MongoTupleheadDataset, num_workers=2)",
             lambda: bench_dataloader(wt.MongoTupleheadDataset(config=cfg), a.swap_cap, a.epochs,
                                      a.batch)),
        ]:
            items, dt = fn()
            rows.append({"reader": name, "samples_per_s": items / dt,
                         "GB_per_s": items * item_bytes / dt / 1e9})
        base = rows[0]["GB_per_s"]
        for r in rows:
            r["vs_raw"] = r["GB_per_s"] / base
        if a.json:
            print(json.dumps({"size": a.size, "item_bytes": item_bytes, "rows": rows}))
        else:
            print(f"sample: float32 {a.size}^3 + uint8 {a.size}^3 = {item_bytes / 2**20:.2f} MiB, "
                  f"SWAP_CAP {a.swap_cap}, batch {a.batch}, {a.epochs} epochs\n")
            print("| reader | samples/s | GB/s | vs raw store reads |")
            print("|---|---:|---:|---:|")
            for r in rows:
                print(f"| {r['reader']} | {r['samples_per_s']:.1f} | {r['GB_per_s']:.2f} | "
                      f"{r['vs_raw'] * 100:.0f}% |")
    finally:
        wt.clean(cfg)


if __name__ == "__main__":
    main()
