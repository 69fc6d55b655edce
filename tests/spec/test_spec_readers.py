"""Spec mode's readers (docs/reproducible.md, "Readers"), in one process
over a store that a generator thread fills: every reader kind delivers
epoch e from spec generation e // REUSE in the order pi(seed, e); a rank's
batches do not depend on the number of DataLoader workers; spec_index and
generation name the spec, and every sample is fn(spec) of its index."""
import threading

import numpy as np
import pytest
import torch

import wirehead_torch as wt

SWAP_CAP, REUSE, BATCH, EPOCHS = 8, 2, 2, 4
RUN_SEED = 77


def make(spec):
    rng = np.random.default_rng(spec.seed)
    return rng.random((3,), dtype=np.float32), np.array([spec.index], np.int64)


@pytest.fixture
def spec_store(store_cfg):
    """A spec-mode store and a generator thread making its samples."""
    cfg = store_cfg(swap_cap=SWAP_CAP, sample=("x", "k"), budget="1MiB", RUN_SEED=RUN_SEED,
                    REUSE=REUSE, READ_TIMEOUT=60)
    g = wt.WireheadGenerator(make, config=cfg, quiet=True)
    t = threading.Thread(target=g.run, daemon=True)
    t.start()
    try:
        yield cfg
    finally:
        g.stop()
        t.join(60)
        g.close()


def _epochs(dl, epochs=EPOCHS):
    out = []
    for e in range(epochs):
        dl.set_epoch(e)
        out.append([{k: v.clone() for k, v in b.items()} for b in dl])
    return out


def _ks(epochs):
    return [[b["spec_index"].tolist() for b in ep] for ep in epochs]


def _check(epochs):
    """Each sample is fn(spec) of its spec_index; epoch e reads spec
    generation e // REUSE, every index of it once (no padding here)."""
    for e, ep in enumerate(epochs):
        s = e // REUSE
        ks = sorted(k for b in ep for k in b["spec_index"].tolist())
        assert ks == list(range(s * SWAP_CAP, (s + 1) * SWAP_CAP)), (e, ks)
        for b in ep:
            assert b["generation"].tolist() == [s] * len(b["generation"])
            for k, x, kk in zip(b["spec_index"].tolist(), b["x"], b["k"]):
                assert kk.tolist() == [k]
                spec = wt.Spec(index=k, seed=wt.spec_seed(RUN_SEED, k), generation=s,
                               position=k % SWAP_CAP, params={}, params_version=0,
                               run_seed=RUN_SEED)
                assert torch.equal(x, torch.from_numpy(make(spec)[0])), k


def test_iterable_batches_do_not_depend_on_the_workers(spec_store):
    runs = {}
    for workers, ring in ((0, True), (1, True), (3, True), (2, False)):
        ds = wt.WireheadIterableDataset(config=spec_store, seed=5)
        dl = wt.DataLoader(ds, batch_size=BATCH, num_workers=workers, ring=ring)
        runs[(workers, ring)] = _epochs(dl)
        assert dl.stats()["spec_waits"] >= 0
    first = runs[(0, True)]
    _check(first)
    # epochs of one generation read it in other orders (pi(seed, e))
    assert _ks(first)[0] != _ks(first)[1]
    for key, got in runs.items():
        assert _ks(got) == _ks(first), key
        for ea, eb in zip(got, first):
            for a, b in zip(ea, eb):
                assert all(torch.equal(a[n], b[n]) for n in ("x", "k", "is_pad", "generation",
                                                             "position", "spec_index")), key


def test_map_style_and_wirehead_loader_read_the_same_samples(spec_store):
    ds = wt.WireheadIterableDataset(config=spec_store, seed=5)
    want = _ks(_epochs(wt.DataLoader(ds, batch_size=BATCH)))
    ld = wt.WireheadLoader(config=spec_store, batch_size=BATCH, seed=5)
    try:
        got = _epochs(ld)
    finally:
        ld.close()
    _check(got)
    assert _ks(got) == want
    # the map-style reader: the same positions, in the same order
    mds = wt.MongoheadDataset(config=spec_store)
    for workers in (0, 2):
        dl = wt.DataLoader(mds, batch_size=BATCH, num_workers=workers, seed=5, shuffle=True)
        for e, ep in enumerate(_epochs(dl)):
            assert [b["label"].view(-1).tolist() for b in ep] == want[e], (workers, e)
    # ds[i] reads set_epoch's spec generation
    mds.set_epoch(2)
    assert int(mds[3]["label"][0]) == 1 * SWAP_CAP + 3


def test_resume_continues_the_run(spec_store):
    ds = wt.WireheadIterableDataset(config=spec_store, seed=5)
    want = [b for ep in _epochs(wt.DataLoader(ds, batch_size=BATCH, num_workers=2))
            for b in ep]
    dl = wt.DataLoader(ds, batch_size=BATCH, num_workers=2)
    got, state = [], None
    for e in range(EPOCHS):
        dl.set_epoch(e)
        for b in dl:
            got.append({k: v.clone() for k, v in b.items()})
            if len(got) == 5:
                state = dl.state_dict()
                break
        if state is not None:
            break
    assert state["run_seed"] == RUN_SEED and state["reuse"] == REUSE
    dl2 = wt.DataLoader(wt.WireheadIterableDataset(config=spec_store, seed=5),
                        batch_size=BATCH, num_workers=1)
    with pytest.raises(ValueError, match="num_workers"):
        dl2.load_state_dict(state)  # the worker count is part of a mid-epoch state
    dl2 = wt.DataLoader(wt.WireheadIterableDataset(config=spec_store, seed=5),
                        batch_size=BATCH, num_workers=2)
    dl2.load_state_dict(state)
    for e in range(state["epoch"], EPOCHS):
        dl2.set_epoch(e)
        got.extend({k: v.clone() for k, v in b.items()} for b in dl2)
    assert [b["spec_index"].tolist() for b in got] == [b["spec_index"].tolist() for b in want]
    assert all(torch.equal(a["x"], b["x"]) for a, b in zip(got, want))


def test_refresh_step_and_a_state_of_another_mode_are_refused(spec_store, shm_cfg):
    with pytest.raises(ValueError, match="refresh='step'.*RUN_SEED"):
        wt.WireheadIterableDataset(config=spec_store, refresh="step")
    with pytest.raises(ValueError, match="refresh='step'.*RUN_SEED"):
        wt.WireheadLoader(config=spec_store, batch_size=2, refresh="step")
    plain = shm_cfg(swap_cap=SWAP_CAP, sample=("x", "k"))
    wt.WireheadGenerator(iter([make(wt.Spec(index=i, seed=i, generation=0, position=i,
                                            params={}, params_version=0, run_seed=0))
                               for i in range(SWAP_CAP)]), config=plain, quiet=True).run()
    state = wt.DataLoader(wt.WireheadIterableDataset(config=plain), batch_size=2).state_dict()
    dl = wt.DataLoader(wt.WireheadIterableDataset(config=spec_store), batch_size=2)
    with pytest.raises(ValueError, match="outside spec mode.*RUN_SEED=77"):
        dl.load_state_dict(state)


def test_a_wait_with_no_generator_says_to_start_generators(shm_cfg, caplog):
    cfg = shm_cfg(swap_cap=SWAP_CAP, sample=("x", "k"), RUN_SEED=RUN_SEED)
    ld = wt.WireheadLoader(config=cfg, batch_size=BATCH, timeout=2.5)
    try:
        with caplog.at_level("WARNING", logger="wirehead_torch"), \
                pytest.raises(TimeoutError, match="no generator is making one; start generators"):
            next(iter(ld))
    finally:
        ld.close()
    said = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert said and all("start generators" in m and "REUSE" not in m for m in said), said
    assert ld.stats()["spec_waits"] == 1 and ld.stats()["spec_wait_s"] >= 2.5


def test_fn_of_the_wrong_fields_is_an_error_naming_the_index_not_a_retry(shm_cfg, caplog):
    cfg = shm_cfg(swap_cap=SWAP_CAP, sample=("x", "k"), RUN_SEED=RUN_SEED)
    g = wt.WireheadGenerator(lambda spec: make(spec) + (1,), config=cfg, quiet=True,
                             name="gen 7")
    try:
        with caplog.at_level("WARNING", logger="wirehead_torch"), \
                pytest.raises(wt.InvalidSampleError,
                              match=r"sample index 0: fn returned 3 fields, SAMPLE names 2"):
            g.run()
    finally:
        g.close()
    assert not [r for r in caplog.records if "attempt" in r.getMessage()], caplog.text
