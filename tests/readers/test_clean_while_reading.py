"""`wirehead-torch clean` while readers run: every reader kind (the C
loader's threads, DataLoader workers kept across epochs) notices the store
was removed and re-created and moves to the new one, instead of serving the
unlinked segment's last generation for ever."""
import time

import pytest
import torch

import wirehead_torch as wt

import whlib

TIMEOUT = 60


def _batches(kind, cfg):
    """An endless stream of (tags) lists, one per batch, from one reader kind."""
    if kind == "loader":
        src = wt.WireheadLoader(config=cfg, batch_size=2, num_threads=2)
    elif kind == "iterable":
        ds = wt.WireheadIterableDataset(config=cfg, batch_size=2, num_workers=2)
        src = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=True)
    else:
        cls = wt.MongoheadDataset if kind == "map" else wt.MongoTupleheadDataset
        src = torch.utils.data.DataLoader(cls(config=cfg), batch_size=2, num_workers=2,
                                          persistent_workers=True)
    while True:
        for b in src:
            if isinstance(b, dict):
                ids = b["input"] if "input" in b else b["id"]
            else:
                ids = b[0]
            yield [int(i[0]) for i in ids]


@pytest.mark.parametrize("kind", ["loader", "iterable", "map", "tuple"])
def test_readers_follow_a_cleaned_store(shm_cfg, kind):
    cfg = shm_cfg(swap_cap=4, budget=None, SELF_SEAL=True, READ_TIMEOUT=TIMEOUT)
    g1 = whlib.spawn("gen", cfg, 1)
    g2 = None
    try:
        batches = _batches(kind, cfg)
        assert set(next(batches)) == {1}
        assert whlib.stop(g1) is not None
        wt.clean(config=cfg)
        g2 = whlib.spawn("gen", cfg, 2)
        seen = set()
        # bounded in time, not in batches: a fast reader runs through any
        # count of batches of the old store before the new one's first seal
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:  # a stale reader never sees tag 2
            seen |= set(next(batches))
            if 2 in seen:
                break
            whlib.assert_alive([g2], "while the reader looks for the new store")
        assert 2 in seen, f"{kind} still reads the removed store (tags {seen})"
    finally:
        whlib.stop(g1)
        if g2 is not None:
            whlib.stop(g2)
