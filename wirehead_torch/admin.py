"""status() and clean(): store figures and removal."""
import logging
import os
import re

from . import _C
from ._store import ProcessStore
from .config import get_config, get_store_config, redact, secrets_hidden, store_kwargs

log = logging.getLogger("wirehead_torch")


def status(config=None, config_path=None):
    """The store's figures as a dict: current (read) and write generation,
    write fill, totals, the last swaps and the generation rate."""
    if isinstance(config, str):
        config, config_path = None, config
    cfg = get_config(config_path, config)
    ps = ProcessStore(cfg, create=False)  # a typo in a config must not make a store
    try:
        st = ps.get().status()
    finally:
        ps.close()
    st["store"] = redact(cfg["STORE"])
    hist = st["history"]
    rate = None
    if len(hist) >= 2 and hist[-1]["time"] > hist[0]["time"]:
        rate = (hist[-1]["generated"] - hist[0]["generated"]) / (hist[-1]["time"] - hist[0]["time"])
    st["samples_per_s"] = rate
    return st


def _exists(cfg):
    """Whether the store has anything to remove: its shm segment, or a
    MongoDB collection of its own (named as the store names them)."""
    uri = cfg["STORE"]
    if uri.startswith("shm://"):
        return os.path.exists(f"/dev/shm/wirehead.{uri[len('shm://'):]}")
    prefix = re.escape(str(cfg["COLLECTION_PREFIX"]))
    own = re.compile(rf"{prefix}\.state|{prefix}\.gen\.[0-9]+(\.m)?")
    return any(own.fullmatch(n) for n in _C.mongo_collections(**store_kwargs(cfg, False)))


def clean(config=None, config_path=None):
    """Removes everything this store holds (its shm segment, or its MongoDB
    collections); nothing else. Returns whether there was anything."""
    if isinstance(config, str):
        config, config_path = None, config
    cfg, bad = get_store_config(config_path, config)
    if bad is not None:
        log.warning("%s; removing the store it names (%s) all the same", bad, redact(cfg.store))
    with secrets_hidden(cfg["STORE"]):
        existed = _exists(cfg)
        _C.clean(**store_kwargs(cfg))
    return existed
