"""The original wirehead's documented usage, run with only the import
changed (the `wirehead` package this distribution ships): its unit example
with no manager, the blog's 256^3 sample, the logger and the `wirehead`
command, clean while running, a 64 MiB /dev/shm. Both stores.

The scripts below are written here from the original's public API (class
names, keyword arguments, config keys); none is copied."""
import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import wirehead_torch as wt
from wirehead_torch.config import load_config

import whlib

SWAP_CAP = 100

# The `wirehead` package under test: this checkout's compatibility package
# (compat/, a distribution of its own), ahead of any installed one.
COMPAT = os.path.join(whlib.REPO, "compat")
sys.path.insert(0, COMPAT)


def _env():
    """Child environment importing this checkout's `wirehead` first."""
    return whlib.env_for_child({"PYTHONPATH": os.pathsep.join(
        [COMPAT, whlib.env_for_child()["PYTHONPATH"]])})


def _original_config(kind, name, mongo=None, swap_cap=SWAP_CAP, extra=""):
    """config.yaml text with the original's keys only. shm: no MONGOHOST,
    so DBNAME names the embedded store; mongo: PORT quoted as YAML users
    of the original wrote it."""
    host = ""
    if kind == "mongo":
        hostport = mongo.uri[len("mongodb://"):]
        h, p = hostport.rsplit(":", 1)
        host = f'MONGOHOST: "{h}"\nPORT: "{p}"\n'
    return (f'{host}DBNAME: "{name}"\nSWAP_CAP: {swap_cap}\nSAMPLE: ["data", "label"]\n'
            f'WRITE_COLLECTION: "write"\nREAD_COLLECTION: "read"\n'
            f'COUNTER_COLLECTION: "counter"\nTEMP_COLLECTION: "temp"\nCHUNKSIZE: 10\n{extra}')


@pytest.fixture(params=["shm", "mongo"])
def original_dir(request, tmp_path, monkeypatch):
    """A working directory holding an original-style config.yaml (cwd)."""
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    mongo = request.getfixturevalue("mongo_server") if request.param == "mongo" else None
    name = whlib.unique_name("orig")

    def write(**kw):
        (tmp_path / "config.yaml").write_text(_original_config(request.param, name, mongo, **kw))
        return tmp_path

    write()
    monkeypatch.chdir(tmp_path)
    yield write
    wt.clean(load_config(tmp_path / "config.yaml"))


GENERATOR = '''
import numpy as np
from wirehead import WireheadGenerator

def create_generator():
    for i in range({n}):
        img = i + np.arange(256) / 256.0
        lab = np.full(256, float(i))
        yield (img, lab)

if __name__ == "__main__":
    brain_generator = create_generator()
    wirehead_runtime = WireheadGenerator(
        generator=brain_generator,
        config_path="config.yaml",
        n_samples={n},
    )
    wirehead_runtime.run(verbose=True)
'''


def _write(d, name, text):
    (d / name).write_text(textwrap.dedent(text))
    return d / name


def test_unit_example_without_manager(original_dir):
    """A generator with run(verbose=True) and no manager fills and seals a
    generation itself; a reader indexing [[i]] sees all of it."""
    d = original_dir()
    gen = whlib.spawn_script([_write(d, "generator.py", GENERATOR.format(n=SWAP_CAP))], cwd=d,
                             env=_env())
    assert gen.wait(120) == 0, whlib.drained(gen.stderr)
    out = "".join(whlib.drained(gen.stdout))
    assert "Generator: Initialized" in out
    assert out.count("pushed sample") == SWAP_CAP
    assert "swap success" in out  # it sealed, no manager ran
    whlib.stop(gen)

    import wirehead
    assert wirehead.__file__ == os.path.join(COMPAT, "wirehead", "__init__.py")
    from wirehead import MongoTupleheadDataset
    from wirehead.dataset import MongoheadDataset, unit_interval_normalize
    dataset = MongoTupleheadDataset(config_path="config.yaml")
    seen = set()
    for i in range(SWAP_CAP):
        data = dataset[[i]]
        sample, label = data[0][0], data[0][1]
        assert sample.shape == (256,) and bool((label == int(sample[0])).all())
        seen.add(int(sample[0]))
    assert seen == set(range(SWAP_CAP))  # one whole generation, each sample once

    ds = MongoheadDataset("config.yaml", normalize=unit_interval_normalize,
                          transform=lambda t: t * 2, sample=("label", "data"))
    item = ds[[3]][3]  # input: the label field, doubled, scaled to [0, 1] (all equal: nan)
    x, y = item["input"], item["label"]
    assert x.dtype.is_floating_point and y.shape == (256,)
    assert float(y.min()) == 2 * int(y[0] / 2) and float(y.max() - y.min()) == pytest.approx(2 * 255 / 256)
    ds = MongoheadDataset("config.yaml", normalize=unit_interval_normalize)
    x = ds[[5]][5]["input"]
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    with pytest.raises(ValueError, match="sample= names"):
        MongoheadDataset("config.yaml", sample=("data", "mask"))


def test_quoted_port_and_default_config_path(original_dir):
    """PORT: "45055" and the default config path "config.yaml" (cwd)."""
    d = original_dir()
    g = wt.WireheadGenerator(iter([(np.zeros(3), np.ones(3))]), quiet=True)
    assert g.cfg["SWAP_CAP"] == SWAP_CAP and isinstance(g.cfg["PORT"], int)
    assert g.cfg["STORE"] == load_config(d / "config.yaml")["STORE"]


def test_run_generator_is_the_originals_name_for_run(shm_cfg, capsys):
    """run_generator(), the loop's name in the original's scripts, puts
    n_samples samples, seals the generation they fill and says the
    original's lines, as run() does."""
    from wirehead import WireheadGenerator
    cfg = shm_cfg(swap_cap=2, sample=("data", "label"), SELF_SEAL=True)
    items = iter([(np.full(4, float(i)), np.zeros(4, np.uint8)) for i in range(3)])
    g = WireheadGenerator(items, config=cfg, n_samples=2)
    assert g.run_generator() == 2 and g.accepted == 2 and g.sealed == 1
    out = capsys.readouterr().out
    assert "Generator: Initialized" in out and "done: 2 samples" in out, out


def test_blog_256_cubed_float64_shm(tmp_path, monkeypatch):
    """The blog's 256^3 float64 sample on the embedded store with only the
    original keys: the store sizes itself from the first sample."""
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text(_original_config("shm", whlib.unique_name("blog"),
                                                           swap_cap=1))
    cfg = load_config("config.yaml")
    try:
        img = np.random.default_rng(1).random((256, 256, 256))
        lab = (img > 0.5).astype(np.float64)
        from wirehead import MongoTupleheadDataset, WireheadGenerator
        g = WireheadGenerator(iter([(img, lab)]), config_path="config.yaml", n_samples=1)
        assert g.run() == 1 and g.sealed == 1
        st = wt.status(cfg)
        assert st["byte_budget"] >= img.nbytes * 2  # auto: one sample's bytes and slack
        x, y = MongoTupleheadDataset(config_path="config.yaml")[[0]][0]
        assert np.array_equal(x.numpy(), img) and np.array_equal(y.numpy(), lab)
    finally:
        wt.clean(cfg)


def _three_swaps(d, cap=4):
    d = d(swap_cap=cap)
    from wirehead import WireheadGenerator
    g = WireheadGenerator((whlib.sample(3, i) for i in range(3 * cap)),
                          config_path="config.yaml", quiet=True)
    assert g.run() == 3 * cap and g.sealed == 3
    return d


def test_logger_and_wirehead_command_after_three_swaps(original_dir):
    d = _three_swaps(original_dir)
    from wirehead import SwapLog, WireheadLogger, WireheadSnapshot
    logger = WireheadLogger("config.yaml")
    logs = logger.history()
    assert [s.swap_count for s in logs] == [1, 2, 3]
    assert all(isinstance(s, SwapLog) for s in logs)
    assert logs[0].swap_duration is None and logs[1].prev_swap_timestamp == logs[0].swap_timestamp
    assert logs[2].swap_duration == pytest.approx(logs[2].swap_timestamp - logs[1].swap_timestamp)
    assert logger.history() == []  # nothing new since
    snap = logger.snapshot()
    assert isinstance(snap, WireheadSnapshot) and snap.swap_count == 3
    assert snap.fill_pct == 0.0 and snap.read_docs == 4 and len(snap.recent_swaps) == 3
    assert json.loads(snap.to_jsonl())["recent_swaps"][2]["swap_count"] == 3
    from wirehead_torch.apps.monitor import tui_lines
    text = "\n".join(tui_lines(snap))
    assert "3 total" in text and "#3" in text

    # the `wirehead CONFIG` command: history as JSONL, one line per swap
    p = whlib.spawn_script(["-m", "wirehead.log", "config.yaml"], cwd=d, env=_env())
    assert p.wait(60) == 0
    lines = [json.loads(x) for x in whlib.drained(p.stdout)]
    assert [x["swap_count"] for x in lines] == [1, 2, 3]
    whlib.stop(p)
    p = whlib.spawn_script(["-m", "wirehead.log", "config.yaml", "--daemon", "--count", "2",
                            "--poll-interval", "0.01"], cwd=d, env=_env())
    assert p.wait(60) == 0
    snaps = [json.loads(x) for x in whlib.drained(p.stdout)]
    assert len(snaps) == 2 and all(s["swap_count"] == 3 for s in snaps)
    whlib.stop(p)
    # the console scripts are installed next to the interpreter
    exe = os.path.join(os.path.dirname(sys.executable), "wirehead")
    if os.path.exists(exe):
        r = subprocess.run([exe, "config.yaml"], cwd=d, capture_output=True, text=True,
                           timeout=60, env=whlib.env_for_child())
        assert r.returncode == 0 and len(r.stdout.splitlines()) == 3
    r = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "status", "--config",
                        "config.yaml", "--watch", "--json", "--count", "2", "--interval",
                        "0.01"], cwd=d, capture_output=True, text=True, timeout=60,
                       env=whlib.env_for_child())
    assert r.returncode == 0, r.stderr
    watch = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(watch) == 2 and all(w["seals"] == 3 for w in watch)


def test_no_swaps_yet(original_dir):
    d = original_dir()
    r = subprocess.run([sys.executable, "-m", "wirehead.log", "config.yaml"], cwd=d,
                       capture_output=True, text=True, timeout=60, env=_env())
    assert r.returncode == 0 and r.stdout.strip() == "No swaps recorded yet."


def _samples(tag, n):
    # a function, not a generator expression in a comprehension: that would
    # read the loop's tag late, when every generator sees the last one
    return (whlib.sample(tag, i) for i in range(n))


def _run_in_threads(*targets):
    ts = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in ts:
        t.start()
    return ts


def test_manager_and_self_sealers_never_both_seal(store_cfg):
    """With a manager watching, self-sealing generators still seal: the
    manager holds no lease between seals, logs the generators' seals, and
    seals only a generation they leave full; without one, they seal, each
    generation once."""
    cfg = store_cfg(swap_cap=4, SELF_SEAL=True)
    gens = [wt.WireheadGenerator(_samples(t, 10 ** 9), config=cfg,
                                 quiet=True) for t in (1, 2)]
    m = wt.WireheadManager(config=cfg, quiet=True)
    threads = _run_in_threads(m.run, *(g.run for g in gens))
    whlib.until(lambda: len(m.records) >= 3, 120, "three seals logged by the manager")
    assert sum(g.sealed for g in gens) >= 3  # the generators seal, the manager watches
    for g in gens:
        g.stop()
    for t in threads[1:]:
        t.join(60)
    # a generator that does not seal fills the next generation: the manager seals it
    seals = _status(cfg)["seals"]
    swaps = m.swaps
    filler = wt.WireheadGenerator(_samples(9, 4 - _status(cfg)["write_fill"]),
                                  config=dict(cfg, SELF_SEAL=False), quiet=True)
    filler.run()
    whlib.until(lambda: _status(cfg)["seals"] > seals, 60, "the manager to seal the last one")
    m.stop()
    threads[0].join(120)
    st = wt.status(cfg)
    assert m.swaps == swaps + 1 and filler.sealed == 0 and st["leader_pid"] == 0
    # each generation sealed once, by a generator or by the manager
    assert st["seals"] == m.swaps + sum(g.sealed for g in gens)
    led = [h["generation"] for h in st["history"]]
    assert len(led) == len(set(led))

    # no manager: two self-sealing generators seal every generation exactly once
    cfg2 = store_cfg(swap_cap=4, SELF_SEAL=True)
    gens = [wt.WireheadGenerator(_samples(t, 20), config=cfg2,
                                 quiet=True) for t in (3, 4)]
    for t in _run_in_threads(*(g.run for g in gens)):
        t.join(120)
    st = wt.status(cfg2)
    # every full generation sealed (surplus puts racing a seal are discarded)
    assert sum(g.sealed for g in gens) == st["seals"] >= 5
    assert st["generated"] == 4 * st["seals"] + st["write_fill"] and st["write_fill"] < 4
    gens_sealed = [h["generation"] for h in st["history"]]
    assert len(set(gens_sealed)) == st["seals"]
    store = whlib.open_store(cfg2)
    got = whlib.read_generation(store, store.current(), 4)
    assert got is not None and len(set(got)) == 4


def test_manager_beside_a_self_sealing_generator_adds_no_discards(shm_cfg):
    """One fast self-sealing generator puts a fixed number of samples, with
    and without a manager running beside it: the manager watches (it logs
    the generator's seals) and the discards stay what they are without it
    (a manager holding the lease left each seal to its next poll, and the
    generator's puts meanwhile were discarded)."""
    n, cap = 4000, 16

    def run(with_manager):
        cfg = shm_cfg(swap_cap=cap, SELF_SEAL=True, budget=None)
        g = wt.WireheadGenerator(_samples(1, n), config=cfg, quiet=True)
        m = wt.WireheadManager(config=cfg, quiet=True) if with_manager else None
        t = _run_in_threads(m.run) if m else []
        g.run()
        if m:
            whlib.until(lambda: len(m.records) >= 1, 60, "the manager to log a seal")
            m.stop()
            t[0].join(60)
        assert g.accepted + g.discarded == n
        return g.discarded, wt.status(cfg)["seals"], m

    alone, seals_alone, _ = run(False)
    beside, seals, m = run(True)
    assert seals_alone >= n // cap - 1 and seals >= n // cap - 2 - beside // cap
    # a generator descheduled past SEAL_GRACE between its put and its seal
    # may lose a seal to the manager and a put or two after it: a few, not thousands
    assert beside <= alone + 3, (alone, beside)
    assert len(m.records) >= seals // 2  # it logged the generator's seals as they came


def test_clean_while_running(store_cfg):
    """`wirehead-torch clean` under a running manager and generator: both
    re-attach to the new store, the manager seals it and its rate is right."""
    cfg = store_cfg(swap_cap=4, SELF_SEAL=False, budget=None)
    mgr = whlib.spawn("manager", cfg, stdout=subprocess.PIPE)
    gen = whlib.spawn("gen", cfg, 5)
    try:
        whlib.wait_line(mgr.stdout, "samples_per_s", 60)
        ds = wt.MongoTupleheadDataset(config=cfg, output="numpy")
        newest = max(_counter(ds, i) for i in range(4))
        wt.clean(cfg)
        # the new store's seals: made by the manager after it re-attached
        whlib.until(lambda: _seals_or_0(cfg) >= 3, 60, "seals in the re-created store")
        new = {h["generation"] for h in wt.status(cfg)["history"]}
        recs = []
        while not new.issubset({r["generation"] for r in recs}):
            recs += [json.loads(x) for x in whlib.wait_line(mgr.stdout, "samples_per_s", 60)]
        rates = [r["samples_per_s"] for r in recs if r["generation"] in new]
        assert all(r is None or r > 0 for r in rates) and any(r for r in rates)
        # a reader opened before the clean follows to the new store's samples
        whlib.until(lambda: _counter(ds, 0) > newest, 60, "the reader to re-attach")
    finally:
        assert whlib.stop(gen) == 0
        assert whlib.stop(mgr) == 0


def _counter(ds, i):
    ident, data = ds[[i]][0]
    return whlib.check_sample(ident, data)[1]


def _status(cfg):
    try:
        return wt.status(cfg)
    except wt.NotFoundError:
        return {}


def _seals_or_0(cfg):
    return _status(cfg).get("seals", 0)


SMALL_SHM = '''
import numpy as np, wirehead_torch as wt
cfg = {{"STORE": "shm://small", "SWAP_CAP": 20, "SAMPLE": ["data", "label"]}}
g = wt.WireheadGenerator(((np.full((160, 160), i, np.float64), np.full(4, i)) for i in range(20)),
                         config=cfg, quiet=True)
assert g.run() == 20 and g.sealed == 1
st = wt.status(cfg)
print("BUDGET", st["byte_budget"])
x, y = wt.MongoTupleheadDataset(config=cfg)[[19]][0]
assert float(x[0, 0]) == 19.0
wt.clean(cfg)
try:
    wt.WireheadGenerator(iter([(np.zeros(4), np.zeros(4))]), quiet=True,
                         config=dict(cfg, BYTE_BUDGET="256MiB")).run()
except wt.StoreSpaceError as e:
    print("SPACE", e)
try:  # auto-sized, too big for 64 MiB: the error says it was sized automatically
    wt.WireheadGenerator(iter([(np.zeros(1 << 20), np.zeros(4))]), quiet=True, config=cfg).run()
except wt.StoreSpaceError as e:
    print("AUTO", e)
'''


def test_small_store_in_64mib_dev_shm(tmp_path):
    """Docker's default /dev/shm (64 MiB, a tmpfs mounted in a private mount
    namespace here) holds a small auto-sized store; a budget that does not
    fit says what /dev/shm needs and has."""
    script = _write(tmp_path, "small.py", SMALL_SHM.format())
    r = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64m tmpfs /dev/shm"
                        f" && exec {sys.executable} {script}"], capture_output=True, text=True,
                       timeout=120, env=whlib.env_for_child())
    assert r.returncode == 0, r.stderr
    budget = int(r.stdout.split("BUDGET ")[1].split()[0])
    assert 20 * 160 * 160 * 8 < budget < 16 << 20  # 3 areas fit 64 MiB with room to spare
    space = r.stdout.split("SPACE ")[1]
    assert "/dev/shm has" in space and "needs" in space and "--shm-size" in space
    auto = r.stdout.split("AUTO ")[1]
    assert "/dev/shm has" in auto and "BYTE_BUDGET auto" in auto and "SWAP_CAP=20" in auto


def test_database_holding_the_original_layout_says_so(mongo_server):
    """A reader pointed at a database the original wirehead filled (read.bin,
    status) is told what it is looking at and what to do."""
    from mongo_server import RawClient
    db = whlib.unique_name("origdb")
    with RawClient(mongo_server.uri) as rc:
        rc.command(db, {"insert": "read.bin", "documents": [{"id": 0, "kind": "data"}]})
        rc.command(db, {"insert": "status", "documents": [{"swapped": True}]})
    cfg = {"STORE": f"{mongo_server.uri}/{db}", "SWAP_CAP": 4, "SAMPLE": ["data", "label"],
           "READ_TIMEOUT": 0.5}
    try:
        with pytest.raises(TimeoutError, match="original wirehead") as e:
            wt.MongoTupleheadDataset(config=cfg)[[0]]
        assert "read.bin" in str(e.value) and "status" in str(e.value)
        # a database without them gets no such hint
        with pytest.raises(TimeoutError) as e:
            wt.MongoTupleheadDataset(config=dict(cfg, STORE=cfg["STORE"] + "x"))[[0]]
        assert "original wirehead" not in str(e.value)
    finally:
        wt.clean(cfg)
        wt.clean(dict(cfg, STORE=cfg["STORE"] + "x"))
        with RawClient(mongo_server.uri) as rc:
            rc.command(db, {"dropDatabase": 1})
