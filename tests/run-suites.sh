#!/bin/sh
# Runs each test binary (or tests/test_*.sh script) given, with ATTND_BIN
# pointing at this build's server, once per libattn kernel (ATTN_KERNEL=
# generic, avx2, avx512; ATTN_KERNELS chooses the list), and fails if any of
# them fails. A kernel this CPU lacks is skipped with one line saying so.
# Where the avx512 kernel runs its bfloat16 products with vdpbf16ps, the
# suites that compute in bfloat16 (test_bf16, test_api) run once more with
# ATTN_BF16=emulated: the emulation that CPUs without the instruction run.
# Each libcheck suite prints its own "N%: Checks: N, Failures: N, Errors: N" line.
set -u
build=$1; shift
export ATTND_BIN="$build/attnd"
export ATTND_TESTDATA="${ATTND_TESTDATA:-$(pwd)/tests/data}"
status=0
for kernel in ${ATTN_KERNELS:-generic avx2 avx512}; do
    # attnd --version names the kernel it runs: the forced one when the CPU has it.
    if ! ATTN_KERNEL=$kernel "$ATTND_BIN" --version | grep -q "kernel $kernel,"; then
        echo "== kernel $kernel: skipped, this CPU cannot run it"
        continue
    fi
    export ATTN_KERNEL=$kernel
    for t in "$@"; do
        echo "== $t (kernel $kernel)"
        case "$t" in
            *.sh) sh "$t" ;;
            *) "$t" ;;
        esac || { echo "FAILED: $t (kernel $kernel)"; status=1; }
    done
done
case " ${ATTN_KERNELS:-generic avx2 avx512} " in *" avx512 "*)
    if ATTN_KERNEL=avx512 "$ATTND_BIN" --version | grep -q "kernel avx512, bf16 avx512_bf16,"; then
        export ATTN_KERNEL=avx512 ATTN_BF16=emulated
        for t in "$@"; do
            case "$t" in
                */test_bf16|*/test_api)
                    echo "== $t (kernel avx512, bf16 emulated)"
                    "$t" || { echo "FAILED: $t (kernel avx512, bf16 emulated)"; status=1; } ;;
            esac
        done
        unset ATTN_BF16
    fi ;;
esac
exit $status
