"""WireheadGenerator: pushes samples from any Python generator into the store."""
import logging
import time

from . import _C
from ._arrays import to_store_arrays
from ._redact import secrets_hidden
from ._store import GenLabels, ProcessStore, StopFlag
from ._store_args import store_kwargs
from .config import get_config
from .manager import StallLog
from .params import GeneratorParams, clear_current

log = logging.getLogger("wirehead_torch")


def _spec_maker(source, cfg, say, who):
    """The spec-mode loop for a function of a wt.Spec (RUN_SEED set), None
    for an iterable of samples; a mismatch of the two is a TypeError."""
    spec = cfg["RUN_SEED"] is not None
    is_fn = callable(source) and not hasattr(source, "__next__")
    if spec and not is_fn:
        raise TypeError(f"RUN_SEED is set (spec mode): WireheadGenerator takes a function of a "
                        f"wt.Spec returning one sample, got {type(source).__name__} "
                        f"(docs/reproducible.md)")
    if not spec and is_fn and not hasattr(source, "__iter__"):
        raise TypeError(f"WireheadGenerator got a function ({getattr(source, '__name__', source)}"
                        f"): a function of a wt.Spec needs RUN_SEED in the config (spec mode, "
                        f"docs/reproducible.md); otherwise pass an iterable of samples, e.g. "
                        f"a generator object (call the generator function)")
    if not spec:
        return None
    from .spec import SpecMaker
    return SpecMaker(source, cfg, say, who)

# seconds between a running generator's summary lines
SUMMARY_EVERY = 30.0


class WireheadGenerator:
    """Pulls tuples (one array per SAMPLE name) from ``generator`` and puts
    them into the store. Many processes may run one at once.

    ``run()`` stops after ``n_samples`` puts, when the generator is
    exhausted, or on SIGTERM/SIGINT (after finishing the current put), and
    returns the number of puts. ``accepted`` and ``discarded`` count how
    many were taken into a generation or dropped as surplus.

    With SELF_SEAL (the default) the generator whose put fills the write
    generation seals it when no manager holds the lease, under the same
    lease, so a manager is optional; ``sealed`` counts its seals.

    Before each sample it reads the store's params (docs/params.md) when
    their version changed: the generator reads them with
    ``wirehead_torch.current_params()``, and the sample records their
    version (``params_version``).

    Lines go to stdout: a start line, a summary at most every
    ``summary_every`` seconds and an end line; ``verbose=True`` adds the
    original's two lines per generation sealed here, ``run(verbose=True)``
    those and one per put, ``quiet=True`` none (warnings go to the log
    either way). Each line, warnings too, starts with ``name``
    (``Generator``, the original's). Generations are named ``#N`` as
    ``status`` names them.

    The first sample is checked against the store's read generation: a
    field of another dtype or shape is refused before it is put
    (``check_layout=False`` for a store meant to hold samples that vary)."""

    def __init__(self, generator, config_path=None, config=None, n_samples=None, quiet=False,
                 verbose=False, summary_every=SUMMARY_EVERY, check_layout=True,
                 name="Generator"):
        self.cfg = get_config(config_path, config)
        if n_samples is not None and (not isinstance(n_samples, int) or n_samples < 0):
            raise ValueError(f"n_samples must be a non-negative integer, got {n_samples!r}")
        self.name = str(name)
        self.spec = _spec_maker(generator, self.cfg, self._say, self.name)
        self.generator = generator
        self.n_samples = n_samples
        self.quiet = quiet
        self.verbose = verbose
        self.summary_every = float(summary_every)
        self.check_layout = check_layout
        self.accepted = 0
        self.discarded = 0
        self.waits = 0
        self.sealed = 0
        self._store = ProcessStore(self.cfg, who=self.name)
        self._stop = StopFlag()
        self._it = None
        self._manager_until = 0.0  # a manager led recently: no fill checks until then
        self._stall = StallLog(self.name)
        self._params = GeneratorParams()
        self._labels = GenLabels(self._store)
        self._summary = None  # (monotonic time, puts, seals) of the last summary line
        self._last_sealed = None
        self._layout_checked = not check_layout

    @property
    def params_version(self):
        """The params version the last sample taken was made under."""
        return self._params.version

    def _say(self, text):
        if not self.quiet:
            print(f"{self.name}: {text}", flush=True)

    def _put(self, arrays, stop, verbose):
        """Puts one sample; waits out a full write area and a server outage
        (retrying the same sample) until it is stored or stop is set.
        Returns (status, generation) or None when stopped."""
        warned_full = warned_down = False
        delay = 0.05
        while True:
            try:
                # the handle follows a store removed or re-created meanwhile
                status, gen = self._store.get().put(arrays, wait_ms=100)
            except (_C.StoreUnavailableError, _C.StoreTimeoutError) as e:
                # a server outage, or an shm lock held by a stopped process
                if not warned_down:
                    log.warning("%s: %s; retrying", self.name, e)
                    warned_down = True
                if stop.wait(delay):
                    return None
                delay = min(delay * 2, 2.0)
                continue
            if warned_down:
                log.warning("%s: the store answers again", self.name)
                warned_down = False
            if status != _C.PUT_WAIT:
                return status, gen
            self.waits += 1
            self._self_seal(status, verbose)
            if not warned_full:
                log.warning("%s: write area full (BYTE_BUDGET); waiting for the generation "
                            "to be sealed", self.name)
                warned_full = True
            if stop:
                return None

    def _self_seal(self, status, verbose):
        """Seals the write generation if it is full and no manager leads.
        An accepted put checks the fill first; a discarded or waiting put
        means the generation is full already. verbose: the run's or cycle's
        (the seal lines are said with it or with the generator's own)."""
        if not self.cfg["SELF_SEAL"]:
            return
        try:
            self._try_seal(status, self.verbose or verbose)
        except (_C.StoreUnavailableError, _C.StoreTimeoutError, _C.NotFoundError,
                _C.LeaseLostError):
            pass  # the store is away, stuck or wiped: the next put deals with it

    def _try_seal(self, status, say):
        store = self._store.get()
        now = time.monotonic()
        if status == _C.PUT_ACCEPTED:
            if now < self._manager_until:
                return
            st = store.status()
            if st["leader_pid"]:  # a manager (or a sealing peer) leads: leave it to it
                self._manager_until = now + float(self.cfg["LEASE_SECONDS"]) / 4
                return
            if st["write_fill"] < st["swap_cap"]:
                return
        if not store.lead():
            self._manager_until = now + float(self.cfg["LEASE_SECONDS"]) / 4
            return
        try:
            info = store.seal()
        finally:
            store.resign()
        if info is not None and "blocked_pid" in info:
            self._stall.blocked(info, store)
            return
        self._stall.sealed()  # sealed now, or not full: the generation moved on
        if info is not None:
            self.sealed += 1
            self._last_sealed = info["generation"]
            if say:
                self._say(f"Time: {time.time()}")
                self._say(f"swap success: generation {self._labels(info['generation'])} "
                          f"sealed (generated={info['generated']} "
                          f"discarded={info['discarded']})")

    def stop(self):
        """Asks a running ``run()`` (e.g. in another thread) to return after
        the current put."""
        self._stop.set()

    def _step(self, stop, verbose):
        """Takes one item and puts it: False when the generator is
        exhausted or stop was set. verbose: a line per put, and the seal
        lines."""
        if self._it is None:
            self._it = iter(self.generator)
        self._refresh_params()
        try:
            item = next(self._it)
        except StopIteration:
            return False
        finally:
            clear_current()
        arrays = to_store_arrays(item, self.cfg["SAMPLE"])
        if not self._layout_checked:
            self._check_layout(arrays)
        res = self._put(arrays, stop, verbose)
        if res is None:
            return False
        status, gen = res
        if status == _C.PUT_ACCEPTED:
            if not self.accepted:  # the first put of an auto-sized store creates it
                self._store.note_created(None if self.quiet else self._say)
            self.accepted += 1
        else:
            self.discarded += 1
        if verbose:
            what = "accepted" if status == _C.PUT_ACCEPTED else "discarded (generation full)"
            self._say(f"pushed sample {self.accepted + self.discarded} into generation "
                      f"{self._labels(gen)}, {what}, with cap: {self.cfg['SWAP_CAP']}")
        self._self_seal(status, verbose)
        self._summarize()
        return True

    def _summarize(self):
        """The summary line, at most once per summary_every seconds."""
        now = time.monotonic()
        puts = self.accepted + self.discarded
        if self._summary is None:
            self._summary = (now, puts, self.sealed)
            return
        t0, puts0, seals0 = self._summary
        if self.quiet or now - t0 < self.summary_every:
            return
        self._summary = (now, puts, self.sealed)
        last = (f", the last {self._labels(self._last_sealed)}"
                if self.sealed > seals0 and self._last_sealed else "")
        self._say(f"{puts} samples ({self.accepted} accepted, {self.discarded} surplus), "
                  f"{(puts - puts0) / (now - t0):.1f}/s over the last {now - t0:.0f}s; "
                  f"{self.sealed} generations sealed here ({self.sealed - seals0} new{last})")

    def _check_layout(self, arrays):
        """Refuses a first sample whose fields differ in dtype or shape from
        the store's read generation (a store made for other samples), before
        anything is put. Read through a handle of its own, closed at once,
        so the generator does not count as a reader."""
        self._layout_checked = True
        store = self._store.get()
        try:
            gen = store.current()
            if not gen:
                return
            with secrets_hidden(self.cfg["STORE"]):
                probe = _C.Store(**store_kwargs(self.cfg, False, False))
            try:
                got = probe.read_sample(gen, 0, None, 5.0, True)
            finally:
                probe.close()
        except _C.WireheadError:
            return  # nothing readable to compare with: the store is new, away or moving on
        names = {code: dtype for dtype, code in _C.DTYPES.items()}
        for name, (a, code), b in zip(self.cfg["SAMPLE"], arrays, got.arrays):
            mine, theirs = (names[code], list(a.shape)), (str(b.dtype), list(b.shape))
            if mine != theirs:
                raise ValueError(
                    f"field '{name}' of this generator's first sample is {mine[0]} "
                    f"{mine[1]} but the store's samples are {theirs[0]} {theirs[1]} "
                    f"(generation {self._labels(got.generation)}): make samples of the "
                    f"store's dtype and shape, remove the old store first (wirehead-torch "
                    f"clean --config FILE), or pass check_layout=False to WireheadGenerator "
                    f"for a store meant to hold samples that vary")

    def _refresh_params(self):
        """The params the next sample is made under; a store away keeps the
        last ones (the put that follows waits the outage out)."""
        try:
            self._params.refresh(self._store.get())
        except (_C.StoreUnavailableError, _C.StoreTimeoutError) as e:
            log.warning("%s: params not refreshed (%s); the sample uses version %d",
                        self.name, e, self._params.version)
            self._params.refresh_local(self._store.get())

    def cycle(self, verbose=False):
        """One step of the original's loop: one sample in, and a seal if it
        filled the generation. Returns False once the generator is exhausted."""
        return self._step(self._stop, verbose)

    def run(self, verbose=False):
        """Puts samples until n_samples, the generator's end or a stop
        (see the class); returns the number of puts. verbose: a line per
        put and the seal lines."""
        if self.spec is not None:
            return self._run_spec()
        puts = 0
        self._say("Initialized")
        with self._stop as stop:
            self._store.get()  # a store that cannot be opened fails before any sample
            while not stop and (self.n_samples is None or puts < self.n_samples):
                if not self._step(stop, verbose):
                    break
                puts += 1
            if puts and self.cfg["SELF_SEAL"] and not stop:
                # a full generation left unsealed at the end
                self._self_seal(_C.PUT_DISCARDED, verbose)
        self._stop = StopFlag()  # a later run() starts afresh
        last = f", the last {self._labels(self._last_sealed)}" if self._last_sealed else ""
        self._say(f"done: {puts} samples ({self.accepted} accepted, {self.discarded} "
                  f"surplus), {self.sealed} generations sealed here{last}")
        return puts

    def run_generator(self):
        """The original wirehead's name for ``run()`` (its scripts call it;
        docs/migration.md)."""
        return self.run()

    def _run_spec(self):
        """Spec mode: claims, materializes and puts indices until n_samples
        are made, or SIGTERM/SIGINT (after the current one)."""
        m = self.spec
        self._say(f"Initialized (spec mode, RUN_SEED={self.cfg['RUN_SEED']})")
        steps = 0
        with self._stop as stop:
            store = self._store.get()
            while not stop and (self.n_samples is None or steps < self.n_samples):
                if not m.step(store, stop):
                    break
                steps += 1
        self._stop = StopFlag()
        self.accepted, self.discarded, self.sealed = m.made, m.duplicates, m.sealed
        last = f", the last #{m.last_sealed}" if m.last_sealed is not None else ""
        self._say(f"done: {m.made} samples made, {m.duplicates} made twice "
                  f"({m.nondeterministic} with other bytes), {m.failures} failed attempts, "
                  f"{m.sealed} generations completed here{last}")
        return steps

    def close(self):
        self._store.close()
