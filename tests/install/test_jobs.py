"""The job commands the SLURM scripts call (wirehead_torch/apps/jobs.py), run
directly: a user's generator function by module:function with a seed per
process, and the errors for bad options."""
import json
import subprocess
import sys

import pytest

from wirehead_torch.apps.jobs import load_generator

import whlib

USER_GEN = '''
import whlib

def make(seed):
    n = 0
    while True:
        yield whlib.sample(seed, n)
        n += 1
'''


def test_generate_runs_a_user_function_with_one_seed_per_process(shm_cfg, tmp_path):
    cfg = shm_cfg(swap_cap=8)
    (tmp_path / "mygen.py").write_text(USER_GEN)
    path = tmp_path / "config.yaml"
    path.write_text(f"STORE: {cfg['STORE']}\nSWAP_CAP: 8\nSAMPLE: [id, data]\nSELF_SEAL: false\n"
                    f"BYTE_BUDGET: {cfg['BYTE_BUDGET']}\n")
    r = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "generate", "--config",
                        str(path), "--gen-module", "mygen:make", "--procs", "2", "--seed", "40",
                        "--seconds", "1"], cwd=tmp_path, env=whlib.env_for_child(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("pushed") == 2 and "exit codes [0, 0]" in r.stdout, r.stdout
    assert "seed 40" in r.stdout and "seed 41" in r.stdout
    import wirehead_torch as wt
    # generators do not seal here (SELF_SEAL false): the manager seals what they wrote
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    store = whlib.open_store(cfg)
    got = whlib.read_generation(store, store.current(), 8)
    assert got is not None and {tag for tag, _ in got} <= {40, 41}


@pytest.mark.parametrize("spec,text", [
    ("nocolon", "module:function"),
    ("whlib:no_such_function", "no function 'no_such_function'"),
])
def test_bad_gen_module_is_an_error_naming_the_option(spec, text):
    with pytest.raises(ValueError, match=text):
        load_generator(spec)


def test_train_without_config_or_inline_is_refused():
    r = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "train", "--seconds", "1"],
                       env=whlib.env_for_child(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--config is required unless --inline" in r.stderr


def test_train_inline_records_per_step_detail_only_up_to_its_limit(tmp_path):
    r = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "train", "--inline",
                        "--size", "16", "--batch-size", "1", "--seconds", "2",
                        "--record-steps", "3", "--out", str(tmp_path)],
                       env=whlib.env_for_child({"OMP_NUM_THREADS": "1"}), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rec = json.loads((tmp_path / "train.rank0.json").read_text())
    assert rec["steps"] > 3 and rec["samples"] == rec["steps"], rec["steps"]
    assert rec["recorded_steps"] == 3 and len(rec["step_t"]) == 3
    assert sum(len(ep) for ep in rec["epochs"]) == 3
    assert f"train rank 0/1: {rec['steps']} steps" in r.stdout


SPEC_GEN = '''
import numpy as np

def make(spec):
    return np.full(4, spec.seed % 1000, np.int64), np.array([spec.index], np.int64)
'''


def test_generate_in_spec_mode_calls_the_function_of_each_spec(shm_cfg, tmp_path):
    """With RUN_SEED, generate runs module:function as fn(spec) (2 processes
    share the claims), --seed and --shards are refused naming the key, and
    status shows the spec lines."""
    import numpy as np

    import wirehead_torch as wt
    cfg = shm_cfg(swap_cap=4, sample=("x", "k"))
    (tmp_path / "specgen.py").write_text(SPEC_GEN)
    path = tmp_path / "config.yaml"
    path.write_text(f"STORE: {cfg['STORE']}\nSWAP_CAP: 4\nSAMPLE: [x, k]\nRUN_SEED: 9\n"
                    f"BYTE_BUDGET: 1MiB\n")
    base = [sys.executable, "-m", "wirehead_torch.apps.cli"]
    for bad in (["--gen-module", "specgen:make", "--seed", "3"], ["--shards", "x.tar"]):
        r = subprocess.run(base + ["generate", "--config", str(path), *bad], cwd=tmp_path,
                           env=whlib.env_for_child(), capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and f"{bad[-2]}: the config has RUN_SEED" in r.stderr, r.stderr
    r = subprocess.run(base + ["generate", "--config", str(path), "--gen-module", "specgen:make",
                               "--procs", "2", "--seconds", "3"], cwd=tmp_path,
                       env=whlib.env_for_child(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("specgen:make of each spec, RUN_SEED 9") == 2, r.stdout
    spec_cfg = dict(cfg, SAMPLE=["x", "k"], RUN_SEED=9, BYTE_BUDGET="1MiB")
    ds = wt.MongoTupleheadDataset(config=spec_cfg, output="numpy")
    for i in range(4):  # epoch 0 reads spec generation 0: index i at position i
        x, k = ds[i]
        assert int(k[0]) == i and np.array_equal(x, np.full(4, wt.spec_seed(9, i) % 1000))
    st = subprocess.run(base + ["status", "--config", str(path)], cwd=tmp_path,
                        env=whlib.env_for_child(), capture_output=True, text=True, timeout=120)
    assert st.returncode == 0, st.stderr
    assert "spec mode        RUN_SEED 9; sealed up to spec generation #" in st.stdout, st.stdout
    js = json.loads(subprocess.run(base + ["status", "--config", str(path), "--json"],
                                   cwd=tmp_path, env=whlib.env_for_child(), capture_output=True,
                                   text=True, timeout=120).stdout)
    assert js["spec"]["spec"] and js["spec"]["run_seed"] == 9 and js["spec"]["any_sealed"]
