"""The shard format (docs/shards.md): tar and ``.npy`` headers written and
parsed with every size bounded and checked, a shard read member by member,
``index.json`` loaded and checked, shard paths expanded. A damaged or
hostile shard is a ShardError naming the shard and the member, never a
crash, a pickle or a partial sample."""
import ast
import glob
import json
import logging
import os
import re

import numpy as np

from . import _C, _files

log = logging.getLogger("wirehead_torch")

INDEX_NAME = "index.json"
LOCK_NAME = ".export.lock"
INDEX_FORMAT = "wirehead_torch shards"
SUPPORTED_MEMBERS = ".npy (NumPy arrays of a numeric or bool dtype)"

BLOCK = 512
END = b"\0" * (2 * BLOCK)
_NPY_MAGIC = b"\x93NUMPY"
NPY_HEADER_MAX = 1 << 16  # far above any header of <= MAX_NDIM dims
_PAX_MAX = 1 << 20  # a pax or GNU long-name record larger than this is refused
_NAME_MAX = 4096
_READ_CHUNK = 8 << 20
EXPORT_NOTE_EVERY = 10.0  # seconds between an export's notes on what it waits for

# store dtype name <-> .npy descr (little-endian; one-byte types say '|')
DESCR = {"bool": "|b1", "uint8": "|u1", "int8": "|i1", "uint16": "<u2", "int16": "<i2",
          "uint32": "<u4", "int32": "<i4", "uint64": "<u8", "int64": "<i8", "float16": "<f2",
          "float32": "<f4", "float64": "<f8", "complex64": "<c8", "complex128": "<c16"}
_FROM_DESCR = {v: k for k, v in DESCR.items()}
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


def SampleError(message, shard=None, member=None):
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
    descr = DESCR.get(dtype)
    if descr is None:
        raise ShardError(f"dtype {dtype} has no .npy form (supported: {sorted(DESCR)})")
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
    h = bytearray(BLOCK)
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


def safe_name(name, shard):
    if "\0" in name or "\\" in name or name.startswith("/") or len(name) > _NAME_MAX:
        raise SampleError("unsafe member name (absolute, a NUL or a backslash, or too long)",
                           shard, name)
    parts = name.split("/")
    if ".." in parts:
        raise SampleError("unsafe member name (a '..' component leaves the archive)",
                           shard, name)
    return name


def parse_npy(head, member_size, shard, member):
    """(dtype name, shape, fortran, header bytes) of a .npy member whose
    first bytes are head (at least its whole header)."""
    if len(head) < 10 or head[:6] != _NPY_MAGIC:
        raise SampleError("not a .npy file (no \\x93NUMPY magic)", shard, member)
    major = head[6]
    if major == 1:
        hlen, start = int.from_bytes(head[8:10], "little"), 10
    elif major in (2, 3):
        if len(head) < 12:
            raise SampleError(".npy header cut short", shard, member)
        hlen, start = int.from_bytes(head[8:12], "little"), 12
    else:
        raise SampleError(f".npy format version {major} is not 1, 2 or 3", shard, member)
    if hlen > NPY_HEADER_MAX or start + hlen > min(len(head), member_size):
        raise SampleError(f".npy header of {hlen} bytes does not fit the member of "
                           f"{member_size} bytes", shard, member)
    try:
        text = bytes(head[start:start + hlen]).decode("utf-8" if major == 3 else "latin1")
        d = ast.literal_eval(text)
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        raise SampleError(".npy header is not a Python literal", shard, member) from None
    if not isinstance(d, dict) or set(d) != {"descr", "fortran_order", "shape"}:
        raise SampleError(".npy header must hold exactly descr, fortran_order and shape",
                           shard, member)
    descr, fortran, shape = d["descr"], d["fortran_order"], d["shape"]
    dtype = _FROM_DESCR.get(descr) if isinstance(descr, str) else None
    if dtype is None:
        raise SampleError(f".npy dtype {descr!r} is not supported: wirehead_torch stores "
                           f"little-endian numeric and bool arrays ({', '.join(sorted(DESCR))});"
                           f" object arrays (pickles) are never read", shard, member)
    if not isinstance(fortran, bool) or not isinstance(shape, tuple) or \
            len(shape) > _C.MAX_NDIM or not all(
                isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**48 for x in shape):
        raise SampleError(f".npy header: bad fortran_order or shape {shape!r} (at most "
                           f"{_C.MAX_NDIM} non-negative dims)", shard, member)
    nbytes = np.dtype(descr).itemsize
    for x in shape:
        nbytes *= x
    if start + hlen + nbytes != member_size:
        raise SampleError(f".npy data of shape {shape} {dtype} is {nbytes} bytes, the member "
                           f"holds {member_size - start - hlen}", shard, member)
    return dtype, shape, fortran, start + hlen



def bytes_of(arr):
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


class ShardReader:
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


def tar_members(rd):
    """(name, size) of each regular member, the reader left at its data;
    the caller consumes exactly size bytes plus padding."""
    pending_name = None
    pending_size = None
    while True:
        if rd.offset == rd.size:
            raise ShardError("truncated: the archive ends without its end-of-archive blocks",
                             rd.shard)
        h = rd.read_exact(BLOCK)
        if not any(h):
            return
        stored = _parse_number(h[148:156], "checksum", rd.shard, None)
        blank = h[:148] + b" " * 8 + h[156:]
        if stored not in (sum(blank), sum(b - 256 if b > 127 else b for b in blank)):
            raise ShardError(f"tar header at offset {rd.offset - BLOCK} fails its checksum "
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
        padded = size + (-size % BLOCK)
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


def load_index(directory, cache):
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

