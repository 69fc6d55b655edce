"""`make lint`: no module of wirehead_torch/ reaches into another's
underscored names. A module may use the names it defines itself (module
globals, its classes' methods and attributes, what it assigns on self);
anything else spelt `x._name` (or getattr/hasattr/setattr of "_name"), and
any `from .mod import _name` of a name that is not a module, fails, naming
the file, line and name. The extension (`_C`) and the package's private
modules (`_batch`, `_ring`, ...) are modules, not names in them; dunders are
Python's. Fails on every reach (ALLOW aside), and on ALLOW entries nothing
uses any more.

Usage: check_names.py
"""
import ast
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "wirehead_torch")

# Names of other projects that the package uses by design: (module, name, why).
ALLOW = [
    ("wirehead_torch/dataloader.py", "_shutdown_workers",
     "torch's DataLoader iterator ends its workers only through it"),
    ("wirehead_torch/config.py", "_getframe",
     "sys._getframe: a warning names the user's line, not the package's"),
    ("wirehead_torch/apps/jobs.py", "_exit",
     "os._exit: a rank leaves without interpreter teardown"),
    ("wirehead_torch/apps/demo.py", "_exit",
     "os._exit: a demo rank leaves without interpreter teardown"),
]
# Names public in spite of the underscore: namedtuple's documented methods.
PUBLIC = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) \
        and name not in PUBLIC


def _modules():
    """{dotted name: path} of the package's modules."""
    out = {}
    for p in glob.glob(os.path.join(PKG, "**", "*.py"), recursive=True):
        rel = os.path.relpath(p, ROOT)[:-3].replace(os.sep, ".")
        out[rel.removesuffix(".__init__")] = p
    for p in glob.glob(os.path.join(PKG, "*.so")):  # the extension
        out["wirehead_torch." + os.path.basename(p).split(".", 1)[0]] = p
    return out


def _own(tree):
    """The underscored names a module defines: its globals and local names,
    its classes' members (methods, class attributes, __slots__), and the
    attributes it assigns on self or cls (an assignment on another object
    is a reach like a read)."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            own.add(node.attr)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            own.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            own.update(e.value for e in ast.walk(node.value)
                       if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return {n for n in own if _private(n)}


def reaches(mods=None):
    """[(path, line, name, how)] of every reach into another's private name."""
    mods = mods or _modules()
    out = []
    for m, path in sorted(mods.items()):
        if not path.endswith(".py"):
            continue
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        own = _own(tree)
        pkg = m if path.endswith("__init__.py") else m.rsplit(".", 1)[0]
        rel = os.path.relpath(path, ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                if not base.startswith("wirehead_torch"):
                    continue
                for a in node.names:
                    if _private(a.name) and f"{base}.{a.name}" not in mods:
                        out.append((rel, node.lineno, a.name, f"imported from {base}"))
            elif isinstance(node, ast.Attribute) and _private(node.attr) and \
                    node.attr not in own:
                out.append((rel, node.lineno, node.attr, "an attribute it does not define"))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("getattr", "hasattr", "setattr", "delattr") and \
                    len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and \
                    isinstance(node.args[1].value, str) and _private(node.args[1].value) and \
                    node.args[1].value not in own:
                out.append((rel, node.lineno, node.args[1].value,
                            f"{node.func.id}() of a name it does not define"))
    return out


def main():
    allow = {(a, b) for a, b, _ in ALLOW}
    used, bad = set(), []
    for path, line, name, how in reaches():
        if (path, name) in allow:
            used.add((path, name))
            continue
        bad.append(f"{path}:{line}: {name}: {how} (another module's private name: give it a "
                   f"public one, or ask through a named method)")
    for a, b, _ in ALLOW:
        if (a, b) not in used:
            bad.append(f"ALLOW lets {a} use {b}, which it no longer does: drop the entry")
    for line in bad:
        print(line, file=sys.stderr)
    n = sum(p.endswith(".py") for p in _modules().values())
    print(f"check_names: {n} wirehead_torch modules, "
          + (f"{len(bad)} reaches into another's private names above" if bad
             else f"none reaches into another's private names ({len(ALLOW)} in ALLOW)"))
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
