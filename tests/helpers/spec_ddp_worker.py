"""One DDP rank of tests/spec/test_spec_runs.py: python spec_ddp_worker.py SPEC_JSON.

RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the environment (as
torchrun sets them). The JSON says: cfg (a spec-mode config), batch,
workers, epochs (in all), take (stop after this many batches and write the
resume state, or null), resume (a file of {rank: state} to load, or null),
out (the output path, "{rank}" replaced). The rank reads with
wt.DataLoader over WireheadIterableDataset, all-reduces after every batch
(ranks stay in step, as DDP keeps them) and writes every batch it got:
each tensor as a list, in order, and its resume state when it stops early."""
import json
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import wirehead_torch as wt  # noqa: E402


def _one_thread(_worker_id):
    torch.set_num_threads(1)


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=90))
    rank = dist.get_rank()
    ds = wt.WireheadIterableDataset(config=spec["cfg"], seed=spec.get("seed", 3))
    dl = wt.DataLoader(ds, batch_size=spec["batch"], num_workers=spec["workers"],
                       worker_init_fn=_one_thread)
    if spec.get("resume"):
        with open(spec["resume"]) as f:
            dl.load_state_dict(json.load(f)[str(rank)])
    got, state, taken = [], None, 0
    start = dl.state_dict()["epoch"] if spec.get("resume") else 0
    for epoch in range(start, spec["epochs"]):
        dl.set_epoch(epoch)
        for batch in dl:
            got.append({k: v.tolist() for k, v in sorted(batch.items())})
            taken += 1
            t = torch.tensor([1], dtype=torch.int64)
            dist.all_reduce(t)
            if spec.get("take") is not None and taken == spec["take"]:
                state = dl.state_dict()
                break
        if state is not None:
            break
    dist.barrier()
    out = spec["out"].replace("{rank}", str(rank))
    with open(out + ".tmp", "w") as f:
        json.dump({"rank": rank, "batches": got, "state": state}, f)
    os.replace(out + ".tmp", out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
