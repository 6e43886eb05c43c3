#!/bin/bash
# make reliability: attnd under hostile conditions, one table, each row a
# measured figure, its bar and PASS or FAIL; the exit status is 1 when a row
# fails. docs/reliability.md says what each row does and why its bar.
#
#   tests/reliability/run.sh BUILD_DIR
#
# Durations (seconds) come from the environment:
#   FUZZ_TIME                     the fuzzing row (default 60)
#   RELIABILITY_SECONDS           the soak (default 60)
#   RELIABILITY_SLOW_SECONDS      slow and idle clients held (default 10)
#   RELIABILITY_FAILOVER_SECONDS  wrk through nginx, a replica killed halfway (default 10)
#   RELIABILITY_DRAIN_SECONDS     wrk before the SIGTERM (default 5)
#   RELIABILITY_MEMORY_SECONDS    the worst admitted requests in a 1 GiB cgroup (default 30)
#   RELIABILITY_ONLY              a subset of: fuzz soak overload slow slots abandoned failover
#                                 drain slowdrain memory valgrind
#   RELIABILITY_VALGRIND          quick (the default) or full (every case; see below)
# Every server runs on a free loopback port; everything started here is
# stopped here, by pid.
set -u
cd "$(dirname "$0")/../.."
build=${1:-build}
attnd=$build/attnd
fuzz_time=${FUZZ_TIME:-60}
soak_s=${RELIABILITY_SECONDS:-60}
slow_s=${RELIABILITY_SLOW_SECONDS:-10}
failover_s=${RELIABILITY_FAILOVER_SECONDS:-10}
drain_s=${RELIABILITY_DRAIN_SECONDS:-5}
memory_s=${RELIABILITY_MEMORY_SECONDS:-30}
only=${RELIABILITY_ONLY:-fuzz soak overload slow slots abandoned failover drain slowdrain memory valgrind}
work=$(mktemp -d /tmp/attnd-reliability-XXXXXX)
chmod 755 "$work" # nginx workers may run as another user
# 500 held connections and more, on both sides.
ulimit -n 8192 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

rows=()
failed=0
pids=()

cleanup() {
    for p in "${pids[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    wait 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

row() { # name, figure, bar, PASS|FAIL
    rows+=("| $1 | $2 | $3 | $4 |")
    [ "$4" = PASS ] || failed=1
    printf '%-22s %s  [%s]  %s\n' "$1" "$4" "$3" "$2" >&2
}
want() { [[ " $only " == *" $1 "* ]]; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start_attnd NAME ARGS...: starts attnd on a free port; sets PORT and PID.
start_attnd() {
    local name=$1
    shift
    PORT=$(free_port)
    "$attnd" --bind 127.0.0.1 --port "$PORT" "$@" 2>"$work/$name.log" &
    PID=$!
    pids+=("$PID")
    for _ in $(seq 100); do
        curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    echo "attnd ($name) did not start:" >&2
    cat "$work/$name.log" >&2
    return 1
}

stop_attnd() { # PID: SIGTERM, wait; sets STATUS to its exit status
    kill -TERM "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    STATUS=$?
}

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
fd_count() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
field() { sed -n "s/^.* $1=\([^ ]*\).*$/\1/p" "$2" | tail -1; } # key=value in a mix: line
kv() { sed -n "s/^$1: *//p" "$2" | tail -1; }                   # "key: value" lines

# wrk's own error counts ("Socket errors: connect 0, read 1, write 0, timeout 0").
socket_errors() {
    local line
    line=$(grep 'Socket errors' "$1")
    [ -z "$line" ] && { echo "connect 0, read 0, write 0, timeout 0"; return; }
    echo "${line#*Socket errors: }"
}

# ------------------------------------------------------------------ fuzzing
if want fuzz; then
    if sh tests/fuzz/run.sh build/fuzz "$fuzz_time" >"$work/fuzz.out" 2>"$work/fuzz.err"; then
        result=PASS
    else
        result=FAIL
        cat "$work/fuzz.err" >&2
    fi
    summary=$(sed -n 's/^fuzz: //p' "$work/fuzz.out" | tail -1)
    row "fuzzing (make fuzz)" "${summary:-no summary}" \
        "no crash, leak, UB or broken invariant in ${fuzz_time} s" "$result"
fi

# --------------------------------------------------------------------- soak
if want soak; then
    start_attnd soak --max-body 64KiB --max-work 1e7 || exit 1
    fd0=$(fd_count "$PID")
    warm=$(( soak_s / 6 > 3 ? soak_s / 6 : 3 ))
    wrk -t64 -c64 -d"${warm}s" -s tests/reliability/mix.lua "http://127.0.0.1:$PORT" -- soak \
        >"$work/warm.out" 2>&1
    sleep 1
    rss0=$(rss_kib "$PID")
    wrk -t64 -c64 -d"${soak_s}s" --latency -s tests/reliability/mix.lua \
        "http://127.0.0.1:$PORT" -- soak >"$work/soak.out" 2>&1 &
    wrk_pid=$!
    pids+=("$wrk_pid")
    rss_max=$rss0
    while kill -0 "$wrk_pid" 2>/dev/null; do
        r=$(rss_kib "$PID")
        [ "$r" -gt "$rss_max" ] && rss_max=$r
        sleep 1
    done
    wait "$wrk_pid"
    fd1=$(fd_count "$PID")
    for _ in $(seq 50); do # the server sees the clients' closes a moment later
        fd1=$(fd_count "$PID")
        [ "$fd1" -le "$fd0" ] && break
        sleep 0.1
    done
    rss1=$(rss_kib "$PID")
    alive=yes
    kill -0 "$PID" 2>/dev/null || alive=no
    stop_attnd "$PID"; status=$STATUS
    m=$work/soak.out
    reqs=$(field requests "$m"); s5xx=$(field 5xx "$m"); wrong=$(field wrong "$m")
    lost=$(field unanswered "$m"); statuses=$(field statuses "$m")
    rate=$(sed -n 's/^Requests\/sec: *//p' "$m")
    growth=$(( rss_max - rss0 ))
    result=PASS
    [ "${s5xx:-x}" = 0 ] && [ "${wrong:-x}" = 0 ] && [ "${lost:-x}" = 0 ] &&
        [ "$growth" -lt 16384 ] && [ "$fd1" -le "$fd0" ] && [ "$alive" = yes ] &&
        [ "$status" = 0 ] || result=FAIL
    [ "$result" = PASS ] || { grep '^mix:' "$m" >&2; tail -5 "$work/soak.log" >&2; }
    row "soak (${soak_s} s, 64 conns)" \
        "${reqs:-0} requests (${rate:-0}/s; ${statuses:-none}): ${s5xx:-?} 5xx, ${wrong:-?} wrong, ${lost:-?} unanswered; RSS +$(mib "$growth") MiB after warm-up ($(mib "$rss0") -> max $(mib "$rss_max") MiB); fds $fd0 -> $fd1; exit $status" \
        "0 5xx; RSS growth < 16 MiB; fds back to baseline" "$result"
fi

# ----------------------------------------------------------------- overload
if want overload; then
    start_attnd overload --threads 1 --queue 2 || exit 1
    python3 tests/reliability/clients.py overload "$PORT" >"$work/overload.out" 2>&1
    rc=$?
    stop_attnd "$PID"; status=$STATUS
    o=$work/overload.out
    result=PASS
    [ "$rc" = 0 ] && [ "$status" = 0 ] || result=FAIL
    [ "$result" = PASS ] || cat "$o" >&2
    row "overload (--threads 1 --queue 2)" \
        "$(kv requests "$o"): $(kv answered_503 "$o") answered 503 + Retry-After, p99 $(kv p99_503_ms "$o") ms (p50 $(kv p50_503_ms "$o"), max $(kv max_503_ms "$o")); $(kv answered_200 "$o") accepted, each answer its own request's, $(kv other "$o") other" \
        "503 p99 < 20 ms; every accepted answer right" "$result"
fi

# ----------------------------------------------------- slow and idle clients
if want slow; then
    start_attnd slow --max-conns-per-ip 64 || exit 1
    python3 tests/reliability/clients.py slow "$PORT" --conns 500 --limit 64 \
        --seconds "$slow_s" >"$work/slow.out" 2>&1
    rc=$?
    stop_attnd "$PID"; status=$STATUS
    s=$work/slow.out
    result=PASS
    [ "$rc" = 0 ] && [ "$status" = 0 ] || result=FAIL
    [ "$result" = PASS ] || cat "$s" >&2
    row "slow and idle clients" \
        "$(kv held "$s"); $(kv normal_requests "$s") normal requests meanwhile: max $(kv max_ms "$s") ms (p99 $(kv p99_ms "$s")); 65th connection from one address: $(kv limit_answer "$s")" \
        "normal request < 100 ms; past --max-conns-per-ip a JSON 503" "$result"
fi

# ------------------------------------------------------ connection slots
# Four addresses, each under --max-conns-per-ip, trickle headers on more
# connections than --max-connections: another address is still answered
# (the idlest held connection makes room), and no trickler outlives
# --header-timeout, whatever bytes it sends.
if want slots; then
    start_attnd slots --max-connections 1000 --max-conns-per-ip 255 --header-timeout 15 || exit 1
    python3 tests/reliability/clients.py slots "$PORT" --addresses 4 --per-address 255 \
        --header-timeout 15 >"$work/slots.out" 2>&1
    rc=$?
    shed=$(curl -s "http://127.0.0.1:$PORT/metrics" |
           awk '/^attnd_connections_(closed|refused)_total/ {printf "%s%s %s", sep, $1, $2; sep=", "}')
    stop_attnd "$PID"; status=$STATUS
    o=$work/slots.out
    result=PASS
    [ "$rc" = 0 ] && [ "$status" = 0 ] || result=FAIL
    [ "$result" = PASS ] || cat "$o" >&2
    row "connection slots" \
        "$(kv trickling "$o") against --max-connections 1000: longest lived $(kv longest_life_s "$o") s (--header-timeout 15), $(kv still_open "$o") left; another address: $(kv other_requests "$o"), max $(kv max_ms "$o") ms (p99 $(kv p99_ms "$o")); closed and refused: ${shed:-none}" \
        "another address: every request answered 200, p99 < 200 ms; no trickler past --header-timeout (seen within 2 s)" "$result"
fi

# ------------------------------------------------------ abandoned requests
if want abandoned; then
    start_attnd abandoned --threads 1 --queue 16 || exit 1
    python3 tests/reliability/clients.py abandon "$PORT" --requests 6 --ms 1500 \
        >"$work/abandoned.out" 2>&1
    rc=$?
    stop_attnd "$PID"; status=$STATUS
    o=$work/abandoned.out
    result=PASS
    [ "$rc" = 0 ] && [ "$status" = 0 ] || result=FAIL
    [ "$result" = PASS ] || cat "$o" >&2
    row "abandoned requests" \
        "$(kv abandoned "$o") (multi-head, small bodies), on one compute thread, clients closed at once: a small request from another client $(kv small_request "$o"); $(kv logged_499 "$o") logged 499" \
        "small request < 500 ms; every abandoned one 499" "$result"
fi

# ---------------------------------------------------------------- fail-over
if want failover; then
    start_attnd replica-a --threads 1 || exit 1
    port_a=$PORT pid_a=$PID
    start_attnd replica-b --threads 1 || exit 1
    port_b=$PORT pid_b=$PID
    lb_port=$(free_port)
    # docker/nginx.conf with each upstream's run of replica lines replaced by
    # the two replicas and the listen line at a free port, as
    # tests/test_server.c runs it.
    awk -v a="$port_a" -v b="$port_b" -v p="$lb_port" -v dir="$work" '
        /^[ \t]*server attnd/ { if (!run) { sub(/attnd[-0-9]*:[0-9]+/, "127.0.0.1:" a); print;
                                            sub(/127.0.0.1:[0-9]+/, "127.0.0.1:" b); print }
                                run = 1; next }
        { run = 0 }
        /^[ \t]*listen / { print "        listen 127.0.0.1:" p ";"; next }
        /^[ \t]*access_log / { print "    access_log " dir "/access.log;"; next }
        { print }' docker/nginx.conf >"$work/nginx.conf"
    user=""
    [ "$(id -u)" = 0 ] && user=" user root;"
    nginx -p "$work" -e "$work/nginx-error.log" -c "$work/nginx.conf" \
        -g "daemon off; pid $work/nginx.pid;$user" >"$work/nginx.out" 2>&1 &
    nginx_pid=$!
    pids+=("$nginx_pid")
    for _ in $(seq 100); do
        curl -fs "http://127.0.0.1:$lb_port/healthz" >/dev/null 2>&1 && break
        sleep 0.05
    done
    wrk -t16 -c16 -d"${failover_s}s" -s tests/reliability/mix.lua \
        "http://127.0.0.1:$lb_port" -- valid >"$work/failover.out" 2>&1 &
    wrk_pid=$!
    pids+=("$wrk_pid")
    sleep "$(awk -v s="$failover_s" 'BEGIN {print s / 2}')"
    served_a=$(curl -s "http://127.0.0.1:$port_a/metrics" |
               awk '/^attnd_requests_total/ {n += $2} END {print n + 0}')
    kill -KILL "$pid_a"
    wait "$pid_a" 2>/dev/null
    wait "$wrk_pid"
    served_b=$(curl -s "http://127.0.0.1:$port_b/metrics" |
               awk '/^attnd_requests_total/ {n += $2} END {print n + 0}')
    kill -QUIT "$nginx_pid"
    wait "$nginx_pid" 2>/dev/null
    stop_attnd "$pid_b"; status=$STATUS
    f=$work/failover.out
    reqs=$(field requests "$f"); wrong=$(field wrong "$f"); lost=$(field unanswered "$f")
    errs=$(socket_errors "$f")
    result=PASS
    [ "${wrong:-x}" = 0 ] && [ "${lost:-x}" = 0 ] && [ "${reqs:-0}" -gt 0 ] &&
        [ "$served_a" -gt 0 ] && [ "$status" = 0 ] &&
        ! grep -q 'Socket errors' "$f" || result=FAIL
    [ "$result" = PASS ] || { cat "$f" >&2; tail -5 "$work/nginx-error.log" >&2; }
    row "fail-over (nginx, 2 replicas)" \
        "${reqs:-0} requests over 16 conns in ${failover_s} s, replica A SIGKILLed halfway (it had served $served_a, B $served_b): ${wrong:-?} failed, ${lost:-?} unanswered, socket errors: $errs" \
        "0 failed requests at the client" "$result"
fi

# ---------------------------------------------------------- drain under load
if want drain; then
    start_attnd drain || exit 1
    wrk -t32 -c32 -d$(( drain_s + 30 ))s -s tests/reliability/mix.lua \
        "http://127.0.0.1:$PORT" -- drain >"$work/drain.out" 2>&1 &
    wrk_pid=$!
    pids+=("$wrk_pid")
    sleep "$drain_s"
    t0=$(date +%s.%N)
    kill -TERM "$PID"
    wait "$PID"
    status=$?
    t1=$(date +%s.%N)
    sleep 0.5 # let wrk see every last answer, then stop it
    kill -INT "$wrk_pid"
    wait "$wrk_pid"
    d=$work/drain.out
    reqs=$(field requests "$d"); answered=$(field answered "$d"); wrong=$(field wrong "$d")
    statuses=$(field statuses "$d")
    # Once the listening socket is closed, wrk's reconnections are refused;
    # it counts each as a write error (its connect is non-blocking), never
    # sent. A request sent on an open connection and not answered shows as
    # a read error (the connection closed under it) or a timeout.
    errs=$(socket_errors "$d")
    read_err=$(echo "$errs" | sed -n 's/.*read \([0-9]*\).*/\1/p')
    timeouts=$(echo "$errs" | sed -n 's/.*timeout \([0-9]*\).*/\1/p')
    refused=$(echo "$errs" | sed -n 's/.*write \([0-9]*\).*/\1/p')
    inflight=$(sed -n 's/.*draining \([0-9]*\) in-flight.*/\1/p' "$work/drain.log")
    took=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f", (b - a) * 1000}')
    result=PASS
    [ "$status" = 0 ] && [ "${wrong:-x}" = 0 ] && [ "${read_err:-x}" = 0 ] &&
        [ "${timeouts:-x}" = 0 ] && [ "${answered:-0}" -gt 0 ] || result=FAIL
    [ "$result" = PASS ] || { cat "$d" >&2; tail -5 "$work/drain.log" >&2; }
    row "drain under load" \
        "SIGTERM after ${drain_s} s of wrk (32 conns), ${inflight:-?} in flight: exit $status in $took ms; ${answered:-0} answers (${statuses:-none}), ${wrong:-?} wrong; ${read_err:-?} requests lost on open connections, ${timeouts:-?} timeouts; ${refused:-?} reconnections refused after the listening socket closed" \
        "every accepted request answered; exit 0" "$result"
fi

# ------------------------------------------------- drain with slow clients
# Bodies trickled a byte every 5 s and headers trickled must not hold the
# exit; a computation in flight is answered.
if want slowdrain; then
    start_attnd slowdrain --threads 1 --timeout 60 --header-timeout 60 || exit 1
    python3 tests/reliability/clients.py drain "$PORT" --pid "$PID" --drain-timeout 20 \
        >"$work/slowdrain.out" 2>&1
    rc=$?
    wait "$PID"
    status=$?
    o=$work/slowdrain.out
    result=PASS
    [ "$rc" = 0 ] && [ "$status" = 0 ] || result=FAIL
    [ "$result" = PASS ] || { cat "$o" >&2; tail -5 "$work/slowdrain.log" >&2; }
    row "drain with slow clients" \
        "SIGTERM with bodies trickling (dropped: $(kv bodies_dropped "$o")), headers trickling and one computation in flight ($(kv in_flight "$o")): exit $status after $(kv exit_after "$o")" \
        "bodies dropped < 1 s; the computation answered; exit within --drain-timeout (20 s)" "$result"
fi

# ----------------------------------------------------------------- valgrind
# The api suites (api, codec) and the lib suites (lib, mha, kernels,
# variants). RELIABILITY_VALGRIND=quick (the default: a few minutes) runs
# every suite with the cases that run fastest under valgrind (~50 times
# slower than native); left out are the million-case number, string and
# float-printing properties, the tile-boundary sweeps, the thread-count
# comparisons, the multi-head backward, every kernel's exhaustive products
# and each variant's sweep, whose code the kept cases also reach on smaller
# shapes. RELIABILITY_VALGRIND=full runs every case (hours on 2 cores).
valgrind_cases() {
    case "$valgrind_mode:$1" in
        quick:api) echo "attention multihead errors" ;;
        quick:codec) echo "validator objects decode encode robustness" ;;
        quick:lib) echo "functions chapter causal masks gqa extremes gradients stats kernels blas invalid" ;;
        quick:mha) echo "forward contract" ;;
        quick:kernels) echo "promises" ;;
        quick:variants) echo "promises" ;;
        *) echo "all" ;;
    esac
}
# ------------------------------------------------------------------- memory
# attnd on its default limits in a memory cgroup of 1 GiB (v2 memory.max or
# v1 memory.limit_in_bytes; RLIMIT_AS of 1 GiB where no cgroup can be made),
# under a stream of the largest requests of each memory-hungry class that
# its cost model admits (found by bisection against a second attnd with
# --max-work 1, which judges memory first and computes nothing), beside
# stalled 50 MB uploads and small requests that must be answered.
if want memory; then
    cg= ; cgv= ; limit=$((1024 * 1024 * 1024))
    if [ -w /sys/fs/cgroup/cgroup.subtree_control ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null &&
        mkdir "/sys/fs/cgroup/attnd-reliability-$$" 2>/dev/null; then
        cg=/sys/fs/cgroup/attnd-reliability-$$; cgv=2
        echo "$limit" >"$cg/memory.max"; echo 0 >"$cg/memory.swap.max" 2>/dev/null
    elif [ -d /sys/fs/cgroup/memory ] && mkdir "/sys/fs/cgroup/memory/attnd-reliability-$$" 2>/dev/null; then
        cg=/sys/fs/cgroup/memory/attnd-reliability-$$; cgv=1
        echo "$limit" >"$cg/memory.limit_in_bytes"
        echo "$limit" >"$cg/memory.memsw.limit_in_bytes" 2>/dev/null
    fi
    PORT=$(free_port)
    if [ -n "$cg" ]; then
        how="a 1 GiB memory cgroup (v$cgv)"
        sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$cg" \
            "$attnd" --bind 127.0.0.1 --port "$PORT" --threads 2 2>"$work/memory.log" &
    else
        how="RLIMIT_AS of 1 GiB (no cgroup could be made)"
        sh -c 'ulimit -v 1048576 && exec "$@"' sh \
            "$attnd" --bind 127.0.0.1 --port "$PORT" --threads 2 2>"$work/memory.log" &
    fi
    mem_pid=$!
    pids+=("$mem_pid")
    mem_port=$PORT
    for _ in $(seq 100); do
        curl -fs "http://127.0.0.1:$mem_port/healthz" >/dev/null 2>&1 && break
        sleep 0.05
    done
    start_attnd memory-probe --threads 2 --max-work 1 || exit 1
    probe_pid=$PID
    python3 tests/memory_check.py stream "http://127.0.0.1:$mem_port" "http://127.0.0.1:$PORT" \
        "$memory_s" 4 >"$work/memory.out" 2>&1
    rc=$?
    alive=yes
    kill -0 "$mem_pid" 2>/dev/null || alive=no
    peak=? ; ooms=0
    if [ "$cgv" = 2 ]; then
        [ -r "$cg/memory.peak" ] && peak=$(( $(cat "$cg/memory.peak") / 1048576 ))
        ooms=$(awk '/^oom_kill / {print $2}' "$cg/memory.events" 2>/dev/null)
    elif [ "$cgv" = 1 ]; then
        peak=$(( $(cat "$cg/memory.max_usage_in_bytes") / 1048576 ))
        ooms=$(awk '/^oom_kill / {print $2}' "$cg/memory.oom_control" 2>/dev/null)
    else
        peak=$(awk '/^VmHWM:/ {print int($2 / 1024)}' "/proc/$mem_pid/status" 2>/dev/null)
    fi
    stop_attnd "$mem_pid"; status=$STATUS
    stop_attnd "$probe_pid"
    [ -n "$cg" ] && rmdir "$cg" 2>/dev/null
    answers=$(sed -n 's/^ *answers: //p' "$work/memory.out")
    if [ "$rc" = 0 ] && [ "$alive" = yes ] && [ "${ooms:-0}" = 0 ] && [ "$status" = 0 ]; then
        result=PASS
    else
        result=FAIL
        cat "$work/memory.out" "$work/memory.log" >&2
    fi
    row "memory (1 GiB)" "$how, ${memory_s} s: peak ${peak} MiB, ${ooms:-0} OOM kills, exit $status; $answers" \
        "alive, no OOM kill; heavy answers 200 or 503 + Retry-After, 90% of small ones 200" "$result"
fi

if want valgrind; then
    valgrind_mode=${RELIABILITY_VALGRIND:-quick}
    result=PASS
    figure=""
    for suite in api codec lib mha kernels variants; do
        start=$(date +%s)
        checks=0
        errors=0
        cases=$(valgrind_cases "$suite")
        for c in $cases; do
            out=$work/valgrind-$suite-$c.out
            # An empty CK_RUN_CASE would select no case at all.
            if [ "$c" = all ]; then unset CK_RUN_CASE; else export CK_RUN_CASE=$c; fi
            CK_FORK=no ATTND_TESTDATA="$PWD/tests/data" \
                valgrind --error-exitcode=1 --leak-check=full \
                --errors-for-leak-kinds=definite,indirect "$build/test_$suite" >"$out" 2>&1
            rc=$?
            e=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' "$out" | tail -1)
            n=$(sed -n 's/^[0-9]*%: Checks: \([0-9]*\).*/\1/p' "$out")
            checks=$(( checks + ${n:-0} ))
            errors=$(( errors + ${e:-0} ))
            # A case name that matches no case runs nothing and passes.
            if [ "$rc" != 0 ] || [ "${n:-0}" = 0 ]; then
                result=FAIL
                grep -E '==[0-9]+== (Invalid|Conditional|Use of|[0-9,]+ bytes in)|Checks:|:F:|:E:' \
                    "$out" | head -20 >&2
            fi
        done
        unset CK_RUN_CASE
        what=$suite
        [ "$cases" = all ] || what="$suite ($(echo $cases | tr ' ' ','))"
        figure="$figure${figure:+; }$what: $checks checks, $errors errors, $(( $(date +%s) - start )) s"
    done
    row "valgrind ($valgrind_mode)" "$figure" \
        "no error, no definite or indirect leak (--error-exitcode=1)" "$result"
fi

# -------------------------------------------------------------------- table
load=$(cut -d' ' -f1-3 /proc/loadavg)
echo
echo "make reliability, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores, load average $load"
echo
echo "| row | measured | bar | result |"
echo "| --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
exit $failed
