"""A spec-mode generator for the tests of tests/spec/: python spec_gen.py
CFG_JSON [--slow] [--hang-at K] [--n N]. fn(spec) is a pure function of the
spec (see sample()); --slow sleeps a random 0-30 ms before each sample (the
sleep's randomness is the process's own: it changes when a sample is made,
never what it holds); --hang-at K never returns for index K (a process to
kill while it holds a claim). Prints STARTED to stderr, then runs until
SIGTERM or N."""
import json
import os
import random
import sys
import time

import numpy as np

import wirehead_torch as wt


def sample(spec):
    """What index spec.index holds: 4x4 float32 from its seed, and the index."""
    rng = np.random.default_rng(spec.seed)
    return rng.random((4, 4), dtype=np.float32), np.array([spec.index], np.int64)


def main():
    cfg = json.loads(sys.argv[1])
    slow = "--slow" in sys.argv
    n = int(sys.argv[sys.argv.index("--n") + 1]) if "--n" in sys.argv else None
    hang = int(sys.argv[sys.argv.index("--hang-at") + 1]) if "--hang-at" in sys.argv else None
    jitter = random.Random(os.getpid())

    def fn(spec):
        if slow:
            time.sleep(jitter.random() * 0.03)
        while spec.index == hang:
            time.sleep(3600)
        return sample(spec)

    print("STARTED", file=sys.stderr, flush=True)
    wt.WireheadGenerator(fn, config=cfg, n_samples=n, quiet=True).run()


if __name__ == "__main__":
    main()
