"""Child processes of tests/shards: an export killed at a random instant, and
the peak memory of an export or an import.

    shards_proc.py export CFG_JSON OUT SHARD_SIZE       # prints "exporting", runs until killed
    shards_proc.py rss-export CFG_JSON OUT              # prints a JSON line of peaks
    shards_proc.py rss-import SHARD_PATTERN             # prints a JSON line of peaks
"""
import json
import resource
import sys
import threading

import wirehead_torch as wt


def _anon_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status")


class PeakAnon:
    """Highest private (anonymous) RSS seen, polled every millisecond: the
    shm store's shared pages an export reads through are not the export's
    own memory, so ru_maxrss (which counts them) is not the measure there."""

    def __init__(self):
        self.base = _anon_kib()
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _anon_kib())

    def close(self):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _anon_kib())
        return (self.peak - self.base) * 1024


def main():
    kind = sys.argv[1]
    if kind == "export":
        cfg, out, size = json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
        print("exporting", flush=True)
        wt.export_shards(out, config=cfg, generations=10**6, shard_size=size, timeout=30)
    elif kind == "rss-export":
        cfg, out = json.loads(sys.argv[2]), sys.argv[3]
        peak = PeakAnon()
        idx = wt.export_shards(out, config=cfg, generations=1, shard_size=2**40)
        print(json.dumps({"anon_peak_bytes": peak.close(), "samples": idx["samples"]}))
    elif kind == "rss-import":
        import numpy as np  # noqa: F401 (imported before the baseline)
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        n = 0
        for sample in wt.from_shards(sys.argv[2]):
            n += 1
            del sample
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"maxrss_over_base_bytes": peak - base, "samples": n}))


if __name__ == "__main__":
    main()
