"""Spec mode (docs/reproducible.md): the spec of a sample index, its seed,
and what a generator does with a function of a spec: claim the next index,
materialize it, put it at its position."""
import dataclasses
import json
import logging
import threading

from . import _C
from ._arrays import to_store_arrays

log = logging.getLogger("wirehead_torch")

_U64 = 1 << 64
# a generator with nothing to claim polls again after this, doubling up to _IDLE_MAX
_IDLE_MIN, _IDLE_MAX = 0.01, 0.5
# the stored text of an exception in fn (the store keeps one line per index)
_WHY_MAX = 400


def spec_seed(run_seed, index):
    """The 64-bit seed of sample ``index`` of a run: the ``index + 1``-th
    output of SplitMix64 seeded with ``mix64(run_seed)`` (docs/reproducible.md,
    "The spec of sample k"). The same on every platform and in every version."""
    for name, v in (("run_seed", run_seed), ("index", index)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < _U64:
            raise ValueError(f"spec_seed: {name} must be an integer in 0..2**64-1, got {v!r}")
    return _C.spec_seed(run_seed, index)


@dataclasses.dataclass(frozen=True)
class Spec:
    """What a spec-mode generator's function gets: everything the sample
    may depend on. ``params`` is the params document in force for the
    generation (a copy of its own)."""

    index: int
    seed: int
    generation: int
    position: int
    params: dict
    params_version: int
    run_seed: int
    attempt: int = 1


class _Renewal:
    """Renews a claim every lease/3 seconds from a thread of its own while
    fn runs (the handle's calls serialise in C), so fn may take any time."""

    def __init__(self, store, claim, lease_s, who):
        self._store, self._claim, self._lease, self._who = store, claim, lease_s, who
        self._done = threading.Event()
        self.lost = False
        self._t = threading.Thread(target=self._run, name="wirehead-claim-renewal", daemon=True)

    def _run(self):
        while not self._done.wait(self._lease / 3):
            try:
                if not _C.spec_renew(self._store, self._claim, lease_s=self._lease):
                    self.lost = True  # another put wins; ours is then a counted duplicate
                    return
            except _C.WireheadError as e:  # an outage: the next renewal tries again
                log.warning("%s: claim of sample index %d not renewed: %s", self._who,
                            self._claim.index, e)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._t.join()


class SpecMaker:
    """The spec-mode loop of one WireheadGenerator: counts what it did
    (``made``, ``duplicates``, ``nondeterministic``, ``failures``,
    ``sealed``) and says what it waits for."""

    def __init__(self, fn, cfg, say, who="wirehead generator"):
        self.fn = fn
        self.cfg = cfg
        self.say = say
        self.who = who  # how its log lines start (the generator's name)
        self.run_seed = cfg["RUN_SEED"]
        self.lease = float(cfg["CLAIM_LEASE"])
        self.attempts = int(cfg["SPEC_ATTEMPTS"])
        self.made = self.duplicates = self.nondeterministic = self.failures = 0
        self.sealed = 0
        self.last_sealed = None
        self._params = (None, None)  # (version, document)
        self._layout = None  # (index, [(dtype, shape)]) of the first sample made here
        self._warned_nondet = False
        self._waiting = None  # what an idle generator last said it waits for

    def _spec(self, store, claim):
        version, doc = self._params
        if version != claim.params_version:
            doc = json.loads(_C.spec_params(store, claim))
            self._params = (claim.params_version, doc)
        return Spec(index=claim.index, seed=_C.spec_seed(self.run_seed, claim.index),
                    generation=claim.spec_gen, position=claim.position,
                    params=json.loads(json.dumps(doc)), params_version=claim.params_version,
                    run_seed=self.run_seed, attempt=claim.attempt)

    def _arrays(self, item, k):
        """The sample fn returned, checked: every field named in SAMPLE, and
        each field's dtype and shape those of the first sample made here."""
        try:
            arrays = to_store_arrays(item, self.cfg["SAMPLE"], "fn returned")
        except _C.InvalidSampleError as e:
            raise _C.InvalidSampleError(f"sample index {k}: {e}") from None
        names = {code: name for name, code in _C.DTYPES.items()}
        layout = [(names[code], tuple(a.shape)) for a, code in arrays]
        if self._layout is None:
            self._layout = (k, layout)
        first, want = self._layout
        for name, mine, theirs in zip(self.cfg["SAMPLE"], layout, want):
            if mine != theirs:
                raise _C.InvalidSampleError(
                    f"sample index {k}: field '{name}' is {mine[0]} {list(mine[1])} but "
                    f"sample index {first} was {theirs[0]} {list(theirs[1])}: fn must "
                    f"return the same dtype and shape for every index")
        return arrays

    def _idle(self, status, stop, delay):
        """Waits for something to claim; says once what it waits for."""
        what = ("readers: the next generation would be more than "
                f"{_C.SPEC_AHEAD} ahead of the slowest one" if status == _C.CLAIM_AHEAD
                else "the claims of other generators to finish or expire")
        if what != self._waiting:
            self._waiting = what
            log.info("%s: waiting for %s", self.who, what)
        return stop.wait(delay)

    def _retried(self, stop, call, *args, **kw):
        """call(*args, **kw), retried while the store is away or an shm lock
        is held by a stopped process (each try waits LEASE_SECONDS at most);
        None once stop is set."""
        delay, warned = _IDLE_MIN, False
        while True:
            try:
                res = call(*args, **kw)
            except (_C.StoreUnavailableError, _C.StoreTimeoutError) as e:
                if not warned:
                    log.warning("%s: %s; retrying", self.who, e)
                    warned = True
                if stop.wait(delay):
                    return None
                delay = min(delay * 2, _IDLE_MAX * 4)
                continue
            if warned:
                log.warning("%s: the store answers again", self.who)
            return res

    def step(self, store, stop):
        """Claims, materializes and puts one index. Returns False when stop
        was set before anything was claimed."""
        delay = _IDLE_MIN
        while True:
            res = self._retried(stop, _C.spec_claim, store, lease_s=self.lease,
                                max_attempts=self.attempts)
            if res is None:
                return False
            status, claim = res
            if claim is not None:
                break
            if self._idle(status, stop, delay):
                return False
            delay = min(delay * 2, _IDLE_MAX)
        self._waiting = None
        try:
            spec = self._spec(store, claim)
        except _C.GenerationGoneError:
            return True  # its generation (or params version) went away: claim again
        try:
            with _Renewal(store, claim, self.lease, self.who):
                item = self.fn(spec)
            arrays = self._arrays(item, claim.index)
        except Exception as e:
            invalid = isinstance(e, _C.InvalidSampleError)
            self._failed(store, claim, e, said=not invalid)
            if invalid:
                raise  # fn returns what no store can hold: every retry would too
            return True
        res = self._retried(stop, _C.spec_put, store, claim, arrays)
        if res is None:
            return False  # stopped: the claim expires and another generator makes it
        self._count(claim, *res)
        return True

    def _failed(self, store, claim, e, said=True):
        """The claim given back after fn's exception e (said: logged here;
        an invalid sample is raised to the caller instead)."""
        why = f"{type(e).__name__}: {e}".replace("\n", " ")[:_WHY_MAX]
        self.failures += 1
        gone = _C.spec_fail(store, claim, max_attempts=self.attempts,
                            why=why)
        if said:
            log.warning("%s: fn failed on sample index %d (attempt %d of %d): %s%s", self.who,
                        claim.index, claim.attempt, self.attempts, why,
                        "; the index has failed for good" if gone else "")

    def _count(self, claim, put, sealed):
        if put == _C.SPEC_PUT_ACCEPTED:
            self.made += 1
        elif put in (_C.SPEC_PUT_SAME, _C.SPEC_PUT_DIFFERENT):
            self.duplicates += 1
            if put == _C.SPEC_PUT_DIFFERENT:
                self.nondeterministic += 1
                if not self._warned_nondet:
                    self._warned_nondet = True
                    log.warning("%s: sample index %d was made twice with "
                                "different bytes: fn is not a function of its spec alone, "
                                "so runs are not reproducible (docs/reproducible.md); the "
                                "first put was kept", self.who, claim.index)
        if sealed:
            self.sealed += 1
            self.last_sealed = claim.spec_gen
