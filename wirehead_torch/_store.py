"""Per-process store handles: a handle never crosses a fork."""
import os
import signal
import threading
import time

from . import _C
from .config import store_kwargs


class ProcessStore:
    """Opens the store lazily, once per process (DataLoader workers and
    forked children get their own handle)."""

    def __init__(self, cfg, create=True):
        self.cfg = cfg
        self.create = create
        self._st = None
        self._pid = None

    def get(self):
        if self._st is None or self._pid != os.getpid():
            self._st = _C.Store(**store_kwargs(self.cfg, self.create))
            self._pid = os.getpid()
        return self._st

    def close(self):
        if self._st is not None and self._pid == os.getpid():
            self._st.close()
        self._st = None

    def __getstate__(self):
        return {"cfg": self.cfg, "create": self.create, "_st": None, "_pid": None}


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
