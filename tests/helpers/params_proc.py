"""Child processes of tests/store/test_params.py.

  params_proc.py gen CFG_JSON TAG   a WireheadGenerator whose samples say
      what they were made under: id = [tag, counter, start_ns, version]
      (start_ns: CLOCK_MONOTONIC when the sample was begun, version:
      current_params_version() then); prints "S tag counter start_ns version"
      per sample made
  params_proc.py set CFG_JSON WHO N   N sets of {"who", "k", "len", "pad"}
      ("pad" of "len" characters); prints "V version" per set"""
import json
import sys
import time

import numpy as np

import wirehead_torch as wt


def made(tag):
    counter = 0
    while True:
        start = time.monotonic_ns()
        version = wt.current_params_version()
        noise = wt.current_params().get("noise", 0.0)
        ident = np.array([tag, counter, start, version], dtype=np.int64)
        print(f"S {tag} {counter} {start} {version}", flush=True)
        time.sleep(0.005)  # the sample's work
        yield ident, np.full(16, noise, dtype=np.float32)
        counter += 1


def main():
    kind, cfg = sys.argv[1], json.loads(sys.argv[2])
    if kind == "gen":
        print("STARTED", file=sys.stderr, flush=True)
        wt.WireheadGenerator(made(int(sys.argv[3])), config=cfg, quiet=True).run()
    elif kind == "set":
        who, n = int(sys.argv[3]), int(sys.argv[4])
        for k in range(n):
            size = (who * 7919 + k * 104729) % 30000
            v = wt.set_params({"who": who, "k": k, "len": size, "pad": "x" * size}, config=cfg)
            print(f"V {v}", flush=True)
    else:
        raise SystemExit(f"unknown kind {kind}")


if __name__ == "__main__":
    main()
