"""Shard export and import against `tar` on the same bytes, interleaved
repetition by repetition.

    .venv/bin/python benchmarks/bench_shards.py [--mib 64] [--samples 4] [--reps 5]
                                                [--dir DIR] [--json FILE]

One generation of SAMPLES samples (a float32 field of MIB MiB and an int64
id) is sealed in an shm store once. Each repetition then times, in a
rotating order:
  export     wt.export_shards of that generation: one shard, read through
             the store's verified read path, XXH3 of every member and of the
             file, fsync, rename, index.json
  tar cf     `tar cf` of the same .npy members (extracted once beforehand,
             so in the page cache) into one archive, then `sync` of it (the
             export fsyncs too)
  import     WireheadGenerator(wt.from_shards(shard)) into a second shm
             store: parse, XXH3 check against the index, put (copy into
             shared memory plus the store's own checksum)
  read       wt.from_shards(shard) alone, every sample taken and dropped
  tar xf     `tar xf` of the same shard into an empty directory
Throughput is the shard's bytes over wall time; the table gives medians over
the repetitions of GB/s and of the ratio export / tar cf and import / tar xf
(and read / tar xf) within the same repetition. Needs about
(4 + 4 + 1) x SAMPLES x MIB MiB of /dev/shm and 3 x SAMPLES x MIB MiB of
disk under --dir.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import wirehead_torch as wt  # noqa: E402


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args()
    if a.reps < 3:
        ap.error("--reps must be >= 3 (medians)")
    n, size = a.samples, a.mib << 20
    budget = f"{n * a.mib + 8}MiB"
    tag = uuid.uuid4().hex[:8]
    src_cfg = {"STORE": f"shm://bench-shards-src-{tag}", "SWAP_CAP": n,
               "SAMPLE": ["vol", "id"], "BYTE_BUDGET": budget, "SELF_SEAL": True,
               "READ_TIMEOUT": 30}
    dst_cfg = dict(src_cfg, STORE=f"shm://bench-shards-dst-{tag}")
    scratch = tempfile.mkdtemp(prefix="bench-shards-", dir=a.dir)
    try:
        base = np.arange(size // 4, dtype=np.float32)
        items = ((base + i, np.array([i], np.int64)) for i in range(n))
        assert wt.WireheadGenerator(items, config=src_cfg, quiet=True).run() == n
        del base, items

        # the same bytes as files, for tar cf
        first = os.path.join(scratch, "first")
        wt.export_shards(first, config=src_cfg, shard_size=2**40)
        shard = os.path.join(first, "shards-000000.tar")
        nbytes = os.path.getsize(shard)
        members = os.path.join(scratch, "members")
        os.mkdir(members)
        subprocess.run(["tar", "xf", shard, "-C", members], check=True)
        names = sorted(os.listdir(members))

        def export():
            out = os.path.join(scratch, "export")
            shutil.rmtree(out, ignore_errors=True)
            return timed(lambda: wt.export_shards(out, config=src_cfg, shard_size=2**40))

        def tar_cf():
            out = os.path.join(scratch, "cf.tar")
            if os.path.exists(out):
                os.unlink(out)

            def run():
                subprocess.run(["tar", "cf", out, "-C", members, *names], check=True)
                subprocess.run(["sync", out], check=True)
            return timed(run)

        def import_():
            def run():
                g = wt.WireheadGenerator(wt.from_shards(shard, config=dst_cfg), config=dst_cfg,
                                         quiet=True)
                assert g.run() == n
                g.close()
            return timed(run)

        def read():
            def run():
                k = 0
                for s in wt.from_shards(shard, config=dst_cfg):
                    k += 1
                    del s
                assert k == n
            return timed(run)

        def tar_xf():
            out = os.path.join(scratch, "xf")
            shutil.rmtree(out, ignore_errors=True)
            os.mkdir(out)
            return timed(lambda: subprocess.run(["tar", "xf", shard, "-C", out], check=True))

        ops = {"export": export, "tar cf": tar_cf, "import": import_, "read": read,
               "tar xf": tar_xf}
        for _ in range(4):  # every area of the import's store faulted in once
            import_()
        export()
        tar_cf()
        tar_xf()
        times = {k: [] for k in ops}
        order = list(ops)
        for r in range(a.reps):
            for k in order[r % len(order):] + order[:r % len(order)]:
                times[k].append(ops[k]())
        gbs = {k: [nbytes / t / 1e9 for t in v] for k, v in times.items()}
        ratios = {
            "export / tar cf": [e / c for e, c in zip(gbs["export"], gbs["tar cf"])],
            "import / tar xf": [i / x for i, x in zip(gbs["import"], gbs["tar xf"])],
            "read / tar xf": [i / x for i, x in zip(gbs["read"], gbs["tar xf"])],
        }
        print(f"shard: {n} samples of {a.mib} MiB, {nbytes / 2**20:.1f} MiB; {a.reps} reps, "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"{'operation':<16}{'GB/s (median)':>14}{'min':>8}{'max':>8}")
        for k, v in gbs.items():
            print(f"{k:<16}{statistics.median(v):>14.2f}{min(v):>8.2f}{max(v):>8.2f}")
        print(f"{'ratio':<16}{'median':>14}{'min':>8}{'max':>8}")
        for k, v in ratios.items():
            print(f"{k:<16}{statistics.median(v):>14.2f}{min(v):>8.2f}{max(v):>8.2f}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"mib": a.mib, "samples": n, "shard_bytes": nbytes, "reps": a.reps,
                           "gbs": gbs, "ratios": ratios}, f, indent=1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        wt.clean(src_cfg)
        wt.clean(dst_cfg)


if __name__ == "__main__":
    main()
