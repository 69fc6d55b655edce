"""status() and clean(): store figures and removal."""
from . import _C
from ._store import ProcessStore
from .config import get_config, redact, secrets_hidden, store_kwargs


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


def clean(config=None, config_path=None):
    """Removes everything this store holds (its shm segment, or its MongoDB
    collections); nothing else."""
    if isinstance(config, str):
        config, config_path = None, config
    cfg = get_config(config_path, config)
    with secrets_hidden(cfg["STORE"]):
        _C.clean(**store_kwargs(cfg))
