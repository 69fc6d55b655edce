"""Configuration: the original wirehead ``config.yaml`` keys plus a few new ones.

Every key but ``SWAP_CAP`` and ``SAMPLE`` has a default (see ``DEFAULTS``).
``resolve`` checks every value once and returns a read-only ``Config``; the
rest of the package takes values from it as they are.
"""
import contextlib
import dataclasses
import difflib
import hashlib
import math
import os
import re
import socket
import stat
import sys
import warnings
from collections.abc import Mapping
from typing import Optional
from urllib.parse import unquote

import yaml

from . import _C


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
    "CHUNKSIZE": 4,               # MiB per chunk document (MongoDB store)
    "WRITE_COLLECTION": "write",  # original names; the prefix below replaces them
    "READ_COLLECTION": "read",
    "COUNTER_COLLECTION": "counters",
    "TEMP_COLLECTION": "temp",
    # new keys
    "STORE": None,                # shm://NAME or mongodb://...; default derived below
    "COLLECTION_PREFIX": None,    # MongoDB collections' prefix: WRITE_COLLECTION or "wirehead"
    "BYTE_BUDGET": "auto",        # shm: bytes per generation area (4 areas); auto: sized
                                  # from the first sample when the first generator writes
    "SELF_SEAL": True,            # generators seal a full generation when no manager leads
    "LEASE_SECONDS": 10.0,        # a dead manager is replaced within this time
    "READ_TIMEOUT": 120.0,        # readers wait this long for the first generation
    "CONNECT_TIMEOUT": 10.0,      # MongoDB: bounded wait for the server
    "VERIFY_READS": True,         # check every field's XXH3 checksum on read
    "HANDOVER_CHECK": "slot",     # ring hand-over: the slot's seal (slot) or every row again (rows)
    "MANAGER_POLL": 0.01,         # seconds between seal checks
    "LOCAL_CACHE": None,          # mongodb:// only: shm://NAME or auto, the node-local
                                  # copy a relay fills and readers read (docs/relay.md)
}

REQUIRED = ("SWAP_CAP", "SAMPLE")
KNOWN_KEYS = ORIGINAL_KEYS | set(DEFAULTS)
STORE_ENV = "WIREHEAD_STORE"

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1000 ** 2, "mib": 1 << 20, "g": 1 << 30, "gb": 1000 ** 3, "gib": 1 << 30,
          "t": 1 << 40, "tib": 1 << 40}

# The bounds the C side takes (the Store arguments): SWAP_CAP's range is the
# C one (wh.h); byte counts fit in uint64 with headroom; timeouts below 1e6 s.
_INT_RANGES = {"SWAP_CAP": (_C.SWAP_CAP_MIN, _C.SWAP_CAP_MAX), "PORT": (1, 65535)}
# (least, most); all must be positive. CHUNKSIZE (MiB): a chunk document
# must fit MongoDB's 16 MiB limit, and tiny chunks make reads of millions.
_NUM_RANGES = {"LEASE_SECONDS": (0, 1e6), "READ_TIMEOUT": (0, 1e6),
               "CONNECT_TIMEOUT": (0, 1e6), "MANAGER_POLL": (0, 3600.0),
               "CHUNKSIZE": (1 / 2048, 15.0)}
_BYTES_MAX = 1 << 62
_NAME_MAX = 63          # a SAMPLE field name (the C side keeps 64 bytes with the NUL)
_NAME_KEYS = ("DBNAME", "WRITE_COLLECTION", "READ_COLLECTION", "COUNTER_COLLECTION",
              "TEMP_COLLECTION", "COLLECTION_PREFIX", "MONGOHOST")
_STORE_MAX = 4096
_SHM_NAME_MAX = 200     # the shm store's own rule: 1..200 of [A-Za-z0-9._-]
_SHM_NAME = re.compile(r"[A-Za-z0-9._-]+")
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
    if v.startswith("shm://"):
        name = v[len("shm://"):]
        if not name:
            raise ConfigError(f"{where}: {key} {v!r} names no store: write shm://NAME "
                              f"(1..{_SHM_NAME_MAX} ASCII letters, digits, '-', '_', '.')")
        if len(name) > _SHM_NAME_MAX or not _SHM_NAME.fullmatch(name):
            raise ConfigError(f"{where}: {key} {v!r}: the shm store name {name!r} must be "
                              f"1..{_SHM_NAME_MAX} ASCII letters, digits, '-', '_', '.'")
        return v
    if v.startswith("mongodb://") or v.startswith("mongodb+srv://"):
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
    raise ConfigError(f"{where}: {key} must start with shm:// or mongodb://, got {shown!r}")


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
    if key in _NAME_KEYS:
        return None if v is None else _name(v, key, where, limit=200)
    return v


def _local_cache(v, where):
    """A LOCAL_CACHE value: None (off), 'auto', or an shm:// store."""
    if v is None or v is False:
        return None
    if isinstance(v, str) and v.strip().lower() == "auto":
        return "auto"
    if not isinstance(v, str) or not v.startswith("shm://"):
        raise ConfigError(f"{where}: LOCAL_CACHE must be shm://NAME or auto (the node-local "
                          f"copy of a mongodb:// STORE), got {v!r}")
    return _store(v, "LOCAL_CACHE", where)


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
            store = f"mongodb://{vals['MONGOHOST']}:{vals['PORT']}/{vals['DBNAME']}"
        else:
            store = f"shm://{vals['DBNAME']}"
        store = _store(store, "STORE (made from MONGOHOST/PORT/DBNAME)", where)
    vals["STORE"] = store
    if vals["LOCAL_CACHE"] and not store.startswith("mongodb://"):
        raise ConfigError(f"{where}: LOCAL_CACHE is the node-local copy of a mongodb:// STORE; "
                          f"STORE is {redact(store)!r}: remove LOCAL_CACHE or use a MongoDB "
                          f"store")
    if not vals["COLLECTION_PREFIX"]:
        prefix = raw.get("WRITE_COLLECTION") or "wirehead"
        vals["COLLECTION_PREFIX"] = _name(prefix, "COLLECTION_PREFIX", where, limit=200)
    return Config(source=str(where), **{k.lower(): v for k, v in vals.items()})


class _ConfigYAMLError(yaml.YAMLError):
    """A config-specific YAML problem, reported as it is (with the file)."""


class _ConfigLoader(yaml.SafeLoader):
    """Safe loading without anchors/aliases (a few hundred bytes of nested
    aliases, "billion laughs", would expand to gigabytes), with a bounded
    nesting depth (deep nesting would exhaust the recursion limit) and no
    key given twice in one mapping."""

    MAX_DEPTH = 32

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            ev = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"YAML alias *{ev.anchor} is not allowed in a config", ev.start_mark)
        self._depth += 1
        try:
            if self._depth > self.MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise _ConfigYAMLError(f"nested deeper than {self.MAX_DEPTH} levels "
                                       f"(at line {line})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        first = {}
        for key_node, _value in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":
                continue
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            try:
                if key in first:
                    raise _ConfigYAMLError(f"key {key!r} appears twice (lines {first[key]} "
                                           f"and {line})")
                first[key] = line
            except TypeError:
                continue  # an unhashable key: the constructor reports it
        return super().construct_mapping(node, deep)


_FILE_MAX = 1 << 20
DEFAULT_CONFIG_PATH = "config.yaml"
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def _read_config_file(path):
    """The file's bytes, at most _FILE_MAX. Never blocks: the open does not
    wait for a FIFO's writer, and anything but a regular file is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
            raise ConfigError(f"{path}: a config must be a regular file, this is {kind}")
        if st.st_size > _FILE_MAX:
            raise ConfigError(f"{path}: config is larger than {_FILE_MAX} bytes")
        chunks, n = [], 0
        while n <= _FILE_MAX:
            b = os.read(fd, _FILE_MAX + 1 - n)
            if not b:
                break
            chunks.append(b)
            n += len(b)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config: {e.strerror}") from None
    finally:
        os.close(fd)
    if n > _FILE_MAX:  # grew while read
        raise ConfigError(f"{path}: config is larger than {_FILE_MAX} bytes")
    return b"".join(chunks)


def load_config(path):
    """Reads a wirehead YAML config and returns the resolved ``Config``."""
    return resolve(_load_raw(path), where=os.fspath(path))


def _load_raw(path):
    """The mapping a config file holds, unchecked (ConfigError if the file
    cannot be read or parsed)."""
    if isinstance(path, Mapping):
        raise ConfigError("config_path= takes a file path; for a mapping use config=")
    path = os.fspath(path)
    data = _read_config_file(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: config is not UTF-8 text ({e.reason} at byte "
                          f"{e.start})") from None
    try:
        raw = yaml.load(text, Loader=_ConfigLoader)
    except _ConfigYAMLError as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: config is nested too deeply") from None
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


# ---- redaction: a store URI shown anywhere (logs, status, errors) ----

# URI options that carry a secret (compared lower-case), and the words that
# mark an option name as one whatever the driver calls it.
_SECRET_OPTIONS = {
    "password", "authmechanismproperties", "tlscertificatekeyfilepassword",
    "tlscertificatekeyfile", "sslclientcertificatekeypassword", "sslclientcertificatekeyfile",
    "sslpemkeypassword", "sslpemkeyfile", "proxypassword", "proxyusername",
}
_SECRET_WORDS = re.compile(r"pass|secret|token|credential|key", re.I)
_HIDDEN = "***"


def _secret_option(name):
    n = unquote(name).lower()
    return n in _SECRET_OPTIONS or bool(_SECRET_WORDS.search(n))


def _parse_uri(uri):
    """(scheme, userinfo or None, hosts/path, [(sep, name, value or None)])
    of scheme://[userinfo@]hosts[/db][?options], or None without a scheme.
    Userinfo is taken up to the last '@' before the options (up to the last
    '@' anywhere when a '?' comes before any '/', i.e. an unescaped '?' in the
    password): hiding too much beats showing a password."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return None
    q = rest.find("?")
    head = rest if q < 0 else rest[:q]
    userinfo = None
    at = head.rfind("@")
    if at < 0 and q >= 0 and "/" not in head and "@" in rest:
        at = rest.rfind("@")
    if at >= 0:
        userinfo, rest = rest[:at], rest[at + 1:]
    q = rest.find("?")
    hosts, query = (rest, None) if q < 0 else (rest[:q], rest[q + 1:])
    opts = []
    if query is not None:
        parts = re.split(r"([&;])", query)
        seps = [""] + parts[1::2]
        for s, item in zip(seps, parts[0::2]):
            name, eq, value = item.partition("=")
            opts.append((s, name, value if eq else None))
    return scheme, userinfo, hosts, opts


def _hide_option(name, value):
    if value is None or not _secret_option(name):
        return value
    if unquote(name).lower() == "authmechanismproperties":
        # PROPERTY:value,...: keep the property names, hide every value
        props = []
        for p in unquote(value).split(","):
            pname, colon, _v = p.partition(":")
            props.append(f"{pname}:{_HIDDEN}" if colon else _HIDDEN)
        return ",".join(props)
    return _HIDDEN


def redact(uri):
    """The store URI with its secrets hidden, for logs, status and errors:
    the userinfo (``user:password@``) and the value of every URI option that
    carries a password, token or key (``authMechanismProperties`` keeps its
    property names). Option names are compared case-insensitively. Anything
    that is not a URI is returned as it is."""
    if not isinstance(uri, str):
        return uri
    parsed = _parse_uri(uri)
    if parsed is None:
        return uri
    scheme, userinfo, hosts, opts = parsed
    out = f"{scheme}://" + (f"{_HIDDEN}@" if userinfo is not None else "") + hosts
    if opts:
        out += "?" + "".join(s + name + ("" if v is None else "=" + _hide_option(name, v))
                             for s, name, v in opts)
    return out


def _secrets(uri):
    """Every secret string in uri, as written and percent-decoded."""
    parsed = _parse_uri(uri) if isinstance(uri, str) else None
    if parsed is None:
        return []
    _scheme, userinfo, _hosts, opts = parsed
    found = []
    if userinfo is not None:
        user, _c, password = userinfo.partition(":")
        found += [userinfo, user, password]
    for _s, name, value in opts:
        if value is None or not _secret_option(name):
            continue
        found.append(value)
        for p in unquote(value).split(","):
            found += [p, p.partition(":")[2]]
    out = set()
    for s in found:
        out.update((s, unquote(s)))
    # short strings would blank out ordinary words of a message
    return sorted((s for s in out if len(s) >= 3), key=len, reverse=True)


def scrub(text, uri):
    """text with uri shown redacted and every secret of uri hidden (for
    messages that may quote the URI or one of its values)."""
    if not isinstance(text, str) or not isinstance(uri, str):
        return text
    text = text.replace(uri, redact(uri))
    for s in _secrets(uri):
        text = text.replace(s, _HIDDEN)
    return text


@contextlib.contextmanager
def secrets_hidden(uri):
    """Re-raises an exception whose message holds a secret of uri as the
    same exception class with the secret hidden (and no chained original)."""
    try:
        yield
    except Exception as e:
        msg = str(e)
        clean = scrub(msg, uri)
        if clean == msg:
            raise
        try:
            new = type(e)(clean)
        except Exception:
            new = None
        if new is None:
            raise RuntimeError(clean) from None
        raise new from None


# ---- what the C store is given ----

def node_name():
    """This node's identity for LOCAL_CACHE auto: SLURM's node name when set
    (several "nodes" of one host then keep apart), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def local_cache_uri(cfg):
    """The shm:// store readers read on this node (None without
    LOCAL_CACHE). auto: a name made from the store, its database and
    collection prefix, and this node, so configs of other stores or nodes
    never share one."""
    cfg = resolve(cfg)
    if not cfg.local_cache:
        return None
    if cfg.local_cache != "auto":
        return cfg.local_cache
    node = node_name()
    key = "\0".join((cfg.store, cfg.dbname, cfg.collection_prefix, node))
    tag = hashlib.sha256(key.encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", node)[:80]
    return f"shm://relay-{safe}-{tag}"


def database(cfg):
    """The name of the database a store opens: for MongoDB the one named in
    the URI, else DBNAME (as the C store picks it); for shm://NAME, NAME."""
    cfg = resolve(cfg)
    scheme, _userinfo, hosts, _opts = _parse_uri(cfg.store)
    if scheme == "shm":
        return hosts
    return unquote(hosts.partition("/")[2]) or cfg.dbname or "wirehead"


def local_origin(cfg):
    """(id, name) of the store a LOCAL_CACHE copy mirrors, as the copy
    records it: id a digest of what names that store (scheme, hosts,
    database, collection prefix), name the same in words for messages and
    status. Neither holds the URI's credentials or options."""
    cfg = resolve(cfg)
    scheme, _userinfo, hosts, _opts = _parse_uri(cfg.store)
    hosts = hosts.partition("/")[0]  # the credentials went with the userinfo
    db = database(cfg)
    key = "\0".join((scheme, ",".join(sorted(h.lower() for h in hosts.split(","))), db,
                     cfg.collection_prefix))
    name = f"{scheme}://{hosts}/{db} (prefix {cfg.collection_prefix})"
    name = name.encode("ascii", "backslashreplace").decode()  # the store keeps ASCII
    if len(name) > 150:
        name = name[:147] + "..."
    return hashlib.sha256(key.encode()).hexdigest()[:32], name


def budget_arg(byte_budget):
    """A config's BYTE_BUDGET (None: auto) as the C store takes it."""
    return _C.BYTE_BUDGET_AUTO if byte_budget is None else int(byte_budget)


def store_kwargs(cfg, create=True, local=False):
    """Arguments for ``_C.Store`` and ``_C.clean`` from a resolved config
    (create=False: open only an existing store). BYTE_BUDGET auto is
    _C.BYTE_BUDGET_AUTO (0): the
    C store then lets only a put create an shm store, sized from its sample.
    local=True: a reader's store, the node-local copy when LOCAL_CACHE is
    set (only its relay creates it, recording its source: a copy of another
    source, or a plain store, is refused). Without local, an shm store that
    is a copy is refused: only its relay writes it."""
    cfg = resolve(cfg)
    uri = local_cache_uri(cfg) if local else None
    if uri:
        kw = dict(create=create, uri=uri, swap_cap=cfg.swap_cap, fields=list(cfg.sample),
                  byte_budget=_C.BYTE_BUDGET_AUTO, chunk_bytes=int(cfg.chunksize * (1 << 20)),
                  dbname=cfg.dbname, prefix=cfg.collection_prefix, lease_s=cfg.lease_seconds,
                  connect_timeout_s=cfg.connect_timeout, verify_reads=cfg.verify_reads)
        kw["origin_id"], kw["origin_name"] = local_origin(cfg)
        return kw
    return dict(
        create=create,
        uri=cfg.store,
        swap_cap=cfg.swap_cap,
        fields=list(cfg.sample),
        byte_budget=budget_arg(cfg.byte_budget),
        chunk_bytes=int(cfg.chunksize * (1 << 20)),
        dbname=cfg.dbname,
        prefix=cfg.collection_prefix,
        lease_s=cfg.lease_seconds,
        connect_timeout_s=cfg.connect_timeout,
        verify_reads=cfg.verify_reads,
    )


# The shm segment's layout (the C store's, see ext/shm/wh_shm.c): a header page
# run, then an index of SWAP_CAP entries per generation area, then the areas.
_SHM_AREAS = 4
_SHM_PAGE = 4096
_SHM_ENTRY_BYTES = 16       # one index entry: offset and size


def _page_up(n):
    return (n + _SHM_PAGE - 1) // _SHM_PAGE * _SHM_PAGE


def shm_reserve_bytes(cfg, byte_budget=None):
    """Bytes of /dev/shm an shm:// store of this config reserves::

        HEADER + page(SWAP_CAP * 4 * 16) + 4 * page(BYTE_BUDGET)

    4 generation areas of BYTE_BUDGET each, an index of 16 bytes per sample
    and area, and the segment header (HEADER, 48 KiB in this version); page() rounds up to
    4096 bytes. So BYTE_BUDGET 2GB reserves a little over 8 GB.

    byte_budget overrides the config's; with BYTE_BUDGET auto and none given
    the size is not known until the first put sizes the store: None. A
    MongoDB store reserves no /dev/shm: 0."""
    cfg = resolve(cfg)
    if not cfg.store.startswith("shm://"):
        return 0
    budget = cfg.byte_budget if byte_budget is None else int(byte_budget)
    if budget is None:
        return None
    from . import _C  # the header's size is the C store's, not a copy of it
    header = _page_up(_C.shm_layout()["hdr_size"])
    return (header + _page_up(cfg.swap_cap * _SHM_AREAS * _SHM_ENTRY_BYTES)
            + _SHM_AREAS * _page_up(budget))
