"""`make lint`: the house by layers, and no circles in it. For the C core,
reads which ext/ file defines and which calls each external symbol (nm over
the extension's objects) and which header each file includes; each folder
of ext/ is a layer (LAYERS), and a call or an include from one folder into
another of the same or a higher rank fails, naming both ends (no exception:
the backends stand on ext/backend/, below them). For the package, which
module imports which (at any depth of the code, the package's lazy
top-level names aside). Fails naming every group of files that call or
import each other round in a circle, files of one folder included (each
file is a room of its own, whatever headers it shares).

Two more rules of the C core: a URI scheme is spelled (in a string) only in
the scheme table (SCHEME_TABLE) and in the folder of the backend its line
names, and a backend's name only in its folder; and no ext/ file is longer
than MAX_LINES.

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
# folders of lower rank (the backends share a rank and call each other not
# at all; each stands on the interface below them, backend/).
LAYERS = {"core": 0, "backend": 1, "shm": 2, "mongo": 2, "store": 3, "read": 4, "cuda": 5,
          "py": 6}

# The one table of URI schemes: lines {"scheme://", &wh_<x>_ops}.
SCHEME_TABLE = "store/wh_scheme.c"
MAX_LINES = 900
# Files longer than MAX_LINES for now, each with why; an entry no file
# needs any more fails, so the list only shrinks (empty: none is).
LONG_OK = {}


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
    paths under ext/ ("shm/wh_pfile.c", "backend/wh_backend.h")."""
    where = {os.path.basename(p): os.path.relpath(p, EXT)
             for p in glob.glob(os.path.join(EXT, "*", "*.h"))}
    out = []
    for p in sorted(glob.glob(os.path.join(EXT, "*", "*.[ch]"))):
        with open(p, encoding="utf-8") as f:
            for h in re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read(), re.M):
                if os.path.basename(h) in where:
                    out.append((os.path.relpath(p, EXT), where[os.path.basename(h)]))
    return out


def layer_errors(objdir):
    """Calls and includes that run up (or across) a layer."""
    bad = []
    for folder in sorted({os.path.basename(os.path.dirname(p))
                          for p in glob.glob(os.path.join(EXT, "*", "*.[ch]"))}):
        if folder not in LAYERS:
            bad.append(f"ext/{folder}/ has no rank in LAYERS")

    def up(src, dst):
        fa, fb = os.path.dirname(src), os.path.dirname(dst)
        if fa == fb or fa not in LAYERS or fb not in LAYERS:
            return None
        if LAYERS[fb] < LAYERS[fa]:
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
    return bad


def _strings(path):
    """The string literals of a C file, comments and character literals
    left out."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    token = re.compile(r"//[^\n]*|/\*.*?\*/|'(?:\\.|[^'\\])*'" + r'|"((?:\\.|[^"\\\n])*)"', re.S)
    return [m.group(1) for m in token.finditer(text) if m.group(1) is not None]


def scheme_errors(objdir):
    """Schemes and backend names spelled outside the scheme table and the
    backend's own folder."""
    with open(os.path.join(EXT, SCHEME_TABLE), encoding="utf-8") as f:
        lines = re.findall(r'\{\s*"([A-Za-z][A-Za-z0-9+.-]*://)",\s*&(\w+)\s*\}', f.read())
    if not lines:
        return [f"ext/{SCHEME_TABLE}: no scheme table lines ({{\"scheme://\", &ops}}) found"]
    owner = {}  # symbol -> folder that defines it
    for a, sym, b in _calls(objdir):
        owner[sym] = os.path.dirname(b)
    spelled = {}  # a string it must not be in, or equal to -> the folder it may be in
    for prefix, ops in lines:
        folder = owner.get(ops)
        if folder is None:
            return [f"ext/{SCHEME_TABLE}: {ops} is defined in no ext/ folder"]
        spelled[prefix] = folder
        for p in glob.glob(os.path.join(EXT, folder, "*.c")):
            for name in re.findall(r'\.name\s*=\s*"([^"]+)"', open(p, encoding="utf-8").read()):
                spelled[name] = folder
    bad = []
    for p in sorted(glob.glob(os.path.join(EXT, "*", "*.[ch]"))):
        rel = os.path.relpath(p, EXT)
        if rel == SCHEME_TABLE:
            continue
        for lit in _strings(p):
            for word, folder in spelled.items():
                hit = word in lit if word.endswith("://") else lit == word
                if hit and os.path.dirname(rel) != folder:
                    bad.append(f"ext/{rel} spells {word!r} (in \"{lit[:60]}\"): only "
                               f"ext/{SCHEME_TABLE} and ext/{folder}/ may; ask the store what "
                               f"a store can do (wh_store_caps, wh_store_backend_of)")
    return bad


def size_errors():
    """ext/ files longer than MAX_LINES, and LONG_OK entries no file needs."""
    bad, used = [], set()
    for p in sorted(glob.glob(os.path.join(EXT, "*", "*.[ch]"))):
        rel = os.path.relpath(p, EXT)
        with open(p, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES and rel in LONG_OK:
            used.add(rel)
        elif n > MAX_LINES:
            bad.append(f"ext/{rel} has {n} lines, more than {MAX_LINES}: split it by concern")
    for rel in sorted(set(LONG_OK) - used):
        bad.append(f"LONG_OK lets ext/{rel} be long, which it is no longer: drop the entry")
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
          + (f"{len(layers)} arrows up above" if layers else "every call and include runs down"))
    rules = scheme_errors(objdirs[0]) + size_errors()
    for line in rules:
        print(line, file=sys.stderr)
    print("check_layers: " + (f"{len(rules)} schemes or sizes out of place above" if rules else
                              f"schemes spelled only in ext/{SCHEME_TABLE} and their backends, "
                              f"no file over {MAX_LINES} lines"))
    bad = bool(layers) or bool(rules)
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
