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


def test_a_handle_on_a_removed_segment_reads_a_generation_of_the_new_one(shm_cfg):
    """A handle that still maps a store's removed segment, asked for a
    generation sealed in the segment made again under its name (as a loader
    thread is, when another thread's handle moved first), reads it there:
    it moves to the new segment and reads what was asked, instead of
    waiting for a newer generation that may never come."""
    cfg = shm_cfg(swap_cap=2)

    def fill(tag):
        items = [whlib.sample(tag, i) for i in range(2)]
        assert wt.WireheadGenerator(iter(items), config=cfg).run() == 2
        assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1

    fill(1)
    old = open_store(cfg)
    first = old.wait_generation(0, 5.0)
    wt.clean(cfg)
    fill(2)
    new = open_store(cfg)
    asked = new.current()
    assert asked > first  # ids keep increasing across the remake
    g, pos, is_pad, arrs, skipped = old.read_sample(asked, 1, timeout=5.0, skip=False)
    assert (g, pos, is_pad, skipped) == (asked, 1, False, None)
    want = [np.from_dlpack(a) for a in new.read_sample(asked, 1, skip=False)[3]]
    for a, b in zip((np.from_dlpack(a) for a in arrs), want):
        assert np.array_equal(a, b)
