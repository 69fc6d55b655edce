"""Batches read straight into shared-memory ring slots: what
WireheadIterableDataset(batches=True) and the map-style readers
(MongoheadDataset / MongoTupleheadDataset with batches=True) share.

A BatchRing belongs to one dataset. In each process that reads batches it
holds that process's WorkerRing (_ring.py: a DataLoader worker's region, or
region "m" when the dataset is iterated in the process that owns it) and the
field layout learnt there. fill() reads each listed sample once, through the
store's one C read policy, into its row of a free slot; deliver() turns the
filled slot into what crosses the DataLoader's queue (a RingBatch handle) or,
in-process, into the batch's tensors.
"""
import logging
import os
import weakref
from typing import NamedTuple, Optional

import numpy as np

from . import _C, _ring
from ._arrays import _import_torch, _torch_dtype, needs_cast_message

log = logging.getLogger("wirehead_torch")

# How long a DataLoader worker waits for one of its slots (held by the main
# process's tensors) before it sends a batch the plain way.
RING_WAIT_S = 0.5
_ALIGN = 64  # each field's rows start on a cache line of the slot


# What batches=True cannot serve, by keyword: the batch's tensors view a
# shared slot that the samples were read into unchanged.
_REFUSED = {
    "transform": "batches=True hands out batches that view shared slots; apply the "
                 "transform to each batch in the training loop instead",
    "normalize": "normalize= scales each sample by its own minimum and maximum as it is "
                 "read, and batches=True reads samples unchanged into a shared slot; "
                 "normalize the batch's rows in the training loop instead",
    "views": "views=True and batches=True exclude each other: batches are copied once "
             "into ring slots, views are not copied at all",
    "output": "batches=True hands out torch tensors that view a shared slot (what a "
              "DataLoader's collate makes of numpy samples too); output='numpy' needs "
              "batches=False",
}


def refuse_with_batches(**given):
    """ValueError naming the first keyword given (true) that batches=True
    cannot serve, and why."""
    for key, on in given.items():
        if on:
            raise ValueError(f"{key}= with batches=True: {_REFUSED[key]}")


class LayoutEntry(NamedTuple):
    """A field of the samples a batch stacks, as learnt from one of them."""
    index: int  # in the stored sample
    name: str  # stored name
    dtype: str
    shape: tuple  # of one sample's field
    nbytes: int  # of one sample's field
    cast: Optional[str]  # the dtype asked for by cast=, None: as stored


class RowRead(NamedTuple):
    """Where one row of a batch was read from (the read policy may move it)."""
    generation: int
    position: int
    is_pad: bool
    params_version: int  # of the sample read (docs/params.md)


class _NewLayout(Exception):
    """A batch's first sample has another layout than the one cached."""


def _itemsize(dtype):
    torch = _import_torch()  # not before a batch is read: numpy-only readers lack it
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


class Batch:
    """One batch being filled: the slot (None: ordinary memory, no slot was
    free), its memory, the field layout and each field's place in it."""

    __slots__ = ("ring", "slot", "mem", "layout", "fields", "sums")

    def __init__(self, ring, slot, mem, layout, fields):
        self.ring, self.slot, self.mem, self.layout, self.fields = ring, slot, mem, layout, fields
        self.sums = {}  # (layout entry, row) -> the XXH3-64 its bytes have

    def checks(self):
        """(offset, nbytes, XXH3-64) of every row of every field: what the
        main process checks a slot against before a tensor views it."""
        return [(self.fields[k].offset + r * self.layout[k].nbytes, self.layout[k].nbytes, h)
                for (k, r), h in sorted(self.sums.items())]

    def resum(self, k, r):
        """Row r of layout entry k was written after its read: hash it anew."""
        if self.slot is not None:
            nb = self.layout[k].nbytes
            self.sums[(k, r)] = self.mem.hash(self.fields[k].offset + r * nb, nb)

    def row(self, k, r):
        """Layout entry k of row r as a flat, writable tensor over the batch's memory."""
        dtype, nb = self.layout[k].dtype, self.layout[k].nbytes
        torch = _import_torch()
        return torch.frombuffer(memoryview(self.mem).cast("B"), dtype=getattr(torch, dtype),
                                offset=self.fields[k].offset + r * nb,
                                count=nb // _itemsize(dtype))


class BatchRing:
    """Per-dataset state of the batch ring, rebuilt in every process.

    what: how messages name the reader ("MongoTupleheadDataset(batches=True)").
    nfields: fields a stored sample has (len(SAMPLE)); want: the indices
    read, names: their stored names, keys: the batch's names for them;
    form: "dict" ({key: tensor}) or "list" ([tensor, ...] in want order, as
    torch's default_collate makes of tuples); cast: {name: dtype} asked for."""

    def __init__(self, what, slots, nfields, want, names, keys=None, form="dict", cast=None,
                 timeout=60.0):
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise ValueError(f"ring_slots must be a positive integer, got {slots!r}")
        self.what = what
        self.slots = slots
        self.nfields = nfields
        self.want = list(want)
        self.names = list(names)
        self.keys = list(keys or names)
        self.form = form
        self.cast = cast
        self.timeout = timeout
        # ring files are named by the DataLoader's main process and this token
        self.token = os.urandom(6).hex()
        self._ring = (None, None)  # (pid, WorkerRing) in this process
        self._layout = (None, None)  # (pid, field layout) in this process
        self._pickled_by = self._unpickled_in = None
        weakref.finalize(self, _ring.cleanup, os.getpid(), self.token)

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_ring"] = d["_layout"] = (None, None)
        d["_pickled_by"] = os.getpid()
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._unpickled_in = os.getpid()
        # a rank process that received the dataset runs DataLoaders of its own
        weakref.finalize(self, _ring.cleanup, os.getpid(), self.token)

    # --- this process's ring region ---------------------------------------
    def _main_pid(self, in_worker):
        """The process that runs the DataLoader: where this copy was pickled
        (spawn, forkserver), else the parent of a forked worker."""
        if not in_worker:
            return os.getpid()
        if self._unpickled_in == os.getpid():
            return self._pickled_by
        return os.getppid()

    def worker_ring(self, worker):
        """This process's WorkerRing (worker None: in-process iteration), or
        None when another live process holds the region."""
        pid, ring = self._ring
        if pid == os.getpid():
            return ring
        in_worker = worker is not None
        try:
            # in-process iteration has a region of its own ("m"): a DataLoader
            # worker 0 started later must not find it locked
            ring = _ring.WorkerRing(self._main_pid(in_worker), self.token,
                                    worker if in_worker else "m", self.slots)
        except _ring.RingBusy:
            log.warning("wirehead: ring region of worker %s is used by another iteration of "
                        "this dataset; this one sends batches the ordinary way", worker)
            ring = None
        if ring is not None:
            # its descriptor holds the region's lock: closed with the dataset
            weakref.finalize(self, ring.close)
        self._ring = (os.getpid(), ring)
        return ring

    # --- layout ------------------------------------------------------------
    def layout(self, store, gen, pos, skip=True):
        """[LayoutEntry] of the sample at (gen, pos), checked against what
        torch can hold."""
        torch = _import_torch()
        arrs = store.read_sample(gen, pos, self.want, self.timeout, skip).arrays
        out = []
        for i, name in zip(self.want, self.names):
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
            nbytes = int(np.prod(a.shape, dtype=np.int64)) * _itemsize(a.dtype)
            out.append(LayoutEntry(i, name, a.dtype, tuple(a.shape), nbytes, target))
        return out

    def _shape_error(self, store, gen, pos, layout, skip, cause=None):
        """Raises the error naming the field of the sample at (gen, pos)
        that differs from the batch's layout; cause: the read's own error."""
        # the generation the read policy finds it in (the newest if gen was reclaimed)
        got = store.read_sample(gen, pos, self.want, self.timeout, skip)
        gen, pos = got.generation, got.position
        for e in layout:
            a = got.arrays[e.index]
            if (a.dtype, tuple(a.shape)) != (e.dtype, e.shape):
                raise ValueError(
                    f"{self.what} stacks samples of one shape: field '{e.name}' is {e.dtype} "
                    f"{list(e.shape)} in this batch but {a.dtype} {list(a.shape)} at "
                    f"generation {gen} position {pos}; use batches=False with a collate_fn "
                    f"for samples of varying shape") from cause
        raise RuntimeError(f"sample at generation {gen} position {pos} does not fit the batch"
                           + (f": {cause}" if cause else "")) from cause

    # --- reading a batch ---------------------------------------------------
    def fill(self, store, gen, positions, worker, skip=True):
        """(Batch, rows): the samples at positions of generation gen, each
        read once through the store's read policy (a reclaimed generation
        moves to the newest; a corrupt sample is skipped and a neighbour
        stands in, or with skip=False raises CorruptSampleError naming it)
        into its row of a free slot of this process's ring. rows: one
        RowRead (generation, position, is_pad, params_version) per sample, as read. worker: the
        DataLoader worker id, None in-process."""
        ring = self.worker_ring(worker)
        pid, layout = self._layout
        layout = layout if pid == os.getpid() else None
        # the layout is learnt once per process (one extra read) and again
        # only when a batch's first sample differs from it
        try:
            if layout is None:
                raise _NewLayout
            got = self._one(store, ring, layout, gen, positions, worker, skip, True)
        except _NewLayout:
            layout = self.layout(store, gen, positions[0], skip)
            got = self._one(store, ring, layout, gen, positions, worker, skip, False)
        self._layout = (os.getpid(), layout)
        return got

    def _one(self, store, ring, layout, gen, positions, worker, skip, may_relayout):
        n = len(positions)
        fields, off = [], 0
        for e, key in zip(layout, self.keys):
            fields.append(_ring.SlotField(key, e.dtype, (n,) + e.shape, off, e.nbytes * n, e.cast))
            off += -(-e.nbytes * n // _ALIGN) * _ALIGN
        got = ring.acquire(off, RING_WAIT_S if worker is not None else 0) if ring else None
        if got is None:
            slot, mem = None, np.empty(off, np.uint8)
            if ring is not None and not ring.warned:
                ring.warned = True
                log.warning("wirehead: every ring slot of worker %s is still held by batches "
                            "in use; sending batches the ordinary way (a copy) while that "
                            "lasts (raise ring_slots)", ring.worker)
        else:
            slot, mem = got
        batch = Batch(ring, slot, mem, layout, fields)
        try:
            rows = self._rows(store, batch, gen, positions, skip, may_relayout)
        except BaseException:
            self.give_back(batch)
            raise
        return batch, rows

    def _rows(self, store, batch, gen, positions, skip, may_relayout):
        """Reads each sample into its row of batch (one copy each)."""
        layout, fields = batch.layout, batch.fields
        view = memoryview(batch.mem).cast("B")
        rows = []
        for r, pos in enumerate(positions):
            bufs = [None] * self.nfields
            for e, f in zip(layout, fields):
                bufs[e.index] = view[f.offset + r * e.nbytes:f.offset + (r + 1) * e.nbytes]
            cause = None
            if batch.slot is not None:
                batch.mem.check()  # the slot file still whole: the copy cannot SIGBUS
            got = None
            try:
                got = store.read_sample_into(gen, pos, bufs, self.timeout, skip)
                gen, pos = got.generation, got.position
            except _C.InvalidSampleError as err:
                cause = err  # a field of another size: named below
            if got is None or any(got.layouts[e.index] != (e.dtype, e.shape) for e in layout):
                if r == 0 and may_relayout:
                    raise _NewLayout
                self._shape_error(store, gen, pos, layout, skip, cause)
            if got.skipped:
                log.warning("wirehead reader: skipped corrupt sample (%s); a neighbour stands "
                            "in as padding", got.skipped)
            for k, e in enumerate(layout):  # checked during the copy: no second pass here
                batch.sums[(k, r)] = got.checksums[e.index]
            rows.append(RowRead(gen, pos, bool(got.is_pad), store.last_params_version))
        return rows

    def give_back(self, batch):
        """The batch's slot back to the ring (the batch will not be sent)."""
        if batch.slot is not None:
            batch.ring.give_back(batch.slot)

    def deliver(self, batch, extras=None, in_worker=False):
        """The filled batch as a DataLoader worker sends it (a RingBatch
        handle), or in-process as tensors over the slot; in ordinary memory
        when no slot was free. extras: {name: (values, dtype)} added as
        small tensors (the iterable's is_pad, generation, position)."""
        extras = extras or {}
        if batch.slot is None:
            return _ring.plain(batch.mem, batch.fields, extras, self.form)
        if in_worker:
            return batch.ring.handle(batch.slot, batch.fields, extras, self.form, batch.checks())
        return batch.ring.local(batch.slot, batch.fields, extras, self.form)
