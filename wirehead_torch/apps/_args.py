"""What every ``wirehead-torch`` subcommand's flags share: each number is
checked when it is parsed, and anything wrong on the command line is one
line naming the flag, its value and what it takes (exit 2), never a
traceback nor a value taken silently."""
import argparse
import math

# Durations (--seconds, --timeout): below 10^6 s (11.6 days), as READ_TIMEOUT
# and LEASE_SECONDS are in a config; a job running longer leaves --seconds out.
MAX_SECONDS = 1e6
# Polling intervals (--interval, --poll-interval): at most an hour, as MANAGER_POLL.
MAX_INTERVAL = 3600.0
# Processes one command starts (generate --procs, demo --generators, --ddp):
# each is a Python process with its own sample buffers.
MAX_PROCS = 1024
# A synthetic volume's edge (generate, train, demo --size): 256^3 voxels are
# 80 MiB a sample (float32 image and uint8 labels) and several times that
# while the generator makes one.
MAX_SIZE = 256
# A training batch (train, demo --batch-size), in samples.
MAX_BATCH = 65536
# Counts (--count, --max-swaps, --samples, ...): an int64.
MAX_COUNT = 2 ** 63 - 1


class Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line: the command, what is
    wrong, and where the options are listed (exit 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _kind(text, kind):
    return argparse.ArgumentTypeError(f"{text!r} is not {kind}")


def integer(lo, hi=MAX_COUNT, span=None):
    """An argparse type: an integer in lo..hi (span: how the range is said)."""
    rng = span or (f"in {lo}..{hi}" if hi != MAX_COUNT else f">= {lo}")

    def parse(text):
        try:
            v = int(text.strip(), 10)
        except ValueError:
            raise _kind(text, f"an integer (give one {rng})") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{text} is out of range: give an integer {rng}")
        return v
    return parse


def number(lo, hi, what="a number", lo_open=True, hi_open=False):
    """An argparse type: a finite float from lo to hi, each end in the
    range or not (lo_open, hi_open)."""
    rng = (f"{'>' if lo_open else '>='} {lo:g} and {'below' if hi_open else 'at most'} "
           f"{hi:.0f}")

    def parse(text):
        try:
            v = float(text)
        except ValueError:
            raise _kind(text, f"{what} (give one {rng})") from None
        if not math.isfinite(v):
            raise _kind(text, f"a finite number: give {what} {rng}")
        if v < lo or (lo_open and v == lo) or v > hi or (hi_open and v == hi):
            raise argparse.ArgumentTypeError(f"{text} is out of range: give {what} {rng}")
        return v
    return parse


def seconds(lo_open=True):
    """A duration: above 0 (lo_open; else from 0) and below MAX_SECONDS."""
    return number(0.0, MAX_SECONDS, "a number of seconds", lo_open, hi_open=True)


def seed():
    """A seed: an integer in 0..2^63-1 (the next processes' are one more each)."""
    return integer(0, 2 ** 63 - 1 - MAX_PROCS, span=f"in 0..2^63-{MAX_PROCS + 1}")
