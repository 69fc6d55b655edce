"""A trainer killed by a signal takes its DataLoader workers with it: no
worker runs a second later, and no ring file of its workers stays in
/dev/shm (the workers remove them as they end, SIGKILL of the trainer
included; wirehead_torch/_ring.py)."""
import glob
import json
import multiprocessing
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


def in_session(sid):
    """The running processes of session sid (the trainer's, which its
    workers inherit: found even after they lost their parent)."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
                found.append(int(d))
    return found


def _sigint_as_in_a_terminal():
    """SIGINT handled by default in the trainer, as in a terminal's
    foreground job: one run in the background of a non-interactive shell
    (CI) inherits it ignored, and Python then ignores Ctrl-C too."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def until(what, within):
    """Polls what() until true or within seconds passed; what()'s last value."""
    deadline = time.monotonic() + within
    while not (ok := what()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return ok


@pytest.mark.parametrize("sig, how", [
    (signal.SIGKILL, None), (signal.SIGTERM, None), (signal.SIGTERM, "group"),
    (signal.SIGTERM, "term-group-at-fork"), (signal.SIGINT, None), (signal.SIGINT, "group"),
    (signal.SIGINT, "sigint-at-fork"), (None, "exit")],
    ids=["SIGKILL", "SIGTERM", "SIGTERM-group", "SIGTERM-group-at-fork", "SIGINT", "SIGINT-group",
         "SIGINT-at-fork", "exit"])
def test_workers_end_with_their_trainer(shm_cfg, sig, how):
    """group: to the trainer and its workers, as Ctrl-C in a terminal or a
    batch system that signals every process of a job does.
    sigint-at-fork: the SIGINT arrives while an epoch forks its workers
    (from an at-fork callback, where Python ignores a KeyboardInterrupt):
    wt.DataLoader raises it once the workers are started.
    term-group-at-fork: SIGTERM to the group at that moment (only the
    trainer can remove its files: its new worker has not set up its
    signals). exit: no signal, the trainer leaves mid-epoch
    (multiprocessing ends its workers at exit, and torch's SIGCHLD handler
    must not stop that exit before the files go)."""
    cfg = shm_cfg(swap_cap=N)
    wt.WireheadGenerator((whlib.sample(1, i) for i in range(N)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    p = subprocess.Popen([sys.executable, TRAINER, json.dumps(cfg),
                          *([how] if how not in (None, "group") else [])],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=whlib.env_for_child(), start_new_session=True,
                         preexec_fn=_sigint_as_in_a_terminal)
    try:
        line = p.stdout.readline()
        assert line, p.communicate(timeout=30)[1]
        got = json.loads(line)
        pid, workers = got["pid"], got["workers"]
        assert len(workers) == 4
        if how in (None, "group"):  # (else these workers may have ended already)
            assert all(running(w) for w in workers)
            files = glob.glob(f"/dev/shm/wirehead-ring.{pid}.*")
            for token in got["tokens"]:  # both datasets' workers made their regions
                assert [f for f in files if f".{token}.w" in f], files
            if how == "group":
                os.killpg(pid, sig)
            else:
                p.send_signal(sig)
        assert p.wait(timeout=30) != 0
        # the workers of any epoch, those started as the trainer was interrupted too
        assert until(lambda: not in_session(pid), 1.0), in_session(pid)
        assert until(lambda: not glob.glob(f"/dev/shm/wirehead-ring.{pid}.*"), 1.0), \
            glob.glob(f"/dev/shm/wirehead-ring.{pid}.*")
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()


def test_workers_keep_the_sigint_handler(shm_cfg):
    """Workers forked while the DataLoader holds a SIGINT get the handler
    the trainer had, not the holding one."""
    cfg = shm_cfg(swap_cap=N)
    wt.WireheadGenerator((whlib.sample(1, i) for i in range(N)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    want = signal.getsignal(signal.SIGINT)
    seen = multiprocessing.Array("i", 2)

    def init(k):
        seen[k] = 1 if signal.getsignal(signal.SIGINT) is want else 2

    dl = wt.DataLoader(wt.WireheadIterableDataset(config=cfg, fields=["id", "data"]),
                       batch_size=2, num_workers=2, worker_init_fn=init)
    assert sum(len(b["id"]) for b in dl) == N
    assert list(seen) == [1, 1]
    assert signal.getsignal(signal.SIGINT) is want
