"""Start order never matters with BYTE_BUDGET auto: each reader kind, the
manager and status may start before, after or together with the first
generator, on both stores, with 20 MiB samples (an auto-sized shm store is
created only by a generator's put, sized from its sample)."""
import os

import pytest

import wirehead_torch as wt

import whlib

BIG = 5 * 2**20  # floats per sample: 20 MiB of data
SWAP_CAP = 4
TIMEOUT = 240


def _cfg(store_cfg, self_seal=True):
    # budget=None: BYTE_BUDGET left at its default, auto
    return store_cfg(swap_cap=SWAP_CAP, budget=None, SELF_SEAL=self_seal, READ_TIMEOUT=TIMEOUT)


def _first_seal(cfg):
    def sealed():
        try:
            return wt.status(config=cfg)["read_gen"] > 0
        except wt.NotFoundError:
            return False
    whlib.until(sealed, TIMEOUT, "the generator's first seal")


@pytest.mark.parametrize("order", ["reader_first", "generator_first", "together"])
@pytest.mark.parametrize("kind", ["loader", "iterable", "map", "tuple"])
def test_reader_any_start_order(store_cfg, kind, order):
    cfg = _cfg(store_cfg)
    procs = []
    try:
        if order == "generator_first":
            procs.append(whlib.spawn("gen", cfg, 1, 3 * SWAP_CAP, BIG))
            _first_seal(cfg)
        reader = whlib.spawn("read", cfg, kind, SWAP_CAP)
        procs.append(reader)
        if order == "reader_first":
            # the reader says what it waits for while no generator has run
            got = "".join(whlib.wait_line(reader.stderr, "waiting", TIMEOUT))
            if cfg["STORE"].startswith("shm://"):
                assert "to be created" in got and "BYTE_BUDGET auto" in got, got
                assert not os.path.exists(f"/dev/shm/wirehead.{cfg['STORE'][6:]}")
        if order != "generator_first":
            procs.append(whlib.spawn("gen", cfg, 1, 3 * SWAP_CAP, BIG))
        whlib.wait_line(reader.stderr, f"READ {SWAP_CAP}", TIMEOUT)
        assert reader.wait(TIMEOUT) == 0, whlib.tail(reader.stderr)
    finally:
        for p in procs:
            whlib.stop(p)


def test_manager_before_generator(store_cfg):
    cfg = _cfg(store_cfg, self_seal=False)
    mgr = whlib.spawn("manager", cfg, 1)
    gen = None
    try:
        whlib.wait_line(mgr.stderr, "STARTED", TIMEOUT)
        if cfg["STORE"].startswith("shm://"):
            with pytest.raises(wt.StoreNotCreatedError, match="BYTE_BUDGET auto"):
                wt.WireheadManager(config=cfg)._store.get().lead()
        gen = whlib.spawn("gen", cfg, 1, SWAP_CAP, BIG)
        whlib.wait_line(mgr.stderr, "SWAPS 1", TIMEOUT)
        assert mgr.wait(TIMEOUT) == 0
        assert wt.status(config=cfg)["seals"] == 1
    finally:
        whlib.stop(mgr)
        if gen is not None:
            whlib.stop(gen)


def test_status_before_generator_creates_nothing(shm_cfg):
    cfg = shm_cfg(swap_cap=SWAP_CAP, budget=None)
    with pytest.raises(wt.NotFoundError, match="no shm store"):
        wt.status(config=cfg)
    assert not os.path.exists(f"/dev/shm/wirehead.{cfg['STORE'][6:]}")
