"""Trainer-side read paths on the shm store, each against a memcpy of the
same bytes interleaved with it repetition by repetition.

    .venv/bin/python benchmarks/bench_loader.py [--mib 8 64] [--reps 5] [--busy 0 2]
        [--json FILE] [--only TEXT ...] [--cache-fit]

A sample is one float32 field of MIB MiB ('input', shape (MIB, 512, 512))
and a 16-byte uint8 'label'. One generation is filled once and no manager
runs while timing, so every reader reads the same bytes. Each consumer
touches every byte it receives (a sum over a uint64 view), the baseline
included.

The baseline, memcpy+touch: each sample's bytes copied from the store's own
memory (a view, checked once before timing) into a warm, reused buffer, and
that buffer touched: the least a reader that hands out copies can do.
The store holds at least twice the last-level cache's bytes (SWAP_CAP
rounded up to whole batches; --cache-fit: the earlier 8 or 32 samples).
One repetition of a reader = one epoch of SWAP_CAP samples through it, with
a baseline epoch right before it; its ratio is its GB/s over that epoch's.
Reported per reader: the median over --reps repetitions of GB/s and of that
ratio, CPU seconds per GB (user + system of this process and its
DataLoader workers, from getrusage and /proc) and its ratio to the
baseline's, and minor page faults per sample.

--busy N: N busy processes (a Python spin loop each) compete for the CPUs
while the readers run; each value given is one pass over every reader
(--busy 0 2: quiet, then with two).

Readers:
  memcpy+touch, 4 batch buffers in turn
                      the baseline's work, but into batches of a ring of 4, touched
                      a batch at a time: what handing over batches costs by itself
  Store.read_into, 4 batch buffers in turn
                      the same, with each row read through the read policy (copy + XXH3
                      in one pass): what a batching reader that checks every byte costs
                      at least, in one thread
  Store.read_into     the read policy into a warm, reused buffer (copy + XXH3 in one pass)
  WireheadLoader      2 C threads assemble batches into a ring of buffers
  Store.read          the read policy's plain read into a new buffer per sample
  map-style           MongoTupleheadDataset[i] in this process
  iterable            WireheadIterableDataset iterated in this process
  DL default          DataLoader(WireheadIterableDataset, batch_size=B, num_workers=2)
  wt.DataLoader       wirehead_torch.DataLoader(WireheadIterableDataset, batch_size=B,
                      num_workers=2): the ring underneath
  DL ring             DataLoader(WireheadIterableDataset(batches=True), batch_size=None,
                      num_workers=2): the shared-memory batch ring
  DL ring, rows       the same with HANDOVER_CHECK: rows (every row re-hashed at hand-over)
  DL map-style        DataLoader(MongoTupleheadDataset, batch_size=B, num_workers=2)
  DL map-style ring   DataLoader(MongoTupleheadDataset(batches=True), batch_size=None,
                      sampler=BatchSampler(SequentialSampler, B), num_workers=2)
DataLoaders keep persistent workers; every reader runs 3 epochs before timing.
--only runs the readers whose name holds one of the texts (the baseline
always runs, interleaved with each).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import wirehead_torch as wt  # noqa: E402
from wirehead_torch import _C  # noqa: E402
from wirehead_torch.config import resolve  # noqa: E402

if os.path.exists(os.path.join(os.path.dirname(wt.__file__), "_store_args.py")):
    from wirehead_torch._store_args import store_kwargs
else:  # a tree from before config.py's split, measured by bench_revs.py
    from wirehead_torch.config import store_kwargs

_TICK = os.sysconf("SC_CLK_TCK")


def touch(*arrays):
    s = 0
    for a in arrays:
        a = np.ascontiguousarray(a)
        s += int(a.view(np.uint8)[: a.nbytes - a.nbytes % 8].view(np.uint64).sum())
    return s


def fill(cfg, mib, n):
    img = np.random.default_rng(0).standard_normal((mib, 512, 512)).astype(np.float32)
    items = ((img + i, np.full(16, i, np.uint8)) for i in range(n))
    # SELF_SEAL off: the manager below makes the one seal
    assert wt.WireheadGenerator(items, config=dict(cfg, SELF_SEAL=False), quiet=True).run() == n
    assert wt.WireheadManager(config=cfg, quiet=True).run(max_swaps=1) == 1


def usage(pids):
    """(minor faults, CPU seconds) of this process and the given children."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    flt, cpu = r.ru_minflt, r.ru_utime + r.ru_stime
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                v = f.read().rsplit(")", 1)[1].split()
            flt += int(v[7])
            cpu += (int(v[11]) + int(v[12])) / _TICK
        except OSError:
            pass
    return flt, cpu


class Memcpy:
    name = "memcpy+touch (baseline)"

    def __init__(self, cfg, mib):
        self.st = _C.Store(**store_kwargs(resolve(cfg)))
        self.gen = self.st.current()
        self.n = cfg["SWAP_CAP"]
        # the store's own bytes, checked once here
        self.views = [[np.from_dlpack(a) for a in
                       self.st.view_sample(self.gen, pos, [0, 1]).arrays] for pos in range(self.n)]
        self.bufs = [np.ones((mib, 512, 512), np.float32), np.ones(16, np.uint8)]
        self.epoch()

    def epoch(self):
        for v in self.views:
            for dst, src in zip(self.bufs, v):
                np.copyto(dst, src)
            touch(*self.bufs)
        return self.n


class InBatches:
    """A reader's work, but into the rows of batches taken in turn from a ring
    of 4 batch buffers, each touched once full, as the loaders hand them
    over: the memory a batch lands in is no longer the buffer the last sample
    just warmed. The class it is mixed into copies one row (copy_row)."""

    def __init__(self, cfg, mib, batch):
        self.batch = batch
        self.ring = [[np.ones((batch, mib, 512, 512), np.float32), np.ones((batch, 16), np.uint8)]
                     for _ in range(4)]
        super().__init__(cfg, mib)

    def epoch(self):
        for b0 in range(0, self.n, self.batch):
            bufs = self.ring[(b0 // self.batch) % len(self.ring)]
            for row, pos in enumerate(range(b0, min(b0 + self.batch, self.n))):
                self.copy_row(pos, [b[row] for b in bufs])
            touch(*bufs)
        return self.n


class MemcpyBatches(InBatches, Memcpy):
    name = "memcpy+touch, 4 batch buffers in turn"

    def copy_row(self, pos, rows):
        for dst, src in zip(rows, self.views[pos]):
            np.copyto(dst, src)


class Raw:
    name = "Store.read_into a warm buffer"

    def __init__(self, cfg, mib):
        self.st = _C.Store(**store_kwargs(resolve(cfg)))
        self.gen = self.st.current()
        self.bufs = [np.ones((mib, 512, 512), np.float32), np.ones(16, np.uint8)]
        self.n = cfg["SWAP_CAP"]
        self.epoch()

    def epoch(self):
        for pos in range(self.n):
            self.st.read_into(self.gen, pos, self.bufs)
            touch(*self.bufs)
        return self.n


class RawBatches(InBatches, Raw):
    """Store.read_into (copy and XXH3 in one pass) into batch rows: the least
    a batching reader that checks every byte can do, in one thread."""
    name = "Store.read_into, 4 batch buffers in turn"

    def copy_row(self, pos, rows):
        self.st.read_into(self.gen, pos, rows)


class StoreRead(Raw):
    name = "Store.read (new buffer per sample)"

    def epoch(self):
        for pos in range(self.n):
            touch(*(np.from_dlpack(a) for a in self.st.read(self.gen, pos)))
        return self.n


class Loader:
    name = "WireheadLoader (2 C threads)"

    def __init__(self, cfg, batch):
        self.ld = wt.WireheadLoader(config=cfg, batch_size=batch, num_threads=2, prefetch=2)
        self.epoch()

    def epoch(self):
        n = 0
        for b in self.ld:
            touch(b["input"].numpy(), b["label"].numpy())
            n += len(b["input"])
        return n


class MapStyle:
    name = "map-style: MongoTupleheadDataset[i]"

    def __init__(self, cfg):
        self.ds = wt.MongoTupleheadDataset(config=cfg)
        self.epoch()

    def epoch(self):
        for i in range(len(self.ds)):
            x, y = self.ds[i]
            touch(x.numpy(), y.numpy())
        return len(self.ds)


class InProcess:
    name = "WireheadIterableDataset in-process"

    def __init__(self, cfg):
        self.ds = wt.WireheadIterableDataset(config=cfg, shuffle=False)
        self.epoch()

    def epoch(self):
        n = 0
        for it in self.ds:
            touch(it["input"].numpy(), it["label"].numpy())
            n += 1
        return n


class DL:
    def __init__(self, name, ds, batch, sampler=None, loader=torch.utils.data.DataLoader):
        self.name = name
        self.dl = loader(ds, batch_size=batch, sampler=sampler, num_workers=2,
                         persistent_workers=True)
        self.epoch()

    @property
    def pids(self):
        it = getattr(self.dl, "_iterator", None)
        return [w.pid for w in getattr(it, "_workers", [])]

    def epoch(self):
        n = 0
        for b in self.dl:
            x, y = (b["input"], b["label"]) if isinstance(b, dict) else b
            touch(x.numpy(), y.numpy())
            n += len(x)
        return n


def timed(reader, item_bytes):
    pids = getattr(reader, "pids", [])
    f0, c0 = usage(pids)
    t0 = time.perf_counter()
    n = reader.epoch()
    dt = time.perf_counter() - t0
    f1, c1 = usage(pids)
    return {"GB_s": n * item_bytes / dt / 1e9, "faults": (f1 - f0) / n,
            "cpu_ms": (c1 - c0) * 1e3 / n, "cpu_s_GB": (c1 - c0) / (n * item_bytes / 1e9)}


_KEYS = ("GB_s", "faults", "cpu_ms", "cpu_s_GB")


def run_size(mib, reps, swap_cap, batch, only=None):
    item_bytes = mib * (1 << 20) + 16
    cfg = {"STORE": f"shm://bench-loader-{os.getpid()}", "SWAP_CAP": swap_cap,
           "SAMPLE": ["input", "label"], "BYTE_BUDGET": (item_bytes + 4096) * swap_cap + (4 << 20)}
    wt.clean(cfg)
    try:
        fill(cfg, mib, swap_cap)
        base = Memcpy(cfg, mib)

        def iterable(c=cfg, **kw):
            return wt.WireheadIterableDataset(config=c, shuffle=False, batch_size=batch,
                                              num_workers=2, **kw)
        batches = torch.utils.data.BatchSampler(
            torch.utils.data.SequentialSampler(range(swap_cap)), batch, False)
        rows_cfg = dict(cfg, HANDOVER_CHECK="rows")
        dl = {
            "DataLoader(WireheadIterableDataset, num_workers=2)":
                lambda name: DL(name, iterable(), batch),
            "wt.DataLoader(WireheadIterableDataset, batch_size=B, num_workers=2)":
                lambda name: DL(name, wt.WireheadIterableDataset(config=cfg, shuffle=False),
                                batch, loader=wt.DataLoader),
            "DataLoader(WireheadIterableDataset(batches=True), num_workers=2): ring":
                lambda name: DL(name, iterable(batches=True), None),
            "DataLoader(WireheadIterableDataset(batches=True), num_workers=2): ring, "
            "HANDOVER_CHECK rows":
                lambda name: DL(name, iterable(rows_cfg, batches=True), None),
            "DataLoader(MongoTupleheadDataset, num_workers=2)":
                lambda name: DL(name, wt.MongoTupleheadDataset(config=cfg), batch),
            "DataLoader(MongoTupleheadDataset(batches=True), BatchSampler, num_workers=2): ring":
                lambda name: DL(name, wt.MongoTupleheadDataset(config=cfg, batches=True), None,
                                sampler=batches),
        }
        makers = [(MemcpyBatches.name, lambda: MemcpyBatches(cfg, mib, batch)),
                  (RawBatches.name, lambda: RawBatches(cfg, mib, batch)),
                  (Raw.name, lambda: Raw(cfg, mib)),
                  (Loader.name, lambda: Loader(cfg, batch)),
                  (StoreRead.name, lambda: StoreRead(cfg, mib)),
                  (MapStyle.name, lambda: MapStyle(cfg)),
                  (InProcess.name, lambda: InProcess(cfg))]
        makers += [(name, lambda name=name, make=make: make(name)) for name, make in dl.items()]
        rows = []
        for name, make in makers:
            if only and not any(t.lower() in name.lower() for t in only):
                continue
            reader = make()
            for _ in range(2):  # rings and pools reach their steady state
                reader.epoch()
            got = {"base": [], "reader": []}
            for _ in range(reps):
                got["base"].append(timed(base, item_bytes))
                got["reader"].append(timed(reader, item_bytes))
            name = reader.name
            del reader
            ratios = [r["GB_s"] / b["GB_s"] for r, b in zip(got["reader"], got["base"])]
            cpu = [r["cpu_s_GB"] / b["cpu_s_GB"] for r, b in zip(got["reader"], got["base"])]
            med = {k: statistics.median(x[k] for x in got["reader"]) for k in _KEYS}
            base_med = {k: statistics.median(x[k] for x in got["base"]) for k in _KEYS}
            rows.append({"reader": name, **med, "vs_memcpy": statistics.median(ratios),
                         "cpu_vs_memcpy": statistics.median(cpu), "memcpy": base_med,
                         "ratios": ratios})
        return {"mib": mib, "item_bytes": item_bytes, "swap_cap": swap_cap, "batch": batch,
                "reps": reps, "rows": rows}
    finally:
        wt.clean(cfg)


def llc_bytes():
    """The largest CPU cache of this machine (0 where sysfs does not say)."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    for idx in os.listdir(base) if os.path.isdir(base) else ():
        try:
            with open(f"{base}/{idx}/size") as f:
                t = f.read().strip()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
        best = max(best, int(t.rstrip("KMG") or 0) * mult)
    return best


def store_samples(mib, batch):
    """Samples in the store: at least twice the last-level cache's bytes, as a
    real store is; a store that fits there makes the baseline read from cache
    while readers that write a ring evict it."""
    n = max(8, -(-2 * llc_bytes() // (mib << 20)))
    return -(-n // batch) * batch


def busy_procs(n):
    """n processes spinning on a CPU each (ended by the caller, by pid)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def table(res, busy):
    print(f"\nsample: float32 {res['mib']} MiB + 16-byte label, SWAP_CAP {res['swap_cap']}, "
          f"batch {res['batch']}, {busy} busy processes; medians of {res['reps']} interleaved "
          f"repetitions; CPU: this process + DataLoader workers\n")
    print("| reader | GB/s | ÷ memcpy+touch | CPU s/GB | CPU ÷ memcpy's | faults/sample |")
    print("|---|---:|---:|---:|---:|---:|")
    m = {k: statistics.median(r["memcpy"][k] for r in res["rows"]) for k in _KEYS}
    print(f"| memcpy+touch (baseline) | {m['GB_s']:.2f} | 1.00 | {m['cpu_s_GB']:.3f} | 1.00 | "
          f"{m['faults']:.0f} |")
    for r in res["rows"]:
        print(f"| {r['reader']} | {r['GB_s']:.2f} | {r['vs_memcpy']:.2f} | {r['cpu_s_GB']:.3f} | "
              f"{r['cpu_vs_memcpy']:.2f} | {r['faults']:.0f} |", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mib", type=int, nargs="+", default=[8, 64])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--only", nargs="+", metavar="TEXT",
                   help="only the readers whose name holds one of these texts")
    p.add_argument("--busy", type=int, nargs="+", default=[0], metavar="N",
                   help="competing busy processes; one pass per value (default: 0)")
    p.add_argument("--cache-fit", action="store_true",
                   help="the earlier sizing (8 samples of 32 MiB or more, else 32), "
                        "which lets a small store sit in a large last-level cache")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for busy in a.busy:
        procs = busy_procs(busy)
        try:
            for mib in a.mib:
                batch = 2 if mib >= 32 else 4
                if a.cache_fit:
                    swap_cap = 8 if mib >= 32 else 32
                else:
                    swap_cap = store_samples(mib, batch)
                res = run_size(mib, a.reps, swap_cap, batch, a.only)
                res["busy"] = busy
                results.append(res)
                table(res, busy)
        finally:
            for pr in procs:
                pr.kill()
                pr.wait()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": "benchmarks/bench_loader.py " + " ".join(argv or sys.argv[1:]),
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
