"""Test helpers: unique stores, child processes, the verifiable test sample.

The test sample has two fields: 'id' (int64 [2]: producer tag, counter) and
'data' (float32 [n], data[k] = tag * 1000 + counter + k / n), so a reader can
check every sample it gets against its id."""
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import uuid

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PROCS = os.path.join(HERE, "procs.py")


def unique_name(prefix="whtest"):
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def sample(tag, counter, n=256):
    ident = np.array([tag, counter], dtype=np.int64)
    data = (np.float32(tag * 1000 + counter) + np.arange(n, dtype=np.float32) / np.float32(n))
    return ident, data


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
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("WIREHEAD_FAULT_PUT_PAUSE", None)
    env.update(extra or {})
    return env


def spawn(kind, cfg, *args, env=None, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL):
    """Starts tests/procs.py KIND CFG_JSON ARGS... as a child process."""
    return subprocess.Popen([sys.executable, PROCS, kind, json.dumps(cfg), *map(str, args)],
                            env=env_for_child(env), stdout=stdout, stderr=stderr, text=True)


_pending = {}  # fd -> text read past the last line returned


def wait_line(stream, text, timeout):
    """Reads stream until a line containing text; returns all lines read.
    Raises TimeoutError after timeout seconds.

    Reads the pipe with os.read, not readline: a buffered readline can pull
    the next line into Python's buffer, where select() cannot see it."""
    fd = stream.fileno()
    buf = _pending.pop(fd, "")
    deadline = time.monotonic() + timeout
    lines = []
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        while True:
            while "\n" in buf:
                line, buf = buf.split("\n", 1)
                lines.append(line + "\n")
                if text in line:
                    _pending[fd] = buf
                    return lines
            left = deadline - time.monotonic()
            if left <= 0:
                _pending[fd] = buf
                raise TimeoutError(f"no line with {text!r} within {timeout}s; got {lines[-5:]}")
            if sel.select(left):
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise EOFError(f"stream closed before {text!r}; got {lines[-5:]}")
                buf += chunk.decode(errors="replace")
    finally:
        sel.close()


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
            _pending.pop(s.fileno(), None)  # the fd number will be reused
            s.close()
    return proc.returncode


def until(cond, timeout, what):
    """Polls cond() (a real condition) until true; bounded."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def open_store(cfg):
    """A raw store handle (wirehead_torch._C.Store) for a test config."""
    from wirehead_torch import _C
    from wirehead_torch.config import resolve, store_kwargs
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
    path = f"/dev/shm/wirehead.{cfg['STORE'][len('shm://'):]}"
    needle = sample(tag, counter)[1].tobytes()[:64]
    with open(path, "r+b") as f:
        blob = f.read()
        at = blob.find(needle)
        assert at > 0, "sample not found in the segment"
        f.seek(at + 8)
        f.write(bytes([blob[at + 8] ^ 0x01]))
