#!/bin/sh
# Copies mongo-java-server (in-memory backend) and its runtime dependencies
# into <repo>/.deps/mongo-java-server/ for the test server. Idempotent: does
# nothing when the jars for the pinned version are already there.
# Usage: tests/mongo/fetch.sh [DEST]
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
dest=${1:-"$repo/.deps/mongo-java-server"}
version=$(sed -n 's:.*<mongo-java-server.version>\(.*\)</mongo-java-server.version>.*:\1:p' "$here/pom.xml")
stamp="$dest/.fetched-$version-$(cksum < "$here/pom.xml" | cut -d" " -f1)"

if [ -f "$stamp" ] && ls "$dest"/mongo-java-server-memory-backend-"$version".jar >/dev/null 2>&1; then
    exit 0
fi

command -v mvn >/dev/null 2>&1 || { echo "fetch.sh: mvn (Maven) not found" >&2; exit 1; }
command -v java >/dev/null 2>&1 || { echo "fetch.sh: java not found" >&2; exit 1; }

tmp="$dest.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT INT TERM
# Maven's output is shown only when it fails.
if ! mvn -q -B -Dstyle.color=never -f "$here/pom.xml" dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$tmp" >"$tmp/mvn.log" 2>&1; then
    cat "$tmp/mvn.log" >&2
    echo "fetch.sh: Maven could not fetch mongo-java-server $version" >&2
    exit 1
fi
rm -f "$tmp/mvn.log"
touch "$tmp/$(basename "$stamp")"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp" "$dest"
trap - EXIT INT TERM
echo "fetch.sh: mongo-java-server $version in $dest"
