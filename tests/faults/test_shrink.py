"""A shared file cut under a running reader: never a signal death.

Any file in /dev/shm may be truncated by a process of the same user. Each
reader kind (and the relay, and the params file) runs 100 rounds in
tests/helpers/shrink_proc.py: in each, a forked child reads while a thread
cuts the store segment (or a ring file, or the params file, or the relay's
local copy) at a random instant to a random size; the child then leaves with
the error caught and the reader alive, after `del`, or with views held, in
turn. Every child must exit by itself (no SIGBUS, at exit either), and
every sample it got before its error must be the right one (a view may show
zero pages where its file was cut after hand-over, docs/guarantees.md)."""
import json
import os
import subprocess
import sys

import pytest

import whlib

ROUNDS = 100


def _run(kind, seed, *extra, rounds=ROUNDS):
    proc = subprocess.run(
        [sys.executable, os.path.join(whlib.HERE, "shrink_proc.py"), kind, "mix", str(rounds),
         str(seed), *extra],
        env=whlib.env_for_child(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["signals"] == [], f"rounds that died by a signal: {out['signals']}\n" + \
        proc.stderr[-3000:]
    assert out["bad"] == [], f"rounds with wrong data or an unexpected error: {out['bad']}\n" + \
        proc.stderr[-3000:]
    return out


@pytest.mark.shrink100
@pytest.mark.parametrize("kind", ["map-copy", "map-view", "iterable", "iterable-view", "loader",
                                  "ring", "workers", "params"])
def test_cut_under_a_reader_is_an_error_not_a_signal(kind):
    out = _run(kind, 7)
    # most rounds cut what is being read: the reader said so
    assert out["exits"].get("0", 0) >= ROUNDS // 2, out


@pytest.mark.asan
@pytest.mark.parametrize("kind", ["map-copy", "ring"])
def test_cut_under_a_reader_few_rounds(kind):
    """A few rounds, in every lane: under ASan+UBSan (make test-asan) the
    guard's repair of a mapping is clean under the sanitizers too, and the
    torch 2.x lane, which leaves the 100-round tests to the first (the guard
    is C, the same under either torch), still cuts under a reader."""
    out = _run(kind, 5, rounds=12)
    assert out["exits"].get("0", 0) >= 6, out


@pytest.mark.shrink100
def test_cut_under_the_relay_is_an_error_not_a_signal(mongo_server):
    out = _run("relay", 11, mongo_server.uri)
    assert out["exits"].get("0", 0) >= ROUNDS // 2, out


# a SIGBUS the guard does not own: a page past the end of a file no store maps
FOREIGN_FAULT = r"""
fd, path = tempfile.mkstemp()
os.write(fd, b"x" * 8192)
m = mmap.mmap(fd, 8192)
os.ftruncate(fd, 0)
os.unlink(path)
print("touching", flush=True)
m[4096]
"""


def test_guard_chains_to_the_handler_before_it():
    """A SIGBUS the guard does not own still reaches the handler installed
    before it (here Python's faulthandler), and the process dies of it."""
    code = r"""
import faulthandler, mmap, os, sys, tempfile
import numpy as np
faulthandler.enable()
import wirehead_torch as wt
cfg = {"STORE": "shm://" + sys.argv[1], "SWAP_CAP": 1, "SAMPLE": ["x"], "BYTE_BUDGET": "1MiB"}
wt.WireheadGenerator(iter([(np.zeros(4),)]), config=cfg).run()  # the guard goes in front
""" + FOREIGN_FAULT
    name = whlib.unique_name()
    proc = subprocess.run([sys.executable, "-c", code, name], env=whlib.env_for_child(),
                          capture_output=True, text=True, timeout=120)
    try:
        assert proc.returncode == -7, (proc.returncode, proc.stderr[-2000:])
        assert "touching" in proc.stdout
        assert "Bus error" in proc.stderr  # faulthandler's report: it was called
    finally:
        import wirehead_torch as wt
        wt.clean({"STORE": f"shm://{name}", "SWAP_CAP": 1, "SAMPLE": ["x"]})


HEAP_GATHER = r"""
import json, os, sys
import numpy as np
import wirehead_torch as wt
from wirehead_torch import _C, _ring
import whlib
cfg = json.loads(sys.argv[1])
st = whlib.open_store(cfg)
path = _ring.region_path(os.getpid(), "cut", 0)
ring = _C.Ring(path, 1, True, os.getpid(), "0")
pos = np.arange(2, dtype=np.uint32).tobytes()
fill = lambda: _C.ring_fill(ring=ring, store=st, generation=st.current(), positions=pos,
                            want=[0, 1], timeout=10.0, direct_min=1024)
try:
    first = fill()  # the ring's one slot, kept: the next batch gets none
    assert first.slot == 0 and first.in_store, first
    got = fill()  # outside the ring: its rows gathered out of the store
    ids = np.frombuffer(got.memory, np.int64, 4, got.offsets[0]).reshape(2, 2)
    data = np.frombuffer(got.memory, np.float32, 2 * 256, got.offsets[1]).reshape(2, 256)
    for i, d in zip(ids, data):
        whlib.check_sample(i, d)
    print("no error")
except wt.CorruptSampleError as e:
    print("error:", e)
finally:
    del ring
    for f in os.listdir("/dev/shm"):
        if ("/dev/shm/" + f).startswith(path):
            os.unlink("/dev/shm/" + f)
"""


def test_cut_under_a_workers_gather_outside_the_ring_is_an_error(shm_cfg):
    """A DataLoader worker with no ring slot free gathers the rows it would
    have left in the store into a batch of its own: the store cut between
    their check and that copy (the fault point) is an error, not rows of
    zeros sent to the main process."""
    import wirehead_torch as wt
    cfg = shm_cfg(swap_cap=2)
    wt.WireheadGenerator((whlib.sample(1, i) for i in range(2)), config=cfg).run()
    assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
    env = whlib.env_for_child({"WIREHEAD_FAULT_CUT": "heap-gather"})
    proc = subprocess.run([sys.executable, "-c", HEAP_GATHER, json.dumps(cfg)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wirehead: fault cut at heap-gather: /dev/shm/wirehead." in proc.stderr, proc.stderr
    assert proc.stdout.startswith("error:") and "was truncated" in proc.stdout, proc.stdout


def test_status_of_a_store_cut_under_its_handle_is_an_error():
    """Status figures copied out of a cut segment are the guard's zero
    pages (no generation, no readers): an error naming the file instead."""
    code = r"""
import sys
import whlib
cfg = {"STORE": "shm://" + sys.argv[1], "SWAP_CAP": 2, "SAMPLE": ["id", "data"]}
import wirehead_torch as wt
try:
    wt.WireheadGenerator((whlib.sample(1, i) for i in range(2)), config=cfg, quiet=True).run()
    st = whlib.open_store(cfg)
    assert st.status()["read_gen"] > 0
    path = "/dev/shm/wirehead." + sys.argv[1]
    import os
    os.truncate(path, 0)
    try:
        print("no error:", st.status()["read_gen"])
    except wt.CorruptSampleError as e:
        print("error:", e)
finally:
    wt.clean(cfg)
"""
    proc = subprocess.run([sys.executable, "-c", code, whlib.unique_name()],
                          env=whlib.env_for_child(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("error:") and "was truncated to 0 of its" in proc.stdout, \
        proc.stdout


SENT = r"""
import os, signal, sys
import numpy as np
got = []
if sys.argv[2] == "handler":
    signal.signal(signal.SIGBUS, lambda signum, frame: got.append(signum))
else:
    signal.signal(signal.SIGBUS, signal.SIG_IGN)
import wirehead_torch as wt
cfg = {"STORE": "shm://" + sys.argv[1], "SWAP_CAP": 1, "SAMPLE": ["x"], "BYTE_BUDGET": "1MiB"}
try:
    wt.WireheadGenerator(iter([(np.zeros(4),)]), config=cfg, quiet=True).run()  # guard in front
    os.kill(os.getpid(), signal.SIGBUS)  # sent by kill: no address
    signal.raise_signal(signal.SIGBUS)  # and by raise
    print("alive", got)
finally:
    wt.clean(cfg)
"""


@pytest.mark.parametrize("how, says", [("handler", "alive [7, 7]"), ("ignore", "alive []")])
def test_a_sent_sigbus_reaches_the_handler_installed_before_the_guard(how, says):
    """signal.signal(SIGBUS, ...) before the package: a SIGBUS sent by kill
    or raise (no fault address, nothing for the guard to repair) reaches
    that handler, or is ignored under SIG_IGN, as without the guard."""
    proc = subprocess.run([sys.executable, "-c", SENT, whlib.unique_name(), how],
                          env=whlib.env_for_child(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.strip() == says, proc.stdout


LATE = r"""
import faulthandler, mmap, os, signal, sys, tempfile
import numpy as np
how = sys.argv[2]
if how == "disable":
    faulthandler.enable()  # before the package, as pytest does
import wirehead_torch as wt
cfg = {"STORE": "shm://" + sys.argv[1], "SWAP_CAP": 1, "SAMPLE": ["x", "y"],
       "BYTE_BUDGET": "1MiB"}
try:
    wt.WireheadGenerator(iter([(np.ones(1 << 16), np.ones(1))]), config=cfg, quiet=True).run()
    x = wt.MongoheadDataset(config=cfg, views=True)[0]["input"]  # a view of the store, held
    # the last store call is over: what follows puts its handler in front
    if how == "disable":
        faulthandler.disable()
    elif how == "signal":
        signal.signal(signal.SIGBUS, lambda signum, frame: None)
    else:
        faulthandler.enable()
    os.truncate("/dev/shm/wirehead." + sys.argv[1], 0)
    print("view", float(x.sum()), flush=True)  # zero pages, not SIGBUS
finally:
    wt.clean(cfg)
if how != "enable":
    sys.exit(0)
# a SIGBUS the guard does not own still ends in faulthandler's report
""" + FOREIGN_FAULT


@pytest.mark.parametrize("how", ["enable", "disable", "signal"])
def test_guard_stays_in_front_of_handlers_installed_after_the_last_store_call(how):
    """faulthandler.enable() or .disable() or signal.signal(SIGBUS, ...)
    after the last store call would put another handler in front of the
    guard: a view held over a store cut then would kill the process (or
    loop in Python's handler). The guard goes back in front at once, and
    a SIGBUS it does not own still reaches faulthandler."""
    proc = subprocess.run([sys.executable, "-c", LATE, whlib.unique_name(), how],
                          env=whlib.env_for_child(), capture_output=True, text=True, timeout=60)
    assert "view 0.0" in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    if how == "enable":
        assert proc.returncode == -7 and "Bus error" in proc.stderr, proc.stderr[-2000:]
    else:
        assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])


CIRCLE = r"""
import mmap, os, sys, tempfile
from faulthandler import enable  # a reference the package's wrapper never sees
import numpy as np
import wirehead_torch as wt
cfg = {"STORE": "shm://" + sys.argv[1], "SWAP_CAP": 1, "SAMPLE": ["x"], "BYTE_BUDGET": "1MiB"}
try:
    wt.WireheadGenerator(iter([(np.zeros(4),)]), config=cfg, quiet=True).run()
    enable()  # chains to the guard it displaced
    wt.status(cfg)  # a store call: the guard in front again, chaining to faulthandler
finally:
    wt.clean(cfg)
""" + FOREIGN_FAULT


def test_a_circle_of_handlers_ends_in_the_default():
    """faulthandler enabled after the guard, past the wrapper, chains back to
    the guard, which a store call then puts in front of it again: a SIGBUS
    the guard does not own goes to faulthandler, whose report raises it
    again for the guard. It ends in the default once, not in reports for
    ever."""
    proc = subprocess.run([sys.executable, "-c", CIRCLE, whlib.unique_name()],
                          env=whlib.env_for_child(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == -7, (proc.returncode, proc.stderr[-2000:])
    assert "touching" in proc.stdout
    assert proc.stderr.count("Fatal Python error: Bus error") == 1, proc.stderr[-2000:]
