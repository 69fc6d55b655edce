"""`status` lists the readers from the heartbeat they leave in the store:
pid, the generation each reads, samples read of it (reuse) and its rate."""
import os

import wirehead_torch as wt

import whlib


def _fill(cfg, n):
    g = wt.WireheadGenerator((whlib.sample(1, i) for i in range(n)), config=cfg, n_samples=n)
    g.quiet = True
    g.run()


def test_status_lists_readers(store_cfg):
    cfg = store_cfg(swap_cap=4, SELF_SEAL=True)
    _fill(cfg, 8)
    assert wt.status(config=cfg)["readers"] == []
    loader = wt.WireheadLoader(config=cfg, batch_size=2, num_threads=1)
    for _ in loader:
        pass
    st = wt.status(config=cfg)
    mine = [r for r in st["readers"] if r["pid"] == os.getpid()]
    assert len(mine) == 1, st["readers"]
    r = mine[0]
    assert r["generation"] == st["read_gen"]
    assert 1 <= r["reads"] <= 4 and r["reuse"] == r["gen_reads"] / 4
    assert 0 <= r["age_s"] < 30 and r["samples_per_s"] >= 0
    # every reader of the read generation counts toward its reuse per sample
    assert st["reuse_per_sample"] == round(sum(x["reuse"] for x in st["readers"]
                                               if x["generation"] == st["read_gen"]), 2)
    assert st["reuse_per_sample"] >= r["reuse"] > 0
    if cfg["STORE"].startswith("shm://"):
        loader.close()  # a closed reader leaves the list at once (shm)
        assert wt.status(config=cfg)["readers"] == []


def test_cli_status_shows_readers(shm_cfg, tmp_path):
    import subprocess
    import sys

    import yaml
    cfg = shm_cfg(swap_cap=4, SELF_SEAL=True)
    _fill(cfg, 8)
    loader = wt.WireheadLoader(config=cfg, batch_size=2, num_threads=1)
    for _ in loader:
        pass
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "status"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60, env=whlib.env_for_child())
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith(f"  {os.getpid()}"))
    assert "reuse" in line and "samples/s" in line, r.stdout
    assert "readers          1; each sample of the read generation served" in r.stdout


def test_status_says_when_generators_stopped(store_cfg):
    """`status` tells a store nobody writes to from one being filled: the time
    of the newest put, accepted or discarded, on both backends."""
    import time

    from wirehead_torch import _C
    from wirehead_torch._store_args import store_kwargs
    from wirehead_torch.apps.cli import GENERATOR_IDLE_S, _fmt_status
    from wirehead_torch.config import resolve
    cfg = store_cfg(swap_cap=4, SELF_SEAL=False)
    _C.Store(**store_kwargs(resolve(cfg))).close()  # the store, with nothing put
    st = wt.status(config=cfg)
    assert st["last_put"] == 0
    assert "generators       none has put a sample yet\n" in _fmt_status(st)
    t0 = time.time()
    _fill(cfg, 2)  # accepted
    st = wt.status(config=cfg)
    assert t0 - 1 <= st["last_put"] <= time.time() + 1, st["last_put"]
    line = next(x for x in _fmt_status(st).splitlines() if x.startswith("generators"))
    assert line.startswith("generators       last put "), line
    # the same store a while later, as `status` would print it then
    later = _fmt_status(st, now=st["last_put"] + GENERATOR_IDLE_S + 5)
    assert f"generators       none in the last {GENERATOR_IDLE_S} s: last put " in later
    assert "(1 min ago)" in later
    # a put the full write generation discards counts too
    _fill(cfg, 2)
    full = wt.status(config=cfg)
    assert full["write_fill"] == 4 and full["discarded"] == 0
    _fill(cfg, 1)
    st = wt.status(config=cfg)
    assert st["discarded"] == 1 and st["last_put"] > full["last_put"]


def test_status_rate_runs_until_now(store_cfg):
    """`rate` is the samples accepted from the oldest swap listed until the
    moment of `status`, not until the newest swap: a store whose generators
    stopped shows a rate that falls."""
    import time
    cfg = store_cfg(swap_cap=4, SELF_SEAL=True)
    _fill(cfg, 10)  # two swaps, two samples in the write generation
    t0 = time.time()
    st = wt.status(config=cfg)
    t1 = time.time()
    first = st["history"][0]
    got = st["generated"] - first["generated"]
    assert got >= 6, st
    assert got / (t1 - first["time"]) <= st["samples_per_s"] <= got / (t0 - first["time"])
