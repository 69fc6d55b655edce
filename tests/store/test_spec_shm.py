"""Spec mode on the embedded store (docs/reproducible.md, the shm backend's
claims, window, puts and seals): claim order, leases, failures, duplicates,
the window readers' needs set, RUN_SEED checks, the first put of an
auto-sized store, exact reads across a removed store, generators killed,
stopped or slowed beside each other, and damaged spec fields in the
segment (an error or ignored, never a crash, a hang or another index's
bytes). Every sample is a function of its index, so every read is checked.

The C-level kill test (tests/c/test_store.c, "spec generator SIGKILLed at
every step") kills a generator after each store write in turn; here a
generator process is killed mid-claim among others."""
import json
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import wirehead_torch as wt
from wirehead_torch import _C
from wirehead_torch._store_args import store_kwargs
from wirehead_torch.config import resolve

import whlib

pytestmark = pytest.mark.asan

CAP = 4
SEED = 7
GEN = os.path.join(whlib.HERE, "spec_gen.py")
sys.path.insert(0, whlib.HERE)
from spec_gen import sample as gen_sample  # noqa: E402


def cfg_of(shm_cfg, cap=CAP, budget="64KiB", **extra):
    extra.setdefault("RUN_SEED", SEED)
    return shm_cfg(swap_cap=cap, sample=("x", "k"), budget=budget, **extra)


def handle(cfg, **over):
    """A raw spec-mode handle of cfg's store (a reader or a generator)."""
    kw = store_kwargs(resolve(cfg))
    kw.update(over)
    return _C.Store(**kw)


def item(k):
    """The sample of index k in these tests: its bytes are a function of k."""
    return (np.arange(4, dtype=np.float32) + np.float32(k), np.array([k], np.int64))


def arrays(x):
    return [(np.ascontiguousarray(a), _C.DTYPES[str(a.dtype)]) for a in x]


def claim(st, lease=30.0, attempts=3):
    return _C.spec_claim(st, lease_s=lease, max_attempts=attempts)


def claimed(st, lease=30.0, attempts=3):
    status, c = claim(st, lease, attempts)
    assert status == _C.CLAIM_OK and c is not None, (status, c)
    return c


def put(st, c, x=None):
    return _C.spec_put(st, c, arrays(item(c.index) if x is None else x))


def make_until_ahead(st, limit=64):
    """Claims and puts until the window is full; the indices made."""
    made = []
    for _ in range(limit):
        status, c = claim(st)
        if status == _C.CLAIM_AHEAD:
            return made
        assert status == _C.CLAIM_OK, status
        assert put(st, c)[0] == _C.SPEC_PUT_ACCEPTED
        made.append(c.index)
    raise AssertionError(f"no CLAIM_AHEAD after {limit} claims: {made}")


def read_exact(st, s, cap=CAP, want=item, timeout=30.0):
    """Reads spec generation s position by position (exact reads, waiting
    for it); each must be want(index) of its index. Returns the store's
    generation ids read."""
    gens = set()
    for p in range(cap):
        k = s * cap + p
        got = st.read_sample(0, p, None, timeout, False, spec_gen=s)
        gens.add(got.generation)
        arrs = [np.from_dlpack(a) for a in got.arrays]
        for a, b in zip(arrs, want(k)):
            assert a.dtype == b.dtype and np.array_equal(a, b), f"index {k}: {arrs} != {want(k)}"
    return gens


def seg_path(cfg):
    return f"/dev/shm/wirehead.{cfg['STORE'][len('shm://'):]}"


class Seg:
    """The segment's bytes, for damage and white-box checks."""

    def __init__(self, cfg):
        self.lay = _C.shm_layout()
        self.cap = cfg["SWAP_CAP"]
        fd = os.open(seg_path(cfg), os.O_RDWR)
        try:
            self.m = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        self.spec_off = self.u64(self.lay["hdr_spec_off"])

    def close(self):
        self.m.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def u64(self, off):
        return struct.unpack_from("<Q", self.m, off)[0]

    def u32(self, off):
        return struct.unpack_from("<I", self.m, off)[0]

    def put64(self, off, v):
        struct.pack_into("<Q", self.m, off, v)

    def put32(self, off, v):
        struct.pack_into("<I", self.m, off, v)

    def slot(self, i):
        return self.lay["slots"] + i * self.lay["slot_size"]

    def areas(self):
        """(gen, spec label, state) of each area."""
        L = self.lay
        return [(self.u64(self.slot(i) + L["slot_gen"]), self.u64(self.slot(i) + L["slot_spec_label"]),
                 self.u32(self.slot(i) + L["slot_spec_state"])) for i in range(4)]

    def area_of(self, gen):
        return [g for g, _, _ in self.areas()].index(gen)

    def claim_entry(self, area, pos):
        """Offset of a claim entry: pid i32, attempts u32, token, expiry, state u32, lease_ms u32."""
        return self.spec_off + (area * self.cap + pos) * self.lay["claim_size"]

    def params_copy(self, area):
        return self.spec_off + 4 * self.cap * self.lay["claim_size"] + area * 65536


def sealed_once(cfg, s):
    """Spec generation s is sealed in exactly one area."""
    with Seg(cfg) as seg:
        return sum(1 for g, label, state in seg.areas() if g and label == s + 1 and state == 2) == 1


# ---- claims --------------------------------------------------------------

def test_claim_order_positions_and_the_sealing_put(shm_cfg):
    """Indices are claimed in order at their positions, one generation id
    for a spec generation; whatever order the puts come in, the one that
    commits the last position seals it, and the next claim opens the next
    spec generation under a newer id."""
    cfg = cfg_of(shm_cfg)
    st = handle(cfg)
    try:
        cs = [claimed(st) for _ in range(CAP)]
        assert [(c.index, c.spec_gen, c.position, c.attempt) for c in cs] == \
            [(k, 0, k, 1) for k in range(CAP)]
        assert len({c.generation for c in cs}) == 1 and cs[0].params_version == 0
        assert claim(st)[0] == _C.CLAIM_WAIT  # every index held by a live claimer
        order = [2, 0, 3, 1]
        for i, p in enumerate(order):
            assert put(st, cs[p]) == (_C.SPEC_PUT_ACCEPTED, i == CAP - 1)
            assert _C.spec_locate(st, 0) == (cs[0].generation if i == CAP - 1 else 0)
        nxt = claimed(st)
        assert (nxt.index, nxt.spec_gen, nxt.position) == (CAP, 1, 0)
        assert nxt.generation > cs[0].generation
        read_exact(st, 0)
        assert _C.spec_seed(SEED, 3) == wt.spec_seed(SEED, 3)
    finally:
        st.close()


def test_expired_claim_taken_over_with_the_next_attempt(shm_cfg):
    """A claim not renewed for its lease is claimed again (attempt 2); the
    old claimer's renewal says it lost it, and its put, first to complete,
    still wins: the taker's is a counted duplicate."""
    cfg = cfg_of(shm_cfg)
    a, b = handle(cfg), handle(cfg)
    try:
        cs = [claimed(a, lease=0.3) for _ in range(CAP)]
        t0 = time.monotonic()
        assert claim(b)[0] == _C.CLAIM_WAIT
        got = None
        while got is None:
            status, got = claim(b)
            assert time.monotonic() - t0 < 10, "no claim taken over within 10 s"
            if got is None:
                time.sleep(0.01)
        assert time.monotonic() - t0 >= 0.25, "taken over before the lease ran out"
        assert (got.index, got.attempt) == (0, 2)
        assert not _C.spec_renew(a, cs[0], lease_s=0.3)
        assert put(a, cs[0]) == (_C.SPEC_PUT_ACCEPTED, False)
        assert put(b, got)[0] == _C.SPEC_PUT_SAME
        assert _C.spec_status(a)["duplicates"] == 1
    finally:
        a.close()
        b.close()


def test_a_longer_lease_of_another_generator_is_respected(shm_cfg):
    """Generators may run with different CLAIM_LEASE: a live claim made for
    30 s is not taken as damaged by one whose lease is 1 s."""
    cfg = cfg_of(shm_cfg)
    a, b = handle(cfg), handle(cfg)
    try:
        assert claimed(a, lease=30).index == 0
        c = claimed(b, lease=1)
        assert (c.index, c.attempt) == (1, 1)
    finally:
        a.close()
        b.close()


CLAIMER = """
import sys, time
from wirehead_torch import _C
from wirehead_torch._store_args import store_kwargs
from wirehead_torch.config import resolve
import json
st = _C.Store(**store_kwargs(resolve(json.loads(sys.argv[1]))))
status, c = _C.spec_claim(st, lease_s=float(sys.argv[2]), max_attempts=3)
print("CLAIMED", c.index, flush=True)
sys.stdin.readline()
import numpy as np
arrs = [(np.arange(4, dtype=np.float32) + np.float32(c.index), _C.DTYPES["float32"]),
        (np.array([c.index], np.int64), _C.DTYPES["int64"])]
print("RENEWED", _C.spec_renew(st, c, lease_s=30), flush=True)
print("PUT", _C.spec_put(st, c, arrs)[0], flush=True)
"""


def spawn_claimer(cfg, lease):
    p = subprocess.Popen([sys.executable, "-c", CLAIMER, json.dumps(cfg), str(lease)],
                         env=whlib.env_for_child(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    whlib.wait_line(p.stdout, "CLAIMED 0", 60)
    return p


def test_dead_claimers_index_taken_at_once(shm_cfg):
    """A claimer SIGKILLed holding index 0 (lease 30 s) delays nobody: the
    next claim takes index 0 at once, as attempt 2."""
    cfg = cfg_of(shm_cfg)
    p = spawn_claimer(cfg, 30)
    st = handle(cfg)
    try:
        p.kill()
        p.wait(10)
        t0 = time.monotonic()
        c = claimed(st)
        assert (c.index, c.attempt) == (0, 2) and time.monotonic() - t0 < 5
    finally:
        whlib.stop(p)
        st.close()


def test_stopped_claimer_delays_its_index_at_most_its_lease(shm_cfg):
    """A claimer stopped (SIGSTOP) holding index 0 keeps it for its lease
    only: the others make the rest, then index 0 as attempt 2; continued,
    its renewal says the claim is gone and its late put is a duplicate."""
    cfg = cfg_of(shm_cfg)
    p = spawn_claimer(cfg, 0.5)
    st = handle(cfg)
    try:
        os.kill(p.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        rest = [claimed(st) for _ in range(CAP - 1)]
        assert [c.index for c in rest] == [1, 2, 3]
        for c in rest:
            put(st, c)
        got = None
        while got is None:
            status, got = claim(st)
            assert status in (_C.CLAIM_OK, _C.CLAIM_WAIT) and time.monotonic() - t0 < 10
            if got is None:
                time.sleep(0.01)
        assert (got.index, got.attempt) == (0, 2)
        assert put(st, got) == (_C.SPEC_PUT_ACCEPTED, True)
        os.kill(p.pid, signal.SIGCONT)
        p.stdin.write("\n")
        p.stdin.flush()
        whlib.wait_line(p.stdout, "RENEWED False", 30)
        whlib.wait_line(p.stdout, f"PUT {_C.SPEC_PUT_SAME}", 30)
        read_exact(st, 0)
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
        whlib.stop(p)
        st.close()


def test_status_shows_claims_oldest_first_with_their_age(shm_cfg):
    """Claimed, unfinished indices are shown oldest first, with the time
    since their last renewal (what the lease counts), pid and attempt."""
    cfg = cfg_of(shm_cfg)
    st = handle(cfg)
    try:
        c0 = claimed(st)
        time.sleep(0.2)  # the age shown is what is measured here
        c1 = claimed(st)
        shown = _C.spec_status(st)["claims"]
        assert [(c["index"], c["pid"], c["attempt"]) for c in shown] == \
            [(0, os.getpid(), 1), (1, os.getpid(), 1)]
        assert shown[0]["age_s"] >= 0.2 > shown[1]["age_s"]
        assert _C.spec_renew(st, c0, lease_s=30)  # renewed: now the younger
        assert [c["index"] for c in _C.spec_status(st)["claims"]] == [c1.index, c0.index]
    finally:
        st.close()


def test_area_lock_of_a_stopped_process_is_passed_over(shm_cfg):
    """The only area a new generation could open in has its lock held by a
    stopped process (here: its lock word names this live process): a claim
    says WAIT at once rather than holding the header's lock for
    LEASE_SECONDS and failing; released, the area is taken."""
    cfg = cfg_of(shm_cfg, LEASE_SECONDS=5)
    g, rd = handle(cfg), handle(cfg)
    try:
        make_until_ahead(g)
        _C.spec_need(rd, 1)  # 0's area is the one to open 4 in
        with Seg(cfg) as seg:
            off = seg.slot(seg.area_of(_C.spec_locate(rd, 0))) + seg.lay["slot_lock"]
            seg.put32(off, os.getpid())
            try:
                t0 = time.monotonic()
                assert claim(g)[0] == _C.CLAIM_WAIT and time.monotonic() - t0 < 2
            finally:
                seg.put32(off, 0)
        assert claimed(g).index == 4 * CAP
    finally:
        g.close()
        rd.close()


def test_generator_claims_again_when_the_params_version_it_claimed_under_went(shm_cfg,
                                                                            monkeypatch):
    """Index 0 claimed before an auto store exists carries the params version
    of that moment; set_params before fn gets its spec makes the version's
    document unavailable: the generator drops that claim and claims again,
    instead of dying."""
    from wirehead_torch import spec as spec_mod
    cfg = cfg_of(shm_cfg, budget=None)
    real = _C.spec_claim
    first = []

    def claim_then_set(store, **kw):
        res = real(store, **kw)
        if not first:
            first.append(res[1])
            assert store.params_set(json.dumps({"v": 1})) == 1
        return res

    class C:
        def __getattr__(self, name):
            return claim_then_set if name == "spec_claim" else getattr(_C, name)

    monkeypatch.setattr(spec_mod, "_C", C())
    seen = []

    def fn(spec):
        seen.append((spec.index, spec.params_version, spec.params))
        return item(spec.index)

    g = wt.WireheadGenerator(fn, config=cfg, n_samples=CAP + 1, quiet=True)
    g.run()
    g.close()
    assert first[0].params_version == 0
    assert seen[:CAP] == [(k, 1, {"v": 1}) for k in range(CAP)]
    rd = handle(cfg)
    try:
        read_exact(rd, 0)
    finally:
        rd.close()


# ---- failures ------------------------------------------------------------

def test_fn_failures_end_in_spec_failed_error(shm_cfg):
    """fn raising on one index SPEC_ATTEMPTS times fails it for good: the
    generator's next claim and a reader's locate raise SpecFailedError
    naming the index, its place, the attempts, the pid, the host and the
    exception."""
    cfg = cfg_of(shm_cfg, SPEC_ATTEMPTS=3)

    def fn(spec):
        if spec.index == 2:
            raise ValueError("bad shape")
        return item(spec.index)

    want = (f"sample index 2 (generation 0, position 2) failed 3 attempts; last by pid "
            f"{os.getpid()} on host {socket.gethostname()}: ValueError: bad shape")
    g = wt.WireheadGenerator(fn, config=cfg, quiet=True)
    with pytest.raises(wt.SpecFailedError) as e:
        g.run()
    assert str(e.value) == want
    g.close()
    rd = handle(cfg)
    try:
        with pytest.raises(wt.SpecFailedError) as e:
            _C.spec_locate(rd, 0)
        assert str(e.value) == want
        assert _C.spec_status(rd)["failure"] == want
    finally:
        rd.close()


def test_fn_failures_before_an_auto_store_exists(shm_cfg):
    """BYTE_BUDGET auto: index 0 is claimed before any segment exists; fn
    failing there still ends in SpecFailedError after SPEC_ATTEMPTS (the
    handle counts them), and no store is made."""
    cfg = cfg_of(shm_cfg, budget=None)
    st = handle(cfg)
    try:
        for attempt in (1, 2, 3):
            c = claimed(st)
            assert (c.index, c.generation, c.attempt) == (0, 0, attempt)
            failed = _C.spec_fail(st, c, max_attempts=3, why="ValueError: no")
            assert failed == (attempt == 3)
        with pytest.raises(wt.SpecFailedError, match=r"sample index 0 \(generation 0, position "
                           r"0\) failed 3 attempts; last by pid \d+ on host .*: ValueError: no"):
            claim(st)
        assert not os.path.exists(seg_path(cfg))
    finally:
        st.close()


def test_expired_last_attempt_says_the_lease(shm_cfg):
    """An index whose last attempt's claim expired fails with the lease in
    the message."""
    cfg = cfg_of(shm_cfg)
    a, b = handle(cfg), handle(cfg)
    try:
        claimed(a, lease=0.05, attempts=1)
        t0 = time.monotonic()
        with pytest.raises(wt.SpecFailedError) as e:
            while time.monotonic() - t0 < 10:
                claim(b, attempts=1)
                time.sleep(0.01)
        assert str(e.value).startswith("sample index 0 (generation 0, position 0) failed 1 "
                                       f"attempts; last by pid {os.getpid()} on host ")
        assert str(e.value).endswith(", whose claim expired after 0.05s"), str(e.value)
    finally:
        a.close()
        b.close()


def test_index_given_back_at_a_higher_spec_attempts_fails_not_hangs(shm_cfg):
    """A generator with SPEC_ATTEMPTS=5 gave index 0 back after its third
    failure; one with SPEC_ATTEMPTS=3 must not skip it for ever (the
    generation would never complete): the index has failed for it."""
    cfg = cfg_of(shm_cfg)
    a, b = handle(cfg), handle(cfg)
    try:
        for attempt in (1, 2, 3):
            c = claimed(a, attempts=5)
            assert (c.index, c.attempt) == (0, attempt)
            assert not _C.spec_fail(a, c, max_attempts=5, why="ValueError: again")
        with pytest.raises(wt.SpecFailedError, match="sample index 0 .* failed 3 attempts"):
            claim(b, attempts=3)
    finally:
        a.close()
        b.close()


# ---- duplicates ----------------------------------------------------------

def test_duplicates_same_and_different_counted(shm_cfg):
    """The first complete put of an index wins; another with the same bytes
    is SAME, one with other bytes DIFFERENT (fn is not a function of its
    spec); both counted, the stored bytes the first's."""
    cfg = cfg_of(shm_cfg)
    st = handle(cfg)
    try:
        c = claimed(st)
        assert put(st, c)[0] == _C.SPEC_PUT_ACCEPTED
        assert put(st, c)[0] == _C.SPEC_PUT_SAME
        other = (np.full(4, -1, np.float32), np.array([0], np.int64))
        assert put(st, c, other)[0] == _C.SPEC_PUT_DIFFERENT
        s = _C.spec_status(st)
        assert (s["duplicates"], s["nondeterministic"]) == (2, 1)
        for c in [claimed(st) for _ in range(CAP - 1)]:
            put(st, c)
        read_exact(st, 0)
    finally:
        st.close()


# ---- the window ----------------------------------------------------------

def test_window_ahead_resume_and_a_reader_far_back(shm_cfg):
    """With no reader, generators make WH_SPEC_AHEAD generations and wait
    (CLAIM_AHEAD); a reader's need moves the window on; a reader resuming
    far back gets the generation it needs made again: the open one, beyond
    the window now, is abandoned (its late put dropped as GONE) and the
    needed one opened, with the same bytes as before."""
    cfg = cfg_of(shm_cfg)
    g, rd = handle(cfg), handle(cfg)
    try:
        assert make_until_ahead(g) == list(range(4 * CAP))
        assert _C.SPEC_AHEAD == 4 and claim(g)[0] == _C.CLAIM_AHEAD
        _C.spec_need(rd, 2)
        assert make_until_ahead(g) == list(range(4 * CAP, 6 * CAP))
        assert [_C.spec_locate(rd, s) != 0 for s in range(6)] == [False] * 2 + [True] * 4
        _C.spec_need(rd, 3)
        late = claimed(g)  # 6 opens in 2's area
        assert (late.spec_gen, late.position) == (6, 0) and _C.spec_locate(rd, 2) == 0
        _C.spec_need(rd, 0)  # a reader resumed at generation 0
        again = claimed(g)
        assert (again.index, again.spec_gen, again.attempt) == (0, 0, 1)
        assert put(g, late)[0] == _C.SPEC_PUT_GONE
        assert _C.spec_locate(rd, 6) == 0 and _C.spec_locate(rd, 3) != 0
        assert put(g, again)[0] == _C.SPEC_PUT_ACCEPTED
        assert make_until_ahead(g) == list(range(1, 3 * CAP))
        for s in range(4):
            read_exact(rd, s)
            assert sealed_once(cfg, s)
        st = _C.spec_status(rd)  # exact reads publish their need: 3 last
        assert (st["floor"], st["reader"], st["slowest_pid"]) == (3, True, os.getpid())
    finally:
        g.close()
        rd.close()


# ---- RUN_SEED, modes and other participants ------------------------------

def test_run_seed_mismatch_refused_both_ways(shm_cfg):
    """A store records its RUN_SEED (or none); another value, or one side
    without, is refused naming the store, both values and the key."""
    cfg = cfg_of(shm_cfg)
    name = cfg["STORE"]
    handle(cfg).close()
    with pytest.raises(ValueError) as e:
        handle(cfg, run_seed=8).status()
    assert str(e.value).startswith(f"store {name} was created with RUN_SEED=7; this config has "
                                   f"RUN_SEED=8 (two runs never share a store: clean it or name "
                                   f"another STORE)")
    with pytest.raises(ValueError) as e:
        handle(cfg, run_seed=None).status()
    assert str(e.value).startswith(f"store {name} was created with RUN_SEED=7 (spec mode); this "
                                   f"config has no RUN_SEED")
    plain = cfg_of(shm_cfg, RUN_SEED=None)
    handle(plain).close()
    with pytest.raises(ValueError) as e:
        handle(plain, run_seed=8).status()
    assert str(e.value).startswith(f"store {plain['STORE']} was created without RUN_SEED "
                                   f"(freshest mode); this config sets RUN_SEED=8")


def test_freshest_put_on_a_spec_store_refused(shm_cfg):
    cfg = cfg_of(shm_cfg)
    st = handle(cfg)
    try:
        with pytest.raises(wt.WireheadError, match=r"is in spec mode \(RUN_SEED=7\)"):
            st.put(arrays(item(0)))
        assert _C.spec_status(st)["open"] is False and wt.status(cfg)["generated"] == 0
    finally:
        st.close()


def test_manager_beside_spec_generators_is_harmless(shm_cfg, tmp_path):
    """`wirehead-torch manager` on a spec store leads and seals nothing the
    generators did not complete: every generation stays exact, and it
    stops cleanly."""
    cfg = cfg_of(shm_cfg)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    mgr = whlib.spawn_script(["-m", "wirehead_torch.apps.cli", "manager", "--config", str(path)],
                             cwd=whlib.REPO)  # where a relative WIREHEAD_EXT_DIR (ASan) points
    g = handle(cfg)
    try:
        whlib.until(lambda: wt.status(cfg)["leader_pid"] == mgr.pid, 60, "the manager's lease")
        assert make_until_ahead(g) == list(range(4 * CAP))
        whlib.assert_alive([mgr], "beside spec generators")
        for s in range(4):
            read_exact(g, s)
            assert sealed_once(cfg, s)
    finally:
        code = whlib.stop(mgr)
        g.close()
    assert code == 0, whlib.tail(mgr.stderr)


def test_auto_store_created_by_racing_first_puts(shm_cfg):
    """BYTE_BUDGET auto: generators claim index 0 before any segment exists
    and put it at once; one creates the store, one put wins, the others
    are duplicates of the same bytes, and the generation is exact."""
    cfg = cfg_of(shm_cfg, budget=None)
    hs = [handle(cfg) for _ in range(3)]
    cs = [claimed(h) for h in hs]
    assert all((c.index, c.generation) == (0, 0) for c in cs)
    go, res = threading.Barrier(3), [None] * 3

    def run(i):
        go.wait()
        res[i] = put(hs[i], cs[i])[0]

    ts = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    try:
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert sorted(res) == [_C.SPEC_PUT_ACCEPTED, _C.SPEC_PUT_SAME, _C.SPEC_PUT_SAME], res
        made = make_until_ahead(hs[0])
        assert made == list(range(1, 4 * CAP))
        for s in range(4):
            read_exact(hs[1], s)
            assert sealed_once(cfg, s)
    finally:
        for h in hs:
            h.close()


def test_first_put_after_its_generation_was_sealed_is_a_duplicate(shm_cfg):
    """SWAP_CAP 1, auto store: two claim index 0 before the store exists;
    the first put creates it and seals generation 0; the second is a
    duplicate of it, not a second generation 0 in another area."""
    cfg = cfg_of(shm_cfg, cap=1, budget=None)
    a, b = handle(cfg), handle(cfg)
    try:
        ca, cb = claimed(a), claimed(b)
        assert put(a, ca) == (_C.SPEC_PUT_ACCEPTED, True)
        assert put(b, cb)[0] == _C.SPEC_PUT_SAME
        assert sealed_once(cfg, 0)
        read_exact(b, 0, cap=1)
    finally:
        a.close()
        b.close()


def test_first_claim_under_a_params_version_replaced_before_its_put(shm_cfg):
    """Auto store: index 0 is claimed under params version 1; version 2 is
    set before its put. The generation opens under version 2 (in force
    then), the put made under 1 is dropped, and index 0 is claimed again
    with version 2's document."""
    cfg = cfg_of(shm_cfg, budget=None)
    st = handle(cfg)
    try:
        assert st.params_set(json.dumps({"lr": 1})) == 1
        c = claimed(st)
        assert (c.generation, c.params_version) == (0, 1)
        assert json.loads(_C.spec_params(st, c)) == {"lr": 1}
        assert st.params_set(json.dumps({"lr": 2})) == 2
        assert put(st, c)[0] == _C.SPEC_PUT_GONE
        c = claimed(st)
        assert (c.index, c.params_version, c.attempt) == (0, 2, 1)
        assert json.loads(_C.spec_params(st, c)) == {"lr": 2}
        assert st.params_set(json.dumps({"lr": 3})) == 3
        c2 = claimed(st)  # the generation keeps its version
        assert c2.params_version == 2 and json.loads(_C.spec_params(st, c2)) == {"lr": 2}
    finally:
        st.close()


# ---- exact reads across a removed store ----------------------------------

def spawn_gen(cfg, *flags, env=None):
    p = subprocess.Popen([sys.executable, GEN, json.dumps(cfg), *flags],
                         env=whlib.env_for_child(env), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    whlib.wait_line(p.stderr, "STARTED", 60)
    return p


def test_exact_reads_wait_for_a_generation_lost_with_the_store(shm_cfg):
    """wt.clean removes the store mid-run: an exact read of spec generation
    1 waits until the generators (which create the store again) have made
    it again, and gets the same bytes."""
    cfg = cfg_of(shm_cfg, budget=None, CLAIM_LEASE=5)
    gen = spawn_gen(cfg)
    rd = handle(cfg)
    later = None
    try:
        before = read_exact(rd, 1, want=gen_sample_of)
        wt.clean(cfg)
        assert not os.path.exists(seg_path(cfg))
        later = handle(cfg)  # a reader from here on: only the store made again has it
        after = read_exact(later, 1, want=gen_sample_of)
        assert len(before) == len(after) == 1 and before != after
        whlib.assert_alive([gen], "after the store was removed")
    finally:
        whlib.stop(gen)
        rd.close()
        if later is not None:
            later.close()


def gen_sample_of(k):
    """spec_gen.py's sample of index k."""
    class S:
        index = k
        seed = wt.spec_seed(SEED, k)
    return gen_sample(S)


# ---- generators killed, slowed and stopped among others -------------------

def test_three_generators_one_killed_mid_claim_one_slow(shm_cfg):
    """Three generator processes fill the window (4 generations): one is
    SIGKILLed inside its fifth claim (a fault point) and started again, one
    is slowed at random. Every index is made once at its position with
    fn(spec)'s bytes, each generation sealed in one area."""
    cfg = cfg_of(shm_cfg, cap=8, budget="256KiB", CLAIM_LEASE=5)
    victim = spawn_gen(cfg, env={"WIREHEAD_FAULT_SPEC_KILL": "claim:3:2"})
    procs = [spawn_gen(cfg), spawn_gen(cfg, "--slow")]
    try:
        victim.wait(60)
        assert victim.returncode == -signal.SIGKILL, whlib.tail(victim.stderr)
        assert "wirehead: fault kill at claim step 3" in "".join(whlib.drained(victim.stderr))
        procs.append(spawn_gen(cfg))
        rd = handle(cfg)
        try:
            whlib.until(lambda: all(_C.spec_locate(rd, s) for s in range(4)), 120,
                        "4 generations")
            whlib.assert_alive(procs, "while making them")
            for s in range(4):
                read_exact(rd, s, cap=8, want=gen_sample_of)
                assert sealed_once(cfg, s)
            st = _C.spec_status(rd)
            assert not st["failed"] and st["nondeterministic"] == 0
        finally:
            rd.close()
    finally:
        for p in procs:
            whlib.stop(p)
        whlib.stop(victim)


def test_generator_killed_right_after_a_commit(shm_cfg):
    """A generator SIGKILLed right after committing its first sample (before
    it counts it, marks its claim done or seals): its index stays made, once;
    another generator completes the window, nothing made twice."""
    cfg = cfg_of(shm_cfg, CLAIM_LEASE=5)
    victim = spawn_gen(cfg, env={"WIREHEAD_FAULT_SPEC_COMMIT_KILL": "1"})
    victim.wait(60)
    assert victim.returncode == -signal.SIGKILL
    assert "wirehead: fault kill after spec commit" in "".join(whlib.drained(victim.stderr))
    whlib.stop(victim)
    gen = spawn_gen(cfg)
    rd = handle(cfg)
    try:
        whlib.until(lambda: all(_C.spec_locate(rd, s) for s in range(4)), 60, "4 generations")
        for s in range(4):
            read_exact(rd, s, want=gen_sample_of)
            assert sealed_once(cfg, s)
        assert _C.spec_status(rd)["duplicates"] == 0
    finally:
        whlib.stop(gen)
        rd.close()


def test_stopped_lock_holder_delays_spec_generators_but_stops_none(shm_cfg):
    """A process stopped holding the segment's header lock (here: its lock
    word names this live test process) makes a spec generator's claims wait
    LEASE_SECONDS per try; the generator says so, keeps retrying, and goes
    on once the lock is let go."""
    cfg = cfg_of(shm_cfg, LEASE_SECONDS=1, CLAIM_LEASE=5)
    gen = spawn_gen(cfg)
    rd = handle(cfg)
    try:
        whlib.until(lambda: _C.spec_locate(rd, 0), 60, "generation 0")
        _C.spec_need(rd, 1)
        with whlib.header_lock_held(cfg) as me:
            whlib.wait_line(gen.stderr, f"held by pid {me}", 60)
            whlib.assert_alive([gen], "while the lock was held")
        whlib.wait_line(gen.stderr, "the store answers again", 60)
        _C.spec_need(rd, 4)
        whlib.until(lambda: _C.spec_locate(rd, 4), 60, "generation 4 after the release")
        read_exact(rd, 4, want=gen_sample_of)
    finally:
        code = whlib.stop(gen)
        rd.close()
    assert code == 0


# ---- damaged spec fields -------------------------------------------------

def test_swapped_labels_are_no_labels(shm_cfg):
    """Two sealed areas' spec labels swapped: neither is taken for the other
    generation (that would hand a reader another index's bytes); both count
    as not stored and are made again, exactly."""
    cfg = cfg_of(shm_cfg)
    g, rd = handle(cfg), handle(cfg)
    try:
        make_until_ahead(g)
        with Seg(cfg) as seg:
            a0, a1 = seg.area_of(_C.spec_locate(rd, 0)), seg.area_of(_C.spec_locate(rd, 1))
            off = seg.lay["slot_spec_label"]
            l0, l1 = seg.u64(seg.slot(a0) + off), seg.u64(seg.slot(a1) + off)
            seg.put64(seg.slot(a0) + off, l1)
            seg.put64(seg.slot(a1) + off, l0)
        assert _C.spec_locate(rd, 0) == 0 and _C.spec_locate(rd, 1) == 0
        cs = [claimed(g), claimed(g)]
        assert [c.index for c in cs] == [0, 1]
        for c in cs:
            put(g, c)
        _C.spec_need(rd, 0)
        make_until_ahead(g)
        for s in range(4):
            read_exact(rd, s)
    finally:
        g.close()
        rd.close()


def test_damaged_params_copy_is_an_error(shm_cfg):
    """A byte of an area's params copy changed: the generator gets an error
    naming the damage, never a document fn did not ask for."""
    cfg = cfg_of(shm_cfg)
    st = handle(cfg)
    try:
        st.params_set(json.dumps({"lr": 0.1}))
        c = claimed(st)
        assert json.loads(_C.spec_params(st, c)) == {"lr": 0.1}
        with Seg(cfg) as seg:
            off = seg.params_copy(seg.area_of(c.generation))
            assert bytes(seg.m[off:off + 11]) == b'{"lr": 0.1}'
            seg.m[off + 9] = ord("9")
        with pytest.raises(wt.CorruptSampleError, match="params document .* is damaged"):
            _C.spec_params(st, c)
    finally:
        st.close()


def test_damaged_claim_entries_neither_hang_nor_skip(shm_cfg):
    """A claim entry forged DONE without a put is still claimed (a skipped
    index would never let its generation seal); one forged with attempts
    past SPEC_ATTEMPTS fails the index for good; forged pids, expiries and
    states are claimed as expired or free."""
    cfg = cfg_of(shm_cfg)
    st = handle(cfg)
    try:
        c0 = claimed(st)
        with Seg(cfg) as seg:
            area = seg.area_of(c0.generation)
            e1, e2, e3 = (seg.claim_entry(area, p) for p in (1, 2, 3))
            seg.put32(e1 + 24, 2)  # DONE, never put
            seg.put32(e2, 0xffffffff)  # pid -1, HELD, expiry far ahead
            seg.put32(e2 + 24, 1)
            seg.put64(e2 + 16, (1 << 64) - 1)
            seg.put32(e3 + 24, 0x7777)  # no state at all
        got = [claimed(st) for _ in range(CAP - 1)]
        assert [(c.index, c.attempt) for c in got] == [(1, 1), (2, 1), (3, 1)]
        for c in [c0] + got:
            put(st, c)
        read_exact(st, 0)
        c4 = claimed(st)
        with Seg(cfg) as seg:
            seg.put32(seg.claim_entry(seg.area_of(c4.generation), 1) + 4, 0xfffffff0)
        with pytest.raises(wt.SpecFailedError, match="sample index 5 .* failed 4294967280"):
            claim(st)
    finally:
        st.close()


def test_flipped_spec_byte_in_the_header_changes_no_handle(shm_cfg):
    """The header's spec flag zeroed under attached handles: they stay in
    spec mode (their mode was checked at attach), so a manager's seal does
    not run the freshest seal over spec areas; a new opener is refused."""
    cfg = cfg_of(shm_cfg)
    g, rd = handle(cfg), handle(cfg)
    try:
        make_until_ahead(g)
        with Seg(cfg) as seg:
            off = seg.lay["hdr_spec_off"] - 16  # spec (u32), its pad, run_seed, spec_off
            assert seg.u32(off) == 1 and seg.u64(off + 8) == SEED
            seg.put32(off, 0)
        assert g.lead()
        assert g.seal() is None
        g.resign()
        assert _C.spec_status(rd)["spec"] is True
        for s in range(4):
            read_exact(rd, s)
        with pytest.raises(ValueError, match="was created without RUN_SEED"):
            handle(cfg).status()
    finally:
        g.close()
        rd.close()


def test_forged_floor_is_ignored(shm_cfg):
    """The persisted floor (the window's start with no reader) forged past
    any index that fits 64 bits: it counts as none, and generators make
    generations 0.. exactly instead of opening an area no label can name,
    claim after claim."""
    cfg = cfg_of(shm_cfg)
    g = handle(cfg)
    try:
        c0 = claimed(g)  # the segment exists
        assert c0.index == 0 and put(g, c0)[0] == _C.SPEC_PUT_ACCEPTED
        with Seg(cfg) as seg:
            seg.put64(seg.lay["hdr_spec_off"] + 8, (1 << 64) - 1)  # spec_off, then spec_floor
        assert make_until_ahead(g) == list(range(1, 4 * CAP))
    finally:
        g.close()
