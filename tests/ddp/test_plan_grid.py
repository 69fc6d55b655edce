"""The sample-order rule over the whole grid of worlds, workers, sizes and
epochs, through the bindings the dataset and the loader use."""
import itertools
import math

import pytest
import torch

from wirehead_torch import _C, WireheadIterableDataset

PADS = {"repeat": 0, "ignore": 1, "drop": 2}


def plan(n, world, rank, workers, worker, batch, pad="repeat", shuffle=True, seed=3):
    return dict(swap_cap=n, world=world, rank=rank, workers=workers, worker=worker,
                batch=batch if pad != "drop" else 0, shuffle=shuffle, seed=seed, pad=PADS[pad])


def items(p, epoch):
    pos, pad = _C.plan_items(**p, epoch=epoch)
    return list(memoryview(pos).cast("q")), [bool(x) for x in pad]


@pytest.mark.parametrize("n", range(1, 65))
def test_grid_every_position_once_equal_counts(n):
    for world, workers, batch in itertools.product(range(1, 5), range(0, 4), range(1, 6)):
        for epoch in (0, 1):
            counts, real = [], []
            for rank in range(world):
                for worker in range(max(workers, 1)):
                    p = plan(n, world, rank, workers, worker, batch)
                    pos, pad = items(p, epoch)
                    counts.append(len(pos))
                    real += [q for q, isp in zip(pos, pad) if not isp]
                    assert all(0 <= q < n for q in pos)
            assert sorted(real) == list(range(n)), (n, world, workers, batch)
            assert len(set(counts)) == 1, "every worker yields the same count"
            assert counts[0] % batch == 0, "workers are padded to whole batches"
            # DataLoader: batch i of a rank comes from worker i mod workers;
            # every worker yields ceil(count / batch) batches
            per_rank = max(workers, 1) * math.ceil(counts[0] / batch)
            info = _C.plan_info(**plan(n, world, 0, workers, 0, batch))
            assert info["rank_batches"] == per_rank


@pytest.mark.parametrize("n", [1, 7, 20, 64])
def test_order_does_not_depend_on_world(n):
    for epoch in range(3):
        ref = items(plan(n, 1, 0, 0, 0, 1), epoch)[0]
        for world, workers in itertools.product(range(1, 5), range(0, 4)):
            w_total = world * max(workers, 1)
            glob = {}
            for rank in range(world):
                for worker in range(max(workers, 1)):
                    g = rank * max(workers, 1) + worker
                    pos, pad = items(plan(n, world, rank, workers, worker, 1), epoch)
                    for k, (q, isp) in enumerate(zip(pos, pad)):
                        if not isp:
                            glob[g + k * w_total] = q
            assert [glob[i] for i in range(n)] == ref


def test_epochs_differ_and_identity_without_shuffle():
    a = items(plan(32, 1, 0, 0, 0, 1), 0)[0]
    b = items(plan(32, 1, 0, 0, 0, 1), 1)[0]
    assert sorted(a) == sorted(b) == list(range(32)) and a != b
    assert items(plan(32, 1, 0, 0, 0, 1, shuffle=False), 5)[0] == list(range(32))


@pytest.mark.parametrize("n, world, workers, batch", [(20, 3, 2, 4), (7, 2, 3, 2), (13, 1, 2, 5),
                                                      (5, 4, 0, 3)])
@pytest.mark.parametrize("pad", ["repeat", "drop"])
def test_dataset_len_matches_dataloader(shm_cfg, n, world, workers, batch, pad):
    """len(DataLoader) is exact: the batches a rank's DataLoader yields,
    computed worker by worker, match len()."""
    cfg = shm_cfg(swap_cap=n)
    for rank in range(world):
        ds = WireheadIterableDataset(config=cfg, batch_size=batch, num_workers=workers,
                                     rank=rank, world_size=world, pad=pad)
        dl = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers)
        steps = ds._steps(workers)
        yielded = max(workers, 1) * math.ceil(steps / batch)
        assert len(dl) == yielded
        if pad == "drop":
            assert steps == (n // (world * max(workers, 1))) // batch * batch


def test_bad_plans_name_the_field():
    with pytest.raises(wt_err(), match="rank"):
        _C.plan_info(**plan(10, 2, 2, 0, 0, 1))
    with pytest.raises(wt_err(), match="swap_cap"):
        _C.plan_info(**plan(0, 1, 0, 0, 0, 1))


def wt_err():
    return _C.WireheadError
