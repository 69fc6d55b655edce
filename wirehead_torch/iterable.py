"""WireheadIterableDataset: this worker's share of each epoch, for an
ordinary torch DataLoader under DDP."""
import copy

import torch

from . import _C
from ._arrays import to_output
from ._batch import BatchRing, refuse_in_loader, refuse_with_batches
from ._epochs import MAX_WORKERS, EpochState
from ._order import (
    Order,
    SpecShare,
    WorkerShare,
    check_ignore_fits,
    check_yields,
    plan_sizes,
    warn_padding,
)
from ._reader import (
    Generations,
    check_int,
    check_views_store,
    read_sample,
    reader_timeout,
    view_sample,
)
from ._spec_read import check_spec_order, spec_state
from ._store import ProcessStore, check_min_params
from .config import get_config


class WireheadIterableDataset(torch.utils.data.IterableDataset):
    """Yields this DataLoader worker's items of each epoch: dicts of tensors
    named by SAMPLE (or ``fields``) plus ``is_pad`` (bool), ``generation``
    and ``position`` (int64). Every worker of every rank yields the same
    number of items; no two get the same sample of the same generation in
    an epoch (docs/design.md, "Sample order").

    Pass the DataLoader's ``batch_size`` and ``num_workers`` to pad every
    worker to whole batches and make ``len(DataLoader)`` exact, and its
    ``drop_last`` to drop each worker's partial last batch instead of
    padding it (``wirehead_torch.DataLoader`` passes all three itself).

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
    (docs/copies.md, "Store-backed views and reader pins"); when the pin policy
    refuses a view the item is a copy. Under DataLoader workers a view
    could not cross the process boundary, so views=True is ignored there
    (each worker reads copies; use batches=True for one copy per sample)."""

    def __init__(self, config_path=None, config=None, *, fields=None, batch_size=None,
                 num_workers=None, shuffle=True, seed=0, pad="repeat", ignore_index=-100,
                 label_fields=None, refresh="epoch", transform=None, rank=None,
                 world_size=None, cast=None, timeout=None, batches=False, ring_slots=4, views=False,
                 drop_last=False, min_params_version=None):
        super().__init__()
        self.cfg = get_config(config_path, config)
        self.min_params_version = check_min_params(min_params_version)
        if views:
            check_views_store(self.cfg)
        self.views = bool(views)
        self.order = Order(self.cfg, fields, shuffle, seed, pad, ignore_index, label_fields,
                           refresh, rank, world_size)
        check_spec_order(self.cfg, self.order, "WireheadIterableDataset")
        if batch_size is not None:
            check_int("batch_size", batch_size, 1, _C.SWAP_CAP_MAX)
        if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 0
                                        or num_workers > MAX_WORKERS):
            raise ValueError(f"num_workers must be 0..{MAX_WORKERS}, got {num_workers!r}")
        if batches and not batch_size:
            raise ValueError("batches=True yields whole batches: give batch_size too")
        if batches:
            refuse_with_batches(views=views, transform=transform is not None)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.batches = bool(batches)
        self.drop_last = bool(drop_last)
        self.ring_slots = ring_slots
        self._pad_memo = {}  # the epoch whose padding was last reported
        self._pad_warn = True  # False: the wirehead_torch.DataLoader reports it
        self.transform = transform
        self.cast = cast
        self.timeout = reader_timeout(self.cfg, timeout)
        self._fresh_state()

    def _fresh_state(self):
        """Epoch state, store handle and ring of this object alone (also for
        the copy a wirehead_torch.DataLoader makes: two loaders over one
        dataset must not share them)."""
        self._batch_ring = BatchRing("WireheadIterableDataset(batches=True)", self.ring_slots,
                                     len(self.cfg["SAMPLE"]), self.order.want,
                                     self.order.fields, cast=self.cast, timeout=self.timeout,
                                     verify=self.cfg["VERIFY_READS"],
                                     rows=self.cfg["HANDOVER_CHECK"] == "rows")
        self._store = ProcessStore(self.cfg, local=True,
                                    min_params=self.min_params_version)
        # shared with worker processes (fork, spawn, forkserver)
        self._epochs = EpochState()
        self._local_resume = None  # StatefulDataLoader protocol (per worker)
        self._progress = (0, 0, 0)  # (epoch, items yielded, generation) in this process

    @property
    def _shared(self):
        """This rank's epoch state (a RankEpoch in shared memory)."""
        return self._epochs.of_rank(self.order.rank)

    @property
    def _generations(self):
        """Which generation each epoch and step reads (_reader.Generations)."""
        return Generations(self.cfg, self.timeout, self.min_params_version, self.order.refresh,
                           "WireheadIterableDataset")

    @property
    def _spec(self):
        """Spec mode (RUN_SEED): the rank's batches, whatever the workers."""
        return self.cfg["RUN_SEED"] is not None

    # --- sizes -------------------------------------------------------
    def _private_copy(self):
        """A copy with epoch state, store handle and ring of its own."""
        other = copy.copy(self)
        other._fresh_state()
        return other

    def _plan(self, workers, worker=0):
        """The plan of this worker: with a batch size, workers yield whole
        batches (pad='drop' and drop_last drop the partial one). In spec
        mode the rank's plan whatever the workers (SpecShare splits its
        batches among them)."""
        if self._spec:
            workers = worker = 0
        return self.order.plan(workers, worker, self.batch_size or 0, self.drop_last,
                               whole_batches=True)

    def _steps(self, workers):
        return plan_sizes(self._plan(workers))["steps"]

    def __len__(self):
        """Items this rank yields per epoch: exact when batch_size and
        num_workers were given, else the count for one worker per rank."""
        workers = self.num_workers or 0
        items = self._steps(workers) * (1 if self._spec else max(workers, 1))
        return -(-items // self.batch_size) if self.batches else items

    # --- epochs and resume --------------------------------------------
    def set_epoch(self, epoch):
        """The next iteration runs this epoch (later ones count on from it).
        A state loaded for the same epoch still applies (the usual
        load_state_dict, then set_epoch loop); one for another epoch is
        dropped."""
        self._shared.set_epoch(epoch)

    def state_dict(self, batches_consumed=None):
        """With batches_consumed (the rank's batches taken this epoch): the
        rank's resume state, made in the main process. Without it: this
        worker's state, for torchdata's StatefulDataLoader."""
        if batches_consumed is None:
            epoch, step, gen = self._progress
            return {"epoch": epoch, "step": step, "generation": gen,
                    "seed": self.order.seed}
        sh = self._shared
        return {"epoch": sh.running_epoch(), "batches_consumed": int(batches_consumed),
                "generation": sh.generation, "seed": self.order.seed,
                "world_size": self.order.world_size, "num_workers": self.num_workers,
                "batch_size": self.batch_size, "drop_last": self.drop_last,
                **spec_state(self.cfg)}

    def load_state_dict(self, state):
        if "step" in state:  # one worker's state (StatefulDataLoader)
            self._local_resume = (int(state["epoch"]), int(state["step"]),
                                  int(state.get("generation", 0)))
            return
        for key, have in (("world_size", self.order.world_size),
                          ("num_workers", self.num_workers), ("batch_size", self.batch_size),
                          ("drop_last", self.drop_last), ("seed", self.order.seed),
                          *spec_state(self.cfg).items()):
            if key in state and state[key] != have:
                raise ValueError(f"cannot resume: state has {key}={state[key]!r}, this "
                                 f"dataset has {have!r} (the worker count, batch size, world "
                                 f"size and seed must not change mid-epoch)")
        self._shared.resume(state["epoch"], state["batches_consumed"],
                            state.get("generation", 0))

    # --- iteration ------------------------------------------------------
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (0, 0)
        if self.num_workers is not None and self.num_workers != workers:
            raise ValueError(f"WireheadIterableDataset was given num_workers={self.num_workers} "
                             f"but runs in a DataLoader with num_workers={workers}; pass the "
                             f"same value to both")
        sh = self._shared
        epoch, resumed = sh.begin_iteration(worker)
        gen = 0

        def plan_of(w):
            return self._plan(workers, w)

        if self._spec:
            share = self._spec_share(sh, workers, worker, epoch, resumed)
        elif self._local_resume is not None:
            epoch, start, gen = self._local_resume
            self._local_resume = None
            # later iterations of this worker go on from the resumed epoch
            sh.continue_from(worker, epoch)
            share = WorkerShare.of_worker(plan_of, worker, epoch, start=start)
        else:
            share = WorkerShare.of_worker(plan_of, worker, epoch, resumed=resumed)
            if resumed is not None:
                gen = sh.resume_generation
        what = "WireheadIterableDataset"
        sizes = check_yields(share.plan, what, self.batch_size, self.drop_last)
        if worker == 0 and self._pad_warn:
            warn_padding(share.plan, sizes, what, epoch, self._pad_memo, self.batch_size or 1)
        if self.batches:
            return self._batches(share, gen, worker, info is not None)
        return self._items(share, gen, worker, self.views and info is None)

    def _spec_share(self, sh, workers, worker, epoch, resumed):
        """This worker's SpecShare of epoch (resumed: the rank's batches
        taken before a resume of it; a StatefulDataLoader's worker state
        names the rows this worker made)."""
        if workers and not self.batch_size:
            raise ValueError(f"WireheadIterableDataset: in spec mode (RUN_SEED) {workers} "
                             f"DataLoader workers make the rank's batches in turn: give "
                             f"batch_size (the DataLoader's) to the dataset, or use "
                             f"wirehead_torch.DataLoader, which passes it")
        start = 0
        if self._local_resume is not None:
            epoch, start, _ = self._local_resume
            self._local_resume = None
            sh.continue_from(worker, epoch)
        return SpecShare(self._plan(0), epoch, self.batch_size, workers, worker,
                         skip=resumed or 0, start=start)

    def _start(self, gen, worker, epoch):
        """(store, generation, rule) of this worker's epoch (gen: a resumed
        state's; rule: which generation each step reads); worker 0's
        generation is the rank's generation in use, and its wait for a
        spec generation is counted in the rank's shared state."""
        store, rule = self._store.get(), self._generations
        gen = rule.for_epoch(store, resume=gen, epoch=epoch)
        if worker == 0:
            self._shared.generation = gen
            if rule.spec is not None and rule.spec.last_wait_s:
                self._shared.count_wait(rule.spec.last_wait_s)
        return store, gen, rule

    def _items(self, share, gen, worker, views=False):
        o = self.order
        store, gen, rule = self._start(gen, worker, share.epoch)
        positions, pads = share.rows()
        epoch, start = share.epoch, share.start
        spec_gen = rule.spec_gen(epoch)
        for k in range(len(positions)):
            pos, is_pad = positions[k], bool(pads[k])
            gen = rule.for_step(store, gen)
            got = (view_sample(store, gen, pos, o.want, self.timeout, spec_gen=spec_gen)
                   if views else None)
            viewed = got is not None
            if not viewed:  # a copy, also when the pin policy refuses the view
                got = read_sample(store, gen, pos, o.want, self.timeout, spec_gen=spec_gen)
            gen, pos, arrs = got.generation, got.position, got.arrays
            is_pad = is_pad or got.is_pad
            item = {name: to_output(arrs[i], name, "torch", self.cast, numpy_ok=False)
                    for i, name in zip(o.want, o.fields)}
            if o.pad == "ignore":
                for name in o.label_fields:
                    # every item: a misfit fails the first, not the first padded one
                    check_ignore_fits(item[name].dtype, o.ignore_index, name)
                    if is_pad:
                        if viewed:  # a view is read-only: the filled label is a copy
                            item[name] = item[name].clone()
                        item[name].fill_(o.ignore_index)
            item["is_pad"] = torch.tensor(is_pad)
            item["generation"] = torch.tensor(gen if spec_gen is None else spec_gen,
                                              dtype=torch.int64)
            item["position"] = torch.tensor(pos, dtype=torch.int64)
            if spec_gen is not None:
                item["spec_index"] = torch.tensor(spec_gen * o.swap_cap + pos, dtype=torch.int64)
            item["params_version"] = torch.tensor(store.last_params_version, dtype=torch.int64)
            self._progress = (epoch, start + k + 1, gen)
            if self.transform is not None:
                item = self.transform(item)
            yield item

    # --- batches=True: the shared ring (_batch.py) ------------------------
    def _batches(self, share, gen, worker, in_worker):
        o = self.order
        store, gen, rule = self._start(gen, worker, share.epoch)
        ring, B = self._batch_ring, self.batch_size
        spec_gen = rule.spec_gen(share.epoch)
        spec = None if spec_gen is None else (spec_gen, o.swap_cap)
        # a wirehead_torch.DataLoader's device iteration: large rows stay in
        # the store, its main process copies them from there (docs/gpu.md)
        direct_min = self._shared.direct_min
        done = share.start
        for positions, pads in share.batches(B):
            gen = rule.for_step(store, gen)
            batch, rows = ring.fill(store, gen, positions, worker if in_worker else None,
                                    pads=pads, ignore=((o.label_fields, o.ignore_index)
                                                       if o.pad == "ignore" else None),
                                    direct_min=direct_min, spec=spec)
            if o.pad == "ignore":
                try:
                    self._check_ignore(batch)
                except BaseException:
                    ring.give_back(batch)
                    raise
            gen = rows[-1].generation
            done += len(positions)
            self._progress = (share.epoch, done, gen)
            yield ring.deliver(batch, extras=True, in_worker=in_worker)

    def _check_ignore(self, batch):
        """The ignore_index the padding rows' label fields get must fit the
        dtype they are delivered in (cast= or as stored); checked on every
        batch, so a misfit fails the first one, not the first padded one at
        an epoch's end."""
        for entry in batch.layout:
            if entry.name in self.order.label_fields:
                check_ignore_fits(getattr(torch, entry.cast or entry.dtype),
                                  self.order.ignore_index, entry.name)

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_store"] = ProcessStore(self.cfg, local=True,
                                    min_params=self.min_params_version)
        return d


class IterableAdapter:
    """What wirehead_torch.DataLoader asks of a WireheadIterableDataset (one
    adapter per dataset kind; dataset.MapAdapter is the other): a copy of
    the dataset set up for the DataLoader (its batch size, workers and
    drop_last; batches=True on the ring), and that copy's plan, epochs,
    generation in use and resume state, through named methods."""

    kind = "iterable"
    # a device iteration's workers may leave large rows in the store
    # (docs/gpu.md): set_direct_min says from what size
    hands_over_positions = True

    @staticmethod
    def fits(dataset):
        return isinstance(dataset, WireheadIterableDataset)

    def __init__(self, dataset, what, *, ring, batch_size, num_workers, shuffle, drop_last,
                 seed):
        del seed  # the dataset's own (its order)
        ds = self.dataset = dataset._private_copy()
        self.what, self.ring, self.batch_size = what, ring, batch_size
        for name, have, want in (("batch_size", ds.batch_size, batch_size),
                                 ("num_workers", ds.num_workers, num_workers)):
            if have is not None and have != want:
                raise ValueError(f"{what}: the dataset was given {name}={have} but the "
                                 f"DataLoader {name}={want}; leave it out of the dataset (the "
                                 f"DataLoader tells it)")
        if ds.drop_last and not drop_last:
            raise ValueError(f"{what}: the dataset was given drop_last=True but the "
                             f"DataLoader drop_last=False; pass drop_last to the DataLoader")
        if ring:
            refuse_in_loader(what, ds, views=ds.views, transform=ds.transform is not None)
        ds.batch_size, ds.num_workers, ds.drop_last = batch_size, num_workers, bool(drop_last)
        ds.batches = ring
        ds._batch_ring.owned_by_loader(what)
        ds._pad_warn = False  # reported by the DataLoader, in the main process, once per epoch
        ds._pad_memo = {}
        if shuffle is not None and shuffle != ds.order.shuffle:
            ds.order = copy.copy(ds.order)
            ds.order.shuffle = shuffle

    def torch_args(self, collate_fn):
        """The torch DataLoader's arguments this kind sets."""
        return dict(batch_size=None if self.ring else self.batch_size, shuffle=None,
                    drop_last=False, collate_fn=collate_fn)

    @property
    def token(self):
        """The dataset's ring (its files' name)."""
        return self.dataset._batch_ring.token

    def plan(self):
        """The plan of worker 0 of this rank."""
        return self.dataset._plan(self.dataset.num_workers)

    def begin_epoch(self, epoch, start, resume):
        """The next iteration runs epoch from the rank's batch start on;
        resume: the state loaded for it (None: a fresh epoch). Set before
        the workers start (or, persistent, go on): they share it."""
        sh = self.dataset._shared
        if resume is None:
            sh.start(epoch)
        else:
            sh.resume(epoch, start, resume["dataset"].get("generation", 0))

    def generation(self):
        """The generation the running epoch reads (set by worker 0, which
        yields the epoch's, and a resumed epoch's, first batch)."""
        return self.dataset._shared.generation

    def resume_state(self, mid_epoch):
        """This kind's part of the DataLoader's state_dict()."""
        gen = self.generation() if mid_epoch else 0
        return {"dataset": {"generation": int(gen), "pad": self.dataset.order.pad}}

    def loaded(self, state):
        """A state for load_state_dict, checked against this dataset: the
        one to keep."""
        pad = self.dataset.order.pad
        if state.get("dataset", {}).get("pad", pad) != pad:
            raise ValueError(f"{self.what}: cannot resume: state has pad="
                             f"{state['dataset']['pad']!r}, the dataset pad={pad!r}")
        state = copy.deepcopy(state)
        state.setdefault("dataset", {})
        return state

    def spec_waits(self):
        """(waits, seconds) of the first worker's waits for a spec generation."""
        sh = self.dataset._shared
        return int(sh.spec_waits), sh.spec_wait_us / 1e6

    def set_direct_min(self, nbytes):
        """A device iteration's cut-over (0: none): the workers leave rows
        of at least nbytes in the store. Read by each worker as its epoch
        starts, so set before they start. HANDOVER_CHECK: rows re-hashes
        every row at hand-over: all then stay in the slot."""
        if self.dataset.cfg["HANDOVER_CHECK"] != "rows":
            self.dataset._shared.direct_min = nbytes

    def store(self):
        """This process's handle on the dataset's store."""
        return self.dataset._store.get()
