"""Parameters through the store (docs/params.md): a small versioned JSON
document a trainer sets and generators read."""
import json
import threading

from ._store import ProcessStore
from ._store_args import store_kwargs
from .config import get_config

#: the largest params document a store keeps, in bytes of its JSON text
MAX_PARAMS_BYTES = 64 * 1024
#: the deepest nesting of dicts and lists a params document may have
MAX_PARAMS_DEPTH = 64

_stores = {}
_stores_lock = threading.Lock()
_local = threading.local()


def encode(params):
    """The JSON text of params (bytes); TypeError when it is not a dict of
    JSON-serialisable values, ValueError naming the size past 64 KiB."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of JSON-serialisable values, got "
                        f"{type(params).__name__}")
    _check_depth(params)
    try:
        text = json.dumps(params, sort_keys=True, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise TypeError(f"params are not JSON-serialisable: {e}") from None
    data = text.encode()
    if len(data) > MAX_PARAMS_BYTES:
        raise ValueError(f"params document is {len(data)} bytes of JSON, more than the "
                         f"{MAX_PARAMS_BYTES} bytes a store keeps")
    return data


def _check_depth(params):
    """TypeError past MAX_PARAMS_DEPTH levels, before json.dumps would
    recurse into a RecursionError (a walk of its own: no recursion here)."""
    todo = [(params, 1)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, (dict, list, tuple)):
            if depth > MAX_PARAMS_DEPTH:
                raise TypeError(f"params are not JSON-serialisable: nested deeper than "
                                f"{MAX_PARAMS_DEPTH} levels of dicts and lists (or "
                                f"holding themselves)")
            todo.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict)
                                                 else value))


def _store(config_path, config):
    """This process's handle on the configured store, kept for later calls
    (a trainer may set params every step)."""
    cfg = get_config(config_path, config)
    key = repr(sorted(store_kwargs(cfg).items()))
    with _stores_lock:
        ps = _stores.get(key)
        if ps is None:
            ps = _stores[key] = ProcessStore(cfg)
    return ps.get()


def set_params(params, config_path=None, config=None):
    """Stores params (a dict of JSON-serialisable values, at most 64 KiB of
    JSON) as the store's new params document; returns its version (one more
    than the last; the first set gives 1). Concurrent setters each get their
    own version."""
    data = encode(params)
    return _store(config_path, config).params_set(data)


def get_params(config_path=None, config=None):
    """(version, params) of the store's current params document; (0, {})
    when none was ever set."""
    version, data = _store(config_path, config).params_get()
    return version, json.loads(data)


class GeneratorParams:
    """What a WireheadGenerator keeps of the params: the version and
    document its next sample is made under, refreshed only when the store's
    version word says it changed (docs/params.md)."""

    def __init__(self):
        self.version = 0
        self.params = {}

    def refresh(self, store):
        """Before each sample: catches up with the store and makes the
        result what current_params() returns in this thread and what the
        next put records."""
        v = store.params_version()
        if v != self.version:
            got, data = store.params_get()
            self.version, self.params = got, json.loads(data)
        self.refresh_local(store)

    def refresh_local(self, store):
        """What refresh does once the document is known."""
        store.set_put_params(self.version)
        _local.current = (self.version, self.params)


def current_params():
    """Inside a generator run by WireheadGenerator: the params document
    (a dict, do not change it) the sample being made is made under, and
    that its header records by version. RuntimeError elsewhere."""
    return _current()[1]


def current_params_version():
    """The version of current_params()."""
    return _current()[0]


def _current():
    cur = getattr(_local, "current", None)
    if cur is None:
        raise RuntimeError("current_params() is for a generator that WireheadGenerator runs "
                           "(it reads the params before each sample); a trainer reads them "
                           "with wirehead_torch.get_params(config)")
    return cur


def clear_current():
    _local.current = None


__all__ = ["MAX_PARAMS_BYTES", "set_params", "get_params", "current_params",
           "current_params_version"]
