#!/bin/sh
# Memory as a budget, against live attnd servers (ATTND_BIN), by
# tests/memory_check.py: requests whose memory is not in their FLOPs
# (multi-head projections with d_model = 1, a narrow key tail with a huge
# d_k, the head mean of many heads) refused before allocating (422
# memory_limit) or served without the memory they used to take; the sum
# over requests computing bounded by --max-memory (503); bodies growing as
# they arrive and bounded together by --max-body-memory (503).
set -u
bin=${ATTND_BIN:-build/attnd}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
pids=""
trap 'for p in $pids; do kill $p 2>/dev/null; done; rm -rf "$tmp"' EXIT
fail=0

# start NAME ARGS...: attnd on a free port; sets url and pid.
start() {
    name=$1
    shift
    "$bin" --bind 127.0.0.1 --port 0 "$@" 2>"$tmp/$name.log" &
    pid=$!
    pids="$pids $pid"
    port=
    for _ in $(seq 200); do
        port=$(sed -n 's/.*listening on [^ ]*:\([0-9][0-9]*\).*/\1/p' "$tmp/$name.log" | head -1)
        [ -n "$port" ] && break
        sleep 0.05
    done
    [ -n "$port" ] || { cat "$tmp/$name.log"; echo "FAILED attnd ($name) did not start"; exit 1; }
    url=http://127.0.0.1:$port
}

start defaults --threads 2
python3 "$here/memory_check.py" checks "$url" "$pid" || fail=1
start budget --threads 2 --max-request-memory 64MiB --max-memory 16MiB
python3 "$here/memory_check.py" budget "$url" || fail=1
start bodies --threads 2 --max-body-memory 1MiB
python3 "$here/memory_check.py" bodies "$url" || fail=1
for p in $pids; do
    kill -0 "$p" 2>/dev/null || { echo "FAILED an attnd died"; fail=1; }
done
exit $fail
