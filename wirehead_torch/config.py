"""Configuration: the original wirehead ``config.yaml`` keys plus a few new ones.

Every key but ``SWAP_CAP`` and ``SAMPLE`` has a default (see ``DEFAULTS``).
``resolve`` checks every value once and returns a read-only ``Config``; the
rest of the package takes values from it as they are. The file is read and
parsed by _config_file, store URIs are shown through _redact, and what the
C store is given is made from a Config by _store_args.
"""
import dataclasses
import difflib
import math
import os
import re
import sys
import warnings
from collections.abc import Mapping
from typing import Optional

from . import _C, _uri
from ._config_file import load_yaml
from ._redact import redact, scrub


class ConfigError(ValueError):
    """A config value (or the config file) is not usable; the message names
    the key or environment variable, the file and the value."""


# Keys of the original wirehead, kept as they were.
ORIGINAL_KEYS = {
    "MONGOHOST", "PORT", "DBNAME", "SWAP_CAP", "SAMPLE", "CHUNKSIZE",
    "WRITE_COLLECTION", "READ_COLLECTION", "COUNTER_COLLECTION", "TEMP_COLLECTION",
}

DEFAULTS = {
    "MONGOHOST": None,
    "PORT": 27017,
    "DBNAME": "wirehead",
    "CHUNKSIZE": _C.CHUNK_BYTES_DEFAULT >> 20,  # MiB per chunk document (MongoDB store)
    "WRITE_COLLECTION": "write",  # original names; the prefix below replaces them
    "READ_COLLECTION": "read",
    "COUNTER_COLLECTION": "counters",
    "TEMP_COLLECTION": "temp",
    # new keys
    "STORE": None,                # the store's URI (docs/config.md); default derived below
    "COLLECTION_PREFIX": None,    # MongoDB collections' prefix: WRITE_COLLECTION or "wirehead"
    "BYTE_BUDGET": "auto",        # shm: bytes per generation area; auto: sized
                                  # from the first sample when the first generator writes
    "SELF_SEAL": True,            # generators seal a full generation when no manager leads
    "LEASE_SECONDS": _C.LEASE_SECONDS_DEFAULT,  # a dead manager is replaced within this time
    "READ_TIMEOUT": 120.0,        # readers wait this long for the first generation
    "CONNECT_TIMEOUT": _C.CONNECT_TIMEOUT_DEFAULT,  # MongoDB: bounded wait for the server
    "VERIFY_READS": True,         # check every field's XXH3 checksum on read
    "HANDOVER_CHECK": "slot",     # ring hand-over: the slot's seal (slot) or every row again (rows)
    "MANAGER_POLL": 0.01,         # seconds between seal checks
    "LOCAL_CACHE": None,          # MongoDB only: the node-local copy a relay fills and
                                  # readers read, a store or auto (docs/relay.md)
    # spec mode (docs/reproducible.md)
    "RUN_SEED": None,             # an int in 0..2**64-1: batches a function of the settings
    "REUSE": 1,                   # epochs a reader reads each generation (spec mode)
    "CLAIM_LEASE": 30.0,          # seconds a claimed index stays its generator's without news
    "SPEC_ATTEMPTS": 3,           # claims of one index before it fails for good
}

REQUIRED = ("SWAP_CAP", "SAMPLE")
KNOWN_KEYS = ORIGINAL_KEYS | set(DEFAULTS)
STORE_ENV = "WIREHEAD_STORE"

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1000 ** 2, "mib": 1 << 20, "g": 1 << 30, "gb": 1000 ** 3, "gib": 1 << 30,
          "t": 1 << 40, "tib": 1 << 40}

# The bounds the C side takes (the Store arguments) are C's: SWAP_CAP's
# range, timeouts below _C.SECONDS_MAX, a field name's length; byte counts
# fit in uint64 with headroom.
_INT_RANGES = {"SWAP_CAP": (_C.SWAP_CAP_MIN, _C.SWAP_CAP_MAX), "PORT": (1, 65535),
               "REUSE": (1, 1 << 31), "SPEC_ATTEMPTS": (1, 1 << 20)}
# (least, most); all must be positive. CHUNKSIZE (MiB): a chunk document
# must fit MongoDB's 16 MiB limit, and tiny chunks make reads of millions.
_NUM_RANGES = {"LEASE_SECONDS": (0, _C.SECONDS_MAX), "READ_TIMEOUT": (0, _C.SECONDS_MAX),
               "CONNECT_TIMEOUT": (0, _C.SECONDS_MAX), "MANAGER_POLL": (0, 3600.0),
               "CLAIM_LEASE": (0, _C.SECONDS_MAX),
               "CHUNKSIZE": (1 / 2048, 15.0)}
_BYTES_MAX = 1 << 62
_NAME_MAX = _C.FIELD_NAME_MAX  # a SAMPLE field name
_NAME_KEYS = ("DBNAME", "WRITE_COLLECTION", "READ_COLLECTION", "COUNTER_COLLECTION",
              "TEMP_COLLECTION", "COLLECTION_PREFIX", "MONGOHOST")
_STORE_MAX = 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# characters MongoDB refuses in a database name on Linux (its docs:
# "Restrictions on Database Names")
_MONGO_DB_BAD = '/\\. "$\0'


def parse_bytes(value, key="BYTE_BUDGET", where="config"):
    """``1048576``, ``"64MiB"``, ``"1.5GB"`` -> bytes (int)."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be a byte count, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {key} must be a finite byte count, got {value!r}")
    if isinstance(value, (int, float)):
        n = int(value)
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise ConfigError(f"{where}: {key} must be 'auto' or a byte count like 268435456 "
                              f"or '256MiB', got {value!r}")
        f = float(m.group(1)) * _UNITS[m.group(2).lower()]
        n = int(f) if math.isfinite(f) else 0
    if not 0 < n <= _BYTES_MAX:
        raise ConfigError(f"{where}: {key} must be in 1..{_BYTES_MAX} bytes, got {value!r}")
    return n


def _number(v, key, where, integer):
    """An int (or float) from a YAML value; quoted numbers are accepted as the
    original wirehead did."""
    got = v
    if isinstance(v, str):
        text = v.strip()
        try:
            v = int(text) if re.fullmatch(r"[+-]?[0-9]+", text) else (
                None if integer else float(text))
        except ValueError:
            v = None
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or (
            integer and not isinstance(v, int)):
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{where}: {key} must be {kind}, got {got!r}")
    if isinstance(v, float) and not math.isfinite(v):
        raise ConfigError(f"{where}: {key} must be a finite number, got {got!r}")
    return v


def _name(v, key, where, limit=_NAME_MAX):
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{where}: {key} must be a non-empty string, got {v!r}")
    if _CONTROL.search(v):
        raise ConfigError(f"{where}: {key} contains a control character: {v!r}")
    if len(v.encode()) > limit:
        raise ConfigError(f"{where}: {key} is longer than {limit} bytes: {v!r}")
    return v


def _store(v, key, where):
    """A STORE value (key names where it came from: STORE or WIREHEAD_STORE)."""
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{where}: {key} must be a non-empty string, got {v!r}")
    shown = redact(v)
    if _CONTROL.search(v):
        raise ConfigError(f"{where}: {key} contains a control character: {shown!r}")
    if len(v.encode()) > _STORE_MAX:
        raise ConfigError(f"{where}: {key} is longer than {_STORE_MAX} bytes: {shown[:80]!r}...")
    try:
        b = _uri.backend_of(v)
    except _C.InvalidSampleError as e:
        raise ConfigError(f"{where}: {key} {shown!r}: {scrub(str(e), v)}") from None
    try:
        _uri.check_name(b)
    except _C.InvalidSampleError as e:
        if b.name == "":
            raise ConfigError(f"{where}: {key} {v!r} names no store: write "
                              f"{_uri.shm_uri('NAME')} (the {e})") from None
        raise ConfigError(f"{where}: {key} {v!r}: the {e}") from None
    if b.backend == "mongodb":
        if v.endswith("://"):
            raise ConfigError(f"{where}: {key} {v!r} names no MongoDB host")
        rest = v.split("://", 1)[1].split("?", 1)[0]
        db = rest.split("/", 1)[1] if "/" in rest else ""
        bad = sorted(set(db) & set(_MONGO_DB_BAD))
        if bad or len(db.encode()) > 63:
            why = (f"may not contain {', '.join(repr(c) for c in bad)}" if bad
                   else "is longer than 63 bytes")
            raise ConfigError(f"{where}: {key} {shown!r}: the MongoDB database name {db!r} {why} "
                              f"(MongoDB refuses / \\ . \" $ and spaces in database names)")
    return v


def _is_auto(v):
    return v is None or (isinstance(v, str) and v.strip().lower() == "auto")


def _check_value(key, v, where):
    """One key's value, checked and converted (ConfigError otherwise)."""
    if key in _INT_RANGES:
        lo, hi = _INT_RANGES[key]
        v = _number(v, key, where, integer=True)
        if not lo <= v <= hi:
            raise ConfigError(f"{where}: {key} must be in {lo}..{hi}, got {v!r}")
        return v
    if key in _NUM_RANGES:
        lo, hi = _NUM_RANGES[key]
        v = _number(v, key, where, integer=False)
        if not (v > 0 and lo <= v <= hi):
            raise ConfigError(f"{where}: {key} must be a positive number in {lo:g}..{hi:g}, "
                              f"got {v!r}")
        return float(v)
    if key == "SAMPLE":
        if not isinstance(v, (list, tuple)) or not v:
            raise ConfigError(f"{where}: SAMPLE must be a non-empty list of field names, "
                              f"got {v!r}")
        for i, s in enumerate(v):
            _name(s, f"SAMPLE[{i}]", where)
        if len(set(v)) != len(v):
            raise ConfigError(f"{where}: SAMPLE names a field twice: {list(v)!r}")
        return tuple(v)
    if key == "BYTE_BUDGET":
        if _is_auto(v):
            return None
        n = parse_bytes(v, key, where)
        if n < _C.BYTE_BUDGET_MIN:  # the shm store's least area
            raise ConfigError(f"{where}: BYTE_BUDGET must be at least {_C.BYTE_BUDGET_MIN} "
                              f"bytes (or auto), got {v!r}")
        return n
    if key in ("VERIFY_READS", "SELF_SEAL"):
        if not isinstance(v, bool):
            raise ConfigError(f"{where}: {key} must be true or false, got {v!r}")
        return v
    if key == "HANDOVER_CHECK":
        if not isinstance(v, str) or v.strip().lower() not in ("slot", "rows"):
            raise ConfigError(f"{where}: HANDOVER_CHECK must be slot or rows, got {v!r}")
        return v.strip().lower()
    if key == "STORE":
        return None if v is None else _store(v, key, where)
    if key == "LOCAL_CACHE":
        return _local_cache(v, where)
    if key == "RUN_SEED":
        if v is None:
            return None
        v = _number(v, key, where, integer=True)
        if not 0 <= v < 1 << 64:
            raise ConfigError(f"{where}: RUN_SEED must be an integer in 0..2**64-1, got {v!r}")
        return v
    if key in _NAME_KEYS:
        return None if v is None else _name(v, key, where, limit=200)
    return v


def _local_cache(v, where):
    """A LOCAL_CACHE value: None (off), 'auto', or a store a relay fills."""
    if v is None or v is False:
        return None
    if isinstance(v, str) and v.strip().lower() == "auto":
        return "auto"
    if not isinstance(v, str):
        raise ConfigError(f"{where}: LOCAL_CACHE must be {_uri.shm_uri('NAME')} or auto (the "
                          f"node-local copy of the STORE), got {v!r}")
    v = _store(v, "LOCAL_CACHE", where)
    b = _uri.backend_of(v)
    if not b.relay_target:
        raise ConfigError(f"{where}: LOCAL_CACHE {redact(v)!r} is a {b.backend} store, which "
                          f"a relay cannot fill: write {_uri.shm_uri('NAME')} or auto (the "
                          f"node-local copy of the STORE)")
    return v


def check_value(key, value, where="config"):
    """``value`` for ``key`` as a resolved config holds it; ConfigError naming
    the key, where and the value when it is not usable (for callers that take
    one value from elsewhere, e.g. a command-line option)."""
    if key not in KNOWN_KEYS:
        raise ConfigError(f"{where}: {key} is not a config key")
    return _check_value(key, value, where)


@dataclasses.dataclass(frozen=True, eq=False)
class Config(Mapping):
    """A resolved, read-only config. Read it as a mapping of the config keys
    (``cfg["SWAP_CAP"]``, ``cfg.get``) or by attribute (``cfg.swap_cap``);
    ``replace(KEY=value)`` gives a new one, checked the same way.
    ``byte_budget`` None means auto; ``source`` is where it came from."""

    store: str
    swap_cap: int
    sample: tuple[str, ...]
    byte_budget: Optional[int]
    collection_prefix: str
    mongohost: Optional[str]
    port: int
    dbname: str
    chunksize: float
    write_collection: str
    read_collection: str
    counter_collection: str
    temp_collection: str
    self_seal: bool
    lease_seconds: float
    read_timeout: float
    connect_timeout: float
    verify_reads: bool
    manager_poll: float
    source: str = "config"
    local_cache: Optional[str] = None
    handover_check: str = "slot"
    run_seed: Optional[int] = None
    reuse: int = 1
    claim_lease: float = 30.0
    spec_attempts: int = 3

    def __getitem__(self, key):
        if not isinstance(key, str) or key not in KNOWN_KEYS:
            raise KeyError(key)
        return getattr(self, key.lower())

    def __iter__(self):
        return iter(sorted(KNOWN_KEYS))

    def __len__(self):
        return len(KNOWN_KEYS)

    def __eq__(self, other):
        return Mapping.__eq__(self, other)

    __hash__ = None

    def replace(self, **changes):
        """A new Config with these keys changed (by config key name)."""
        raw = dict(self)
        raw.update(changes)
        return resolve(raw, where=self.source)

    def __repr__(self):
        vals = ", ".join(f"{k}={(redact(v) if k == 'STORE' else v)!r}" for k, v in self.items())
        return f"Config({vals})"


def _unknown_key(key):
    """An unknown key, with the known key it is most like."""
    near = difflib.get_close_matches(key.upper(), sorted(KNOWN_KEYS), n=1, cutoff=0.6)
    return f"{key!r} (did you mean {near[0]!r}?)" if near else repr(key)


def _outside_package():
    """The stacklevel of the first caller outside this package, so that a
    warning names the user's line, not ours."""
    pkg = os.path.dirname(os.path.abspath(__file__)) + os.sep
    f, level = sys._getframe(1), 1
    while f is not None and f.f_code.co_filename.startswith(pkg):
        f, level = f.f_back, level + 1
    return level


def resolve(raw, where="config"):
    """Fills defaults, checks every value and resolves ``STORE``; returns a
    ``Config`` (a ``Config`` given is returned as it is)."""
    if isinstance(raw, Config):
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping of keys, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in KNOWN_KEYS)
    if unknown:
        warnings.warn(f"{where}: unknown config keys are ignored: "
                      f"{', '.join(_unknown_key(k) for k in unknown)}",
                      stacklevel=_outside_package())
    merged = dict(DEFAULTS)
    merged.update((k, v) for k, v in raw.items() if k in KNOWN_KEYS)
    for key in REQUIRED:
        if merged.get(key) is None:
            raise ConfigError(f"{where}: required key {key} is missing")
    # sorted: with several bad keys, the same one is named on every run
    vals = {k: _check_value(k, merged[k], where) for k in sorted(KNOWN_KEYS)}
    env = os.environ.get(STORE_ENV)
    if env:
        store = _store(env, STORE_ENV, f"environment (overrides STORE of {where})")
    elif vals["STORE"]:
        store = vals["STORE"]
    else:
        if vals["MONGOHOST"]:
            store = _uri.mongodb_uri(vals["MONGOHOST"], vals["PORT"], vals["DBNAME"])
        else:
            store = _uri.shm_uri(vals["DBNAME"])
        store = _store(store, "STORE (made from MONGOHOST/PORT/DBNAME)", where)
    vals["STORE"] = store
    if vals["LOCAL_CACHE"]:
        b = _uri.backend_of(store)
        if not b.relay_source:
            raise ConfigError(f"{where}: LOCAL_CACHE is the node-local copy a relay makes of "
                              f"the STORE; STORE is {redact(store)!r}, a {b.backend} store, "
                              f"which no relay copies from: remove LOCAL_CACHE")
    if vals["RUN_SEED"] is None:
        spec_only = [k for k in ("REUSE", "CLAIM_LEASE", "SPEC_ATTEMPTS")
                     if raw.get(k) is not None and vals[k] != DEFAULTS[k]]
        if spec_only:
            raise ConfigError(f"{where}: {', '.join(spec_only)} applies in spec mode only: "
                              f"set RUN_SEED (docs/reproducible.md), or remove it")
    elif vals["LOCAL_CACHE"]:
        raise ConfigError(f"{where}: LOCAL_CACHE with RUN_SEED: a relay does not copy spec "
                          f"generations yet; read the MongoDB store directly (remove "
                          f"LOCAL_CACHE) or run without RUN_SEED")
    if not vals["COLLECTION_PREFIX"]:
        prefix = raw.get("WRITE_COLLECTION") or "wirehead"
        vals["COLLECTION_PREFIX"] = _name(prefix, "COLLECTION_PREFIX", where, limit=200)
    return Config(source=str(where), **{k.lower(): v for k, v in vals.items()})


DEFAULT_CONFIG_PATH = "config.yaml"


def load_config(path):
    """Reads a wirehead YAML config and returns the resolved ``Config``."""
    return resolve(_load_raw(path), where=os.fspath(path))


def _load_raw(path):
    """The mapping a config file holds, unchecked (ConfigError if the file
    cannot be read or parsed)."""
    if isinstance(path, Mapping):
        raise ConfigError("config_path= takes a file path; for a mapping use config=")
    raw = load_yaml(os.fspath(path), ConfigError)
    return raw if raw is not None else {}


def get_config(config_path=None, config=None):
    """The resolved config from a path or a mapping (at most one of them;
    neither: "config.yaml" in the working directory, as the original)."""
    if config_path is not None and config is not None:
        raise ConfigError("give exactly one of config_path= or config=")
    if isinstance(config, (str, bytes, os.PathLike)):
        raise ConfigError(f"config= takes a mapping; for a file use config_path= "
                          f"(got {config!r})")
    if config_path is None and config is None:
        config_path = DEFAULT_CONFIG_PATH
    if config is not None:
        return resolve(config, where="config=")
    return load_config(config_path)


# The keys that say which store a config names; the rest only say how to use it.
STORE_KEYS = ("STORE", "MONGOHOST", "PORT", "DBNAME", "COLLECTION_PREFIX", "WRITE_COLLECTION",
              "CONNECT_TIMEOUT", "LOCAL_CACHE")


def get_store_config(config_path=None, config=None):
    """``(config, error)``: the resolved config, or, when a key that does not
    name the store is unusable, a config naming the same store (the other
    keys at stand-in values) and that ConfigError, so that a broken key never
    keeps an operator from removing or inspecting the store it names."""
    try:
        return get_config(config_path, config), None
    except ConfigError as e:
        if config is None:
            try:
                raw = _load_raw(DEFAULT_CONFIG_PATH if config_path is None else config_path)
            except ConfigError:
                raise e from None
        else:
            raw = config
        if not isinstance(raw, Mapping):
            raise
        where = str(config_path or DEFAULT_CONFIG_PATH) if config is None else "config="
        ident = {k: raw[k] for k in STORE_KEYS if k in raw}
        try:
            cfg = resolve({**ident, "SWAP_CAP": 1, "SAMPLE": ["_"]}, where=where)
        except ConfigError:
            raise e from None
        return cfg, e
