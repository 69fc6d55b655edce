"""Export: sealed generations into tar shards and their index.json
(docs/shards.md), written beside a lock so two exports never share a
directory, every name reached through the one fd --out was opened as."""
import fcntl
import json
import os
import re
import signal
import stat
import time

from . import _C, _files
from ._reader import wait_for_generation
from ._shard_format import (
    BLOCK,
    END,
    EXPORT_NOTE_EVERY,
    INDEX_FORMAT,
    INDEX_NAME,
    LOCK_NAME,
    ShardError,
    bytes_of,
    log,
    npy_header,
    tar_header,
)
from ._store import GenLabels, ProcessStore, StopFlag
from .config import get_config, parse_bytes

_WHO = "wirehead export"  # the one prefix of everything an export says


class _ShardWriter:
    """Writes shards DIR/PREFIX-NNNNNN.tar, each to a temporary name, fsynced
    and renamed when complete; index.json is rewritten (atomically) after
    every shard, so a killed export leaves complete shards and their index.
    Every name is made relative to dir_fd (DIR, opened once); out is DIR's
    path, for messages. The index counts only samples and generations of
    the shards it lists."""

    def __init__(self, out, dir_fd, shard_size, fields, prefix="shards"):
        self.out = out
        self.dir_fd = dir_fd
        self.shard_size = shard_size
        self.prefix = prefix
        self.index = {"format": INDEX_FORMAT, "version": 1, "fields": list(fields),
                      "schema": None, "samples": 0, "generations": [], "checksum": "xxh3-64",
                      "shards": []}
        self._f = None
        self._tmp = None
        self._entry = None
        self._hash = None
        self._partial = False
        self._mtime = int(time.time())
        self._index_id = None  # (dev, ino) of the index.json this export put in place
        self._listed = {}  # generation: its samples in the shards the index lists
        self._added = {}  # generation: its samples added, listed or not
        self._entry_gens = {}  # generation: its samples in the shard being written

    def _path(self, name):
        return os.path.join(self.out, name)

    @property
    def written(self):
        """Samples in the listed shards and the one being written."""
        return self.index["samples"] + (self._entry["samples"] if self._f is not None else 0)

    def _open(self):
        n = len(self.index["shards"])
        name = f"{self.prefix}-{n:06d}.tar"
        self._tmp = self._path(f".{name}.tmp")
        self._f = open(_files.create(self._tmp, ShardError, dir_fd=self.dir_fd), "wb",
                       buffering=0)
        self._hash = _C.Xxh3()
        self._entry = {"name": name, "bytes": 0, "samples": 0, "xxh3": None, "members": {}}
        self._entry_gens = {}

    def _write(self, data):
        view = memoryview(data).cast("B")
        self._hash.update(view)
        self._entry["bytes"] += view.nbytes
        while view:
            n = self._f.write(view)
            view = view[n:]

    def add(self, gen, pos, arrays):
        """One sample: arrays are (dtype name, shape, C-contiguous buffer)
        in SAMPLE order."""
        size = sum(BLOCK + len(npy_header(d, s)) + b.nbytes + (-b.nbytes) % BLOCK
                   for d, s, b in arrays)  # npy headers are 64-aligned: padding is the data's
        if self._f is not None and self._entry["samples"] and \
                self._entry["bytes"] + size + len(END) > self.shard_size:
            self.close_shard()
        if self._f is None:
            self._open()
        key = f"g{gen:020d}-p{pos:05d}"
        self._partial = True  # until the sample's last member is written
        for field, (dtype, shape, buf) in zip(self.index["fields"], arrays):
            name = f"{key}.{field}.npy"
            head = npy_header(dtype, shape)
            data = memoryview(buf).cast("B")
            total = len(head) + data.nbytes
            member_hash = _C.Xxh3()
            member_hash.update(head)
            member_hash.update(data)
            self._write(tar_header(name, total, self._mtime) + head)
            self._write(data)
            pad = -total % BLOCK
            if pad:
                self._write(b"\0" * pad)
            self._entry["members"][name] = member_hash.hexdigest()
        self._partial = False
        self._note_schema(arrays)
        self._entry["samples"] += 1
        self._entry_gens[gen] = self._entry_gens.get(gen, 0) + 1
        self._added[gen] = self._added.get(gen, 0) + 1

    def _note_schema(self, arrays):
        seen = [{"dtype": d, "shape": list(s)} for d, s, _ in arrays]
        if self.index["schema"] is None:
            self.index["schema"] = dict(zip(self.index["fields"], seen))
            return
        for field, now in zip(self.index["fields"], seen):
            had = self.index["schema"][field]
            if had["dtype"] != now["dtype"]:
                had["dtype"] = None  # varies between samples
            if had["shape"] is not None and had["shape"] != now["shape"]:
                had["shape"] = None

    def close_shard(self):
        if self._f is None:
            return
        self._write(END)
        os.fsync(self._f.fileno())
        f, self._f = self._f, None
        self._entry["xxh3"] = self._hash.hexdigest()
        try:  # never over a file or link another process put at the name
            _files.put_in_place(f.fileno(), self._tmp, self._path(self._entry["name"]),
                                ShardError, dir_fd=self.dir_fd)
        finally:
            f.close()
        self.index["shards"].append(self._entry)
        self.index["samples"] += self._entry["samples"]
        for gen, n in self._entry_gens.items():
            self._listed[gen] = self._listed.get(gen, 0) + n
        self.index["generations"] = list(self._listed)
        self._write_index()

    def listed(self, gen):
        """The samples of generation gen in the listed shards."""
        return self._listed.get(gen, 0)

    def note_whole(self, whole):
        """The index's whole_generations: those of whole (read to their end)
        with every sample added in a listed shard; partial_generations: the
        other listed ones (an interrupted or failed export, a reclaimed
        generation, samples=N)."""
        done = [g for g in self._listed if g in whole and self._listed[g] == self._added[g]]
        self.index["whole_generations"] = done
        self.index["partial_generations"] = [g for g in self._listed if g not in done]

    def _write_index(self):
        # the first one never replaces a file; later ones only the one put here before
        self._index_id = _files.write_file(
            self._path(INDEX_NAME), json.dumps(self.index, indent=1).encode(),
            ShardError, replaces=self._index_id, sync=True,
            tmp=self._path(f".{INDEX_NAME}.tmp"), dir_fd=self.dir_fd)
        os.fsync(self.dir_fd)

    def finish(self):
        """Completes the shard being written; one holding part of a sample
        (an error in the middle of writing it: a full disk) is dropped
        instead, so every shard on disk holds whole samples only."""
        if self._partial:
            self._partial = False
            self.abandon()
        self.close_shard()

    def abandon(self):
        if self._f is not None:
            mine = _files.identity(self._f.fileno())
            self._f.close()
            self._f = None
            _files.remove_own(self._tmp, mine, self.dir_fd)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class _Out:
    """--out, opened once as a directory of this user's, its final component
    never followed (O_NOFOLLOW: a link there, planted in a shared directory,
    is refused naming it). Every name the export makes, takes over, renames
    or removes is reached relative to fd, so --out renamed away mid-export
    and replaced (by a link, another directory) gets nothing: the files go
    on into the directory opened, wherever it now is."""

    def __init__(self, out):
        # a trailing "/" or "/." would have the kernel follow a link at the last name
        self.path = re.sub(r"(?:/\.?)+$", "", out) or ("/" if out.startswith("/") else ".")
        self.fd = self._parent = None
        self.made = False
        parent, self._name = os.path.split(self.path)
        try:
            if self._name in ("", ".", ".."):  # no link can be the last component
                self.fd = self._open(self.path, None)
            else:
                self._parent = self._open_parent(parent or ".")
                try:
                    os.mkdir(self._name, dir_fd=self._parent)
                    self.made = True
                except FileExistsError:
                    pass
                except OSError as e:
                    raise ShardError(f"--out {self.path}: cannot make it: {e.strerror}") from None
                self.fd = self._open(self._name, self._parent)
            st = os.fstat(self.fd)
            if st.st_uid != os.geteuid():
                raise ShardError(f"--out {self.path} belongs to uid {st.st_uid}, not to this "
                                 f"user (uid {os.geteuid()}); another user's directory is "
                                 f"theirs to change under the export: give a new directory "
                                 f"or one of yours")
        except BaseException:
            self._close_fds()
            raise

    def _open_parent(self, parent):
        try:
            os.makedirs(parent, exist_ok=True)
            return os.open(parent, _DIR_FLAGS)
        except OSError as e:
            why = e.strerror if os.path.isdir(parent) or not os.path.lexists(parent) else \
                f"{_files.there(parent)} is there, not a directory"
            raise ShardError(f"--out {self.path}: cannot make or open {parent}: {why}") from None

    def _open(self, name, parent):
        try:
            return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
        except OSError as e:
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except OSError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                raise ShardError(
                    f"--out {self.path} is a symbolic link (to "
                    f"{os.readlink(name, dir_fd=parent)}); export never writes through a "
                    f"link at --out (one planted in a shared directory would take the "
                    f"shards elsewhere): give the directory itself") from None
            if st is not None and not stat.S_ISDIR(st.st_mode):
                raise ShardError(f"--out {self.path} is {_files.kind(st.st_mode)}, not a "
                                 f"directory; give an empty or new directory") from None
            raise ShardError(f"--out {self.path}: cannot open: {e.strerror}") from None

    def name(self, name):
        """A name in --out as messages give it."""
        return os.path.join(self.path, name)

    def take(self, prefix):
        """Takes the export lock; returns its fd. A directory holding an
        export is refused; the leftovers of a dead exporter (no lock held)
        are removed either way, so a killed export leaves only whole shards
        behind. On an error --out is released (removed when made here)."""
        lock = None
        try:
            lock = self._lock_file()
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(lock)
                lock = None  # another export's: not removed
                raise ShardError(f"{self.path}: another export is writing there now") from None
            self._clear(prefix)
        except BaseException:
            self.release(lock, wrote=False)
            raise
        return lock

    def _clear(self, prefix):
        names = sorted(os.listdir(self.fd))
        removed = []
        for name in names:  # a dead export's unfinished shard or index: nobody holds the lock
            if name.startswith(f".{prefix}-") and name.endswith(".tar.tmp") or \
                    name == f".{INDEX_NAME}.tmp":
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):  # no export makes a link
                    raise ShardError(f"{self.name(name)}: {_files.kind(st.st_mode)} is there, "
                                     f"not an export's leftover; refusing to write through "
                                     f"or over it (remove it)")
                os.unlink(name, dir_fd=self.fd)
                removed.append(name)
        held = [n for n in names if n == INDEX_NAME or
                (n.startswith(prefix + "-") and n.endswith(".tar"))]
        if held:
            first = next((n for n in held if n != INDEX_NAME), held[0])
            raise ShardError(f"{self.path} holds an export already ({first}"
                             + (f" and {len(held) - 1} more" if len(held) > 1 else "")
                             + (f"; removed a dead export's leftovers {removed}" if removed
                                else "")
                             + "): give an empty or new --out directory, or remove that "
                               "export first")

    def _lock_file(self):
        """The export lock's fd: made exclusively, or a killed export's lock
        file taken over when it is a plain file of this user's (one name, not
        a link); anything else at the name is refused naming it."""
        try:
            return os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                           os.O_CLOEXEC, 0o644, dir_fd=self.fd)
        except FileExistsError:
            pass
        try:
            fd = os.open(LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=self.fd)
        except OSError:
            fd = None
        if fd is not None:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1:
                return fd
            os.close(fd)
        path = self.name(LOCK_NAME)
        raise ShardError(f"{path}: {_files.there(path, self.fd)} is there that no export of "
                         f"this user made; refusing to lock through it (remove it)")

    def release(self, lock, wrote=True):
        """Drops the export lock (None: not taken); a directory this export
        made and wrote nothing into is removed again (while its name is
        still that directory)."""
        if lock is not None:
            _files.remove_own(self.name(LOCK_NAME), _files.identity(lock), self.fd)
            os.close(lock)
        if self.made and not wrote and \
                _files.named(self._name, self._parent) == _files.identity(self.fd):
            try:
                os.rmdir(self._name, dir_fd=self._parent)
            except OSError:
                pass
        self._close_fds()

    def _close_fds(self):
        for fd in (self.fd, self._parent):
            if fd is not None:
                os.close(fd)
        self.fd = self._parent = None


def export_shards(out, config_path=None, config=None, *, generations=None, samples=None,
                  shard_size="1GiB", timeout=None, prefix="shards", quiet=True,
                  on_signal="raise"):
    """Writes sealed generations of the store as tar shards into directory
    out (docs/shards.md); returns the index (a dict, also out/index.json).

    Starts at the newest sealed generation, exports every position of it
    through the store's verified read path, then waits (up to ``timeout``,
    default READ_TIMEOUT) for the next newer one, until ``generations``
    whole generations (default 1) or exactly ``samples`` samples are
    written. A sample is held in memory one at a time.

    SIGINT/SIGTERM end the export early: with generations= after finishing
    the generation being written, with samples= after the current sample;
    the shard being written is completed and index.json says
    ``"complete": false`` and which generation, if any, is in the shards
    only in part. Then
    on_signal="raise" (default) raises KeyboardInterrupt (SIGINT) or
    SystemExit(143) (SIGTERM); on_signal="return" returns the index (the
    command line does this and exits 130 or 143)."""
    if on_signal not in ("raise", "return"):
        raise ValueError(f"on_signal must be 'raise' or 'return', got {on_signal!r}")
    cfg = get_config(config_path, config)
    if generations is not None and samples is not None:
        raise ValueError("give generations= or samples=, not both")
    for what, v in (("generations", generations), ("samples", samples)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ValueError(f"{what} must be a positive integer, got {v!r}")
    if generations is None and samples is None:
        generations = 1
    try:
        limit = parse_bytes(shard_size, key="shard_size", where="export")
    except ValueError:
        raise ValueError(f"shard_size must be a byte count like 1073741824 or '1GiB', got "
                         f"{shard_size!r}") from None
    if limit < BLOCK * 4:
        raise ValueError(f"shard_size {shard_size!r} is too small (at least 2 KiB)")
    fields = list(cfg["SAMPLE"])
    for f in fields:
        if "/" in f or not f.isprintable():
            raise ShardError(f"SAMPLE field {f!r} cannot name a tar member (a '/' or an "
                             f"unprintable character)")
    timeout = float(cfg["READ_TIMEOUT"] if timeout is None else timeout)
    if not timeout >= 0:
        raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout:g}")
    where = _Out(out)
    lock = where.take(prefix)
    w = None
    try:
        store_handle = ProcessStore(cfg)  # opened as the readers open it
        w = _ShardWriter(where.path, where.fd, limit, fields, prefix)
        return _export(w, store_handle, cfg, out, generations, samples, timeout, quiet,
                       on_signal)
    finally:
        where.release(lock, wrote=w is not None and bool(w.index["shards"]))


def _export(w, store_handle, cfg, out, generations, samples, timeout, quiet, on_signal):
    say = (lambda text: None) if quiet else \
        (lambda text: print(f"{_WHO}: {text}", flush=True))
    label = GenLabels(store_handle)  # #N as status says; shard names keep the full ids
    done_gens = moved = corrupt = 0
    last = 0
    whole = []  # generations written whole
    signum = None
    try:
        with StopFlag() as stop:
            store = store_handle.get()
            swap_cap = store.swap_cap
            while not stop:
                gen = wait_for_generation(store, cfg, timeout, last, stop=stop,
                                          who=_WHO, note_every=EXPORT_NOTE_EVERY,
                                          longer="timeout= (--timeout) or READ_TIMEOUT")
                if gen is None:
                    break
                pos = 0
                told = False
                # a signal during --generations finishes the generation (sealed: no
                # waiting), so the shards hold whole generations; a second one stops
                while pos < swap_cap and (not stop or (generations is not None and pos)):
                    if stop and not told:
                        told = True
                        say(f"{signal.Signals(stop.signum).name}: finishing generation "
                            f"{label(gen)} "
                            f"({swap_cap - pos} positions left); a second signal stops now")
                    try:
                        got = store.read_sample(gen, pos, None, timeout, False)
                    except _C.CorruptSampleError as e:
                        corrupt += 1
                        log.warning("%s: generation %s position %d not exported: %s", _WHO,
                                    label(gen), pos, e)
                        pos += 1
                        continue
                    if got.generation != gen:  # reclaimed under us: start over on the newer one
                        moved += 1
                        if stop:  # not a newer one, once stopped: this one stays partial
                            break
                        log.warning("%s: generation %s was reclaimed after %d of %d positions; "
                                    "going on with generation %s", _WHO, label(gen), pos,
                                    swap_cap, label(got.generation))
                        gen, pos = got.generation, 0
                        continue
                    w.add(gen, got.position,
                          [(a.dtype, a.shape, bytes_of(a)) for a in got.arrays])
                    del got
                    pos += 1
                    if samples is not None and w.written >= samples:
                        break
                last = gen
                if pos >= swap_cap:
                    done_gens += 1
                    whole.append(gen)
                    say(f"generation {label(gen)} written ({w.written} samples so far)")
                if samples is not None and w.written >= samples:
                    break
                if generations is not None and done_gens >= generations:
                    break
            signum = stop.signum if stop else None
        w.finish()
        names = {g: label(g) for g in w.index["generations"]}  # while the store is open
    except BaseException:
        w.finish()  # the whole samples written so far stay
        if w.index["shards"]:
            w.index["complete"] = False
            w.note_whole(whole)
            w._write_index()
        raise
    finally:
        store_handle.close()
    w.index["reclaimed_during_export"] = moved
    w.index["corrupt_skipped"] = corrupt
    w.index["complete"] = signum is None
    w.note_whole(whole)
    if w.index["shards"]:  # else nothing is kept: the directory is removed if made here
        w._write_index()
    if signum is not None:
        name = signal.Signals(signum).name
        w.index["interrupted"] = name
        part = w.index["partial_generations"]
        if part:  # for the caller's message (not in index.json, which has the id)
            w.index["partial_label"] = _labels(part, names)
        say(f"interrupted by {name}: {_wrote(w, names, out)} (index.json: complete false)")
        if on_signal == "raise":
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        return w.index
    say(_wrote(w, names, out))
    return w.index


def _wrote(w, names, out):
    """What the export wrote, counted from the shards its index lists:
    samples, shards, the generations in them whole and those only in part."""
    idx = w.index
    text = f"{_n(idx['samples'], 'sample')} in {_n(len(idx['shards']), 'shard')} under {out}"
    whole, part = idx["whole_generations"], idx["partial_generations"]
    said = []
    if whole:
        said.append(f"{_n(len(whole), 'whole generation')} ({_labels(whole, names)})")
    if len(part) == 1:
        said.append(f"{_n(w.listed(part[0]), 'sample')} of generation {names[part[0]]}")
    elif part:
        said.append(f"{_n(sum(map(w.listed, part)), 'sample')} of {len(part)} generations "
                    f"only in part ({_labels(part, names)})")
    return text + (": " + " and ".join(said) if said else "")


def _n(count, what):
    return f"{count} {what}" + ("" if count == 1 else "s")


def _labels(gens, names):
    shown = [names[g] for g in gens]
    return ", ".join(shown if len(shown) <= 4 else [shown[0], "...", shown[-1]])

