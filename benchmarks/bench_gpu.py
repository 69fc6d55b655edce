"""GPU-direct delivery: GB/s into device tensors, and the fraction of a
training step spent waiting for data.

    .venv/bin/python benchmarks/bench_gpu.py [--side 96] [--samples 64] [--batch 8]
                                             [--reps 5] [--steps 60] [--json FILE]

Needs a CUDA GPU and a CUDA build of torch; without one it prints why and
exits 0. One shm generation of SAMPLES samples ('input' float32
(SIDE, SIDE, SIDE), 'label' int64 (SIDE, SIDE, SIDE) / 8 per side) is
filled once; every reader delivers the same bytes to the same device.

Rates (GB/s of batch bytes landed in device tensors, median over --reps
epochs, each reader's epochs interleaved with the others'):
  pinned copy       cudaMemcpyAsync of one batch's bytes from one pinned
                    buffer into a preallocated device tensor, repeated for
                    the epoch's batches: the link's ceiling in this process
  WireheadLoader    WireheadLoader(device="cuda"): C threads, a page-locked
                    ring, async copies on a side stream
  to_device         wirehead_torch.to_device(DataLoader(WireheadIterableDataset,
                    num_workers=2, batch_size=B))
  DL pin_memory     DataLoader(WireheadIterableDataset, num_workers=2,
                    batch_size=B, pin_memory=True) + .to(device, non_blocking=True)
An epoch ends with a synchronize of the current stream, so every byte has
landed. Target: WireheadLoader >= 80% of the pinned copy rate.

Data wait: a small 3D net (three Conv3d layers) trains for --steps steps
on each reader's batches; the host time blocked in next() over the loop's
wall time (after a synchronize) is the data-wait fraction. Target: < 1%
when generation keeps up (here the generation is filled, so it does).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import wirehead_torch as wt  # noqa: E402


def no_gpu_reason():
    if not torch.cuda.is_available():
        built = torch.version.cuda
        return (f"no CUDA GPU is available to torch {torch.__version__} "
                f"({'a CUDA ' + built + ' build' if built else 'a CPU-only build'}); "
                f"nothing to measure")
    try:
        wt._C.cuda_init(torch.cuda.current_device())
    except wt.CudaError as e:
        return str(e)
    return None


def fill(cfg, side, n):
    rng = np.random.default_rng(0)
    img = rng.standard_normal((side, side, side)).astype(np.float32)
    lab = rng.integers(0, 4, size=(side // 8,) * 3).astype(np.int64)
    items = ((img + i, lab + i) for i in range(n))
    assert wt.WireheadGenerator(items, config=dict(cfg, SELF_SEAL=False), quiet=True).run() == n
    assert wt.WireheadManager(config=cfg, quiet=True).run(max_swaps=1) == 1


def batch_bytes(b):
    return sum(v.numel() * v.element_size() for k, v in b.items()
               if k in ("input", "label"))


def epoch_rate(batches, dev):
    """GB/s of one epoch of `batches` (an iterator of dicts) into device memory."""
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    n = 0
    for b in batches:
        n += batch_bytes(b)
        assert b["input"].device.type == "cuda"
    torch.cuda.current_stream(dev).synchronize()
    return n / (time.perf_counter() - t0) / 1e9


def pinned_rate(nbatches, nbytes, dev):
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    side = torch.cuda.Stream(dev)
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    with torch.cuda.stream(side):
        for _ in range(nbatches):
            dst.copy_(src, non_blocking=True)
    side.synchronize()
    return nbatches * nbytes / (time.perf_counter() - t0) / 1e9


def dl_pin(cfg, batch, dev):
    ds = wt.WireheadIterableDataset(config=cfg, fields=["input", "label"], shuffle=False,
                                    batch_size=batch, num_workers=2)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=2, pin_memory=True,
                                     persistent_workers=True)

    def run():
        for b in dl:
            yield {k: b[k].to(dev, non_blocking=True) for k in ("input", "label")}
    return run


def dl_to_device(cfg, batch, dev):
    ds = wt.WireheadIterableDataset(config=cfg, fields=["input", "label"], shuffle=False,
                                    batch_size=batch, num_workers=2)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=2,
                                     persistent_workers=True)

    def run():
        return wt.to_device(dl, dev)
    return run


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv3d(1, 8, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv3d(8, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv3d(16, 4, 3, stride=4, padding=1))

    def forward(self, x):
        return self.body(x.unsqueeze(1))


def data_wait(make_iter, steps, dev):
    """(fraction of wall time blocked in next(), steps/s) over `steps` steps."""
    net = Net().to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    lossf = torch.nn.CrossEntropyLoss()
    it, done, waited = make_iter(), 0, 0.0
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    while done < steps:
        w = time.perf_counter()
        try:
            b = next(it)
        except StopIteration:
            it = make_iter()
            continue
        waited += time.perf_counter() - w
        out = net(b["input"])
        y = b["label"] % 4
        loss = lossf(out[..., :y.shape[-3], :y.shape[-2], :y.shape[-1]], y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        done += 1
    torch.cuda.synchronize(dev)
    wall = time.perf_counter() - t0
    return waited / wall, steps / wall


def describe(dev):
    p = torch.cuda.get_device_properties(dev)
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.split()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        drv = "?"
    info = wt._C.cuda_init(dev.index or 0)
    return {"device": p.name, "memory_gib": round(p.total_memory / 2**30, 1), "driver": drv,
            "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "runtime_loaded": info["lib"], "runtime_version": info["runtime_version"],
            "python": platform.python_version()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", type=int, default=96)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json")
    a = ap.parse_args()
    why = no_gpu_reason()
    if why:
        print(f"bench_gpu: skipped: {why}.\n"
              f"Run it on a machine with a CUDA GPU and a CUDA build of torch; the GPU path "
              f"is otherwise checked against the fake runtime in tests/gpu/test_cuda.py.")
        return 0
    dev = torch.device("cuda", torch.cuda.current_device())
    name = f"benchgpu-{os.getpid()}"
    per = a.side ** 3 * 4 + (a.side // 8) ** 3 * 8
    cfg = {"STORE": f"shm://{name}", "SWAP_CAP": a.samples, "SAMPLE": ["input", "label"],
           "BYTE_BUDGET": int(per * a.samples * 3.5) + (64 << 20), "READ_TIMEOUT": 60,
           "SELF_SEAL": False}
    try:
        fill(cfg, a.side, a.samples)
        loader = wt.WireheadLoader(config=cfg, batch_size=a.batch, fields=["input", "label"],
                                   shuffle=False, device=dev, num_threads=4, prefetch=3)
        readers = {"WireheadLoader": lambda: iter(loader),
                   "to_device": dl_to_device(cfg, a.batch, dev),
                   "DL pin_memory": dl_pin(cfg, a.batch, dev)}
        nb = -(-a.samples // a.batch)
        nbytes = per * a.batch
        rates = {k: [] for k in ["pinned copy", *readers]}
        for k, make in readers.items():  # warm-up: workers, pools, rings
            epoch_rate(make(), dev)
        for _ in range(a.reps):
            rates["pinned copy"].append(pinned_rate(nb, nbytes, dev))
            for k, make in readers.items():
                rates[k].append(epoch_rate(make(), dev))
        med = {k: statistics.median(v) for k, v in rates.items()}
        waits = {k: data_wait(make, a.steps, dev) for k, make in readers.items()}
        st = loader.stats()
        res = {"machine": describe(dev), "args": vars(a), "sample_bytes": per,
               "gbps": med, "vs_pinned": {k: v / med["pinned copy"] for k, v in med.items()},
               "data_wait_fraction": {k: w[0] for k, w in waits.items()},
               "steps_per_s": {k: w[1] for k, w in waits.items()},
               "loader_stats": {k: st[k] for k in ("h2d_bytes", "copy_s", "wait_s", "copies",
                                                  "stream_waits", "host_waits", "ring",
                                                  "device_buffers")}}
        print(json.dumps(res["machine"]))
        print(f"{'reader':16} {'GB/s':>7} {'vs pinned':>9} {'data wait':>9} {'steps/s':>8}")
        for k in rates:
            w = waits.get(k)
            print(f"{k:16} {med[k]:7.2f} {med[k] / med['pinned copy']:9.0%} "
                  f"{(f'{w[0]:.2%}' if w else '-'):>9} {(f'{w[1]:.1f}' if w else '-'):>8}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        loader.close()
    finally:
        wt.clean(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
