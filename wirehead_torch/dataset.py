"""Map-style readers of the current generation, with the original names."""
import logging
import time

import numpy as np

from . import _C
from ._arrays import to_output
from ._store import ProcessStore
from .config import get_config, redact

try:
    import torch
    _Base = torch.utils.data.Dataset
except ImportError:  # pragma: no cover - torch is a dependency of readers
    torch = None
    _Base = object

_GONE_RETRIES = 8
log = logging.getLogger("wirehead_torch")


def wait_for_generation(store, cfg, timeout, newer_than=0):
    """Newest sealed generation (newer than newer_than); waits up to timeout
    seconds while there is none or the server cannot be reached."""
    deadline = time.monotonic() + timeout
    delay, warned = 0.005, False
    while True:
        try:
            gen = store.current()
            if gen and gen != newer_than:
                return gen
            problem = None
        except _C.StoreUnavailableError as e:
            problem = e
            if not warned:
                log.warning("wirehead reader: %s; waiting up to %gs", e, timeout)
                warned = True
        if time.monotonic() >= deadline:
            if problem is not None:
                raise problem
            st = store.status()
            raise TimeoutError(
                f"no generation sealed in {redact(cfg['STORE'])} after {timeout:g}s: the "
                f"write generation holds {st['write_fill']} of SWAP_CAP={st['swap_cap']} "
                f"samples and {'a manager holds the lease' if st['leader_pid'] else 'no manager is running'}"
                f"; start generators (WireheadGenerator) and a manager "
                f"(wirehead-torch manager --config ...), or raise READ_TIMEOUT")
        time.sleep(delay)  # bounded poll; a store has no wake-up channel across processes
        delay = min(delay * 2, 0.1)


def read_sample(store, gen, pos, want, cfg, timeout):
    """(generation, arrays) of position pos, from gen or, if gen was
    reclaimed meanwhile (or the server lost it), from the newest one."""
    for _ in range(_GONE_RETRIES):
        try:
            return gen, store.read(gen, pos, want)
        except (_C.GenerationGoneError, _C.NotFoundError, _C.StoreUnavailableError):
            gen = wait_for_generation(store, cfg, timeout, newer_than=gen)
    raise _C.GenerationGoneError(f"position {pos}: generations were reclaimed {_GONE_RETRIES} "
                                 f"times in a row while reading; is the reader starved of CPU?")


class _CurrentGenerationReader(_Base):
    def __init__(self, config_path=None, config=None, *, timeout=None, output="torch",
                 cast=None):
        self.cfg = get_config(config_path, config)
        if len(self.cfg["SAMPLE"]) < 2:
            raise ValueError(f"{type(self).__name__} reads two fields (input, label); SAMPLE "
                             f"names {self.cfg['SAMPLE']}")
        self.timeout = float(self.cfg["READ_TIMEOUT"] if timeout is None else timeout)
        self.output = output
        self.cast = cast
        self.names = self.cfg["SAMPLE"][:2]
        self._store = ProcessStore(self.cfg)

    def __len__(self):
        return self.cfg["SWAP_CAP"]

    def _pair(self, index):
        n = len(self)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} out of range for SWAP_CAP={n}")
        store = self._store.get()
        gen = wait_for_generation(store, self.cfg, self.timeout)
        _, arrs = read_sample(store, gen, i, [0, 1], self.cfg, self.timeout)
        return tuple(to_output(a, name, self.output, self.cast)
                     for a, name in zip(arrs[:2], self.names))

    @staticmethod
    def _is_batch(index):
        return isinstance(index, (list, tuple, range, np.ndarray)) or (
            torch is not None and isinstance(index, torch.Tensor) and index.dim() == 1)


class MongoheadDataset(_CurrentGenerationReader):
    """``ds[i]`` -> ``{'input': ..., 'label': ...}`` (the first two SAMPLE
    fields, exact stored dtype and shape); ``ds[[i, j]]`` -> ``{i: ..., j: ...}``.
    Works on any store (shm:// or mongodb://)."""

    def __getitem__(self, index):
        if self._is_batch(index):
            return {int(i): self[int(i)] for i in index}
        x, y = self._pair(index)
        return {"input": x, "label": y}


class MongoTupleheadDataset(_CurrentGenerationReader):
    """``ds[i]`` -> ``(input, label)``; ``ds[[i, j]]`` -> a list of tuples."""

    def __getitem__(self, index):
        if self._is_batch(index):
            return [self[int(i)] for i in index]
        return self._pair(index)
