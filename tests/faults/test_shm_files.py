"""Files the project makes in /dev/shm (the shm store's segment, the batch
ring's control and slot files) when another user got there first, and ring
files damaged while a run uses them.

Another uid (65534, through setpriv; these tests run as root, as the
project's other namespace tests do) plants a symlink to a file of ours, or
a file of its own with mode 0666, at each path before the reader or
DataLoader starts. Each scenario runs in a child in a private mount
namespace on a fresh tmpfs at /dev/shm (mode 1777, as /dev/shm is), so the
host's /dev/shm is never touched: the run must refuse with an error naming
the path, and neither the link's target nor the planted file may change.
A truncated ring file, or garbage in a slot's seal or extras (in its rows
too with HANDOVER_CHECK: rows), must be an error naming the file, never a
SIGBUS (a child killed by a signal fails the test) and never data."""
import gc
import json
import os
import pickle
import subprocess
import sys

import pytest

import whlib

pytestmark = pytest.mark.asan  # the children inherit the sanitizer build's environment

ATTACKER = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
PLANTED = b"planted by uid 65534\n"
VICTIM = b"a file of the trainer's user\n" * 4
SWAP_CAP = 8


# --- the parent: one child per scenario -----------------------------------

def child(*args, private=True):
    """Runs this file's main() with args; its JSON result."""
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    if private:
        cmd = ["unshare", "-m", "sh", "-c",
               'mount -t tmpfs -o mode=1777,size=256m tmpfs /dev/shm && exec "$@"', "sh", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=whlib.env_for_child())
    assert r.returncode == 0, f"child exit {r.returncode} (-7: SIGBUS)\n{r.stdout}\n{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_refused(got, path_part, words):
    """Every run refused naming the path; nothing outside was written."""
    assert got["errors"], "the run did not refuse"
    name = os.path.basename(got["path"])
    if name.startswith("wirehead."):
        name = name[len("wirehead."):]  # the segment: named by its store
    for err in got["errors"]:
        assert name in err and path_part in got["path"], err
        assert any(w in err for w in words), err
    assert got["victim"] == VICTIM.decode() and got["victim_mtime_same"]
    assert got["planted"] in (None, PLANTED.decode())
    assert got["planted_kind"] == got["kind"]  # the planted link or file is still what it was


RING = ["w0", "w1", "w0.s0.v1", "wm", "wm.s0.v1"]


@pytest.mark.parametrize("kind", ["link", "file"])
@pytest.mark.parametrize("where", ["segment"] + RING)
def test_planted_path_is_refused_and_nothing_outside_is_written(tmp_path, where, kind):
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    victim.chmod(0o600)
    got = child("plant", where, kind, str(victim))
    why = {"link": ["symbolic link"], "file": ["uid 65534", "mode 666"]}[kind]
    if where == "segment":
        # the segment: by the generator that would make it and a reader
        assert len(got["errors"]) == 2
        why = why + ["Too many levels of symbolic links"]
    check_refused(got, where.replace("segment", "wirehead."), why)
    if kind == "file":
        assert got["planted_mode"] == 0o666 and got["planted_uid"] == 65534
    # the kernel's own guards were off or on; the refusal does not rely on them
    assert set(got["sysctl"]) == {"protected_symlinks", "protected_regular"}


def test_truncated_slot_at_hand_over_is_an_error_naming_it():
    got = child("trunc-slot-main", private=False)
    assert "holds 0 bytes" in got["error"] and got["path"] in got["error"]
    assert got["other_ok"] and got["slot_free"]


def test_truncated_slot_before_a_copy_is_an_error_naming_it():
    got = child("trunc-slot-worker", private=False)
    assert "holds 0 bytes" in got["error"] and got["path"] in got["error"]
    assert "truncated" in got["error"]


def test_truncated_control_file_is_an_error_naming_it():
    got = child("trunc-control", private=False)
    for err, path in zip(got["errors"], got["paths"]):
        assert "holds 0 bytes" in err and path in err, err


def test_garbage_in_a_slot_is_an_error_naming_it_not_data():
    """HANDOVER_CHECK: rows re-hashes every row at hand-over: a row changed
    after its worker filled it is refused."""
    got = child("garbage-rows", private=False)
    assert got["path"] in got["error"] and "XXH3" in got["error"]
    assert got["other_ok"] and got["slot_free"]


def test_garbage_in_a_slots_seal_is_an_error_by_default():
    """The default hand-over check reads the slot's seal (header and row
    table, against the handle's XXH3 of it): damage there is refused."""
    for what in ("garbage-seal", "garbage-seal-header"):
        got = child(what, private=False)
        assert got["path"] in got["error"] and "does not hold the batch" in got["error"], got
        assert got["other_ok"] and got["slot_free"]


def test_garbage_in_a_row_passes_the_default_check():
    """What the default trades for one pass per byte (docs/guarantees.md):
    a row changed in the slot after its worker's checked copy is not read
    again at hand-over, so the change comes through."""
    got = child("garbage", private=False)
    assert got["error"] == "no error" and got["garbage_seen"], got
    assert got["other_ok"]


def test_garbage_in_a_batchs_extras_is_an_error_too():
    got = child("garbage-tail", private=False)
    assert got["path"] in got["error"] and "XXH3" in got["error"]
    assert got["other_ok"] and got["slot_free"]


def test_verify_reads_off_checks_no_bytes_at_hand_over():
    """VERIFY_READS: false checks no checksum on reads, and none at the
    ring's hand-over either: the changed bytes come through (what the key
    trades for speed, docs/config.md)."""
    got = child("garbage-unverified", private=False)
    assert got["error"] == "no error" and got["garbage_seen"], got
    assert got["other_ok"]


def test_shared_map_refuses_what_is_not_ours(tmp_path):
    """The binding itself: a link, another mode, a short file; what is
    refused keeps its bytes."""
    import wirehead_torch as wt
    target = tmp_path / "target"
    target.write_bytes(VICTIM)
    link = tmp_path / "link"
    link.symlink_to(target)
    for how in ("open", "create", "region"):
        with pytest.raises(OSError, match=f"{link} is a symbolic link: refused"):
            wt._C.SharedMap(str(link), 64, how=how)
    loose = tmp_path / "loose"
    loose.write_bytes(bytes(64))
    loose.chmod(0o644)
    with pytest.raises(OSError, match=f"{loose} has mode 644, not 0600"):
        wt._C.SharedMap(str(loose), 64, how="region")
    assert target.read_bytes() == VICTIM and loose.read_bytes() == bytes(64)
    region = str(tmp_path / "region")
    held = wt._C.SharedMap(region, 64, how="region")
    with pytest.raises(BlockingIOError, match="held by another live process"):
        wt._C.SharedMap(region, 64, how="region")  # the lock of a live region
    held.unlock()
    wt._C.SharedMap(region, 64, how="region").store(0, 1)
    with pytest.raises(OSError, match="holds 64 bytes, 128 expected"):
        wt._C.SharedMap(region, 128, how="region")
    with pytest.raises(ValueError, match="how must be"):
        wt._C.SharedMap(region, 64, how="append")


# --- the child ------------------------------------------------------------

def _cfg():
    name = whlib.unique_name("shmfiles")
    return {"STORE": f"shm://{name}", "SWAP_CAP": SWAP_CAP, "SAMPLE": ["id", "data"],
            "READ_TIMEOUT": 10, "LEASE_SECONDS": 5, "SELF_SEAL": False, "BYTE_BUDGET": "2MiB"}


def _filled(cfg):
    import wirehead_torch as wt
    assert wt.WireheadGenerator((whlib.sample(1, i) for i in range(SWAP_CAP)),
                                config=cfg).run() == SWAP_CAP
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1


def _plant(path, kind, victim):
    if kind == "link":
        cmd = ["ln", "-s", victim, path]
    else:
        cmd = ["sh", "-c", f"printf 'planted by uid 65534\\n' > '{path}' && chmod 0666 '{path}'"]
    subprocess.run(ATTACKER + cmd, check=True)


def _state(path, kind, victim, vstat):
    st = os.lstat(path)
    planted = None
    if kind == "file":
        with open(path, "rb") as f:
            planted = f.read().decode()
    with open(victim, "rb") as f:
        vbytes = f.read().decode()
    now = os.stat(victim)
    return {"planted": planted, "planted_mode": st.st_mode & 0o7777, "planted_uid": st.st_uid,
            "planted_kind": "link" if os.path.islink(path) else "file", "victim": vbytes,
            "victim_mtime_same": (now.st_mtime_ns, now.st_size) == (vstat.st_mtime_ns,
                                                                   vstat.st_size)}


def _sysctls():
    out = {}
    for k in ("protected_symlinks", "protected_regular"):
        with open(f"/proc/sys/fs/{k}") as f:
            out[k] = int(f.read())
    return out


def _plant_case(where, kind, victim):
    import torch

    import wirehead_torch as wt
    from wirehead_torch import _ring
    cfg = _cfg()
    vstat = os.stat(victim)
    errors = []
    if where == "segment":
        path = f"/dev/shm/wirehead.{cfg['STORE'][len('shm://'):]}"
        _plant(path, kind, victim)
        for run in (lambda: wt.WireheadGenerator(iter([whlib.sample(1, 0)]), config=cfg).run(),
                    lambda: wt.MongoheadDataset(config=cfg)[0]):
            try:
                run()
            except Exception as e:  # reported to the parent
                errors.append(f"{type(e).__name__}: {e}")
        ds = None
    else:
        _filled(cfg)
        region, _, slot = where.partition(".")
        if region == "wm":
            ds = wt.MongoheadDataset(config=cfg, batches=True)
            run = lambda: ds[[0, 1]]  # noqa: E731 (in-process: region "m")
        else:
            ds = wt.WireheadIterableDataset(config=cfg, batch_size=4, num_workers=2,
                                            batches=True)
            run = lambda: list(torch.utils.data.DataLoader(  # noqa: E731
                ds, batch_size=None, num_workers=2, timeout=120))
        path = _ring.region_path(os.getpid(), ds._batch_ring.token, region[1:])
        path += f".{slot}" if slot else ""
        _plant(path, kind, victim)
        try:
            run()
        except Exception as e:  # reported to the parent
            errors.append(f"{type(e).__name__}: {e}")
    out = {"path": path, "kind": kind, "errors": errors, "sysctl": _sysctls(),
           **_state(path, kind, victim, vstat)}
    ds = run = None  # the ring's files go with the dataset
    gc.collect()
    return out


class _Handles:
    """A map-style reader whose DataLoader workers send each ring handle
    pickled, with its arguments: the test opens it when it likes."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, indices):
        h = self.ds[indices]
        return h.handle, pickle.dumps(h)


def _handles(ds, n):
    """n handles made by one DataLoader worker (which has exited since)."""
    import torch
    from torch.utils.data import BatchSampler, SequentialSampler
    dl = torch.utils.data.DataLoader(
        _Handles(ds), batch_size=None, num_workers=1, timeout=120,
        sampler=BatchSampler(SequentialSampler(range(SWAP_CAP)), 2, False))
    return list(dl)[:n]


def _slot_path(h):
    from wirehead_torch import _ring
    return f"{_ring.region_path(h.main_pid, h.token, h.worker)}.s{h.slot}.v{h.version}"


def _owner(h):
    """Owner word of a handle's slot (0: free)."""
    from wirehead_torch import _ring
    return _ring._MAIN[(h.main_pid, h.token, h.worker)].word(h.slot, _ring._OWNER)


def _rows_ok(b, indices):
    ids, data = b["input"], b["label"]
    for ident, row, index in zip(ids, data, indices):
        _, counter = whlib.check_sample(ident.numpy(), row.numpy())
        assert counter == index
    return True


def _damage_case(what):
    import wirehead_torch as wt
    cfg = _cfg()
    if what == "garbage-unverified":
        cfg["VERIFY_READS"] = False
    if what == "garbage-rows":
        cfg["HANDOVER_CHECK"] = "rows"
    try:
        return _damaged(what, cfg)
    finally:
        wt.clean(cfg)


def _damaged(what, cfg):
    import wirehead_torch as wt
    from wirehead_torch import _ring
    _filled(cfg)
    ds = wt.MongoheadDataset(config=cfg, batches=True)
    if what == "trunc-slot-worker":
        _rows_ok(ds[[0, 1]], [0, 1])  # region "m", slot 0 made and mapped
        gc.collect()
        path = _ring.region_path(os.getpid(), ds._batch_ring.token, "m") + ".s0.v1"
        os.truncate(path, 0)
        try:
            ds[[2, 3]]  # slot 0 again: its copy would fault on the truncated pages
            return {"error": "no error"}
        except OSError as e:
            return {"error": str(e), "path": path}
    if what == "trunc-control":
        (h, blob), (h2, blob2) = _handles(ds, 2)
        pickle.loads(blob2)  # the main process maps worker 0's control file
        gc.collect()
        errors, paths = [], []
        path = _ring.region_path(h.main_pid, h.token, h.worker)
        os.truncate(path, 0)
        try:
            pickle.loads(blob)
            errors.append("no error")
        except OSError as e:
            errors.append(str(e))
        paths.append(path)
        _ring._MAIN.clear()  # a fresh look at the file refuses it as well
        try:
            pickle.loads(blob)
            errors.append("no error")
        except OSError as e:
            errors.append(str(e))
        paths.append(path)
        _rows_ok(ds[[0, 1]], [0, 1])  # in-process: region "m"
        gc.collect()
        path = _ring.region_path(os.getpid(), ds._batch_ring.token, "m")
        os.truncate(path, 0)
        try:
            ds[[2, 3]]
            errors.append("no error")
        except OSError as e:
            errors.append(str(e))
        paths.append(path)
        return {"errors": errors, "paths": paths}
    (h, blob), (h2, blob2) = _handles(ds, 2)
    path = _slot_path(h)
    size = whlib.wire_words(h.wire)[whlib.WIRE_WORDS["hsize"]]  # the batch's bytes in the slot
    if what == "trunc-slot-main":
        os.truncate(path, 0)
        exc = OSError
    else:  # garbage: another process of this user, or a bug, wrote into the slot
        seal = (size + 63) // 64 * 64  # after the batch: 8 header words, the row table
        # in a row, in the extras after the rows (is_pad, generation, ...), in
        # the seal's row table (the first row's stored XXH3) or its header (pid)
        at, n = {"garbage-tail": (size - 8, 8), "garbage-seal": (seal + 64 + 16, 8),
                 "garbage-seal-header": (seal + 8, 8)}.get(what, (100, 64))
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(b"\xa5" * n)
        exc = RuntimeError
    out = {"path": path}
    try:
        batch = pickle.loads(blob)
        out["error"] = "no error"
        out["garbage_seen"] = b"\xa5" * 64 in b"".join(t.numpy().tobytes() for t in batch.values())
        del batch
    except exc as e:
        out["error"] = str(e)
    out["slot_free"] = _owner(h) == 0  # back to its worker, not lost
    out["other_ok"] = _rows_ok(pickle.loads(blob2), [2, 3])
    return out


def main():
    what = sys.argv[1]
    if what == "plant":
        out = _plant_case(*sys.argv[2:5])
    else:
        out = _damage_case(what)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
