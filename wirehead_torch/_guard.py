"""Keeps the SIGBUS guard of shared mappings (docs/design.md, "Shared
mappings can shrink") in front of the handlers Python code installs after
it. The guard goes in front at every store call; between two, a handler
installed by faulthandler.enable (pytest, torch's elastic agent, -X
faulthandler at start) or signal.signal would otherwise take a store cut
under a held view, and the process would die of it. So those calls are
wrapped: the guard goes back in front right after each, chaining to the
handler just installed. faulthandler's enable and register save the
handler in front to chain to: the guard steps aside for their call, so
that they chain past it, not back into it."""
import faulthandler
import functools
import signal

from . import _C

_MARK = "__wirehead_guard__"


def _wrap(fn, aside):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if aside:
            _C.guard_step_aside()
        try:
            return fn(*args, **kwargs)
        finally:
            _C.guard_restore()
    setattr(call, _MARK, True)
    return call


def keep_in_front():
    """Wraps the calls above (once per process; a no-op until the guard
    was installed, at the first mapping of a store, ring or params file)."""
    for mod, name, aside in ((faulthandler, "enable", True), (faulthandler, "register", True),
                             (faulthandler, "disable", False),
                             (faulthandler, "unregister", False), (signal, "signal", False)):
        fn = getattr(mod, name, None)
        if fn is not None and not getattr(fn, _MARK, False):
            setattr(mod, name, _wrap(fn, aside))
