"""DataLoader(WireheadIterableDataset, num_workers=2) under the fork, spawn
and forkserver start methods, with and without persistent workers: each
epoch yields every position once, epochs advance (and differ in order)
without set_epoch, and set_epoch(e) makes the next iteration epoch e."""
import multiprocessing

import pytest
import torch

import wirehead_torch as wt
from wirehead_torch import _C
from wirehead_torch._order import Order
from wirehead_torch.config import resolve

import whlib

SWAP_CAP = 20  # 2 workers x batch 4: 10 steps per worker, padded to 12
WORKERS = 2
BATCH = 4
SEED = 3
METHODS = [m for m in ("fork", "spawn", "forkserver")
           if m in multiprocessing.get_all_start_methods()]


def test_all_start_methods_are_available():
    assert METHODS == ["fork", "spawn", "forkserver"]




@pytest.fixture
def filled(store_cfg, monkeypatch):
    """One sealed generation; no DDP environment (world size 1)."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    cfg = store_cfg(swap_cap=SWAP_CAP)
    wt.WireheadGenerator((whlib.sample(5, i) for i in range(SWAP_CAP)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    return cfg


def plan(cfg, epoch):
    """(position, is_pad) in the order the DataLoader delivers epoch: batch
    i comes from worker i mod WORKERS."""
    o = Order(resolve(cfg), None, True, SEED, "repeat", -100, None, "epoch", 0, 1)
    per_worker = []
    for w in range(WORKERS):
        pos, pad = _C.plan_items(**o.plan(WORKERS, w, BATCH), epoch=epoch)
        per_worker.append([(p, bool(x)) for p, x in zip(memoryview(pos).cast("q"), pad)])
    steps = len(per_worker[0])
    seq = []
    for i in range(WORKERS * steps // BATCH):
        k = i // WORKERS
        seq += per_worker[i % WORKERS][k * BATCH:(k + 1) * BATCH]
    return seq


def loader(cfg, method, persistent):
    ds = wt.WireheadIterableDataset(config=cfg, batch_size=BATCH, num_workers=WORKERS,
                                    seed=SEED)
    dl = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=WORKERS,
                                     multiprocessing_context=method,
                                     persistent_workers=persistent)
    return ds, dl


def epoch_items(dl):
    """One iteration: [(position, is_pad)], every sample checked."""
    out, gens = [], set()
    for b in dl:
        assert set(b) == {"id", "data", "is_pad", "generation", "position",
                      "params_version"}
        assert b["is_pad"].dtype == torch.bool and b["position"].dtype == torch.int64
        for ident, data in zip(b["id"], b["data"]):
            whlib.check_sample(ident.numpy(), data.numpy())
        gens |= set(b["generation"].tolist())
        out += [(int(p), bool(x)) for p, x in zip(b["position"], b["is_pad"])]
    assert len(gens) == 1
    return out


def covers_once(items):
    real = [p for p, pad in items if not pad]
    return sorted(real) == list(range(SWAP_CAP))


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_epochs_cover_each_position_once_and_advance(filled, method, persistent):
    ds, dl = loader(filled, method, persistent)
    assert len(dl) == 6 and len(ds) == 24
    ep0, ep1 = epoch_items(dl), epoch_items(dl)
    for items in (ep0, ep1):
        assert len(items) == len(dl) * BATCH
        assert covers_once(items), items
    # no set_epoch: the second iteration is epoch 1, in a new order
    assert [p for p, _ in ep0] != [p for p, _ in ep1]
    assert ep0 == plan(filled, 0) and ep1 == plan(filled, 1)
    # set_epoch(e): the next iteration is epoch e, the one after e + 1
    ds.set_epoch(5)
    ep5, ep6 = epoch_items(dl), epoch_items(dl)
    assert ep5 == plan(filled, 5) and ep6 == plan(filled, 6)
    assert covers_once(ep5) and covers_once(ep6)
    # a fresh dataset told set_epoch(1) yields epoch 1 in the same order
    fresh, fresh_dl = loader(filled, method, persistent)
    fresh.set_epoch(1)
    assert epoch_items(fresh_dl) == ep1
