"""Bad input gets a clear error naming the problem and loses nothing stored."""
import glob
import os
import time

import numpy as np
import pytest
import torch

import wirehead_torch as wt

import whlib

pytestmark = pytest.mark.asan  # also run against the sanitizer build


def filled(cfg, n=None):
    n = cfg["SWAP_CAP"] if n is None else n
    items = [whlib.sample(1, i) for i in range(n)]
    assert wt.WireheadGenerator(iter(items), config=cfg).run() == n
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    return items


def all_readable(cfg):
    ds = wt.MongoTupleheadDataset(config=cfg)
    return [whlib.check_sample(*ds[i]) for i in range(len(ds))]


@pytest.mark.parametrize("item, match", [
    ((np.zeros(2, np.int64),), "1 fields, SAMPLE names 2"),
    ((np.zeros(2), np.zeros(2), np.zeros(2)), "3 fields"),
    ([1, 2], "field 'id': expected a numpy array"),
    ((np.zeros(2, np.int64), [1.0, 2.0]), "field 'data': expected a numpy array"),
    ((np.zeros(2, np.int64), np.array(["a", "b"])), "field 'data': dtype <U1"),
    ((np.array([object()], dtype=object), np.zeros(2)), "field 'id': dtype object"),
    ((np.zeros(2, np.int64), np.zeros(2, ">f4")), "field 'data': dtype >f4"),
    ({"id": np.zeros(2), "dta": np.zeros(2)}, "do not match SAMPLE"),
    (np.zeros(3), "expected a tuple"),
])
def test_bad_samples_raise_and_keep_the_store(store_cfg, item, match):
    cfg = store_cfg(swap_cap=3)
    filled(cfg)
    with pytest.raises(wt.InvalidSampleError, match=match):
        wt.WireheadGenerator(iter([item]), config=cfg).run()
    assert len(all_readable(cfg)) == 3
    assert wt.status(cfg)["write_fill"] == 0


def test_sample_too_large_for_budget(shm_cfg):
    cfg = shm_cfg(swap_cap=2, budget="64KiB")
    big = (np.zeros(2, np.int64), np.zeros(64 * 1024, np.float32))
    with pytest.raises(wt.SampleTooLargeError, match="BYTE_BUDGET"):
        wt.WireheadGenerator(iter([big]), config=cfg).run()


def test_budget_too_small_for_swap_cap_is_an_error_not_a_hang(shm_cfg):
    cfg = shm_cfg(swap_cap=100, budget="64KiB")
    items = [(np.zeros(2, np.int64), np.zeros(4096, np.float32))] * 100
    with pytest.raises(wt.SampleTooLargeError, match="SWAP_CAP"):
        wt.WireheadGenerator(iter(items), config=cfg).run()


def test_schema_mismatch_is_clear(shm_cfg):
    cfg = shm_cfg(swap_cap=3)
    filled(cfg)
    other = dict(cfg, SAMPLE=["image", "seg"])
    with pytest.raises(wt.SchemaMismatchError, match=r"SAMPLE \[id, data\]"):
        wt.MongoheadDataset(config=other)[0]
    with pytest.raises(wt.SchemaMismatchError, match="SWAP_CAP=3"):
        wt.MongoheadDataset(config=dict(cfg, SWAP_CAP=4))[0]
    assert len(all_readable(cfg)) == 3


def test_corrupted_bytes_are_detected(shm_cfg):
    cfg = shm_cfg(swap_cap=2)
    filled(cfg)
    whlib.corrupt_shm_sample(cfg, 1, 1)
    ds = wt.MongoTupleheadDataset(config=cfg)
    whlib.check_sample(*ds[0])
    with pytest.raises(wt.CorruptSampleError, match="field 'data': checksum mismatch"):
        ds[1]
    # with checks off the bytes come through as stored
    raw = wt.MongoTupleheadDataset(config=dict(cfg, VERIFY_READS=False))[1]
    with pytest.raises(AssertionError):
        whlib.check_sample(*raw)


@pytest.mark.parametrize("size", [0, 4096])
def test_segment_cut_below_its_header_is_an_error_for_a_new_opener(shm_cfg, size):
    """A segment cut shorter than its header, 0 bytes too (a creator names
    its segment only once it holds the header's pages), is an error naming
    the truncation for readers and generators that open it afterwards, at
    once: not a store taken for half-made and removed, nor a wait."""
    cfg = shm_cfg(swap_cap=2, budget="1MiB")
    filled(cfg)
    path = f"/dev/shm/wirehead.{cfg['STORE'][len('shm://'):]}"
    os.truncate(path, size)
    t0 = time.monotonic()
    with pytest.raises(wt.CorruptSampleError, match=rf"is {size} bytes, less than its header "
                                                    r".*truncated"):
        wt.MongoheadDataset(config=cfg)[0]
    with pytest.raises(wt.CorruptSampleError, match="truncated"):
        wt.WireheadGenerator((whlib.sample(1, i) for i in range(1)), config=cfg).run()
    assert time.monotonic() - t0 < 2  # no wait for a creator
    assert os.path.getsize(path) == size  # left for the user to look at and clean


def test_segment_cut_to_nothing_under_dataloader_workers_is_an_error_at_once(shm_cfg):
    """Workers that open the store after it was cut to 0 bytes (a new
    epoch's) get the truncation error, as for any other short size, not a
    wait for a generation that ends in a TimeoutError."""
    cfg = shm_cfg(swap_cap=4, budget="1MiB", READ_TIMEOUT=20)
    filled(cfg, n=4)
    dl = wt.DataLoader(wt.WireheadIterableDataset(config=cfg), batch_size=2, num_workers=1)
    assert len(list(dl)) == 2
    os.truncate(f"/dev/shm/wirehead.{cfg['STORE'][len('shm://'):]}", 0)
    t0 = time.monotonic()
    with pytest.raises(wt.CorruptSampleError, match=r"(?s)worker.*is 0 bytes, less than its "
                                                    r"header.*truncated"):
        list(dl)
    assert time.monotonic() - t0 < 10  # workers start, and say so


def test_store_too_big_for_dev_shm_fails_at_creation(shm_cfg):
    cfg = shm_cfg(budget="16TiB")
    with pytest.raises(wt.StoreSpaceError, match="BYTE_BUDGET") as e:
        wt.WireheadGenerator(iter([]), config=cfg).run()
    assert "/dev/shm" in str(e.value)
    name = cfg["STORE"][len("shm://"):]
    assert not glob.glob(f"/dev/shm/wirehead.{name}")


def test_bad_store_names(shm_cfg):
    with pytest.raises(wt.ConfigError, match="STORE 'shm://a/b': the shm store name 'a/b'"):
        wt.status({"STORE": "shm://a/b", "SWAP_CAP": 1, "SAMPLE": ["x"]})


def test_cuda_tensor_is_refused_clearly(store_cfg):
    cfg = store_cfg()
    meta = torch.zeros(2, device="meta")
    with pytest.raises(wt.InvalidSampleError, match="field 'data': tensor on meta"):
        wt.WireheadGenerator(iter([(np.zeros(2, np.int64), meta)]), config=cfg).run()


def test_generator_of_another_shape_is_refused_before_its_first_put(store_cfg):
    """A generator whose samples differ from the store's is refused at its
    first sample, naming the field, both layouts and the ways out; nothing
    of it is put. check_layout=False lets a store of varying samples be."""
    cfg = store_cfg(swap_cap=2, SELF_SEAL=True)
    wt.WireheadGenerator((whlib.sample(1, i) for i in range(2)), config=cfg, quiet=True).run()
    before = wt.status(config=cfg)["generated"]
    g = wt.WireheadGenerator((whlib.sample(2, i, n=128) for i in range(2)), config=cfg,
                             quiet=True)
    with pytest.raises(ValueError, match=r"field 'data' of this generator's first sample is "
                                         r"float32 \[128\] but the store's samples are float32 "
                                         r"\[256\] \(generation #1\): .*wirehead-torch clean.*"
                                         r"check_layout=False"):
        g.run()
    g.close()
    assert wt.status(config=cfg)["generated"] == before  # refused before the put
    g = wt.WireheadGenerator((whlib.sample(3, i, n=128) for i in range(2)), config=cfg,
                             quiet=True, check_layout=False)
    assert g.run() == 2 and g.accepted == 2
    g.close()


def test_dataloader_ring_errors_name_the_dataloader_not_batches(shm_cfg):
    """wirehead_torch.DataLoader turns the ring on itself: its shape error
    names it and ring=False, never batches=True the user did not pass."""
    cfg = shm_cfg(swap_cap=4, SELF_SEAL=True)
    items = [whlib.sample(1, i, n=256 if i < 2 else 128) for i in range(4)]
    wt.WireheadGenerator(iter(items), config=cfg, quiet=True).run()
    dl = wt.DataLoader(wt.WireheadIterableDataset(config=cfg, shuffle=False), batch_size=4)
    with pytest.raises(ValueError) as e:
        next(iter(dl))
    said = str(e.value)
    assert "wirehead_torch.DataLoader (ring=True, its default) stacks samples of one shape" \
        in said and "pass ring=False to the DataLoader" in said, said
    assert "batches=" not in said and "generation #1 position 2" in said, said


B = 2 ** 32 + 2  # once cut to 32 bits on its way into C: a batch of 2


@pytest.mark.parametrize("make, match", [
    (lambda c: wt.WireheadLoader(config=c, batch_size=B),
     f"batch_size must be an integer in 1..1073741824, got {B}"),
    (lambda c: wt.WireheadLoader(config=c, batch_size=True), "batch_size .* got True"),
    (lambda c: wt.WireheadLoader(config=c, batch_size=2, prefetch=10 ** 7),
     "prefetch must be an integer in 1..64, got 10000000"),
    (lambda c: wt.WireheadLoader(config=c, batch_size=2, prefetch=2.5), "prefetch .* got 2.5"),
    (lambda c: wt.WireheadLoader(config=c, batch_size=2, num_threads=2 ** 32 + 1),
     "num_threads must be an integer in 1..256"),
    (lambda c: wt.WireheadLoader(config=c, batch_size=2, timeout=float("inf")),
     "timeout must be a number of seconds > 0 and below 1e\\+06, got inf"),
    (lambda c: wt.WireheadLoader(config=c, batch_size=2, timeout=float("nan")), "got nan"),
    (lambda c: wt.WireheadLoader(config=c, batch_size=2, seed=-1),
     "seed must be an integer in 0..2\\*\\*64-1, got -1"),
    (lambda c: wt.WireheadLoader(config=c, batch_size=2, seed=2.5), "seed .* got 2.5"),
    (lambda c: wt.WireheadLoader(config=c, batch_size=2, rank=0, world_size=2 ** 32 + 1),
     "world_size must be in 1..1048576"),
    (lambda c: wt.WireheadIterableDataset(config=c, batch_size=B, batches=True),
     f"batch_size must be an integer in 1..1073741824, got {B}"),
    (lambda c: wt.WireheadIterableDataset(config=c, timeout=-1), "timeout .* got -1"),
    (lambda c: wt.MongoheadDataset(config=c, timeout=float("nan")), "timeout .* got nan"),
    (lambda c: wt.DataLoader(wt.WireheadIterableDataset(config=c), batch_size=B),
     f"batch_size must be a positive integer, got {B} \\(at most 1073741824;"),
    (lambda c: wt.DataLoader(wt.WireheadIterableDataset(config=c), batch_size=2,
                             timeout=float("nan")), "timeout .* got nan"),
])
def test_reader_numbers_are_checked(shm_cfg, make, match):
    """Every number a reader takes is checked when it is made, naming the
    keyword, the value and the range: none is cut to 32 bits, floored or
    taken as inf."""
    cfg = shm_cfg(swap_cap=4)
    with pytest.raises(ValueError, match=match):
        make(cfg)


def test_numbers_into_c_are_never_cut_to_32_bits(monkeypatch, shm_cfg):
    from wirehead_torch import _C
    plan = dict(swap_cap=8, world=1, rank=0, workers=0, worker=0, batch=4, shuffle=False,
                seed=0, pad=0)
    assert _C.plan_info(**plan)["rank_batches"] == 2
    for key, value in (("batch", B), ("world", 2 ** 32 + 1), ("swap_cap", -1)):
        with pytest.raises(OverflowError, match=f"{value} is not in 0..4294967295"):
            _C.plan_info(**dict(plan, **{key: value}))
    # the environment's ranks, named as they were given
    monkeypatch.setenv("WORLD_SIZE", str(2 ** 32 + 1))
    monkeypatch.setenv("RANK", "0")
    loader = wt.WireheadLoader(config=shm_cfg(swap_cap=4), batch_size=2)
    with pytest.raises(ValueError, match="environment variable WORLD_SIZE='4294967297' is not "
                                         "an integer in 1..1048576"):
        len(loader)
