"""Entry points for batch jobs (the SLURM scripts in slurm/ call these).

    wirehead-torch generate --config C [--gen-module synth|MODULE:FUNC] [--procs N]
                            [--seconds T] [--seed S] [--size 32] [--labels 8]
                            [--quiet | --verbose]
    wirehead-torch generate --config C --shards PATTERN... [--loop] [--procs N] [--seed S]
                            [--quiet | --verbose]
    wirehead-torch export   --config C --out DIR [--generations N | --samples N]
                            [--shard-size 1GiB] [--timeout S]
    wirehead-torch train    --config C [--seconds T] [--inline] [--out DIR] ...

`generate` runs N generator processes of one generator function and exits 0
when they end: after --seconds, on SIGTERM/SIGINT (SLURM pre-emption: each
finishes its current sample first), or when the generator is exhausted.
MODULE:FUNC names a function returning an iterable of tuples (one array per
SAMPLE name); it is called with seed=... when it takes a `seed` argument.

`train` is one training rank of the demo's 3D U-Net (under torchrun with
WORLD_SIZE > 1: gloo on CPU, NCCL on GPU). Rank 0's clock ends every rank
at the same step after --seconds (or at a SIGTERM on any rank); each rank
then closes its loader and process group and, with --out, writes
DIR/train.rank<R>.json: steps, samples and data wait in total, and for the
first --record-steps steps each step's time, data wait, loss and items
[generation, position, is_pad] by epoch. --inline generates each batch in
the training loop instead of reading the cache (the benchmark baseline).
"""
import argparse
import functools
import importlib
import inspect
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from .. import _C
from .._files import write_file
from .._order import MAX_WORLD, env_int
from ._args import MAX_BATCH, MAX_PROCS, MAX_SIZE, integer, number, seconds, seed

__all__ = ["load_generator", "parser", "run"]

# How long after --seconds a generator's last put may still wait for room.
_PUT_GRACE_S = 5.0
# train --record-steps: a recorded step keeps a few numbers and its batch's
# items, so the record grows with it.
MAX_RECORD_STEPS = 10 ** 7


# --------------------------------------------------------------------------
# generate


def _gen_function(spec):
    """The function --gen-module names ("module:function"), imported: a
    module that is missing or fails to import is a ValueError naming it."""
    mod, sep, fn = spec.partition(":")
    if not sep or not mod or not fn:
        raise ValueError(f"--gen-module must be 'synth' or 'module:function', got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a user's module next to the job script
    try:
        module = importlib.import_module(mod)
    except ImportError as e:
        raise ValueError(f"--gen-module {spec!r}: cannot import {mod}: {e} (the module must "
                         f"be importable from {os.getcwd()} or the Python path)") from None
    func = getattr(module, fn, None)
    if not callable(func):
        raise ValueError(f"--gen-module {spec!r}: {mod} has no function {fn!r}")
    return func


def load_spec_function(spec, size=32, labels=8):
    """Spec mode (RUN_SEED, docs/reproducible.md): the function of a
    wt.Spec named by spec: "synth" (a SynthSeg-like sample seeded by the
    spec's seed) or "module:function", called as function(spec)."""
    if spec == "synth":
        from .synth import synth_sample
        return functools.partial(_synth_of_spec, synth_sample, size, labels)
    return _gen_function(spec)


def _synth_of_spec(make, size, labels, spec):
    return make(spec.seed, size=size, n_labels=labels)


def load_generator(spec, seed=None, size=32, labels=8):
    """The iterable named by spec: "synth" (the SynthSeg-like generator) or
    "module:function"."""
    if spec == "synth":
        from .synth import synth_generator
        return synth_generator(size=size, n_labels=labels, seed=seed)
    func = _gen_function(spec)
    try:
        takes_seed = "seed" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        takes_seed = False
    return func(seed=seed) if takes_seed else func()


def _until(deadline, items):
    """items until time.monotonic() passes deadline (None: no end)."""
    for item in items:
        yield item
        if deadline is not None and time.monotonic() >= deadline:
            return


def _generate_one(a):
    """One generator process. Every line it says starts with its name,
    ``generator N`` (N: --index), its errors too."""
    name = f"generator {a.index}"
    try:
        return _run_generator(a, name)
    except (ValueError, _C.WireheadError, TimeoutError, RuntimeError) as e:
        print(f"{name}: {e}", file=sys.stderr, flush=True)
        return 2


def _run_generator(a, name):
    from ..generator import WireheadGenerator
    seed = None if a.seed is None else a.seed + a.index
    spec = _check_spec_options(a)
    deadline = None if a.seconds is None else time.monotonic() + a.seconds
    if a.shards:
        from ..shards import expand_urls, from_shards
        # N processes read every N-th shard each, so no sample goes in twice
        mine = expand_urls(a.shards)[a.index % a.procs_total::a.procs_total]
        if not mine:
            raise ValueError(f"--shards {' '.join(a.shards)}: no shard left for process "
                             f"{a.index} of {a.procs_total}; use fewer --procs")
        source = from_shards(mine, shuffle=seed is not None, seed=seed or 0, loop=a.loop,
                             config_path=a.config)
    elif spec:
        source = load_spec_function(a.gen_module or "synth", a.size, a.labels)
    else:
        source = load_generator(a.gen_module or "synth", seed, a.size, a.labels)
    # a spec function is called by the generator (stopped at --seconds below)
    gen = WireheadGenerator(source if spec else _until(deadline, source), config_path=a.config,
                            quiet=a.quiet, verbose=a.verbose, name=name)
    if a.seconds is not None:
        # a put waiting for room (no manager left to seal) must not keep the
        # job past its end either
        t = threading.Timer(a.seconds + (0 if spec else _PUT_GRACE_S), gen.stop)
        t.daemon = True
        t.start()
    if a.shards:
        what = (f"shards {' '.join(a.shards)}, "
                + (f"shuffled with seed {seed}" if seed is not None else "in order"))
    elif gen.spec is not None:
        what = (f"{a.gen_module or 'synth'} of each spec, RUN_SEED "
                f"{gen.cfg['RUN_SEED']}")
    else:
        what = (f"{a.gen_module or 'synth'}, "
                + (f"seed {seed}" if seed is not None else "a fresh random seed"))
    print(f"{name}: started (pid {os.getpid()}, {what})", flush=True)
    t0 = time.monotonic()
    n = gen.run()
    dt = time.monotonic() - t0
    gen.close()
    print(f"{name}: pushed {n} samples in {dt:.1f}s ({n / max(dt, 1e-9):.2f}/s), "
          f"{gen.accepted} accepted, {gen.discarded} surplus", flush=True)
    return 0


def _check_spec_options(a):
    """Whether the config puts its store in spec mode (RUN_SEED); there,
    --seed and --shards are refused, naming the option."""
    from ..config import get_config
    if get_config(a.config)["RUN_SEED"] is None:
        return False
    bad = "--shards" if a.shards else "--seed" if a.seed is not None else None
    if bad:
        raise ValueError(f"{bad}: the config has RUN_SEED (spec mode, docs/reproducible.md): "
                         f"each sample is made by a function of its wt.Spec (--gen-module "
                         f"M:F), seeded by the spec's seed; leave {bad} out")
    return True


def _check_shards(patterns, procs):
    """Every shard --shards names exists, and there is one for each of
    --procs processes: said before anything is put."""
    from ..shards import expand_urls
    paths = expand_urls(patterns)
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ValueError(f"--shards: {len(missing)} of {len(paths)} shards do not exist: "
                         f"{', '.join(missing[:5])}{more}")
    if procs > len(paths):
        raise ValueError(f"--procs {procs} but --shards names {len(paths)} shards: each "
                         f"process reads whole shards; use --procs {len(paths)} or fewer")


def _generate(a, argv):
    if a.procs == 1:
        return _generate_one(a)
    # N children of this command; SIGTERM/SIGINT is passed on to each, which
    # finishes its sample and exits 0.
    base = [sys.executable, "-m", "wirehead_torch.apps.cli", "generate"]
    rest = _drop_opt(argv, "--procs") + ["--procs", "1", "--procs-total", str(a.procs)]
    kids = [subprocess.Popen(base + rest + ["--index", str(a.index + i)])
            for i in range(a.procs)]

    def forward(signum, _frame):
        for k in kids:
            if k.poll() is None:
                k.send_signal(signum)
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [k.wait() for k in kids]
    bad = [c for c in codes if c != 0]
    print(f"wirehead-torch generate: {a.procs} processes ended, exit codes {codes}",
          flush=True)
    return 1 if bad else 0


def _drop_opt(argv, name):
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x == name:
            skip = True
        elif not x.startswith(name + "="):
            out.append(x)
    return out


# --------------------------------------------------------------------------
# train


def _inline_batches(size, labels, batch_size, seed):
    """The baseline: samples generated in the training loop itself."""
    import numpy as np
    import torch

    from .synth import synth_generator
    gen = synth_generator(size=size, n_labels=labels, seed=seed)
    while True:
        xs, ys = zip(*(next(gen) for _ in range(batch_size)))
        yield {"input": torch.from_numpy(np.stack(xs)), "label": torch.from_numpy(np.stack(ys)),
               "is_pad": torch.zeros(batch_size, dtype=torch.bool),
               "generation": torch.full((batch_size,), -1, dtype=torch.int64),
               "position": torch.full((batch_size,), -1, dtype=torch.int64)}


class _GpuSampler:
    """GPU utilisation (%) through NVML every 0.2 s, when pynvml and a GPU
    are there; otherwise samples stays empty."""

    def __init__(self):
        self.samples = []
        self._stop = threading.Event()
        try:
            import pynvml
            pynvml.nvmlInit()
            idx = env_int("LOCAL_RANK", 0, MAX_PROCS - 1, 0)
            self._h = pynvml.nvmlDeviceGetHandleByIndex(idx)
            self._nvml = pynvml
        except Exception:
            self._nvml = None
            return
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self._stop.wait(0.2):
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._h).gpu)

    def close(self):
        self._stop.set()
        return (sum(self.samples) / len(self.samples)) if self.samples else None


def _train(a):
    import torch
    import torch.distributed as dist

    from .demo import tiny_unet, train_step

    world = env_int("WORLD_SIZE", 1, MAX_WORLD, 1)
    local_rank = env_int("LOCAL_RANK", 0, MAX_PROCS - 1, 0)
    cuda = torch.cuda.is_available() and not a.cpu
    if world > 1:
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = tiny_unet(a.labels).to(device)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)

    term = {"set": False}
    signal.signal(signal.SIGTERM, lambda *_: term.update(set=True))
    loader = None
    if a.inline:
        source = _inline_batches(a.size, a.labels, a.batch_size, 1000 + rank)
    else:
        from ..loader import WireheadLoader
        loader = WireheadLoader(config_path=a.config, batch_size=a.batch_size,
                                num_threads=2, prefetch=2, shuffle=True)
    gpu = _GpuSampler() if cuda else None
    rec = {"rank": rank, "world": world, "inline": a.inline, "steps": 0, "epochs": [],
           "step_t": [], "step_wait": [], "loss": [], "recorded_steps": 0,
           "waited_s": 0.0, "samples": 0}
    t0 = time.monotonic()
    deadline = t0 + a.seconds if a.seconds is not None else float("inf")
    try:
        stop = False
        while not stop:
            it = source if a.inline else iter(loader)
            items = []
            if rec["recorded_steps"] < a.record_steps:
                rec["epochs"].append(items)
            while True:
                tw = time.monotonic()
                batch = next(it, None)
                wait = time.monotonic() - tw
                if batch is None:
                    break  # end of this loader epoch: the next one starts
                pads = batch["is_pad"].tolist()
                # per-step detail for the first --record-steps steps only: a
                # long run's record stays bounded
                keep = rec["recorded_steps"] < a.record_steps
                if keep:
                    items += [[int(g), int(p), bool(x)] for g, p, x in zip(
                        batch["generation"].tolist(), batch["position"].tolist(), pads)]
                if cuda:
                    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                _n, loss, _pairs, _g = train_step(model, opt, batch)
                del batch  # the loader reuses a ring slot once its tensors are gone
                now = time.monotonic()
                rec["steps"] += 1
                rec["samples"] += pads.count(False)
                rec["waited_s"] += wait
                if keep:
                    rec["recorded_steps"] += 1
                    rec["step_t"].append(round(now - t0, 4))
                    rec["step_wait"].append(round(wait, 5))
                    rec["loss"].append(round(loss, 5))
                stop = now >= deadline or term["set"]
                if world > 1:
                    # one verdict for every rank: rank 0's clock, or a SIGTERM anywhere
                    v = torch.tensor([float(stop and (rank == 0 or term["set"]))])
                    dist.all_reduce(v)
                    stop = v.item() > 0
                if stop:
                    break
    finally:
        if loader is not None:
            loader.close()
        rec["gpu_util"] = gpu.close() if gpu else None
    rec["seconds"] = round(time.monotonic() - t0, 3)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    n, waited = rec["samples"], rec["waited_s"]
    print(f"train rank {rank}/{world}: {rec['steps']} steps, {n} samples in "
          f"{rec['seconds']:.1f}s ({n / max(rec['seconds'], 1e-9):.2f}/s), waited for data "
          f"{waited:.2f}s ({100 * waited / max(rec['seconds'], 1e-9):.1f}%)", flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        # never through or over a link planted in --out (a rerun replaces its file)
        write_file(os.path.join(a.out, f"train.rank{rank}.json"), json.dumps(rec).encode(),
                   ValueError, replaces="file")
    return 0


# --------------------------------------------------------------------------
# command line


def parser(sub):
    g = sub.add_parser("generate", help="run N generator processes into the store")
    g.add_argument("--config", default="config.yaml",
                   help="the store's config file (default: config.yaml)")
    g.add_argument("--gen-module", default=None, metavar="synth|MODULE:FUNCTION",
                   help="'synth' (built-in SynthSeg-like volumes, the default) or "
                        "module:function")
    g.add_argument("--procs", type=integer(1, MAX_PROCS), default=1, metavar="N",
                   help=f"generator processes (default 1, at most {MAX_PROCS})")
    g.add_argument("--seconds", type=seconds(), default=None, metavar="T",
                   help="stop after this long (below 10^6)")
    g.add_argument("--seed", type=seed(), default=None, metavar="S",
                   help="seed of the first process (the others: +1, +2, ...); with --shards "
                        "it also shuffles the shard order (default: a fresh random seed, "
                        "shards in order)")
    loud = g.add_mutually_exclusive_group()
    loud.add_argument("--quiet", action="store_true",
                      help="only each process's start and end lines (and errors)")
    loud.add_argument("--verbose", action="store_true",
                      help="also two lines per generation a process seals")
    g.add_argument("--size", type=integer(4, MAX_SIZE), default=32, metavar="N",
                   help=f"synth: volume edge (default 32, 4..{MAX_SIZE})")
    g.add_argument("--labels", type=integer(2, 255), default=8, metavar="K",
                   help="synth: label classes (default 8, 2..255)")
    g.add_argument("--shards", default=None, nargs="+", metavar="PATTERN",
                   help="read samples from tar shards instead of --gen-module: paths, "
                        "brace patterns ('kept/shards-{000000..000009}.tar') or globs "
                        "('kept/shards-*.tar', expanded in sorted order); every shard must "
                        "exist")
    g.add_argument("--loop", action="store_true", help="--shards: read them again and again")
    g.add_argument("--index", type=integer(0, MAX_PROCS - 1), default=0, help=argparse.SUPPRESS)
    g.add_argument("--procs-total", type=integer(1, MAX_PROCS), default=1,
                   help=argparse.SUPPRESS)
    e = sub.add_parser("export", help="write sealed generations as tar shards (WebDataset)")
    e.add_argument("--config", default="config.yaml",
                   help="the store's config file (default: config.yaml)")
    e.add_argument("--out", required=True, help="directory for the shards and index.json")
    n = e.add_mutually_exclusive_group()
    n.add_argument("--generations", type=integer(1), default=None, metavar="N",
                   help="whole generations to write (default 1)")
    n.add_argument("--samples", type=integer(1), default=None, metavar="N",
                   help="samples to write")
    e.add_argument("--shard-size", type=_byte_count, default="1GiB", metavar="BYTES",
                   help="bytes per shard (default 1GiB, at least 2KiB)")
    e.add_argument("--timeout", type=seconds(lo_open=False), default=None, metavar="S",
                   help="seconds (0 to below 10^6) to wait for each generation (default "
                        "READ_TIMEOUT)")
    t = sub.add_parser("train", help="one training rank of the demo's 3D U-Net")
    t.add_argument("--config", default=None, help="store config (not needed with --inline)")
    t.add_argument("--seconds", type=seconds(), default=None, metavar="T",
                   help="stop after this long (default: at SIGTERM)")
    t.add_argument("--batch-size", type=integer(1, MAX_BATCH), default=4, metavar="B")
    t.add_argument("--labels", type=integer(2, 255), default=8, metavar="K")
    t.add_argument("--size", type=integer(4, MAX_SIZE), default=32, metavar="N",
                   help="--inline: volume edge")
    t.add_argument("--lr", type=number(0, 10.0, "a learning rate"), default=2e-3)
    t.add_argument("--threads", type=integer(1, 1024), default=1, metavar="N",
                   help="torch CPU threads per rank")
    t.add_argument("--inline", action="store_true",
                   help="generate batches in the loop (baseline), no cache")
    t.add_argument("--cpu", action="store_true", help="stay on the CPU with a GPU present")
    t.add_argument("--out", default=None, help="write DIR/train.rank<R>.json")
    t.add_argument("--record-steps", type=integer(0, MAX_RECORD_STEPS), default=100000,
                   metavar="N", help=f"--out: per-step detail for this many steps (default "
                                     f"100000, at most {MAX_RECORD_STEPS})")


def _byte_count(text):
    """--shard-size: a byte count such as 1073741824 or 1GiB (export_shards
    says when it is too small for a shard)."""
    from ..config import ConfigError, parse_bytes
    try:
        return parse_bytes(text, key="--shard-size", where="export")
    except ConfigError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count like 1073741824 or "
                                         f"1GiB") from None


def run(args, argv):
    """Runs a parsed `generate`, `export` or `train` command; returns the
    exit status."""
    if args.cmd == "export":
        from ..shards import export_shards
        index = export_shards(args.out, config_path=args.config,
                              generations=args.generations, samples=args.samples,
                              shard_size=args.shard_size, timeout=args.timeout, quiet=False,
                              on_signal="return")
        if index.get("interrupted"):
            part = index.get("partial_generations") or []
            print(f"wirehead export: interrupted by {index['interrupted']}; {args.out}/index.json "
                  f"says \"complete\": false"
                  + (f", generation {index['partial_label']} is in the shards only in part"
                     if len(part) == 1 else
                     f", generations {index['partial_label']} are in the shards only in part"
                     if part else "")
                  + (f" ({index['samples']} samples in {len(index['shards'])} shards kept)"
                     if index["shards"] else " (nothing kept)"), file=sys.stderr, flush=True)
            return 130 if index["interrupted"] == "SIGINT" else 143
        return 0
    if args.cmd == "generate":
        if args.loop and not args.shards:
            raise ValueError("--loop reads --shards again and again; it needs --shards")
        if args.shards and args.gen_module is not None:
            raise ValueError("--gen-module and --shards are two sources; give one")
        _check_spec_options(args)  # before any process starts
        if args.gen_module not in (None, "synth") and args.procs_total == 1:
            _gen_function(args.gen_module)  # a module missing is said once, before any process
        if args.shards and args.procs_total == 1:  # checked once, before any process starts
            _check_shards(args.shards, args.procs)
            from ..shards import check_store_layout
            check_store_layout(args.shards, config_path=args.config)
        return _generate(args, argv[1:])
    if not args.inline and not args.config:
        raise ValueError("--config is required unless --inline")
    rc = _train(args)
    # Leave without interpreter teardown: a rank on MongoDB once hung there
    # (client threads at exit). Everything is closed and written by now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
