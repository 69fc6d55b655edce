"""The MongoDB store against the in-memory wire-protocol server:
faults survived, many processes, bad data, config compatibility.

Every test gets its own database on a server shared by this module; the
restart test gets a server of its own (a restart wipes everything)."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import wirehead_torch as wt
from wirehead_torch import _C
from wirehead_torch.config import resolve

import whlib
from mongo_server import MongoTestServer, RawClient, binary, unbinary
from whlib import open_store, read_generation

pytestmark = pytest.mark.asan  # also run against the sanitizer build

READER = os.path.join(whlib.HERE, "reader_proc.py")
SMALL_CHUNK = 1 / 2048  # CHUNKSIZE in MiB: 512-byte chunks, so samples span several


@pytest.fixture(scope="module")
def server():
    with MongoTestServer() as s:
        yield s


def _make_cfg(srv, made, swap_cap=8, sample=("id", "data"), **extra):
    db = whlib.unique_name("whm")
    cfg = {"STORE": f"{srv.uri}/{db}", "SWAP_CAP": swap_cap, "SAMPLE": list(sample),
           "READ_TIMEOUT": 30, "LEASE_SECONDS": 5, "CONNECT_TIMEOUT": 10,
           "CHUNKSIZE": SMALL_CHUNK, "SELF_SEAL": False}  # a manager seals (seal_one)
    cfg.update(extra)
    made.append(cfg)
    return cfg


@pytest.fixture
def mongo_cfg(server):
    """A factory of configs for fresh MongoDB stores (own database each)."""
    made = []
    yield lambda **kw: _make_cfg(server, made, **kw)
    for cfg in made:
        try:
            wt.clean(cfg)
        except wt.StoreUnavailableError:
            pass


def db_of(cfg):
    return cfg["STORE"].rsplit("/", 1)[1]


def prefix_of(cfg):
    return resolve(cfg)["COLLECTION_PREFIX"]


def store_collections(rc, cfg):
    pre = prefix_of(cfg) + "."
    return [c for c in rc.collections(db_of(cfg)) if c.startswith(pre)]

def fill(cfg, tag, n, start=0):
    g = wt.WireheadGenerator((whlib.sample(tag, start + i) for i in range(n)), config=cfg)
    assert g.run() == n
    return g


def seal_one(cfg):
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    return wt.status(cfg)["read_gen"]


def spawn_reader(kind, cfg):
    return subprocess.Popen([sys.executable, READER, kind, json.dumps(cfg)],
                            env=whlib.env_for_child(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


# -- basics ------------------------------------------------------------------


def test_roundtrip_surplus_and_status(mongo_cfg):
    cfg = mongo_cfg(swap_cap=5)
    g = fill(cfg, 1, 9)
    assert (g.accepted, g.discarded) == (5, 4)
    st = wt.status(cfg)
    assert st["write_fill"] == 5 and st["discarded"] == 4 and st["read_gen"] == 0
    assert "@" not in st["store"]
    gen = seal_one(cfg)
    assert gen == st["write_gen"]
    seen = read_generation(open_store(cfg), gen, 5)
    assert sorted(seen) == [(1, i) for i in range(5)]  # the first SWAP_CAP committed
    st = wt.status(cfg)
    assert st["seals"] == 1 and st["generated"] == 5 and len(st["history"]) == 1
    assert st["history"][0]["generation"] == gen


def test_every_dtype_round_trips_through_chunks(mongo_cfg):
    """Exact dtypes and shapes, with fields straddling 512-byte chunks."""
    dtypes = ["bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32",
              "int64", "float16", "float32", "float64", "complex64", "complex128"]
    cfg = mongo_cfg(swap_cap=1, sample=dtypes)
    rng = np.random.default_rng(4)
    arrays = []
    for i, dt in enumerate(dtypes):
        shape = [(), (3,), (5, 7), (2, 3, 11), (0, 4)][i % 5]
        n = int(np.prod(shape)) if shape else 1
        raw = rng.integers(0, 256, size=n * np.dtype(dt).itemsize, dtype=np.uint8)
        a = (raw[:n] & 1).astype(bool) if dt == "bool" else raw.view(dt)
        arrays.append(a.reshape(shape))
    store = open_store(cfg)
    from wirehead_torch._arrays import to_store_arrays
    status, _ = store.put(to_store_arrays(tuple(arrays), dtypes))
    assert status == _C.PUT_ACCEPTED
    assert store.lead()
    info = store.seal()
    out = store.read(info["generation"], 0)
    for a, o, dt in zip(arrays, out, dtypes):
        b = np.from_dlpack(o)
        if dt == "bool":
            b = b.view(np.bool_)
        assert b.dtype == a.dtype and b.shape == a.shape, dt
        assert b.tobytes() == np.ascontiguousarray(a).tobytes(), dt


def test_original_wirehead_config_and_uri_database_wins(server, tmp_path):
    port = server.port
    db = whlib.unique_name("orig")
    yaml_text = (f"MONGOHOST: 127.0.0.1\nPORT: {port}\nDBNAME: {db}\nSWAP_CAP: 3\n"
                 f"SAMPLE: [id, data]\nCHUNKSIZE: 10\nWRITE_COLLECTION: write\n"
                 f"READ_COLLECTION: read\nCOUNTER_COLLECTION: counters\n"
                 f"TEMP_COLLECTION: temp\n")
    path = tmp_path / "config.yaml"
    path.write_text(yaml_text)
    try:
        cfg = wt.load_config(path)
        g = fill(cfg, 2, 3)
        assert g.sealed == 1 and wt.status(cfg)["read_gen"] > 0  # the generator sealed it
        with RawClient(server.uri) as rc:
            names = rc.collections(db)
        assert "write.state" in names and all(n.startswith("write.") for n in names)
        # a database named in the URI wins over DBNAME
        other = whlib.unique_name("uri")
        cfg2 = dict(cfg, STORE=f"{server.uri}/{other}")
        fill(cfg2, 3, 1)
        with RawClient(server.uri) as rc:
            assert "write.state" in rc.collections(other)
        wt.clean(cfg2)
    finally:
        wt.clean(wt.load_config(path))
    with RawClient(server.uri) as rc:
        assert rc.collections(db) == []


def test_clean_drops_only_this_store(mongo_cfg, server):
    a = mongo_cfg(swap_cap=2)
    b = dict(a, COLLECTION_PREFIX="other")  # same database, another store
    fill(a, 1, 2)
    fill(b, 1, 2)
    with RawClient(server.uri) as rc:
        db = db_of(a)
        rc.command(db, {"insert": "wirehead_not_ours", "documents": [{"x": 1}]})
        rc.command(db, {"insert": "wirehead.notes", "documents": [{"x": 1}]})
        before = rc.collections(db)
        out = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "clean", "--config",
                              _write_cfg(a)], env=whlib.env_for_child(), capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        after = rc.collections(db)
    gone = set(before) - set(after)
    assert gone and all(n.startswith("wirehead.") for n in gone)
    assert {"wirehead_not_ours", "wirehead.notes", "other.state"} <= set(after)
    wt.clean(b)


def _write_cfg(cfg):
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), whlib.unique_name("cfg") + ".yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)  # JSON is YAML
    return path


def test_status_cli_against_mongodb(mongo_cfg):
    cfg = mongo_cfg(swap_cap=2)
    fill(cfg, 1, 2)
    gen = seal_one(cfg)
    path = _write_cfg(cfg)
    try:
        out = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "status", "--json",
                              "--config", path], env=whlib.env_for_child(),
                             capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(path)
    assert out.returncode == 0, out.stderr
    st = json.loads(out.stdout)
    assert st["read_gen"] == gen and st["seals"] == 1 and st["swap_cap"] == 2


def test_generation_ids_increase_when_the_database_is_wiped(mongo_cfg):
    cfg = mongo_cfg(swap_cap=1)
    ids = []
    for round_ in range(3):
        fill(cfg, 1, 1, start=round_)
        ids.append(seal_one(cfg))
        wt.clean(cfg)  # everything gone, as after a restart of the in-memory server
    assert ids == sorted(ids) and len(set(ids)) == 3


def test_schema_mismatch_is_refused(mongo_cfg):
    cfg = mongo_cfg(swap_cap=3)
    fill(cfg, 1, 1)
    with pytest.raises(wt.SchemaMismatchError, match="SWAP_CAP=3"):
        wt.status(dict(cfg, SWAP_CAP=4))
    with pytest.raises(wt.SchemaMismatchError, match=r"\[id, data\]"):
        wt.status(dict(cfg, SAMPLE=["x", "y"]))


# -- faults ------------------------------------------------------------------


def test_unreachable_server_gives_a_clear_error_after_a_bounded_wait():
    port = whlib.free_port()  # nothing listens there
    cfg = {"STORE": f"mongodb://alice:hunter2pw@127.0.0.1:{port}/db?authSource=admin",
           "SWAP_CAP": 4, "SAMPLE": ["id", "data"], "CONNECT_TIMEOUT": 1.5}
    t0 = time.monotonic()
    with pytest.raises(wt.StoreUnavailableError) as e:
        wt.status(cfg)
    took = time.monotonic() - t0
    msg = str(e.value)
    assert took < 8, f"waited {took:.1f}s for a 1.5 s CONNECT_TIMEOUT"
    assert f"127.0.0.1:{port}" in msg and "unreachable" in msg
    assert "hunter2pw" not in msg and "alice" not in msg
    with pytest.raises(wt.StoreUnavailableError):
        wt.WireheadGenerator(iter([whlib.sample(1, 0)]), config=cfg).run()


def test_generator_killed_mid_put_leaves_nothing_visible(mongo_cfg, server):
    cfg = mongo_cfg(swap_cap=6)
    victim = whlib.spawn("gen", cfg, 66, env={"WIREHEAD_FAULT_PUT_PAUSE": "60"})
    try:
        whlib.wait_line(victim.stderr, "fault pause in put", 60)
        st = wt.status(cfg)
        with RawClient(server.uri) as rc:
            chunks = rc.find(db_of(cfg), f"wirehead.gen.{st['write_gen']}", {"d": {"$exists": True}},
                             {"_id": 1})
        assert st["write_fill"] == 0 and chunks, "half the chunks written, nothing committed"
        orphan = chunks[0]["_id"]["s"]
        victim.kill()
        victim.wait(10)
    finally:
        whlib.stop(victim)
    store = open_store(cfg)
    assert store.current() == 0
    fill(cfg, 7, 6)  # others carry on
    gen = seal_one(cfg)
    assert sorted(read_generation(store, gen, 6)) == [(7, i) for i in range(6)]
    # the dead put's chunks go with their generation's collection
    for k in range(3):
        fill(cfg, 8, 6, start=10 * k)
        seal_one(cfg)
    with RawClient(server.uri) as rc:
        names = store_collections(rc, cfg)
        assert len(names) <= 7, names
        for n in names:
            if n.endswith(".state") or n.endswith(".m"):
                continue
            assert not rc.find(db_of(cfg), n, {"_id.s": orphan}), "orphan chunks linger"


def test_put_that_outlives_three_seals_is_discarded(mongo_cfg, server):
    """A paused generator resumes after its generation was reclaimed: its
    sample must not count as accepted nor appear anywhere."""
    cfg = mongo_cfg(swap_cap=4)
    victim = whlib.spawn("gen", cfg, 99, 1, env={"WIREHEAD_FAULT_PUT_PAUSE": "6"})
    try:
        whlib.wait_line(victim.stderr, "fault pause in put", 60)
        for k in range(3):
            fill(cfg, 1, 4, start=4 * k)
            seal_one(cfg)
        assert victim.poll() is None, "the victim resumed before three seals; test invalid"
        lines = whlib.wait_line(victim.stderr, "PUSHED", 60)
        assert victim.wait(30) == 0
    finally:
        whlib.stop(victim)
    pushed = [l for l in lines if l.startswith("PUSHED")][0].split()
    assert pushed[1:] == ["1", "0", "1"], f"pushed/accepted/discarded: {pushed}"
    store = open_store(cfg)
    st = wt.status(cfg)
    assert st["write_fill"] == 0
    for gen in (st["read_gen"], st["read_gen"] - 1):
        assert all(t != 99 for t, _ in read_generation(store, gen, 4))
    fill(cfg, 2, 4)
    seal_one(cfg)  # sweeps the collection the late put recreated
    with RawClient(server.uri) as rc:
        assert len(store_collections(rc, cfg)) <= 7


def test_manager_killed_mid_seal_then_replaced(mongo_cfg, server):
    swap_cap = 4
    cfg = mongo_cfg(swap_cap=swap_cap, LEASE_SECONDS=1.5)
    gen_p = whlib.spawn("gen", cfg, 5)
    mgr = whlib.spawn("manager", cfg, stdout=subprocess.PIPE,
                      env={"WIREHEAD_FAULT_SEAL_PAUSE": "60"})
    mgr2 = None
    try:
        whlib.wait_line(mgr.stderr, "fault pause in seal", 60)
        mgr.kill()  # swapped, old generations not yet reclaimed
        mgr.wait(10)
        st = wt.status(cfg)
        assert st["seals"] == 1 and st["read_gen"] > 0
        store = open_store(cfg)
        first = read_generation(store, st["read_gen"], swap_cap)
        assert len(set(first)) == swap_cap
        t0 = time.monotonic()
        mgr2 = whlib.spawn("manager", cfg, 4, stdout=subprocess.PIPE)
        sealed = []
        for _ in range(4):
            line = whlib.wait_line(mgr2.stdout, '"generation"', 60)[-1]
            sealed.append(json.loads(line)["generation"])
        took = time.monotonic() - t0
        assert mgr2.wait(30) == 0
        assert sealed == sorted(sealed) and sealed[0] > st["read_gen"]
        assert took < 30, "the new manager must take over within about LEASE_SECONDS"
        st2 = wt.status(cfg)
        assert st2["seals"] == 5
        every = list(first)
        for gen in (st2["read_gen"] - 1, st2["read_gen"]):
            seen = read_generation(store, gen, swap_cap)
            assert seen is not None and len(set(seen)) == swap_cap
            every += seen
        assert len(every) == len(set(every)), "a sample sealed into two generations"
        with RawClient(server.uri) as rc:
            names = store_collections(rc, cfg)
        assert len(names) <= 7, f"left-over generations after the killed seal: {names}"
    finally:
        whlib.stop(gen_p)
        whlib.stop(mgr)
        if mgr2 is not None:
            whlib.stop(mgr2)


def test_three_generators_manager_and_readers_fill_ten_generations(mongo_cfg):
    swap_cap = 8
    cfg = mongo_cfg(swap_cap=swap_cap)
    gens = [whlib.spawn("gen", cfg, tag) for tag in (1, 2, 3)]
    mgr = whlib.spawn("manager", cfg, stdout=subprocess.PIPE)
    readers = [spawn_reader("store", cfg) for _ in range(2)]
    try:
        for p in gens + [mgr] + readers:
            whlib.wait_line(p.stderr, "STARTED", 60)
        results = []
        for r in readers:
            got = []
            while len(got) < 10:
                line = whlib.wait_line(r.stdout, '"gen"', 120)[-1]
                got.append(json.loads(line))
            results.append(got)
    finally:
        codes = [whlib.stop(p) for p in gens + [mgr] + readers]
    assert codes == [0] * len(codes), f"SIGTERM exit codes {codes}"
    for got in results:
        gens_read = [g["gen"] for g in got]
        assert gens_read == sorted(set(gens_read)), "generation ids only increase"
        every = []
        for g in got:
            ids = [tuple(i) for i in g["ids"]]
            assert len(ids) == swap_cap and len(set(ids)) == swap_cap
            every += ids
        assert len(every) == len(set(every)), "a sample in two generations"
    tags = {i[0] for got in results for g in got for i in g["ids"]}
    assert tags == {1, 2, 3}
    # both readers saw identical contents for the generations they share
    a = {g["gen"]: g["ids"] for g in results[0]}
    b = {g["gen"]: g["ids"] for g in results[1]}
    assert all(a[k] == b[k] for k in set(a) & set(b))


def test_server_restart_while_everything_runs(tmp_path):
    """The in-memory server loses everything on restart: generators, manager
    and reader reconnect by themselves and carry on with new generations."""
    swap_cap = 6
    with MongoTestServer(log_path=str(tmp_path / "server.log")) as srv:
        made = []
        cfg = _make_cfg(srv, made, swap_cap=swap_cap, CONNECT_TIMEOUT=2, LEASE_SECONDS=2,
                        READ_TIMEOUT=60)
        gens = [whlib.spawn("gen", cfg, tag) for tag in (1, 2)]
        mgr = whlib.spawn("manager", cfg, stdout=subprocess.PIPE)
        reader = spawn_reader("dataset", cfg)
        procs = gens + [mgr, reader]
        try:
            for p in procs:
                whlib.wait_line(p.stderr, "STARTED", 60)
            before = json.loads(whlib.wait_line(reader.stdout, '"read"', 60)[-1])
            first_epoch = wt.status(cfg)["read_gen"]
            assert first_epoch > 0
            srv.stop()
            # everyone notices the outage: the manager reports it
            whlib.wait_line(mgr.stderr, "MongoDB", 60)
            whlib.assert_alive(procs, "during the outage")
            srv.start()  # same port, empty
            def read_gen():
                try:
                    return wt.status(cfg)["read_gen"]
                except wt.NotFoundError:  # wiped: nobody has re-created the store yet
                    return 0

            whlib.until(lambda: read_gen() > first_epoch, 90,
                        "a generation sealed after the restart")
            # the reader continues on new generations: samples newer than any before
            top = before["max"]
            deadline = time.monotonic() + 90
            while True:
                rec = json.loads(whlib.wait_line(reader.stdout, '"read"', 90)[-1])
                newer = [t for t, c in rec["max"].items() if c > top.get(t, -1) + swap_cap]
                if newer:
                    break
                assert time.monotonic() < deadline, "reader did not continue after restart"
            whlib.assert_alive(procs, "after the restart")
        finally:
            codes = [whlib.stop(p) for p in procs]
        assert codes == [0] * len(procs), f"SIGTERM exit codes {codes}"


# -- bad data ----------------------------------------------------------------


def test_bad_data_reads_as_corrupt_with_a_reason(mongo_cfg, server):
    swap_cap = 6
    cfg = mongo_cfg(swap_cap=swap_cap)
    fill(cfg, 4, swap_cap)
    gen = seal_one(cfg)
    db, man, chunks = db_of(cfg), f"wirehead.gen.{gen}.m", f"wirehead.gen.{gen}"
    with RawClient(server.uri) as rc:
        m = {d["_id"]: d for d in rc.find(db, man)}
        assert sorted(m) == list(range(swap_cap)) and all(d["k"] >= 2 for d in m.values())
        # 0: a truncated chunk
        rc.update(db, chunks, {"_id": {"s": m[0]["s"], "c": 1}},
                  {"$set": {"d": binary(b"\0" * 7)}})
        # 1: a manifest whose sizes disagree with its chunks
        rc.update(db, man, {"_id": 1}, {"$set": {"z": m[1]["z"] + 512}})
        # 2: a wrong dtype code (header checksum recomputed: only the code is wrong)
        h = bytearray(unbinary(m[2]["h"]))
        h[64 + 96] = 42  # field 1's dtype
        h[32:40] = whlib.xxh3(bytes(h[:32] + h[40:])).to_bytes(8, "little")
        rc.update(db, man, {"_id": 2}, {"$set": {"h": binary(h)}})
        # 3: a missing chunk
        rc.command(db, {"delete": chunks, "deletes": [
            {"q": {"_id": {"s": m[3]["s"], "c": 0}}, "limit": 1}]})
        # 4: flipped data bits
        c = rc.find(db, chunks, {"_id": {"s": m[4]["s"], "c": 0}})[0]
        d = bytearray(unbinary(c["d"]))
        d[3] ^= 0x10
        rc.update(db, chunks, {"_id": c["_id"]}, {"$set": {"d": binary(d)}})
    store = open_store(cfg)
    expect = {0: "holds 7 bytes", 1: "data bytes", 2: "unknown dtype code 42",
              3: "chunks missing", 4: "checksum mismatch"}
    for pos, reason in expect.items():
        with pytest.raises(wt.CorruptSampleError, match=reason) as e:
            store.read(gen, pos)
        assert f"position {pos}" in str(e.value)
    ident, data = store.read(gen, 5)
    whlib.check_sample(np.from_dlpack(ident), np.from_dlpack(data))
    # the same through the user-facing reader: an error naming the reason
    ds = wt.MongoheadDataset(config=cfg, output="numpy")
    with pytest.raises(wt.CorruptSampleError, match="unknown dtype code"):
        ds[2]
    whlib.check_sample(ds[5]["input"], ds[5]["label"])
