"""Results of more than one value cross from C as named records (struct
sequences): read by name, still tuples for callers that unpack them, the
same values either way, and picklable as module attributes."""

import pickle

import numpy as np
import pytest

import wirehead_torch as wt
from wirehead_torch import _C

import whlib
from whlib import open_store

pytestmark = pytest.mark.asan  # also run against the sanitizer build

RECORDS = {
    "PutResult": ("status", "generation"),
    "SampleRead": ("generation", "position", "is_pad", "arrays", "skipped"),
    "SampleCopy": ("generation", "position", "is_pad", "layouts", "skipped", "checksums"),
    "FieldLayout": ("dtype", "shape"),
    "LoaderBatch": ("fields", "is_pad", "generation", "position", "params_version", "batch_index",
                    "any_pad"),
    "PlanItems": ("positions", "is_pad"),
    "PlanResume": ("role", "step"),
    "Backend": ("scheme", "backend", "views", "pins", "mappable", "params_file", "relay_source",
                "relay_target", "name", "spec"),
    "SpecClaim": ("index", "spec_gen", "position", "generation", "params_version", "attempt",
                  "token"),
    "ShmFiles": ("segment", "params", "relay_lock", "relay_state", "ring_prefix"),
}


def _same(rec, name):
    """rec is a tuple of the record type name whose items are its named fields."""
    assert type(rec) is getattr(_C, name)
    assert isinstance(rec, tuple)
    fields = RECORDS[name]
    assert len(rec) == len(fields)
    assert tuple(getattr(rec, f) for f in fields) == tuple(rec)


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_record_types_name_their_fields(name):
    tp = getattr(_C, name)
    assert tp.__module__ == "wirehead_torch._C"
    assert tp.n_sequence_fields == tp.n_fields == len(RECORDS[name])
    for f in RECORDS[name]:
        assert getattr(tp, f).__doc__, f"{name}.{f} has no doc"


def test_store_results_are_named_records(shm_cfg):
    cfg = shm_cfg(swap_cap=3)
    store = open_store(cfg)
    ident, data = whlib.sample(7, 0)
    put = store.put([(ident, _C.DTYPES["int64"]), (data, _C.DTYPES["float32"])])
    _same(put, "PutResult")
    assert put.status == _C.PUT_ACCEPTED and put.generation >= 1
    assert wt.WireheadGenerator(iter([whlib.sample(7, i) for i in (1, 2)]), config=cfg).run() == 2
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    gen = store.wait_generation(0, 5.0)

    got = store.read_sample(gen, 1, [1])
    _same(got, "SampleRead")
    assert (got.generation, got.is_pad, got.skipped, got.arrays[0]) == (gen, False, None, None)
    row = np.from_dlpack(got.arrays[1])
    assert row.shape == (256,)
    # a copy into the caller's buffers: the layouts say what was copied
    out = np.empty_like(row)
    copy = store.read_sample_into(gen, got.position, [None, out])
    _same(copy, "SampleCopy")
    assert (copy.generation, copy.position) == (got.generation, got.position)
    assert copy.layouts[0] is None
    _same(copy.layouts[1], "FieldLayout")
    assert copy.layouts[1] == ("float32", (256,))
    assert (copy.layouts[1].dtype, copy.layouts[1].shape) == ("float32", (256,))
    np.testing.assert_array_equal(out, row)

    view = store.view_sample(gen, 0)
    _same(view, "SampleRead")
    assert view.position == 0 and view.arrays[0].shape == (2,)


def test_a_corrupt_sample_names_what_it_skipped(shm_cfg):
    cfg = shm_cfg(swap_cap=3)
    assert wt.WireheadGenerator(iter([whlib.sample(1, i) for i in range(3)]), config=cfg).run() == 3
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    whlib.corrupt_shm_sample(cfg, 1, 1)
    store = open_store(cfg)
    got = store.read_sample(store.wait_generation(0, 5.0), 1)
    assert (got.position, got.is_pad) == (2, True)
    assert "checksum mismatch" in got.skipped


def test_plan_results_are_named_records():
    plan = dict(swap_cap=10, world=1, rank=0, workers=2, worker=0, batch=2, shuffle=True,
                seed=3, pad=0)
    items = _C.plan_items(**plan, epoch=1)
    _same(items, "PlanItems")
    positions = np.frombuffer(items.positions, np.int64)
    assert len(positions) == len(items.is_pad) == _C.plan_info(**plan)["steps"]
    res = _C.plan_resume(**plan, consumed=3)
    _same(res, "PlanResume")
    assert (res.role, res.step) == tuple(res) and res.role in (0, 1)
    # module attributes, so a record pickles like the tuple it is
    assert pickle.loads(pickle.dumps(res)) == res
    assert type(pickle.loads(pickle.dumps(items))) is _C.PlanItems


def test_loader_batches_are_named_records(shm_cfg):
    cfg = shm_cfg(swap_cap=4)
    assert wt.WireheadGenerator(iter([whlib.sample(2, i) for i in range(4)]), config=cfg).run() == 4
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    loader = wt.WireheadLoader(config=cfg, batch_size=2, shuffle=False)
    ld = loader._loader()
    ld.start(0, 0, 0)
    b = ld.next()
    _same(b, "LoaderBatch")
    assert b.batch_index == 0 and b.any_pad is None  # host batch: read is_pad
    assert np.from_dlpack(b.position).tolist() == [0, 1]
    assert np.from_dlpack(b.fields[0]).shape == (2, 2)
    loader.close()
