"""Test helpers: unique stores, child processes, the verifiable test sample.

The test sample has two fields: 'id' (int64 [2]: producer tag, counter) and
'data' (float32 [n], data[k] = tag * 1000 + counter + k / n), so a reader can
check every sample it gets against its id."""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
REPO = os.path.dirname(TESTS)
PROCS = os.path.join(HERE, "procs.py")


def free_port():
    """A loopback TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unique_name(prefix="whtest"):
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def sample(tag, counter, n=256):
    ident = np.array([tag, counter], dtype=np.int64)
    data = (np.float32(tag * 1000 + counter) + np.arange(n, dtype=np.float32) / np.float32(n))
    return ident, data


def xxh3(data):
    """XXH3-64 of bytes, as the sample format checksums them (to forge
    headers whose checksum still holds)."""
    import ctypes
    lib = ctypes.CDLL("libxxhash.so.0")
    lib.XXH3_64bits.restype = ctypes.c_uint64
    lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lib.XXH3_64bits(data, len(data))


# A ring batch's layout as its handle carries it (SlotHandle.wire): native
# uint64 words in the order ext/read/wh_batch.h gives ("a batch's layout as
# it crosses processes"); what the tests that forge or measure one read.
WIRE_WORDS = {"n": 1, "nfields": 2, "want": 3, "direct": 4, "size": 5, "hsize": 6, "off": 11}


def wire_words(wire):
    """The layout's words, a list (to read, or change and pack_wire)."""
    import struct
    return list(struct.unpack(f"{len(wire) // 8}Q", wire))


def pack_wire(words):
    import struct
    return struct.pack(f"{len(words)}Q", *words)


def check_sample(ident, data):
    """Raises AssertionError unless data matches its id."""
    ident = np.asarray(ident)
    data = np.asarray(data)
    tag, counter = int(ident[0]), int(ident[1])
    n = data.shape[0]
    want = np.float32(tag * 1000 + counter) + np.arange(n, dtype=np.float32) / np.float32(n)
    assert np.array_equal(data, want), f"sample {tag}/{counter}: data does not match its id"
    return tag, counter


def env_for_child(extra=None):
    env = dict(os.environ)
    # children import the package the tests run against: the source tree's
    # under an editable install, site-packages' under a real one
    import wirehead_torch
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(wirehead_torch.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, HERE, env.get("PYTHONPATH")) if p)
    env.pop("WIREHEAD_FAULT_PUT_PAUSE", None)
    env.update(extra or {})
    return env


def spawn(kind, cfg, *args, env=None, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL):
    """Starts tests/helpers/procs.py KIND CFG_JSON ARGS... as a child process. Its
    pipes are drained from the start (wait_line reads what was drained), so
    a child never blocks on a full pipe that the test stopped reading."""
    proc = subprocess.Popen([sys.executable, PROCS, kind, json.dumps(cfg), *map(str, args)],
                            env=env_for_child(env), stdout=stdout, stderr=stderr, text=True)
    for s in (proc.stdout, proc.stderr):
        if s is not None:
            _drain(s)
    return proc


def spawn_script(args, cwd, env=None, stdout=subprocess.PIPE, stderr=subprocess.PIPE):
    """Starts `python ARGS...` (a script file, or -m MODULE) in cwd with
    drained pipes, like spawn."""
    proc = subprocess.Popen([sys.executable, *map(str, args)], cwd=cwd, env=env_for_child(env),
                            stdout=stdout, stderr=stderr, text=True)
    for s in (proc.stdout, proc.stderr):
        if s is not None:
            _drain(s)
    return proc


def drained(stream, timeout=60):
    """Every line of a finished child's drained pipe (waits for its end)."""
    d = _drain(stream)
    d.thread.join(timeout)
    with d.cond:
        return list(d.lines)


class _Drain:
    """Reads one pipe to its end on a thread; lines wait for wait_line."""

    def __init__(self, stream):
        self.stream = stream
        self.lines = []
        self.taken = 0
        self.eof = False
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        fd, buf = self.stream.fileno(), ""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk.decode(errors="replace")
            *done, buf = buf.split("\n")
            if done:
                with self.cond:
                    self.lines += [line + "\n" for line in done]
                    self.cond.notify_all()
        with self.cond:
            if buf:
                self.lines.append(buf)
            self.eof = True
            self.cond.notify_all()


_drains = {}  # id(stream) -> _Drain


def _drain(stream):
    d = _drains.get(id(stream))
    if d is None or d.stream is not stream:
        d = _drains[id(stream)] = _Drain(stream)
    return d


def wait_line(stream, text, timeout):
    """Waits for a line of a child's pipe containing text; returns the lines
    read since the last call, that one included. Raises TimeoutError after
    timeout seconds, EOFError if the pipe closes first."""
    d = _drain(stream)
    deadline = time.monotonic() + timeout
    with d.cond:
        while True:
            for i in range(d.taken, len(d.lines)):
                if text in d.lines[i]:
                    got, d.taken = d.lines[d.taken:i + 1], i + 1
                    return got
            seen = d.lines[d.taken:][-5:]
            if d.eof:
                raise EOFError(f"stream closed before {text!r}; got {seen}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line with {text!r} within {timeout}s; got {seen}")
            d.cond.wait(left)


def stop(proc, sig=signal.SIGTERM, timeout=20):
    """Ends a child we started, by pid; returns its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for s in (proc.stdout, proc.stderr):
        if s and not s.closed:
            d = _drains.pop(id(s), None)
            if d is not None:
                d.thread.join(10)  # to EOF: the fd must not be closed under the reader
            s.close()
    return proc.returncode


def tail(stream, n=8):
    """The last n lines drained from a child's pipe so far."""
    if stream is None:
        return ""
    d = _drain(stream)
    with d.cond:
        return "".join(d.lines[-n:])


def assert_alive(procs, when):
    """Fails naming each child that ended, its exit code and last stderr lines."""
    dead = []
    for p in procs:
        if p.poll() is not None:
            if p.stderr is not None:
                _drain(p.stderr).thread.join(5)  # to its end: the last words
            dead.append(f"{' '.join(map(str, p.args[2:3]))} pid {p.pid} exit {p.returncode}: "
                        f"{tail(p.stderr)}")
    assert not dead, f"a process died {when}:\n" + "\n".join(dead)


def wait_ranks(procs, logs, name, timeout):
    """Waits up to timeout seconds for the rank processes procs (rank r's
    output in logs[r], an open file), kills those still running, and
    asserts that none hung and every one exited 0, with each rank's log
    tail in the message."""
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        pass
    finally:
        hung = [r for r, p in enumerate(procs) if p.poll() is None]
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for log in logs:
            log.close()
    tails = {}
    for r, log in enumerate(logs):
        with open(log.name) as f:
            tails[r] = f.read()[-3000:]
    assert not hung, f"{name}: ranks {hung} still running after {timeout}s: {tails}"
    bad = {r: p.returncode for r, p in enumerate(procs) if p.returncode != 0}
    assert not bad, f"{name}: ranks exited with {bad}: {tails}"


def until(cond, timeout, what):
    """Polls cond() (a real condition) until true; bounded."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


@contextlib.contextmanager
def header_lock_held(cfg):
    """While inside: the shm store's header lock word names this live
    process, as if a process holding it were stopped (SIGSTOP); let go on
    exit."""
    from wirehead_torch import _C
    lay = _C.shm_layout()
    seg = _C.SharedMap(f"/dev/shm/wirehead.{cfg['STORE'][len('shm://'):]}", lay["slots"])
    w, me = lay["hdr_lock"] // 8, os.getpid()

    def take():  # the owner is the word's low half; its high half counts waiters
        cur = seg.load(w)
        return (cur & 0xffffffff) == 0 and seg.cas(w, cur, cur | me)

    until(take, 30, "the header lock")
    try:
        yield me
    finally:
        seg.store(w, seg.load(w) & ~0xffffffff)


def open_store(cfg):
    """A raw store handle (wirehead_torch._C.Store) for a test config."""
    from wirehead_torch import _C
    from wirehead_torch._store_args import store_kwargs
    from wirehead_torch.config import resolve
    return _C.Store(**store_kwargs(resolve(cfg)))


def read_generation(store, gen, swap_cap):
    """All samples of gen as (tag, counter), each checked against its id;
    None if the generation was reclaimed meanwhile."""
    import wirehead_torch as wt
    seen = []
    for pos in range(swap_cap):
        try:
            ident, data = store.read(gen, pos)
        except wt.GenerationGoneError:
            return None
        seen.append(check_sample(np.from_dlpack(ident), np.from_dlpack(data)))
    return seen


def corrupt_shm_sample(cfg, tag, counter):
    """Flips one data bit of sample(tag, counter) inside cfg's shm segment."""
    flip_bit_after(cfg, sample(tag, counter)[1].tobytes()[:64])


def flip_bit_after(cfg, needle):
    """Flips one bit 8 bytes into the first place needle stands in cfg's
    shm segment (a sample's data: its checksum no longer holds)."""
    path = f"/dev/shm/wirehead.{cfg['STORE'][len('shm://'):]}"
    with open(path, "r+b") as f:
        blob = f.read()
        at = blob.find(needle)
        assert at > 0, "sample not found in the segment"
        f.seek(at + 8)
        f.write(bytes([blob[at + 8] ^ 0x01]))
