"""Hostile or damaged bytes in a store are errors or counted skips, never
wrong data or a whole epoch lost: a sample records the generation and
position it was stored at inside its checksummed header, and a damaged
header is corruption even where it names the schema."""
import struct

import numpy as np
import pytest

import wirehead_torch as wt

import whlib
from whlib import open_store

pytestmark = pytest.mark.asan  # also run against the sanitizer build

SWAP_CAP = 4
SCHEMA_HASH = slice(8, 16)  # the sample header's schema hash


def sealed(cfg):
    items = [whlib.sample(1, i) for i in range(SWAP_CAP)]
    assert wt.WireheadGenerator(iter(items), config={**cfg, "SELF_SEAL": False}).run() == SWAP_CAP
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    return wt.status(cfg)["read_gen"]


def shm_path(cfg):
    return f"/dev/shm/wirehead.{cfg['STORE'][len('shm://'):]}"


def shm_index(blob, size):
    """Byte offset of the index of SWAP_CAP equal-size samples: a run of
    (offset, size) pairs with distinct offsets."""
    q = np.frombuffer(blob[:len(blob) // 8 * 8], dtype="<u8")
    hits = np.flatnonzero(q == size)
    for h in hits:
        i = h - 1
        if i < 0 or i + 2 * SWAP_CAP > len(q):
            continue
        pairs = q[i:i + 2 * SWAP_CAP].reshape(SWAP_CAP, 2)
        if (pairs[:, 1] == size).all() and len(set(pairs[:, 0])) == SWAP_CAP:
            return int(i) * 8
    raise AssertionError("index not found in the segment")


def shm_samples(cfg):
    """(index offset, [sample offsets in the segment]) of the read generation."""
    with open(shm_path(cfg), "rb") as f:
        blob = f.read()
    magic = struct.pack("<I", 0x31534857)
    starts = [i for i in range(0, len(blob), 64) if blob[i:i + 4] == magic]
    sizes = {struct.unpack_from("<Q", blob, s + 16)[0] for s in starts}
    assert len(sizes) == 1, sizes
    return blob, shm_index(blob, sizes.pop()), starts


def patch(cfg, at, data):
    with open(shm_path(cfg), "r+b") as f:
        f.seek(at)
        f.write(data)


def check_all_read_as_sample_0(cfg, gen):
    """Every position's entry names sample 0's bytes: only position 0 reads."""
    store = open_store(cfg)
    g, pos, is_pad, arrs, skipped = store.read_sample(gen, 0)
    assert (pos, is_pad, skipped) == (0, False, None)
    for p in range(1, SWAP_CAP):
        with pytest.raises(wt.CorruptSampleError, match=f"position {p}.*stored at generation "
                           f"{gen} position 0"):
            store.read_sample(gen, p, skip=False)
        # the read policy: a counted skip, the stand-in marked as padding
        g, pos, is_pad, arrs, skipped = store.read_sample(gen, p)
        assert is_pad and pos == 0 and "stored at generation" in skipped
    return store


def check_position_1_skipped(cfg, gen):
    """Position 1's header is damaged: corrupt, skipped for position 2."""
    store = open_store(cfg)
    with pytest.raises(wt.CorruptSampleError, match="header checksum"):
        store.read_sample(gen, 1, skip=False)
    g, pos, is_pad, arrs, skipped = store.read_sample(gen, 1)
    assert is_pad and pos == 2 and "header checksum" in skipped
    whlib.check_sample(np.from_dlpack(arrs[0]), np.from_dlpack(arrs[1]))


def test_shm_index_pointing_at_one_sample_is_not_valid_data(shm_cfg):
    cfg = shm_cfg(swap_cap=SWAP_CAP)
    gen = sealed(cfg)
    blob, idx, _ = shm_samples(cfg)
    first = blob[idx:idx + 16]
    for p in range(1, SWAP_CAP):  # every entry names sample 0's bytes
        patch(cfg, idx + 16 * p, first)
    store = check_all_read_as_sample_0(cfg, gen)
    with pytest.raises(wt.CorruptSampleError, match="stored at generation"):
        store.view_sample(gen, 1, skip=False)


def test_shm_flipped_schema_bit_is_a_skip_not_a_schema_change(shm_cfg):
    cfg = shm_cfg(swap_cap=SWAP_CAP)
    gen = sealed(cfg)
    blob, idx, _ = shm_samples(cfg)
    off1 = struct.unpack_from("<Q", blob, idx + 16)[0]
    # the sample at position 1: its offset is relative to its area, so find
    # the header whose recorded place is position 1
    starts = [i for i in range(0, len(blob), 64) if blob[i:i + 4] == struct.pack("<I", 0x31534857)
              and struct.unpack_from("<QQ", blob, i + 40) == (gen, 1)]
    assert len(starts) == 1 and starts[0] % 4096 == off1 % 4096
    at = starts[0] + SCHEMA_HASH.start
    patch(cfg, at, bytes([blob[at] ^ 0x04]))
    check_position_1_skipped(cfg, gen)


@pytest.fixture
def mongo_cfg(request, mongo_server):
    from conftest import _clean_all, _config_factory
    make, made = _config_factory(lambda: f"{mongo_server.uri}/{whlib.unique_name('whh')}",
                                 CONNECT_TIMEOUT=10)
    yield make
    _clean_all(made)


def manifests(cfg, rc, gen):
    from wirehead_torch.config import resolve
    db = cfg["STORE"].rsplit("/", 1)[1]
    coll = f"{resolve(cfg)['COLLECTION_PREFIX']}.gen.{gen}.m"
    return db, coll, {d["_id"]: d for d in rc.find(db, coll)}


def test_mongo_manifests_pointing_at_one_sample_are_not_valid_data(mongo_cfg, mongo_server):
    from mongo_server import RawClient
    cfg = mongo_cfg(swap_cap=SWAP_CAP)
    gen = sealed(cfg)
    with RawClient(mongo_server.uri) as rc:
        db, coll, m = manifests(cfg, rc, gen)
        assert sorted(m) == list(range(SWAP_CAP))
        first = {k: v for k, v in m[0].items() if k != "_id"}
        for p in range(1, SWAP_CAP):
            rc.update(db, coll, {"_id": p}, {"$set": first})
    check_all_read_as_sample_0(cfg, gen)


def test_mongo_flipped_schema_bit_is_a_skip_not_a_schema_change(mongo_cfg, mongo_server):
    from mongo_server import RawClient, binary, unbinary
    cfg = mongo_cfg(swap_cap=SWAP_CAP)
    gen = sealed(cfg)
    with RawClient(mongo_server.uri) as rc:
        db, coll, m = manifests(cfg, rc, gen)
        h = bytearray(unbinary(m[1]["h"]))
        h[SCHEMA_HASH.start] ^= 0x04
        rc.update(db, coll, {"_id": 1}, {"$set": {"h": binary(h)}})
    check_position_1_skipped(cfg, gen)


def forge_claim(cfg, rc, gen, claim, chunk=None):
    """Manifest 1 claims `claim` bytes of data (float32 field 1), with a
    header whose checksum holds and sizes that agree with each other."""
    from mongo_server import binary, unbinary
    db, coll, m = manifests(cfg, rc, gen)
    h = bytearray(unbinary(m[1]["h"]))
    d = 64 + 96  # field 1's descriptor: shape, nbytes; header: total
    off = struct.unpack_from("<Q", h, d + 72)[0]
    struct.pack_into("<Q", h, d + 8, claim // 4)
    struct.pack_into("<Q", h, d + 80, claim)
    struct.pack_into("<Q", h, 16, off + claim)
    h[32:40] = whlib.xxh3(bytes(h[:32] + h[40:])).to_bytes(8, "little")
    dlen, b = off + claim - len(h), chunk or m[1]["b"]
    rc.update(db, coll, {"_id": 1}, {"$set": {"h": binary(h), "z": dlen, "b": b,
                                               "k": -(-dlen // b)}})


def test_mongo_forged_2gib_manifest_is_not_allocated(mongo_cfg, mongo_server):
    import resource

    from mongo_server import RawClient
    cfg = mongo_cfg(swap_cap=SWAP_CAP)
    gen = sealed(cfg)
    with RawClient(mongo_server.uri) as rc:
        forge_claim(cfg, rc, gen, 2 << 30)
    store = open_store(cfg)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(wt.CorruptSampleError, match="claims 2147483.* bytes in .* chunks, 1 exist"):
        store.read_sample(gen, 1, skip=False)
    grew_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grew_mib < 256, f"peak RSS grew by {grew_mib:.0f} MiB for a forged manifest"
    assert store.read_sample(gen, 1)[2]  # the read policy skips it


def test_mongo_manifest_of_a_million_chunks_is_refused(mongo_cfg, mongo_server):
    from mongo_server import RawClient
    cfg = mongo_cfg(swap_cap=SWAP_CAP)
    gen = sealed(cfg)
    with RawClient(mongo_server.uri) as rc:
        forge_claim(cfg, rc, gen, 1 << 20, chunk=1)  # a filter naming 1M chunk ids
    with pytest.raises(wt.CorruptSampleError, match="chunks, at most 262144"):
        open_store(cfg).read_sample(gen, 1, skip=False)


@pytest.mark.parametrize("expires", ["soon", None, 1 << 62])
def test_mongo_forged_lease_does_not_stop_managers(mongo_cfg, mongo_server, expires):
    from mongo_server import RawClient
    cfg = mongo_cfg(swap_cap=SWAP_CAP)
    sealed(cfg)  # the store exists, its lease given back
    from wirehead_torch.config import resolve
    db = cfg["STORE"].rsplit("/", 1)[1]
    state = f"{resolve(cfg)['COLLECTION_PREFIX']}.state"
    doc = {"owner": 7, "pid": 1, "host": "elsewhere"}
    if expires is not None:
        doc["expires"] = expires
    with RawClient(mongo_server.uri) as rc:
        rc.command(db, {"update": state, "updates": [
            {"q": {"_id": "lease"}, "u": {"$set": doc}, "upsert": True}]})
    store = open_store(cfg)
    assert store.lead(), f"a lease with expires={expires!r} stopped the manager"


def test_mongo_refused_credentials_are_not_an_outage(mongo_server):
    uri = mongo_server.uri.replace("mongodb://", "mongodb://alice:pw@")
    cfg = {"STORE": f"{uri}/{whlib.unique_name('wha')}?authSource=admin", "SWAP_CAP": 4,
           "SAMPLE": ["x"], "CONNECT_TIMEOUT": 2}
    with pytest.raises(wt.WireheadError, match="credentials") as e:
        wt.status(cfg)
    assert not isinstance(e.value, wt.StoreUnavailableError)
    assert "pw" not in str(e.value).replace("password", "")


def test_stopped_lock_holder_delays_but_stops_no_manager(shm_cfg):
    """A process stopped while holding the segment's header lock (here: the
    lock word names this live test process) makes the manager wait
    LEASE_SECONDS at most per try and log the pid; it goes on sealing once
    the lock is let go, and the generator beside it keeps running."""
    cfg = shm_cfg(swap_cap=SWAP_CAP, LEASE_SECONDS=1)
    procs = [whlib.spawn("gen", cfg, 1), whlib.spawn("manager", cfg)]
    mgr_p = procs[1]
    try:
        for p in procs:
            whlib.wait_line(p.stderr, "STARTED", 60)
        whlib.until(lambda: wt.status(cfg)["seals"] >= 1, 60, "the first seal")
        with whlib.header_lock_held(cfg) as me:
            whlib.wait_line(mgr_p.stderr, f"held by pid {me}", 60)
            seals = wt.status(cfg)["seals"]  # status does not wait for the lock
            whlib.assert_alive(procs, "while the lock was held")
        whlib.until(lambda: wt.status(cfg)["seals"] > seals, 60, "a seal after the release")
        whlib.assert_alive(procs, "after the lock was let go")
    finally:
        codes = [whlib.stop(p) for p in procs]
    assert codes == [0, 0], f"SIGTERM exit codes {codes}"
