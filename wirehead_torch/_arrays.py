"""Conversions between user arrays, store dtype codes and torch tensors."""
import sys

import numpy as np

from . import _C

# torch is imported only by readers: a generator that yields tensors has
# imported it already, and one that yields numpy arrays never needs it.
torch = None

# torch >= 2.3 has these types, but most of its ops raise "not implemented"
# for them; they are handed out only when cast= names them explicitly.
_LIMITED_UNSIGNED = {"uint16", "uint32", "uint64"}


def import_torch():
    """torch, imported on first use (numpy-only readers run without it)."""
    global torch
    if torch is None:
        import torch as t
        torch = t
    return torch

# numpy dtype name -> store dtype name (bool and every numeric type)
_NUMPY_OK = {"bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
             "float16", "float32", "float64", "complex64", "complex128"}


def torch_dtype(name, asked=False):
    """The torch dtype of a store dtype name, None where this torch has none
    (or limits it to what cast= asks for: asked)."""
    if name in _LIMITED_UNSIGNED and not asked:
        return None
    return getattr(import_torch(), name, None)


def to_store_arrays(item, names, what="generator yielded"):
    """One generator item -> [(buffer, dtype_code)] in SAMPLE order (what:
    how errors say it came, e.g. "fn returned" in spec mode).

    Accepts numpy arrays, numpy scalars and CPU torch tensors of any numeric
    or bool dtype and any strides. Errors name the field."""
    if isinstance(item, dict):
        missing = [n for n in names if n not in item]
        extra = [k for k in item if k not in names]
        if missing or extra:
            raise _C.InvalidSampleError(
                f"sample dict keys {sorted(item)} do not match SAMPLE {names}"
                f" (missing {missing}, unexpected {extra})")
        item = [item[n] for n in names]
    if not isinstance(item, (tuple, list)):
        raise _C.InvalidSampleError(
            f"{what} a {type(item).__name__}; expected a tuple of "
            f"{len(names)} arrays (SAMPLE {names})")
    if len(item) != len(names):
        raise _C.InvalidSampleError(
            f"{what} {len(item)} fields, SAMPLE names {len(names)}: {names}")
    out = []
    for name, a in zip(names, item):
        code = None
        t = sys.modules.get("torch")
        if t is not None and isinstance(a, t.Tensor):
            if a.device.type != "cpu":
                raise _C.InvalidSampleError(
                    f"field '{name}': tensor on {a.device}; move it to the CPU first")
            if a.is_sparse or a.layout != t.strided:
                raise _C.InvalidSampleError(
                    f"field '{name}': {a.layout} tensor; convert it with .to_dense() first")
            # the lazy negative/conjugate bits (x.neg() views, x.conj()) are
            # not in the memory numpy sees: materialise what the user sees
            a = a.detach().resolve_conj().resolve_neg()
            if a.dtype == t.bfloat16:
                a, code = a.view(t.int16), _C.DTYPES["bfloat16"]
            try:
                a = a.numpy()
            except TypeError as e:
                raise _C.InvalidSampleError(f"field '{name}': unsupported tensor dtype "
                                            f"{a.dtype}: {e}") from None
        elif isinstance(a, np.generic):
            a = np.asarray(a)
        elif not isinstance(a, np.ndarray):
            raise _C.InvalidSampleError(
                f"field '{name}': expected a numpy array or CPU torch tensor, got "
                f"{type(a).__name__}")
        if code is None:
            dname = a.dtype.name
            if dname not in _NUMPY_OK or not a.dtype.isnative:
                raise _C.InvalidSampleError(
                    f"field '{name}': dtype {a.dtype} is not a native numeric or bool type")
            code = _C.DTYPES[dname]
        out.append((a, code))
    return out


def needs_cast_message(name, dtype, numpy_ok=True):
    way = "read it as numpy (output='numpy') or ask" if numpy_ok else "ask"
    t = import_torch()
    if dtype in _LIMITED_UNSIGNED and getattr(t, dtype, None) is not None:
        return (f"field '{name}' is stored as {dtype}; torch {t.__version__} has {dtype} "
                f"tensors but most of its ops are not implemented for them, so they are "
                f"handed out only on request: {way} for a cast, e.g. "
                f"cast={{'{name}': 'int64'}}, or cast={{'{name}': '{dtype}'}} for the "
                f"{dtype} tensor as stored")
    return (f"field '{name}' is stored as {dtype}, which torch {t.__version__} cannot "
            f"hold; {way} for a cast, e.g. cast={{'{name}': 'int64'}}")


def to_output(arr, name, output="torch", cast=None, numpy_ok=True):
    """A _C.Array -> torch tensor (exact dtype) or numpy array, no copy.

    cast maps field name -> dtype name for an explicit, user-requested cast;
    numpy_ok says whether the caller offers output='numpy' (for the error)."""
    target = (cast or {}).get(name)
    if target is not None and output != "numpy" and torch_dtype(target, asked=True) is None:
        raise TypeError(f"cast={{'{name}': {target!r}}}: torch {import_torch().__version__} "
                        f"has no dtype {target!r}")
    if output == "numpy":
        if arr.dtype == "bfloat16":
            raise TypeError(f"field '{name}' is bfloat16, which numpy cannot hold; "
                            f"use output='torch'")
        x = np.from_dlpack(arr)
        if arr.dtype == "bool":
            x = x.view(np.bool_)
        return x.astype(target) if target else x
    import_torch()
    tdt = torch_dtype(arr.dtype, asked=(target == arr.dtype))
    if tdt is None:
        if target is None:
            raise TypeError(needs_cast_message(name, arr.dtype, numpy_ok))
        t = torch.from_numpy(np.from_dlpack(arr).astype(target))
        return t
    t = torch.from_dlpack(arr)
    if arr.dtype == "bool" and t.dtype != torch.bool:
        t = t.view(torch.bool)
    if target and target != arr.dtype:
        t = t.to(torch_dtype(target, asked=True))
    return t

