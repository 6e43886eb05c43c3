#!/bin/sh
# Runs the libFuzzer target for FUZZ_TIME seconds and prints one summary line.
#   tests/fuzz/run.sh BUILD_DIR SECONDS        fuzz
#   tests/fuzz/run.sh BUILD_DIR merge          minimise tests/fuzz/corpus
# Seeds: tests/fuzz/corpus (kept in the repository, minimised), every body
# the API suite sends (captured by tests/fuzz/capture.c) and the JSONTestSuite
# documents. New inputs go to BUILD_DIR/work/corpus, outside the repository.
# An input that crashes, breaks an invariant or takes longer than
# FUZZ_INPUT_TIMEOUT seconds is copied into tests/fuzz/regressions/ (which
# `make test` replays) and the run fails.
set -u
build=$1
mode=$2
work=$build/work
fuzzer=$build/fuzz_api
capture=${CAPTURE_BIN:-build/capture_test_api}
timeout=${FUZZ_INPUT_TIMEOUT:-10}
# Inputs of a few KiB reach every field and encoding; longer ones only
# compute more, which --max-work forbids here anyway.
max_len=${FUZZ_MAX_LEN:-4096}

rm -rf "$work/seeds" "$work/artifacts"
mkdir -p "$work/corpus" "$work/seeds" "$work/artifacts"
cp tests/data/json_parsing/*.json "$work/seeds/"
if ! ATTND_CAPTURE_DIR="$work/seeds" CK_FORK=no CK_VERBOSITY=silent "$capture" >"$work/capture.log" 2>&1; then
    echo "fuzz: the API suite failed while its bodies were captured (see $work/capture.log)" >&2
    exit 1
fi
seeds=$(ls "$work/seeds" | wc -l)

if [ "$mode" = merge ]; then
    # The smallest set of inputs that keeps the coverage of everything known.
    rm -rf "$work/merged" && mkdir -p "$work/merged"
    # Edges only (no hit counts): the smallest set that reaches every line
    # reached so far, picked greedily.
    "$fuzzer" -set_cover_merge=1 -use_counters=0 -max_len="$max_len" -timeout="$timeout" "$work/merged" \
        tests/fuzz/corpus "$work/corpus" "$work/seeds" >"$work/merge.log" 2>&1 \
        || { tail -20 "$work/merge.log"; exit 1; }
    rm -f tests/fuzz/corpus/*
    cp "$work/merged"/* tests/fuzz/corpus/
    echo "fuzz: tests/fuzz/corpus minimised to $(ls tests/fuzz/corpus | wc -l) inputs" \
         "($(du -sk tests/fuzz/corpus | cut -f1) KiB) from $seeds seeds and $(ls "$work/corpus" | wc -l) found inputs"
    exit 0
fi

seconds=$mode
log=$work/fuzz.log
"$fuzzer" -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb=2048 \
    -max_len="$max_len" -dict=tests/fuzz/api.dict -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" \
    "$work/corpus" tests/fuzz/corpus "$work/seeds" >"$log" 2>&1
status=$?
stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
runs=$(stat number_of_executed_units)
rate=$(stat average_exec_per_sec)
new=$(stat new_units_added)
rss=$(stat peak_rss_mb)
cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
found=0
for a in "$work/artifacts"/*; do
    [ -f "$a" ] || continue
    cp "$a" tests/fuzz/regressions/
    found=$((found + 1))
    echo "fuzz: saved tests/fuzz/regressions/$(basename "$a")" >&2
done
echo "fuzz: ${runs:-0} inputs in ${seconds} s (${rate:-0}/s), coverage ${cov:-0} edges," \
     "${new:-0} new inputs, peak RSS ${rss:-0} MiB, ${found} failing input(s); seeds: $seeds"
if [ "$status" -ne 0 ] || [ "$found" -ne 0 ]; then
    grep -m1 -A30 -E 'ERROR: |==[0-9]+== |runtime error|invariant broken|ALARM|Timeout' "$log" >&2
    echo "fuzz: FAILED (full log: $log)" >&2
    exit 1
fi
