"""Map-style readers of the current generation, with the original names."""
import logging

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

log = logging.getLogger("wirehead_torch")


def wait_for_generation(store, cfg, timeout, newer_than=0):
    """Newest sealed generation (other than newer_than); waits up to timeout
    seconds (C read policy: bounded backoff) while there is none or the
    server cannot be reached."""
    try:
        return store.wait_generation(newer_than, timeout)
    except _C.StoreTimeoutError:
        st = store.status()
        raise TimeoutError(
            f"no generation sealed in {redact(cfg['STORE'])} after {timeout:g}s: the "
            f"write generation holds {st['write_fill']} of SWAP_CAP={st['swap_cap']} "
            f"samples and {'a manager holds the lease' if st['leader_pid'] else 'no manager is running'}"
            f"; start generators (WireheadGenerator) and a manager "
            f"(wirehead-torch manager --config ...), or raise READ_TIMEOUT") from None


def read_sample(store, gen, pos, want, timeout, skip=True):
    """(generation, position, is_pad, arrays) through the one C read policy:
    a reclaimed generation moves to the newest; a corrupt sample is skipped
    (logged) and its neighbour stands in as padding, or with skip=False
    raises CorruptSampleError."""
    gen, pos, is_pad, arrs, skipped = store.read_sample(gen, pos, want, timeout, skip)
    if skipped:
        log.warning("wirehead reader: skipped corrupt sample (%s); a neighbour stands in as "
                    "padding", skipped)
    return gen, pos, is_pad, arrs


def view_sample(store, gen, pos, want, timeout, skip=True):
    """As read_sample, but the arrays view the shm store (read-only, the
    generation pinned while any of them lives); None when the pin policy
    refuses (this process still holds views of another generation): the
    caller reads a copy instead."""
    try:
        gen, pos, is_pad, arrs, skipped = store.view_sample(gen, pos, want, timeout, skip)
    except _C.PinLimitError:
        return None
    if skipped:
        log.warning("wirehead reader: skipped corrupt sample (%s); a neighbour stands in as "
                    "padding", skipped)
    return gen, pos, is_pad, arrs


class _CurrentGenerationReader(_Base):
    def __init__(self, config_path=None, config=None, *, timeout=None, output="torch",
                 cast=None, views=False):
        self.cfg = get_config(config_path, config)
        if views and not str(self.cfg["STORE"]).startswith("shm://"):
            raise ValueError(f"views=True needs an shm:// store (STORE is "
                             f"{redact(self.cfg['STORE'])}); MongoDB samples are read as copies")
        self.views = bool(views)
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
        # an indexed read names its corrupt sample rather than substitute another
        got = view_sample(store, gen, i, [0, 1], self.timeout, skip=False) if self.views else None
        viewed = got is not None
        if not viewed:
            got = read_sample(store, gen, i, [0, 1], self.timeout, skip=False)
        out = tuple(to_output(a, name, self.output, self.cast)
                    for a, name in zip(got[3][:2], self.names))
        if viewed and self.output == "numpy":
            for x in out:  # numpy can say read-only; torch cannot (a write there faults)
                if not x.flags.owndata:
                    x.flags.writeable = False
        return out

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
