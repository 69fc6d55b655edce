import os
import subprocess
import warnings

import pytest

import whlib

import wirehead_torch as wt
from wirehead_torch.config import parse_bytes, redact


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
    assert cfg["SWAP_CAP"] == 10 and cfg["SAMPLE"] == ["data", "label"]
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
    with pytest.raises(ValueError) as e:
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
