"""Configuration: the original wirehead ``config.yaml`` keys plus a few new ones.

Every key but ``SWAP_CAP`` and ``SAMPLE`` has a default (see ``DEFAULTS``).
"""
import os
import re
import warnings

import yaml

# Keys of the original wirehead, kept as they were.
ORIGINAL_KEYS = {
    "MONGOHOST", "PORT", "DBNAME", "SWAP_CAP", "SAMPLE", "CHUNKSIZE",
    "WRITE_COLLECTION", "READ_COLLECTION", "COUNTER_COLLECTION", "TEMP_COLLECTION",
}

DEFAULTS = {
    "MONGOHOST": None,
    "PORT": 27017,
    "DBNAME": "wirehead",
    "CHUNKSIZE": 4,               # MiB per chunk document (MongoDB store)
    "WRITE_COLLECTION": "write",  # original names; the prefix below replaces them
    "READ_COLLECTION": "read",
    "COUNTER_COLLECTION": "counters",
    "TEMP_COLLECTION": "temp",
    # new keys
    "STORE": None,                # shm://NAME or mongodb://...; default derived below
    "COLLECTION_PREFIX": None,    # MongoDB collection prefix; default WRITE_COLLECTION or "wirehead"
    "BYTE_BUDGET": "256MiB",      # shm: bytes for one generation (3 are reserved up front)
    "LEASE_SECONDS": 10.0,        # a dead manager is replaced within this time
    "READ_TIMEOUT": 120.0,        # readers wait this long for the first generation
    "CONNECT_TIMEOUT": 10.0,      # MongoDB: bounded wait for the server
    "VERIFY_READS": True,         # check every field's XXH3 checksum on read
    "MANAGER_POLL": 0.01,         # seconds between seal checks
}

REQUIRED = ("SWAP_CAP", "SAMPLE")
KNOWN_KEYS = ORIGINAL_KEYS | set(DEFAULTS)

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1000 ** 2, "mib": 1 << 20, "g": 1 << 30, "gb": 1000 ** 3, "gib": 1 << 30,
          "t": 1 << 40, "tib": 1 << 40}


def parse_bytes(value, key="BYTE_BUDGET", where="config"):
    """``1048576``, ``"64MiB"``, ``"1.5GB"`` -> bytes (int)."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: {key} must be a byte count, got {value!r}")
    if isinstance(value, (int, float)):
        n = int(value)
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{where}: {key} must be a byte count like 268435456 or '256MiB', "
                             f"got {value!r}")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError(f"{where}: {key} must be positive, got {value!r}")
    return n


def _check(cfg, where):
    for key in REQUIRED:
        if key not in cfg or cfg[key] is None:
            raise ValueError(f"{where}: required key {key} is missing")
    cap = cfg["SWAP_CAP"]
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"{where}: SWAP_CAP must be a positive integer, got {cap!r}")
    sample = cfg["SAMPLE"]
    if (not isinstance(sample, (list, tuple)) or not sample
            or not all(isinstance(s, str) and s for s in sample)):
        raise ValueError(f"{where}: SAMPLE must be a non-empty list of field names, "
                         f"got {sample!r}")
    if len(set(sample)) != len(sample):
        raise ValueError(f"{where}: SAMPLE names a field twice: {sample!r}")
    if not isinstance(cfg["VERIFY_READS"], bool):
        raise ValueError(f"{where}: VERIFY_READS must be true or false, got "
                         f"{cfg['VERIFY_READS']!r}")
    for key in ("LEASE_SECONDS", "READ_TIMEOUT", "CONNECT_TIMEOUT", "MANAGER_POLL", "PORT",
                "CHUNKSIZE"):
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ValueError(f"{where}: {key} must be a positive number, got {v!r}")


def resolve(raw, where="config"):
    """Fills defaults, checks types and resolves ``STORE``. Returns a new dict."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping of keys, got {type(raw).__name__}")
    unknown = sorted(k for k in raw if k not in KNOWN_KEYS)
    if unknown:
        warnings.warn(f"{where}: unknown config keys {unknown} are ignored", stacklevel=3)
    cfg = dict(DEFAULTS)
    cfg.update(raw)
    _check(cfg, where)
    cfg["SAMPLE"] = list(cfg["SAMPLE"])
    cfg["BYTE_BUDGET"] = parse_bytes(cfg["BYTE_BUDGET"], "BYTE_BUDGET", where)
    store = os.environ.get("WIREHEAD_STORE") or cfg.get("STORE")
    if not store:
        if cfg.get("MONGOHOST"):
            store = f"mongodb://{cfg['MONGOHOST']}:{int(cfg['PORT'])}/{cfg['DBNAME']}"
        else:
            store = f"shm://{cfg['DBNAME']}"
    if not (store.startswith("shm://") or store.startswith("mongodb://")
            or store.startswith("mongodb+srv://")):
        raise ValueError(f"{where}: STORE must start with shm:// or mongodb://, got "
                         f"{redact(store)!r}")
    cfg["STORE"] = store
    if not cfg.get("COLLECTION_PREFIX"):
        cfg["COLLECTION_PREFIX"] = raw.get("WRITE_COLLECTION") or "wirehead"
    return cfg


def load_config(path):
    """Reads a wirehead YAML config and returns the resolved mapping."""
    path = os.fspath(path)
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"{path}: cannot read config: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    return resolve(raw if raw is not None else {}, where=path)


def get_config(config_path=None, config=None):
    """The resolved config from a path or a dict (exactly one of them)."""
    if (config_path is None) == (config is None):
        raise ValueError("give exactly one of config_path= or config=")
    if config is not None:
        return resolve(config)
    return load_config(config_path)


def redact(uri):
    """The URI with any user:password@ removed, for logs and errors."""
    return re.sub(r"(?<=://)[^/@]*@", "***@", uri)


def store_kwargs(cfg, create=True):
    """Arguments for ``_C.Store`` and ``_C.clean`` from a resolved config
    (create=False: open only an existing store)."""
    return dict(
        create=create,
        uri=cfg["STORE"],
        swap_cap=cfg["SWAP_CAP"],
        fields=cfg["SAMPLE"],
        byte_budget=cfg["BYTE_BUDGET"],
        chunk_bytes=int(float(cfg["CHUNKSIZE"]) * (1 << 20)),
        dbname=str(cfg["DBNAME"]),
        prefix=str(cfg["COLLECTION_PREFIX"]),
        lease_s=float(cfg["LEASE_SECONDS"]),
        connect_timeout_s=float(cfg["CONNECT_TIMEOUT"]),
        verify_reads=bool(cfg["VERIFY_READS"]),
    )
