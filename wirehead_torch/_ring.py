"""Shared-memory batch ring behind batches=True of WireheadIterableDataset
and of the map-style readers (filled by _batch.py).

A DataLoader worker reads each sample once, straight into a row of a slot:
a file in /dev/shm that the DataLoader's main process maps too. Only a small
handle (RingBatch) crosses the worker's queue; unpickled in the main process
it becomes the batch (a dict or a list of tensors viewing the slot), and the
slot goes back to its worker when the last of those tensors dies. Slots are
reused, so after the first round no sample lands in fresh pages, in the
worker or the main process.

Files, per (main process, dataset, worker k), mode 0600:
  wirehead-ring.<main pid>.<token>.w<k>             control words; the live
                                                    worker holds an flock on it
  wirehead-ring.<main pid>.<token>.w<k>.s<j>.v<v>   slot j's bytes (v grows it)
Control words per slot: owner pid (0: free), fill sequence, capacity,
version. The worker that takes region k (the flock) reclaims every slot not
held by the main process: its previous owner died or exited, and the handle
it sent is refused (owner and sequence are checked) if it ever arrives. The
main process removes its files when the dataset is collected or at exit;
files of a main process that died are removed by the next ring made.

/dev/shm is open to every user, so the files are made and opened in C
(SharedMap): made exclusively, never through a symlink, and an existing one
is used only if it is this user's regular file with mode 0600 and the size
expected; anything else is refused naming the path, and never written. A
file's size is checked again before each control word, copy and hand-over
(a truncated file is an error naming it, not SIGBUS), and the handle
carries the XXH3 of each row of each field as the worker left it (the
sample's stored checksum, which the copy into the slot was checked against,
so the worker makes no second pass): the main process checks every row
before any tensor views the slot, so bytes changed in between are an error
naming the file, never a batch.
"""
import glob
import logging
import os
import stat
import threading
import time
import weakref
from typing import NamedTuple, Optional

from . import _C

log = logging.getLogger("wirehead_torch")

DIR = "/dev/shm"
PREFIX = "wirehead-ring."
_WORDS = 4
_OWNER, _SEQ, _CAP, _VER = range(_WORDS)
_PAGE = os.sysconf("SC_PAGE_SIZE")
_swept = False


class SlotField(NamedTuple):
    """One field of a batch in a ring slot (what crosses to the main process)."""
    key: str  # the batch's name for it
    dtype: str  # as stored
    shape: tuple  # the batch's: rows first
    offset: int  # where its rows start in the slot
    nbytes: int  # bytes of all its rows
    cast: Optional[str]  # the dtype asked for by cast=, None: as stored


class RingBusy(Exception):
    """Another live process holds this worker's ring region."""


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


def _sweep_dead():
    """Removes ring files whose main process is gone (it was killed before
    its clean-up ran); once per process."""
    global _swept
    if _swept:
        return
    _swept = True
    for path in glob.glob(f"{DIR}/{PREFIX}*"):
        try:
            pid = int(os.path.basename(path)[len(PREFIX):].split(".", 1)[0])
            if pid > 0 and not _alive(pid) and os.lstat(path).st_uid == os.geteuid():
                os.unlink(path)
        except (ValueError, OSError):
            pass


def cleanup(main_pid, token):
    """Removes a dataset's ring files (in its main process only: a forked
    worker that collects its copy of the dataset must not)."""
    if os.getpid() != main_pid:
        return
    for key in [k for k in _MAIN if k[1] == token]:
        del _MAIN[key]
    for path in glob.glob(f"{DIR}/{PREFIX}{main_pid}.{token}.*"):
        try:
            os.unlink(path)
        except OSError:
            pass


def _map(path, size, create):
    """Slot file at path mapped (made when create, else an existing one of
    ours); OSError naming the file when it cannot be, or is not ours."""
    try:
        # populated up front, once per slot and process: no faults per batch
        return _C.SharedMap(path, size, how="create" if create else "open", populate=True,
                            hugepage=create)
    except OSError as e:
        if create and "cannot reserve" in str(e):
            # reserved, not only sized: a full /dev/shm is this error, not a
            # SIGBUS at the first write into the slot
            raise OSError(f"wirehead ring slot {e}; free space there, or lower ring_slots "
                          f"or the batch size") from None
        raise OSError(f"wirehead ring slot: {e}") from None


def _unlink_ours(path):
    """Removes path if it is a file of this user's (a file or link of anyone
    else's stays, and creating the file there is then refused naming it)."""
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
            os.unlink(path)
    except OSError:
        pass


def _release(words, i, seq, owner):
    """Slot i back to its worker once the main process's tensors are gone."""
    if words.load(i + _SEQ) == seq:
        words.cas(i + _OWNER, owner, 0)


class _Slots:
    """Control words and slot maps of one region, as either side sees them."""

    def __init__(self, path, nslots, create):
        self.path = path
        self.nslots = nslots
        size = nslots * _WORDS * 8
        try:
            # a worker holds the region's lock for as long as it keeps the map
            self.words = _C.SharedMap(path, size, how="region" if create else "open")
        except BlockingIOError:
            raise RingBusy(path) from None
        except OSError as e:
            raise OSError(f"wirehead ring control file: {e}") from None
        self.maps = {}  # slot -> (version, SharedMap)

    def data(self, j, create=False):
        i = j * _WORDS
        ver, cap = self.words.load(i + _VER), self.words.load(i + _CAP)
        have = self.maps.get(j)
        if have is None or have[0] != ver:
            if cap <= 0:
                raise OSError(f"wirehead ring control file {self.path}: slot {j} has capacity "
                              f"{cap}: the file was damaged")
            self.maps[j] = (ver, _map(self.slot_path(j, ver), cap, create))
        return self.maps[j][1]

    def slot_path(self, j, ver):
        return f"{self.path}.s{j}.v{ver}"


class WorkerRing:
    """The worker's side of region k: takes free slots and fills them."""

    def __init__(self, main_pid, token, worker, nslots):
        _sweep_dead()
        self.main_pid = main_pid
        self.token = token
        self.worker = worker
        self.pid = os.getpid()
        self.warned = False  # "all slots held" logged once
        # threads of this process (a thread pool indexing a map-style reader)
        # take free slots one at a time
        self._lock = threading.Lock()
        self.s = _Slots(region_path(main_pid, token, worker), nslots, create=True)
        w = self.s.words
        for j in range(nslots):
            # not held by the main process: a dead or finished worker's
            held = w.load(j * _WORDS + _OWNER)
            if held not in (0, main_pid):
                w.cas(j * _WORDS + _OWNER, held, 0)

    def acquire(self, nbytes, wait_s):
        """(slot, writable mmap of at least nbytes), or None when every slot
        stays held for wait_s."""
        w, n = self.s.words, self.s.nslots
        deadline = time.monotonic() + wait_s
        delay = 5e-5
        while True:
            with self._lock:
                free = [j for j in range(n) if w.load(j * _WORDS + _OWNER) == 0]
                # only this process takes free slots of its region, so under the
                # lock a free slot stays free
                if free:
                    fits = [j for j in free if w.load(j * _WORDS + _CAP) >= nbytes]
                    j = fits[0] if fits else free[0]
                    i = j * _WORDS
                    w.add(i + _SEQ, 1)
                    w.store(i + _OWNER, self.pid)
                    try:
                        if not fits:
                            self._grow(j, nbytes)
                        return j, self.s.data(j)
                    except BaseException:
                        w.store(i + _OWNER, 0)
                        raise
            if time.monotonic() >= deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 2e-3)

    def _grow(self, j, nbytes):
        """Slot j's file replaced by a larger one: the new file is made
        first, so a failure (a full /dev/shm) leaves the slot as it was."""
        i = j * _WORDS
        w = self.s.words
        ver, cap = w.load(i + _VER), -(-nbytes // _PAGE) * _PAGE
        path = self.s.slot_path(j, ver + 1)
        _unlink_ours(path)  # left by a worker that died while growing this slot
        m = _map(path, cap, create=True)
        try:
            os.unlink(self.s.slot_path(j, ver))
        except OSError:
            pass
        w.store(i + _CAP, cap)
        w.store(i + _VER, ver + 1)
        self.s.maps[j] = (ver + 1, m)

    def give_back(self, j):
        with self._lock:
            self.s.words.cas(j * _WORDS + _OWNER, self.pid, 0)

    def handle(self, j, fields, extras, form, checks):
        """The filled slot j as the handle sent to the main process, with the
        XXH3 of each row of each field (checks: (offset, nbytes, XXH3-64),
        the stored checksums the copy was checked against): what the main
        process maps is checked against them."""
        i = j * _WORDS
        w = self.s.words
        return RingBatch(self.main_pid, self.token, self.worker, self.s.nslots, j,
                         w.load(i + _VER), w.load(i + _SEQ), self.pid, fields, extras, form,
                         checks)

    def local(self, j, fields, extras, form="dict"):
        """In-process iteration: the batch as tensors, no handle."""
        i = j * _WORDS
        m = self.s.data(j)
        m.check()  # still whole: the tensors are made over it
        return _tensors(m, fields, extras, self.s.words, i, self.s.words.load(i + _SEQ),
                        self.pid, form)

    def close(self):
        self.s.words.unlock()


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


# main process: (main pid, token, worker) -> _Slots
_MAIN = {}


def _rebuild(main_pid, token, worker, nslots, j, ver, seq, wpid, fields, extras, form, checks):
    if os.getpid() != main_pid:
        raise RuntimeError(f"a wirehead ring batch opens only in the process that runs the "
                           f"DataLoader (pid {main_pid}), not in pid {os.getpid()}")
    key = (main_pid, token, worker)
    s = _MAIN.get(key)
    if s is None:
        s = _MAIN[key] = _Slots(region_path(main_pid, token, worker), nslots, create=False)
    i = j * _WORDS
    w = s.words
    # the owner word changes hands atomically: a worker reclaiming the slot
    # at the same moment either sees it held here or takes it first
    if w.load(i + _SEQ) != seq or w.load(i + _VER) != ver or not w.cas(i + _OWNER, wpid, main_pid):
        raise RuntimeError(f"wirehead ring: slot {j} of worker {worker} was reclaimed before "
                           f"its batch arrived (worker {wpid} gone); batch dropped")
    try:
        m = s.data(j)
        # every row as the worker copied it (the sample's stored checksums),
        # or an error naming the file: garbage written into it is never delivered
        if len(checks) != _rows(fields) or any(m.hash(off, n) != h for off, n, h in checks):
            raise RuntimeError(f"wirehead ring: slot file {s.slot_path(j, ver)} was changed "
                               f"after worker {wpid} filled it (its bytes fail their XXH3 "
                               f"check); batch dropped")
    except BaseException:
        try:
            w.cas(i + _OWNER, main_pid, 0)  # back to the worker, which refills it
        except OSError:
            pass  # the control file is damaged too: the worker finds that out itself
        raise
    return _tensors(m, fields, extras, w, i, seq, main_pid, form)


def _rows(fields):
    """Rows of every field a batch of these fields has: one check each."""
    return sum(f.shape[0] for f in fields)


def _used(fields):
    """Bytes of a slot that a batch of these fields fills."""
    return max([off + nb for _, _, _, off, nb, _ in fields] + [0])


def _tensors(m, fields, extras, words, i, seq, owner, form="dict"):
    """The batch's tensors over slot map m; the slot is released when the
    last of them dies (the memoryview they all hold is collected)."""
    import torch
    used = _used(fields)
    if used > m.size:
        raise RuntimeError(f"wirehead ring: a batch of {used} bytes does not fit its slot "
                           f"file {m.path} ({m.size} bytes)")
    mv = memoryview(m)[:used]
    weakref.finalize(mv, _release, words, i, seq, owner)
    out = {}
    for name, dtype, shape, off, nb, target in fields:
        tdt = getattr(torch, dtype)
        count = nb // torch.empty((), dtype=tdt).element_size()
        t = (torch.frombuffer(mv, dtype=tdt, count=count, offset=off) if count
             else torch.empty(0, dtype=tdt)).view(shape)
        out[name] = _cast(t, dtype, target)
    del mv  # the tensors hold it now
    return _finish(out, extras, form)


def plain(mem, fields, extras, form="dict"):
    """A batch in ordinary memory (a worker found no free slot): torch's
    reduction sends it through the queue as any tensor, a copy."""
    import torch
    out = {}
    for name, dtype, shape, off, nb, target in fields:
        t = torch.from_numpy(mem[off:off + nb]).view(getattr(torch, dtype)).view(shape)
        out[name] = _cast(t, dtype, target)
    return _finish(out, extras, form)


def _cast(t, dtype, target):
    """The cast the user asked for (cast=), a copy; else t itself."""
    import torch
    return t.to(getattr(torch, target)) if target and target != dtype else t


def _finish(out, extras, form):
    """The batch as its dataset's default collate would have made it:
    {name: tensor} (plus the extras), or the tensors as a list ("list")."""
    import torch
    for name, (values, dtype) in extras.items():
        out[name] = torch.tensor(values, dtype=getattr(torch, dtype))
    return list(out.values()) if form == "list" else out
