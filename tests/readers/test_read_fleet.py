"""Readers outlast any generator fleet: 32 self-sealing generators against
one starved reader of each kind (nice 5, on the same CPU as the whole
fleet), so every copy the reader makes is slow enough to lose the race with
reclamation again and again. No exception may reach the reader's loop, and
every sample it gets is its own (checked against its id).

WH_FLEET_SECONDS (default 2) is each reader's time; WH_FLEET_FLOATS (default
64Ki: 256 KiB samples) the sample size, e.g. WH_FLEET_SECONDS=300
WH_FLEET_FLOATS=2097152 for 8 MiB samples for 5 minutes by hand."""
import json
import os
import subprocess
import sys
import threading
import time

import pytest

import whlib

GENERATORS = 32
FLEET_PROCS = 4  # the 32 generators run as threads of these processes
SECONDS = float(os.environ.get("WH_FLEET_SECONDS", "2"))
FLOATS = int(os.environ.get("WH_FLEET_FLOATS", str(64 << 10)))
SWAP_CAP = 4
STARVE_NICE = 5  # the reader gets a third of a fleet process's CPU share
FIRST_ITEM_S = 60  # how long past SECONDS a reader may take to its first item


def fleet_cfg():
    # room for every generator's put in flight besides a full generation
    sample_bytes = FLOATS * 4 + 16 + 1024
    # not the default prefix: a module's store outlives each test
    return {"STORE": f"shm://{whlib.unique_name('whfleet')}", "SWAP_CAP": SWAP_CAP,
            "SAMPLE": ["id", "data"], "READ_TIMEOUT": 60, "LEASE_SECONDS": 5,
            "SELF_SEAL": True,
            "BYTE_BUDGET": (SWAP_CAP + GENERATORS) * sample_bytes + (1 << 20)}


def one_cpu():
    return min(os.sched_getaffinity(0))


def run_fleet(cfg, first_tag, threads, floats):
    """Child: `threads` self-sealing generators (threads of this process)
    until stdin closes."""
    import wirehead_torch as wt
    os.sched_setaffinity(0, {one_cpu()})
    stop = threading.Event()

    def gen(tag):
        counter = 0
        while not stop.is_set():
            yield whlib.sample(tag, counter, floats)
            counter += 1

    def run(tag):
        g = wt.WireheadGenerator(gen(tag), config=cfg, quiet=True)
        while not stop.is_set() and g.cycle():
            pass

    ts = [threading.Thread(target=run, args=(first_tag + i,), daemon=True)
          for i in range(threads)]
    for t in ts:
        t.start()
    print("STARTED", file=sys.stderr, flush=True)
    sys.stdin.read()  # the test closes it to stop the fleet
    stop.set()
    for t in ts:
        t.join(30)


KINDS = ["map", "map_views", "iterable", "iterable_views", "dataloader", "loader"]


def read_kind(kind, cfg, seconds, wt, torch):
    """Reads with one reader of `kind` for `seconds`: {items, error, ...}."""
    out = {"items": 0, "error": None, "gone": None}
    t0 = time.monotonic()
    deadline = t0 + seconds

    def going():
        # SECONDS of reading, and at least until a first item (a starved
        # DataLoader's workers can take seconds just to start), bounded
        now = time.monotonic()
        return now < deadline or (out["items"] == 0 and now < deadline + FIRST_ITEM_S)

    def check(ident, data):
        whlib.check_sample(ident.numpy(), data.numpy())
        out["items"] += 1
        out.setdefault("first_item_s", round(time.monotonic() - t0, 3))

    try:
        if kind in ("map", "map_views"):
            ds = wt.MongoTupleheadDataset(config=cfg, views=kind == "map_views")
            held = None
            i = 0
            while going():
                x, y = ds[i % SWAP_CAP]
                check(x, y)
                held = (x, y)  # a training step keeps its batch until the next
                i += 1
            del held
        elif kind in ("iterable", "iterable_views", "dataloader"):
            ds = wt.WireheadIterableDataset(config=cfg, views=kind == "iterable_views")
            it = (torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
                  if kind == "dataloader" else ds)
            while going():
                for item in it:
                    check(item["id"], item["data"])
                    if not going():
                        break
        elif kind == "loader":
            ld = wt.WireheadLoader(config=cfg, batch_size=2, num_threads=2)
            try:
                while going():
                    for b in ld:
                        for r in range(b["id"].shape[0]):
                            check(b["id"][r], b["data"][r])
                        if not going():
                            break
                out["gone"] = ld.stats().get("gone")
            finally:
                ld.close()
    except BaseException as e:  # noqa: BLE001 - reported to the test
        out["error"] = f"{type(e).__name__}: {e}"
    out["read_s"] = round(time.monotonic() - t0, 3)
    return out


def read_all(cfg, seconds, kinds):
    """Child: one starved reader of each kind in turn, `seconds` each;
    prints RESULT {kind: result}. One process: its start is slow under
    load."""
    import faulthandler
    faulthandler.dump_traceback_later(len(kinds) * (seconds + FIRST_ITEM_S + 60), exit=True)  # a hang says where
    import torch

    import wirehead_torch as wt
    # after the imports: a starved import would take minutes
    os.sched_setaffinity(0, {one_cpu()})
    os.nice(STARVE_NICE)
    res = {kind: read_kind(kind, cfg, seconds, wt, torch) for kind in kinds}
    print("RESULT " + json.dumps(res), flush=True)


def spawn_self(*args):
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *map(str, args)],
                            env=whlib.env_for_child(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def fleet_reads(cfg, generators, fleet_procs, floats, kinds):
    """A fleet of `generators`, and what one starved reader of each kind got
    meanwhile: ({kind: result}, seals during the reads)."""
    per = generators // fleet_procs
    procs = [spawn_self("fleet", json.dumps(cfg), 100 + k * per, per, floats)
             for k in range(fleet_procs)]
    try:
        for p in procs:
            whlib.wait_line(p.stderr, "STARTED", 120)
        store = whlib.open_store(cfg)
        seals0 = store.status()["seals"]
        whlib.until(lambda: store.status()["seals"] >= seals0 + 3, 120, "the fleet's first seals")
        seals0 = store.status()["seals"]
        r = spawn_self("read", json.dumps(cfg), SECONDS, ",".join(kinds))
        try:
            out, err = r.communicate(timeout=len(kinds) * (SECONDS + FIRST_ITEM_S + 60) + 60)
        except subprocess.TimeoutExpired:
            whlib.stop(r)
            raise
        res = None
        for line in out.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[len("RESULT "):])
        assert res is not None, f"the reader died: {err[-2000:]}"
        return res, store.status()["seals"] - seals0
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                whlib.stop(p)


@pytest.fixture(scope="module")
def shm_fleet():
    import wirehead_torch as wt
    cfg = fleet_cfg()
    try:
        yield fleet_reads(cfg, GENERATORS, FLEET_PROCS, FLOATS, KINDS)
    finally:
        wt.clean(cfg)


MONGO_KINDS = ["map", "iterable", "dataloader", "loader"]  # no views on MongoDB
MONGO_GENERATORS = 8  # the test server shares the CPUs


@pytest.fixture(scope="module")
def mongo_fleet(mongo_server):
    import wirehead_torch as wt
    cfg = {**fleet_cfg(), "STORE": f"{mongo_server.uri}/{whlib.unique_name('whm')}",
           "CONNECT_TIMEOUT": 10}
    cfg.pop("BYTE_BUDGET")
    try:
        yield fleet_reads(cfg, MONGO_GENERATORS, 2, 4096, MONGO_KINDS)
    finally:
        wt.clean(cfg)


def check_reads(res, seals, kind):
    print(f"{kind}: {res[kind]}, {seals} seals during all reads")
    assert res[kind]["error"] is None, f"reader {kind}: {res[kind]['error']}"
    assert res[kind]["items"] > 0
    # the fleet kept sealing while the readers read: there were races to lose
    assert seals > 2 * len(res)


@pytest.mark.parametrize("kind", MONGO_KINDS)
def test_mongo_reader_outlasts_a_fleet(mongo_fleet, kind):
    check_reads(*mongo_fleet, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_starved_reader_outlasts_32_generators(shm_fleet, kind):
    check_reads(*shm_fleet, kind)


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "fleet":
        run_fleet(json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                  int(sys.argv[5]))
    elif role == "read":
        read_all(json.loads(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split(","))
