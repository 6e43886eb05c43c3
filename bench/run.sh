#!/bin/sh
# make bench: every figure, measured in one run, printed as one markdown
# table with the machine at the top (docs/benchmarks.md explains each row).
#
#   sh bench/run.sh [BUILD]        (make bench runs it with BUILD=build)
#
# It compiles its C programs into BUILD/bench/, then measures
#   1. the kernel: libattn's attention against the machine's limit (the best
#      OpenBLAS sgemm over the kernels the CPU runs, each in a child process,
#      and an FMA loop), the OpenBLAS and ATTN_KERNEL variants, causal,
#      backward, bfloat16 against float32, ragged batches (packed, and padded
#      with a mask) and multi-head, all taking turns in one run
#      (bench/kernel.c; with BENCH_ONLY=ragged and not kernel, only the ragged
#      batches' turns and the dense ones they are compared with); then
#      decoding over a KV cache against the memory's read bandwidth, and
#      1-token appends at 1k and 32k positions, taking turns (bench/decode.c)
#   2. the library's peak RSS growth at n=32768 (bench/memory.c)
#   3. attnd's peak RSS growth serving that request, base64 in and out;
#      attnd's compute time against in-process for the n=4096 forward and
#      the short batch, and its page faults per request (bench/server.py)
#   4. the tensor codec against jansson (bench/codec.c)
#   4b. the fixed cost of one attn_parallel_for call (bench/parallel.c)
#   5. HTTP under wrk: attnd against nginx (../shared/peers/nginx.conf) and the
#      FastAPI peer (../shared/peers/fastapi_attention.py); decode steps
#      through a KV cache (bench/decode_http.py), taking turns with a blunt
#      C responder of the same exchange (bench/decode_floor.c)
#   5b. the Open Inference Protocol: binary /v2 against base64 /v1 under wrk,
#      and the transport's share of a large binary request (Server-Timing)
# Everything it starts listens on 127.0.0.1 and is stopped on exit. Raw
# outputs stay in BUILD/bench/ (results.txt, wrk_*.txt) for a closer look.
# Exit status: 0 when every bar holds, 1 when one fails or is not measured.
#
# Environment: BENCH_PEERS (default ../shared/peers), BENCH_WRK_SECONDS (5),
# BENCH_ONLY (a subset of "kernel ragged decode memory server codec parallel http oip"; default all),
# BENCH_KERNEL_SECONDS (120: the kernel section's rounds, after its warm-up: about seven on 2 cores),
# BENCH_DECODE_SECONDS (60: the decode rows' rounds, about forty).
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${1:-build}
OUT=$BUILD/bench
PEERS=${BENCH_PEERS:-../shared/peers}
WRK_SECONDS=${BENCH_WRK_SECONDS:-5}
THREADS=2
RES=$OUT/results.txt
mkdir -p "$OUT"
: > "$RES"
TMP=$(mktemp -d /tmp/attnd-bench.XXXXXX)
# attnd runs on its defaults here, not on whatever ATTND_* the caller set.
for v in $(env | sed -n 's/^\(ATTND_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
PIDS=""

# Stops whatever we started (by pid), gently first.
stop_pid() {
    kill "$1" 2>/dev/null || return 0
    i=0
    while kill -0 "$1" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    kill -9 "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    PIDS=$(echo "$PIDS" | sed "s/ $1\\b//")
}
cleanup() {
    for p in $PIDS; do stop_pid "$p"; done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

want() {
    case " ${BENCH_ONLY:-kernel ragged decode memory server codec parallel http oip} " in *" $1 "*) return 0 ;; esac
    return 1
}
put() { echo "$1 $2" >> "$RES"; }
get() { awk -v k="$1" '$1 == k { sub(/^[^ ]+ /, ""); print; exit }' "$RES"; }
note() { echo "bench: $*" >&2; }
calc() { awk "BEGIN { printf \"$1\", ($2) }"; }
gt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 > b + 0) }'; }

free_port() {
    /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_http URL: until anything answers on it (at most ~15 s).
wait_http() {
    i=0
    while [ $i -lt 150 ]; do
        curl -s -o /dev/null --max-time 1 "$1" && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# post URL BODYFILE OUTFILE -> prints the HTTP status
post() {
    curl -s -o "$3" -w '%{http_code}' --max-time 300 \
        -H 'Content-Type: application/json' --data-binary @"$2" "$1"
}

vmhwm_kb() { awk '$1 == "VmHWM:" { print $2 }' "/proc/$1/status"; }

# ------------------------------------------------------------------ compile
CFLAGS="-std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -pthread -Ilib -Iapi"
PKG_CFLAGS=$(pkg-config --cflags openblas jansson)
PKG_LIBS="$(pkg-config --libs openblas jansson) -lm"
compile() { # name libs...
    name=$1; shift
    # shellcheck disable=SC2086
    if ! cc $CFLAGS $PKG_CFLAGS "bench/$name.c" "$@" $PKG_LIBS -o "$OUT/$name" 2> "$OUT/$name.cc.log"; then
        note "could not compile bench/$name.c (see $OUT/$name.cc.log)"
        return 1
    fi
}
have_kernel=0; have_decode=0; have_memory=0; have_codec=0; have_parallel=0; have_floor=0
[ -f "$BUILD/libattn.a" ] && compile kernel bench/peak.c "$BUILD/libattn.a" && have_kernel=1
[ -f "$BUILD/libattn.a" ] && compile decode "$BUILD/libattn.a" && have_decode=1
[ -f "$BUILD/libattn.a" ] && compile memory "$BUILD/libattn.a" && have_memory=1
[ -f "$BUILD/libcodec.a" ] && compile codec "$BUILD/libcodec.a" && have_codec=1
# The floor responder needs neither OpenBLAS nor jansson: only attnd's codec.
# shellcheck disable=SC2086
if [ ! -f "$BUILD/libcodec.a" ]; then
    note "no $BUILD/libcodec.a: bench/decode_floor.c not compiled"
elif cc $CFLAGS bench/decode_floor.c "$BUILD/libcodec.a" -lm -o "$OUT/decode_floor" \
        2> "$OUT/decode_floor.cc.log"; then
    have_floor=1
else
    note "could not compile bench/decode_floor.c (see $OUT/decode_floor.cc.log)"
fi
[ -f "$BUILD/libattn.a" ] && compile parallel "$BUILD/libattn.a" && have_parallel=1

# ------------------------------------------------------------------ machine
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
CPU=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
# A hypervisor may hide the model's name; OpenBLAS goes by family and model.
CPU="$CPU (family $(awk -F': ' '/^cpu family/ { print $2; exit }' /proc/cpuinfo), model $(awk -F': ' '/^model\t/ { print $2; exit }' /proc/cpuinfo))"
CORES=$(nproc)
# The instruction sets that matter here, as /proc/cpuinfo names them.
FLAGS=$(awk -F': ' '/^flags/ { print $2; exit }' /proc/cpuinfo | tr ' ' '\n' |
    grep -E '^(avx|avx2|fma|avx512f|avx512_bf16|amx_tile)$' | tr '\n' ' ' | sed 's/ $//')
if [ $have_kernel = 1 ]; then
    "$OUT/kernel" info > "$TMP/info" 2>/dev/null
    CORENAME=$(awk '$1 == "blas_corename" { print $2 }' "$TMP/info")
    BLASCONF=$(awk '$1 == "blas_config" { sub(/^[^ ]+ /, ""); print }' "$TMP/info")
    ATTNKERNEL=$(awk '$1 == "attn_kernel" { print $2 }' "$TMP/info")
    ATTNBF16=$(awk '$1 == "attn_bf16" { print $2 }' "$TMP/info")
else
    CORENAME="?"; BLASCONF="?"; ATTNKERNEL="?"; ATTNBF16="?"
fi

# ------------------------------------------------------------------ 1. kernel
# The ragged batches' turns are part of the kernel table; alone, they take
# turns with the dense forward and forward+backward only.
if [ $have_kernel = 1 ] && { want kernel || want ragged; }; then
    if want kernel; then
        note "kernel: attention, sgemm under each OpenBLAS kernel and FMA loops, taking turns"
        only=""
    else
        note "kernel: ragged batches and the dense turns they are compared with, taking turns"
        only=ragged
    fi
    # shellcheck disable=SC2086
    if "$OUT/kernel" table $THREADS "${BENCH_KERNEL_SECONDS:-120}" $only > "$TMP/kernel"; then
        while read -r k v; do put "kern_$k" "$v"; done < "$TMP/kernel"
        cp "$TMP/kernel" "$OUT/kernel.txt"
    fi
fi

# ------------------------------------------------------------------ 1b. decode
if [ $have_decode = 1 ] && want decode; then
    note "decode: over a KV cache against a STREAM-style sum, and appends, taking turns"
    if "$OUT/decode" $THREADS "${BENCH_DECODE_SECONDS:-60}" > "$TMP/decode"; then
        while read -r k v; do put "dec_$k" "$v"; done < "$TMP/decode"
        cp "$TMP/decode" "$OUT/decode.txt"
    fi
fi

# ------------------------------------------------------------------ 2. library memory
if [ $have_memory = 1 ] && want memory; then
    note "memory: forward+backward at n=32768, d=64"
    if "$OUT/memory" $THREADS 32768 64 > "$TMP/mem"; then
        while read -r k v; do put "mem_$k" "$v"; done < "$TMP/mem"
    fi
fi

# ------------------------------------------------------------------ bodies
if want server || want http || want oip; then
    note "bodies: generating request bodies"
    /usr/bin/python3 bench/bodies.py "$OUT" || note "could not generate the bodies"
fi

# ------------------------------------------------------------------ 3. attnd memory
ATTND=$BUILD/attnd
if [ -x "$ATTND" ] && [ -f "$OUT/big.json" ] && want server; then
    note "attnd memory: serving n=32768 base64 forward+backward"
    port=$(free_port)
    "$ATTND" --port "$port" --max-body 400000000 --max-work 1e13 --timeout 600 \
        > "$TMP/attnd-big.log" 2>&1 &
    pid=$!; PIDS="$PIDS $pid"
    if wait_http "http://127.0.0.1:$port/healthz"; then
        # One small request first, so the idle server's own peak is the baseline.
        post "http://127.0.0.1:$port/v1/attention" "$OUT/small.json" "$TMP/r" > /dev/null
        before=$(vmhwm_kb "$pid")
        t0=$(date +%s.%N)
        status=$(post "http://127.0.0.1:$port/v1/attention" "$OUT/big.json" "$TMP/big.out")
        t1=$(date +%s.%N)
        after=$(vmhwm_kb "$pid")
        put srv_seconds "$(calc %.1f "$t1 - $t0")"
        put srv_status "$status"
        # A 200 must carry the whole answer: output and the three gradients.
        if [ "$status" = 200 ] && ! /usr/bin/python3 -c '
import base64, json, sys
r = json.load(open(sys.argv[1]))
ts = [r["output"]] + [r["grad"][x] for x in "qkv"]
assert all(len(base64.b64decode(t["base64"])) == 32768 * 64 * 4 for t in ts)
' "$TMP/big.out" 2> "$TMP/check.err"; then
            note "attnd answer to the n=32768 request is incomplete: $(tail -1 "$TMP/check.err")"
            status="200 (incomplete answer)"
        fi
        if [ "$status" = 200 ]; then
            put srv_hwm_before_kb "$before"
            put srv_hwm_after_kb "$after"
            put srv_growth_kb $((after - before))
            put srv_body_in "$(wc -c < "$OUT/big.json")"
            put srv_body_out "$(wc -c < "$TMP/big.out")"
        else
            note "attnd answered $status: $(head -c 300 "$TMP/big.out")"
        fi
    else
        note "attnd did not start: $(tail -3 "$TMP/attnd-big.log")"
    fi
    stop_pid "$pid"
    rm -f "$TMP/big.out"
fi

# ------------------------------------------------------------------ 3b. attnd's compute
# The n=4096 forward and the short batch through a running attnd (its own
# meta.timing_ms.compute) against the same calls in-process (bench/kernel.c's
# child, its buffers warm), taking turns; and attnd's minor page faults per
# repeated n=4096 request (bench/server.py).
if [ -x "$ATTND" ] && [ $have_kernel = 1 ] && want server; then
    note "attnd compute: n=4096 and the short batch, server against in-process; page faults"
    port=$(free_port)
    "$ATTND" --port "$port" --threads $THREADS --max-body 400000000 --max-work 1e13 \
        --timeout 600 > "$TMP/attnd-compute.log" 2>&1 &
    pid=$!; PIDS="$PIDS $pid"
    if wait_http "http://127.0.0.1:$port/healthz"; then
        if /usr/bin/python3 bench/server.py "http://127.0.0.1:$port/v1/attention" "$pid" \
                "$OUT/kernel" $THREADS > "$TMP/server" 2> "$TMP/server.err"; then
            while read -r k v; do put "srvc_$k" "$v"; done < "$TMP/server"
        else
            note "bench/server.py failed: $(tail -1 "$TMP/server.err")"
        fi
    else
        note "attnd did not start: $(tail -3 "$TMP/attnd-compute.log")"
    fi
    stop_pid "$pid"
fi

# ------------------------------------------------------------------ 4. codec
if [ $have_codec = 1 ] && want codec; then
    note "codec: 1M floats against jansson"
    if "$OUT/codec" 1000000 > "$TMP/codec"; then
        while read -r k v; do put "codec_$k" "$v"; done < "$TMP/codec"
    fi
fi

# ------------------------------------------------------------------ 4b. parallel
if [ $have_parallel = 1 ] && want parallel; then
    note "parallel: the cost of an empty attn_parallel_for call"
    if "$OUT/parallel" $THREADS > "$TMP/parallel"; then
        while read -r k v; do put "par_$k" "$v"; done < "$TMP/parallel"
    fi
fi

# ------------------------------------------------------------------ 5. HTTP
# post_oip URL BODYFILE OUTFILE: an Open Inference Protocol body whose JSON
# text is $BENCH_JSON_LEN bytes -> prints the HTTP status
post_oip() {
    curl -s -o "$3" -w '%{http_code}' --max-time 300 -H 'Content-Type: application/octet-stream' \
        -H "Inference-Header-Content-Length: $BENCH_JSON_LEN" --data-binary @"$2" "$1"
}

# wrk_run NAME URL BODY [SCRIPT]: one wrk run (after a short warm-up); its
# req/s, p99 (ms) and failures go into the results when its req/s is the
# best so far for NAME, so that calling it again gives the better of the
# runs. SCRIPT (default bench/body.lua, JSON) bench/oip_body.lua sends an
# Open Inference Protocol body with BENCH_JSON_LEN.
wrk_run() {
    script=${4:-bench/body.lua}
    if [ "$script" = bench/oip_body.lua ]; then
        status=$(post_oip "$2" "$3" "$TMP/check")
    else
        status=$(post "$2" "$3" "$TMP/check")
    fi
    if [ "$status" != 200 ]; then
        note "$1: $2 answered $status: $(head -c 200 "$TMP/check")"
        put "${1}_status" "$status"
        return 1
    fi
    # The warm-up: connections, caches, lazily started workers.
    BENCH_BODY=$3 wrk -t1 -c16 -d1s -s "$script" "$2" > /dev/null 2>&1
    BENCH_BODY=$3 wrk -t1 -c16 -d"${WRK_SECONDS}s" --latency -s "$script" "$2" \
        > "$TMP/wrk.txt" 2>&1
    awk -v name="$1" '
        function ms(s) {
            if (s ~ /us$/) return substr(s, 1, length(s) - 2) / 1000
            if (s ~ /ms$/) return substr(s, 1, length(s) - 2) + 0
            if (s ~ /m$/) return substr(s, 1, length(s) - 1) * 60000
            if (s ~ /s$/) return substr(s, 1, length(s) - 1) * 1000
            return s
        }
        $1 == "Requests/sec:" { printf "%s_rps %s\n", name, $2 }
        $1 == "99%" { printf "%s_p99ms %.3f\n", name, ms($2) }
        /Non-2xx or 3xx responses:/ { printf "%s_non2xx %s\n", name, $NF }
        /Socket errors:/ { sub(/.*Socket errors: */, ""); printf "%s_sockerr %s\n", name, $0 }
    ' "$TMP/wrk.txt" > "$TMP/wrk.res"
    new=$(awk -v k="${1}_rps" '$1 == k { print $2 }' "$TMP/wrk.res")
    old=$(get "${1}_rps")
    if [ -n "$new" ] && { [ -z "$old" ] || gt "$new" "$old"; }; then
        sed -i "/^${1}_/d" "$RES"
        cat "$TMP/wrk.res" >> "$RES"
        cp "$TMP/wrk.txt" "$OUT/wrk_$1.txt"
    fi
}

# Every server stays up for the whole section and they take turns, three
# rounds, keeping each one's better run: a burst of other work on the machine
# then hits attnd and its peers alike. An idle server costs nothing.
ATTND_URL=""; NGINX_URL=""; FASTAPI1_URL=""; FASTAPI2_URL=""
if [ -x "$ATTND" ] && [ -f "$OUT/small.json" ] && want http; then
    port=$(free_port)
    "$ATTND" --port "$port" > /dev/null 2> "$TMP/attnd.log" &
    PIDS="$PIDS $!"
    if wait_http "http://127.0.0.1:$port/healthz"; then
        ATTND_URL="http://127.0.0.1:$port/v1/attention"
    else
        note "attnd did not start: $(tail -3 "$TMP/attnd.log")"
    fi
fi
if [ -f "$PEERS/nginx.conf" ] && command -v nginx > /dev/null && [ -f "$OUT/small.json" ] && want http; then
    port=$(free_port)
    sed -e "s#^pid .*#pid $TMP/nginx.pid;#" \
        -e "s#^error_log .*#error_log $TMP/nginx.err;#" \
        -e "s#listen 127.0.0.1:[0-9]*#listen 127.0.0.1:$port#" \
        "$PEERS/nginx.conf" > "$TMP/nginx.conf"
    nginx -e "$TMP/nginx.err" -c "$TMP/nginx.conf" -g 'daemon off;' > /dev/null 2>&1 &
    PIDS="$PIDS $!"
    if wait_http "http://127.0.0.1:$port/"; then
        NGINX_URL="http://127.0.0.1:$port/"
    else
        note "nginx did not start: $(tail -3 "$TMP/nginx.err" 2>/dev/null)"
    fi
fi
if [ -f "$PEERS/fastapi_attention.py" ] && [ -f "$OUT/medium.json" ] && want http &&
    /usr/bin/python3 -c 'import fastapi, uvicorn, numpy' 2> /dev/null; then
    for w in 1 2; do
        port=$(free_port)
        (cd "$PEERS" && exec /usr/bin/python3 -m uvicorn fastapi_attention:app \
            --host 127.0.0.1 --port "$port" --workers $w) > /dev/null 2> "$TMP/uvicorn$w.log" &
        PIDS="$PIDS $!"
        # Each worker says so when it is ready; wait for all of them.
        i=0
        while [ "$(grep -c 'Application startup complete' "$TMP/uvicorn$w.log")" -lt $w ] && [ $i -lt 150 ]; do
            sleep 0.1; i=$((i + 1))
        done
        if wait_http "http://127.0.0.1:$port/docs"; then
            eval "FASTAPI${w}_URL=http://127.0.0.1:$port/v1/attention"
        else
            note "FastAPI ($w workers) did not start: $(tail -3 "$TMP/uvicorn$w.log")"
        fi
    done
fi
# turn NAME URL BODY: one wrk run when the server is up.
turn() {
    [ -n "$2" ] || return 0
    note "http: $1 ($round)"
    wrk_run "$1" "$2" "$3"
}
for round in 1 2 3; do
    turn attnd_small "$ATTND_URL" "$OUT/small.json"
    turn nginx_small "$NGINX_URL" "$OUT/small.json"
    turn attnd_medium "$ATTND_URL" "$OUT/medium.json"
    turn fastapi1_medium "$FASTAPI1_URL" "$OUT/medium.json"
    turn fastapi2_medium "$FASTAPI2_URL" "$OUT/medium.json"
done
# Decoding over HTTP through a KV cache (bench/decode_http.py): a step's
# round trip beyond its server-side compute, and a step through a cache
# against re-sending K and V each time.
if [ -n "$ATTND_URL" ] && /usr/bin/python3 -c 'import numpy' 2> /dev/null; then
    note "http: decode steps through a KV cache"
    floor=""
    [ "$have_floor" = 1 ] && floor="$OUT/decode_floor"
    # shellcheck disable=SC2086
    if /usr/bin/python3 bench/decode_http.py "${ATTND_URL%/v1/attention}" 100 $floor > "$TMP/dechttp" 2> "$TMP/dechttp.err"; then
        cat "$TMP/dechttp" >> "$RES"
        cp "$TMP/dechttp" "$OUT/decode_http.txt"
    else
        note "bench/decode_http.py: $(tail -2 "$TMP/dechttp.err")"
    fi
fi
round=1
turn fastapi1_small "$FASTAPI1_URL" "$OUT/small.json"
turn fastapi2_small "$FASTAPI2_URL" "$OUT/small.json"
for p in $PIDS; do stop_pid "$p"; done

# ------------------------------------------------------------------ 5b. /v2
# The same numbers (q, k, v [8, 512, 64], forward) as base64 on /v1 and as
# binary tensors on /v2, both ways, to one attnd, taking turns for five
# rounds; then an [8, 4096, 64] request as binary /v2, three times, the
# transport's share of it (decode + encode over total) from its
# Server-Timing, the smallest of the three.
if [ -x "$ATTND" ] && [ -f "$OUT/oip_h8_n512.bin" ] && want oip; then
    port=$(free_port)
    "$ATTND" --port "$port" > /dev/null 2> "$TMP/attnd-oip.log" &
    oip_pid=$!
    PIDS="$PIDS $oip_pid"
    if wait_http "http://127.0.0.1:$port/healthz"; then
        base="http://127.0.0.1:$port"
        # The ratio of each round's pair (the two runs back to back), and
        # their median: a burst of other work on the machine then spoils
        # one pair, not the figure.
        # the last run's req/s, when every answer of it was a 2xx
        last_rps() {
            grep -q "^${1}_non2xx" "$TMP/wrk.res" ||
                awk -v k="${1}_rps" '$1 == k { print $2 }' "$TMP/wrk.res"
        }
        pairs=""
        for round in 1 2 3 4 5; do
            note "oip: /v1 base64 H=8 n=512 ($round)"
            : > "$TMP/wrk.res"
            wrk_run v1_b64_h8_n512 "$base/v1/attention" "$OUT/b64_h8_n512.json"
            a=$(last_rps v1_b64_h8_n512)
            note "oip: /v2 binary H=8 n=512 ($round)"
            : > "$TMP/wrk.res"
            BENCH_JSON_LEN=$(cat "$OUT/oip_h8_n512.len") wrk_run v2_bin_h8_n512 \
                "$base/v2/models/attention/infer" "$OUT/oip_h8_n512.bin" bench/oip_body.lua
            b=$(last_rps v2_bin_h8_n512)
            [ -n "$a" ] && [ -n "$b" ] && pairs="$pairs $(calc %.2f "$b / $a")"
        done
        if [ -n "$pairs" ]; then
            put oip_pairs "$pairs"
            put oip_ratio "$(echo $pairs | tr ' ' '\n' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')"
        fi
        export BENCH_JSON_LEN
        BENCH_JSON_LEN=$(cat "$OUT/oip_h8_n4096.len")
        for i in 1 2 3; do
            note "oip: /v2 binary H=8 n=4096 ($i)"
            status=$(curl -s -o /dev/null -D "$TMP/oip.h" -w '%{http_code}' --max-time 600 \
                -H 'Content-Type: application/octet-stream' \
                -H "Inference-Header-Content-Length: $BENCH_JSON_LEN" \
                --data-binary @"$OUT/oip_h8_n4096.bin" "$base/v2/models/attention/infer")
            [ "$status" = 200 ] || { note "oip: n=4096 answered $status"; put oip_n4096_status "$status"; continue; }
            timing=$(tr -d '\r' < "$TMP/oip.h" | sed -n 's/^[Ss]erver-[Tt]iming: //p')
            share=$(echo "$timing" | awk -F', ' '{
                for (i = 1; i <= NF; i++) { split($i, kv, ";dur="); t[kv[1]] = kv[2] }
                if (t["total"] > 0) printf "%.4f %s %s %s %s\n", (t["decode"] + t["encode"]) / t["total"], t["decode"], t["encode"], t["compute"], t["total"] }')
            old=$(get oip_n4096_share)
            if [ -n "$share" ] && { [ -z "$old" ] || gt "$old" "${share%% *}"; }; then
                sed -i '/^oip_n4096_/d' "$RES"
                set -- $share
                put oip_n4096_share "$1"; put oip_n4096_decode_ms "$2"; put oip_n4096_encode_ms "$3"
                put oip_n4096_compute_ms "$4"; put oip_n4096_total_ms "$5"
            fi
        done
        unset BENCH_JSON_LEN
    else
        note "attnd did not start: $(tail -3 "$TMP/attnd-oip.log")"
    fi
    stop_pid "$oip_pid"
fi

# ------------------------------------------------------------------ table
FAILS=0
# row LABEL VALUE DETAIL [OP BAR [AIM]]: one table line of SECTION. An empty
# VALUE is "not measured", which counts as a failure only for a row with a
# bar, unless BENCH_ONLY left the section out.
SECTION=kernel
row() {
    label=$1; value=$2; detail=$3; op=${4:-}; bar=${5:-}; aim=${6:-}
    if [ -z "$value" ] && ! want "$SECTION"; then
        result="not run (BENCH_ONLY)"
        value="n/a"
    elif [ -z "$value" ]; then
        result="not measured"
        [ -n "$op" ] && FAILS=$((FAILS + 1))
        value="n/a"
    elif [ -z "$op" ]; then
        result="info"
    else
        result=$(awk -v v="$value" -v b="$bar" -v op="$op" 'BEGIN {
            v += 0; b += 0
            print ((op == ">=" && v >= b) || (op == "<=" && v <= b)) ? "PASS" : "FAIL" }')
        [ "$result" = FAIL ] && FAILS=$((FAILS + 1))
    fi
    printf '| %s | %s | %s | %s | %s |\n' "$label" "$value" "$detail" \
        "${op:+$op $bar}${aim:+ (aim $aim)}" "$result"
}
# ratio A B FORMAT: A/B when both are present, else nothing.
ratio() { [ -n "$1" ] && [ -n "$2" ] && calc "$3" "$1 / $2"; }
# scaled X DIVISOR FORMAT: X/DIVISOR, or "?" when X is missing.
scaled() { if [ -n "$1" ]; then calc "$3" "$1 / $2"; else echo "?"; fi; }

# ---- the machine's limit: the best sgemm over the OpenBLAS kernels measured
BLAS_LABELS="unset SkylakeX Cooperlake Haswell Prescott"
best=""; best_label=""
for l in $BLAS_LABELS; do
    v=$(get "kern_sgemm_${l}_gflops")
    [ -n "$v" ] && { [ -z "$best" ] || gt "$v" "$best"; } && { best=$v; best_label=$l; }
done
# blas_name LABEL: "SkylakeX", or "unset (Prescott)" for the environment's default.
blas_name() {
    c=$(get "kern_blas_${1}_core" | cut -d' ' -f1)
    if [ "$1" = unset ]; then echo "unset ($c)"; else echo "$1"; fi
}
blas_detail() {
    out=""
    for l in $BLAS_LABELS; do
        [ -n "$(get "kern_blas_${l}_core")$(get "kern_blas_${l}_dead")" ] || continue
        dead=$(get "kern_blas_${l}_dead"); same=$(get "kern_blas_${l}_same")
        v=$(get "kern_sgemm_${l}_gflops"); f=$(get "kern_sgemm_${l}_failed")
        if [ -n "$dead" ]; then item="$l: $dead, not counted"
        elif [ -n "$same" ]; then item="$l: the same core as unset"
        elif [ -n "$v" ]; then item="$(blas_name "$l") $v"
        else item="$l: ${f:-not measured}, not counted"; fi
        out="${out:+$out; }$item"
    done
    echo "$out"
}
peak=""; peak_isa=""
for i in avx512 avx2; do
    v=$(get "kern_peak_${i}_gflops")
    [ -n "$v" ] && { [ -z "$peak" ] || gt "$v" "$peak"; } && { peak=$v; peak_isa=$i; }
done
# vs_limit GFLOPS: "123.4 / 290.1 GFLOP/s (the FMA loop's 0.38)"
vs_limit() {
    echo "${1:-?} / ${best:-?} GFLOP/s$([ -n "$1" ] && [ -n "$peak" ] && echo " ($(calc %.2f "$1 / $peak") of the FMA loop)")"
}

echo
echo "attnd benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo
if [ "${OPENBLAS_CORETYPE+set}" = set ]; then coretype="OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"; else coretype="OPENBLAS_CORETYPE unset"; fi
echo "Machine: $CPU, $CORES cores ($FLAGS); OpenBLAS runs its $CORENAME kernels in this environment ($coretype; $BLASCONF); libattn kernel $ATTNKERNEL, bfloat16 products $ATTNBF16"
echo "Load average (1 min) at the start: $LOAD_START, at the end: $(cut -d' ' -f1 /proc/loadavg) (other work on the machine makes every figure noisier)"
# Under load OpenBLAS's threaded sgemm loses more than libattn (its threads
# wait for each other at every block, spinning), which flatters the kernel rows.
gt "$LOAD_START" 1.0 && echo "**The machine was busy when the run started: the ratios against the machine's limit read high; compare runs made on a quiet machine.**"
echo
echo "| measurement | value | absolute figures | bar | result |"
echo "| --- | --- | --- | --- | --- |"
sz="B=1, H=8, n=4096"
row "machine's limit: best OpenBLAS sgemm GFLOP/s (square 2560³, $THREADS threads, each kernel the CPU runs in a child process)" \
    "$best" "best: $([ -n "$best_label" ] && blas_name "$best_label"); each: $(blas_detail)"
row "machine's limit: FMA loop GFLOP/s ($THREADS threads)" "$peak" \
    "$(for i in avx512 avx2; do v=$(get "kern_peak_${i}_gflops"); [ -n "$v" ] && printf '%s %s; ' "$i" "$v"; done)best sgemm / FMA loop: $(ratio "$best" "$peak" %.2f)"
row "attention forward / machine's limit, $sz, d=64 ($THREADS threads)" \
    "$(ratio "$(get kern_fwd_gflops)" "$best" %.2f)" "$(vs_limit "$(get kern_fwd_gflops)")" ">=" 0.6 0.8
row "attention forward / machine's limit, $sz, d=128" \
    "$(ratio "$(get kern_fwd_d128_gflops)" "$best" %.2f)" "$(vs_limit "$(get kern_fwd_d128_gflops)")" ">=" 0.6 0.8
row "short sequences: forward / machine's limit, B=64, H=8, n=64, d=64" \
    "$(ratio "$(get kern_fwd_batch_gflops)" "$best" %.2f)" "$(vs_limit "$(get kern_fwd_batch_gflops)")" ">=" 0.35 0.6
# Both in children started alike, taking turns one after the other (a
# child against this process compared two processes' noise as well).
p=$(get kern_fwd_prescott_gflops); f=$(get kern_fwd_gflops); e=$(get kern_fwd_env_gflops)
row "forward with OpenBLAS forced to Prescott / forward in this environment, $sz, d=64" \
    "$(ratio "$p" "$e" %.2f)" \
    "${p:-$(get kern_fwd_prescott_failed)} GFLOP/s (child, OPENBLAS_CORETYPE=Prescott) / ${e:-$(get kern_fwd_env_failed)} GFLOP/s (child, this environment: $CORENAME; in this process ${f:-?})" ">=" 0.9 1.0
w=$(get kern_fwd_blas_wide_gflops); wl=$(get kern_fwd_blas_wide_core)
[ -n "$wl" ] && row "forward with OpenBLAS's $wl kernels / forward in this environment" \
    "$(ratio "$w" "$f" %.2f)" "${w:-$(get kern_fwd_blas_wide_failed)} GFLOP/s (child, OPENBLAS_CORETYPE=$wl) / ${f:-?} GFLOP/s"
for k in generic avx2 avx512; do
    h=$(get "kern_fwd_kernel_${k}_heads")
    label="forward with ATTN_KERNEL=$k / machine's limit, B=1, H=${h:-8}, n=4096, d=64"
    if want kernel && [ -n "$(get kern_threads)" ] && [ -z "$(get "kern_kernel_${k}_core")$(get "kern_kernel_${k}_dead")" ]; then
        printf '| %s | n/a | not run: the CPU lacks it | | info |\n' "$label"
        continue
    fi
    v=$(get "kern_fwd_kernel_${k}_gflops")
    row "$label" "$(ratio "$v" "$best" %.2f)" \
        "$(if [ -n "$v" ]; then vs_limit "$v"; else echo "child: $(get "kern_kernel_${k}_dead")$(get "kern_fwd_kernel_${k}_failed")"; fi)"
done
full=$(get kern_fwd_s); causal=$(get kern_causal_s); fb=$(get kern_fwdbwd_s)
row "causal time / full time, $sz, d=64" "$(ratio "$causal" "$full" %.2f)" \
    "$(scaled "$causal" 0.001 %.1f) ms / $(scaled "$full" 0.001 %.1f) ms" "<=" 0.55 0.5
row "(forward+backward) time / forward time, $sz, d=64" "$(ratio "$fb" "$full" %.2f)" \
    "$(scaled "$fb" 0.001 %.1f) ms / $(scaled "$full" 0.001 %.1f) ms" "<=" 3.5 3.0
# bfloat16 against float32, each ratio of the best times of the rounds, and
# its spread: the ratio within each round (the two measured seconds apart).
bp=$(get kern_bf16)
spread() {
    [ -n "$(get "kern_$1_median")" ] &&
        echo "; per round $(get "kern_$1_min") / $(get "kern_$1_median") / $(get "kern_$1_max") (min / median / max of $(get "kern_$1_rounds") rounds)"
}
b=$(get kern_fwd_bf16_gflops)
row "bfloat16 forward / float32 forward, $sz, d=64 (bf16 path: ${bp:-?})" \
    "$(ratio "$(get kern_fwd_s)" "$(get kern_fwd_bf16_s)" %.2f)" \
    "${b:-?} / $(get kern_fwd_gflops) GFLOP/s$(spread bf16_fwd)" ">=" 1.5 1.8
row "bfloat16 forward / machine's limit, $sz, d=64" "$(ratio "$b" "$best" %.2f)" "$(vs_limit "$b")"
b=$(get kern_fwd_bf16_d128_gflops)
row "bfloat16 forward / float32 forward, $sz, d=128" \
    "$(ratio "$(get kern_fwd_d128_s)" "$(get kern_fwd_bf16_d128_s)" %.2f)" \
    "${b:-?} / $(get kern_fwd_d128_gflops) GFLOP/s$(spread bf16_fwd_d128)" ">=" 1.5 1.8
row "bfloat16 forward / machine's limit, $sz, d=128" "$(ratio "$b" "$best" %.2f)" "$(vs_limit "$b")"
fb16=$(get kern_fwdbwd_bf16_s)
row "bfloat16 (forward+backward) / float32 (forward+backward), $sz, d=64" \
    "$(ratio "$fb" "$fb16" %.2f)" \
    "$(scaled "$fb16" 0.001 %.1f) ms / $(scaled "$fb" 0.001 %.1f) ms$(spread bf16_fwdbwd)" ">=" 1.3
if [ -n "$(get kern_kernel_bf16_emulated_core)" ]; then
    e=$(get kern_fwd_bf16_emulated_gflops)
    row "bfloat16 forward emulated (ATTN_BF16=emulated, as without AVX512_BF16) / float32 forward, children, $sz, d=64" \
        "$(ratio "$(get kern_fwd_env_f32_s)" "$(get kern_fwd_bf16_emulated_s)" %.2f)" \
        "${e:-?} / $(get kern_fwd_env_f32_gflops) GFLOP/s$(spread bf16_emulated_fwd)"
fi
mf=$(get kern_mha_fwd_s); mfb=$(get kern_mha_fwdbwd_s)
row "multi-head (B=8, n=512, d_model=512, H=8, causal, W_O): (forward+backward) / forward" \
    "$(ratio "$mfb" "$mf" %.2f)" \
    "$(scaled "$mfb" 0.001 %.1f) ms / $(scaled "$mf" 0.001 %.1f) ms (forward $(get kern_mha_fwd_gflops) GFLOP/s)" "<=" 4.0 3.3

# ---- ragged batches: the pairs that exist, against the dense n=4096 rows
SECTION=ragged
# spread NAME SCALE: " (per round min / median / max: a / b / c)" of
# kernel.c's per-round ratio NAME, times SCALE.
spread() {
    [ -n "$(get "kern_$1_rounds")" ] || return 0
    printf '; per round (%s rounds) min / median / max: %s / %s / %s' "$(get "kern_$1_rounds")" \
        "$(calc %.2f "$(get "kern_$1_min") * $2")" "$(calc %.2f "$(get "kern_$1_median") * $2")" \
        "$(calc %.2f "$(get "kern_$1_max") * $2")"
}
# flops_of KEY: the FLOPs of one run of a turn (GFLOP/s times seconds).
flops_of() { [ -n "$(get "kern_$1_gflops")" ] && calc %.6g "$(get "kern_$1_gflops") * $(get "kern_$1_s")"; }
rb=$(get kern_batch_log48); sb=$(get kern_batch_short2000)
rlabel="48 sequences of 16..2048 ($(echo "$rb" | awk '{print $3}') rows), H=8, d=64"
for m in fwd fwdbwd; do
    what=$([ $m = fwd ] && echo forward || echo "forward+backward")
    bar=$([ $m = fwd ] && echo 0.8 || echo 0.75); aim=$([ $m = fwd ] && echo 0.9 || echo "")
    r=$(get "kern_ragged_${m}_gflops"); d=$(get "kern_${m}_gflops")
    fr=$(flops_of "ragged_$m"); fd=$(flops_of "$m")
    row "ragged batch, $rlabel: $what GFLOP/s on the pairs that exist / dense $what, $sz" \
        "$(ratio "$r" "$d" %.2f)" \
        "${r:-?} / ${d:-?} GFLOP/s$([ -n "$fr" ] && [ -n "$fd" ] && spread "ragged_vs_dense_$m" "$fr / $fd")" \
        ">=" "$bar" $aim
    pt=$(get "kern_padded_${m}_s"); rt=$(get "kern_ragged_${m}_s")
    row "ragged batch, $rlabel: $what, padded to the longest with a [B, 1, 1, n] key-padding mask: time / packed time" \
        "$(ratio "$pt" "$rt" %.1f)" \
        "$(scaled "$pt" 0.001 %.1f) ms / $(scaled "$rt" 0.001 %.1f) ms$(spread "padded_vs_ragged_$m" 1)" ">=" 4
done
r=$(get kern_ragged_short_fwd_gflops); d=$(get kern_fwd_gflops)
fr=$(flops_of ragged_short_fwd); fd=$(flops_of fwd)
row "ragged batch, 2000 sequences of 1..16 ($(echo "$sb" | awk '{print $3}') rows), H=8, d=64: forward GFLOP/s on the pairs that exist / dense forward, $sz" \
    "$(ratio "$r" "$d" %.2f)" \
    "${r:-?} / ${d:-?} GFLOP/s$([ -n "$fr" ] && [ -n "$fd" ] && spread short_vs_dense_fwd "$fr / $fd")" ">=" 0.3
# The same batch against the memory: its q, k, v read and its output
# written once, and nothing computed (a few FLOPs a byte: what bounds it).
st=$(get kern_ragged_short_fwd_s); ss=$(get kern_stream_short_s)
row "ragged batch, 2000 sequences of 1..16: forward time / one pass reading its q, k, v and writing its output (out = q + k v, the memory's floor), $THREADS threads" \
    "$(ratio "$st" "$ss" %.2f)" \
    "$(scaled "$st" 0.001 %.1f) ms / $(scaled "$ss" 0.001 %.1f) ms$(spread short_vs_stream 1)"
# Nearly all the work in one sequence: at half the dense rate or less, one
# thread would be doing it while the other waits.
r=$(get kern_ragged_mixed_fwd_gflops)
fr=$(flops_of ragged_mixed_fwd)
row "ragged batch, one sequence of 4096 and 500 of 1..32 (the long one first), H=8, d=64: forward GFLOP/s on the pairs that exist / dense forward, $sz ($THREADS threads)" \
    "$(ratio "$r" "$d" %.2f)" \
    "${r:-?} / ${d:-?} GFLOP/s$([ -n "$fr" ] && [ -n "$fd" ] && spread mixed_vs_dense_fwd "$fr / $fd")" ">=" 0.8
SECTION=decode
# decode_row DTYPE: the decode step's bytes per second over the sum's.
decode_row() {
    row "decode step over a KV cache, $1 pages: K and V bytes read per second / a STREAM-style sum's, H_q=32, H_kv=8, d=128, 32768 positions, 1 query row ($THREADS threads)" \
        "$(get "dec_ratio_$2")" \
        "decode $(get "dec_decode_$2_gbs") GB/s, sum $(get dec_stream_gbs) GB/s (medians of $(get dec_rounds) rounds taking turns); ratio per round $(get "dec_ratio_$2_min") to $(get "dec_ratio_$2_max"), per CPU second $(get "dec_ratio_$2_cpu")" \
        ">=" 0.7 0.85
}
decode_row bfloat16 bf16
decode_row float32 f32
row "1-token append to a float32 cache of 32768 positions / of 1024 (time)" "$(get dec_ratio_append)" \
    "$(get dec_append_32k_us) us / $(get dec_append_1k_us) us (medians of 64 appends in a row, a page's allocation included); ratio per round $(get dec_ratio_append_min) to $(get dec_ratio_append_max)" \
    "<=" 2

SECTION=memory
g=$(get mem_growth_kb)
ru=$(get mem_maxrss_after_kb); [ -n "$ru" ] && ru=$(calc %.1f "($ru - $(get mem_maxrss_before_kb)) / 1024")
row "library peak RSS growth (MiB), forward+backward, B=1 H=1 n=32768 d=64" \
    "$([ -n "$g" ] && calc %.1f "$g / 1024")" \
    "VmHWM $(scaled "$(get mem_hwm_before_kb)" 1024 %.0f) -> $(scaled "$(get mem_hwm_after_kb)" 1024 %.0f) MiB (ru_maxrss growth ${ru:-?} MiB; its inputs and outputs: $(scaled "$(get mem_inputs_kb)" 1024 %.0f) MiB); $(s=$(get mem_seconds); echo "${s:-?}") s" \
    "<=" 256
SECTION=server
g=$(get srv_growth_kb); s=$(get srv_status)
row "attnd peak RSS growth (MiB) serving that request, base64 in and out" \
    "$([ -n "$g" ] && calc %.1f "$g / 1024")" \
    "$([ -n "$s" ] && [ "$s" != 200 ] && echo "attnd answered $s; ")VmHWM $(scaled "$(get srv_hwm_before_kb)" 1024 %.0f) -> $(scaled "$(get srv_hwm_after_kb)" 1024 %.0f) MiB; body $(scaled "$(get srv_body_in)" 1e6 %.1f) MB in, $(scaled "$(get srv_body_out)" 1e6 %.1f) MB out; $(s=$(get srv_seconds); echo "${s:-?}") s" \
    "<=" 400
# srvc_detail SHAPE: "server 250.1 GFLOP/s (137.4 ms), in-process 260.2 (132.1 ms)"
srvc_detail() {
    echo "server $(get "srvc_${1}_server_gflops") GFLOP/s ($(get "srvc_${1}_server_ms") ms, meta.timing_ms.compute), in-process $(get "srvc_${1}_inproc_gflops") GFLOP/s ($(get "srvc_${1}_inproc_ms") ms); best of 3 rounds taking turns, base64 in and out"
}
row "attnd / in-process GFLOP/s, B=1, H=8, n=4096, d=64 forward ($THREADS threads)" \
    "$(get srvc_n4096_ratio)" "$(srvc_detail n4096)" ">=" 0.95
row "attnd / in-process GFLOP/s, short sequences B=64, H=8, n=64, d=64 forward" \
    "$(get srvc_batch_ratio)" "$(srvc_detail batch)" ">=" 0.9
row "attnd minor page faults per repeated n=4096 request, after warm-up" \
    "$(get srvc_faults_per_request)" \
    "/proc/PID/stat minflt before and after $(get srvc_faults_requests) requests, every thread of attnd" \
    "<=" 499

SECTION=codec
row "tensor codec: jansson time / ours (decode+encode), 1M float32" \
    "$(get codec_ratio)" \
    "ours: decode $(get codec_ours_decode_mbs) MB/s, encode $(get codec_ours_encode_mbs) MB/s; jansson: json_loadb $(get codec_jansson_decode_mbs) MB/s, json_dumps $(get codec_jansson_encode_mbs) MB/s; text $(scaled "$(get codec_text_bytes)" 1e6 %.1f) MB" \
    ">=" 8 15

SECTION=parallel
row "an empty attn_parallel_for call on $THREADS threads (us): starting and joining them" \
    "$(get "par_empty_t${THREADS}_us")" \
    "1 thread: $(get par_empty_t1_us) us; 64 units of ~2 us: $(get "par_tiny_t${THREADS}_us") us on $THREADS threads, $(get par_tiny_t1_us) us on 1"

# http_detail NAME: "12345 req/s, p99 0.52 ms" (+ failures)
http_detail() {
    rps=$(get "${1}_rps")
    if [ -z "$rps" ]; then
        s=$(get "${1}_status"); echo "not measured${s:+ (answered $s)}"; return
    fi
    extra=""
    n2=$(get "${1}_non2xx"); [ -n "$n2" ] && extra=", $n2 non-2xx answers"
    se=$(get "${1}_sockerr"); [ -n "$se" ] && extra="$extra, socket errors: $se"
    echo "$rps req/s, p99 $(get "${1}_p99ms") ms$extra"
}
# req/s of a run in which every answer was a 2xx; nothing otherwise.
valid_rps() { [ -z "$(get "${1}_non2xx")" ] && get "${1}_rps"; }

SECTION=http
label="small request (n=4, d=4): attnd / nginx req/s"
if ! want http || { [ -f "$PEERS/nginx.conf" ] && command -v nginx > /dev/null; }; then
    row "$label" "$(ratio "$(valid_rps attnd_small)" "$(valid_rps nginx_small)" %.2f)" \
        "attnd $(http_detail attnd_small); nginx $(http_detail nginx_small)" ">=" 0.8 1.0
else
    printf '| %s | n/a | attnd %s; nginx: peer not available (%s) | >= 0.8 (aim 1.0) | peer not available |\n' \
        "$label" "$(http_detail attnd_small)" "$PEERS/nginx.conf"
fi
label="medium request (n=128, d=64, nested, causal): attnd / FastAPI req/s"
if ! want http || { [ -f "$PEERS/fastapi_attention.py" ] && [ -n "$(get fastapi1_medium_rps)$(get fastapi2_medium_rps)" ]; }; then
    f1=$(valid_rps fastapi1_medium); f2=$(valid_rps fastapi2_medium); w=1
    [ -n "$f2" ] && { [ -z "$f1" ] || gt "$f2" "$f1"; } && w=2
    row "$label" "$(ratio "$(valid_rps attnd_medium)" "$(valid_rps fastapi${w}_medium)" %.1f)" \
        "attnd $(http_detail attnd_medium); FastAPI ($w worker(s), the better of 1 and 2) $(http_detail fastapi${w}_medium)" ">=" 10 20
    f1=$(valid_rps fastapi1_small); f2=$(valid_rps fastapi2_small); w=1
    [ -n "$f2" ] && { [ -z "$f1" ] || gt "$f2" "$f1"; } && w=2
    row "small request: attnd / FastAPI req/s" \
        "$(ratio "$(valid_rps attnd_small)" "$(valid_rps fastapi${w}_small)" %.1f)" \
        "FastAPI ($w worker(s)) $(http_detail fastapi${w}_small)"
else
    printf '| %s | n/a | attnd %s; FastAPI: peer not available (%s, python3-fastapi, -uvicorn, -numpy) | >= 10 (aim 20) | peer not available |\n' \
        "$label" "$(http_detail attnd_medium)" "$PEERS/fastapi_attention.py"
fi
floor_detail="the floor, a blunt C responder of the same exchange streaming as many bytes with two threads, taking turns (bench/decode_floor.c): round trip - stream $(get http_dec_floor_us) us (stream $(get http_dec_floor_stream_us) us), $(get http_dec_floor_codec_us) us when it also decodes the body and encodes the answer with attnd's codec ($(get http_dec_floor_codec_work_us) us of it)"
[ -n "$(get http_dec_floor_us)" ] || floor_detail="the floor (bench/decode_floor.c) not measured"
row "decode step over HTTP (bfloat16 cache of 32768 positions, H_q=32, H_kv=8, d=128, base64): round trip - server compute, median (us)" \
    "$(get http_dec_overhead_us)" \
    "round trip $(get http_dec_rtt_us) us, compute (append + kernel, meta.timing_ms) $(get http_dec_compute_us) us, of the overhead inside attnd's clock (meta.timing_ms.total - compute: body read, decoding, queueing, encoding) $(get http_dec_server_us) us; $floor_detail; over 2048 positions, round trip - compute $(get http_dec_overhead_2k_us) us; GET /v2/health/live (nothing computed) after a pause as long as a step: $(get http_dec_pause_get_us) us; over 64 positions (nothing streamed), round trip - compute $(get http_dec_overhead_64_us) us back to back, $(get http_dec_overhead_64_pause_us) us after a pause as long as the long step's compute; a small model's step (H_q=4, H_kv=2, d=16, 200 positions, computed on the I/O thread) round trip $(get http_dec_small_rtt_us) us, $(get http_dec_small_pause_rtt_us) us after a pause of 300 us; one kept-alive connection to each server, bench/decode_http.py" \
    "<=" 150
row "decode step at 4096 positions (float32): re-sending K and V to /v1/attention / through a KV cache (time)" \
    "$(get http_resend_ratio)" \
    "$(get http_resend_step_ms) ms / $(get http_cache_step_ms) ms (medians, taking turns)" ">=" 20
SECTION=oip
row "Open Inference Protocol: binary /v2 / base64 /v1 req/s, H=8, n=512, d=64, forward, tensors both ways (median of 5 pairs)" \
    "$(get oip_ratio)" \
    "pairs:$(get oip_pairs); best runs: /v2 binary $(http_detail v2_bin_h8_n512); /v1 base64 $(http_detail v1_b64_h8_n512); bodies $(scaled "$(wc -c < "$OUT/oip_h8_n512.bin" 2>/dev/null)" 1e6 %.1f) MB and $(scaled "$(wc -c < "$OUT/b64_h8_n512.json" 2>/dev/null)" 1e6 %.1f) MB" \
    ">=" 1.3
row "Open Inference Protocol: transport (decode + encode) / total, binary, H=8, n=4096, d=64, forward (Server-Timing)" \
    "$(get oip_n4096_share)" \
    "decode $(get oip_n4096_decode_ms) ms + encode $(get oip_n4096_encode_ms) ms of $(get oip_n4096_total_ms) ms (compute $(get oip_n4096_compute_ms) ms)$(s=$(get oip_n4096_status); [ -n "$s" ] && echo "; answered $s")" \
    "<=" 0.05
echo
echo "Each HTTP figure: wrk -t1 -c16 -d${WRK_SECONDS}s --latency -s bench/body.lua URL (POST, Content-Type: application/json) after a 1 s warm-up; kernel figures: best of several runs after a warm-up; decode figures: medians of per-round ratios. Raw outputs: $OUT/."
[ $FAILS -eq 0 ] || { echo "$FAILS bar(s) failed or not measured"; exit 1; }
