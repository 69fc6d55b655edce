"""GPU-direct helpers: batches to a CUDA device through page-locked memory
and an async copy on a side stream (the C stage of ext/wh_cuda.c), for
code that keeps a torch DataLoader. WireheadLoader(device="cuda") uses the
same stage without this module's Python loop."""
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


def to_device(batches, device="cuda", from_dlpack=None):
    """Yields each batch of `batches` (e.g. a torch DataLoader without
    pin_memory) on `device`: copied once into a page-locked ring buffer,
    then cudaMemcpyAsync on a side stream; the current stream waits on the
    copy's event (no host synchronize), so the next batch's copy overlaps
    this one's compute. A ring buffer is reused only after its copy
    completed, device memory only after the work queued on it is done."""
    refuse_in_worker("wirehead_torch.to_device")
    stage = _C.CudaStage(device=device_index(device))
    try:
        for batch in batches:
            yield stage_batch(stage, batch, from_dlpack)
    finally:
        stage.close()
