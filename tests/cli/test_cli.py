"""The `wirehead-torch` and `wirehead` commands as users run them: the
default config file, --version, a closed pipe, clean of a store that is
not there or named by a config with a broken key, rates across swaps, human times and short generation labels."""
import importlib.metadata
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
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
    assert "pass the config's path: wirehead --config PATH" in r.stderr
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



def _manager_lines(out):
    return [x for x in out.getvalue().splitlines() if x]


def test_manager_is_quiet_by_default_and_ends_saying_what_it_sealed(shm_cfg, monkeypatch):
    """Beside a self-sealing generator the manager said a line per swap
    (hundreds a second) and then `0 swaps, exiting`. Now: a start line, a
    summary at most every summary_every seconds and an end line counting its
    own seals and the generators' it saw, every one of them, also when more
    were sealed between two looks than the store's history lists (16);
    verbose=True gives a line per swap."""
    cfg = shm_cfg(swap_cap=1, SELF_SEAL=True, MANAGER_POLL=0.01)
    g = wt.WireheadGenerator((whlib.sample(1, i) for i in range(10 ** 6)), config=cfg, quiet=True)
    g.cycle()  # the store exists, one generation sealed by the generator
    out = io.StringIO()
    m = wt.WireheadManager(config=cfg, out=out)
    looks, go = [], threading.Event()
    look = m._watch

    def held_look(store, w):  # the second look waits until 40 seals are made
        looks.append(1)
        if len(looks) == 2:
            go.wait(60)
        return look(store, w)
    monkeypatch.setattr(m, "_watch", held_look)
    t = threading.Thread(target=m.run)
    t.start()
    try:
        whlib.until(lambda: len(looks) >= 2, 60, "the manager's first look")
        for _ in range(40):
            g.cycle()
        go.set()
        whlib.until(lambda: m.seen == 40, 60, "the manager to count 40 seals")
    finally:
        go.set()
        m.stop()
        t.join(60)
    g.close()
    m.close()
    assert len(m.records) == 16  # the history lists the last 16; all 40 are counted
    lines = _manager_lines(out)
    assert len(lines) == 2, lines  # no line per swap, no summary within 30 s
    assert lines[0].startswith(f"wirehead manager: pid {os.getpid()} watches {cfg['STORE']}")
    assert lines[1] == ("wirehead manager: stopped (stop()): 40 generations sealed (0 here, 40 by "
                        "self-sealing generators), the last #41"), lines[1]

    # a summary line once summary_every has passed, a line per swap with verbose
    cfg2 = shm_cfg(swap_cap=2, SELF_SEAL=False)
    wt.WireheadGenerator((whlib.sample(1, i) for i in range(4)), config=cfg2).run()
    for kw, want in (({"summary_every": 0}, 3), ({"verbose": True}, 3), ({"quiet": True}, 0)):
        out = io.StringIO()
        m = wt.WireheadManager(config=cfg2, out=out, **kw)
        assert m.run(max_swaps=1) == 1
        m.close()
        lines = _manager_lines(out)
        if not want:  # quiet: nothing printed, as a quiet generator
            assert lines == [], lines
            wt.WireheadGenerator((whlib.sample(1, i) for i in range(2)), config=cfg2).run()
            continue
        assert len(lines) == want and all(x.startswith("wirehead manager: ") for x in lines), kw
        assert lines[-1] == ("wirehead manager: stopped (max_swaps=1): 1 generations sealed, "
                             f"the last #{wt.status(cfg2)['seals']}"), lines
        if want == 3:
            assert re.search(r"swap generation #\d+ generated=", lines[1]), lines
        wt.WireheadGenerator((whlib.sample(1, i) for i in range(2)), config=cfg2).run()


def test_cli_manager_beside_a_self_sealing_generator(shm_cfg, tmp_path):
    """The command as the new user ran it: a few lines, not one per swap, and
    an end line naming what it saw sealed."""
    cfg = shm_cfg(swap_cap=4, SELF_SEAL=True, MANAGER_POLL=0.01)
    d = _config_dir(tmp_path, cfg)
    mgr = subprocess.Popen([sys.executable, "-m", "wirehead_torch.apps.cli", "manager"], cwd=d,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           env=whlib.env_for_child())
    try:
        assert len(whlib.wait_line(mgr.stdout, "watches", 60)) == 1  # its first line
        g = wt.WireheadGenerator((whlib.sample(1, i) for i in range(400)), config=cfg, quiet=True)
        assert g.run() == 400 and g.sealed == 100
        g.close()
        mgr.send_signal(signal.SIGTERM)
        lines = [x.rstrip("\n") for x in whlib.wait_line(mgr.stdout, "stopped", 60)]
        mgr.wait(60)  # a second SIGTERM (whlib.stop's) would not be caught
    finally:
        code = whlib.stop(mgr, signal.SIGTERM, 60)
    assert code == 0
    assert len(lines) == 1, lines  # the end line only (a summary only after 30 s)
    got = re.fullmatch(r"wirehead manager: stopped \(SIGTERM\): (\d+) generations sealed "
                       r"\(0 here, (\d+) by self-sealing generators\)(, the last #\d+)?",
                       lines[-1])
    assert got and got.group(1) == got.group(2) and int(got.group(1)) <= 100, lines


def test_cli_manager_quiet_keeps_its_start_and_end_lines(shm_cfg, tmp_path):
    """`manager --quiet` drops the summaries only (the API's quiet=True
    prints nothing, as a quiet generator does)."""
    cfg = shm_cfg(swap_cap=2, SELF_SEAL=False)
    wt.WireheadGenerator((whlib.sample(1, i) for i in range(4)), config=cfg, quiet=True).run()
    r = _cli("manager", "--quiet", "--max-swaps", "1", cwd=_config_dir(tmp_path, cfg))
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 2, (r.stdout, r.stderr)
    assert lines[0].endswith("; no summaries") and "stopped (max_swaps=1)" in lines[1], lines


def test_monitor_names_generations_as_status_does(store_cfg, tmp_path):
    """monitor's JSONL named generations by their 19-digit id where status
    says #N, and gave DBNAME's default where the URI names the database; it
    said `No swaps recorded yet.` (exit 0) for a store that does not exist,
    and took its config only as a positional argument."""
    cfg = store_cfg(swap_cap=2, SELF_SEAL=True)
    d = _config_dir(tmp_path, cfg)
    r = _cli("monitor", "--config", "config.yaml", cwd=d)
    want = _cli("status", "--config", "config.yaml", cwd=d)
    assert (r.returncode, want.returncode) == (2, 2) and r.stdout == "", r.stdout
    assert r.stderr.replace("monitor", "status") == want.stderr, (r.stderr, want.stderr)
    _put(cfg, 1, 6)
    for args in (("--config", "config.yaml"), ("config.yaml",), ()):
        r = _cli("monitor", *args, cwd=d)
        assert r.returncode == 0, r.stderr
        recs = [json.loads(x) for x in r.stdout.splitlines()]
        assert [x["generation"] for x in recs] == ["#1", "#2", "#3"]
        assert [x["swap_count"] for x in recs] == [1, 2, 3]
        assert [x["generation_id"] for x in recs] == [
            h["generation"] for h in wt.status(cfg)["history"]]
        db = cfg["STORE"].rsplit("/", 1)[1]  # shm://NAME, or the database the URI names
        assert {x["db_name"] for x in recs} == {db}
    r = _cli("monitor", "--daemon", "--count", "1", "--config", "config.yaml", cwd=d)
    snap = json.loads(r.stdout)
    assert snap["db_name"] == db and snap["recent_swaps"][-1]["generation"] == "#3"
    r = _cli("monitor", "config.yaml", "--config", "other.yaml", cwd=d)
    assert r.returncode == 2 and "two configs" in r.stderr


# Every flag of every subcommand that takes a number, with the values that
# once ended in a traceback, ran forever or were taken silently. Each must be
# one line on stderr naming the flag (exit 2) before anything is run.
_BAD = ["inf", "nan", "-1", "0", "100000000000000000000", "1e30", "abc"]
_FLAGS = [
    ("manager", "--max-swaps", ()), ("manager", "--seconds", ()),
    ("status", "--interval", ("--watch",)), ("status", "--count", ("--watch",)),
    ("relay", "--max-generations", ()),
    ("generate", "--procs", ()), ("generate", "--seconds", ()), ("generate", "--seed", ()),
    ("generate", "--size", ()), ("generate", "--labels", ()), ("generate", "--index", ()),
    ("generate", "--procs-total", ()),
    ("export", "--generations", ("--out", "x")), ("export", "--samples", ("--out", "x")),
    ("export", "--shard-size", ("--out", "x")), ("export", "--timeout", ("--out", "x")),
    ("train", "--seconds", ()), ("train", "--batch-size", ()), ("train", "--labels", ()),
    ("train", "--size", ()), ("train", "--lr", ()), ("train", "--threads", ()),
    ("train", "--record-steps", ()),
    ("demo", "--seconds", ()), ("demo", "--size", ()), ("demo", "--labels", ()),
    ("demo", "--generators", ()), ("demo", "--swap-cap", ()), ("demo", "--batch-size", ()),
    ("demo", "--lr", ()), ("demo", "--seed", ()), ("demo", "--gen-nice", ()),
    ("demo", "--ddp", ()),
    ("monitor", "--poll-interval", ("--daemon",)), ("monitor", "--count", ("--daemon",)),
]
# where 0 (or -1) is a value the flag takes
_TAKES = {("generate", "--seed"): "0", ("generate", "--index"): "0",
          ("export", "--timeout"): "0", ("train", "--record-steps"): "0",
          ("demo", "--seed"): "0", ("demo", "--gen-nice"): "0"}


@pytest.mark.parametrize("cmd, flag, extra", _FLAGS, ids=[f"{c} {f}" for c, f, _ in _FLAGS])
def test_every_numeric_flag_is_checked(cmd, flag, extra, tmp_path, capsys, monkeypatch):
    from wirehead_torch.apps import cli, demo, jobs, monitor

    def ran(*args, **kw):  # a value taken: the command would run with it
        raise AssertionError(f"{cmd} ran with {flag} {value}")
    for mod, name in ((cli, "_cmd_manager"), (cli, "_cmd_status"), (cli, "_cmd_relay"),
                      (jobs, "run"), (demo, "_run_demo"), (monitor, "WireheadLogger")):
        monkeypatch.setattr(mod, name, ran)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("SWAP_CAP: 4\nSAMPLE: [input, label]\n")
    for value in _BAD:
        if _TAKES.get((cmd, flag)) == value:
            continue
        with pytest.raises(SystemExit) as e:
            cli.main([cmd, *extra, f"{flag}={value}"])
        err = capsys.readouterr().err
        assert e.value.code == 2, (cmd, flag, value, err)
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"wirehead-torch {cmd}: argument {flag}: ") and value in err, err


def test_generate_names_a_missing_module_and_starts_nothing(tmp_path):
    (tmp_path / "config.yaml").write_text("SWAP_CAP: 4\nSAMPLE: [input, label]\n")
    for procs in ("1", "2"):
        r = _cli("generate", "--gen-module", "no_such_module_h38:make", "--procs", procs,
                 cwd=tmp_path)
        assert r.returncode == 2 and r.stdout == "", r.stdout
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("wirehead-torch generate: --gen-module "
                                   "'no_such_module_h38:make': cannot import no_such_module_h38")
    r = _cli("generate", "--gen-module", "synth", "--shards", "x.tar", cwd=tmp_path)
    assert r.returncode == 2 and "two sources" in r.stderr
    r = _cli("status", "--interval", "1", cwd=tmp_path)
    assert r.returncode == 2 and "--interval paces --watch" in r.stderr


def test_generate_says_its_seed_and_one_prefix_per_process(shm_cfg, tmp_path):
    """A plain generate said `seed None`, and one process spoke as
    `generator 0 pid N`, `Generator` and `wirehead generator`."""
    cfg = shm_cfg(swap_cap=2, SELF_SEAL=True)
    d = _config_dir(tmp_path, cfg)
    for seed, says in (((), "a fresh random seed"), (("--seed", "7"), "seed 7")):
        r = _cli("generate", "--seconds", "1", "--size", "4", *seed, cwd=d)
        assert r.returncode == 0, r.stderr
        lines = (r.stdout + r.stderr).splitlines()
        assert lines and all(x.startswith("generator 0: ") for x in lines), lines
        assert says in lines[0] and "None" not in r.stdout + r.stderr, lines
