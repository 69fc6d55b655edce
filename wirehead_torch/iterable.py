"""WireheadIterableDataset: this worker's share of each epoch, for an
ordinary torch DataLoader under DDP."""
import logging
import multiprocessing
import os
import weakref

import numpy as np
import torch

from . import _C, _ring
from ._arrays import _torch_dtype, needs_cast_message
from ._arrays import to_output
from ._order import Order, check_ignore_fits
from ._store import ProcessStore
from .config import get_config
from .dataset import check_views_store, read_sample, view_sample, wait_for_generation

_MAX_WORKERS = 256
# shared epoch state: [base epoch, resume batches (-1: none), resume
# generation, generation in use, iterations of worker 0, of worker 1, ...]
_BASE, _RESUME, _RESUME_GEN, _GEN, _COUNTS = range(5)
_REGION = _COUNTS + _MAX_WORKERS
# A dataset pickled to several rank processes before they exist (ddp_spawn)
# carries one shared array to all of them: each rank keeps its state in its
# own region (rank mod _RANK_REGIONS; ranks that share memory share a host).
_RANK_REGIONS = 64
# batches=True: how long a DataLoader worker waits for one of its ring slots
# (held by the main process's tensors) before it sends a batch the plain way
_RING_WAIT_S = 0.5

log = logging.getLogger("wirehead_torch")


class _NewLayout(Exception):
    """A batch's first sample has another layout than the one cached."""


class WireheadIterableDataset(torch.utils.data.IterableDataset):
    """Yields this DataLoader worker's items of each epoch: dicts of tensors
    named by SAMPLE (or ``fields``) plus ``is_pad`` (bool), ``generation``
    and ``position`` (int64). Every worker of every rank yields the same
    number of items; no two get the same sample of the same generation in
    an epoch (DESIGN.md, "Sample order").

    Pass the DataLoader's ``batch_size`` and ``num_workers`` to pad every
    worker to whole batches and make ``len(DataLoader)`` exact.

    The epoch counters are shared with the DataLoader's worker processes
    (fork, spawn or forkserver), so the dataset pickles only while a worker
    process is being started, not with ``pickle.dumps`` or ``deepcopy``.

    ``batches=True`` (with ``batch_size``) yields whole batches instead of
    items: use it with ``DataLoader(ds, batch_size=None, num_workers=K)``.
    Each worker then reads every sample once, straight into a reused slot
    of a shared-memory ring (``ring_slots`` per worker), and the batch's
    tensors in the main process view that slot: no collate copy, no fresh
    pages per sample. A slot is reused only after every tensor of its batch
    is gone; a worker whose slots are all held for 0.5 s (the loop keeps
    more than ``ring_slots - 2`` of its batches) sends that batch the
    ordinary way, logged once.

    ``views=True`` (shm:// store) iterated in-process (no DataLoader
    workers) yields tensors that view the store, read-only, with no copy
    (README, "Store-backed views and reader pins"); when the pin policy
    refuses a view the item is a copy. Under DataLoader workers a view
    could not cross the process boundary, so views=True is ignored there
    (each worker reads copies; use batches=True for one copy per sample)."""

    def __init__(self, config_path=None, config=None, *, fields=None, batch_size=None,
                 num_workers=None, shuffle=True, seed=0, pad="repeat", ignore_index=-100,
                 label_fields=None, refresh="epoch", transform=None, rank=None,
                 world_size=None, cast=None, timeout=None, batches=False, ring_slots=4, views=False):
        super().__init__()
        self.cfg = get_config(config_path, config)
        if views:
            check_views_store(self.cfg)
        if views and batches:
            raise ValueError("views=True and batches=True exclude each other: batches are "
                             "copied once into ring slots, views are not copied at all")
        self.views = bool(views)
        self.order = Order(self.cfg, fields, shuffle, seed, pad, ignore_index, label_fields,
                           refresh, rank, world_size)
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 0
                                        or num_workers > _MAX_WORKERS):
            raise ValueError(f"num_workers must be 0..{_MAX_WORKERS}, got {num_workers!r}")
        if batches and not batch_size:
            raise ValueError("batches=True yields whole batches: give batch_size too")
        if batches and transform is not None:
            raise ValueError("batches=True hands out batches that view shared slots; apply "
                             "the transform to each batch in the training loop instead")
        if not isinstance(ring_slots, int) or ring_slots < 1:
            raise ValueError(f"ring_slots must be a positive integer, got {ring_slots!r}")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.batches = bool(batches)
        self.ring_slots = ring_slots
        # ring files are named by the DataLoader's main process and this token
        self._ring_token = os.urandom(6).hex()
        self._ring_state = (None, None)  # (pid, WorkerRing) in this process
        self._ring_layout = (None, None)  # (pid, field layout) in this process
        self._pickled_by = self._unpickled_in = None
        weakref.finalize(self, _ring.cleanup, os.getpid(), self._ring_token)
        self.transform = transform
        self.cast = cast
        self.timeout = float(self.cfg["READ_TIMEOUT"] if timeout is None else timeout)
        self._store = ProcessStore(self.cfg)
        # Shared with worker processes (fork, spawn, forkserver) so that
        # persistent and fresh workers agree on the epoch.
        self._raw = multiprocessing.RawArray("q", _REGION * _RANK_REGIONS)
        for r in range(_RANK_REGIONS):
            self._raw[r * _REGION + _RESUME] = -1
        self._local_resume = None  # StatefulDataLoader protocol (per worker)
        self._progress = (0, 0, 0)  # (epoch, items yielded, generation) in this process

    @property
    def _shared(self):
        """This rank's region of the shared epoch state."""
        start = (self.order.rank % _RANK_REGIONS) * _REGION
        return memoryview(self._raw).cast("B").cast("q")[start:start + _REGION]

    # --- sizes -------------------------------------------------------
    def _steps(self, workers):
        info = _C.plan_info(**self.order.plan(workers, 0, self.batch_size or 0))
        steps = info["steps"]
        if self.order.pad == "drop" and self.batch_size:
            steps -= steps % self.batch_size  # whole batches only
        return steps

    def __len__(self):
        """Items this rank yields per epoch: exact when batch_size and
        num_workers were given, else the count for one worker per rank."""
        workers = self.num_workers or 0
        items = self._steps(workers) * max(workers, 1)
        return -(-items // self.batch_size) if self.batches else items

    # --- epochs and resume --------------------------------------------
    def set_epoch(self, epoch):
        """The next iteration runs this epoch (later ones count on from it).
        A state loaded for the same epoch still applies (the usual
        load_state_dict, then set_epoch loop); one for another epoch is
        dropped."""
        sh = self._shared
        untouched = not any(sh[_COUNTS:])
        if sh[_RESUME] >= 0 and sh[_BASE] == int(epoch) and untouched:
            return
        self._set_epoch(epoch)

    def _set_epoch(self, epoch):
        sh = self._shared
        sh[_BASE] = int(epoch)
        sh[_RESUME] = -1
        for w in range(_MAX_WORKERS):
            sh[_COUNTS + w] = 0

    def _epoch_of_running(self):
        sh = self._shared
        return sh[_BASE] + max(sh[_COUNTS] - 1, 0)

    def state_dict(self, batches_consumed=None):
        """With batches_consumed (the rank's batches taken this epoch): the
        rank's resume state, made in the main process. Without it: this
        worker's state, for torchdata's StatefulDataLoader."""
        if batches_consumed is None:
            epoch, step, gen = self._progress
            return {"epoch": epoch, "step": step, "generation": gen,
                    "seed": self.order.seed}
        return {"epoch": self._epoch_of_running(), "batches_consumed": int(batches_consumed),
                "generation": self._shared[_GEN], "seed": self.order.seed,
                "world_size": self.order.world_size, "num_workers": self.num_workers,
                "batch_size": self.batch_size}

    def load_state_dict(self, state):
        if "step" in state:  # one worker's state (StatefulDataLoader)
            self._local_resume = (int(state["epoch"]), int(state["step"]),
                                  int(state.get("generation", 0)))
            return
        for key, have in (("world_size", self.order.world_size),
                          ("num_workers", self.num_workers), ("batch_size", self.batch_size),
                          ("seed", self.order.seed)):
            if key in state and state[key] != have:
                raise ValueError(f"cannot resume: state has {key}={state[key]!r}, this "
                                 f"dataset has {have!r} (the worker count, batch size, world "
                                 f"size and seed must not change mid-epoch)")
        self._set_epoch(state["epoch"])
        sh = self._shared
        sh[_RESUME] = int(state["batches_consumed"])
        sh[_RESUME_GEN] = int(state.get("generation", 0))
        sh[_GEN] = sh[_RESUME_GEN]

    # --- iteration ------------------------------------------------------
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (0, 0)
        if self.num_workers is not None and self.num_workers != workers:
            raise ValueError(f"WireheadIterableDataset was given num_workers={self.num_workers} "
                             f"but runs in a DataLoader with num_workers={workers}; pass the "
                             f"same value to both")
        sh = self._shared
        count = sh[_COUNTS + worker]
        sh[_COUNTS + worker] = count + 1
        epoch, start, gen = sh[_BASE] + count, 0, 0
        plan = self.order.plan(workers, worker, self.batch_size or 0)
        if self._local_resume is not None:
            epoch, start, gen = self._local_resume
            self._local_resume = None
            # later iterations of this worker go on from the resumed epoch
            sh[_COUNTS + worker] = max(epoch - sh[_BASE] + 1, 1)
        elif count == 0 and sh[_RESUME] >= 0:
            start = _C.plan_resume_step(**plan, consumed=sh[_RESUME])
            gen = sh[_RESUME_GEN]
        steps = self._steps(workers)
        if self.batches:
            return self._batches(plan, epoch, start, steps, gen, worker, info is not None)
        return self._items(plan, epoch, start, steps, gen, worker,
                           self.views and info is None)

    def _start(self, plan, epoch, start, steps, gen, worker):
        """(store, generation, positions, pads) of this worker's epoch."""
        store = self._store.get()
        newest = wait_for_generation(store, self.cfg, self.timeout)
        gen = gen or newest
        if worker == 0:
            self._shared[_GEN] = gen
        positions, pads = _C.plan_items(**plan, epoch=epoch, start=start, stop=steps)
        return store, gen, memoryview(positions).cast("q"), pads

    def _items(self, plan, epoch, start, steps, gen, worker, views=False):
        o = self.order
        store, gen, positions, pads = self._start(plan, epoch, start, steps, gen, worker)
        for k in range(len(positions)):
            pos, is_pad = positions[k], bool(pads[k])
            if o.refresh == "step":
                try:
                    gen = max(gen, store.current())
                except _C.StoreUnavailableError:
                    pass  # keep reading gen; the read policy waits out the outage
            got = view_sample(store, gen, pos, o.want, self.timeout) if views else None
            viewed = got is not None
            if not viewed:  # a copy, also when the pin policy refuses the view
                got = read_sample(store, gen, pos, o.want, self.timeout)
            gen, pos, skipped, arrs = got
            is_pad = is_pad or skipped
            item = {name: to_output(arrs[i], name, "torch", self.cast, numpy_ok=False)
                    for i, name in zip(o.want, o.fields)}
            if is_pad and o.pad == "ignore":
                for name in o.label_fields:
                    if viewed:  # a view is read-only: the filled label is a copy
                        item[name] = item[name].clone()
                    check_ignore_fits(item[name].dtype, o.ignore_index, name)
                    item[name].fill_(o.ignore_index)
            item["is_pad"] = torch.tensor(is_pad)
            item["generation"] = torch.tensor(gen, dtype=torch.int64)
            item["position"] = torch.tensor(pos, dtype=torch.int64)
            self._progress = (epoch, start + k + 1, gen)
            if self.transform is not None:
                item = self.transform(item)
            yield item

    # --- batches=True: the shared ring -----------------------------------
    def _main_pid(self, in_worker):
        """The process that runs the DataLoader: where this copy was pickled
        (spawn, forkserver), else the parent of a forked worker."""
        if not in_worker:
            return os.getpid()
        if self._unpickled_in == os.getpid():
            return self._pickled_by
        return os.getppid()

    def _worker_ring(self, worker, in_worker):
        pid, ring = self._ring_state
        if pid == os.getpid():
            return ring
        try:
            # in-process iteration has a region of its own ("m"): a DataLoader
            # worker 0 started later must not find it locked
            ring = _ring.WorkerRing(self._main_pid(in_worker), self._ring_token,
                                    worker if in_worker else "m", self.ring_slots)
        except _ring.RingBusy:
            log.warning("wirehead: ring region of worker %d is used by another iteration of "
                        "this dataset; this one sends batches the ordinary way", worker)
            ring = None
        self._ring_state = (os.getpid(), ring)
        return ring

    def _layout(self, store, gen, pos):
        """[(field index, name, dtype, shape, nbytes, cast target)] of the
        sample at (gen, pos), checked against what torch can hold."""
        o = self.order
        _, _, _, arrs = read_sample(store, gen, pos, o.want, self.timeout)
        out = []
        for i, name in zip(o.want, o.fields):
            a = arrs[i]
            target = (self.cast or {}).get(name)
            if _torch_dtype(target or a.dtype, asked=target is not None) is None:
                if target is None:
                    raise TypeError(needs_cast_message(name, a.dtype, numpy_ok=False))
                raise TypeError(f"cast={{'{name}': {target!r}}}: torch {torch.__version__} "
                                f"has no dtype {target!r}")
            if _torch_dtype(a.dtype, asked=True) is None:
                raise TypeError(f"field '{name}' is stored as {a.dtype}, which torch "
                                f"{torch.__version__} cannot view; batches=True needs a dtype "
                                f"torch has (use batches=False with cast=)")
            item = torch.empty((), dtype=_torch_dtype(a.dtype, asked=True)).element_size()
            nbytes = int(np.prod(a.shape, dtype=np.int64)) * item
            out.append((i, name, a.dtype, tuple(a.shape), nbytes, target))
        return out

    def _batches(self, plan, epoch, start, steps, gen, worker, in_worker):
        o = self.order
        store, gen, positions, pads = self._start(plan, epoch, start, steps, gen, worker)
        ring = self._worker_ring(worker, in_worker)
        B = self.batch_size
        # the field layout is learnt once per process (one extra read) and
        # learnt again only when a batch's first sample differs from it
        pid, layout = self._ring_layout
        layout = layout if pid == os.getpid() else None
        for b0 in range(0, len(positions), B):
            n = min(B, len(positions) - b0)
            if o.refresh == "step":
                try:
                    gen = max(gen, store.current())
                except _C.StoreUnavailableError:
                    pass
            try:
                if layout is None:
                    raise _NewLayout
                slot, mem, fields, extras = self._one_batch(store, ring, layout, positions, pads,
                                                            b0, n, gen, in_worker, True)
            except _NewLayout:
                layout = self._layout(store, gen, positions[b0])
                slot, mem, fields, extras = self._one_batch(store, ring, layout, positions, pads,
                                                            b0, n, gen, in_worker, False)
            self._ring_layout = (os.getpid(), layout)
            gen = extras["generation"][0][-1]
            self._progress = (epoch, start + b0 + n, gen)
            if slot is None:
                yield self._plain(mem, fields, extras)
            elif in_worker:
                yield ring.handle(slot, fields, extras)
            else:
                yield ring.local(slot, fields, extras)

    def _one_batch(self, store, ring, layout, positions, pads, b0, n, gen, in_worker,
                   may_relayout):
        """(slot or None, memory, fields, extras) of one batch read into a
        ring slot, or into ordinary memory when no slot comes free."""
        fields, off = [], 0
        for i, name, dtype, shape, nb, target in layout:
            fields.append((name, dtype, (n,) + shape, off, nb * n, target))
            off += -(-nb * n // 64) * 64
        got = ring.acquire(off, 0 if not in_worker else _RING_WAIT_S) if ring else None
        if got is None:
            slot, mem = None, np.empty(off, np.uint8)
            if ring is not None and not ring.warned:
                ring.warned = True
                log.warning("wirehead: every ring slot of worker %s is still held by batches "
                            "in use; sending batches the ordinary way (a copy) while that "
                            "lasts (raise ring_slots)", ring.worker)
        else:
            slot, mem = got
        try:
            extras = self._fill(store, mem, layout, fields, positions, pads, b0, n, gen,
                                may_relayout)
        except BaseException:
            if slot is not None:
                ring.give_back(slot)
            raise
        return slot, mem, fields, extras

    def _fill(self, store, mem, layout, fields, positions, pads, b0, n, gen, may_relayout):
        """Reads samples b0..b0+n-1 into their rows of mem (one copy each)."""
        o = self.order
        nf = len(self.cfg["SAMPLE"])
        pad_l, gen_l, pos_l = [], [], []
        view = memoryview(mem).cast("B")
        for r in range(n):
            bufs = [None] * nf
            for (i, name, dtype, shape, nb, _), (_, _, _, off, _, _) in zip(layout, fields):
                bufs[i] = view[off + r * nb:off + (r + 1) * nb]
            pos = positions[b0 + r]
            try:
                gen, pos, skipped_pad, lay, skipped = store.read_sample_into(
                    gen, pos, bufs, self.timeout)
            except _C.InvalidSampleError:
                lay = None  # a field of another size: named below
            if lay is None or any(lay[f[0]] != (f[2], f[3]) for f in layout):
                if r == 0 and may_relayout:
                    raise _NewLayout
                self._shape_error(store, gen, pos, layout)
            if skipped:
                log.warning("wirehead reader: skipped corrupt sample (%s); a neighbour stands "
                            "in as padding", skipped)
            is_pad = bool(pads[b0 + r]) or skipped_pad
            if is_pad and o.pad == "ignore":
                self._fill_ignore(view, layout, fields, r)
            pad_l.append(is_pad)
            gen_l.append(gen)
            pos_l.append(pos)
        return {"is_pad": (pad_l, "bool"), "generation": (gen_l, "int64"),
                "position": (pos_l, "int64")}

    def _shape_error(self, store, gen, pos, layout):
        other = {f[0]: (f[2], f[3]) for f in self._layout(store, gen, pos)}
        for i, name, dtype, shape, _, _ in layout:
            if other[i] != (dtype, shape):
                raise ValueError(
                    f"WireheadIterableDataset(batches=True) stacks samples of one shape: "
                    f"field '{name}' is {dtype} {list(shape)} in this batch but {other[i][0]} "
                    f"{list(other[i][1])} at generation {gen} position {pos}; use "
                    f"batches=False with a collate_fn for samples of varying shape")
        raise RuntimeError(f"sample at generation {gen} position {pos} does not fit the batch")

    def _fill_ignore(self, view, layout, fields, r):
        for (i, name, dtype, shape, nb, _), (_, _, _, off, _, _) in zip(layout, fields):
            if name in self.order.label_fields:
                tdt = getattr(torch, dtype)
                t = torch.frombuffer(view, dtype=tdt, offset=off + r * nb,
                                     count=nb // torch.empty((), dtype=tdt).element_size())
                check_ignore_fits(t.dtype, self.order.ignore_index, name)
                t.fill_(self.order.ignore_index)

    @staticmethod
    def _plain(mem, fields, extras):
        """A batch in ordinary memory (no free ring slot)."""
        out = {}
        for name, dtype, shape, off, nb, target in fields:
            t = torch.from_numpy(mem[off:off + nb]).view(getattr(torch, dtype)).view(shape)
            out[name] = t.to(getattr(torch, target)) if target and target != dtype else t
        for name, (values, dtype) in extras.items():
            out[name] = torch.tensor(values, dtype=getattr(torch, dtype))
        return out

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_store"] = ProcessStore(self.cfg)
        d["_ring_state"] = d["_ring_layout"] = (None, None)
        d["_pickled_by"] = os.getpid()
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._unpickled_in = os.getpid()
        # a rank process that received the dataset runs DataLoaders of its own
        weakref.finalize(self, _ring.cleanup, os.getpid(), self._ring_token)
