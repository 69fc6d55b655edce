"""`make lint`: the house by layers, and no circles in it. For the C core,
reads which ext/ file defines and which calls each external symbol (nm over
the extension's objects) and which header each file includes; each folder
of ext/ is a layer (LAYERS), and a call or an include from one folder into
another of the same or a higher rank fails, naming both ends, unless ALLOW
declares it. For the package, which module imports which (at any depth of
the code, the package's lazy top-level names aside). Fails naming every
group of files that call or import each other round in a circle.

Usage: check_layers.py [OBJDIR]  (default: the in-place build's objects)
"""
import ast
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXT = os.path.join(ROOT, "ext")

# Each ext/ folder's rank: a file calls and includes only its own folder and
# folders of lower rank (the two backends share a rank and call each other
# not at all).
LAYERS = {"core": 0, "shm": 1, "mongo": 1, "store": 2, "read": 3, "cuda": 4, "py": 5}

# The arrows that run up a layer by design: (from folder, to file, why).
_BACKEND = "the backend interface: the vtable a backend fills, its handle's head"
_SHARED = "what both backends fill alike (readers in a status, params figures), in wh_backend.h"
ALLOW = [
    ("shm", "store/wh_backend.h", _BACKEND),
    ("mongo", "store/wh_backend.h", _BACKEND),
    ("shm", "store/wh_status.c", _SHARED),
    ("mongo", "store/wh_status.c", _SHARED),
]


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


def _calls(objdir):
    """[(caller, symbol, callee)] over ext/*/*.c, each file named by its
    folder (layer) and stem: "shm/wh_pfile"."""
    files = {}
    for src in sorted(glob.glob(os.path.join(EXT, "*", "*.c"))):
        name = os.path.relpath(src, EXT)[:-2]
        obj = os.path.join(objdir, name + ".o")
        if not os.path.exists(obj) or os.path.getmtime(obj) < os.path.getmtime(src):
            sys.exit(f"check_layers: {obj} is missing or older than {src}; build first "
                     f"(make build)")
        files[name] = _symbols(obj)
    owner = {s: n for n, (d, _) in files.items() for s in d}
    return sorted((n, s, owner[s]) for n, (_, u) in files.items() for s in u
                  if owner.get(s, n) != n)


def graph(objdir):
    """{file: [files whose functions it calls]} over ext/*/*.c."""
    g = {os.path.relpath(p, EXT)[:-2]: set()
         for p in glob.glob(os.path.join(EXT, "*", "*.c"))}
    for a, _, b in _calls(objdir):
        g[a].add(b)
    return {n: sorted(t) for n, t in sorted(g.items())}


def _includes():
    """[(file, header)] for every #include "..." of an ext/ header, both as
    paths under ext/ ("shm/wh_pfile.c", "store/wh_backend.h")."""
    where = {os.path.basename(p): os.path.relpath(p, EXT)
             for p in glob.glob(os.path.join(EXT, "*", "*.h"))}
    out = []
    for p in sorted(glob.glob(os.path.join(EXT, "*", "*.[ch]"))):
        with open(p, encoding="utf-8") as f:
            for h in re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read(), re.M):
                if os.path.basename(h) in where:
                    out.append((os.path.relpath(p, EXT), where[os.path.basename(h)]))
    return out


def _rooms(g):
    """The file graph with the files of one module split behind a private
    header (a folder's *_int.h, included by each) as one room: a backend
    cut by size, not by layer."""
    room = {}
    for a, h in _includes():
        if h.endswith("_int.h") and os.path.dirname(a) == os.path.dirname(h) and a.endswith(".c"):
            room[a[:-2]] = h[:-len("_int.h")] + "*"
    out = {}
    for n, ts in g.items():
        out.setdefault(room.get(n, n), set()).update(room.get(t, t) for t in ts)
    return {n: sorted(t for t in ts if t != n) for n, ts in out.items()}


def layer_errors(objdir):
    """Calls and includes that run up (or across) a layer, ALLOW aside, and
    ALLOW entries nothing uses any more."""
    bad, used = [], set()
    for folder in sorted({os.path.basename(os.path.dirname(p))
                          for p in glob.glob(os.path.join(EXT, "*", "*.[ch]"))}):
        if folder not in LAYERS:
            bad.append(f"ext/{folder}/ has no rank in LAYERS")
    allow = {(a, b) for a, b, _ in ALLOW}

    def up(src, dst):
        fa, fb = os.path.dirname(src), os.path.dirname(dst)
        if fa == fb or fa not in LAYERS or fb not in LAYERS:
            return None
        if LAYERS[fb] < LAYERS[fa]:
            return None
        if (fa, dst) in allow:
            used.add((fa, dst))
            return None
        return "a higher layer" if LAYERS[fb] > LAYERS[fa] else "a layer beside it"

    for a, sym, b in _calls(objdir):
        why = up(a, b + ".c")
        if why:
            bad.append(f"ext/{a}.c calls {sym} in ext/{b}.c ({why})")
    for a, h in _includes():
        why = up(a, h)
        if why:
            bad.append(f"ext/{a} includes {os.path.basename(h)} in ext/{os.path.dirname(h)}/ "
                       f"({why})")
    for a, b, _ in ALLOW:
        if (a, b) not in used:
            bad.append(f"ALLOW lets ext/{a}/ reach ext/{b}, which nothing there does any more: "
                       f"drop the entry")
    return bad


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
    layers = layer_errors(objdirs[0])
    for line in layers:
        print(line, file=sys.stderr)
    print(f"check_layers: {len(LAYERS)} ext/ layers, "
          + (f"{len(layers)} arrows up above" if layers else
             f"every call and include runs down ({len(ALLOW)} declared in ALLOW)"))
    bad = bool(layers)
    for what, g, verb in (("ext/ files", _rooms(graph(objdirs[0])), "calls"),
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
