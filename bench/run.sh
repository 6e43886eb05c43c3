#!/bin/sh
# make bench: every figure of issue 4's table, measured in one run, printed as
# one markdown table with the machine at the top.
#
#   sh bench/run.sh [BUILD]        (make bench runs it with BUILD=build)
#
# It compiles its C programs into BUILD/bench/, then measures
#   1. the kernel: libattn SDPA against sgemm on the same 2 cores (bench/kernel.c)
#   2. the library's peak RSS growth at n=32768 (bench/memory.c)
#   3. attnd's peak RSS growth serving that request, base64 in and out
#   4. the tensor codec against jansson (bench/codec.c)
#   5. HTTP under wrk: attnd against nginx (../shared/peers/nginx.conf) and the
#      FastAPI peer (../shared/peers/fastapi_attention.py)
# Everything it starts listens on 127.0.0.1 and is stopped on exit. Raw
# outputs stay in BUILD/bench/ (results.txt, wrk_*.txt) for a closer look.
# Exit status: 0 when every bar holds, 1 when one fails or is not measured.
#
# Environment: BENCH_PEERS (default ../shared/peers), BENCH_WRK_SECONDS (5),
# BENCH_ONLY (a subset of "kernel memory server codec http"; default all).
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
    case " ${BENCH_ONLY:-kernel memory server codec http} " in *" $1 "*) return 0 ;; esac
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
have_kernel=0; have_memory=0; have_codec=0
[ -f "$BUILD/libattn.a" ] && compile kernel "$BUILD/libattn.a" && have_kernel=1
[ -f "$BUILD/libattn.a" ] && compile memory "$BUILD/libattn.a" && have_memory=1
[ -f "$BUILD/libattnapi.a" ] && [ -f "$BUILD/libattn.a" ] &&
    compile codec "$BUILD/libattnapi.a" "$BUILD/libattn.a" && have_codec=1

# ------------------------------------------------------------------ machine
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
CPU=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
CORES=$(nproc)
if [ $have_kernel = 1 ]; then
    "$OUT/kernel" info > "$TMP/info" 2>/dev/null
    CORENAME=$(awk '$1 == "blas_corename" { print $2 }' "$TMP/info")
    BLASCONF=$(awk '$1 == "blas_config" { sub(/^[^ ]+ /, ""); print }' "$TMP/info")
else
    CORENAME="?"; BLASCONF="?"
fi

# ------------------------------------------------------------------ 1. kernel
if [ $have_kernel = 1 ] && want kernel; then
    # The reference: square sgemm of about the work of one n=4096 forward
    # (2*2560^3 = 33.6 GFLOP against 34.4), on the same 2 cores as OpenBLAS
    # threads, taking turns with the n=4096 runs in one process (see
    # bench/kernel.c) so that other work on the machine hits both alike. For
    # every n, the full, causal and forward+backward runs take turns as well.
    for n in 4096 1024 256; do
        note "kernel: attention n=$n$([ $n = 4096 ] && echo ", taking turns with sgemm")"
        gemm=""; [ $n = 4096 ] && gemm=2560
        # shellcheck disable=SC2086
        if "$OUT/kernel" attn $THREADS 8 $n 64 $gemm > "$TMP/attn"; then
            while read -r k v; do
                case $k in sgemm_*) put "$k" "$v" ;; *) put "attn${n}_$k" "$v" ;; esac
            done < "$TMP/attn"
        fi
    done
fi

# ------------------------------------------------------------------ 2. library memory
if [ $have_memory = 1 ] && want memory; then
    note "memory: forward+backward at n=32768, d=64"
    if "$OUT/memory" $THREADS 32768 64 > "$TMP/mem"; then
        while read -r k v; do put "mem_$k" "$v"; done < "$TMP/mem"
    fi
fi

# ------------------------------------------------------------------ bodies
if want server || want http; then
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

# ------------------------------------------------------------------ 4. codec
if [ $have_codec = 1 ] && want codec; then
    note "codec: 1M floats against jansson"
    if "$OUT/codec" 1000000 > "$TMP/codec"; then
        while read -r k v; do put "codec_$k" "$v"; done < "$TMP/codec"
    fi
fi

# ------------------------------------------------------------------ 5. HTTP
# wrk_run NAME URL BODY: one wrk run (after a short warm-up); its req/s, p99
# (ms) and failures go into the results when its req/s is the best so far
# for NAME, so that calling it again gives the better of the runs.
wrk_run() {
    status=$(post "$2" "$3" "$TMP/check")
    if [ "$status" != 200 ]; then
        note "$1: $2 answered $status: $(head -c 200 "$TMP/check")"
        put "${1}_status" "$status"
        return 1
    fi
    # The warm-up: connections, caches, lazily started workers.
    BENCH_BODY=$3 wrk -t1 -c16 -d1s -s bench/body.lua "$2" > /dev/null 2>&1
    BENCH_BODY=$3 wrk -t1 -c16 -d"${WRK_SECONDS}s" --latency -s bench/body.lua "$2" \
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

# Every server stays up for the whole section and they take turns, two
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
for round in 1 2; do
    turn attnd_small "$ATTND_URL" "$OUT/small.json"
    turn nginx_small "$NGINX_URL" "$OUT/small.json"
    turn attnd_medium "$ATTND_URL" "$OUT/medium.json"
    turn fastapi1_medium "$FASTAPI1_URL" "$OUT/medium.json"
    turn fastapi2_medium "$FASTAPI2_URL" "$OUT/medium.json"
done
round=1
turn fastapi1_small "$FASTAPI1_URL" "$OUT/small.json"
turn fastapi2_small "$FASTAPI2_URL" "$OUT/small.json"
for p in $PIDS; do stop_pid "$p"; done

# ------------------------------------------------------------------ table
FAILS=0
# row LABEL VALUE DETAIL [OP BAR]: one table line. An empty VALUE is "not
# measured", which counts as a failure only for a row with a bar.
row() {
    label=$1; value=$2; detail=$3; op=${4:-}; bar=${5:-}
    if [ -z "$value" ]; then
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
    printf '| %s | %s | %s | %s | %s |\n' "$label" "$value" "$detail" "${op:+$op $bar}" "$result"
}
# ratio A B FORMAT: A/B when both are present, else nothing.
ratio() { [ -n "$1" ] && [ -n "$2" ] && calc "$3" "$1 / $2"; }
# scaled X DIVISOR FORMAT: X/DIVISOR, or "?" when X is missing.
scaled() { if [ -n "$1" ]; then calc "$3" "$1 / $2"; else echo "?"; fi; }

sg=$(get sgemm_gflops)
echo
echo "attnd benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo
echo "Machine: $CPU, $CORES cores; OpenBLAS corename $CORENAME ($BLASCONF)"
echo "Load average (1 min) at the start: $LOAD_START, at the end: $(cut -d' ' -f1 /proc/loadavg) (other work on the machine makes every figure noisier)"
echo
echo "| measurement | value | absolute figures | bar | result |"
echo "| --- | --- | --- | --- | --- |"
for n in 4096 1024 256; do
    gf=$(get attn${n}_gflops); full=$(get attn${n}_full_s)
    causal=$(get attn${n}_causal_s); fb=$(get attn${n}_fwdbwd_s)
    if [ $n = 4096 ]; then set -- ">=" 0.7 "<=" 0.55 "<=" 3.5; else set -- "" "" "" "" "" ""; fi
    row "attention forward / sgemm GFLOP/s, n=$n (B=1, H=8, d=64, $THREADS threads)" \
        "$(ratio "$gf" "$sg" %.2f)" \
        "${gf:-?} / ${sg:-?} GFLOP/s (sgemm: square $(get sgemm_size)^3 on $THREADS OpenBLAS threads, taking turns with the n=4096 runs)" "$1" "$2"
    row "causal time / full time, n=$n" "$(ratio "$causal" "$full" %.2f)" \
        "$(scaled "$causal" 0.001 %.1f) ms / $(scaled "$full" 0.001 %.1f) ms" "$3" "$4"
    row "(forward+backward) time / forward time, n=$n" "$(ratio "$fb" "$full" %.2f)" \
        "$(scaled "$fb" 0.001 %.1f) ms / $(scaled "$full" 0.001 %.1f) ms" "$5" "$6"
done

g=$(get mem_growth_kb)
ru=$(get mem_maxrss_after_kb); [ -n "$ru" ] && ru=$(calc %.1f "($ru - $(get mem_maxrss_before_kb)) / 1024")
row "library peak RSS growth (MiB), forward+backward, B=1 H=1 n=32768 d=64" \
    "$([ -n "$g" ] && calc %.1f "$g / 1024")" \
    "VmHWM $(scaled "$(get mem_hwm_before_kb)" 1024 %.0f) -> $(scaled "$(get mem_hwm_after_kb)" 1024 %.0f) MiB (ru_maxrss growth ${ru:-?} MiB; its inputs and outputs: $(scaled "$(get mem_inputs_kb)" 1024 %.0f) MiB); $(s=$(get mem_seconds); echo "${s:-?}") s" \
    "<=" 256
g=$(get srv_growth_kb); s=$(get srv_status)
row "attnd peak RSS growth (MiB) serving that request, base64 in and out" \
    "$([ -n "$g" ] && calc %.1f "$g / 1024")" \
    "$([ -n "$s" ] && [ "$s" != 200 ] && echo "attnd answered $s; ")VmHWM $(scaled "$(get srv_hwm_before_kb)" 1024 %.0f) -> $(scaled "$(get srv_hwm_after_kb)" 1024 %.0f) MiB; body $(scaled "$(get srv_body_in)" 1e6 %.1f) MB in, $(scaled "$(get srv_body_out)" 1e6 %.1f) MB out; $(s=$(get srv_seconds); echo "${s:-?}") s" \
    "<=" 400

row "tensor codec: jansson time / ours (decode+encode), 1M float32" \
    "$(get codec_ratio)" \
    "ours: decode $(get codec_ours_decode_mbs) MB/s, encode $(get codec_ours_encode_mbs) MB/s; jansson: json_loadb $(get codec_jansson_decode_mbs) MB/s, json_dumps $(get codec_jansson_encode_mbs) MB/s; text $(scaled "$(get codec_text_bytes)" 1e6 %.1f) MB" \
    ">=" 4

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

label="small request (n=4, d=4): attnd / nginx req/s"
if [ -f "$PEERS/nginx.conf" ] && command -v nginx > /dev/null; then
    row "$label" "$(ratio "$(valid_rps attnd_small)" "$(valid_rps nginx_small)" %.2f)" \
        "attnd $(http_detail attnd_small); nginx $(http_detail nginx_small)" ">=" 0.5
else
    printf '| %s | n/a | attnd %s; nginx: peer not available (%s) | >= 0.5 | peer not available |\n' \
        "$label" "$(http_detail attnd_small)" "$PEERS/nginx.conf"
fi
label="medium request (n=128, d=64, nested, causal): attnd / FastAPI req/s"
if [ -f "$PEERS/fastapi_attention.py" ] && [ -n "$(get fastapi1_medium_rps)$(get fastapi2_medium_rps)" ]; then
    f1=$(valid_rps fastapi1_medium); f2=$(valid_rps fastapi2_medium); w=1
    [ -n "$f2" ] && { [ -z "$f1" ] || gt "$f2" "$f1"; } && w=2
    row "$label" "$(ratio "$(valid_rps attnd_medium)" "$(valid_rps fastapi${w}_medium)" %.1f)" \
        "attnd $(http_detail attnd_medium); FastAPI ($w worker(s), the better of 1 and 2) $(http_detail fastapi${w}_medium)" ">=" 5
    f1=$(valid_rps fastapi1_small); f2=$(valid_rps fastapi2_small); w=1
    [ -n "$f2" ] && { [ -z "$f1" ] || gt "$f2" "$f1"; } && w=2
    row "small request: attnd / FastAPI req/s" \
        "$(ratio "$(valid_rps attnd_small)" "$(valid_rps fastapi${w}_small)" %.1f)" \
        "FastAPI ($w worker(s)) $(http_detail fastapi${w}_small)"
else
    printf '| %s | n/a | attnd %s; FastAPI: peer not available (%s, python3-fastapi, -uvicorn, -numpy) | >= 5 | peer not available |\n' \
        "$label" "$(http_detail attnd_medium)" "$PEERS/fastapi_attention.py"
fi
echo
echo "Each HTTP figure: wrk -t1 -c16 -d${WRK_SECONDS}s --latency -s bench/body.lua URL (POST, Content-Type: application/json) after a 1 s warm-up; kernel figures: best of several runs after a warm-up. Raw outputs: $OUT/."
[ $FAILS -eq 0 ] || { echo "$FAILS bar(s) failed or not measured"; exit 1; }
