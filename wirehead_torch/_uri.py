"""Store URIs: the one module of the package that spells a scheme
(``shm://``, ``mongodb://``) or asks for a file name under /dev/shm.
Everything else asks it.

What a store can do (views, pins, a mappable segment, a params file, being
the source or the target of a relay) is what the C backend table says of
its scheme (``_C.backend_of``), never a guess from the scheme's spelling;
the names of the files under /dev/shm are C's (``_C.shm_files``,
``_C.SHM_DIR``, ``_C.RING_PREFIX``)."""
import re

from . import _C

SHM_DIR = _C.SHM_DIR
RING_PREFIX = _C.RING_PREFIX


def backend_of(uri):
    """The _C.Backend record of uri's scheme; InvalidSampleError naming the
    known schemes for any other."""
    return _C.backend_of(uri)


def check_name(backend):
    """The store name of a Backend record, checked by its backend's rule
    (InvalidSampleError with the C store's message)."""
    if backend.name is not None:
        _C.shm_check_name(backend.name)


def shm_uri(name):
    """The URI of the shm store NAME (its name is not checked here)."""
    return f"shm://{name}"


def mongodb_uri(host, port, dbname):
    """The URI the original wirehead's MONGOHOST, PORT and DBNAME name."""
    return f"mongodb://{host}:{port}/{dbname}"


def shm_files(uri):
    """The /dev/shm files of uri's store (_C.ShmFiles), None for a store of
    a backend that names its stores by no local name (a server's address)."""
    name = backend_of(uri).name
    return _C.shm_files(name) if name is not None else None


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
