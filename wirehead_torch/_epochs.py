"""The epoch state a WireheadIterableDataset shares with its DataLoader's
worker processes (fork, spawn or forkserver), so that persistent and fresh
workers, and the main process, agree on the epoch each iteration runs, the
rank's resume point and the generation in use: one named structure per
rank in shared memory."""
import ctypes
import multiprocessing

MAX_WORKERS = 256
# A dataset pickled to several rank processes before they exist (ddp_spawn)
# carries one shared array to all of them: each rank keeps its state in its
# own region (rank mod RANK_REGIONS; ranks that share memory share a host).
RANK_REGIONS = 64


class RankEpoch(ctypes.Structure):
    """One rank's epoch state (a region of the shared array)."""

    _fields_ = [
        ("base_epoch", ctypes.c_int64),  # the epoch the first iteration of each worker runs
        ("resume_batches", ctypes.c_int64),  # the rank's batches taken before a resume; -1: none
        ("resume_generation", ctypes.c_int64),  # the generation a resumed epoch reads
        ("generation", ctypes.c_int64),  # the generation the running epoch reads (worker 0's)
        # a device iteration's cut-over: rows of at least this many bytes stay
        # in the store for the main process's copy (0: none; docs/gpu.md)
        ("direct_min", ctypes.c_int64),
        ("iterations", ctypes.c_int64 * MAX_WORKERS),  # iterations started, per worker
        # spec mode: worker 0's waits for a spec generation not sealed yet
        ("spec_waits", ctypes.c_int64),
        ("spec_wait_us", ctypes.c_int64),
    ]

    def count_wait(self, seconds):
        """Worker 0 waited seconds for its epoch's spec generation."""
        self.spec_waits += 1
        self.spec_wait_us += int(seconds * 1e6)

    def start(self, epoch):
        """The next iteration of every worker runs epoch; no resume."""
        self.base_epoch = int(epoch)
        self.resume_batches = -1
        ctypes.memset(ctypes.addressof(self.iterations), 0, ctypes.sizeof(self.iterations))

    def set_epoch(self, epoch):
        """start(epoch), unless a resume loaded for that same epoch is still
        to run (the usual load_state_dict, then set_epoch loop)."""
        if self.resume_batches >= 0 and self.base_epoch == int(epoch) and \
                not any(self.iterations):
            return
        self.start(epoch)

    def resume(self, epoch, batches, generation):
        """The next iteration runs the rest of epoch: the rank has taken
        batches of it, reading generation (0: the newest)."""
        self.start(epoch)
        self.resume_batches = int(batches)
        self.resume_generation = self.generation = int(generation)

    def running_epoch(self):
        """The epoch of worker 0's latest iteration (the one running)."""
        return self.base_epoch + max(self.iterations[0] - 1, 0)

    def begin_iteration(self, worker):
        """Counts an iteration of worker: (epoch, resumed) where resumed is
        the rank's batches taken before, for its first iteration after a
        resume, else None."""
        count = self.iterations[worker]
        self.iterations[worker] = count + 1
        resumed = self.resume_batches if count == 0 and self.resume_batches >= 0 else None
        return self.base_epoch + count, resumed

    def continue_from(self, worker, epoch):
        """worker resumed epoch on its own (a StatefulDataLoader's worker
        state): its later iterations go on from there."""
        self.iterations[worker] = max(epoch - self.base_epoch + 1, 1)


class EpochState:
    """A dataset's shared epoch state: a RankEpoch per rank region, in
    memory shared with the processes it is pickled to while they start."""

    def __init__(self):
        self._regions = multiprocessing.RawArray(RankEpoch, RANK_REGIONS)
        for region in self._regions:
            region.resume_batches = -1

    def of_rank(self, rank):
        """rank's RankEpoch (a view of the shared memory, not a copy)."""
        return self._regions[rank % RANK_REGIONS]
