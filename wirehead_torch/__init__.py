"""wirehead_torch: a bounded, always-fresh circular cache between synthetic-data
generators and PyTorch training, with a C core."""
import os as _os
import sys as _sys

# libmongoc initialises itself when the extension loads and would keep
# counters in /dev/shm/mongoc-<pid>, left behind by killed processes.
_os.environ.setdefault("MONGOC_DISABLE_SHM", "1")

if _os.environ.get("WIREHEAD_EXT_DIR"):
    # Test hook: load the extension from another build (the sanitizer build).
    import glob as _glob
    import importlib.util as _ilu
    _path = _glob.glob(_os.path.join(_os.environ["WIREHEAD_EXT_DIR"], "_C*.so"))[0]
    _spec = _ilu.spec_from_file_location(__name__ + "._C", _path)
    _mod = _ilu.module_from_spec(_spec)
    _sys.modules[__name__ + "._C"] = _mod
    _spec.loader.exec_module(_mod)

try:
    from . import _C  # noqa: E402,F401 (wirehead_torch._C, loaded above)
except ImportError as _e:
    # the usual cause: Python found a source checkout (the working directory)
    # before the installed package, and the checkout's extension is not built
    _here = _os.path.dirname(_os.path.abspath(__file__))
    raise ImportError(
        f"wirehead_torch's C extension (_C) is not in {_here}: this is a source checkout "
        "without a built extension, found before any installed copy (is the working "
        "directory the checkout?). Run from another directory to use the installed "
        "package, or build the checkout in place with `make build`.") from _e
from . import _guard  # noqa: E402
from ._C import (  # noqa: E402
    CorruptSampleError,
    CudaError,
    GenerationGoneError,
    InvalidSampleError,
    LeaseLostError,
    NotFoundError,
    PinLimitError,
    SampleTooLargeError,
    SchemaMismatchError,
    SpecFailedError,
    StoreNotCreatedError,
    StoreSpaceError,
    StoreTimeoutError,
    StoreUnavailableError,
    WireheadError,
)
from ._store import gen_label  # noqa: E402
from .admin import clean, status  # noqa: E402
from .config import Config, ConfigError, load_config  # noqa: E402
from .generator import WireheadGenerator  # noqa: E402
from .manager import WireheadManager  # noqa: E402
from .params import (  # noqa: E402
    MAX_PARAMS_BYTES,
    MAX_PARAMS_DEPTH,
    current_params,
    current_params_version,
    get_params,
    set_params,
)
from .relay import WireheadRelay  # noqa: E402
from .shards import ShardError, export_shards, from_shards, mix  # noqa: E402
from .spec import Spec, spec_seed  # noqa: E402

_guard.keep_in_front()  # faulthandler and signal.signal leave the SIGBUS guard in front

# The readers need torch (the map-style ones also run without it, with
# output="numpy"); generators, the manager and the CLI do not, so readers are
# imported on first use and `import wirehead_torch` never imports torch.
_LAZY = {"WireheadIterableDataset": ".iterable", "WireheadLoader": ".loader",
         "MongoheadDataset": ".dataset", "MongoTupleheadDataset": ".dataset",
         "to_device": ".cuda", "DataLoader": ".dataloader"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        try:
            mod = importlib.import_module(_LAZY[name], __name__)
        except ModuleNotFoundError as e:
            if e.name != "torch":
                raise
            raise ImportError(f"wirehead_torch.{name} needs PyTorch, which is not installed: "
                              f"pip install torch (or, in the wirehead_torch checkout, "
                              f"pip install '.[torch]')") from e
        value = getattr(mod, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))

__version__ = "0.1.0"

__all__ = [
    "WireheadGenerator", "WireheadManager", "WireheadRelay", "WireheadIterableDataset",
    "WireheadLoader",
    "MongoheadDataset", "MongoTupleheadDataset", "DataLoader", "to_device",
    "load_config", "Config", "ConfigError", "status", "clean", "gen_label", "WireheadError",
    "set_params", "get_params", "current_params", "current_params_version",
    "MAX_PARAMS_BYTES", "MAX_PARAMS_DEPTH",
    "InvalidSampleError",
    "SchemaMismatchError", "GenerationGoneError", "CorruptSampleError", "StoreSpaceError",
    "SampleTooLargeError", "StoreTimeoutError", "StoreUnavailableError", "NotFoundError",
    "StoreNotCreatedError",
    "LeaseLostError", "PinLimitError", "CudaError",
    "export_shards", "from_shards", "mix", "ShardError",
    "Spec", "spec_seed", "SpecFailedError",
]
