"""status() and clean(): store figures and removal."""
import logging
import os
import re
import time

from . import _C, _uri
from ._redact import redact, secrets_hidden
from ._store import ProcessStore
from ._store_args import local_cache_uri, local_origin, node_name, store_kwargs
from .config import get_config, get_store_config

log = logging.getLogger("wirehead_torch")


def status(config=None, config_path=None):
    """The store's figures as a dict: current (read) and write generation,
    write fill, totals, the last swaps and the generation rate; in spec
    mode (RUN_SEED) also ``spec``: the run's seed, the last sealed spec
    generation, the one being made and its fill, the claimed but
    unfinished indices with their age, the slowest reader's need, the
    duplicate and nondeterministic puts, a failed index."""
    if isinstance(config, str):
        config, config_path = None, config
    cfg = get_config(config_path, config)
    ps = ProcessStore(cfg, create=False)  # a typo in a config must not make a store
    try:
        store = ps.get()
        st = store.status()
        _params_status(store, st)
        if cfg["RUN_SEED"] is not None:  # spec mode (docs/reproducible.md)
            st["spec"] = _C.spec_status(store)
    finally:
        ps.close()
    st["store"] = redact(cfg["STORE"])
    hist = st["history"]
    rate = None
    # accepted samples per second from the oldest swap listed until now (not
    # until the newest swap): it falls once generators stop
    now = time.time()
    if hist and now > hist[0]["time"]:
        rate = max(0, st["generated"] - hist[0]["generated"]) / (now - hist[0]["time"])
    st["samples_per_s"] = rate
    # how many times, on average, readers have been served each sample of
    # the read generation: with the params version, what SWAP_CAP is tuned by
    st["reuse_per_sample"] = round(sum(r["reuse"] for r in st.get("readers") or []
                                       if r["generation"] == st["read_gen"]), 2)
    if cfg["LOCAL_CACHE"]:
        st["local_cache"] = local_status(cfg, st["read_gen"])
    return st


def local_status(cfg, source_gen):
    """This node's LOCAL_CACHE: its read generation, how many generations
    it is behind the store's newest (source_gen), the source the copy
    records (``source``; ``foreign``: not this config's store, so its
    readers and relay refuse the copy), its relay's figures and the readers
    reading it."""
    from .relay import relay_figures
    origin_id, origin = local_origin(cfg)
    gen, readers, source, foreign = 0, [], None, False
    try:
        ps = _C.Store(**store_kwargs(cfg, create=False, local=True))
    except _C.NotFoundError:  # no relay has made it yet
        pass
    except _C.SchemaMismatchError:
        # another store's copy (none of its figures are this store's), or a
        # plain store: whose, read from its header without opening it as one
        try:
            found = _C.shm_origin(_uri.backend_of(local_cache_uri(cfg)).name)
        except _C.WireheadError:
            found = None
        if found is None or found[0] == origin_id:
            raise  # refused for another reason (its SAMPLE, its layout)
        source, foreign = found[1] or None, True
    else:
        try:
            local = ps.status()
        finally:
            ps.close()
        gen, readers, source = local["read_gen"], local["readers"], local["origin"] or None
    # generation numbers count up by one per seal
    lag = (source_gen - gen if gen else (1 if source_gen else 0)) if source_gen >= gen else 0
    return {"store": local_cache_uri(cfg), "node": node_name(), "read_gen": gen,
            "lag_generations": lag, "source": source, "foreign": foreign, "config_source": origin,
            "relay": relay_figures(cfg),
            "readers": readers}  # this node's readers beat into the copy they read


def _params_status(store, st):
    """The params version (docs/params.md) and how much of the read
    generation was made under it: read_params {min, max, at_current,
    samples}, None before the first seal."""
    v = st["params_version"] = store.params_version()
    st["read_params"] = None
    if st["read_gen"]:
        try:
            gp = store.gen_params(st["read_gen"])
        except (_C.GenerationGoneError, _C.NotFoundError):
            return  # reclaimed since: the next status says
        st["read_params"] = {"min": gp["min"], "max": gp["max"], "samples": gp["samples"],
                             "at_current": gp["at_max"] if gp["max"] == v else 0}


def _exists(cfg):
    """Whether the store has anything to remove, asked the way its backend
    keeps it: its files in /dev/shm (segment and params file), or a MongoDB
    collection of its own (named as the store names them)."""
    files = _uri.shm_files(cfg["STORE"])
    if files is not None:
        return any(os.path.exists(f) for f in (files.segment, files.params))
    b = _uri.backend_of(cfg["STORE"])
    if b.backend != "mongodb":
        raise ValueError(f"clean: no rule for what a {b.backend} store holds")
    prefix = re.escape(str(cfg["COLLECTION_PREFIX"]))
    own = re.compile(rf"{prefix}\.state|{prefix}\.gen\.[0-9]+(\.m)?")
    return any(own.fullmatch(n) for n in _C.mongo_collections(**store_kwargs(cfg, False)))


def clean(config=None, config_path=None, local_only=False):
    """Removes everything this store holds (its shm segment and params
    file, or its MongoDB collections, and with LOCAL_CACHE this node's
    copy); nothing else. local_only: only this node's copy (the store
    itself stays). What is not this config's is refused, nothing removed
    (SchemaMismatchError naming what was found): under LOCAL_CACHE a plain
    store or another store's copy, under an shm STORE a relay's copy.
    Returns whether there was anything."""
    if isinstance(config, str):
        config, config_path = None, config
    cfg, bad = get_store_config(config_path, config)
    if local_only and not cfg["LOCAL_CACHE"]:
        raise ValueError(f"{cfg.source}: local_only removes this node's LOCAL_CACHE copy; "
                         f"the config sets no LOCAL_CACHE")
    if bad is not None:
        log.warning("%s; removing the store it names (%s) all the same", bad, redact(cfg.store))
    existed = False
    if cfg["LOCAL_CACHE"]:  # this node's copy and its relay's files; first, so a
        # refused copy leaves the store too
        files = _uri.shm_files(local_cache_uri(cfg))
        existed |= os.path.exists(files.segment)
        _C.clean(**store_kwargs(cfg, local=True))
        try:  # the figures; the lock file stays (a running relay holds it)
            os.unlink(files.relay_state)
        except FileNotFoundError:
            pass
    if not local_only:
        with secrets_hidden(cfg["STORE"]):
            existed |= _exists(cfg)
            _C.clean(**store_kwargs(cfg))
    return existed
