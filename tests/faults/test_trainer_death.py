"""A trainer killed by a signal takes its DataLoader workers with it: no
worker runs a second later, and no ring file of its workers stays in
/dev/shm (the workers remove them as they end, SIGKILL of the trainer
included; wirehead_torch/_ring.py)."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import wirehead_torch as wt

import whlib

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "..", "helpers", "trainer_proc.py")
N = 16

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG is Linux's")


def running(pid):
    """pid runs (a zombie no longer does: its new parent may reap it late)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def until(what, within):
    """Polls what() until true or within seconds passed; what()'s last value."""
    deadline = time.monotonic() + within
    while not (ok := what()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return ok


# SIGINT is left out: in CI the trainer at times ran on after it (issue 38's
# closing note); SIGKILL and SIGTERM end it every time
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_workers_end_with_their_trainer(shm_cfg, sig):
    cfg = shm_cfg(swap_cap=N)
    wt.WireheadGenerator((whlib.sample(1, i) for i in range(N)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    p = subprocess.Popen([sys.executable, TRAINER, json.dumps(cfg)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=whlib.env_for_child())
    try:
        line = p.stdout.readline()
        assert line, p.communicate(timeout=30)[1]
        got = json.loads(line)
        pid, workers = got["pid"], got["workers"]
        assert len(workers) == 4 and all(running(w) for w in workers)
        files = glob.glob(f"/dev/shm/wirehead-ring.{pid}.*")
        for token in got["tokens"]:  # both datasets' workers made their regions
            assert [f for f in files if f".{token}.w" in f], files
        p.send_signal(sig)
        if sig == signal.SIGINT:
            # a KeyboardInterrupt that lands in a destructor (torch's iterator
            # ending its workers at an epoch's end) is ignored by Python, as
            # a user's first Ctrl-C there is: they press it again
            for _ in range(15):
                try:
                    p.wait(timeout=2)
                    break
                except subprocess.TimeoutExpired:
                    p.send_signal(sig)
        assert p.wait(timeout=30) != 0
        assert until(lambda: not any(running(w) for w in workers), 1.0), \
            [w for w in workers if running(w)]
        assert until(lambda: not glob.glob(f"/dev/shm/wirehead-ring.{pid}.*"), 1.0), \
            glob.glob(f"/dev/shm/wirehead-ring.{pid}.*")
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()
