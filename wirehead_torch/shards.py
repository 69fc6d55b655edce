"""Sealed generations to and from tar shards in the WebDataset layout
(docs/shards.md): reading shards back (from_shards, mix, ShardSource) here,
writing them in _shard_export.py, the format itself in _shard_format.py.

A shard is a plain ustar archive; each sample is one member per SAMPLE field,
``g<generation>-p<position>.<field>.npy``, in SAMPLE order, each a NumPy
``.npy`` file (format 1.0) of the field's exact stored dtype and shape.
``index.json`` beside the shards names the fields, their dtypes and shapes,
the sample count and an XXH3-64 checksum of every shard and member."""
import os
import random

import numpy as np

from . import _C, _files
from ._redact import redact
from ._shard_export import export_shards  # noqa: F401 (the module's public names)
from ._shard_format import (  # noqa: F401 (INDEX_FORMAT: the module's public names)
    BLOCK,
    DESCR,
    INDEX_FORMAT,
    INDEX_NAME,
    NPY_HEADER_MAX,
    SUPPORTED_MEMBERS,
    SampleError,
    ShardError,
    ShardReader,
    expand_urls,
    load_index,
    log,
    parse_npy,
    safe_name,
    tar_members,
)
from ._store import ProcessStore
from .config import get_config

__all__ = ["export_shards", "from_shards", "mix", "expand_urls", "ShardError", "ShardSource"]


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
        idx = load_index(os.path.dirname(os.path.abspath(p)), cache)
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
                idx = load_index(os.path.dirname(os.path.abspath(path)), self._indexes)
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
            rd = ShardReader(f, path, size, _C.Xxh3() if whole else None)
            yield from self._samples(rd, fields, schema, entry if check else None)

    def _samples(self, rd, fields, schema, entry):
        pos = {name: i for i, name in enumerate(fields)}
        key, arrays, bad = None, None, None
        members = tar_members(rd)
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
                    rd.skip(start + size + (-size % BLOCK) - rd.offset, name)
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
        padded = size + (-size % BLOCK)
        if bad is not None:  # the rest of a bad sample is read past
            rd.skip(padded, name)
            return
        safe_name(name, rd.shard)
        if kind not in (b"0", b"\0", b"7"):
            what = {b"1": "a hard link", b"2": "a symbolic link", b"3": "a character device",
                    b"4": "a block device", b"6": "a FIFO"}.get(kind, f"of type {kind!r}")
            raise SampleError(f"member is {what}; shards hold regular files of "
                               f"{SUPPORTED_MEMBERS}", rd.shard, name)
        if not key[1].endswith(".npy"):
            raise SampleError(f"unsupported member type; shards hold {SUPPORTED_MEMBERS} "
                               f"members named KEY.FIELD.npy", rd.shard, name)
        field = key[1][:-4]
        if field not in pos:
            raise SampleError(f"field {field!r} is not one of the fields {list(pos)}",
                               rd.shard, name)
        if field in arrays:
            raise SampleError(f"field {field!r} twice in one sample", rd.shard, name)
        head = rd.read_exact(min(size, NPY_HEADER_MAX + 12), name)
        dtype, shape, fortran, hsize = parse_npy(head, size, rd.shard, name)
        want = (schema or {}).get(field)
        if want is not None and (
                (want.get("dtype") is not None and want["dtype"] != dtype) or
                (want.get("shape") is not None and list(want["shape"]) != list(shape))):
            raise SampleError(f"{dtype} of shape {list(shape)} contradicts the schema of "
                               f"{INDEX_NAME}: {want.get('dtype')} of shape "
                               f"{want.get('shape')}", rd.shard, name)
        buf = np.empty(size - hsize, np.uint8)  # not zeroed: every byte is read into it
        have = len(head) - hsize
        buf[:have] = np.frombuffer(head, np.uint8, have, hsize)
        rd.readinto(memoryview(buf)[have:], name)
        if entry is not None and entry.get("members"):
            want_hash = entry["members"].get(name)
            if want_hash is None:
                raise SampleError(f"member not listed in {INDEX_NAME}: damaged or added",
                                   rd.shard, name)
            h = _C.Xxh3()
            h.update(head[:hsize])
            h.update(buf)
            if h.hexdigest() != want_hash:
                raise SampleError(f"XXH3-64 {h.hexdigest()} differs from {INDEX_NAME}'s "
                                   f"{want_hash}: damaged", rd.shard, name)
        rd.skip(padded - size, name)
        arrays[field] = buf.view(DESCR[dtype]).reshape(shape, order="F" if fortran else "C")

    def _finish(self, shard, key, arrays, fields, bad):
        if bad is not None:
            return None
        self.last_fields = fields
        missing = [f for f in fields if f not in arrays]
        if missing:
            self._fail(SampleError(f"sample {key[0]!r} has no member for field(s) "
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
