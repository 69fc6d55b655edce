"""Map-style readers of the current generation, with the original names."""
import copy
import logging

import numpy as np

from ._arrays import to_output
from ._batch import BatchRing, refuse_in_loader, refuse_with_batches
from ._order import WorkerShare, plan_sizes, rank_world
from ._reader import Generations, check_views_store, read_sample, reader_timeout, view_sample
from ._spec_read import EpochIndex
from ._store import ProcessStore, check_min_params
from .config import get_config

try:
    import torch
    _Base = torch.utils.data.Dataset
    _Sampler = torch.utils.data.Sampler
except ImportError:  # pragma: no cover - torch is a dependency of readers
    torch = None
    _Base = _Sampler = object

log = logging.getLogger("wirehead_torch")


def unit_interval_normalize(img):
    """Scales img to [0, 1] by its minimum and maximum (the original's
    preprocessing helper, for the ``normalize=`` keyword)."""
    lo, hi = img.min(), img.max()
    return (img - lo) / (hi - lo)


class _CurrentGenerationReader(_Base):
    """Keywords of the original wirehead keep their meaning: ``sample``
    names the (input, label) fields; ``transform`` is applied to each field
    read (a tensor or array here: the bytes need no decoding), ``normalize``
    to the input as float, as the original did; ``keeptrying=False`` reads
    once without waiting for a generation (True: wait up to ``timeout``);
    ``id`` is accepted, positions 0..SWAP_CAP-1 being the index.

    ``batches=True``: ``ds[list_of_indices]`` is the whole batch, with the
    structure torch's default collate gives this dataset's items, each
    sample read once into a row of a reused shared-memory ring slot
    (``ring_slots`` per DataLoader worker). Use it as
    ``DataLoader(ds, batch_size=None, sampler=BatchSampler(sampler, B,
    drop_last), num_workers=K)``: only a small handle crosses the worker's
    queue and the batch's tensors in the main process view the slot, which
    goes back to its worker once they are all gone (docs/copies.md). A
    single index still reads the one item. ``transform=``, ``normalize=``,
    ``views=True`` and ``output="numpy"`` cannot work on shared slots and
    are refused with it."""

    _KEYS = None  # the batch's names of the two fields (None: their SAMPLE names)
    _FORM = "dict"  # "dict" or "list", as default_collate makes of the items

    def __init__(self, config_path=None, config=None, *, timeout=None, output="torch",
                 cast=None, sample=None, transform=None, normalize=None, keeptrying=True,
                 id="id", collection=None, views=False, batches=False, ring_slots=4,
                 min_params_version=None):
        if collection is not None:
            raise ValueError("collection= (a pymongo collection) is not supported: give "
                             "config_path= (or config=) naming the store")
        self.cfg = get_config(config_path or None, config)
        self.min_params_version = check_min_params(min_params_version)
        if views:
            check_views_store(self.cfg)
        self.views = bool(views)
        names = self.cfg["SAMPLE"][:2] if sample is None else list(sample)
        if len(names) != 2:
            raise ValueError(f"{type(self).__name__} reads two fields (input, label); "
                             f"{'sample=' if sample is not None else 'SAMPLE'} names {names}")
        missing = [n for n in names if n not in self.cfg["SAMPLE"]]
        if missing:
            raise ValueError(f"sample= names {missing}, which SAMPLE {self.cfg['SAMPLE']} "
                             f"does not hold")
        self.fields = [self.cfg["SAMPLE"].index(n) for n in names]
        if batches:
            if torch is None:
                raise ImportError("batches=True hands out torch tensors: install torch")
            refuse_with_batches(transform=transform is not None,
                                normalize=normalize is not None, views=views,
                                output=output != "torch")
            if names[0] == names[1]:
                raise ValueError(f"batches=True reads two distinct fields; sample= names "
                                 f"{names[0]!r} twice")
        self.batches = bool(batches)
        self.ring_slots = ring_slots
        self.timeout = reader_timeout(self.cfg, timeout)
        if not keeptrying:
            self.timeout = 0.001  # one look, no wait
        self.output = output
        self.cast = cast
        self.names = names
        self.transform = transform
        self.normalize = normalize
        self.keeptrying = keeptrying
        self.id = id
        self._epoch = 0  # spec mode: the epoch a read of an index is in (set_epoch)
        self._fresh_state()

    def _fresh_state(self):
        """Store handle and ring of this object alone."""
        self._store = ProcessStore(self.cfg, local=True, min_params=self.min_params_version)
        self._batch_ring = BatchRing(f"{type(self).__name__}(batches=True)", self.ring_slots,
                                     len(self.cfg["SAMPLE"]), self.fields, self.names,
                                     keys=self._KEYS, form=self._FORM, cast=self.cast,
                                     timeout=self.timeout, verify=self.cfg["VERIFY_READS"],
                                     rows=self.cfg["HANDOVER_CHECK"] == "rows")
        self._warned_single = False  # batches=True read one index in a DataLoader worker

    @property
    def _generations(self):
        """Which generation each read starts on (_reader.Generations)."""
        return Generations(self.cfg, self.timeout, self.min_params_version,
                           who=type(self).__name__)

    def set_epoch(self, epoch):
        """Spec mode (RUN_SEED): reads of ds[i] read epoch's spec generation
        (epoch // REUSE; docs/reproducible.md). Without RUN_SEED every read
        starts on the newest generation and the epoch is not asked."""
        self._epoch = int(epoch)

    def _read_gen(self, store, index):
        """(generation id, spec generation or None) a read of index starts
        on: the newest; in spec mode the spec generation of the epoch the
        index carries (the DataLoader's sampler), else of set_epoch's."""
        rule = self._generations
        epoch = getattr(index, "epoch", self._epoch)
        return rule.for_epoch(store, epoch=epoch), rule.spec_gen(epoch)

    def _private_copy(self):
        """A copy with store handle and ring of its own (what a
        wirehead_torch.DataLoader reads: two loaders over one dataset must
        not share a ring)."""
        other = copy.copy(self)
        other._fresh_state()
        return other

    def __len__(self):
        return self.cfg["SWAP_CAP"]

    def _position(self, index):
        n = len(self)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} out of range for SWAP_CAP={n}")
        return i

    def _pair(self, index):
        i = self._position(index)
        if self.batches and not self._warned_single and torch is not None \
                and torch.utils.data.get_worker_info() is not None:
            self._warned_single = True
            log.warning("wirehead: %s(batches=True) is read one index at a time in a "
                        "DataLoader worker, so the DataLoader collates (two copies); give "
                        "it sampler=BatchSampler(...) and batch_size=None for the ring",
                        type(self).__name__)
        store = self._store.get()
        gen, spec_gen = self._read_gen(store, index)
        # an indexed read names its corrupt sample rather than substitute another
        got = (view_sample(store, gen, i, self.fields, self.timeout, skip=False,
                           spec_gen=spec_gen) if self.views else None)
        viewed = got is not None
        if not viewed:
            got = read_sample(store, gen, i, self.fields, self.timeout, skip=False,
                              spec_gen=spec_gen)
        arrs = got.arrays
        x, y = (to_output(a, name, self.output, self.cast)
                for a, name in zip([arrs[f] for f in self.fields], self.names))
        if viewed and self.output == "numpy":
            for v in (x, y):  # numpy can say read-only; torch cannot (a write there faults)
                if not v.flags.owndata:
                    v.flags.writeable = False
        if self.transform is not None:
            x, y = self.transform(x), self.transform(y)
        if self.normalize is not None:
            x = self.normalize(x.float() if hasattr(x, "float") else np.asarray(x, np.float32))
        return x, y

    @staticmethod
    def _is_batch(index):
        return isinstance(index, (list, tuple, range, np.ndarray)) or (
            torch is not None and isinstance(index, torch.Tensor) and index.dim() == 1)

    def _ring_batch(self, index):
        """batches=True: the samples at index (a list), each read once
        through the one C read policy (a corrupt sample is an error naming
        it; a reclaimed generation moves to the newest) into a row of a ring
        slot; a handle in a DataLoader worker, the batch in-process."""
        positions = [self._position(i) for i in index]
        if not positions:
            raise IndexError(f"{type(self).__name__}(batches=True): an empty list of "
                             f"indices is no batch")
        store = self._store.get()
        gen, spec_gen = self._read_gen(store, index[0])
        info = torch.utils.data.get_worker_info()
        worker = None if info is None else info.id
        batch, _ = self._batch_ring.fill(
            store, gen, positions, worker, skip=False,
            spec=None if spec_gen is None else (spec_gen, self.cfg["SWAP_CAP"]))
        return self._batch_ring.deliver(batch, in_worker=worker is not None)


class MongoheadDataset(_CurrentGenerationReader):
    """``ds[i]`` -> ``{'input': ..., 'label': ...}`` (the first two SAMPLE
    fields, exact stored dtype and shape); ``ds[[i, j]]`` -> ``{i: ..., j: ...}``,
    or with ``batches=True`` the batch ``{'input': X, 'label': Y}`` (a leading
    batch dimension). Works on any store (shm:// or mongodb://)."""

    _KEYS = ("input", "label")

    def __getitem__(self, index):
        if self._is_batch(index):
            if self.batches:
                return self._ring_batch(index)
            return {int(i): self[int(i)] for i in index}
        x, y = self._pair(index)
        return {"input": x, "label": y}


class MongoTupleheadDataset(_CurrentGenerationReader):
    """``ds[i]`` -> ``(input, label)``; ``ds[[i, j]]`` -> a list of tuples, or
    with ``batches=True`` the batch ``[X, Y]`` (a list, as torch's
    default_collate makes of tuples)."""

    _FORM = "list"

    def __getitem__(self, index):
        if self._is_batch(index):
            if self.batches:
                return self._ring_batch(index)
            return [self[int(i)] for i in index]
        return self._pair(index)


class PlanBatchSampler(_Sampler):
    """Batches of positions for a map-style reader, in the plan's order: the
    rank's share of a generation (every rank the same count, a short one
    repeating samples as torch's DistributedSampler does), shuffled by
    (seed, epoch), cut into batches (WorkerShare); drop_last drops a
    partial last batch. epoch and start (batches to skip) are set by the
    DataLoader before each iteration."""

    def __init__(self, swap_cap, batch_size, drop_last, shuffle, seed, rank, world_size,
                 spec=False):
        self.swap_cap = swap_cap
        self.spec = spec  # spec mode: each position carries its epoch (EpochIndex)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        self._rank, self._world = rank, world_size
        self.epoch = 0
        self.start = 0

    def plan(self):
        rank, world = rank_world(self._rank, self._world)
        # workers 0: a map-style DataLoader hands batches to its workers in
        # order itself; batch only matters with drop_last (whole batches)
        return dict(swap_cap=self.swap_cap, world=world, rank=rank, workers=0, worker=0,
                    batch=self.batch_size if self.drop_last else 0, shuffle=self.shuffle,
                    seed=self.seed, pad=0, drop_last=self.drop_last)

    def __len__(self):
        steps = plan_sizes(self.plan())["steps"]
        return -(-steps // self.batch_size)

    def __iter__(self):
        share = WorkerShare(self.plan(), self.epoch)
        start, self.start = self.start, 0
        for positions, _ in share.batches(self.batch_size, skip=start):
            if self.spec:
                yield [EpochIndex(p, self.epoch) for p in positions]
            else:
                yield positions.tolist()


class MapAdapter:
    """What wirehead_torch.DataLoader asks of a MongoheadDataset or
    MongoTupleheadDataset (one adapter per dataset kind;
    iterable.IterableAdapter is the other): a copy of the dataset set up
    for the DataLoader (batches=True on the ring), the sampler that orders
    it by the plan, and its plan, epochs and resume state, through named
    methods."""

    kind = "map"
    hands_over_positions = False  # every row of its batches is in the slot

    @staticmethod
    def fits(dataset):
        return isinstance(dataset, _CurrentGenerationReader)

    def __init__(self, dataset, what, *, ring, batch_size, num_workers, shuffle, drop_last,
                 seed):
        del num_workers  # torch hands the sampler's batches to the workers in turn
        ds = self.dataset = dataset._private_copy()
        self.ring = ring
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"{what}: seed must be an integer, got {seed!r}")
        if ring:
            refuse_in_loader(what, ds, transform=ds.transform is not None,
                             normalize=ds.normalize is not None, views=ds.views,
                             output=ds.output != "torch")
            if ds.names[0] == ds.names[1]:
                raise ValueError(f"{what}: the ring reads two distinct fields; sample= "
                                 f"names {ds.names[0]!r} twice (pass ring=False)")
        ds.batches = ring
        ds._batch_ring.owned_by_loader(what)
        self.sampler = PlanBatchSampler(len(ds), batch_size, bool(drop_last), bool(shuffle),
                                        seed, None, None, spec=ds.cfg["RUN_SEED"] is not None)

    def torch_args(self, collate_fn):
        """The torch DataLoader's arguments this kind sets: the sampler's
        batches, whole (the ring) or collated."""
        if self.ring:
            return dict(batch_size=None, sampler=self.sampler)
        return dict(batch_sampler=self.sampler, collate_fn=collate_fn)

    @property
    def token(self):
        """The dataset's ring (its files' name)."""
        return self.dataset._batch_ring.token

    def plan(self):
        """The plan of this rank (its batches go to the workers in turn)."""
        return self.sampler.plan()

    def begin_epoch(self, epoch, start, resume):
        """The next iteration runs epoch from the rank's batch start on."""
        del resume  # the sampler's epoch and start say it all
        self.sampler.epoch, self.sampler.start = epoch, start

    def generation(self):
        """0: every read starts on the newest generation, none is the
        epoch's."""
        return 0

    def resume_state(self, mid_epoch):
        """This kind's part of the DataLoader's state_dict(): none."""
        del mid_epoch
        return {}

    def loaded(self, state):
        """A state for load_state_dict: the one to keep."""
        return copy.deepcopy(state)

    def spec_waits(self):
        """(waits, seconds) its workers waited for a spec generation: their
        reads find the one the main process waited for."""
        return 0, 0.0

    def set_direct_min(self, nbytes):
        """No rows stay in the store: nothing to set."""
        del nbytes

    def store(self):
        """This process's handle on the dataset's store."""
        return self.dataset._store.get()
