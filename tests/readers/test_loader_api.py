"""Options, errors and resume of WireheadLoader and WireheadIterableDataset
in one process (the multi-process DDP runs are in test_ddp.py)."""
import numpy as np
import pytest
import torch

import wirehead_torch as wt

import whlib

pytestmark = pytest.mark.asan  # also run against the sanitizer build

N = 10


def fill(cfg):
    wt.WireheadGenerator((whlib.sample(4, i) for i in range(N)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    return cfg


@pytest.fixture
def filled(store_cfg):
    return fill(store_cfg(swap_cap=N))


@pytest.fixture
def shm_filled(shm_cfg):
    return fill(shm_cfg(swap_cap=N))


def positions(batches):
    return [(int(p), bool(x)) for b in batches for p, x in zip(b["position"], b["is_pad"])]


def test_world_size_without_rank_is_an_error(filled, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    # found when iterating (the process group may come after the dataset)
    loader = wt.WireheadLoader(config=filled, batch_size=2)
    ds = wt.WireheadIterableDataset(config=filled)
    with pytest.raises(ValueError, match="no rank is known"):
        len(loader)
    with pytest.raises(ValueError, match="no rank is known"):
        next(iter(ds))
    monkeypatch.setenv("RANK", "1")
    assert ds.order.rank == 1 and len(loader) == -(-len(ds) // 2)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK='x'"):
        next(iter(ds))


def test_unknown_field_and_bad_options(filled):
    with pytest.raises(ValueError, match=r"\['image'\] are not in the store's SAMPLE"):
        wt.WireheadLoader(config=filled, batch_size=2, fields=["image"])
    with pytest.raises(ValueError, match="pad must be"):
        wt.WireheadIterableDataset(config=filled, pad="zero")
    with pytest.raises(ValueError, match="refresh"):
        wt.WireheadIterableDataset(config=filled, refresh="always")
    with pytest.raises(ValueError, match="batch_size"):
        wt.WireheadLoader(config=filled, batch_size=0)


def test_worker_count_mismatch_is_clear(filled):
    ds = wt.WireheadIterableDataset(config=filled, num_workers=2, batch_size=2)
    dl = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=0)
    with pytest.raises(ValueError, match="num_workers=2 but runs in a DataLoader with num_workers=0"):
        list(dl)


def test_resume_with_changed_worker_count_is_refused(filled):
    ds = wt.WireheadIterableDataset(config=filled, num_workers=2, batch_size=2)
    state = ds.state_dict(batches_consumed=1)
    other = wt.WireheadIterableDataset(config=filled, num_workers=3, batch_size=2)
    with pytest.raises(ValueError, match="num_workers=2"):
        other.load_state_dict(state)


def test_loader_resume_yields_exactly_the_rest(filled):
    ld = wt.WireheadLoader(config=filled, batch_size=3, seed=5)
    full = positions(list(ld))  # epoch 0
    assert sorted(p for p, pad in full if not pad) == list(range(N))
    it = iter(ld)  # epoch 1
    first = positions([next(it), next(it)])
    state = ld.state_dict()
    assert state["epoch"] == 1 and state["batches_consumed"] == 2
    del it
    ld2 = wt.WireheadLoader(config=filled, batch_size=3, seed=5)
    ld2.load_state_dict(state)
    rest = positions(list(ld2))
    assert len(first) + len(rest) == len(ld) * 3
    real = sorted(p for p, pad in first + rest if not pad)
    assert real == list(range(N))
    ref = wt.WireheadLoader(config=filled, batch_size=3, seed=5)
    ref.set_epoch(1)
    assert positions(list(ref)) == first + rest
    with pytest.raises(ValueError, match="batch_size"):
        wt.WireheadLoader(config=filled, batch_size=4, seed=5).load_state_dict(state)


@pytest.mark.parametrize("pad", ["repeat", "drop"])
def test_dataset_resume_in_process(filled, pad):
    ds = wt.WireheadIterableDataset(config=filled, batch_size=3, num_workers=0, seed=1, pad=pad)
    dl = torch.utils.data.DataLoader(ds, batch_size=3)
    it = iter(dl)
    first = positions([next(it) for _ in range(2)])
    state = ds.state_dict(batches_consumed=2)
    del it
    ds2 = wt.WireheadIterableDataset(config=filled, batch_size=3, num_workers=0, seed=1, pad=pad)
    ds2.load_state_dict(state)
    rest = positions(list(torch.utils.data.DataLoader(ds2, batch_size=3)))
    real = [p for p, is_pad in first + rest if not is_pad]
    assert len(real) == len(set(real)), "resume repeated a position"
    assert len(first) + len(rest) == len(ds)
    if pad == "repeat":
        assert sorted(real) == list(range(N))
    else:  # whole batches only: 9 of the 10 positions this epoch
        assert len(real) == N - N % 3


def test_stateful_dataloader_protocol_per_worker(filled):
    ds = wt.WireheadIterableDataset(config=filled, seed=2)
    it = iter(ds)
    got = [next(it)["position"].item() for _ in range(4)]
    st = ds.state_dict()
    assert st["step"] == 4
    ds2 = wt.WireheadIterableDataset(config=filled, seed=2)
    ds2.load_state_dict(st)
    rest = [x["position"].item() for x in ds2]
    assert sorted(got + rest) == list(range(N))


@pytest.mark.parametrize("per_worker", [False, True])
def test_resume_in_a_later_epoch_goes_on_without_set_epoch(filled, per_worker):
    """A run resumed in epoch 2 continues with epoch 3's order, not epoch 1's."""
    ds = wt.WireheadIterableDataset(config=filled, seed=4)
    ds.set_epoch(2)
    it = iter(ds)
    got = [next(it)["position"].item() for _ in range(3)]
    st = ds.state_dict() if per_worker else ds.state_dict(batches_consumed=3)
    ref = wt.WireheadIterableDataset(config=filled, seed=4)
    ref.set_epoch(3)
    epoch3 = [x["position"].item() for x in ref]
    ds2 = wt.WireheadIterableDataset(config=filled, seed=4)
    ds2.load_state_dict(st)
    rest = [x["position"].item() for x in ds2]
    assert sorted(got + rest) == list(range(N))
    assert [x["position"].item() for x in ds2] == epoch3 != sorted(epoch3)


def test_pad_ignore_sets_label_fields(store_cfg):
    cfg = store_cfg(swap_cap=5, sample=("input", "label"))
    items = [(np.full(3, i, np.float32), np.full(3, i, np.int64)) for i in range(5)]
    wt.WireheadGenerator(iter(items), config=cfg).run()
    wt.WireheadManager(config=cfg).run(max_swaps=1)
    ld = wt.WireheadLoader(config=cfg, batch_size=4, pad="ignore", ignore_index=-100)
    for b in ld:
        assert (b["label"][b["is_pad"]] == -100).all()
        assert (b["label"][~b["is_pad"]] >= 0).all()
        assert (b["input"][b["is_pad"]] >= 0).all()
    ds = wt.WireheadIterableDataset(config=cfg, pad="ignore", batch_size=4, num_workers=0)
    pads = [it for it in ds if it["is_pad"]]
    assert pads and all((it["label"] == -100).all() for it in pads)


def test_pad_ignore_refuses_an_index_the_dtype_cannot_hold(store_cfg):
    cfg = store_cfg(swap_cap=3, sample=("input", "label"))
    wt.WireheadGenerator(iter([(np.zeros(2, np.float32), np.zeros(2, np.uint8))] * 3),
                         config=cfg).run()
    wt.WireheadManager(config=cfg).run(max_swaps=1)
    with pytest.raises(ValueError, match="ignore_index -100 does not fit label field 'label' of dtype torch.uint8"):
        list(wt.WireheadLoader(config=cfg, batch_size=2, pad="ignore"))


def test_loader_refuses_ragged_batches_by_name(store_cfg):
    cfg = store_cfg(swap_cap=4, sample=("img", "lbl"))
    items = [(np.zeros((2, 2 + (i % 2)), np.float32), np.int64(i)) for i in range(4)]
    wt.WireheadGenerator(iter(items), config=cfg).run()
    wt.WireheadManager(config=cfg).run(max_swaps=1)
    with pytest.raises(wt.InvalidSampleError, match=r"field 'img'.*float32\(2, 3\).*float32\(2, 2\)"):
        list(wt.WireheadLoader(config=cfg, batch_size=4, shuffle=False))


def test_corrupt_sample_is_counted_and_skipped(shm_filled, caplog):
    filled = shm_filled
    name = filled["STORE"][len("shm://"):]
    needle = whlib.sample(4, 6)[1].tobytes()[:64]
    with open(f"/dev/shm/wirehead.{name}", "r+b") as f:
        blob = f.read()
        at = blob.find(needle)
        f.seek(at + 4)
        f.write(bytes([blob[at + 4] ^ 0x10]))
    ld = wt.WireheadLoader(config=filled, batch_size=5, shuffle=False)
    with caplog.at_level("WARNING"):
        batches = list(ld)
    assert ld.stats()["corrupt"] == 1
    assert "checksum mismatch" in caplog.text
    got = positions(batches)
    assert (6, False) not in got and (7, True) in got
    for b in batches:
        for ident, data in zip(b["id"], b["data"]):
            whlib.check_sample(ident.numpy(), data.numpy())
    with caplog.at_level("WARNING"):
        items = list(wt.WireheadIterableDataset(config=filled, shuffle=False))
    assert len(items) == N and sum(bool(i["is_pad"]) for i in items) == 1


def test_generation_refresh_step_moves_on(store_cfg):
    cfg = store_cfg(swap_cap=4)
    wt.WireheadGenerator((whlib.sample(1, i) for i in range(4)), config=cfg).run()
    wt.WireheadManager(config=cfg).run(max_swaps=1)
    g1 = wt.status(cfg)["read_gen"]
    ds = wt.WireheadIterableDataset(config=cfg, refresh="step", shuffle=False)
    it = iter(ds)
    assert next(it)["generation"].item() == g1
    wt.WireheadGenerator((whlib.sample(2, i) for i in range(4)), config=cfg).run()
    wt.WireheadManager(config=cfg).run(max_swaps=1)
    nxt = next(it)
    assert nxt["generation"].item() > g1 and nxt["position"].item() == 1
    whlib.check_sample(nxt["id"].numpy(), nxt["data"].numpy())
    assert nxt["id"][0].item() == 2


def test_dtype_torch_cannot_hold_needs_an_explicit_cast(store_cfg):
    cfg = store_cfg(swap_cap=2, sample=("img", "lbl"))
    items = [(np.full(3, i, np.float32), np.full(3, 60000 + i, np.uint16)) for i in range(2)]
    wt.WireheadGenerator(iter(items), config=cfg).run()
    wt.WireheadManager(config=cfg).run(max_swaps=1)
    # the same on every torch: 2.3+ has uint16 tensors, but few ops for them
    with pytest.raises(TypeError) as e:
        list(wt.WireheadLoader(config=cfg, batch_size=2))
    assert "'lbl'" in str(e.value) and "uint16" in str(e.value) and "cast=" in str(e.value)
    assert "output=" not in str(e.value)
    b = next(iter(wt.WireheadLoader(config=cfg, batch_size=2, cast={"lbl": "int32"})))
    assert b["lbl"].dtype == torch.int32 and sorted(b["lbl"][:, 0].tolist()) == [60000, 60001]
    it = next(iter(wt.WireheadIterableDataset(config=cfg, cast={"lbl": "int64"})))
    assert it["lbl"].dtype == torch.int64 and it["lbl"][0] >= 60000
    if hasattr(torch, "uint16"):
        b = next(iter(wt.WireheadLoader(config=cfg, batch_size=2, cast={"lbl": "uint16"})))
        assert b["lbl"].dtype == torch.uint16


def test_eight_dimensional_fields_through_the_loader(store_cfg):
    cfg = store_cfg(swap_cap=2, sample=("x", "y"))
    shape = (2,) * 8
    items = [(np.arange(256, dtype=np.float32).reshape(shape) + i, np.int64(i)) for i in range(2)]
    wt.WireheadGenerator(iter(items), config=cfg).run()
    wt.WireheadManager(config=cfg).run(max_swaps=1)
    b = next(iter(wt.WireheadLoader(config=cfg, batch_size=2, shuffle=False)))
    assert tuple(b["x"].shape) == (2,) + shape
    assert b["x"].stride() == tuple(256 // 2 ** k for k in range(9))
    for row, y in zip(b["x"], b["y"]):
        assert np.array_equal(row.numpy(), items[int(y)][0])


def test_close_while_another_thread_reads(store_cfg):
    import threading

    from whlib import open_store
    cfg = store_cfg(swap_cap=1)
    wt.WireheadGenerator(iter([whlib.sample(1, 0)]), config=cfg).run()
    wt.WireheadManager(config=cfg).run(max_swaps=1)
    for _ in range(20):
        st = open_store(cfg)
        gen = st.current()
        errors = []

        def reader(st=st, gen=gen, errors=errors):
            try:
                while True:
                    st.read(gen, 0)
            except wt.WireheadError as e:
                errors.append(str(e))

        t = threading.Thread(target=reader)
        t.start()
        st.close()
        t.join(30)
        assert not t.is_alive() and errors and "closed" in errors[0]


def test_resume_then_set_epoch_loop(filled):
    """The usual loop calls set_epoch(e) after load_state_dict: the state
    for epoch e still applies; a state for another epoch is dropped."""
    ld = wt.WireheadLoader(config=filled, batch_size=3, seed=5)
    ld.set_epoch(1)
    it = iter(ld)
    first = positions([next(it), next(it)])
    state = ld.state_dict()
    del it
    again = wt.WireheadLoader(config=filled, batch_size=3, seed=5)
    again.load_state_dict(state)
    again.set_epoch(1)
    rest = positions(list(again))
    assert sorted(p for p, pad in first + rest if not pad) == list(range(N))
    assert len(first) + len(rest) == len(ld) * 3
    other = wt.WireheadLoader(config=filled, batch_size=3, seed=5)
    other.load_state_dict(state)
    other.set_epoch(2)
    assert len(list(other)) == len(other)
    ds = wt.WireheadIterableDataset(config=filled, batch_size=3, num_workers=0, seed=1)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=3))
    head = positions([next(it)])
    dstate = ds.state_dict(batches_consumed=1)
    del it
    ds2 = wt.WireheadIterableDataset(config=filled, batch_size=3, num_workers=0, seed=1)
    ds2.load_state_dict(dstate)
    ds2.set_epoch(dstate["epoch"])
    tail = positions(list(torch.utils.data.DataLoader(ds2, batch_size=3)))
    assert sorted(p for p, pad in head + tail if not pad) == list(range(N))
    ds2.set_epoch(dstate["epoch"])  # after an iteration: the whole epoch again
    assert len(positions(list(torch.utils.data.DataLoader(ds2, batch_size=3)))) == len(ds2)


def test_second_thread_iterating_one_loader_is_an_error(shm_filled):
    import threading
    ld = wt.WireheadLoader(config=shm_filled, batch_size=3, shuffle=False)
    it = iter(ld)
    got = [next(it)]
    errors = []

    def other():
        try:
            got.extend(ld)
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=other)
    t.start()
    t.join(60)
    assert not t.is_alive() and errors and "another thread" in errors[0]
    got.extend(it)
    assert len(got) == len(ld) == 4
    assert sorted(p for p, pad in positions(got) if not pad) == list(range(N))
    # once the first iteration is over, another thread may iterate
    t = threading.Thread(target=other)
    t.start()
    t.join(60)
    assert not t.is_alive() and len(errors) == 1 and len(got) == 2 * len(ld)


def test_new_iter_in_same_thread_supersedes_the_old(shm_filled):
    ld = wt.WireheadLoader(config=shm_filled, batch_size=3, shuffle=False)
    old = iter(ld)
    next(old)
    new = list(ld)
    assert len(new) == len(ld)
    with pytest.raises(RuntimeError, match="superseded"):
        next(old)
