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
 *   attn_kv_kern                                   the table of them
 *
 * Shapes (one decode unit: key/value head g, its group's R query rows):
 *   q    [R, d_k]         rows g*R .. of the call's q [H_q, n_q, d_k]: the
 *                         group's query heads one after the other
 *   kt   [d_k, 64]        a page's keys of head g, transposed, in the dtype
 *   v    [64, d_v]        its values
 *   s    [KMR, 64]        one strip's scores, then weights (st->strip)
 *   out  [R, d_v]         the rows' unnormalised outputs
 * Every page is read once for all R rows: its k^T panel and v tile stay in
 * L1/L2 while the strips of KMR rows pass over them.
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
 * Scores of `rows` query rows against keys c0 .. c0 + nv*VW of a page:
 *   s[r][c0 ..] = sum_p q[r][p] * kt[p][c0 ..]
 * the register block of kern_body.h's gemm with the panel widened as it
 * is read, and the same multiply-adds in the same order (so a float32 page
 * gives the forward's bits). Panel rows are always 64 keys: no tail.
 */
static inline __attribute__((always_inline)) void
KF(kv_scores_block)(const attn_kv_dtype dtype, const int nv, int rows, int64_t d_k,
                    const float *q, const void *kt, int64_t c0, float *s)
{
    vf acc[KMR][KNV];
    int64_t off[KMR];
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++) {
        off[r] = (r < rows ? r : 0) * d_k;
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            acc[r][v] = vzero();
    }
    const float *ap = q;
#pragma GCC unroll 2
    for (int64_t p = 0; p < d_k; p++, ap++) {
        vf bv[KNV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            bv[v] = KF(kv_load)(dtype, kt, p * ATTN_KV_PAGE + c0 + v * VW);
#pragma GCC unroll 8
        for (int r = 0; r < KMR; r++) {
            vf ab = vset1(ap[off[r]]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++)
                acc[r][v] = vfma(ab, bv[v], acc[r][v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++) {
        if (r >= rows)
            break;
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            vstore(s + r * ATTN_KV_PAGE + c0 + v * VW, acc[r][v]);
    }
}

static inline __attribute__((always_inline)) void
KF(kv_scores)(const attn_kv_dtype dtype, int rows, int64_t d_k, const float *q, const void *kt,
              float *s)
{
    _Static_assert(ATTN_KV_PAGE % (KNV * VW) == 0, "a page's keys fill whole blocks");
    for (int64_t c0 = 0; c0 < ATTN_KV_PAGE; c0 += KNV * VW)
        KF(kv_scores_block)(dtype, KNV, rows, d_k, q, kt, c0, s);
}

/*
 * The rows' outputs take in the page's values, weighted:
 *   out[r][c0 ..] (+)= sum_{j < cols} s[r][j] * v[j][c0 ..]
 * the gemm's block again (keys in order, one multiply-add each), the last
 * vector of a row masked when d_v is not a whole number of vectors.
 */
static inline __attribute__((always_inline)) void
KF(kv_pv_block)(const attn_kv_dtype dtype, const int nv, const bool masked, int rows,
                int64_t cols, const float *s, const void *v, int64_t d_v, int64_t c0,
                float *out, int tail, bool accumulate)
{
    const vmask last = vmask_first(tail);
    vf acc[KMR][KNV];
    int64_t off[KMR];
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++) {
        off[r] = (r < rows ? r : 0) * ATTN_KV_PAGE;
#pragma GCC unroll 4
        for (int w = 0; w < nv; w++) {
            float *o = out + r * d_v + c0 + w * VW;
            acc[r][w] = vzero();
            if (accumulate && r < rows)
                acc[r][w] = masked && w == nv - 1 ? vload_m(o, last) : vload(o);
        }
    }
    const float *ap = s;
#pragma GCC unroll 2
    for (int64_t j = 0; j < cols; j++, ap++) {
        vf bv[KNV];
#pragma GCC unroll 4
        for (int w = 0; w < nv; w++)
            bv[w] = masked && w == nv - 1
                        ? KF(kv_load_first)(dtype, v, j * d_v + c0 + w * VW, tail, last)
                        : KF(kv_load)(dtype, v, j * d_v + c0 + w * VW);
#pragma GCC unroll 8
        for (int r = 0; r < KMR; r++) {
            vf ab = vset1(ap[off[r]]);
#pragma GCC unroll 4
            for (int w = 0; w < nv; w++)
                acc[r][w] = vfma(ab, bv[w], acc[r][w]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++) {
        if (r >= rows)
            break;
#pragma GCC unroll 4
        for (int w = 0; w < nv; w++) {
            float *o = out + r * d_v + c0 + w * VW;
            if (masked && w == nv - 1)
                vstore_m(o, acc[r][w], last);
            else
                vstore(o, acc[r][w]);
        }
    }
}

static inline __attribute__((always_inline)) void
KF(kv_pv)(const attn_kv_dtype dtype, int rows, int64_t cols, const float *s, const void *v,
          int64_t d_v, float *out, bool accumulate)
{
    for (int64_t c0 = 0; c0 < d_v; c0 += KNV * VW) {
        const int64_t width = KMIN(d_v - c0, (int64_t)(KNV * VW));
        const int nv = (int)((width + VW - 1) / VW);
        const int tail = (int)(width - (int64_t)(nv - 1) * VW);
#define KV_PV(n)                                                                           \
    (tail < VW ? KF(kv_pv_block)(dtype, n, true, rows, cols, s, v, d_v, c0, out, tail,     \
                                 accumulate)                                               \
               : KF(kv_pv_block)(dtype, n, false, rows, cols, s, v, d_v, c0, out, tail,    \
                                 accumulate))
        switch (nv) {
        case 1:
            KV_PV(1);
            break;
#if KNV >= 2
        case 2:
            KV_PV(2);
            break;
#endif
#if KNV >= 3
        case 3:
            KV_PV(3);
            break;
#endif
#if KNV >= 4
        case 4:
            KV_PV(4);
            break;
#endif
        }
#undef KV_PV
    }
}

/* Do all KMR rows of the strip from unit row r0 see every key of the full
 * tile, with nothing but the scale on their scores? (Its rows belong to
 * different heads, so each row is asked, not the first and the last.) */
static inline bool KF(kv_strip_sees_all)(const sdpa_call *c, const sdpa_tile *t, int64_t r0,
                                         int rows)
{
    if (!c->plain || rows != KMR || t->cols != KERN_BK)
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
 * One decode unit: the tiles tile_begin .. tile_end - 1 of head g, for all
 * R rows of its group, as forward_tile folds a key tile into a block of
 * one head's rows: per strip, scores, the row steps of the online softmax
 * (the whole strip at once where it can), then the weighted values. Row r
 * is query head g * group + r / n_q at query i = r % n_q: its position,
 * ALiBi slope and mask range are its own, and its arithmetic is exactly the
 * forward's for that row.
 */
static inline __attribute__((always_inline)) void
KF(kv_decode_as)(const attn_kv_dtype dtype, const kv_call *kc, const kv_unit *u,
                 sdpa_fwd_state *st)
{
    const sdpa_call *c = &kc->call;
    const attn_sdpa_params *p = c->p;
    const attn_kv_cache *cache = kc->cache;
    const int64_t d_k = p->d_k, d_v = p->d_v, n_q = p->n_q, R = kc->rows;
    const float *q = c->q + u->g * R * d_k;
    float *s = st->strip;
    for (int64_t tile = u->tile_begin; tile < u->tile_end; tile++) {
        const int64_t j0 = tile * ATTN_KV_PAGE;
        const unsigned char *block = kv_head_block(cache, tile, u->g);
        sdpa_tile t = {.j0 = j0, .cols = KMIN(u->k_end - j0, (int64_t)ATTN_KV_PAGE), .rows = 1};
        for (int64_t r0 = 0; r0 < R; r0 += KMR) {
            const int rows = (int)KMIN((int64_t)KMR, R - r0);
            KF(kv_scores)(dtype, rows, d_k, q + r0 * d_k, block, s);
            float m_new[KMR], sum[KMR];
            if (KF(kv_strip_sees_all)(c, &t, r0, rows) &&
                KF(strip_plain)(s, p->scale, st->m + r0, m_new, sum)) {
                for (int r = 0; r < KMR; r++)
                    KF(fold_row)(st, r0 + r, st->m[r0 + r], m_new[r], sum[r], d_v, d_v);
            } else {
                for (int r = 0; r < rows; r++) {
                    const int64_t row = r0 + r;
                    float *x = s + r * ATTN_KV_PAGE;
                    t.h = u->g * c->group + row / n_q;
                    const float m_old = st->m[row];
                    const float m_tile = KF(score_row)(c, &t, row % n_q, x, NULL);
                    if (isnan(m_tile)) {
                        /* Scores overflowed: redone in double at the end. */
                        st->l[row] = NAN;
                        memset(x, 0, (size_t)t.cols * sizeof *x);
                        continue;
                    }
                    const float m_row = m_tile > m_old ? m_tile : m_old;
                    if (m_row == -INFINITY) {
                        memset(x, 0, (size_t)t.cols * sizeof *x);
                        continue;
                    }
                    KF(fold_row)(st, row, m_old, m_row, KF(exp_sum)(x, t.cols, m_row), d_v, d_v);
                }
            }
            KF(kv_pv)(dtype, rows, t.cols, s, block + cache->v_offset, d_v, st->out + r0 * d_v,
                      st->accumulate);
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

const attn_kv_kern KF(attn_kv_kern) = {
    .decode = {
        [ATTN_KV_FLOAT32] = KF(kv_decode_f32),
        [ATTN_KV_FLOAT16] = KF(kv_decode_f16),
        [ATTN_KV_BFLOAT16] = KF(kv_decode_bf16),
    },
    .widen = KF(kv_widen),
};
