"""wirehead_torch.DataLoader: the ring set up for both dataset kinds, its
arguments and errors, resume in the original order, padding warnings,
zero-batch errors and drop_last (WireheadLoader too)."""
import logging
import multiprocessing

import pytest
import torch

import wirehead_torch as wt

import whlib

N = 13  # odd, so workers' shares and batch counts are uneven


def fill(cfg, n=N):
    wt.WireheadGenerator((whlib.sample(4, i) for i in range(n)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    return cfg


@pytest.fixture
def shm_filled(shm_cfg):
    return fill(shm_cfg(swap_cap=N))


@pytest.fixture
def filled(store_cfg):
    return fill(store_cfg(swap_cap=N))


def rows(batch, kind):
    """[(generation, position, is_pad)] of an iterable batch; [(position,)]
    of a map-style one (the stored id field holds the position: one
    generator committed samples 0..N-1 in order)."""
    if kind == "iterable":
        return list(zip(batch["generation"].tolist(), batch["position"].tolist(),
                        batch["is_pad"].tolist()))
    x = batch[0] if isinstance(batch, list) else batch["input"]
    return [(p,) for p in x[:, 1].tolist()]


def make(cfg, kind, workers, **kw):
    shuffle = kw.pop("shuffle", True)
    if kind == "iterable":
        ds = wt.WireheadIterableDataset(config=cfg, seed=7, shuffle=shuffle)
        return wt.DataLoader(ds, batch_size=2, num_workers=workers, **kw)
    ds = (wt.MongoTupleheadDataset if kind == "map" else wt.MongoheadDataset)(config=cfg)
    return wt.DataLoader(ds, batch_size=2, num_workers=workers, shuffle=shuffle, seed=7, **kw)


@pytest.mark.parametrize("kind", ["iterable", "map"])
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_resume_gives_the_rest_in_the_original_order(shm_filled, kind, workers):
    """After K batches (K = 0..2*workers, and up to the epoch's end), a new
    DataLoader loaded with the state yields exactly the uninterrupted run's
    batches K, K+1, ... of that epoch, batch by batch."""
    ref = make(shm_filled, kind, workers)
    ref.set_epoch(1)
    full, states = [], [ref.state_dict()]
    for batch in ref:
        full.append(rows(batch, kind))
        states.append(ref.state_dict())
    assert len(full) == len(ref)
    assert states[0]["epoch"] == 1 and states[0]["batches_consumed"] == 0
    assert states[-1]["epoch"] == 2 and states[-1]["batches_consumed"] == 0  # epoch done
    if kind == "iterable":
        real = sorted(p for b in full for _, p, pad in b if not pad)
        assert real == list(range(N)), "each position once per epoch"
    else:
        assert sorted(p for b in full for (p,) in b) == list(range(N))
    for k in range(0, min(max(2 * workers, 2), len(full) - 1) + 1):
        st = states[k]
        assert st["epoch"] == 1 and st["batches_consumed"] == k
        again = make(shm_filled, kind, workers)
        again.load_state_dict(st)
        rest = [rows(b, kind) for b in again]
        assert rest == full[k:], f"resumed after {k} batches with {workers} workers"
        # the next iteration is the next epoch, whole
        assert again.state_dict()["epoch"] == 2
        nxt = [rows(b, kind) for b in again]
        assert len(nxt) == len(again)


def test_resume_on_both_stores_and_persistent_workers(filled):
    for kind in ("iterable", "dict"):
        ref = make(filled, kind, 2, persistent_workers=True)
        ref.set_epoch(3)
        full = []
        it = iter(ref)
        for _ in range(3):
            full.append(rows(next(it), kind))
        st = ref.state_dict()
        full += [rows(b, kind) for b in it]
        again = make(filled, kind, 2, persistent_workers=True)
        again.load_state_dict(st)
        again.set_epoch(3)  # the usual loop after a load: the state still applies
        assert [rows(b, kind) for b in again] == full[3:]
        ref.set_epoch(4)
        e4 = [rows(b, kind) for b in ref]
        assert [rows(b, kind) for b in again] == e4, "later epochs go on from the resumed one"


def test_state_round_trip_and_mismatch_refused(shm_filled):
    dl = make(shm_filled, "iterable", 2)
    it = iter(dl)
    next(it)
    st = dl.state_dict()
    assert st["batches_consumed"] == 1 and st["kind"] == "iterable"
    assert st["dataset"]["generation"] > 0
    del it
    other = make(shm_filled, "iterable", 2)
    other.load_state_dict(st)
    assert other.state_dict() == st, "a state saved before the next batch is the loaded one"
    with pytest.raises(ValueError, match="num_workers=2"):
        make(shm_filled, "iterable", 3).load_state_dict(st)
    with pytest.raises(ValueError, match="state is of a iterable dataset"):
        make(shm_filled, "map", 2).load_state_dict(st)
    with pytest.raises(ValueError, match="batches_consumed"):
        other.load_state_dict({"epoch": 0})


def test_batches_hold_the_samples_and_dataset_is_left_as_it_was(shm_filled):
    ds = wt.WireheadIterableDataset(config=shm_filled, shuffle=False)
    dl = wt.DataLoader(ds, batch_size=4, num_workers=0)
    b = next(iter(dl))
    assert set(b) == {"id", "data", "is_pad", "generation", "position",
                      "params_version"}
    assert b["data"].shape == (4, 256) and b["data"].dtype == torch.float32
    assert b["id"][:, 1].tolist() == b["position"].tolist() == [0, 1, 2, 3]
    assert b["is_pad"].dtype == torch.bool and b["generation"].dtype == torch.int64
    assert ds.batches is False and ds.batch_size is None, "the user's dataset is unchanged"
    # two loaders over one dataset keep their own epochs
    a, c = wt.DataLoader(ds, batch_size=4), wt.DataLoader(ds, batch_size=4)
    a.set_epoch(5)
    assert len(list(a)) == len(a) and c.state_dict()["epoch"] == 0
    m = wt.MongoheadDataset(config=shm_filled)
    mb = next(iter(wt.DataLoader(m, batch_size=3, num_workers=1)))
    assert set(mb) == {"input", "label"} and mb["input"][:, 1].tolist() == [0, 1, 2]
    assert m.batches is False


def test_epochs_follow_set_epoch(shm_filled):
    dl = make(shm_filled, "map", 0)
    e0 = [rows(b, "map") for b in dl]
    e1 = [rows(b, "map") for b in dl]  # counts on without set_epoch
    assert e0 != e1
    dl.set_epoch(0)
    assert [rows(b, "map") for b in dl] == e0
    seq = make(shm_filled, "map", 0, shuffle=False)
    assert [p for b in seq for (p,) in rows(b, "map")] == list(range(N))


def test_arguments_that_do_not_fit_are_errors_naming_them(shm_filled):
    ds = wt.WireheadIterableDataset(config=shm_filled)
    m = wt.MongoTupleheadDataset(config=shm_filled)
    with pytest.raises(ValueError, match="sampler= is not taken"):
        wt.DataLoader(ds, batch_size=2, sampler=[0, 1])
    with pytest.raises(ValueError, match="batch_sampler= is not taken"):
        wt.DataLoader(m, batch_sampler=[[0, 1]])
    with pytest.raises(ValueError, match="collate_fn= would replace the ring"):
        wt.DataLoader(m, batch_size=2, collate_fn=lambda x: x)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got None"):
        wt.DataLoader(ds, batch_size=None)
    with pytest.raises(TypeError, match="got list"):
        wt.DataLoader([1, 2, 3], batch_size=2)
    told = wt.WireheadIterableDataset(config=shm_filled, batch_size=4, num_workers=0)
    with pytest.raises(ValueError, match="dataset was given batch_size=4 but the DataLoader "
                                         "batch_size=2"):
        wt.DataLoader(told, batch_size=2)
    tf = wt.WireheadIterableDataset(config=shm_filled, transform=lambda x: x)
    with pytest.raises(ValueError, match=r"transform= with batches=True.*ring=False"):
        wt.DataLoader(tf, batch_size=2)
    norm = wt.MongoTupleheadDataset(config=shm_filled, normalize=lambda x: x)
    with pytest.raises(ValueError, match="normalize="):
        wt.DataLoader(norm, batch_size=2)
    # ring=False: the ordinary collate path, a collate_fn allowed, same order
    plain = wt.DataLoader(tf, batch_size=2, ring=False, collate_fn=lambda items: items)
    got = next(iter(plain))
    assert isinstance(got, list) and len(got) == 2 and "position" in got[0]
    ring = next(iter(wt.DataLoader(ds, batch_size=2)))
    assert [i["position"].item() for i in got] == ring["position"].tolist()
    # device=: a CUDA device, or "cpu" for host tensors as without it
    with pytest.raises(ValueError, match=r"device= takes a CUDA device .* or 'cpu'; got 'meta'"):
        wt.DataLoader(ds, batch_size=2, device="meta")
    with pytest.raises(ValueError, match="pass one of them"):
        wt.DataLoader(ds, batch_size=2, device="cuda", pin_memory=True)
    on_cpu = wt.DataLoader(ds, batch_size=2, device="cpu", pin_memory=False)
    assert next(iter(on_cpu))["position"].tolist() == ring["position"].tolist()
    with pytest.raises(RuntimeError, match=r"needs device= \(a CUDA device\)"):
        on_cpu.device_stats()
    with pytest.raises(RuntimeError, match="no iteration has reached the device yet"):
        wt.DataLoader(ds, batch_size=2, device="cuda").device_stats()


def test_padding_share_is_warned_once_per_epoch(shm_cfg, caplog):
    """batch_size 32 over SWAP_CAP 10: 22 of 32 items (69%) are padding with
    one reader, 54 of 64 (84%) with two workers."""
    cfg = fill(shm_cfg(swap_cap=10), n=10)
    caplog.set_level(logging.WARNING, logger="wirehead_torch")
    ds = wt.WireheadIterableDataset(config=cfg)
    dl = wt.DataLoader(ds, batch_size=32, num_workers=2)
    for _ in range(2):
        assert len(list(dl)) == 2
    msgs = [r.getMessage() for r in caplog.records if "padding" in r.getMessage()]
    assert len(msgs) == 2, msgs  # one per epoch
    assert "54 of the 64 items rank 0 reads in epoch 0 are padding (84%" in msgs[0]
    assert "SWAP_CAP 10, world size 1 x 2 workers" in msgs[0] and "batch_size 32" in msgs[0]
    assert "drop_last=True" in msgs[0] and "epoch 1" in msgs[1]
    caplog.clear()
    ld = wt.WireheadLoader(config=cfg, batch_size=32)
    list(ld)
    msgs = [r.getMessage() for r in caplog.records if "padding" in r.getMessage()]
    assert len(msgs) == 1 and "22 of the 32 items" in msgs[0] and "(69%" in msgs[0]
    caplog.clear()
    # a plain torch DataLoader: worker 0 (here in-process) reports it
    plain = wt.WireheadIterableDataset(config=cfg, batch_size=32, num_workers=0)
    list(torch.utils.data.DataLoader(plain, batch_size=32))
    assert sum("22 of the 32 items" in r.getMessage() for r in caplog.records) == 1
    caplog.clear()
    list(wt.DataLoader(ds, batch_size=4))  # 2 of 12: below the share, nothing said
    assert not [r for r in caplog.records if "padding" in r.getMessage()]


def test_zero_batches_are_errors_naming_the_numbers(shm_cfg):
    cfg = fill(shm_cfg(swap_cap=10), n=10)
    ds = wt.WireheadIterableDataset(config=cfg, pad="drop", rank=0, world_size=4)
    dl = wt.DataLoader(ds, batch_size=2, num_workers=3)
    with pytest.raises(ValueError, match=r"pad='drop' gives no batch: SWAP_CAP 10, world size "
                                         r"4 x 3 workers = 12 readers.*10 // 12 = 0"):
        iter(dl)
    with pytest.raises(ValueError, match=r"pad='drop' gives no batch: SWAP_CAP 10, world size 16"):
        list(wt.WireheadLoader(config=cfg, batch_size=2, pad="drop", rank=0, world_size=16))
    with pytest.raises(ValueError, match=r"drop_last=True gives no batch: SWAP_CAP 10, world "
                                         r"size 1 x 1 worker = 1 reader leaves each reader 10 "
                                         r"samples per epoch, fewer than batch_size 32"):
        list(wt.WireheadLoader(config=cfg, batch_size=32, drop_last=True))
    with pytest.raises(ValueError, match="fewer than batch_size 32"):
        iter(wt.DataLoader(wt.MongoTupleheadDataset(config=cfg), batch_size=32, drop_last=True))
    plain = wt.WireheadIterableDataset(config=cfg, pad="drop", batch_size=16, num_workers=0)
    with pytest.raises(ValueError, match=r"pad='drop' \(whole batches only\) gives no batch"):
        list(torch.utils.data.DataLoader(plain, batch_size=16))


@pytest.mark.parametrize("pad", ["repeat", "drop"])
def test_drop_last_never_yields_a_padded_or_partial_batch(shm_cfg, pad):
    cfg = fill(shm_cfg(swap_cap=10), n=10)
    ld = wt.WireheadLoader(config=cfg, batch_size=4, drop_last=True, pad=pad)
    got = list(ld)
    assert len(got) == len(ld) == 2
    assert all(b["position"].numel() == 4 and not b["is_pad"].any() for b in got)
    pos = [p for b in got for p in b["position"].tolist()]
    assert len(set(pos)) == 8
    padded = wt.WireheadLoader(config=cfg, batch_size=4, pad="repeat")
    assert len(padded) == 3 and list(padded)[-1]["is_pad"].any()
    ds = wt.WireheadIterableDataset(config=cfg, pad=pad)
    for workers in (0, 2):
        dl = wt.DataLoader(ds, batch_size=2, num_workers=workers, drop_last=True)
        got = list(dl)
        assert len(got) == len(dl) > 0
        assert all(b["position"].numel() == 2 and not b["is_pad"].any() for b in got)
    m = wt.DataLoader(wt.MongoTupleheadDataset(config=cfg), batch_size=4, drop_last=True)
    got = list(m)
    assert len(got) == len(m) == 2 and all(b[0].shape[0] == 4 for b in got)


@pytest.mark.parametrize("workers", [2, 3])
def test_dataset_state_under_a_plain_torch_dataloader_keeps_the_order(shm_filled, workers):
    """ds.state_dict(K) with a torch DataLoader of several workers: an odd K
    used to resume the right batches in another order."""
    def loader():
        ds = wt.WireheadIterableDataset(config=shm_filled, batch_size=2, num_workers=workers,
                                        seed=9)
        return ds, torch.utils.data.DataLoader(ds, batch_size=2, num_workers=workers)

    ds, dl = loader()
    full = [rows(b, "iterable") for b in dl]
    for k in range(1, 2 * workers + 1):
        ds, dl = loader()
        it = iter(dl)
        for _ in range(k):
            next(it)
        state = ds.state_dict(batches_consumed=k)
        del it
        ds2, dl2 = loader()
        ds2.load_state_dict(state)
        assert [rows(b, "iterable") for b in dl2] == full[k:], f"after {k} batches"


@pytest.mark.parametrize("kind", ["iterable", "map"])
def test_spawned_workers_resume_in_order(shm_filled, kind):
    ctx = dict(multiprocessing_context="spawn")
    ref = make(shm_filled, kind, 2, **ctx)
    full, it = [], iter(ref)
    full.append(rows(next(it), kind))
    st = ref.state_dict()
    full += [rows(b, kind) for b in it]
    again = make(shm_filled, kind, 2, **ctx)
    again.load_state_dict(st)
    assert [rows(b, kind) for b in again] == full[1:]


@pytest.mark.parametrize("persistent", [False, True])
def test_a_worker_error_stops_the_workers_at_once(shm_cfg, persistent):
    """A batch a worker cannot make raises in the loop with the workers
    already gone: torch alone leaves them until the garbage collector frees
    its iterator, then waits up to 5 s for each. With persistent workers the
    next epoch starts new ones (and meets the same error)."""
    cfg = shm_cfg(swap_cap=8, SELF_SEAL=True)
    items = [whlib.sample(1, i, n=256 if i != 5 else 128) for i in range(8)]
    wt.WireheadGenerator(iter(items), config=cfg, quiet=True).run()
    dl = wt.DataLoader(wt.WireheadIterableDataset(config=cfg, shuffle=False), batch_size=4,
                       num_workers=2, persistent_workers=persistent)
    before = set(multiprocessing.active_children())
    for _ in range(2):
        with pytest.raises(ValueError, match="stacks samples of one shape"):
            for _ in dl:
                pass
        assert set(multiprocessing.active_children()) <= before


def test_a_loop_that_breaks_early_lets_the_workers_go(shm_filled):
    """The DataLoader keeps no reference of its own to torch's iterator: a
    loop that breaks ends its workers as torch does, not when the
    DataLoader is gone."""
    dl = wt.DataLoader(wt.WireheadIterableDataset(config=shm_filled), batch_size=2,
                       num_workers=2)
    before = set(multiprocessing.active_children())
    for _ in dl:
        assert set(multiprocessing.active_children()) - before
        break
    assert set(multiprocessing.active_children()) <= before
    assert len(list(dl)) == len(dl)  # and the next epoch runs
