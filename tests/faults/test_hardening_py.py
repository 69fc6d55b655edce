"""Hostile or odd input on the Python side: config values, YAML bombs,
tensor bits, concurrent loader iteration."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import wirehead_torch as wt
from wirehead_torch import _C
from wirehead_torch._arrays import to_store_arrays
from wirehead_torch._store_args import store_kwargs

import whlib


def cfg_file(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


BASE = "STORE: shm://hard\nSAMPLE: [a]\n"


@pytest.mark.parametrize("line,key", [
    ("SWAP_CAP: 18446744073709551619", "SWAP_CAP"),   # 2**64+3 would wrap to 3
    ("SWAP_CAP: 1073741825", "SWAP_CAP"),
    ("SWAP_CAP: 0", "SWAP_CAP"),
    ("SWAP_CAP: 2.5", "SWAP_CAP"),
    ("SWAP_CAP: 4\nPORT: 70000", "PORT"),
    ("SWAP_CAP: 4\nPORT: 0", "PORT"),
    ("SWAP_CAP: 4\nLEASE_SECONDS: .nan", "LEASE_SECONDS"),
    ("SWAP_CAP: 4\nREAD_TIMEOUT: .inf", "READ_TIMEOUT"),
    ("SWAP_CAP: 4\nCONNECT_TIMEOUT: 1e300", "CONNECT_TIMEOUT"),
    ("SWAP_CAP: 4\nMANAGER_POLL: -.inf", "MANAGER_POLL"),
    ("SWAP_CAP: 4\nCHUNKSIZE: .nan", "CHUNKSIZE"),
    ("SWAP_CAP: 4\nCHUNKSIZE: 0.000001", "CHUNKSIZE"),   # 1-byte chunks
    ("SWAP_CAP: 4\nCHUNKSIZE: 16", "CHUNKSIZE"),         # over MongoDB's document limit
    ("SWAP_CAP: 4\nBYTE_BUDGET: .inf", "BYTE_BUDGET"),
    ("SWAP_CAP: 4\nBYTE_BUDGET: 99999999999999999999999999", "BYTE_BUDGET"),
    ("SWAP_CAP: 4\nBYTE_BUDGET: '" + "9" * 400 + "'", "BYTE_BUDGET"),
    ("SWAP_CAP: 4\nDBNAME: \"a\\0b\"", "DBNAME"),
    ("SWAP_CAP: 4\nCOLLECTION_PREFIX: \"p\\nq\"", "COLLECTION_PREFIX"),
    ("SWAP_CAP: 4\nSTORE: \"shm://x\\0y\"", "STORE"),
])
def test_out_of_range_values_name_key_and_file(tmp_path, line, key):
    p = cfg_file(tmp_path, "SAMPLE: [a]\n" + line + "\n")
    with pytest.raises(ValueError) as ei:
        wt.load_config(p)
    assert key in str(ei.value) and str(p) in str(ei.value)


@pytest.mark.parametrize("sample,what", [
    ('["a\\0b"]', "control character"),
    ('["a", "b\\tc"]', "control character"),
    ('["a", "a"]', "twice"),
    ('["' + "x" * 64 + '"]', "longer than 63"),
    ('[""]', "non-empty"),
    ("[1]", "non-empty string"),
])
def test_bad_sample_names(tmp_path, sample, what):
    p = cfg_file(tmp_path, f"SWAP_CAP: 4\nSAMPLE: {sample}\n")
    with pytest.raises(ValueError, match=what) as ei:
        wt.load_config(p)
    assert "SAMPLE" in str(ei.value) and str(p) in str(ei.value)


def test_quoted_numbers_accepted_like_the_original(tmp_path, monkeypatch):
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    p = cfg_file(tmp_path, 'MONGOHOST: h\nPORT: "45055"\nSWAP_CAP: "100"\nSAMPLE: [a]\n'
                           'CHUNKSIZE: "8"\nLEASE_SECONDS: "2.5"\n')
    cfg = wt.load_config(p)
    assert cfg["PORT"] == 45055 and cfg["SWAP_CAP"] == 100
    assert cfg["CHUNKSIZE"] == 8 and cfg["LEASE_SECONDS"] == 2.5
    assert cfg["STORE"] == "mongodb://h:45055/wirehead"
    assert store_kwargs(cfg)["swap_cap"] == 100
    for bad in ('"1e99999"', '"nan"', '"0x10"', '"18446744073709551619"'):
        with pytest.raises(ValueError, match="SWAP_CAP"):
            wt.load_config(cfg_file(tmp_path, f"SWAP_CAP: {bad}\nSAMPLE: [a]\n"))


def test_billion_laughs_refused_quickly(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    p = cfg_file(tmp_path, "\n".join(lines) + "\nSWAP_CAP: 4\nSAMPLE: [a]\n")
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="alias") as ei:
        wt.load_config(p)
    assert time.monotonic() - t0 < 5
    assert str(p) in str(ei.value)


def test_single_alias_also_refused(tmp_path):
    p = cfg_file(tmp_path, "SAMPLE: &s [a]\nREAD_COLLECTION: *s\nSWAP_CAP: 4\n")
    with pytest.raises(ValueError, match=r"alias \*s"):
        wt.load_config(p)


@pytest.mark.parametrize("data", [
    bytes(range(256)),
    b"\xff\xfe\x00S\x00W\x00A\x00P",
    b"SWAP_CAP: 4\nSAMPLE: [a]\n\x00\x01\x02",
    b"SWAP_CAP: 4\n" + b"#" * ((1 << 20) + 1),
])
def test_binary_garbage_names_file(tmp_path, data):
    p = cfg_file(tmp_path, data)
    with pytest.raises(ValueError) as ei:
        wt.load_config(p)
    assert str(p) in str(ei.value)


def test_dict_config_checked_too():
    with pytest.raises(ValueError, match="SWAP_CAP"):
        wt.config.get_config(config={"SWAP_CAP": 2 ** 64 + 3, "SAMPLE": ["a"], "STORE": "shm://x"})
    with pytest.raises(ValueError, match="SAMPLE"):
        wt.config.get_config(config={"SWAP_CAP": 4, "SAMPLE": ["a\x00"], "STORE": "shm://x"})


def odd_tensors():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) - 7.5
    c = torch.complex(torch.arange(6.0), torch.arange(6.0) + 1)
    return {
        "neg bit (imag of conj)": c.conj().imag,
        "neg bit view": torch._neg_view(base),
        "neg bit transposed": torch._neg_view(base).t(),
        "conj": c.conj(),
        "conj of neg": c.conj().neg(),
        "non-contiguous": base[:, ::2],
        "transposed": base.t(),
        "expanded": torch.arange(3.0).expand(4, 3),
        "zero-size": torch.zeros(0, 5),
        "requires_grad": (base * 2).requires_grad_(),
        "bfloat16 neg bit": torch._neg_view(base.to(torch.bfloat16)),
        "int neg bit": torch._neg_view(torch.arange(5, dtype=torch.int32)),
        "scalar": torch.tensor(3.25),
    }


@pytest.mark.parametrize("kind", list(odd_tensors()))
def test_odd_tensors_store_what_the_user_sees(shm_cfg, kind):
    t = odd_tensors()[kind]
    want = t.detach().clone().resolve_conj().resolve_neg()
    cfg = shm_cfg(swap_cap=2, sample=("x", "y"))
    assert wt.WireheadGenerator(iter([(t, t), (t, t)]), config=cfg).run() == 2
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    ds = wt.MongoTupleheadDataset(config=cfg)
    for i in range(2):
        for got in ds[i]:
            assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape)
            assert torch.equal(got, want), kind


def test_sparse_tensor_refused_clearly(shm_cfg):
    cfg = shm_cfg(swap_cap=1, sample=("x",))
    sp = torch.eye(3).to_sparse()
    with pytest.raises(wt.InvalidSampleError, match="field 'x'.*to_dense"):
        wt.WireheadGenerator(iter([(sp,)]), config=cfg).run()


def test_to_store_arrays_neg_bit_directly():
    c = torch.complex(torch.arange(4.0), torch.arange(4.0))
    t = c.conj().imag  # the negative bit set: numpy() refuses it
    assert t.is_neg()
    ((arr, code),) = to_store_arrays((t,), ["x"])
    assert np.array_equal(np.asarray(arr), np.array([-0.0, -1.0, -2.0, -3.0], np.float32))
    assert code == _C.DTYPES["float32"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tensor_to_generator_is_refused_clearly(shm_cfg):
    cfg = shm_cfg(swap_cap=1, sample=("x", "y"))
    t = torch.zeros(2, device="cuda")
    with pytest.raises(wt.InvalidSampleError, match="field 'y': tensor on cuda.*CPU"):
        wt.WireheadGenerator(iter([(torch.zeros(2), t)]), config=cfg).run()
    assert wt.status(cfg)["write_fill"] == 0


def test_manager_keeps_a_bounded_number_of_swap_records(shm_cfg, monkeypatch):
    import whlib
    monkeypatch.setattr(wt.WireheadManager, "RECORDS_KEPT", 3)
    cfg = shm_cfg(swap_cap=1)
    mgr = wt.WireheadManager(config=cfg)
    for i in range(5):
        wt.WireheadGenerator(iter([whlib.sample(1, i)]), config=cfg).run()
        assert mgr.run(max_swaps=i + 1) == i + 1  # counts across runs
    assert len(mgr.records) == 3
    gens = [r["generation"] for r in mgr.records]
    assert gens == sorted(gens) and gens[-1] == wt.status(cfg)["read_gen"]


def _nested(depth, leaf=1):
    d = leaf
    for _ in range(depth):
        d = {"a": d}
    return d


def test_params_nested_too_deep_is_the_documented_type_error(shm_cfg):
    cfg = shm_cfg(swap_cap=2, sample=["a"])
    for deep in (_nested(5000), [[[[0]]]] * 2 + [_nested(wt.MAX_PARAMS_DEPTH)],
                 {"a": [_nested(4999)]}):
        doc = deep if isinstance(deep, dict) else {"x": deep}
        with pytest.raises(TypeError, match=f"params are not JSON-serialisable: nested deeper "
                                            f"than {wt.MAX_PARAMS_DEPTH} levels"):
            wt.set_params(doc, config=cfg)
    loop = {}
    loop["self"] = loop
    with pytest.raises(TypeError, match="nested deeper"):
        wt.set_params(loop, config=cfg)
    assert wt.get_params(config=cfg) == (0, {})  # nothing stored
    ok = _nested(wt.MAX_PARAMS_DEPTH - 1)  # the document itself is the first level
    assert wt.set_params(ok, config=cfg) == 1
    assert wt.get_params(config=cfg) == (1, ok)


@pytest.mark.parametrize("text,says", [
    ("1e999", "a: 1e999 is not representable (inf and nan are not JSON)"),
    ("-1e999", "a: -1e999 is not representable"),
    ("[1, 2e400]", "a: 2e400 is not representable"),
    ("[" * 5000 + "]" * 5000, "a: nested too deep"),
    ("[" * 70 + "]" * 70, "nested deeper than 64 levels"),
    ("9" * 5000, "a: Exceeds the limit"),
])
def test_cli_params_unrepresentable_value_is_one_line(shm_cfg, tmp_path, capsys, text, says):
    from wirehead_torch.apps import cli
    cfg = shm_cfg(swap_cap=2, sample=["a"])
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    assert cli.main(["params", "--config", str(path), "--set", f"a={text}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wirehead-torch params: --set a: " if "deeper" not in says else
                          "wirehead-torch params: params are not JSON-serialisable")
    assert says in err and err.count("\n") == 1, err
    assert wt.get_params(config=cfg) == (0, {})


def test_cli_params_1e999_exits_without_a_traceback(shm_cfg, tmp_path):
    cfg = shm_cfg(swap_cap=2, sample=["a"])
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    r = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "params", "--config",
                        str(path), "--set", "a=1e999"], capture_output=True, text=True,
                       env=whlib.env_for_child(), timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1] == ("wirehead-torch params: --set a: 1e999 is not "
                                         "representable (inf and nan are not JSON); give a "
                                         "finite number")


def _relay_of_nowhere(tmp_path, prefix):
    """(config of a relay whose MongoDB is unreachable, its LOCAL_CACHE
    name, a victim file outside /dev/shm)."""
    name = whlib.unique_name(prefix)
    cfg = {"STORE": "mongodb://127.0.0.1:1/db", "SAMPLE": ["a"], "SWAP_CAP": 2,
           "LOCAL_CACHE": f"shm://{name}", "CONNECT_TIMEOUT": 1}
    victim = tmp_path / "victim"
    victim.write_bytes(b"kept")
    return cfg, name, victim


@pytest.mark.parametrize("kind", ["link", "dangling", "fifo", "dir"])
def test_relay_lock_that_is_not_a_regular_file_is_a_one_line_error(tmp_path, kind):
    cfg, name, victim = _relay_of_nowhere(tmp_path, "whrelaylock")
    lock = f"/dev/shm/wirehead-relay.{name}.lock"
    what = {"link": "a symbolic link", "dangling": "a symbolic link", "fifo": "a FIFO",
            "dir": "a directory"}[kind]
    if kind == "link":
        os.symlink(victim, lock)
    elif kind == "dangling":
        os.symlink(tmp_path / "absent", lock)
    elif kind == "fifo":
        os.mkfifo(lock, 0o600)
    else:
        os.mkdir(lock, 0o700)
    try:
        path = tmp_path / "c.yaml"
        path.write_text(json.dumps(cfg))
        r = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "relay",
                            "--config", str(path), "--no-wait"], capture_output=True,
                           text=True, env=whlib.env_for_child(), timeout=60)
    finally:
        (os.rmdir if kind == "dir" else os.unlink)(lock)
    assert r.returncode == 2
    assert r.stderr == (f"wirehead-torch relay: {lock}: the relay's file is {what}, it must "
                        f"be a regular file of uid {os.geteuid()} with mode 0600; remove it\n")
    assert victim.read_bytes() == b"kept" and not os.path.lexists(tmp_path / "absent")


def test_relay_figures_are_never_written_through_a_link(tmp_path):
    cfg, name, victim = _relay_of_nowhere(tmp_path, "whrelayfig")
    figures = f"/dev/shm/wirehead-relay.{name}.json"
    os.symlink(victim, figures)
    relay = wt.WireheadRelay(config=cfg, wait=False, quiet=True)
    try:
        # refused at the relay's start, before it writes its figures (a link
        # planted later is refused by the write: _files.put_in_place)
        with pytest.raises(wt.ConfigError, match=f"{figures}: the relay's file is a symbolic "
                                                 f"link, it must be a regular file"):
            relay.run()
    finally:
        relay.close()
        os.unlink(figures)
    assert victim.read_bytes() == b"kept"
    assert not [f for f in os.listdir("/dev/shm") if name in f]  # no temporary left


def test_relay_figures_of_another_user_are_refused_not_replaced(tmp_path):
    """A figures file of another user's (uid 65534), put there first: the
    relay refuses it at its start, in one line naming the file and its
    owner, and never replaces it (as root it could)."""
    import threading
    cfg, name, _victim = _relay_of_nowhere(tmp_path, "whrelayuid")
    figures = f"/dev/shm/wirehead-relay.{name}.json"
    with open(figures, "w") as f:
        f.write("planted")
    os.chmod(figures, 0o600)
    os.chown(figures, 65534, 65534)
    relay = wt.WireheadRelay(config=cfg, wait=False, quiet=True)
    errors = []

    def run():
        try:
            relay.run()
        except Exception as e:  # noqa: BLE001 - what it raises is the finding
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)  # at once when refused; else it runs (MongoDB unreachable) until stopped
    try:
        assert not t.is_alive(), "the relay took another user's figures file over"
    finally:
        relay.stop()
        t.join(30)
        relay.close()
        st = os.lstat(figures)
        with open(figures) as f:
            kept = f.read()
        os.unlink(figures)
    assert [(type(e), str(e)) for e in errors] == [(
        wt.ConfigError, f"{figures}: the relay's file is a file of uid 65534 with mode 0600, it "
                        f"must be a regular file of uid {os.geteuid()} with mode 0600; remove it")]
    assert (st.st_uid, kept) == (65534, "planted")


@pytest.mark.parametrize("which", ["lock", "json"])
def test_relay_of_another_user_finds_ours_in_one_line(tmp_path, which):
    """The other way round: a relay run by uid 65534 finds a file of
    root's at the name of its lock or its figures: a one-line error naming
    it, never a PermissionError traceback."""
    import shutil
    import tempfile
    cfg, name, _victim = _relay_of_nowhere(tmp_path, "whrelayroot")
    planted = f"/dev/shm/wirehead-relay.{name}.{which}"
    with open(planted, "w") as f:
        f.write("root's")
    os.chmod(planted, 0o644)
    where = tempfile.mkdtemp()  # a config the other user can read (tmp_path is root's alone)
    os.chmod(where, 0o755)
    path = os.path.join(where, "c.yaml")
    with open(path, "w") as f:
        f.write(json.dumps(cfg))
    os.chmod(path, 0o644)
    try:
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            sys.executable, "-m", "wirehead_torch.apps.cli", "relay", "--config",
                            path, "--no-wait"], capture_output=True, text=True, cwd=where,
                           env=whlib.env_for_child(), timeout=60)
    finally:
        for f in (f"/dev/shm/wirehead-relay.{name}.{x}" for x in ("lock", "json")):
            if os.path.lexists(f):
                os.unlink(f)
        shutil.rmtree(where)
    assert (r.returncode, r.stderr) == (
        2, f"wirehead-torch relay: {planted}: the relay's file is a file of uid 0 with mode "
           f"0644, it must be a regular file of uid 65534 with mode 0600; remove it\n")


def test_a_reader_waiting_for_a_missing_store_says_so_every_30_s(monkeypatch, caplog):
    """A reader waiting 120 s for a store that does not exist said a line
    every 5 s (24 lines); after its first line (at 2 s) it says one per
    30 s. The store's wait is a fake here that moves a fake clock, so the
    two minutes take none."""
    from wirehead_torch import _reader
    from wirehead_torch.config import resolve
    clock = [1000.0]

    class Absent:
        def wait_generation(self, newer_than, timeout):
            clock[0] += timeout
            raise _C.StoreNotCreatedError("no shm store")

        def status(self):
            raise _C.StoreNotCreatedError("no shm store")

    monkeypatch.setattr(_reader.time, "monotonic", lambda: clock[0])
    cfg = resolve({"STORE": "shm://h38-absent", "SWAP_CAP": 4, "SAMPLE": ["a"]})
    with caplog.at_level("WARNING", logger="wirehead_torch"):
        with pytest.raises(TimeoutError, match="does not exist yet after 120s"):
            _reader.wait_for_generation(Absent(), cfg, 120.0)
    said = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert [int(x.split("waiting ")[1].split("s ")[0]) for x in said] == [2, 32, 62, 92], said
    assert all(x.startswith(f"wirehead reader: pid {os.getpid()} waiting ") for x in said)
