"""Child processes for the tests: python tests/helpers/procs.py KIND CFG_JSON [ARGS].

  gen TAG [N [SIZE]]  push test samples tagged TAG (N puts, default unbounded;
                  SIZE floats of data each, default 256)
  read KIND N     read N samples with one reader kind (loader, iterable, map,
                  tuple), check each against its id, print READ N
  manager [MAX]   run a manager
  lease           take the manager lease, print LEASED, then wait forever
  view [write]    view position 0 of the current generation, print PINNED GEN,
                  then wait forever (with write: write into the view)
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import wirehead_torch as wt  # noqa: E402

import whlib  # noqa: E402


def _gen(tag, n=256):
    counter = 0
    while True:
        yield whlib.sample(tag, counter, n)
        counter += 1


def _read(kind, cfg, n):
    """Reads n samples (one or more epochs) with a reader of this kind; every
    one checked against its id. Two threads/workers, batches of 2."""
    import torch
    got = 0
    if kind == "loader":
        batches = wt.WireheadLoader(config=cfg, batch_size=2, num_threads=2)
    elif kind == "iterable":
        ds = wt.WireheadIterableDataset(config=cfg, batch_size=2, num_workers=2)
        batches = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2)
    elif kind in ("map", "tuple"):
        cls = wt.MongoheadDataset if kind == "map" else wt.MongoTupleheadDataset
        ds = cls(config=cfg)
        batches = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2)
    else:
        raise SystemExit(f"unknown reader kind {kind}")
    print("READER", file=sys.stderr, flush=True)
    while got < n:
        for b in batches:
            if isinstance(b, dict) and "input" in b:  # MongoheadDataset: input, label
                ids, data = b["input"], b["label"]
            elif isinstance(b, dict):
                ids, data = b["id"], b["data"]
            else:
                ids, data = b[0], b[1]
            for i in range(len(ids)):
                whlib.check_sample(ids[i].numpy(), data[i].numpy())
                got += 1
    print(f"READ {got}", file=sys.stderr, flush=True)


def main():
    kind, cfg = sys.argv[1], json.loads(sys.argv[2])
    args = sys.argv[3:]
    if kind == "gen":
        n = int(args[1]) if len(args) > 1 else None
        size = int(args[2]) if len(args) > 2 else 256
        g = wt.WireheadGenerator(_gen(int(args[0]), size), config=cfg, n_samples=n)
        print("STARTED", file=sys.stderr, flush=True)
        pushed = g.run()
        print(f"PUSHED {pushed} {g.accepted} {g.discarded}", file=sys.stderr, flush=True)
    elif kind == "read":
        _read(args[0], cfg, int(args[1]))
    elif kind == "manager":
        m = wt.WireheadManager(config=cfg, json_lines=True, out=sys.stdout)
        print("STARTED", file=sys.stderr, flush=True)
        n = m.run(max_swaps=int(args[0]) if args else None)
        print(f"SWAPS {n}", file=sys.stderr, flush=True)
    elif kind == "lease":
        from wirehead_torch import _C
        from wirehead_torch._store_args import store_kwargs
        from wirehead_torch.config import resolve
        st = _C.Store(**store_kwargs(resolve(cfg)))
        assert st.lead()
        print("LEASED", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    elif kind == "view":
        import torch
        st = whlib.open_store(cfg)
        gen = st.current()
        _, _, _, arrs, _ = st.view_sample(gen, 0, None, 10.0, False)
        views = [torch.from_dlpack(a) for a in arrs]
        print(f"PINNED {gen}", file=sys.stderr, flush=True)
        if args and args[0] == "write":
            views[1][0] = -1.0  # a read-only mapping: this faults
            print("WROTE", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    else:
        raise SystemExit(f"unknown kind {kind}")


if __name__ == "__main__":
    main()
