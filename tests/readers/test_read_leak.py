"""No read path leaks: a read that skips corrupt samples (or retries a
reclaimed generation) holds one buffer per field, the last attempt's, so a
reader's RSS stays flat however many samples it skips. Seven of a
generation's eight 4 MiB samples are corrupt: every read of a corrupt
position skips up to seven of them, and a leak of each skipped attempt's
buffers would add hundreds of MiB over these reads."""
import gc

import numpy as np
import pytest
import torch

import wirehead_torch as wt

import whlib

# Not in the sanitizer lane: ASan keeps freed memory in quarantine, so RSS
# there says nothing about leaks (the C tests' leak checker covers those).

SWAP_CAP = 8
FLOATS = 1 << 20  # 4 MiB samples
ROUNDS = 6
GROWTH_MIB = 48  # a leak of the skipped attempts would be > 500 MiB


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def corrupt_cfg(shm_cfg):
    """A sealed generation of 8 samples of which 1..7 are corrupt."""
    cfg = shm_cfg(swap_cap=SWAP_CAP, budget=f"{SWAP_CAP * 5}MiB")
    items = [whlib.sample(1, i, FLOATS) for i in range(SWAP_CAP)]
    assert wt.WireheadGenerator(iter(items), config=cfg).run() == SWAP_CAP
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    for i in range(1, SWAP_CAP):
        corrupt(cfg, i)
    return cfg


def corrupt(cfg, counter):
    """Flips one data bit of sample(1, counter, FLOATS) in cfg's segment."""
    # mid-sample: the first floats round to the previous sample's last ones
    data = whlib.sample(1, counter, FLOATS)[1]
    whlib.flip_bit_after(cfg, data[FLOATS // 2:FLOATS // 2 + 16].tobytes())


def flat(read_round):
    """RSS grows by less than GROWTH_MIB over ROUNDS rounds after a warm-up."""
    read_round()
    gc.collect()
    before = rss_mib()
    for _ in range(ROUNDS):
        read_round()
    gc.collect()
    grown = rss_mib() - before
    assert grown < GROWTH_MIB, f"RSS grew by {grown:.0f} MiB over {ROUNDS} rounds"


def test_store_read_sample_skipping_holds_one_buffer(corrupt_cfg):
    store = whlib.open_store(corrupt_cfg)
    gen = store.current()

    def one_round():
        for pos in range(1, SWAP_CAP):  # pos skips SWAP_CAP - pos corrupt samples
            g, p, is_pad, arrs, skipped = store.read_sample(gen, pos)
            assert (p, is_pad) == (0, True) and "checksum" in skipped
            whlib.check_sample(np.from_dlpack(arrs[0]), np.from_dlpack(arrs[1]))
    flat(one_round)


def test_iterable_in_process_skipping_is_flat(corrupt_cfg):
    ds = wt.WireheadIterableDataset(config=corrupt_cfg, shuffle=False)

    def one_round():
        n = 0
        for item in ds:
            whlib.check_sample(item["id"].numpy(), item["data"].numpy())
            n += 1
        assert n == SWAP_CAP
    flat(one_round)


@pytest.mark.parametrize("views", [False, True])
def test_map_style_reads_of_corrupt_samples_are_flat(corrupt_cfg, views):
    ds = wt.MongoTupleheadDataset(config=corrupt_cfg, views=views)

    def one_round():
        x, y = ds[0]
        whlib.check_sample(x.numpy(), y.numpy())
        held = (x, y)  # a view held: later reads of it fall back to copies
        for i in range(1, SWAP_CAP):  # an indexed read names its corrupt sample
            with pytest.raises(wt.CorruptSampleError, match="checksum"):
                ds[i]
        del held
    flat(one_round)


def test_loader_skipping_is_flat(corrupt_cfg):
    ld = wt.WireheadLoader(config=corrupt_cfg, batch_size=4, num_threads=2, shuffle=False)

    def one_round():
        rows = 0
        for b in ld:
            for r in range(b["id"].shape[0]):
                whlib.check_sample(b["id"][r].numpy(), b["data"][r].numpy())
                rows += 1
            del b
        assert rows == SWAP_CAP
    try:
        flat(one_round)
        assert ld.stats()["corrupt"] > 0
    finally:
        ld.close()


def test_views_reader_holding_a_view_reads_copies_flat(corrupt_cfg):
    """views=True holding a view of an older generation: its copies of the
    newest (the pin policy refuses a second view) are flat too."""
    cfg = corrupt_cfg
    ds = wt.MongoTupleheadDataset(config=cfg, views=True)
    x, y = ds[0]
    held = (x, y)
    more = [whlib.sample(2, i, FLOATS) for i in range(SWAP_CAP)]
    assert wt.WireheadGenerator(iter(more), config=cfg).run() == SWAP_CAP
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1

    def one_round():
        for i in range(SWAP_CAP):
            a, b = ds[i]
            assert not torch.equal(a, held[0])
            whlib.check_sample(a.numpy(), b.numpy())
    flat(one_round)
