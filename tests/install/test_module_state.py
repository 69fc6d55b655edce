"""The extension keeps no process globals for Python objects: multi-phase
init with module state, types bound to their module. Two instances of
wirehead_torch._C are independent (each raises its own exceptions), an
object keeps its module instance alive, and a tensor exported by an
instance outlives it."""
import gc
import importlib.util
import os
import subprocess
import sys
import weakref

import numpy as np
import pytest

from wirehead_torch import _C
from wirehead_torch._store_args import store_kwargs
from wirehead_torch.config import get_config

import whlib

pytestmark = pytest.mark.asan  # also run against the sanitizer build


def _fresh_instance():
    """A second, separate instance of the extension module (as a
    subinterpreter or importlib.reload-style loader would make)."""
    spec = importlib.util.spec_from_file_location("wirehead_torch._C", _C.__file__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _put_one(store, counter):
    ident, data = whlib.sample(7, counter)
    status, _ = store.put([(ident, _C.DTYPES["int64"]), (data, _C.DTYPES["float32"])])
    assert status == _C.PUT_ACCEPTED


def test_two_instances_have_their_own_exceptions_and_types():
    m2 = _fresh_instance()
    assert m2 is not _C
    for name in ("WireheadError", "InvalidSampleError", "SchemaMismatchError", "CudaError",
                 "PinLimitError", "Store", "Loader", "Array", "SharedMap", "CudaStage"):
        assert getattr(m2, name) is not getattr(_C, name), name
    assert issubclass(m2.InvalidSampleError, m2.WireheadError)
    assert not issubclass(m2.InvalidSampleError, _C.WireheadError)
    # an error raised by the second instance's code is the second's class
    with pytest.raises(m2.InvalidSampleError) as e:
        m2.Store(uri="shm://" + whlib.unique_name(), swap_cap=0, fields=["a"])
    assert not isinstance(e.value, _C.WireheadError)
    assert "SWAP_CAP" in str(e.value)
    with pytest.raises(_C.InvalidSampleError):
        _C.Store(uri="shm://" + whlib.unique_name(), swap_cap=0, fields=["a"])


def test_an_object_keeps_its_instance_and_a_tensor_outlives_it(shm_cfg):
    import torch
    cfg = shm_cfg(swap_cap=2)
    m2 = _fresh_instance()
    gone = weakref.ref(m2)
    store = m2.Store(**store_kwargs(get_config(None, cfg)))
    try:
        _put_one(store, 0)
        _put_one(store, 1)
        assert store.lead()
        assert store.seal()
        arrays = store.read(store.current(), 1)
        assert type(arrays[1]) is m2.Array and not isinstance(arrays[1], _C.Array)
        # errors from a method reach the instance through the object's type
        with pytest.raises(m2.InvalidSampleError) as e:
            store.read(store.current(), 5)
        assert not isinstance(e.value, _C.WireheadError)
    finally:
        store.close()
    del store, m2
    gc.collect()
    assert gone() is not None, "the Arrays hold their module instance"
    tensor = torch.from_dlpack(arrays[1])
    del arrays
    gc.collect()
    assert gone() is None, "the module instance was kept after its last object died"
    # the tensor's memory belongs to the C buffer, not to the module
    ident, data = whlib.sample(7, 1)
    assert np.array_equal(tensor.numpy(), data)


SUBINTERP = r"""
import importlib.util, sys
try:
    import _xxsubinterpreters as interpreters
except ImportError:
    import _interpreters as interpreters
code = '''
import importlib.util
spec = importlib.util.spec_from_file_location("wirehead_torch._C", PATH)
C = importlib.util.module_from_spec(spec)
spec.loader.exec_module(C)
try:
    C.Store(uri="shm://x", swap_cap=0, fields=["a"])
except C.InvalidSampleError as e:
    assert "SWAP_CAP" in str(e)
else:
    raise SystemExit("no error")
'''.replace("PATH", repr(sys.argv[1]))
for _ in range(2):
    interp = interpreters.create()
    interpreters.run_string(interp, code)
    interpreters.destroy(interp)
print("subinterpreters ok")
"""


def test_loads_in_subinterpreters():
    # in a child: a crash at interpreter teardown must fail this test, not the run
    r = subprocess.run([sys.executable, "-c", SUBINTERP, _C.__file__], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "subinterpreters ok" in r.stdout


def test_an_array_cannot_be_made_without_a_buffer():
    # Arrays come from reads only; one made by hand would have no memory behind it
    with pytest.raises(TypeError, match="cannot create"):
        _C.Array()


def test_fault_hooks_only_in_test_builds():
    """The suite runs against the project's test build (make: WH_FAULTS=1),
    which has the fault-injection points; the wheel's smoke test checks that
    a release build has none."""
    from wirehead_torch import _C
    assert _C.FAULT_HOOKS == 1
