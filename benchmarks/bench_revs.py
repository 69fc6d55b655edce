"""Two commits of the package against each other: bench_loader.py (this
tree's copy, so both sides run the same measurement) over each commit's
package, alternating commit by commit for --rounds rounds, one repetition
per run. Each run reports every read path as a ratio to memcpy+touch (bench_loader.py) in
that same run; this prints, per read path, the median ratio for each commit
and the second's median over the first's.

    .venv/bin/python benchmarks/bench_revs.py 90b2d32 HEAD --mib 64 --rounds 3 [--only TEXT ...]

--only is bench_loader.py's: the read paths whose name holds one of the
texts (more rounds of a few paths in the time of one round of all).

Each commit is checked out with `git worktree add` under a temporary folder
and its extension built there (a minute each), with this tree's
bench_loader.py copied in, which imports the package of the checkout it
stands in; the worktrees are removed at the end.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "benchmarks", "bench_loader.py")


def checkout(rev, into):
    subprocess.run(["git", "-C", REPO, "worktree", "add", "-q", "--detach", into, rev], check=True)
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=into,
                   check=True, stdout=subprocess.DEVNULL)
    # this tree's measurement, in the checkout: it imports the package beside it
    shutil.copy(BENCH, os.path.join(into, "benchmarks", "bench_loader.py"))


def one_run(tree, mib, out, only=None):
    bench = os.path.join(tree, "benchmarks", "bench_loader.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, bench, "--mib", str(mib), "--reps", "1", "--json", out] +
                   (["--only", *only] if only else []),
                   env=env, cwd=tree, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        rows = json.load(f)["results"][0]["rows"]
    return {r["reader"]: (r["vs_memcpy"], r["GB_s"], r["memcpy"]["GB_s"]) for r in rows}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", nargs="+")
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="bench-revs-")
    trees = {}
    try:
        for rev in (a.before, a.after):
            trees[rev] = os.path.join(tmp, rev.replace("/", "_"))
            checkout(rev, trees[rev])
        got = {rev: {} for rev in trees}
        for k in range(a.rounds):
            order = list(trees) if k % 2 == 0 else list(reversed(trees))
            for rev in order:
                for name, ratio in one_run(trees[rev], a.mib, os.path.join(tmp, "out.json"),
                                            a.only).items():
                    got[rev].setdefault(name, []).append(ratio)
        print(f"\n{a.mib} MiB samples, median of {a.rounds} rounds (commits alternating), "
              f"each a ratio to memcpy+touch in the same run; the GB/s columns are the\n"
              f"medians of each side's own figures\n")
        print(f"| reader | {a.before} | {a.after} | after / before | GB/s, {a.before} "
              f"(its memcpy+touch) | GB/s, {a.after} (its memcpy+touch) |")
        print("|---|---:|---:|---:|---:|---:|")

        def med(rev, name, k):
            return statistics.median(x[k] for x in got[rev][name])

        def gbs(rev, name):
            return f"{med(rev, name, 1):.2f} ({med(rev, name, 2):.2f})"

        for name in got[a.before]:
            b = med(a.before, name, 0)
            if name not in got[a.after]:
                print(f"| {name} | {b * 100:.0f}% | (absent) | | {gbs(a.before, name)} | |")
                continue
            f = med(a.after, name, 0)
            print(f"| {name} | {b * 100:.0f}% | {f * 100:.0f}% | {f / b:.2f} | "
                  f"{gbs(a.before, name)} | {gbs(a.after, name)} |", flush=True)
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", tree],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
