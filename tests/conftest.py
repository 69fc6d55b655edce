import collections
import glob
import os
import re
import sys

import pytest

# the helper modules (whlib, procs, ...) live in tests/helpers
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))

import whlib  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "asan: also run against the ASan+UBSan build")
    config.addinivalue_line("markers", "gpu: needs a CUDA device")
    config.addinivalue_line("markers", "lightning: needs Lightning (the torch 2.x lane)")
    config.addinivalue_line("markers", "shrink100: 100 rounds of a cut file per reader kind "
                            "(C-level, so run in the first lane only)")
    config.addinivalue_line("markers", "once: exercises only what the other lanes do not change "
                            "(the C store and relay, the Makefile), so run in the first lane "
                            "only")


def _config_factory(store_uri, **defaults):
    """make(swap_cap, sample, budget, **extra) -> a config for a fresh store,
    and the list of configs made (to clean up)."""
    made = []

    def make(swap_cap=8, sample=("id", "data"), budget="2MiB", **extra):
        # SELF_SEAL off: these tests count the seals a manager makes
        # (tests/compat/test_compat.py covers self-sealing generators)
        cfg = {"STORE": store_uri(), "SWAP_CAP": swap_cap, "SAMPLE": list(sample),
               "READ_TIMEOUT": 30, "LEASE_SECONDS": 5, "SELF_SEAL": False, **defaults}
        if budget is not None and cfg["STORE"].startswith("shm://"):
            cfg["BYTE_BUDGET"] = budget
        cfg.update(extra)
        made.append(cfg)
        return cfg

    return make, made


def _clean_all(made):
    import wirehead_torch as wt
    for cfg in made:
        wt.clean(cfg)


@pytest.fixture
def shm_cfg():
    """A factory of configs for fresh shm stores, removed afterwards."""
    make, made = _config_factory(lambda: f"shm://{whlib.unique_name()}")
    yield make
    _clean_all(made)


@pytest.fixture(scope="session")
def mongo_server():
    """The in-memory MongoDB test server, for the whole session."""
    from mongo_server import MongoTestServer
    with MongoTestServer() as srv:
        yield srv


@pytest.fixture(params=["shm", "mongo"])
def store_cfg(request, shm_cfg):
    """A factory of configs for fresh stores, once per store kind: the
    embedded store, and MongoDB (a database of its own per config)."""
    if request.param == "shm":
        yield shm_cfg
        return
    srv = request.getfixturevalue("mongo_server")
    make, made = _config_factory(lambda: f"{srv.uri}/{whlib.unique_name('whm')}",
                                 CONNECT_TIMEOUT=10)
    yield make
    _clean_all(made)


def _own_stores():
    """This process's shm stores and params files named by
    whlib.unique_name()'s default prefix (the function-scoped configs)."""
    return set(glob.glob(f"/dev/shm/wirehead*.whtest-{os.getpid()}-*"))


@pytest.fixture(autouse=True)
def _no_store_left_behind():
    """A test removes the stores it made (after its other fixtures' clean-up,
    which runs first): one still in /dev/shm is removed and fails the test.
    One made later by a process a test left running fails a later test, or
    the session (below)."""
    before = _own_stores()
    yield
    left = sorted(_own_stores() - before)
    for path in left:
        os.unlink(path)
    assert not left, f"left in /dev/shm by this test (or a process it left running): {left}"


@pytest.fixture(scope="session", autouse=True)
def _no_store_left_by_the_session():
    yield
    left = sorted(_own_stores())
    for path in left:
        os.unlink(path)
    assert not left, f"left in /dev/shm at the end of the run: {left}"


def _gpu_skip(report):
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return "GPU" in reason or "CUDA" in reason


def pytest_sessionfinish(session, exitstatus):
    """Under CI (WIREHEAD_STRICT_SKIPS=1) a skip is a failure unless it is a
    test that needs a GPU."""
    if os.environ.get("WIREHEAD_STRICT_SKIPS") != "1":
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = tr.stats.get("skipped", []) if tr else []
    bad = [r for r in skipped if not _gpu_skip(r)]
    if bad:
        for r in bad:
            print(f"\nnot allowed to skip in CI: {r.nodeid}: {r.longrepr}")
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    """(Here, not in tests/install: test modules import this conftest by
    name, and a second module named conftest shadows it.) Counts the documentation's blocks that test_docs.py checked but did
    not run, by the reason their marker gives, so a run says how much of
    the documentation it did not execute."""
    reasons = collections.Counter()
    for report in terminalreporter.stats.get("passed", []):
        m = re.search(r"test_unrun_block_names_what_exists\[.*-not-run=([\w-]+)\]$",
                      report.nodeid)
        if m and report.when == "call":
            reasons[m.group(1)] += 1
    if reasons:
        terminalreporter.write_line(
            f"docs blocks not run: {sum(reasons.values())} ("
            + ", ".join(f"{k} {n}" for k, n in sorted(reasons.items()))
            + "; each checked for the targets, commands and paths it names; "
              "reasons: tests/install/test_docs.py NOT_RUN)")
