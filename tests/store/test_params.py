"""Parameters through the store (docs/params.md): set by a trainer, read by
generators, recorded by every sample, filtered on by readers."""
import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

import wirehead_torch as wt
from wirehead_torch._reader import wait_for_generation
from wirehead_torch._store import ProcessStore
from wirehead_torch.apps import cli
from wirehead_torch.config import get_config

import whlib
from whlib import open_store

HELPER = os.path.join(whlib.HERE, "params_proc.py")
SAMPLE = ("id", "data")


def spawn(kind, cfg, *args):
    proc = subprocess.Popen([sys.executable, HELPER, kind, json.dumps(cfg), *map(str, args)],
                            env=whlib.env_for_child(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    whlib._drain(proc.stdout)
    whlib._drain(proc.stderr)
    return proc


def lines(proc, prefix):
    d = whlib._drain(proc.stdout)
    with d.cond:
        return [ln.split()[1:] for ln in d.lines if ln.startswith(prefix + " ")]


def made(proc):
    """(tag, counter, start_ns, version) of each sample the generator made."""
    return [tuple(map(int, f)) for f in lines(proc, "S")]


def test_set_get_versions(store_cfg):
    cfg = store_cfg()
    assert wt.get_params(config=cfg) == (0, {})
    assert wt.set_params({"noise": 0.1}, config=cfg) == 1
    doc = {"noise": 0.25, "schedule": [1, 2, 3], "nested": {"a": None, "b": "text"}}
    assert wt.set_params(doc, config=cfg) == 2
    assert wt.get_params(config=cfg) == (2, doc)
    store = open_store(cfg)
    assert store.params_version() == 2
    # exactly the bound is kept, byte for byte
    text = b'"' + b"x" * (wt.MAX_PARAMS_BYTES - 2) + b'"'
    assert store.params_set(text) == 3
    assert store.params_get() == (3, text)
    # cleaning the store removes its params too; a handle kept open notices
    wt.clean(cfg)
    assert open_store(cfg).params_get() == (0, b"{}")
    whlib.until(lambda: wt.get_params(config=cfg) == (0, {}), 10, "the kept handle to notice")


def test_running_generators_take_a_set_within_one_sample(store_cfg):
    """4 generators run; each set reaches all of them within one sample, and
    every sample records (in its checksummed header) the version it was made
    under, one whose set had begun before the sample was."""
    cfg = store_cfg(swap_cap=8, sample=SAMPLE, budget="1MiB", SELF_SEAL=True)
    begun = {}  # version -> CLOCK_MONOTONIC when its set began
    t = time.monotonic_ns()
    begun[wt.set_params({"noise": 0.0}, config=cfg)] = t
    gens = [spawn("gen", cfg, tag) for tag in range(4)]
    try:
        for p in gens:
            whlib.wait_line(p.stderr, "STARTED", 60)
        whlib.until(lambda: all(len(made(p)) >= 3 for p in gens), 60, "samples from each")
        for k in range(1, 4):
            t = time.monotonic_ns()
            v = wt.set_params({"noise": float(k)}, config=cfg)
            begun[v] = t
            ended = time.monotonic_ns()
            whlib.until(lambda t=ended: all(sum(s[2] > t for s in made(p)) >= 3 for p in gens),
                        60, f"3 samples from each generator after set {v}")
            for p in gens:
                late = [s for s in made(p) if s[2] > ended and s[3] < v]
                assert len(late) <= 1, f"generator {p.pid} made {late} after version {v} was set"
        # a generation sealed after the last set: headers say what each sample was made under
        store = open_store(cfg)
        last = max(begun)
        whlib.until(lambda: store.gen_params(store.current())["min"] == last
                    if store.current() else False, 60, "a generation made under the last set")
        gen = store.current()
        for pos in range(8):
            g, _, _, arrs, _ = store.read_sample(gen, pos)
            ident = np.from_dlpack(arrs[0])
            recorded = store.last_params_version
            assert recorded == ident[3], "the header records the version the generator saw"
            assert begun[recorded] <= ident[2], "a version can only be used once its set began"
            assert np.all(np.from_dlpack(arrs[1]) == float(recorded - 1))
        # each generator's versions only go up
        for p in gens:
            vs = [s[3] for s in made(p)]
            assert vs == sorted(vs)
        whlib.assert_alive(gens, "while params were set")
        st = wt.status(cfg)
        assert st["params_version"] == last
        assert st["read_params"]["samples"] == 8 and st["read_params"]["max"] == last
    finally:
        for p in gens:
            whlib.stop(p)


def _fill(cfg, noise, n):
    """n samples put in-process under the current params (self-sealing)."""
    def g():
        for i in range(n):
            p = wt.current_params()
            yield np.array([0, i, 0, wt.current_params_version()], np.int64), \
                np.full(16, p["noise"], np.float32)
    assert wt.WireheadGenerator(g(), config=cfg, quiet=True).run() == n


def test_ranks_see_the_same_version_for_the_same_sample(store_cfg):
    """A generation made under two versions, read by 2 DDP ranks (each with
    its own store handle): each position carries the version it was made
    under for every rank, and the ranks together cover the generation."""
    cfg = store_cfg(swap_cap=4, sample=SAMPLE, SELF_SEAL=True)
    v1 = wt.set_params({"noise": 1.0}, config=cfg)
    _fill(cfg, 1.0, 2)
    v2 = wt.set_params({"noise": 2.0}, config=cfg)
    _fill(cfg, 2.0, 2)
    seen = {}
    for rank in (0, 1):
        ds = wt.WireheadIterableDataset(config=cfg, shuffle=True, seed=7, rank=rank,
                                        world_size=2, timeout=10)
        for it in ds:
            key = (int(it["generation"]), int(it["position"]))
            assert key not in seen, f"position {key} read by two ranks"
            seen[key] = (rank, int(it["params_version"]), int(it["id"][3]))
    assert len(seen) == 4 and {r for r, _, _ in seen.values()} == {0, 1}
    assert sorted(v for _, v, _ in seen.values()) == [v1, v1, v2, v2]
    for _, version, made_under in seen.values():  # what the generator saw, for every rank
        assert version == made_under


def test_reader_takes_only_generations_under_min_version(store_cfg):
    cfg = store_cfg(swap_cap=4, sample=SAMPLE, SELF_SEAL=True)
    wt.set_params({"noise": 1.0}, config=cfg)
    _fill(cfg, 1.0, 4)                        # a generation under version 1
    v2 = wt.set_params({"noise": 2.0}, config=cfg)
    _fill(cfg, 2.0, 2)
    v3 = wt.set_params({"noise": 3.0}, config=cfg)
    _fill(cfg, 3.0, 2)                        # a generation under versions 2 and 3
    store = open_store(cfg)
    gp = store.gen_params(store.current())
    assert (gp["min"], gp["max"], gp["at_max"], gp["samples"]) == (v2, v3, 2, 4)

    items = list(wt.WireheadIterableDataset(config=cfg, shuffle=False, min_params_version=v2))
    assert sorted(int(it["params_version"]) for it in items) == [v2, v2, v3, v3]
    for it in items:  # the header's version is the one the generator saw
        assert int(it["id"][3]) == int(it["params_version"])
        assert float(it["data"][0]) == float(it["params_version"])

    # nothing made entirely under v3 yet: a bounded wait that says why
    late = wt.WireheadIterableDataset(config=cfg, min_params_version=v3, timeout=1)
    with pytest.raises(TimeoutError, match=rf">= {v3} .*versions {v2}\.\.{v3}"):
        next(iter(late))
    with pytest.raises(TimeoutError, match=rf">= {v3}"):
        next(iter(wt.WireheadLoader(config=cfg, batch_size=2, min_params_version=v3,
                                    timeout=1)))
    _fill(cfg, 3.0, 4)
    items = list(wt.WireheadIterableDataset(config=cfg, min_params_version=v3, timeout=10))
    assert [int(it["params_version"]) for it in items] == [v3] * 4
    for batch in wt.WireheadLoader(config=cfg, batch_size=2, min_params_version=v3, timeout=10):
        assert batch["id"][:, 3].tolist() == [v3, v3]
        assert batch["params_version"].tolist() == [v3, v3]
    # ring batches carry each sample's version too
    for batch in wt.WireheadIterableDataset(config=cfg, batch_size=2, batches=True,
                                            min_params_version=v3, timeout=10):
        assert batch["params_version"].tolist() == [v3, v3]
    with pytest.raises(ValueError, match="min_params_version"):
        wt.WireheadIterableDataset(config=cfg, min_params_version=-1)


def test_a_reader_waiting_for_a_params_version_says_which(store_cfg, caplog):
    """While a generation exists, the wait's note names the version wanted
    and the read generation's, not a missing first generation."""
    cfg = get_config(None, store_cfg(swap_cap=4, sample=SAMPLE, SELF_SEAL=True))
    v1 = wt.set_params({"noise": 1.0}, config=cfg)
    _fill(cfg, 1.0, 4)
    handle = ProcessStore(cfg, min_params=v1 + 1)
    try:
        with caplog.at_level(logging.WARNING, "wirehead_torch"), \
                pytest.raises(TimeoutError, match=rf">= {v1 + 1}"):
            wait_for_generation(handle.get(), cfg, 0.5, min_params=v1 + 1, note_every=0.1)
    finally:
        handle.close()
    notes = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert notes, caplog.text
    assert f"params version >= {v1 + 1}" in notes[0] and f"versions {v1}..{v1}" in notes[0]
    assert "first generation" not in notes[0] and "start a generator" not in notes[0]


def test_concurrent_setters_get_unique_versions_and_no_torn_document(store_cfg):
    cfg = store_cfg()
    setters = [spawn("set", cfg, who, 30) for who in range(4)]
    seen, last = 0, 0
    try:
        while any(p.poll() is None for p in setters) or seen == 0:
            v, doc = wt.get_params(config=cfg)
            assert v >= last, "versions only go up"
            last = v
            if v:
                assert len(doc["pad"]) == doc["len"], f"torn document at version {v}"
                seen += 1
        for p in setters:
            assert p.wait(60) == 0, whlib.tail(p.stderr)
        versions = sorted(int(ln.split()[1]) for p in setters
                          for ln in whlib.drained(p.stdout) if ln.startswith("V "))
    finally:
        for p in setters:
            whlib.stop(p)
    assert versions == list(range(1, 121)), "each set has a version of its own"
    v, doc = wt.get_params(config=cfg)
    assert v == 120 and len(doc["pad"]) == doc["len"]


def test_too_large_is_an_error_naming_the_size(store_cfg):
    cfg = store_cfg()
    wt.set_params({"a": 1}, config=cfg)
    with pytest.raises(ValueError, match="70008 bytes"):
        wt.set_params({"a": "x" * 70000}, config=cfg)
    with pytest.raises(wt.SampleTooLargeError, match="65537 bytes"):
        open_store(cfg).params_set(b"1" * (wt.MAX_PARAMS_BYTES + 1))
    assert wt.get_params(config=cfg) == (1, {"a": 1})


def test_not_json_serialisable_is_a_clear_error(store_cfg):
    cfg = store_cfg()
    with pytest.raises(TypeError, match="not JSON-serialisable.*object"):
        wt.set_params({"x": object()}, config=cfg)
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        wt.set_params({"x": float("nan")}, config=cfg)
    with pytest.raises(TypeError, match="must be a dict"):
        wt.set_params([1, 2], config=cfg)
    assert wt.get_params(config=cfg) == (0, {})


def test_generator_killed_mid_read_leaves_nothing(store_cfg):
    cfg = store_cfg(sample=SAMPLE, SELF_SEAL=True)
    big = {"noise": 0.5, "pad": "y" * 60000}  # reads long enough to be killed inside
    wt.set_params(big, config=cfg)
    name = cfg["STORE"][len("shm://"):] if cfg["STORE"].startswith("shm://") else None
    for k in range(3):
        p = spawn("gen", cfg, k)
        whlib.wait_line(p.stderr, "STARTED", 60)
        whlib.until(lambda p=p, k=k: len(made(p)) > k, 60, "samples")
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    t = time.monotonic()
    assert wt.set_params({"noise": 0.75}, config=cfg) == 2
    assert time.monotonic() - t < 2.0, "no lock left held"
    assert wt.get_params(config=cfg) == (2, {"noise": 0.75})
    if name:
        ours = sorted(f for f in os.listdir("/dev/shm") if f.endswith("." + name))
        assert ours == [f"wirehead-params.{name}", f"wirehead.{name}"]


def test_params_command_and_status(store_cfg, tmp_path, capsys):
    cfg = store_cfg(sample=SAMPLE, swap_cap=4, SELF_SEAL=True)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["params", "--config", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"version": 0, "params": {}}
    assert cli.main(["params", "--config", str(path), "--set", "noise=0.5",
                     "--set", 'name="warm"']) == 0
    out = capsys.readouterr().out
    assert "version 1" in out and 'name = "warm"' in out
    assert cli.main(["params", "--config", str(path), "--set", "noise=1.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "version": 2, "params": {"noise": 1.5, "name": "warm"}}
    assert cli.main(["params", "--config", str(path), "--set", "noise"]) == 2
    assert "KEY=JSON" in capsys.readouterr().err
    for bad in ("NaN", "Infinity", "-Infinity"):  # Python's json takes them, JSON does not
        assert cli.main(["params", "--config", str(path), "--set", f"noise={bad}"]) == 2
        assert f"{bad} is not a JSON value" in capsys.readouterr().err
    assert wt.get_params(config=cfg)[0] == 2  # nothing stored
    _fill(cfg, 1.5, 4)
    assert cli.main(["status", "--config", str(path), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["params_version"] == 2
    assert st["read_params"] == {"min": 2, "max": 2, "samples": 4, "at_current": 4}
    wt.set_params({"noise": 2.5}, config=cfg)
    assert cli.main(["status", "--config", str(path)]) == 0
    assert "version 3; the read generation: 0/4 samples made under it (versions 2)" in \
        capsys.readouterr().out
