"""A trainer for the tests of its workers' end (tests/faults/test_trainer_death.py).

    python tests/helpers/trainer_proc.py CFG_JSON [sigint-at-fork | term-group-at-fork | exit]

Iterates two wirehead_torch.DataLoaders with 2 workers each, one over a
WireheadIterableDataset and one over a MongoheadDataset, side by side,
epoch after epoch, each epoch to its end; once both have yielded a batch
it prints one JSON line: its pid, the pids of the four workers and the
ring tokens of the two datasets. Runs until a signal ends it.

sigint-at-fork: once that line is out, the trainer sends itself SIGINT
from inside the next fork of a worker (an at-fork callback), as a Ctrl-C
that arrives while an epoch starts its workers. term-group-at-fork: the
same moment, SIGTERM to its whole process group (its new worker not yet
set up).
exit: once that line is out, the trainer leaves by SystemExit(3) in the
middle of the epoch, its workers running (multiprocessing ends them).
"""
import itertools
import json
import os
import signal
import sys
import time

import wirehead_torch as wt


def main():
    cfg = json.loads(sys.argv[1])
    loaders = [
        wt.DataLoader(wt.WireheadIterableDataset(config=cfg, fields=["id", "data"],
                                                 ring_slots=2), batch_size=2, num_workers=2),
        wt.DataLoader(wt.MongoheadDataset(config=cfg, sample=("data", "id")), batch_size=2,
                      num_workers=2),
    ]
    said = False
    if sys.argv[2:] in (["sigint-at-fork"], ["term-group-at-fork"]):
        sent = []

        def at_fork():
            if said and not sent:
                sent.append(True)
                if sys.argv[2] == "sigint-at-fork":
                    signal.raise_signal(signal.SIGINT)
                else:
                    os.killpg(0, signal.SIGTERM)
        os.register_at_fork(after_in_parent=at_fork)
    for epoch in itertools.count():
        its = [iter(dl) for dl in loaders]
        while its:
            for it in list(its):
                batch = next(it, None)
                if batch is None:  # this epoch's end: torch ends its workers here
                    its.remove(it)
                    continue
                assert len(batch)
            if not said and len(its) == 2:
                said = True
                workers = [w.pid for dl in loaders for w in dl._torch_it()._workers]
                print(json.dumps({"pid": os.getpid(), "workers": workers,
                                  "tokens": [dl.dataset._batch_ring.token for dl in loaders]}),
                      flush=True)
                if sys.argv[2:] == ["exit"]:
                    sys.exit(3)
            time.sleep(0.01)  # a training step: the workers read ahead meanwhile


if __name__ == "__main__":
    main()
