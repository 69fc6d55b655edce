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
