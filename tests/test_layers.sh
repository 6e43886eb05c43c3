#!/bin/sh
# The layers as the build enforces them (Makefile, "The layers"):
#   - build/libattn.a exports only attn_ names, and a program with functions
#     of its own named as libattn's internal ones (sdpa_alloc, mha_gemm,
#     cpu_features) links against it;
#   - each layer's include paths let it include what it may and nothing
#     else: a probe file including a header of another layer, compiled with
#     the layer's flags (BUILD/layers.env, written by make), must fail with
#     "not found"; one including a header it may use must compile;
#   - no file of lib/, api/, server/ or cpu/ escapes its include paths with
#     a relative path ("../").
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
cd "$root" || exit 1
build=$(dirname "${ATTND_BIN:-build/attnd}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { echo "ok     $1"; pass=$((pass + 1)); }
bad() { echo "FAILED $1"; fail=$((fail + 1)); }

[ -f "$build/layers.env" ] || { echo "FAILED no $build/layers.env: run make first"; exit 1; }
. "$build/layers.env"

# ------------------------------------------------------------- exports
nm -g --defined-only "$build/libattn.a" | awk 'NF == 3 { print $3 }' | sort -u > "$tmp/exports"
others=$(grep -v '^attn_' "$tmp/exports" | tr '\n' ' ')
if [ -z "$others" ]; then
    ok "libattn.a exports only attn_ names ($(wc -l < "$tmp/exports") of them)"
else
    bad "libattn.a exports names without attn_: $others"
fi
for name in attn_sdpa_forward attn_sdpa_backward attn_mha_forward attn_kernel_name; do
    grep -qx "$name" "$tmp/exports" && ok "libattn.a exports $name" || bad "libattn.a exports $name"
done

cat > "$tmp/clash.c" <<'C'
/* Functions named as libattn's internal ones, beside a call into it. */
#include <stddef.h>
#include <stdint.h>

#include "attn.h"

void *sdpa_alloc(int64_t n, size_t size) { return (void *)(uintptr_t)(n + (int64_t)size); }
void mha_gemm(void) {}
unsigned cpu_features(void) { return 42; }

int main(void)
{
    attn_sdpa_params p = {.batch = 1, .heads_q = 1, .heads_kv = 1, .n_q = 2, .n_k = 2,
                          .d_k = 2, .d_v = 2, .scale = 1.0f, .threads = 2};
    const float q[4] = {1, 0, 0, 1}, k[4] = {1, 0, 0, 1}, v[4] = {1, 2, 3, 4};
    float out[4];
    if (attn_sdpa_forward(&p, q, k, v, out, NULL, NULL, NULL, NULL) != ATTN_OK)
        return 1;
    mha_gemm();
    return cpu_features() == 42 && sdpa_alloc(1, 1) != NULL ? 0 : 1;
}
C
# shellcheck disable=SC2086
if $CC $CFLAGS_COMMON -I"$build/include" -o "$tmp/clash" "$tmp/clash.c" "$build/libattn.a" \
        $LDFLAGS_ALL $PKG_LIBS_LIB > "$tmp/clash.log" 2>&1 && "$tmp/clash"; then
    ok "a program with its own sdpa_alloc, mha_gemm and cpu_features links libattn.a and runs"
else
    cat "$tmp/clash.log"; bad "a program with its own sdpa_alloc, mha_gemm and cpu_features links libattn.a"
fi

# ------------------------------------------------------------ includes
# probe LAYER FLAGS HEADER ok|missing
probe() {
    printf '#include "%s"\nint layer_probe;\n' "$3" > "$tmp/probe.c"
    # shellcheck disable=SC2086
    if $CC $CFLAGS_COMMON $2 -fsyntax-only "$tmp/probe.c" > "$tmp/probe.log" 2>&1; then
        got=ok
    elif grep -qE "No such file or directory|file not found" "$tmp/probe.log"; then
        got=missing
    else
        got=error
    fi
    if [ "$got" = "$4" ]; then
        [ "$4" = ok ] && ok "$1 may include $3" || ok "$1 cannot include $3"
    else
        cat "$tmp/probe.log"
        [ "$4" = ok ] && bad "$1 may include $3 (got: $got)" || bad "$1 cannot include $3 (got: $got)"
    fi
}
for h in cpu_features.h; do probe cpu/ "$INC_CPU" $h ok; done
for h in attn.h api.h server.h; do probe cpu/ "$INC_CPU" $h missing; done
for h in attn.h internal.h kern.h sdpa.h cpu_features.h cblas.h; do probe lib/ "$INC_LIB" $h ok; done
for h in api.h json/codec.h server.h config.h; do probe lib/ "$INC_LIB" $h missing; done
for h in api.h attn.h json/codec.h request.h cpu_features.h; do probe api/ "$INC_API" $h ok; done
for h in internal.h kern.h sdpa.h mha.h kern_body.h server.h config.h; do
    probe api/ "$INC_API" $h missing
done
for h in server.h config.h api.h json/codec.h; do probe server/ "$INC_SERVER" $h ok; done
for h in attn.h internal.h kern.h sdpa.h cpu_features.h; do probe server/ "$INC_SERVER" $h missing; done

escapes=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"(\.\./|/)' lib api server cpu)
if [ -z "$escapes" ]; then
    ok "no include in lib/, api/, server/ or cpu/ climbs out of its directory"
else
    bad "includes that climb out of their directory: $escapes"
fi

echo "$pass passed, $fail failed"
[ $fail = 0 ]
