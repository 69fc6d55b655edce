"""Store-backed views (shm): reader pins keep the viewed generation's area
from reuse; the pin policy never lets one reader stall the generators; dead
readers' pins are pruned; views are read-only."""
import logging
import os
import signal
import threading

import numpy as np
import pytest
import torch

import wirehead_torch as wt
from wirehead_torch import _C
from wirehead_torch._arrays import to_store_arrays

import whlib

pytestmark = pytest.mark.asan  # also run against the sanitizer build

NAMES = ["id", "data"]


def put_and_seal(st, tag, counter, tries=10_000):
    """Puts samples until a seal happens; returns (seal info, next counter).
    Fails if the seal does not come: the policy must let generation go on."""
    for _ in range(tries):
        st.put(to_store_arrays(whlib.sample(tag, counter), NAMES))
        counter += 1
        assert st.lead()  # renews the lease (children start slowly under load)
        info = st.seal()
        if info and "generation" in info:
            return info, counter
        assert not (info and "blocked_pid" in info), f"seal blocked: {info}"
    raise AssertionError("no seal")


def fill_full(st, tag, counter):
    """Fills the write generation without sealing it."""
    while st.status()["write_fill"] < st.swap_cap:
        st.put(to_store_arrays(whlib.sample(tag, counter), NAMES))
        counter += 1
    return counter


def view_all(st, gen):
    """Every position of gen as (torch id, torch data), viewing the store."""
    out = []
    for pos in range(st.swap_cap):
        g, p, pad, arrs, _ = st.view_sample(gen, pos, None, 10.0, False)
        assert (g, p, pad) == (gen, pos, False)
        out.append(tuple(torch.from_dlpack(a) for a in arrs))
    return out


def check_views(views, want):
    got = [whlib.check_sample(i.numpy(), d.numpy()) for i, d in views]
    assert got == want


def pins(st):
    return {a["generation"]: (a["pins"], a["pin_pid"]) for a in st.status()["areas"]
            if a["pins"]}


def test_views_stay_exact_across_seals(shm_cfg):
    """A reader holding views across 24 seals: every byte of every view is
    its own sample's after every seal, and no seal is ever held up."""
    cfg = shm_cfg(swap_cap=4, budget="64KiB")
    st = whlib.open_store(cfg)
    assert st.lead()
    _, counter = put_and_seal(st, 1, 0)
    seals = 0
    for _round in range(4):
        gen = st.current()
        views = view_all(st, gen)
        want = [whlib.check_sample(i.numpy(), d.numpy()) for i, d in views]
        assert len(set(want)) == st.swap_cap
        assert pins(st) == {gen: (st.swap_cap, os.getpid())}
        _C.counters_reset()
        for _ in range(6):
            _, counter = put_and_seal(st, 1, counter)
            seals += 1
            check_views(views, want)
        assert _C.counters()["bytes_copied_out"] == 0  # views copy nothing
        del views
        assert pins(st) == {}
    assert seals >= 20


def test_one_pinned_generation_per_process(shm_cfg):
    cfg = shm_cfg(swap_cap=2, budget="64KiB")
    st = whlib.open_store(cfg)
    assert st.lead()
    _, counter = put_and_seal(st, 2, 0)
    old = st.current()
    held = view_all(st, old)
    _, counter = put_and_seal(st, 2, counter)
    with pytest.raises(wt.PinLimitError, match=f"still holds views of generation {old}"):
        st.view_sample(st.current(), 0, None, 10.0, False)
    # the map-style reader falls back to a copy, and says nothing is wrong
    ds = wt.MongoTupleheadDataset(config=cfg, views=True)
    _C.counters_reset()
    x, y = ds[1]
    whlib.check_sample(x.numpy(), y.numpy())
    assert _C.counters()["bytes_copied_out"] > 0
    del held
    _C.counters_reset()
    x, y = ds[0]
    whlib.check_sample(x.numpy(), y.numpy())
    assert _C.counters()["bytes_copied_out"] == 0
    assert pins(st) == {st.current(): (1, os.getpid())}  # one view: one sample pinned
    del x
    assert pins(st) == {st.current(): (1, os.getpid())}  # y still views the sample
    del y
    assert pins(st) == {}


def test_numpy_views_are_read_only(shm_cfg):
    cfg = shm_cfg(swap_cap=2, budget="64KiB")
    st = whlib.open_store(cfg)
    assert st.lead()
    put_and_seal(st, 3, 0)
    ds = wt.MongoheadDataset(config=cfg, views=True, output="numpy")
    item = ds[1]
    whlib.check_sample(item["input"], item["label"])
    with pytest.raises(ValueError, match="read-only"):
        item["label"][0] = 0


def test_a_write_through_a_torch_view_faults_and_changes_nothing(shm_cfg):
    cfg = shm_cfg(swap_cap=2, budget="64KiB")
    st = whlib.open_store(cfg)
    assert st.lead()
    put_and_seal(st, 4, 0)
    gen = st.current()
    before = whlib.read_generation(st, gen, 2)
    p = whlib.spawn("view", cfg, "write")
    try:
        whlib.wait_line(p.stderr, "PINNED", 60)
        rc = p.wait(60)
        if rc != -signal.SIGSEGV:  # the sanitizer build reports the fault and exits
            assert rc != 0 and any("SEGV" in line for line in whlib.wait_line(p.stderr, "SEGV", 60))
    finally:
        whlib.stop(p)
    assert whlib.read_generation(st, gen, 2) == before
    # the dead writer's pin goes at the next seal
    put_and_seal(st, 4, 100)
    assert pins(st) == {}


def test_killed_readers_pins_are_pruned_and_generation_goes_on(shm_cfg, caplog):
    """Two readers pinning two old generations fill every free area: the
    seal waits, the manager names the reader it waits for; once that reader
    is SIGKILLed its pin is pruned and sealing goes on."""
    cfg = shm_cfg(swap_cap=2, budget="64KiB")
    st = whlib.open_store(cfg)
    assert st.lead()
    _, counter = put_and_seal(st, 5, 0)
    readers = []
    try:
        for _ in range(2):
            r = whlib.spawn("view", cfg)
            readers.append(r)
            whlib.wait_line(r.stderr, "PINNED", 60)
            _, counter = put_and_seal(st, 5, counter)
        pinned = pins(st)
        assert sorted(pid for _, pid in pinned.values()) == sorted(r.pid for r in readers)
        counter = fill_full(st, 5, counter)
        assert st.lead()
        info = st.seal()  # read + write + two pinned areas: nothing free
        assert info is not None and info.get("blocked_reader") is True
        assert info["blocked_pid"] in {r.pid for r in readers}
        st.resign()
        # the manager logs the pid it waits for, then seals once it is gone
        mgr = wt.WireheadManager(config=cfg)
        done = []
        t = threading.Thread(target=lambda: done.append(mgr.run(max_swaps=1)))
        with caplog.at_level(logging.WARNING, logger="wirehead_torch"):
            t.start()
            whlib.until(lambda: any("sealing waits for reader pid" in r.getMessage()
                                    for r in caplog.records), 60, "the manager's log line")
            line = next(r.getMessage() for r in caplog.records
                        if "sealing waits for reader pid" in r.getMessage())
            victim = next(r for r in readers if f"pid {r.pid} " in line)
            gen_held = next(g for g, (_, pid) in pinned.items() if pid == victim.pid)
            assert f"generation {wt.gen_label(gen_held, st.status())}" in line  # as #N
            victim.send_signal(signal.SIGKILL)
            victim.wait(30)
            t.join(60)
        assert done == [1]
        assert all(pid != victim.pid for _, pid in pins(st).values())
    finally:
        for r in readers:
            whlib.stop(r, signal.SIGKILL)


def test_generators_continue_while_a_reader_holds_views(shm_cfg):
    """Generator and manager processes keep sealing while this process holds
    views of one generation throughout; the views stay exact."""
    cfg = shm_cfg(swap_cap=4, budget="64KiB", MANAGER_POLL=0.005)
    st = whlib.open_store(cfg)
    gen_p = whlib.spawn("gen", cfg, 6)
    mgr_p = whlib.spawn("manager", cfg)
    try:
        gen = wt._reader.wait_for_generation(st, cfg, 60)
        views = view_all(st, gen)
        want = [whlib.check_sample(i.numpy(), d.numpy()) for i, d in views]
        start = st.status()["seals"]
        whlib.until(lambda: st.status()["seals"] >= start + 8, 120, "8 seals while pinned")
        check_views(views, want)
        assert gen in pins(st)
    finally:
        whlib.stop(gen_p)
        whlib.stop(mgr_p)


def test_old_segment_layout_is_refused_and_kept(shm_cfg):
    cfg = shm_cfg(swap_cap=2, budget="64KiB")
    path = "/dev/shm/wirehead." + cfg["STORE"][len("shm://"):]
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.write(fd, (0x314d485344414857).to_bytes(8, "little") + bytes(8184))
    finally:
        os.close(fd)
    with pytest.raises(wt.SchemaMismatchError, match="older wirehead_torch"):
        whlib.open_store(cfg)
    assert os.path.getsize(path) == 8192  # refused, not taken for stale and removed


def test_views_need_an_shm_store():
    cfg = {"STORE": "mongodb://127.0.0.1:1/x", "SWAP_CAP": 2, "SAMPLE": NAMES}
    with pytest.raises(ValueError, match="shm://"):
        wt.MongoTupleheadDataset(config=cfg, views=True)


def test_views_survive_the_store_handle(shm_cfg):
    """A view keeps the segment mapped after its handle is closed."""
    cfg = shm_cfg(swap_cap=2, budget="64KiB")
    st = whlib.open_store(cfg)
    assert st.lead()
    put_and_seal(st, 7, 0)
    views = view_all(st, st.current())
    want = [whlib.check_sample(i.numpy(), d.numpy()) for i, d in views]
    st.close()
    check_views(views, want)
    del views
    st2 = whlib.open_store(cfg)
    assert pins(st2) == {}
    assert st2.status()["generated"] >= 2


def _minflt():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.parametrize("n", [1 << 19, 1 << 22])  # 2 MiB and 16 MiB data fields
def test_reads_reuse_prefaulted_buffers(store_cfg, n):
    """Store.read and the map-style reader hand out pooled buffers: once a
    tensor is gone its buffer serves the next read of that size (same
    address, no fresh page faults); never while a tensor still holds it."""
    if n > 1 << 19 and not store_cfg(swap_cap=1)["STORE"].startswith("shm://"):
        n = 1 << 19  # keep the MongoDB test server's work small
    cfg = store_cfg(swap_cap=2, budget=f"{(n * 4 + 4096) * 2}")
    wt.WireheadGenerator((whlib.sample(8, i, n) for i in range(2)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    st = whlib.open_store(cfg)
    gen = st.current()
    ptrs = set()
    for k in range(4):  # warm: the pool maps a buffer, the store's pages are touched
        ident, data = st.read(gen, k % 2)
        whlib.check_sample(np.from_dlpack(ident), np.from_dlpack(data))
        ptrs.add(data.data_ptr)
        del ident, data
    base = _C.counters()
    flt = _minflt()
    seen = set()
    for k in range(8):
        ident, data = st.read(gen, k % 2)
        seen.add(data.data_ptr)
        del ident, data
    assert _minflt() - flt < 8 * (n * 4 // 4096) // 20  # fresh 4 KiB pages would fault each
    assert seen <= ptrs
    now = _C.counters()
    assert now["pool_misses"] == base["pool_misses"]
    assert now["pool_hits"] >= base["pool_hits"] + 8

    # a live tensor keeps its buffer: the next read gets another one
    held = torch.from_dlpack(st.read(gen, 0)[1])
    first = held.data_ptr()
    other = torch.from_dlpack(st.read(gen, 1)[1])
    assert other.data_ptr() != first
    whlib.check_sample(np.array([8, 0]), held.numpy())
    del other

    ds = wt.MongoTupleheadDataset(config=cfg)
    ds[1]  # warm
    base = _C.counters()
    for k in range(4):
        x, y = ds[k % 2]
        whlib.check_sample(x.numpy(), y.numpy())
        del x, y
    assert _C.counters()["pool_misses"] == base["pool_misses"]
    whlib.check_sample(np.array([8, 0]), held.numpy())  # untouched throughout
