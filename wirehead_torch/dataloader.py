"""wirehead_torch.DataLoader: a torch DataLoader that sets up the one-copy
batch ring for the wirehead datasets, orders their samples by the plan, and
resumes mid-epoch (state_dict / load_state_dict). It asks its dataset
through one adapter per kind (iterable.IterableAdapter,
dataset.MapAdapter), and hands its batches to a device through DeviceFeed
(the protocol to_device of cuda.py takes)."""
import copy
import os
import signal
import threading
import weakref

import torch

from . import _C, _ring
from ._order import check_yields, warn_padding
from ._reader import reader_timeout
from ._spec_read import SpecWait, spec_generation, spec_state
from .dataset import MapAdapter
from .iterable import IterableAdapter

_STATE_VERSION = 1
_ADAPTERS = (IterableAdapter, MapAdapter)
_SUPERSEDED = ("{what}: this iteration was ended by a newer iteration of the same DataLoader "
               "(its workers stopped, so that the new one's take their ring regions over); "
               "iterate a DataLoader one iteration at a time, or use one DataLoader per iteration")


class _InterruptHeld:
    """Holds a SIGINT that arrives while an iteration forks its workers and
    raises it after: Python would run it in the parent's at-fork callbacks,
    where the KeyboardInterrupt is ignored and the loop runs on (a lost
    Ctrl-C). Only the main thread, and a handler set from Python, can be
    held; otherwise the signal goes as before. A worker forked meanwhile
    gets the handler back (a Ctrl-C to the terminal reaches it as before)."""

    _now = None  # the one in force in this process
    _at_fork = False

    def __enter__(self):
        self.got, self.old = None, None
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is not None:
            if not _InterruptHeld._at_fork:
                os.register_at_fork(after_in_child=_InterruptHeld._in_child)
                _InterruptHeld._at_fork = True
            self.old = signal.signal(signal.SIGINT, self._hold)
            _InterruptHeld._now = self
        return self

    @staticmethod
    def _in_child():
        held, _InterruptHeld._now = _InterruptHeld._now, None
        if held is not None:
            signal.signal(signal.SIGINT, held.old)

    def _hold(self, signum, frame):
        self.got = (signum, frame)

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
            _InterruptHeld._now = None
        return False

    def deliver(self):
        """Runs the handler a held SIGINT was for, here, where its
        KeyboardInterrupt reaches the caller."""
        got, self.got = self.got, None
        if got is None or self.old is None or self.old == signal.SIG_IGN:
            return
        if self.old == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)
        else:
            self.old(*got)


class DataLoader(torch.utils.data.DataLoader):
    """A ``torch.utils.data.DataLoader`` for the wirehead datasets that reads
    each sample once, straight into the batch the training loop gets.

    ``dataset`` is a ``WireheadIterableDataset``, ``MongoheadDataset`` or
    ``MongoTupleheadDataset``; the DataLoader's usual arguments keep their
    meaning. Underneath, the dataset (a copy: the one passed in is left as
    it was) is set to ``batches=True``: every DataLoader worker reads the
    samples of a batch into a slot of a shared-memory ring and only a small
    handle crosses the worker queue (README, "Copies per read path").

    - ``WireheadIterableDataset``: the dataset is told ``batch_size``,
      ``num_workers`` and ``drop_last``; batches are dicts of the SAMPLE
      fields (or ``fields``) plus ``is_pad`` (bool), ``generation`` and
      ``position`` (int64), each with a leading batch dimension. Order,
      shuffle, seed and padding are the dataset's (``shuffle=`` here
      overrides the dataset's).
    - ``MongoheadDataset`` / ``MongoTupleheadDataset``: positions
      ``0..SWAP_CAP-1`` of the newest generation, ordered by the same plan
      (``shuffle``: a permutation fixed by ``(seed, epoch)``; under DDP each
      rank its own share, every rank the same count); batches are
      ``{'input': X, 'label': Y}`` or ``[X, Y]`` as default collate makes
      them.

    ``drop_last=True`` never yields a padded or partial last batch.
    ``sampler``/``batch_sampler`` (the order is the plan's) and, with the
    ring, ``collate_fn`` are refused; ``ring=False`` keeps the ordinary
    collate path (two copies per sample) for datasets with per-sample
    ``transform=`` and the like. ``set_epoch(e)`` picks the epoch the next
    iteration runs (later ones count on from it); ``state_dict()`` /
    ``load_state_dict()`` resume mid-epoch with exactly the remaining
    batches, in their original order, as torchdata's StatefulDataLoader
    does (state between batches; load before iterating)."""

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 seed=0, ring=True, device=None, **kwargs):
        what = "wirehead_torch.DataLoader"
        adapter = next((a for a in _ADAPTERS if a.fits(dataset)), None)
        if adapter is None:
            raise TypeError(f"{what} reads WireheadIterableDataset, MongoheadDataset or "
                            f"MongoTupleheadDataset; got {type(dataset).__name__} (use "
                            f"torch.utils.data.DataLoader for other datasets)")
        if (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                or not 1 <= batch_size <= _C.SWAP_CAP_MAX):
            raise ValueError(f"{what}: batch_size must be a positive integer, got "
                             f"{batch_size!r} (at most {_C.SWAP_CAP_MAX}; unbatched items: "
                             f"torch.utils.data.DataLoader)")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"{what}: num_workers must be a non-negative integer, got "
                             f"{num_workers!r}")
        if timeout:  # torch's own wait for a worker's batch (0: none)
            reader_timeout(None, timeout)
        for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler)):
            if value is not None:
                raise ValueError(
                    f"{what}: {name}= is not taken: the order is the plan's (shuffle=, seed=, "
                    f"each DDP rank its share, resume); use torch.utils.data.DataLoader with "
                    f"the dataset's batches=True for an order of your own")
        if collate_fn is not None and ring:
            raise ValueError(f"{what}: collate_fn= would replace the ring, whose batches "
                             f"arrive already stacked; pass ring=False for a collate_fn (two "
                             f"copies per sample), or change the batch in the training loop")
        if kwargs.get("in_order") is False:
            raise ValueError(f"{what}: in_order=False would hand batches out as workers finish "
                             f"them; the plan's order and resume need in_order=True")
        if shuffle is not None and not isinstance(shuffle, bool):
            raise ValueError(f"{what}: shuffle must be True, False or None, got {shuffle!r}")
        if device is not None and str(device) != "cpu" and pin_memory:
            raise ValueError(f"{what}: device= copies each batch straight from its ring slot "
                             f"to the device; pin_memory=True would copy it into page-locked "
                             f"memory first: pass one of them")
        # each worker ends with the process iterating this DataLoader
        worker_init_fn = _ring.WorkerStart(worker_init_fn)
        self._ring = bool(ring)
        self._what = what
        self._epoch = 0           # the epoch the next iteration runs
        self._resume = None       # a loaded state, applied by the next iteration
        self._current = None      # (epoch, batches consumed) of the running iteration
        self._done = False        # the running iteration yielded its last batch
        self._ended = weakref.WeakSet()  # torch iterators a newer iteration ended
        self._pad_memo = {}
        self._adapter = adapter(dataset, what, ring=self._ring, batch_size=batch_size,
                                num_workers=num_workers, shuffle=shuffle, drop_last=drop_last,
                                seed=seed)
        cfg = self._adapter.dataset.cfg
        # spec mode (docs/reproducible.md): the main process waits for each
        # epoch's spec generation before the workers read it (counted: stats())
        self._spec = SpecWait(cfg, what) if cfg["RUN_SEED"] is not None else None
        super().__init__(self._adapter.dataset, num_workers=num_workers, pin_memory=pin_memory,
                         timeout=timeout, worker_init_fn=worker_init_fn,
                         multiprocessing_context=multiprocessing_context, generator=generator,
                         **self._adapter.torch_args(collate_fn), **kwargs)
        self._batch = batch_size
        self._workers = num_workers
        self._drop_last = bool(drop_last)
        self._device = None
        self._stages = {}  # device index -> CudaStage: slot registrations kept across epochs
        self._said = {}  # the staged fallback was said (once per DataLoader)
        if device is not None:
            import torch as _t
            self._device = _t.device(device) if not isinstance(device, int) else \
                _t.device("cuda", device)
            if self._device.type == "cpu":  # host tensors, as without device=
                self._device = None
            elif self._device.type != "cuda":
                raise ValueError(f"{what}: device= takes a CUDA device ('cuda', 'cuda:1', "
                                 f"an index) or 'cpu'; got {device!r}")

    # --- epochs ------------------------------------------------------------
    def set_epoch(self, epoch):
        """The next iteration runs this epoch. A state loaded for the same
        epoch still applies (load_state_dict, then the usual set_epoch
        loop); one for another epoch is dropped."""
        self._epoch = int(epoch)
        if self._resume is not None and self._resume["epoch"] != self._epoch:
            self._resume = None

    def _plan(self):
        """The plan of worker 0 of this rank (what len(), the padding and
        the empty-epoch checks ask)."""
        return self._adapter.plan()

    def __iter__(self):
        if self._device is not None:
            return self._to_device(self._device)
        return self._host_iter()

    def _to_device(self, device):
        """This DataLoader's batches on device (to_device): each one copied
        straight from its ring slot by a stage kept for the DataLoader's
        life, so each slot file is registered once."""
        from .cuda import ToDevice, device_index, refuse_in_worker
        refuse_in_worker(self._what)
        index = device_index(device)
        stage = self._stages.get(index)
        if stage is None:
            stage = self._stages[index] = _C.CudaStage(device=index)
        prev = getattr(self, "_last_to_device", None)
        if prev is not None:  # its iterator, and with it its workers, ends now
            prev.end(_SUPERSEDED.format(what=self._what))
        self._last_to_device = ToDevice(self, device, None, stage, self._said)
        return self._last_to_device

    def device_stats(self):
        """With device=: the stats() of the running (or last) iteration's
        copies: path, host_copy_bytes, staged_why, ... (docs/gpu.md)."""
        it = getattr(self, "_last_to_device", None)
        if it is None:
            if self._device is None:
                raise RuntimeError(f"{self._what}: device_stats() needs device= (a CUDA "
                                   f"device) and an iteration")
            raise RuntimeError(f"{self._what}: device_stats(): no iteration has reached the "
                               f"device yet (iterate first; one whose iter() raised, e.g. a "
                               f"CudaError, has none)")
        return it.stats()

    def device_feed(self, stage):
        """This DataLoader's batches as a device iteration takes them: the
        DeviceFeed of an iteration copied by stage (a _C.CudaStage), the
        protocol to_device (cuda.py) uses."""
        return DeviceFeed(self, stage)

    def _host_iter(self):
        self._end_previous()  # before this epoch's state is set for the new workers
        resume = self._resume
        self._resume = None
        epoch = resume["epoch"] if resume else self._epoch
        start = resume["batches_consumed"] if resume else 0
        plan = self._plan()
        info = check_yields(plan, self._what, self._batch, self._drop_last)
        warn_padding(plan, info, self._what, epoch, self._pad_memo, self._batch)
        self._adapter.begin_epoch(epoch, start, resume)
        if self._spec is not None:
            ds = self._adapter.dataset
            self._spec.generation(self._adapter.store(), spec_generation(ds.cfg, epoch),
                                  ds.timeout)
        self._epoch = epoch + 1
        self._current = [epoch, start]
        self._done = False
        with _InterruptHeld() as held:
            it = super().__iter__()  # forks the workers
        try:
            held.deliver()
        except BaseException:  # the KeyboardInterrupt: no worker stays behind
            try:
                self._stop_workers(it)
            except Exception:  # torch's word on a worker the same Ctrl-C ended (a
                pass  # terminal's reaches them all): the interrupt is what was asked
            raise
        # weak: a loop that breaks early lets torch's iterator (and its
        # workers) go as before
        self._torch_it = weakref.ref(it)
        return self._counted(it, self._current)

    def _counted(self, it, current):
        n = len(self)
        try:
            for batch in it:
                if it in self._ended:
                    raise RuntimeError(_SUPERSEDED.format(what=self._what))
                if current is self._current:
                    current[1] += 1
                    self._done = current[1] >= n
                yield batch
        except Exception:
            self._stop_workers(it)
            raise

    def _end_previous(self):
        """Ends the previous iteration's workers if it still runs: a loop
        that broke out of its epoch may still hold its iterator (Lightning,
        a device iteration), and its workers keep the ring regions the new
        workers take over until the garbage collector frees it. One
        iteration at a time, as with persistent_workers."""
        ref, self._torch_it = getattr(self, "_torch_it", None), None
        it = ref() if ref is not None else None
        if it is not None and it is not getattr(self, "_iterator", None):
            self._ended.add(it)
            self._stop_workers(it)

    def _abort(self):
        """The device copy of a batch raised (DeviceFeed.abort): the workers
        of the running iteration end now, as after a worker's error."""
        ref, self._torch_it = getattr(self, "_torch_it", None), None
        it = ref() if ref is not None else None
        if it is not None:
            self._stop_workers(it)

    def _stop_workers(self, it):
        """Ends the workers of an iteration that raised. The error's frames
        keep torch's iterator alive until the garbage collector frees it, and
        then its workers can wait 5 s each for a stop that never reaches them
        (the collector may close the queues first); stopped here, they end at
        once. A persistent iterator is dropped with them: the next epoch
        starts new workers."""
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is None:  # num_workers=0: nothing runs elsewhere
            return
        shutdown()
        if getattr(self, "_iterator", None) is it:
            self._iterator = None

    def stats(self):
        """What the reads waited for (spec mode; docs/reproducible.md):
        spec_waits, the epochs that waited for their spec generation to be
        sealed, and spec_wait_s, the seconds they waited (this process's
        waits and, for a WireheadIterableDataset, its first worker's)."""
        if self._spec is None:
            return {"spec_waits": 0, "spec_wait_s": 0.0}
        waits, wait_s = self._spec.waits, self._spec.wait_s
        worker = self._adapter.spec_waits()
        return {"spec_waits": waits + worker[0], "spec_wait_s": wait_s + worker[1]}

    # --- resume ------------------------------------------------------------
    def state_dict(self):
        """Where the training loop is: taken between batches (after the
        last one of an epoch it names the next epoch's start)."""
        if self._resume is not None:
            return copy.deepcopy(self._resume)
        if self._current is None or self._done:
            epoch, consumed = (self._epoch, 0)
        else:
            epoch, consumed = self._current
        plan = self._plan()
        state = {"version": _STATE_VERSION, "kind": self._adapter.kind, "epoch": epoch,
                 "batches_consumed": consumed, "batch_size": self._batch,
                 "num_workers": self._workers, "drop_last": self._drop_last,
                 "world_size": plan["world"], "seed": plan["seed"],
                 "shuffle": plan["shuffle"], **spec_state(self._adapter.dataset.cfg)}
        state.update(self._adapter.resume_state(bool(consumed) and not self._done))
        return state

    def load_state_dict(self, state):
        """Applies a state_dict() before the next iteration: it yields the
        rest of that epoch, from the same generation if it still exists."""
        if not isinstance(state, dict) or "batches_consumed" not in state:
            raise ValueError(f"{self._what}: not a state of this DataLoader (no "
                             f"batches_consumed): {state!r:.200}")
        if int(state.get("version", 1)) > _STATE_VERSION:
            raise ValueError(f"{self._what}: state version {state['version']} is newer than "
                             f"this wirehead_torch reads ({_STATE_VERSION})")
        kind = self._adapter.kind
        if state.get("kind") != kind:
            raise ValueError(f"{self._what}: state is of a {state.get('kind')} dataset, this "
                             f"DataLoader reads a {kind} one")
        plan = self._plan()
        spec = spec_state(self._adapter.dataset.cfg)
        if spec and "run_seed" not in state:
            raise ValueError(f"{self._what}: cannot resume: the state was taken outside spec "
                             f"mode, this DataLoader reads RUN_SEED={spec['run_seed']}")
        for key, have in (("batch_size", self._batch), ("num_workers", self._workers),
                          ("drop_last", self._drop_last), ("world_size", plan["world"]),
                          ("seed", plan["seed"]), ("shuffle", plan["shuffle"]),
                          ("run_seed", spec.get("run_seed")), ("reuse", spec.get("reuse"))):
            if key in state and state[key] != have:
                raise ValueError(f"{self._what}: cannot resume: state has {key}={state[key]!r}, "
                                 f"this DataLoader has {have!r} (batch size, workers, "
                                 f"drop_last, world size, seed and shuffle must not change "
                                 f"mid-epoch)")
        self._resume = self._adapter.loaded(state)
        self._epoch = int(state["epoch"])
        self._current = None


class DeviceFeed:
    """What a device iteration (to_device, cuda.py) asks of a
    wirehead_torch.DataLoader: the protocol between the two, documented in
    docs/gpu.md. batches() yields each batch still in its ring slot
    (_ring.SlotBatch, claimed, not yet tensors; a batch that missed the ring
    as ordinary tensors); store() is the handle through which the rows a
    worker left in the store (SlotBatch.in_store) are viewed; abort() ends
    the running iteration's workers when a copy raised."""

    def __init__(self, loader, stage):
        self.loader, self.stage = loader, stage

    def batches(self):
        """The batches as the device takes them. With the ring, a
        WireheadIterableDataset's workers leave rows of at least the
        stage's cut-over in an shm store (the hand-over of positions,
        docs/gpu.md): they are copied to the device from there."""
        loader, adapter = self.loader, self.loader._adapter
        token = adapter.token if loader._ring else None
        hands_over = token is not None and adapter.hands_over_positions
        if token is not None:
            _ring.direct(token, True)
        if hands_over and not self.stage.stats()["staged_why"]:
            adapter.set_direct_min(self.stage.direct_min(self._store_uri())[0])
        try:
            yield from loader._host_iter()
        finally:
            if hands_over:
                adapter.set_direct_min(0)
            if token is not None:
                _ring.direct(token, False)

    def _store_uri(self):
        """The store this process reads: the node-local copy under LOCAL_CACHE."""
        from ._store_args import store_kwargs
        return store_kwargs(self.loader.dataset.cfg, create=False, local=True)["uri"]

    def store(self):
        """This process's handle on the dataset's store."""
        return self.loader._adapter.store()

    def abort(self):
        """A batch's copy raised: the workers of the running iteration end
        now, not when the garbage collector frees its iterator (they could
        otherwise read on, and even make the store again)."""
        self.loader._abort()
