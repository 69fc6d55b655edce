"""A spec-mode generator child process for the store tests
(tests/store/test_spec_store.py), on the _C.spec_* bindings alone.

    python tests/helpers/spec_proc.py CFG_JSON
        Claims indices and puts sample index k (sample(k)) at its position
        until the window is full (CLAIM_AHEAD), printing one JSON line per
        put: {"index": k, "attempt": a, "put": SPEC_PUT_*, "sealed": bool}.
        Exits 0, or 2 if the window never filled within 120 s.

    python tests/helpers/spec_proc.py CFG_JSON hold
        Claims one index, prints {"held": k} and waits to be killed holding
        the claim.
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from wirehead_torch import _C  # noqa: E402
from wirehead_torch._store_args import store_kwargs  # noqa: E402
from wirehead_torch.config import resolve  # noqa: E402

import whlib  # noqa: E402

TAG = 77


def sample(k):
    """Sample index k of these tests: (id, data), a function of k alone
    (its length too)."""
    return whlib.sample(TAG, k, n=16 + k % 11)


def arrays(k):
    return [(a, _C.DTYPES[a.dtype.name]) for a in sample(k)]


def main():
    r = resolve(json.loads(sys.argv[1]))
    hold = sys.argv[2:] == ["hold"]
    store = _C.Store(**store_kwargs(r))
    lease, attempts = float(r["CLAIM_LEASE"]), int(r["SPEC_ATTEMPTS"])
    deadline = time.monotonic() + 120
    delay = 0.005
    while time.monotonic() < deadline:
        status, claim = _C.spec_claim(store, lease_s=lease, max_attempts=attempts)
        if status == _C.CLAIM_AHEAD:
            return 0
        if claim is None:  # every index is with a live claimer: poll, backing off
            time.sleep(delay)
            delay = min(2 * delay, 0.1)
            continue
        delay = 0.005
        if hold:
            print(json.dumps({"held": claim.index}), flush=True)
            while True:
                time.sleep(60)  # killed here, the claim still its
        put, sealed = _C.spec_put(store, claim, arrays(claim.index))
        print(json.dumps({"index": claim.index, "attempt": claim.attempt, "put": put,
                          "sealed": sealed}), flush=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
