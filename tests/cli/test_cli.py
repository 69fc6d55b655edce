"""The `wirehead-torch` and `wirehead` commands as users run them: the
default config file, --version, a closed pipe, clean of a store that is
not there or named by a config with a broken key, rates across swaps, human times and short generation labels."""
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml

import wirehead_torch as wt
from wirehead_torch._store import gen_label
from wirehead_torch.apps.monitor import WireheadLogger, human_time, tui_lines

import whlib


def _cli(*args, cwd, stdout=subprocess.PIPE, module="wirehead_torch.apps.cli"):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=120,
                          env=whlib.env_for_child())


def _put(cfg, tag, n):
    """n samples through a self-sealing generator (it seals each full
    generation itself)."""
    g = wt.WireheadGenerator((whlib.sample(tag, i) for i in range(n)), config=cfg, quiet=True)
    assert g.run() == n


def _config_dir(tmp_path, cfg):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    return tmp_path


def test_config_defaults_to_config_yaml(store_cfg, tmp_path):
    cfg = store_cfg(swap_cap=4, SELF_SEAL=True)
    _put(cfg, 1, 5)
    (tmp_path / "with").mkdir()
    d = _config_dir(tmp_path / "with", cfg)
    r = _cli("status", cwd=d)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == ["store", cfg["STORE"]]
    assert "1 swaps" in r.stdout
    r = _cli("status", "--config", "config.yaml", "--json", cwd=d)  # given, as before
    assert r.returncode == 0 and json.loads(r.stdout)["seals"] == 1, r.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    for cmd in ("status", "clean", "manager"):
        r = _cli(cmd, cwd=empty)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.strip() == (f"wirehead-torch {cmd}: no config.yaml in {empty} "
                                    f"(the default --config); pass --config PATH")
    # the original's command takes the path as its argument, config.yaml by default
    r = _cli(cwd=d, module="wirehead_torch.apps.monitor")
    assert r.returncode == 0 and json.loads(r.stdout.splitlines()[0])["swap_count"] == 1
    r = _cli(cwd=empty, module="wirehead_torch.apps.monitor")
    assert r.returncode == 2 and "no config.yaml in" in r.stderr
    assert "pass the config's path: wirehead PATH" in r.stderr
    # ... which wirehead-torch also serves, as `monitor`
    r = _cli("monitor", cwd=d)
    assert r.returncode == 0 and json.loads(r.stdout.splitlines()[0])["swap_count"] == 1
    r = _cli("monitor", "--daemon", "--count", "1", cwd=d)
    assert r.returncode == 0 and json.loads(r.stdout)["generated"] == 5
    r = _cli("monitor", cwd=empty)
    assert r.returncode == 2
    assert r.stderr.startswith(f"wirehead-torch monitor: no config.yaml in {empty}")


def test_version(tmp_path):
    r = _cli("--version", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert first == f"wirehead-torch {wt.__version__}"
    assert wt.__version__ == importlib.metadata.version("wirehead_torch")
    # which `wirehead` package imports: tests/install/test_install.py checks each case
    assert second.startswith("wirehead: ")


def _to_closed_pipe(args, cwd, module="wirehead_torch.apps.cli"):
    """Runs a command whose stdout is a pipe nobody reads any more: every
    write fails with EPIPE, as after `| head` has exited."""
    rfd, wfd = os.pipe()
    os.close(rfd)
    try:
        return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, stdout=wfd,
                              stderr=subprocess.PIPE, text=True, timeout=120,
                              env=whlib.env_for_child())
    finally:
        os.close(wfd)


def test_closed_pipe_exits_quietly(shm_cfg, tmp_path):
    cfg = shm_cfg(swap_cap=4, SELF_SEAL=True)
    _put(cfg, 1, 9)
    d = _config_dir(tmp_path, cfg)
    for args, module in ((["status"], "wirehead_torch.apps.cli"),
                         (["status", "--json"], "wirehead_torch.apps.cli"),
                         (["status", "--watch", "--count", "3", "--interval", "0.01"],
                          "wirehead_torch.apps.cli"),
                         (["--version"], "wirehead_torch.apps.cli"),
                         ([], "wirehead_torch.apps.monitor"),
                         (["--daemon", "--count", "2", "--poll-interval", "0.01"],
                          "wirehead_torch.apps.monitor")):
        r = _to_closed_pipe(args, d, module)
        # 141 = 128 + SIGPIPE, what a shell reports for `yes | head -1`'s yes
        assert (r.returncode, r.stderr) == (141, ""), (module, args)
    # through a shell and head, as users write it
    r = subprocess.run(f"{sys.executable} -m wirehead_torch.apps.cli status | head -1", shell=True,
                       cwd=d, capture_output=True, text=True, timeout=120,
                       env=whlib.env_for_child())
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout == f"store            {cfg['STORE']}\n"


def test_clean_says_when_there_is_nothing_to_remove(store_cfg, tmp_path):
    cfg = store_cfg(swap_cap=4, SELF_SEAL=True)
    d = _config_dir(tmp_path, cfg)
    r = _cli("clean", cwd=d)
    # (a line on dead processes' ring files may follow: /dev/shm is shared)
    assert (r.returncode, _first(r)) == (0, f"nothing to remove: no store {cfg['STORE']}")
    assert wt.clean(cfg) is False
    _put(cfg, 1, 5)
    r = _cli("clean", cwd=d)
    assert (r.returncode, _first(r)) == (0, f"removed store {cfg['STORE']}"), r.stderr
    with pytest.raises(wt.NotFoundError):
        wt.status(cfg)
    r = _cli("clean", cwd=d)
    assert _first(r) == f"nothing to remove: no store {cfg['STORE']}"
    _put(cfg, 2, 1)  # a store with an empty write generation only is a store too
    assert wt.clean(cfg) is True and wt.clean(cfg) is False


def _first(r):
    return r.stdout.split("\n", 1)[0]


_RING_HOLDER = """
import os, sys
from wirehead_torch import _ring
r = _ring.WorkerRing(os.getpid(), sys.argv[1], 0, 2)
print(_ring.region_path(os.getpid(), sys.argv[1], 0), flush=True)
sys.stdin.read()
"""


def test_clean_removes_ring_files_of_killed_processes(store_cfg, tmp_path):
    """A process SIGKILLed while holding a DataLoader batch ring leaves its
    ring files in /dev/shm; `clean` removes them and says how many, and
    keeps the files of a live process."""
    cfg = store_cfg(swap_cap=4)
    d = _config_dir(tmp_path, cfg)
    token = os.urandom(6).hex()
    procs = [subprocess.Popen([sys.executable, "-c", _RING_HOLDER, f"{token}{k}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=whlib.env_for_child()) for k in range(2)]
    try:
        paths = [p.stdout.readline().strip() for p in procs]
        assert all(os.path.exists(x) for x in paths), paths
        procs[0].kill()
        procs[0].wait(30)
        left = [x for x in os.listdir("/dev/shm") if f"{token}0" in x]
        assert left, "a killed process leaves its ring files"
        r = _cli("clean", cwd=d)
        assert r.returncode == 0, r.stderr
        said = re.search(r"removed (\d+) ring file\(s\) of DataLoader processes that are gone",
                         r.stdout)
        assert said and int(said.group(1)) >= len(left), r.stdout
        assert not [x for x in os.listdir("/dev/shm") if f"{token}0" in x]
        assert os.path.exists(paths[1]), "a live process's ring files stay"
    finally:
        for p in procs:
            p.kill()
            p.wait(30)
        for x in os.listdir("/dev/shm"):
            if token in x:
                os.unlink(f"/dev/shm/{x}")


def test_clean_despite_a_broken_key(store_cfg, tmp_path):
    """A key that does not name the store (here SWAP_CAP) is unusable: clean
    still removes the store, saying what is wrong; a broken STORE is refused."""
    cfg = store_cfg(swap_cap=4, SELF_SEAL=True)
    _put(cfg, 1, 5)
    d = _config_dir(tmp_path, {**cfg, "SWAP_CAP": "ten"})
    r = _cli("clean", cwd=d)
    assert (r.returncode, _first(r)) == (0, f"removed store {cfg['STORE']}"), r.stderr
    assert "SWAP_CAP must be an integer, got 'ten'" in r.stderr
    with pytest.raises(wt.NotFoundError):
        wt.status(cfg)
    _put(cfg, 1, 5)
    assert wt.clean(config={**cfg, "SAMPLE": []}) is True
    d = _config_dir(tmp_path, {**cfg, "STORE": "shm://", "SWAP_CAP": "ten"})
    r = _cli("clean", cwd=d)
    assert r.returncode == 2 and "STORE 'shm://' names no store" in r.stderr, r.stderr


def test_rates_across_a_swap(store_cfg):
    """Between two snapshots the write generation was sealed and a new one
    started, so it holds fewer samples and bytes than before: the rates
    still count what was generated."""
    cfg = store_cfg(swap_cap=4, SELF_SEAL=True)
    _put(cfg, 1, 3)
    logger = WireheadLogger(config=cfg, poll_interval=0.01)
    first = logger.snapshot()
    assert (first.write_docs, first.swap_count) == (3, 0)
    _put(cfg, 2, 2)  # the 4th fills and seals generation #1, the 5th starts #2
    second = logger.snapshot()
    assert (second.write_docs, second.swap_count) == (1, 1)
    dt = second.timestamp - first.timestamp
    assert second.samples_per_s == pytest.approx(2 / dt)
    assert second.swaps_per_s == pytest.approx(1 / dt)
    sample_mb = second.write_size_mb / second.write_docs
    raw_mb = (2 * 8 + 256 * 4) / 2**20  # whlib.sample: int64[2], float32[256]
    if cfg["STORE"].startswith("shm://"):
        # the store's own byte count (headers included), which fell at the swap
        assert second.write_size_mb < first.write_size_mb and sample_mb > raw_mb
    else:  # the server keeps no byte count: measured from a sample of generation #1
        assert sample_mb == pytest.approx(raw_mb)
    assert second.write_mb_per_s == pytest.approx(second.samples_per_s * sample_mb)
    assert second.write_mb_per_s > 0
    rates = next(x for x in tui_lines(second) if x.startswith("rates"))
    assert f"{second.write_mb_per_s:.2f} MB/s" in rates
    # nothing generated since: the rates fall to zero, not below
    third = logger.snapshot()
    assert third.samples_per_s == third.write_mb_per_s == third.swaps_per_s == 0


def test_human_times_and_short_generation_labels(store_cfg, tmp_path):
    cfg = store_cfg(swap_cap=4, SELF_SEAL=True)
    _put(cfg, 1, 14)  # 3 swaps, 2 samples in generation #4
    d = _config_dir(tmp_path, cfg)
    r = _cli("status", cwd=d)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert not re.search(r"\d{10}", text), text  # no raw ids, no epoch seconds
    assert "read generation  #3\n" in text and "write generation #4 (2/4 samples" in text
    swaps = [x for x in text.splitlines() if x.startswith("  ")]
    assert len(swaps) == 3
    for n, line in enumerate(swaps, 1):
        assert re.fullmatch(rf"  \d\d:\d\d:\d\d \(\d+ s ago\)  generation #{n} "
                            rf"generated={4 * n} .*", line), line
    # --json keeps the full ids
    full = wt.status(cfg)
    r = _cli("status", "--json", cwd=d)
    js = json.loads(r.stdout)
    assert js["read_gen"] == full["read_gen"] and js["write_gen"] == full["write_gen"]
    assert [h["generation"] for h in js["history"]] == [h["generation"] for h in full["history"]]
    assert full["write_gen"] - full["read_gen"] == 1 and full["read_gen"] > 10 ** 9

    logger = WireheadLogger(config=cfg)
    logger.history()
    lines = tui_lines(logger.snapshot())
    recent = lines[lines.index("recent swaps:") + 1:]
    assert [x.split()[0] for x in recent] == ["#3", "#2", "#1"]
    assert all(re.match(r"  #\d +\d\d:\d\d:\d\d \(\d+ s ago\)  lifetime=", x) for x in recent)
    assert not any(re.search(r"\d{10}", x) for x in lines)


def test_human_time_and_label_formats():
    now = time.mktime((2026, 11, 24, 12, 3, 9, 0, 0, -1))  # local noon: no day boundary near
    assert human_time(now - 5, now) == "12:03:04 (5 s ago)"
    assert human_time(now - 150, now) == "12:00:39 (2 min ago)"
    assert human_time(now - 7200, now) == "10:03:09 (2.0 h ago)"
    assert human_time(now - 86400 * 3, now) == "2026-11-21 12:03:09 (3.0 d ago)"
    assert human_time(now + 30, now) == "12:03:39 (in the future: clocks differ)"
    st = {"write_gen": 1764000000000000100, "seals": 100}
    assert gen_label(1764000000000000000, st) == "#1"
    assert gen_label(1764000000000000100, st) == "#101"
    assert gen_label(1764000000000123456, st) == "...123456"  # outside: the id's last digits


def test_generate_is_quiet_by_default(shm_cfg, tmp_path):
    """generate says a start and end line per process (and the generator's
    own), no line per generation; --quiet only the start and end lines;
    --verbose two lines per generation sealed, named #N as status names
    them."""
    cfg = shm_cfg(swap_cap=2, SELF_SEAL=True)
    d = _config_dir(tmp_path, cfg)
    outs = {}
    for mode in ((), ("--quiet",), ("--verbose",)):
        r = _cli("generate", "--config", "config.yaml", "--seconds", "1", "--size", "8",
                 *mode, cwd=d)
        assert r.returncode == 0, r.stderr
        outs[mode] = r.stdout.splitlines()
    seals = wt.status(config=cfg)["seals"]
    assert seals > 20  # the lines below are not few because little happened
    assert len(outs[()]) <= 6 and not any("swap success" in x for x in outs[()]), outs[()]
    assert len(outs[("--quiet",)]) == 2, outs[("--quiet",)]
    assert "started" in outs[("--quiet",)][0] and "pushed" in outs[("--quiet",)][1]
    loud = [x for x in outs[("--verbose",)] if "swap success: generation #" in x]
    assert len(loud) > 10 and not any(str(wt.status(config=cfg)["write_gen"])[:10] in x
                                      for x in outs[("--verbose",)])


def test_clean_needs_only_the_store_keys_and_warnings_name_the_users_key(shm_cfg, tmp_path):
    cfg = shm_cfg(swap_cap=2, SELF_SEAL=True)
    _put(cfg, 1, 2)
    d = _config_dir(tmp_path, dict(cfg, READ_TIMEOUT="soon", SWAPCAP=3))
    r = _cli("clean", "--config", "config.yaml", cwd=d)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"removed store {cfg['STORE']}"
    assert "READ_TIMEOUT" in r.stderr and "all the same" in r.stderr
    # the unknown key: the command's own line, no file inside the package
    assert ("wirehead-torch: warning: config.yaml: unknown config keys are ignored: "
            "'SWAPCAP' (did you mean 'SWAP_CAP'?)") in r.stderr, r.stderr
    assert "wirehead_torch/" not in r.stderr and ".py:" not in r.stderr, r.stderr
    with pytest.raises(wt.NotFoundError):
        wt.status(config=cfg)


def test_quiet_manager_logs_a_summary_not_a_line_per_swap(shm_cfg, caplog, capsys):
    cfg = shm_cfg(swap_cap=2, SELF_SEAL=False)
    wt.WireheadGenerator((whlib.sample(1, i) for i in range(2)), config=cfg, quiet=True).run()
    m = wt.WireheadManager(config=cfg, quiet=True, summary_every=0)
    with caplog.at_level("INFO", logger="wirehead_torch"):
        assert m.run(max_swaps=1) == 1
    m.close()
    assert capsys.readouterr().out == ""
    said = [r.getMessage() for r in caplog.records if "manager" in r.getMessage()]
    assert len(said) == 1 and "1 swaps in the last" in said[0] and "#1" in said[0], said
