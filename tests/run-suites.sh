#!/bin/sh
# tests/run-suites.sh BUILD SUITE...
#
# Runs each suite given (a libcheck binary, or a tests/test_*.sh script)
# with ATTND_BIN pointing at BUILD's server, prints its result line and its
# time, and fails if any suite fails.
#
# ATTN_KERNELS lists the libattn kernels to run with (generic, avx2,
# avx512); unset or empty, it is the one libattn picks (ATTN_KERNEL, or the
# widest this CPU runs). The first kernel runs every suite whole. Each
# further one runs only the test cases tagged "kernel" (CK_INCLUDE_TAGS):
# those whose results depend on the kernel; the rest, the scripts included,
# would only repeat themselves. A kernel this CPU lacks is skipped with one
# line saying so; when it lacks them all, the suites run on libattn's pick.
#
# Where the avx512 kernel runs its bfloat16 products with vdpbf16ps or AMX
# tiles (and avx512 is listed), test_bf16's cases tagged "kernel" run once
# more with ATTN_BF16=emulated: the emulation that CPUs without the
# instruction run; with AMX tiles, once more with ATTN_BF16=avx512_bf16.
#
# One suite, one test case: run the binary with libcheck's CK_RUN_CASE,
# e.g. `CK_RUN_CASE=gradients build/test_lib` (tcase_create's names).
set -u
build=$1
shift
export ATTND_BIN="$build/attnd"
export ATTND_TESTDATA="${ATTND_TESTDATA:-$(pwd)/tests/data}"
status=0
first=yes

# Runs the suites on the kernel in ATTN_KERNEL (or libattn's pick).
run_kernel() {
    name=$("$ATTND_BIN" --version | sed -n 's/.*kernel \([a-z0-9]*\),.*/\1/p')
    for t in "$@"; do
        if [ $first = yes ]; then
            echo "== $t (kernel $name)"
        else
            case "$t" in *.sh) continue ;; esac
            echo "== $t (kernel $name: the cases tagged kernel)"
        fi
        start=$(date +%s)
        case "$t" in
            *.sh) sh "$t" ;;
            *) if [ $first = yes ]; then "$t"; else CK_INCLUDE_TAGS=kernel "$t"; fi ;;
        esac || { echo "FAILED: $t (kernel $name)"; status=1; }
        echo "   $(($(date +%s) - start)) s"
    done
    first=no
}

for kernel in ${ATTN_KERNELS:-}; do
    # attnd --version names the kernel it runs: the forced one when the CPU has it.
    if ! ATTN_KERNEL=$kernel "$ATTND_BIN" --version | grep -q "kernel $kernel,"; then
        echo "== kernel $kernel: skipped, this CPU cannot run it"
        continue
    fi
    ATTN_KERNEL=$kernel
    export ATTN_KERNEL
    run_kernel "$@"
done
[ $first = no ] || run_kernel "$@"
case " ${ATTN_KERNELS:-} " in *" avx512 "*)
    paths=$(ATTN_KERNEL=avx512 "$ATTND_BIN" --version |
        sed -n 's/.*kernel avx512, bf16 \(avx512_bf16\|amx\),.*/\1/p')
    case "$paths" in
    amx) paths="avx512_bf16 emulated" ;;
    avx512_bf16) paths="emulated" ;;
    esac
    for path in $paths; do
        for t in "$@"; do
            case "$t" in */test_bf16)
                echo "== $t (kernel avx512, bf16 $path: the cases tagged kernel)"
                start=$(date +%s)
                ATTN_KERNEL=avx512 ATTN_BF16=$path CK_INCLUDE_TAGS=kernel "$t" ||
                    { echo "FAILED: $t (kernel avx512, bf16 $path)"; status=1; }
                echo "   $(($(date +%s) - start)) s" ;;
            esac
        done
    done ;;
esac
exit $status
