"""What every reader does in spec mode (docs/reproducible.md), torch-free:
the spec generation an epoch reads, the wait for it (counted, and said
with its remedy), and the rank's batches a DataLoader worker makes."""
import logging
import os
import time

from . import _C
from ._redact import redact

log = logging.getLogger("wirehead_torch")

# the first note of a wait, then one every NOTE_EVERY seconds
FIRST_NOTE = 2.0
NOTE_EVERY = 30.0
_POLL_MIN, _POLL_MAX = 0.002, 0.1


def spec_generation(cfg, epoch):
    """The spec generation epoch reads: each is read REUSE epochs in a row."""
    return int(epoch) // int(cfg["REUSE"])


def check_spec_order(cfg, order, what):
    """Order options that cannot be reproduced are refused in spec mode."""
    if cfg["RUN_SEED"] is not None and order.refresh != "epoch":
        raise ValueError(f"{what}: refresh={order.refresh!r} reads whatever generation is "
                         f"newest at each step; in spec mode (RUN_SEED) epoch e reads spec "
                         f"generation e // REUSE: use refresh='epoch'")


def spec_state(cfg):
    """What a resume state records of spec mode (and a resume must match)."""
    if cfg["RUN_SEED"] is None:
        return {}
    return {"run_seed": cfg["RUN_SEED"], "reuse": cfg["REUSE"]}


def spec_columns(position, spec_gen, swap_cap):
    """A batch's generation and spec_index columns in spec mode, from its
    position column (a tensor, on its device): the spec generation for
    every row, and each row's sample index."""
    return {"generation": position * 0 + spec_gen,
            "spec_index": position + spec_gen * swap_cap}


class EpochIndex(int):
    """A position a map-style reader is asked for, with the epoch it is
    read in (spec mode: the epoch names the spec generation; the
    DataLoader's sampler makes these, its workers read them)."""

    def __new__(cls, position, epoch):
        self = super().__new__(cls, position)
        self.epoch = int(epoch)
        return self

    def __reduce__(self):
        return EpochIndex, (int(self), self.epoch)


class SpecWait:
    """Waits for a spec generation to be sealed, publishing the reader's
    need first (so the store keeps it, and makes it again when it was
    lost); counts the waits and their seconds (``waits``, ``wait_s``) and
    says, at most every NOTE_EVERY seconds, what it waits for and what
    would end it."""

    def __init__(self, cfg, who):
        self.cfg = cfg
        self.who = who
        self.waits = 0
        self.wait_s = 0.0
        self.last_wait_s = 0.0  # the latest call's wait (0: it found the generation sealed)

    def _state(self, store, s):
        """(what the store says about spec generation s, in words; what
        would end the wait)."""
        start = "start generators (WireheadGenerator(fn) with this RUN_SEED)"
        try:
            st = _C.spec_status(store)
        except _C.WireheadError as e:
            return f"the store did not say more ({e})", start
        if not st["spec"]:
            return ("the store does not exist yet: the first generator's first sample creates "
                    "it", start)
        parts = []
        if st["any_sealed"] and st["last_sealed"] > s:
            parts.append(f"#{s} is no longer stored (a newer one is): generators make it again")
        elif st["any_sealed"]:
            parts.append(f"sealed up to #{st['last_sealed']}")
        else:
            parts.append("none is sealed yet")
        if not st["open"]:
            parts.append("no generator is making one")
            return "; ".join(parts), start
        parts.append(f"#{st['open_gen']} is being made ({st['open_fill']} of "
                     f"SWAP_CAP={self.cfg['SWAP_CAP']}, {len(st['claims'])} claimed now)")
        return "; ".join(parts), "more generators, or a higher REUSE, keep readers from waiting"

    def generation(self, store, s, timeout, stop=None):
        """The store's id of sealed spec generation s, waiting up to timeout
        seconds (None once stop, a flag, is set). SpecFailedError when an
        index of it failed every attempt."""
        self.last_wait_s = 0.0
        _C.spec_need(store, s)
        gen = _C.spec_locate(store, s)
        if gen:
            return gen
        start = time.monotonic()
        note, poll = start + FIRST_NOTE, _POLL_MIN
        self.waits += 1
        cap = self.cfg["SWAP_CAP"]
        try:
            while True:
                if stop is not None and stop:
                    return None
                now = time.monotonic()
                if now - start >= timeout:
                    state, _ = self._state(store, s)
                    raise TimeoutError(
                        f"{self.who}: spec generation #{s} (sample indices {s * cap}.."
                        f"{s * cap + cap - 1}) of {redact(self.cfg['STORE'])} is not sealed "
                        f"after {timeout:g}s: {state}; start generators "
                        f"(WireheadGenerator(fn) with this RUN_SEED), or wait longer "
                        f"(READ_TIMEOUT, or the reader's timeout=)")
                if now >= note:
                    note = now + NOTE_EVERY
                    log.warning("%s (pid %d): waiting %.0fs for spec generation #%s (sample "
                                "indices %d..%d): %s; %s", self.who, os.getpid(), now - start,
                                s, s * cap, s * cap + cap - 1, *self._state(store, s))
                time.sleep(poll)
                poll = min(poll * 2, _POLL_MAX)
                _C.spec_need(store, s)  # the reader's beat while it waits
                gen = _C.spec_locate(store, s)
                if gen:
                    return gen
        finally:
            self.last_wait_s = time.monotonic() - start
            self.wait_s += self.last_wait_s
