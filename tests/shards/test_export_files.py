"""An export writes only its own files: a file or link planted in --out at
any name the export creates (its temporaries, its lock, a shard, the index),
before it starts or while it waits for a generation, is refused naming it;
the file a link points at is unchanged and nothing appears outside --out.
--out itself is opened once: a link there or another owner's directory is
refused, and one renamed away mid-export takes the rest of the export with
it. The export counts only what its index lists, under one prefix.
And the reader's bad input of the same round: shard paths that are not
regular files, malformed pax numbers, an index.json of mistyped values."""
import io
import json
import os
import subprocess
import sys
import tarfile
import threading

import numpy as np
import pytest

import wirehead_torch as wt
from wirehead_torch import shards

import whlib

FIELDS = ("id", "data")
VICTIM = b"a file of the user's, outside --out\n"
NAMES = [".shards-000000.tar.tmp", ".index.json.tmp", "shards-000000.tar", "index.json",
         ".export.lock"]


def _tree(root, skip):
    """{path: bytes or link target} of everything under root but skip."""
    seen = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if os.path.join(d, x) != skip]
        for n in files + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            p = os.path.join(d, n)
            seen[p] = ("link", os.readlink(p)) if os.path.islink(p) else open(p, "rb").read()
    return seen


def _plant(path, how, victim, absent):
    """A link to the victim, a link to a name outside --out that does not
    exist yet, or a plain file."""
    if how == "link":
        os.symlink(victim, path)
    elif how == "dangling":
        os.symlink(absent, path)
    else:
        with open(path, "wb") as f:
            f.write(b"planted")


def _feed(cfg, tag=1):
    g = wt.WireheadGenerator((whlib.sample(tag, i, n=16) for i in range(2)), config=cfg,
                             quiet=True)
    assert g.run() == 2
    g.close()


@pytest.fixture
def outside(tmp_path):
    """(--out, the victim outside it, a name outside that must stay absent)
    and a check that nothing outside --out changed."""
    out = tmp_path / "shared" / "out"
    out.parent.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    absent = tmp_path / "created-through-a-link"
    before = _tree(str(tmp_path), str(out))
    yield str(out), str(victim), str(absent)
    assert victim.read_bytes() == VICTIM
    assert not os.path.lexists(absent)
    assert _tree(str(tmp_path), str(out)) == before


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("how", ["link", "dangling"])
def test_planted_before_the_export_starts_is_refused_naming_it(shm_cfg, outside, name, how):
    out, victim, absent = outside
    cfg = shm_cfg(swap_cap=2, sample=FIELDS, SELF_SEAL=True)
    _feed(cfg)
    os.makedirs(out)
    planted = os.path.join(out, name)
    _plant(planted, how, victim, absent)
    with pytest.raises(wt.ShardError) as e:
        wt.export_shards(out, config=cfg, timeout=5)
    assert name in str(e.value)
    assert os.readlink(planted) in (victim, absent)  # left where it was
    assert sorted(os.listdir(out)) == [name]


@pytest.mark.parametrize("name", NAMES[:4])
@pytest.mark.parametrize("how", ["link", "dangling", "file"])
def test_planted_while_the_export_waits_is_refused_naming_it(shm_cfg, outside, name, how):
    out, victim, absent = outside
    cfg = shm_cfg(swap_cap=2, sample=FIELDS, SELF_SEAL=True)
    planted = os.path.join(out, name)
    done = []

    def plant_then_seal():  # the lock file is there: the export waits for a generation
        whlib.until(lambda: os.path.exists(os.path.join(out, ".export.lock")), 30,
                    "the export's lock")
        _plant(planted, how, victim, absent)
        _feed(cfg)
        done.append(True)
    t = threading.Thread(target=plant_then_seal, daemon=True)
    t.start()
    try:
        with pytest.raises(wt.ShardError, match=name.replace(".", r"\.")) as e:
            wt.export_shards(out, config=cfg, timeout=30)
    finally:
        t.join(30)
    assert done
    assert "refusing" in str(e.value)
    assert os.path.lexists(planted)  # never replaced, nor removed
    if how != "file":
        assert os.readlink(planted) in (victim, absent)
    else:
        assert open(planted, "rb").read() == b"planted"
    # only the export's own names beside it: no temporary or lock left behind
    left = set(os.listdir(out)) - {name}
    assert left <= {"shards-000000.tar", "index.json"}, left


def test_lock_replaced_by_a_link_while_waiting_is_left_alone(shm_cfg, outside):
    out, victim, absent = outside
    cfg = shm_cfg(swap_cap=2, sample=FIELDS, SELF_SEAL=True)
    lock = os.path.join(out, ".export.lock")

    def swap_then_seal():
        whlib.until(lambda: os.path.exists(lock), 30, "the export's lock")
        os.unlink(lock)
        os.symlink(victim, lock)
        _feed(cfg)
    t = threading.Thread(target=swap_then_seal, daemon=True)
    t.start()
    try:
        idx = wt.export_shards(out, config=cfg, timeout=30)
    finally:
        t.join(30)
    assert idx["samples"] == 2
    assert os.readlink(lock) == victim  # not the export's lock: not removed either
    assert sorted(os.listdir(out)) == [".export.lock", "index.json", "shards-000000.tar"]


def test_dead_exports_leftovers_are_still_removed(shm_cfg, tmp_path):
    cfg = shm_cfg(swap_cap=2, sample=FIELDS, SELF_SEAL=True)
    _feed(cfg)
    out = tmp_path / "out"
    out.mkdir()
    for name in (".shards-000000.tar.tmp", ".index.json.tmp", ".export.lock"):
        (out / name).write_bytes(b"left by a SIGKILLed export")
    idx = wt.export_shards(str(out), config=cfg, timeout=5)
    assert idx["samples"] == 2
    assert sorted(os.listdir(out)) == ["index.json", "shards-000000.tar"]
    assert sum(1 for _ in wt.from_shards(str(out / "shards-000000.tar"), verify="full")) == 2


def test_cli_export_refuses_a_planted_link_in_one_line(shm_cfg, outside, tmp_path):
    out, victim, absent = outside
    cfg = shm_cfg(swap_cap=2, sample=FIELDS, SELF_SEAL=True)
    os.makedirs(out)
    os.symlink(victim, os.path.join(out, ".export.lock"))
    conf = tmp_path / "shared" / "c.yaml"
    conf.write_text(json.dumps(cfg))
    try:
        r = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "export",
                            "--config", str(conf), "--out", out, "--timeout", "1"],
                           env=whlib.env_for_child(), capture_output=True, text=True,
                           timeout=120)
    finally:
        conf.unlink()
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert f"{out}/.export.lock: a symbolic link is there" in r.stderr, r.stderr


# ---- reading ---------------------------------------------------------------


def _npy(a):
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def _shard(path, pax=None):
    """A shard of samples 0 and 1; pax: the raw records of a pax header
    before sample 1's first member."""
    with open(path, "wb") as f:
        with tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(2):
                ident, data = whlib.sample(1, i, n=16)
                for j, (field, a) in enumerate((("id", ident), ("data", data))):
                    raw = _npy(a)
                    if pax is not None and i == 1 and j == 0:
                        tf.fileobj.write(_pax_block(pax))
                        tf.offset += 512 + 512 * ((len(pax) + 511) // 512)
                    ti = tarfile.TarInfo(f"s{i}.{field}.npy")
                    ti.size = len(raw)
                    tf.addfile(ti, io.BytesIO(raw))
    return str(path)


def _pax_block(records):
    ti = tarfile.TarInfo("PaxHeader")
    ti.type, ti.size = tarfile.XHDTYPE, len(records)
    head = ti.tobuf(tarfile.USTAR_FORMAT)
    return head + records + b"\0" * (-len(records) % 512)


def _rec(key, value):
    body = f" {key}={value}\n".encode()
    n = len(body) + 1
    n = len(body) + len(str(n))
    return str(n).encode() + body


@pytest.mark.parametrize("records", [
    _rec("size", "-1"), _rec("size", "+12"), _rec("size", "1_0"), _rec("size", "1e3"),
    _rec("size", "9" * 40), _rec("size", ""), b"-5 size=1\n", b"x size=1\n",
    b"99 size=1\n", b"3 size=1\n", _rec("size", "12")[:-1] + b"X",
])
def test_malformed_pax_numbers_are_shard_errors_also_when_skipping(tmp_path, records):
    path = _shard(tmp_path / "p.tar", records)
    with pytest.raises(wt.ShardError) as e:
        list(wt.from_shards(path, fields=FIELDS))
    assert type(e.value) is wt.ShardError and e.value.shard == path
    assert "pax" in str(e.value) or "truncated" in str(e.value)
    src = wt.from_shards(path, fields=FIELDS, on_error="skip")
    got = list(src)  # the rest of the shard is dropped: a sample ends at the next key
    assert src.skipped_shards == 1 and len(got) <= 1
    for s in got:
        whlib.check_sample(*s)


def test_well_formed_pax_size_is_taken(tmp_path):
    ident = _npy(whlib.sample(1, 1, n=16)[0])
    path = _shard(tmp_path / "p.tar", _rec("size", str(len(ident))))
    assert [int(s[0][1]) for s in wt.from_shards(path, fields=FIELDS)] == [0, 1]


def test_negative_octal_size_is_a_shard_error(tmp_path):
    path = _shard(tmp_path / "o.tar")
    raw = bytearray(open(path, "rb").read())
    raw[124:136] = b"-0000000001\0"
    raw[148:156] = b" " * 8
    raw[148:156] = format(sum(raw[:512]), "06o").encode() + b"\0 "
    open(path, "wb").write(raw)
    with pytest.raises(wt.ShardError, match="size.*not an octal number"):
        list(wt.from_shards(path, fields=FIELDS))


@pytest.mark.parametrize("kind", ["fifo", "dir", "device", "socket"])
def test_shard_path_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    import socket
    path = str(tmp_path / "x.tar")
    sock = None
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        os.mkdir(path)
    elif kind == "device":
        path = "/dev/zero"
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path)
    what = {"fifo": "a FIFO", "dir": "a directory", "device": "a character device",
            "socket": "a socket"}[kind]
    result = []

    def read():  # in a thread: a blocked open() would hang the test, not fail it
        try:
            list(wt.from_shards(path, fields=FIELDS))
        except wt.ShardError as e:
            result.append(e)
    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(20)
    if sock is not None:
        sock.close()
    assert not t.is_alive(), "from_shards blocked on a non-regular file"
    assert result and result[0].shard == path
    assert f"a shard must be a regular file, this is {what}" in str(result[0])
    src = wt.from_shards(path, fields=FIELDS, on_error="skip")
    assert list(src) == [] and src.skipped_shards == 1


def test_a_link_to_a_regular_shard_is_read(tmp_path):
    path = _shard(tmp_path / "real.tar")
    os.symlink(path, tmp_path / "linked.tar")
    assert len(list(wt.from_shards(str(tmp_path / "linked.tar"), fields=FIELDS))) == 2


def _index(path, **change):
    idx = {"format": shards.INDEX_FORMAT, "version": 1, "fields": list(FIELDS),
           "schema": {"id": {"dtype": "int64", "shape": [2]},
                      "data": {"dtype": "float32", "shape": [16]}},
           "samples": 2, "checksum": "xxh3-64",
           "shards": [{"name": "s.tar", "bytes": os.path.getsize(path), "samples": 2,
                       "xxh3": None, "members": {}}]}
    for key, value in change.items():
        if key.startswith("entry_"):
            idx["shards"][0][key[6:]] = value
        else:
            idx[key] = value
    return idx


@pytest.mark.parametrize("change,key", [
    ({"fields": 5}, "'fields'"), ({"fields": None}, "'fields'"),
    ({"fields": ["id", 3]}, "'fields'"),
    ({"schema": ["id", "data"]}, "'schema'"), ({"schema": {"id": 5}}, "'schema'.id"),
    ({"schema": {"id": {"dtype": 5, "shape": [2]}}}, "'schema'.id.dtype"),
    ({"schema": {"id": {"dtype": "int64", "shape": "2"}}}, "'schema'.id.shape"),
    ({"schema": {"id": {"dtype": "int64", "shape": [-2]}}}, "'schema'.id.shape"),
    ({"shards": 7}, "'shards'"), ({"shards": [1, 2]}, r"'shards'\[0\]"),
    ({"shards": [{}]}, r"'shards'\[0\]\.name"),
    ({"entry_name": 4}, r"'shards'\[0\]\.name"), ({"entry_bytes": "12"}, r"'shards'\[0\]\.bytes"),
    ({"entry_bytes": True}, r"'shards'\[0\]\.bytes"), ({"entry_members": [1]}, r"'shards'\[0\]\.members"),
    ({"entry_members": {"s0.id.npy": 5}}, r"'shards'\[0\]\.members"), ({"entry_xxh3": 12}, r"'shards'\[0\]\.xxh3"),
])
def test_index_of_mistyped_values_is_a_shard_error_naming_the_key(tmp_path, change, key):
    path = _shard(tmp_path / "s.tar")
    (tmp_path / "index.json").write_text(json.dumps(_index(path, **change)))
    with pytest.raises(wt.ShardError, match=f"index.json: {key} must be") as e:
        list(wt.from_shards(path))
    assert type(e.value) is wt.ShardError
    src = wt.from_shards(path, fields=FIELDS, on_error="skip")
    assert list(src) == [] and src.skipped_shards == 1
    # the good index beside the same shard reads
    (tmp_path / "index.json").write_text(json.dumps(_index(path)))
    assert len(list(wt.from_shards(path))) == 2


def test_index_that_is_a_fifo_is_refused(tmp_path):
    path = _shard(tmp_path / "s.tar")
    os.mkfifo(tmp_path / "index.json")
    # not a regular file: no index (as when absent), never an open() that waits
    assert len(list(wt.from_shards(path, fields=FIELDS))) == 2


def test_records_replace_only_a_regular_file(tmp_path, monkeypatch):
    """The helper under the relay's figures and train's records, and the
    link + unlink stand-in for renameat2 where the C library lacks it."""
    from wirehead_torch import _files
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    rec = tmp_path / "train.rank0.json"
    _files.write_file(str(rec), b"1", ValueError, replaces="file")
    _files.write_file(str(rec), b"2", ValueError, replaces="file")  # a rerun replaces it
    assert rec.read_bytes() == b"2"
    rec.unlink()
    rec.symlink_to(victim)
    with pytest.raises(ValueError, match=f"{rec}: a symbolic link is there"):
        _files.write_file(str(rec), b"3", ValueError, replaces="file")
    assert victim.read_bytes() == VICTIM and rec.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["train.rank0.json", "victim"]
    for renameat2 in (_files._renameat2, None):
        monkeypatch.setattr(_files, "_renameat2", renameat2)
        new = tmp_path / "new"
        _files.write_file(str(new), b"x", ValueError)
        assert new.read_bytes() == b"x"
        with pytest.raises(ValueError, match=f"{new}: a file is already there"):
            _files.write_file(str(new), b"y", ValueError)
        assert new.read_bytes() == b"x"
        new.unlink()
        new.symlink_to(victim)
        with pytest.raises(ValueError, match=f"{new}: a symbolic link is already there"):
            _files.write_file(str(new), b"y", ValueError)
        assert victim.read_bytes() == VICTIM
        new.unlink()
        assert sorted(os.listdir(tmp_path)) == ["train.rank0.json", "victim"]


# ---- --out itself: opened once, every name reached through that fd --------


@pytest.fixture
def shared_dir(tmp_path):
    """A directory anyone may write into, without the sticky bit (mode
    0777): another user can rename or replace --out there; and a directory
    of the user's beside it, which must stay empty."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    other = tmp_path / "other"
    other.mkdir()
    return str(shared / "out"), str(other)


@pytest.mark.parametrize("renameat2", [True, False])
def test_out_renamed_away_and_replaced_by_a_link_mid_export_writes_nothing_there(
        shm_cfg, shared_dir, monkeypatch, renameat2):
    """Shards and index.json go on into the directory opened (also by
    link + unlink, where the C library lacks renameat2)."""
    from wirehead_torch import _files
    if not renameat2:
        monkeypatch.setattr(_files, "_renameat2", None)
    out, other = shared_dir
    moved = out + ".moved"
    cfg = shm_cfg(swap_cap=2, sample=FIELDS, SELF_SEAL=True)
    _feed(cfg)
    from wirehead_torch._shard_export import _ShardWriter
    real, swapped = _ShardWriter._write_index, []

    def swap_then_write(self):  # the first shard is in place, its index not yet
        if not swapped:
            os.rename(out, moved)
            os.symlink(other, out)
            swapped.append(True)
        return real(self)
    monkeypatch.setattr(_ShardWriter, "_write_index", swap_then_write)
    idx = wt.export_shards(out, config=cfg, shard_size="2KiB", timeout=5)
    assert swapped and idx["samples"] == 2 and len(idx["shards"]) == 2
    assert os.listdir(other) == []  # neither index.json nor the second shard
    assert os.readlink(out) == other
    # the export went on in its own directory, wherever it was moved to
    assert sorted(os.listdir(moved)) == ["index.json", "shards-000000.tar",
                                         "shards-000001.tar"]
    tars = sorted(os.path.join(moved, n) for n in os.listdir(moved) if n.endswith(".tar"))
    assert sum(1 for _ in wt.from_shards(tars, verify="full")) == 2


@pytest.mark.parametrize("trail", ["", "/", "/."])
def test_out_that_is_a_planted_link_is_refused_naming_it(shm_cfg, shared_dir, trail):
    out, other = shared_dir
    cfg = shm_cfg(swap_cap=2, sample=FIELDS, SELF_SEAL=True)
    _feed(cfg)
    os.symlink(other, out)
    with pytest.raises(wt.ShardError) as e:
        wt.export_shards(out + trail, config=cfg, timeout=5)
    assert f"--out {out} is a symbolic link (to {other})" in str(e.value)
    assert os.listdir(other) == [] and os.readlink(out) == other


def test_out_of_another_owner_is_refused_naming_both(shm_cfg, shared_dir, monkeypatch):
    out, _ = shared_dir
    cfg = shm_cfg(swap_cap=2, sample=FIELDS, SELF_SEAL=True)
    _feed(cfg)
    os.mkdir(out)
    owner = os.stat(out).st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # as another user sees it
    with pytest.raises(wt.ShardError, match=f"--out {out} belongs to uid {owner}, not to this "
                                            f"user \\(uid {owner + 1}\\)"):
        wt.export_shards(out, config=cfg, timeout=5)
    assert os.listdir(out) == []


# ---- what export says ------------------------------------------------------


def test_export_counts_only_what_it_wrote_under_one_prefix(shm_cfg, tmp_path, monkeypatch,
                                                           capsys, caplog):
    """A generation reclaimed after its first sample (four seals put in
    between, deterministically): the shards hold that sample and the next
    generation whole, and the export says so, not "of 2 generations"."""
    cfg = shm_cfg(swap_cap=4, sample=FIELDS, SELF_SEAL=True)
    g = wt.WireheadGenerator((whlib.sample(1, i, n=16) for i in range(4)), config=cfg,
                             quiet=True)
    assert g.run() == 4
    g.close()
    from wirehead_torch._shard_export import _ShardWriter
    real, fed = _ShardWriter.add, []

    def add_then_outrun(self, gen, pos, arrays):
        real(self, gen, pos, arrays)
        if not fed:
            fed.append(gen)
            g = wt.WireheadGenerator((whlib.sample(2, i, n=16) for i in range(16)),
                                     config=cfg, quiet=True)
            assert g.run() == 16
            g.close()
    monkeypatch.setattr(_ShardWriter, "add", add_then_outrun)
    caplog.set_level("INFO", logger="wirehead_torch")
    idx = wt.export_shards(str(tmp_path / "kept"), config=cfg, generations=1, timeout=5,
                           quiet=False)
    assert idx["reclaimed_during_export"] == 1
    assert idx["partial_generations"] == fed and len(idx["whole_generations"]) == 1
    assert idx["generations"] == fed + idx["whole_generations"] and idx["samples"] == 5
    out = capsys.readouterr().out.splitlines()
    said = out + [r.getMessage() for r in caplog.records if r.module == "_shard_export"]
    assert said and all(line.startswith("wirehead export: ") for line in said), said
    assert any("was reclaimed" in line for line in said)
    last = out[-1]
    assert f"5 samples in {len(idx['shards'])} shard" in last, last
    assert "1 whole generation (#" in last and "1 sample of generation" in last, last
    assert "2 generations" not in last and "of 1 generation" not in last, last


def test_a_dropped_shard_takes_its_generation_out_of_the_index(shm_cfg, tmp_path, monkeypatch):
    """A write error (a full disk) in the second sample of generation 2
    drops the shard holding generation 2's first: index.json lists only
    generation 1, whole, as the shards hold it."""
    cfg = shm_cfg(swap_cap=2, sample=FIELDS, SELF_SEAL=True)
    _feed(cfg, 1)
    from wirehead_torch._shard_export import _ShardWriter
    real_add, real_write, added = _ShardWriter.add, _ShardWriter._write, []

    def add(self, gen, pos, arrays):
        real_add(self, gen, pos, arrays)
        added.append(gen)
        if len(added) == 2:  # generation 1 written: the next one sealed
            _feed(cfg, 2)

    def write(self, data):
        # the second member of the shard's second sample: its first is written
        if len(self.index["shards"]) == 1 and len(self._entry["members"]) == 3:
            raise OSError(28, "No space left on device")
        return real_write(self, data)
    monkeypatch.setattr(_ShardWriter, "add", add)
    monkeypatch.setattr(_ShardWriter, "_write", write)
    out = tmp_path / "kept"
    with pytest.raises(OSError, match="No space"):  # 2 samples a shard
        wt.export_shards(str(out), config=cfg, generations=2, shard_size="6KiB", timeout=5)
    assert added[0] == added[1] != added[2]
    assert sorted(os.listdir(out)) == ["index.json", "shards-000000.tar"]
    idx = json.loads((out / "index.json").read_text())
    assert idx["samples"] == 2 and idx["complete"] is False
    assert idx["generations"] == idx["whole_generations"] == added[:1]
    assert idx["partial_generations"] == []
