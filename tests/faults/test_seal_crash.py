"""Self-sealing generators SIGKILLed inside a seal (shm store).

WIREHEAD_FAULT_SEAL_KILL=<n> makes a seal kill its own process right after
its n-th write to the store, so a kill lands at each step in turn. Whatever
step a generator dies at, the next participant's seal gives a generation of
exactly SWAP_CAP distinct, correct samples.

The soak kills 8 self-sealing generators at random instants while a reader
checks every generation it meets. WIREHEAD_SEAL_SOAK_S sets its length in
seconds (20 by default)."""
import json
import os
import random
import signal
import time

import pytest

import wirehead_torch as wt

import whlib
from whlib import open_store, read_generation

CAP = 4
MAX_STEPS = 32  # bound on the steps probed; a seal has far fewer


def _prime(cfg):
    """Every area holds a generation once (a half-reset area would still
    carry one's index and counts); returns the empty write generation."""
    g = wt.WireheadGenerator((whlib.sample(9, i) for i in range(5 * CAP)), config=cfg,
                             quiet=True)
    assert g.run() == 5 * CAP and g.sealed == 5
    st = wt.status(cfg)
    assert st["write_fill"] == 0
    return st["write_gen"]


def _sealer(cfg, tag, n, step):
    """A generator child that puts n samples and self-seals, killed by the
    fault at seal step `step`. True if it was killed there, False if it
    ended on its own (its seals have fewer steps)."""
    p = whlib.spawn("gen", cfg, tag, n, env={"WIREHEAD_FAULT_SEAL_KILL": str(step)})
    try:
        p.wait(60)
        err = "".join(whlib.drained(p.stderr))
    finally:
        code = whlib.stop(p)
    if code == -signal.SIGKILL:
        assert f"wirehead: fault kill at seal step {step}\n" in err, err
        return True
    assert code == 0 and "fault kill" not in err, f"exit {code}: {err[-2000:]}"
    return False


def _next_generation_exact(cfg, w, victim_tag):
    """The next participant (this process) carries on: generation w keeps
    the victim's samples, and w + 1 is made of exactly CAP distinct, correct
    samples of its own."""
    g = wt.WireheadGenerator((whlib.sample(2, i) for i in range(10 * CAP)), config=cfg,
                             quiet=True)
    store = open_store(cfg)
    for _ in range(10 * CAP):  # bounded: a surplus put (w full) seals w, CAP more fill w + 1
        if store.current() > w:
            break
        g.cycle()
    st = wt.status(cfg)
    assert st["read_gen"] == w + 1, st
    assert sorted(read_generation(store, w, CAP)) == [(victim_tag, i) for i in range(CAP)]
    got = read_generation(store, w + 1, CAP)
    assert len(set(got)) == CAP and {t for t, _ in got} == {2}, got
    gens = [a["generation"] for a in st["areas"] if a["generation"]]
    assert len(gens) == len(set(gens)), f"two areas hold one generation: {st['areas']}"


def test_generator_killed_at_every_seal_step(shm_cfg):
    steps = None
    for step in range(1, MAX_STEPS + 1):
        cfg = shm_cfg(swap_cap=CAP, budget="64KiB", SELF_SEAL=True)
        w = _prime(cfg)
        if not _sealer(cfg, 1, CAP, step):
            steps = step - 1
            break
        _next_generation_exact(cfg, w, 1)
        wt.clean(cfg)
    assert steps is not None and steps >= 7, steps


def test_repairing_seal_killed_at_every_step(shm_cfg):
    """The first sealer dies with the next area published but write_gen not
    moved (step 5); the one that repairs it dies at each of its own steps."""
    for step in range(1, MAX_STEPS + 1):
        cfg = shm_cfg(swap_cap=CAP, budget="64KiB", SELF_SEAL=True)
        w = _prime(cfg)
        assert _sealer(cfg, 1, CAP, 5)
        st = wt.status(cfg)
        assert st["write_gen"] == w and max(a["generation"] for a in st["areas"]) == w + 1
        killed = _sealer(cfg, 3, 1, step)  # its one put is surplus: it seals
        _next_generation_exact(cfg, w, 1)
        wt.clean(cfg)
        if not killed:
            assert step > 8, f"the repairing seal had only {step - 1} steps"
            return
    raise AssertionError(f"the repairing seal was killed at all of {MAX_STEPS} steps")


# ---- random-kill soak -------------------------------------------------------

def _gen_child(cfg, tag):
    """Forked generator: samples tagged `tag` until killed."""
    code = 1
    try:
        os.nice(10)  # 8 busy generators on a few cores must not starve the killer and reader

        def samples():
            i = 0
            while True:
                yield whlib.sample(tag, i, n=64)
                i += 1
        wt.WireheadGenerator(samples(), config=cfg, quiet=True).run()
        code = 0
    finally:
        os._exit(code)


def _fork_gen(cfg, tag):
    pid = os.fork()
    if pid == 0:
        _gen_child(cfg, tag)
    return pid


def _read_all(cfg, secs, out_fd):
    """Reader: checks every generation it meets until secs have passed;
    writes its counts (or the failure) as JSON to out_fd."""
    res = {"error": "reader died"}
    try:
        store = open_store(cfg)
        seen, last, gens_read, gone = set(), 0, 0, 0
        end = time.monotonic() + secs
        while time.monotonic() < end:
            gen = store.current()
            if gen == last:
                time.sleep(0.0005)  # polling for a newer generation, not a synchronisation
                continue
            assert gen > last, f"generation {gen} after {last}"
            last = gen
            # raises CorruptSampleError if any sample fails its checksum, and
            # AssertionError if one's data does not match its id
            got = read_generation(store, gen, CAP)
            if got is None:
                gone += 1
                continue
            assert len(set(got)) == CAP, f"generation {gen} repeats a sample: {got}"
            assert not seen & set(got), f"generation {gen} repeats an earlier sample: {got}"
            seen |= set(got)
            gens_read += 1
        res = {"read": gens_read, "gone": gone, "last": last}
    except Exception as e:  # reported to the test, which fails
        res = {"error": f"{type(e).__name__}: {e}"}
    finally:
        os.write(out_fd, json.dumps(res).encode())
        os._exit(0)


@pytest.mark.once
def test_random_kill_soak(shm_cfg):
    secs = float(os.environ.get("WIREHEAD_SEAL_SOAK_S", "20"))
    cfg = shm_cfg(swap_cap=CAP, budget="64KiB", SELF_SEAL=True)
    rnd = random.Random(int(os.environ.get("WIREHEAD_SEAL_SOAK_SEED", "0")) or None)
    tags = iter(range(1, 1 << 30))  # a tag per generator life: every sample unique
    kids = {}  # pid -> kill time
    dying = set()  # killed, not yet reaped: reaped without waiting on their exit
    kills = 0

    def reap(pid, flags):
        got, status = os.waitpid(pid, flags)
        if got:
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, \
                f"generator {pid} ended by itself: status {status:#x}"
            dying.discard(pid)

    open_store(cfg)  # created before the reader looks
    rfd, wfd = os.pipe()
    reader = os.fork()
    if reader == 0:
        os.close(rfd)
        _read_all(cfg, secs, wfd)
    os.close(wfd)
    try:
        for _ in range(8):
            kids[_fork_gen(cfg, next(tags))] = time.monotonic() + rnd.uniform(0.02, 0.1)
        end = time.monotonic() + secs
        while time.monotonic() < end:
            now = time.monotonic()
            for pid, at in list(kids.items()):
                if now >= at:
                    os.kill(pid, signal.SIGKILL)
                    del kids[pid]
                    dying.add(pid)
                    kills += 1
                    kids[_fork_gen(cfg, next(tags))] = time.monotonic() + rnd.uniform(0.02, 0.1)
            for pid in list(dying):
                reap(pid, os.WNOHANG)
            time.sleep(max(0.0, min(kids.values()) - time.monotonic()))  # the next kill's time
    finally:
        for pid in kids:
            os.kill(pid, signal.SIGKILL)
            dying.add(pid)
        for pid in list(dying):
            reap(pid, 0)
        with os.fdopen(rfd, "rb") as f:
            out = f.read()  # the reader ends by itself after secs
        _, status = os.waitpid(reader, 0)
    res = json.loads(out)
    st = wt.status(cfg)
    print(f"soak {secs:g}s: {kills} kills, {st['seals']} seals, {res.get('read')} generations "
          f"read whole ({(res.get('read') or 0) * CAP} samples checked), {res.get('gone')} "
          f"reclaimed while read")
    assert "error" not in res, res["error"]
    assert status == 0
    # the soak did its work: on a loaded machine restarts lag the 20-100 ms
    # schedule, so the bounds are loose
    assert kills >= 8 * secs and res["read"] >= 10, (kills, res)
