"""What a store can do is what its backend's operation table says, looked up
by the URI's scheme in C's one scheme table (_C.backend_of): each
capability holds on a real store of that backend, and a call the backend
lacks is refused naming it. The shm backend's rules cross to Python from C:
the name rule (_C.shm_check_name), the /dev/shm files a name makes
(_C.shm_files), a segment's size (_C.shm_segment_bytes), and the bounds C
enforces (_C.PARAMS_MAX, _C.SECONDS_MAX, ...)."""

import os

import numpy as np
import pytest

import wirehead_torch as wt
from wirehead_torch import _C
from wirehead_torch._store_args import store_kwargs
from wirehead_torch.config import resolve

import whlib
from whlib import open_store

pytestmark = pytest.mark.asan  # also run against the sanitizer build

CAPS = ("views", "pins", "mappable", "params_file", "relay_source", "relay_target")
SHM_CAPS = {"views", "pins", "mappable", "params_file", "relay_target"}
MONGO_CAPS = {"relay_source"}


@pytest.mark.parametrize("uri, scheme, backend, caps, name", [
    ("shm://a-b.c_d", "shm", "shm", SHM_CAPS, "a-b.c_d"),
    ("shm://", "shm", "shm", SHM_CAPS, ""),
    ("mongodb://h1:27017,h2/db?w=1", "mongodb", "mongodb", MONGO_CAPS, None),
    ("mongodb+srv://user:pw@cluster.example/db", "mongodb+srv", "mongodb", MONGO_CAPS, None),
])
def test_backend_of_each_scheme(uri, scheme, backend, caps, name):
    b = _C.backend_of(uri)
    assert (b.scheme, b.backend, b.name) == (scheme, backend, name)
    assert {c for c in CAPS if getattr(b, c)} == caps
    assert all(type(getattr(b, c)) is bool for c in CAPS)


@pytest.mark.parametrize("uri", ["", "shm:/x", "SHM://x", "mongo://h", "redis://h", "x"])
def test_an_unknown_scheme_names_every_scheme_known(uri):
    with pytest.raises(_C.InvalidSampleError,
                       match=r"must start with shm://, mongodb:// or mongodb\+srv://"):
        _C.backend_of(uri)


def _one_generation(cfg, n=2):
    assert wt.WireheadGenerator(iter([whlib.sample(3, i) for i in range(n)]), config=cfg).run() == n
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1


def test_capabilities_hold_on_a_store(store_cfg):
    """Each capability backend_of reports is one the store has, and each it
    does not is refused by the store naming its backend."""
    cfg = store_cfg(swap_cap=2)
    _one_generation(cfg)
    b = _C.backend_of(cfg["STORE"])
    store = open_store(cfg)
    gen = store.wait_generation(0, 10.0)
    if b.views:
        got = store.view_sample(gen, 1)
        assert np.from_dlpack(got.arrays[0]).tolist() == [3, 1]
        del got
    else:
        with pytest.raises(_C.InvalidSampleError,
                           match=f"store-backed views need a store of shm://; "
                                 f"the {b.backend} backend has none"):
            store.view_sample(gen, 1)
    assert store.read_sample(gen, 0).position == 0  # every backend copies
    wt.set_params({"k": 1}, config=cfg)
    files = _C.shm_files(b.name) if b.name is not None else None
    assert b.params_file == (files is not None and os.path.exists(files.params))
    if b.relay_source:  # a mongodb STORE may have a LOCAL_CACHE: a relay pulls from it
        local = f"shm://{whlib.unique_name()}"
        lc = resolve({**cfg, "STORE": local, "BYTE_BUDGET": "2MiB"})
        dst = _C.Store(**store_kwargs(lc))
        try:
            assert dst.pull_from(store, gen)["generation"] == gen
            assert _C.backend_of(local).relay_target
        finally:
            dst.close()
            _C.clean(**store_kwargs(lc))
    store.close()


def test_shm_files_are_the_files_a_store_makes(shm_cfg):
    cfg = shm_cfg(swap_cap=3, budget="1MiB")
    name = cfg["STORE"][len("shm://"):]
    f = _C.shm_files(name)
    assert not os.path.exists(f.segment) and not os.path.exists(f.params)
    _one_generation(cfg, 3)
    wt.set_params({"a": 2}, config=cfg)
    assert os.path.isfile(f.segment) and os.path.isfile(f.params)
    # the segment's size, as C computes it, is what the store reserved
    st = open_store(cfg).status()
    want = _C.shm_segment_bytes(3, 1 << 20)
    assert st["store_bytes"] == os.path.getsize(f.segment) == want
    assert len(st["areas"]) == _C.SHM_AREAS
    # the relay's files sit next to the local store they fill; the rings'
    # files all start alike
    from wirehead_torch import _ring, _uri
    assert _uri.shm_files(cfg["STORE"]) == f
    assert f.ring_prefix == f"{_ring.DIR}/{_ring.PREFIX}" == f"{_C.SHM_DIR}/{_C.RING_PREFIX}"
    assert all(os.path.dirname(p) == _C.SHM_DIR for p in f)
    wt.clean(cfg)
    assert not os.path.exists(f.segment) and not os.path.exists(f.params)


@pytest.mark.parametrize("name", ["", "a b", "a/b", "../x", "x\n", "é", "a" * 201])
def test_the_shm_name_rule_is_the_stores(name):
    with pytest.raises(_C.InvalidSampleError) as said:
        _C.shm_check_name(name)
    with pytest.raises(_C.InvalidSampleError) as opened:
        _C.Store(f"shm://{name}", 2, ["x"], create=False)
    assert str(said.value) == str(opened.value)
    assert "shm store name" in str(said.value)
    with pytest.raises(_C.InvalidSampleError):
        _C.shm_files(name)


def test_names_the_rule_allows():
    for name in ("a", "A-z_0.9", "a" * _C.SHM_NAME_MAX):
        _C.shm_check_name(name)
        assert _C.shm_files(name).segment.endswith("/wirehead." + name)


def test_the_bounds_python_reads_are_the_ones_c_enforces(shm_cfg):
    cfg = resolve(shm_cfg(swap_cap=2))
    kw = store_kwargs(cfg)
    for key in ("lease_s", "connect_timeout_s"):
        with pytest.raises(_C.InvalidSampleError, match="below"):
            _C.Store(**{**kw, key: _C.SECONDS_MAX})
    with pytest.raises(_C.InvalidSampleError, match=f"at least {_C.BYTE_BUDGET_MIN}"):
        _C.Store(**{**kw, "byte_budget": _C.BYTE_BUDGET_MIN - 1})
    with pytest.raises(_C.InvalidSampleError):
        _C.Store(**{**kw, "fields": ["x" * (_C.FIELD_NAME_MAX + 1)]})
    store = _C.Store(**{**kw, "fields": ["x" * _C.FIELD_NAME_MAX, "y"],
                        "lease_s": _C.LEASE_SECONDS_DEFAULT,
                        "connect_timeout_s": _C.CONNECT_TIMEOUT_DEFAULT})
    doc = '{"k":"' + "v" * (_C.PARAMS_MAX - 8) + '"}'
    assert len(doc) == _C.PARAMS_MAX
    assert store.params_set(doc) == 1
    with pytest.raises(_C.SampleTooLargeError, match=str(_C.PARAMS_MAX)):
        store.params_set(doc + " ")
    store.close()
    assert _C.CHUNK_BYTES_DEFAULT < _C.CHUNK_BYTES_MAX < 16 << 20
