"""Child processes for the tests: python tests/procs.py KIND CFG_JSON [ARGS].

  gen TAG [N]     push test samples tagged TAG (N puts, default unbounded)
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

import whlib  # noqa: E402
import wirehead_torch as wt  # noqa: E402


def _gen(tag):
    counter = 0
    while True:
        yield whlib.sample(tag, counter)
        counter += 1


def main():
    kind, cfg = sys.argv[1], json.loads(sys.argv[2])
    args = sys.argv[3:]
    if kind == "gen":
        n = int(args[1]) if len(args) > 1 else None
        g = wt.WireheadGenerator(_gen(int(args[0])), config=cfg, n_samples=n)
        print("STARTED", file=sys.stderr, flush=True)
        pushed = g.run()
        print(f"PUSHED {pushed} {g.accepted} {g.discarded}", file=sys.stderr, flush=True)
    elif kind == "manager":
        m = wt.WireheadManager(config=cfg, json_lines=True, out=sys.stdout)
        print("STARTED", file=sys.stderr, flush=True)
        n = m.run(max_swaps=int(args[0]) if args else None)
        print(f"SWAPS {n}", file=sys.stderr, flush=True)
    elif kind == "lease":
        from wirehead_torch import _C
        from wirehead_torch.config import resolve, store_kwargs
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
