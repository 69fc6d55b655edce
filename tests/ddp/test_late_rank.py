"""Rank and world size are found when iterating: a dataset built before the
process group exists (Lightning datamodule __init__, ddp_spawn) must not
read the whole generation on every rank."""
import json

import late_rank_worker
import pytest
import torch  # noqa: F401 (imported before torch.multiprocessing, as users do)
import torch.multiprocessing as mp

import wirehead_torch as wt

import whlib

WORLD = 2


@pytest.mark.parametrize("mp_context", ["fork", "spawn"])
def test_dataset_built_before_the_process_group(shm_cfg, tmp_path, mp_context, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    cfg = shm_cfg(swap_cap=12, sample=("id", "data"))
    items = [whlib.sample(1, i) for i in range(12)]
    wt.WireheadGenerator(iter(items), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    ds = wt.WireheadIterableDataset(config=cfg, batch_size=2, num_workers=2, shuffle=True)
    loader = wt.WireheadLoader(config=cfg, batch_size=2, num_threads=1)
    assert len(loader) == 6  # no process group yet: one rank reads everything
    out = str(tmp_path / "rank{rank}.json")
    mp.spawn(late_rank_worker.run_rank,
             args=(WORLD, whlib.free_port(), ds, loader, mp_context, out),
             nprocs=WORLD, join=True)
    got = [json.load(open(out.format(rank=r))) for r in range(WORLD)]
    for kind in ("dataset", "loader"):
        lens = [len(g[kind]) for g in got]
        # 12 samples over 2 ranks; the dataset pads each of its 2 workers to whole batches
        assert lens == ([8, 8] if kind == "dataset" else [6, 6]), (kind, lens)
        real = [(gen, pos) for g in got for gen, pos, pad in g[kind] if not pad]
        assert len(real) == len(set(real)) == 12, f"{kind}: duplicates across ranks: {real}"
    assert [g["len"] for g in got] == [4, 4] and [g["loader_len"] for g in got] == [3, 3]
