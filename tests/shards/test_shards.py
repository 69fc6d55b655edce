"""Generations to and from tar shards: exact round trips through a fresh
store, exports killed at random instants, WebDataset both ways, bad input,
and memory bounded by one sample (docs/shards.md)."""
import io
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import threading
import time

import numpy as np
import pytest

import wirehead_torch as wt
from wirehead_torch import shards

import whlib

SAMPLE = ("id", "data", "mask", "vol", "scale")
PROC = os.path.join(whlib.HERE, "shards_proc.py")


def _sample(tag, counter):
    """whlib's verifiable sample plus fields of other dtypes and ranks."""
    ident, data = whlib.sample(tag, counter, n=300)
    rng = np.random.default_rng(counter)
    mask = rng.random((3, 5)) > 0.5
    vol = rng.integers(0, 60000, (2, 3, 4), dtype=np.uint16)
    scale = np.array(counter * 0.5 + 1j, dtype=np.complex128)
    return ident, data, mask, vol, scale


def _paced(tag, pause=0.005, start=0):
    i = start
    while True:
        yield _sample(tag, i)
        i += 1
        time.sleep(pause)


class _Feeder:
    """A generator (self-sealing) putting samples in a background thread."""

    def __init__(self, cfg, source):
        self.gen = wt.WireheadGenerator(source, config=cfg, quiet=True)
        self.t = threading.Thread(target=self.gen.run, daemon=True)
        self.t.start()

    def close(self):
        self.gen.stop()
        self.t.join(30)
        assert not self.t.is_alive()
        self.gen.close()


def _members_by_tarfile(paths):
    """(member name, array) of every member, read with Python's tarfile and
    numpy.load (a reader independent of ours)."""
    out = []
    for p in paths:
        with tarfile.open(p) as tf:
            for m in tf.getmembers():
                out.append((m.name, np.load(io.BytesIO(tf.extractfile(m).read()),
                                            allow_pickle=False)))
    return out


def _tars(out):
    return sorted(os.path.join(out, n) for n in os.listdir(out) if n.endswith(".tar"))


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.asan
def test_export_import_every_byte_equal(store_cfg, shm_cfg, tmp_path):
    src = store_cfg(swap_cap=4, sample=SAMPLE, SELF_SEAL=True)
    feeder = _Feeder(src, _paced(3, pause=0.01))
    try:
        idx = wt.export_shards(str(tmp_path), config=src, generations=3, shard_size=20000)
    finally:
        feeder.close()
    assert len(idx["generations"]) >= 3 and idx["samples"] >= 12
    assert idx["fields"] == list(SAMPLE)
    assert idx["schema"]["vol"] == {"dtype": "uint16", "shape": [2, 3, 4]}
    assert idx["schema"]["scale"] == {"dtype": "complex128", "shape": []}
    paths = _tars(str(tmp_path))
    assert [os.path.basename(p) for p in paths] == [s["name"] for s in idx["shards"]]
    assert len(paths) > 1  # shard_size split them
    with open(tmp_path / "index.json") as f:
        assert json.load(f)["samples"] == idx["samples"]

    # what tarfile + numpy.load see: the members, named and typed as stored
    members = _members_by_tarfile(paths)
    assert len(members) == idx["samples"] * len(SAMPLE)
    exported = [tuple(a for _, a in members[i:i + len(SAMPLE)])
                for i in range(0, len(members), len(SAMPLE))]
    for (name, _), s in zip(members[::len(SAMPLE)], exported):
        assert name.endswith(".id.npy") and name.startswith("g")
        assert s[2].dtype == np.bool_ and s[3].dtype == np.uint16 and s[4].shape == ()
        tag, counter = whlib.check_sample(s[0], s[1])
        want = _sample(tag, counter)
        assert all(_same(a, b) for a, b in zip(s, want))

    # into a fresh store: one generation holding every exported sample
    dst = shm_cfg(swap_cap=idx["samples"], sample=SAMPLE, budget="4MiB", SELF_SEAL=True)
    pattern = str(tmp_path / f"shards-{{000000..{len(paths) - 1:06d}}}.tar")
    g = wt.WireheadGenerator(wt.from_shards(pattern, config=dst), config=dst, quiet=True)
    assert g.run() == idx["samples"]
    g.close()
    st = whlib.open_store(dst)
    gen = st.wait_generation(0, 10.0)
    got = []
    for pos in range(idx["samples"]):
        arrs = st.read(gen, pos)
        got.append(tuple(np.from_dlpack(a).view(np.bool_) if a.dtype == "bool"
                         else np.from_dlpack(a) for a in arrs))
    st.close()
    key = lambda s: tuple(s[0].tolist())  # noqa: E731 (puts may land in any order)
    assert sorted(map(key, got)) == sorted(map(key, exported))
    by_id = {key(s): s for s in exported}
    for s in got:
        assert all(_same(a, b) for a, b in zip(s, by_id[key(s)]))


def test_killed_export_leaves_complete_shards(shm_cfg, tmp_path):
    rng = random.Random(7)
    for round_ in range(3):
        cfg = shm_cfg(swap_cap=4, sample=SAMPLE, SELF_SEAL=True)
        out = tmp_path / f"round{round_}"
        out.mkdir()
        feeder = _Feeder(cfg, _paced(round_, pause=0.002))
        try:
            child = subprocess.Popen([sys.executable, PROC, "export", json.dumps(cfg), str(out), "6000"],
                                     env=whlib.env_for_child(), stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
            assert child.stdout.readline().strip() == "exporting"
            whlib.until(lambda out=out: len(_tars(str(out))) >= 2,
                        30, "the export's first shards")
            time.sleep(rng.uniform(0.0, 0.3))  # a random instant, not a synchronisation
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            child.stdout.close()
        finally:
            feeder.close()
        paths = _tars(str(out))
        assert paths
        assert all(not n.endswith(".tar") or n.startswith("shards-") for n in os.listdir(out))
        for p in paths:  # `tar -t` lists each one whole
            r = subprocess.run(["tar", "-tf", p], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            assert len(r.stdout.split()) % len(SAMPLE) == 0
        with open(out / "index.json") as f:
            listed = [s["name"] for s in json.load(f)["shards"]]
        for p in paths:  # one renamed but never listed is refused by name
            if os.path.basename(p) not in listed:
                with pytest.raises(wt.ShardError, match=f"{os.path.basename(p)}.*not listed"):
                    list(wt.from_shards(p, config=cfg))
        src = wt.from_shards([str(out / n) for n in listed], config=cfg)
        n = 0
        for s in src:
            tag, counter = whlib.check_sample(s[0], s[1])
            assert all(_same(a, b) for a, b in zip(s, _sample(tag, counter)))
            n += 1
        assert n >= 1 and src.skipped == 0 and src.skipped_shards == 0
        # the shards the index lists (all but perhaps the one renamed last) verify
        assert set(listed) <= {os.path.basename(p) for p in paths}
        assert len(paths) - len(listed) <= 1
        # a new export into the same directory is refused, naming the first shard;
        # the dead export's temporary files are removed
        with pytest.raises(wt.ShardError, match=r"holds an export already \(shards-000000\.tar"
                                                r".*give an empty or new --out directory"):
            wt.export_shards(str(out), config=cfg)
        assert not [n for n in os.listdir(out) if n.endswith(".tmp") or n.startswith(".")]


def test_webdataset_reads_ours_and_we_read_theirs(shm_cfg, tmp_path):
    webdataset = pytest.importorskip("webdataset")
    cfg = shm_cfg(swap_cap=4, sample=SAMPLE, SELF_SEAL=True)
    feeder = _Feeder(cfg, _paced(5, pause=0.01))
    try:
        idx = wt.export_shards(str(tmp_path / "ours"), config=cfg, generations=2,
                               shard_size=30000)
    finally:
        feeder.close()
    paths = _tars(str(tmp_path / "ours"))
    ours = [s for s in wt.from_shards(paths, config=cfg)]
    theirs = list(webdataset.WebDataset(paths, shardshuffle=False).decode())
    assert len(theirs) == len(ours) == idx["samples"]
    for d, s in zip(theirs, ours):
        assert d["__key__"].startswith("g")
        assert all(_same(d[f"{f}.npy"], a) for f, a in zip(SAMPLE, s))

    # theirs: webdataset.ShardWriter with .npy members
    pattern = str(tmp_path / "wds-%06d.tar")
    with webdataset.ShardWriter(pattern, maxcount=3) as w:
        for i in range(7):
            s = _sample(9, i)
            w.write({"__key__": f"sample{i:04d}", **{f"{f}.npy": a for f, a in zip(SAMPLE, s)}})
    got = list(wt.from_shards(str(tmp_path / "wds-{000000..000002}.tar"), fields=SAMPLE))
    assert len(got) == 7
    for i, s in enumerate(got):
        assert all(_same(a, b) for a, b in zip(s, _sample(9, i)))


# ---- bad input ---------------------------------------------------------


def _npy(a):
    b = io.BytesIO()
    np.save(b, a, allow_pickle=True)
    return b.getvalue()


def _tar(path, members, kind=tarfile.REGTYPE):
    """A tar of (name, bytes) members (bytes None: a symlink to 'x')."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            if data is None:
                ti.type, ti.linkname = tarfile.SYMTYPE, "x"
                tf.addfile(ti)
            else:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return str(path)


def _good(key, tag=1, counter=0):
    ident, data = whlib.sample(tag, counter, n=16)
    return [(f"{key}.id.npy", _npy(ident)), (f"{key}.data.npy", _npy(data))]


FIELDS = ("id", "data")


def _read(path, **kw):
    return list(wt.from_shards(path, fields=FIELDS, **kw))


def test_truncated_and_empty_shards(tmp_path):
    path = _tar(tmp_path / "t.tar", _good("a") + _good("b", counter=1) + _good("c", counter=2))
    raw = open(path, "rb").read()
    assert len(_read(path)) == 3
    with tarfile.open(path) as tf:
        last = tf.getmembers()[-1]
    end = last.offset_data + last.size + (-last.size % 512)
    for cut in (end, 512 * 3 + 100, 700, 100):  # the end blocks, in data, in a header
        bad = tmp_path / f"cut{cut}.tar"
        bad.write_bytes(raw[:cut])
        with pytest.raises(wt.ShardError, match="truncated") as e:
            list(wt.from_shards(str(bad), fields=FIELDS))
        assert e.value.shard == str(bad)
        src = wt.from_shards(str(bad), fields=FIELDS, on_error="skip")
        got = list(src)
        assert src.skipped_shards == 1 and len(got) < 3
        for s in got:  # only whole samples
            whlib.check_sample(*s)
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    with pytest.raises(wt.ShardError, match=r"empty\.tar.*0 bytes"):
        _read(str(empty))
    noise = tmp_path / "noise.tar"
    noise.write_bytes(os.urandom(4096))
    with pytest.raises(wt.ShardError, match="checksum"):
        _read(str(noise))
    src = wt.from_shards([str(empty), path], fields=FIELDS, on_error="skip")
    assert len(list(src)) == 3 and src.skipped_shards == 1


def test_missing_field_names_shard_and_member(tmp_path, shm_cfg):
    members = _good("a") + _good("b", counter=1)[:1] + _good("c", counter=2)
    path = _tar(tmp_path / "m.tar", members)
    with pytest.raises(wt.ShardError, match=r"m\.tar: sample 'b' has no member for field\(s\) "
                                            r"\['data'\] \(it has \['id'\]\)") as e:
        _read(path)
    assert e.value.member is None and type(e.value) is wt.ShardError  # no private class shows
    src = wt.from_shards(path, fields=FIELDS, on_error="skip")
    assert [int(s[0][1]) for s in src] == [0, 2] and src.skipped == 1
    # never a partial sample in the store: the put before the bad one only
    cfg = shm_cfg(swap_cap=8, sample=FIELDS)
    g = wt.WireheadGenerator(wt.from_shards(path, config=cfg), config=cfg, quiet=True)
    with pytest.raises(wt.ShardError, match="has no member for field"):
        g.run()
    g.close()
    assert wt.status(config=cfg)["write_fill"] == 1


def test_dtype_or_shape_contradicting_the_index(tmp_path):
    ident, data = whlib.sample(1, 0, n=16)
    members = _good("a") + [("b.id.npy", _npy(ident)), ("b.data.npy", _npy(data[:8]))] + \
        [("c.id.npy", _npy(ident)), ("c.data.npy", _npy(data.astype(np.float64)))]
    path = _tar(tmp_path / "s.tar", members)
    index = {"format": shards.INDEX_FORMAT, "version": 1, "fields": list(FIELDS),
             "schema": {"id": {"dtype": "int64", "shape": [2]},
                        "data": {"dtype": "float32", "shape": [16]}},
             "samples": 3, "checksum": "xxh3-64",
             "shards": [{"name": "s.tar", "bytes": os.path.getsize(path), "samples": 3,
                         "xxh3": None, "members": {}}]}
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(wt.ShardError, match=r"'b\.data\.npy'.*float32 of shape \[8\] "
                                            r"contradicts"):
        list(wt.from_shards(path))  # fields from the index
    src = wt.from_shards(path, on_error="skip")
    assert len(list(src)) == 1 and src.skipped == 2
    assert any("float64" in e for e in src.errors)
    # a byte changed in a member the index has a checksum of
    raw = bytearray(open(path, "rb").read())
    raw[512 + 200] ^= 1
    open(path, "wb").write(raw)
    index["shards"][0]["members"] = {"a.id.npy": "0" * 16}
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(wt.ShardError, match=r"'a\.id\.npy'.*XXH3-64"):
        list(wt.from_shards(path))


def test_unsafe_names_links_and_other_member_types(tmp_path):
    for name, data, what in [("../evil.id.npy", _npy(np.zeros(2, np.int64)), "unsafe"),
                             ("/abs.id.npy", _npy(np.zeros(2, np.int64)), "unsafe"),
                             ("x.id.npy", None, "symbolic link"),
                             ("x.id.pyd", b"\x80\x04K\x01.", r"\.npy"),
                             ("x.id.json", b"{}", r"\.npy"),
                             ("x.id.npy", _npy(np.array([{"a": 1}], dtype=object)), "pickle")]:
        path = _tar(tmp_path / "u.tar", _good("a") + [(name, data)] + _good("z", counter=5))
        with pytest.raises(wt.ShardError, match=what) as e:
            _read(path)
        assert e.value.shard == path and e.value.member is not None
        assert name.lstrip("/").split("/")[-1] in e.value.member
        src = wt.from_shards(path, fields=FIELDS, on_error="skip")
        assert [int(s[0][1]) for s in src] == [0, 5] and src.skipped == 1


def test_mix_and_loop_and_shuffle(tmp_path):
    for i in range(3):
        _tar(tmp_path / f"p-{i}.tar", [m for c in range(4) for m in _good(f"k{i}{c}", i, c)])
    pat = str(tmp_path / "p-{0..2}.tar")
    plain = [tuple(s[0]) for s in wt.from_shards(pat, fields=FIELDS)]
    assert plain == [(i, c) for i in range(3) for c in range(4)]
    a = [tuple(s[0]) for s in wt.from_shards(pat, shuffle=True, seed=1, fields=FIELDS)]
    b = [tuple(s[0]) for s in wt.from_shards(pat, shuffle=True, seed=1, fields=FIELDS)]
    assert a == b and sorted(a) == sorted(plain)
    orders = {tuple(tuple(s[0]) for s in wt.from_shards(pat, shuffle=True, seed=k,
                                                         shuffle_buffer=5, fields=FIELDS))
              for k in range(6)}
    assert len(orders) > 1
    looped = wt.from_shards(str(tmp_path / "p-0.tar"), loop=True, fields=FIELDS)
    it = iter(looped)
    assert [int(next(it)[0][1]) for _ in range(10)] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    real = wt.from_shards(str(tmp_path / "p-0.tar"), loop=True, fields=FIELDS)
    synth = (whlib.sample(7, i, n=16) for i in range(10**9))
    m = wt.mix([real, synth], [0.25, 0.75], seed=3)
    tags = [int(next(m)[0][0]) for _ in range(2000)]
    share = tags.count(0) / len(tags)
    assert 0.2 < share < 0.3, share
    m2 = wt.mix([iter([1, 2]), iter([3])], seed=0)
    assert sorted(m2) == [1, 2, 3]
    with pytest.raises(ValueError, match="weights"):
        next(wt.mix([[1]], [0]))


# ---- memory --------------------------------------------------------------

MIB64 = 64 << 20


def test_export_and_import_memory_bounded_by_a_sample(shm_cfg, tmp_path):
    n = 3  # a shard of three samples: memory bounded by one, not the shard
    cfg = shm_cfg(swap_cap=n, sample=("id", "vol"), budget=f"{n * 64 + 4}MiB",
                  SELF_SEAL=True)
    vol = np.arange(MIB64 // 4, dtype=np.float32)
    g = wt.WireheadGenerator(((np.array([0, i], np.int64), vol) for i in range(n)),
                             config=cfg, quiet=True)
    assert g.run() == n
    g.close()
    del vol
    out = tmp_path / "big"
    proc = PROC
    r = subprocess.run([sys.executable, proc, "rss-export", json.dumps(cfg), str(out)],
                       env=whlib.env_for_child(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    exp = json.loads(r.stdout.splitlines()[-1])
    assert exp["samples"] == n
    r = subprocess.run([sys.executable, proc, "rss-import", str(out / "shards-000000.tar")],
                       env=whlib.env_for_child(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    imp = json.loads(r.stdout.splitlines()[-1])
    assert imp["samples"] == n
    assert os.path.getsize(out / "shards-000000.tar") > n * MIB64
    for what, peak in (("export", exp["anon_peak_bytes"]),
                       ("import", imp["peak_over_base_bytes"])):
        print(f"{what}: peak {peak / 2**20:.0f} MiB over its baseline")
        assert peak < 2.5 * MIB64, f"{what}: {peak / 2**20:.0f} MiB over its baseline"


@pytest.mark.asan
def test_verify_full_checks_the_whole_file(tmp_path):
    path = _tar(tmp_path / "f.tar", _good("a") + _good("b", counter=1))
    h = wt._C.Xxh3()
    h.update(open(path, "rb").read())
    entry = {"name": "f.tar", "bytes": os.path.getsize(path), "samples": 2, "xxh3": h.hexdigest(),
             "members": {}}
    index = {"format": shards.INDEX_FORMAT, "version": 1, "fields": list(FIELDS),
             "schema": None, "samples": 2, "checksum": "xxh3-64", "shards": [entry]}
    (tmp_path / "index.json").write_text(json.dumps(index))
    assert len(list(wt.from_shards(path, verify="full"))) == 2
    raw = bytearray(open(path, "rb").read())
    raw[-1] ^= 1  # the tar's trailing zero padding: no member holds it
    open(path, "wb").write(raw)
    assert len(list(wt.from_shards(path))) == 2
    with pytest.raises(wt.ShardError, match=r"f\.tar: XXH3-64 .* differs"):
        list(wt.from_shards(path, verify="full"))


def test_cli_export_then_generate_from_shards_in_two_processes(shm_cfg, tmp_path):
    src = shm_cfg(swap_cap=4, sample=FIELDS, SELF_SEAL=True)
    g = wt.WireheadGenerator((whlib.sample(2, i, n=16) for i in range(4)), config=src,
                             quiet=True)
    assert g.run() == 4
    g.close()
    (tmp_path / "src.yaml").write_text(json.dumps(src))
    cli = [sys.executable, "-m", "wirehead_torch.apps.cli"]
    env = whlib.env_for_child()
    r = subprocess.run(cli + ["export", "--config", "src.yaml", "--out", "kept",
                              "--shard-size", "2KiB"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "wirehead export: 4 samples in 4 shards under kept: 1 whole generation (#1)" \
        in r.stdout.splitlines(), r.stdout
    r = subprocess.run(cli + ["export", "--config", "src.yaml", "--out", "kept"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "holds an export already (shards-000000.tar" in r.stderr
    (tmp_path / "afile").write_text("")
    for bad, says in ((["--out", "afile"], "afile is a file, not a directory"),
                      (["--out", "t", "--timeout", "-1"], "argument --timeout: -1 is out of range")):
        r = subprocess.run(cli + ["export", "--config", "src.yaml"] + bad, cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "t").exists()
    dst = shm_cfg(swap_cap=4, sample=FIELDS, SELF_SEAL=True)
    (tmp_path / "dst.yaml").write_text(json.dumps(dst))
    r = subprocess.run(cli + ["generate", "--config", "dst.yaml", "--procs", "2", "--shards",
                              "kept/shards-{000000..000003}.tar"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("pushed 2 samples") == 2  # every shard read once
    st = whlib.open_store(dst)
    gen = st.wait_generation(0, 10.0)
    ids = sorted(int(np.from_dlpack(st.read(gen, p)[0])[1]) for p in range(4))
    st.close()
    assert ids == [0, 1, 2, 3]


def test_bfloat16_is_refused_by_export_with_its_reason(shm_cfg, tmp_path):
    torch = pytest.importorskip("torch")
    cfg = shm_cfg(swap_cap=1, sample=("x",), SELF_SEAL=True)
    g = wt.WireheadGenerator([(torch.ones(4, dtype=torch.bfloat16),)], config=cfg, quiet=True)
    assert g.run() == 1
    g.close()
    with pytest.raises(wt.ShardError, match="bfloat16 has no .npy form"):
        wt.export_shards(str(tmp_path / "b"), config=cfg)
    assert not (tmp_path / "b").exists()  # made by the export, nothing kept: removed


@pytest.mark.asan
def test_hostile_npy_headers(tmp_path):
    def npy(header, data=b""):
        text = header.encode("latin1")
        text += b" " * (-(10 + len(text) + 1) % 64) + b"\n"
        return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data

    for header, data, what in [
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 2**60), }", b"", "literal"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (0, %d), }" % 2**60, b"", "shape"),
            ("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", b"\0" * 8, "pickle"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", b"\0" * 15, "16 bytes"),
            ("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", b"\0" * 4, "'>f4'"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", b"\0" * 4,
             "exactly"),
            ("__import__('os').system('true')", b"", "literal"),
            ("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }", b"\0" * 4, "fortran")]:
        path = _tar(tmp_path / "h.tar", _good("a") + [("b.id.npy", npy(header, data))] +
                    _good("b", counter=1)[1:])
        with pytest.raises(wt.ShardError, match=what) as e:
            _read(path)
        assert e.value.member == "b.id.npy"
    raw = _npy(np.zeros(2, np.int64))
    path = _tar(tmp_path / "v.tar", _good("a") + [("b.id.npy", raw[:6] + b"\x07" + raw[7:])])
    with pytest.raises(wt.ShardError, match="version 7"):
        _read(path)


@pytest.mark.asan
def test_random_damage_is_a_shard_error_or_whole_samples(tmp_path):
    """Bytes flipped, cut or inserted anywhere in a shard: the reader yields
    whole samples, or stops (or skips) with a ShardError; never another
    exception. Without an index a flip inside data that keeps the framing
    goes unseen (tar has no data checksum); with index.json's member
    checksums every yielded sample is intact."""
    path = _tar(tmp_path / "ok.tar", [m for c in range(3) for m in _good(f"k{c}", 4, c)])
    raw = open(path, "rb").read()
    members = {}
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            h = wt._C.Xxh3()
            h.update(tf.extractfile(m).read())
            members[m.name] = h.hexdigest()
    rng = random.Random(11)
    counts = {"error": 0, "unseen": 0}
    for verified in (False, True):
        d = tmp_path / f"v{int(verified)}"
        d.mkdir()
        bad = d / "bad.tar"
        for i in range(300):
            b = bytearray(raw)
            how = i % 3
            at = rng.randrange(len(b))
            if how == 0:
                for _ in range(rng.randint(1, 4)):
                    b[rng.randrange(len(b))] = rng.randrange(256)
            elif how == 1:
                del b[at:]
            else:
                b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 600)))
            bad.write_bytes(bytes(b))
            if verified:  # the index of the undamaged shard, but the file's own size
                entry = {"name": "bad.tar", "bytes": len(b), "samples": 3, "xxh3": None,
                         "members": members}
                (d / "index.json").write_text(json.dumps(
                    {"format": shards.INDEX_FORMAT, "version": 1, "fields": list(FIELDS),
                     "schema": None, "samples": 3, "checksum": "xxh3-64", "shards": [entry]}))
            for on_error in ("raise", "skip"):
                try:
                    for s in wt.from_shards(str(bad), fields=FIELDS, on_error=on_error):
                        whlib.check_sample(*s)
                except wt.ShardError:
                    counts["error"] += 1
                except AssertionError:
                    assert not verified, f"damage {i} went unseen with member checksums"
                    counts["unseen"] += 1
    assert counts["error"] > 200


def test_write_error_mid_sample_drops_only_that_shard(shm_cfg, tmp_path, monkeypatch):
    cfg = shm_cfg(swap_cap=4, sample=FIELDS, SELF_SEAL=True)
    g = wt.WireheadGenerator((whlib.sample(6, i, n=16) for i in range(4)), config=cfg,
                             quiet=True)
    assert g.run() == 4
    g.close()
    from wirehead_torch._shard_export import _ShardWriter
    real = _ShardWriter._write

    def failing(self, data):
        # one sample per shard (2 KiB): the third sample's second member fails
        if self._entry["samples"] == 0 and len(self.index["shards"]) == 2 and \
                len(self._entry["members"]) == 1:
            raise OSError(28, "No space left on device")
        return real(self, data)
    monkeypatch.setattr(_ShardWriter, "_write", failing)
    out = tmp_path / "full"
    with pytest.raises(OSError, match="No space"):
        wt.export_shards(str(out), config=cfg, shard_size="2KiB")
    assert sorted(os.listdir(out)) == ["index.json", "shards-000000.tar", "shards-000001.tar"]
    with open(out / "index.json") as f:
        assert json.load(f)["samples"] == 2
    assert [int(s[0][1]) for s in wt.from_shards(_tars(str(out)), fields=FIELDS)] == [0, 1]


def test_export_errors_say_what_to_do(shm_cfg, tmp_path):
    absent = shm_cfg(swap_cap=2, sample=FIELDS, budget=None)  # made by its first sample
    with pytest.raises(TimeoutError, match=r"store shm://.* does not exist yet after 0\.5s "
                                           r"\(no shared-memory segment"):
        wt.export_shards(str(tmp_path / "a"), config=absent, timeout=0.5)
    cfg = shm_cfg(swap_cap=2, sample=FIELDS)
    g = wt.WireheadGenerator((whlib.sample(6, 0, n=16) for _ in range(1)), config=cfg,
                             quiet=True)
    g.run()  # the store exists now, with no generation sealed
    g.close()
    with pytest.raises(TimeoutError, match=r"no generation sealed in shm://.* after 0\.5s: "
                                           r"waited for the first generation"):
        wt.export_shards(str(tmp_path / "a"), config=cfg, timeout=0.5)
    with pytest.raises(ValueError, match="shard_size must be a byte count"):
        wt.export_shards(str(tmp_path / "b"), config=cfg, shard_size="lots")
    with pytest.raises(ValueError, match="not both"):
        wt.export_shards(str(tmp_path / "c"), config=cfg, generations=1, samples=2)
    with pytest.raises(ValueError, match="on_error"):
        wt.from_shards("x.tar", on_error="ignore")
    with pytest.raises(wt.ShardError, match="only local paths"):
        wt.from_shards("https://host/shards-{0..3}.tar")
    with pytest.raises(wt.ShardError, match=r"nothing-\*\.tar.*the glob matches no file"):
        wt.from_shards(str(tmp_path / "nothing-*.tar"))


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_ends_an_export_visibly_with_every_shard_complete_and_listed(shm_cfg, tmp_path,
                                                                            sig, code):
    cfg = shm_cfg(swap_cap=4, sample=SAMPLE, SELF_SEAL=True)
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))
    feeder = _Feeder(cfg, _paced(8, pause=0.005))
    try:
        child = subprocess.Popen([sys.executable, "-m", "wirehead_torch.apps.cli", "export",
                                  "--config", "c.yaml", "--out", "kept", "--generations",
                                  "1000000", "--shard-size", "8KiB"], cwd=tmp_path,
                                 env=whlib.env_for_child(), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        whlib.until(lambda: len(_tars(str(tmp_path / "kept"))) >= 3
                    if (tmp_path / "kept").is_dir() else False, 30, "three shards")
        child.send_signal(sig)
        out, err = child.communicate(timeout=30)
    finally:
        feeder.close()
    assert child.returncode == code, err  # interrupted, visibly
    assert f"wirehead export: interrupted by {sig.name}" in err and '"complete": false' in err
    assert "1000000" not in out
    kept = tmp_path / "kept"
    with open(kept / "index.json") as f:
        index = json.load(f)
    assert index["complete"] is False
    last = out.splitlines()[-1]  # counted from the index, never the generations asked for
    assert last.startswith(f"wirehead export: interrupted by {sig.name}: {index['samples']} "
                           f"samples in {len(index['shards'])} shards under kept: "), last
    _whole_generations_only(index, _tars(str(kept)), 4)
    assert sorted(os.listdir(kept)) == sorted(["index.json"] +
                                              [s["name"] for s in index["shards"]])
    src = wt.from_shards(_tars(str(kept)), verify="full")
    assert sum(1 for _ in src) == index["samples"] > 0


def _whole_generations_only(index, paths, swap_cap):
    """The signal finished the generation being written: each generation
    in the shards is whole, unless it was reclaimed under the export."""
    per_gen = {}
    for name, _ in _members_by_tarfile(paths):
        if name.endswith(".id.npy"):
            g = int(name[1:name.index("-")])
            per_gen[g] = per_gen.get(g, 0) + 1
    assert sorted(per_gen) == sorted(index["generations"])
    assert index["whole_generations"] + index["partial_generations"] == index["generations"]
    assert all(per_gen[g] == swap_cap for g in index["whole_generations"])
    assert len(index["partial_generations"]) <= 1
    if not index["reclaimed_during_export"]:
        assert index["partial_generations"] == []


def test_sigint_raises_keyboardinterrupt_and_the_index_says_incomplete(shm_cfg, tmp_path):
    cfg = shm_cfg(swap_cap=4, sample=SAMPLE, SELF_SEAL=True)
    out = tmp_path / "kept"
    feeder = _Feeder(cfg, _paced(9, pause=0.005))

    def interrupt():  # once the export is past its start (its handler installed)
        whlib.until(lambda: len(_tars(str(out))) >= 2 if out.is_dir() else False, 30,
                    "two shards")
        os.kill(os.getpid(), signal.SIGINT)
    t = threading.Thread(target=interrupt, daemon=True)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            wt.export_shards(str(out), config=cfg, generations=1000000, shard_size="8KiB")
    finally:
        t.join(30)
        feeder.close()
    with open(out / "index.json") as f:
        index = json.load(f)
    assert index["complete"] is False
    _whole_generations_only(index, _tars(str(out)), 4)
    src = wt.from_shards(_tars(str(out)), verify="full")
    assert sum(1 for _ in src) == index["samples"] > 0
    # a finished export says complete, every generation whole
    cfg2 = shm_cfg(swap_cap=2, sample=FIELDS, SELF_SEAL=True)
    g = wt.WireheadGenerator((whlib.sample(3, i, n=16) for i in range(2)), config=cfg2,
                             quiet=True)
    g.run()
    g.close()
    done = wt.export_shards(str(tmp_path / "done"), config=cfg2)
    assert done["complete"] is True and done["partial_generations"] == []
    assert done["whole_generations"] == done["generations"]


def test_shard_not_in_the_index_beside_it_is_refused(shm_cfg, tmp_path):
    cfg = shm_cfg(swap_cap=2, sample=FIELDS, SELF_SEAL=True)
    g = wt.WireheadGenerator((whlib.sample(4, i, n=16) for i in range(2)), config=cfg,
                             quiet=True)
    g.run()
    g.close()
    wt.export_shards(str(tmp_path / "kept"), config=cfg)
    foreign = tmp_path / "kept" / "shards-000009.tar"
    _tar(str(foreign), _good("g1-p0", 4, 0))
    with pytest.raises(wt.ShardError, match=r"shards-000009\.tar.*not listed in the index"):
        list(wt.from_shards(str(tmp_path / "kept" / "shards-*.tar"), config=cfg))
    src = wt.from_shards(str(tmp_path / "kept" / "shards-*.tar"), config=cfg, on_error="skip")
    assert sum(1 for _ in src) == 2 and src.skipped_shards == 1


def test_export_out_and_timeout_checked_and_made_dir_removed(shm_cfg, tmp_path):
    cfg = shm_cfg(swap_cap=2, sample=FIELDS)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(wt.ShardError, match="afile is a file, not a directory"):
        wt.export_shards(str(tmp_path / "afile"), config=cfg, timeout=0.1)
    with pytest.raises(ValueError, match="timeout must be"):
        wt.export_shards(str(tmp_path / "t"), config=cfg, timeout=-1)
    with pytest.raises(TimeoutError):
        wt.export_shards(str(tmp_path / "new"), config=cfg, timeout=0.2)
    assert not (tmp_path / "new").exists()  # made by the export, nothing written: removed


def test_cli_generate_checks_shards_options_first_and_quiet(shm_cfg, tmp_path):
    src = shm_cfg(swap_cap=2, sample=FIELDS, SELF_SEAL=True)
    g = wt.WireheadGenerator((whlib.sample(5, i, n=16) for i in range(2)), config=src,
                             quiet=True)
    g.run()
    g.close()
    wt.export_shards(str(tmp_path / "kept"), config=src, shard_size="2KiB")  # 2 shards
    dst = shm_cfg(swap_cap=1, sample=FIELDS, SELF_SEAL=True)
    (tmp_path / "dst.yaml").write_text(json.dumps(dst))
    cli = [sys.executable, "-m", "wirehead_torch.apps.cli", "generate", "--config", "dst.yaml"]

    def run(*args):
        return subprocess.run(cli + list(args), cwd=tmp_path, env=whlib.env_for_child(),
                              capture_output=True, text=True, timeout=60)
    r = run("--loop")
    assert r.returncode == 2 and "--loop" in r.stderr and "needs --shards" in r.stderr
    r = run("--shards", "kept/shards-{000000..000003}.tar")
    assert r.returncode == 2, r.stderr
    assert "2 of 4 shards do not exist: kept/shards-000002.tar, kept/shards-000003.tar" \
        in r.stderr
    r = run("--procs", "3", "--shards", "kept/shards-*.tar")
    assert r.returncode == 2 and "--procs 3 but --shards names 2 shards" in r.stderr
    assert "started" not in r.stdout  # nothing started
    with pytest.raises(wt.NotFoundError):
        wt.status(config=dst)  # nothing put
    r = run("--quiet", "--shards", "kept/shards-*.tar")  # a glob, expanded in order
    assert r.returncode == 0, r.stderr
    assert "swap success" not in r.stdout and "Time:" not in r.stdout
    assert "pushed 2 samples" in r.stdout and "started" in r.stdout
    r = run("--shards", "kept/shards-*.tar")  # default: no line per generation
    assert r.returncode == 0 and "swap success" not in r.stdout, r.stdout
    assert "generator 0: done: 2 samples" in r.stdout, r.stdout
    r = run("--verbose", "--shards", "kept/shards-*.tar")
    assert r.returncode == 0 and r.stdout.count("swap success: generation #") == 2, r.stdout


def test_store_of_another_sample_names_both_samples(store_cfg):
    cfg = store_cfg(swap_cap=2, sample=FIELDS)
    whlib.open_store(cfg).close()  # the store, made
    other = dict(cfg, SAMPLE=["id", "weight"])
    with pytest.raises(wt.WireheadError, match=r"created with SAMPLE \[id, data\], the "
                                               r"config's SAMPLE is \[id, weight\]"):
        whlib.open_store(other)


def test_dataset_for_a_torch_dataloader_reads_every_sample_once(shm_cfg, tmp_path):
    torch = pytest.importorskip("torch")
    cfg = shm_cfg(swap_cap=6, sample=SAMPLE, SELF_SEAL=True)
    g = wt.WireheadGenerator((_sample(7, i) for i in range(6)), config=cfg, quiet=True)
    g.run()
    g.close()
    wt.export_shards(str(tmp_path / "val"), config=cfg, shard_size="8KiB")
    assert len(_tars(str(tmp_path / "val"))) >= 3
    ds = wt.from_shards(str(tmp_path / "val" / "shards-*.tar"), config=cfg,
                        shuffle=True, seed=3).dataset()
    for workers in (0, 2):
        seen = []
        for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers):
            assert set(batch) == set(SAMPLE)
            tag, counter = whlib.check_sample(batch["id"].numpy(), batch["data"].numpy())
            want = _sample(tag, counter)
            assert batch["vol"].dtype == torch.int32  # uint16, widened
            assert np.array_equal(batch["vol"].numpy(), want[3])
            assert batch["mask"].dtype == torch.bool and batch["scale"].dtype == torch.complex128
            seen.append(counter)
        assert sorted(seen) == list(range(6)), workers  # every sample, once


def test_cli_import_into_a_store_of_another_shape_names_the_field(shm_cfg, tmp_path):
    src = shm_cfg(swap_cap=2, sample=FIELDS, SELF_SEAL=True)
    g = wt.WireheadGenerator((whlib.sample(8, i, n=16) for i in range(2)), config=src,
                             quiet=True)
    g.run()
    g.close()
    wt.export_shards(str(tmp_path / "kept"), config=src)
    dst = shm_cfg(swap_cap=2, sample=FIELDS, SELF_SEAL=True)
    g = wt.WireheadGenerator((whlib.sample(8, i, n=40) for i in range(2)), config=dst,
                             quiet=True)
    g.run()  # the store holds a sealed generation of another data shape
    g.close()
    (tmp_path / "dst.yaml").write_text(json.dumps(dst))
    before = wt.status(config=dst)["generated"]
    r = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "generate", "--config",
                        "dst.yaml", "--shards", "kept/shards-000000.tar"], cwd=tmp_path,
                       env=whlib.env_for_child(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "field 'data': the shards hold" in r.stderr and "the store shm://" in r.stderr
    assert wt.status(config=dst)["generated"] == before  # nothing put
