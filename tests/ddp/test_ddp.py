"""Real multi-process DDP runs (gloo on loopback): 3 ranks, each a
DataLoader with 2 workers over WireheadIterableDataset (or a WireheadLoader),
reading while 3 generators and a manager keep swapping generations.

Each rank is tests/helpers/ddp_worker.py, started as torchrun would start it; it
checks every sample against its id, all-reduces after every batch and
writes what it saw to a JSON file; the assertions are made here."""
import json
import os
import subprocess
import sys
import time
from collections import defaultdict

import pytest

import wirehead_torch as wt
from wirehead_torch import _C
from wirehead_torch._order import Order
from wirehead_torch._store_args import store_kwargs
from wirehead_torch.config import resolve

import whlib

WORKER = os.path.join(whlib.HERE, "ddp_worker.py")
WORLD = 3
WORKERS = 2
BATCH = 4
SWAP_CAP = 38         # not divisible by WORLD * WORKERS = 6: every worker pads
EPOCHS = 3
RESUME_EPOCH = 1
LAUNCH_TIMEOUT = 120  # a whole launch; each collective is bounded at 60 s
SEED = 7




class Feed:
    """Generators and a manager swapping generations of cfg's store."""

    def __init__(self, cfg, tags=(1, 2, 3)):
        self.cfg = cfg
        self.gens = [whlib.spawn("gen", cfg, tag) for tag in tags]
        self.mgr = whlib.spawn("manager", cfg)

    def wait_started(self):
        for p in self.gens + [self.mgr]:
            whlib.wait_line(p.stderr, "STARTED", 60)
        # generators yield the CPU to the ranks; they use what is left
        for p in self.gens:
            os.setpriority(os.PRIO_PROCESS, p.pid, 10)
        try:
            whlib.until(lambda: self.seals() >= 1, 60, "the first seal")
        except TimeoutError:
            whlib.assert_alive(self.gens + [self.mgr], "before the first seal")
            raise AssertionError(f"no seal within 60 s; store status {self.status()}; "
                                 f"manager says {whlib.tail(self.mgr.stderr)}") from None

    def status(self):
        try:
            return wt.status(self.cfg)
        except Exception as e:  # noqa: BLE001 (a diagnostic)
            return repr(e)

    def seals(self):
        try:
            return wt.status(self.cfg)["seals"]
        except wt.NotFoundError:  # STARTED is printed before the store is opened
            return 0

    def stop(self):
        """Stops manager and generators: no generation is reclaimed after."""
        for p in [self.mgr] + self.gens:
            rc = whlib.stop(p)
            assert rc == 0, f"feed process {p.args[2]} exited with {rc}"


@pytest.fixture
def feed(store_cfg):
    f = Feed(store_cfg(swap_cap=SWAP_CAP))
    try:
        f.wait_started()
        yield f
    finally:
        for p in [f.mgr] + f.gens:
            whlib.stop(p)


def launch(tmp_path, name, rank_env=True, **spec):
    """Runs WORLD ranks of ddp_worker.py with spec; returns their results
    by rank. Fails (after killing the ranks) if any takes too long.
    rank_env: RANK/WORLD_SIZE in the environment (as torchrun sets them);
    else only the process group knows them."""
    spec.setdefault("batch", BATCH)
    spec.setdefault("seed", SEED)
    spec["out"] = str(tmp_path / f"{name}.{{rank}}.json")
    spec_path = tmp_path / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    port = whlib.free_port()
    procs, logs = [], []
    for rank in range(WORLD):
        log = open(tmp_path / f"{name}.{rank}.log", "w")
        logs.append(log)
        # loopback only: gloo's own connections too, not just the rendezvous
        env = whlib.env_for_child({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                   "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"})
        args = [sys.executable, WORKER, str(spec_path)]
        if rank_env:
            env.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
        else:
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
                env.pop(k, None)
            args += [str(rank), str(WORLD)]
        procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))
    whlib.wait_ranks(procs, logs, name, LAUNCH_TIMEOUT)
    out = {}
    for r in range(WORLD):
        with open(spec["out"].replace("{rank}", str(r))) as f:
            out[r] = json.load(f)
        assert out[r]["rank"] == r and out[r]["world"] == WORLD
    return out


def plan_positions(cfg, kind, rank, epoch, steps):
    """The positions rank must yield in epoch, in delivery order: the
    DataLoader hands batch i out from worker i mod WORKERS."""
    o = Order(resolve(cfg), None, True, SEED, "repeat", -100, None, "epoch", rank, WORLD)
    if kind == "loader":
        pos, pad = _C.plan_items(**o.plan(0, 0, BATCH), epoch=epoch)
        return [(p, bool(x)) for p, x in zip(memoryview(pos).cast("q"), pad)][:steps * BATCH]
    per_worker = []
    for w in range(WORKERS):
        pos, pad = _C.plan_items(**o.plan(WORKERS, w, BATCH), epoch=epoch)
        per_worker.append([(p, bool(x)) for p, x in zip(memoryview(pos).cast("q"), pad)])
    seq = []
    for i in range(steps):
        k = i // WORKERS
        seq += per_worker[i % WORKERS][k * BATCH:(k + 1) * BATCH]
    return seq


def check_ids(results):
    """One (generation, position) is one sample wherever and whenever it
    was read, and a generation holds distinct samples."""
    seen, by_gen = {}, defaultdict(dict)
    for res in results:
        for ep in res["epochs"]:
            for gen, pos, _pad, tag, counter in ep["items"]:
                key, ident = (gen, pos), (tag, counter)
                assert seen.setdefault(key, ident) == ident, \
                    f"generation {gen} position {pos} read as {seen[key]} and as {ident}"
                other = by_gen[gen].setdefault(ident, pos)
                assert other == pos, f"sample {ident} at positions {other} and {pos} of {gen}"
    return seen


def check_epoch(eps):
    """eps: one epoch's record from every rank. Returns its real items."""
    lens = {r: ep["steps"] for r, ep in eps.items()}
    assert len(set(lens.values())) == 1, f"ranks ran different numbers of steps: {lens}"
    steps = lens[0]
    for r, ep in eps.items():
        assert len(ep["items"]) == steps * BATCH
        # every rank at the same batch index at every all_reduce
        assert [row[0] for row in ep["reduced"]] == [WORLD] * steps
        assert [row[2] for row in ep["reduced"]] == [WORLD * i for i in range(steps)]
        assert ep["reduced"] == eps[0]["reduced"]
    real = [(g, p) for ep in eps.values() for g, p, pad, _t, _c in ep["items"] if not pad]
    assert len(set(real)) == len(real), "a (generation, position) pair repeats within an epoch"
    assert sorted(p for _g, p in real) == list(range(SWAP_CAP)), \
        "real items do not cover each position exactly once"
    assert sum(row[1] for row in eps[0]["reduced"]) == SWAP_CAP
    return real


def run_ddp(tmp_path, feed, kind, workers, persistent, refresh, rank_env):
    cfg = feed.cfg
    common = dict(kind=kind, cfg=cfg, workers=workers, persistent=persistent, refresh=refresh,
                  rank_env=rank_env)
    t0 = time.monotonic()
    seals0 = feed.seals()
    main = launch(tmp_path, "main", epochs=EPOCHS, **common)
    seals1 = feed.seals()
    t_main = time.monotonic() - t0

    n = main[0]["len"]
    assert all(main[r]["len"] == n for r in main)
    gens = set()
    for e in range(EPOCHS):
        eps = {r: main[r]["epochs"][e] for r in main}
        assert all(ep["steps"] == n for ep in eps.values()), "steps per epoch != len(loader)"
        assert all(ep["epoch"] == e for ep in eps.values()), "iterations must advance the epoch"
        gens |= {g for g, _p in check_epoch(eps)}
        for r, ep in eps.items():
            assert [(p, pad) for _g, p, pad, _t, _c in ep["items"]] == \
                plan_positions(cfg, kind, r, e, n), f"rank {r} epoch {e} is not in plan order"
    check_ids(main.values())
    assert seals1 > seals0, "the manager did not swap while the ranks read"
    assert len(gens) >= 2, f"every epoch read generation {gens}: swapping was not exercised"

    # resume: k batches of RESUME_EPOCH while swapping, then (store frozen) the rest
    take = n - 1
    first = launch(tmp_path, "first", epochs=1, take=take, set_epoch=RESUME_EPOCH, **common)
    feed.stop()
    states = {r: first[r]["state"] for r in first}
    state_file = tmp_path / "states.json"
    state_file.write_text(json.dumps(states))
    store = _C.Store(**store_kwargs(resolve(cfg)))
    newest = store.current()
    kept = {}
    for r, st in states.items():
        assert st["epoch"] == RESUME_EPOCH and st["batches_consumed"] == take
        try:
            store.read(st["generation"], 0)
            kept[r] = st["generation"]
        except wt.GenerationGoneError:
            kept[r] = newest
    rest = launch(tmp_path, "rest", epochs=1, resume=str(state_file), **common)

    both = {}
    for r in range(WORLD):
        a, b = first[r]["epochs"][0], rest[r]["epochs"][0]
        assert a["steps"] == take and b["steps"] == n - take
        assert b["epoch"] == RESUME_EPOCH
        seq = [(p, pad) for _g, p, pad, _t, _c in a["items"] + b["items"]]
        assert seq == [(p, pad) for _g, p, pad, _t, _c in main[r]["epochs"][RESUME_EPOCH]["items"]]
        want_gen = newest if refresh == "step" else kept[r]
        assert {g for g, *_ in b["items"]} == {want_gen}, \
            f"rank {r} resumed on {({g for g, *_ in b['items']})}, expected {want_gen}"
        both[r] = {"steps": n, "items": a["items"] + b["items"],
                   "reduced": a["reduced"] + [[x, y, z + WORLD * take] for x, y, z in b["reduced"]]}
    check_epoch(both)
    check_ids(list(first.values()) + list(rest.values()))
    return {"main_s": round(t_main, 1), "seals": seals1 - seals0, "generations": len(gens)}


# Variants: persistent DataLoader workers or not; refresh per epoch or per
# step; rank from RANK/WORLD_SIZE (torchrun) or from the process group only.
@pytest.mark.parametrize("persistent,refresh,rank_env", [
    (True, "epoch", True), (False, "step", False)], ids=["persistent-epoch", "fresh-step-pg"])
def test_dataloader_ddp_no_duplicates_lockstep_resume(tmp_path, feed, persistent, refresh,
                                                      rank_env):
    print(run_ddp(tmp_path, feed, "dataset", WORKERS, persistent, refresh, rank_env))


@pytest.mark.parametrize("refresh,rank_env", [("epoch", True), ("step", False)],
                         ids=["epoch", "step-pg"])
def test_wirehead_loader_ddp_no_duplicates_lockstep_resume(tmp_path, feed, refresh, rank_env):
    print(run_ddp(tmp_path, feed, "loader", 2, False, refresh, rank_env))



@pytest.fixture
def one_generation(store_cfg):
    """(config, generation): a store with one sealed generation."""
    cfg = store_cfg(swap_cap=SWAP_CAP)
    wt.WireheadGenerator((whlib.sample(6, i) for i in range(SWAP_CAP)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    return cfg, _C.Store(**store_kwargs(resolve(cfg))).current()


# A checkpoint taken after load_state_dict and before the first batch (a
# save on SIGTERM, a save/load/save round trip) must resume at the same
# place: same epoch, batches consumed and generation.

def test_loader_state_saved_right_after_resume_is_the_loaded_state(one_generation):
    cfg, gen = one_generation
    opts = dict(config=cfg, batch_size=BATCH, num_threads=2, rank=1, world_size=WORLD,
                seed=SEED)
    ld = wt.WireheadLoader(**opts)
    ld.set_epoch(RESUME_EPOCH)
    it = iter(ld)
    next(it), next(it)
    state = ld.state_dict()
    del it
    ld.close()
    assert (state["epoch"], state["batches_consumed"], state["generation"]) == \
        (RESUME_EPOCH, 2, gen)
    again = wt.WireheadLoader(**opts)
    again.load_state_dict(state)
    try:
        assert again.state_dict() == state
    finally:
        again.close()


def test_dataset_state_saved_right_after_resume_is_the_loaded_state(one_generation):
    cfg, gen = one_generation
    state = {"epoch": RESUME_EPOCH, "batches_consumed": 3, "generation": gen, "seed": SEED,
             "world_size": WORLD, "num_workers": WORKERS, "batch_size": BATCH,
             "drop_last": False}
    ds = wt.WireheadIterableDataset(config=cfg, batch_size=BATCH, num_workers=WORKERS,
                                    rank=1, world_size=WORLD, seed=SEED)
    ds.load_state_dict(state)
    assert ds.state_dict(batches_consumed=3) == state
