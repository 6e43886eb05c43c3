/*
 * Private to libattn's KV caches (kv_cache.c, kv_forward.c, kv_exact.c and
 * the kernels' kern_kv_body.h): the cache itself, the geometry of a page,
 * the scalar conversions between float32 and the 16-bit dtypes, and the
 * kernel table attention over pages runs through.
 *
 * A page of ATTN_KV_PAGE positions holds, for each key/value head in turn,
 * one head block:
 *   kt [d_k, ATTN_KV_PAGE]   the head's keys, transposed (the k^T panel of
 *                            the tiled kernels, KERN_BK == ATTN_KV_PAGE)
 *   v  [ATTN_KV_PAGE, d_v]   its values, row by row
 * in the cache's dtype. Position j of the cache is column j % 64 of page
 * j / 64.
 */
#ifndef ATTN_KV_H
#define ATTN_KV_H

#include <string.h>

#include "kern.h"

_Static_assert(ATTN_KV_PAGE == KERN_BK, "a page is one key tile of the kernels");

struct attn_kv_cache {
    attn_kv_config config;
    size_t elem;       /* bytes per element */
    size_t head_bytes; /* one head block of a page */
    size_t v_offset;   /* bytes from a head block to its values */
    size_t page_bytes; /* num_kv_heads head blocks */
    int64_t length;
    int64_t pages;        /* in use: ceil(length / ATTN_KV_PAGE) */
    int64_t capacity;     /* entries of `page` allocated */
    unsigned char **page; /* [capacity], the first `pages` in use */
    float rope_base;      /* 0: keys not rotated */
};

/* The head block of key/value head g in page p. */
static inline const unsigned char *kv_head_block(const attn_kv_cache *c, int64_t p, int64_t g)
{
    return c->page[p] + (size_t)g * c->head_bytes;
}

/* --------------------------------------------------- 16-bit conversions */

static inline float kv_bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t kv_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Widening is exact: every float16 and bfloat16 is a float32. */
static inline float kv_bf16_to_f32(uint16_t h)
{
    return kv_bits_float((uint32_t)h << 16);
}

static inline float kv_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = h >> 10 & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) /* zero or subnormal: mant * 2^-24, exact in float32 */
        return kv_bits_float(kv_float_bits((float)mant * 0x1p-24f) | sign);
    if (exp == 31) /* infinity or NaN (never stored: appends refuse them) */
        return kv_bits_float(sign | 0x7f800000u | mant << 13);
    /* Normal: the exponent rebiased from 15 to 127, the mantissa widened. */
    return kv_bits_float(sign | (exp + 112u) << 23 | mant << 13);
}

/* Narrowing, to nearest, ties to even, for finite inputs that the dtype
 * holds (appends check that first: kv_fits). */
static inline uint16_t kv_f32_to_bf16(float f)
{
    uint32_t u = kv_float_bits(f);
    /* Adding 0x7fff rounds the dropped half to nearest; the kept half's
     * lowest bit breaks a tie towards even. */
    return (uint16_t)((u + 0x7fffu + (u >> 16 & 1u)) >> 16);
}

static inline uint16_t kv_f32_to_f16(float f)
{
    const uint32_t u = kv_float_bits(f), a = u & 0x7fffffffu;
    const uint16_t sign = (uint16_t)(u >> 16 & 0x8000u);
    if (a < 0x38800000u) {
        /* Below float16's smallest normal 2^-14: a multiple of 2^-24.
         * Scaling by 2^24 is exact, and adding then taking away 2^23
         * rounds to an integer, to nearest even (the default rounding
         * mode); 1024 is the smallest normal's encoding, as it should be. */
        float scaled = kv_bits_float(a) * 0x1p24f;
        float whole = (scaled + 0x1p23f) - 0x1p23f;
        return (uint16_t)(sign | (uint16_t)whole);
    }
    /* Normal: the exponent rebiased from 127 to 15 (112 << 23 less), then
     * 13 bits of mantissa dropped to nearest even; a carry rounds up into
     * the exponent, as it should. */
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + (r >> 13 & 1u);
    return (uint16_t)(sign | r >> 13);
}

/* The error for a call whose rope base (`asked`, 0 for none) is not the
 * one the cached keys were appended with; `who` is "this append" or "this
 * attention". */
attn_status kv_rope_mismatch(attn_error *err, float cached, const char *who, float asked);

/* ------------------------------------------------------------- kernels */

/* One attention call over a cache, as the kernels see it. The sdpa_call's
 * parameters are those of attn_sdpa_forward over the cached keys (batch 1,
 * n_k = length, layout [H, n, d]); its q is the queries as the kernels read
 * them (rotated when rope is on). */
typedef struct {
    sdpa_call call;
    const attn_kv_cache *cache;
    int64_t rows; /* query rows of a group: (H_q / H_kv) * n_q */
} kv_call;

/* A decode unit: pages tile_begin .. tile_end - 1 of key/value heads
 * g_begin .. g_end - 1, for every query row of their groups (row r of head
 * g's group is query head g * group + r / n_q, query i = r % n_q), the keys
 * before k_end (the last key any row sees). */
typedef struct {
    int64_t g_begin, g_end;
    int64_t tile_begin, tile_end;
    int64_t k_end;
} kv_unit;

typedef struct {
    /* Folds every tile of the unit into st (the rows of its heads' groups,
     * head by head: m, l [(g_end - g_begin) * rows], out [same, d_v] with
     * row stride d_v, as the forward's; st->strip one strip's scores), the
     * first tile writing out, later ones adding; the rows are then
     * unnormalised, as the forward leaves them before its last step. One
     * function per dtype (attn_kv_dtype). */
    void (*decode[3])(const kv_call *c, const kv_unit *u, sdpa_fwd_state *st);
    /* dst[0..n) = the n elements of `dtype` at src, widened. */
    void (*widen)(attn_kv_dtype dtype, const void *src, float *dst, int64_t n);
    /* dst [pairs, cols] (row stride ldd): word (u, c) joins src[u][c] and
     * src[u + ceil(rows / 2)][c] rounded to bfloat16 (low, high half), for
     * src [rows, cols] of `dtype` (row stride lds); rows past `rows` zero.
     * The bfloat16 kernels' row_pairs with split, from the page as stored
     * (kern_kv_body.h). */
    void (*join)(attn_kv_dtype dtype, const void *src, int64_t lds, int64_t rows, int64_t cols,
                 uint32_t *dst, int64_t ldd, int64_t pairs);
} attn_kv_kern;

extern const attn_kv_kern attn_kv_kern_generic;
#if defined(__x86_64__)
extern const attn_kv_kern attn_kv_kern_avx2;
extern const attn_kv_kern attn_kv_kern_avx512;
#endif

/* The table of the kernel attn_kernel() chose (or of `kind`; NULL when
 * this CPU cannot run it). */
const attn_kv_kern *attn_kv_kern_get(void);
const attn_kv_kern *attn_kv_kern_of(attn_kernel_kind kind);

/* The last step of query row (h, i) (kv_forward.c): o = (acc + o) / l as
 * attn_sdpa_forward finishes a row, its softmax row to rows (when not
 * NULL), the row redone in double when its float sums overflowed. */
void kv_finish_row(const kv_call *kc, attn_softmax_row *rows, int64_t h, int64_t i, float *o,
                   const double *acc, bool partial, float m, double l);

/* attn_kv_forward with bfloat16 products (kv_forward_bf16.c): sp is the
 * call's attn_sdpa_params (batch 1, n_k = length, [H, n, d]), checked,
 * over a cache that is not empty and whose rope base is the call's. */
attn_status kv_forward_bf16(const attn_kv_cache *cache, const attn_sdpa_params *sp,
                            const float *q, float *out, attn_softmax_row *rows,
                            attn_error *err);

/* An upper bound of what kv_forward_bf16 allocates besides the rotated
 * queries, for sp->threads threads. */
double kv_forward_bf16_workspace(const attn_sdpa_params *sp);

/* ----------------------------------------------------- double precision */

/* Query row `row` of the call (head h, query i; its rotated q row at
 * q_row) recomputed from scratch in double precision over the pages,
 * written to out [d_v]; returns its softmax maximum and sum. For the rows
 * whose float accumulation overflowed, as sdpa_forward_row_exact. */
attn_softmax_row kv_forward_row_exact(const kv_call *c, int64_t h, int64_t i,
                                      const float *q_row, float *out);

#endif /* ATTN_KV_H */
