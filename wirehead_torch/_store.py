"""Per-process store handles: a handle never crosses a fork."""
import logging
import os
import signal
import threading
import time

from . import _C
from .config import redact, secrets_hidden, store_kwargs

log = logging.getLogger("wirehead_torch")


# An automatic BYTE_BUDGET: per sample, its bytes plus room for the sample
# and field headers; the whole area gets a quarter more for samples that vary
# a little in size, and a MiB so tiny samples still fit.
_AUTO_PER_FIELD = 256
_AUTO_SLACK = 1.25
_AUTO_MIN = 1 << 20


def auto_budget(arrays, swap_cap):
    """Bytes for one generation area sized from one sample's arrays."""
    sample = 64 + sum(memoryview(buf).nbytes + _AUTO_PER_FIELD for buf, _code in arrays)
    n = int(swap_cap * sample * _AUTO_SLACK) + _AUTO_MIN
    return (n + 4095) & ~4095


def shm_path(cfg):
    """The /dev/shm file of an shm:// store (None for MongoDB)."""
    uri = cfg["STORE"]
    return f"/dev/shm/wirehead.{uri[len('shm://'):]}" if uri.startswith("shm://") else None


def _identity(path):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


class ProcessStore:
    """Opens the store lazily, once per process (DataLoader workers and
    forked children get their own handle).

    With ``BYTE_BUDGET: auto`` an shm store is created by the first
    generator's first put (``get(sample)``), sized from that sample; other
    participants wait for it to exist. Every CHECK_EVERY seconds ``get``
    compares the shm file with the one it opened, so a store removed or
    re-created (``wirehead-torch clean``) is re-attached instead of
    orphaning this process; ``reattached`` counts those."""

    CHECK_EVERY = 1.0

    def __init__(self, cfg, create=True):
        self.cfg = cfg
        self.create = create
        self._st = None
        self._pid = None
        self._ident = None
        self._checked = 0.0
        self.reattached = 0

    def auto_sized(self):
        """True for an shm store created by the first put (BYTE_BUDGET auto)."""
        return self.cfg["BYTE_BUDGET"] is None and shm_path(self.cfg) is not None

    def _open(self, sample, timeout, stop):
        # a C error may quote the URI or one of its option values
        with secrets_hidden(self.cfg["STORE"]):
            return self._open_store(sample, timeout, stop)

    def _open_store(self, sample, timeout, stop):
        path = shm_path(self.cfg)
        if not self.auto_sized() or not self.create:
            st = _C.Store(**store_kwargs(self.cfg, self.create))
        elif sample is not None:
            st = None
            for _ in range(5):
                try:  # an existing store is used as it is, whatever its budget
                    st = _C.Store(**store_kwargs(self.cfg, False))
                    break
                except _C.NotFoundError:
                    pass
                budget = auto_budget(sample, self.cfg["SWAP_CAP"])
                try:
                    st = _C.Store(**store_kwargs(self.cfg, True, byte_budget=budget))
                    break
                except _C.StoreSpaceError as e:
                    raise _C.StoreSpaceError(
                        f"{e} [BYTE_BUDGET auto: {budget} bytes per generation, sized from the "
                        f"first sample for SWAP_CAP={self.cfg['SWAP_CAP']}]") from None
                except _C.SchemaMismatchError as e:
                    if "BYTE_BUDGET" not in str(e):
                        raise  # another generator created it meanwhile otherwise: open that
            if st is None:
                raise _C.StoreUnavailableError(f"shm store {redact(self.cfg['STORE'])}: could not "
                                               f"create or open it")
        else:
            st = self._wait_created(timeout, stop)
        self._ident = _identity(path) if path else None
        self._checked = time.monotonic()
        return st

    def _wait_created(self, timeout, stop):
        """Opens an auto-sized shm store once a generator has created it."""
        if timeout is None:
            timeout = float(self.cfg["READ_TIMEOUT"])
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            try:
                return _C.Store(**store_kwargs(self.cfg, False))
            except _C.NotFoundError:
                if time.monotonic() >= deadline or (stop is not None and stop):
                    raise TimeoutError(
                        f"shm store {redact(self.cfg['STORE'])} does not exist after {timeout:g}s: "
                        f"with BYTE_BUDGET auto the first generator's first sample creates "
                        f"it; start a generator (WireheadGenerator) or set BYTE_BUDGET") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def changed(self):
        """True if the shm file this handle opened was removed or replaced."""
        path = shm_path(self.cfg)
        return bool(path) and self._st is not None and _identity(path) != self._ident

    def get(self, sample=None, timeout=None, stop=None):
        """The handle; sample (store arrays) sizes an auto store; timeout
        bounds the wait for one that does not exist yet."""
        if self._st is None or self._pid != os.getpid():
            self._st = self._open(sample, timeout, stop)
            self._pid = os.getpid()
        elif time.monotonic() - self._checked >= self.CHECK_EVERY:
            self._checked = time.monotonic()
            if self.changed():
                log.warning("wirehead: store %s was removed or re-created; re-attaching",
                            redact(self.cfg["STORE"]))
                self.close()
                self.reattached += 1
                self._st = self._open(sample, timeout, stop)
                self._pid = os.getpid()
        return self._st

    def close(self):
        if self._st is not None and self._pid == os.getpid():
            self._st.close()
        self._st = None

    def __getstate__(self):
        return {"cfg": self.cfg, "create": self.create, "_st": None, "_pid": None,
                "_ident": None, "_checked": 0.0, "reattached": 0}


class StopFlag:
    """SIGTERM/SIGINT (or stop()) set a flag so the current step finishes
    cleanly; a second signal gets the signal's previous handler (so a
    second Ctrl-C interrupts a stuck step).

    The handler only sets a flag: taking a lock there (as Event.set does)
    can deadlock against the interrupted main thread. Handlers are
    installed only from the main thread and restored on exit."""

    _SLICE = 0.05

    def __init__(self):
        self.stopped = False
        self.signum = None
        self._old = {}

    def _handler(self, signum, frame):
        self.stopped = True
        self.signum = signum
        old = self._old.pop(signum, None)
        if old is not None:
            signal.signal(signum, old)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()
        return False

    def set(self):
        self.stopped = True

    def __bool__(self):
        return self.stopped

    def wait(self, seconds):
        """Sleeps up to seconds, returning early (True) once stopped."""
        deadline = time.monotonic() + seconds
        while not self.stopped:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, self._SLICE))
        return True
