"""The original wirehead's import paths, served by wirehead_torch (the way
Pillow provides ``PIL``): ``from wirehead import WireheadGenerator`` and
``from wirehead.dataset import MongoheadDataset`` keep working with only
the package installed changed. See README "Coming from wirehead"."""
from wirehead_torch import (  # noqa: F401
    WireheadError,
    WireheadGenerator,
    WireheadManager,
    clean,
    load_config,
    status,
)
from wirehead_torch.monitor import SwapLog, WireheadLogger, WireheadSnapshot  # noqa: F401

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
