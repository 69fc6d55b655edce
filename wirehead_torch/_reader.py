"""What every Python reader shares, torch-free: the one wait for a sealed
generation (the datasets, the loader, export, the demo go through it),
refresh='step', and a sample read or viewed through the store's one C
read policy."""
import logging
import numbers
import os
import time

from . import _C, _uri
from ._order import warn_skipped
from ._redact import redact
from ._spec_read import SpecWait, spec_generation
from ._store import gen_label
from ._store_args import database, store_kwargs

log = logging.getLogger("wirehead_torch")

# How often a reader waiting for a generation says what it waits for, after
# its first note (a job waiting two minutes for its generators says it five
# times, not twenty-four).
WAIT_NOTE_EVERY = 30.0
# A reader's timeout=: below 10^6 s, as READ_TIMEOUT in a config.
MAX_TIMEOUT = 1e6
# How often a reader of the node-local copy looks whether its relay lives
# (and says so when it does not).
RELAY_CHECK_EVERY = 60.0
_relay_checked = {}  # LOCAL_CACHE URI -> when this process last looked
# The store's own wait runs in slices this long while a stop flag or a
# check is to be looked at between them.
_STOP_SLICE = 1.0


def check_int(what, value, lo, hi):
    """value as an int when it is an integer (not a bool) in lo..hi; else a
    ValueError naming what, the value and the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not (
            lo <= value <= hi):
        raise ValueError(f"{what} must be an integer in {lo}..{hi}, got {value!r}")
    return int(value)


def reader_timeout(cfg, timeout, zero=True):
    """The seconds a reader waits for a generation: READ_TIMEOUT when
    timeout is None, else timeout, a number in 0..10^6 (zero=False: above
    0); a ValueError naming timeout= otherwise."""
    if timeout is None:
        return float(cfg["READ_TIMEOUT"])
    ok = (not isinstance(timeout, bool) and isinstance(timeout, numbers.Real)
          and (0 <= timeout if zero else 0 < timeout) and timeout < MAX_TIMEOUT)
    if not ok:
        raise ValueError(f"timeout must be a number of seconds {'>=' if zero else '>'} 0 and "
                         f"below {MAX_TIMEOUT:g}, got {timeout!r}")
    return float(timeout)


def original_layout_hint(cfg):
    """A sentence for a user whose MongoDB database holds the original
    wirehead's collections (``read.bin``, ``status``, ...), else ''."""
    if _uri.backend_of(cfg["STORE"]).backend != "mongodb":
        return ""
    try:
        names = set(_C.mongo_collections(**store_kwargs(cfg, False)))
    except _C.WireheadError:
        return ""
    theirs = sorted(names & {f"{cfg['READ_COLLECTION']}.bin", f"{cfg['WRITE_COLLECTION']}.bin",
                             f"{cfg['TEMP_COLLECTION']}.bin", "status"})
    if not theirs:
        return ""
    return (f"; database {database(cfg)!r} holds collections of the original wirehead "
            f"({', '.join(theirs)}), which wirehead_torch does not read: run the generators "
            f"with wirehead_torch (or `from wirehead import ...` of this package) to fill "
            f"its own collections ({cfg['COLLECTION_PREFIX']}.state, "
            f"{cfg['COLLECTION_PREFIX']}.gen.N), and drop the old ones when no original "
            f"wirehead process uses them")


def _relay_wait(cfg):
    """What a reader of the node-local copy (LOCAL_CACHE) waits for."""
    from ._store_args import local_cache_uri
    from .relay import RELAY_COMMAND, relay_figures
    fig = relay_figures(cfg)
    if fig and fig["running"]:
        return (f"the relay (pid {fig['pid']}) to copy the first generation of "
                f"{redact(cfg['STORE'])} into {local_cache_uri(cfg)}", "start a generator")
    return (f"a relay to fill this node's copy {local_cache_uri(cfg)} (LOCAL_CACHE) of "
            f"{redact(cfg['STORE'])}", f"start one relay per node ({RELAY_COMMAND})")


def _check_relay(cfg, gen, who):
    """A reader of the node-local copy says, at most once a minute, when no
    relay runs on its node: it then reads a copy that no longer follows
    MongoDB."""
    from ._store_args import local_cache_uri
    from .relay import RELAY_COMMAND, relay_figures
    local = local_cache_uri(cfg)
    now = time.monotonic()
    if now - _relay_checked.get(local, -RELAY_CHECK_EVERY) < RELAY_CHECK_EVERY:
        return
    _relay_checked[local] = now
    fig = relay_figures(cfg)
    if fig and fig["running"]:
        return
    last = f"the last one, pid {fig['pid']}, has ended" if fig else "none has run"
    log.warning("%s: pid %d: no relay runs on this node (%s): reading generation %s of its "
                "copy %s, which no longer follows %s; start one relay per node (%s)", who,
                os.getpid(), last, gen_label(gen, (fig or {}).get("labels")), local,
                redact(cfg["STORE"]), RELAY_COMMAND)


def _not_created(cfg):
    if _uri.backend_of(cfg["STORE"]).mappable:
        return "no shared-memory segment: no generator has put a sample"
    return "no generator has created it"


def gen_text(store, cfg, gen, st=None):
    """gen as status names it: #N of the config's STORE (for a node-local
    copy, by the figures its relay keeps, since the copy's own count starts
    at its first copy; cfg None: store's own count)."""
    if cfg is not None and cfg["LOCAL_CACHE"]:
        from .relay import relay_figures
        return gen_label(gen, (relay_figures(cfg) or {}).get("labels"))
    try:
        return gen_label(gen, st or store.status())
    except _C.WireheadError:
        return gen_label(gen, None)


def _params_of_read(store, cfg):
    """The params versions of the read generation, in words."""
    try:
        st = store.status()
        gen = st["read_gen"]
        if not gen:
            return "no generation is sealed yet"
        gp = store.gen_params(gen)
        return (f"the read generation {gen_text(store, cfg, gen, st)} was made under params "
                f"versions "
                f"{gp['min']}..{gp['max']}; the store is at version {store.params_version()}")
    except _C.WireheadError as e:
        return f"the store did not say more: {e}"


def _waiting_for(store, cfg, newer_than=0, min_params=0):
    """(what a reader with no generation to read waits for, what to do),
    in words; what is None when the store does not exist yet."""
    if cfg["LOCAL_CACHE"]:
        return _relay_wait(cfg)
    try:
        st = store.status()
    except _C.StoreNotCreatedError:
        return None, "start a generator (WireheadGenerator)"
    except _C.WireheadError as e:
        return f"{redact(cfg['STORE'])} to answer ({e})", "start a generator (WireheadGenerator)"
    if min_params and st["read_gen"]:
        # a generation exists: what is missing is one made under the version wanted
        return (f"a generation of {redact(cfg['STORE'])} made entirely under params version "
                f">= {min_params} ({_params_of_read(store, cfg)})",
                "set_params must reach that version and generators make a whole generation "
                "under it")
    who = ("a manager or generator holds the lease" if st["leader_pid"] else
           "no manager is running" + ("" if cfg["SELF_SEAL"] else " and SELF_SEAL is off"))
    which = (f"a generation newer than {gen_label(newer_than, st)}" if newer_than
             else "the first generation")
    return (f"{which} of {redact(cfg['STORE'])}: the write generation holds "
            f"{st['write_fill']} of SWAP_CAP={st['swap_cap']} samples and {who}",
            "start a generator (WireheadGenerator)")


def _absent_note(cfg):
    return (f"shm store {redact(cfg['STORE'])} to be created (it does not exist yet: with "
            f"BYTE_BUDGET auto the first generator's first sample creates it)"
            if _uri.backend_of(cfg["STORE"]).mappable
            else f"store {redact(cfg['STORE'])} to be created (it does not exist yet: "
                 f"{_not_created(cfg)})")


def wait_for_generation(store, cfg, timeout, newer_than=0, min_params=0, *, stop=None,
                        check=None, who="wirehead reader", note_every=WAIT_NOTE_EVERY,
                        longer="READ_TIMEOUT, or the reader's timeout="):
    """Newest sealed generation (other than newer_than); waits up to timeout
    seconds (the store's C wait: bounded backoff) while there is none, the
    store does not exist yet or the server cannot be reached, saying every
    note_every seconds (who: the process's name there) what it waits for.

    stop: a flag (true once stopped): None is returned once it is set.
    check: called between slices of the wait; what it raises ends the wait.
    longer: how the caller waits longer, for the timeout's error."""
    start = time.monotonic()
    deadline = start + timeout
    note = start + min(2.0, note_every)  # the first note early: a slow start says why soon
    sliced = stop is not None or check is not None
    hinted = False
    while not stop:
        if check is not None:
            check()
        now = time.monotonic()
        step = max(0.0, min(deadline, note) - now)
        if sliced:
            step = min(step, _STOP_SLICE)
        try:
            gen = store.wait_generation(newer_than, step)
            if cfg.get("LOCAL_CACHE"):  # a plain dict of a config may lack the key
                _check_relay(cfg, gen, who)
            return gen
        except (_C.StoreTimeoutError, _C.StoreUnavailableError, _C.StoreNotCreatedError) as e:
            # an outage is waited out for the whole timeout, like a slow start
            if time.monotonic() >= deadline:
                if isinstance(e, _C.StoreUnavailableError):
                    raise
                break
        now = time.monotonic()
        if now < note:
            continue
        note = now + note_every
        if not hinted:  # a slow start: say early if this database holds the original's layout
            hinted = True
            hint = original_layout_hint(cfg)
            if hint:
                log.warning("%s: no generation yet%s", who, hint)
        what, advice = _waiting_for(store, cfg, newer_than, min_params)
        log.warning("%s: pid %d waiting %.0fs of its %gs timeout for %s; %s", who,
                    os.getpid(), now - start, timeout, what or _absent_note(cfg), advice)
    if stop:
        return None
    where = redact(cfg["STORE"])
    what, advice = _waiting_for(store, cfg, newer_than, min_params)
    if what is None:
        raise TimeoutError(f"store {where} does not exist yet after {timeout:g}s "
                           f"({_not_created(cfg)}): start generators into it first, or wait "
                           f"longer ({longer})") from None
    if min_params:
        raise TimeoutError(f"no generation made entirely under params version >= {min_params} "
                           f"in {where} after {timeout:g}s ({_params_of_read(store, cfg)}); "
                           f"set_params must have reached that version and generators a whole "
                           f"generation under it, or wait longer ({longer})") from None
    raise TimeoutError(
        f"no generation "
        f"{'newer than ' + gen_text(store, cfg, newer_than) + ' ' if newer_than else ''}sealed in "
        f"{where} after {timeout:g}s: waited for {what}; "
        f"{_relay_wait(cfg)[1] + ', ' if cfg['LOCAL_CACHE'] else ''}"
        f"start generators (WireheadGenerator; with SELF_SEAL they seal full generations "
        f"themselves) or a manager (wirehead-torch manager --config ...), or wait longer "
        f"({longer})"
        f"{original_layout_hint(cfg)}") from None


class Generations:
    """Which generation a reader reads: the one place this is decided,
    asked by every reader kind (WireheadIterableDataset, the map-style
    readers, WireheadLoader, wirehead_torch.DataLoader with or without a
    device). An epoch (a map-style reader: each read) starts on the
    generation a resumed state names, else on the newest sealed one,
    waited for (min_params: made entirely under params >= it); with
    refresh='step' each step moves on to the newest sealed one (the C
    loader's threads do that step themselves).

    In spec mode (RUN_SEED; docs/reproducible.md) epoch e reads spec
    generation e // REUSE and nothing else: spec_gen(e) names it,
    for_epoch waits for it (counted in ``spec``, a SpecWait) and every
    read of it is exact (a lost one is waited for where it is made
    again, never replaced by the newest)."""

    def __init__(self, cfg, timeout, min_params=0, refresh="epoch", who="wirehead reader"):
        self.cfg, self.timeout = cfg, timeout
        self.min_params, self.refresh = min_params, refresh
        self.spec = SpecWait(cfg, who) if cfg["RUN_SEED"] is not None else None

    def spec_gen(self, epoch):
        """The spec generation epoch reads; None outside spec mode."""
        return None if self.spec is None else spec_generation(self.cfg, epoch)

    def for_epoch(self, store, resume=0, epoch=0):
        """The generation an epoch starts on; resume: the one a resumed
        state names (0: none). Waits for a generation either way. In spec
        mode: the store's id of epoch's spec generation (resume is not
        asked: the epoch names it)."""
        if self.spec is not None:
            return self.spec.generation(store, self.spec_gen(epoch), self.timeout)
        newest = wait_for_generation(store, self.cfg, self.timeout, min_params=self.min_params)
        return resume or newest

    def for_step(self, store, gen):
        """The generation the next step reads, gen the one the last read:
        with refresh='step' the newest sealed one where it is newer (during
        an outage gen stays: the read policy waits it out); else gen."""
        if self.refresh != "step":
            return gen
        try:
            return max(gen, store.current())
        except _C.StoreUnavailableError:
            return gen


def read_sample(store, gen, pos, want, timeout, skip=True, spec_gen=None):
    """The _C.SampleRead (generation, position, is_pad, arrays, skipped)
    through the one C read policy: a reclaimed generation moves to the
    newest; a corrupt sample is skipped (logged) and its neighbour stands in
    as padding, or with skip=False raises CorruptSampleError. spec_gen
    (spec mode): gen holds that spec generation, read exactly."""
    got = store.read_sample(gen, pos, want, timeout, skip, spec_gen=spec_gen)
    if got.skipped:
        warn_skipped("wirehead reader", 1, got.skipped)
    return got


def check_views_store(cfg):
    """views=True needs a store whose backend has views (or LOCAL_CACHE,
    a copy that has them): other bytes arrive as copies."""
    b = _uri.backend_of(cfg["STORE"])
    if not b.views and not cfg["LOCAL_CACHE"]:
        raise ValueError(f"views=True needs a store with views, such as "
                         f"{_uri.shm_uri('NAME')} (STORE is {redact(cfg['STORE'])}); a "
                         f"{b.backend} store's samples are read as copies")


def view_sample(store, gen, pos, want, timeout, skip=True, spec_gen=None):
    """As read_sample, but the arrays view the shm store (read-only, the
    generation pinned while any of them lives); None when the pin policy
    refuses (this process still holds views of another generation): the
    caller reads a copy instead."""
    try:
        got = store.view_sample(gen, pos, want, timeout, skip, spec_gen=spec_gen)
    except _C.PinLimitError:
        return None
    if got.skipped:
        warn_skipped("wirehead reader", 1, got.skipped)
    return got
