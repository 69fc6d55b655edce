"""GPU-direct delivery: GB/s into device tensors against the link, training
steps/s against a resident-batch ceiling, and host CPU per GB delivered.

    .venv/bin/python benchmarks/bench_gpu.py [--side 96] [--samples 64] [--batch 8]
                                             [--reps 5] [--steps 60] [--json FILE]

Needs a CUDA GPU and a CUDA build of torch; without one it prints why and
exits 0. One shm generation of SAMPLES samples ('input' float32
(SIDE, SIDE, SIDE), 'label' int64 (SIDE, SIDE, SIDE) / 8 per side) is
filled once; every reader delivers the same bytes to the same device.
Sizes used for the published figures: --side 96 (3.5 MB), 160 (16 MB),
256 --batch 2 (64 MiB); each run takes well under a minute and a half.

Per reader:
  GB/s, vs pinned   batch bytes landed in device tensors (median over --reps
                    repetitions, readers interleaved, each repetition epochs
                    back to back for RATE_MIN_S), over batch-sized pinned
                    cudaMemcpyAsync measured the same way in the same run
                    (the link's ceiling in this process)
  steps/s, vs ceil  a three-Conv3d net trained for --steps steps on the
                    reader's batches, over the same net on one batch kept
                    resident on the device (the ceiling: no data movement)
  CPU s/GB          host CPU seconds (this process and its DataLoader
                    workers, user + system) per GB delivered, over the
                    rate epochs
  path              WireheadLoader: stats()["path"], wt.DataLoader: the
                    to_device iterator's stats()["path"] (registered:
                    copied from the store's or the ring slot's registered
                    mapping; staged: through page-locked memory); the
                    torch DataLoader readers are staged
Readers: WireheadLoader(device) on its default path, WireheadLoader with
WIREHEAD_GPU_DIRECT_MIN_ROW=off (the staged path, for comparison),
to_device(wt.DataLoader(WireheadIterableDataset, num_workers=4)),
to_device(DataLoader(WireheadIterableDataset, num_workers=2)), and
DataLoader(pin_memory=True) + .to(device, non_blocking=True).
Targets: WireheadLoader >= 0.9 of pinned at 16 MB and 64 MiB, >= 0.8 at
3.5 MB; training >= 0.97 of the ceiling; <= 0.05 CPU s/GB registered.
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


RATE_MIN_S = 0.5  # epochs back to back until this long: a steady rate, not one epoch's start


def epoch_rate(make, dev):
    """GB/s into device memory of whole epochs of make() (an iterator of
    dicts per epoch), run back to back for at least RATE_MIN_S, as a trainer
    reads the current generation epoch after epoch."""
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    n = 0
    while True:
        for b in make():
            n += batch_bytes(b)
            assert b["input"].device.type == "cuda"
        torch.cuda.current_stream(dev).synchronize()
        if time.perf_counter() - t0 >= RATE_MIN_S:
            return n / (time.perf_counter() - t0) / 1e9, n


def pinned_rate(nbatches, nbytes, dev):
    """GB/s of batch-sized cudaMemcpyAsync from page-locked memory, epochs of
    nbatches back to back for RATE_MIN_S, as epoch_rate measures readers."""
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    side = torch.cuda.Stream(dev)
    torch.cuda.synchronize(dev)
    t0, n = time.perf_counter(), 0
    while True:
        with torch.cuda.stream(side):
            for _ in range(nbatches):
                dst.copy_(src, non_blocking=True)
        side.synchronize()
        n += nbatches * nbytes
        if time.perf_counter() - t0 >= RATE_MIN_S:
            return n / (time.perf_counter() - t0) / 1e9


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


def wt_dl_to_device(cfg, batch, dev):
    """to_device(wt.DataLoader): straight from the ring's slots; run.last is
    the last epoch's iterator (its stats() say which path ran)."""
    ds = wt.WireheadIterableDataset(config=cfg, fields=["input", "label"], shuffle=False)
    dl = wt.DataLoader(ds, batch_size=batch, num_workers=4, persistent_workers=True)

    def run():
        run.last = wt.to_device(dl, dev)
        return run.last
    run.last = None
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


WARM_STEPS = 5  # untimed, before every training measurement (the ceiling's too)


def data_wait(make_iter, steps, dev):
    """(host time blocked in next() over wall time, steps/s) over `steps`
    steps; only steps/s is reported (the host blocks there while the GPU is
    the bound too, so the first is no measure of the GPU waiting)."""
    net = Net().to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    lossf = torch.nn.CrossEntropyLoss()
    it, done, waited = make_iter(), -WARM_STEPS, 0.0
    t0 = None
    while done < steps:
        if done == 0:  # kernels chosen, memory pooled: the same start for every reader
            torch.cuda.synchronize(dev)
            t0, waited = time.perf_counter(), 0.0
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


def cpu_seconds():
    """User + system CPU seconds of this process and its live children
    (DataLoader workers are not reaped while persistent)."""
    t = os.times()
    total = t.user + t.system
    me, tick = str(os.getpid()), os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if st[1] == me:  # ppid
            total += (int(st[11]) + int(st[12])) / tick
    return total


def resident_ceiling(make_iter, steps, dev):
    """steps/s of the same net on one batch already on the device."""
    b = next(make_iter())
    b = {k: v.clone() for k, v in b.items() if k in ("input", "label")}
    return data_wait(lambda: iter([b] * (steps + WARM_STEPS)), steps, dev)[1]


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
        os.environ["WIREHEAD_GPU_DIRECT_MIN_ROW"] = "off"  # read when the C loader is made
        staged = wt.WireheadLoader(config=cfg, batch_size=a.batch, fields=["input", "label"],
                                   shuffle=False, device=dev, num_threads=4, prefetch=3)
        staged._loader()
        del os.environ["WIREHEAD_GPU_DIRECT_MIN_ROW"]
        readers = {"WireheadLoader": lambda: iter(loader),
                   "WL staged": lambda: iter(staged),
                   "wt.DataLoader": wt_dl_to_device(cfg, a.batch, dev),
                   "to_device": dl_to_device(cfg, a.batch, dev),
                   "DL pin_memory": dl_pin(cfg, a.batch, dev)}
        nb = -(-a.samples // a.batch)
        nbytes = per * a.batch
        rates = {k: [] for k in ["pinned copy", *readers]}
        for k, make in readers.items():  # warm-up: workers, pools, rings
            epoch_rate(make, dev)
        cpu = {k: 0.0 for k in readers}
        moved = {k: 0 for k in readers}
        for _ in range(a.reps):
            rates["pinned copy"].append(pinned_rate(nb, nbytes, dev))
            for k, make in readers.items():
                c0 = cpu_seconds()
                rate, n = epoch_rate(make, dev)
                rates[k].append(rate)
                cpu[k] += cpu_seconds() - c0
                moved[k] += n
        med = {k: statistics.median(v) for k, v in rates.items()}
        ceiling = resident_ceiling(readers["WireheadLoader"], a.steps, dev)
        steps = {k: data_wait(make, a.steps, dev)[1] for k, make in readers.items()}
        paths = {"WireheadLoader": loader.stats()["path"], "WL staged": staged.stats()["path"],
                 "wt.DataLoader": readers["wt.DataLoader"].last.stats()["path"],
                 "to_device": "staged", "DL pin_memory": "staged"}
        cpu_gb = {k: cpu[k] / (moved[k] / 1e9) for k in readers}
        st = loader.stats()
        res = {"machine": describe(dev), "args": vars(a), "sample_bytes": per,
               "gbps": med, "vs_pinned": {k: v / med["pinned copy"] for k, v in med.items()},
               "steps_per_s": steps, "resident_steps_per_s": ceiling,
               "vs_resident": {k: v / ceiling for k, v in steps.items()},
               "cpu_s_per_gb": cpu_gb, "path": paths,
               "loader_stats": {k: st[k] for k in ("h2d_bytes", "copy_s", "wait_s", "copies",
                                                  "stream_waits", "host_waits", "ring",
                                                  "device_buffers", "path", "host_copy_bytes",
                                                  "registrations", "staged_why")}}
        print(json.dumps(res["machine"]))
        print(f"resident-batch ceiling: {ceiling:.1f} steps/s")
        print(f"{'reader':16} {'GB/s':>7} {'vs pinned':>9} {'steps/s':>8} {'vs ceil':>7} "
              f"{'CPU s/GB':>8} path")
        for k in rates:
            s_ = steps.get(k)
            print(f"{k:16} {med[k]:7.2f} {med[k] / med['pinned copy']:9.2f} "
                  f"{(f'{s_:.1f}' if s_ else '-'):>8} {(f'{s_ / ceiling:.2f}' if s_ else '-'):>7} "
                  f"{(f'{cpu_gb[k]:.3f}' if k in cpu_gb else '-'):>8} {paths.get(k, '-')}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        loader.close()
        staged.close()
    finally:
        wt.clean(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
