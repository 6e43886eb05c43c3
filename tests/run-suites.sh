#!/bin/sh
# Runs each test binary (or tests/test_*.sh script) given, with ATTND_BIN pointing at this build's server,
# and fails if any of them fails. Each libcheck suite prints its own
# "N%: Checks: N, Failures: N, Errors: N" line.
set -u
build=$1; shift
export ATTND_BIN="$build/attnd"
export ATTND_TESTDATA="${ATTND_TESTDATA:-$(pwd)/tests/data}"
status=0
for t in "$@"; do
    echo "== $t"
    case "$t" in
        *.sh) sh "$t" ;;
        *) "$t" ;;
    esac || { echo "FAILED: $t"; status=1; }
done
exit $status
