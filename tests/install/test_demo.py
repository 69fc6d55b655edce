"""`make demo` end to end, short: generators, manager and training start,
train, stop, and leave no segment behind (also under torchrun)."""
import glob
import subprocess
import sys

import pytest

import whlib


@pytest.mark.parametrize("ddp", [None, 2])
def test_demo_runs_and_cleans_up(ddp):
    store = f"shm://{whlib.unique_name('demo')}"
    cmd = [sys.executable, "-m", "wirehead_torch.apps.demo", "--seconds", "6", "--size", "16",
           "--store", store, "--json"]
    if ddp:
        cmd += ["--ddp", str(ddp)]
    out = subprocess.run(cmd, env=whlib.env_for_child(), capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-4000:] + "\n--- stdout:\n" + out.stdout[-1500:]
    assert '"step"' in out.stdout or '"steps"' in out.stdout, out.stdout[-2000:]
    assert not glob.glob(f"/dev/shm/wirehead.{store[6:]}")
