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
one exits (TAKEOVER_S).
The main process removes its files when the dataset is collected or at exit;
files of a main process that died are removed by the next ring made or by
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

    def handle(self, j, stamp, fields, extras, form, seal, size, direct=None):
        """The filled slot j (stamp: its version and fill sequence) as the
        handle sent to the main process, with seal: the XXH3 of the slot's
        header and row table (each row's stored checksum, which its copy
        was checked against); direct: the rows left in the store
        (_batch.DirectRows), None when the slot holds the whole batch."""
        ver, seq = stamp
        return RingBatch(self.main_pid, self.token, self.worker, self.nslots, j, ver, seq,
                         self.pid, fields, extras, form, seal, size, direct)

    def local(self, j, fields, extras, size, form="dict", direct=None):
        """In-process iteration: the batch as tensors (a SlotBatch while a
        device iteration runs), no handle."""
        return batch_of(self.c.local(j, size), fields, extras, form, self.token, direct)

    def close(self):
        self.c.unlock()


class RingBatch:
    """A filled slot, in transit from a worker to the DataLoader's main
    process; unpickled there it is the batch (a dict or list of tensors).
    Use the dataset with DataLoader(batch_size=None): it yields whole
    batches (a map-style reader with sampler=BatchSampler(...) too)."""

    __slots__ = ("args",)

    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return _rebuild, self.args

    def __repr__(self):
        return (f"<wirehead_torch RingBatch slot {self.args[4]} of worker {self.args[2]}: "
                f"opened as tensors in the DataLoader's main process; a DataLoader over "
                f"a dataset with batches=True needs batch_size=None>")


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
    direct: the rows a worker left in the store (_batch.DirectRows), for
    the copy to take from there. take() hands mem over once: whoever still
    refers to this object (a reader's suspended frame) no longer holds the
    slot."""

    __slots__ = ("mem", "fields", "extras", "form", "direct")

    def __init__(self, mem, fields, extras, form, direct=None):
        self.mem, self.fields, self.extras, self.form = mem, fields, extras, form
        self.direct = direct

    def __repr__(self):
        return ("<wirehead_torch SlotBatch: a batch for a device iteration of "
                "wirehead_torch.DataLoader (device= or to_device), not tensors>")

    def take(self):
        mem, self.mem = self.mem, None
        return mem


def batch_of(mem, fields, extras, form, token, direct=None):
    """The batch over mem: tensors, or a SlotBatch while a device iteration
    of token runs. One whose large rows are in the store is always a
    SlotBatch: only a device iteration asks for those, and one that ended
    leaves them only to batches torch drops unread."""
    if token in _DIRECT or direct is not None:
        return SlotBatch(mem, tuple(fields), tuple(extras), form, direct)
    return tensors(mem, fields, extras, form)
# token -> how its batches are checked at hand-over (hand_over_checks)
_CHECK = {}


def _rebuild(main_pid, token, worker, nslots, j, ver, seq, wpid, fields, extras, form, seal,
             size, direct=None):
    if os.getpid() != main_pid:
        raise RuntimeError(f"a wirehead ring batch opens only in the process that runs the "
                           f"DataLoader (pid {main_pid}), not in pid {os.getpid()}")
    key = (main_pid, token, worker)
    ring = _MAIN.get(key)
    if ring is None:
        ring = _MAIN[key] = _C.Ring(region_path(main_pid, token, worker), nslots, False,
                                    main_pid, str(worker))
    # checked in C; the slot goes back to its worker when the last tensor
    # over it dies. The seal's table: every row of every field the slot
    # holds, then the extras
    rows = direct.checks() if direct else sum(f.shape[0] for f in fields) + 1
    check = _CHECK.get(token, _C.RING_CHECK_SLOT)
    return batch_of(ring.claim(j, ver, seq, wpid, size, seal, rows, check), fields, extras, form,
                    token, direct)


def tensors(mem, fields, extras, form="dict", from_dlpack=None):
    """The batch's tensors over mem (a uint8 Array: a claimed slot, heap
    memory when no slot was free, or the batch's copy on a device); a slot
    goes back when the last of them dies. extras: (name, offset, dtype,
    rows) read from the batch's tail, as small tensors of their own."""
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
    for name, off, dtype, n in extras:
        tdt = getattr(torch, dtype)
        out[name] = base[off:off + n * torch.empty((), dtype=tdt).element_size()].view(tdt).clone()
    return list(out.values()) if form == "list" else out
