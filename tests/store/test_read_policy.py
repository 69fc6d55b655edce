"""The one C read policy (Store.read_sample / wait_generation) every reader
goes through: corrupt samples skipped as counted padding or reported,
bounded waits for a generation."""

import numpy as np
import pytest

import wirehead_torch as wt

import whlib
from whlib import open_store

pytestmark = pytest.mark.asan  # also run against the sanitizer build


def test_read_sample_skips_or_reports_a_corrupt_sample(shm_cfg):
    cfg = shm_cfg(swap_cap=3)
    items = [whlib.sample(1, i) for i in range(3)]
    assert wt.WireheadGenerator(iter(items), config=cfg).run() == 3
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    whlib.corrupt_shm_sample(cfg, 1, 1)
    store = open_store(cfg)
    gen = store.wait_generation(0, 5.0)
    # an intact sample: read as asked, not padding
    g, pos, is_pad, arrs, skipped = store.read_sample(gen, 0)
    assert (g, pos, is_pad, skipped) == (gen, 0, False, None)
    whlib.check_sample(np.from_dlpack(arrs[0]), np.from_dlpack(arrs[1]))
    # the corrupt one: its neighbour stands in, marked as padding, reason given
    g, pos, is_pad, arrs, skipped = store.read_sample(gen, 1)
    assert (g, pos, is_pad) == (gen, 2, True)
    assert "checksum mismatch" in skipped
    whlib.check_sample(np.from_dlpack(arrs[0]), np.from_dlpack(arrs[1]))
    # an indexed read (skip=False) names the corrupt sample instead
    with pytest.raises(wt.CorruptSampleError, match="checksum mismatch"):
        store.read_sample(gen, 1, skip=False)
    with pytest.raises(ValueError, match="out of range"):
        store.read_sample(gen, 3)


def test_every_sample_corrupt_is_an_error_not_a_loop(shm_cfg):
    cfg = shm_cfg(swap_cap=1)
    assert wt.WireheadGenerator(iter([whlib.sample(1, 1)]), config=cfg).run() == 1
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    whlib.corrupt_shm_sample(cfg, 1, 1)
    store = open_store(cfg)
    with pytest.raises(wt.CorruptSampleError, match="every sample of generation"):
        store.read_sample(store.current(), 0)


def test_wait_generation_is_bounded(shm_cfg):
    cfg = shm_cfg(swap_cap=2)
    store = open_store(cfg)
    with pytest.raises(wt.StoreTimeoutError, match="no generation sealed within 0.2s"):
        store.wait_generation(0, 0.2)
    # the reader's message explains what is missing
    ds = wt.MongoTupleheadDataset(config=cfg, timeout=0.2)
    with pytest.raises(TimeoutError, match="no manager is running"):
        ds[0]
