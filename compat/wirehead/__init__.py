"""The original wirehead's import paths, served by wirehead_torch:
``from wirehead import WireheadGenerator`` and ``from wirehead.dataset
import MongoheadDataset`` keep working with only the package installed
changed. This package is a distribution of its own, named ``wirehead``
like the original's, so pip replaces one with the other on install and
never leaves files of both (see compat/README.md)."""
from ._wirehead_torch import require

require()

from wirehead_torch import (  # noqa: E402,F401
    WireheadError,
    WireheadGenerator,
    WireheadManager,
    clean,
    load_config,
    status,
)
from wirehead_torch.apps.monitor import SwapLog, WireheadLogger, WireheadSnapshot  # noqa: E402,F401

_READERS = ("MongoheadDataset", "MongoTupleheadDataset", "WireheadIterableDataset",
            "WireheadLoader")


def __getattr__(name):
    # readers need torch: imported on first use, as in wirehead_torch
    if name in _READERS:
        import wirehead_torch
        return getattr(wirehead_torch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MongoheadDataset", "MongoTupleheadDataset", "WireheadGenerator", "WireheadManager",
           "SwapLog", "WireheadSnapshot", "WireheadLogger"]
