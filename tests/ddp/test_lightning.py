"""A LightningDataModule that builds the dataset in __init__ under the
ddp_spawn strategy (2 CPU ranks): each rank reads its own share, no sample
twice per epoch, and every rank takes the same number of steps. Runs in the
torch 2.x lane (`make test-torch2`), where Lightning is installed."""
import json
import os
import re
import subprocess
import sys

import pytest

import wirehead_torch as wt

import whlib

pytestmark = pytest.mark.lightning

N, EPOCHS = 14, 2


def test_datamodule_built_in_init_under_ddp_spawn(store_cfg, tmp_path):
    pytest.importorskip("lightning", reason="Lightning is installed in the torch 2.x lane")
    cfg = store_cfg(swap_cap=N)
    wt.WireheadGenerator((whlib.sample(2, i) for i in range(N)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    env = whlib.env_for_child({"PL_DISABLE_FORK": "1"})
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(var, None)
    env["MASTER_ADDR"], env["MASTER_PORT"] = "127.0.0.1", str(whlib.free_port())
    out = subprocess.run([sys.executable, f"{whlib.HERE}/lightning_proc.py", json.dumps(cfg),
                          str(tmp_path), str(EPOCHS)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    got = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    assert [g["world"] for g in got] == [2, 2]
    for epoch in map(str, range(EPOCHS)):
        steps = [len(g["epochs"][epoch]) for g in got]
        assert steps[0] == steps[1] > 0, f"epoch {epoch}: unequal steps {steps}"
        real = [(gen, pos) for g in got for batch in g["epochs"][epoch]
                for gen, pos, pad in batch if not pad]
        assert len(real) == len(set(real)), f"epoch {epoch}: a sample read twice: {sorted(real)}"
        assert len(set(real)) == N, f"epoch {epoch}: {len(set(real))} of {N} samples read"


def _lightning_doc_blocks():
    """docs/lightning.md's python module (its file= name and text) and the
    text of the sh block that runs it."""
    with open(os.path.join(whlib.REPO, "docs", "lightning.md"), encoding="utf-8") as f:
        doc = f.read()
    blocks = re.findall(r"(?:<!--\s*docs-test:([^>]*)-->\n)?```(\w+)\n(.*?)\n```\n", doc, re.S)
    files = [(re.search(r"file=(\S+)", mark).group(1), text + "\n")
             for mark, lang, text in blocks if "file=" in mark]
    run = [text + "\n" for mark, lang, text in blocks if lang == "sh"]
    assert len(files) == 1 and len(run) == 1, blocks
    return files[0], run[0]


def test_docs_lightning_stays_on_the_ring_every_epoch(tmp_path):
    """docs/lightning.md as written: 3 epochs under the default strategy
    (DDP) and under ddp_spawn, a DataLoader without persistent workers (new
    workers every epoch). No epoch's worker falls back from the batch ring:
    each takes its region over from the previous epoch's."""
    pytest.importorskip("lightning", reason="Lightning is installed in the torch 2.x lane")
    (name, module), run = _lightning_doc_blocks()
    (tmp_path / name).write_text(module)
    store = f"shm://{whlib.unique_name('lightning')}"
    env = whlib.env_for_child({"WIREHEAD_STORE": store, "PL_DISABLE_FORK": "1"})
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR"):
        env.pop(var, None)
    # the venv activated, as the user's shell has it
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    try:
        out = subprocess.run(["bash", "-e", "-c", run], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
    finally:
        wt.clean({"STORE": store, "SWAP_CAP": 1, "SAMPLE": ["x"]})
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    # each strategy ran its 3 epochs to the end
    assert log.count("`Trainer.fit` stopped: `max_epochs=3` reached.") == 2, log[-4000:]
    assert "ordinary way" not in log, log[-4000:]
    assert not [p for p in os.listdir("/dev/shm") if store[len("shm://"):] in p]
