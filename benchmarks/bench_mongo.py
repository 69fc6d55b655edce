"""MongoDB store throughput against raw libmongoc and the original wirehead.

    .venv/bin/python benchmarks/bench_mongo.py [--uri mongodb://HOST:PORT]
        [--sizes 1,8,32] [--total-mib 128] [--reps 3] [--chunk-mib 4]
        [--no-original] [--out benchmarks/results_mongo.md]

Against one server in one run (the in-memory test server, started here,
unless --uri names another), for each sample size it measures write and read
MB/s of the sample payload for:

  raw         libmongoc insert_many/find of the same bytes as chunk documents
              into a reused buffer (benchmarks/bench_mongo.c, no protocol)
  raw-index   raw plus one small per-sample document written after and read
              before the chunks (the least any store that finds samples by
              position does)
  store (C)   wh_store_put / seal / wh_store_read into a reused buffer,
              checksums verified (benchmarks/bench_mongo.c store)
  store (Py)  the same through wirehead_torch._C.Store.put/read from Python
              (pooled output buffers, reused once a read's array is gone)
  pymongo     raw PyMongo (in the venv; 4.13, the last that speaks the test
              server's wire version 8): insert_many / find of the same chunk
              documents, each read assembled into one reused bytearray
  original    PyPI wirehead 0.9.3 (WireheadGenerator.cycle, then
              MongoheadDataset[[i]]), installed into .deps/wirehead-orig by
              this script (a venv that reuses the system torch; PyMongo
              4.13, the last that speaks the test server's wire version 8)

For the Python client modes (store (Py), pymongo) the client process's
CPU seconds per GB read are measured too (time.process_time around the
reads; the server is another process). Each figure is the median over
--reps runs, modes interleaved. Results go
to --out as a markdown table (and the JSON of every run beside it).
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "helpers"))
sys.path.insert(0, REPO)

BIN = os.path.join(REPO, "build", "bench", "bench_mongo")
ORIG_VENV = os.path.join(REPO, ".deps", "wirehead-orig")
ORIG_VERSION = "0.9.3"
# the newest PyMongo that still talks to wire version 8 (the test server's)
ORIG_PYMONGO = "pymongo==4.13.2"

ORIG_SCRIPT = textwrap.dedent("""
    import json, sys, time, os
    import numpy as np
    host, port, db, size, n, chunk_mib, workdir = sys.argv[1:8]
    size, n = int(size), int(n)
    cfg = os.path.join(workdir, "config.yaml")
    with open(cfg, "w") as f:
        f.write(f"MONGOHOST: {host}\\nPORT: {port}\\nDBNAME: {db}\\nSWAP_CAP: {n}\\n"
                f"SAMPLE: [data, label]\\nCHUNKSIZE: {chunk_mib}\\nWRITE_COLLECTION: write\\n"
                f"READ_COLLECTION: read\\nCOUNTER_COLLECTION: counters\\n"
                f"TEMP_COLLECTION: temp\\n")
    from pymongo import MongoClient
    MongoClient(f"mongodb://{host}:{port}").drop_database(db)
    import io, contextlib
    from wirehead import WireheadGenerator, MongoheadDataset
    data = (np.arange(size, dtype=np.uint64) * 2654435761 >> 13).astype(np.uint8)
    label = np.zeros(64, np.uint8)
    def gen():
        while True:
            yield data, label
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet):
        g = WireheadGenerator(gen(), config_path=cfg, n_samples=n)
        t0 = time.perf_counter()
        for _ in range(n):
            g.cycle()
        write_s = time.perf_counter() - t0
        ds = MongoheadDataset(config_path=cfg)
        assert len(ds) == n, len(ds)
        t0 = time.perf_counter()
        for i in range(n):
            out = ds[[i]]
        read_s = time.perf_counter() - t0
    x = out[n - 1]["input"]
    assert x.numel() == size, "original wirehead read back another size"
    MongoClient(f"mongodb://{host}:{port}").drop_database(db)
    print(json.dumps({"write_s": write_s, "read_s": read_s, "bytes": size * n}))
""")


def build_c():
    # the sources and flags are listed once, in ext/sources.mk
    subprocess.run(["make", "-s", os.path.relpath(BIN, REPO)], check=True, cwd=REPO)


def ensure_original():
    py = os.path.join(ORIG_VENV, "bin", "python")
    want = ORIG_PYMONGO.split("==")[1]
    ok = os.path.exists(py) and subprocess.run(
        [py, "-c", f"import wirehead, pymongo; assert pymongo.version == {want!r}"],
        capture_output=True, cwd=ORIG_VENV).returncode == 0  # not the repo: its wirehead/ is ours
    if not ok:
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", ORIG_VENV],
                       check=True)
        subprocess.run([os.path.join(ORIG_VENV, "bin", "pip"), "install", "-q",
                        f"wirehead=={ORIG_VERSION}", ORIG_PYMONGO], check=True)
    return py


def run_c(mode, uri, db, size, chunk, n):
    out = subprocess.run([BIN, mode, uri, db, str(size), str(chunk), str(n)],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"bench_mongo {mode}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def run_py_store(uri, db, size, chunk, n):
    import numpy as np

    from wirehead_torch import _C
    kw = dict(uri=f"{uri}/{db}", swap_cap=n, fields=["data"], chunk_bytes=chunk, prefix="benchpy")
    _C.clean(**kw)
    st = _C.Store(**kw)
    data = (np.arange(size, dtype=np.uint64) * 2654435761 >> 13).astype(np.uint8)
    t0 = time.perf_counter()
    for _ in range(n):
        status, _ = st.put([(data, 2)])  # 2: uint8
        assert status == _C.PUT_ACCEPTED
    write_s = time.perf_counter() - t0
    assert st.lead()
    gen = st.seal()["generation"]
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(n):
        (arr,) = st.read(gen, i)
        if i < n - 1:
            del arr  # the buffer returns to the pool for the next read
    read_s, read_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    assert np.array_equal(np.from_dlpack(arr), data)
    st.close()
    _C.clean(**kw)
    return {"write_s": write_s, "read_s": read_s, "read_cpu_s": read_cpu_s, "bytes": size * n}


def run_pymongo(uri, db, size, chunk, n):
    """The least a Python client does: chunk documents in, chunk documents
    out, into one reused buffer."""
    import numpy as np
    from bson.binary import Binary
    from pymongo import MongoClient
    data = (np.arange(size, dtype=np.uint64) * 2654435761 >> 13).astype(np.uint8).tobytes()
    nch = -(-size // chunk)
    client = MongoClient(uri)
    coll = client[db]["chunks"]
    coll.drop()
    t0 = time.perf_counter()
    for sid in range(n):
        coll.insert_many([{"_id": sid * 1_000_000 + k, "d": Binary(data[k * chunk:(k + 1) * chunk])}
                          for k in range(nch)], ordered=True)
    write_s = time.perf_counter() - t0
    per = max(1, min(nch, (32 << 20) // (chunk + 256)))  # replies of about 32 MB, as the store
    buf = bytearray(size)
    view = memoryview(buf)
    c0, t0 = time.process_time(), time.perf_counter()
    for sid in range(n):
        got = 0
        for doc in coll.find({"_id": {"$gte": sid * 1_000_000, "$lt": sid * 1_000_000 + nch}},
                             batch_size=per):
            k = doc["_id"] - sid * 1_000_000
            d = doc["d"]
            view[k * chunk:k * chunk + len(d)] = d
            got += len(d)
        assert got == size
    read_s, read_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    assert bytes(buf) == data
    client.drop_database(db)
    client.close()
    return {"write_s": write_s, "read_s": read_s, "read_cpu_s": read_cpu_s, "bytes": size * n}


def run_original(py, host, port, db, size, chunk_mib, n, workdir):
    out = subprocess.run([py, "-c", ORIG_SCRIPT, host, str(port), db, str(size), str(n),
                          str(chunk_mib), workdir], capture_output=True, text=True,
                         timeout=1200, env=dict(os.environ, PYTHONPATH=""), cwd=workdir)
    if out.returncode != 0:
        raise RuntimeError(f"original wirehead: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--uri", help="an existing server (default: start the test server)")
    p.add_argument("--sizes", default="1,8,32", help="sample sizes in MiB")
    p.add_argument("--total-mib", type=int, default=128, help="payload per run and size")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--chunk-mib", type=float, default=4.0)
    p.add_argument("--no-original", action="store_true")
    p.add_argument("--out", default=os.path.join(HERE, "results_mongo.md"))
    a = p.parse_args(argv)
    build_c()
    orig_py = None if a.no_original else ensure_original()
    chunk = int(a.chunk_mib * (1 << 20))
    server = None
    if a.uri:
        uri = a.uri.rstrip("/")
    else:
        from mongo_server import MongoTestServer
        server = MongoTestServer().start()
        uri = server.uri
    hostport = uri.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1]
    host, port = hostport.rsplit(":", 1) if ":" in hostport else (hostport, "27017")
    workdir = os.path.join(REPO, "build", "bench")
    os.makedirs(workdir, exist_ok=True)
    modes = ["raw", "raw-index", "store (C)", "store (Py)", "pymongo"] + (
        [] if orig_py is None else ["original"])
    runs = []
    try:
        for size_mib in [float(s) for s in a.sizes.split(",")]:
            size = int(size_mib * (1 << 20))
            n = max(2, int(a.total_mib // size_mib))
            for rep in range(a.reps):
                order = modes if rep % 2 == 0 else modes[::-1]
                for mode in order:
                    db = f"bench_{mode.split()[0].replace('-', '_')}"
                    if mode in ("raw", "raw-index"):
                        r = run_c(mode, uri, db, size, chunk, n)
                    elif mode == "store (C)":
                        r = run_c("store", uri, db, size, chunk, n)
                    elif mode == "store (Py)":
                        r = run_py_store(uri, db, size, chunk, n)
                    elif mode == "pymongo":
                        r = run_pymongo(uri, db, size, chunk, n)
                    else:
                        r = run_original(orig_py, host, port, db, size, int(round(a.chunk_mib)) or 1,
                                         n, workdir)
                    r.update(mode=mode, size_mib=size_mib, n=n, rep=rep)
                    runs.append(r)
                    print(f"{size_mib:g} MiB x{n} {mode:11s} write {r['bytes'] / r['write_s'] / 1e6:8.1f} "
                          f"MB/s  read {r['bytes'] / r['read_s'] / 1e6:8.1f} MB/s"
                          + (f"  read CPU {r['read_cpu_s'] / (r['bytes'] / 1e9):.2f} s/GB"
                             if "read_cpu_s" in r else ""), flush=True)
    finally:
        if server is not None:
            server.close()
    write_table(a, uri if a.uri else "in-memory test server (mongo-java-server 1.47.0)", modes,
                runs, chunk)


def write_table(a, where, modes, runs, chunk):
    def med(size, mode, key):
        vals = [r["bytes"] / r[key] / 1e6 for r in runs if r["size_mib"] == size and r["mode"] == mode]
        return statistics.median(vals) if vals else None

    def cpu(size, mode):
        vals = [r["read_cpu_s"] / (r["bytes"] / 1e9) for r in runs
                if r["size_mib"] == size and r["mode"] == mode and "read_cpu_s" in r]
        return statistics.median(vals) if vals else None

    sizes = sorted({r["size_mib"] for r in runs})
    lines = ["# MongoDB store throughput", "",
             f"Server: {where}. Chunks of {chunk / 2**20:g} MiB; {a.total_mib} MiB of payload "
             f"per run; median of {a.reps} runs; MB/s = 10^6 bytes of sample payload per second.",
             f"Command: `.venv/bin/python benchmarks/bench_mongo.py {' '.join(shlex.quote(x) for x in sys.argv[1:])}`",
             f"Machine: {os.cpu_count()} CPU cores (client and server share them).", "",
             "| sample | mode | write MB/s | read MB/s | write vs raw | read vs raw | read vs raw-index | read vs original | read client CPU-s/GB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for size in sizes:
        for mode in modes:
            w, r = med(size, mode, "write_s"), med(size, mode, "read_s")
            if w is None:
                continue
            rw, rr = med(size, "raw", "write_s"), med(size, "raw", "read_s")
            ri, ro = med(size, "raw-index", "read_s"), med(size, "original", "read_s")

            def pct(x, base):
                return f"{100 * x / base:.0f}%" if base else "-"

            def times(x, base):
                return f"{x / base:.1f}x" if base else "-"

            c = cpu(size, mode)
            cp = cpu(size, "pymongo")
            cs = "-" if c is None else (f"{c:.2f}" + (f" ({c / cp:.2f}x pymongo)"
                                                      if cp and mode != "pymongo" else ""))
            lines.append(f"| {size:g} MiB | {mode} | {w:.0f} | {r:.0f} | {pct(w, rw)} | {pct(r, rr)} | "
                         f"{pct(r, ri)} | {times(r, ro) if mode != 'original' else '-'} | {cs} |")
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump(runs, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
