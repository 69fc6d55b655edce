"""Issue 40's "done when", on shm and on MongoDB: a run with one generator
and a run with three (one SIGKILLed mid-generation and restarted, one slowed
at random) deliver identical batches — every tensor, every spec_index — for
4 generations x REUSE 2 on a 2-rank DDP run with 2 DataLoader workers per
rank; a third run stopped after 5 batches and restarted in new processes
from state_dict() delivers the same continuation; every delivered sample is
fn(spec) of its spec_index."""
import json
import os
import signal
import subprocess
import sys

import numpy as np

import wirehead_torch as wt
from wirehead_torch import _C
from wirehead_torch._store_args import store_kwargs
from wirehead_torch.config import resolve

import whlib

WORKER = os.path.join(whlib.HERE, "spec_ddp_worker.py")
GEN = os.path.join(whlib.HERE, "spec_gen.py")
WORLD, WORKERS, BATCH = 2, 2, 2
SWAP_CAP, REUSE, GENERATIONS = 8, 2, 4
EPOCHS = GENERATIONS * REUSE
RUN_SEED = 20261128
LAUNCH_TIMEOUT = 240

sys.path.insert(0, whlib.HERE)
from spec_gen import sample  # noqa: E402


class Feed:
    """Spec generators of cfg's store, as processes; stop() ends them."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.procs = []

    def start(self, *flags):
        p = subprocess.Popen([sys.executable, GEN, json.dumps(dict(self.cfg)), *flags],
                             env=whlib.env_for_child(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        whlib.wait_line(p.stderr, "STARTED", 60)
        self.procs.append(p)
        return p

    def status(self):
        st = _C.Store(**store_kwargs(resolve(self.cfg)))
        try:
            return _C.spec_status(st)
        finally:
            st.close()

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def launch(tmp_path, name, cfg, **spec):
    """WORLD ranks of spec_ddp_worker.py; their results by rank."""
    spec.update(cfg=dict(cfg), batch=BATCH, workers=WORKERS, epochs=EPOCHS,
                out=str(tmp_path / f"{name}.{{rank}}.json"))
    path = tmp_path / f"{name}.spec.json"
    path.write_text(json.dumps(spec))
    port = whlib.free_port()
    procs, logs = [], []
    for rank in range(WORLD):
        log = open(tmp_path / f"{name}.{rank}.log", "w")
        logs.append(log)
        env = whlib.env_for_child({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                   "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
                                   "RANK": str(rank), "WORLD_SIZE": str(WORLD),
                                   "LOCAL_RANK": str(rank)})
        procs.append(subprocess.Popen([sys.executable, WORKER, str(path)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT))
    whlib.wait_ranks(procs, logs, name, LAUNCH_TIMEOUT)
    out = {}
    for r in range(WORLD):
        with open(spec["out"].replace("{rank}", str(r))) as f:
            out[r] = json.load(f)
    return out


def _kill_mid_generation(feed, victim, index):
    """SIGKILLs victim once it holds the claim of index (in generation 1)."""
    whlib.until(lambda: any(c["index"] == index and c["pid"] == victim.pid
                            for c in feed.status()["claims"]), 60,
                f"generator {victim.pid} holding index {index}")
    victim.kill()
    victim.wait(10)


def _check_samples(batches):
    for b in batches:
        for k, x, idx in zip(b["spec_index"], b["x"], b["k"]):
            assert idx == [k]
            spec = wt.Spec(index=k, seed=wt.spec_seed(RUN_SEED, k), generation=k // SWAP_CAP,
                           position=k % SWAP_CAP, params={}, params_version=0,
                           run_seed=RUN_SEED)
            assert np.array_equal(np.array(x, np.float32), sample(spec)[0]), k


def test_runs_are_the_same_whatever_generators_do(store_cfg, tmp_path):
    def cfg():
        return store_cfg(swap_cap=SWAP_CAP, sample=("x", "k"), budget="1MiB", RUN_SEED=RUN_SEED,
                    REUSE=REUSE, CLAIM_LEASE=2, READ_TIMEOUT=120)

    runs = {}
    # one generator
    c = cfg()
    feed = Feed(c)
    try:
        feed.start()
        runs["one"] = launch(tmp_path, "one", c)
    finally:
        feed.stop()
    # three: one slowed at random, one SIGKILLed mid-generation and restarted
    c = cfg()
    feed = Feed(c)
    try:
        victim = feed.start("--hang-at", str(SWAP_CAP + 3))
        _kill_mid_generation(feed, victim, SWAP_CAP + 3)
        feed.start("--slow")
        feed.start()  # the killed one, restarted
        feed.start()
        runs["three"] = launch(tmp_path, "three", c)
    finally:
        feed.stop()
    # stopped after 5 batches, resumed in new processes
    c = cfg()
    feed = Feed(c)
    try:
        feed.start()
        first = launch(tmp_path, "first", c, take=5)
        states = {str(r): first[r]["state"] for r in first}
        (tmp_path / "states.json").write_text(json.dumps(states))
        rest = launch(tmp_path, "rest", c, resume=str(tmp_path / "states.json"))
    finally:
        feed.stop()
    for r in range(WORLD):
        one = runs["one"][r]["batches"]
        assert len(one) == EPOCHS * SWAP_CAP // WORLD // BATCH
        _check_samples(one)
        assert runs["three"][r]["batches"] == one, f"rank {r}: three generators differ"
        resumed = first[r]["batches"] + rest[r]["batches"]
        assert len(first[r]["batches"]) == 5
        assert resumed == one, f"rank {r}: the resumed run differs"
    # ranks read disjoint samples of each epoch
    for e in range(EPOCHS):
        per = SWAP_CAP // WORLD // BATCH
        ks = [k for r in range(WORLD) for b in runs["one"][r]["batches"][e * per:(e + 1) * per]
              for k, pad in zip(b["spec_index"], b["is_pad"]) if not pad]
        assert sorted(ks) == list(range(e // REUSE * SWAP_CAP, (e // REUSE + 1) * SWAP_CAP))
