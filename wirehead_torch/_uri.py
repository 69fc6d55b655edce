"""Store URIs: the one module of the package that spells a scheme
(``shm://``, ``mongodb://``, ``mongodb+srv://``) or a file name under
/dev/shm. Everything else asks it.

What a store can do (views, pins, a mappable segment, a params file, being
the source or the target of a relay) is what the C backend table says of
its scheme (``backend_of``), never a guess from the scheme's spelling.

Until the C side exports the table (``_C.backend_of``,
``_C.shm_check_name``, ``_C.shm_files``, ``_C.SHM_DIR``,
``_C.RING_PREFIX``), the block marked below stands in for it, with the same
names, fields and messages; it is the only code that would call them."""
import re
from typing import NamedTuple, Optional

from . import _C

# ---- stand-in for the C exports (removed when _C has them) ----------------


class Backend(NamedTuple):
    """What the backend table says of a store URI (``_C.Backend``)."""
    scheme: str  # "shm", "mongodb", "mongodb+srv"
    backend: str  # "shm" or "mongodb"
    views: bool  # tensors over the store's own memory
    pins: bool  # readers pin the generation area they view
    mappable: bool  # one segment file, mapped by every process
    params_file: bool  # the params live in a side file beside the store
    relay_source: bool  # a relay copies its generations into a node-local copy
    relay_target: bool  # a relay fills it: it can be a LOCAL_CACHE
    name: Optional[str]  # shm: the store's NAME; None where the backend names none


class ShmFiles(NamedTuple):
    """The /dev/shm files the package makes for an shm store's name."""
    segment: str
    params: str
    relay_lock: str
    relay_state: str


_SHM = dict(backend="shm", views=True, pins=True, mappable=True, params_file=True,
            relay_source=False, relay_target=True)
_MONGO = dict(backend="mongodb", views=False, pins=False, mappable=False, params_file=False,
              relay_source=True, relay_target=False)
_TABLE = (("shm", _SHM), ("mongodb", _MONGO), ("mongodb+srv", _MONGO))
_NAME_MAX = 200
_NAME = re.compile(r"[A-Za-z0-9._-]*")
SHM_DIR = "/dev/shm"
RING_PREFIX = "wirehead-ring."


def backend_of(uri):
    """The Backend record of uri's scheme; InvalidSampleError naming the
    known schemes for any other."""
    for scheme, caps in _TABLE:
        if isinstance(uri, str) and uri.startswith(scheme + "://"):
            name = uri[len(scheme) + 3:] if caps["backend"] == "shm" else None
            return Backend(scheme=scheme, name=name, **caps)
    known = [f"{s}://" for s, _ in _TABLE]
    raise _C.InvalidSampleError(f"store URI must start with {', '.join(known[:-1])} or "
                                f"{known[-1]}")


def _shm_check_name(name):
    if not 0 < len(name) <= _NAME_MAX:
        raise _C.InvalidSampleError(f"shm store name must be 1..{_NAME_MAX} characters")
    if not _NAME.fullmatch(name):
        raise _C.InvalidSampleError(f"shm store name '{name}': use only ASCII letters, "
                                    f"digits, '-', '_', '.'")


def _shm_files(name):
    _shm_check_name(name)
    return ShmFiles(segment=f"{SHM_DIR}/wirehead.{name}",
                    params=f"{SHM_DIR}/wirehead-params.{name}",
                    relay_lock=f"{SHM_DIR}/wirehead-relay.{name}.lock",
                    relay_state=f"{SHM_DIR}/wirehead-relay.{name}.json")

# ---- end of the stand-in ----------------------------------------------------


def check_name(backend):
    """The store name of a Backend record, checked by its backend's rule
    (InvalidSampleError with the C store's message)."""
    if backend.name is not None:
        _shm_check_name(backend.name)


def shm_uri(name):
    """The URI of the shm store NAME (its name is not checked here)."""
    return f"shm://{name}"


def mongodb_uri(host, port, dbname):
    """The URI the original wirehead's MONGOHOST, PORT and DBNAME name."""
    return f"mongodb://{host}:{port}/{dbname}"


def shm_files(uri):
    """The /dev/shm files of uri's store (ShmFiles), None for a store of a
    backend that names its stores by no local name (a server's address)."""
    b = backend_of(uri)
    return _shm_files(b.name) if b.name is not None else None


def split(uri):
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
