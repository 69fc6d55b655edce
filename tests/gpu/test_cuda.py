"""GPU-direct path (ext/cuda/wh_cuda.c) against a fake CUDA runtime built here
(tests/gpu/fakecuda/fakecuda.c): its streams run on their own threads, copies
happen later (slowed or held), and it records violations, so a missing
stream wait or an early slot reuse gives wrong bytes or a recorded
violation. No GPU is needed; the tests that need one say "GPU" when
skipped."""
import contextlib
import ctypes
import glob
import multiprocessing
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import wirehead_torch as wt
from wirehead_torch import _C

import whlib

pytestmark = pytest.mark.asan  # also run against the sanitizer build

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_SRC = os.path.join(HERE, "fakecuda", "fakecuda.c")
KDLCUDA = 2


def build_fake(out_dir):
    """The fake runtime as a shared library, compiled with the system cc."""
    path = os.path.join(str(out_dir), "libfakecudart.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-g", "-Wall", "-Wextra", "-Werror",
                    "-pthread", "-o", path, FAKE_SRC], check=True)
    return path


class Fake:
    """ctypes handle on the fake runtime the extension loaded (same library,
    same state)."""

    def __init__(self, path):
        self.path = path
        self.lib = lib = ctypes.CDLL(path)
        lib.fake_stream_read.restype = ctypes.c_ulonglong
        lib.fake_stream_read.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                         ctypes.c_void_p]
        lib.fake_op_done.argtypes = [ctypes.c_ulonglong]
        for f in ("fake_drain", "fake_gate"):
            getattr(lib, f).argtypes = [ctypes.c_void_p]
        lib.fake_counter.restype = ctypes.c_long
        lib.fake_counter.argtypes = [ctypes.c_char_p]
        lib.fake_set_copy_delay_us.argtypes = [ctypes.c_long]
        lib.fake_kind.argtypes = [ctypes.c_void_p]
        lib.fake_set_device_limit.argtypes = [ctypes.c_long]
        lib.fake_registered_bytes.restype = ctypes.c_ulonglong
        lib.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        lib.cudaStreamDestroy.argtypes = [ctypes.c_void_p]

    def counter(self, name):
        return self.lib.fake_counter(name.encode())

    def violations(self):
        out, buf = [], ctypes.create_string_buffer(256)
        while self.lib.fake_violation(len(out), buf, 256):
            out.append(buf.value.decode())
        return out

    def new_stream(self):
        s = ctypes.c_void_p()
        assert self.lib.cudaStreamCreateWithFlags(ctypes.byref(s), 1) == 0
        return s.value

    def read(self, stream, ptr, nbytes):
        """A consumer kernel on `stream` reading device bytes: (op id, buffer)."""
        out = ctypes.create_string_buffer(nbytes)
        op = self.lib.fake_stream_read(stream, ptr, nbytes, out)
        assert op
        return op, out

    def done(self, op):
        return bool(self.lib.fake_op_done(op))


@pytest.fixture(scope="session")
def fake_lib(tmp_path_factory):
    path = build_fake(tmp_path_factory.mktemp("fakecuda"))
    old = os.environ.get("WIREHEAD_CUDA_LIB")
    os.environ["WIREHEAD_CUDA_LIB"] = path
    info = _C.cuda_init(0)
    assert info["lib"] == path, f"the extension loaded another CUDA runtime: {info}"
    yield Fake(path)
    if old is None:
        os.environ.pop("WIREHEAD_CUDA_LIB", None)
    else:
        os.environ["WIREHEAD_CUDA_LIB"] = old


@pytest.fixture
def fake(fake_lib):
    lib = fake_lib.lib
    lib.fake_reset()
    lib.fake_set_copy_delay_us(0)
    yield fake_lib
    lib.fake_hold_copies(0)
    lib.fake_open_gate()
    lib.fake_drain_all()
    lib.fake_set_copy_delay_us(0)


def tensor_of(cap, versioned=False):
    """(data pointer, device type, device id, ndim, shape) of a DLPack capsule."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    p = get(cap, b"dltensor_versioned" if versioned else b"dltensor")
    if versioned:
        p += 8 + 8 + 8 + 8  # version, manager_ctx, deleter, flags
    data = ctypes.c_void_p.from_address(p).value
    dev_type = ctypes.c_int32.from_address(p + 8).value
    dev_id = ctypes.c_int32.from_address(p + 12).value
    ndim = ctypes.c_int32.from_address(p + 16).value
    shape_p = ctypes.c_void_p.from_address(p + 24).value
    shape = tuple(ctypes.c_int64.from_address(shape_p + 8 * i).value for i in range(ndim))
    return data, dev_type, dev_id, ndim, shape


def host_items(*arrays):
    return [(a.ctypes.data, a.nbytes, _C.DTYPES[a.dtype.name], a.shape) for a in arrays]


def run_child(code, **env):
    """Runs code in a fresh interpreter (the runtime is loaded once per
    process) and returns its output."""
    e = whlib.env_for_child({k: str(v) for k, v in env.items()})
    for k in ("WIREHEAD_CUDA_LIB", "FAKECUDA_DEVICES", "FAKECUDA_RUNTIME_VERSION",
              "FAKECUDA_DRIVER_VERSION"):
        if k not in env:
            e.pop(k, None)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


PROBE = """
import wirehead_torch as wt
from wirehead_torch import _C
try:
    print(_C.cuda_init({dev}))
except wt.CudaError as e:
    print("CudaError:", e)
"""


def test_errors_name_what_is_missing(fake_lib):
    out = run_child(PROBE.format(dev=0), WIREHEAD_CUDA_LIB="/nonexistent/libcudart.so.12")
    assert "CudaError: CUDA: WIREHEAD_CUDA_LIB=/nonexistent/libcudart.so.12 cannot be loaded" in out
    out = run_child(PROBE.format(dev=0), WIREHEAD_CUDA_LIB=fake_lib.path,
                    FAKECUDA_RUNTIME_VERSION=10020)
    assert "version 10.2, too old (need 11.0 or newer)" in out
    out = run_child(PROBE.format(dev=0), WIREHEAD_CUDA_LIB=fake_lib.path,
                    FAKECUDA_DRIVER_VERSION=0)
    assert "no NVIDIA driver is installed" in out
    out = run_child(PROBE.format(dev=1), WIREHEAD_CUDA_LIB=fake_lib.path, FAKECUDA_DEVICES=1)
    assert "CUDA: no device 1: this machine has 1 CUDA device" in out
    out = run_child(PROBE.format(dev=0), WIREHEAD_CUDA_LIB=fake_lib.path, FAKECUDA_DEVICES=0)
    assert "no device 0: this machine has 0 CUDA devices" in out
    out = run_child(PROBE.format(dev=1), WIREHEAD_CUDA_LIB=fake_lib.path, FAKECUDA_DEVICES=2)
    assert "'runtime_version': 12040" in out


def test_no_library_found_without_override():
    # this machine has no CUDA runtime; with one (a GPU machine) the probe succeeds
    out = run_child(PROBE.format(dev=0))
    # without a runtime the error says where it looked and how to name one;
    # with one (torch's CUDA wheels, a GPU machine) the result or the error
    # (no driver, no device) names the library it found
    assert ("no CUDA runtime library is loaded or loadable" in out
            and "WIREHEAD_CUDA_LIB" in out) or "libcudart" in out, out


def test_extension_links_no_cuda_library():
    so = _C.__file__
    out = subprocess.run(["ldd", so], capture_output=True, text=True, check=True).stdout
    libs = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert not [x for x in libs if x.startswith(("libcudart", "libcuda.", "libnvrtc"))], out
    assert "dlopen" in subprocess.run(["nm", "-D", so], capture_output=True, text=True).stdout


def test_correct_bytes_under_a_slow_copy_engine(fake):
    fake.lib.fake_set_copy_delay_us(3000)
    stage = _C.CudaStage(device=0)
    stream = fake.new_stream()
    rng = np.random.default_rng(1)
    sent, reads = [], []
    for i in range(6):
        a = rng.integers(0, 255, size=(3, 50), dtype=np.uint8)
        b = rng.standard_normal(17).astype(np.float32)
        arrs = stage.copy(host_items(a, b))
        a[:] = 0  # the caller's memory is free once copy() returns
        for arr, want in zip(arrs, (a.copy(), b)):
            assert arr.__dlpack_device__() == (KDLCUDA, 0)
            cap = arr.__dlpack__(stream=stream)
            ptr, dt, di, ndim, shape = tensor_of(cap)
            assert (dt, di, shape) == (KDLCUDA, 0, arr.shape)
            assert fake.lib.fake_kind(ptr) == 1  # device memory
            reads.append((fake.read(stream, ptr, arr_nbytes(arr)), cap))
        sent.append(b)
    fake.lib.fake_drain(stream)
    got = [np.frombuffer(out.raw, np.float32) for (op, out), _ in reads[1::2]]
    for g, b in zip(got, sent):
        np.testing.assert_array_equal(g, b)
    st = stage.stats()
    assert st["copies"] == 6 and st["stream_waits"] == 12
    assert fake.counter("pageable_copies") == 0 and fake.violations() == []
    del reads
    stage.close()
    fake.lib.cudaStreamDestroy(stream)


def arr_nbytes(arr):
    n = np.dtype(arr.dtype).itemsize
    for d in arr.shape:
        n *= d
    return n


def test_consumer_stream_waits_on_the_copy(fake):
    stage = _C.CudaStage(device=0)
    waits = fake.counter("stream_waits")
    for i, stream in enumerate((None, 1, 2, fake.new_stream())):
        x = np.arange(1000, dtype=np.int64) * (i + 1)
        fake.lib.fake_hold_copies(1)  # the copy engine has not run yet
        (arr,) = stage.copy(host_items(x))
        cap = arr.__dlpack__(stream=stream)
        ptr = tensor_of(cap)[0]
        op, out = fake.read(1 if stream is None else stream, ptr, x.nbytes)
        assert not fake.done(op)  # held behind the copy event, not reading garbage
        fake.lib.fake_hold_copies(0)
        fake.lib.fake_drain_all()
        assert fake.done(op)
        np.testing.assert_array_equal(np.frombuffer(out.raw, np.int64), x)
        del cap, arr
    # one wait per export, and the refills of the reused buffer waited on its consumers
    assert stage.stats()["stream_waits"] == 4 and fake.counter("stream_waits") - waits > 4
    assert fake.violations() == [] and fake.counter("host_syncs") == 0
    stage.close()


def test_missing_wait_is_caught_by_the_fake(fake):
    # the check itself: stream=-1 (the consumer synchronises itself) makes no
    # wait, and a read racing the copy is a recorded violation
    stage = _C.CudaStage(device=0)
    x = np.arange(64, dtype=np.float64)
    fake.lib.fake_hold_copies(1)
    (arr,) = stage.copy(host_items(x))
    cap = arr.__dlpack__(stream=-1)
    op, out = fake.read(2, tensor_of(cap)[0], x.nbytes)
    fake.lib.fake_drain(2)
    fake.lib.fake_hold_copies(0)
    fake.lib.fake_drain_all()
    v = fake.violations()
    assert len(v) == 1 and "did not wait on the copy event" in v[0]
    assert not np.array_equal(np.frombuffer(out.raw, np.float64), x)
    del cap
    stage.close()


def test_pinned_slot_reused_only_after_its_event(fake):
    stage = _C.CudaStage(device=0)
    fake.lib.fake_hold_copies(1)
    xs = [np.full(4096, i, dtype=np.uint8) for i in range(3)]
    arrs = [stage.copy(host_items(x))[0] for x in xs]
    # copies pending: each needed its own page-locked buffer
    assert stage.stats()["pinned_buffers"] == 3
    fake.lib.fake_hold_copies(0)
    fake.lib.fake_drain_all()
    more = [stage.copy(host_items(x))[0] for x in xs]
    assert stage.stats()["pinned_buffers"] == 3  # events done: reused
    stream = fake.new_stream()
    for arr, x in zip(arrs + more, xs + xs):
        cap = arr.__dlpack__(stream=stream)
        op, out = fake.read(stream, tensor_of(cap)[0], x.nbytes)
        fake.lib.fake_drain(stream)
        assert out.raw == x.tobytes()
    assert fake.violations() == []
    assert fake.counter("host_syncs") == 0
    stage.close()


def test_device_buffer_reused_only_after_its_consumer(fake):
    stage = _C.CudaStage(device=0)
    stream = fake.new_stream()
    a = np.full(10000, 7, dtype=np.uint8)
    b = np.full(10000, 9, dtype=np.uint8)
    (arr,) = stage.copy(host_items(a))
    fake.lib.fake_drain_all()  # A's copy is done: only its consumer holds the buffer
    fake.lib.fake_gate(stream)  # the consumer's stream is busy with earlier work
    cap = arr.__dlpack__(stream=stream)
    ptr = tensor_of(cap)[0]
    op, out = fake.read(stream, ptr, a.nbytes)
    del cap, arr  # the consumer is done on the host side; its read is still queued
    (arr2,) = stage.copy(host_items(b))
    assert arr2.data_ptr == ptr  # the same device buffer, from the pool
    fake.lib.fake_open_gate()
    fake.lib.fake_drain_all()
    assert out.raw == a.tobytes()  # the refill waited for the consumer's read
    cap2 = arr2.__dlpack__(stream=stream)
    op, out2 = fake.read(stream, tensor_of(cap2)[0], b.nbytes)
    fake.lib.fake_drain(stream)
    assert out2.raw == b.tobytes()
    assert fake.violations() == [] and fake.counter("host_syncs") == 0
    del cap2
    stage.close()


def test_dlpack_arguments_for_device_arrays(fake):
    stage = _C.CudaStage(device=0)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (arr,) = stage.copy(host_items(x))
    with pytest.raises(ValueError, match="stream=0 is ambiguous"):
        arr.__dlpack__(stream=0)
    with pytest.raises(ValueError, match="not a CUDA stream"):
        arr.__dlpack__(stream=-5)
    with pytest.raises(TypeError, match="stream must be None or an int"):
        arr.__dlpack__(stream="1")
    with pytest.raises(BufferError, match=r"lives on device \(2, 0\)"):
        arr.__dlpack__(dl_device=(1, 0))
    with pytest.raises(BufferError, match="copy=True is supported for host arrays only"):
        arr.__dlpack__(copy=True)
    cap = arr.__dlpack__(stream=1, max_version=(1, 0), dl_device=(KDLCUDA, 0), copy=False)
    assert "dltensor_versioned" in repr(cap)
    ptr, dt, di, ndim, shape = tensor_of(cap, versioned=True)
    assert (dt, di, shape) == (KDLCUDA, 0, (3, 4))
    old = arr.__dlpack__(stream=2, max_version=(0, 8))
    assert '"dltensor"' in repr(old)
    op, out = fake.read(1, ptr, x.nbytes)
    fake.lib.fake_drain(1)
    np.testing.assert_array_equal(np.frombuffer(out.raw, np.float32).reshape(3, 4), x)
    del cap, old
    stage.close()


# ---- WireheadLoader(device="cuda") and to_device against the fake ----

N = 10


def fill(cfg):
    wt.WireheadGenerator((whlib.sample(4, i) for i in range(N)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    return cfg


class Consumer:
    """Stands in for torch.from_dlpack of a CUDA build: exports device arrays
    for its own stream (as torch passes its current stream), reads the bytes
    there with a fake kernel, and releases the capsule after that read, as a
    tensor going away would. Host arrays go to the real from_dlpack."""

    def __init__(self, fake, real):
        self.fake, self.real = fake, real
        self.stream = fake.new_stream()
        self.exports = 0

    def __call__(self, arr):
        import torch
        if arr.__dlpack_device__()[0] != KDLCUDA:
            return self.real(arr)
        cap = arr.__dlpack__(stream=self.stream)
        ptr, _, _, _, shape = tensor_of(cap)
        dt = np.dtype({"bool": "uint8", "bfloat16": "int16"}.get(arr.dtype, arr.dtype))
        op, out = self.fake.read(self.stream, ptr, int(np.prod(shape)) * dt.itemsize)
        self.fake.lib.fake_drain(self.stream)  # the test's own wait, not the loader's
        self.exports += 1
        del cap
        t = torch.from_numpy(np.frombuffer(out.raw, dt).reshape(shape).copy())
        return t.view(torch.bfloat16) if arr.dtype == "bfloat16" else t


@pytest.fixture
def consumer(fake, monkeypatch):
    import torch
    c = Consumer(fake, torch.from_dlpack)
    monkeypatch.setattr(torch, "from_dlpack", c)
    return c


def check_batches(batches):
    seen = set()
    for b in batches:
        for ident, data, pad in zip(b["id"], b["data"], b["is_pad"]):
            tag, counter = whlib.check_sample(ident.numpy(), data.numpy())
            if not pad:
                seen.add(counter)
    return seen


def test_loader_device_bytes_under_a_slow_copy_engine(fake, consumer, store_cfg):
    cfg = fill(store_cfg(swap_cap=N))
    fake.lib.fake_set_copy_delay_us(2000)
    loader = wt.WireheadLoader(config=cfg, batch_size=3, device="cuda:0", shuffle=True,
                               prefetch=2)
    for epoch in range(2):
        batches = list(loader)
        assert len(batches) == len(loader) == 4
        assert check_batches(batches) == set(range(N))
        assert all(b["is_pad"].dtype.is_floating_point is False for b in batches)
    st = loader.stats()
    assert st["copies"] == 8 and st["h2d_bytes"] > 8 * 3 * (256 * 4 + 16)
    # id, data, is_pad, generation, position, params_version
    assert st["stream_waits"] == consumer.exports == 8 * 6
    assert st["copy_s"] > 0 and "wait_s" in st
    assert fake.counter("pageable_copies") == 0  # the ring is page-locked
    assert fake.counter("host_syncs") == 0  # no host synchronize in the steady state
    assert fake.violations() == []
    loader.close()


@pytest.mark.parametrize("value", ["-1", "1e9", "OFFF", "0", " 12", "99999999999999999999"])
def test_direct_min_row_env_is_checked(fake, shm_cfg, monkeypatch, value):
    """WIREHEAD_GPU_DIRECT_MIN_ROW is a byte count of digits or off: -1 once
    was the largest count (a raw error later), 1e9 was read as 1 byte and
    OFF as the default; now each is refused naming the variable, and the
    loader on a device says so when it is made."""
    stage = _C.CudaStage(device=0)
    monkeypatch.setenv("WIREHEAD_GPU_DIRECT_MIN_ROW", value)
    with pytest.raises(ValueError, match=f"WIREHEAD_GPU_DIRECT_MIN_ROW={re.escape(value)} is "
                                         f"neither a row size in bytes"):
        stage.direct_min("shm://x")
    cfg = fill(shm_cfg(swap_cap=N))
    loader = wt.WireheadLoader(config=cfg, batch_size=2, device="cuda")
    with pytest.raises(ValueError, match="WIREHEAD_GPU_DIRECT_MIN_ROW"):
        loader._loader()
    loader.close()


def test_direct_min_row_env_values(fake, monkeypatch):
    stage = _C.CudaStage(device=0)
    for value, want in (("1000000000", 10 ** 9), ("", 256 * 1024), ("1", 1)):
        monkeypatch.setenv("WIREHEAD_GPU_DIRECT_MIN_ROW", value)
        assert stage.direct_min("shm://x") == (want, "")
    for value in ("off", "OFF", "Off"):  # any case means off
        monkeypatch.setenv("WIREHEAD_GPU_DIRECT_MIN_ROW", value)
        assert stage.direct_min("shm://x") == (0, "WIREHEAD_GPU_DIRECT_MIN_ROW=off")


def test_loader_ring_slot_reused_only_after_its_copy(fake, shm_cfg):
    cfg = fill(shm_cfg(swap_cap=N))
    loader = wt.WireheadLoader(config=cfg, batch_size=2, device="cuda", shuffle=False,
                               prefetch=1)
    ld = loader._loader()
    stream = fake.new_stream()

    def epoch(e):
        ld.start(e, 0, 0)
        got = []
        while (b := ld.next()) is not None:
            fields, is_pad, gens, pos, pvs, index, any_pad = b
            assert fields[1].__dlpack_device__() == (KDLCUDA, 0)
            caps = [fields[0].__dlpack__(stream=stream), fields[1].__dlpack__(stream=stream)]
            reads = [fake.read(stream, tensor_of(c)[0], n) for c, n in zip(caps, (16 * 2, 1024 * 2))]
            got.append((reads, caps, any_pad))
        return got

    fake.lib.fake_hold_copies(1)  # no copy completes while the epoch is read
    first = epoch(0)
    assert len(first) == 5
    ring = ld.info()["ring"]
    assert ring >= 5  # every slot's copy pending: none reused, the ring grew
    assert not any(fake.done(r[0][0][0]) for r in first)
    fake.lib.fake_hold_copies(0)
    fake.lib.fake_drain_all()
    counters = []
    for (ids, data), caps, any_pad in first:
        ids = np.frombuffer(ids[1].raw, np.int64).reshape(2, 2)
        data = np.frombuffer(data[1].raw, np.float32).reshape(2, 256)
        for i, d in zip(ids, data):
            counters.append(whlib.check_sample(i, d)[1])
        assert any_pad is False
    assert counters == list(range(N))
    del first, caps
    second = epoch(1)  # copies complete now: slots come back, the ring stays
    fake.lib.fake_drain_all()
    assert ld.info()["ring"] == ring and len(second) == 5
    assert fake.violations() == [] and fake.counter("host_syncs") == 0
    del second
    loader.close()


def test_loader_ignore_pad_uses_the_host_flag(fake, consumer, shm_cfg):
    cfg = fill(shm_cfg(swap_cap=N))
    loader = wt.WireheadLoader(config=cfg, batch_size=4, device="cuda", shuffle=False,
                               pad="ignore", label_fields=["id"], ignore_index=-7)
    batches = list(loader)
    last = batches[-1]
    assert last["is_pad"].tolist() == [False, False, True, True]
    assert (last["id"][2:] == -7).all() and (batches[0]["id"] != -7).all()
    loader.close()


def test_cpu_loader_is_untouched(fake, shm_cfg):
    cfg = fill(shm_cfg(swap_cap=N))
    before = fake.counter("copies"), fake.counter("event_records")
    loader = wt.WireheadLoader(config=cfg, batch_size=3)
    batches = list(loader)
    assert check_batches(batches) == set(range(N))
    assert all(b["data"].device.type == "cpu" for b in batches)
    assert "h2d_bytes" not in loader.stats()
    assert (fake.counter("copies"), fake.counter("event_records")) == before
    loader.close()


def test_to_device_moves_dataloader_batches(fake, consumer):
    import torch
    fake.lib.fake_set_copy_delay_us(1000)
    ds = torch.utils.data.TensorDataset(torch.arange(40, dtype=torch.float32).reshape(10, 4),
                                        torch.arange(10) % 2 == 0)
    dl = torch.utils.data.DataLoader(ds, batch_size=4)
    out = list(wt.to_device(dl, "cuda:0"))
    assert len(out) == 3
    for (x, flag), (hx, hflag) in zip(out, dl):
        assert torch.equal(x, hx) and flag.dtype == torch.bool and torch.equal(flag, hflag)
    d = {"a": torch.ones(3, dtype=torch.bfloat16), "b": [torch.zeros(2, 2, dtype=torch.int16)],
         "name": "x"}
    (moved,) = list(wt.to_device([d], 0))
    assert moved["name"] == "x" and moved["a"].dtype == torch.bfloat16
    assert torch.equal(moved["a"], d["a"])
    assert torch.equal(moved["b"][0], d["b"][0])
    assert fake.violations() == [] and fake.counter("pageable_copies") == 0


class CudaInWorker:
    """A map-style dataset whose items try to create CUDA state in a worker."""

    def __init__(self, cfg):
        self.cfg = cfg

    def __len__(self):
        return 2

    def __getitem__(self, i):
        import torch
        try:
            if i == 0:
                next(wt.to_device([torch.zeros(1)], "cuda"))
            else:
                wt.WireheadLoader(config=self.cfg, batch_size=1, device="cuda")
        except RuntimeError as e:
            return str(e)
        return "no error"


def test_dataloader_workers_refuse_cuda(fake_lib, shm_cfg):
    import torch
    dl = torch.utils.data.DataLoader(CudaInWorker(shm_cfg()), num_workers=1, batch_size=None)
    msgs = list(dl)
    assert len(msgs) == 2
    for what, msg in zip(("wirehead_torch.to_device", "WireheadLoader"), msgs):
        assert msg.startswith(what) and "inside a DataLoader worker process" in msg
        assert "must not create CUDA state" in msg


REAL_GPU = """
import torch, wirehead_torch as wt, json, sys
cfg = json.loads(sys.argv[1])
cpu = list(wt.WireheadLoader(config=cfg, batch_size=3, shuffle=False))
gpu = wt.WireheadLoader(config=cfg, batch_size=3, shuffle=False, device="cuda")
side = torch.cuda.Stream()
with torch.cuda.stream(side):  # a non-default consumer stream
    got = [{k: v.clone() for k, v in b.items()} for b in gpu]
torch.cuda.current_stream().wait_stream(side)
assert len(got) == len(cpu)
for c, g in zip(cpu, got):
    for k in c:
        assert g[k].device.type == "cuda", k
        assert torch.equal(c[k], g[k].cpu()), k
st = gpu.stats()
assert st["h2d_bytes"] > 0 and st["copies"] == len(cpu), st
moved = list(wt.to_device(torch.utils.data.DataLoader(torch.arange(12.0).reshape(6, 2),
                                                      batch_size=4), "cuda"))
assert torch.equal(torch.cat(moved).cpu(), torch.arange(12.0).reshape(6, 2))
# the registered path: 256 KiB rows copied straight from the store
big = json.loads(sys.argv[2])
cpu = [b["data"] for b in wt.WireheadLoader(config=big, batch_size=4, shuffle=False,
                                            fields=["data"])]
gpu = wt.WireheadLoader(config=big, batch_size=4, shuffle=False, fields=["data"], device="cuda")
for epoch in range(2):
    got = [b["data"].clone() for b in gpu]
    assert all(torch.equal(c, g.cpu()) for c, g in zip(cpu, got)) and len(got) == len(cpu)
st = gpu.stats()
assert st["path"] == "registered" and st["host_copy_bytes"] == 0, st
gpu.close()
print("ok", st["h2d_bytes"])
"""


def test_real_gpu_loader_and_to_device(shm_cfg):
    import json

    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False here)")
    cfg = fill(shm_cfg(swap_cap=N))
    big = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    e = whlib.env_for_child()
    e.pop("WIREHEAD_CUDA_LIB", None)  # the real runtime, as torch loaded it
    r = subprocess.run([sys.executable, "-c", REAL_GPU, json.dumps(cfg), json.dumps(big)], env=e,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr


def test_loader_on_a_missing_device_names_it(fake, shm_cfg):
    cfg = fill(shm_cfg(swap_cap=N))
    loader = wt.WireheadLoader(config=cfg, batch_size=2, device="cuda:3")
    with pytest.raises(wt.CudaError, match="no device 3: this machine has 1 CUDA device"):
        next(iter(loader))
    loader.close()


def test_many_consumer_streams_fall_back_to_a_host_wait(fake):
    # a device buffer tracks the release events of 8 streams; a 9th makes the
    # stage wait for the oldest on the host rather than forget it
    stage = _C.CudaStage(device=0)
    x = np.arange(256, dtype=np.int32)
    (arr,) = stage.copy(host_items(x))
    streams = [fake.new_stream() for _ in range(9)]
    outs = []
    for s in streams:
        cap = arr.__dlpack__(stream=s)
        outs.append(fake.read(s, tensor_of(cap)[0], x.nbytes)[1])
        del cap
    fake.lib.fake_drain_all()
    assert all(o.raw == x.tobytes() for o in outs)
    st = stage.stats()
    assert st["host_waits"] == 1 and st["stream_waits"] == 9
    del arr
    y = x + 1
    (arr2,) = stage.copy(host_items(y))
    cap = arr2.__dlpack__(stream=streams[0])
    op, out = fake.read(streams[0], tensor_of(cap)[0], y.nbytes)
    fake.lib.fake_drain_all()
    assert out.raw == y.tobytes() and fake.violations() == []
    del cap
    stage.close()


def test_second_device(fake_lib):
    out = run_child("""
import numpy as np
from wirehead_torch import _C
st = _C.CudaStage(device=1)
x = np.arange(6, dtype=np.float64)
(a,) = st.copy([(x.ctypes.data, x.nbytes, _C.DTYPES["float64"], x.shape)])
print(a.__dlpack_device__(), a.shape, a.dtype)
""", WIREHEAD_CUDA_LIB=fake_lib.path, FAKECUDA_DEVICES=2)
    assert out.strip() == "(2, 1) (6,) float64"


# ---- the registered path: DMA straight from the store's mapping ----

BIG = 65536  # float32 rows of 256 KiB: at the cut-over, copied from the store


def fill_big(cfg, n=N, tag=5):
    wt.WireheadGenerator((whlib.sample(tag, i, BIG) for i in range(n)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    return cfg


def read_epoch(fake, ld, e, stream):
    """Epoch e of a C loader: (fake read of data, of ids) per batch, issued on stream."""
    ld.start(e, 0, 0)
    got = []
    while (b := ld.next()) is not None:
        fields = b[0]
        caps = [fields[0].__dlpack__(stream=stream), fields[1].__dlpack__(stream=stream)]
        rows = tensor_of(caps[1])[4][0]
        got.append([fake.read(stream, tensor_of(caps[0])[0], 16 * rows)[1],
                    fake.read(stream, tensor_of(caps[1])[0], 4 * BIG * rows)[1]])
        del caps
    return got


def counters_of(got):
    out = []
    for ids, data in got:
        ids = np.frombuffer(ids.raw, np.int64).reshape(-1, 2)
        data = np.frombuffer(data.raw, np.float32).reshape(len(ids), BIG)
        out += [whlib.check_sample(i, d)[1] for i, d in zip(ids, data)]
    return out


def test_registered_path_copies_from_the_store_without_host_copies(fake, consumer, shm_cfg):
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    fake.lib.fake_set_copy_delay_us(2000)  # the copy engine reads the store late
    before = fake.counter("registers")
    loader = wt.WireheadLoader(config=cfg, batch_size=4, device="cuda", shuffle=False,
                               fields=["data"])
    data = [b["data"] for b in loader]
    want = np.stack([whlib.sample(5, i, BIG)[1] for i in range(N)])
    assert np.array_equal(np.concatenate([d.numpy() for d in data])[:N], want)
    st = loader.stats()
    assert st["path"] == "registered" and st["host_copy_bytes"] == 0 and not st["staged_why"]
    assert fake.counter("registers") == before + 1
    assert fake.counter("registered_copies") == N + 2  # one per row, padding row included
    assert fake.counter("pageable_copies") == 0 and fake.counter("host_syncs") == 0
    flags = fake.lib.fake_last_register_flags()
    assert flags & 8 and flags & 1  # read-only (CUDA >= 11.1) and portable
    assert fake.violations() == []
    loader.close()
    fake.lib.fake_drain_all()
    assert fake.lib.fake_registered_bytes() == 0  # the last user unregistered it


def corrupt_big(cfg, tag, counter):
    """Flips one data bit in the middle of sample(tag, counter, BIG) in cfg's segment."""
    whlib.flip_bit_after(cfg, whlib.sample(tag, counter, BIG)[1][BIG // 2:BIG // 2 + 16].tobytes())


def test_registered_path_checks_each_sample_once_per_generation(fake, consumer, shm_cfg):
    """VERIFY_READS on the registered path: a sample's bytes are hashed the
    first time this process copies them from a generation (a damaged one is
    skipped then), not again in later epochs of that generation; a new
    generation is checked anew (docs/gpu.md, "Checks")."""
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    corrupt_big(cfg, 5, 3)  # damaged before the first read
    loader = wt.WireheadLoader(config=cfg, batch_size=5, device="cuda", shuffle=False)
    first = check_batches(list(loader))  # skipped: a neighbour stands in as padding
    assert 3 not in first and loader.stats()["corrupt"] == 1
    corrupt_big(cfg, 5, 7)  # damaged after its first check
    batches = list(loader)  # sample 3 skipped again: a failed check is never remembered
    ids = np.concatenate([b["id"].numpy() for b in batches])
    data = np.concatenate([b["data"].numpy() for b in batches])
    k = [i for i, (tag, c) in enumerate(ids) if c == 7][0]
    with pytest.raises(AssertionError):  # through, unchecked: the documented trade
        whlib.check_sample(ids[k], data[k])
    assert loader.stats()["corrupt"] == 2
    loader.close()
    # a new generation under the same areas is checked again
    wt.WireheadGenerator((whlib.sample(6, i, BIG) for i in range(N)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    corrupt_big(cfg, 6, 7)
    loader = wt.WireheadLoader(config=cfg, batch_size=5, device="cuda", shuffle=False)
    assert 7 not in check_batches(list(loader)) and loader.stats()["corrupt"] == 1
    assert fake.violations() == []
    loader.close()


@contextlib.contextmanager
def loader_holding_views(cfg):
    """A WireheadLoader(device) one batch into an epoch: the batches it
    prefetched after that one hold their rows' store views (their pins)."""
    loader = wt.WireheadLoader(config=cfg, batch_size=2, device="cuda", shuffle=False,
                               fields=["data"])
    it = iter(loader)
    try:
        next(it)
        yield loader
    finally:
        del it
        loader.close()


def test_a_fork_does_not_pin_the_loaders_in_flight_views(fake, consumer, shm_cfg):
    """A child forked while WireheadLoader(device) holds store views for its
    copies (a DataLoader's workers, say) does not pin their generations for
    its life: only the loader's threads use those views."""
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    with loader_holding_views(cfg):
        before = {a["generation"]: a["pinners"] for a in wt.status(cfg)["areas"]}
        assert any(before.values())  # the loader pins its generation
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child only waits
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        os.close(r)
        try:
            after = {a["generation"]: a["pinners"] for a in wt.status(cfg)["areas"]}
            assert after == before, (before, after)
        finally:
            os.close(w)
            os.waitpid(pid, 0)
    assert fake.violations() == []


def test_device_loaders_pins_do_not_refuse_this_processs_views(fake, consumer, shm_cfg):
    """The one-generation-per-process rule for views (docs/copies.md) counts
    the views the caller holds, not the pins WireheadLoader(device) keeps for
    its copies: with the loader holding generation A, a view of a newer
    generation B in the same process is made, not refused."""
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    with loader_holding_views(cfg):
        old = [a["generation"] for a in wt.status(cfg)["areas"] if a["pinners"]]
        assert old, wt.status(cfg)["areas"]  # the loader's, this process's only
        wt.WireheadGenerator((whlib.sample(6, i, BIG) for i in range(N)), config=cfg).run()
        assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
        st = whlib.open_store(cfg)
        new = st.current()
        assert new not in old
        g, p, pad, arrays, _ = st.view_sample(new, 3, None, 10.0, False)
        ids, data = (np.from_dlpack(a) for a in arrays)
        assert (g, p, pad) == (new, 3, False) and whlib.check_sample(ids, data) == (6, 3)
        del arrays, ids, data
    assert fake.violations() == []


def test_small_rows_are_gathered_and_counted(fake, consumer, shm_cfg):
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    loader = wt.WireheadLoader(config=cfg, batch_size=5, device="cuda", shuffle=False)
    assert check_batches(list(loader)) == set(range(N))
    st = loader.stats()
    # the 16-byte ids go with the batch buffer; the 256 KiB rows from the store
    assert st["path"] == "registered" and st["host_copy_bytes"] == 16 * N
    assert fake.counter("registered_copies") == N and fake.violations() == []
    # the page-locked ring holds what the host writes (ids and the four
    # per-row columns, 64-byte aligned), not the rows left in the store
    per_slot = 128 + 64 + 3 * 64
    assert 0 < st["ring_bytes"] <= st["ring"] * per_slot, st
    loader.close()


def test_refused_after_registered_batches_keeps_every_row(fake, consumer, shm_cfg, monkeypatch):
    """Batches filled for the registered path (their page-locked part
    without the large rows) are staged whole when registration is then
    refused: every row with its id, padding flags included."""
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    monkeypatch.setenv("FAKECUDA_REGISTER_LIMIT", "1")
    loader = wt.WireheadLoader(config=cfg, batch_size=5, device="cuda", shuffle=False)
    with pytest.warns(RuntimeWarning, match="RLIMIT_MEMLOCK"):
        batches = list(loader)
    assert check_batches(batches) == set(range(N))
    pads = np.concatenate([b["is_pad"].numpy() for b in batches])
    assert pads.sum() == len(pads) - N and not pads[:N].any()
    st = loader.stats()
    assert st["path"] == "staged" and st["host_copy_bytes"] >= 4 * BIG * N
    assert fake.violations() == []
    loader.close()


def test_fake_flags_a_dma_from_unregistered_or_changed_memory(fake):
    lib = fake.lib
    lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                    ctypes.c_int, ctypes.c_void_p]
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    src = np.arange(1024, dtype=np.uint8)
    dev = ctypes.c_void_p()
    assert lib.cudaMalloc(ctypes.byref(dev), src.nbytes) == 0
    s = fake.new_stream()
    assert lib.cudaHostRegister(src.ctypes.data, src.nbytes, 8) == 0
    lib.fake_hold_copies(1)
    assert lib.cudaMemcpyAsync(dev, src.ctypes.data, 512, 1, s) == 0
    src[:4] = 99  # an area reclaimed and written while its DMA is pending
    lib.fake_hold_copies(0)
    lib.fake_drain_all()
    assert any("changed before the copy ran" in v for v in fake.violations())
    lib.fake_hold_copies(1)
    assert lib.cudaMemcpyAsync(dev, src.ctypes.data, 512, 1, s) == 0
    assert lib.cudaHostUnregister(src.ctypes.data) == 0
    lib.fake_hold_copies(0)
    lib.fake_drain_all()
    v = fake.violations()
    assert any("cudaHostUnregister" in x for x in v) and any("unregistered before" in x for x in v)
    assert lib.cudaFree(dev) == 0


def test_pending_dma_holds_its_generation(fake, shm_cfg):
    # copies held: the store seals newer generations meanwhile, yet the
    # area under the pending DMA is not reclaimed, so the bytes are exact
    cfg = fill_big(shm_cfg(swap_cap=4, budget="2MiB"), n=4)
    loader = wt.WireheadLoader(config=cfg, batch_size=2, device="cuda", shuffle=False,
                               fields=["id", "data"], prefetch=1)
    ld = loader._loader()
    stream = fake.new_stream()
    fake.lib.fake_hold_copies(1)
    got = read_epoch(fake, ld, 0, stream)
    for tag in (6, 7, 8, 9):  # four seals: every unpinned area is reused
        fill_big(cfg, n=4, tag=tag)
    fake.lib.fake_hold_copies(0)
    fake.lib.fake_drain_all()
    assert counters_of(got) == [0, 1, 2, 3]
    assert fake.violations() == []
    loader.close()


def test_registered_again_after_the_store_is_made_again(fake, shm_cfg):
    cfg = fill_big(shm_cfg(swap_cap=4, budget="2MiB"), n=4)
    loader = wt.WireheadLoader(config=cfg, batch_size=2, device="cuda", shuffle=False,
                               fields=["id", "data"])
    ld = loader._loader()
    stream = fake.new_stream()
    before = (fake.counter("registers"), fake.counter("unregisters"))
    got = read_epoch(fake, ld, 0, stream)
    fake.lib.fake_drain_all()
    assert counters_of(got) == [0, 1, 2, 3]
    wt.clean(cfg)
    fill_big(cfg, n=4, tag=6)  # a new segment under the same name
    import time
    deadline = time.monotonic() + 10
    while True:  # the handle notices the new segment within a second
        got = read_epoch(fake, ld, 1, stream)
        fake.lib.fake_drain_all()
        if np.frombuffer(got[0][0].raw, np.int64)[0] == 6 or time.monotonic() > deadline:
            break
    try:
        assert counters_of(got) == [0, 1, 2, 3]
        assert np.frombuffer(got[0][0].raw, np.int64)[0] == 6
        # the new segment registered once, while the loader's threads moved
        # to it one by one (batches from both segments alternate meanwhile)
        assert fake.counter("registers") == before[0] + 2
        assert fake.violations() == []
    finally:
        loader.close()
    fake.lib.fake_drain_all()
    assert fake.lib.fake_registered_bytes() == 0  # every registration let go
    assert fake.counter("unregisters") == before[1] + 2


@pytest.mark.parametrize("env, says", [("FAKECUDA_REGISTER_LIMIT", "RLIMIT_MEMLOCK"),
                                       ("FAKECUDA_NO_REGISTER", "not supported")])
def test_refused_registration_falls_back_and_says_why_once(fake, consumer, shm_cfg,
                                                           monkeypatch, env, says):
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    monkeypatch.setenv(env, "1")
    loader = wt.WireheadLoader(config=cfg, batch_size=4, device="cuda", shuffle=False,
                               fields=["data"])
    with pytest.warns(RuntimeWarning, match=says) as record:
        for _ in range(2):
            data = [b["data"] for b in loader]
    assert len([w for w in record if "staged" in str(w.message)]) == 1
    want = np.stack([whlib.sample(5, i, BIG)[1] for i in range(N)])
    assert np.array_equal(np.concatenate([d.numpy() for d in data])[:N], want)
    st = loader.stats()
    assert st["path"] == "staged" and says in st["staged_why"] and st["host_copy_bytes"] > 0
    assert fake.violations() == []
    # no error of the refused call (or of a query not ready) is left pending
    # for torch's check after its next kernel launch to raise
    assert fake.lib.cudaPeekAtLastError() == 0
    loader.close()


def test_two_loaders_in_one_process_register_once(fake, consumer, shm_cfg):
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    before = fake.counter("registers")
    a = wt.WireheadLoader(config=cfg, batch_size=4, device="cuda", fields=["data"])
    b = wt.WireheadLoader(config=cfg, batch_size=4, device="cuda", fields=["data"], seed=1)
    for x, y in zip(a, b):
        assert x["data"].shape == y["data"].shape == (4, BIG)
    assert fake.counter("registers") == before + 1
    assert a.stats()["registrations"] == b.stats()["registrations"]
    a.close()
    assert fake.lib.fake_registered_bytes() > 0  # b still uses it
    b.close()
    assert fake.lib.fake_registered_bytes() == 0 and fake.violations() == []


def test_device_out_of_memory_names_the_bytes(fake, shm_cfg):
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    fake.lib.fake_set_device_limit(1 << 20)
    try:
        loader = wt.WireheadLoader(config=cfg, batch_size=8, device="cuda", fields=["data"])
        with pytest.raises(wt.CudaError, match=r"cannot allocate a \d+-byte device buffer"):
            next(iter(loader))
        loader.close()
    finally:
        fake.lib.fake_set_device_limit(-1)
    assert fake.violations() == []


# ---- wirehead_torch.DataLoader: DMA straight from the ring's slot files ----

def ring_loader(cfg, workers=2, slots=4, batch=2, **kw):
    ds = wt.WireheadIterableDataset(config=cfg, fields=["id", "data"], shuffle=False,
                                    ring_slots=slots)
    return wt.DataLoader(ds, batch_size=batch, num_workers=workers, **kw)


def ring_counters(batches):
    out = []
    for b in batches:
        for i, d, pad in zip(b["id"].numpy(), b["data"].numpy(), np.asarray(b["is_pad"])):
            if not pad:
                out.append(whlib.check_sample(i, d)[1])
    return sorted(out)


def test_dataloader_batches_copied_straight_from_their_slots(fake, consumer, shm_cfg):
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    fake.lib.fake_set_copy_delay_us(2000)  # the copy engine reads the slot late
    before = fake.counter("registers")
    dl = ring_loader(cfg, workers=2, batch=2, device="cuda:0")
    for epoch in range(2):
        batches = list(dl)
        assert len(batches) == len(dl) and ring_counters(batches) == list(range(N))
        assert all(b["data"].shape == (2, BIG) for b in batches)
        st = dl.device_stats()
        assert st["path"] == "registered" and st["host_copy_bytes"] == 0
        assert st["batches_registered"] == len(batches) and not st["staged_why"]
        if epoch == 0:
            registered = fake.counter("registers") - before
            # each slot file once (2 workers, 4 slots), and the store's mapping
            assert 2 <= registered <= 2 * 4 + 1
    assert fake.counter("registers") - before == registered  # not again in epoch 1
    # the workers left the 256 KiB rows in the store: per batch one copy of
    # the slot's part before them (id), one per row, one of the extras;
    # nothing from pageable memory
    assert fake.counter("registered_copies") == 2 * 4 * len(batches)
    assert fake.counter("pageable_copies") == 0 and fake.counter("host_syncs") == 0
    assert fake.violations() == []
    # the slot files hold the small rows and the extras, not the 256 KiB rows
    sizes = [os.path.getsize(p) for p in glob.glob(
        f"/dev/shm/wirehead-ring.{os.getpid()}.{dl.dataset._batch_ring.token}.w*.s*")]
    assert sizes and max(sizes) < 2 * 4 * BIG
    # to_device of a wt.DataLoader takes the same path, with its own stats
    it = wt.to_device(ring_loader(cfg, workers=1), "cuda")
    assert ring_counters(list(it)) == list(range(N))
    assert it.stats()["path"] == "registered" and it.stats()["host_copy_bytes"] == 0
    del batches, dl
    fake.lib.fake_drain_all()
    import gc
    gc.collect()
    assert fake.lib.fake_registered_bytes() == 0  # every slot unregistered with its stage


def test_dataloader_epoch_left_early_hands_its_ring_to_the_next(fake, consumer, shm_cfg):
    # a loop that breaks out of an epoch (steps per epoch) keeps its iterator
    # alive; the next epoch's iteration ends its workers first, so its own
    # take their ring regions over at once: no 10 s wait, no fallback to the
    # pickled path (said by a marker beside the region), and the epoch after
    # still copies straight from the slots
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    dl = ring_loader(cfg, workers=2, batch=2, device="cuda")
    token = dl.dataset._batch_ring.token
    for _, b in zip(range(2), dl):
        assert b["data"].shape == (2, BIG)
    first = dl._last_to_device
    for epoch in (1, 2):
        batches = list(dl)
        assert ring_counters(batches) == list(range(N))
        st = dl.device_stats()
        assert st["path"] == "registered" and not st["staged_why"], (epoch, st)
        assert not glob.glob(f"/dev/shm/wirehead-ring.{os.getpid()}.{token}.w*.said")
    with pytest.raises(RuntimeError, match="ended by a newer iteration"):
        next(first)
    assert fake.violations() == []


def turned_over(dl, cfg, gens=4, size=BIG):
    """dl's batches as to_device takes them, the store moving on by gens
    generations (of samples of size floats) after the workers read the
    first batch of its first epoch and before its copy: its rows' generation
    is reclaimed."""
    inner, once = dl.device_feed, []

    def device_feed(stage):
        feed = inner(stage)
        batches = feed.batches

        def turning():
            for b in batches():
                if not once:
                    once.append(True)
                    for tag in range(6, 6 + gens):
                        wt.WireheadGenerator((whlib.sample(tag, i, size) for i in range(N)),
                                             config=cfg).run()
                        assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
                yield b

        feed.batches = turning
        return feed

    dl.device_feed = device_feed
    return dl


def test_dataloader_rows_reclaimed_before_their_copy_are_read_again(fake, consumer, shm_cfg):
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    dl = turned_over(ring_loader(cfg, workers=1, batch=2, device="cuda"), cfg)
    batches = list(dl)
    # every row is whole and one sample; the first batch (and any the worker
    # had read ahead) comes from the newest generation, read again here
    assert ring_counters(batches) == list(range(N))
    first = batches[0]
    assert int(first["id"][0][0]) == 9 and int(first["generation"][0]) > 1
    st = dl.device_stats()
    assert st["rereads"] >= 1 and st["host_copy_bytes"] >= st["rereads"] * 2 * 4 * BIG
    assert fake.violations() == []
    # the next epoch's rows come straight from the store again (the
    # DataLoader's stage counts on across epochs)
    assert ring_counters(list(dl)) == list(range(N))
    again = dl.device_stats()
    assert again["rereads"] == st["rereads"] and again["path"] == "registered"
    assert again["host_copy_bytes"] == st["host_copy_bytes"]


def test_dataloader_rows_read_again_in_another_layout_name_the_field(fake, consumer, shm_cfg):
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    dl = turned_over(ring_loader(cfg, workers=1, batch=2, device="cuda"), cfg, size=BIG // 2)
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="field 'data'"):
        list(dl)
    # the workers are gone with the error: none reads on (or makes the store again)
    assert set(multiprocessing.active_children()) <= before
    assert fake.violations() == []


def test_dataloader_in_process_and_handover_check_rows(fake, consumer, shm_cfg):
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    # num_workers=0: the batches filled here leave their rows in the store too
    dl = ring_loader(cfg, workers=0, device="cuda")
    before = fake.counter("registered_copies")
    batches = list(dl)
    assert ring_counters(batches) == list(range(N))
    assert fake.counter("registered_copies") - before == 4 * len(batches)
    assert dl.device_stats()["host_copy_bytes"] == 0
    # HANDOVER_CHECK: rows re-hashes every row at hand-over: all stay in the slot
    rows = dict(cfg, HANDOVER_CHECK="rows")
    dl = ring_loader(rows, workers=1, device="cuda")
    before = fake.counter("registered_copies")
    batches = list(dl)
    assert ring_counters(batches) == list(range(N))
    assert fake.counter("registered_copies") - before == len(batches)  # one copy a batch
    assert dl.device_stats()["path"] == "registered" and fake.violations() == []


@pytest.mark.parametrize("persistent", [False, True])
def test_dataloader_rows_left_in_the_store_are_checked_once_per_generation(fake, consumer,
                                                                           shm_cfg, persistent):
    """A row the workers leave in the store is checked by the first worker
    that reads it from its generation; the main process remembers that
    check (its view finds the stored checksum the worker verified) and
    hashes nothing, and workers it forks later inherit it (docs/gpu.md,
    "wirehead_torch.DataLoader")."""
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    corrupt_big(cfg, 5, 3)  # damaged before the first read: skipped by the worker
    dl = ring_loader(cfg, workers=1, batch=2, device="cuda", persistent_workers=persistent)

    def epoch():
        batches = list(dl)
        return batches, [(i, d) for b in batches for i, d, pad in
                         zip(b["id"].numpy(), b["data"].numpy(), np.asarray(b["is_pad"]))
                         if not pad]

    batches, rows = epoch()
    assert sorted(whlib.check_sample(i, d)[1] for i, d in rows) == [c for c in range(N) if c != 3]
    assert sum(int(np.asarray(b["is_pad"]).sum()) for b in batches) == 1
    corrupt_big(cfg, 5, 7)  # damaged after its check: through, unchecked (the documented trade)
    _, rows = epoch()
    with pytest.raises(AssertionError):
        whlib.check_sample(*[(i, d) for i, d in rows if i[1] == 7][0])
    # a new generation is checked anew
    wt.WireheadGenerator((whlib.sample(6, i, BIG) for i in range(N)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    corrupt_big(cfg, 6, 7)
    _, rows = epoch()
    assert sorted(whlib.check_sample(i, d) for i, d in rows) == [(6, c) for c in range(N)
                                                                  if c != 7]
    assert dl.device_stats()["host_copy_bytes"] == 0 and fake.violations() == []


@pytest.mark.parametrize("change", ["size", "offsets"])
def test_dataloader_handle_whose_layout_does_not_fit_its_slot_is_refused(fake, consumer,
                                                                          shm_cfg, change):
    # the layout a handle names is checked against the slot claimed before
    # any copy is queued from it
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    dl = ring_loader(cfg, workers=1, batch=2, device="cuda")
    inner = dl.device_feed

    def device_feed(stage):
        feed = inner(stage)
        batches = feed.batches

        def tampered():
            for b in batches():
                words = whlib.wire_words(b.wire)
                if change == "size":
                    words[whlib.WIRE_WORDS["size"]] += 64
                else:  # the data field's rows said to start before the id's end
                    words[whlib.WIRE_WORDS["off"] + 1] = 0
                b.wire = whlib.pack_wire(words)
                yield b

        feed.batches = tampered
        return feed

    dl.device_feed = device_feed
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="does not fit its"):
        list(dl)
    assert set(multiprocessing.active_children()) <= before
    assert fake.violations() == []


def test_dataloader_device_iteration_started_before_the_generator(fake, consumer, shm_cfg):
    # the reader first: its workers wait for the first generation, then hand
    # over its rows' positions as usual
    import threading
    cfg = shm_cfg(swap_cap=N, budget="4MiB")
    dl = ring_loader(cfg, workers=2, batch=2, device="cuda")
    before = set(multiprocessing.active_children())
    started = []

    def fill_once_the_workers_run():
        import time
        deadline = time.monotonic() + 30
        while not set(multiprocessing.active_children()) - before:
            assert time.monotonic() < deadline, "the DataLoader's workers never started"
            time.sleep(0.01)
        started.append(True)
        fill_big(cfg)

    filler = threading.Thread(target=fill_once_the_workers_run)
    filler.start()
    batches = list(dl)  # its workers start, and wait for the first generation
    filler.join()
    assert started and ring_counters(batches) == list(range(N))
    st = dl.device_stats()
    assert st["path"] == "registered" and st["host_copy_bytes"] == 0 and st["rereads"] == 0
    assert fake.violations() == []


def test_dataloader_host_iteration_after_a_device_one_gets_whole_batches(fake, consumer,
                                                                         shm_cfg):
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    dl = ring_loader(cfg, workers=2, persistent_workers=True)
    it = wt.to_device(dl, "cuda")
    assert ring_counters(list(it)) == list(range(N))
    assert it.stats()["host_copy_bytes"] == 0 and it.stats()["path"] == "registered"
    # the same workers, now for host tensors: every row in its slot
    batches = list(dl)
    assert all(isinstance(b, dict) and not b["data"].is_cuda for b in batches)
    assert ring_counters(batches) == list(range(N))
    assert fake.violations() == []


class LateConsumer:
    """from_dlpack whose reads of the device bytes queue on its own stream
    and run only when the copies do (the fake holds them): the tensors are
    filled later, and a pending copy keeps its slot meanwhile."""

    def __init__(self, fake):
        self.fake, self.stream, self.caps = fake, fake.new_stream(), []

    def __call__(self, arr):
        import torch
        cap = arr.__dlpack__(stream=self.stream)
        ptr, _, _, _, shape = tensor_of(cap)
        dt = getattr(torch, "uint8" if arr.dtype == "bool" else arr.dtype)
        n = int(np.prod(shape)) * torch.empty((), dtype=dt).element_size()
        op, out = self.fake.read(self.stream, ptr, n)
        self.caps.append((cap, out))
        t = torch.frombuffer(out, dtype=dt).reshape(shape)
        return t.view(torch.bool) if arr.dtype == "bool" else t


def held_epoch(fake, dl, early=False):
    """An epoch of dl through to_device with every copy held; early: give
    each slot back to its worker as soon as its copy is queued (what holding
    the slot prevents). (batches, stats) once the copies ran."""
    from wirehead_torch import _ring
    late = LateConsumer(fake)
    fake.lib.fake_hold_copies(1)
    it = wt.to_device(dl, "cuda", from_dlpack=late)
    batches = []
    for _ in range(len(dl)):  # not to the end: closing the stage waits for the copies
        b = next(it)
        batches.append({k: b[k] for k in ("id", "data")})
        if early:
            for ring in _ring._MAIN.values():
                for j in range(2):
                    ring.give_back(j)
    st = it.stats()
    fake.lib.fake_hold_copies(0)
    fake.lib.fake_drain_all()
    assert next(it, None) is None
    for b in batches:  # N = 10 samples in batches of 2: no padding
        b["is_pad"] = [False] * len(b["id"])
    return batches, st


def test_dataloader_pending_copy_holds_its_rows_generation(fake, consumer, shm_cfg):
    # the main process's views of a batch's rows pin their generation until
    # the copy ran: four newer generations sealed meanwhile reuse every
    # other area, and the bytes copied late are still the rows the worker read
    cfg = fill_big(shm_cfg(swap_cap=4, budget="2MiB"), n=4)
    late = LateConsumer(fake)
    fake.lib.fake_hold_copies(1)
    dl = ring_loader(cfg, workers=1, slots=4, batch=2)
    it = wt.to_device(dl, "cuda", from_dlpack=late)
    b = next(it)
    first = {k: b[k] for k in ("id", "data")}
    first["is_pad"] = [False, False]
    for tag in (6, 7, 8, 9):
        fill_big(cfg, n=4, tag=tag)
    fake.lib.fake_hold_copies(0)
    fake.lib.fake_drain_all()
    assert [whlib.check_sample(i, d) for i, d in zip(first["id"].numpy(),
                                                      first["data"].numpy())] == [(5, 0), (5, 1)]
    assert it.stats()["rereads"] == 0 and it.stats()["host_copy_bytes"] == 0
    assert fake.violations() == []
    it.close()


def test_dataloader_slot_held_until_its_copy_completed(fake, consumer, shm_cfg, caplog):
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    # given back early, the worker refills a slot under its pending copy:
    # the fake sees the bytes change before the copy ran
    batches, _ = held_epoch(fake, ring_loader(cfg, workers=1, slots=2), early=True)
    assert any("changed before the copy ran" in v for v in fake.violations())
    fake.lib.fake_reset()
    # held: the worker finds both slots taken and sends the rest of the
    # epoch outside the ring (staged) until the copies complete
    with caplog.at_level("WARNING", logger="wirehead_torch"):
        batches, st = held_epoch(fake, ring_loader(cfg, workers=1, slots=2))
    assert ring_counters(batches) == list(range(N))
    assert st["batches_registered"] == 2 and st["batches_staged"] == len(batches) - 2
    assert st["path"] == "staged" and not st["staged_why"]  # no slot free, not refused
    assert fake.violations() == []
    # the copies completed: the slots went back, the next epoch uses them again
    dl = ring_loader(cfg, workers=1, slots=2, device="cuda")
    got = [b["data"] for b in dl]
    assert len(got) == 5 and dl.device_stats()["path"] == "registered"


def test_dataloader_slot_registered_again_after_it_grows(fake, consumer, shm_cfg, monkeypatch):
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    monkeypatch.setenv("WIREHEAD_GPU_DIRECT_MIN_ROW", str(4 * BIG + 1))  # whole batches in slots
    dl = ring_loader(cfg, workers=0, slots=1, batch=1, device="cuda")
    before = (fake.counter("registers"), fake.counter("unregisters"))
    assert ring_counters(list(dl)) == list(range(N))
    assert fake.counter("registers") == before[0] + 1  # one slot, one file
    dl.dataset.batch_size = 3  # larger batches: the slot grows to a new file
    dl._batch = 3
    got = list(dl)
    assert ring_counters(got) == list(range(N))
    assert fake.counter("registers") == before[0] + 2
    assert fake.counter("unregisters") == before[1] + 1  # the old file's, once unused
    assert dl.device_stats()["path"] == "registered" and fake.violations() == []


@pytest.mark.parametrize("env, says", [("FAKECUDA_REGISTER_LIMIT", "RLIMIT_MEMLOCK"),
                                       ("FAKECUDA_NO_REGISTER", "not supported")])
def test_dataloader_refused_registration_falls_back_once(fake, consumer, shm_cfg, monkeypatch,
                                                         env, says):
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    monkeypatch.setenv(env, "1")
    dl = ring_loader(cfg, workers=2, device="cuda")
    with pytest.warns(RuntimeWarning, match=says) as record:
        for _ in range(2):
            batches = list(dl)
    assert len([w for w in record if "staged" in str(w.message)]) == 1
    assert ring_counters(batches) == list(range(N))
    st = dl.device_stats()
    assert st["path"] == "staged" and says in st["staged_why"]
    assert st["host_copy_bytes"] >= N * 4 * BIG
    assert fake.violations() == []


# ---- a file cut between a copy's check and the copy ----

CUT_PROC = os.path.join(os.path.dirname(HERE), "helpers", "cut_copy_proc.py")
REFUSED = {"FAKECUDA_REGISTER_LIMIT": "1"}


@pytest.mark.parametrize("kind, site, env, says", [
    # a loader thread copies a small row out of its checked store view
    ("loader", "view-copy", {}, "was truncated"),
    # the same, the file cut inside the row's page: zeros in place, no fault
    ("loader", "view-copy:inside", {}, "was truncated"),
    # registration refused: the rows gathered into page-locked memory
    ("loader", "gather", REFUSED, "was truncated"),
    # the main process gathers the rows its worker left in the store
    ("dataloader", "gather", REFUSED, "was truncated"),
    # whole batches in the slots: a slot file copied into page-locked memory
    ("dataloader", "slot-copy", {**REFUSED, "WIREHEAD_GPU_DIRECT_MIN_ROW": "off"},
     "was truncated"),
    # to_device of store views
    ("to-device", "stage-copy", {}, "was truncated while it was copied"),
])
def test_a_file_cut_under_a_copy_is_an_error_not_a_batch(fake_lib, shm_cfg, kind, site, env,
                                                        says):
    """The guard turns the pages of a cut file into zeros, so a check
    before a copy is not enough: the file cut right after it (the fault
    point), each copy out of a store or ring file is checked again before
    its bytes go on, and the loop gets an error, never a row of zeros."""
    import json
    cfg = fill_big(shm_cfg(swap_cap=N, budget="4MiB"))
    e = whlib.env_for_child({"WIREHEAD_CUDA_LIB": fake_lib.path, "WIREHEAD_FAULT_CUT": site,
                             **env})
    r = subprocess.run([sys.executable, CUT_PROC, kind, json.dumps(cfg)], env=e,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"wirehead: fault cut at {site.split(':')[0]}: /dev/shm/" in r.stderr, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["error"] and says in out["error"][1], (out, r.stderr[-3000:])


def test_stats_while_another_thread_closes(fake, consumer, shm_cfg):
    """info() reads the GPU stage's figures under the loader's lock: a close
    in another thread (which frees the stage) either waits for it or makes
    it say the handle was closed, never a read of freed memory (the
    sanitizer lane runs this too)."""
    import threading
    cfg = fill(shm_cfg(swap_cap=N))
    loader = wt.WireheadLoader(config=cfg, batch_size=2, device="cuda", shuffle=False)
    for _ in range(20):
        next(iter(loader))
        ld = loader._loader()  # the C handle: the Python object would open a new one
        got, errors = [], []

        def poll(ld=ld, got=got, errors=errors):
            while True:
                try:
                    got.append(ld.info()["copies"])
                except ValueError as e:
                    errors.append(str(e))
                    return

        t = threading.Thread(target=poll)
        t.start()
        while not got and t.is_alive():  # the poller runs info() before the close
            t.join(0.001)
        loader.close()
        t.join(10)
        assert not t.is_alive() and got and min(got) >= 1
        assert len(errors) == 1 and "closed" in errors[0], errors


def test_spec_mode_on_the_device_path_delivers_the_host_paths_batches(fake, consumer, shm_cfg):
    # spec mode (docs/reproducible.md) through wt.DataLoader(device=): the
    # rows copied straight from the store and the slots give the host path's
    # batches, spec_index and generation columns included
    import threading
    cfg = shm_cfg(swap_cap=N, budget="8MiB", RUN_SEED=3)
    g = wt.WireheadGenerator(lambda spec: whlib.sample(5, spec.index, BIG), config=cfg,
                             quiet=True)
    t = threading.Thread(target=g.run, daemon=True)
    t.start()

    def epochs(**kw):
        ds = wt.WireheadIterableDataset(config=cfg, fields=["id", "data"], seed=2)
        dl = wt.DataLoader(ds, batch_size=2, num_workers=2, **kw)
        out = []
        for e in range(2):
            dl.set_epoch(e)
            out.append([(b["spec_index"].numpy().tolist(), b["generation"].numpy().tolist(),
                         b["id"].numpy().copy(), b["data"].numpy().copy()) for b in dl])
        return out, dl
    try:
        host, _ = epochs()
        dev, dl = epochs(device="cuda")
        assert dl.device_stats()["path"] == "registered", dl.device_stats()
        ld = wt.WireheadLoader(config=cfg, fields=["id", "data"], batch_size=2, seed=2,
                               device="cuda")
        try:  # the C loader's threads on the device: the same samples in the same order
            for e in range(2):
                ld.set_epoch(e)
                got = [(b["spec_index"].cpu().numpy().tolist(), b["data"].cpu().numpy().copy())
                       for b in ld]
                assert [k for k, _ in got] == [k for k, *_ in host[e]]
                assert all(np.array_equal(d, h[3]) for (_, d), h in zip(got, host[e]))
        finally:
            ld.close()
    finally:
        g.stop()
        t.join(60)
        g.close()
    for e, (he, de) in enumerate(zip(host, dev)):
        assert sorted(k for ks, *_ in he for k in ks) == list(range(e * N, (e + 1) * N))
        for (hk, hg, hi, hd), (dk, dg, di, dd) in zip(he, de):
            assert (hk, hg) == (dk, dg) and hg == [e] * len(hg)
            assert np.array_equal(hi, di) and np.array_equal(hd, dd)
            for k, i, d in zip(dk, di, dd):  # each row is fn(spec) of its index
                assert whlib.check_sample(i, d) == (5, k)
    assert fake.violations() == []
