"""A stalled seal is said: two reader processes pin two different old
generations with views, so no area is free for the next generation; the
self-sealing generator and the manager log which generations are pinned and
by which pids (once, then every STALL_LOG_EVERY seconds), and status shows
it."""
import logging
import signal
import threading

import wirehead_torch as wt
from wirehead_torch import manager
from wirehead_torch.apps.cli import _fmt_status

import whlib


def _samples(tag):
    i = 0
    while True:
        yield whlib.sample(tag, i)
        i += 1


def _cycle_until_sealed(g):
    before = g.sealed
    for _ in range(1000):  # bounded; a generation takes SWAP_CAP puts
        g.cycle()
        if g.sealed > before:
            return
    raise AssertionError("no seal")


def _pin_two(cfg, g):
    """Two readers viewing two different generations, then one seal more:
    read, write and both pinned areas take all four. Returns the reader
    processes and the generations they pin."""
    readers, pinned = [], []
    try:
        for _ in range(2):
            _cycle_until_sealed(g)
            r = whlib.spawn("view", cfg)
            readers.append(r)
            line = whlib.wait_line(r.stderr, "PINNED", 60)[-1]
            pinned.append(int(line.split()[1]))
        _cycle_until_sealed(g)
    except BaseException:
        for r in readers:
            whlib.stop(r, signal.SIGKILL)
        raise
    assert pinned[0] != pinned[1]
    return readers, pinned


def _stall_lines(caplog, who):
    return [r.getMessage() for r in caplog.records
            if "sealing stalled" in r.getMessage() and who in r.getMessage()]


def test_generator_says_which_generations_are_pinned(shm_cfg, caplog, monkeypatch):
    cfg = shm_cfg(swap_cap=2, budget="64KiB", SELF_SEAL=True)
    g = wt.WireheadGenerator(_samples(5), config=cfg, quiet=True)
    readers, pinned = _pin_two(cfg, g)
    try:
        sealed = g.sealed
        with caplog.at_level(logging.WARNING, logger="wirehead_torch"):
            for _ in range(4):  # fills the write generation, then every put is surplus
                g.cycle()
            assert not _stall_lines(caplog, "Generator"), "said before STALL_GRACE"
            whlib.until(lambda: g.cycle() and _stall_lines(caplog, "Generator"), 30,
                        "the generator's stall line")
            for _ in range(5):
                g.cycle()
            assert g.sealed == sealed, "sealed with no free area"
            lines = _stall_lines(caplog, "Generator")
            assert len(lines) == 1, f"said once per stall, not per attempt: {lines}"
            for r, gen in zip(readers, pinned):
                assert f"generation {wt.gen_label(gen, wt.status(cfg))} by pid {r.pid}" in lines[0], lines[0]
            # status says so too
            text = _fmt_status(wt.status(cfg))
            assert "sealing" in text and "stalled" in text
            for r, gen in zip(readers, pinned):
                assert f"generation {wt.gen_label(gen, wt.status(cfg))} by pid {r.pid}" in text, text
            # said again once the interval has passed
            monkeypatch.setattr(manager, "STALL_LOG_EVERY", 0.0)
            g.cycle()
            assert len(_stall_lines(caplog, "Generator")) == 2
            # a reader gone: its pin is pruned, sealing goes on, and that is said
            whlib.stop(readers[0], signal.SIGKILL)
            _cycle_until_sealed(g)
            assert any("sealing goes on after a stall" in r.getMessage()
                       for r in caplog.records)
        assert "stalled" not in _fmt_status(wt.status(cfg))
    finally:
        for r in readers:
            whlib.stop(r, signal.SIGKILL)
        g.close()


def test_manager_says_which_generations_are_pinned(shm_cfg, caplog):
    cfg = shm_cfg(swap_cap=2, budget="64KiB", SELF_SEAL=True, MANAGER_POLL=0.01)
    g = wt.WireheadGenerator(_samples(6), config=cfg, quiet=True)
    readers, pinned = _pin_two(cfg, g)
    done = []
    mgr = wt.WireheadManager(config=cfg, quiet=True)
    t = threading.Thread(target=lambda: done.append(mgr.run(max_swaps=1)))
    try:
        for _ in range(2):  # the write generation full
            g.cycle()
        assert wt.status(cfg)["write_fill"] == 2
        with caplog.at_level(logging.WARNING, logger="wirehead_torch"):
            t.start()
            whlib.until(lambda: _stall_lines(caplog, "wirehead manager"), 60,
                        "the manager's stall line")
            line = _stall_lines(caplog, "wirehead manager")[0]
            for r, gen in zip(readers, pinned):
                assert f"generation {wt.gen_label(gen, wt.status(cfg))} by pid {r.pid}" in line, line
            whlib.stop(readers[1], signal.SIGKILL)
            t.join(60)
            assert done == [1]
            assert len(_stall_lines(caplog, "wirehead manager")) == 1
            assert any("wirehead manager" in r.getMessage() and "goes on after a stall"
                       in r.getMessage() for r in caplog.records)
    finally:
        mgr.stop()
        if t.is_alive():
            t.join(60)
        for r in readers:
            whlib.stop(r, signal.SIGKILL)
        g.close()
