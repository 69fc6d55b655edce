"""Installs where users are: the generator side runs without torch; next
to, over and after the original wirehead."""
import glob
import os
import subprocess
import sys

import pytest

import wirehead_torch

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
        assert "pip install torch" in str(e) and ".[torch]" in str(e), e
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
    r = _run_without_torch("import sys; from wirehead_torch.apps.cli import main; "
                           "sys.argv = ['wirehead-torch', '--help']; main()", tmp_path)
    assert r.returncode == 0 and "manager" in r.stdout, r.stderr


def test_a_checkout_without_its_extension_says_so(tmp_path):
    """Run where a source tree without a built extension comes first on the
    path (the checkout as working directory), the import says what happened
    and what to do, not "partially initialized module"."""
    import shutil
    src = os.path.dirname(wirehead_torch.__file__)
    shutil.copytree(src, tmp_path / "wirehead_torch",
                    ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
    # -S: no site-packages, so only the copy in the working directory is found
    r = subprocess.run([sys.executable, "-S", "-c", "import wirehead_torch"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "C extension (_C) is not in" in r.stderr and "make build" in r.stderr, r.stderr


def test_every_lazy_name_is_public():
    """The readers are imported on first use; each of those names is in
    __all__ like the others (to_device was not)."""
    assert set(wirehead_torch._LAZY) <= set(wirehead_torch.__all__)
    assert "to_device" in wirehead_torch.__all__


def test_import_does_not_load_torch():
    r = subprocess.run([sys.executable, "-c", "import sys, wirehead_torch; "
                        "print('torch' in sys.modules)"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


# ---- migration: wirehead_torch, its compatibility package, the original ----
#
# Three distributions: wirehead_torch (no `wirehead` package or command),
# the compatibility package built from compat/ (distribution name
# `wirehead`, package `wirehead`, command `wirehead`) and the original
# wirehead (the same names; a stand-in is built here). Each order of
# installing them, and uninstalling each, leaves every installed one whole
# or says what to do.

ORIGINAL_VERSION = "0.9.3"
ORIGINAL_FILES = ["__init__.py", "cli.py", "core.py"]
COMPAT_FILES = ["__init__.py", "_wirehead_torch.py", "dataset.py", "generator.py", "log.py",
                "manager.py"]

_ORIGINAL_SRC = {
    "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\n'
                      'build-backend = "setuptools.build_meta"\n',
    "setup.py": "from setuptools import setup\n"
                f"setup(name='wirehead', version='{ORIGINAL_VERSION}', packages=['wirehead'],\n"
                "      entry_points={'console_scripts': ['wirehead = wirehead.cli:main']})\n",
    "wirehead/__init__.py": "WHO = 'original'\n",
    "wirehead/core.py": "# a module the compatibility package does not have\n",
    "wirehead/cli.py": "def main():\n    print('the original wirehead command')\n",
}


def _clean_env():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INDEX"] = "1"  # everything comes from the wheels built here
    return env


def _copy_checkout(dst):
    """The files a fresh checkout builds both wheels from (no build/, no
    in-place extension: a stale build directory could add old files)."""
    import shutil
    repo = whlib.REPO
    for f in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy2(os.path.join(repo, f), dst / f)
    shutil.copytree(os.path.join(repo, "ext"), dst / "ext")
    shutil.copytree(os.path.join(repo, "wirehead_torch"), dst / "wirehead_torch",
                    ignore=lambda d, names: [n for n in names if n == "__pycache__" or not (
                        n.endswith(".py") or os.path.isdir(os.path.join(d, n)))])
    shutil.copytree(os.path.join(repo, "compat"), dst / "compat", symlinks=True,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """wirehead_torch's and the compatibility package's wheels built from a
    copy of this checkout, and the stand-in original wirehead's."""
    root = tmp_path_factory.mktemp("migration")
    src, orig, dist = root / "src", root / "orig", root / "dist"
    src.mkdir()
    _copy_checkout(src)
    for rel, text in _ORIGINAL_SRC.items():
        (orig / rel).parent.mkdir(parents=True, exist_ok=True)
        (orig / rel).write_text(text)
    # two runs: one pip run refuses two distributions of one name
    for what in ([src, src / "compat"], [orig]):
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "-w", str(dist), *map(str, what)],
                           cwd=root, env=_clean_env(), capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr

    def one(pattern):
        found = glob.glob(str(dist / pattern))
        assert len(found) == 1, (pattern, os.listdir(dist))
        return found[0]
    return {"torch": one("wirehead_torch-*.whl"),
            "compat": one(f"wirehead-{wirehead_torch.__version__}-*.whl"),
            "original": one(f"wirehead-{ORIGINAL_VERSION}-*.whl")}


class Venv:
    """A fresh venv seeing the system's packages (numpy, yaml, pip), none
    of the test run's."""

    def __init__(self, path):
        self.path = path
        # the system's pip serves the venv (creating one with its own pip is slow)
        has_pip = subprocess.run(["/usr/bin/python3", "-c", "import pip"],
                                 capture_output=True).returncode == 0
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(path)]
                       + (["--without-pip"] if has_pip else []), check=True, timeout=300)
        self.bin = path / "bin"

    def run(self, prog, *args):
        return subprocess.run([str(self.bin / prog), *args], cwd=self.path, env=_clean_env(),
                              capture_output=True, text=True, timeout=300)

    def pip(self, *args):
        r = self.run("python", "-m", "pip", *args)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def install(self, wheel):
        return self.pip("install", "--no-deps", "--no-build-isolation", wheel)

    def uninstall(self, dist):
        out = self.pip("uninstall", "-y", dist)
        assert f"Successfully uninstalled {dist}-" in out, out
        return out

    def wirehead_files(self):
        """The files of the `wirehead` package here (None: none)."""
        r = self.run("python", "-c", "import importlib.util as u, os; s = u.find_spec('wirehead');"
                     " print(sorted(f for f in os.listdir(s.submodule_search_locations[0])"
                     " if f.endswith('.py')) if s else None)")
        assert r.returncode == 0, r.stderr
        return eval(r.stdout)

    def wirehead_line(self):
        """What `wirehead-torch --version` says about the wirehead package."""
        r = self.run("wirehead-torch", "--version")
        assert r.returncode == 0, r.stderr
        first, second = r.stdout.splitlines()
        assert first == f"wirehead-torch {wirehead_torch.__version__}"
        return second

    def original_works(self):
        assert self.wirehead_files() == ORIGINAL_FILES
        r = self.run("python", "-c", "import wirehead, wirehead.core; print(wirehead.WHO)")
        assert (r.returncode, r.stdout) == (0, "original\n"), r.stderr
        r = self.run("wirehead")
        assert (r.returncode, r.stdout) == (0, "the original wirehead command\n"), r.stderr

    def compat_works(self):
        assert self.wirehead_files() == COMPAT_FILES
        r = self.run("python", "-c", "import wirehead_torch as wt; from wirehead import "
                     "WireheadGenerator, WireheadLogger; from wirehead.dataset import "
                     "unit_interval_normalize; assert WireheadGenerator is wt.WireheadGenerator;"
                     " print('ok')")
        assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr
        r = self.run("wirehead", "--help")
        assert r.returncode == 0 and "Wirehead swap history" in r.stdout, r.stderr
        assert self.wirehead_line().startswith("wirehead: the compatibility package "
                                               f"{wirehead_torch.__version__} at ")

    def torch_works(self):
        r = self.run("python", "-c", "import wirehead_torch, sys; "
                     "print(wirehead_torch.__file__.startswith(sys.prefix))")
        assert (r.returncode, r.stdout) == (0, "True\n"), r.stderr
        r = self.run("wirehead-torch", "--help")
        assert r.returncode == 0 and "manager" in r.stdout, r.stderr

    def no_wirehead(self):
        assert self.wirehead_files() is None
        assert not (self.bin / "wirehead").exists()
        assert self.wirehead_line().startswith("wirehead: not installed")


def test_wheels_keep_their_names_apart(wheels):
    """wirehead_torch's wheel ships no `wirehead` package or command; the
    compatibility wheel is the distribution `wirehead`, of this version."""
    import zipfile
    with zipfile.ZipFile(wheels["torch"]) as z:
        names = z.namelist()
        entry = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert not [n for n in names if n.startswith("wirehead/")]
    assert "wirehead-torch = wirehead_torch.apps.cli:main" in entry
    assert not [x for x in entry.splitlines() if x.startswith("wirehead ")]
    with zipfile.ZipFile(wheels["compat"]) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
        entry = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert sorted(n.split("/")[1] for n in names if n.startswith("wirehead/")) == COMPAT_FILES
    assert "\nName: wirehead\n" in meta
    assert f"\nVersion: {wirehead_torch.__version__}\n" in meta
    assert "Requires-Dist: wirehead_torch" in meta
    assert "wirehead = wirehead.log:main" in entry


@pytest.mark.parametrize("first", ["original", "torch"])
def test_next_to_the_original(wheels, tmp_path, first):
    """wirehead_torch installed before or after the original wirehead
    touches none of its files; uninstalling either leaves the other whole."""
    v = Venv(tmp_path / "venv")
    for which in ([first] + [w for w in ("original", "torch") if w != first]):
        out = v.install(wheels[which])
        assert "Uninstalling" not in out, out
    v.original_works()
    v.torch_works()
    assert v.wirehead_line() == (
        f"wirehead: the original wirehead {ORIGINAL_VERSION} at "
        f"{v.path}/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages/wirehead;"
        " `from wirehead import` uses it, not wirehead_torch (pip install ./compat in the "
        "checkout replaces it; reinstalling the original brings it back)")
    if first == "original":
        v.uninstall("wirehead_torch")
        v.original_works()
        assert not (v.bin / "wirehead-torch").exists()
    else:
        v.uninstall("wirehead")
        v.torch_works()
        v.no_wirehead()


def test_compatibility_package_and_original_replace_each_other(wheels, tmp_path):
    v = Venv(tmp_path / "venv")
    v.install(wheels["torch"])
    v.no_wirehead()
    v.install(wheels["compat"])
    v.compat_works()
    # the original after the compatibility package: pip uninstalls that first
    out = v.install(wheels["original"])
    assert f"Successfully uninstalled wirehead-{wirehead_torch.__version__}" in out, out
    v.original_works()
    v.torch_works()
    # the compatibility package over the original: pip uninstalls the original
    # (its files go, none is left mixed in)
    out = v.install(wheels["compat"])
    assert f"Found existing installation: wirehead {ORIGINAL_VERSION}" in out, out
    assert f"Successfully uninstalled wirehead-{ORIGINAL_VERSION}" in out, out
    v.compat_works()
    # wirehead_torch uninstalled under the compatibility package: both the
    # imports and the command say what to do
    v.uninstall("wirehead_torch")
    from importlib import util
    spec = util.spec_from_file_location("_w", os.path.join(
        whlib.REPO, "compat", "wirehead", "_wirehead_torch.py"))
    mod = util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for r in (v.run("python", "-c", "from wirehead import WireheadGenerator"),
              v.run("wirehead", "config.yaml")):
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr.rstrip().endswith(f"ImportError: {mod.MISSING}"), r.stderr
    assert "pip uninstall wirehead" in mod.MISSING and "wirehead_torch-*.whl" in mod.MISSING
    v.install(wheels["torch"])
    v.compat_works()
    # uninstalling the compatibility package leaves wirehead_torch whole
    v.uninstall("wirehead")
    v.no_wirehead()
    v.torch_works()


# ---- trying MongoDB: the test server as `make mongo-server` runs it ----

def _trial_server(*args):
    script = os.path.join(whlib.REPO, "tests", "helpers", "mongo_server.py")
    return subprocess.Popen([sys.executable, script, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_mongo_trial_server_prints_a_store_line_that_works(tmp_path):
    """The server `make mongo-server` starts prints an `export
    WIREHEAD_STORE=...` line; a config pointed at another store runs on it
    with that line in the environment, and SIGTERM ends the server with 0.
    A port already taken is refused with a message saying what to do."""
    import signal
    srv = _trial_server("0", "trial")
    try:
        first = srv.stdout.readline()
        line = srv.stdout.readline().strip()
        assert first.startswith("in-memory MongoDB test server on mongodb://127.0.0.1:"), (
            first, srv.stderr.read() if srv.poll() is not None else "")
        assert line.startswith("export WIREHEAD_STORE=mongodb://127.0.0.1:") and (
            line.endswith("/trial")), line
        store = line.split("=", 1)[1]
        code = '''
import numpy as np
import wirehead_torch as wt
cfg = {"STORE": "shm://not-this-one", "SWAP_CAP": 2, "SAMPLE": ["x"]}
wt.WireheadGenerator(iter([(np.zeros(4, np.float32),)] * 2), config=cfg, quiet=True).run()
st = wt.status(cfg)
assert st["store"].startswith("mongodb://") and st["generated"] == 2, st
assert wt.clean(cfg)
print("ok")
'''
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, WIREHEAD_STORE=store))
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
        port = store.rsplit(":", 1)[1].split("/")[0]
        taken = _trial_server(port)
        out, err = taken.communicate(timeout=60)
        assert taken.returncode == 1 and f"port {port} is in use" in err, (out, err)
        assert "MONGO_PORT=0" in err, err
    finally:
        srv.send_signal(signal.SIGTERM)
        assert srv.wait(timeout=60) == 0
    assert not os.path.exists("/dev/shm/wirehead.not-this-one")


# ---- `make install` on a fresh clone: only what the package needs ----

@pytest.mark.once
def test_make_install_in_a_fresh_clone_needs_no_test_toolchain(tmp_path):
    """`make install` (what `make demo` runs first) in a fresh clone makes its
    own venv without the test toolchain's packages, and the package imports
    there: a set-up step that only the tests' packages made work (pytest
    brings a newer `packaging` than Debian's) shows here."""
    if not os.path.isdir(os.path.join(whlib.REPO, ".git")):
        pytest.skip("not a git checkout: nothing to clone")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", whlib.REPO, str(clone)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    r = subprocess.run(["make", "install"], cwd=clone, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert not (clone / ".venv" / ".test-stamp").exists()
    py = str(clone / ".venv" / "bin" / "python")
    r = subprocess.run([py, "-c", "import wirehead_torch, sys; print(wirehead_torch.__file__)"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and str(clone) in r.stdout, r.stdout + r.stderr
    r = subprocess.run([str(clone / ".venv" / "bin" / "wirehead-torch"), "--help"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "generate" in r.stdout, r.stdout + r.stderr
