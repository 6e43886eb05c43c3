#!/bin/sh
# Runs Node.js test files with node's own test runner, after
# tools/node-deps.sh has installed what they need:
#   tests/node/run.sh BUILD "debian-packages" test.mjs ...
# Where this machine cannot have those tools, prints one SKIPPED line saying
# why and exits 0 (make web-test / ops-test on a machine without them).
set -u
build=$1 debs=$2
shift 2
out=$(sh tools/node-deps.sh "$build" $debs)
rc=$?
case $rc in
    0) [ -n "$out" ] && echo "$out" ;;
    3) echo "SKIPPED $*: $(echo "$out" | tail -1)"; exit 0 ;;
    *) echo "$out"; exit $rc ;;
esac
ATTND_BIN="$build/attnd" ATTND_NODE_DIR="$build/node" exec node --test "$@"
