"""The node-local tier (docs/relay.md): one relay per node copies each
generation sealed in a mongodb:// store once into the node's shm:// store
named by LOCAL_CACHE, and seals it there with the same number; every reader
on the node then reads local memory. The copy itself is C (Store.pull_from):
the server's reply goes straight into the shared-memory area."""
import errno
import fcntl
import json
import logging
import os
import signal
import stat
import time

from . import _C
from ._files import kind, there, write_file
from ._store import GenLabels, ProcessStore, StopFlag
from .config import (
    ConfigError,
    budget_arg,
    get_config,
    local_cache_uri,
    node_name,
    redact,
    secrets_hidden,
)

log = logging.getLogger("wirehead_torch")

RELAY_COMMAND = "wirehead-torch relay --config FILE"
NOTE_EVERY = 5.0  # seconds between a waiting relay's notes, as readers say theirs
SUMMARY_EVERY = 30.0  # seconds between a running relay's summary lines


def relay_files(local_uri):
    """The relay's lock file and its figures, next to the local store."""
    name = local_uri[len("shm://"):]
    return (f"/dev/shm/wirehead-relay.{name}.lock", f"/dev/shm/wirehead-relay.{name}.json")


def _open_owned(path, flags):
    """A regular file of this user's, mode 0600, never through a link."""
    def refused(what):
        return ConfigError(f"{path}: the relay's file is {what}, it must be a regular file "
                           f"of uid {os.geteuid()} with mode 0600; remove it")

    def described(st):
        return (kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else
                f"a file of uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}")
    try:  # O_NONBLOCK: a FIFO at the name is refused below, never waited on
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as e:
        # EACCES, EPERM: another user's file, planted first
        if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EACCES, errno.EPERM):
            raise
        try:
            st = os.lstat(path)
        except OSError:
            raise refused(there(path)) from None
        raise refused(described(st)) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise refused(described(st))
    return fd


def relay_figures(cfg):
    """The figures this node's relay last wrote for cfg's LOCAL_CACHE (a
    dict, ``running`` telling whether its process lives), or None when no
    relay has run here."""
    local = local_cache_uri(cfg)
    if not local:
        return None
    try:
        fd = _open_owned(relay_files(local)[1], os.O_RDONLY)
    except (FileNotFoundError, ConfigError):
        return None
    with os.fdopen(fd) as f:
        try:
            fig = json.load(f)
        except ValueError:
            return None
    try:
        os.kill(int(fig.get("pid", 0)), 0)
        fig["running"] = True
    except (OSError, ValueError):
        fig["running"] = False
    return fig


class RelayBusyError(RuntimeError):
    """Another relay fills this node's local store (one relay per node)."""


class WireheadRelay:
    """Fills this node's LOCAL_CACHE store from the config's mongodb://
    STORE: polls the MongoDB state every ``poll`` seconds and, when a newer
    generation is sealed there, copies it once (same generation number,
    positions and checksummed bytes) and seals it locally. A generation
    MongoDB reclaims while it is copied is abandoned for the newest. One
    relay per node: a second one waits for the first to end
    (``wait=False``: raises RelayBusyError instead). It says a start line,
    warnings and a summary at most every ``summary_every`` seconds;
    ``verbose=True`` adds a line per copied generation, ``quiet=True``
    drops the summaries. Generations are named ``#N`` as MongoDB's
    ``status`` names them."""

    def __init__(self, config_path=None, config=None, poll=0.05, wait=True, out=None,
                 quiet=False, verbose=False, summary_every=SUMMARY_EVERY):
        self.cfg = get_config(config_path, config)
        if not self.cfg["LOCAL_CACHE"]:
            raise ConfigError(f"{self.cfg.source}: a relay needs LOCAL_CACHE (shm://NAME or "
                              f"auto) with a mongodb:// STORE")
        self.local = local_cache_uri(self.cfg)
        self.poll = float(poll)
        self.wait = wait
        self.out = out
        self.quiet = bool(quiet)
        self.verbose = bool(verbose)
        self.summary_every = float(summary_every)
        self._summary = None  # (monotonic time, generations, bytes) of the last summary
        self._src = ProcessStore(self.cfg)
        self._labels = GenLabels(self._src)
        self._dst = ProcessStore(self.cfg, local=True)
        self._lock_fd = None
        self._stop = StopFlag()
        self.figures = {"pid": os.getpid(), "node": node_name(), "local": self.local,
                        "source": redact(self.cfg["STORE"]), "generations": 0, "bytes": 0,
                        "abandoned": 0, "last_pull_s": None, "pull_s_total": 0.0,
                        "local_gen": 0, "source_gen": 0, "lag_generations": 0,
                        "started": time.time(), "updated": time.time()}
        self._written = 0.0

    def _say(self, text, every=False):
        """A line to the log (and out); every: one of those said per
        generation, which only verbose says."""
        if every and not self.verbose:
            return
        log.info("wirehead relay: %s", text)
        if self.out is not None:
            print(text, file=self.out, flush=True)

    def _acquire(self):
        """Takes the node's relay lock (flock: the kernel lets go of it when
        the holder dies, however it dies); True once held."""
        path = relay_files(self.local)[0]
        fd = _open_owned(path, os.O_RDWR | os.O_CREAT)
        noted = None
        while True:
            try:
                # a copy of another store under this name is refused at once,
                # not after waiting for the relay that fills it
                self._dst.get().current()
            except _C.WireheadError:
                os.close(fd)
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if self._still_named(fd, path):
                    break
                # the holder removed the file as it ended: lock the one named now
                os.close(fd)
                fd = _open_owned(path, os.O_RDWR | os.O_CREAT)
                continue
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
            try:
                holder = os.pread(fd, 32, 0).decode().strip() or "?"
            except OSError:
                holder = "?"
            what = (f"another relay (pid {holder}) fills {self.local} on this node "
                    f"(one relay per node)")
            if not self.wait:
                os.close(fd)
                raise RelayBusyError(what)
            now = time.monotonic()
            if noted is None or now - noted >= NOTE_EVERY:
                noted = now
                log.warning("wirehead relay: pid %d: %s; waiting to take over", os.getpid(),
                            what)
            if self._stop.wait(0.1):
                os.close(fd)
                return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd
        return True

    @staticmethod
    def _still_named(fd, path):
        try:
            named = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)

    def _check_figures(self):
        """The last relay's figures, if any, must be ours: a file another
        user put there first is refused at the start, not at the first
        write, and before the lock is taken."""
        try:
            os.close(_open_owned(relay_files(self.local)[1], os.O_RDONLY))
        except FileNotFoundError:
            pass

    def _write_figures(self, force=False):
        now = time.time()
        if not force and now - self._written < 1.0:
            return
        self._written = now
        self.figures["updated"] = now
        # readers of the figures see the old file or the new one; the temporary
        # is made exclusively and only a regular file is replaced
        write_file(relay_files(self.local)[1], json.dumps(self.figures).encode(), ConfigError,
                   replaces="file", mode=0o600)

    def step(self):
        """One look at MongoDB; copies its newest sealed generation when the
        local store lacks it. The copy's figures (a dict), or None."""
        src, dst = self._src.get(), self._dst.get()
        with secrets_hidden(self.cfg["STORE"]):
            newest = src.current()
        have = dst.current()
        fig = self.figures
        fig.pop("last_error", None)
        fig["source_gen"], fig["local_gen"] = newest, have
        fig["lag_generations"] = max(0, newest - have) if have else (1 if newest else 0)
        if not newest or newest <= have:
            self._write_figures()
            return None
        try:
            with secrets_hidden(self.cfg["STORE"]):
                info = dst.pull_from(src, newest, budget=budget_arg(self.cfg["BYTE_BUDGET"]),
                                     wait_s=max(30.0, self.cfg["LEASE_SECONDS"]))
        except _C.GenerationGoneError:
            fig["abandoned"] += 1  # reclaimed while copied: the newest next
            self._say(f"generation {self._labels(newest)} was reclaimed in MongoDB while copied; "
                      f"taking the newest", every=True)
            return None
        fig["generations"] += 1
        fig["bytes"] += info["bytes"]
        fig["last_pull_s"] = info["pull_s"]
        fig["pull_s_total"] += info["pull_s"]
        fig["local_gen"] = info["generation"]
        fig["lag_generations"] = max(0, fig["source_gen"] - info["generation"])
        info["label"] = self._labels(info["generation"])
        fig["labels"] = self._labels.seen  # readers on the node name generations as we do
        self._write_figures(force=True)
        return info

    def _summarize(self):
        """The summary line, at most once per summary_every seconds."""
        fig, now = self.figures, time.monotonic()
        if self._summary is None:
            self._summary = (now, fig["generations"], fig["bytes"])
            return
        t0, n0, b0 = self._summary
        if self.quiet or now - t0 < self.summary_every:
            return
        self._summary = (now, fig["generations"], fig["bytes"])
        last = (f", the newest {self._labels(fig['local_gen'])}"
                if fig["generations"] > n0 and fig["local_gen"] else "")
        self._say(f"{fig['generations'] - n0} generations ({(fig['bytes'] - b0) / 2**20:.1f} "
                  f"MiB) copied in the last {now - t0:.0f}s{last}; {fig['generations']} in all, "
                  f"{fig['lag_generations']} behind MongoDB's newest")

    def run(self, max_generations=None):
        """Relays until stopped (SIGTERM, SIGINT, stop()) or after
        max_generations copies; returns the number copied."""
        n = 0
        with self._stop:
            self._check_figures()
            if not self._acquire():
                return 0
            self._say(f"pid {os.getpid()} fills {self.local} from "
                      f"{redact(self.cfg['STORE'])}")
            # the figures file is written from the first look at MongoDB on:
            # a relay that fails before it leaves the last relay's figures
            while not self._stop:
                try:
                    info = self.step()
                except (_C.StoreUnavailableError, _C.NotFoundError) as e:
                    log.warning("wirehead relay: %s; retrying", e)
                    # status tells a live relay that cannot reach MongoDB from a dead one
                    self.figures["last_error"] = str(e)
                    self._write_figures()
                    self._stop.wait(1.0)
                    continue
                except _C.PinLimitError as e:  # readers pin the areas: try again
                    log.warning("wirehead relay: %s", e)
                    self._stop.wait(self.poll)
                    continue
                except _C.LeaseLostError as e:
                    # the relay we took over from still holds the copy's lease:
                    # it gives it up as it ends, or it lapses once it is dead
                    log.warning("wirehead relay: %s; waiting for it to end", e)
                    self._stop.wait(1.0)
                    continue
                if info is not None:
                    n += 1
                    # the first copy is said always: the log shows the relay works
                    self._say(f"generation {info['label']}: {info['samples']} samples, "
                              f"{info['bytes'] / 2**20:.1f} MiB in {info['pull_s']:.3f}s"
                              + ("" if n > 1 or self.verbose else
                                 " (the first; then a summary every "
                                 f"{self.summary_every:.0f}s, --verbose for each)"),
                              every=n > 1 or self.quiet)
                    if max_generations is not None and n >= max_generations:
                        break
                    self._summarize()
                    continue  # a newer one may be sealed already
                self._summarize()
                self._stop.wait(self.poll)
            # the log shows why the relay ended, not only that its lines stopped
            why = (signal.Signals(self._stop.signum).name if self._stop.signum is not None
                   else "stop()" if self._stop else f"max_generations={max_generations}")
            self._say(f"stopped ({why}) after copying {n} generation{'' if n == 1 else 's'}; "
                      f"readers go on reading {self.local} as it is")
        return n

    def stop(self):
        self._stop.set()

    def close(self):
        self._src.close()
        if self._lock_fd is not None:
            # the copy's lease goes before the lock: the relay that takes over
            # next must find the store free
            try:
                self._dst.get().resign()
            except _C.WireheadError:
                pass
        self._dst.close()
        if self._lock_fd is not None:
            # removed while held (a waiting relay then locks a new file), then let go
            path = relay_files(self.local)[0]
            if self._still_named(self._lock_fd, path):
                os.unlink(path)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
