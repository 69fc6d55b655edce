"""WireheadIterableDataset(batches=True): DataLoader workers read each sample
once into a shared-memory ring slot; the main process's batch tensors view
the slot, which goes back to its worker only after they are all gone."""
import gc
import glob
import mmap
import os
import signal

import numpy as np
import pytest
import torch
from test_start_methods import SWAP_CAP, filled  # noqa: F401 (the fixture)

import wirehead_torch as wt
from wirehead_torch import _ring

import whlib

pytestmark = pytest.mark.asan

BATCH = 4
WORKERS = 2


def ring_ds(cfg, workers=WORKERS, **kw):
    return wt.WireheadIterableDataset(config=cfg, batch_size=BATCH, num_workers=workers,
                                      batches=True, **kw)


def ring_dl(ds, method="fork", persistent=False):
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=WORKERS,
                                       multiprocessing_context=method,
                                       persistent_workers=persistent)


def owners(ds, worker):
    """Owner pid of each slot of a worker's ring region (0: free)."""
    path = _ring.region_path(os.getpid(), ds._batch_ring.token, worker)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    words = np.frombuffer(m, np.int64).copy()
    m.close()
    return [int(x) for x in words[0::4]]


def slot_files(ds):
    return sorted(glob.glob(f"{_ring.DIR}/{_ring.PREFIX}{os.getpid()}.{ds._batch_ring.token}.w*.s*"))


def check_batch(b, n=BATCH):
    """Every sample's bytes match its id; returns [(position, is_pad)]."""
    assert set(b) == {"id", "data", "is_pad", "generation", "position",
                      "params_version"}
    assert b["data"].shape == (n, 256) and b["data"].dtype == torch.float32
    assert b["id"].shape == (n, 2) and b["id"].dtype == torch.int64
    assert b["is_pad"].dtype == torch.bool and b["position"].dtype == torch.int64
    for ident, data, pos in zip(b["id"], b["data"], b["position"]):
        _, counter = whlib.check_sample(ident.numpy(), data.numpy())
        assert counter == int(pos)
    return [(int(p), bool(x)) for p, x in zip(b["position"], b["is_pad"])]


def covers_once(items):
    real = [p for p, pad in items if not pad]
    return sorted(real) == list(range(SWAP_CAP))


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_bytes_correct_and_each_sample_once(filled, method, persistent):
    ds = ring_ds(filled)
    dl = ring_dl(ds, method, persistent)
    assert len(dl) == len(ds) == 6  # 10 steps per worker padded to 12: 3 batches each
    for _ in range(3):
        items = []
        for b in dl:
            items += check_batch(b)
        assert len(items) == 24 and covers_once(items), items
        del b
        gc.collect()
        # every batch is gone: every slot is back with its worker
        assert all(o == 0 for w in range(WORKERS) for o in owners(ds, w))
    # slots are reused, not made anew per batch or epoch
    files = slot_files(ds)
    assert 0 < len(files) <= WORKERS * ds.ring_slots
    del dl
    gc.collect()
    ds_files = slot_files(ds)
    del ds
    gc.collect()
    assert ds_files and not any(os.path.exists(f) for f in ds_files)


def test_slot_reused_only_after_its_tensors_are_gone(filled):
    """In-process: a held view keeps its slot (and bytes) while later
    batches are read; its slot is free again once the view is gone."""
    ds = ring_ds(filled, workers=None, ring_slots=2)
    it = iter(ds)
    first = next(it)
    kept = first["data"][1]  # a view keeps the whole slot
    kept_id = first["id"][1].clone()
    del first
    held = [o for o in owners(ds, "m") if o]
    assert held == [os.getpid()]
    items = []
    for b in it:
        items += check_batch(b)
        whlib.check_sample(kept_id.numpy(), kept.numpy())
    assert len(items) == 16
    assert sum(1 for o in owners(ds, "m") if o) >= 1  # the kept view's slot
    del kept, b
    gc.collect()
    assert owners(ds, "m") == [0, 0]
    # the same dataset under a DataLoader: its workers have regions of their own
    for b in ring_dl(ds):
        check_batch(b)
    assert all(any(f".w{w}.s" in f for f in slot_files(ds)) for w in range(WORKERS))


def test_a_forked_child_dropping_the_parents_batch_keeps_its_slot_held(filled):
    """A child forked while the parent holds a batch has a copy of it; the
    child dropping that copy must not hand the slot back (the parent's
    tensors still use it, and a refill would change them)."""
    ds = ring_ds(filled, workers=None, ring_slots=2)
    it = iter(ds)
    first = next(it)
    assert [o for o in owners(ds, "m") if o] == [os.getpid()]
    pid = os.fork()
    if pid == 0:  # the child: drops its copies, collects, and leaves
        code = 0
        try:
            del first
            gc.collect()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [o for o in owners(ds, "m") if o] == [os.getpid()]
    ids = first["id"].clone()
    for b in it:
        check_batch(b)
    assert torch.equal(first["id"], ids)  # still the bytes it was handed
    del first, b
    gc.collect()
    assert owners(ds, "m") == [0, 0]


def test_workers_wait_for_held_slots_then_send_plain_batches(filled):
    """A loop that keeps every batch never sees one overwritten: when all of
    a worker's slots are held, it sends the batch the ordinary way."""
    ds = ring_ds(filled, ring_slots=1)
    kept = list(ring_dl(ds))
    items = []
    for b in kept:
        items += check_batch(b)
    assert covers_once(items)
    assert sorted(o for w in range(WORKERS) for o in owners(ds, w)) == [os.getpid()] * WORKERS
    del kept, b
    gc.collect()
    assert all(o == 0 for w in range(WORKERS) for o in owners(ds, w))


def test_worker_killed_mid_epoch_leaks_no_slot(shm_cfg, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    cfg = shm_cfg(swap_cap=64)
    wt.WireheadGenerator((whlib.sample(5, i) for i in range(64)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    ds = ring_ds(cfg)
    it = iter(ring_dl(ds))
    check_batch(next(it))
    victim = it._workers[0].pid
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=str(victim)):
        for b in it:
            check_batch(b)
    del it
    gc.collect()
    # the next iteration's worker takes the region over and reclaims the
    # dead worker's slots; afterwards every slot is free again
    items = []
    for b in ring_dl(ds):
        items += check_batch(b)
    assert sorted(p for p, pad in items if not pad) == list(range(64))
    del b
    gc.collect()
    got = [o for w in range(WORKERS) for o in owners(ds, w)]
    assert got == [0] * len(got)
    assert len(slot_files(ds)) <= WORKERS * ds.ring_slots


def test_samples_of_another_shape_are_an_error_naming_the_field(shm_cfg):
    cfg = shm_cfg(swap_cap=4)
    items = [whlib.sample(1, i, n=256 if i < 2 else 128) for i in range(4)]
    wt.WireheadGenerator(iter(items), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    ds = wt.WireheadIterableDataset(config=cfg, batch_size=4, batches=True, shuffle=False)
    with pytest.raises(ValueError, match=r"field 'data' is float32 \[256\].*\[128\]"):
        next(iter(ds))


def test_options_are_checked(shm_cfg):
    cfg = shm_cfg()
    with pytest.raises(ValueError, match="batch_size"):
        wt.WireheadIterableDataset(config=cfg, batches=True)
    with pytest.raises(ValueError, match="transform"):
        wt.WireheadIterableDataset(config=cfg, batch_size=2, batches=True, transform=abs)
    with pytest.raises(ValueError, match="ring_slots"):
        wt.WireheadIterableDataset(config=cfg, batch_size=2, batches=True, ring_slots=0)
    # above the ring's bound: refused here, not later in a DataLoader worker
    with pytest.raises(ValueError, match="ring_slots must be an integer 1..65536"):
        wt.WireheadIterableDataset(config=cfg, batch_size=2, batches=True, ring_slots=10**6)


def test_pad_ignore_and_field_subset_in_batches(filled):
    """Padding rows of the label field hold ignore_index; only the fields
    asked for are read."""
    ds = wt.WireheadIterableDataset(config=filled, batch_size=8, batches=True, pad="ignore",
                                    ignore_index=-100, shuffle=False)
    pads = 0
    for b in ds:
        assert b["data"].shape[0] == 8
        for ident, data, pad in zip(b["id"], b["data"], b["is_pad"]):
            if pad:
                pads += 1
                assert bool((data == -100).all())
            else:
                whlib.check_sample(ident.numpy(), data.numpy())
    assert pads == 4  # 20 samples padded to 3 batches of 8
    only = wt.WireheadIterableDataset(config=filled, batch_size=4, batches=True, fields=["id"])
    b = next(iter(only))
    assert set(b) == {"id", "is_pad", "generation", "position",
                      "params_version"} and b["id"].shape == (4, 2)


def test_shared_map_words_and_size_checks(tmp_path):
    path = str(tmp_path / "ctl")
    m = wt._C.SharedMap(path, 32, how="create")
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.path.getsize(path) == 32
    with pytest.raises(OSError, match="ctl holds 32 bytes, 64 expected"):
        wt._C.SharedMap(path, 64)  # a short file is refused, not a SIGBUS later
    with pytest.raises(OSError, match="ctl exists already"):
        wt._C.SharedMap(path, 32, how="create")
    assert m.size == 32 and m.path == path
    m.store(1, 7)
    assert not m.cas(1, 6, 9) and m.load(1) == 7
    assert m.cas(1, 7, 9) and m.load(1) == 9
    assert m.add(3, 5) == 5
    with pytest.raises(IndexError, match="word 4 outside"):
        m.load(4)
    with pytest.raises(IndexError):
        m.store(-1, 0)
    view = memoryview(m)
    del m  # the buffer keeps the mapping alive
    with open(path, "rb") as f:
        assert view.cast("q")[1] == 9 and f.read()[8:16] == (9).to_bytes(8, "little")


@pytest.mark.parametrize("dtype", ["int16", "int64", "float16", "bfloat16", "float32", "float64"])
def test_pad_ignore_through_workers_in_every_label_dtype(shm_cfg, dtype):
    """The fill writes ignore_index into the padding rows' label field, in
    each dtype a label can have; the main process's check of every row
    holds for the rows written after their read."""
    cfg = shm_cfg(swap_cap=5, sample=("img", "lbl"))
    tdt = getattr(torch, dtype)
    items = [(torch.full((3,), float(i)), torch.full((2,), i + 1, dtype=tdt)) for i in range(5)]
    wt.WireheadGenerator(iter(items), config=cfg).run()
    wt.WireheadManager(config=cfg).run(max_swaps=1)
    ds = ring_ds(cfg, pad="ignore", ignore_index=-100, label_fields=["lbl"], shuffle=False)
    pads = 0
    for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=WORKERS):
        assert b["lbl"].dtype == tdt
        for img, lbl, pad in zip(b["img"], b["lbl"], b["is_pad"]):
            want = -100 if pad else int(img[0]) + 1
            assert lbl.float().tolist() == [want, want]
            pads += bool(pad)
    assert pads == 3  # 5 samples over 2 workers, each padded to 2 batches of 4


def test_pad_ignore_that_does_not_fit_the_label_is_an_error(shm_cfg):
    cfg = shm_cfg(swap_cap=3, sample=("img", "lbl"))
    items = [(np.full(3, i, np.float32), np.full(2, i, np.uint8)) for i in range(3)]
    wt.WireheadGenerator(iter(items), config=cfg).run()
    wt.WireheadManager(config=cfg).run(max_swaps=1)
    ds = wt.WireheadIterableDataset(config=cfg, batch_size=2, batches=True, pad="ignore",
                                    ignore_index=-100, label_fields=["lbl"], shuffle=False)
    it = iter(ds)
    # the first batch, which holds no padding, already says so
    with pytest.raises(ValueError, match="ignore_index -100 does not fit label field 'lbl'"):
        next(it)


@pytest.mark.parametrize("workers", [0, WORKERS])
def test_pad_ignore_goes_into_the_cast_dtype(shm_cfg, workers):
    """uint8 labels cast to int64 take ignore_index -100 in their padding
    rows (the value is meant for the dtype the batch is delivered in), as
    WireheadLoader and the item path do; the stored bytes are untouched."""
    cfg = shm_cfg(swap_cap=5, sample=("img", "lbl"))
    items = [(np.full(3, i, np.float32), np.full(2, i + 1, np.uint8)) for i in range(5)]
    wt.WireheadGenerator(iter(items), config=cfg).run()
    wt.WireheadManager(config=cfg).run(max_swaps=1)
    ds = ring_ds(cfg, workers=workers, pad="ignore", ignore_index=-100, label_fields=["lbl"],
                 shuffle=False, cast={"lbl": "int64"})
    pads = rows = 0
    for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers):
        assert b["lbl"].dtype == torch.int64
        for img, lbl, pad in zip(b["img"], b["lbl"], b["is_pad"]):
            want = -100 if pad else int(img[0]) + 1
            assert lbl.tolist() == [want, want]
            pads += bool(pad)
            rows += 1
    assert pads == rows - 5 and pads > 0
    m = wt.MongoTupleheadDataset(config=cfg)
    assert [m[i][1].tolist() for i in range(5)] == [[i + 1] * 2 for i in range(5)]
