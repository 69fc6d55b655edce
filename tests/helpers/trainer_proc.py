"""A trainer for the tests of its workers' end (tests/faults/test_trainer_death.py).

    python tests/helpers/trainer_proc.py CFG_JSON

Iterates two wirehead_torch.DataLoaders with 2 workers each, one over a
WireheadIterableDataset and one over a MongoheadDataset, epoch after
epoch; once both have yielded a batch it prints one JSON line: its pid,
the pids of the four workers and the ring tokens of the two datasets.
Runs until a signal ends it.
"""
import itertools
import json
import os
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
    for epoch in itertools.count():
        for batches in zip(*loaders):
            assert all(len(b) for b in batches)
            if not said:
                said = True
                workers = [w.pid for dl in loaders for w in dl._torch_it()._workers]
                print(json.dumps({"pid": os.getpid(), "workers": workers,
                                  "tokens": [dl.dataset._batch_ring.token for dl in loaders]}),
                      flush=True)
            time.sleep(0.01)  # a training step: the workers read ahead meanwhile


if __name__ == "__main__":
    main()
