/*
 * Attention over a KV cache's pages (lib/kv.h), compiled once per
 * instruction set after kern_body.h, whose register block, row steps and
 * online softmax it reuses. Besides kern_body.h's vector operations, the
 * including file defines:
 *
 *   vload_f16(p)    VW float16 values at p, widened (exactly)
 *   vload_bf16(p)   VW bfloat16 values at p, widened (a shift)
 *
 * It defines, in each kernel file (KF(x) is x_generic, x_avx2, x_avx512):
 *   kv_decode_f32, kv_decode_f16, kv_decode_bf16   one decode unit per dtype
 *   kv_widen                                       a run of 16-bit values to floats
 *   kv_join                                        a page's rows to bfloat16 words
 *   attn_kv_kern                                   the table of them
 *
 * Shapes (one decode unit: pages of heads g_begin .. g_end - 1; head g's
 * group has R query rows):
 *   q    [R, d_k]         rows g*R .. of the call's q [H_q, n_q, d_k]: the
 *                         group's query heads one after the other
 *   kt   [d_k, 64]        a page's keys of head g, transposed, in the dtype
 *   v    [64, d_v]        its values
 *   s    [KMR, 64]        one strip's scores, then weights (st->strip)
 *   out  [R, d_v]         the rows' unnormalised outputs
 * Every head block is read once for all R rows: its k^T panel and v tile
 * stay in L1/L2 while the strips of KMR rows pass over them.
 */
#include "kv.h"

/* One vector of `dtype` elements at element `at` of p, widened. */
static inline __attribute__((always_inline)) vf KF(kv_load)(const attn_kv_dtype dtype,
                                                           const void *p, int64_t at)
{
    if (dtype == ATTN_KV_FLOAT16)
        return vload_f16((const uint16_t *)p + at);
    if (dtype == ATTN_KV_BFLOAT16)
        return vload_bf16((const uint16_t *)p + at);
    return vload((const float *)p + at);
}

/* The first n < VW elements (lanes `m`), the others 0: masked for float32;
 * the 16-bit dtypes have no masked load in every instruction set, so they
 * go through a zero-padded copy (rows of an odd width only). */
static inline __attribute__((always_inline)) vf
KF(kv_load_first)(const attn_kv_dtype dtype, const void *p, int64_t at, int n, vmask m)
{
    if (dtype == ATTN_KV_FLOAT32)
        return vload_m((const float *)p + at, m);
    uint16_t part[VW] = {0};
    memcpy(part, (const uint16_t *)p + at, (size_t)n * sizeof *part);
    return dtype == ATTN_KV_FLOAT16 ? vload_f16(part) : vload_bf16(part);
}

/*
 * Scores of ROWS query rows against keys c0 .. c0 + KNV*VW of a page:
 *   s[r][c0 ..] = sum_p q[r][p] * kt[p][c0 ..]
 * the register block of kern_body.h's gemm with the panel widened as it
 * is read, and the same multiply-adds in the same order (so a float32 page
 * gives the forward's bits). ROWS is a constant of each copy: a group of
 * 4 query heads does 4 rows of work, not KMR. Panel rows are always 64
 * keys: no tail. While it runs, the next page's block of the same head is
 * asked for (`ahead`, `ahead_bytes`, NULL for none): a unit reads one
 * block per page, and the page after is elsewhere in memory, where the
 * hardware's prefetchers cannot guess it.
 */
static inline __attribute__((always_inline)) void
KF(kv_scores_block)(const attn_kv_dtype dtype, const int ROWS, int64_t d_k, const float *q,
                    const void *kt, int64_t c0, float *s, const char *ahead, int64_t ahead_step)
{
    vf acc[KMR][KNV];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
        for (int v = 0; v < KNV; v++)
            acc[r][v] = vzero();
    const float *ap = q;
#pragma GCC unroll 2
    for (int64_t p = 0; p < d_k; p++, ap++) {
        if (ahead != NULL) /* the same row of the next page's panel */
            for (int64_t b = 0; b < ahead_step; b += 64)
                __builtin_prefetch(ahead + p * ahead_step + b, 0, 2);
        vf bv[KNV];
#pragma GCC unroll 4
        for (int v = 0; v < KNV; v++)
            bv[v] = KF(kv_load)(dtype, kt, p * ATTN_KV_PAGE + c0 + v * VW);
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++) {
            vf ab = vset1(ap[r * d_k]);
#pragma GCC unroll 4
            for (int v = 0; v < KNV; v++)
                acc[r][v] = vfma(ab, bv[v], acc[r][v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
        for (int v = 0; v < KNV; v++)
            vstore(s + r * ATTN_KV_PAGE + c0 + v * VW, acc[r][v]);
}

/*
 * The rows' outputs take in the page's values, weighted:
 *   out[r][c0 ..] (+)= sum_{j < cols} s[r][j] * v[j][c0 ..]
 * the gemm's block again (keys in order, one multiply-add each) over NV
 * vectors of columns, the last one masked when d_v is not a whole number
 * of vectors.
 */
static inline __attribute__((always_inline)) void
KF(kv_pv_block)(const attn_kv_dtype dtype, const int ROWS, const int NV, const bool masked,
                int64_t cols, const float *s, const void *v, int64_t d_v, int64_t c0,
                float *out, int tail, bool accumulate, const char *ahead, int64_t ahead_step)
{
    const vmask last = vmask_first(tail);
    vf acc[KMR][KNV];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++) {
#pragma GCC unroll 4
        for (int w = 0; w < NV; w++) {
            float *o = out + r * d_v + c0 + w * VW;
            acc[r][w] = vzero();
            if (accumulate)
                acc[r][w] = masked && w == NV - 1 ? vload_m(o, last) : vload(o);
        }
    }
    const float *ap = s;
#pragma GCC unroll 2
    for (int64_t j = 0; j < cols; j++, ap++) {
        if (ahead != NULL) /* the same row of the next page's values */
            for (int64_t b = 0; b < ahead_step; b += 64)
                __builtin_prefetch(ahead + j * ahead_step + b, 0, 2);
        vf bv[KNV];
#pragma GCC unroll 4
        for (int w = 0; w < NV; w++)
            bv[w] = masked && w == NV - 1
                        ? KF(kv_load_first)(dtype, v, j * d_v + c0 + w * VW, tail, last)
                        : KF(kv_load)(dtype, v, j * d_v + c0 + w * VW);
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++) {
            vf ab = vset1(ap[r * ATTN_KV_PAGE]);
#pragma GCC unroll 4
            for (int w = 0; w < NV; w++)
                acc[r][w] = vfma(ab, bv[w], acc[r][w]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++) {
#pragma GCC unroll 4
        for (int w = 0; w < NV; w++) {
            float *o = out + r * d_v + c0 + w * VW;
            if (masked && w == NV - 1)
                vstore_m(o, acc[r][w], last);
            else
                vstore(o, acc[r][w]);
        }
    }
}

/* All of d_v: whole chunks of KNV vectors, then what is left a vector at
 * a time (odd widths only). */
static inline __attribute__((always_inline)) void
KF(kv_pv)(const attn_kv_dtype dtype, const int ROWS, int64_t cols, const float *s,
          const void *v, int64_t d_v, float *out, bool accumulate, const char *ahead,
          int64_t ahead_step)
{
    int64_t c0 = 0;
    for (; c0 + KNV * VW <= d_v; c0 += KNV * VW, ahead = NULL)
        KF(kv_pv_block)(dtype, ROWS, KNV, false, cols, s, v, d_v, c0, out, VW, accumulate,
                        ahead, ahead_step);
    for (; c0 + VW <= d_v; c0 += VW, ahead = NULL)
        KF(kv_pv_block)(dtype, ROWS, 1, false, cols, s, v, d_v, c0, out, VW, accumulate, ahead,
                        ahead_step);
    if (c0 < d_v)
        KF(kv_pv_block)(dtype, ROWS, 1, true, cols, s, v, d_v, c0, out, (int)(d_v - c0),
                        accumulate, ahead, ahead_step);
}

/* Do the ROWS rows of the strip from group row r0 see every key of the
 * full tile, with nothing but the scale on their scores? (Its rows may
 * belong to different query heads, so each row is asked.) */
static inline bool KF(kv_strip_sees_all)(const sdpa_call *c, const sdpa_tile *t, int64_t r0,
                                         int rows)
{
    if (!c->plain || t->cols != KERN_BK)
        return false;
    for (int r = 0; r < rows; r++) {
        int64_t lo, hi;
        sdpa_row_range(c, (r0 + r) % c->p->n_q, t->j0, t->cols, &lo, &hi);
        if (lo != 0 || hi != t->cols)
            return false;
    }
    return true;
}

/*
 * One strip of ROWS rows (rows r0 .. of head g's group) against one page
 * of head g, as forward_tile folds a key tile into a strip of one head's
 * rows: scores, the row steps of the online softmax (the whole strip at
 * once where it can), then the weighted values. Row r is query head
 * g * group + r / n_q at query i = r % n_q: its position, ALiBi slope and
 * visible range are its own, and its arithmetic is exactly the forward's
 * for that row. st holds the group's rows.
 */
static inline __attribute__((always_inline)) void
KF(kv_strip)(const attn_kv_dtype dtype, const int ROWS, const kv_call *kc, int64_t g,
             sdpa_tile *t, const unsigned char *block, int64_t r0, sdpa_fwd_state *st,
             const char *ahead)
{
    const sdpa_call *c = &kc->call;
    const attn_sdpa_params *p = c->p;
    const attn_kv_cache *cache = kc->cache;
    const int64_t d_k = p->d_k, d_v = p->d_v, n_q = p->n_q;
    const float *q = c->q + (g * kc->rows + r0) * d_k;
    float *s = st->strip;
    for (int64_t c0 = 0; c0 < ATTN_KV_PAGE; c0 += KNV * VW)
        KF(kv_scores_block)(dtype, ROWS, d_k, q, block, c0, s, c0 == 0 ? ahead : NULL,
                            ATTN_KV_PAGE * (int64_t)cache->elem);
    float m_new[KMR], sum[KMR];
    if (KF(kv_strip_sees_all)(c, t, r0, ROWS) &&
        KF(strip_plain_rows)(ROWS, s, p->scale, st->m + r0, m_new, sum)) {
        for (int r = 0; r < ROWS; r++)
            KF(fold_row)(st, r0 + r, st->m[r0 + r], m_new[r], sum[r], d_v, d_v);
    } else {
        for (int r = 0; r < ROWS; r++) {
            const int64_t row = r0 + r;
            float *x = s + r * ATTN_KV_PAGE;
            t->h = g * c->group + row / n_q;
            const float m_old = st->m[row];
            const float m_tile = KF(score_row)(c, t, row % n_q, x, NULL);
            if (isnan(m_tile)) {
                /* Scores overflowed: redone in double at the end. */
                st->l[row] = NAN;
                memset(x, 0, (size_t)t->cols * sizeof *x);
                continue;
            }
            const float m_row = m_tile > m_old ? m_tile : m_old;
            if (m_row == -INFINITY) {
                memset(x, 0, (size_t)t->cols * sizeof *x);
                continue;
            }
            KF(fold_row)(st, row, m_old, m_row, KF(exp_sum)(x, t->cols, m_row), d_v, d_v);
        }
    }
    KF(kv_pv)(dtype, ROWS, t->cols, s, block + cache->v_offset, d_v, st->out + r0 * d_v,
              st->accumulate, ahead != NULL ? ahead + cache->v_offset : NULL,
              d_v * (int64_t)cache->elem);
}

/*
 * One decode unit: pages tile_begin .. tile_end - 1, and in each the head
 * blocks g_begin .. g_end - 1 one after the other (one contiguous run of
 * memory: the hardware's prefetchers stream it), each for all R rows of
 * its group, strip by strip. The block after the current one in that order
 * is asked for while the current one is computed: the next page is
 * elsewhere in memory, where no prefetcher would guess it.
 */
static inline __attribute__((always_inline)) void
KF(kv_decode_as)(const attn_kv_dtype dtype, const kv_call *kc, const kv_unit *u,
                 sdpa_fwd_state *st)
{
    const attn_kv_cache *cache = kc->cache;
    const int64_t R = kc->rows, d_v = kc->call.p->d_v;
    for (int64_t tile = u->tile_begin; tile < u->tile_end; tile++) {
        const int64_t j0 = tile * ATTN_KV_PAGE;
        sdpa_tile t = {.j0 = j0, .cols = KMIN(u->k_end - j0, (int64_t)ATTN_KV_PAGE), .rows = 1};
        for (int64_t g = u->g_begin; g < u->g_end; g++) {
            const unsigned char *block = kv_head_block(cache, tile, g);
            const char *ahead = g + 1 < u->g_end ? (const char *)block + cache->head_bytes
                                : tile + 1 < u->tile_end
                                    ? (const char *)kv_head_block(cache, tile + 1, u->g_begin)
                                    : NULL;
            /* The group's rows in the unit's state. */
            sdpa_fwd_state sg = *st;
            sg.m += (g - u->g_begin) * R;
            sg.l += (g - u->g_begin) * R;
            sg.out += (g - u->g_begin) * R * d_v;
            for (int64_t r0 = 0; r0 < R; r0 += KMR) {
                const char *pf = r0 == 0 ? ahead : NULL;
                switch (KMIN((int64_t)KMR, R - r0)) {
#define KV_STRIP(n)                                                                        \
    case n:                                                                                \
        KF(kv_strip)(dtype, n, kc, g, &t, block, r0, &sg, pf);                             \
        break;
                    KV_STRIP(1)
                    KV_STRIP(2)
                    KV_STRIP(3)
                    KV_STRIP(4)
#if KMR > 4
                    KV_STRIP(5)
                    KV_STRIP(6)
#endif
#if KMR > 6
#error "kern_kv_body.h: a strip of more than 6 rows needs its case"
#endif
#undef KV_STRIP
                }
            }
        }
        st->accumulate = true;
    }
}

static void KF(kv_decode_f32)(const kv_call *c, const kv_unit *u, sdpa_fwd_state *st)
{
    KF(kv_decode_as)(ATTN_KV_FLOAT32, c, u, st);
}

static void KF(kv_decode_f16)(const kv_call *c, const kv_unit *u, sdpa_fwd_state *st)
{
    KF(kv_decode_as)(ATTN_KV_FLOAT16, c, u, st);
}

static void KF(kv_decode_bf16)(const kv_call *c, const kv_unit *u, sdpa_fwd_state *st)
{
    KF(kv_decode_as)(ATTN_KV_BFLOAT16, c, u, st);
}

static void KF(kv_widen)(attn_kv_dtype dtype, const void *src, float *dst, int64_t n)
{
    if (dtype == ATTN_KV_FLOAT32) {
        memcpy(dst, src, (size_t)n * sizeof *dst);
        return;
    }
    const uint16_t *h = src;
    int64_t j = 0;
    if (dtype == ATTN_KV_FLOAT16) {
        for (; j + VW <= n; j += VW)
            vstore(dst + j, vload_f16(h + j));
        for (; j < n; j++)
            dst[j] = kv_f16_to_f32(h[j]);
    } else {
        for (; j + VW <= n; j += VW)
            vstore(dst + j, vload_bf16(h + j));
        for (; j < n; j++)
            dst[j] = kv_bf16_to_f32(h[j]);
    }
}

/*
 * A page's rows joined into the bfloat16 kernel's words (kern_body_bf16.h),
 * for attn_kv_forward in bfloat16: dst [pairs, cols] (row stride ldd),
 * word (u, c) holding bf16(src[u][c]) in its low half and bf16(src[u +
 * h][c]) in its high half, h = ceil(rows / 2), rows past `rows` zero; src
 * [rows, cols] of `dtype` (row stride lds). The bfloat16 kernel's
 * row_pairs with `split`, reading the page's elements as they are stored:
 * a bfloat16 element is widened by a shift and its rounding changes
 * nothing but a subnormal (to zero), so its word is the stored half.
 */
static void KF(kv_join)(attn_kv_dtype dtype, const void *src, int64_t lds, int64_t rows,
                        int64_t cols, uint32_t *dst, int64_t ldd, int64_t pairs)
{
    const int64_t h = (rows + 1) / 2;
    for (int64_t u = 0; u < pairs; u++) {
        uint32_t *d = dst + u * ldd;
        const bool has_lo = u < h && u < rows, has_hi = u + h < rows;
        const int64_t lo = u * lds, hi = (u + h) * lds;
        int64_t c = 0;
        for (; c + VW <= cols; c += VW) {
            vf x0 = has_lo ? KF(kv_load)(dtype, src, lo + c) : vzero();
            vf x1 = has_hi ? KF(kv_load)(dtype, src, hi + c) : vzero();
            vp_store(d + c, vbf16_words(x0, x1));
        }
        if (c < cols) {
            const int n = (int)(cols - c);
            const vmask m = vmask_first(n);
            vf x0 = has_lo ? KF(kv_load_first)(dtype, src, lo + c, n, m) : vzero();
            vf x1 = has_hi ? KF(kv_load_first)(dtype, src, hi + c, n, m) : vzero();
            vp_store_m(d + c, vbf16_words(x0, x1), m);
        }
    }
}

const attn_kv_kern KF(attn_kv_kern) = {
    .decode = {
        [ATTN_KV_FLOAT32] = KF(kv_decode_f32),
        [ATTN_KV_FLOAT16] = KF(kv_decode_f16),
        [ATTN_KV_BFLOAT16] = KF(kv_decode_bf16),
    },
    .widen = KF(kv_widen),
    .join = KF(kv_join),
};
