import io
import json
import os
import pickle
import re
import subprocess
import sys
import warnings

import pytest

import wirehead_torch as wt
from wirehead_torch._redact import redact
from wirehead_torch.config import parse_bytes

import whlib


def write(tmp_path, text, name="config.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


ORIGINAL = """
MONGOHOST: "localhost"
DBNAME: "wirehead_test"
PORT: 27017
SWAP_CAP: 10
SAMPLE: ["data", "label"]
WRITE_COLLECTION: "write"
READ_COLLECTION: "read"
COUNTER_COLLECTION: "counters"
TEMP_COLLECTION: "temp"
CHUNKSIZE: 10
"""


def test_original_config_unchanged_resolves_to_mongodb(tmp_path, monkeypatch):
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = wt.load_config(write(tmp_path, ORIGINAL))
    assert cfg["STORE"] == "mongodb://localhost:27017/wirehead_test"
    assert cfg["SWAP_CAP"] == 10 and list(cfg["SAMPLE"]) == ["data", "label"]
    assert cfg["COLLECTION_PREFIX"] == "write"


def test_no_store_no_mongohost_is_shm_of_dbname(tmp_path, monkeypatch):
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    cfg = wt.load_config(write(tmp_path, "DBNAME: brains\nSWAP_CAP: 4\nSAMPLE: [a, b]\n"))
    assert cfg["STORE"] == "shm://brains"
    assert cfg["BYTE_BUDGET"] is None  # auto: sized from the first sample
    assert cfg["SELF_SEAL"] is True
    assert cfg["LEASE_SECONDS"] == 10.0


def test_store_key_and_env_override(tmp_path, monkeypatch):
    p = write(tmp_path, "STORE: shm://x\nSWAP_CAP: 4\nSAMPLE: [a]\nBYTE_BUDGET: 64MiB\n")
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    cfg = wt.load_config(p)
    assert cfg["STORE"] == "shm://x" and cfg["BYTE_BUDGET"] == 64 << 20
    monkeypatch.setenv("WIREHEAD_STORE", "mongodb://h:1/db")
    assert wt.load_config(p)["STORE"] == "mongodb://h:1/db"


def test_unknown_key_warns(tmp_path, monkeypatch):
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    with pytest.warns(UserWarning, match="SWAPCAP"):
        wt.load_config(write(tmp_path, "SWAP_CAP: 4\nSAMPLE: [a]\nSWAPCAP: 3\n"))


@pytest.mark.parametrize("text, key", [
    ("SAMPLE: [a]\n", "SWAP_CAP"),
    ("SWAP_CAP: 4\n", "SAMPLE"),
    ("SWAP_CAP: four\nSAMPLE: [a]\n", "SWAP_CAP"),
    ("SWAP_CAP: 0\nSAMPLE: [a]\n", "SWAP_CAP"),
    ("SWAP_CAP: 4\nSAMPLE: a\n", "SAMPLE"),
    ("SWAP_CAP: 4\nSAMPLE: [a, a]\n", "SAMPLE"),
    ("SWAP_CAP: 4\nSAMPLE: [a]\nBYTE_BUDGET: lots\n", "BYTE_BUDGET"),
    ("SWAP_CAP: 4\nSAMPLE: [a]\nLEASE_SECONDS: -1\n", "LEASE_SECONDS"),
    ("SWAP_CAP: 4\nSAMPLE: [a]\nSTORE: redis://x\n", "STORE"),
])
def test_bad_config_names_key_and_file(tmp_path, text, key):
    p = write(tmp_path, text)
    with pytest.raises(wt.ConfigError) as e:
        wt.load_config(p)
    assert key in str(e.value) and str(p) in str(e.value)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        wt.load_config(tmp_path / "nope.yaml")
    with pytest.raises(ValueError, match="not valid YAML"):
        wt.load_config(write(tmp_path, "SWAP_CAP: [\n"))


def test_parse_bytes_and_redact():
    assert parse_bytes("1.5GiB") == 3 << 29
    assert parse_bytes(4096) == 4096
    assert redact("mongodb://user:secret@host:1/db") == "mongodb://***@host:1/db"


def test_package_holds_no_store_logic():
    pkg = os.path.join(whlib.REPO, "wirehead_torch")
    out = subprocess.run(["grep", "-rnE", r"^\s*(import|from)\s+(mmap|pymongo|multiprocessing\.shared_memory|bson)\b|shared_memory",
                          pkg, "--include=*.py"], capture_output=True, text=True)
    assert out.stdout == "", out.stdout


def test_only_the_uri_module_spells_a_scheme_or_a_shm_file():
    """A store's scheme (shm://, mongodb://, mongodb+srv://) and the names
    of the files under /dev/shm are written in code in wirehead_torch/_uri.py
    only: every other module asks it, and what a store can do comes from
    its backend, not from the spelling of its scheme."""
    pkg = os.path.join(whlib.REPO, "wirehead_torch")
    spelled = (r"[\"'](shm|mongodb|mongodb\+srv)://|startswith\([\"'](shm|mongo)|[\"']/dev/shm"
               r"|[\"'/]wirehead(-params|-relay|-ring)?\.|[\"']wirehead-(params|relay|ring)")
    out = subprocess.run(["grep", "-rnE", spelled, pkg, "--include=*.py",
                          "--exclude=_uri.py"], capture_output=True, text=True)
    assert out.returncode == 1 and out.stdout == "", out.stdout + out.stderr


# -- errors name the key, the file and the value --------------------------------

@pytest.mark.parametrize("text, key, value", [
    ("SWAP_CAP: ten\nSAMPLE: [a]\n", "SWAP_CAP", "'ten'"),
    ("SWAP_CAP: 2.5\nSAMPLE: [a]\n", "SWAP_CAP", "2.5"),
    ("SWAP_CAP: 2000000000\nSAMPLE: [a]\n", "SWAP_CAP", "2000000000"),
    ("SWAP_CAP: 4\nSAMPLE: [a]\nPORT: http\n", "PORT", "'http'"),
    ("SWAP_CAP: 4\nSAMPLE: [a]\nREAD_TIMEOUT: soon\n", "READ_TIMEOUT", "'soon'"),
    ("SWAP_CAP: 4\nSAMPLE: [a]\nSELF_SEAL: maybe\n", "SELF_SEAL", "'maybe'"),
    ("SWAP_CAP: 4\nSAMPLE: [a]\nHANDOVER_CHECK: all\n", "HANDOVER_CHECK", "'all'"),
    ("SWAP_CAP: 4\nSAMPLE: [a]\nSTORE: 'shm://'\n", "STORE", "'shm://'"),
    ("SWAP_CAP: 4\nSAMPLE: [a]\nSTORE: 'shm://a/b'\n", "STORE", "'shm://a/b'"),
    ("SWAP_CAP: 4\nSAMPLE: [a]\nSTORE: 'shm://a b'\n", "STORE", "'shm://a b'"),
    ("SWAP_CAP: 4\nSAMPLE: [a]\nSTORE: 'shm://" + "x" * 201 + "'\n", "STORE", "x" * 201),
    ("SWAP_CAP: 4\nSAMPLE: [a]\nSTORE: 'mongodb://'\n", "STORE", "'mongodb://'"),
    ("SWAP_CAP: 4\nSAMPLE: [a]\nDBNAME: 'a/b'\n", "STORE", "'shm://a/b'"),
])
def test_config_error_names_key_file_and_value(tmp_path, monkeypatch, text, key, value):
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    p = write(tmp_path, text)
    with pytest.raises(wt.ConfigError) as e:
        wt.load_config(p)
    msg = str(e.value)
    assert key in msg and str(p) in msg and value in msg, msg
    assert "got None" not in msg
    assert not isinstance(e.value, wt.WireheadError)  # a config problem, not a sample's


def test_bad_store_name_in_a_mapping_is_a_config_error(monkeypatch):
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    for store in ("shm://", "shm://a/b", "shm://../x"):
        with pytest.raises(wt.ConfigError, match=f"config=: STORE '{re.escape(store)}'"):
            wt.status({"STORE": store, "SWAP_CAP": 1, "SAMPLE": ["x"]})


def test_config_takes_a_mapping_and_says_so_for_a_path(tmp_path, monkeypatch):
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    p = write(tmp_path, "SWAP_CAP: 4\nSAMPLE: [a]\n")
    for given in (str(p), p):
        with pytest.raises(wt.ConfigError,
                           match="config= takes a mapping; for a file use config_path="):
            wt.WireheadGenerator(iter([]), config=given)
    with pytest.raises(wt.ConfigError, match="config_path= takes a file path"):
        wt.WireheadManager(config_path={"SWAP_CAP": 4, "SAMPLE": ["a"]})


def test_mongo_errors_call_the_prefix_a_collection_prefix(mongo_server):
    from wirehead_torch import _C
    from wirehead_torch._store_args import store_kwargs
    cfg = {"STORE": f"{mongo_server.uri}/{whlib.unique_name('whm')}", "SWAP_CAP": 3,
           "SAMPLE": ["a"], "COLLECTION_PREFIX": "runs7", "CONNECT_TIMEOUT": 10}
    _C.Store(**store_kwargs(cfg)).close()
    try:
        with pytest.raises(wt.SchemaMismatchError) as e:
            wt.status(dict(cfg, SWAP_CAP=4))
        msg = str(e.value)
        assert "collection prefix 'runs7'" in msg and "COLLECTION_PREFIX" in msg, msg
        assert "store 'runs7'" not in msg
        with pytest.raises(wt.NotFoundError, match="collection prefix 'other'"):
            wt.status(dict(cfg, COLLECTION_PREFIX="other"))
    finally:
        wt.clean(cfg)


# -- config edges -------------------------------------------------------------

def test_deeply_nested_yaml_is_a_clear_error(tmp_path):
    for text in ("SWAP_CAP: 4\nSAMPLE: " + "[" * 5000 + "]" * 5000 + "\n",
                 "".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n"):
        p = write(tmp_path, text)
        with pytest.raises(wt.ConfigError, match="nested deeper than 32 levels") as e:
            wt.load_config(p)
        assert str(p) in str(e.value)


def test_duplicate_keys_are_an_error_naming_key_and_lines(tmp_path):
    p = write(tmp_path, "SWAP_CAP: 4\nSAMPLE: [a]\nSWAP_CAP: 5\n")
    with pytest.raises(wt.ConfigError) as e:
        wt.load_config(p)
    assert str(p) in str(e.value) and "'SWAP_CAP' appears twice (lines 1 and 3)" in str(e.value)


_LOAD = "import sys, wirehead_torch as wt\ntry:\n    wt.load_config(sys.argv[1])\n" \
        "except wt.ConfigError as e:\n    print(e)\n    sys.exit(3)\n"


def test_fifo_or_other_non_regular_config_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (tmp_path, "a directory"),
                       ("/dev/zero", "a character device")):
        # a blocking open of a FIFO with no writer never returns: the timeout fails the test
        r = subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True,
                           text=True, timeout=60, env=_env())
        assert r.returncode == 3, r.stderr
        assert str(path) in r.stdout and f"must be a regular file, this is {kind}" in r.stdout
    r = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "status", "--config",
                        str(fifo)], capture_output=True, text=True, timeout=60, env=_env())
    assert r.returncode == 2 and "a FIFO" in r.stderr and str(fifo) in r.stderr, r.stderr


def test_oversized_config_is_refused(tmp_path):
    p = write(tmp_path, "SWAP_CAP: 4\nSAMPLE: [a]\n" + "#" * (1 << 20) + "\n")
    with pytest.raises(wt.ConfigError, match="larger than 1048576 bytes"):
        wt.load_config(p)


@pytest.mark.parametrize("env, what", [
    ("shm://a/b", "shm store name 'a/b'"),
    ("shm://", "names no store"),
    ("redis://h/db", "must start with shm://, mongodb:// or mongodb+srv://"),
    ("shm://x\n", "control character"),
])
def test_wirehead_store_env_is_checked_like_store(tmp_path, monkeypatch, env, what):
    p = write(tmp_path, "STORE: shm://fine\nSWAP_CAP: 4\nSAMPLE: [a]\n")
    monkeypatch.setenv("WIREHEAD_STORE", env)
    with pytest.raises(wt.ConfigError) as e:
        wt.load_config(p)
    msg = str(e.value)
    assert "WIREHEAD_STORE" in msg and str(p) in msg and what in msg, msg


def test_wirehead_store_env_hides_its_secrets_in_errors(tmp_path, monkeypatch):
    p = write(tmp_path, "SWAP_CAP: 4\nSAMPLE: [a]\n")
    monkeypatch.setenv("WIREHEAD_STORE", "redis://u:SECRETpw@h/db")
    with pytest.raises(wt.ConfigError) as e:
        wt.load_config(p)
    assert "SECRETpw" not in str(e.value) and "redis://***@h/db" in str(e.value)


@pytest.mark.parametrize("value", ["-1", "abc", "", "1e9", "99999999999999999999999"])
def test_bad_pool_bytes_is_refused_with_a_message_not_unlimited(value):
    code = "from wirehead_torch import _C; _C.counters()"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=_env(WIREHEAD_POOL_BYTES=value))
    assert r.returncode == 0, r.stderr
    assert f"WIREHEAD_POOL_BYTES={value} is not a byte count" in r.stderr
    assert "using the default 1073741824 bytes" in r.stderr
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=_env(WIREHEAD_POOL_BYTES="1048576"))
    assert r.returncode == 0 and "WIREHEAD_POOL_BYTES" not in r.stderr, r.stderr


def _env(**extra):
    env = dict(os.environ, **extra)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("WIREHEAD_STORE", None)
    return env


# -- the resolved config --------------------------------------------------------

def test_resolved_config_is_frozen_and_reads_as_a_mapping(tmp_path, monkeypatch):
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    cfg = wt.load_config(write(tmp_path, "STORE: shm://x\nSWAP_CAP: '4'\nSAMPLE: [a, b]\n"))
    assert isinstance(cfg, wt.Config)
    assert cfg["SWAP_CAP"] == cfg.swap_cap == 4 and cfg.get("SWAP_CAP") == 4
    assert cfg.get("NOT_A_KEY", "dflt") == "dflt" and "NOT_A_KEY" not in cfg
    assert cfg.sample == ("a", "b") and cfg.source == str(tmp_path / "config.yaml")
    with pytest.raises(AttributeError):
        cfg.swap_cap = 5
    with pytest.raises(TypeError):
        cfg["SWAP_CAP"] = 5
    with pytest.raises(AttributeError):
        cfg.sample.append("c")
    new = cfg.replace(SWAP_CAP=8)
    assert new.swap_cap == 8 and cfg.swap_cap == 4
    with pytest.raises(wt.ConfigError, match="SWAP_CAP must be in 1..1073741824, got 0"):
        cfg.replace(SWAP_CAP=0)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert wt.config.resolve(dict(cfg)) == cfg  # a plain copy resolves to the same


def test_store_kwargs_passes_zero_for_an_auto_budget(monkeypatch):
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    from wirehead_torch import _store_args, config
    cfg = config.resolve({"STORE": "shm://x", "SWAP_CAP": 4, "SAMPLE": ["a"]})
    assert cfg.byte_budget is None and _store_args.store_kwargs(cfg)["byte_budget"] == 0
    assert _store_args.store_kwargs(cfg.replace(BYTE_BUDGET="1MiB"))["byte_budget"] == 1 << 20
    assert not hasattr(config, "AUTO_FALLBACK_BUDGET")
    assert not hasattr(_store_args, "AUTO_FALLBACK_BUDGET")


# -- redaction ------------------------------------------------------------------

@pytest.mark.parametrize("uri, shown", [
    ("mongodb://user:secret@host:1/db", "mongodb://***@host:1/db"),
    ("mongodb://h/db?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:tok1",
     "mongodb://h/db?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:***"),
    ("mongodb://h/db?AUTHMECHANISMPROPERTIES=AWS_SESSION_TOKEN%3Atok1,SERVICE_NAME:svc",
     "mongodb://h/db?AUTHMECHANISMPROPERTIES=AWS_SESSION_TOKEN:***,SERVICE_NAME:***"),
    ("mongodb://h/?tls=true&tlsCertificateKeyFilePassword=pw1;tlsCertificateKeyFile=/k.pem",
     "mongodb://h/?tls=true&tlsCertificateKeyFilePassword=***;tlsCertificateKeyFile=***"),
    ("mongodb://h/db?sslclientcertificatekeypassword=pw1&proxyPassword=pw2&appname=a",
     "mongodb://h/db?sslclientcertificatekeypassword=***&proxyPassword=***&appname=a"),
    ("mongodb+srv://u:p%40ss@cluster.example/db?retryWrites=true",
     "mongodb+srv://***@cluster.example/db?retryWrites=true"),
    ("mongodb://u:pa?ss@h/db", "mongodb://***@h/db"),
    ("mongodb://u:p@ss@h/db?w=1", "mongodb://***@h/db?w=1"),
    ("mongodb://h/db?someToken=abc&someSecret=def", "mongodb://h/db?someToken=***&someSecret=***"),
    ("shm://brains", "shm://brains"),
])
def test_redact_by_structure(uri, shown):
    assert redact(uri) == shown


SECRETS = ("SECRETtok1", "SECRETpw2", "SECRETpw3")
# options a client connecting without TLS or a login accepts (a TLS option
# would turn TLS on), and so a live store can be opened with
SECRET_OPTS = (f"authMechanismProperties=AWS_SESSION_TOKEN:{SECRETS[0]}"
               f"&PROXYPASSWORD={SECRETS[1]}&password={SECRETS[2]}")


def test_scrub_hides_secrets_quoted_in_messages():
    from wirehead_torch._redact import scrub, secrets_hidden
    uri = f"mongodb://u:SECRETpw9@h/db?{SECRET_OPTS}"
    msg = f"invalid MongoDB URI {uri}: Unsupported value for \"x\": \"{SECRETS[1]}\""
    out = scrub(msg, uri)
    assert not any(s in out for s in SECRETS + ("SECRETpw9",)) and redact(uri) in out
    with pytest.raises(wt.StoreUnavailableError) as e:
        with secrets_hidden(uri):
            raise wt.StoreUnavailableError(f"server said {SECRETS[0]}")
    assert SECRETS[0] not in str(e.value) and e.value.__cause__ is None
    with pytest.raises(KeyError):  # nothing secret: the original, untouched
        with secrets_hidden(uri):
            raise KeyError("plain")


def _assert_hidden(text):
    assert text and not any(s in text for s in SECRETS), text
    assert "AWS_SESSION_TOKEN:***" in text and "PROXYPASSWORD=***" in text, text


def test_no_secret_in_any_output_path(mongo_server, tmp_path, monkeypatch, capsys):
    from wirehead_torch import _C
    from wirehead_torch._store_args import store_kwargs
    from wirehead_torch.apps import cli
    from wirehead_torch.apps.monitor import WireheadLogger
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    store = f"{mongo_server.uri}/{whlib.unique_name('whm')}?{SECRET_OPTS}"
    cfg = {"STORE": store, "SWAP_CAP": 2, "SAMPLE": ["a"], "CONNECT_TIMEOUT": 10}
    path = write(tmp_path, "".join(f"{k}: {v!r}\n" for k, v in cfg.items()).replace("'", '"'))
    _C.Store(**store_kwargs(cfg)).close()
    try:
        _assert_hidden(wt.status(cfg)["store"])
        _assert_hidden(repr(wt.load_config(path)))
        assert cli.main(["status", "--config", str(path)]) == 0
        _assert_hidden(capsys.readouterr().out)
        assert cli.main(["status", "--json", "--config", str(path)]) == 0
        _assert_hidden(json.loads(capsys.readouterr().out)["store"])
        out = io.StringIO()
        log = WireheadLogger(config=cfg, poll_interval=0.01, out=out)
        log.run(count=1)
        log.run_daemon(count=1)
        _assert_hidden(out.getvalue())
        _assert_hidden(log.snapshot().store)
    finally:
        assert cli.main(["clean", "--config", str(path)]) == 0
    _assert_hidden(capsys.readouterr().out)


def test_no_password_in_errors_of_an_unreachable_store(tmp_path, monkeypatch, capsys):
    from wirehead_torch.apps import cli
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    store = f"mongodb://user:SECRETpw9@127.0.0.1:{whlib.free_port()}/db?{SECRET_OPTS}"
    path = write(tmp_path, f'STORE: "{store}"\nSWAP_CAP: 2\nSAMPLE: [a]\nCONNECT_TIMEOUT: 0.2\n')
    for argv in (["status", "--config", str(path)], ["clean", "--config", str(path)]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "unreachable" in err and not any(s in err for s in SECRETS + ("SECRETpw9",)), err


def test_byte_budget_below_one_page_names_key_and_file(tmp_path):
    p = write(tmp_path, "SWAP_CAP: 4\nSAMPLE: [a]\nBYTE_BUDGET: 10\n")
    with pytest.raises(wt.ConfigError, match=r"config\.yaml: BYTE_BUDGET must be at least "
                                             r"4096 bytes \(or auto\), got 10"):
        wt.load_config(p)


def test_unknown_key_warning_names_the_callers_line_and_the_key_meant():
    import warnings
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        wt.WireheadManager(config={"STORE": "shm://unused", "SWAP_CAP": 2, "SAMPLE": ["a"],
                                   "swap_cap": 3, "READTIMEOUT": 1, "zzz": 1})
    assert len(w) == 1 and w[0].filename == __file__, (w[0].filename, w[0].message)
    assert str(w[0].message) == ("config=: unknown config keys are ignored: 'READTIMEOUT' (did "
                                 "you mean 'READ_TIMEOUT'?), 'swap_cap' (did you mean "
                                 "'SWAP_CAP'?), 'zzz'")


@pytest.mark.parametrize("uri,bad", [("mongodb://127.0.0.1:27017/my.db", "'.'"),
                                     ("mongodb://127.0.0.1:27017/my db", "' '"),
                                     ("mongodb://h/a$b?retryWrites=false", "'$'"),
                                     ("mongodb://h/" + "d" * 64, "longer than 63 bytes")])
def test_mongodb_database_name_mongodb_refuses_is_a_config_error(uri, bad):
    with pytest.raises(wt.ConfigError) as e:
        wt.config.get_config(config={"STORE": uri, "SWAP_CAP": 2, "SAMPLE": ["a"]})
    assert "STORE" in str(e.value) and "database name" in str(e.value) and bad in str(e.value)


def test_mongodb_uri_with_options_and_credentials_is_accepted():
    for uri in ("mongodb://h/ok_db?x=1", "mongodb://u:p@h1,h2/db", "mongodb://h"):
        assert wt.config.get_config(config={"STORE": uri, "SWAP_CAP": 2,
                                            "SAMPLE": ["a"]})["STORE"] == uri


def test_a_mongodb_srv_store_takes_a_local_cache(monkeypatch):
    """mongodb+srv:// is a MongoDB STORE like mongodb://: with LOCAL_CACHE
    it loads as a config, and its node-local copy is named and records its
    source as any other's; an shm STORE with LOCAL_CACHE, or a LOCAL_CACHE
    a relay cannot fill, is still refused naming the key."""
    from wirehead_torch._store_args import local_cache_uri, local_origin, store_kwargs
    monkeypatch.delenv("WIREHEAD_STORE", raising=False)
    base = {"SWAP_CAP": 4, "SAMPLE": ["a"]}
    store = "mongodb+srv://user:SECRETpw9@cluster.example/db?retryWrites=true"
    for local in ("auto", "shm://srv-copy"):
        cfg = wt.config.get_config(config=dict(base, STORE=store, LOCAL_CACHE=local))
        assert cfg.store == store and cfg.local_cache == local
        uri = local_cache_uri(cfg)
        assert uri == local if local != "auto" else uri.startswith("shm://relay-")
        origin_id, name = local_origin(cfg)
        assert name == "mongodb+srv://cluster.example/db (prefix wirehead)"
        kw = store_kwargs(cfg, local=True)
        assert kw["uri"] == uri and kw["origin_id"] == origin_id and kw["byte_budget"] == 0
        assert store_kwargs(cfg)["uri"] == store
    with pytest.raises(wt.ConfigError, match="LOCAL_CACHE") as e:
        wt.config.get_config(config=dict(base, STORE="shm://x", LOCAL_CACHE="auto"))
    assert "shm://x" in str(e.value)
    with pytest.raises(wt.ConfigError, match="LOCAL_CACHE") as e:
        wt.config.get_config(config=dict(base, STORE=store, LOCAL_CACHE=store))
    assert "SECRETpw9" not in str(e.value), str(e.value)
