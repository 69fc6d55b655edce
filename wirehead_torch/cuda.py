"""GPU-direct helpers: batches to a CUDA device with an async copy on a
side stream (the C stage of ext/cuda/wh_cuda.c), for code that keeps a
DataLoader: a wirehead_torch.DataLoader's batches straight from their
registered ring slots, any other batches through page-locked memory.
WireheadLoader(device="cuda") uses the same stage without this module's
Python loop."""
import warnings

import torch
import torch.utils.data

from . import _C


def refuse_in_worker(what):
    """CUDA state must not be created in DataLoader worker processes: it does
    not survive fork, and each worker would hold its own CUDA context."""
    if torch.utils.data.get_worker_info() is not None:
        raise RuntimeError(
            f"{what} was asked for a CUDA device inside a DataLoader worker process; workers "
            f"must not create CUDA state. Move batches to the GPU in the main process: "
            f"WireheadLoader(device='cuda') or wirehead_torch.to_device(loader, 'cuda')")


def device_index(device):
    """The CUDA device number of `device` ("cuda", "cuda:1", torch.device, int)."""
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"not a CUDA device: {device!r}")
    if d.index is not None:
        return d.index
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


def _dtype_name(t):
    return str(t.dtype).rsplit(".", 1)[-1]


def _host_leaves(obj, out):
    """CPU tensors of a batch (dict, list, tuple, namedtuple or tensor), in order."""
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "cpu":
            out.append(obj.contiguous())
    elif isinstance(obj, dict):
        for v in obj.values():
            _host_leaves(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _host_leaves(v, out)
    return out


def _rebuild(obj, moved):
    if isinstance(obj, torch.Tensor):
        return next(moved) if obj.device.type == "cpu" else obj
    if isinstance(obj, dict):
        return type(obj)((k, _rebuild(v, moved)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_rebuild(v, moved) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_rebuild(v, moved) for v in obj)
    return obj


def stage_batch(stage, batch, from_dlpack=None):
    """One batch through the stage: every CPU tensor in one page-locked
    buffer and one async copy; the result has device tensors in their place
    (the consumer's current stream waits on the copy inside from_dlpack)."""
    from_dlpack = from_dlpack or torch.from_dlpack
    leaves = _host_leaves(batch, [])
    for t in leaves:
        if _dtype_name(t) not in _C.DTYPES:
            raise TypeError(f"to_device: tensors of dtype {t.dtype} are not supported")
    arrays = stage.copy([(t.data_ptr(), t.numel() * t.element_size(), _C.DTYPES[_dtype_name(t)],
                          tuple(t.shape)) for t in leaves])
    del leaves  # copied into page-locked memory: the caller's tensors are free
    moved = []
    for a in arrays:
        t = from_dlpack(a)
        if a.dtype == "bool" and t.dtype != torch.bool:
            t = t.view(torch.bool)
        moved.append(t)
    return _rebuild(batch, iter(moved))


class ToDevice:
    """What to_device returns: an iterator of the batches on the device,
    with stats(): the stage's counters (copies, h2d_bytes, copy_s,
    host_copy_bytes, staged_why, registrations, ...) plus path
    ("registered": every batch copied straight from its registered ring
    slot; "staged": through page-locked memory) and the batches of each."""

    def __init__(self, batches, device, from_dlpack, stage=None, said=None):
        refuse_in_worker("wirehead_torch.to_device")
        self._own = stage is None
        self._stage = stage or _C.CudaStage(device=device_index(device))
        self._counts = {"registered": 0, "staged": 0}
        # {"said": True} once the fallback was said: shared by the
        # iterations over one stage (a DataLoader's), said once for them all
        self._said = {} if said is None else said
        self._closed = False
        self._ended = None  # why a newer iteration ended this one (end)
        self._last = {}
        self._gen = self._run(batches, device, from_dlpack)

    def __iter__(self):
        return self

    def __next__(self):
        if self._ended:
            raise RuntimeError(self._ended)
        return next(self._gen)

    def close(self):
        self._gen.close()

    def end(self, why):
        """A newer iteration of the same DataLoader starts: this one, if
        not done, ends now (its workers with it) and says why if asked for
        more."""
        if self._gen.gi_frame is not None:
            self._ended = why
            self._gen.close()

    def _run(self, batches, device, from_dlpack):
        from ._ring import SlotBatch, tensors
        # a wirehead_torch.DataLoader hands its batches over still in their
        # ring slots (its DeviceFeed); any other iterable as tensors
        feed_of = getattr(batches, "device_feed", None)
        feed = feed_of(self._stage) if feed_of is not None else None
        source = iter(feed.batches() if feed is not None else batches)
        try:
            while True:
                # slots whose copies completed go back to their workers
                # before the next batch is asked for
                self._stage.poll()
                try:
                    batch = next(source)
                except StopIteration:
                    break
                if not isinstance(batch, SlotBatch):
                    self._counts["staged"] += 1
                    yield stage_batch(self._stage, batch, from_dlpack)
                    continue
                fields, extras, form = batch.fields, batch.extras, batch.form
                # rows a worker left in the store are copied from there
                store = feed.store() if batch.in_store else None
                arr, direct, _ = self._stage.copy_slot(batch.take(), wire=batch.wire,
                                                       store=store)
                del batch, store  # the stage holds the slot until its copy completed
                self._counts["registered" if direct else "staged"] += 1
                if not direct and not self._said.get("said"):
                    self._say(device)
                yield tensors(arr, fields, extras, form, from_dlpack)
        except Exception:
            if feed is not None:
                feed.abort()
            raise
        finally:
            self._last = self.stats()
            if self._own:
                self._closed = True
                self._stage.close()

    def _say(self, device):
        why = self._stage.stats()["staged_why"]
        if why:
            self._said["said"] = True  # once: the reason does not change
            warnings.warn(f"to_device(wirehead_torch.DataLoader, {str(device)!r}): batches are "
                          f"staged through page-locked memory (a host copy), not copied "
                          f"straight from their ring slots: {why}", RuntimeWarning,
                          stacklevel=3)

    def stats(self):
        if self._closed:  # the counters as the iteration ended
            return dict(self._last)
        st = self._stage.stats()
        st["path"] = "staged" if self._counts["staged"] or not self._counts["registered"] \
            else "registered"
        st["batches_registered"] = self._counts["registered"]
        st["batches_staged"] = self._counts["staged"]
        return st


def to_device(batches, device="cuda", from_dlpack=None):
    """Yields each batch of `batches` on `device`; the current stream
    waits on each copy's event (no host synchronize), so the next batch's
    copy overlaps this one's compute. A wirehead_torch.DataLoader's batches
    are copied straight from their ring slots (registered in place with
    cudaHostRegister once per slot file), each slot held until its copy
    completed; any other iterable of tensors (e.g. a torch DataLoader
    without pin_memory) is copied once into a page-locked buffer first
    ("staged"). Device memory is reused only after the work queued on it is
    done. The iterator's stats() says which path ran (docs/gpu.md)."""
    return ToDevice(batches, device, from_dlpack)
