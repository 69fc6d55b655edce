"""A reader whose shared files are truncated at random instants, ROUNDS
times, each round in a forked child that then leaves as the mode says:

  caught  the error caught, the reader kept, the child returns to the end
          of this script (interpreter exit with the reader alive)
  del     the reader deleted and collected, then interpreter exit
  views   tensors of the reader still held at interpreter exit
  mix     round r in the r % 3-th of those

Usage: shrink_proc.py KIND MODE ROUNDS SEED [MONGODB_URI]
KIND: map-copy, map-view, iterable, iterable-view, loader, ring (in
process), workers (wt.DataLoader, one worker), params, relay (its local
copy is cut; needs MONGODB_URI).
The parent prints one JSON line: {"rounds", "signals": [[round, signal]],
"bad": [[round, code]], "exits": {code: rounds}}; a child's code is 0 when
its reader raised the expected error, 10 when every read ended before the
cut reached it (AFTER_CUT reads after the cut, or 2 s), 3 for wrong data, 4 for an unexpected error. Exit 0 always:
the test judges."""
import gc
import itertools
import json
import os
import random
import sys
import threading
import time

import numpy as np

from wirehead_torch import _ring

import whlib

SWAP_CAP = 4
N = 1 << 18  # float32 values per sample: 1 MiB, so a cut lands inside copies
MODES = ("caught", "del", "views")
AFTER_CUT = 4 * SWAP_CAP  # items read after the cut before a round ends without an error


def fill(cfg):
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        _fill(cfg)


def _fill(cfg):
    import wirehead_torch as wt
    wt.WireheadGenerator((whlib.sample(1, i, N) for i in range(SWAP_CAP)), config=cfg).run()
    wt.WireheadManager(config=cfg).run(max_swaps=1)


def _pair(item):
    if isinstance(item, dict):  # map-style: {"input": first field, "label": second}
        item = list(item.values())
    return item[0], item[1]


def reader(kind, cfg):
    """(object to keep, iterator of (id, data) pairs)."""
    import wirehead_torch as wt
    if kind in ("map-copy", "map-view"):
        ds = wt.MongoheadDataset(config=cfg, views=kind == "map-view")
        return ds, (_pair(ds[i % SWAP_CAP]) for i in range(10**6))
    if kind in ("iterable", "iterable-view"):
        ds = wt.WireheadIterableDataset(config=cfg, views=kind == "iterable-view")
        return ds, (_pair(s) for _ in range(10**6) for s in ds)
    if kind == "loader":
        ld = wt.WireheadLoader(config=cfg, batch_size=2)
        return ld, (_pair([v[k] for v in b.values()]) for _ in range(10**6) for b in ld
                    for k in range(2))
    if kind == "ring":
        ds = wt.MongoheadDataset(config=cfg, batches=True)
        return ds, (_pair([v[k] for v in b.values()]) for i in range(10**6)
                    for b in [ds[[i % SWAP_CAP, (i + 1) % SWAP_CAP]]] for k in range(2))
    if kind == "workers":
        ds = wt.WireheadIterableDataset(config=cfg)
        dl = wt.DataLoader(ds, batch_size=2, num_workers=1)
        return dl, (_pair([v[k] for v in b.values()]) for _ in range(10**6) for b in dl
                    for k in range(2))
    if kind == "relay":
        relay = wt.WireheadRelay(config=cfg, wait=False, quiet=True)
        # the relay copies; a reader of the MongoDB config reads its local copy
        ds = wt.MongoheadDataset(config=cfg)
        return relay, (_pair(ds[i % SWAP_CAP]) for i in range(10**6) if relay.step() or True)
    raise SystemExit(f"unknown kind {kind}")


def check(kind, ident, data):
    """The sample matches its id; a view (of the store, or of a ring slot)
    may instead show zero pages where its file was cut after hand-over."""
    try:
        whlib.check_sample(ident, data)
    except AssertionError:
        if kind not in ("map-view", "iterable-view", "ring", "workers"):
            raise
        tag, counter = int(ident[0]), int(ident[1])
        n = data.shape[0]
        want = np.float32(tag * 1000 + counter) + np.arange(n, dtype=np.float32) / np.float32(n)
        if not np.all(data[data != want] == 0):
            raise


def targets(kind, cfg):
    name = (cfg.get("LOCAL_CACHE") or cfg["STORE"])[len("shm://"):]
    paths = [f"/dev/shm/wirehead.{name}"]
    if kind in ("ring", "workers"):
        paths += [os.path.join("/dev/shm", f) for f in os.listdir("/dev/shm")
                  if f.startswith(f"{_ring.PREFIX}{os.getpid()}.")]
    if kind == "params":
        paths = [f"/dev/shm/wirehead-params.{name}"]
    return paths


def child(kind, mode, cfg, rng):
    """One round; returns the exit code (0 fine, 3 wrong data, 4 unexpected)."""
    import wirehead_torch as wt
    held, got = [], 0
    if kind == "params":
        wt.set_params({"lr": 1}, config=cfg)
        keep, it = None, (wt.get_params(config=cfg) for _ in range(10**6))
    else:
        keep, it = reader(kind, cfg)
    if kind != "relay":  # the reader is open and has read before the cut
        first = next(it)
        it = itertools.chain([first], it)
    # (the relay's first copy runs under the cut: it makes the local copy)
    stop = threading.Event()

    def cut():
        stop.wait(rng.uniform(0, 0.02))
        paths = targets(kind, cfg)
        path = rng.choice(paths)
        for _ in range(2000):  # the relay makes its local copy meanwhile
            if os.path.exists(path) or stop.wait(0.001):
                break
        size = os.path.getsize(path)
        os.truncate(path, rng.choice([0, 4096, size // 2, max(size - 4096, 0)]))

    t = threading.Thread(target=cut)
    t.start()
    code = 10  # no error: every read ended before the cut reached it
    deadline = time.monotonic() + 2
    after_cut = 0
    try:
        for item in it:
            if kind != "params":
                ident, data = item
                check(kind, np.asarray(ident), np.asarray(data))
                if mode == "views" and len(held) < 4:
                    held.append((ident, data))
            got += 1
            # every sample read again after the cut (twice, past what a ring
            # had filled before it) reaches what the cut did to it
            after_cut += not t.is_alive()
            if after_cut > AFTER_CUT or time.monotonic() > deadline:
                break
    except AssertionError as e:
        code = 3
        print(f"wrong data: {e}", file=sys.stderr)
    except (wt.WireheadError, OSError):
        code = 0
    except RuntimeError as e:
        # a worker's error raised again by the DataLoader, or a batch refused
        # at hand-over naming its ring file (a cut control file can be made
        # again by the next worker: its slots then fail their seal check)
        code = 0 if kind == "workers" and ("truncated" in str(e) or "wirehead ring" in str(e)) \
            else 4
        if code:
            print(f"unexpected RuntimeError: {e}", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - any other failure is the test's finding
        code = 4
        print(f"unexpected {type(e).__name__}: {e}", file=sys.stderr)
    t.join()
    if mode == "del":
        del it
        keep = None
        gc.collect()
    child.keep = (keep, held)  # alive at interpreter exit for caught / views
    return code


def main():
    kind, mode, rounds, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    mongo = sys.argv[5] if len(sys.argv) > 5 else None
    import wirehead_torch as wt
    # imported once here, not in every forked round
    _ = wt.MongoheadDataset, wt.WireheadIterableDataset, wt.WireheadLoader, wt.DataLoader
    rng = random.Random(seed)
    out = {"rounds": rounds, "signals": [], "bad": [], "exits": {}}
    for r in range(rounds):
        cfg = {"STORE": f"shm://{whlib.unique_name('whshrink')}", "SWAP_CAP": SWAP_CAP,
               "SAMPLE": ["id", "data"], "BYTE_BUDGET": "6MiB", "READ_TIMEOUT": 1,
               "LEASE_SECONDS": 2, "SELF_SEAL": False}
        if kind == "relay":  # the local copy of a MongoDB store is cut
            cfg["LOCAL_CACHE"] = cfg["STORE"]
            cfg["STORE"] = f"{mongo}/{whlib.unique_name('whshrinkm')}"
            cfg["CONNECT_TIMEOUT"] = 10
        fill(cfg)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            rng.seed(seed * 1000 + r)
            code = child(kind, MODES[r % 3] if mode == "mix" else mode, cfg, rng)
            return code  # leaves through the interpreter's own exit
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            out["signals"].append([r, os.WTERMSIG(status)])
        else:
            code = os.WEXITSTATUS(status)
            out["exits"][code] = out["exits"].get(code, 0) + 1
            if code not in (0, 10):
                out["bad"].append([r, code])
        wt.clean(cfg)
        if kind == "relay":
            wt.clean({**cfg, "STORE": cfg["LOCAL_CACHE"], "LOCAL_CACHE": None})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
