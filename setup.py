# The C extension: flags come from pkg-config so one build serves any
# Linux system with libmongoc, libbson, libxxhash and the DLPack header
# installed; what is missing is named with the package that provides it.
import glob
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup

# (pkg-config names, newest first; what provides it on Debian/Ubuntu; on RHEL/Fedora)
_LIBS = [
    (("mongoc2", "libmongoc-1.0"), "libmongoc-dev", "mongo-c-driver-devel"),
    (("bson2", "libbson-1.0"), "libbson-dev", "libbson-devel"),
    (("libxxhash",), "libxxhash-dev", "xxhash-devel"),
]


def _fail(msg):
    sys.stderr.write(f"\nwirehead_torch: cannot build the C extension: {msg}\n\n")
    raise SystemExit(1)


def _pkg_modules():
    if shutil.which("pkg-config") is None:
        _fail("pkg-config is not installed (Debian/Ubuntu: apt-get install pkg-config; "
              "RHEL/Fedora: dnf install pkgconf-pkg-config), or install the prebuilt wheel")
    found, missing = [], []
    for names, deb, rpm in _LIBS:
        hit = next((n for n in names if subprocess.run(
            ["pkg-config", "--exists", n], capture_output=True).returncode == 0), None)
        if hit is None:
            missing.append((names, deb, rpm))
        else:
            found.append(hit)
    if missing:
        what = "; ".join(f"{' or '.join(n)}" for n, _, _ in missing)
        _fail(f"pkg-config finds no {what}.\n"
              f"  Debian/Ubuntu: apt-get install {' '.join(d for _, d, _ in missing)}\n"
              f"  RHEL/Fedora:   dnf install {' '.join(r for _, _, r in missing)}\n"
              f"  (or set PKG_CONFIG_PATH to where their .pc files are)")
    return found


def _check_dlpack(cflags):
    cc = os.environ.get("CC", "cc").split()
    probe = subprocess.run([*cc, *cflags, "-E", "-x", "c", "-"],
                           input="#include <dlpack/dlpack.h>\n",
                           capture_output=True, text=True)
    if probe.returncode != 0:
        _fail("the header dlpack/dlpack.h is missing.\n"
              "  Debian/Ubuntu: apt-get install libdlpack-dev\n"
              "  elsewhere: put dlpack.h (DLPack 0.6 or newer) under <include>/dlpack/ "
              "and set CPATH")


def _pkg(flag, modules):
    out = subprocess.run(["pkg-config", flag, *modules], check=True, capture_output=True,
                         text=True).stdout
    return shlex.split(out)


modules = _pkg_modules()
_check_dlpack(_pkg("--cflags", modules))
extra_compile = ["-std=gnu11", "-Wall", "-Wextra", "-O2", "-fvisibility=hidden"]
# -Werror only for the project's own builds (make, CI): a newer compiler or
# libmongoc deprecation on a user's machine must not break pip install.
if os.environ.get("WH_WERROR") == "1":
    extra_compile.append("-Werror")
# The fault-injection points (ext/core/wh_fault.h) only in the project's test
# builds (make exports WH_FAULTS=1); a user's install and the wheel lack them.
if os.environ.get("WH_FAULTS") == "1":
    extra_compile.append("-DWH_FAULTS")
extra_link = []
if os.environ.get("WH_SANITIZE"):
    extra_compile += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1"]
    extra_link += ["-fsanitize=address,undefined"]

setup(
    ext_modules=[
        Extension(
            "wirehead_torch._C",
            # one folder per layer (ext/*/README.md); files include each other by name
            sources=sorted(glob.glob("ext/*/*.c")),
            depends=sorted(glob.glob("ext/*/*.h")),
            include_dirs=sorted(glob.glob("ext/*/")),
            extra_compile_args=_pkg("--cflags", modules) + extra_compile,
            extra_link_args=_pkg("--libs", modules) + ["-ldl", "-lpthread", "-lrt"] + extra_link,
        )
    ]
)
