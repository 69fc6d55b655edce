"""`make lint`: no circles in the house. For the C core, reads which ext/
file defines and which calls each external symbol (nm over the extension's
objects); for the package, which module imports which (at any depth of the
code, the package's lazy top-level names aside). Fails naming every group
of files that call or import each other round in a circle.

Usage: check_layers.py [OBJDIR]  (default: the in-place build's objects)
"""
import ast
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _symbols(obj):
    """(defined, undefined) global symbols of one object file."""
    out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBR":
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
    return defined, undefined


def graph(objdir):
    """{file: [files whose functions it calls]} over ext/*/*.c, each file
    named by its folder (layer) and stem: "shm/wh_pfile"."""
    files = {}
    for src in sorted(glob.glob(os.path.join(ROOT, "ext", "*", "*.c"))):
        name = os.path.relpath(src, os.path.join(ROOT, "ext"))[:-2]
        obj = os.path.join(objdir, name + ".o")
        if not os.path.exists(obj) or os.path.getmtime(obj) < os.path.getmtime(src):
            sys.exit(f"check_layers: {obj} is missing or older than {src}; build first "
                     f"(make build)")
        files[name] = _symbols(obj)
    owner = {s: n for n, (d, _) in files.items() for s in d}
    return {n: sorted({owner[s] for s in u if owner.get(s, n) != n})
            for n, (_, u) in files.items()}


def py_graph():
    """{module: [package modules it imports]} over wirehead_torch/."""
    mods = {}
    for p in glob.glob(os.path.join(ROOT, "wirehead_torch", "**", "*.py"), recursive=True):
        rel = os.path.relpath(p, ROOT)[:-3].replace(os.sep, ".")
        mods[rel.removesuffix(".__init__")] = p
    g = {}
    for m, p in mods.items():
        pkg = m if p.endswith("__init__.py") else m.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(open(p).read(), p)):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    deps.add(full if full in mods else base)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        # the package's names are lazy (resolved on first use), so importing
        # them from a library module is no circle; only the apps do
        deps.discard("wirehead_torch")
        g[m] = sorted(d for d in deps if d in mods and d != m)
    return g


def circles(g):
    """Groups of two or more files that reach each other (Tarjan's SCC)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in g:
        if v not in index:
            visit(v)
    return out


def main():
    objdirs = sys.argv[1:] or glob.glob(os.path.join(ROOT, "build", "temp.*", "ext"))
    if not objdirs:
        sys.exit("check_layers: no build/temp.*/ext objects; build first (make build)")
    bad = False
    for what, g, verb in (("ext/ files", graph(objdirs[0]), "calls"),
                          ("wirehead_torch modules", py_graph(), "imports")):
        found = circles(g)
        bad = bad or bool(found)
        for group in found:
            print(f"{what} that {verb.rstrip('s')} each other in a circle: " + ", ".join(group),
                  file=sys.stderr)
            for f in group:
                print(f"  {f} {verb} {[t for t in g[f] if t in group]}", file=sys.stderr)
        print(f"check_layers: {len(g)} {what}, " + ("circles above" if found else "no circles"))
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
