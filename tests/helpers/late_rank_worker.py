"""Rank processes for tests/ddp/test_late_rank.py: the dataset and loader are
built by the parent before any process group exists (as a Lightning
datamodule built in __init__ under ddp_spawn is) and reach each rank
pickled; every rank records the (generation, position, is_pad) it reads."""
import json
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def _items(batch):
    return [[int(g), int(p), bool(x)] for g, p, x in
            zip(batch["generation"], batch["position"], batch["is_pad"])]


def run_rank(rank, world, port, ds, loader, mp_context, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    dl = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2,
                                     multiprocessing_context=mp_context)
    got = {"len": len(dl), "dataset": [], "loader": [], "loader_len": len(loader)}
    for batch in dl:
        got["dataset"] += _items(batch)
    for batch in loader:
        got["loader"] += _items(batch)
    loader.close()
    with open(out.format(rank=rank), "w") as f:
        json.dump(got, f)
    dist.barrier()
    dist.destroy_process_group()
