"""A reader on the fake CUDA runtime whose store (or ring slot) file is cut
between a copy's check and the copy itself: WIREHEAD_FAULT_CUT names the
copy (ext/core/wh_fault.h). Every batch that reaches the loop must hold
exactly its samples; the cut must come as an error instead.

Usage: cut_copy_proc.py KIND CFG_JSON, with WIREHEAD_CUDA_LIB the fake
runtime. KIND: loader (WireheadLoader(device="cuda")), dataloader
(wt.DataLoader(device="cuda"), one worker), to-device (to_device of store
views).
Prints one JSON line {"batches": good batches before the error, "error":
[type, message] or null}; exits 3 when a batch holds wrong data."""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "gpu"))
from test_cuda import Consumer, Fake, ring_loader  # noqa: E402

import wirehead_torch as wt  # noqa: E402

import whlib  # noqa: E402


def rows_ok(batch):
    ids, data = np.asarray(batch["id"]), np.asarray(batch["data"])
    if ids.ndim == 1:  # one sample
        ids, data = ids[None], data[None]
    for ident, row in zip(ids, data):
        whlib.check_sample(ident, row)


def main():
    kind, cfg = sys.argv[1], json.loads(sys.argv[2])
    fake = Fake(os.environ["WIREHEAD_CUDA_LIB"])
    torch.from_dlpack = Consumer(fake, torch.from_dlpack)
    good, error = 0, None
    try:
        if kind == "loader":
            # one row a batch (the cut row is its batch's last: no later row's
            # check catches it), one batch ahead (the batch is handed over
            # before the next one's error)
            batches = wt.WireheadLoader(config=cfg, batch_size=1, device="cuda", shuffle=False,
                                        num_threads=1, prefetch=1)
        elif kind == "dataloader":
            batches = ring_loader(cfg, workers=1, device="cuda")
        elif kind == "to-device":
            ds = wt.MongoheadDataset(config=cfg, views=True)
            batches = wt.to_device([ds[i] for i in range(2)], "cuda")
        else:
            raise SystemExit(f"unknown kind {kind}")
        for b in batches:
            rows_ok(b)
            good += 1
    except (wt.WireheadError, OSError, RuntimeError) as e:
        error = [type(e).__name__, str(e)]
    print(json.dumps({"batches": good, "error": error}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"wrong data: {e}", file=sys.stderr)
        sys.exit(3)
