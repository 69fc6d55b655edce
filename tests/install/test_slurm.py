"""The slurm/ scripts on a real 3-node SLURM cluster (tests/helpers/slurm_cluster.py:
munged, slurmctld and three slurmd on loopback, started for this module and
stopped by pid): a generator array, a manager and a 3-node torchrun
training on MongoDB (the in-memory test server), a one-node run on shm, a
generator array stopped by SLURM's signal, a run whose MongoDB server
comes from mongod.sbatch, and the benchmark job. There is no mongod binary
on the test machine: mongod.sbatch runs a stand-in that serves the
in-memory test server on the port it is given."""
import json
import os
import re
import subprocess
import sys

import pytest

import whlib
from slurm_cluster import SlurmCluster

SLURM = os.path.join(whlib.REPO, "slurm")
SUBMIT = os.path.join(SLURM, "submit.sh")
JOB_TIMEOUT = 240


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


def job_env(**extra):
    """What the jobs inherit (sbatch exports the submitter's environment)."""
    env = {"WH_PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           # every "node" is this host: gloo's own connections stay on loopback
           "GLOO_SOCKET_IFNAME": "lo"}
    env.update(extra)
    return env


def write_cfg(path, swap_cap, store=None, **extra):
    lines = [f"SWAP_CAP: {swap_cap}", "SAMPLE: [input, label]", "READ_TIMEOUT: 120"]
    if store:
        lines.append(f"STORE: {store}")
    lines += [f"{k}: {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def submit(cluster, *args, env=None):
    """Runs slurm/submit.sh (env: more variables for it and the jobs);
    returns the run dir and {role: job id}."""
    r = subprocess.run(["bash", SUBMIT, *args], env=cluster.env(job_env(**(env or {}))),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "wirehead-torch status --config" in r.stdout and "scancel" in r.stdout, r.stdout
    run_dir = r.stdout.split("run dir:")[1].split()[0]
    with open(os.path.join(run_dir, "jobs")) as f:
        return run_dir, dict(line.strip().split("=") for line in f if line.strip())


def wait_ok(cluster, jobids, run_dir=None):
    states = cluster.wait_jobs(jobids, JOB_TIMEOUT)
    bad = {j: s for j, s in states.items() if s != ("COMPLETED", "0:0")}
    logs = ""
    if bad and run_dir:
        for name in sorted(os.listdir(os.path.join(run_dir, "logs"))):
            with open(os.path.join(run_dir, "logs", name), errors="replace") as f:
                logs += f"--- {name}\n{f.read()[-3000:]}\n"
    assert not bad, f"jobs did not all exit 0: {bad}\n{logs}"
    return states


def read_log(run_dir, prefix):
    out = {}
    for name in os.listdir(os.path.join(run_dir, "logs")):
        if name.startswith(prefix):
            with open(os.path.join(run_dir, "logs", name)) as f:
                out[name] = f.read()
    return out


def check_ranks(run_dir, world, swap_cap):
    """Every rank ran the same steps; within an epoch no position (and so no
    sample) went to two ranks; a full epoch covers every position once."""
    recs = []
    for r in range(world):
        with open(os.path.join(run_dir, "train", f"train.rank{r}.json")) as f:
            recs.append(json.load(f))
    assert [(x["rank"], x["world"]) for x in recs] == [(r, world) for r in range(world)]
    steps = {x["rank"]: x["steps"] for x in recs}
    assert len(set(steps.values())) == 1 and recs[0]["steps"] > 0, f"unequal steps {steps}"
    assert len({len(x["epochs"]) for x in recs}) == 1, "ranks ran different epochs"
    full = 0
    for e in range(len(recs[0]["epochs"])):
        eps = [x["epochs"][e] for x in recs]
        assert len({len(ep) for ep in eps}) == 1, f"epoch {e}: unequal items per rank"
        real = [(g, p) for ep in eps for g, p, pad in ep if not pad]
        positions = [p for _g, p in real]
        assert len(set(positions)) == len(positions), \
            f"epoch {e}: a position went to two ranks or twice to one: {sorted(positions)}"
        if e < len(recs[0]["epochs"]) - 1:  # the last epoch may stop part-way
            assert sorted(positions) == list(range(swap_cap)), f"epoch {e} incomplete"
            full += 1
    assert full >= 1, "not one full epoch was trained"
    return recs


def test_three_node_torchrun_on_mongodb_with_generator_array_and_manager(
        cluster, mongo_server, tmp_path):
    swap_cap = 10  # not divisible by 3 ranks: padding keeps the ranks in step
    cfg = write_cfg(tmp_path / "config.yaml", swap_cap, CONNECT_TIMEOUT=10)
    store = f"{mongo_server.uri}/{whlib.unique_name('whslurm')}"
    run_dir, jobs = submit(cluster, "--config", cfg, "--store", store, "--generators", "2",
                           "--procs", "1", "--train-nodes", "3", "--seconds", "12",
                           "--run-dir", str(tmp_path / "run"), "--gen-args", "--size 16",
                           "--train-args", "--batch-size 2", "--sbatch-args",
                           "--cpus-per-task=1")
    assert set(jobs) == {"generators", "manager", "train"}
    states = wait_ok(cluster, [int(j) for j in jobs.values()], run_dir)
    assert sum(k.startswith(jobs["generators"] + "_") for k in states) == 2, states
    gens = read_log(run_dir, "gen-")
    assert len(gens) == 2 and all("pushed" in t and "generators: done" in t
                                  for t in gens.values()), gens
    (mgr,) = read_log(run_dir, "manager-").values()
    # its end line: why it stopped, its own seals and the generators' it saw
    assert re.search(r"wirehead manager: stopped \(.*\): \d+ generations sealed \(\d+ here, "
                     r"\d+ by self-sealing generators\)", mgr), mgr
    (train,) = read_log(run_dir, "train-").values()
    assert "node rank 2 of 3" in train and "train: done (0)" in train
    check_ranks(run_dir, 3, swap_cap)
    import wirehead_torch as wt
    wt.clean({"STORE": store, "SWAP_CAP": swap_cap, "SAMPLE": ["input", "label"]})


def test_relay_per_node_with_local_cache(cluster, mongo_server, tmp_path):
    """LOCAL_CACHE: train.sbatch starts one relay per training node before
    torchrun; every rank reads its node's copy (auto: named per node)."""
    swap_cap = 10
    cfg = write_cfg(tmp_path / "config.yaml", swap_cap, CONNECT_TIMEOUT=10, LOCAL_CACHE="auto")
    store = f"{mongo_server.uri}/{whlib.unique_name('whslurm')}"
    run_dir, jobs = submit(cluster, "--config", cfg, "--store", store, "--generators", "1",
                           "--procs", "1", "--train-nodes", "3", "--seconds", "12",
                           "--run-dir", str(tmp_path / "run"), "--gen-args", "--size 16",
                           "--train-args", "--batch-size 2", "--sbatch-args",
                           "--cpus-per-task=1")
    wait_ok(cluster, [int(j) for j in jobs.values()], run_dir)
    (relay,) = read_log(run_dir, "relay-").values()
    fills = [line for line in relay.splitlines() if " fills shm://relay-" in line]
    assert sorted(line.split("shm://relay-")[1].split("-")[0] for line in fills) == \
        ["n1", "n2", "n3"], relay  # one relay on each node, each filling its own copy
    assert "MiB in" in relay, relay  # a generation was copied
    # each node pulls a generation from MongoDB once: bytes per generation =
    # nodes x generation bytes, whatever the ranks and workers on a node
    pulled = {}  # generation -> [MiB pulled by each relay that copied it]
    for line in relay.splitlines():
        m = re.search(r"generation #(\d+): \d+ samples, ([\d.]+) MiB in", line)
        if m:
            pulled.setdefault(int(m.group(1)), []).append(float(m.group(2)))
    assert pulled and all(len(v) <= 3 for v in pulled.values()), pulled
    print(f"MongoDB MiB served per generation (3 nodes, one relay each): "
          f"{sorted((g, round(sum(v), 2), len(v)) for g, v in pulled.items())[-5:]}")
    (train,) = read_log(run_dir, "train-").values()
    assert "one relay per node" in train and "train: done (0)" in train
    check_ranks(run_dir, 3, swap_cap)
    import wirehead_torch as wt
    from wirehead_torch.relay import relay_files
    wt.clean({"STORE": store, "SWAP_CAP": swap_cap, "SAMPLE": ["input", "label"]})
    # each node's copy and its relay's files, by the names the relays said
    # (the step's end may SIGKILL a relay before it removes its lock); a
    # copy is removed only as its store's copy
    for line in fills:
        local = "shm://" + line.split("shm://", 1)[1].split()[0]
        wt.clean({"STORE": store, "SWAP_CAP": swap_cap, "SAMPLE": ["input", "label"],
                  "LOCAL_CACHE": local}, local_only=True)
        for path in relay_files(local):
            if os.path.exists(path):
                os.unlink(path)
        assert not os.path.exists(f"/dev/shm/wirehead.{local[len('shm://'):]}")


STAND_IN_MONGOD = """#!{python}
# stands in for mongod: the in-memory test server on --port, until SIGTERM
import signal, subprocess, sys
sys.path.insert(0, {tests!r})
from mongo_server import SOURCE, _java, jar_dir
port = sys.argv[sys.argv.index("--port") + 1]
p = subprocess.Popen([_java(), "-XX:+UseSerialGC", "-cp", jar_dir() + "/*", SOURCE, port],
                     stdin=subprocess.PIPE)
signal.signal(signal.SIGTERM, lambda *_: p.stdin.close())  # stdin closed: it exits
sys.exit(p.wait())
"""


def test_mongod_job_serves_the_run_and_ends_after_it(cluster, tmp_path):
    """submit.sh --mongod: the other jobs wait for mongod.sbatch's URI file,
    run on that server, and mongod ends once they have all left the queue."""
    mongod = tmp_path / "mongod"
    mongod.write_text(STAND_IN_MONGOD.format(python=sys.executable, tests=whlib.HERE))
    mongod.chmod(0o755)
    cfg = write_cfg(tmp_path / "config.yaml", 8, CONNECT_TIMEOUT=10)
    env = {"WH_MONGOD": str(mongod), "WH_MONGOD_PORT": str(whlib.free_port()),
           "WH_MONGOD_DB": whlib.unique_name("whslurm")}
    run_dir, jobs = submit(cluster, "--config", cfg, "--mongod", "--generators", "1", "--procs",
                           "1", "--seconds", "8", "--run-dir", str(tmp_path / "run"),
                           "--gen-args", "--size 16", "--train-args", "--batch-size 2",
                           "--sbatch-args", "--cpus-per-task=1", env=env)
    assert set(jobs) == {"mongod", "generators", "manager", "train"}
    wait_ok(cluster, [int(j) for j in jobs.values()], run_dir)
    (log,) = read_log(run_dir, "mongod-").values()
    assert "URI in" in log and "mongod: stopped" in log, log
    (train,) = read_log(run_dir, "train-").values()
    assert "train: done (0)" in train
    check_ranks(run_dir, 1, 8)
    assert not os.path.exists(os.path.join(run_dir, "mongo.uri")), "a stale URI was left"


def test_one_node_run_on_shm_inside_one_allocation(cluster, tmp_path):
    name = whlib.unique_name("whslurm")
    cfg = write_cfg(tmp_path / "config.yaml", 8, store=f"shm://{name}", BYTE_BUDGET="2MiB")
    run_dir, jobs = submit(cluster, "--config", cfg, "--procs", "1", "--seconds", "8",
                           "--run-dir", str(tmp_path / "run"), "--gen-args", "--size 16",
                           "--train-args", "--batch-size 2", "--sbatch-args",
                           "--cpus-per-task=2")
    assert set(jobs) == {"train"}
    wait_ok(cluster, [int(jobs["train"])], run_dir)
    (log,) = read_log(run_dir, "train-").values()
    assert "pushed" in log and "removed store" in log, log
    check_ranks(run_dir, 1, 8)
    assert not os.path.exists(f"/dev/shm/wirehead.{name}"), "the run left its store behind"


def test_generator_array_ends_cleanly_on_slurm_signal(cluster, tmp_path):
    """The batch shell gets SIGTERM (what --signal=B:TERM@N and pre-emption
    send); every generator finishes its sample and the tasks exit 0."""
    name = whlib.unique_name("whslurm")
    cfg = write_cfg(tmp_path / "config.yaml", 8, store=f"shm://{name}", BYTE_BUDGET="2MiB")
    logs = tmp_path / "logs"
    logs.mkdir()
    env = job_env(WH_CONFIG=cfg, WH_RUN_DIR=str(tmp_path), WH_SLURM_DIR=SLURM, WH_PROCS="2",
                  WH_GEN_ARGS="--size 16")
    jid = cluster.sbatch(["--array=0-1", "--cpus-per-task=1", f"--output={logs}/gen-%A_%a.out",
                          os.path.join(SLURM, "generators.sbatch")], env=env)
    try:
        for task in (0, 1):
            path = logs / f"gen-{jid}_{task}.out"
            whlib.until(lambda: path.exists() and path.read_text().count("started") == 2,  # noqa: B023
                        JOB_TIMEOUT, f"both generators of task {task} started")
        cluster.run(["scancel", "--batch", "--signal=TERM", str(jid)])
        states = cluster.wait_jobs([jid], JOB_TIMEOUT)
        assert states and all(s == ("COMPLETED", "0:0") for s in states.values()), states
        for task in (0, 1):
            text = (logs / f"gen-{jid}_{task}.out").read_text()
            assert text.count("pushed") == 2 and "exit codes [0, 0]" in text, text
    finally:
        import wirehead_torch as wt
        wt.clean({"STORE": f"shm://{name}", "SWAP_CAP": 8, "SAMPLE": ["input", "label"]})


def test_bench_job_writes_results_table_and_plots(cluster, tmp_path):
    env = job_env(WH_SLURM_DIR=SLURM, WH_BENCH_NAME="t",
                  WH_BENCH_ARGS=f"--out-root {tmp_path} --seconds 3 --train-seconds 5 "
                                "--size 16 --parts scaling,training,store")
    jid = cluster.sbatch(["--cpus-per-task=2", f"--output={tmp_path}/bench.out",
                          os.path.join(SLURM, "bench.sbatch")], env=env)
    states = cluster.wait_jobs([jid], JOB_TIMEOUT)
    assert states[str(jid)] == ("COMPLETED", "0:0"), (tmp_path / "bench.out").read_text()
    out = tmp_path / "t"
    res = json.loads((out / "results.json").read_text())
    assert [r["generators"] for r in res["scaling"]] == [1, 2]
    assert all(r["samples_per_s"] > 0 and r["ideal_per_s"] > 0 for r in res["scaling"])
    modes = [(r["mode"], r["generators"]) for r in res["training"]]
    assert modes == [("inline", 0), ("wirehead", 1), ("wirehead", 2)]
    for r in res["training"]:
        assert r["steps"] > 0 and r["samples_per_s"] > 0 and 0 <= r["data_wait_pct"] <= 100
    for r in res["training"][1:]:
        assert r["reuse"] >= 1.0 and r["reuse_over_time"], r
    assert res["store"]["rows"] and all(r["GB_s"] > 0 for r in res["store"]["rows"])
    assert "SLURM job" in res["machine"]
    md = (out / "results.md").read_text()
    assert "## Generator scaling" in md and "## Training" in md and "| inline |" in md
    for png in ("scaling.png", "training.png", "reuse.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png
