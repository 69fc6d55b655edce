# The C extension: flags come from pkg-config so one build serves any
# Debian-like system with libmongoc, libbson and libxxhash installed.
import glob
import os
import shlex
import subprocess

from setuptools import Extension, setup


def pkg(flag):
    out = subprocess.run(["pkg-config", flag, "libmongoc-1.0", "libbson-1.0", "libxxhash"],
                         check=True, capture_output=True, text=True).stdout
    return shlex.split(out)


extra_compile = ["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O2", "-fvisibility=hidden"]
extra_link = []
if os.environ.get("WH_SANITIZE"):
    extra_compile += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1"]
    extra_link += ["-fsanitize=address,undefined"]

setup(
    ext_modules=[
        Extension(
            "wirehead_torch._C",
            sources=sorted(glob.glob("ext/*.c")),
            depends=sorted(glob.glob("ext/*.h")),
            extra_compile_args=pkg("--cflags") + extra_compile,
            extra_link_args=pkg("--libs") + ["-ldl", "-lpthread", "-lrt"] + extra_link,
        )
    ]
)
