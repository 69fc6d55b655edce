"""A curriculum through the params document, measured: generator processes
make SynthSeg-like volumes whose noise level is the params' "noise"; the
trainer (this process) reads batches with WireheadLoader and raises the
noise every --step seconds with set_params. Prints, per second, how many of
the samples the trainer read were made under each params version, and how
long each version took to reach the trainer (first sample read under it,
and the first batch made entirely under it); writes the counts as JSON and
a plot.

    .venv/bin/python benchmarks/bench_params.py --seconds 40 --step 8 --out benchmarks/results/params

Nothing is asserted: tests/store/test_params.py holds the guarantees.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import wirehead_torch as wt  # noqa: E402


def run_generator(cfg, seed, size):
    """A generator process: a blob volume plus the params' noise level."""
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, size, dtype=np.float32)] * 3,
                                indexing="ij"))

    def volumes():
        while True:
            noise = float(wt.current_params().get("noise", 0.0))
            centre = rng.uniform(-0.4, 0.4, (3, 1, 1, 1)).astype(np.float32)
            label = (((grid - centre) ** 2).sum(0) < rng.uniform(0.1, 0.4)).astype(np.uint8)
            image = label.astype(np.float32) + noise * rng.standard_normal(label.shape,
                                                                             dtype=np.float32)
            yield image, label

    wt.WireheadGenerator(volumes(), config=cfg, quiet=True).run()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=40)
    p.add_argument("--step", type=float, default=8, help="seconds between noise raises")
    p.add_argument("--generators", type=int, default=2)
    p.add_argument("--size", type=int, default=32, help="volume edge (voxels)")
    p.add_argument("--swap-cap", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--out", default=None, help="folder for params.json and params.png")
    a = p.parse_args(argv)
    cfg = {"STORE": f"shm://bench-params-{os.getpid()}", "SWAP_CAP": a.swap_cap,
           "SAMPLE": ["image", "label"], "SELF_SEAL": True}
    wt.clean(cfg)
    wt.set_params({"noise": 0.0}, config=cfg)
    gens = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--generator",
                              json.dumps(cfg), str(k), str(a.size)]) for k in range(a.generators)]
    per_second = []  # [{version: samples read}] per second of the run
    set_at = {1: 0.0}  # version -> seconds into the run it was set
    first_read, first_whole = {}, {}
    try:
        loader = wt.WireheadLoader(config=cfg, batch_size=a.batch, shuffle=True, timeout=120)
        t0 = time.monotonic()
        next_step, level = a.step, 0.0
        while True:
            for batch in loader:
                now = time.monotonic() - t0
                while len(per_second) <= int(now):
                    per_second.append({})
                versions = [int(v) for v in batch["params_version"].tolist()]
                for v in versions:
                    per_second[int(now)][v] = per_second[int(now)].get(v, 0) + 1
                    first_read.setdefault(v, now)
                if len(set(versions)) == 1:
                    first_whole.setdefault(versions[0], now)
                if now >= next_step:
                    level = round(level + 0.1, 3)
                    v = wt.set_params({"noise": level}, config=cfg)
                    set_at[v] = now
                    next_step += a.step
                if now >= a.seconds:
                    break
            if time.monotonic() - t0 >= a.seconds:
                break
        loader.close()
    finally:
        for g in gens:
            g.terminate()
        for g in gens:
            g.wait(30)
        wt.clean(cfg)
    versions = sorted(set_at)
    print(f"\n{a.generators} generators of {a.size}^3 volumes, SWAP_CAP {a.swap_cap}, "
          f"batch {a.batch}; noise raised by 0.1 every {a.step:g} s\n")
    print("| version | noise | set at | first read after | first whole batch after |")
    print("|---:|---:|---:|---:|---:|")
    for v in versions:
        fr = first_read.get(v)
        fw = first_whole.get(v)
        print(f"| {v} | {(v - 1) / 10:.1f} | {set_at[v]:.1f} s | "
              + (f"{fr - set_at[v]:.2f} s" if fr is not None else "-") + " | "
              + (f"{fw - set_at[v]:.2f} s" if fw is not None else "-") + " |")
    print("\nsamples read per second, by params version:")
    print("second " + " ".join(f"{'v' + str(v):>6}" for v in versions))
    for s, counts in enumerate(per_second):
        print(f"{s:6d} " + " ".join(f"{counts.get(v, 0):>6d}" for v in versions))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "params.json"), "w") as f:
            json.dump({"command": "benchmarks/bench_params.py " + " ".join(argv or sys.argv[1:]),
                       "set_at": set_at, "first_read": first_read, "first_whole": first_whole,
                       "per_second": per_second}, f, indent=1)
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=90)
        xs = range(len(per_second))
        for v in versions:
            ax.plot(xs, [c.get(v, 0) for c in per_second], label=f"v{v} (noise {(v - 1) / 10:.1f})")
        for v in versions[1:]:
            ax.axvline(set_at[v], color="gray", lw=0.5, ls="--")
        ax.set_xlabel("seconds (dashed: set_params)")
        ax.set_ylabel("samples read per second")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "params.png"))
        print(f"\nwrote {a.out}/params.json and params.png")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--generator":
        run_generator(json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
