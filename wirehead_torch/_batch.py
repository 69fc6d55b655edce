"""Batches read straight into shared-memory ring slots: what
WireheadIterableDataset(batches=True) and the map-style readers
(MongoheadDataset / MongoTupleheadDataset with batches=True) share.

A BatchRing belongs to one dataset. In each process that reads batches it
holds that process's WorkerRing (_ring.py: a DataLoader worker's region, or
region "m" when the dataset is iterated in the process that owns it) and the
field layout last checked there. fill() is one C call (_C.ring_fill: each
listed sample read once, through the store's one read policy, into its row
of a free slot, with the rows' extras); deliver() turns the filled slot
into what crosses the DataLoader's queue (a RingBatch handle) or,
in-process, into the batch's tensors.
"""
import logging
import os
import weakref
from typing import NamedTuple, Optional

import numpy as np

from . import _C, _ring
from ._arrays import import_torch, needs_cast_message, torch_dtype
from ._order import warn_skipped
from ._reader import gen_text

log = logging.getLogger("wirehead_torch")

# How long a DataLoader worker waits for one of its slots (held by the main
# process's tensors) before it sends a batch the plain way.
RING_WAIT_S = 0.5


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


def refuse_in_loader(what, ds, **given):
    """refuse_with_batches for the ring of a DataLoader (what) over ds: the
    error names the dataset and the DataLoader's way out."""
    try:
        refuse_with_batches(**given)
    except ValueError as e:
        raise ValueError(f"{what}: {type(ds).__name__}({e}; or pass ring=False to the "
                         f"DataLoader for the ordinary collate path (two copies)") from None


class LayoutEntry(NamedTuple):
    """A field of the samples a batch stacks, as learnt from its first row."""
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


def _itemsize(dtype):
    torch = import_torch()  # not before a batch is read: numpy-only readers lack it
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


class Batch:
    """One filled batch: the slot (None: heap memory, no slot was free) and
    its stamp (version, sequence), its heap memory (a uint8 Array; None for
    a slot), the field layout (LayoutEntry per field) and each field's
    place in it (SlotField), the extras' places (is_pad, generation,
    position, params_version), the slot's seal (the XXH3 of its header and
    row table), the batch's layout as the main process reads it (wire:
    bytes only C reads) and whether rows of some fields stayed in the store
    (in_store)."""

    __slots__ = ("ring", "slot", "stamp", "mem", "layout", "fields", "extras", "seal", "wire",
                 "in_store")

    def __init__(self, *, ring, slot, stamp, mem, layout, fields, extras, seal, wire, in_store):
        self.ring, self.slot, self.stamp, self.mem, self.layout = ring, slot, stamp, mem, layout
        self.fields, self.extras, self.seal = fields, extras, seal
        self.wire, self.in_store = wire, in_store


class BatchRing:
    """Per-dataset state of the batch ring, rebuilt in every process.

    what: how messages name the reader ("MongoTupleheadDataset(batches=True)").
    nfields: fields a stored sample has (len(SAMPLE)); want: the indices
    read, names: their stored names, keys: the batch's names for them;
    form: "dict" ({key: tensor}) or "list" ([tensor, ...] in want order, as
    torch's default_collate makes of tuples); cast: {name: dtype} asked for;
    verify: the main process checks a batch at hand-over (VERIFY_READS): the
    slot's seal, and with rows (HANDOVER_CHECK: rows) every row again."""

    def __init__(self, what, slots, nfields, want, names, keys=None, form="dict", cast=None,
                 timeout=60.0, verify=True, rows=False):
        if (not isinstance(slots, int) or isinstance(slots, bool)
                or not 1 <= slots <= _C.RING_SLOTS_MAX):
            raise ValueError(f"ring_slots must be an integer 1..{_C.RING_SLOTS_MAX}, got {slots!r}")
        self.what = what
        # what the user asked the ring with, and how to leave it (a DataLoader sets its own)
        self.asked, self.way_out = "batches=True", "use batches=False"
        self.slots = slots
        self.nfields = nfields
        self.want = list(want)
        self.names = list(names)
        self.keys = list(keys or names)
        self.form = form
        self.cast = cast
        self.timeout = timeout
        self.verify = bool(verify)
        self.rows = bool(rows)
        # ring files are named by the DataLoader's main process and this token
        self.token = os.urandom(6).hex()
        self._ring = (None, None)  # (pid, WorkerRing) in this process
        self._checked = (None, None)  # (pid, the layout last checked) in this process
        self._pickled_by = self._unpickled_in = None
        _ring.hand_over_checks(self.token, self.verify, self.rows)
        weakref.finalize(self, _ring.cleanup, os.getpid(), self.token)
        _ring.remove_at_exit()  # what a worker made after that clean-up ran

    def owned_by_loader(self, what):
        """The ring's errors name what the user passed: a DataLoader (what)
        with ring=True."""
        self.what = f"{what} (ring=True, its default)"
        self.asked = "the DataLoader's ring (ring=True, its default)"
        self.way_out = "pass ring=False to the DataLoader"

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_ring"] = d["_checked"] = (None, None)
        d["_pickled_by"] = os.getpid()
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._unpickled_in = os.getpid()
        # a rank process that received the dataset runs DataLoaders of its own
        _ring.hand_over_checks(self.token, self.verify, self.rows)
        weakref.finalize(self, _ring.cleanup, os.getpid(), self.token)
        _ring.remove_at_exit()  # what a worker made after that clean-up ran

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
            if _ring.WorkerRing.first_fallback(self._main_pid(in_worker), self.token, worker):
                log.warning("wirehead: the ring region of worker %s was still held after %.0fs "
                            "by another live iteration of this dataset (an earlier DataLoader "
                            "iterator not shut down, or two iterating at once); this worker "
                            "sends its batches the ordinary way: pickled through the "
                            "DataLoader's queue, one more copy of every byte of every batch "
                            "(said once per dataset and worker)", worker, _ring.TAKEOVER_S)
            ring = None
        if ring is not None:
            # its descriptor holds the region's lock: closed with the dataset
            weakref.finalize(self, ring.close)
        self._ring = (os.getpid(), ring)
        return ring

    # --- layout ------------------------------------------------------------
    def _layout(self, layouts):
        """[LayoutEntry] of a batch's first row (layouts: ring_fill's
        FieldLayouts), checked against what torch can hold once per layout
        and process."""
        out = []
        for i, name in zip(self.want, self.names):
            dtype, shape = layouts[i].dtype, tuple(layouts[i].shape)
            out.append(LayoutEntry(i, name, dtype, shape, 0, (self.cast or {}).get(name)))
        pid, checked = self._checked
        if pid == os.getpid() and [e._replace(nbytes=0) for e in checked] == out:
            return checked
        torch = import_torch()
        for e in out:
            if torch_dtype(e.cast or e.dtype, asked=e.cast is not None) is None:
                if e.cast is None:
                    raise TypeError(needs_cast_message(e.name, e.dtype, numpy_ok=False))
                raise TypeError(f"cast={{'{e.name}': {e.cast!r}}}: torch {torch.__version__} "
                                f"has no dtype {e.cast!r}")
            if torch_dtype(e.dtype, asked=True) is None:
                raise TypeError(f"field '{e.name}' is stored as {e.dtype}, which torch "
                                f"{torch.__version__} cannot view; {self.asked} needs a dtype "
                                f"torch has ({self.way_out} with cast=)")
        out = [e._replace(nbytes=int(np.prod(e.shape, dtype=np.int64)) * _itemsize(e.dtype))
               for e in out]
        self._checked = (os.getpid(), out)
        return out

    def _shape_error(self, store, gen, pos, layout, skip):
        """Raises the error naming the field of the sample at (gen, pos)
        that differs from the batch's layout."""
        # the generation the read policy finds it in (the newest if gen was reclaimed)
        got = store.read_sample(gen, pos, self.want, self.timeout, skip)
        gen, pos = got.generation, got.position
        for e in layout:
            a = got.arrays[e.index]
            if (a.dtype, tuple(a.shape)) != (e.dtype, e.shape):
                raise ValueError(
                    f"{self.what} stacks samples of one shape: field '{e.name}' is {e.dtype} "
                    f"{list(e.shape)} in this batch but {a.dtype} {list(a.shape)} at "
                    f"generation {gen_text(store, None, gen)} position {pos}; "
                    f"{self.way_out} with a collate_fn for samples of varying shape")
        raise RuntimeError(f"sample at generation {gen_text(store, None, gen)} position {pos} "
                           f"does not fit the batch")

    # --- reading a batch ---------------------------------------------------
    def fill(self, store, gen, positions, worker, skip=True, pads=None, ignore=None,
             direct_min=0, spec=None):
        """(Batch, rows): the samples at positions of generation gen, each
        read once through the store's read policy (a reclaimed generation
        moves to the newest; a corrupt sample is skipped and a neighbour
        stands in, or with skip=False raises CorruptSampleError naming it)
        into its row of a free slot of this process's ring, in one C call.
        rows: one RowRead (generation, position, is_pad, params_version) per
        sample, as read; pads: which rows the plan pads; ignore: (label
        field names, ignore_index) for pad='ignore', written into the
        padding rows' label fields (the caller checks it fits their dtype).
        worker: the DataLoader worker id, None in-process. direct_min > 0 (a
        device iteration, an shm store): rows of at least that many bytes
        stay in the store for the main process's device copy, in a slot
        only (heap memory gets them copied). spec (spec mode): (spec_gen,
        SWAP_CAP): gen holds spec generation spec_gen, read exactly; the
        batch's generation column says spec_gen and a spec_index column is
        added (docs/reproducible.md)."""
        spec_gen, cap = spec or (None, 0)
        ring = self.worker_ring(worker)
        pos = np.asarray(positions, dtype=np.uint32)
        pad = b"" if pads is None else bytes(bytearray(bool(p) for p in pads))
        labels, value = ignore or ((), None)
        # the value goes in as the batch is delivered: label fields cast to
        # another dtype get it in their cast copy (_ring.tensors), the rest here
        cast = self.cast or {}
        in_c = [i for i, name in zip(self.want, self.names) if name in labels and name not in cast]
        got = _C.ring_fill(ring=ring.c if ring else None, store=store, generation=gen,
                           positions=pos.tobytes(), pads=pad, want=self.want,
                           timeout=self.timeout, skip=skip,
                           wait_s=RING_WAIT_S if worker is not None and ring else 0,
                           ignore_fields=in_c if ignore else None, ignore_value=value,
                           direct_min=direct_min if ring else 0, spec_gen=spec_gen)
        if got.mismatch_generation is not None:
            first = [LayoutEntry(i, name, got.layouts[i].dtype, tuple(got.layouts[i].shape), 0,
                                 None) for i, name in zip(self.want, self.names)]
            self._shape_error(store, got.mismatch_generation, got.mismatch_position, first, skip)
        try:
            layout = self._layout(got.layouts)
        except BaseException:
            if got.slot >= 0:
                ring.give_back(got.slot)
            raise
        if got.slot < 0 and ring is not None and not ring.warned:
            ring.warned = True
            log.warning("wirehead: every ring slot of worker %s is still held by batches "
                        "in use; sending batches the ordinary way (a copy) while that "
                        "lasts (raise ring_slots)", ring.worker)
        if got.skipped:
            warn_skipped("wirehead reader", got.skipped, got.last_skip)
        n = len(got.position)
        fields = [_ring.SlotField(key, e.dtype, (n,) + e.shape, got.offsets[e.index],
                                  e.nbytes * n, e.cast,
                                  (value, got.pad_offset) if ignore and e.name in labels
                                  and e.index not in in_c else None)
                  for e, key in zip(layout, self.keys)]
        extras = (("is_pad", got.pad_offset, "bool", n),
                  ("generation", got.generation_offset, "int64", n),
                  ("position", got.position_offset, "int64", n),
                  ("params_version", got.params_version_offset, "int64", n))
        if spec_gen is not None:  # columns made from the stored ones: (mul, add)
            extras = (extras[0], ("generation", got.generation_offset, "int64", n, (0, spec_gen)),
                      extras[2], ("spec_index", got.position_offset, "int64", n,
                                  (1, spec_gen * cap)), extras[3])
        slot = got.slot if got.slot >= 0 else None
        batch = Batch(ring=ring if slot is not None else None, slot=slot,
                      stamp=(got.version, got.sequence), mem=got.memory, layout=layout,
                      fields=fields, extras=extras, seal=got.seal, wire=got.wire,
                      in_store=got.in_store)
        return batch, [RowRead(*r) for r in zip(got.generation, got.position, got.is_pad,
                                                  got.params_version)]

    def give_back(self, batch):
        """The batch's slot back to the ring (the batch will not be sent)."""
        if batch.slot is not None:
            batch.ring.give_back(batch.slot)

    def deliver(self, batch, extras=False, in_worker=False):
        """The filled batch as a DataLoader worker sends it (a RingBatch
        handle), or in-process as tensors over the slot; in heap memory
        when no slot was free. extras: add the rows' is_pad, generation,
        position and params_version as small tensors."""
        more = batch.extras if extras else ()
        if batch.slot is None:
            mem, batch.mem = batch.mem, None
            if in_worker:
                return _ring.tensors(mem, batch.fields, more, self.form)
            return _ring.batch_of(mem, batch.fields, more, self.form, self.token)
        version, sequence = batch.stamp
        if in_worker:
            return batch.ring.handle(slot=batch.slot, version=version, sequence=sequence,
                                     fields=batch.fields, extras=more, form=self.form,
                                     seal=batch.seal, wire=batch.wire, in_store=batch.in_store)
        return batch.ring.local(slot=batch.slot, fields=batch.fields, extras=more,
                                form=self.form, wire=batch.wire, in_store=batch.in_store)
