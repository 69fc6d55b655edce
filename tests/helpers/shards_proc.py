"""Child processes of tests/shards: an export killed at a random instant, and
the peak memory of an export or an import.

    shards_proc.py export CFG_JSON OUT SHARD_SIZE       # prints "exporting", runs until killed
    shards_proc.py rss-export CFG_JSON OUT              # prints a JSON line of peaks
    shards_proc.py rss-import SHARD_PATTERN             # prints a JSON line of peaks
"""
import json
import sys
import threading

import wirehead_torch as wt


def _status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def _anon_kib():
    return _status_kib("RssAnon")


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
        # the peak RSS (VmHWM) starts again here: ru_maxrss would keep the
        # parent's, inherited across exec
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _status_kib("VmRSS")
        n = 0
        for sample in wt.from_shards(sys.argv[2]):
            n += 1
            del sample
        peak = _status_kib("VmHWM")
        print(json.dumps({"peak_over_base_bytes": (peak - base) * 1024, "samples": n}))


if __name__ == "__main__":
    main()
