"""Writes the seed corpora under tests/fuzz/corpus/ (run from the repository
root with the package built: .venv/bin/python tests/fuzz/make_seeds.py).
Seeds are real encodings made by this build, so the fuzzers start from
inputs that pass every check and mutate from there."""
import os
import struct
import sys

import bson
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "helpers"))
import wirehead_torch as wt  # noqa: E402

import whlib  # noqa: E402

HERE = os.path.join(os.path.dirname(__file__), "corpus")
MAGIC = struct.pack("<I", 0x31534857)


def write(kind, name, data):
    os.makedirs(os.path.join(HERE, kind), exist_ok=True)
    with open(os.path.join(HERE, kind, name), "wb") as f:
        f.write(data)


def encoded_sample():
    """A sample as the store encodes it (id int64[2], data float32[32])."""
    cfg = {"STORE": f"shm://whseeds{os.getpid()}", "SWAP_CAP": 1, "SAMPLE": ["id", "data"],
           "BYTE_BUDGET": "64KiB", "SELF_SEAL": False}
    item = (np.array([7, 1], dtype=np.int64), np.arange(32, dtype=np.float32))
    try:
        wt.WireheadGenerator(iter([item]), config=cfg, quiet=True).run()
        with open(f"/dev/shm/wirehead.whseeds{os.getpid()}", "rb") as f:
            blob = f.read()
    finally:
        wt.clean(cfg)
    at = blob.find(MAGIC)
    total = struct.unpack_from("<Q", blob, at + 16)[0]
    return bytearray(blob[at:at + total])


def placed(sample, gen, pos):
    s = bytearray(sample)
    struct.pack_into("<QQ", s, 40, gen, pos)
    s[32:40] = whlib.xxh3(bytes(s[:32] + s[40:struct.unpack_from("<Q", s, 24)[0]])).to_bytes(8, "little")
    return s


def main():
    sample = encoded_sample()
    hsize = struct.unpack_from("<Q", sample, 24)[0]
    write("fuzz_sample", "valid", bytes(placed(sample, 7, 1)))
    write("fuzz_sample", "header_only", bytes(placed(sample, 7, 1)[:hsize]))
    write("fuzz_segment", "untouched", b"")
    write("fuzz_segment", "truncated", b"\xff\x00\x10\x00\x00")
    write("fuzz_segment", "header_patch", struct.pack("<IB", 1100, 8) + b"\xff" * 8)
    hdr = bytes(placed(sample, 7, 1)[:hsize])
    dlen = len(sample) - hsize
    docs = {
        0: {"_id": "state", "read_gen": 5, "write_gen": 7, "retiring": 3, "seals": 2,
            "generated": 10, "discarded": 1,
            "history": [{"generation": 5, "time_ns": 1, "generated": 2, "discarded": 0,
                         "seal_ns": 3}]},
        1: {"_id": "state", "schema": {"version": 2, "hash": 1, "names": ["id", "data"]},
            "swap_cap": 8},
        2: {"_id": "lease", "owner": 3, "expires": 1000500, "lease_ms": 1000, "pid": 9},
        3: {"_id": 1, "s": 5, "k": 1, "z": dlen, "b": 4096, "h": bson.Binary(hdr)},
        4: {"_id": {"s": 5, "c": 3}, "d": bson.Binary(b"\0" * 8)},
    }
    for kind, doc in docs.items():
        write("fuzz_mongo_docs", f"doc{kind}", bytes([kind]) + bson.encode(doc))
    # a spec-mode state (ext/mongo/wh_mongo_spec_doc.c), through parser 0
    spec = {"_id": "state", "read_gen": 5, "write_gen": 9,
            "spec": {"run_seed": 7, "floor": 1, "open": {"s": 3, "g": 8, "pv": 2, "t": 1},
                     "kept": [{"s": 1, "g": 5}, {"s": 2, "g": 7}], "dup": 1,
                     "nondet": 0, "fails": [{"s": 3, "k": 13, "m": "ValueError"}]}}
    write("fuzz_mongo_docs", "doc0_spec", bytes([0]) + bson.encode(spec))


if __name__ == "__main__":
    main()
