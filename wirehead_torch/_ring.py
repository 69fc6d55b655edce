"""DataLoader glue of the shared-memory batch ring behind batches=True of
WireheadIterableDataset and of the map-style readers (filled by _batch.py).

The ring itself is C (ext/read/wh_ring.c, bound as _C.Ring and _C.ring_fill):
slot files in /dev/shm, the control words that hand a slot from a worker
to the DataLoader's main process and back, the fill of a slot (each sample
read once, straight into its row, through the store's read policy, its XXH3
checked in the same pass) with the slot's seal (header and row table) and
the hand-over check (the seal against the handle's XXH3 of it, the extras;
every row again with HANDOVER_CHECK: rows; the file's size before each
word, copy and hash).
What stays here: the handle that crosses the worker's queue (RingBatch,
pickled), turning a claimed slot into the batch's tensors, and removing a
dataset's files.

Files, per (main process, dataset, worker k), mode 0600:
  wirehead-ring.<main pid>.<token>.w<k>             control words; the live
                                                    worker holds an flock on it
  wirehead-ring.<main pid>.<token>.w<k>.s<j>.v<v>   slot j's bytes (v grows it)
  wirehead-ring.<main pid>.<token>.w<k>.said        the fallback was said (empty)
A worker takes its region over from an earlier iteration's worker as that
one exits (TAKEOVER_S); a new iteration of a wirehead_torch.DataLoader ends
the previous one's workers first.
The main process removes its files when the dataset is collected or at exit;
a wirehead_torch.DataLoader's workers end with it, removing its files as
they go (WorkerStart), so one killed by a signal leaves none; files of a
main process that died otherwise (SIGKILL with workers that never started,
another DataLoader) are removed by the next ring made or by
`wirehead-torch clean`, whichever comes first.
"""
import glob
import os
import time
from typing import NamedTuple, Optional

from . import _C, _uri

DIR = _uri.SHM_DIR
PREFIX = _uri.RING_PREFIX
# control words of a slot (Ring.word): owner pid (0: free), fill sequence,
# capacity, version
_OWNER, _SEQ, _CAP, _VER = range(4)
_swept = False
_exit_registered = None  # the pid whose ring files are removed at its exit


class SlotField(NamedTuple):
    """One field of a batch in a ring slot (what crosses to the main process)."""
    key: str  # the batch's name for it
    dtype: str  # as stored
    shape: tuple  # the batch's: rows first
    offset: int  # where its rows start in the slot
    nbytes: int  # bytes of all its rows
    cast: Optional[str]  # the dtype asked for by cast=, None: as stored
    # pad='ignore' on a label field given a cast=: (ignore_index, offset of
    # the batch's is_pad rows), written into its padding rows as delivered
    # (the value is meant for the dtype asked for); other label fields get
    # it in the C fill
    ignore: Optional[tuple] = None


class RingBusy(Exception):
    """Another live process holds this worker's ring region."""


# How long a worker waits for the region of an earlier iteration's worker:
# a new epoch's DataLoader iterator starts its workers before the previous
# iterator is shut down (Lightning, a loop that breaks early), and those
# workers let the region go as they exit.
TAKEOVER_S = 10.0


def region_path(main_pid, token, worker):
    return f"{DIR}/{PREFIX}{main_pid}.{token}.w{worker}"


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_dead():
    """Removes this user's ring files whose main process is gone (it was
    killed before its clean-up ran); returns how many. Files of live
    processes stay."""
    n = 0
    for path in glob.glob(f"{DIR}/{PREFIX}*"):
        try:
            pid = int(os.path.basename(path)[len(PREFIX):].split(".", 1)[0])
            if pid > 0 and not _alive(pid) and os.lstat(path).st_uid == os.geteuid():
                os.unlink(path)
                n += 1
        except (ValueError, OSError):
            pass
    return n


def _sweep_dead():
    """remove_dead(), once per process: the first ring made."""
    global _swept
    if not _swept:
        _swept = True
        remove_dead()


def _remove_mine(pid):
    """This process's ring files (its exit: every worker has ended)."""
    if os.getpid() != pid:
        return
    for path in glob.glob(f"{DIR}/{PREFIX}{pid}.*"):
        try:
            if os.lstat(path).st_uid == os.geteuid():
                os.unlink(path)
        except OSError:
            pass


def _quiet_worker_deaths(pid):
    """At exit, before multiprocessing ends the workers: torch's SIGCHLD
    handler would raise for each one it terminates ("killed by signal"),
    inside multiprocessing's exit function, which then stops before the
    ring files go. Only torch's handler is taken down, in this process."""
    import signal
    handler = signal.getsignal(signal.SIGCHLD)
    if os.getpid() == pid and getattr(handler, "__module__", "").startswith("torch."):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def remove_at_exit():
    """At this process's exit, after multiprocessing has ended its daemonic
    children (DataLoader workers: a worker started late in an interrupted
    epoch may make its region after the datasets' own clean-up ran), and
    on a SIGTERM it does not handle, its ring files go. A priority below 0
    runs after the children are joined; an atexit function registered
    after multiprocessing's runs before it."""
    global _exit_registered
    pid = os.getpid()
    if _exit_registered != pid:
        import atexit
        import multiprocessing.util
        _exit_registered = pid
        multiprocessing.util.Finalize(None, _remove_mine, args=(pid,), exitpriority=-100)
        atexit.register(_quiet_worker_deaths, pid)
        try:  # SIGTERM with no handler: its files go too (a SIGTERM to every
            # process of a job may leave no worker to remove them)
            _C.ring_term_removes(DIR, f"{PREFIX}{pid}.")
        except OSError:
            pass  # not Linux


class WorkerStart:
    """worker_init_fn of a wirehead_torch.DataLoader (wrapping the user's):
    the worker ends when the process iterating the DataLoader dies, by any
    signal, SIGKILL included, and the last words of each worker remove
    that process's ring files (_C.ring_exit_with; Linux)."""

    def __init__(self, fn=None):
        self.fn = fn
        remove_at_exit()  # made in the main process, by the DataLoader

    def __call__(self, worker_id):
        import multiprocessing
        parent = multiprocessing.parent_process()
        if parent is not None and hasattr(_C, "ring_exit_with"):
            main = parent.pid
            # a forkserver's child: its parent is the server, which ends
            # after the main process; else the main process is the parent
            # (reparented once it died: ended at once)
            ppid = main if os.getppid() == main or not _alive(main) else 0
            try:
                _C.ring_exit_with(main, ppid, DIR, f"{PREFIX}{main}.")
            except OSError:
                pass  # not Linux: torch's own check ends workers within 5 s
        if self.fn is not None:
            self.fn(worker_id)


def hand_over_checks(token, on, rows=False):
    """How this process checks token's batches at hand-over: the slot's
    seal (on), and every row again (rows: HANDOVER_CHECK: rows). Kept here,
    in the process that claims, never taken from a handle: a dataset with
    VERIFY_READS off checks no bytes on reads, so none at hand-over
    either."""
    _CHECK[token] = _C.RING_CHECK_ROWS if on and rows else _C.RING_CHECK_SLOT if on else 0


def cleanup(main_pid, token):
    """Removes a dataset's ring files (in its main process only: a forked
    worker that collects its copy of the dataset must not)."""
    if os.getpid() != main_pid:
        return
    for key in [k for k in _MAIN if k[1] == token]:
        del _MAIN[key]
    _CHECK.pop(token, None)
    for path in glob.glob(f"{DIR}/{PREFIX}{main_pid}.{token}.*"):
        try:
            os.unlink(path)
        except OSError:
            pass


class WorkerRing:
    """The worker's side of region k (its lock held, slots the main process
    does not hold reclaimed): _C.ring_fill takes and fills its slots."""

    def __init__(self, main_pid, token, worker, nslots):
        _sweep_dead()
        self.main_pid = main_pid
        self.token = token
        self.worker = worker
        self.nslots = nslots
        self.pid = os.getpid()
        self.warned = False  # "all slots held" logged once
        path = region_path(main_pid, token, worker)
        deadline, delay = time.monotonic() + TAKEOVER_S, 0.001
        while True:
            try:
                self.c = _C.Ring(path, nslots, True, main_pid, str(worker))
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RingBusy(path) from None
            time.sleep(delay)  # the holder exits when its iterator is shut down
            delay = min(delay * 2, 0.05)

    def give_back(self, j):
        self.c.give_back(j)

    @staticmethod
    def first_fallback(main_pid, token, worker):
        """True the first time any process asks for this region (a marker
        file beside it, removed with the dataset's files): the fallback is
        said once, not by each epoch's new worker."""
        try:
            os.close(os.open(region_path(main_pid, token, worker) + ".said",
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600))
        except FileExistsError:
            return False
        except OSError:
            pass  # no marker: said again rather than never
        return True

    def handle(self, *, slot, version, sequence, fields, extras, form, seal, wire, in_store):
        """The filled slot (version, sequence: its stamp) as the handle sent
        to the main process, with seal: the XXH3 of the slot's header and
        row table (each row's stored checksum, which its copy was checked
        against); wire: the batch's layout as ring_fill wrote it (bytes only
        C reads); in_store: rows of some fields stayed in the store."""
        return RingBatch(SlotHandle(
            main_pid=self.main_pid, token=self.token, worker=self.worker, nslots=self.nslots,
            slot=slot, version=version, sequence=sequence, worker_pid=self.pid, fields=fields,
            extras=extras, form=form, seal=seal, wire=wire, in_store=in_store))

    def local(self, *, slot, fields, extras, form, wire, in_store):
        """In-process iteration: the batch as tensors (a SlotBatch while a
        device iteration runs), no handle."""
        return batch_of(self.c.local(slot=slot, wire=wire), fields, extras, form, self.token,
                        wire, in_store)

    def close(self):
        self.c.unlock()


class SlotHandle(NamedTuple):
    """What crosses a DataLoader worker's queue for a batch in a ring slot."""
    main_pid: int  # the process that runs the DataLoader
    token: str  # the dataset's ring (BatchRing.token)
    worker: object  # the region: the worker's id
    nslots: int  # slots of the region
    slot: int
    version: int  # the slot file's version and fill sequence: the fill it names
    sequence: int
    worker_pid: int  # the worker that filled it
    fields: tuple  # SlotField per field batched
    extras: tuple  # (name, offset, dtype, rows[, (mul, add)]) per extra
    form: str  # "dict" or "list"
    seal: int  # XXH3 of the slot's seal
    wire: bytes  # the batch's layout as ring_fill wrote it: read only in C
    in_store: bool  # rows of some fields stayed in the store


class RingBatch:
    """A filled slot, in transit from a worker to the DataLoader's main
    process; unpickled there it is the batch (a dict or list of tensors).
    Use the dataset with DataLoader(batch_size=None): it yields whole
    batches (a map-style reader with sampler=BatchSampler(...) too)."""

    __slots__ = ("handle",)

    def __init__(self, handle):
        self.handle = handle

    def __reduce__(self):
        return _open, (self.handle,)

    def __repr__(self):
        return (f"<wirehead_torch RingBatch slot {self.handle.slot} of worker "
                f"{self.handle.worker}: opened as tensors in the DataLoader's main process; a "
                f"DataLoader over a dataset with batches=True needs batch_size=None>")


# main process: (main pid, token, worker) -> _C.Ring
_MAIN = {}
# token -> device iterations running now (direct): batches stay SlotBatch
_DIRECT = {}


def direct(token, on):
    """A device iteration of token's batches starts (on) or ends: meanwhile
    claimed batches arrive as SlotBatch, to be copied from their slot."""
    n = _DIRECT.get(token, 0) + (1 if on else -1)
    if n > 0:
        _DIRECT[token] = n
    else:
        _DIRECT.pop(token, None)


class SlotBatch:
    """A batch still in its slot (mem: the claimed slot's uint8 Array, or
    heap memory), for a device iteration to copy straight from the slot;
    wire: the batch's layout as its worker wrote it (None for heap memory),
    in_store: the rows of some fields are in the store, for the copy to take
    from there. take() hands mem over once: whoever still refers to this
    object (a reader's suspended frame) no longer holds the slot."""

    __slots__ = ("mem", "fields", "extras", "form", "wire", "in_store")

    def __init__(self, mem, fields, extras, form, wire=None, in_store=False):
        self.mem, self.fields, self.extras, self.form = mem, fields, extras, form
        self.wire, self.in_store = wire, in_store

    def __repr__(self):
        return ("<wirehead_torch SlotBatch: a batch for a device iteration of "
                "wirehead_torch.DataLoader (device= or to_device), not tensors>")

    def take(self):
        mem, self.mem = self.mem, None
        return mem


def batch_of(mem, fields, extras, form, token, wire=None, in_store=False):
    """The batch over mem: tensors, or a SlotBatch while a device iteration
    of token runs. One whose large rows are in the store is always a
    SlotBatch: only a device iteration asks for those, and one that ended
    leaves them only to batches torch drops unread."""
    if token in _DIRECT or in_store:
        return SlotBatch(mem, tuple(fields), tuple(extras), form, wire, in_store)
    return tensors(mem, fields, extras, form)


# token -> how its batches are checked at hand-over (hand_over_checks)
_CHECK = {}


def _open(h):
    """A SlotHandle unpickled: the batch over its slot, claimed and checked
    (in C; the slot goes back to its worker when the last tensor over it
    dies)."""
    if os.getpid() != h.main_pid:
        raise RuntimeError(f"a wirehead ring batch opens only in the process that runs the "
                           f"DataLoader (pid {h.main_pid}), not in pid {os.getpid()}")
    key = (h.main_pid, h.token, h.worker)
    ring = _MAIN.get(key)
    if ring is None:
        ring = _MAIN[key] = _C.Ring(region_path(h.main_pid, h.token, h.worker), h.nslots, False,
                                    h.main_pid, str(h.worker))
    mem = ring.claim(slot=h.slot, version=h.version, sequence=h.sequence,
                     worker_pid=h.worker_pid, seal=h.seal, wire=h.wire,
                     check=_CHECK.get(h.token, _C.RING_CHECK_SLOT))
    return batch_of(mem, h.fields, h.extras, h.form, h.token, h.wire, h.in_store)


def tensors(mem, fields, extras, form="dict", from_dlpack=None):
    """The batch's tensors over mem (a uint8 Array: a claimed slot, heap
    memory when no slot was free, or the batch's copy on a device); a slot
    goes back when the last of them dies. extras: (name, offset, dtype,
    rows) read from the batch's tail, as small tensors of their own; a
    fifth item (mul, add) makes the column stored * mul + add (spec mode's
    generation and spec_index, docs/reproducible.md)."""
    import torch
    base = (from_dlpack or torch.from_dlpack)(mem)
    out = {}
    for f in fields:
        t = base[f.offset:f.offset + f.nbytes].view(getattr(torch, f.dtype)).view(f.shape)
        if f.cast and f.cast != f.dtype:
            t = t.to(getattr(torch, f.cast))  # a copy: the slot keeps the stored bytes
        if f.ignore is not None:
            value, pad_off = f.ignore
            t[base[pad_off:pad_off + f.shape[0]].view(torch.bool)] = value
        out[f.key] = t
    for name, off, dtype, n, *affine in extras:
        tdt = getattr(torch, dtype)
        t = base[off:off + n * torch.empty((), dtype=tdt).element_size()].view(tdt).clone()
        if affine:
            mul, add = affine[0]
            t = t * mul + add
        out[name] = t
    return list(out.values()) if form == "list" else out
