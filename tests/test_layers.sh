#!/bin/sh
# The layers as the build enforces them (Makefile, "The layers"):
#   - build/libattn.a exports only attn_ names, and a program with functions
#     of its own named as libattn's internal ones (sdpa_alloc, mha_gemm,
#     cpu_features) links against it;
#   - build/libcodec.a (the JSON codec) exports only codec_ names, and a
#     program that uses the codec links against it alone: the codec needs
#     nothing of the API layer or of libattn;
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

# --------------------------------------------------------------- codec
nm -g --defined-only "$build/libcodec.a" | awk 'NF == 3 { print $3 }' | sort -u > "$tmp/codec_exports"
others=$(grep -v '^codec_' "$tmp/codec_exports" | tr '\n' ' ')
if [ -z "$others" ]; then
    ok "libcodec.a exports only codec_ names ($(wc -l < "$tmp/codec_exports") of them)"
else
    bad "libcodec.a exports names without codec_: $others"
fi

cat > "$tmp/codec_alone.c" <<'C'
/* The codec with nothing else of attnd: a document validated, a tensor read
 * from it, a fault placed, text written; beside functions of its own named
 * as the API layer's and cpu/'s. */
#include <stdio.h>
#include <string.h>

#include "codec.h"

int api_fail(void) { return 7; }
unsigned cpu_features(void) { return 42; }

int main(void)
{
    const char *body = "{\"q\": [[1, 2.5], [3, -4e-1]]}";
    codec_span spans[2];
    codec_doc doc;
    codec_error e;
    if (!codec_doc_validate(&doc, body, strlen(body), spans, 2, &e))
        return 1;
    codec_tensor t;
    bool ok = codec_doc_tensor(&doc, spans[0].value, spans[0].value_end, "q", false, &t, &e);
    codec_doc_free(&doc);
    if (!ok || t.rank != 2 || t.count != 4 || t.f32[1] != 2.5f || t.f32[3] != -0.4f)
        return 2;
    codec_buf b = {0};
    codec_tensor_encode(&b, t.f32, t.rank, t.shape, CODEC_ENC_NESTED);
    codec_tensor_free(&t);
    ok = !b.failed && strcmp(b.data, "[[1.0,2.5],[3.0,-0.4]]") == 0;
    if (!ok)
        fprintf(stderr, "encoded: %s\n", b.data ? b.data : "(nothing)");
    codec_buf_free(&b);
    const char *bad = "{\"q\": [1,]}";
    if (!ok || codec_validate(bad, strlen(bad), &e) || e.kind != CODEC_ERR_SYNTAX ||
        e.offset != 9 || e.line != 1 || e.column != 10)
        return 3;
    return api_fail() == 7 && cpu_features() == 42 ? 0 : 4;
}
C
# shellcheck disable=SC2086
if $CC $CFLAGS_COMMON $INC_CODEC -o "$tmp/codec_alone" "$tmp/codec_alone.c" "$build/libcodec.a" \
        $LDFLAGS_ALL -lm > "$tmp/codec_alone.log" 2>&1 && "$tmp/codec_alone"; then
    ok "a program that uses the codec links libcodec.a alone and runs"
else
    cat "$tmp/codec_alone.log"; bad "a program that uses the codec links libcodec.a alone and runs (status $?)"
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
for h in codec.h codec_internal.h cpu_features.h; do probe api/json/ "$INC_CODEC" $h ok; done
for h in api.h request.h attn.h internal.h kern.h server.h config.h json/codec.h; do
    probe api/json/ "$INC_CODEC" $h missing
done
for h in api.h attn.h json/codec.h request.h; do probe api/ "$INC_API" $h ok; done
for h in internal.h kern.h sdpa.h mha.h kern_body.h cpu_features.h server.h config.h; do
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
