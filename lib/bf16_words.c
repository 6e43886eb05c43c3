/*
 * The bfloat16 kernels' conversions (kern.h: rows, row_pairs, pack_t) for
 * inputs the caller gave as bfloat16 words (attn_sdpa_params.dtype): the
 * same words, in the same places, read straight from the uint16_t tensor,
 * so no float32 copy of it is made. A word is taken as it is, except what
 * rounding its float32 value would change (bf16.h): a subnormal becomes
 * zero of its sign and a NaN quiet. That is why these are the kernels'
 * bits by definition, and why one portable copy serves every kernel: the
 * work is a pass over the input, O(n d) against the products' O(n^2 d).
 */
#include "bf16.h"
#include "kern.h"

/* The word bf16_round_bits gives for the float32 value of bfloat16 w. */
static inline uint32_t word(uint16_t w)
{
    return bf16_round_bits((uint32_t)w << 16) >> 16;
}

/* dst [ceil(n / 2)]: element t with element t + ceil(n / 2), the high half
 * of the last word zero when n is odd (kern_body_bf16.h's split_words). */
static void split_words(const uint16_t *x, int64_t n, uint32_t *dst)
{
    const int64_t h = (n + 1) / 2;
    for (int64_t t = 0; t < h; t++)
        dst[t] = word(x[t]) | (t + h < n ? word(x[t + h]) << 16 : 0u);
}

static void rows_words(const uint16_t *src, int64_t lds, int64_t rows, int64_t cols,
                       uint32_t *dst, int64_t ldd)
{
    for (int64_t r = 0; r < rows; r++)
        split_words(src + r * lds, cols, dst + r * ldd);
}

static void row_pairs_words(const uint16_t *src, int64_t lds, int64_t rows, int64_t cols,
                            uint32_t *dst, int64_t ldd, int64_t pairs, bool split)
{
    const int64_t h = (rows + 1) / 2;
    for (int64_t u = 0; u < pairs; u++) {
        const int64_t lo_row = split ? u : 2 * u, hi_row = split ? u + h : 2 * u + 1;
        const bool has_lo = lo_row < rows && (!split || u < h), has_hi = hi_row < rows;
        const uint16_t *lo = src + (has_lo ? lo_row : 0) * lds;
        const uint16_t *hi = src + (has_hi ? hi_row : 0) * lds;
        uint32_t *d = dst + u * ldd;
        for (int64_t c = 0; c < cols; c++)
            d[c] = (has_lo ? word(lo[c]) : 0u) | (has_hi ? word(hi[c]) << 16 : 0u);
    }
}

static void pack_t_words(const uint16_t *src, int64_t lds, int64_t keys, int64_t d,
                         uint32_t *dst)
{
    const int64_t h = (d + 1) / 2;
    for (int64_t j = 0; j < keys; j++) {
        const uint16_t *x = src + j * lds;
        for (int64_t t = 0; t < h; t++)
            dst[t * KERN_BK + j] = word(x[t]) | (t + h < d ? word(x[t + h]) << 16 : 0u);
    }
    for (int64_t t = 0; t < h; t++)
        for (int64_t j = keys; j < KERN_BK; j++)
            dst[t * KERN_BK + j] = 0;
}

void sdpa_bf16_rows(const attn_kern_bf16 *kb, sdpa_src src, int64_t lds, int64_t rows,
                    int64_t cols, uint32_t *dst, int64_t ldd)
{
    if (src.f32 != NULL)
        kb->rows(src.f32, lds, rows, cols, dst, ldd);
    else
        rows_words(src.bf16, lds, rows, cols, dst, ldd);
}

void sdpa_bf16_row_pairs(const attn_kern_bf16 *kb, sdpa_src src, int64_t lds, int64_t rows,
                         int64_t cols, uint32_t *dst, int64_t ldd, int64_t pairs, bool split)
{
    if (src.f32 != NULL)
        kb->row_pairs(src.f32, lds, rows, cols, dst, ldd, pairs, split);
    else
        row_pairs_words(src.bf16, lds, rows, cols, dst, ldd, pairs, split);
}

void sdpa_bf16_pack_t(const attn_kern_bf16 *kb, sdpa_src src, int64_t lds, int64_t keys,
                      int64_t d, uint32_t *dst)
{
    if (src.f32 != NULL)
        kb->pack_t(src.f32, lds, keys, d, dst);
    else
        pack_t_words(src.bf16, lds, keys, d, dst);
}
