"""Every fenced code block of README.md and docs/*.md runs as written.

The conventions a block's author follows are in docs/development.md,
"Code blocks in the documentation": the fence's language says how a block
is checked, and an HTML comment on the line before the fence,
``<!-- docs-test: KEY[=VALUE] ... -->``, adds what the block needs:

- ``python``: run with this interpreter, in the document's working folder
  (a fresh folder per document, with the repository's ``slurm`` and
  ``benchmarks`` folders linked in).
- ``sh``: run with ``bash -e`` there, in the user's environment with this
  interpreter's venv activated (its ``bin`` first on ``PATH``, as
  ``source .venv/bin/activate`` leaves it): ``python``, ``wirehead-torch``
  and ``wirehead`` are whatever that finds, with no stand-ins.
- ``yaml``: a config, resolved by ``wirehead_torch.load_config`` (an unknown
  key, a warning, is a failure).
- ``text``: output or a synopsis, not code.
- ``file=NAME``: the block is also the file NAME of the working folder
  (written before any block of the document runs); a python block with it
  is a module other blocks use, and is not run by itself.
- ``store=mongodb``: the block runs against a fresh database of the
  MongoDB test server instead of a fresh shm store.
- ``gpu``: on a machine without a CUDA device the block must stop with
  ``wirehead_torch.CudaError`` (the loader reports the missing device),
  and nothing else.
- ``not-run=REASON``: one of NOT_RUN's reasons; such a block is still
  checked: every ``make`` target it names exists in the Makefile, every
  ``wirehead-torch`` subcommand exists, every repository path it names
  exists. The run's summary counts them by reason (tests/install/conftest.py).

Each run block gets a fresh store through ``WIREHEAD_STORE`` (which
overrides ``STORE`` in any config), and must have removed it when it ends,
as an example run by a user leaves nothing behind."""
import os
import re
import signal
import subprocess
import sys
import time
import warnings

import pytest

import whlib

ROOT = whlib.REPO
DOCS = ["README.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))

# Why a block may stay unrun; each is covered elsewhere.
NOT_RUN = {
    "make": "a make target of the project itself: it installs into .venv and runs for "
            "minutes; CI runs `make test`, tests/install/test_demo.py runs the demo",
    "installs": "installs system packages or into a Python environment (root, network); "
                "`make test-installed` and `make test-wheel` install the package for real",
    "bench": "a benchmark: runs for minutes on an idle machine and rewrites a results "
             "file; its output is the table beside it",
    "cluster": "submits jobs to a SLURM cluster; tests/install/test_slurm.py runs these scripts "
               "on a 3-node test cluster",
    "lightning": "needs PyTorch Lightning, which only the torch 2.x lane has; "
                 "tests/ddp/test_lightning.py runs these blocks as written there",
}
LANGS = {"python", "sh", "yaml", "text"}
TIMEOUT = 300
# repository folders a document's working folder links, so that blocks can
# name them as from a checkout
LINKED = ("slurm", "benchmarks")

_FENCE = re.compile(r"^```(\S*)\s*$")
_MARK = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->\s*$")


class Block:
    def __init__(self, doc, line, lang, text, opts):
        self.doc, self.line, self.lang, self.text, self.opts = doc, line, lang, text, opts

    @property
    def id(self):
        return f"{self.doc}:{self.line}"


def parse_opts(text, where):
    opts = {}
    for word in text.split():
        key, _, value = word.partition("=")
        if key not in ("file", "store", "gpu", "not-run"):
            raise ValueError(f"{where}: unknown docs-test option {key!r}")
        opts[key] = value or True
    return opts


def blocks_of(doc):
    """The fenced blocks of one document, in order."""
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        if j == len(lines):
            raise ValueError(f"{doc}:{start + 1}: code block never closed")
        mark = _MARK.match(lines[start - 1]) if start else None
        opts = parse_opts(mark.group(1), f"{doc}:{start}") if mark else {}
        out.append(Block(doc, start + 1, m.group(1), "\n".join(lines[start + 1:j]) + "\n", opts))
        i = j + 1
    return out


ALL = [b for doc in DOCS for b in blocks_of(doc)]
RUN = [b for b in ALL if b.lang in ("python", "sh") and "not-run" not in b.opts
       and not (b.lang == "python" and "file" in b.opts)]


# --- the working folders -------------------------------------------------
@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    """doc -> a folder holding its file= blocks."""
    dirs = {}
    for doc in DOCS:
        d = tmp_path_factory.mktemp(re.sub(r"\W", "_", doc))
        for name in LINKED:  # paths as seen from a checkout
            os.symlink(os.path.join(ROOT, name), d / name)
        for b in blocks_of(doc):
            if "file" in b.opts:
                (d / b.opts["file"]).write_text(b.text)
        dirs[doc] = d
    return dirs


def user_env(store=None):
    """The environment of this run with this interpreter's venv activated,
    as `source .venv/bin/activate` leaves it, and the block's store."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONHOME", "WIREHEAD_CUDA_LIB", "WIREHEAD_FAULT_PUT_PAUSE")}
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["MONGOC_DISABLE_SHM"] = "1"
    if store is not None:
        env["WIREHEAD_STORE"] = store
    return env


def test_blocks_see_the_package_under_test_from_path(tmp_path):
    """In that environment `python` and the package's commands are the venv's
    and import the package under test: blocks run as a user runs them, and
    what they run is what this run tests."""
    import wirehead_torch
    r = subprocess.run(
        ["bash", "-e", "-c", "command -v python wirehead-torch wirehead; "
         "python -c 'import wirehead_torch; print(wirehead_torch.__file__)'"],
        cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (
        f"python, wirehead-torch or wirehead is not on the venv's PATH ({sys.prefix}); "
        f"`make install` puts them there\n{r.stdout}{r.stderr}")
    *commands, imported = r.stdout.split()
    bindir = os.path.dirname(sys.executable)
    assert all(os.path.dirname(c) == bindir for c in commands), (commands, bindir)
    assert os.path.realpath(imported) == os.path.realpath(wirehead_torch.__file__), imported


def clean_store(store):
    """Removes the store (a MongoDB one: its database, made for the block,
    whatever collection prefix the block's config gives); whether there was
    anything left to remove."""
    if store.startswith("mongodb://"):
        from mongo_server import RawClient
        server, db = store.rsplit("/", 1)
        with RawClient(server) as client:
            left = client.collections(db)
            client.command(db, {"dropDatabase": 1})
        return bool(left)
    import wirehead_torch as wt
    return wt.clean({"STORE": store, "SWAP_CAP": 1, "SAMPLE": ["x"]})


@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_block_runs(block, workdirs, request, tmp_path):
    if block.opts.get("store") == "mongodb":
        srv = request.getfixturevalue("mongo_server")
        store = f"{srv.uri}/{whlib.unique_name('docs')}"
    else:
        store = f"shm://{whlib.unique_name('docs')}"
    if block.lang == "python":
        cmd = [sys.executable, "-c", block.text]
    else:
        cmd = ["bash", "-e", "-c", block.text]
    try:
        rc, stdout, stderr, left = run_block(cmd, workdirs[block.doc], user_env(store),
                                             tmp_path)
    finally:
        store_left = clean_store(store)
    out = f"--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-5000:]}"
    assert not left, f"{block.id} left processes running after it ended: {left}\n{out}"
    if "gpu" in block.opts and not _have_gpu():
        assert rc != 0 and "wirehead_torch.CudaError" in stderr, (
            f"{block.id}: without a CUDA device this block must stop with CudaError\n{out}")
        assert stderr.rstrip().split("\n")[-1].startswith("wirehead_torch.CudaError"), out
    else:
        assert rc == 0, f"{block.id} failed (exit {rc})\n{out}"
    assert not store_left, (f"{block.id} left its store behind (the example must remove "
                            f"what it made, also when it fails)\n{out}")


# a shell block's clean-up: `trap '...' EXIT`; a job started with `&`
_TRAP = re.compile(r"^trap '[^']*' EXIT\b", re.M)
_BACKGROUND = re.compile(r"(?<![&>|])&(?![&>])")
TRAPPED = [b for b in RUN if b.lang == "sh" and _TRAP.search(b.text)]


def test_shell_blocks_that_start_processes_stop_them_on_failure():
    """Under `bash -e` a failed step skips the block's last lines: a block
    that starts a process in the background stops it in an EXIT trap."""
    for b in RUN:
        if b.lang == "sh" and _BACKGROUND.search(b.text):
            m = _TRAP.search(b.text)
            assert m and "kill" in b.text[m.start():b.text.index("\n", m.start())], (
                f"{b.id} starts a process in the background and has no `trap 'kill ...' EXIT`")
    assert len(TRAPPED) >= 4


@pytest.mark.parametrize("block", TRAPPED, ids=[b.id for b in TRAPPED])
def test_shell_block_cleans_up_when_a_step_fails(block, workdirs, tmp_path):
    """The block with a step that fails right after its trap is set (what it
    started is running): it fails, and leaves no process and no store."""
    store = f"shm://{whlib.unique_name('docs')}"
    end = block.text.index("\n", _TRAP.search(block.text).start()) + 1
    text = block.text[:end] + "false  # a step that fails\n" + block.text[end:]
    try:
        rc, stdout, stderr, left = run_block(["bash", "-e", "-c", text], workdirs[block.doc],
                                             user_env(store), tmp_path)
    finally:
        store_left = clean_store(store)
    out = f"--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-5000:]}"
    assert rc == 1, f"{block.id}: exit {rc}, not the failed step's 1\n{out}"
    assert not left, f"{block.id} left processes running after a failed step: {left}\n{out}"
    assert not store_left, f"{block.id} left its store behind after a failed step\n{out}"


def _group_pids(pgid):
    """Live processes of a process group (from /proc), zombies left out."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def run_block(cmd, cwd, env, tmp_path):
    """(exit status, stdout, stderr, pids left running) of one block, run in
    a process group of its own: its output goes to files, so a background
    process it leaves behind cannot hold the test up, and whatever of the
    group is still alive when it ends (or times out) is ended here."""
    with open(tmp_path / "out", "w+") as fo, open(tmp_path / "err", "w+") as fe:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fo, stderr=fe,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = None
        # exiting children (DataLoader workers, torchrun ranks) get a bounded
        # moment to go; anything still there is a leftover of the block
        deadline = time.monotonic() + 5
        left = _group_pids(proc.pid)
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = _group_pids(proc.pid)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not _group_pids(proc.pid):
                break
            os.killpg(proc.pid, sig)
            end = time.monotonic() + 10
            while _group_pids(proc.pid) and time.monotonic() < end:
                time.sleep(0.05)
        if rc is None:
            proc.wait()
            left = left or ["timed out after %d s" % TIMEOUT]
        fo.seek(0)
        fe.seek(0)
        return rc, fo.read(), fe.read(), left


def _have_gpu():
    import torch
    return torch.cuda.is_available()


YAML = [b for b in ALL if b.lang == "yaml"]


@pytest.mark.parametrize("block", YAML, ids=[b.id for b in YAML])
def test_yaml_block_is_a_valid_config(block, tmp_path):
    from wirehead_torch import load_config
    p = tmp_path / "config.yaml"
    p.write_text(block.text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = load_config(str(p))
    assert cfg["SWAP_CAP"] >= 1 and cfg["SAMPLE"]


def _make_targets():
    """Targets of the Makefile and the files it includes."""
    targets, files = set(), ["Makefile"]
    while files:
        with open(os.path.join(ROOT, files.pop()), encoding="utf-8") as f:
            text = f.read()
        files += re.findall(r"^-?include\s+(\S+)", text, re.M)
        for line in text.split("\n"):
            m = re.match(r"^([A-Za-z0-9_.$()/-]+(?:\s+[A-Za-z0-9_.$()/-]+)*)\s*:(?!=)", line)
            if m:
                targets.update(m.group(1).split())
    return targets


def _subcommands():
    """The wirehead-torch subcommands, from its --help."""
    r = subprocess.run(["wirehead-torch", "--help"], capture_output=True, text=True,
                       env=user_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    return set(re.findall(r"[a-z]+", r.stdout.split("{", 1)[1].split("}", 1)[0]))


NOT_RUN_BLOCKS = [b for b in ALL if "not-run" in b.opts]


# the id carries the reason, which the run's summary counts
@pytest.mark.parametrize("block", NOT_RUN_BLOCKS,
                         ids=[f"{b.id}-not-run={b.opts['not-run']}" for b in NOT_RUN_BLOCKS])
def test_unrun_block_names_what_exists(block):
    reason = block.opts["not-run"]
    assert reason in NOT_RUN, (f"{block.id}: not-run={reason!r} is none of the reasons "
                               f"{sorted(NOT_RUN)}")
    assert block.lang == "sh", f"{block.id}: only shell blocks may stay unrun"
    targets = _make_targets()
    for m in re.finditer(r"(?:^|[\s;&|(])make\s+((?:[a-z][\w-]*\s*)+)", block.text):
        for t in m.group(1).split():
            if "=" not in t:
                assert t in targets, f"{block.id}: `make {t}` is not a Makefile target"
    subs = _subcommands()
    for m in re.finditer(r"wirehead-torch\s+([a-z]+)", block.text):
        assert m.group(1) in subs, f"{block.id}: no `wirehead-torch {m.group(1)}` subcommand"
    for m in re.finditer(r"(?<![\w/.$~-])((?:slurm|benchmarks|tests|docs|ext)/[\w./-]*\w)",
                         block.text):
        assert os.path.exists(os.path.join(ROOT, m.group(1))), (
            f"{block.id}: names {m.group(1)}, which the repository does not hold")


def test_every_block_has_a_known_language_and_reason():
    for doc in DOCS:
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                # an indented fence (in a list) would escape the checks
                assert not re.match(r"^\s+```", line), f"{doc}:{n}: indented code fence"
    for b in ALL:
        assert b.lang in LANGS, (f"{b.id}: fence language {b.lang!r}; use one of "
                                 f"{sorted(LANGS)} (docs/development.md)")
        if "not-run" in b.opts or "gpu" in b.opts or "store" in b.opts:
            assert b.lang in ("sh", "python"), f"{b.id}: options on a {b.lang} block"
        if "store" in b.opts:
            assert b.opts["store"] == "mongodb", f"{b.id}: store= takes only mongodb"
    # the harness runs something in every document that has code
    assert len(RUN) >= 10


def test_links_resolve_and_readme_links_every_doc():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    for doc in DOCS[1:]:
        assert f"({doc})" in readme, f"README.md does not link {doc}"
    for doc in DOCS:
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            text = f.read()
        base = os.path.dirname(os.path.join(ROOT, doc))
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert os.path.exists(os.path.join(base, target)), f"{doc}: broken link {target}"


def test_no_file_cites_a_design_document_the_repository_lacks():
    bad = []
    for top in ("wirehead_torch", "ext", "tests", "benchmarks", "wirehead", "slurm"):
        for dirpath, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if not name.endswith((".py", ".c", ".h", ".sh", ".sbatch", ".md")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        if re.search(r"(?<![/\w])DESIGN\.md", line):
                            bad.append(f"{os.path.relpath(path, ROOT)}:{n}")
    assert not bad, f"cite docs/design.md instead: {bad}"


def _section(text, heading):
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_readers_md_names_every_keyword_of_every_reader():
    import inspect

    import wirehead_torch as wt
    with open(os.path.join(ROOT, "docs", "readers.md"), encoding="utf-8") as f:
        text = f.read()
    shared = _section(text, "Options shared by WireheadLoader and WireheadIterableDataset")
    for cls, heading, with_shared in (
            (wt.WireheadLoader, "WireheadLoader", True),
            (wt.WireheadIterableDataset, "WireheadIterableDataset", True),
            (wt.MongoheadDataset, "MongoheadDataset and MongoTupleheadDataset", False),
            (wt.MongoTupleheadDataset, "MongoheadDataset and MongoTupleheadDataset", False)):
        doc = _section(text, heading) + (shared if with_shared else "")
        names = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        missing = [p for p in names if f"`{p}`" not in doc]
        assert not missing, f"docs/readers.md, {heading}: no row for {missing}"
        assert len(names) >= 13


def test_guarantees_md_names_tests_that_exist():
    with open(os.path.join(ROOT, "docs", "guarantees.md"), encoding="utf-8") as f:
        text = f.read()
    sources = {}
    for dirpath, _dirs, files in os.walk(os.path.join(ROOT, "tests")):
        for name in files:
            if name.endswith((".py", ".c")):
                with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                    sources[os.path.relpath(os.path.join(dirpath, name), ROOT)] = f.read()
    files = set(re.findall(r"`((?:tests/)?[\w/]+\.(?:py|c))`", text))
    for name in files:
        path = name if name.startswith("tests/") else f"tests/{name}"
        assert path in sources, f"docs/guarantees.md names {name}, which tests/ lacks"
    funcs = set(re.findall(r"`((?:test|t)_\w+)`", text))
    assert len(funcs) > 30
    for fn in funcs:
        assert any(re.search(rf"\b{fn}\(", src) for src in sources.values()), (
            f"docs/guarantees.md names {fn}, which no test defines")
