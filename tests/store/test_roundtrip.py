"""Every dtype and shape round-trips bit for bit (store level and torch)."""
import numpy as np
import pytest
import torch

import wirehead_torch as wt
from wirehead_torch import _C
from wirehead_torch._arrays import to_output, to_store_arrays

pytestmark = pytest.mark.asan  # also run against the sanitizer build

DTYPES = ["bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
          "float16", "float32", "float64", "complex64", "complex128"]


def make(dtype, shape, rng):
    n = int(np.prod(shape)) if shape else 1
    raw = rng.integers(0, 256, size=n * np.dtype(dtype).itemsize, dtype=np.uint8)
    if dtype == "bool":
        a = (raw[:n] & 1).astype(bool)
    else:
        a = raw.view(dtype)  # every bit pattern, NaN payloads included
    return a.reshape(shape)


def variants(a):
    yield "contiguous", a
    if a.ndim >= 1 and a.shape[0] > 1:
        yield "negative", a[::-1]
    if a.ndim == 4:
        yield "transposed", a.transpose(3, 1, 0, 2)
        yield "sliced", a[:, ::2, :, ::-1]


def same_bits(x, y):
    x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def put_read(store, arrays):
    st = store.put(to_store_arrays(arrays, ["a", "b"]))
    assert st[0] == _C.PUT_ACCEPTED
    info = store.seal()
    assert info is not None
    return store.read(info["generation"], 0)


@pytest.fixture
def store(store_cfg):
    from wirehead_torch._store_args import store_kwargs
    from wirehead_torch.config import resolve
    st = _C.Store(**store_kwargs(resolve(store_cfg(swap_cap=1, sample=("a", "b"), budget="1MiB"))))
    assert st.lead()
    yield st
    st.close()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (7,), (3, 4, 5, 6)])
def test_store_roundtrip_bit_exact(store, dtype, shape):
    rng = np.random.default_rng(hash((dtype, shape)) & 0xffff)
    base = make(dtype, shape, rng)
    for label, a in variants(base):
        b = make("int64", (2,), rng)
        out = put_read(store, (a, b))
        got = np.from_dlpack(out[0])
        if dtype == "bool":
            got = got.view(np.bool_)
        assert out[0].dtype == dtype and out[0].shape == a.shape, label
        assert same_bits(got, a), f"{dtype} {shape} {label}"
        assert same_bits(to_output(out[0], "a", "numpy"), a)


UNSIGNED_WIDE = ("uint16", "uint32", "uint64")


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_roundtrip_or_clear_error(store, dtype):
    rng = np.random.default_rng(7)
    a = make(dtype, (2, 3), rng)[:, ::-1]
    out = put_read(store, (a, np.zeros(1, np.int8)))
    if dtype not in UNSIGNED_WIDE:
        t = to_output(out[0], "a")
        assert str(t.dtype) == f"torch.{dtype}"
        assert same_bits(t.numpy(), a)
        assert t.data_ptr() == out[0].data_ptr  # no copy on the way to torch
    else:
        with pytest.raises(TypeError) as e:
            to_output(out[0], "a")
        msg = str(e.value)
        assert "'a'" in msg and dtype in msg and "output='numpy'" in msg and "cast=" in msg
        t = to_output(out[0], "a", cast={"a": "int64"})
        assert t.dtype == torch.int64 and np.array_equal(t.numpy(), a.astype(np.int64))
        if hasattr(torch, dtype):  # torch >= 2.3: the stored type itself, on request
            t = to_output(out[0], "a", cast={"a": dtype})
            assert str(t.dtype) == f"torch.{dtype}"
            assert t.data_ptr() == out[0].data_ptr
            assert same_bits(t.view(getattr(torch, f"int{dtype[4:]}")).numpy(),
                             a.view(f"int{dtype[4:]}"))
        else:
            with pytest.raises(TypeError, match=f"has no dtype '{dtype}'"):
                to_output(out[0], "a", cast={"a": dtype})


def test_torch_tensor_inputs_any_strides(store):
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4).permute(2, 0, 1)
    y = torch.tensor(True)
    out = put_read(store, (x, y))
    assert torch.equal(to_output(out[0], "a"), x)
    assert to_output(out[1], "b").dtype == torch.bool and bool(to_output(out[1], "b"))
    bf = torch.randn(5).to(torch.bfloat16)
    out = put_read(store, (bf, y))
    assert out[0].dtype == "bfloat16"
    t = to_output(out[0], "a")
    assert t.dtype == torch.bfloat16 and torch.equal(t, bf)


def test_dataset_returns_exact_dtype_and_shape(store_cfg):
    cfg = store_cfg(swap_cap=2, sample=("input", "label", "extra"))
    rng = np.random.default_rng(0)
    items = [(rng.standard_normal((4, 4, 4)).astype(np.float32),
              rng.integers(0, 9, (4, 4, 4)).astype(np.uint8), np.int32(i)) for i in range(2)]
    assert wt.WireheadGenerator(iter(items), config=cfg).run() == 2
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    ds = wt.MongoheadDataset(config=cfg)
    assert len(ds) == 2
    got = ds[1]
    assert set(got) == {"input", "label"}
    assert got["input"].dtype == torch.float32 and got["label"].dtype == torch.uint8
    assert np.array_equal(got["input"].numpy(), items[1][0])
    assert np.array_equal(got["label"].numpy(), items[1][1])
    batch = ds[[0, 1]]
    assert sorted(batch) == [0, 1] and np.array_equal(batch[0]["label"].numpy(), items[0][1])
    tds = wt.MongoTupleheadDataset(config=cfg)
    pairs = tds[[1, 0]]
    assert isinstance(pairs, list) and len(pairs) == 2
    assert np.array_equal(pairs[0][0].numpy(), items[1][0])
    assert np.array_equal(tds[-1][1].numpy(), items[1][1])
    with pytest.raises(IndexError):
        tds[2]
