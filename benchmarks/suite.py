"""The benchmark suite: one command locally (`make bench`) and on a cluster
(`sbatch slurm/bench.sbatch`), the same outputs.

    .venv/bin/python benchmarks/suite.py [--name NAME] [--out-root benchmarks/results]
        [--max-generators N] [--seconds S] [--train-seconds T] [--size 32]
        [--parts scaling,training,store[,mongo]]

Parts (each a separate set of processes on a fresh shm store, started and
stopped here by pid):
  scaling   1, 2, 4, ... N generator processes of the SynthSeg-like
            generator (`wirehead-torch generate`) with a manager for S
            seconds: samples/s put into the store against N x the rate of
            one generator.
  training  the demo's 3D U-Net (`wirehead-torch train`) for T seconds,
            fed by 1, 2, ... N generators through the cache, against the
            baseline that generates each batch inline in the training loop:
            trainer samples/s, the fraction of each step spent waiting for
            data, GPU utilisation through NVML (pynvml, with a GPU), reuse
            (samples trained on per distinct sample) over time.
  store     benchmarks/bench_store.c --quick (shm store vs memcpy).
  mongo     benchmarks/bench_mongo.py, short (MongoDB store vs raw libmongoc;
            --with-original adds the original wirehead, fetched by pip).

Writes OUT_ROOT/NAME/: results.json, results.md (the tables), scaling.png,
training.png, reuse.png. Progress goes to stderr.
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PARTS = ("scaling", "training", "store", "mongo")


def say(msg):
    print(f"[suite {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def counts(n):
    """1, 2, 4, ... up to n, and n itself."""
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return out + [n]


def cli(*args):
    return [sys.executable, "-m", "wirehead_torch.apps.cli", *map(str, args)]


class Feed:
    """A manager and `procs` generator processes on a fresh shm store."""

    def __init__(self, work, procs, size, seconds, swap_cap, nice=0):
        self.cfg = os.path.join(work, f"cfg-{uuid.uuid4().hex[:8]}.yaml")
        sample = size ** 3 * 5 + 4096
        with open(self.cfg, "w") as f:
            f.write(f"STORE: shm://whbench-{os.getpid()}-{uuid.uuid4().hex[:8]}\n"
                    f"SWAP_CAP: {swap_cap}\nSAMPLE: [input, label]\n"
                    f"BYTE_BUDGET: {sample * (swap_cap + 2 * procs + 8)}\n")
        pre = ["nice", "-n", str(nice)] if nice else []
        # output to files: a pipe nobody reads while training would block them
        self.log = self.cfg[:-5] + ".log"
        with open(self.log + ".mgr", "w") as mlog, open(self.log, "w") as glog:
            self.mgr = subprocess.Popen(cli("manager", "--config", self.cfg, "--seconds",
                                            seconds + 5),
                                        stdout=subprocess.DEVNULL, stderr=mlog)
            self.gen = subprocess.Popen(pre + cli("generate", "--config", self.cfg, "--procs",
                                                  procs, "--seconds", seconds, "--size", size),
                                        stdout=glog, stderr=subprocess.STDOUT)

    def finish(self, timeout):
        """Waits for the generators' own end; returns their output."""
        self.gen.wait(timeout)
        self.mgr.terminate()
        self.mgr.wait(30)
        subprocess.run(cli("clean", "--config", self.cfg), capture_output=True)
        with open(self.log) as f:
            out = f.read()
        if self.gen.returncode != 0:
            raise RuntimeError(f"generators exited {self.gen.returncode}: {out[-2000:]}")
        return out

    def kill(self):
        for p in (self.gen, self.mgr):
            if p.poll() is None:
                p.kill()
                p.wait()


_PUSHED = re.compile(r"pushed (\d+) samples in ([\d.]+)s \(([\d.]+)/s\), (\d+) accepted")


def part_scaling(a, work):
    rows = []
    for n in counts(a.max_generators):
        say(f"scaling: {n} generator process(es), {a.seconds:g}s")
        feed = Feed(work, n, a.size, a.seconds, a.swap_cap)
        try:
            out = feed.finish(a.seconds + 120)
        finally:
            feed.kill()
        per = [(int(p), float(t), int(acc)) for p, t, _r, acc in _PUSHED.findall(out)]
        if len(per) != n:
            raise RuntimeError(f"scaling: {len(per)} of {n} generators reported: {out[-2000:]}")
        rate = sum(p / t for p, t, _ in per)
        accepted = sum(acc / t for _p, t, acc in per)
        rows.append({"generators": n, "samples_per_s": round(rate, 2),
                     "accepted_per_s": round(accepted, 2)})
        say(f"scaling: {n} -> {rate:.1f} samples/s")
    one = rows[0]["samples_per_s"]
    for r in rows:
        r["ideal_per_s"] = round(one * r["generators"], 2)
        r["speedup"] = round(r["samples_per_s"] / one, 2) if one else None
        r["efficiency"] = round(r["samples_per_s"] / r["ideal_per_s"], 3) if one else None
    return rows


def _train_record(out_dir):
    with open(os.path.join(out_dir, "train.rank0.json")) as f:
        return json.load(f)


def _train_summary(rec, label, generators):
    items = [it for ep in rec["epochs"] for it in ep if not it[2]]
    secs = rec["seconds"]
    # The first batch waits for start-up (the first sealed generation, the
    # first inline batch): reported apart from the steady state after it.
    steady = secs - rec["step_t"][0]
    waited = sum(rec["step_wait"][1:])
    row = {"mode": label, "generators": generators, "steps": rec["steps"],
           "samples_per_s": round(rec["samples"] / secs, 2),
           "first_batch_s": round(rec["step_wait"][0], 2),
           "data_wait_pct": round(100.0 * waited / steady, 1) if steady > 0 else None,
           "gpu_util_pct": None if rec.get("gpu_util") is None else round(rec["gpu_util"], 1)}
    if rec["inline"]:
        row["reuse"] = 1.0
        row["reuse_over_time"] = []
        return row
    seen, curve, k, next_t = set(), [], 0, 1.0
    for t, ep_items in _steps_items(rec):
        k += len(ep_items)
        seen.update((g, p) for g, p, _ in ep_items)
        if t >= next_t or t == rec["step_t"][-1]:
            curve.append([round(t, 2), round(k / len(seen), 3)])
            next_t = t + 1.0
    row["reuse"] = round(len(items) / len({(g, p) for g, p, _ in items}), 3) if items else None
    row["reuse_over_time"] = curve
    return row


def _steps_items(rec):
    """(time, real items) per step, in order."""
    flat = [it for ep in rec["epochs"] for it in ep]
    per = len(flat) // max(rec["recorded_steps"], 1)
    for i, t in enumerate(rec["step_t"]):
        yield t, [it for it in flat[i * per:(i + 1) * per] if not it[2]]


def part_training(a, work):
    rows = []
    common = ["--seconds", a.train_seconds, "--batch-size", a.batch_size, "--threads",
              a.train_threads]
    out = os.path.join(work, "inline")
    say(f"training: inline baseline (generation in the loop), {a.train_seconds:g}s")
    subprocess.run(cli("train", "--inline", "--size", a.size, "--out", out, *common), check=True,
                   stdout=subprocess.DEVNULL)
    rows.append(_train_summary(_train_record(out), "inline", 0))
    say(f"training: inline -> {rows[-1]['samples_per_s']} samples/s, "
        f"waiting {rows[-1]['data_wait_pct']}%")
    for n in counts(a.max_generators):
        say(f"training: wirehead with {n} generator(s) (nice {a.gen_nice}), "
            f"{a.train_seconds:g}s")
        out = os.path.join(work, f"wh{n}")
        # the generators outlive the trainer's start-up and first-generation wait
        feed = Feed(work, n, a.size, a.train_seconds + 60, a.swap_cap, nice=a.gen_nice)
        try:
            subprocess.run(cli("train", "--config", feed.cfg, "--out", out, *common), check=True,
                           stdout=subprocess.DEVNULL)
            feed.gen.terminate()
            feed.finish(120)
        finally:
            feed.kill()
        rows.append(_train_summary(_train_record(out), "wirehead", n))
        say(f"training: {n} generator(s) -> {rows[-1]['samples_per_s']} samples/s, "
            f"waiting {rows[-1]['data_wait_pct']}%, reuse {rows[-1]['reuse']}")
    return rows


def part_store(a, work):
    say("store: bench_store --quick (shm store vs memcpy)")
    r = subprocess.run(["make", "-s", "-f", "benchmarks/bench.mk", "bench-store",
                        "BENCH_STORE_ARGS=--quick"], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"bench-store failed: {r.stderr[-2000:]}")
    rows = []
    for line in r.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[2].replace(".", "", 1).isdigit():
            rows.append({"sample": cells[0], "operation": cells[1], "GB_s": float(cells[2]),
                         "vs": cells[3]})
    return {"rows": rows, "text": r.stdout}


def part_mongo(a, work):
    say("mongo: bench_mongo.py (1 rep, 1 and 8 MiB, 32 MiB of payload)")
    md = os.path.join(work, "mongo.md")
    args = [sys.executable, os.path.join(HERE, "bench_mongo.py"), "--reps", "1", "--sizes",
            "1,8", "--total-mib", "32", "--out", md]
    if not a.with_original:
        args.append("--no-original")
    subprocess.run(args, check=True, cwd=REPO, stdout=sys.stderr)
    with open(md) as f:
        return {"text": f.read()}


# --------------------------------------------------------------------------
# outputs


def table(rows, cols):
    head = "| " + " | ".join(h for h, _ in cols) + " |"
    rule = "|" + "|".join("---:" for _ in cols) + "|"
    body = ["| " + " | ".join("-" if r.get(k) is None else str(r[k]) for _, k in cols) + " |"
            for r in rows]
    return "\n".join([head, rule] + body)


def write_markdown(res, path):
    lines = [f"# Benchmark run {res['name']}", "",
             f"{res['machine']}; {res['command']}", ""]
    if "scaling" in res:
        lines += ["## Generator scaling (SynthSeg-like generator, "
                  f"{res['settings']['size']}^3, into the shm store)", "",
                  table(res["scaling"], [("generators", "generators"),
                                         ("samples/s", "samples_per_s"),
                                         ("N x one generator", "ideal_per_s"),
                                         ("speed-up", "speedup"),
                                         ("efficiency", "efficiency"),
                                         ("accepted/s", "accepted_per_s")]), ""]
    if "training" in res:
        lines += ["## Training: wirehead against inline generation", "",
                  table(res["training"], [("mode", "mode"), ("generators", "generators"),
                                          ("steps", "steps"), ("samples/s", "samples_per_s"),
                                          ("first batch s", "first_batch_s"),
                                          ("data wait % after it", "data_wait_pct"),
                                          ("GPU util %", "gpu_util_pct"),
                                          ("reuse", "reuse")]), ""]
    if "store" in res:
        lines += ["## shm store (bench_store --quick)", "", res["store"]["text"].strip(), ""]
    if "mongo" in res:
        body = [x for x in res["mongo"]["text"].strip().splitlines() if not x.startswith("# ")]
        lines += ["## MongoDB store (bench_mongo.py, short)", ""] + body + [""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def plot(res, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = []
    if res.get("scaling"):
        rows = res["scaling"]
        n = [r["generators"] for r in rows]
        fig, ax = plt.subplots(figsize=(5, 3.5), dpi=90)
        ax.plot(n, [r["samples_per_s"] for r in rows], "o-", label="measured")
        ax.plot(n, [r["ideal_per_s"] for r in rows], "--", color="gray",
                label="N x one generator")
        ax.set_xlabel("generator processes")
        ax.set_ylabel("samples/s into the store")
        ax.set_title("Generator scaling")
        ax.set_xticks(n)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, "scaling.png"))
        plt.close(fig)
        made.append("scaling.png")
    if res.get("training"):
        rows = res["training"]
        base = [r for r in rows if r["mode"] == "inline"]
        wh = [r for r in rows if r["mode"] == "wirehead"]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5), dpi=90)
        n = [r["generators"] for r in wh]
        a1.plot(n, [r["samples_per_s"] for r in wh], "o-", label="wirehead")
        a2.plot(n, [r["data_wait_pct"] for r in wh], "o-", label="wirehead")
        if base:
            a1.axhline(base[0]["samples_per_s"], ls="--", color="C3", label="inline generation")
            a2.axhline(base[0]["data_wait_pct"], ls="--", color="C3", label="inline generation")
        a1.set_ylabel("trainer samples/s")
        a2.set_ylabel("% of step time waiting for data\n(after the first batch)")
        for ax in (a1, a2):
            ax.set_xlabel("generator processes")
            ax.set_xticks(n)
            ax.legend()
        fig.suptitle("Training with wirehead against inline generation")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "training.png"))
        plt.close(fig)
        fig, ax = plt.subplots(figsize=(5, 3.5), dpi=90)
        for r in wh:
            c = r["reuse_over_time"]
            ax.plot([x for x, _ in c], [y for _, y in c], label=f"{r['generators']} generator(s)")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("samples trained / distinct samples")
        ax.set_title("Reuse over time")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, "reuse.png"))
        plt.close(fig)
        made += ["training.png", "reuse.png"]
    return made


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", default=None, help="results folder name (default local-<time>)")
    p.add_argument("--out-root", default=os.path.join(HERE, "results"))
    p.add_argument("--parts", default="scaling,training,store")
    p.add_argument("--max-generators", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seconds", type=float, default=10.0, help="per scaling point")
    p.add_argument("--train-seconds", type=float, default=15.0, help="per training run")
    p.add_argument("--size", type=int, default=32, help="volume edge of the generator")
    p.add_argument("--swap-cap", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--train-threads", type=int, default=1, help="torch threads of the trainer")
    p.add_argument("--gen-nice", type=int, default=10,
                   help="niceness of the generators while training shares their node")
    p.add_argument("--with-original", action="store_true", help="mongo: the original wirehead too")
    a = p.parse_args(argv)
    parts = [x for x in a.parts.split(",") if x]
    bad = [x for x in parts if x not in PARTS]
    if bad or a.max_generators < 1:
        p.error(f"unknown parts {bad}" if bad else "--max-generators must be >= 1")
    name = a.name or time.strftime("local-%Y%m%d-%H%M%S")
    out = os.path.join(a.out_root, name)
    os.makedirs(out, exist_ok=True)
    res = {"name": name, "command": "benchmarks/suite.py " + " ".join(sys.argv[1:] if argv is None
                                                                      else argv),
           "machine": f"{platform.node()}, {os.cpu_count()} CPUs, Python "
                      f"{platform.python_version()}"
                      + (f", SLURM job {os.environ['SLURM_JOB_ID']} on "
                         f"{os.environ.get('SLURMD_NODENAME')}"
                         if os.environ.get("SLURM_JOB_ID") else ""),
           "settings": {k: v for k, v in vars(a).items() if k not in ("name", "out_root")},
           "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wh-suite-") as work:
        for part in parts:
            res[part] = globals()[f"part_{part}"](a, work)
            with open(os.path.join(out, "results.json"), "w") as f:
                json.dump(res, f, indent=1)  # partial results survive a later failure
    res["seconds"] = round(time.monotonic() - t0, 1)
    res["plots"] = plot(res, out)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    write_markdown(res, os.path.join(out, "results.md"))
    say(f"done in {res['seconds']:.0f}s: {out}/results.json, results.md, "
        + ", ".join(res["plots"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
