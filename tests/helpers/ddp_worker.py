"""One DDP rank for tests/ddp/test_ddp.py: python tests/helpers/ddp_worker.py SPEC_JSON
[RANK WORLD_SIZE].

RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the environment
(as torchrun sets them); with RANK and WORLD_SIZE on the command line
instead, they go only to init_process_group (tcp:// on MASTER_ADDR:PORT).
The spec (a JSON file) says what to run:

  kind        "dataset" (DataLoader over WireheadIterableDataset) or "loader"
              (WireheadLoader)
  cfg         the store config
  epochs      full epochs to run (after resuming, if resume is given)
  batch       batch size; workers: DataLoader workers (dataset) or reader
              threads (loader); persistent: persistent_workers; refresh
  set_epoch   call set_epoch(e) before the first iteration (or null)
  take        stop after this many batches of the first epoch and record
              the resume state (or null)
  resume      path of a JSON file {rank: state} to load_state_dict (or null)
  seed        order seed
  out         output path; "{rank}" is replaced by the rank

Between two epochs rank 0 waits (bounded) until the manager has sealed a
generation newer than any read so far, so the next epoch reads another one
however slow the machine. Every sample is checked against its id; an
all_reduce runs after every batch. The rank writes JSON: len, and per epoch the epoch number, the
steps, every item [generation, position, is_pad, tag, counter] in order
and the all-reduced [ranks, real items, batch index] of every step."""
import json
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import wirehead_torch as wt  # noqa: E402

import whlib  # noqa: E402


def _one_thread(_worker_id):
    torch.set_num_threads(1)


def _items(batch):
    """[generation, position, is_pad, tag, counter] per item, each sample
    checked against its id."""
    out = []
    for ident, data, gen, pos, pad in zip(batch["id"], batch["data"], batch["generation"],
                                          batch["position"], batch["is_pad"]):
        tag, counter = whlib.check_sample(ident.numpy(), data.numpy())
        out.append([int(gen), int(pos), bool(pad), tag, counter])
    return out


def _make(spec):
    cfg, batch, workers = spec["cfg"], spec["batch"], spec["workers"]
    if spec["kind"] == "dataset":
        ds = wt.WireheadIterableDataset(config=cfg, batch_size=batch, num_workers=workers,
                                        refresh=spec["refresh"], seed=spec["seed"])
        dl = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers,
                                         persistent_workers=spec["persistent"],
                                         worker_init_fn=_one_thread)
        return ds, dl
    ld = wt.WireheadLoader(config=cfg, batch_size=batch, num_threads=workers,
                           refresh=spec["refresh"], seed=spec["seed"])
    return ld, ld


def _running_epoch(spec, obj):
    if spec["kind"] == "dataset":
        return obj.state_dict(batches_consumed=0)["epoch"]
    return obj.state_dict()["epoch"]


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    torch.set_num_threads(1)
    timeout = timedelta(seconds=spec.get("dist_timeout", 60))
    if len(sys.argv) > 2:
        # rank and world given to torch.distributed only, not in RANK/WORLD_SIZE:
        # the dataset must take them from the process group
        r, w = int(sys.argv[2]), int(sys.argv[3])
        addr = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        dist.init_process_group("gloo", init_method=addr, rank=r, world_size=w,
                                timeout=timeout)
    else:
        dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    obj, dl = _make(spec)
    if spec.get("set_epoch") is not None:
        obj.set_epoch(spec["set_epoch"])
    if spec.get("resume"):
        with open(spec["resume"]) as f:
            obj.load_state_dict(json.load(f)[str(rank)])
    result = {"rank": rank, "world": world, "len": len(dl), "epochs": [], "state": None}
    for _ in range(spec["epochs"]):
        ep = {"epoch": None, "steps": 0, "items": [], "reduced": []}
        result["epochs"].append(ep)
        for i, batch in enumerate(dl):
            if ep["epoch"] is None:
                ep["epoch"] = _running_epoch(spec, obj)
            items = _items(batch)
            ep["items"] += items
            ep["steps"] += 1
            t = torch.tensor([1, sum(not it[2] for it in items), i], dtype=torch.int64)
            dist.all_reduce(t)
            ep["reduced"].append(t.tolist())
            del batch
            if spec.get("take") is not None and len(result["epochs"]) == 1 \
                    and ep["steps"] == spec["take"]:
                result["state"] = (obj.state_dict(batches_consumed=spec["take"])
                                   if spec["kind"] == "dataset" else obj.state_dict())
                break
        if result["state"] is not None:
            break
        if len(result["epochs"]) < spec["epochs"]:
            if rank == 0:
                newest = max(it[0] for it in ep["items"])
                whlib.until(lambda: wt.status(spec["cfg"])["read_gen"] > newest, 45,  # noqa: B023
                            "a generation newer than this epoch's")
            dist.barrier()
    dist.barrier()
    out = spec["out"].replace("{rank}", str(rank))
    with open(out + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(out + ".tmp", out)
    if spec["kind"] == "loader":
        obj.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
