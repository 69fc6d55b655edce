"""WireheadLoader: the C-native batch loader (no Python worker processes)."""
import threading
import warnings

import torch

from . import _C
from ._arrays import to_output
from ._order import Order, check_ignore_fits, check_yields, log_skips, plan_sizes, warn_padding
from ._reader import Generations, check_int, reader_timeout
from ._redact import secrets_hidden
from ._spec_read import check_spec_order, spec_columns, spec_state
from ._store import PerProcess, ProcessStore, check_min_params
from ._store_args import store_kwargs
from .config import get_config

_REFRESH = {"epoch": 0, "step": 1}
_ITER_LOCK = threading.Lock()  # guards WireheadLoader._active only
# The most batches a loader reads ahead: its ring holds prefetch + 1 batches
# of batch_size samples each, and their slots are made up front (10**7 once
# took 23 GB before a sample was read). And the most reader threads (the C
# loader's bound).
MAX_PREFETCH = 64
MAX_THREADS = 256


class WireheadLoader:
    """Iterates over this rank's share of the current generation in batches.

    C threads (GIL released) read samples straight into stacked batch
    buffers from a fixed ring; each batch is a dict of tensors keyed by
    field name plus ``is_pad`` (bool), ``generation``, ``position`` and
    ``params_version`` (int64), sharing the ring buffer through DLPack. A ring buffer is reused
    only after every tensor of its batch is released. Every rank yields
    ``len(loader)`` batches per epoch (docs/design.md, "Sample order").

    ``device="cuda[:N]"``: samples are copied ahead on a side stream
    straight from the store's mapping, registered with the CUDA runtime
    (large rows), or gathered in page-locked memory (small rows, or where
    registration is refused: a warning says why); the tensors are on the
    device and your current stream waits on their copy. ``stats()`` says
    which ``path`` ran and ``host_copy_bytes`` (docs/gpu.md).

    ``batch_size`` is 1..SWAP_CAP's maximum, ``num_threads`` 1..256,
    ``prefetch`` 1..64: the ring holds at most 65 batches."""

    def __init__(self, config_path=None, config=None, *, batch_size, num_threads=2, prefetch=2,
                 drop_last=False, device="cpu", fields=None, shuffle=True, seed=0,
                 pad="repeat", ignore_index=-100, label_fields=None, refresh="epoch",
                 transform=None, rank=None, world_size=None, cast=None, timeout=None,
                 min_params_version=None):
        self.cfg = get_config(config_path, config)
        self.min_params_version = check_min_params(min_params_version)
        self.batch_size = check_int("batch_size", batch_size, 1, _C.SWAP_CAP_MAX)
        self.num_threads = check_int("num_threads", num_threads, 1, MAX_THREADS)
        self.prefetch = check_int("prefetch", prefetch, 1, MAX_PREFETCH)
        self.order = Order(self.cfg, fields, shuffle, seed, pad, ignore_index, label_fields,
                           refresh, rank, world_size)
        self.drop_last = bool(drop_last)
        self.device = torch.device(device)
        if self.device.type == "cuda":
            from .cuda import refuse_in_worker
            refuse_in_worker("WireheadLoader")
        self.transform = transform
        self.cast = cast
        self.timeout = reader_timeout(self.cfg, timeout, zero=False)
        check_spec_order(self.cfg, self.order, "WireheadLoader")
        # which generation each epoch reads (spec mode: e // REUSE, its waits counted)
        self._rule = Generations(self.cfg, self.timeout, self.min_params_version,
                                 self.order.refresh, "WireheadLoader")
        self._epoch = 0          # the epoch the next iteration runs
        self._resume = None      # (epoch, start_batch, generation)
        self._current = None     # (epoch, generation) of the running iteration
        self._consumed = 0
        self._skips = 0
        self._ld = PerProcess()  # the C loader of this process
        self._rw = None
        self._active = None      # (thread id, token) of the running iteration
        self._store = ProcessStore(self.cfg, local=True, min_params=self.min_params_version)
        self._pad_memo = {}  # the epoch whose padding was last reported
        self._staged_said = False

    def _plan(self):
        # drop_last: whole batches only (never a padded or partial last
        # batch); pad='drop' alone may end on a partial batch of real samples
        return self.order.plan(batch=self.batch_size, drop_last=self.drop_last)

    def __len__(self):
        # from the plan each time: the rank may be known only once iterating
        return plan_sizes(self._plan())["rank_batches"]

    def set_epoch(self, epoch):
        """The next iteration runs this epoch. A state loaded for the same
        epoch still applies (the usual load_state_dict, then set_epoch
        loop); one for another epoch is dropped."""
        self._epoch = int(epoch)
        if self._resume is not None and self._resume[0] != self._epoch:
            self._resume = None

    def _loader(self):
        o = self.order
        plan = o.plan()
        rw = (plan["rank"], plan["world"])
        ld = self._ld.get()
        if ld is not None and self._rw != rw:
            self._ld.drop().close()  # built before the process group existed
            ld = None
        if ld is None:
            self._rw = rw
            with secrets_hidden(self.cfg["STORE"]):
                ld = self._ld.keep(_C.Loader(
                    store=dict(store_kwargs(self.cfg, local=True),
                               min_params=self.min_params_version),
                    batch=self.batch_size,
                    threads=self.num_threads, prefetch=self.prefetch, drop_last=self.drop_last,
                    world=rw[1], rank=rw[0], shuffle=o.shuffle, seed=o.seed, pad=plan["pad"],
                    pad_batches=o.pad != "drop" or self.drop_last, want=o.want,
                    refresh=_REFRESH[o.refresh], timeout_s=self.timeout, **self._cuda_kwargs()))
        return ld

    def _cuda_kwargs(self):
        # device="cuda": page-locked ring, async copies on a side stream (C)
        if self.device.type != "cuda":
            return {}
        from .cuda import device_index
        return {"device": device_index(self.device)}

    def __iter__(self):
        # one C loader feeds one iteration: a second thread would take
        # batches of the same epoch (or restart it) and break len()
        me, token = threading.get_ident(), object()
        with _ITER_LOCK:
            if self._active is not None and self._active[0] != me:
                raise RuntimeError(
                    "this WireheadLoader is already being iterated by another thread; "
                    "give each thread its own WireheadLoader")
            self._active = (me, token)
        try:
            yield from self._batches_of(token)
        finally:
            with _ITER_LOCK:
                if self._active is not None and self._active[1] is token:
                    self._active = None

    def _batches_of(self, token):
        epoch, start, gen = self._resume or (self._epoch, 0, 0)
        plan = self._plan()
        info = check_yields(plan, "WireheadLoader", self.batch_size)
        warn_padding(plan, info, "WireheadLoader", epoch, self._pad_memo, self.batch_size)
        ld = self._loader()
        # wait here, not in C, so Ctrl-C and a server outage are handled;
        # with refresh='step' the C threads move on to newer ones themselves
        rule = self._rule
        spec_gen = rule.spec_gen(epoch)
        gen = rule.for_epoch(self._store.get(), resume=gen, epoch=epoch)
        if spec_gen is None:
            ld.start(epoch, start, gen)
        else:
            ld.start(epoch, start, gen, spec_gen=spec_gen)
        self._resume = None
        self._epoch = epoch + 1
        self._current = (epoch, ld.info()["generation"])
        self._consumed = start
        o = self.order
        while True:
            got = ld.next()
            if got is None:
                break
            fields, is_pad, gens, pos, pvs, index = (got.fields, got.is_pad, got.generation,
                                                     got.position, got.params_version,
                                                     got.batch_index)
            # on a CUDA device from_dlpack makes the current stream wait on the
            # batch's copy; whether it holds padding is known on the host
            any_pad = got.any_pad
            pad_t = torch.from_dlpack(is_pad).view(torch.bool)
            batch = {}
            for i, name in zip(o.want, o.fields):
                t = to_output(fields[i], name, "torch", self.cast, numpy_ok=False)
                if name in o.label_fields and o.pad == "ignore":
                    # every batch: a misfit fails the first, not the first padded one
                    check_ignore_fits(t.dtype, o.ignore_index, name)
                if name in o.label_fields and o.pad == "ignore" and (
                        bool(pad_t.any()) if any_pad is None else any_pad):
                    if any_pad is None:
                        t[pad_t] = o.ignore_index
                    else:  # a boolean index would synchronise the device
                        t.masked_fill_(pad_t.view(-1, *[1] * (t.dim() - 1)), o.ignore_index)
                batch[name] = t
            batch["is_pad"] = pad_t
            batch["generation"] = torch.from_dlpack(gens)
            batch["position"] = torch.from_dlpack(pos)
            batch["params_version"] = torch.from_dlpack(pvs)
            if spec_gen is not None:
                batch.update(spec_columns(batch["position"], spec_gen, self.cfg["SWAP_CAP"]))
            del fields, is_pad, gens, pos, pvs
            info = ld.info()
            self._skips = log_skips(info, self._skips, "WireheadLoader")
            if info.get("staged_why") and not self._staged_said:
                self._staged_said = True  # once per loader: the reason does not change
                warnings.warn(f"WireheadLoader(device={str(self.device)!r}): batches are staged "
                              f"through page-locked memory (a host copy), not copied straight "
                              f"from the store: {info['staged_why']}", RuntimeWarning,
                              stacklevel=2)
            if self.device.type not in ("cpu", "cuda"):
                batch = {k: v.to(self.device) for k, v in batch.items()}
            if self.transform is not None:
                batch = self.transform(batch)
            self._consumed = index + 1
            yield batch
            if self._active is None or self._active[1] is not token:
                raise RuntimeError("this WireheadLoader iteration was superseded by a newer "
                                   "iter() of the same loader, which restarted it")

    def state_dict(self):
        """Resume state: the running epoch, batches consumed in it, the
        generation it reads, and the settings that must match on resume."""
        epoch, gen = self._current if self._current else (self._epoch, 0)
        return {"epoch": epoch, "batches_consumed": self._consumed, "generation": gen,
                "seed": self.order.seed, "world_size": self.order.world_size,
                "batch_size": self.batch_size, "shuffle": self.order.shuffle,
                "pad": self.order.pad, **spec_state(self.cfg)}

    def load_state_dict(self, state):
        for key, have in (("world_size", self.order.world_size),
                          ("batch_size", self.batch_size), ("seed", self.order.seed),
                          ("shuffle", self.order.shuffle), ("pad", self.order.pad),
                          *spec_state(self.cfg).items()):
            if key in state and state[key] != have:
                raise ValueError(f"cannot resume: state has {key}={state[key]!r}, this loader "
                                 f"has {have!r}")
        self._resume = (int(state["epoch"]), int(state["batches_consumed"]),
                        int(state.get("generation", 0)))
        # a checkpoint taken before the next batch must give this state back
        self._current = (self._resume[0], self._resume[2])
        self._consumed = self._resume[1]

    def stats(self):
        info = self._loader().info()
        if self._rule.spec is not None:  # waits for a spec generation not sealed yet
            info["spec_waits"] = self._rule.spec.waits
            info["spec_wait_s"] = self._rule.spec.wait_s
        return info

    def close(self):
        ld = self._ld.drop()
        if ld is not None:
            ld.close()
        self._store.close()

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_ld"], d["_active"] = PerProcess(), None
        return d
