"""What the C store is given: ``_C.Store`` and ``_C.clean``'s arguments
from a resolved config, and the node-local copy's naming (LOCAL_CACHE
auto, this node's name, the source a copy records)."""
import hashlib
import os
import re
import socket
from urllib.parse import unquote

from . import _C, _uri
from .config import resolve


def node_name():
    """This node's identity for LOCAL_CACHE auto: SLURM's node name when set
    (several "nodes" of one host then keep apart), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def local_cache_uri(cfg):
    """The store readers read on this node (None without LOCAL_CACHE).
    auto: a name made from the store, its database and collection prefix,
    and this node, so configs of other stores or nodes never share one."""
    cfg = resolve(cfg)
    if not cfg.local_cache:
        return None
    if cfg.local_cache != "auto":
        return cfg.local_cache
    node = node_name()
    key = "\0".join((cfg.store, cfg.dbname, cfg.collection_prefix, node))
    tag = hashlib.sha256(key.encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", node)[:80]
    return _uri.shm_uri(f"relay-{safe}-{tag}")


def database(cfg):
    """The name of the database a store opens: for MongoDB the one named in
    the URI, else DBNAME (as the C store picks it); for a store the URI
    names (shm://NAME), NAME."""
    cfg = resolve(cfg)
    name = _uri.backend_of(cfg.store).name
    if name is not None:
        return name
    _scheme, _userinfo, hosts, _opts = _uri.split(cfg.store)
    return unquote(hosts.partition("/")[2]) or cfg.dbname or "wirehead"


def local_origin(cfg):
    """(id, name) of the store a LOCAL_CACHE copy mirrors, as the copy
    records it: id a digest of what names that store (scheme, hosts,
    database, collection prefix), name the same in words for messages and
    status. Neither holds the URI's credentials or options."""
    cfg = resolve(cfg)
    scheme, _userinfo, hosts, _opts = _uri.split(cfg.store)
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
    _C.BYTE_BUDGET_AUTO (0): the C store then lets only a put create an shm
    store, sized from its sample. local=True: a reader's store, the
    node-local copy when LOCAL_CACHE is set (only its relay creates it,
    auto-sized, recording its source: a copy of another source, or a plain
    store, is refused). Without local, an shm store that is a copy is
    refused: only its relay writes it."""
    cfg = resolve(cfg)
    copy = local_cache_uri(cfg) if local else None
    kw = dict(create=create, uri=copy or cfg.store, swap_cap=cfg.swap_cap,
              fields=list(cfg.sample),
              byte_budget=budget_arg(None if copy else cfg.byte_budget),
              chunk_bytes=int(cfg.chunksize * (1 << 20)), dbname=cfg.dbname,
              prefix=cfg.collection_prefix, lease_s=cfg.lease_seconds,
              connect_timeout_s=cfg.connect_timeout, verify_reads=cfg.verify_reads,
              run_seed=cfg.run_seed)
    if copy:
        kw["origin_id"], kw["origin_name"] = local_origin(cfg)
    return kw
