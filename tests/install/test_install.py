"""Installs where users are: the generator side runs without torch."""
import os
import subprocess
import sys

import whlib

# Makes `import torch` fail in the child, as on a machine without torch.
_BLOCK_TORCH = r'''
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoTorch())
'''


def _run_without_torch(code, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(_BLOCK_TORCH)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


def test_generator_manager_and_status_without_torch(tmp_path):
    name = whlib.unique_name()
    code = f'''
import sys
import numpy as np
import wirehead_torch as wt
cfg = {{"STORE": "shm://{name}", "SWAP_CAP": 3, "SAMPLE": ["x", "y"], "BYTE_BUDGET": "1MiB",
        "SELF_SEAL": False}}
try:
    items = [(np.full(4, i, np.float32), np.int64(i)) for i in range(3)]
    wt.WireheadGenerator(iter(items), config=cfg, quiet=True).run()
    assert wt.WireheadManager(config=cfg, quiet=True).run(max_swaps=1) == 1
    st = wt.status(cfg)
    assert st["read_gen"] and st["generated"] == 3, st
    ds = wt.MongoTupleheadDataset(config=cfg, output="numpy")
    assert sorted(int(ds[i][1]) for i in range(3)) == [0, 1, 2]
    try:
        wt.WireheadLoader
    except ImportError as e:
        assert "wirehead_torch[torch]" in str(e), e
    else:
        raise AssertionError("WireheadLoader imported without torch")
    assert "torch" not in sys.modules
    print("ok")
finally:
    wt.clean(cfg)
'''
    r = _run_without_torch(code, tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_cli_without_torch(tmp_path):
    r = _run_without_torch("import sys; from wirehead_torch.cli import main; "
                           "sys.argv = ['wirehead-torch', '--help']; main()", tmp_path)
    assert r.returncode == 0 and "manager" in r.stdout, r.stderr


def test_import_does_not_load_torch():
    r = subprocess.run([sys.executable, "-c", "import sys, wirehead_torch; "
                        "print('torch' in sys.modules)"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
