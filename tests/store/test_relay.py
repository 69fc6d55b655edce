"""The node-local tier: a relay copies each generation sealed in MongoDB
into the node's shm store (LOCAL_CACHE), and every reader reads that copy.

Checked here: every byte of every sample read through the tier; disjoint
positions for 2 ranks x 2 workers, and for 3 nodes x 2 ranks x 2 workers; a relay SIGKILLed at random instants
while a reader reads (no torn or wrong sample, the next relay resumes with
the newest generation); the MongoDB server restarted mid-pull; a
generation reclaimed in MongoDB mid-copy; start order (readers, then relay,
then generators); one relay per node; a copy serves only the store it
mirrors (two databases given one LOCAL_CACHE name, a plain shm store)."""
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import wirehead_torch as wt
from wirehead_torch import _reader
from wirehead_torch._arrays import to_store_arrays
from wirehead_torch.admin import local_status
from wirehead_torch.apps import cli
from wirehead_torch.config import ConfigError, local_cache_uri, local_origin, resolve, store_kwargs

import whlib

SWAP_CAP = 8
N = 4096  # floats per sample: 16 KiB of data


@pytest.fixture
def relay_cfg(mongo_server, tmp_path):
    """make(**extra) -> (config dict, its YAML file) for a fresh MongoDB store
    with its own LOCAL_CACHE; both removed afterwards."""
    made = []

    def make(**extra):
        cfg = {"STORE": f"{mongo_server.uri}/{whlib.unique_name('whm')}", "SWAP_CAP": SWAP_CAP,
               "SAMPLE": ["id", "data"], "LEASE_SECONDS": 5, "SELF_SEAL": False,
               "CONNECT_TIMEOUT": 10, "READ_TIMEOUT": 60,
               "LOCAL_CACHE": f"shm://{whlib.unique_name('whrelay')}", **extra}
        path = tmp_path / f"cfg{len(made)}.yaml"
        path.write_text(json.dumps(cfg))  # JSON is YAML
        made.append(cfg)
        return cfg, str(path)

    yield make
    for cfg in made:
        try:
            wt.clean(cfg)
        except wt.SchemaMismatchError:  # its LOCAL_CACHE holds another config's copy
            wt.clean(dict(cfg, LOCAL_CACHE=None))
        try:  # a SIGKILLed relay leaves its lock file (a clean exit removes it)
            os.unlink(f"/dev/shm/wirehead-relay.{cfg['LOCAL_CACHE'][6:]}.lock")
        except FileNotFoundError:
            pass


def _local(cfg):
    """A raw handle on the node-local copy, opened as its store's copy (a
    plain handle is refused: only the relay writes a copy)."""
    return wt._C.Store(**store_kwargs(resolve(cfg), local=True))


def _feed(store, tag, n=N):
    """Fills MongoDB's write generation with samples tagged tag and seals it."""
    assert store.lead()
    for i in range(SWAP_CAP):
        status, _gen = store.put(to_store_arrays(whlib.sample(tag, i, n), ("id", "data")))
        assert status == 0
    info = store.seal()
    assert info and info.get("generation"), info
    return info["generation"]


def _relay_proc(path, *args):
    return subprocess.Popen([sys.executable, "-m", "wirehead_torch.apps.cli", "relay",
                             "--config", path, *args], env=whlib.env_for_child(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.asan
def test_every_byte_read_through_the_tier(relay_cfg):
    cfg, _ = relay_cfg()
    src = whlib.open_store(cfg)
    relay = wt.WireheadRelay(config=cfg)
    try:
        pulled = 0
        for tag in (1, 2, 3):
            gen = _feed(src, tag)
            info = relay.step()
            assert info["generation"] == gen and info["samples"] == SWAP_CAP
            pulled += info["bytes"]
            local = _local(cfg)
            assert local.current() == gen  # same generation number
            # every position holds the same encoded sample: same arrays, same bytes
            for pos in range(SWAP_CAP):
                a = [np.from_dlpack(x) for x in src.read(gen, pos)]
                b = [np.from_dlpack(x) for x in local.read(gen, pos)]
                for x, y in zip(a, b):
                    assert x.dtype == y.dtype and x.shape == y.shape
                    assert x.tobytes() == y.tobytes()
                assert whlib.check_sample(b[0], b[1]) == (tag, pos)
            local.close()
        # a newer generation sealed in MongoDB but not relayed yet: readers
        # still read the local copy's newest
        newer = _feed(src, 4)
        assert newer > gen
        ds = wt.MongoheadDataset(config=cfg, timeout=5)
        seen = [ds[i] for i in range(SWAP_CAP)]
        for pos, item in enumerate(seen):
            assert whlib.check_sample(item["input"].numpy(), item["label"].numpy()) == (3, pos)
        ld = wt.WireheadLoader(config=cfg, batch_size=4, num_threads=2)
        got = []
        for b in ld:
            assert set(b["generation"].tolist()) == {gen}
            for ident, data in zip(b["id"], b["data"]):
                got.append(whlib.check_sample(ident.numpy(), data.numpy()))
        assert sorted(got) == [(3, p) for p in range(SWAP_CAP)]
        ld.close()
        dl = wt.DataLoader(wt.WireheadIterableDataset(config=cfg, shuffle=False), batch_size=4,
                           num_workers=2)
        got = []
        for b in dl:
            assert set(b["generation"].tolist()) == {gen}
            got += [whlib.check_sample(i.numpy(), d.numpy()) for i, d in zip(b["id"], b["data"])]
        assert sorted(got) == [(3, p) for p in range(SWAP_CAP)]
        # observability: what the relay pulled, and the lag behind MongoDB
        st = wt.status(config=cfg)["local_cache"]
        assert st["read_gen"] == gen and st["lag_generations"] == 1
        assert st["relay"]["generations"] == 3 and st["relay"]["bytes"] == pulled
        assert pulled >= 3 * SWAP_CAP * N * 4
        from wirehead_torch.apps.cli import _fmt_status
        text = _fmt_status(wt.status(config=cfg))
        assert "3 generations mirrored" in text and "1 behind MongoDB's newest" in text, text
        assert relay.step()["generation"] == newer
        assert wt.status(config=cfg)["local_cache"]["lag_generations"] == 0
    finally:
        relay.close()
        src.close()


def test_ranks_and_workers_read_disjoint_positions(relay_cfg):
    import torch
    cfg, _ = relay_cfg()
    src = whlib.open_store(cfg)
    relay = wt.WireheadRelay(config=cfg)
    try:
        gen = _feed(src, 5)
        assert relay.step()["generation"] == gen
        items = {}
        for rank in range(2):
            ds = wt.WireheadIterableDataset(config=cfg, batch_size=1, num_workers=2, rank=rank,
                                            world_size=2, seed=3)
            dl = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=2)
            items[rank] = []
            for b in dl:
                tag, counter = whlib.check_sample(b["id"][0].numpy(), b["data"][0].numpy())
                assert int(b["generation"][0]) == gen and tag == 5
                assert counter == int(b["position"][0])  # the position means the same sample
                if not bool(b["is_pad"][0]):
                    items[rank].append(counter)
        assert not set(items[0]) & set(items[1]), items
        assert sorted(items[0] + items[1]) == list(range(SWAP_CAP))
        assert len(items[0]) == len(items[1]) == SWAP_CAP // 2
    finally:
        relay.close()
        src.close()


def test_three_nodes_two_ranks_two_workers(relay_cfg):
    """3 nodes (a LOCAL_CACHE and a relay each) x 2 ranks x 2 DataLoader
    workers: every rank reads its node's copy, no sample of the generation
    is read twice across the 6 ranks, together they read it all, and every
    rank takes the same number of steps."""
    import torch
    cap = 12
    cfg, _ = relay_cfg(SWAP_CAP=cap)
    nodes = [dict(cfg, LOCAL_CACHE=f"shm://{whlib.unique_name('whnode')}") for _ in range(3)]
    src = whlib.open_store(cfg)
    relays = []
    try:
        assert src.lead()
        for i in range(cap):
            assert src.put(to_store_arrays(whlib.sample(6, i, N), ("id", "data")))[0] == 0
        gen = src.seal()["generation"]
        for node in nodes:
            relays.append(wt.WireheadRelay(config=node))
            assert relays[-1].step()["generation"] == gen
        read, steps = {}, {}
        for k, node in enumerate(nodes):
            for local_rank in range(2):
                rank = 2 * k + local_rank
                ds = wt.WireheadIterableDataset(config=node, batch_size=1, num_workers=2,
                                                rank=rank, world_size=6, seed=11)
                read[rank], steps[rank] = [], 0
                for b in torch.utils.data.DataLoader(ds, batch_size=1, num_workers=2):
                    steps[rank] += 1
                    tag, counter = whlib.check_sample(b["id"][0].numpy(),
                                                      b["data"][0].numpy())
                    assert (int(b["generation"][0]), tag) == (gen, 6)
                    assert counter == int(b["position"][0])
                    if not bool(b["is_pad"][0]):
                        read[rank].append(counter)
        every = [c for r in read.values() for c in r]
        assert sorted(every) == list(range(cap)), read  # each once, all of them
        assert len(set(steps.values())) == 1, steps
    finally:
        for r in relays:
            r.close()
        src.close()
        for node in nodes:
            wt.clean(node)
            try:
                os.unlink(f"/dev/shm/wirehead-relay.{node['LOCAL_CACHE'][6:]}.lock")
            except FileNotFoundError:
                pass


@pytest.mark.asan
def test_generation_reclaimed_mid_copy_is_abandoned_for_the_newest(relay_cfg):
    cfg, _ = relay_cfg()
    src = whlib.open_store(cfg)
    relay = wt.WireheadRelay(config=cfg)
    try:
        first = _feed(src, 1)
        relay.step()
        gens = [_feed(src, tag) for tag in (2, 3, 4)]  # MongoDB keeps the newest two
        local = relay._dst.get()
        with pytest.raises(wt.GenerationGoneError):
            local.pull_from(src, gens[0])
        # nothing changed locally: the old generation reads whole
        assert local.current() == first
        assert whlib.read_generation(local, first, SWAP_CAP) == [(1, p) for p in range(SWAP_CAP)]
        assert relay.step()["generation"] == gens[-1]
        assert whlib.read_generation(local, gens[-1], SWAP_CAP) == \
            [(4, p) for p in range(SWAP_CAP)]
    finally:
        relay.close()
        src.close()


@pytest.mark.once
def test_relay_killed_at_random_instants(relay_cfg):
    """SIGKILL at 20 random instants, mostly mid-copy, while a reader reads
    through the tier and generators keep sealing in MongoDB."""
    cfg, path = relay_cfg(SWAP_CAP=16)
    rng = random.Random(1234)
    feed = [whlib.spawn("gen", cfg, tag, 10 ** 9, 64 * 1024) for tag in (1, 2)]
    feed.append(whlib.spawn("manager", cfg))
    reader = None
    try:
        first = _relay_proc(path, "--max-generations", "1")
        assert first.wait(60) == 0, first.stderr.read()
        whlib.stop(first)
        reader = whlib.spawn("read", cfg, "loader", 10 ** 9)
        whlib.wait_line(reader.stderr, "READER", 60)
        local = _local(cfg)
        kills = mid = 0
        t0 = time.monotonic()
        while kills < 20:
            p = _relay_proc(path)
            whlib.wait_line(p.stderr, "fills", 30)
            time.sleep(rng.uniform(0.0, 0.4))  # a random instant, not a synchronisation
            whlib.stop(p, signal.SIGKILL)  # and closes its pipes
            kills += 1
            fill = local.status()["write_fill"]
            mid += 0 < fill < 16  # killed with a copy half done
            # the local copy reads whole at every instant a relay may die
            gen = local.current()
            got = whlib.read_generation(local, gen, 16)
            assert got is None or len(got) == 16
            assert time.monotonic() - t0 < 120
        assert mid >= 5, f"only {mid} of {kills} kills came mid-copy"
        assert reader.poll() is None, whlib.tail(reader.stderr)
        # the next relay resumes with MongoDB's newest generation
        src = whlib.open_store(cfg)
        newest = src.current()
        p = _relay_proc(path)
        try:
            whlib.until(lambda: local.current() >= newest, 60, "the relay to catch up")
        finally:
            whlib.stop(p)
        src.close()
        got = whlib.read_generation(local, local.current(), 16)
        assert got is None or len(got) == 16
        assert reader.poll() is None, whlib.tail(reader.stderr)
        local.close()
    finally:
        if reader is not None:
            whlib.stop(reader)
        for f in feed:
            whlib.stop(f)


@pytest.mark.once
def test_mongodb_restarted_mid_pull(tmp_path):
    """The server goes away right after a seal (the relay pulling it) and
    comes back empty: the local copy stays readable throughout, the relay
    outlives the outage, and it copies the first generation sealed after."""
    from mongo_server import MongoTestServer
    big = 256 * 1024  # 1 MiB samples: a pull takes a while
    with MongoTestServer() as srv:
        cfg = {"STORE": f"{srv.uri}/{whlib.unique_name('whm')}", "SWAP_CAP": SWAP_CAP,
               "SAMPLE": ["id", "data"], "LEASE_SECONDS": 5, "SELF_SEAL": False,
               "CONNECT_TIMEOUT": 5, "READ_TIMEOUT": 60,
               "LOCAL_CACHE": f"shm://{whlib.unique_name('whrelay')}"}
        path = tmp_path / "cfg.yaml"
        path.write_text(json.dumps(cfg))
        relay = _relay_proc(str(path))
        local = None
        try:
            src = whlib.open_store(cfg)
            first = _feed(src, 1, big)
            whlib.wait_line(relay.stderr, "fills", 30)
            local = _local(cfg)
            whlib.until(lambda: local.current() == first, 60, "the first copy")
            _feed(src, 2, big)
            src.close()
            srv.restart()  # the relay is pulling generation 2, or about to
            assert whlib.read_generation(local, local.current(), SWAP_CAP) is not None
            assert relay.poll() is None, whlib.tail(relay.stderr)
            src = whlib.open_store(cfg)  # the store made anew, as a generator would
            after = _feed(src, 3, N)
            src.close()
            whlib.until(lambda: local.current() == after, 90, "the copy after the restart")
            assert whlib.read_generation(local, after, SWAP_CAP) == \
                [(3, p) for p in range(SWAP_CAP)]
            assert relay.poll() is None, whlib.tail(relay.stderr)
        finally:
            whlib.stop(relay)
            if local is not None:
                local.close()
            wt.clean(cfg)


def test_readers_before_relay_before_generators(relay_cfg):
    cfg, path = relay_cfg()
    reader = whlib.spawn("read", cfg, "loader", SWAP_CAP)
    relay = feed = None
    try:
        said = "".join(whlib.wait_line(reader.stderr, "waiting", 60))
        assert "wirehead-torch relay --config FILE" in said, said
        assert local_cache_uri(cfg) in said
        relay = _relay_proc(path)
        whlib.wait_line(relay.stderr, "fills", 30)
        feed = [whlib.spawn("gen", cfg, 7, 10 ** 9, N), whlib.spawn("manager", cfg)]
        whlib.wait_line(reader.stderr, f"READ {SWAP_CAP}", 90)
        assert reader.wait(60) == 0, whlib.tail(reader.stderr)
    finally:
        for p in [reader, relay] + (feed or []):
            if p is not None:
                whlib.stop(p)


def test_one_relay_per_node(relay_cfg):
    cfg, path = relay_cfg()
    a = _relay_proc(path)
    b = c = None
    try:
        whlib.wait_line(a.stderr, "fills", 30)
        b = _relay_proc(path, "--no-wait")
        assert b.wait(30) == 2
        err = b.stderr.read()
        assert f"another relay (pid {a.pid})" in err, err
        c = _relay_proc(path)  # waits, and takes over when the first ends
        whlib.wait_line(c.stderr, "waiting to take over", 30)
        whlib.stop(a, signal.SIGKILL)
        whlib.wait_line(c.stderr, "fills", 30)
        # a relay that ends cleanly removes its lock file
        lock = f"/dev/shm/wirehead-relay.{cfg['LOCAL_CACHE'][6:]}.lock"
        assert os.path.exists(lock)
        assert whlib.stop(c) == 0
        assert not os.path.exists(lock)
    finally:
        for p in (a, b, c):
            if p is not None:
                whlib.stop(p)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_waiting_relay_takes_over_from_one_that_copied(relay_cfg, sig):
    """A relay that has copied (so holds the copy's lease) is stopped while
    another waits: the waiting one takes over and copies what comes next."""
    cfg, path = relay_cfg()
    src = whlib.open_store(cfg)
    a = _relay_proc(path)
    c = None
    try:
        whlib.wait_line(a.stderr, "fills", 30)
        first = _feed(src, 1)
        local = _local(cfg)
        whlib.until(lambda: local.current() == first, 60, "the first relay's copy")
        c = _relay_proc(path)
        whlib.wait_line(c.stderr, "waiting to take over", 30)
        a.send_signal(sig)
        # the log says why it ended, and how much it did
        whlib.wait_line(a.stderr, f"stopped ({sig.name}) after copying 1 generation;", 30)
        assert a.wait(30) == 0
        whlib.wait_line(c.stderr, "fills", 30)
        after = _feed(src, 2)
        whlib.until(lambda: local.current() == after or c.poll() is not None, 60,
                    "the second relay's copy")
        assert c.poll() is None, whlib.tail(c.stderr)
        assert whlib.read_generation(local, after, SWAP_CAP) == [(2, p) for p in range(SWAP_CAP)]
        local.close()
    finally:
        for p in (a, c):
            if p is not None:
                whlib.stop(p)
        src.close()


def test_local_cache_config():
    base = {"SWAP_CAP": 4, "SAMPLE": ["x"]}
    with pytest.raises(ConfigError, match="LOCAL_CACHE"):
        resolve(dict(base, STORE="shm://x", LOCAL_CACHE="auto"))
    with pytest.raises(ConfigError, match="LOCAL_CACHE"):
        resolve(dict(base, STORE="mongodb://h/db", LOCAL_CACHE="mongodb://h/other"))
    cfg = resolve(dict(base, STORE="mongodb://h/db", LOCAL_CACHE="auto"))
    names = set()
    old = os.environ.get("SLURMD_NODENAME")
    try:
        for node in ("node1", "node2"):
            os.environ["SLURMD_NODENAME"] = node
            names.add(local_cache_uri(cfg))
            assert node in local_cache_uri(cfg)
    finally:
        if old is None:
            os.environ.pop("SLURMD_NODENAME", None)
        else:
            os.environ["SLURMD_NODENAME"] = old
    assert len(names) == 2  # two "nodes" on one host keep apart
    other = resolve(dict(base, STORE="mongodb://h/db2", LOCAL_CACHE="auto"))
    assert local_cache_uri(other) != local_cache_uri(cfg)


def test_quiet_relay_and_its_figures_while_mongodb_is_unreachable(relay_cfg, caplog):
    """--quiet drops the line per copied generation, not the start line; a
    reader of the copy says when no relay runs on its node; a relay that
    cannot reach MongoDB says in its figures (so in status) that it lives
    and why it copies nothing."""
    cfg, path = relay_cfg()
    src = whlib.open_store(cfg)
    try:
        gen = _feed(src, 1)
        r = _relay_proc(path, "--quiet", "--max-generations", "1")
        assert r.wait(60) == 0
        err = r.stderr.read()
        assert "fills" in err and "generation #" not in err, err
        assert "stopped (max_generations=1) after copying 1 generation;" in err, err
        # by default only the first copied generation is said (the log shows
        # the relay works), then summaries; --verbose says each, as #N
        for n, args in ((2, ()), (3, ("--verbose",))):
            _feed(src, n)
            v = _relay_proc(path, *args, "--max-generations", "1")
            assert v.wait(60) == 0
            said = v.stderr.read()
            assert f"generation #{n}:" in said, said
            assert ("(the first; then a summary every" in said) == (not args), said
            assert str(gen)[:12] not in said, said  # no full ids in its lines
        fig = wt.relay.relay_figures(cfg)
        assert fig["local_gen"] == gen + 2, fig
        assert fig["bytes"] > 0
        # the relay has ended: a reader still reads the copy, and says so
        local = _local(cfg)
        _reader._relay_checked.clear()
        with caplog.at_level("WARNING", logger="wirehead_torch"):
            assert _reader.wait_for_generation(local, cfg, 10) == gen + 2
        local.close()
        said = caplog.text
        assert f"no relay runs on this node (the last one, pid {v.pid}, has ended)" in said, said
        assert f"generation #3 of its copy {cfg['LOCAL_CACHE']}" in said, said
        # a relay whose MongoDB is gone: nothing listens on the port (a copy
        # of its own: the one above mirrors another store)
        dead = dict(cfg, STORE=f"mongodb://127.0.0.1:{whlib.free_port()}/x", CONNECT_TIMEOUT=1,
                    LOCAL_CACHE=f"shm://{whlib.unique_name('whrelay')}")
        relay = wt.WireheadRelay(config=dead)
        t = threading.Thread(target=relay.run, daemon=True)
        t.start()
        try:
            whlib.until(lambda: (wt.relay.relay_figures(dead) or {}).get("last_error"), 60,
                        "the unreachable relay's figures")
            fig = wt.relay.relay_figures(dead)
            assert fig["running"] and fig["pid"] == os.getpid(), fig
            assert fig["generations"] == 0 and "127.0.0.1" in fig["last_error"], fig
            text = "\n".join(cli._fmt_local({"relay": fig, "store": cfg["LOCAL_CACHE"],
                                              "node": "n", "read_gen": 0,
                                              "lag_generations": 0, "readers": []}, {}))
            assert "relay error" in text and "retrying" in text, text
        finally:
            relay.stop()
            t.join(30)
            relay.close()
            for path in wt.relay.relay_files(dead["LOCAL_CACHE"]):  # its lock and figures
                if os.path.exists(path):
                    os.unlink(path)
            wt.clean({"STORE": dead["LOCAL_CACHE"], "SWAP_CAP": SWAP_CAP,
                      "SAMPLE": ["id", "data"]})
        assert not t.is_alive()
    finally:
        src.close()


SECRET = "hunter2pw"  # a password that must appear in no message


def _refused_naming(text, mine, theirs):
    assert "LOCAL_CACHE" in text and mine in text and theirs in text, text
    assert SECRET not in text and "alice" not in text, text


def test_a_copy_serves_only_the_store_it_mirrors(relay_cfg, mongo_server, tmp_path, capsys):
    """Two MongoDB databases given one explicit LOCAL_CACHE name: the copy
    records the first one's source; the second one's relay (while the
    first's runs) and its readers are refused naming both sources, never a
    password; the first one's readers read; status shows whose copy it is;
    clean --local-only removes the copy alone."""
    cfg_a, path_a = relay_cfg()
    cfg_b, path_b = relay_cfg(LOCAL_CACHE=cfg_a["LOCAL_CACHE"])  # another database
    host = mongo_server.uri[len("mongodb://"):]
    # the same second database, with credentials: nothing of it may show them
    cfg_s = dict(cfg_b, STORE=f"mongodb://alice:{SECRET}@{host}/{cfg_b['STORE'].rsplit('/', 1)[1]}"
                             f"?authSource=admin")
    path_s = tmp_path / "secret.yaml"
    path_s.write_text(json.dumps(cfg_s))
    name_a, name_b = local_origin(cfg_a)[1], local_origin(cfg_b)[1]
    assert name_a != name_b and local_origin(cfg_s)[1] == name_b
    assert local_origin(cfg_s)[0] == local_origin(cfg_b)[0]  # credentials name no other source
    src_a, src_b = whlib.open_store(cfg_a), whlib.open_store(cfg_b)
    relay_a = relay_b = None
    try:
        gen = _feed(src_a, 1)
        _feed(src_b, 2)
        relay_a = _relay_proc(path_a)
        whlib.wait_line(relay_a.stderr, "fills", 30)
        local = _local(cfg_a)
        whlib.until(lambda: local.current() == gen, 60, "the first store's copy")
        local.close()
        # the second relay is refused at once, not left waiting for the lock
        relay_b = _relay_proc(str(path_s))
        assert relay_b.wait(30) == 2
        _refused_naming(relay_b.stderr.read(), name_b, name_a)
        for reader in (lambda: wt.MongoheadDataset(config=cfg_s)[0],
                       lambda: next(iter(wt.WireheadLoader(config=cfg_s, batch_size=2)))):
            with pytest.raises(wt.SchemaMismatchError) as e:
                reader()
            _refused_naming(str(e.value), name_b, name_a)
        # the first store's readers read its samples
        item = wt.MongoheadDataset(config=cfg_a, output="numpy")[3]
        assert item["input"].tolist() == [1, 3], item
        ld = wt.WireheadLoader(config=cfg_a, batch_size=SWAP_CAP, shuffle=False)
        assert next(iter(ld))["id"].tolist() == [[1, p] for p in range(SWAP_CAP)]
        ld.close()
        # status: the copy's source, and a copy of another store said to be one
        loc = wt.status(cfg_a)["local_cache"]
        assert loc["source"] == name_a and not loc["foreign"] and loc["read_gen"] == gen, loc
        capsys.readouterr()
        assert cli.main(["status", "--config", path_a]) == 0
        assert f"source         {name_a}" in capsys.readouterr().out
        loc = wt.status(cfg_b)["local_cache"]
        assert loc["source"] == name_a and loc["foreign"] and loc["read_gen"] == 0, loc
        assert cli.main(["status", "--config", path_b]) == 0
        out = capsys.readouterr().out
        assert f"the copy of {name_a}, NOT of this config's {name_b}" in out, out
        # the test server takes no credentials: status's local lines of the secret config
        loc = local_status(resolve(cfg_s), 0)
        text = "\n".join(cli._fmt_local(loc, {})) + json.dumps(loc)
        assert name_a in text and name_b in text and SECRET not in text and "alice" not in text
        # once its relay has stopped, the copy alone is removed: MongoDB keeps its
        # data; and only as the copy of its own store: another store's clean
        # (--local-only or whole) is refused naming it, and removes nothing
        assert whlib.stop(relay_a) == 0
        copy = f"/dev/shm/wirehead.{cfg_a['LOCAL_CACHE'][6:]}"
        assert os.path.exists(copy)
        gen_b = wt.status(cfg_b)["read_gen"]
        for args in (["--local-only"], []):
            capsys.readouterr()
            assert cli.main(["clean", *args, "--config", path_b]) == 2
            err = capsys.readouterr().err
            assert err.startswith("wirehead-torch clean: nothing removed: ") and \
                f"is this node's copy of {name_a}, not of {name_b}" in err, err
            assert os.path.exists(copy) and wt.status(cfg_b)["read_gen"] == gen_b
        assert cli.main(["clean", "--local-only", "--config", path_a]) == 0
        assert "removed this node's copy" in capsys.readouterr().out
        assert not os.path.exists(copy)
        assert wt.status(cfg_a)["read_gen"] == gen
        # the second store's relay now makes the copy its own
        relay_b = _relay_proc(path_b)
        whlib.wait_line(relay_b.stderr, "fills", 30)
        whlib.until(lambda: wt.status(cfg_b)["local_cache"]["read_gen"], 60,
                    "the second store's copy")
        item = wt.MongoheadDataset(config=cfg_b, output="numpy")[5]
        assert item["input"].tolist() == [2, 5], item
        with pytest.raises(wt.SchemaMismatchError, match="this node's copy of"):
            wt.MongoheadDataset(config=cfg_a)[0]
    finally:
        for p in (relay_a, relay_b):
            if p is not None:
                whlib.stop(p)
        src_a.close()
        src_b.close()


def test_a_plain_store_is_no_copy(relay_cfg):
    """A plain shm store under the LOCAL_CACHE name records no source:
    neither a reader nor a relay takes it for a copy."""
    cfg, _path = relay_cfg()
    plain = whlib.open_store(dict(cfg, STORE=cfg["LOCAL_CACHE"], LOCAL_CACHE=None,
                                  BYTE_BUDGET=1 << 20))
    try:
        name = local_origin(cfg)[1]
        with pytest.raises(wt.SchemaMismatchError, match="records no source") as e:
            wt.MongoheadDataset(config=cfg)[0]
        assert name in str(e.value)
        relay = wt.WireheadRelay(config=cfg, wait=False)
        try:
            with pytest.raises(wt.SchemaMismatchError, match="records no source"):
                relay.run()
        finally:
            relay.close()
        loc = local_status(resolve(cfg), 0)
        assert loc["foreign"] and loc["source"] is None, loc
        assert "no source recorded" in "\n".join(cli._fmt_local(loc, {}))
    finally:
        plain.close()


def test_a_copy_is_written_only_by_its_relay(relay_cfg, tmp_path, capsys):
    """A config whose plain STORE names a relay's copy (another job's
    `STORE: shm://X`, X a LOCAL_CACHE) is refused by every participant --
    generator, manager, reader, status, clean -- naming the copy and the
    store it mirrors, and changes nothing: the store's readers read its
    samples and its next relay copies on. One MongoDB server named another
    way (localhost for 127.0.0.1) is refused, saying that is the
    difference."""
    cfg, _path = relay_cfg()
    src = whlib.open_store(cfg)
    relays = [wt.WireheadRelay(config=cfg, quiet=True)]
    try:
        gen = _feed(src, 1)
        assert relays[0].run(max_generations=1) == 1  # then stops, between runs
        relays[0].close()
        copy = f"/dev/shm/wirehead.{cfg['LOCAL_CACHE'][6:]}"
        name = local_origin(cfg)[1]
        plain = {"STORE": cfg["LOCAL_CACHE"], "SWAP_CAP": SWAP_CAP, "SAMPLE": ["id", "data"],
                 "READ_TIMEOUT": 5}
        path = tmp_path / "plain.yaml"
        path.write_text(json.dumps(plain))
        said = f"shm store '{cfg['LOCAL_CACHE'][6:]}' is this node's copy of {name}"
        for use in (lambda: wt.WireheadGenerator((whlib.sample(200, i, N)
                                                  for i in range(SWAP_CAP)),
                                                 config=plain, quiet=True).run(),
                    lambda: wt.WireheadManager(config=plain, quiet=True).run(max_swaps=1),
                    lambda: wt.MongoheadDataset(config=plain)[0],
                    lambda: wt.status(plain)):
            with pytest.raises(wt.SchemaMismatchError) as e:
                use()
            assert said in str(e.value) and "only that relay writes it" in str(e.value), e.value
        capsys.readouterr()
        assert cli.main(["clean", "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"nothing removed: {said}" in err and "--local-only" in err, err
        assert os.path.exists(copy)
        # the copy is as its relay left it, and nothing holds its lease
        assert _local(cfg).current() == gen
        item = wt.MongoheadDataset(config=cfg, output="numpy")[3]
        assert item["input"].tolist() == [1, 3], item
        after = _feed(src, 2)
        relays.append(wt.WireheadRelay(config=cfg, quiet=True))
        assert relays[-1].run(max_generations=1) == 1
        assert whlib.read_generation(_local(cfg), after, SWAP_CAP) == \
            [(2, p) for p in range(SWAP_CAP)]
        # the same server, its host written another way: still another source
        port = cfg["STORE"].split("/")[2].rsplit(":", 1)[1]
        assert cfg["STORE"].startswith(f"mongodb://127.0.0.1:{port}/")
        other = dict(cfg, STORE=cfg["STORE"].replace("127.0.0.1", "localhost", 1))
        with pytest.raises(wt.SchemaMismatchError) as e:
            wt.MongoheadDataset(config=other)[0]
        assert (f"differ only in how the hosts are written (127.0.0.1:{port} in the copy, "
                f"localhost:{port} here)") in str(e.value), e.value
    finally:
        for r in relays:
            r.close()
        src.close()


def test_clean_of_a_local_cache_never_removes_a_plain_store(shm_cfg, tmp_path, capsys):
    """A LOCAL_CACHE that names a plain shm store (another config's
    training store, no relay's copy): `clean --local-only`, and a whole
    `clean`, are refused naming it, MongoDB unreachable or not, and the
    store keeps its samples."""
    store = shm_cfg(swap_cap=SWAP_CAP)
    src = whlib.open_store(store)
    gen = _feed(src, 3, 64)
    src.close()
    cfg = {"STORE": "mongodb://127.0.0.1:1/db", "SWAP_CAP": SWAP_CAP, "SAMPLE": ["id", "data"],
           "CONNECT_TIMEOUT": 1, "LOCAL_CACHE": store["STORE"]}
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    for args in (["--local-only"], []):
        capsys.readouterr()
        assert cli.main(["clean", *args, "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"wirehead-torch clean: nothing removed: shm store "
                              f"'{store['STORE'][6:]}' (LOCAL_CACHE) records no source: it is "
                              f"a plain shm store, not a relay's copy of "
                              f"{local_origin(cfg)[1]}"), err
        src = whlib.open_store(store)
        assert whlib.read_generation(src, gen, SWAP_CAP) == [(3, p) for p in range(SWAP_CAP)]
        src.close()


def test_a_segment_of_another_layout_is_refused(relay_cfg):
    """A segment whose header is another build's size (an older one, made
    before copies recorded their source) is refused saying so."""
    cfg, _path = relay_cfg()
    plain = dict(cfg, STORE=cfg["LOCAL_CACHE"], LOCAL_CACHE=None, BYTE_BUDGET=1 << 20)
    whlib.open_store(plain).close()
    size = wt._C.shm_layout()["hdr_size"]
    with open(f"/dev/shm/wirehead.{cfg['LOCAL_CACHE'][6:]}", "r+b") as f:
        f.seek(16)  # magic, format version, SWAP_CAP, then the header's size
        assert int.from_bytes(f.read(8), "little") == size
        f.seek(16)
        f.write((size - 208).to_bytes(8, "little"))
    with pytest.raises(wt.SchemaMismatchError, match=f"{size - 208}-byte header"):
        whlib.open_store(plain)


def test_clean_says_it_removes_the_nodes_copy_too(relay_cfg):
    """`wirehead-torch clean` of a config with LOCAL_CACHE removes MongoDB's
    collections and this node's copy, and says both."""
    cfg, path = relay_cfg()
    src = whlib.open_store(cfg)
    _feed(src, 1)
    relay = wt.WireheadRelay(config=cfg, quiet=True)
    assert relay.run(max_generations=1) == 1
    relay.close()
    src.close()
    local = cfg["LOCAL_CACHE"]
    assert os.path.exists(f"/dev/shm/wirehead.{local[len('shm://'):]}")
    r = subprocess.run([sys.executable, "-m", "wirehead_torch.apps.cli", "clean", "--config",
                        str(path)], env=whlib.env_for_child(), capture_output=True, text=True,
                       timeout=120)
    first = r.stdout.splitlines()[0]
    assert r.returncode == 0 and first.startswith("removed store mongodb://"), r.stdout + r.stderr
    assert first.endswith(f"and this node's copy {local}"), first
    assert not os.path.exists(f"/dev/shm/wirehead.{local[len('shm://'):]}")
