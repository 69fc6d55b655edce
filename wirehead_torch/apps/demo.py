"""End-to-end demo: synthetic generators -> wirehead cache -> a small 3D U-Net.

    python -m wirehead_torch.apps.demo [--seconds 60] [--size 32] [--generators 2] ...
    wirehead-torch demo ...              (same options)

The demo process starts `--generators` generator processes and one manager
process (internal subcommands of this module, see _INTERNAL), trains a tiny
3D segmentation net on batches read from the cache, prints progress about once
per second, and after `--seconds` stops every process it started and removes
the store. With `--ddp N` (N > 1) the training runs under
`python -m torch.distributed.run --standalone --nproc_per_node N` on the gloo
backend, while this process keeps owning the generators, the manager and the
clean-up.

Internal subcommands (first argument; not for users):
    _generator --config-json J --size S --labels L --seed N --parent-pid P [--nice K]
    _manager   --config-json J --parent-pid P
    _train     --config-json J --seconds T --size S --labels L --batch-size B
               [--lr X] [--json]          (one DDP rank; run by torchrun)
"""

import argparse
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from .. import _C, _uri
from .._redact import redact
from .._store import gen_label
from ._args import MAX_BATCH, MAX_SIZE, Parser, integer, number, seconds, seed

__all__ = ["main", "demo_config", "tiny_unet"]

# How long stopped children get to finish their current step before SIGKILL.
_STOP_GRACE_S = 10.0
# How long to wait for the first sealed generation before giving up.
_FIRST_GEN_TIMEOUT_S = 120.0
# The most generator processes, and training ranks, the demo starts on one machine.
MAX_DEMO_PROCS = 64


# --------------------------------------------------------------------------
# Command line


def _parser():
    p = Parser(
        prog="wirehead-torch demo",
        description="Run synthetic generators, a manager and a small 3D "
        "segmentation training loop against one wirehead cache, then clean up.",
    )
    p.add_argument("--seconds", type=seconds(), default=60.0, metavar="T",
                   help="how long to train (default 60)")
    p.add_argument("--size", type=integer(8, MAX_SIZE), default=32, metavar="N",
                   help=f"edge of the cubic volumes, even, 8..{MAX_SIZE} (default 32)")
    p.add_argument("--labels", type=integer(2, 255), default=8, metavar="K",
                   help="number of label classes incl. background, 2..255 (default 8)")
    p.add_argument("--generators", type=integer(1, MAX_DEMO_PROCS), default=2, metavar="N",
                   help=f"generator processes to start (default 2, at most {MAX_DEMO_PROCS})")
    p.add_argument("--swap-cap", type=integer(_C.SWAP_CAP_MIN, _C.SWAP_CAP_MAX), default=32,
                   metavar="N", help="samples per generation, SWAP_CAP (default 32)")
    p.add_argument("--batch-size", type=integer(1, MAX_BATCH), default=4, metavar="B",
                   help="training batch size per rank (default 4)")
    p.add_argument("--lr", type=number(0, 10.0, "a learning rate"), default=2e-3,
                   help="Adam learning rate")
    p.add_argument("--store", default=None,
                   help=f"store URL (default {_uri.shm_uri('wh-demo-<pid>')})")
    p.add_argument("--seed", type=seed(), default=None, metavar="S",
                   help="base seed of the generators (default: random)")
    p.add_argument("--gen-nice", type=integer(0, 19), default=10, metavar="N",
                   help="niceness added to generator processes so training "
                   "keeps its CPU on small machines (default 10; 0 = off)")
    p.add_argument("--ddp", type=integer(1, MAX_DEMO_PROCS), default=1, metavar="N",
                   help="train with N local ranks under torchrun (gloo)")
    p.add_argument("--json", action="store_true",
                   help="progress and summary as JSON lines")
    p.add_argument("--verbose", action="store_true",
                   help="show the output of generator and manager processes")
    return p


def _check_args(p, a):
    if a.size % 2:
        p.error(f"argument --size: {a.size} is odd: give an even edge (the net halves it once)")


def demo_config(store, swap_cap, size):
    """The config dict every demo process uses. The byte budget fits
    SWAP_CAP samples (float32 image + uint8 labels, size^3 each) with room
    for puts in flight, so the demo runs in a small /dev/shm too."""
    sample = size ** 3 * 5 + 4096
    return {
        "STORE": store,
        "SWAP_CAP": int(swap_cap),
        "SAMPLE": ["input", "label"],
        "DBNAME": "demo",
        "BYTE_BUDGET": sample * (int(swap_cap) + 8),
    }


def main(argv=None):
    """Entry point of `python -m wirehead_torch.apps.demo` and `wirehead-torch demo`.

    Returns the exit status (0 on success, 130 on Ctrl-C).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _INTERNAL:
        return _INTERNAL[argv[0]](argv[1:])
    p = _parser()
    args = p.parse_args(argv)
    _check_args(p, args)
    return _run_demo(args)


# --------------------------------------------------------------------------
# Orchestration (the demo process)


class _Child:
    def __init__(self, name, popen, log_path):
        self.name = name
        self.popen = popen
        self.log_path = log_path
        self.killed = False   # True once we had to SIGKILL it

    def describe_exit(self):
        rc = self.popen.returncode
        how = f"signal {-rc}" if rc is not None and rc < 0 else f"code {rc}"
        msg = f"{self.name} (pid {self.popen.pid}) exited unexpectedly with {how}"
        tail = _tail(self.log_path)
        return msg + (":\n" + tail if tail else "")


def _tail(path, n=20):
    if not path:
        return ""
    try:
        with open(path, "r", errors="replace") as f:
            return "".join(f.readlines()[-n:]).rstrip()
    except OSError:
        return ""


def _spawn(name, args, logdir, verbose):
    """Start `python -m wirehead_torch.apps.demo <args>`; output to a log file
    (shown if the child fails) unless verbose."""
    cmd = [sys.executable, "-m", "wirehead_torch.apps.demo"] + args
    if verbose:
        return _Child(name, subprocess.Popen(cmd), None)
    log_path = os.path.join(logdir, name.replace(" ", "_") + ".log")
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
    return _Child(name, popen, log_path)


def _stop_children(children, err):
    """SIGTERM every child still running, wait, then SIGKILL the stragglers.

    Reverse start order: the trainer (if any) first, generators, the manager
    last so the store is quiet when it goes. Only our own pids are signalled.
    """
    for ch in reversed(children):
        if ch.popen.poll() is None:
            try:
                ch.popen.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + _STOP_GRACE_S
    for ch in reversed(children):
        try:
            ch.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"demo: {ch.name} (pid {ch.popen.pid}) ignored SIGTERM for "
                  f"{_STOP_GRACE_S:.0f}s; sending SIGKILL", file=err)
            ch.killed = True
            ch.popen.kill()
            ch.popen.wait()


def _check_children(children):
    """Raise if any child has exited: the demo needs all of them running."""
    for ch in children:
        if ch.popen.poll() is not None:
            raise RuntimeError(ch.describe_exit())


def _wait_first_generation(cfg, children, timeout):
    """The readers' wait (the store opened as they open it), checking
    between its slices that every child runs."""
    from .._reader import wait_for_generation
    from .._store import ProcessStore
    from ..config import get_config
    cfg = get_config(None, cfg)
    handle = ProcessStore(cfg)
    try:
        wait_for_generation(handle.get(), cfg, timeout, check=lambda: _check_children(children),
                            who="wirehead demo", longer="the demo waits "
                            f"{timeout:.0f}s for its generators")
    finally:
        handle.close()


def _run_demo(args):
    out = sys.stdout
    err = sys.stderr
    store = args.store or _uri.shm_uri(f"wh-demo-{os.getpid()}")
    cfg = demo_config(store, args.swap_cap, args.size)
    cfg_json = json.dumps(cfg)
    base_seed = args.seed if args.seed is not None else int(
        np.random.SeedSequence().entropy % (2 ** 31))
    logdir = tempfile.mkdtemp(prefix="wh-demo-")
    children = []
    keep_logs = False
    status = 1

    # SIGTERM (e.g. from SLURM or a parent script) must run the clean-up too.
    def _on_term(signum, frame):
        raise SystemExit(128 + signum)
    old_term = signal.signal(signal.SIGTERM, _on_term)

    t_start = time.monotonic()
    deadline = t_start + args.seconds
    try:
        _say(args, out, event="start", store=store, swap_cap=args.swap_cap,
             generators=args.generators, size=args.size, ddp=args.ddp,
             text=f"demo: store {store}, SWAP_CAP {args.swap_cap}, "
                  f"{args.generators} generator(s) of {args.size}^3 volumes, "
                  f"{args.ddp} training rank(s), {args.seconds:g}s")
        me = str(os.getpid())
        children.append(_spawn(
            "manager", ["_manager", "--config-json", cfg_json, "--parent-pid", me],
            logdir, args.verbose))
        for i in range(args.generators):
            children.append(_spawn(
                f"generator {i}",
                ["_generator", "--config-json", cfg_json,
                 "--size", str(args.size), "--labels", str(args.labels),
                 "--seed", str(base_seed + i), "--parent-pid", me,
                 "--nice", str(args.gen_nice)],
                logdir, args.verbose))

        _wait_first_generation(cfg, children, _FIRST_GEN_TIMEOUT_S)
        remaining = max(1.0, deadline - time.monotonic())

        if args.ddp > 1:
            _run_ddp(args, cfg_json, remaining, children)
        else:
            _train(cfg, args, remaining, children=children, out=out)
        status = 0
    except KeyboardInterrupt:
        print("demo: interrupted, stopping", file=err)
        status = 130
    except SystemExit as e:
        print("demo: terminated, stopping", file=err)
        status = e.code if isinstance(e.code, int) else 1
    except Exception as e:
        keep_logs = True
        print(f"demo: error: {e}", file=err)
        status = 1
    finally:
        # A second Ctrl-C must not cut the clean-up short (it is bounded by
        # _STOP_GRACE_S anyway).
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        _stop_children(children, err)
        cleaned = _clean(cfg, err)
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)
        failed = [ch for ch in children
                  if ch.popen.returncode not in (0, None) and not ch.killed]
        if failed and status == 0:
            # Every child should exit 0 on SIGTERM; say so if one did not.
            for ch in failed:
                print(f"demo: warning: {ch.describe_exit()}", file=err)
            keep_logs = True
        _say(args, out, event="stopped",
             processes=len(children), store_removed=cleaned,
             text=f"demo: stopped {len(children)} process(es), "
                  f"store {store} {'removed' if cleaned else 'NOT removed'}")
        if keep_logs and not args.verbose:
            print(f"demo: child logs kept in {logdir}", file=err)
        else:
            shutil.rmtree(logdir, ignore_errors=True)
    return status


def _clean(cfg, err):
    try:
        import wirehead_torch as wh
        wh.clean(cfg)
        return True
    except Exception as e:
        print(f"demo: could not remove store {redact(cfg['STORE'])}: {e}", file=err)
        return False


def _run_ddp(args, cfg_json, seconds, children):
    """Train under torchrun; this process keeps watching its producers."""
    cmd_args = ["_train", "--config-json", cfg_json,
                "--seconds", f"{seconds:.3f}", "--size", str(args.size),
                "--labels", str(args.labels), "--batch-size", str(args.batch_size),
                "--lr", str(args.lr)]
    if args.json:
        cmd_args.append("--json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(args.ddp)]
    cmd += _torchrun_py311_workaround(args.ddp)
    cmd += ["-m", "wirehead_torch.apps.demo"] + cmd_args
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    trainer = _Child("torchrun", subprocess.Popen(cmd, env=env), None)
    producers = list(children)
    children.append(trainer)
    while trainer.popen.poll() is None:
        _check_children(producers)
        time.sleep(0.2)
    if trainer.popen.returncode != 0:
        raise RuntimeError(trainer.describe_exit())


def _torchrun_py311_workaround(nproc):
    """Extra torchrun flags for torch < 2.0 on Python >= 3.11.

    There, Std.from_str("0") returns None (3.11 changed IntFlag iteration),
    so torchrun's default --redirects/--tee of "0" crash it with
    "'NoneType' object has no attribute 'get'". A mapping that names only a
    local rank that does not exist parses fine and leaves every real rank
    at Std.NONE (plain console output), which is what the default means.
    """
    try:
        from torch.distributed.elastic.multiprocessing.api import Std
        broken = Std.from_str("0") is None
    except Exception:
        return []
    if not broken:
        return []
    if nproc > 9:
        raise RuntimeError(
            "this torch's torchrun cannot start on Python 3.11 with more than 9 "
            "local ranks (its --redirects parsing is broken); use --ddp <= 9")
    return ["--redirects", "9:1", "--tee", "9:1"]


# --------------------------------------------------------------------------
# Internal subcommands (child processes)


def _watch_parent(parent_pid):
    """SIGTERM ourselves if the demo process dies, so no generator outlives it.

    The wirehead classes handle SIGTERM by finishing the current step and
    returning, so this ends the child cleanly.
    """
    if parent_pid <= 0:
        return

    def loop():
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=loop, name="wh-demo-parent-watch", daemon=True).start()


def _child_parser(prog):
    p = argparse.ArgumentParser(prog=f"wirehead_torch.apps.demo {prog}")
    p.add_argument("--config-json", required=True)
    p.add_argument("--parent-pid", type=int, default=0)
    return p


def _cmd_generator(argv):
    p = _child_parser("_generator")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--labels", type=int, default=8)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--nice", type=int, default=0)
    a = p.parse_args(argv)
    if a.nice:
        os.nice(a.nice)
    _watch_parent(a.parent_pid)
    import wirehead_torch as wh
    from wirehead_torch.apps.synth import synth_generator
    cfg = json.loads(a.config_json)
    gen = synth_generator(size=a.size, n_labels=a.labels, seed=a.seed)
    n = wh.WireheadGenerator(gen, config=cfg, quiet=True).run()
    print(f"generator pid {os.getpid()}: pushed {n} samples", flush=True)
    return 0


def _cmd_manager(argv):
    a = _child_parser("_manager").parse_args(argv)
    _watch_parent(a.parent_pid)
    import wirehead_torch as wh
    wh.WireheadManager(config=json.loads(a.config_json), quiet=True).run()
    return 0


def _cmd_train(argv):
    p = argparse.ArgumentParser(prog="wirehead_torch.apps.demo _train")
    p.add_argument("--config-json", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--labels", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    # A torch 2.x rank aborted twice in CI ("terminate called without an
    # active exception", not reproduced locally): a fatal signal prints
    # every thread's Python stack.
    faulthandler.enable(all_threads=True)
    import torch.distributed as dist
    dist.init_process_group(backend="gloo")
    _train(json.loads(a.config_json), a, a.seconds, children=None, out=sys.stdout)
    # every rank reaches teardown before any destroys its process group;
    # after an error a barrier could wait for a rank that is gone, so none then
    dist.barrier()
    dist.destroy_process_group()
    # Leave without interpreter teardown, the window that abort's
    # signature is known from (a torch thread taking the GIL there):
    # the loader is closed and the group destroyed, nothing is left to end.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


_INTERNAL = {
    "_generator": _cmd_generator,
    "_manager": _cmd_manager,
    "_train": _cmd_train,
}


# --------------------------------------------------------------------------
# Data access


def _batches(cfg, batch_size):
    """Endless batches: dicts of 'input', 'label', 'is_pad', 'generation',
    'position', from WireheadLoader (the C batch loader; under DDP it takes
    this rank's share), going round its epochs forever."""
    import wirehead_torch as wh

    loader = wh.WireheadLoader(config=cfg, batch_size=batch_size, num_threads=2, prefetch=2,
                               shuffle=True)
    try:
        while True:
            n = 0
            for batch in loader:
                n += 1
                yield batch
            if n == 0:
                raise RuntimeError("WireheadLoader yielded an empty epoch")
    finally:
        loader.close()


# --------------------------------------------------------------------------
# Model and training


def _make_unet(n_labels, width=8):
    import torch
    from torch import nn

    class TinyUNet(nn.Module):
        """Two-level 3D U-Net: 1 -> w -> 2w (half resolution) -> w -> n_labels."""

        def __init__(self):
            super().__init__()
            c1, c2 = width, 2 * width
            self.enc = nn.Sequential(
                nn.Conv3d(1, c1, 3, padding=1), nn.ReLU(inplace=True),
                nn.Conv3d(c1, c1, 3, padding=1), nn.ReLU(inplace=True))
            self.mid = nn.Sequential(
                nn.MaxPool3d(2),
                nn.Conv3d(c1, c2, 3, padding=1), nn.ReLU(inplace=True),
                nn.Conv3d(c2, c2, 3, padding=1), nn.ReLU(inplace=True),
                nn.ConvTranspose3d(c2, c1, 2, stride=2))
            self.dec = nn.Sequential(
                nn.Conv3d(2 * c1, c1, 3, padding=1), nn.ReLU(inplace=True),
                nn.Conv3d(c1, n_labels, 1))

        def forward(self, x):
            e = self.enc(x)
            return self.dec(torch.cat([e, self.mid(e)], dim=1))

    return TinyUNet()


def tiny_unet(n_labels, width=8):
    """The demo's segmentation net, an nn.Module mapping [B,1,S,S,S] to
    [B,n_labels,S,S,S] logits (S even). Built on call so that importing this
    module does not import torch."""
    return _make_unet(n_labels, width)


def _say(args, out, text, **fields):
    if getattr(args, "json", False):
        fields["time"] = round(time.time(), 3)
        out.write(json.dumps(fields) + "\n")
    else:
        out.write(text + "\n")
    out.flush()


def _store_status(cfg):
    import wirehead_torch as wh
    try:
        return wh.status(cfg)
    except wh.WireheadError:
        return {}


def _train(cfg, args, seconds, children, out):
    """Train until `seconds` pass; print progress about once per second.

    Single process when torch.distributed is not initialised; otherwise one
    DDP rank, where rank 0 decides when to print and stop and the ranks agree
    through one small all_reduce per step (so none blocks in backward alone).
    """
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    ddp = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if ddp else 0
    world = dist.get_world_size() if ddp else 1
    torch.manual_seed(0)  # same initial weights on every rank

    model = _make_unet(args.labels)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    batches = _batches(cfg, args.batch_size)
    t0 = time.monotonic()
    deadline = t0 + seconds
    next_report = t0 + 1.0
    step = 0
    consumed = 0               # real (non-pad) samples, all ranks
    waited = 0.0               # seconds this rank (rank 0: all ranks, summed) waited
    seen = set()               # distinct (generation, position), all ranks
    new_pairs = []             # this rank's pairs since the last report
    gens_seen = set()
    last = {"t": t0, "consumed": 0}
    loss_sum, loss_n = 0.0, 0
    last_gen = -1
    try:
        while True:
            tw = time.monotonic()
            batch = next(batches)
            dt_wait = time.monotonic() - tw

            n_real, lval, pairs, gen = train_step(model, opt, batch)
            # Drop our reference before the next fetch: the loader reuses a
            # ring buffer only once every tensor exported from it is gone.
            del batch
            new_pairs.extend(pairs)
            last_gen = max(last_gen, gen)
            step += 1

            now = time.monotonic()
            stop = now >= deadline
            report = now >= next_report or stop
            if ddp:
                # Rank 0's clock decides; everyone learns it in the same step.
                v = torch.tensor([float(stop and rank == 0), float(report and rank == 0),
                                  n_real, dt_wait, lval], dtype=torch.float64)
                dist.all_reduce(v)
                stop, report = v[0].item() > 0, v[1].item() > 0
                n_real, dt_wait, lval = int(v[2].item()), v[3].item(), v[4].item() / world
            consumed += n_real
            waited += dt_wait
            loss_sum += lval
            loss_n += 1

            if report:
                if ddp:
                    gathered = [None] * world
                    dist.all_gather_object(gathered, new_pairs)
                    pairs = [pr for part in gathered for pr in part]
                else:
                    pairs = new_pairs
                seen.update(pairs)
                gens_seen.update(g for g, _ in pairs)
                new_pairs = []
                if rank == 0:
                    if children:
                        _check_children(children)
                    _progress(args, out, cfg, now - t0, step, loss_sum / loss_n,
                              (consumed - last["consumed"]) / max(now - last["t"], 1e-9),
                              last_gen, consumed, len(seen), waited / world, now - t0)
                last = {"t": now, "consumed": consumed}
                loss_sum, loss_n = 0.0, 0
                next_report = now + 1.0
            if stop:
                break
    finally:
        batches.close()

    if rank == 0:
        elapsed = time.monotonic() - t0
        st = _store_status(cfg)
        reuse = consumed / len(seen) if seen else 0.0
        wait_avg = waited / world
        _say(args, out, event="summary", steps=step, samples=consumed,
             seconds=round(elapsed, 2), samples_per_s=round(consumed / elapsed, 2),
             generations_seen=len(gens_seen), distinct_samples=len(seen),
             reuse=round(reuse, 3), generated=st.get("generated"),
             discarded=st.get("discarded"), waited_s=round(wait_avg, 3),
             waited_pct=round(100.0 * wait_avg / elapsed, 1), ranks=world,
             text=f"demo: {step} steps, {consumed} samples in {elapsed:.1f}s "
                  f"({consumed / elapsed:.1f}/s) from {len(gens_seen)} generation(s); "
                  f"{len(seen)} distinct samples, reuse {reuse:.2f}x; "
                  f"generated {st.get('generated', '?')}, discarded "
                  f"{st.get('discarded', '?')}; waited for data "
                  f"{wait_avg:.2f}s ({100.0 * wait_avg / elapsed:.1f}%)")


def train_step(model, opt, batch):
    """One optimiser step on a batch; returns (n_real, loss, pairs, max generation).

    Kept in its own function so the batch tensors and the autograd graph
    are released when it returns.
    """
    import torch
    import torch.nn.functional as F

    x = batch["input"].to(torch.float32).unsqueeze(1)
    y = batch["label"].to(torch.int64)  # stored as uint8; cross_entropy wants int64
    real = batch["is_pad"].to(torch.bool).logical_not()
    gens = batch["generation"].tolist()
    pairs = [(g, p) for g, p, r in zip(gens, batch["position"].tolist(), real.tolist()) if r]

    # Padding items (lock-step DDP) count with weight 0.
    per_sample = F.cross_entropy(model(x), y, reduction="none").flatten(1).mean(1)
    w = real.to(per_sample.dtype)
    loss = (per_sample * w).sum() / w.sum().clamp(min=1.0)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return int(real.sum()), float(loss.detach()), pairs, max(gens, default=-1)


def _progress(args, out, cfg, t, step, loss, rate, gen, consumed, distinct,
              waited, elapsed):
    st = _store_status(cfg)
    reuse = consumed / distinct if distinct else 0.0
    pct = 100.0 * waited / elapsed if elapsed > 0 else 0.0
    fill = st.get("write_fill")
    _say(args, out, event="progress", t=round(t, 2), step=step,
         loss=round(loss, 4), samples_per_s=round(rate, 2), generation=gen,
         read_gen=st.get("read_gen"), write_fill=fill,
         generated=st.get("generated"), consumed=consumed, distinct=distinct,
         reuse=round(reuse, 3), waited_s=round(waited, 3),
         waited_pct=round(pct, 1),
         seals=st.get("seals"),
         text=f"{t:6.1f}s  step {step:5d}  loss {loss:.4f}  "
              f"{rate:6.1f} samples/s  {_gen_text(gen, st)}  fill "
              f"{fill if fill is not None else '?'}/{cfg['SWAP_CAP']}  "
              f"generated {st.get('generated', '?')}  "
              f"reuse {reuse:.2f}x  waited {waited:.2f}s ({pct:.1f}%)")


def _gen_text(gen, st):
    """The batch's generation as status names it (#N), and how far it lags
    the newest."""
    rg = st.get("read_gen")
    if isinstance(rg, int) and isinstance(st.get("seals"), int) and gen >= 0:
        return f"gen {gen_label(gen, st)} (batch {max(0, rg - gen)} behind)"
    return f"gen {gen}"


if __name__ == "__main__":
    sys.exit(main())
