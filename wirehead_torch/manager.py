"""WireheadManager: seals full write generations and says so: a start line, a
summary now and then and an end line (a line per swap when verbose)."""
import collections
import json
import logging
import os
import signal
import sys
import time

from . import _C
from ._redact import redact
from ._store import ProcessStore, StopFlag, gen_label
from .config import get_config

log = logging.getLogger("wirehead_torch")


def swap_record(info, prev_time, prev_generated, now, seals=None):
    """The figures logged for one swap (seals: the store's count after it,
    which numbers the generation for people: #N)."""
    dt = now - prev_time if prev_time else None
    # a wiped server restarts the count: no rate for that swap
    ok = dt and prev_generated is not None and info["generated"] >= prev_generated
    rate = (info["generated"] - prev_generated) / dt if ok else None
    return {
        "time": round(now, 3),
        "generation": info["generation"],
        "generated": info["generated"],
        "discarded": info["discarded"],
        "seal_s": info["seal_s"],
        "samples_per_s": round(rate, 2) if rate is not None else None,
        "seal_number": seals,
    }


def format_record(rec):
    """One line for people: the clock time, the generation as #N (its
    number among the store's seals; the full id is in the JSON lines)."""
    rate = "-" if rec["samples_per_s"] is None else f"{rec['samples_per_s']:.1f}"
    clock = time.strftime("%H:%M:%S", time.localtime(rec["time"]))
    label = (f"#{rec['seal_number']}" if rec.get("seal_number")
             else f"...{str(rec['generation'])[-6:]}")
    return (f"{clock} swap generation {label} "
            f"generated={rec['generated']} discarded={rec['discarded']} "
            f"seal={rec['seal_s'] * 1e3:.3f}ms samples/s={rate}")


# seconds between a manager's summary lines
SUMMARY_EVERY = 30.0
# seconds between repeats of a stall message while the stall lasts
STALL_LOG_EVERY = 60.0
# a block shorter than this is a reader about to drop its views, not a stall
STALL_GRACE = 2.0


def _pinned(st):
    """Areas that could take the next generation but readers' views pin:
    neither the read nor the write generation's."""
    return [a for a in st.get("areas") or []
            if a["pinners"] and a["generation"] not in (st["read_gen"], st["write_gen"])]


def _pin_list(areas, st):
    return ", ".join(f"generation {gen_label(a['generation'], st)} by pid {a['pin_pid']}"
                     + (f" and {a['pinners'] - 1} other process(es)" if a["pinners"] > 1 else "")
                     for a in areas)


def stall_text(st):
    """Why sealing is stuck, from a status dict: the write generation is
    full and every area the next generation could take is pinned by
    readers' views. None when that is not so."""
    areas = st.get("areas") or []
    if not areas or st["write_fill"] < st["swap_cap"]:
        return None
    free = [a for a in areas if a["generation"] not in (st["read_gen"], st["write_gen"])]
    pinned = _pinned(st)
    if not free or len(pinned) < len(free):
        return None
    return (f"stalled: generation {gen_label(st['write_gen'], st)} is full but readers' views "
            f"pin every area the next one could take: {_pin_list(pinned, st)}")


class StallLog:
    """Says that this process cannot seal: once when the stall has lasted
    STALL_GRACE seconds, then every STALL_LOG_EVERY seconds while it lasts,
    naming the generations readers pin and their pids (or the writer in the
    way), and once more when sealing goes on after a stall it said. who:
    the prefix of every line the process says."""

    def __init__(self, who):
        self.who = who
        self.since = None  # monotonic start of the stall
        self.said = None   # when it was last said

    def blocked(self, info, store):
        now = time.monotonic()
        if self.since is None:
            self.since = now
        if now - self.since < STALL_GRACE:
            return
        if self.said is not None and now - self.said < STALL_LOG_EVERY:
            return
        self.said = now
        who = self.who
        lasted = f" for {now - self.since:.0f}s"
        if not info.get("blocked_reader"):
            log.warning("%s: sealing stalled%s: the write generation is full but generator "
                        "pid %d (alive, paused or stopped?) is still writing into the area the "
                        "next generation needs; sealing waits for it", who, lasted,
                        info["blocked_pid"])
            return
        try:
            st = store.status()
            pinned, full = _pinned(st), f"generation {gen_label(st['write_gen'], st)}"
        except _C.WireheadError:
            st, pinned, full = None, [], "the write generation"
        if not pinned:  # the status raced a drop: what the seal saw
            pinned = [{"generation": info["blocked_gen"], "pin_pid": info["blocked_pid"],
                       "pinners": 1}]
        log.warning("%s: sealing stalled%s: %s is full and readers' views pin every area the "
                    "next generation could take: %s; sealing waits for reader pid %d to drop "
                    "its views of generation %s (or to exit)", who, lasted, full,
                    _pin_list(pinned, st), info["blocked_pid"],
                    gen_label(info["blocked_gen"], st))

    def sealed(self):
        if self.said is not None:
            log.warning("%s: sealing goes on after a stall of %.0fs", self.who,
                        time.monotonic() - self.since)
        self.since = self.said = None


# how long a full generation is left to the self-sealing generators before
# a manager seals it
SEAL_GRACE = 0.25


class _Watch:
    """What a manager beside self-sealing generators remembers between looks."""

    def __init__(self):
        self.seals = None  # the store's seal count at the last look
        self.mine = None  # the generation this manager sealed last
        self.full = None  # (write generation, monotonic time first seen full)
        self.generators_seal = True  # until a full generation is left to us


class WireheadManager:
    """Seals the write generation once it holds SWAP_CAP samples.

    Only the holder of the manager lease seals; a second manager waits and
    takes over within LEASE_SECONDS of the first one dying (at once on the
    embedded store when the old manager's process is gone). ``run()`` runs
    until SIGTERM/SIGINT (or ``max_swaps`` seals by this manager), then
    gives the lease up and returns the number of swaps it made.

    Lines go to ``out`` (stdout by default), each starting ``wirehead
    manager:``: a start line, a summary at most every ``summary_every``
    seconds while generations are sealed, and an end line saying what it
    sealed and what it saw sealed; ``verbose=True`` adds a line per swap,
    ``summary_every=None`` drops the summaries; ``quiet=True`` prints
    nothing: the start and end lines go to the log, as a quiet generator's
    do (warnings go to the log either way).
    ``json_lines=True`` writes one JSON object per swap to ``out``
    instead, and the start and end lines to the log.

    With self-sealing generators (SELF_SEAL on in its config) a manager is
    optional: it holds no lease between seals, records the generators'
    seals (``records``; ``seen`` counts them, ``swaps`` its own), and seals
    only a generation left full for SEAL_GRACE seconds."""

    RECORDS_KEPT = 1000
    NAME = "wirehead manager"

    def __init__(self, config_path=None, config=None, json_lines=False, out=None, quiet=False,
                 summary_every=SUMMARY_EVERY, verbose=False):
        self.cfg = get_config(config_path, config)
        self.json_lines = json_lines
        self.out = out
        self.quiet = quiet  # no summaries
        self.verbose = verbose  # a line per swap
        self.summary_every = None if summary_every is None else float(summary_every)
        self._summary = None  # (monotonic time, swaps, seen) of the last summary
        self.swaps = 0
        self.seen = 0  # seals by self-sealing generators this manager saw
        # the latest swap records only: a manager runs for weeks (a list grew
        # ~430 bytes per swap in the soak)
        self.records = collections.deque(maxlen=self.RECORDS_KEPT)
        self._store = ProcessStore(self.cfg)
        self._stop = StopFlag()
        self._why = "stop()"

    def stop(self, why="stop()"):
        """Asks a running ``run()`` (e.g. in another thread) to give the lease
        up and return; why: the reason its end line gives."""
        self._why = why
        self._stop.set()

    def _say(self, text):
        """A line for people: on out, or in the log when quiet or next to
        JSON lines."""
        if self.json_lines or self.quiet:
            log.info("%s: %s", self.NAME, text)
        else:
            print(f"{self.NAME}: {text}", file=self.out or sys.stdout, flush=True)

    def _emit(self, rec, mine):
        """One swap: its own (mine) or a generator's that this manager saw."""
        self.records.append(rec)
        if self.json_lines:
            print(json.dumps(rec), file=self.out or sys.stdout, flush=True)
            return
        if self.verbose:
            self._say(format_record(rec) + ("" if mine else " (by a generator)"))
            return
        now = time.monotonic()
        t0, swaps0, seen0 = self._summary
        if self.quiet or self.summary_every is None or now - t0 < self.summary_every:
            return
        self._summary = (now, self.swaps, self.seen)
        self._say(f"{self._sealed_text(self.swaps - swaps0, self.seen - seen0)} in the last "
                  f"{now - t0:.0f}s; the last: {format_record(rec)}")

    def _sealed_text(self, mine, seen):
        if self.cfg["SELF_SEAL"]:
            return (f"{mine + seen} generations sealed ({mine} here, {seen} by self-sealing "
                    f"generators)")
        return f"{mine} generations sealed"

    def _start_line(self):
        every = ("" if self.json_lines or self.verbose or self.quiet else
                 "; no summaries" if self.summary_every is None else
                 f"; a summary every {self.summary_every:g}s while generations are sealed")
        store = redact(self.cfg["STORE"])
        self._say(f"pid {os.getpid()} watches {store}: its generators seal (SELF_SEAL), this "
                  f"manager seals what they leave full{every}" if self.cfg["SELF_SEAL"] else
                  f"pid {os.getpid()} seals full generations of {store}{every}")

    def _end_line(self, stop, max_swaps):
        why = (signal.Signals(stop.signum).name if stop.signum is not None
               else self._why if stop else f"max_swaps={max_swaps}")
        last = self.records[-1] if self.records else None
        label = (f", the last #{last['seal_number']}" if last and last.get("seal_number")
                 else "")
        self._say(f"stopped ({why}): {self._sealed_text(self.swaps, self.seen)}{label}")

    def run(self, max_swaps=None):
        poll = float(self.cfg["MANAGER_POLL"])
        lease = float(self.cfg["LEASE_SECONDS"])
        renew_every = lease / 4
        leader, last_lead, waiting_logged, down = False, 0.0, False, False
        stall = StallLog(self.NAME)
        self._summary = (time.monotonic(), self.swaps, self.seen)
        waiting_created, prev_seals = False, None
        prev_time, prev_generated = time.time(), None
        store = None
        # generators seal (SELF_SEAL): watch them, and seal only what they leave
        watch = _Watch() if self.cfg["SELF_SEAL"] else None
        try:
            with self._stop as stop:
                self._start_line()
                while not stop and (max_swaps is None or self.swaps < max_swaps):
                    now_store = self._store.get()
                    if now_store is not store:
                        if store is not None:  # a new store: its counts start afresh
                            leader, prev_time, prev_generated, prev_seals = False, None, None, None
                            watch = _Watch() if watch is not None else None
                        store = now_store
                    try:
                        if prev_generated is None:
                            st0 = store.status()
                            if st0["history"]:  # rate from the store's last seal on
                                prev_time = st0["history"][-1]["time"]
                                prev_generated = st0["history"][-1]["generated"]
                            else:  # no seal yet: samples made before we looked have no time
                                prev_generated = st0["generated"]
                                prev_time = time.time() if prev_generated == 0 else None
                        mono = time.monotonic()
                        if watch is not None:
                            info, seen, others = self._watch(store, watch)
                            self.seen += others  # more than seen when the history ran past
                            for h, number in seen:  # seals the generators made
                                self._emit(swap_record(h, prev_time, prev_generated, h["time"],
                                                       number), mine=False)
                                prev_time, prev_generated = h["time"], h["generated"]
                            seals_now = watch.seals
                        elif not leader or mono - last_lead >= renew_every:
                            leader = store.lead()
                            last_lead = mono
                            if not leader:
                                if not waiting_logged:
                                    other = store.status()["leader_pid"]
                                    log.info("%s: another manager%s holds the lease on %s; "
                                             "standing by", self.NAME,
                                             f" (pid {other})" if other else "",
                                             redact(self.cfg["STORE"]))
                                    waiting_logged = True
                                stop.wait(min(poll * 10, lease / 4))
                                continue
                            waiting_logged = False
                        if watch is None:
                            info = store.seal()
                            # the store's seal count must grow with each of ours:
                            # if not, it was wiped (MongoDB keeps this handle)
                            seals_now = (store.status()["seals"]
                                         if info is not None and "blocked_pid" not in info
                                         else None)
                    except _C.LeaseLostError:
                        leader = False  # e.g. expired while this process was paused
                        continue
                    except _C.StoreNotCreatedError:
                        if not waiting_created:
                            log.info("%s: waiting for the first generator to create %s",
                                     self.NAME, redact(self.cfg["STORE"]))
                            waiting_created = True
                        leader, prev_time, prev_generated, prev_seals = False, None, None, None
                        stop.wait(poll)
                        continue
                    except _C.NotFoundError:
                        # a wiped server (or clean) between two calls: start afresh
                        leader, prev_time, prev_generated, prev_seals = False, None, None, None
                        stop.wait(poll)
                        continue
                    except (_C.StoreUnavailableError, _C.StoreTimeoutError) as e:
                        # a server outage, or an shm lock held by a stopped process
                        if not down:
                            log.warning("%s: %s; retrying", self.NAME, e)
                            down = True
                        leader = False
                        stop.wait(min(1.0, lease / 4))
                        continue
                    if down:
                        log.warning("%s: the store answers again", self.NAME)
                        down = False
                    if info is not None and "blocked_pid" in info:
                        stall.blocked(info, store)
                        info = None
                    elif info is not None:
                        stall.sealed()
                    if info is None:
                        stop.wait(poll)
                        continue
                    now = time.time()
                    if prev_seals is not None and seals_now <= prev_seals:
                        prev_time = None  # counted from a wipe we did not see: no rate
                    prev_seals = seals_now
                    self.swaps += 1
                    self._emit(swap_record(info, prev_time, prev_generated, now, seals_now),
                               mine=True)
                    prev_time, prev_generated = now, info["generated"]
                self._end_line(stop, max_swaps)
        finally:
            try:
                if store is not None and store is self._store.opened():
                    store.resign()
            except _C.WireheadError as e:
                log.warning("%s: could not release the lease: %s", self.NAME, e)
            self._stop = StopFlag()  # a later run() starts afresh
        return self.swaps

    run_manager = run

    def _watch(self, store, w):
        """One look at a store whose generators seal: (the seal info of a
        full generation no generator sealed within SEAL_GRACE, sealed here
        under the lease taken for that seal only, or None; [(history entry,
        seal number)] of the seals others made since the last look that the
        store's history still lists; how many seals others made). A
        lease held between seals would make self-sealing generators leave
        every seal to this manager's next poll, and their puts meanwhile
        are discarded."""
        st = store.status()
        seen, others = [], 0
        if w.seals is not None and st["seals"] > w.seals:
            new = st["history"][-(st["seals"] - w.seals):]
            first = st["seals"] - len(new) + 1
            seen = [(h, first + k) for k, h in enumerate(new) if h["generation"] != w.mine]
            others = st["seals"] - w.seals - (len(new) - len(seen))
            if seen:
                w.generators_seal = True
        w.seals = st["seals"]  # a wiped store counts again from its own
        if st["write_fill"] < st["swap_cap"]:
            w.full = None
            return None, seen, others
        now = time.monotonic()
        if w.full is None or w.full[0] != st["write_gen"]:
            w.full = (st["write_gen"], now)
        # a self-sealing generator seals the generation its put fills at
        # once; one left full is a stopped generator's, or SELF_SEAL is off
        # in the generators: sealed here, at once while that lasts
        if w.generators_seal and now - w.full[1] < SEAL_GRACE:
            return None, seen, others
        if not store.lead():
            return None, seen, others
        try:
            info = store.seal()
        finally:
            store.resign()
        if info is not None and "blocked_pid" not in info:
            w.mine, w.generators_seal, w.full = info["generation"], False, None
            w.seals = store.status()["seals"]
            seen = [(h, n) for h, n in seen if h["generation"] != w.mine]
        return info, seen, others

    def close(self):
        self._store.close()

