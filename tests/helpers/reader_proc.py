"""A reader child process for the MongoDB store tests.

    python tests/helpers/reader_proc.py store CFG_JSON
        Reads every new generation whole through the store API, checks every
        sample against its id, and prints one JSON line per generation:
        {"gen": G, "ids": [[tag, counter], ...]} (a generation reclaimed while
        being read is skipped).

    python tests/helpers/reader_proc.py dataset CFG_JSON
        Reads positions round-robin through MongoheadDataset (the user-facing
        reader), checks each sample, and prints {"read": N, "max": {tag:
        counter}} every 10 samples.

Prints STARTED on stderr once the store is open; exits 0 on SIGTERM.
"""
import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import wirehead_torch as wt  # noqa: E402
from wirehead_torch import _C  # noqa: E402
from wirehead_torch._store_args import store_kwargs  # noqa: E402
from wirehead_torch.config import resolve  # noqa: E402

import whlib  # noqa: E402


def _read_whole(store, gen, swap_cap):
    seen = whlib.read_generation(store, gen, swap_cap)
    return None if seen is None else [list(s) for s in seen]


stopping = False


def _stop(signum, frame):
    global stopping
    stopping = True

def run_store(cfg):
    store = _C.Store(**store_kwargs(resolve(cfg)))
    print("STARTED", file=sys.stderr, flush=True)
    last = 0
    while not stopping:
        gen = store.current()
        if gen == 0 or gen == last:
            time.sleep(0.002)  # polling the state document; no wake-up channel
            continue
        ids = _read_whole(store, gen, cfg["SWAP_CAP"])
        last = gen
        if ids is not None:
            print(json.dumps({"gen": gen, "ids": ids}), flush=True)


def run_dataset(cfg):
    ds = wt.MongoheadDataset(config=cfg, output="numpy")
    print("STARTED", file=sys.stderr, flush=True)
    n, top = 0, {}
    i = 0
    while not stopping:
        item = ds[i % len(ds)]
        tag, counter = whlib.check_sample(item["input"], item["label"])
        top[tag] = max(top.get(tag, -1), counter)
        n += 1
        i += 1
        if n % 10 == 0:
            print(json.dumps({"read": n, "max": top}), flush=True)


def main():
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    kind, cfg = sys.argv[1], json.loads(sys.argv[2])
    {"store": run_store, "dataset": run_dataset}[kind](cfg)


if __name__ == "__main__":
    main()
