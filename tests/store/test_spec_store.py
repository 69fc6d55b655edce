"""Spec mode's store operations (docs/reproducible.md) on the _C.spec_*
bindings, with generator processes (tests/helpers/spec_proc.py): claims
from many processes, a claimer killed holding its claim, every index once
at its position with its own bytes."""
import json
import os
import select
import signal
import subprocess
import sys

import numpy as np
import pytest

from wirehead_torch import _C

import spec_proc
import whlib

SPEC_PROC = os.path.join(whlib.HERE, "spec_proc.py")
PROCS = os.path.join(whlib.HERE, "procs.py")


def _spawn(cfg, *args):
    return subprocess.Popen([sys.executable, SPEC_PROC, json.dumps(cfg), *args],
                            env=whlib.env_for_child(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _line(proc, timeout):
    """The next stdout line of proc, within timeout seconds."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no line from pid {proc.pid} within {timeout} s"
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise AssertionError(f"pid {proc.pid} exited {proc.returncode} without a line: "
                             f"{proc.stderr.read()}")
    return line


def _check_window(store, cap):
    """The window's spec generations are sealed, each index at its position
    with its bytes."""
    for s in range(_C.SPEC_AHEAD):
        gen = _C.spec_locate(store, s)
        assert gen, f"spec generation {s} is sealed"
        for pos in range(cap):
            ident, data = (np.from_dlpack(a) for a in store.read(gen, pos))
            want_id, want_data = spec_proc.sample(s * cap + pos)
            assert np.array_equal(ident, want_id) and np.array_equal(data, want_data), \
                f"spec generation {s} position {pos}"


def _claimers_and_a_kill(store_cfg):
    """Two generator processes claim and put while a third, holding a claim,
    is SIGKILLed: every index of the window's generations lands exactly
    once, at its position, with its bytes; the killed claim's index is made
    by another process in a later attempt."""
    cap = 6
    cfg = store_cfg(swap_cap=cap, RUN_SEED=1234, CLAIM_LEASE=5)
    store = whlib.open_store(cfg)
    # The victim claims before the others start: under load they could
    # otherwise fill the window before it claims anything (CI saw that).
    victim = _spawn(cfg, "hold")
    procs = []
    try:
        held = json.loads(_line(victim, 60))["held"]
        procs = [_spawn(cfg) for _ in range(2)]
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs + [victim]:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"generator {p.pid} exited {p.returncode}: {err}"
    puts = [json.loads(line) for out, _ in outs for line in out.splitlines()]
    n = _C.SPEC_AHEAD * cap
    accepted = sorted(p["index"] for p in puts if p["put"] == _C.SPEC_PUT_ACCEPTED)
    assert accepted == list(range(n)), "every index of the window accepted exactly once"
    assert [p["attempt"] for p in puts
            if p["index"] == held and p["put"] == _C.SPEC_PUT_ACCEPTED][0] >= 2
    assert sum(p["sealed"] for p in puts) == _C.SPEC_AHEAD
    _check_window(store, cap)
    st = _C.spec_status(store)
    assert st["spec"] and st["run_seed"] == 1234 and not st["open"] and not st["failed"]
    assert st["any_sealed"] and st["last_sealed"] == _C.SPEC_AHEAD - 1
    assert _C.spec_claim(store, lease_s=5, max_attempts=3) == (_C.CLAIM_AHEAD, None)
    store.close()


@pytest.mark.parametrize("store_cfg", ["mongo"], indirect=True)
def test_mongo_claimers_and_a_kill(store_cfg):
    _claimers_and_a_kill(store_cfg)


def _manager_beside_generators(store_cfg):
    """A manager that holds the lease and seals on every poll while spec
    generators fill the window seals nothing of its own and drops nothing,
    and stops cleanly."""
    cap = 4
    cfg = store_cfg(swap_cap=cap, RUN_SEED=99, CLAIM_LEASE=5, MANAGER_POLL=0.02)
    store = whlib.open_store(cfg)
    mgr = subprocess.Popen([sys.executable, PROCS, "manager", json.dumps(cfg)],
                           env=whlib.env_for_child(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        whlib.until(lambda: store.status()["leader_pid"] == mgr.pid, 60, "the manager leads")
        gen = _spawn(cfg)
        out, err = gen.communicate(timeout=120)
        assert gen.returncode == 0, err
        _check_window(store, cap)
        mgr.send_signal(signal.SIGTERM)
        out, err = mgr.communicate(timeout=30)
    finally:
        if mgr.poll() is None:
            mgr.kill()
            mgr.wait()
    assert mgr.returncode == 0, err
    assert "SWAPS 0" in err, err  # every seal was a put's
    _check_window(store, cap)
    store.close()


@pytest.mark.parametrize("store_cfg", ["mongo"], indirect=True)
def test_mongo_manager_beside_spec_generators(store_cfg):
    _manager_beside_generators(store_cfg)
