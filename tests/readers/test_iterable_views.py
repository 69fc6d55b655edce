"""WireheadIterableDataset(views=True): iterated in-process on shm, items
view the store (no copy, the generation pinned while they live); a refused
pin falls back to a copy; under DataLoader workers views are ignored."""
import gc
import os

import pytest
import torch
from test_start_methods import SWAP_CAP

import wirehead_torch as wt
from wirehead_torch import _C

import whlib
from test_views import pins, put_and_seal, view_all

pytestmark = pytest.mark.asan


def fill(cfg):
    wt.WireheadGenerator((whlib.sample(5, i) for i in range(SWAP_CAP)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1


def check_items(items):
    """Every item's bytes match its id and position; real positions once each."""
    real = []
    for it in items:
        _, counter = whlib.check_sample(it["id"].numpy(), it["data"].numpy())
        assert counter == int(it["position"])
        if not bool(it["is_pad"]):
            real.append(int(it["position"]))
    assert sorted(real) == list(range(SWAP_CAP))


def test_in_process_views_copy_nothing_and_pin_while_alive(shm_cfg, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    cfg = shm_cfg(swap_cap=SWAP_CAP)
    fill(cfg)
    st = whlib.open_store(cfg)
    ds = wt.WireheadIterableDataset(config=cfg, views=True)
    _C.counters_reset()
    items = list(ds)
    assert _C.counters()["bytes_copied_out"] == 0  # views: no sample byte copied
    check_items(items)
    assert pins(st) and all(pid == os.getpid() for _, pid in pins(st).values())
    del items
    gc.collect()
    assert pins(st) == {}
    # the same dataset without views copies
    _C.counters_reset()
    check_items(list(wt.WireheadIterableDataset(config=cfg)))
    assert _C.counters()["bytes_copied_out"] > 0


def test_refused_pin_falls_back_to_a_copy(shm_cfg, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    cfg = shm_cfg(swap_cap=SWAP_CAP, budget="64KiB")
    fill(cfg)
    st = whlib.open_store(cfg)
    assert st.lead()
    held = view_all(st, st.current())  # this process pins the old generation
    put_and_seal(st, 1, 0)
    ds = wt.WireheadIterableDataset(config=cfg, views=True)
    _C.counters_reset()
    items = list(ds)
    assert _C.counters()["bytes_copied_out"] > 0  # refused views became copies
    assert {int(it["generation"]) for it in items} == {st.current()}
    for it in items:
        whlib.check_sample(it["id"].numpy(), it["data"].numpy())
    del held


def test_views_ignored_under_dataloader_workers(shm_cfg, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    cfg = shm_cfg(swap_cap=SWAP_CAP)
    fill(cfg)
    ds = wt.WireheadIterableDataset(config=cfg, views=True, num_workers=2)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                     multiprocessing_context="fork")
    check_items(list(dl))
    assert pins(whlib.open_store(cfg)) == {}


def test_views_options_are_checked(shm_cfg):
    mongo = {"STORE": "mongodb://127.0.0.1:1/x", "SWAP_CAP": 2, "SAMPLE": ["id", "data"]}
    with pytest.raises(ValueError, match="shm://"):
        wt.WireheadIterableDataset(config=mongo, views=True)
    with pytest.raises(ValueError, match="exclude each other"):
        wt.WireheadIterableDataset(config=shm_cfg(swap_cap=SWAP_CAP), views=True,
                                   batches=True, batch_size=2)
