"""Soak test: 3 generators, a manager and a verifying reader on one store
for SOAK_SECONDS (default 300). Every sample carries (generator, counter,
seed); the reader recomputes its bytes from the seed and counts wrong ones.
Prints verified/wrong counts and each process's RSS at start and end;
exits non-zero if any sample was wrong or a process died.

    make soak                       # shm store, 5 minutes
    SOAK_SECONDS=60 SOAK_STORE=mongodb://127.0.0.1:27017/soak make soak
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

N_GENERATORS = 3
DATA_BYTES = 16 << 10
RSS_TICK = 5.0


def seed_of(gid, counter):
    return (gid * 1_000_003 + counter * 7919 + 17) & 0x7FFFFFFF


def content(seed):
    return np.random.default_rng(seed).integers(0, 256, DATA_BYTES, dtype=np.uint8)


def run_generator(cfg, gid):
    import wirehead_torch as wt

    def samples():
        counter = 0
        while True:
            seed = seed_of(gid, counter)
            yield np.array([gid, counter, seed], np.int64), content(seed)
            counter += 1

    print(f"generator {gid}: wrote {wt.WireheadGenerator(samples(), config=cfg, quiet=True).run()}",
          flush=True)


def run_manager(cfg):
    import wirehead_torch as wt
    print(f"manager: {wt.WireheadManager(config=cfg, quiet=True).run()} swaps", flush=True)


def run_reader(cfg):
    """Reads every epoch with the C loader and checks every byte; prints a
    JSON summary on SIGTERM."""
    import wirehead_torch as wt
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    res = {"verified": 0, "wrong": 0, "pad_rows": 0, "epochs": 0, "generations": 0,
           "per_generator": [0] * N_GENERATORS}
    gens = set()
    loader = wt.WireheadLoader(config=cfg, batch_size=16, num_threads=2, timeout=120)
    print("reader: started", flush=True)
    while not stop:
        for batch in loader:
            ids, data = batch["id"].numpy(), batch["data"].numpy()
            for row, pad, gen in zip(range(len(ids)), batch["is_pad"].tolist(),
                                     batch["generation"].tolist()):
                gid, counter, seed = (int(x) for x in ids[row])
                ok = (0 <= gid < N_GENERATORS and seed == seed_of(gid, counter)
                      and np.array_equal(data[row], content(seed)))
                if not ok:
                    res["wrong"] += 1
                elif pad:
                    res["pad_rows"] += 1
                else:
                    res["verified"] += 1
                    res["per_generator"][gid] += 1
                gens.add(gen)
            if stop:
                break
        res["epochs"] += 1
    res["generations"] = len(gens)
    loader.close()
    print("reader: " + json.dumps(res), flush=True)


def rss_kib(pid):
    """(VmRSS, RssAnon) in KiB; RssAnon leaves out the mapped store pages."""
    got = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":")[0]
                if key in ("VmRSS", "RssAnon"):
                    got[key] = int(line.split()[1])
    except OSError:
        return None
    return (got["VmRSS"], got["RssAnon"]) if len(got) == 2 else None


def main():
    seconds = float(os.environ.get("SOAK_SECONDS", "300"))
    store = os.environ.get("SOAK_STORE") or f"shm://soak-{os.getpid()}"
    cfg = {"STORE": store, "SWAP_CAP": 256, "SAMPLE": ["id", "data"],
           "BYTE_BUDGET": "32MiB", "READ_TIMEOUT": 120, "LEASE_SECONDS": 5}
    import wirehead_torch as wt
    wt.clean(cfg)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def spawn(*args):
        return subprocess.Popen([sys.executable, os.path.abspath(__file__), *args,
                                 json.dumps(cfg)], env=env, stdout=subprocess.PIPE, text=True)

    procs = {"manager": spawn("manager")}
    for g in range(N_GENERATORS):
        procs[f"generator{g}"] = spawn("generator", str(g))
    procs["reader"] = spawn("reader")
    assert procs["reader"].stdout.readline().startswith("reader: started")
    t0 = time.monotonic()
    rss = {name: [] for name in procs}
    died = []
    while time.monotonic() - t0 < seconds and not died:
        for name, p in procs.items():
            rss[name].append(rss_kib(p.pid))
            if p.poll() is not None:
                died.append(f"{name} exited with {p.returncode}")
        time.sleep(min(RSS_TICK, max(0.0, seconds - (time.monotonic() - t0))))
    for name, p in procs.items():
        rss[name].append(rss_kib(p.pid))
    elapsed = time.monotonic() - t0
    order = ["reader", "manager"] + [f"generator{g}" for g in range(N_GENERATORS)]
    outs = {}
    for name in order:  # reader first: it reports before the writers stop
        p = procs[name]
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            outs[name] = p.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            outs[name] = p.communicate()[0]
            died.append(f"{name} did not stop on SIGTERM")
    wt.clean(cfg)
    res = None
    for line in outs["reader"].splitlines():
        if line.startswith("reader: {"):
            res = json.loads(line[len("reader: "):])
    print(f"soak: {elapsed:.0f} s on {store}, SWAP_CAP {cfg['SWAP_CAP']}, "
          f"{N_GENERATORS} generators, {DATA_BYTES} B samples")
    for name in order:
        tail = [line for line in outs[name].splitlines() if not line.startswith("reader: ")]
        series = [r for r in rss[name] if r is not None]
        start = series[min(1, len(series) - 1)] if series else (None, None)  # warmed up
        end = series[-1] if series else (None, None)
        peak = max(r[0] for r in series) if series else None
        print(f"  {name:11s} RSS start {start[0]} KiB (anon {start[1]}), end {end[0]} KiB "
              f"(anon {end[1]}), peak {peak} KiB  {' '.join(tail)}")
    print(f"  reader: {json.dumps(res)}")
    for d in died:
        print(f"  FAILED: {d}")
    if res is None or res["wrong"] or not res["verified"] or died:
        print("soak: FAILED")
        return 1
    print(f"soak: OK, {res['verified']} samples verified, 0 wrong")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] != "main":
        role, args, cfg = sys.argv[1], sys.argv[2:-1], json.loads(sys.argv[-1])
        {"generator": lambda: run_generator(cfg, int(args[0])),
         "manager": lambda: run_manager(cfg),
         "reader": lambda: run_reader(cfg)}[role]()
    else:
        sys.exit(main())
