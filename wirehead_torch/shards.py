"""Sealed generations to and from tar shards in the WebDataset layout
(docs/shards.md).

A shard is a plain ustar archive; each sample is one member per SAMPLE field,
``g<generation>-p<position>.<field>.npy``, in SAMPLE order, each a NumPy
``.npy`` file (format 1.0) of the field's exact stored dtype and shape.
``index.json`` beside the shards names the fields, their dtypes and shapes,
the sample count and an XXH3-64 checksum of every shard and member.

The tar headers and ``.npy`` headers are written and parsed here, with every
size bounded and checked, so a damaged or hostile shard is an error naming
the shard and the member, never a crash, a pickle or a partial sample."""
import ast
import fcntl
import glob
import json
import logging
import os
import random
import re
import signal
import stat
import time

import numpy as np

from . import _C, _files
from ._reader import wait_for_generation
from ._store import GenLabels, ProcessStore, StopFlag, gen_label
from .config import get_config, parse_bytes, redact

log = logging.getLogger("wirehead_torch")

__all__ = ["export_shards", "from_shards", "mix", "expand_urls", "ShardError", "ShardSource"]

INDEX_NAME = "index.json"
_LOCK_NAME = ".export.lock"
INDEX_FORMAT = "wirehead_torch shards"
SUPPORTED_MEMBERS = ".npy (NumPy arrays of a numeric or bool dtype)"

_BLOCK = 512
_END = b"\0" * (2 * _BLOCK)
_NPY_MAGIC = b"\x93NUMPY"
_NPY_HEADER_MAX = 1 << 16  # far above any header of <= MAX_NDIM dims
_PAX_MAX = 1 << 20  # a pax or GNU long-name record larger than this is refused
_NAME_MAX = 4096
_READ_CHUNK = 8 << 20
_WAIT_NOTE_EVERY = 10.0  # seconds between an export's notes on what it waits for

# store dtype name <-> .npy descr (little-endian; one-byte types say '|')
_DESCR = {"bool": "|b1", "uint8": "|u1", "int8": "|i1", "uint16": "<u2", "int16": "<i2",
          "uint32": "<u4", "int32": "<i4", "uint64": "<u8", "int64": "<i8", "float16": "<f2",
          "float32": "<f4", "float64": "<f8", "complex64": "<c8", "complex128": "<c16"}
_FROM_DESCR = {v: k for k, v in _DESCR.items()}
_FROM_DESCR.update({"<b1": "bool", "<u1": "uint8", "<i1": "int8", "=b1": "bool",
                    "=u1": "uint8", "=i1": "int8"})
_KEY_RE = re.compile(r"g(\d+)-p(\d+)$")
_OCTAL = re.compile(rb"[0-7]+")
_DECIMAL = re.compile(rb"[0-9]{1,20}")


class ShardError(_C.WireheadError, ValueError):
    """A shard that cannot be read or written as asked; ``shard`` and
    ``member`` name where (None where it does not apply)."""

    def __init__(self, message, shard=None, member=None):
        where = ""
        if shard is not None:
            where = f"shard {shard}" + (f", member {member!r}" if member is not None else "")
            where += ": "
        super().__init__(where + message)
        self.shard = shard
        self.member = member
        self.sample_only = False


def _SampleError(message, shard=None, member=None):
    """A ShardError of bad bytes inside one sample; the archive around it
    is intact, so on_error="skip" drops just that sample."""
    e = ShardError(message, shard, member)
    e.sample_only = True
    return e


# --------------------------------------------------------------------------
# .npy and tar headers


def npy_header(dtype, shape):
    """The .npy (format 1.0) header of a C-order array of dtype (a store
    dtype name) and shape, padded so the data starts 64-byte aligned."""
    descr = _DESCR.get(dtype)
    if descr is None:
        raise ShardError(f"dtype {dtype} has no .npy form (supported: {sorted(_DESCR)})")
    dims = ", ".join(str(int(d)) for d in shape) + ("," if len(shape) == 1 else "")
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({dims}), }}"
    total = len(_NPY_MAGIC) + 4 + len(text) + 1
    text += " " * (-total % 64) + "\n"
    return _NPY_MAGIC + b"\x01\x00" + len(text).to_bytes(2, "little") + text.encode("latin1")


def _octal(value, width):
    digits = format(value, "o")
    if len(digits) < width:
        return digits.rjust(width - 1, "0").encode() + b"\0"
    # GNU base-256 for sizes past the octal field (8 GiB for the size)
    return bytes([0x80]) + value.to_bytes(width - 1, "big")


def tar_header(name, size, mtime):
    """A ustar header block of a regular file."""
    raw = name.encode("utf-8")
    if len(raw) > 100:
        raise ShardError(f"member name {name!r} is longer than 100 bytes")
    h = bytearray(_BLOCK)
    h[0:len(raw)] = raw
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = _octal(size, 12)
    h[136:148] = _octal(int(mtime), 12)
    h[148:156] = b" " * 8
    h[156:157] = b"0"
    h[257:263] = b"ustar\0"
    h[263:265] = b"00"
    h[148:156] = format(sum(h), "06o").encode() + b"\0 "
    return bytes(h)


def _parse_number(field, what, shard, member):
    if field[:1] and field[0] & 0x80:  # GNU base-256, positive only
        if field[0] != 0x80:
            raise ShardError(f"tar header: negative or oversized {what}", shard, member)
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    if not _OCTAL.fullmatch(text):  # int() would take a sign or '_'
        raise ShardError(f"tar header: {what} {bytes(field)!r} is not an octal number",
                         shard, member)
    return int(text, 8)


def _safe_name(name, shard):
    if "\0" in name or "\\" in name or name.startswith("/") or len(name) > _NAME_MAX:
        raise _SampleError("unsafe member name (absolute, a NUL or a backslash, or too long)",
                           shard, name)
    parts = name.split("/")
    if ".." in parts:
        raise _SampleError("unsafe member name (a '..' component leaves the archive)",
                           shard, name)
    return name


def parse_npy(head, member_size, shard, member):
    """(dtype name, shape, fortran, header bytes) of a .npy member whose
    first bytes are head (at least its whole header)."""
    if len(head) < 10 or head[:6] != _NPY_MAGIC:
        raise _SampleError("not a .npy file (no \\x93NUMPY magic)", shard, member)
    major = head[6]
    if major == 1:
        hlen, start = int.from_bytes(head[8:10], "little"), 10
    elif major in (2, 3):
        if len(head) < 12:
            raise _SampleError(".npy header cut short", shard, member)
        hlen, start = int.from_bytes(head[8:12], "little"), 12
    else:
        raise _SampleError(f".npy format version {major} is not 1, 2 or 3", shard, member)
    if hlen > _NPY_HEADER_MAX or start + hlen > min(len(head), member_size):
        raise _SampleError(f".npy header of {hlen} bytes does not fit the member of "
                           f"{member_size} bytes", shard, member)
    try:
        text = bytes(head[start:start + hlen]).decode("utf-8" if major == 3 else "latin1")
        d = ast.literal_eval(text)
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        raise _SampleError(".npy header is not a Python literal", shard, member) from None
    if not isinstance(d, dict) or set(d) != {"descr", "fortran_order", "shape"}:
        raise _SampleError(".npy header must hold exactly descr, fortran_order and shape",
                           shard, member)
    descr, fortran, shape = d["descr"], d["fortran_order"], d["shape"]
    dtype = _FROM_DESCR.get(descr) if isinstance(descr, str) else None
    if dtype is None:
        raise _SampleError(f".npy dtype {descr!r} is not supported: wirehead_torch stores "
                           f"little-endian numeric and bool arrays ({', '.join(sorted(_DESCR))});"
                           f" object arrays (pickles) are never read", shard, member)
    if not isinstance(fortran, bool) or not isinstance(shape, tuple) or \
            len(shape) > _C.MAX_NDIM or not all(
                isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**48 for x in shape):
        raise _SampleError(f".npy header: bad fortran_order or shape {shape!r} (at most "
                           f"{_C.MAX_NDIM} non-negative dims)", shard, member)
    nbytes = np.dtype(descr).itemsize
    for x in shape:
        nbytes *= x
    if start + hlen + nbytes != member_size:
        raise _SampleError(f".npy data of shape {shape} {dtype} is {nbytes} bytes, the member "
                           f"holds {member_size - start - hlen}", shard, member)
    return dtype, shape, fortran, start + hlen


# --------------------------------------------------------------------------
# export


class _ShardWriter:
    """Writes shards DIR/PREFIX-NNNNNN.tar, each to a temporary name, fsynced
    and renamed when complete; index.json is rewritten (atomically) after
    every shard, so a killed export leaves complete shards and their index."""

    def __init__(self, out, shard_size, fields, prefix="shards"):
        self.out = out
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

    def _open(self):
        n = len(self.index["shards"])
        name = f"{self.prefix}-{n:06d}.tar"
        self._tmp = os.path.join(self.out, f".{name}.tmp")
        self._f = open(_files.create(self._tmp, ShardError), "wb", buffering=0)
        self._hash = _C.Xxh3()
        self._entry = {"name": name, "bytes": 0, "samples": 0, "xxh3": None, "members": {}}

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
        size = sum(_BLOCK + len(npy_header(d, s)) + b.nbytes + (-b.nbytes) % _BLOCK
                   for d, s, b in arrays)  # npy headers are 64-aligned: padding is the data's
        if self._f is not None and self._entry["samples"] and \
                self._entry["bytes"] + size + len(_END) > self.shard_size:
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
            pad = -total % _BLOCK
            if pad:
                self._write(b"\0" * pad)
            self._entry["members"][name] = member_hash.hexdigest()
        self._partial = False
        self._note_schema(arrays)
        self._entry["samples"] += 1
        self.index["samples"] += 1
        if not self.index["generations"] or self.index["generations"][-1] != gen:
            self.index["generations"].append(gen)

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
        self._write(_END)
        os.fsync(self._f.fileno())
        f, self._f = self._f, None
        self._entry["xxh3"] = self._hash.hexdigest()
        final = os.path.join(self.out, self._entry["name"])
        try:  # never over a file or link another process put at the name
            _files.put_in_place(f.fileno(), self._tmp, final, ShardError)
        except BaseException:
            self.index["samples"] -= self._entry["samples"]
            raise
        finally:
            f.close()
        self.index["shards"].append(self._entry)
        self._write_index()

    def _write_index(self):
        # the first one never replaces a file; later ones only the one put here before
        self._index_id = _files.write_file(
            os.path.join(self.out, INDEX_NAME), json.dumps(self.index, indent=1).encode(),
            ShardError, replaces=self._index_id, sync=True,
            tmp=os.path.join(self.out, f".{INDEX_NAME}.tmp"))
        fd = os.open(self.out, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

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
            self.index["samples"] -= self._entry["samples"]
            mine = _files.identity(self._f.fileno())
            self._f.close()
            self._f = None
            _files.remove_own(self._tmp, mine)


def _prepare_out(out, prefix):
    """Makes out (when missing) and takes its export lock; returns (lock
    fd, whether out was made here). A directory holding an export is
    refused; the leftovers of a dead exporter (no lock held) are removed
    either way, so a killed export leaves only whole shards behind."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ShardError(f"--out {out} is a file, not a directory; give an empty or new "
                         f"directory")
    made = not os.path.exists(out)
    os.makedirs(out, exist_ok=True)
    fd = _lock_file(os.path.join(out, _LOCK_NAME))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ShardError(f"{out}: another export is writing there now") from None
    try:
        names = sorted(os.listdir(out))
        removed = []
        for name in names:  # a dead export's unfinished shard or index: nobody holds the lock
            if name.startswith(f".{prefix}-") and name.endswith(".tar.tmp") or \
                    name == f".{INDEX_NAME}.tmp":
                path = os.path.join(out, name)
                if not stat.S_ISREG(os.lstat(path).st_mode):  # no export makes a link
                    raise ShardError(f"{path}: {_files.there(path)} is there, not an "
                                     f"export's leftover; refusing to write through or over "
                                     f"it (remove it)")
                os.unlink(path)
                removed.append(name)
        held = [n for n in names if n == INDEX_NAME or
                (n.startswith(prefix + "-") and n.endswith(".tar"))]
        if held:
            first = next((n for n in held if n != INDEX_NAME), held[0])
            raise ShardError(f"{out} holds an export already ({first}"
                             + (f" and {len(held) - 1} more" if len(held) > 1 else "")
                             + (f"; removed a dead export's leftovers {removed}" if removed
                                else "")
                             + "): give an empty or new --out directory, or remove that "
                               "export first")
    except BaseException:
        _release_out(out, fd, False)
        raise
    return fd, made


def _lock_file(path):
    """The export lock's fd: made exclusively, or a killed export's lock
    file taken over when it is a plain file of this user's (one name, not
    a link); anything else at the name is refused naming it."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                       0o644)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        fd = None
    if fd is not None:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1:
            return fd
        os.close(fd)
    raise ShardError(f"{path}: {_files.there(path)} is there that no export of this user "
                     f"made; refusing to lock through it (remove it)")


def _release_out(out, fd, made, wrote=True):
    """Drops the export lock; a directory this export made and wrote
    nothing into is removed again."""
    _files.remove_own(os.path.join(out, _LOCK_NAME), _files.identity(fd))
    os.close(fd)
    if made and not wrote:
        try:
            os.rmdir(out)
        except OSError:
            pass


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
    if limit < _BLOCK * 4:
        raise ValueError(f"shard_size {shard_size!r} is too small (at least 2 KiB)")
    fields = list(cfg["SAMPLE"])
    for f in fields:
        if "/" in f or not f.isprintable():
            raise ShardError(f"SAMPLE field {f!r} cannot name a tar member (a '/' or an "
                             f"unprintable character)")
    timeout = float(cfg["READ_TIMEOUT"] if timeout is None else timeout)
    if not timeout >= 0:
        raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout:g}")
    lock, made = _prepare_out(out, prefix)
    w = None
    try:
        store_handle = ProcessStore(cfg)  # opened as the readers open it
        w = _ShardWriter(out, limit, fields, prefix)
        return _export(w, store_handle, cfg, out, generations, samples, timeout, quiet,
                       on_signal)
    finally:
        _release_out(out, lock, made, wrote=w is not None and bool(w.index["shards"]))


def _export(w, store_handle, cfg, out, generations, samples, timeout, quiet, on_signal):
    say = (lambda text: None) if quiet else (lambda text: print(f"export: {text}", flush=True))
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
                                          who="wirehead export", note_every=_WAIT_NOTE_EVERY,
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
                        log.warning("wirehead export: generation %s position %d not exported: "
                                    "%s", label(gen), pos, e)
                        pos += 1
                        continue
                    if got.generation != gen:  # reclaimed under us: start over on the newer one
                        moved += 1
                        if stop:  # not a newer one, once stopped: this one stays partial
                            break
                        log.warning("wirehead export: generation %s was reclaimed after %d of "
                                    "%d positions; going on with generation %s", label(gen),
                                    pos, swap_cap, label(got.generation))
                        gen, pos = got.generation, 0
                        continue
                    w.add(gen, got.position,
                          [(a.dtype, a.shape, _bytes_of(a)) for a in got.arrays])
                    del got
                    pos += 1
                    if samples is not None and w.index["samples"] >= samples:
                        break
                last = gen
                if pos >= swap_cap:
                    done_gens += 1
                    whole.append(gen)
                    say(f"generation {label(gen)} written ({w.index['samples']} samples so "
                        f"far)")
                if samples is not None and w.index["samples"] >= samples:
                    break
                if generations is not None and done_gens >= generations:
                    break
            signum = stop.signum if stop else None
        w.finish()
    except BaseException:
        w.finish()  # the whole samples written so far stay
        if w.index["shards"]:
            w.index["complete"] = False
            _note_whole(w.index, whole)
            w._write_index()
        raise
    finally:
        store_handle.close()
    w.index["reclaimed_during_export"] = moved
    w.index["corrupt_skipped"] = corrupt
    w.index["complete"] = signum is None
    _note_whole(w.index, whole)
    if w.index["shards"]:  # else nothing is kept: the directory is removed if made here
        w._write_index()
    if signum is not None:
        name = signal.Signals(signum).name
        w.index["interrupted"] = name
        part = w.index["partial_generations"]
        if part:  # for the caller's message (not in index.json, which has the id)
            w.index["partial_label"] = gen_label(part[0], label.seen)
        say(f"interrupted by {name}: {w.index['samples']} samples of "
            f"{len(w.index['whole_generations'])} whole generations"
            + (f" and part of generation {w.index['partial_label']}" if part else "")
            + f" in {len(w.index['shards'])} shards under {out} (index.json: complete false)")
        if on_signal == "raise":
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        return w.index
    say(f"{w.index['samples']} samples of {len(w.index['generations'])} generations in "
        f"{len(w.index['shards'])} shards under {out}")
    return w.index


def _note_whole(index, whole):
    """index's whole_generations and partial_generations: a generation in the
    shards but not written whole (an interrupted or failed export, or
    samples=N) is partial."""
    index["whole_generations"] = [g for g in index["generations"] if g in whole]
    index["partial_generations"] = [g for g in index["generations"] if g not in whole]


def check_store_layout(urls, config_path=None, config=None):
    """Before shards go into a store: their index.json schema (dtype and
    shape per field) against a sample of the store's newest sealed
    generation, where the store has one. A field whose dtype or shape
    differs is a ShardError naming the field, the shards' layout and the
    store's; a store with no generation yet takes any layout."""
    cfg = get_config(config_path, config)
    paths = expand_urls(urls)
    handle = ProcessStore(cfg, create=False)
    try:
        try:
            store = handle.get()
            gen = store.wait_generation(0, 0.0)
            got = store.read_sample(gen, 0, None, 5.0, True)
        except _C.WireheadError:  # not created, or nothing sealed yet
            return
        have = {f: (a.dtype, list(a.shape)) for f, a in zip(cfg["SAMPLE"], got.arrays)}
    finally:
        handle.close()
    cache = {}
    for p in paths:
        idx = _load_index(os.path.dirname(os.path.abspath(p)), cache)
        for field, want in ((idx or {}).get("schema") or {}).items():
            if field not in have or want is None:
                continue
            dtype, shape = have[field]
            if (want.get("dtype") not in (None, dtype)) or \
                    (want.get("shape") is not None and list(want["shape"]) != shape):
                raise ShardError(f"field {field!r}: the shards hold {want.get('dtype')} of "
                                 f"shape {want.get('shape')}, the store "
                                 f"{redact(cfg['STORE'])} holds {dtype} of shape {shape}; "
                                 f"use another store, or `wirehead-torch clean` it first", p)


def _bytes_of(arr):
    """The C-contiguous bytes of a store Array (bfloat16 as its raw bits)."""
    if arr.dtype == "bfloat16":
        raise ShardError("field of dtype bfloat16 has no .npy form (NumPy has no bfloat16); "
                         "store it as float32 or its raw bits as int16 to export it")
    return np.from_dlpack(arr)


# --------------------------------------------------------------------------
# import


def expand_urls(urls):
    """A list of local shard paths from a path, a brace pattern
    (``shards-{000..099}.tar``, ``{a,b}``), a glob (``shards-*.tar``,
    expanded in sorted order) or a list of them."""
    if isinstance(urls, (str, os.PathLike)):
        urls = [urls]
    out = []
    for u in urls:
        u = os.fspath(u)
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", u) and not os.path.exists(u):
            raise ShardError(f"{u!r}: only local paths are read (no URLs or pipes)")
        for x in _brace(u):
            if re.search(r"[*?[]", x) and not os.path.exists(x):
                hits = sorted(glob.glob(x))  # a shell would have expanded it
                if not hits:
                    raise ShardError(f"{x!r}: the glob matches no file")
                out.extend(hits)
            else:
                out.append(x)
    if not out:
        raise ShardError("no shards given")
    return out


def _brace(s):
    m = re.search(r"\{([^{}]*)\}", s)
    if m is None:
        return [s]
    head, body, tail = s[:m.start()], m.group(1), s[m.end():]
    r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if r:
        lo, hi = int(r.group(1)), int(r.group(2))
        width = len(r.group(1)) if r.group(1).startswith("0") else 0
        if hi - lo > 1_000_000:
            raise ShardError(f"brace range {{{body}}} names more than a million shards")
        step = 1 if hi >= lo else -1
        items = [str(i).zfill(width) for i in range(lo, hi + step, step)]
    else:
        items = body.split(",")
    return [x for it in items for x in _brace(head + it + tail)]


class _Reader:
    """Reads one shard member by member from a binary file, bounded by the
    file's size, feeding every byte to the shard checksum when asked."""

    def __init__(self, f, shard, size, hasher):
        self.f, self.shard, self.size, self.hasher = f, shard, size, hasher
        self.offset = 0

    def read_exact(self, n, member=None):
        if n > self.size - self.offset:
            raise ShardError(f"truncated: {n} bytes wanted at offset {self.offset}, the file "
                             f"has {self.size}", self.shard, member)
        buf = bytearray(n)
        self.readinto(memoryview(buf), member)
        return buf

    def readinto(self, view, member=None):
        want = view.nbytes
        if want > self.size - self.offset:
            raise ShardError(f"truncated: {want} bytes wanted at offset {self.offset}, the "
                             f"file has {self.size}", self.shard, member)
        got = 0
        while got < want:
            n = self.f.readinto(view[got:got + _READ_CHUNK])
            if not n:
                raise ShardError(f"truncated: the file ended at offset {self.offset + got}",
                                 self.shard, member)
            got += n
        if self.hasher is not None:
            self.hasher.update(view)
        self.offset += want

    def skip(self, n, member=None):
        while n:
            k = min(n, _READ_CHUNK)
            self.read_exact(k, member)
            n -= k


def _members(rd):
    """(name, size) of each regular member, the reader left at its data;
    the caller consumes exactly size bytes plus padding."""
    pending_name = None
    pending_size = None
    while True:
        if rd.offset == rd.size:
            raise ShardError("truncated: the archive ends without its end-of-archive blocks",
                             rd.shard)
        h = rd.read_exact(_BLOCK)
        if not any(h):
            return
        stored = _parse_number(h[148:156], "checksum", rd.shard, None)
        blank = h[:148] + b" " * 8 + h[156:]
        if stored not in (sum(blank), sum(b - 256 if b > 127 else b for b in blank)):
            raise ShardError(f"tar header at offset {rd.offset - _BLOCK} fails its checksum "
                             f"(not a tar file, or damaged)", rd.shard)
        name = h[0:100].split(b"\0", 1)[0]
        if h[257:263] == b"ustar\0" and h[345]:  # POSIX ustar only: old GNU keeps times there
            name = h[345:500].split(b"\0", 1)[0] + b"/" + name
        name = name.decode("utf-8", "replace")
        if pending_name is not None:
            name, pending_name = pending_name, None
        size = _parse_number(h[124:136], "size", rd.shard, name)
        if pending_size is not None:
            size, pending_size = pending_size, None
        kind = bytes(h[156:157])
        padded = size + (-size % _BLOCK)
        if padded > rd.size - rd.offset:
            raise ShardError(f"truncated: the member's {size} bytes run past the file's end "
                             f"({rd.size} bytes)", rd.shard, name)
        if kind in (b"x", b"L"):  # pax extended header, GNU long name: of the next member
            if size > _PAX_MAX:
                raise ShardError(f"extended header of {size} bytes (at most {_PAX_MAX})",
                                 rd.shard, name)
            data = bytes(rd.read_exact(padded, name)[:size])
            if kind == b"L":
                pending_name = data.split(b"\0", 1)[0].decode("utf-8", "replace")
            else:
                pending_name, pending_size = _pax(data, rd.shard, name)
            continue
        if kind in (b"g", b"5"):  # pax global header, directory: nothing to read
            rd.skip(padded, name)
            continue
        yield name, size, kind


def _pax(data, shard, member):
    """(path, size) of a pax extended header's records (None where absent)."""
    path = size = None
    pos = 0
    while pos < len(data):
        sp = data.find(b" ", pos)
        if sp < 0 or not _DECIMAL.fullmatch(data[pos:sp]):
            raise ShardError(f"malformed pax record at byte {pos}: no decimal length",
                             shard, member)
        n = int(data[pos:sp])
        if n <= sp - pos + 1 or pos + n > len(data) or data[pos + n - 1] != 0x0A:
            raise ShardError(f"malformed pax record at byte {pos}: length {n} does not end "
                             f"at a newline inside the header", shard, member)
        key, _, value = data[sp + 1:pos + n - 1].partition(b"=")
        if key == b"path":
            path = value.decode("utf-8", "replace")
        elif key == b"size":
            if not _DECIMAL.fullmatch(value):  # a sign, a fraction, '_', > 20 digits
                raise ShardError(f"malformed pax size {bytes(value[:32])!r} (a non-negative "
                                 f"decimal integer)", shard, member)
            size = int(value)
        pos += n
    return path, size


def _load_index(directory, cache):
    if directory not in cache:
        path = os.path.join(directory, INDEX_NAME)
        idx = None
        if os.path.isfile(path):
            fd = _files.open_regular(path, ShardError, INDEX_NAME)
            try:
                with open(fd) as f:
                    idx = json.load(f)
            except (OSError, ValueError, RecursionError) as e:
                raise ShardError(f"{path}: not a readable index ({e})") from None
            if not isinstance(idx, dict) or idx.get("format") != INDEX_FORMAT:
                idx = None
            else:
                _check_index(idx, path)
        cache[directory] = idx
    return cache[directory]


def _check_index(idx, path):
    """An index.json of our format whose values have the types the reader
    uses; anything else is a ShardError naming the key."""
    def bad(key, want, got):
        raise ShardError(f"{path}: {key} must be {want}, got {type(got).__name__} "
                         f"{json.dumps(got)[:60]}")

    def count(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    fields = idx.get("fields")
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        bad("'fields'", "a list of field names", fields)
    schema = idx.get("schema")
    if schema is not None:
        if not isinstance(schema, dict):
            bad("'schema'", "an object of field: {dtype, shape} (or null)", schema)
        for field, want in schema.items():
            key = f"'schema'.{field}"
            if want is None:
                continue
            if not isinstance(want, dict):
                bad(key, "an object {dtype, shape} (or null)", want)
            if not isinstance(want.get("dtype"), (str, type(None))):
                bad(key + ".dtype", "a dtype name (or null)", want["dtype"])
            shape = want.get("shape")
            if shape is not None and (not isinstance(shape, list) or
                                      not all(count(x) for x in shape)):
                bad(key + ".shape", "a list of non-negative integers (or null)", shape)
    shards = idx.get("shards", [])
    if not isinstance(shards, list):
        bad("'shards'", "a list of shard entries", shards)
    for i, e in enumerate(shards):
        key = f"'shards'[{i}]"
        if not isinstance(e, dict):
            bad(key, "an object {name, bytes, samples, xxh3, members}", e)
        for k, ok, want in (("name", lambda v: isinstance(v, str), "a file name"),
                            ("bytes", count, "a byte count"),
                            ("xxh3", lambda v: v is None or isinstance(v, str),
                             "a hex digest (or null)"),
                            ("members", lambda v: v is None or isinstance(v, dict) and all(
                                isinstance(x, str) for x in v.values()),
                             "an object of member name: hex digest")):
            if k in e and not ok(e[k]):
                bad(f"{key}.{k}", want, e[k])
        if "name" not in e:
            bad(f"{key}.name", "a file name", None)


class ShardSource:
    """What from_shards returns: an iterable of sample tuples (one array per
    field, in SAMPLE order). ``samples`` counts the samples yielded,
    ``skipped`` the samples and ``skipped_shards`` the shards dropped with
    on_error="skip"; ``errors`` holds the last few such errors' messages."""

    def __init__(self, paths, fields, shuffle, seed, loop, shuffle_buffer, on_error, verify):
        self.paths = paths
        self.fields = fields
        self.shuffle = shuffle
        self.seed = seed
        self.loop = loop
        self.shuffle_buffer = shuffle_buffer
        self.on_error = on_error
        self.verify = verify
        self.samples = 0
        self.skipped = 0
        self.skipped_shards = 0
        self.errors = []
        self.last_fields = None  # the field names of the last sample yielded
        self._it = None
        self._indexes = {}

    def __iter__(self):
        return self._run()

    def dataset(self):
        """A ``torch.utils.data.IterableDataset`` over the same shards and
        settings, yielding each sample as a dict of tensors keyed by field
        name, for a plain ``torch.utils.data.DataLoader`` (an evaluation
        loop over a validation set). With num_workers=N each worker reads
        every N-th shard (of the shuffled order where shuffle=True), so no
        shard is read twice."""
        return _shard_dataset(self)

    def __next__(self):
        if self._it is None:
            self._it = self._run()
        return next(self._it)

    def _fail(self, e, shard_level):
        if self.on_error != "skip":
            raise e
        if shard_level:
            self.skipped_shards += 1
        else:
            self.skipped += 1
        self.errors = (self.errors + [str(e)])[-16:]
        log.warning("wirehead shards: skipped %s: %s", "the rest of a shard" if shard_level
                    else "a sample", e)

    def _run(self):
        epoch = 0
        while True:
            order = list(self.paths)
            if self.shuffle:
                random.Random(f"{self.seed}:{epoch}").shuffle(order)
            before = self.samples
            stream = self._chain(order)
            if self.shuffle and self.shuffle_buffer > 1:
                stream = _buffered_shuffle(stream, self.shuffle_buffer,
                                           random.Random(f"{self.seed}:{epoch}:buffer"))
            for s in stream:
                self.samples += 1
                yield s
                del s  # not held while the next sample is read: one sample in memory
            epoch += 1
            if not self.loop:
                return
            if self.samples == before:
                raise ShardError(f"loop=True over shards that yielded no sample in a whole "
                                 f"pass ({len(self.paths)} shards)")

    def _chain(self, order):
        for p in order:
            for s in self._shard(p):
                yield s
                del s

    def _fields_for(self, idx):
        fields = self.fields
        if fields is None:
            if idx is None:
                raise ShardError("the shards have no index.json naming their fields: give "
                                 "from_shards config_path= or config= (its SAMPLE) or fields=")
            fields = list(idx["fields"])
        return fields

    def _shard(self, path):
        try:  # a FIFO, device or directory is refused before any open() could block
            f = open(_files.open_regular(path, ShardError, "shard"), "rb", buffering=0)
        except ShardError as e:
            self._fail(e, True)
            return
        with f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                self._fail(ShardError("empty file (0 bytes), not a tar archive", path), True)
                return
            try:
                idx = _load_index(os.path.dirname(os.path.abspath(path)), self._indexes)
            except ShardError as e:
                self._fail(e, True)
                return
            entry = None
            if idx is not None:
                entry = next((s for s in idx.get("shards", [])
                              if s.get("name") == os.path.basename(path)), None)
            if idx is not None and entry is None and self.verify:
                self._fail(ShardError(f"not listed in the {INDEX_NAME} beside it: a foreign "
                                      f"shard, or one a killed export renamed but never "
                                      f"listed (read it with verify=False to take it anyway)",
                                      path), True)
                return
            check = bool(self.verify) and entry is not None
            if check and entry.get("bytes") != size:
                self._fail(ShardError(f"the file has {size} bytes, {INDEX_NAME} says "
                                      f"{entry.get('bytes')}: damaged or replaced", path), True)
                return
            try:
                fields = self._fields_for(idx)
            except ShardError as e:
                self._fail(e, True)
                return
            schema = (idx or {}).get("schema") if entry is not None else None
            whole = check and self.verify == "full"
            rd = _Reader(f, path, size, _C.Xxh3() if whole else None)
            yield from self._samples(rd, fields, schema, entry if check else None)

    def _samples(self, rd, fields, schema, entry):
        pos = {name: i for i, name in enumerate(fields)}
        key, arrays, bad = None, None, None
        members = _members(rd)
        while True:
            try:
                item = next(members, None)
            except ShardError as e:
                self._fail(e, True)
                return
            if item is not None:
                name, size, kind = item
            this = None if item is None else _split(name)
            if key is not None and (this is None or this[0] != key[0]):
                # a new key: the sample before is complete, or an error
                done = self._finish(rd.shard, key, arrays, fields, bad)
                key = arrays = None
                if done is not None:
                    yield done
                    done = None
            if item is None:
                break
            if key is None:
                key, arrays, bad = this, {}, None
            try:
                start = rd.offset
                self._member(rd, name, size, kind, this, arrays, pos, schema, entry, bad)
            except ShardError as e:
                if not e.sample_only:
                    self._fail(e, True)
                    return
                try:  # read past the rest of the bad member: the next one is intact
                    rd.skip(start + size + (-size % _BLOCK) - rd.offset, name)
                except ShardError as e2:
                    self._fail(e2, True)
                    return
                if bad is None:
                    self._fail(e, False)
                bad = e
        if rd.hasher is not None:
            try:
                rd.skip(rd.size - rd.offset)
                got = rd.hasher.hexdigest()
                if got != entry.get("xxh3"):
                    raise ShardError(f"XXH3-64 {got} differs from {INDEX_NAME}'s "
                                     f"{entry.get('xxh3')}: damaged", rd.shard)
            except ShardError as e:
                self._fail(e, True)

    def _member(self, rd, name, size, kind, key, arrays, pos, schema, entry, bad):
        """Reads one member into arrays; a sample-only ShardError leaves the rest of
        the member to the caller to read past."""
        padded = size + (-size % _BLOCK)
        if bad is not None:  # the rest of a bad sample is read past
            rd.skip(padded, name)
            return
        _safe_name(name, rd.shard)
        if kind not in (b"0", b"\0", b"7"):
            what = {b"1": "a hard link", b"2": "a symbolic link", b"3": "a character device",
                    b"4": "a block device", b"6": "a FIFO"}.get(kind, f"of type {kind!r}")
            raise _SampleError(f"member is {what}; shards hold regular files of "
                               f"{SUPPORTED_MEMBERS}", rd.shard, name)
        if not key[1].endswith(".npy"):
            raise _SampleError(f"unsupported member type; shards hold {SUPPORTED_MEMBERS} "
                               f"members named KEY.FIELD.npy", rd.shard, name)
        field = key[1][:-4]
        if field not in pos:
            raise _SampleError(f"field {field!r} is not one of the fields {list(pos)}",
                               rd.shard, name)
        if field in arrays:
            raise _SampleError(f"field {field!r} twice in one sample", rd.shard, name)
        head = rd.read_exact(min(size, _NPY_HEADER_MAX + 12), name)
        dtype, shape, fortran, hsize = parse_npy(head, size, rd.shard, name)
        want = (schema or {}).get(field)
        if want is not None and (
                (want.get("dtype") is not None and want["dtype"] != dtype) or
                (want.get("shape") is not None and list(want["shape"]) != list(shape))):
            raise _SampleError(f"{dtype} of shape {list(shape)} contradicts the schema of "
                               f"{INDEX_NAME}: {want.get('dtype')} of shape "
                               f"{want.get('shape')}", rd.shard, name)
        buf = np.empty(size - hsize, np.uint8)  # not zeroed: every byte is read into it
        have = len(head) - hsize
        buf[:have] = np.frombuffer(head, np.uint8, have, hsize)
        rd.readinto(memoryview(buf)[have:], name)
        if entry is not None and entry.get("members"):
            want_hash = entry["members"].get(name)
            if want_hash is None:
                raise _SampleError(f"member not listed in {INDEX_NAME}: damaged or added",
                                   rd.shard, name)
            h = _C.Xxh3()
            h.update(head[:hsize])
            h.update(buf)
            if h.hexdigest() != want_hash:
                raise _SampleError(f"XXH3-64 {h.hexdigest()} differs from {INDEX_NAME}'s "
                                   f"{want_hash}: damaged", rd.shard, name)
        rd.skip(padded - size, name)
        arrays[field] = buf.view(_DESCR[dtype]).reshape(shape, order="F" if fortran else "C")

    def _finish(self, shard, key, arrays, fields, bad):
        if bad is not None:
            return None
        self.last_fields = fields
        missing = [f for f in fields if f not in arrays]
        if missing:
            self._fail(_SampleError(f"sample {key[0]!r} has no member for field(s) "
                                    f"{missing} (it has {sorted(arrays)})", shard), False)
            return None
        return tuple(arrays[f] for f in fields)


def _shard_dataset(source):
    import torch
    from torch.utils.data import IterableDataset, get_worker_info

    class ShardDataset(IterableDataset):
        """Samples of tar shards as dicts of tensors keyed by field name;
        DataLoader workers split the shards between them."""

        def __init__(self, src):
            super().__init__()
            self.source = src

        def __iter__(self):
            s = self.source
            info = get_worker_info()
            paths = list(s.paths)
            if s.shuffle:  # the same order in every worker, then split
                random.Random(f"{s.seed}:split").shuffle(paths)
            if info is not None:
                paths = paths[info.id::info.num_workers]
            if not paths:
                return
            mine = ShardSource(paths, s.fields, s.shuffle, s.seed, s.loop, s.shuffle_buffer,
                               s.on_error, s.verify)
            for sample in mine:
                yield {f: _tensor(torch, f, a) for f, a in zip(mine.last_fields, sample)}

    return ShardDataset(source)


# unsigned types torch has no tensor of: widened losslessly
_WIDEN = {np.dtype("uint16"): np.int32, np.dtype("uint32"): np.int64}


def _tensor(torch, field, a):
    if a.dtype in _WIDEN:
        a = a.astype(_WIDEN[a.dtype])
    try:
        return torch.from_numpy(a)
    except TypeError:
        raise ShardError(f"field {field!r} of dtype {a.dtype} has no torch tensor type; read "
                         f"it from the source's numpy arrays instead") from None


def _split(name):
    """(key, suffix) as WebDataset splits a member name: the key runs to the
    first dot of the file's base name."""
    d, _, base = name.rpartition("/")
    k, _, suffix = base.partition(".")
    return (f"{d}/{k}" if d else k), suffix


def _buffered_shuffle(stream, n, rng):
    buf = []
    for s in stream:
        if len(buf) < n:
            buf.append(s)
            continue
        i = rng.randrange(n)
        buf[i], s = s, buf[i]
        yield s
    rng.shuffle(buf)
    yield from buf


def from_shards(urls, shuffle=False, seed=0, loop=False, *, config_path=None, config=None,
                fields=None, shuffle_buffer=0, on_error="raise", verify=True):
    """A generator source over tar shards (docs/shards.md): sample tuples in
    SAMPLE order (of config_path=/config=, else fields=, else the shards'
    index.json), ready for ``WireheadGenerator(from_shards(...), ...)``.

    urls: a path, a brace pattern (``shards-{000..099}.tar``) or a list.
    shuffle: shard order shuffled by seed (each pass of loop=True anew);
    shuffle_buffer=N also mixes samples within N held samples. verify:
    checks each shard's size, schema and members' XXH3 against an
    index.json beside it ("full": the whole file's XXH3 too).
    on_error="skip" drops a bad sample (or the rest of a bad shard), counts
    it and goes on; "raise" (default) stops with a ShardError naming shard
    and member. Only complete samples are ever yielded."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
        raise ValueError(f"shuffle_buffer must be a non-negative integer, got {shuffle_buffer!r}")
    if fields is not None and (config_path is not None or config is not None):
        raise ValueError("give fields= or a config, not both")
    if config_path is not None or config is not None:
        fields = list(get_config(config_path, config)["SAMPLE"])
    elif fields is not None:
        fields = list(fields)
    if verify not in (True, False, "full"):
        raise ValueError(f"verify must be True, False or 'full', got {verify!r}")
    return ShardSource(expand_urls(urls), fields, bool(shuffle), seed, bool(loop),
                       shuffle_buffer, on_error, verify)


def mix(sources, weights=None, seed=0):
    """One stream from several sources (iterables of samples), each next
    sample drawn from source i with probability weights[i] / sum(weights)
    (default: equal), reproducibly by seed; an exhausted source drops out
    and the mix ends when all have."""
    its = [iter(s) for s in sources]
    if not its:
        raise ValueError("mix() needs at least one source")
    if weights is None:
        weights = [1.0] * len(its)
    weights = [float(w) for w in weights]
    if len(weights) != len(its):
        raise ValueError(f"{len(its)} sources but {len(weights)} weights")
    if any(not (w >= 0) or w == float("inf") for w in weights) or not sum(weights) > 0:
        raise ValueError(f"weights must be finite, non-negative and not all 0: {weights}")
    rng = random.Random(seed)
    live = [i for i, w in enumerate(weights) if w > 0]
    while live:
        i = rng.choices(live, [weights[j] for j in live])[0]
        try:
            s = next(its[i])
        except StopIteration:
            live.remove(i)
            continue
        yield s
