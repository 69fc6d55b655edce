"""Monitoring with the original wirehead's classes: SwapLog (one swap),
WireheadSnapshot (the whole state at one instant) and WireheadLogger, which
prints swap history as JSONL, streams snapshots (``--daemon``) or draws a
curses dashboard (``--tui``). Works on both stores: it reads the seal
history and counters every store keeps (``status()``), so it needs no
collection of its own."""
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import List, Optional

import numpy as np

from .. import _C
from .._redact import redact
from .._store import ProcessStore, gen_label
from .._store_args import database
from ..config import DEFAULT_CONFIG_PATH, get_config
from ._args import MAX_INTERVAL, Parser, integer, number


def human_time(ts, now):
    """A wall-clock time for people: "12:03:04 (5 s ago)", with the date
    when it is not today."""
    t = time.localtime(ts)
    fmt = "%H:%M:%S" if t[:3] == time.localtime(now)[:3] else "%Y-%m-%d %H:%M:%S"
    ago = now - ts
    if ago < 0:
        rel = "in the future: clocks differ"
    elif ago < 60:
        rel = f"{ago:.0f} s ago"
    elif ago < 3600:
        rel = f"{ago / 60:.0f} min ago"
    elif ago < 86400:
        rel = f"{ago / 3600:.1f} h ago"
    else:
        rel = f"{ago / 86400:.1f} d ago"
    return f"{time.strftime(fmt, t)} ({rel})"


def closed_pipe_exit():
    """The exit of a command whose reader went away (``| head``): no
    traceback, the status a shell shows for a tool ended by SIGPIPE."""
    try:
        # stdout's unwritten bytes would fail again at interpreter exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return 128 + 13  # SIGPIPE


def wirehead_package():
    """One line on which ``wirehead`` package this environment imports:
    none, the compatibility package served by wirehead_torch, or the
    original wirehead (then ``from wirehead import`` does not use
    wirehead_torch), with what to do to switch."""
    import importlib.metadata as md
    import importlib.util
    try:
        spec = importlib.util.find_spec("wirehead")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return ("wirehead: not installed (to run the original wirehead's scripts on "
                "wirehead_torch: pip install ./compat in the wirehead_torch checkout)")
    where = list(spec.submodule_search_locations)[0]
    try:
        version = md.version("wirehead")
    except md.PackageNotFoundError:
        version = "(no distribution metadata)"
    if os.path.exists(os.path.join(where, "_wirehead_torch.py")):
        return (f"wirehead: the compatibility package {version} at {where}, served by "
                f"wirehead_torch")
    return (f"wirehead: the original wirehead {version} at {where}; `from wirehead import` "
            f"uses it, not wirehead_torch (pip install ./compat in the checkout replaces it; "
            f"reinstalling the original brings it back)")


@dataclass
class SwapLog:
    """One swap (seal). swap_duration: seconds the swapped-out generation was
    the newest, i.e. since the previous swap (None for the first seen).
    generation names the generation sealed as ``status`` does (``#N``);
    generation_id is its full id (batches, ``status --json``)."""
    swap_timestamp: float
    prev_swap_timestamp: Optional[float] = None
    swap_duration: Optional[float] = None
    swap_count: int = 0
    db_name: str = ""
    generation: str = ""  # ours from here on
    generation_id: int = 0

    def to_jsonl(self) -> str:
        return json.dumps(asdict(self))

    def __str__(self):
        return self.to_jsonl()


@dataclass
class WireheadSnapshot:
    """The state at one instant, with the original's field names. Sealing
    is a pointer flip here, so ``is_swapping`` stays False; a sample is
    counted once committed (``in_flight`` is 0); the ``*_docs`` fields
    count samples."""
    samples_started: int = 0
    samples_completed: int = 0
    in_flight: int = 0
    swap_cap: int = 0
    fill_pct: float = 0.0
    is_swapping: bool = False
    swap_lock_duration: Optional[float] = None
    swap_count: int = 0
    swap_timestamp: Optional[float] = None
    swap_duration: Optional[float] = None
    time_since_last_swap: Optional[float] = None
    avg_swap_duration: Optional[float] = None
    samples_per_s: float = 0.0
    swaps_per_s: float = 0.0
    write_mb_per_s: float = 0.0
    write_docs: int = 0
    write_size_mb: float = 0.0
    read_docs: int = 0
    read_size_mb: float = 0.0
    mongo_active_ops: int = 0
    db_name: str = ""
    poll_interval: float = 2.0
    timestamp: float = 0.0
    recent_swaps: List[SwapLog] = field(default_factory=list)
    # ours
    store: str = ""
    generated: int = 0
    discarded: int = 0
    leader_pid: int = 0
    local_cache: Optional[dict] = None  # LOCAL_CACHE: this node's copy and relay (status)

    def to_jsonl(self) -> str:
        return json.dumps(asdict(self))

    def __str__(self):
        return self.to_jsonl()


class WireheadLogger:
    """Follows a store's swaps. ``history()`` gives the swaps the store
    still records (its last 16), ``run()`` prints them and then each new
    one, ``run_daemon()`` prints a snapshot per poll, ``run_tui()`` draws
    them; ``count`` (ours) ends a loop after that many polls. ``db_name`` is
    the database the store opens (the one a MongoDB URI names wins over
    DBNAME; an shm store's name)."""

    RECENT = 10

    def __init__(self, config_path="config.yaml", poll_interval=2.0, config=None, out=None):
        self.cfg = get_config(None if config is not None else config_path, config)
        self.poll_interval = float(poll_interval)
        self.db_name = database(self.cfg)
        self.swap_cap = self.cfg["SWAP_CAP"]
        self.out = out
        self.swap_count = 0
        self.prev_swap_timestamp = None
        self.last_generation = 0
        self.swap_logs: List[SwapLog] = []
        self._store = ProcessStore(self.cfg, create=False)  # watching never creates a store
        self._prev = None  # (time, generated, seals) of the last snapshot
        self._sample_mb = None  # MB a sample takes in the write generation, last seen

    def _print(self, line):
        print(line, file=self.out or sys.stdout, flush=True)

    def _status(self):
        """The store's status, or None while it does not exist."""
        try:
            return self._store.get().status()
        except (_C.NotFoundError, TimeoutError):
            self._store.close()
            return None

    def _sample_size_mb(self, st):
        """MB one sample takes: from the write generation's bytes (shm), or,
        where the store keeps no byte count (MongoDB), measured once from a
        sample of the read generation."""
        if st["write_fill"] and st["write_bytes"]:
            self._sample_mb = st["write_bytes"] / st["write_fill"] / 2**20
        elif self._sample_mb is None and st["read_gen"]:
            try:
                arrs = self._store.get().read_sample(st["read_gen"], 0, None, 1.0).arrays
                self._sample_mb = sum(np.dtype(a.dtype).itemsize * math.prod(a.shape)
                                      for a in arrs) / 2**20
            except (_C.WireheadError, TimeoutError, TypeError):
                pass  # reclaimed meanwhile (measured at a later poll), or no numpy dtype
        return self._sample_mb or 0.0

    def _new_swaps(self, st):
        """SwapLogs for seals not seen yet, oldest first."""
        if st is None:
            return []
        hist = st["history"]
        if hist and hist[-1]["generation"] < self.last_generation:
            self.last_generation = 0  # the store was removed and made again
        out = []
        first = st["seals"] - len(hist)  # seals older than the recorded history
        for i, h in enumerate(hist):
            if h["generation"] <= self.last_generation:
                continue
            ts = h["time"]
            dur = ts - self.prev_swap_timestamp if self.prev_swap_timestamp is not None else None
            self.swap_count = max(self.swap_count + 1, first + i + 1)
            rec = SwapLog(swap_timestamp=ts, prev_swap_timestamp=self.prev_swap_timestamp,
                          swap_duration=dur, swap_count=self.swap_count,
                          db_name=self.db_name, generation=gen_label(h["generation"], st),
                          generation_id=h["generation"])
            self.prev_swap_timestamp = ts
            self.last_generation = h["generation"]
            self.swap_logs.append(rec)
            out.append(rec)
        del self.swap_logs[:-1000]
        return out

    def history(self) -> List[SwapLog]:
        return self._new_swaps(self._status())

    def recorded(self) -> List[SwapLog]:
        """The swaps the store records, as ``history()``, but a store that
        does not exist raises NotFoundError (as ``status`` says it)."""
        return self._new_swaps(self._store.get().status())

    def snapshot(self) -> WireheadSnapshot:
        now = time.time()
        st = self._status()
        self._new_swaps(st)
        if st is None:
            return WireheadSnapshot(swap_cap=self.swap_cap, db_name=self.db_name,
                                    poll_interval=self.poll_interval, timestamp=now,
                                    store=redact(self.cfg["STORE"]),
                                    recent_swaps=list(self.swap_logs[-self.RECENT:]))
        last = self.swap_logs[-1] if self.swap_logs else None
        durs = [s.swap_duration for s in self.swap_logs if s.swap_duration is not None]
        cur = (now, st["generated"], st["seals"])
        fill = st["write_fill"]
        sps = swps = mbps = 0.0
        if self._prev is not None and now > self._prev[0]:
            dt = now - self._prev[0]
            # Rates from the store's running totals: the write generation's
            # fill and bytes start again at each swap, a total never falls
            # (a wiped store counts from 0 again: then all it counts is new).
            sps = (cur[1] - (self._prev[1] if cur[1] >= self._prev[1] else 0)) / dt
            swps = (cur[2] - (self._prev[2] if cur[2] >= self._prev[2] else 0)) / dt
            mbps = sps * self._sample_size_mb(st)
        self._prev = cur
        return WireheadSnapshot(
            samples_started=fill, samples_completed=fill, in_flight=0,
            swap_cap=st["swap_cap"], fill_pct=100.0 * fill / st["swap_cap"],
            swap_count=max(self.swap_count, st["seals"]),
            swap_timestamp=last.swap_timestamp if last else None,
            swap_duration=last.swap_duration if last else None,
            time_since_last_swap=now - last.swap_timestamp if last else None,
            avg_swap_duration=sum(durs) / len(durs) if durs else None,
            samples_per_s=sps, swaps_per_s=swps, write_mb_per_s=mbps,
            write_docs=fill,
            write_size_mb=st["write_bytes"] / 2**20 or fill * self._sample_size_mb(st),
            read_docs=st["swap_cap"] if st["read_gen"] else 0,
            db_name=self.db_name, poll_interval=self.poll_interval, timestamp=now,
            recent_swaps=list(self.swap_logs[-self.RECENT:]),
            store=redact(self.cfg["STORE"]), generated=st["generated"],
            discarded=st["discarded"], leader_pid=st["leader_pid"],
            local_cache=self._local(st))

    def _local(self, st):
        if not self.cfg["LOCAL_CACHE"]:
            return None
        from ..admin import local_status
        return local_status(self.cfg, st["read_gen"])

    def _polls(self, count):
        n = 0
        while count is None or n < count:
            yield n
            n += 1
            if count is None or n < count:
                time.sleep(self.poll_interval)

    def run(self, count=None):
        """Prints past swaps, then each new one as it happens."""
        self._print(f"Logger: watching {redact(self.cfg['STORE'])} (poll={self.poll_interval}s)")
        for _ in self._polls(count):
            for rec in self.history():
                self._print(rec.to_jsonl())

    def run_daemon(self, count=None):
        """Prints one snapshot per poll as JSONL."""
        self.history()
        for _ in self._polls(count):
            self._print(self.snapshot().to_jsonl())

    def run_tui(self):
        """A curses dashboard; q quits."""
        import curses
        self.history()
        curses.wrapper(self._tui_main)

    def _tui_main(self, scr):
        import curses
        try:
            curses.curs_set(0)
        except curses.error:
            pass
        scr.timeout(int(self.poll_interval * 1000))
        while True:
            snap = self.snapshot()
            scr.erase()
            h, w = scr.getmaxyx()
            for y, line in enumerate(tui_lines(snap)):
                if y >= h:
                    break
                scr.addnstr(y, 0, line, max(1, w - 1), curses.A_BOLD if y == 0 else 0)
            scr.refresh()
            if scr.getch() in (ord("q"), ord("Q")):
                return


def tui_lines(s):
    """The dashboard's text, one string per line."""
    bar = int(s.fill_pct / 5)
    ago = "-" if s.time_since_last_swap is None else f"{s.time_since_last_swap:.0f}s ago"
    avg = "-" if s.avg_swap_duration is None else f"{s.avg_swap_duration:.1f}s"
    lines = [
        f"wirehead - {s.store}   [poll {s.poll_interval}s, q quits]",
        f"write generation  {s.samples_completed}/{s.swap_cap} samples "
        f"[{'#' * bar}{'.' * (20 - bar)}] {s.fill_pct:.0f}%  ({s.write_size_mb:.1f} MB)",
        f"swaps             {s.swap_count} total, last {ago}, average lifetime {avg}",
        f"rates             {s.samples_per_s:.1f} samples/s, {s.swaps_per_s:.2f} swaps/s, "
        f"{s.write_mb_per_s:.2f} MB/s",
        f"totals            {s.generated} generated, {s.discarded} surplus discarded",
        "lease             " + (f"pid {s.leader_pid}" if s.leader_pid else "free"),
    ]
    loc = s.local_cache
    if loc:
        r = loc["relay"] or {}
        lines.append(f"local cache       {loc['store']}: {loc['lag_generations']} behind, "
                     f"{r.get('generations', 0)} relayed, "
                     f"{r.get('bytes', 0) / 2**20:.1f} MiB pulled"
                     + ("" if r.get("running") else " (no relay running)"))
    lines.append("recent swaps:")
    for r in reversed(s.recent_swaps[-5:]):
        life = "-" if r.swap_duration is None else f"{r.swap_duration:.2f}s"
        lines.append(f"  {r.generation:<6} {human_time(r.swap_timestamp, s.timestamp)}  "
                     f"lifetime={life}")
    return lines


def main(argv=None, prog="wirehead", missing_ok=True):
    """The ``wirehead CONFIG [--daemon|--tui]`` command of the original
    (also ``wirehead-torch monitor --config CONFIG``). missing_ok: a store
    that does not exist has no swaps, as the original says (False: the
    error ``status`` gives, exit 2)."""
    p = Parser(prog=prog, description="Wirehead swap history and monitoring (the original's "
               "command)")
    p.add_argument("config", nargs="?", default=None,
                   help=f"path to the wirehead config, the original's form (default: "
                        f"{DEFAULT_CONFIG_PATH})")
    p.add_argument("--config", dest="config_opt", default=None, metavar="CONFIG",
                   help="the same, as every wirehead-torch subcommand takes it")
    p.add_argument("--daemon", action="store_true", help="a JSONL snapshot per poll")
    p.add_argument("--tui", action="store_true", help="a curses dashboard")
    p.add_argument("--poll-interval", type=number(0, MAX_INTERVAL, "a number of seconds"),
                   default=2.0, metavar="S",
                   help=f"seconds between polls (default 2.0, at most {MAX_INTERVAL:g})")
    p.add_argument("--count", type=integer(1), default=None, metavar="N",
                   help="stop after this many polls")
    args = p.parse_args(argv)
    if args.config and args.config_opt and args.config != args.config_opt:
        p.error(f"two configs: {args.config} and --config {args.config_opt}; give one")
    config = args.config_opt or args.config or DEFAULT_CONFIG_PATH
    try:
        if not (args.config_opt or args.config) and not os.path.isfile(config):
            raise ValueError(f"no {DEFAULT_CONFIG_PATH} in {os.getcwd()} (the default); "
                             f"pass the config's path: {prog} --config PATH")
        logger = WireheadLogger(config, poll_interval=args.poll_interval)
        if args.tui:
            logger.run_tui()
        elif args.daemon:
            logger.run_daemon(count=args.count)
        else:
            logs = logger.history() if missing_ok else logger.recorded()
            if not logs:
                print("No swaps recorded yet.")
            for rec in logs:
                print(rec.to_jsonl())
    except (ValueError, _C.WireheadError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        return closed_pipe_exit()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return closed_pipe_exit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
