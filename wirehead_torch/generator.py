"""WireheadGenerator: pushes samples from any Python generator into the store."""
import logging

from . import _C
from ._arrays import to_store_arrays
from ._store import ProcessStore, StopFlag
from .config import get_config

log = logging.getLogger("wirehead_torch")


class WireheadGenerator:
    """Pulls tuples (one array per SAMPLE name) from ``generator`` and puts
    them into the store. Many processes may run one at once.

    ``run()`` stops after ``n_samples`` puts, when the generator is
    exhausted, or on SIGTERM/SIGINT (after finishing the current put), and
    returns the number of puts. ``accepted`` and ``discarded`` count how
    many were taken into a generation or dropped as surplus."""

    def __init__(self, generator, config_path=None, config=None, n_samples=None):
        self.cfg = get_config(config_path, config)
        if n_samples is not None and (not isinstance(n_samples, int) or n_samples < 0):
            raise ValueError(f"n_samples must be a non-negative integer, got {n_samples!r}")
        self.generator = generator
        self.n_samples = n_samples
        self.accepted = 0
        self.discarded = 0
        self.waits = 0
        self._store = ProcessStore(self.cfg)
        self._stop = StopFlag()

    def _put(self, store, arrays, stop):
        """Puts one sample; waits out a full write area and a server outage
        (retrying the same sample) until it is stored or stop is set."""
        warned_full = warned_down = False
        delay = 0.05
        while True:
            try:
                status, _gen = store.put(arrays, wait_ms=100)
            except _C.StoreUnavailableError as e:
                if not warned_down:
                    log.warning("wirehead generator: %s; retrying until the server is back", e)
                    warned_down = True
                if stop.wait(delay):
                    return None
                delay = min(delay * 2, 2.0)
                continue
            if warned_down:
                log.warning("wirehead generator: the store is reachable again")
                warned_down = False
            if status != _C.PUT_WAIT:
                return status
            self.waits += 1
            if not warned_full:
                log.warning("wirehead generator: write area full (BYTE_BUDGET); waiting "
                            "for the manager to seal")
                warned_full = True
            if stop:
                return None

    def stop(self):
        """Asks a running ``run()`` (e.g. in another thread) to return after
        the current put."""
        self._stop.set()

    def run(self):
        names = self.cfg["SAMPLE"]
        puts = 0
        it = iter(self.generator)
        with self._stop as stop:
            store = self._store.get()  # after the handlers: a SIGTERM while connecting is clean
            while not stop and (self.n_samples is None or puts < self.n_samples):
                try:
                    item = next(it)
                except StopIteration:
                    break
                status = self._put(store, to_store_arrays(item, names), stop)
                if status is None:
                    break
                puts += 1
                if status == _C.PUT_ACCEPTED:
                    self.accepted += 1
                else:
                    self.discarded += 1
        self._stop = StopFlag()  # a later run() starts afresh
        return puts

    run_generator = run

    def close(self):
        self._store.close()
