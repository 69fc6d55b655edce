"""The store guarantees of docs/design.md, shown with real processes."""
import json
import os
import subprocess
import sys
import time

import pytest

import wirehead_torch as wt

import whlib
from whlib import open_store, read_generation

pytestmark = pytest.mark.asan  # also run against the sanitizer build


def test_killed_mid_put_leaves_nothing_and_others_carry_on(shm_cfg):
    cfg = shm_cfg(swap_cap=6)
    victim = whlib.spawn("gen", cfg, 66, env={"WIREHEAD_FAULT_PUT_PAUSE": "60"})
    try:
        whlib.wait_line(victim.stderr, "fault pause in put", 60)
        st = wt.status(cfg)
        assert st["write_fill"] == 0 and st["write_bytes"] > 0  # bytes written, not committed
        victim.kill()
        victim.wait(10)
    finally:
        whlib.stop(victim)
    store = open_store(cfg)
    assert store.current() == 0
    assert wt.WireheadGenerator((whlib.sample(7, i) for i in range(6)), config=cfg).run() == 6
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    seen = read_generation(store, store.current(), 6)
    assert sorted(seen) == [(7, i) for i in range(6)]
    # the dead writer's reservation does not block recycling its area
    for g in range(3):
        wt.WireheadGenerator((whlib.sample(8, 10 * g + i) for i in range(6)), config=cfg).run()
        assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    assert wt.status(cfg)["seals"] == 4


def test_three_generators_reader_through_20_swaps(store_cfg):
    swap_cap = 10
    cfg = store_cfg(swap_cap=swap_cap, budget="1MiB")
    gens = [whlib.spawn("gen", cfg, tag) for tag in (1, 2, 3)]
    mgr = whlib.spawn("manager", cfg, stdout=subprocess.PIPE)
    store = open_store(cfg)
    try:
        for p in gens + [mgr]:
            whlib.wait_line(p.stderr, "STARTED", 60)
        gens_seen, last = [], 0
        deadline = time.monotonic() + 120
        while len(gens_seen) < 20:
            assert time.monotonic() < deadline, f"only {len(gens_seen)} generations in 120s"
            gen = store.current()
            if gen == last:
                time.sleep(0.002)
                continue
            assert gen > last, "generation ids must only increase"
            seen = read_generation(store, gen, swap_cap)
            if seen is None:
                continue  # reclaimed while we read: the next one is newer
            assert len(set(seen)) == swap_cap, "a sample appears twice in one generation"
            gens_seen.append((gen, seen))
            last = gen
        st = wt.status(cfg)
        assert st["seals"] >= 20 and st["generated"] >= 20 * swap_cap
    finally:
        codes = [whlib.stop(p) for p in gens + [mgr]]
    assert codes == [0, 0, 0, 0], "SIGTERM must end generators and manager with exit 0"
    tags = {t for _, seen in gens_seen for t, _ in seen}
    assert tags == {1, 2, 3}
    # no sample sealed into two generations
    every = [s for _, seen in gens_seen for s in seen]
    assert len(every) == len(set(every))
    assert wt.status(cfg)["leader_pid"] == 0, "the manager released its lease on SIGTERM"


def test_killed_manager_is_replaced_and_sealing_resumes(shm_cfg):
    cfg = shm_cfg(swap_cap=4, LEASE_SECONDS=30)
    holder = whlib.spawn("lease", cfg)
    try:
        whlib.wait_line(holder.stderr, "LEASED", 60)
        wt.WireheadGenerator((whlib.sample(1, i) for i in range(4)), config=cfg).run()
        store = open_store(cfg)
        assert not store.lead(), "a live lease holder keeps the lease"
        with pytest.raises(wt.LeaseLostError):
            store.seal()
        holder.kill()
        holder.wait(10)
    finally:
        whlib.stop(holder)
    # the dead holder's lease is taken over at once, long before its 30 s expiry
    t0 = time.monotonic()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    assert time.monotonic() - t0 < 10
    assert wt.status(cfg)["read_gen"] != 0


def test_manager_sigkilled_then_restarted(store_cfg):
    cfg = store_cfg(swap_cap=4)
    gen = whlib.spawn("gen", cfg, 5)
    mgr = whlib.spawn("manager", cfg, stdout=subprocess.PIPE)
    try:
        whlib.wait_line(mgr.stdout, '"generation"', 60)
        mgr.kill()
        mgr.wait(10)
        seals = wt.status(cfg)["seals"]
        mgr2 = whlib.spawn("manager", cfg, 3, stdout=subprocess.PIPE)
        lines = []
        for _ in range(3):
            lines += whlib.wait_line(mgr2.stdout, '"generation"', 60)
        assert mgr2.wait(30) == 0
        recs = [json.loads(l) for l in lines if l.startswith("{")]
        assert len(recs) == 3 and all(r["generation"] > 0 for r in recs)
        assert [r["generation"] for r in recs] == sorted(r["generation"] for r in recs)
        assert wt.status(cfg)["seals"] >= seals + 3
    finally:
        whlib.stop(gen)
        whlib.stop(mgr)


def test_stale_segment_from_crashed_creator_is_replaced(shm_cfg):
    cfg = shm_cfg(swap_cap=2)
    name = cfg["STORE"][len("shm://"):]
    path = f"/dev/shm/wirehead.{name}"
    # a creator that died before writing the header: zero-filled, no magic
    with open(path, "wb") as f:
        f.truncate(1 << 16)
    os.chmod(path, 0o600)
    t0 = time.monotonic()
    st = open_store(cfg).status()
    assert st["read_gen"] == 0 and st["swap_cap"] == 2
    assert time.monotonic() - t0 < 15
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_generation_ids_increase_across_recreation(store_cfg):
    cfg = store_cfg(swap_cap=1)
    ids = []
    for round_ in range(3):
        wt.WireheadGenerator(iter([whlib.sample(1, round_)]), config=cfg).run()
        wt.WireheadManager(config=cfg).run(max_swaps=1)
        ids.append(wt.status(cfg)["read_gen"])
        wt.clean(cfg)
    assert ids == sorted(ids) and len(set(ids)) == 3


def test_reader_waits_then_times_out_clearly(store_cfg):
    cfg = store_cfg(swap_cap=3, READ_TIMEOUT=0.3)
    wt.WireheadGenerator(iter([whlib.sample(1, 0)]), config=cfg).run()
    with pytest.raises(TimeoutError) as e:
        wt.MongoheadDataset(config=cfg)[0]
    msg = str(e.value)
    assert "1 of SWAP_CAP=3" in msg and "manager" in msg


def test_surplus_is_discarded_and_counted(store_cfg):
    cfg = store_cfg(swap_cap=3)
    g = wt.WireheadGenerator((whlib.sample(1, i) for i in range(10)), config=cfg)
    assert g.run() == 10 and g.accepted == 3 and g.discarded == 7
    st = wt.status(cfg)
    assert st["write_fill"] == 3 and st["discarded"] == 7
    wt.WireheadManager(config=cfg).run(max_swaps=1)
    seen = read_generation(open_store(cfg), wt.status(cfg)["read_gen"], 3)
    assert seen == [(1, 0), (1, 1), (1, 2)]  # the first SWAP_CAP committed make the generation


def test_segment_mode_and_clean_removes_only_this_store(shm_cfg):
    a, b = shm_cfg(swap_cap=1), shm_cfg(swap_cap=1)
    open_store(a), open_store(b)
    pa = f"/dev/shm/wirehead.{a['STORE'][6:]}"
    pb = f"/dev/shm/wirehead.{b['STORE'][6:]}"
    assert os.stat(pa).st_mode & 0o777 == 0o600
    cfgfile = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"{a['STORE'][6:]}.yaml")
    with open(cfgfile, "w") as f:
        json.dump(a, f)  # JSON is YAML
    try:
        out = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "clean", "--config",
                              cfgfile], env=whlib.env_for_child(), capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    finally:
        os.unlink(cfgfile)
    assert not os.path.exists(pa) and os.path.exists(pb)


def test_cli_status_and_manager_json(store_cfg, tmp_path):
    cfg = store_cfg(swap_cap=2)
    p = tmp_path / "c.yaml"
    p.write_text(json.dumps(cfg))
    wt.WireheadGenerator((whlib.sample(1, i) for i in range(2)), config=cfg).run()
    env = whlib.env_for_child()
    out = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "manager", "--config",
                          str(p), "--json", "--max-swaps", "1"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(rec) >= {"time", "generation", "generated", "discarded", "seal_s", "samples_per_s"}
    out = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "status", "--config",
                          str(p), "--json"], env=env, capture_output=True, text=True, timeout=60)
    st = json.loads(out.stdout)
    assert st["read_gen"] == rec["generation"] and st["history"][-1]["generation"] == rec["generation"]
    out = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "status", "--config",
                          str(p)], env=env, capture_output=True, text=True, timeout=60)
    # people read a short label (the store's first generation), --json the full id
    assert "read generation  #1\n" in out.stdout and str(rec["generation"]) not in out.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("SAMPLE: [a]\n")
    out = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "status", "--config",
                          str(bad)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "SWAP_CAP" in out.stderr and str(bad) in out.stderr


def test_status_of_a_missing_store_creates_nothing(shm_cfg, tmp_path):
    cfg = shm_cfg(swap_cap=2)
    with pytest.raises(wt.NotFoundError, match="no shm store"):
        wt.status(cfg)
    assert not os.path.exists(f"/dev/shm/wirehead.{cfg['STORE'][6:]}")
    p = tmp_path / "c.yaml"
    p.write_text(json.dumps(cfg))
    out = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "status", "--config",
                          str(p)], env=whlib.env_for_child(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "no shm store" in out.stderr


def test_byte_budget_is_fixed_at_creation(shm_cfg):
    cfg = shm_cfg(swap_cap=2, budget="64KiB")
    open_store(cfg)
    with pytest.raises(wt.SchemaMismatchError, match="BYTE_BUDGET=65536.*clean"):
        open_store(dict(cfg, BYTE_BUDGET="1MiB"))
    wt.clean(cfg)
    assert open_store(dict(cfg, BYTE_BUDGET="1MiB")).status()["byte_budget"] == 1 << 20


def test_seal_blocked_by_a_paused_writer_is_logged(shm_cfg):
    """A live generator paused inside a put holds bytes in its generation's
    area: with four areas one such area never stops sealing (the next write
    area is another), but a second paused generator in a later generation
    leaves no free area: sealing waits, and the manager says for whom."""
    cfg = shm_cfg(swap_cap=2)
    pause = {"WIREHEAD_FAULT_PUT_PAUSE": "120"}
    victims = [whlib.spawn("gen", cfg, 66, env=pause)]
    mgr = whlib.spawn("manager", cfg, stdout=subprocess.PIPE)
    gen = whlib.spawn("gen", cfg, 7)
    try:
        whlib.wait_line(victims[0].stderr, "fault pause in put", 60)
        seals = wt.status(cfg)["seals"]
        whlib.until(lambda: wt.status(cfg)["seals"] >= seals + 5, 60,
                    "seals past one paused writer")
        victims.append(whlib.spawn("gen", cfg, 67, env=pause))
        whlib.wait_line(victims[1].stderr, "fault pause in put", 60)
        lines = whlib.wait_line(mgr.stderr, "sealing waits for it", 60)
        assert any(f"generator pid {v.pid}" in lines[-1] for v in victims)
        seals = wt.status(cfg)["seals"]
        for v in victims:
            v.kill()
            v.wait(10)
        whlib.until(lambda: wt.status(cfg)["seals"] > seals, 60, "a seal after the writers died")
    finally:
        codes = [whlib.stop(p) for p in (gen, mgr, *victims)]
    assert codes[:2] == [0, 0]


def test_sigint_also_ends_generator_and_manager_cleanly(shm_cfg):
    import signal
    cfg = shm_cfg(swap_cap=4)
    gen = whlib.spawn("gen", cfg, 3)
    mgr = whlib.spawn("manager", cfg, stdout=subprocess.PIPE)
    try:
        whlib.wait_line(mgr.stdout, '"generation"', 60)
    finally:
        codes = [whlib.stop(p, sig=signal.SIGINT) for p in (gen, mgr)]
    assert codes == [0, 0]
    assert wt.status(cfg)["leader_pid"] == 0
