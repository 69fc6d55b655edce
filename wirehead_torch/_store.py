"""Per-process store handles: a handle never crosses a fork."""
import os
import signal
import threading

from . import _C
from .config import store_kwargs


class ProcessStore:
    """Opens the store lazily, once per process (DataLoader workers and
    forked children get their own handle)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self._st = None
        self._pid = None

    def get(self):
        if self._st is None or self._pid != os.getpid():
            self._st = _C.Store(**store_kwargs(self.cfg))
            self._pid = os.getpid()
        return self._st

    def close(self):
        if self._st is not None and self._pid == os.getpid():
            self._st.close()
        self._st = None

    def __getstate__(self):
        return {"cfg": self.cfg, "_st": None, "_pid": None}


class StopFlag:
    """SIGTERM/SIGINT set a flag so the current step finishes cleanly.

    Handlers are installed only from the main thread and restored on exit."""

    def __init__(self):
        self.event = threading.Event()
        self.signum = None
        self._old = {}

    def _handler(self, signum, frame):
        self.signum = signum
        self.event.set()

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

    def __bool__(self):
        return self.event.is_set()

    def wait(self, seconds):
        return self.event.wait(seconds)
