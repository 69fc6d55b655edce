"""Each delivered byte is copied once (store -> final buffer); tensors share
the C buffers, which live exactly as long as a tensor holds them."""
import gc

import numpy as np
import pytest
import torch

import wirehead_torch as wt
from wirehead_torch import _C

import whlib

pytestmark = pytest.mark.asan  # also run against the sanitizer build

N = 12
ITEM_BYTES = 2 * 8 + 256 * 4  # id int64[2] + data float32[256]


@pytest.fixture
def filled(store_cfg):
    cfg = store_cfg(swap_cap=N)
    wt.WireheadGenerator((whlib.sample(3, i) for i in range(N)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    return cfg


def check_batch(b):
    for ident, data in zip(b["id"], b["data"]):
        whlib.check_sample(ident.numpy(), data.numpy())


def test_loader_copies_each_byte_once_and_shares_its_buffer(filled):
    ld = wt.WireheadLoader(config=filled, batch_size=4, num_threads=2, shuffle=False)
    ld._loader()  # threads up; nothing read before start
    _C.counters_reset()
    n_items, ptrs = 0, []
    for b in ld:
        check_batch(b)
        n_items += len(b["id"])
        ptrs.append(b["id"].data_ptr())
        assert b["data"].data_ptr() > b["id"].data_ptr()  # one stacked buffer per batch
        del b
    c = _C.counters()
    assert n_items == len(ld) * 4 == N
    assert c["bytes_copied_out"] == n_items * ITEM_BYTES
    assert c["copies_out"] == n_items * 2
    # released batches go back to the ring: a buffer is used again
    for b in ld:
        ptrs.append(b["id"].data_ptr())
        del b
    assert len(set(ptrs)) < len(ptrs)
    ld.close()


def test_held_batches_are_never_overwritten(filled):
    ld = wt.WireheadLoader(config=filled, batch_size=2, num_threads=2, prefetch=1)
    held = []
    for epoch in range(3):
        held += list(ld)  # keeps every batch: the ring must grow, not reuse
    assert ld.stats()["ring"] >= len(held) - 1
    ptrs = {b["id"].data_ptr() for b in held}
    assert len(ptrs) == len(held)
    for b in held:
        check_batch(b)
    # the loader can go first; the tensors keep their buffers alive
    ld.close()
    del ld
    gc.collect()
    for b in held:
        check_batch(b)
    views = [np.from_dlpack(b["data"]) for b in held[:2]]
    del held
    gc.collect()
    assert views[0].shape == (2, 256) and np.isfinite(views[0]).all()


def test_dataset_copies_at_most_once(filled):
    ds = wt.WireheadIterableDataset(config=filled, shuffle=False)
    _C.counters_reset()
    items = list(ds)
    c = _C.counters()
    assert len(items) == N
    assert c["bytes_copied_out"] == N * ITEM_BYTES
    for it in items:
        whlib.check_sample(it["id"].numpy(), it["data"].numpy())
    st = wt.MongoheadDataset(config=filled)
    _C.counters_reset()
    st[0]
    assert _C.counters()["bytes_copied_out"] == ITEM_BYTES


def test_tensor_pointer_is_the_c_buffer(filled):
    from wirehead_torch._store_args import store_kwargs
    from wirehead_torch.config import resolve
    store = _C.Store(**store_kwargs(resolve(filled)))
    arrs = store.read(store.current(), 0)
    t = torch.from_dlpack(arrs[1])
    assert t.data_ptr() == arrs[1].data_ptr
    n = np.from_dlpack(arrs[1])
    assert n.__array_interface__["data"][0] == arrs[1].data_ptr


def test_versioned_capsule_when_asked(filled):
    from wirehead_torch._store_args import store_kwargs
    from wirehead_torch.config import resolve
    store = _C.Store(**store_kwargs(resolve(filled)))
    arr = store.read(store.current(), 0)[1]
    cap = arr.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(cap)
    cap0 = arr.__dlpack__()
    assert '"dltensor"' in repr(cap0)
    assert arr.__dlpack_device__() == (1, 0)
    del cap, cap0  # unconsumed capsules free their export (checked under ASan)


def test_copy_true_hands_out_an_independent_copy(filled):
    from wirehead_torch._store_args import store_kwargs
    from wirehead_torch.config import resolve
    store = _C.Store(**store_kwargs(resolve(filled)))
    arr = store.read(store.current(), 0)[1]
    shared = np.from_dlpack(arr)
    before = shared.copy()
    cap = arr.__dlpack__(copy=True)
    copied = torch.utils.dlpack.from_dlpack(cap)
    assert copied.data_ptr() != arr.data_ptr
    assert np.array_equal(copied.numpy(), before)
    copied.add_(1)  # the copy is the consumer's own: the stored bytes do not change
    assert np.array_equal(shared, before)
    if "copy" in torch.from_dlpack.__code__.co_varnames:  # torch >= 2.6 passes copy= on
        t = torch.from_dlpack(arr, copy=True)
        assert t.data_ptr() != arr.data_ptr and np.array_equal(t.numpy(), before)
        assert torch.from_dlpack(arr, copy=False).data_ptr() == arr.data_ptr


def test_dlpack_arguments_checked(filled):
    from wirehead_torch._store_args import store_kwargs
    from wirehead_torch.config import resolve
    store = _C.Store(**store_kwargs(resolve(filled)))
    arr = store.read(store.current(), 0)[1]
    with pytest.raises(TypeError, match="copy must be None or a bool"):
        arr.__dlpack__(copy=1)
    with pytest.raises(BufferError, match=r"lives on device \(1, 0\); export to \(2, 0\)"):
        arr.__dlpack__(dl_device=(2, 0))
    assert '"dltensor"' in repr(arr.__dlpack__(dl_device=(1, 0)))
