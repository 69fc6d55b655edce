"""Per-process store handles: a handle never crosses a fork."""
import logging
import os
import signal
import threading
import time

from . import _C, _uri
from ._redact import redact, secrets_hidden
from ._store_args import store_kwargs

log = logging.getLogger("wirehead_torch")


def gen_label(gen, st):
    """A generation id as people see it everywhere (status, logs, errors):
    "#N", the N-th generation of the store whose status st is (ids count up
    by one per seal from the store's first, write_gen - seals), or the id's
    last 6 digits where it lies outside that range. Full ids stay in JSON
    output, batches and shard names."""
    first = st["write_gen"] - st["seals"] if st else 0
    if st and first <= gen <= st["write_gen"]:
        return f"#{gen - first + 1}"
    return f"...{gen % 10 ** 6:06d}"


class GenLabels:
    """gen_label for the generations one ProcessStore handle meets: reads
    the store's status again only for an id outside what it last saw (a
    new seal, a store re-created under the name), so a label costs no
    round trip in the steady state."""

    def __init__(self, handle):
        self._handle = handle
        self._st = None

    @property
    def seen(self):
        """The figures labels are made from ({write_gen, seals}), for
        gen_label elsewhere; None before the first label."""
        return self._st

    def __call__(self, gen):
        st = self._st
        if not st or not st["write_gen"] - st["seals"] <= gen <= st["write_gen"]:
            try:
                s = self._handle.get().status()
                self._st = st = {"write_gen": s["write_gen"], "seals": s["seals"]}
            except _C.WireheadError:
                pass  # the store is away: the id's last digits
        return gen_label(gen, st)


class PerProcess:
    """A handle of the process that opened it, the one fork guard of the
    Python side: a forked child (or an unpickled copy) sees none and opens
    its own, and only the opener closes it (shared locks, sockets)."""

    __slots__ = ("obj", "pid")

    def __init__(self):
        self.obj = None
        self.pid = None

    def get(self):
        """The handle, or None where this process has not opened one."""
        return self.obj if self.obj is not None and self.pid == os.getpid() else None

    def keep(self, obj):
        self.obj, self.pid = obj, os.getpid()
        return obj

    def drop(self):
        """Forgets the handle; returns it where this process opened it (to
        close), else None."""
        obj = self.get()
        self.obj = self.pid = None
        return obj

    def __reduce__(self):
        return PerProcess, ()  # a handle never crosses a pickle


class ProcessStore:
    """Opens the store lazily, once per process (DataLoader workers and
    forked children get their own handle).

    The C store owns the opening rules, so every participant follows them:
    with ``BYTE_BUDGET: auto`` only a generator's put creates an shm store
    (sized from its sample); until then the others see no generation. A
    handle follows a store removed or re-created under its name
    (``wirehead-torch clean``) by itself."""

    def __init__(self, cfg, create=True, local=False, min_params=0, who="wirehead"):
        self.cfg = cfg
        self.who = who  # the prefix of the process's lines, for the line said here
        self.create = create
        self.local = local  # a reader's: the node-local copy under LOCAL_CACHE
        # readers: generations made entirely under params >= this only
        self.min_params = min_params
        self._h = PerProcess()
        self._noted = False

    def opened(self):
        """This process's handle where it has opened one, else None (opens
        nothing)."""
        return self._h.get()

    def note_created(self, say=None):
        """Says, once, what an shm store this process created reserves in
        /dev/shm (say: print it there too); nothing for a store made by
        another process or one that keeps no files there (MongoDB)."""
        if self._noted or self.opened() is None or _uri.shm_files(self.cfg["STORE"]) is None:
            return
        try:
            st = self.opened().status()
        except _C.WireheadError:  # not created yet (auto): the first put will
            return
        self._noted = True
        if st.get("creator_pid") != os.getpid() or not st.get("store_bytes"):
            return
        auto = self.cfg["BYTE_BUDGET"] is None
        how = "auto, sized from the first sample" if auto else "BYTE_BUDGET"
        text = (f"created shm store {redact(self.cfg['STORE'])}: {len(st['areas'])} "
                f"generation areas of {st['byte_budget'] / 2**20:.1f} MiB ({how}) = "
                f"{st['store_bytes'] / 2**20:.1f} MiB of /dev/shm")
        if say is not None:  # said once: on stdout, or in the log
            say(text)
        else:
            log.info("%s: %s", self.who, text)

    def get(self):
        """This process's handle."""
        st = self._h.get()
        if st is None:
            with secrets_hidden(self.cfg["STORE"]):  # a C error may quote the URI
                kw = store_kwargs(self.cfg, self.create, self.local)
                if self.min_params:
                    kw["min_params"] = self.min_params
                st = self._h.keep(_C.Store(**kw))
            self._noted = False
            if self.cfg["BYTE_BUDGET"] is not None:
                self.note_created()
        return st

    def close(self):
        st = self._h.drop()
        if st is not None:
            st.close()

    def __getstate__(self):
        return {"cfg": self.cfg, "create": self.create, "local": self.local,
                "min_params": self.min_params, "_h": PerProcess(), "_noted": False,
                "who": self.who}


def check_min_params(value):
    """A reader's min_params_version= as the store takes it (0: none)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"min_params_version must be a non-negative integer (a version "
                         f"set_params returned), got {value!r}")
    return value


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
