"""MongoTupleheadDataset / MongoheadDataset(batches=True) under
DataLoader(batch_size=None, sampler=BatchSampler(...)): ds[list] reads each
listed sample once into a row of a worker's shared-memory ring slot, and the
main process gets the batch default_collate would have made, viewing the slot."""
import gc
import os
import resource
import signal
import threading

import numpy as np
import pytest
import torch
from test_ring import owners, slot_files
from test_start_methods import SWAP_CAP, filled  # noqa: F401 (the fixture)
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    RandomSampler,
    SequentialSampler,
    default_collate,
)

import wirehead_torch as wt
from wirehead_torch import _ring

import whlib

pytestmark = pytest.mark.asan

WORKERS = 2
READERS = {"tuple": wt.MongoTupleheadDataset, "dict": wt.MongoheadDataset}


def loader(ds, batch, method="fork", persistent=False, sampler=None, drop_last=False):
    sampler = sampler or SequentialSampler(range(len(ds)))
    return DataLoader(ds, batch_size=None, sampler=BatchSampler(sampler, batch, drop_last),
                      num_workers=WORKERS, multiprocessing_context=method,
                      persistent_workers=persistent, timeout=120)


def pair(b):
    """(ids, data) of a batch of either reader (SAMPLE is ("id", "data"))."""
    return (b[0], b[1]) if isinstance(b, list) else (b["input"], b["label"])


def check_batch(b, indices):
    """Every byte of every row matches the sample written at its index."""
    ids, data = pair(b)
    n = len(indices)
    assert ids.shape == (n, 2) and ids.dtype == torch.int64
    assert data.shape == (n, 256) and data.dtype == torch.float32
    for ident, row, index in zip(ids, data, indices):
        _, counter = whlib.check_sample(ident.numpy(), row.numpy())
        assert counter == index


def same_as_collate(b, plain, indices):
    """b has the structure, dtypes, shapes and values default_collate gives."""
    want = default_collate([plain[i] for i in indices])
    assert type(b) is type(want)
    keys = range(len(want)) if isinstance(want, list) else want.keys()
    assert (len(b) == len(want) if isinstance(want, list) else b.keys() == want.keys())
    for k in keys:
        assert b[k].dtype == want[k].dtype and torch.equal(b[k], want[k])


def all_free(ds):
    return all(o == 0 for w in range(WORKERS) for o in owners(ds, w))


@pytest.mark.parametrize("method,persistent",
                         [("fork", False), ("spawn", True), ("forkserver", False)],
                         ids=["fork-fresh", "spawn-persistent", "forkserver-fresh"])
@pytest.mark.parametrize("kind", sorted(READERS))
def test_batches_right_each_index_once_as_collate_makes_them(filled, kind, method, persistent):
    ds = READERS[kind](config=filled, batches=True)
    plain = READERS[kind](config=filled)
    seeds = [7, 8]
    gen = torch.Generator()
    dl = loader(ds, 3, method, persistent, sampler=RandomSampler(ds, generator=gen))
    for seed in seeds:  # two epochs: the second reuses the first's slots
        gen.manual_seed(seed)
        want = list(BatchSampler(RandomSampler(ds, generator=torch.Generator().manual_seed(seed)),
                                 3, False))
        got = []
        for b, indices in zip(dl, want):
            check_batch(b, indices)
            same_as_collate(b, plain, indices)
            got += pair(b)[0][:, 1].tolist()
        assert len(got) == SWAP_CAP and sorted(got) == list(range(SWAP_CAP))
        del b
        gc.collect()
        assert all_free(ds)  # every batch gone: every slot back with its worker
    assert 0 < len(slot_files(ds)) <= WORKERS * ds.ring_slots
    # drop_last: whole batches only, no index twice
    batches = 0
    for k, b in enumerate(loader(ds, 3, method, drop_last=True)):
        check_batch(b, [3 * k, 3 * k + 1, 3 * k + 2])
        batches += 1
    assert batches == SWAP_CAP // 3
    files = slot_files(ds)
    del dl, b, ds
    gc.collect()
    assert files and not any(os.path.exists(f) for f in files)


def test_in_process_slot_reused_only_after_its_tensors_are_gone(filled):
    ds = wt.MongoTupleheadDataset(config=filled, batches=True, ring_slots=2)
    me = os.getpid()
    ids, data = ds[[0, 1, 2, 3]]
    kept, kept_id = data[1], ids[1].clone()  # a row view keeps the whole slot
    del ids, data
    assert sorted(owners(ds, "m")) == [0, me]
    b2 = ds[[4, 5, 6, 7]]
    assert owners(ds, "m") == [me, me]
    b3 = ds[[8, 9, 10, 11]]  # no slot free: ordinary memory, nothing overwritten
    assert owners(ds, "m") == [me, me]
    check_batch(b2, [4, 5, 6, 7])
    check_batch(b3, [8, 9, 10, 11])
    whlib.check_sample(kept_id.numpy(), kept.numpy())
    del b2
    gc.collect()
    assert sorted(owners(ds, "m")) == [0, me]
    b4 = ds[[12, 13, 14, 15]]  # the freed slot, not the kept one
    check_batch(b4, [12, 13, 14, 15])
    whlib.check_sample(kept_id.numpy(), kept.numpy())
    del kept, b3, b4
    gc.collect()
    assert owners(ds, "m") == [0, 0]
    # indices as numpy or torch arrays, negative ones counted from the end
    check_batch(ds[np.array([19, -2])], [19, 18])
    check_batch(ds[torch.tensor([0, 5])], [0, 5])
    # num_workers=0: the DataLoader hands out the in-process batches
    dl = DataLoader(ds, batch_size=None, sampler=BatchSampler(SequentialSampler(ds), 6, False))
    for k, b in enumerate(dl):
        check_batch(b, list(range(6 * k, min(6 * k + 6, SWAP_CAP))))


def test_workers_wait_for_held_slots_then_send_plain_batches(filled):
    """A loop that keeps every batch never sees one overwritten: a worker
    whose one slot is held sends its next batches the ordinary way."""
    ds = wt.MongoheadDataset(config=filled, batches=True, ring_slots=1)
    kept = list(loader(ds, 4))
    for k, b in enumerate(kept):
        check_batch(b, list(range(4 * k, 4 * k + 4)))
    assert sorted(o for w in range(WORKERS) for o in owners(ds, w)) == [os.getpid()] * WORKERS
    del kept, b
    gc.collect()
    assert all_free(ds)


class _Unopened(Dataset):
    """Hands the ring handle on unopened, so the test opens it when it likes."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, indices):
        return self.ds[indices].handle


def test_worker_killed_mid_epoch_leaks_no_slot_and_its_late_handle_is_refused(shm_cfg,
                                                                              monkeypatch):
    cfg = shm_cfg(swap_cap=64)
    wt.WireheadGenerator((whlib.sample(5, i) for i in range(64)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    ds = wt.MongoTupleheadDataset(config=cfg, batches=True)
    it = iter(loader(_Unopened(ds), 4))
    late = next(it)  # worker 0's first batch, still in its slot
    victim = it._workers[0].pid
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=str(victim)):
        for _ in it:
            pass
    del it
    gc.collect()
    # the next epoch's workers take the regions over and reclaim every slot
    # the dead worker (or a finished one) held for a batch never opened
    for k, b in enumerate(loader(ds, 4)):
        check_batch(b, list(range(4 * k, 4 * k + 4)))
    assert k == 15
    del b
    gc.collect()
    assert all_free(ds)
    assert len(slot_files(ds)) <= WORKERS * ds.ring_slots
    with pytest.raises(RuntimeError, match="reclaimed or refilled before its batch arrived"):
        _ring._open(late)
    assert all_free(ds)


def test_batches_refuse_what_cannot_view_a_shared_slot(shm_cfg):
    cfg = shm_cfg()
    for cls in READERS.values():
        for kw in ({"transform": abs}, {"normalize": abs}, {"views": True},
                   {"output": "numpy"}):
            key = next(iter(kw))
            with pytest.raises(ValueError, match=f"^{key}= with batches=True: "):
                cls(config=cfg, batches=True, **kw)
            cls(config=cfg, **kw)  # each is fine without batches
        with pytest.raises(ValueError, match="ring_slots"):
            cls(config=cfg, batches=True, ring_slots=0)
        with pytest.raises(ValueError, match="'id' twice"):
            cls(config=cfg, batches=True, sample=["id", "id"])


def test_one_index_is_the_item_and_bad_indices_are_errors(filled):
    for cls in READERS.values():
        ds, plain = cls(config=filled, batches=True), cls(config=filled)
        one, want = ds[3], plain[3]
        assert type(one) is type(want)
        for k in (range(2) if isinstance(want, tuple) else want):
            assert torch.equal(one[k], want[k]) and one[k].dtype == want[k].dtype
        with pytest.raises(IndexError, match="index 20 out of range"):
            ds[[0, 20]]
        with pytest.raises(IndexError, match="empty list"):
            ds[[]]
        # so a DataLoader that asks for single items still collates them
        b = next(iter(DataLoader(ds, batch_size=4)))
        same_as_collate(b, plain, [0, 1, 2, 3])


def test_single_indices_in_a_worker_are_logged_once(filled, monkeypatch, caplog):
    # what a DataLoader(batch_size=B) worker does with a batches=True reader
    ds = wt.MongoTupleheadDataset(config=filled, batches=True)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    with caplog.at_level("WARNING", logger="wirehead_torch"):
        for i in range(3):
            ds[i]
    said = [r.getMessage() for r in caplog.records if "one index at a time" in r.getMessage()]
    assert len(said) == 1 and "BatchSampler" in said[0]


def test_samples_of_another_shape_are_an_error_naming_the_field(shm_cfg):
    cfg = shm_cfg(swap_cap=4)
    items = [whlib.sample(1, i, n=256 if i < 2 else 128) for i in range(4)]
    wt.WireheadGenerator(iter(items), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    ds = wt.MongoheadDataset(config=cfg, batches=True)
    with pytest.raises(ValueError, match=r"MongoheadDataset\(batches=True\) stacks samples of "
                                         r"one shape: field 'data' is float32 \[256\] in this "
                                         r"batch but float32 \[128\] at generation #1 "
                                         r"position 2"):
        ds[[0, 1, 2]]
    # a batch of one other shape is learnt anew; then the old shape is the odd one
    b = ds[[2, 3]]
    assert b["label"].shape == (2, 128)
    with pytest.raises(ValueError, match=r"float32 \[128\] in this batch but float32 \[256\]"):
        ds[[3, 0]]
    del b
    gc.collect()
    assert owners(ds, "m") == [0] * ds.ring_slots


def test_dtype_torch_cannot_hold_is_the_iterable_paths_error(shm_cfg):
    cfg = shm_cfg(swap_cap=2, sample=("img", "lbl"))
    items = [(np.full(3, i, np.float32), np.full(3, 60000 + i, np.uint16)) for i in range(2)]
    wt.WireheadGenerator(iter(items), config=cfg).run()
    wt.WireheadManager(config=cfg).run(max_swaps=1)
    # torch >= 2.3 views uint16: there a cast asked for is no error
    for cast in [None] + ([] if hasattr(torch, "uint16") else [{"lbl": "int64"}]):
        with pytest.raises(TypeError) as it_err:
            next(iter(wt.WireheadIterableDataset(config=cfg, batch_size=2, batches=True,
                                                 cast=cast)))
        for cls in READERS.values():
            with pytest.raises(TypeError) as map_err:
                cls(config=cfg, batches=True, cast=cast)[[0, 1]]
            assert str(map_err.value) == str(it_err.value)
            assert "'lbl'" in str(map_err.value) and "uint16" in str(map_err.value)
    if hasattr(torch, "uint16"):
        x, y = wt.MongoTupleheadDataset(config=cfg, batches=True, cast={"lbl": "int64"})[[1, 0]]
        assert y.dtype == torch.int64 and y[:, 0].tolist() == [60001, 60000]


def test_a_corrupt_sample_is_an_error_naming_it(shm_cfg):
    cfg = shm_cfg(swap_cap=3)
    wt.WireheadGenerator((whlib.sample(1, i) for i in range(3)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    whlib.corrupt_shm_sample(cfg, 1, 1)
    ds = wt.MongoTupleheadDataset(config=cfg, batches=True)
    with pytest.raises(wt.CorruptSampleError,
                       match=r"generation \d+ position 1: field 'data': checksum mismatch"):
        ds[[0, 1, 2]]
    assert owners(ds, "m") == [0] * ds.ring_slots  # the slot went back
    check_batch(ds[[2, 0]], [2, 0])  # the intact ones read as asked, none stands in


def test_a_handle_whose_layout_is_not_its_fill_is_refused_and_its_slot_goes_back(filled):
    """A batch's layout crosses in its handle as bytes only C writes and
    reads: one that is not the layout its rows give is refused at the claim,
    naming it, and the slot the handle names goes back to its worker."""
    ds = wt.MongoTupleheadDataset(config=filled, batches=True)
    dl = DataLoader(_Unopened(ds), batch_size=None, num_workers=1, timeout=120,
                    sampler=BatchSampler(SequentialSampler(range(4)), 2, False))
    first, second = list(dl)  # two of the worker's four slots, sent
    assert owners(ds, 0)[first.slot] == first.worker_pid  # sent, not yet claimed
    words = whlib.wire_words(first.wire)
    words[whlib.WIRE_WORDS["hsize"]] += 64  # the slot's part said larger than its rows give
    with pytest.raises(ValueError, match="layout is refused: its offsets or sizes are not"):
        _ring._open(first._replace(wire=whlib.pack_wire(words)))
    assert owners(ds, 0)[first.slot] == 0  # back to its worker, not lost
    check_batch(_ring._open(second), [2, 3])  # the next handle opens as ever


def test_a_reclaimed_generation_moves_to_the_newest(shm_cfg, monkeypatch):
    """The read policy of the indexed read stays: a batch asked of a
    generation already reclaimed is read from the newest one."""
    cfg = shm_cfg(swap_cap=4)
    store = whlib.open_store(cfg)
    gens = []
    for tag in range(1, 9):  # seals until the first generation is reclaimed
        wt.WireheadGenerator((whlib.sample(tag, i) for i in range(4)), config=cfg).run()
        assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
        gens.append(store.current())
        try:
            store.read(gens[0], 0)
        except wt.GenerationGoneError:
            break
    else:
        pytest.fail(f"generation {gens[0]} still readable after {len(gens)} seals")
    # the one rule of which generation a read starts on, made to pick the old one
    monkeypatch.setattr(wt._reader.Generations, "for_epoch", lambda *a, **k: gens[0])
    ids, data = wt.MongoTupleheadDataset(config=cfg, batches=True)[[2, 0, 1]]
    check_batch([ids, data], [2, 0, 1])
    assert ids[:, 0].tolist() == [len(gens)] * 3  # the newest generation's samples


def test_a_dataset_collected_closes_its_ring_descriptor(filled):
    def fds():
        return len(os.listdir("/proc/self/fd"))

    ds = wt.MongoTupleheadDataset(config=filled, batches=True)
    ds[[0, 1]]  # warm: the first ring and store handle of this process
    del ds
    gc.collect()
    before = fds()
    for _ in range(20):
        ds = wt.MongoTupleheadDataset(config=filled, batches=True)
        check_batch(ds[[0, 1, 2]], [0, 1, 2])
        del ds
        gc.collect()
    assert fds() <= before + 1  # not one per dataset


def test_threads_indexing_one_reader_never_share_a_slot(filled):
    ds = wt.MongoTupleheadDataset(config=filled, batches=True, ring_slots=4)
    ds[[0]]  # makes this process's ring region
    gc.collect()
    # the C ring takes a slot (scan, then claim) under its mutex
    got, errors = {}, []

    def read(k, indices):
        try:
            got[k] = (indices, ds[indices])
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=read, args=(k, [4 * k + r for r in range(4)]))
               for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(got) == 2
    ptrs = set()
    for indices, b in got.values():
        check_batch(b, indices)
        ptrs.add(b[0].data_ptr())
    assert len(ptrs) == 2, "two live batches over one slot"


def test_a_full_dev_shm_is_an_error_and_loses_no_slot(filled):
    ds = wt.MongoheadDataset(config=filled, batches=True, ring_slots=2)
    check_batch(ds[[0]], [0])  # the region and slot 0, one page: too small for 4 rows
    gc.collect()
    before = slot_files(ds)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # no file may grow: reserving slot 0's larger file fails as a full /dev/shm does
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))
    try:
        with pytest.raises(OSError, match=r"cannot reserve \d+ bytes in /dev/shm .*ring_slots"):
            ds[[0, 1, 2, 3]]
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert owners(ds, "m") == [0, 0] and slot_files(ds) == before
    check_batch(ds[[2, 3, 4, 5]], [2, 3, 4, 5])  # the same slots work once there is room
