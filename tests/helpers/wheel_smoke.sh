#!/bin/sh
# tests/helpers/wheel_smoke.sh WHEEL: installs WHEEL into a fresh venv (no system
# site-packages, so no torch) and runs tests/helpers/wheel_smoke.py in a private mount
# namespace where the system's libmongoc, libbson and libxxhash are replaced
# by /dev/null, as on a machine without those packages. Needs root (unshare).
# Bounded: a hang fails after 300 s instead of holding CI.
set -eu
wheel=$1
here=$(cd "$(dirname "$0")" && pwd)
venv=build/wheel-smoke
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q "$wheel"
libdir=/usr/lib/$(gcc -print-multiarch)
# run from a folder outside the tree so the source package cannot be imported
mkdir -p build/wheel-smoke-run
cd build/wheel-smoke-run
exec unshare -m --propagation private sh -c '
  for lib in libmongoc-1.0.so.0 libbson-1.0.so.0 libxxhash.so.0; do
    [ -e "$1/$lib" ] && mount --bind /dev/null "$1/$lib"
  done
  exec timeout 300 "$2" "$3"' sh "$libdir" "$OLDPWD/$venv/bin/python" "$here/wheel_smoke.py"
