"""Options shared by WireheadIterableDataset and WireheadLoader: who this
process is in the job, and the order/padding settings."""
import logging
import numbers
import os

log = logging.getLogger("wirehead_torch")

PAD_CODES = {"repeat": 0, "ignore": 1, "drop": 2}
REFRESH = ("epoch", "step")
# The most ranks a job may have (world_size, WORLD_SIZE): the C order takes
# 32-bit counts, and ranks times workers must fit it.
MAX_WORLD = 1 << 20


def _found_rank_world():
    """(rank, world_size) this process can find by itself: an initialised
    torch.distributed, then RANK/WORLD_SIZE; None where neither says."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    if os.environ.get("WORLD_SIZE"):
        w = env_int("WORLD_SIZE", 1, MAX_WORLD)
        return (env_int("RANK", 0, MAX_WORLD - 1) if os.environ.get("RANK") else None), w
    return None


def rank_world(rank=None, world_size=None, inherited=None):
    """(rank, world_size): explicit values win, then what this process finds
    (torch.distributed, then RANK/WORLD_SIZE), then what the process that
    pickled the dataset found (a DataLoader worker started with spawn has no
    process group of its own), then 0/1."""
    found = _found_rank_world() or inherited
    r, w = found if found else (None, None)
    if world_size is not None:
        w = world_size
    if rank is not None:
        r = rank
    w = 1 if w is None else int(w)
    if not 1 <= w <= MAX_WORLD:
        raise ValueError(f"world_size must be in 1..{MAX_WORLD}, got {w}")
    if r is None:
        if w > 1:
            raise ValueError(f"WORLD_SIZE is {w} but no rank is known: initialise "
                             f"torch.distributed, set RANK, or pass rank=")
        r = 0
    r = int(r)
    if not 0 <= r < w:
        raise ValueError(f"rank {r} is not in 0..{w - 1} (world_size {w})")
    return r, w


def env_int(name, lo, hi, default=None):
    """The integer environment variable name, in lo..hi (default when
    unset or empty): a ValueError naming it, its value and the range."""
    v = os.environ.get(name, "")
    if not v.strip():
        return default
    try:
        n = int(v)
    except ValueError:
        n = None
    if n is None or not lo <= n <= hi:
        raise ValueError(f"environment variable {name}={v!r} is not an integer in "
                         f"{lo}..{hi}")
    return n


class Order:
    """Validated order options; field selection by name."""

    def __init__(self, cfg, fields, shuffle, seed, pad, ignore_index, label_fields, refresh,
                 rank, world_size):
        names = cfg["SAMPLE"]
        fields = list(names if fields is None else fields)
        missing = [f for f in fields if f not in names]
        if missing or not fields:
            raise ValueError(f"fields {missing or fields} are not in the store's SAMPLE {names}")
        if pad not in PAD_CODES:
            raise ValueError(f"pad must be one of {sorted(PAD_CODES)}, got {pad!r}")
        if refresh not in REFRESH:
            raise ValueError(f"refresh must be 'epoch' or 'step', got {refresh!r}")
        if label_fields is None:
            label_fields = [names[1]] if (pad == "ignore" and len(names) > 1) else []
        bad = [f for f in label_fields if f not in fields]
        if bad:
            raise ValueError(f"label_fields {bad} are not among the fields read {fields}")
        if pad == "ignore" and not label_fields:
            raise ValueError("pad='ignore' needs label_fields to fill with ignore_index")
        self.names = names
        self.fields = fields
        self.want = [names.index(f) for f in fields]
        self.shuffle = bool(shuffle)
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not (
                0 <= seed < 1 << 64):
            raise ValueError(f"seed must be an integer in 0..2**64-1, got {seed!r}")
        self.seed = int(seed)
        self.pad = pad
        self.ignore_index = ignore_index
        self.label_fields = list(label_fields)
        self.refresh = refresh
        # Rank and world size are looked up whenever they are used, not here:
        # a dataset is often built before the process group exists (Lightning
        # datamodules, ddp_spawn), and would otherwise read everything as rank 0.
        if rank is not None and world_size is not None:
            rank_world(rank, world_size)  # explicit values are checked at once
        self._rank_arg, self._world_arg = rank, world_size
        self._inherited = None
        self.swap_cap = cfg["SWAP_CAP"]

    @property
    def rank(self):
        return rank_world(self._rank_arg, self._world_arg, self._inherited)[0]

    @property
    def world_size(self):
        return rank_world(self._rank_arg, self._world_arg, self._inherited)[1]

    def __getstate__(self):
        # Pickled for a spawned worker: hand on what this process knows.
        d = dict(self.__dict__)
        d["_inherited"] = _found_rank_world() or self._inherited
        return d

    def plan(self, workers=0, worker=0, batch=0, drop_last=False, whole_batches=False):
        """Arguments of the C order functions (pad='drop' never pads; the
        batch size still counts batches on resume; drop_last keeps whole
        batches only, and so does pad='drop' with whole_batches: workers
        whose items a DataLoader batches must all end on a whole batch)."""
        rank, world = rank_world(self._rank_arg, self._world_arg, self._inherited)
        drop_last = bool(batch) and (drop_last or (whole_batches and self.pad == "drop"))
        return dict(swap_cap=self.swap_cap, world=world, rank=rank,
                    workers=workers, worker=worker, batch=batch, shuffle=self.shuffle,
                    seed=self.seed, pad=PAD_CODES[self.pad], drop_last=drop_last)


def plan_sizes(plan):
    """What a plan gives (steps per worker; items, batches and padding per
    rank), counted by the C plan alone (wh_plan.c): len() of every reader
    asks here."""
    from . import _C
    return _C.plan_info(**plan)


class WorkerShare:
    """Which rows one reader produces in an epoch, and in which batches:
    the one place this is decided on the Python side (docs/design.md,
    "Sample order"). A WireheadIterableDataset's worker reads its plan's
    steps from start on, in batches of its own; a map-style reader under
    wirehead_torch.DataLoader hands out its rank's batches (worker 0's plan
    of the rank, no workers), which torch gives to worker i mod num_workers.
    plan: Order.plan's arguments of the reader; start: the steps it read
    already."""

    def __init__(self, plan, epoch, start=0):
        self.plan, self.epoch, self.start = plan, int(epoch), int(start)

    @classmethod
    def of_worker(cls, plan_of, worker, epoch, *, resumed=None, start=0):
        """Worker's share (plan_of(w): worker w's plan); resumed: the
        rank's batches taken before a resume of this epoch, for the
        worker's first iteration after it: the worker then plays the role
        whose batch comes next, so the order is the original one."""
        plan = plan_of(worker)
        if resumed is not None:
            from . import _C
            role, start = _C.plan_resume(**plan, consumed=resumed)
            plan = plan_of(role)
        return cls(plan, epoch, start)

    def rows(self):
        """(positions, pads) of the steps from start on: int64 positions
        (a memoryview) and one pad flag (byte) a row."""
        from . import _C
        positions, pads = _C.plan_items(**self.plan, epoch=self.epoch, start=self.start)
        return memoryview(positions).cast("q"), pads

    def batches(self, size, skip=0):
        """(positions, pads) of each batch of size rows (the last may be
        shorter), skip batches left out."""
        positions, pads = self.rows()
        for b0 in range(skip * size, len(positions), size):
            yield positions[b0:b0 + size], pads[b0:b0 + size]


class SpecShare(WorkerShare):
    """A reader's rows in spec mode (docs/reproducible.md): the rank's plan
    (no workers) cut into batches of size rows, of which DataLoader worker
    w of K makes batches skip + w, skip + w + K, ... (skip: the rank's
    batches taken before a resume). torch hands an iterable dataset's
    batches out from worker i mod K, so any K gives the same batches in
    the same order. start: rows of these the worker made already (its own
    resume state)."""

    def __init__(self, plan, epoch, size, workers, worker, skip=0, start=0):
        super().__init__(plan, epoch, start)
        self.size, self.every, self.first = size, max(workers, 1), skip + worker

    def rows(self):
        from array import array
        positions, pads = WorkerShare(self.plan, self.epoch).rows()
        size = self.size or max(len(positions), 1)
        pos, pad = array("q"), bytearray()
        for b0 in range(self.first * size, len(positions), size * self.every):
            pos.extend(positions[b0:b0 + size])
            pad += pads[b0:b0 + size]
        return memoryview(pos)[self.start:], bytes(pad[self.start:])


# Padding above this share of a rank's items in an epoch is logged (once
# per epoch): a batch_size close to or above SWAP_CAP / (world x workers)
# makes most of every batch repeats.
PAD_WARN_SHARE = 0.25


def _shape(plan):
    workers = max(plan["workers"], 1)
    readers = plan['world'] * workers
    return (f"SWAP_CAP {plan['swap_cap']}, world size {plan['world']} x {workers} "
            f"worker{'s' if workers > 1 else ''} = {readers} reader{'s' if readers > 1 else ''}")


def check_yields(plan, what, batch_size=None, drop_last=None):
    """plan_info of plan; a ValueError naming the numbers when it gives a
    worker no item (pad='drop' with fewer samples than readers, or
    drop_last/whole batches with a share smaller than one batch)."""
    info = plan_sizes(plan)
    if info["steps"] > 0:
        return info
    pad = [k for k, v in PAD_CODES.items() if v == plan["pad"]][0]
    share = plan_sizes(dict(plan, batch=0, drop_last=False))["steps"]
    if share == 0:
        raise ValueError(
            f"{what}: pad='drop' gives no batch: {_shape(plan)}, so each reader's share of "
            f"a generation is {plan['swap_cap']} // {plan['world'] * max(plan['workers'], 1)}"
            f" = 0 samples; raise SWAP_CAP, use fewer workers or ranks, or pad='repeat'")
    # drop_last: what the user set (the iterable dataset also keeps whole
    # batches only for pad='drop')
    drop_last = plan["drop_last"] if drop_last is None else drop_last
    why = "drop_last=True" if drop_last else f"pad={pad!r} (whole batches only)"
    raise ValueError(
        f"{what}: {why} gives no batch: {_shape(plan)} leaves each reader {share} samples "
        f"per epoch, fewer than batch_size {batch_size or plan['batch']}; lower batch_size "
        f"or num_workers, raise SWAP_CAP, or set drop_last=False")


def warn_padding(plan, info, what, epoch, memo, batch_size):
    """Logs, once per epoch (memo: a dict kept by the caller), when padding
    is more than PAD_WARN_SHARE of the rank's items in an epoch."""
    items = info["rank_items"]
    pads = info["rank_pads"]
    if not items or pads <= PAD_WARN_SHARE * items or memo.get("epoch") == epoch:
        return False
    memo["epoch"] = epoch
    log.warning(
        "%s: %d of the %d items rank %d reads in epoch %d are padding (%.0f%%; %s, "
        "batch_size %d): lower batch_size or num_workers, raise SWAP_CAP, or set "
        "drop_last=True (or pad='drop') to drop them", what, pads, items, plan["rank"], epoch,
        100.0 * pads / items, _shape(plan), batch_size)
    return True


def check_ignore_fits(dtype, value, name):
    """Refuses an ignore_index the label field's dtype cannot hold."""
    import torch
    info = torch.finfo(dtype) if dtype.is_floating_point else (
        None if dtype == torch.bool or dtype.is_complex else torch.iinfo(dtype))
    if info is None or not (info.min <= value <= info.max):
        raise ValueError(f"ignore_index {value} does not fit label field '{name}' of dtype "
                         f"{dtype}; pass an ignore_index that does, or pad='repeat'")


def warn_skipped(where, n, last):
    """The one warning for corrupt samples the read policy skipped: n of
    them, the last one's reason; a neighbour stands in as padding."""
    log.warning("%s: skipped %d corrupt sample(s); a neighbour stands in as padding: %s",
                where, n, last)


def log_skips(info, seen, where):
    """Warns of corrupt samples skipped since the last call; returns the count."""
    n = info["corrupt"]
    if n > seen:
        warn_skipped(where, n - seen, info["last_skip"])
    return n

