"""Configuration: the original wirehead ``config.yaml`` keys plus a few new ones.

Every key but ``SWAP_CAP`` and ``SAMPLE`` has a default (see ``DEFAULTS``).
"""
import math
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
    "BYTE_BUDGET": "auto",        # shm: bytes per generation area (4 areas); auto: sized
                                  # from the first sample when the first generator writes
    "SELF_SEAL": True,            # generators seal a full generation when no manager leads
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
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: {key} must be a finite byte count, got {value!r}")
    if isinstance(value, (int, float)):
        n = int(value)
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{where}: {key} must be 'auto' or a byte count like 268435456 or '256MiB', "
                             f"got {value!r}")
        f = float(m.group(1)) * _UNITS[m.group(2).lower()]
        n = int(f) if math.isfinite(f) else 0
    if not 0 < n <= _BYTES_MAX:
        raise ValueError(f"{where}: {key} must be in 1..{_BYTES_MAX} bytes, got {value!r}")
    return n


# Ranges the C side takes (wh_module.c): SWAP_CAP 1..2**30; byte counts fit
# in uint64 with headroom; timeouts below 1e6 s; names under WH_MAX_NAME.
_INT_RANGES = {"SWAP_CAP": (1, 1 << 30), "PORT": (1, 65535)}
# (least, most); all must be positive. CHUNKSIZE (MiB): a chunk document
# must fit MongoDB's 16 MiB limit, and tiny chunks make reads of millions.
_NUM_RANGES = {"LEASE_SECONDS": (0, 1e6), "READ_TIMEOUT": (0, 1e6),
               "CONNECT_TIMEOUT": (0, 1e6), "MANAGER_POLL": (0, 3600.0),
               "CHUNKSIZE": (1 / 2048, 15.0)}
_BYTES_MAX = 1 << 62
_NAME_MAX = 63
_NAME_KEYS = ("DBNAME", "WRITE_COLLECTION", "READ_COLLECTION", "COUNTER_COLLECTION",
              "TEMP_COLLECTION", "COLLECTION_PREFIX", "MONGOHOST")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _number(v, key, where, integer):
    """An int (or float) from a YAML value; quoted numbers are accepted as the
    original wirehead did."""
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
        raise ValueError(f"{where}: {key} must be {kind}, got {v!r}")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{where}: {key} must be a finite number, got {v!r}")
    return v


def _name(v, key, where, limit=_NAME_MAX):
    if not isinstance(v, str) or not v:
        raise ValueError(f"{where}: {key} must be a non-empty string, got {v!r}")
    if _CONTROL.search(v):
        raise ValueError(f"{where}: {key} contains a control character: {v!r}")
    if len(v.encode()) > limit:
        raise ValueError(f"{where}: {key} is longer than {limit} bytes: {v!r}")
    return v


def _check(cfg, where):
    for key in REQUIRED:
        if key not in cfg or cfg[key] is None:
            raise ValueError(f"{where}: required key {key} is missing")
    for key, (lo, hi) in _INT_RANGES.items():
        v = cfg[key] = _number(cfg[key], key, where, integer=True)
        if not lo <= v <= hi:
            raise ValueError(f"{where}: {key} must be in {lo}..{hi}, got {v!r}")
    for key, (lo, hi) in _NUM_RANGES.items():
        v = cfg[key] = _number(cfg[key], key, where, integer=False)
        if not (v > 0 and lo <= v <= hi):
            raise ValueError(f"{where}: {key} must be a positive number in {lo:g}..{hi:g}, "
                             f"got {v!r}")
    sample = cfg["SAMPLE"]
    if not isinstance(sample, (list, tuple)) or not sample:
        raise ValueError(f"{where}: SAMPLE must be a non-empty list of field names, "
                         f"got {sample!r}")
    for i, s in enumerate(sample):
        _name(s, f"SAMPLE[{i}]", where)
    if len(set(sample)) != len(sample):
        raise ValueError(f"{where}: SAMPLE names a field twice: {sample!r}")
    for key in _NAME_KEYS:
        if cfg.get(key) is not None:
            _name(cfg[key], key, where, limit=200)
    if cfg.get("STORE") is not None:
        _name(cfg["STORE"], "STORE", where, limit=4096)
    for key in ("VERIFY_READS", "SELF_SEAL"):
        if not isinstance(cfg[key], bool):
            raise ValueError(f"{where}: {key} must be true or false, got {cfg[key]!r}")


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
    # None: automatic (the C store sizes it from the first sample put)
    auto = cfg["BYTE_BUDGET"] is None or (isinstance(cfg["BYTE_BUDGET"], str)
                                         and cfg["BYTE_BUDGET"].strip().lower() == "auto")
    cfg["BYTE_BUDGET"] = None if auto else parse_bytes(cfg["BYTE_BUDGET"], "BYTE_BUDGET", where)
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


class _NoAliasLoader(yaml.SafeLoader):
    """Safe loading without anchors/aliases: a few hundred bytes of nested
    aliases ("billion laughs") would expand to gigabytes."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            ev = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"YAML alias *{ev.anchor} is not allowed in a config", ev.start_mark)
        return super().compose_node(parent, index)


_FILE_MAX = 1 << 20
DEFAULT_CONFIG_PATH = "config.yaml"


def load_config(path):
    """Reads a wirehead YAML config and returns the resolved mapping."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read(_FILE_MAX + 1)
    except OSError as e:
        raise ValueError(f"{path}: cannot read config: {e.strerror}") from None
    if len(data) > _FILE_MAX:
        raise ValueError(f"{path}: config is larger than {_FILE_MAX} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: config is not UTF-8 text ({e.reason} at byte "
                         f"{e.start})") from None
    try:
        raw = yaml.load(text, Loader=_NoAliasLoader)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    return resolve(raw if raw is not None else {}, where=path)


def get_config(config_path=None, config=None):
    """The resolved config from a path or a dict (at most one of them;
    neither: "config.yaml" in the working directory, as the original)."""
    if config_path is not None and config is not None:
        raise ValueError("give exactly one of config_path= or config=")
    if config_path is None and config is None:
        config_path = DEFAULT_CONFIG_PATH
    if config is not None:
        return resolve(config)
    return load_config(config_path)


def redact(uri):
    """The URI with any user:password@ removed, for logs and errors."""
    return re.sub(r"(?<=://)[^/@]*@", "***@", uri)


def store_kwargs(cfg, create=True):
    """Arguments for ``_C.Store`` and ``_C.clean`` from a resolved config
    (create=False: open only an existing store). BYTE_BUDGET auto is 0: the
    C store then lets only a put create an shm store, sized from its sample."""
    return dict(
        create=create,
        uri=cfg["STORE"],
        swap_cap=cfg["SWAP_CAP"],
        fields=cfg["SAMPLE"],
        byte_budget=cfg["BYTE_BUDGET"] or 0,
        chunk_bytes=int(float(cfg["CHUNKSIZE"]) * (1 << 20)),
        dbname=str(cfg["DBNAME"]),
        prefix=str(cfg["COLLECTION_PREFIX"]),
        lease_s=float(cfg["LEASE_SECONDS"]),
        connect_timeout_s=float(cfg["CONNECT_TIMEOUT"]),
        verify_reads=bool(cfg["VERIFY_READS"]),
    )
