"""A real 3-node SLURM cluster on loopback, for tests and the benchmark run.

    from slurm_cluster import SlurmCluster
    with SlurmCluster(tmpdir) as c:        # munged, slurmctld, slurmd -N n1..n3
        jid = c.sbatch(["-N", "3", "slurm/train.sbatch"])
        c.wait_jobs([jid], timeout=120)    # -> {jobid: (state, exit code)}

    python tests/helpers/slurm_cluster.py DIR -- CMD...   # run CMD with SLURM_CONF set

Everything lives under one directory (key, sockets, state, spool, logs,
slurm.conf); ports are chosen free per run; the daemons run in the
foreground as our children and are stopped by pid. Debian's slurm-wlm and
munge provide the binaries. Node names do not resolve: every node is
127.0.0.1, and scripts read addresses from `scontrol show node`.
"""
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import whlib  # noqa: E402

NODES = ("n1", "n2", "n3")
CPUS = 4            # per node, more than the host has (config_overrides): room for
                    # a generator array, a manager and a training task at once
DONE_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
               "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


class SlurmError(RuntimeError):
    pass


def _conf(d, ports, socket):
    nodes = "\n".join(
        f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} CPUs={CPUS} "
        f"RealMemory=4000 State=UNKNOWN" for n, p in zip(NODES, ports["slurmd"]))
    return f"""\
ClusterName=whtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ports['slurmctld']}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MinJobAge=600
KillWait=10
InactiveLimit=0
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


class SlurmCluster:
    """munged + slurmctld + one slurmd per node, all children of this process."""

    def __init__(self, root, start_timeout=60):
        self.root = os.path.abspath(root)
        self.start_timeout = start_timeout
        self.procs = {}
        self.conf = os.path.join(self.root, "slurm.conf")
        self.socket = os.path.join(self.root, "munge", "munge.socket")

    # -- environment for clients (sbatch, squeue, scontrol, the job scripts)
    def env(self, extra=None):
        env = whlib.env_for_child(extra)
        env["SLURM_CONF"] = self.conf
        return env

    def run(self, args, check=True, timeout=30):
        r = subprocess.run(args, env=self.env(), capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise SlurmError(f"{' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
        return r.stdout

    def _spawn(self, name, args):
        log = open(os.path.join(self.root, "log", f"{name}.out"), "wb")
        self.procs[name] = subprocess.Popen(args, env=self.env(), stdout=log,
                                            stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        log.close()

    def start(self):
        for sub in ("munge", "state", "run", "log", "spool"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        os.chmod(os.path.join(self.root, "munge"), 0o700)
        key = os.path.join(self.root, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        ports = {"slurmctld": whlib.free_port(),
                 "slurmd": [whlib.free_port() for _ in NODES]}
        with open(self.conf, "w") as f:
            f.write(_conf(self.root, ports, self.socket))
        m = os.path.join(self.root, "munge")
        self._spawn("munged", ["munged", "--foreground", "--force",
                               f"--socket={self.socket}", f"--key-file={key}",
                               f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log",
                               f"--seed-file={m}/munged.seed"])
        self._until(lambda: os.path.exists(self.socket), "munged's socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", self.conf])
        for n in NODES:
            os.makedirs(os.path.join(self.root, "spool", n), exist_ok=True)
            self._spawn(f"slurmd.{n}", ["slurmd", "-D", "-N", n, "-f", self.conf])
        self._until(self._nodes_idle, "3 idle nodes")
        return self

    def _until(self, cond, what):
        deadline = time.monotonic() + self.start_timeout
        delay = 0.05
        while True:
            dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
            if dead:
                raise SlurmError(f"{dead} exited while waiting for {what}: {self.logs_tail()}")
            try:
                if cond():
                    return
            except (SlurmError, subprocess.TimeoutExpired):
                pass
            if time.monotonic() > deadline:
                raise SlurmError(f"no {what} within {self.start_timeout}s: {self.logs_tail()}")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _nodes_idle(self):
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"])
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in NODES)

    def logs_tail(self, n=15):
        parts = []
        for d in (os.path.join(self.root, "log"), os.path.join(self.root, "munge")):
            for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
                if name.endswith((".log", ".out")):
                    with open(os.path.join(d, name), errors="replace") as f:
                        tail = "".join(f.readlines()[-n:])
                    parts.append(f"--- {name}\n{tail}")
        return "\n".join(parts)

    # -- jobs
    def sbatch(self, args, env=None):
        """Submits; returns the job id (an int)."""
        r = subprocess.run(["sbatch", "--parsable", *args], env=self.env(env),
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise SlurmError(f"sbatch {args}: {r.stderr.strip()}")
        return int(r.stdout.strip().split(";")[0])

    def job_states(self, jobid):
        """{job id text (array tasks as 12_0): (state, exit code)} of one job."""
        out = self.run(["scontrol", "-o", "show", "job", str(jobid)], check=False)
        states = {}
        for line in out.splitlines():
            f = dict(re.findall(r"(\w+)=(\S+)", line))
            if "JobId" not in f:
                continue
            name = f["JobId"]
            if f.get("ArrayTaskId") not in (None, "(null)"):
                name = f"{f['ArrayJobId']}_{f['ArrayTaskId']}"
            states[name] = (f.get("JobState"), f.get("ExitCode"))
        return states

    def wait_jobs(self, jobids, timeout):
        """Waits until every job (and array task) has ended; returns their
        {id: (state, exit code)}. Raises SlurmError on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            allst = {}
            for j in jobids:
                allst.update(self.job_states(j))
            pending_arrays = any("[" in k for k in allst)
            if allst and not pending_arrays and \
                    all(s in DONE_STATES for s, _ in allst.values()):
                return allst
            if time.monotonic() > deadline:
                raise SlurmError(f"jobs {jobids} not done in {timeout}s: {allst}\n"
                                 + self.logs_tail())
            time.sleep(0.5)

    def cancel_all(self, timeout=60):
        """Cancels every job of this cluster and waits until none runs: a
        job's processes belong to slurmstepd, not slurmd, and would outlive
        the daemons."""
        if self.procs.get("slurmctld") is None or self.procs["slurmctld"].poll() is not None:
            return
        try:
            ids = self.run(["squeue", "-h", "-o", "%A"], check=False).split()
            if ids:
                self.run(["scancel", *ids], check=False)
            deadline = time.monotonic() + timeout
            while self.run(["squeue", "-h", "-o", "%A"], check=False).split():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        except (OSError, subprocess.SubprocessError):
            pass

    def stop(self):
        """Cancels the jobs left, then SIGTERMs our daemons (slurmds first,
        munged last), by pid."""
        self.cancel_all()
        order = [n for n in self.procs if n.startswith("slurmd.")] + ["slurmctld", "munged"]
        for name in order:
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        self.procs.clear()

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()


def main(argv):
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    # a SIGTERM must still stop the daemons (the with block's exit)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with SlurmCluster(argv[0]) as c:
        return subprocess.run(argv[2:], env=c.env()).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
