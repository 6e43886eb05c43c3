/*
 * What libattn's float32 and bfloat16 kernel bodies (kern_body.h,
 * kern_body_bf16.h) share: the transposing pack and the row steps between
 * the products (scores to final scores, the online softmax, the backward's
 * elementwise step), written once against the vector operations of the
 * instruction set and compiled once per kernel file. The file that includes
 * it defines, before the #include:
 *
 *   KF(name)        the name of this instruction set's copy of `name`
 *   KMR             rows of a register block (a strip of query rows)
 *   VW              floats per vector
 *   vf, vmask       a vector of VW floats, and a lane mask
 *   vzero() vset1(x) vload(p) vstore(p, x)
 *   vstream(p, x)   a store around the caches (non-temporal), p aligned to a
 *                   whole vector; the portable kernel's is vstore's
 *   vmask_first(n)  lanes 0 .. n-1 (0 <= n <= VW)
 *   vload_m(p, m)   masked lanes read (others 0); vstore_m(p, x, m)
 *   vadd vsub vmul vmax vfma(a, b, c) = a * b + c
 *   vhmax(x) vhsum(x)        the largest lane, the sum of the lanes
 *   vexp(x)         exp, within 2 ulp of expf; x < ATTN_EXP_MIN gives 0
 *   vkeep_range(x, lo, hi)   lanes lo <= l < hi of x, -INFINITY elsewhere
 *   vnot_one(x)     the lanes where x != 1.0f
 *   vmasked(x, m)   x in the lanes of m, 0 elsewhere
 *   vtranspose(src, lds, rows, dst, ldd)  a VW x VW block, dst[c][r] = src[r][c],
 *                   the rows from `rows` on read as zeros
 *   vnonfinite(x)   the lanes of x that are inf or nan; vmask_none(m)
 *   vbad(x)         the lanes of x that are +inf or nan
 *   vabs vdiv vge(a, b) (a mask) vblend(m, a, b) (a in m, b elsewhere)
 *   vcopysign(x, s) viota() (lane l holds l)
 *   vmul_d(x, f)    lanes (float)((0.0 + (double)x) * f): scaled in double
 *   vfold_d(acc, part)  acc [VW] += part [VW] in double, part [VW] = 0
 *   vbf16_weight(x) x rounded to bfloat16, for x of 0 or in [2^-126, 1] (the
 *                   weights, where no subnormal or overflow can arise)
 *
 * Shapes (a tile is query rows i0 .. i0 + rows of head (b, h) against keys
 * j0 .. j0 + cols, cols <= KERN_BK): a strip of scores is [KMR, KERN_BK].
 *
 * The functions here are static, and a kernel file that uses only some of
 * them (kern_avx512_bf16.c) would warn of the others: hence KERN_SHARED.
 */
#ifndef ATTN_KERN_STEPS_H
#define ATTN_KERN_STEPS_H

#include <math.h>
#include <string.h>

#include "kern.h"

#define KMIN(a, b) ((a) < (b) ? (a) : (b))
#define KERN_SHARED __attribute__((unused))

/* ------------------------------------------------------------- packing */

/* dst [cols, ldd] = src^T for src [rows, cols] (row stride lds): whole
 * VW x VW blocks by the register transpose, the last rows (fewer than VW:
 * all of a short sequence's keys) by the same transpose reading zeros past
 * them (stored as whole vectors where dst's rows have room: those zeros
 * are then the padding), the last columns one by one, and columns rows ..
 * ldd of dst zero. */
KERN_SHARED static void KF(pack_t)(const float *src, int64_t lds, int64_t rows, int64_t cols,
                                   float *dst, int64_t ldd)
{
    const int64_t rows_v = rows / VW * VW, cols_v = cols / VW * VW;
    for (int64_t r0 = 0; r0 < rows_v; r0 += VW)
        for (int64_t c0 = 0; c0 < cols_v; c0 += VW)
            vtranspose(src + r0 * lds + c0, lds, VW, dst + c0 * ldd + r0, ldd);
    int64_t zero_from = rows; /* in dst's rows c < cols_v, the padding still to write */
    if (rows_v < rows && cols_v > 0) {
        const int tail = (int)(rows - rows_v);
        if (rows_v + VW <= ldd) {
            for (int64_t c0 = 0; c0 < cols_v; c0 += VW)
                vtranspose(src + rows_v * lds + c0, lds, tail, dst + c0 * ldd + rows_v, ldd);
            zero_from = rows_v + VW;
        } else {
            const vmask keep = vmask_first(tail);
            float block_t[VW * VW];
            for (int64_t c0 = 0; c0 < cols_v; c0 += VW) {
                vtranspose(src + rows_v * lds + c0, lds, tail, block_t, VW);
                for (int c = 0; c < VW; c++)
                    vstore_m(dst + (c0 + c) * ldd + rows_v, vload(block_t + c * VW), keep);
            }
        }
    }
    /* The columns the transposes wrote need no more when they wrote the
     * padding too (a short sequence's panel). */
    const int64_t c_from = zero_from >= ldd ? cols_v : 0;
    for (int64_t c = c_from; c < cols; c++) {
        float *d = dst + c * ldd;
        for (int64_t r = c < cols_v ? rows : 0; r < rows; r++)
            d[r] = src[r * lds + c];
        for (int64_t r = c < cols_v ? zero_from : rows; r < ldd; r++)
            d[r] = 0.0f;
    }
}

/* ----------------------------------------------------------- row steps */

KERN_SHARED static float KF(max)(const float *x, int64_t n)
{
    vf m = vset1(-INFINITY);
    int64_t j = 0;
    for (; j + VW <= n; j += VW)
        m = vmax(m, vload(x + j));
    float best = vhmax(m);
    for (; j < n; j++)
        best = x[j] > best ? x[j] : best;
    return best;
}

/* x[j] = exp(x[j] - shift), the sum returned; with `bf16` each exponential
 * is rounded to bfloat16 first, and the sum is of the rounded values. */
static inline __attribute__((always_inline)) float KF(exp_sum_as)(float *x, int64_t n,
                                                                  float shift, const bool bf16)
{
    const vf s = vset1(shift);
    vf acc = vzero();
    int64_t j = 0;
    for (; j + VW <= n; j += VW) {
        vf e = vexp(vsub(vload(x + j), s));
        if (bf16)
            e = vbf16_weight(e);
        vstore(x + j, e);
        acc = vadd(acc, e);
    }
    if (j < n) {
        vmask m = vmask_first((int)(n - j));
        vf e = vexp(vsub(vload_m(x + j, m), s));
        if (bf16)
            e = vbf16_weight(e);
        vstore_m(x + j, e, m);
        acc = vadd(acc, vmasked(e, m));
    }
    return vhsum(acc);
}

KERN_SHARED static float KF(exp_sum)(float *x, int64_t n, float shift)
{
    return KF(exp_sum_as)(x, n, shift, false);
}

KERN_SHARED static void KF(scale_row)(float *x, int64_t n, float f)
{
    const vf s = vset1(f);
    int64_t j = 0;
    for (; j + VW <= n; j += VW)
        vstore(x + j, vmul(vload(x + j), s));
    for (; j < n; j++)
        x[j] *= f;
}

/* x[0..n) *= f; false when a result is not finite (inf or nan). */
KERN_SHARED static bool KF(scale_finite)(float *x, int64_t n, float f)
{
    const vf s = vset1(f);
    vmask bad = vmask_first(0);
    int64_t j = 0;
    for (; j + VW <= n; j += VW) {
        vf y = vmul(vload(x + j), s);
        vstore(x + j, y);
        bad |= vnonfinite(y);
    }
    if (j < n) {
        vmask tail = vmask_first((int)(n - j));
        vf y = vmul(vload_m(x + j, tail), s);
        vstore_m(x + j, y, tail);
        bad |= vnonfinite(y) & tail;
    }
    return vmask_none(bad);
}

/* x[0..n) = (float)((0.0 + (double)x[j]) * f): an output row that no
 * double sum was folded into, divided by its softmax sum in double as
 * sdpa_finish_row divides it (the same bits); false when a result is not
 * finite. */
KERN_SHARED static bool KF(scale_wide)(float *x, int64_t n, double f)
{
    vmask bad = vmask_first(0);
    int64_t j = 0;
    for (; j + VW <= n; j += VW) {
        vf y = vmul_d(vload(x + j), f);
        vstore(x + j, y);
        bad |= vnonfinite(y);
    }
    bool finite = vmask_none(bad);
    for (; j < n; j++) {
        x[j] = (float)((0.0 + (double)x[j]) * f);
        finite &= isfinite(x[j]);
    }
    return finite;
}

/* acc [n] += part [n] in double, and part [n] = 0: a float partial sum
 * folded into its double sum (blocked summation), lane by lane the scalar
 * acc[j] += part[j]. */
KERN_SHARED static void KF(fold_partial)(double *acc, float *part, int64_t n)
{
    int64_t j = 0;
    for (; j + VW <= n; j += VW)
        vfold_d(acc + j, part + j);
    for (; j < n; j++) {
        acc[j] += part[j];
        part[j] = 0.0f;
    }
}

/* The largest of x[0..n); NaN when one is NaN or +inf (scores that
 * overflowed float32: the row must be redone in double). */
KERN_SHARED static float KF(max_checked)(const float *x, int64_t n)
{
    vf m = vset1(-INFINITY);
    vmask bad = vmask_first(0);
    int64_t j = 0;
    for (; j + VW <= n; j += VW) {
        vf y = vload(x + j);
        m = vmax(m, y);
        bad |= vbad(y);
    }
    float best = vhmax(m);
    bool any_bad = !vmask_none(bad);
    for (; j < n; j++) {
        any_bad |= x[j] != x[j] || x[j] == INFINITY;
        best = x[j] > best ? x[j] : best;
    }
    return any_bad ? NAN : best;
}

/*
 * tanh, for soft-capping. Below 1/2 its Taylor series to y^17 (each term a
 * tenth of the one before: under half an ulp left over); above, 1 - 2 /
 * (exp(2|y|) + 1), where the cancellation costs at most a bit, with the
 * sign of y. Saturates to +-1 (exp's argument is capped), NaN stays NaN.
 */
static inline vf KF(vtanh)(vf y)
{
    const vf a = vabs(y), a2 = vmul(a, a);
    vf p = vset1(6404582.0f / 10854718875.0f);
    p = vfma(p, a2, vset1(-929569.0f / 638512875.0f));
    p = vfma(p, a2, vset1(21844.0f / 6081075.0f));
    p = vfma(p, a2, vset1(-1382.0f / 155925.0f));
    p = vfma(p, a2, vset1(62.0f / 2835.0f));
    p = vfma(p, a2, vset1(-17.0f / 315.0f));
    p = vfma(p, a2, vset1(2.0f / 15.0f));
    p = vfma(p, a2, vset1(-1.0f / 3.0f));
    vf small = vfma(vmul(p, a2), a, a);
    vf e = vexp(vadd(a, a));
    vf large = vsub(vset1(1.0f), vdiv(vset1(2.0f), vadd(e, vset1(1.0f))));
    return vcopysign(vblend(vge(a, vset1(0.5f)), large, small), y);
}

/*
 * Row i of a tile's scores becomes its final scores in place:
 *   x[j] = softcap(scale * s[j]) - slope * |p_i - j0 - j| (+ the additive
 *   mask), -inf where key j0 + j is hidden (causal, window, boolean mask),
 * and the row's largest final score is returned: -inf if none is visible,
 * NaN if a visible score overflowed to +inf or NaN. With soft-capping and
 * `capped` not NULL, capped[j] = tanh(scale * s[j] / softcap) (the backward
 * needs its derivative).
 */
KERN_SHARED static float KF(score_row)(const sdpa_call *c, const sdpa_tile *t, int64_t i, float *x,
                           float *capped)
{
    const attn_sdpa_params *p = c->p;
    const int64_t cols = t->cols;
    const vf scale = vset1(p->scale);
    int64_t lo, hi; /* the keys of the row that the causal mask and window leave */
    sdpa_row_range(c, i, t->j0, cols, &lo, &hi);
    if (c->plain) {
        vf m = vset1(-INFINITY);
        vmask bad = vmask_first(0);
        int64_t j = 0;
        for (; j + VW <= cols; j += VW) {
            vf s = vmul(vload(x + j), scale);
            if (j < lo || j + VW > hi)
                s = vkeep_range(s, lo - j, hi - j);
            vstore(x + j, s);
            m = vmax(m, s);
            bad |= vbad(s);
        }
        if (j < cols) {
            vmask tail = vmask_first((int)(cols - j));
            vf s = vkeep_range(vmul(vload_m(x + j, tail), scale), lo - j, KMIN(hi, cols) - j);
            vstore_m(x + j, s, tail);
            m = vmax(m, s);
            bad |= vbad(s);
        }
        return vmask_none(bad) ? vhmax(m) : NAN;
    }
    const float cap = p->variants.softcap;
    const float slope = sdpa_alibi_slope(c, t->b, t->h);
    /* ALiBi's distance |p_i - j| as (p_i - j0 - j) - lane, exact in float
     * for positions below 2^24. */
    const float from = (float)(i + c->offset - t->j0);
    for (int64_t j = 0; j < cols; j += VW) {
        vmask keep = vmask_first((int)KMIN((int64_t)VW, cols - j));
        vf s = vmul(vload_m(x + j, keep), scale);
        if (cap > 0.0f) {
            vf th = KF(vtanh)(vmul(s, vset1(1.0f / cap)));
            if (capped != NULL)
                vstore_m(capped + j, th, keep);
            s = vmul(th, vset1(cap));
        }
        if (slope != 0.0f) {
            vf dist = vabs(vsub(vset1(from - (float)j), viota()));
            s = vfma(vset1(-slope), dist, s);
        }
        vstore_m(x + j, s, keep);
    }
    if (p->mask.kind != ATTN_MASK_NONE)
        sdpa_mask_row(c, t->b, t->h, i, t->j0, x, cols);
    for (int64_t j = 0; j < lo; j++)
        x[j] = -INFINITY;
    for (int64_t j = hi; j < cols; j++)
        x[j] = -INFINITY;
    return KF(max_checked)(x, cols);
}

/* ---------------------------------------------------------------- forward */

/* Folds a row's tile into its state: a tile that raised the maximum from
 * m_old to m_new first shrinks the sum and output so far by
 * exp(m_old - m_new); then the tile's sum of exp(x - m_new) is added. */
static inline void KF(fold_row)(sdpa_fwd_state *st, int64_t row, float m_old, float m_new,
                                float sum, int64_t d_v, int64_t ldo)
{
    if (m_new > m_old) {
        /* Before anything was visible l and the output row are 0 (the
         * row's first product overwrites it): nothing to scale. */
        if (m_old != -INFINITY) {
            float shrink = expf(m_old - m_new);
            st->l[row] *= (double)shrink;
            KF(scale_row)(st->out + row * ldo, d_v, shrink);
        }
        st->m[row] = m_new;
    }
    st->l[row] += sum;
}

#define KERN_BV (KERN_BK / VW) /* vectors per row of a strip */

/*
 * The row steps of a whole strip at once, for the usual tile: KMR rows,
 * KERN_BK keys all visible to every row, no mask, ALiBi or soft cap, no
 * statistics or weights. The rows go through each phase together, so that
 * the latency of one row's maximum and exponentials hides behind the
 * others' (row by row, each waited for its own). The arithmetic is
 * score_row's and exp_sum's, operation for operation, so the bits are
 * those of the row-by-row path. False, with the strip untouched, when a
 * score overflowed (the row-by-row path then marks that row for double).
 */
static inline __attribute__((always_inline)) bool
KF(strip_plain_rows)(const int ROWS, float *s, float scale, const float *m_old, float *m_new,
                     float *sum)
{
    const vf vs = vset1(scale);
    vf m[KMR];
    vmask bad = vmask_first(0);
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++) {
        m[r] = vset1(-INFINITY);
#pragma GCC unroll 8
        for (int v = 0; v < KERN_BV; v++) {
            vf x = vmul(vload(s + r * KERN_BK + v * VW), vs);
            m[r] = vmax(m[r], x);
            bad |= vbad(x);
        }
    }
    if (!vmask_none(bad))
        return false;
    vf shift[KMR], acc[KMR];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++) {
        float tile = vhmax(m[r]);
        m_new[r] = tile > m_old[r] ? tile : m_old[r];
        shift[r] = vset1(m_new[r]);
        acc[r] = vzero();
    }
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++) {
#pragma GCC unroll 8
        for (int v = 0; v < KERN_BV; v++) {
            float *x = s + r * KERN_BK + v * VW;
            vf e = vexp(vsub(vmul(vload(x), vs), shift[r]));
            vstore(x, e);
            acc[r] = vadd(acc[r], e);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
        sum[r] = vhsum(acc[r]);
    return true;
}

/* A strip of KMR rows: the tile's usual case. A KV cache's decode step
 * calls strip_plain_rows with the rows of its group (4 query heads: 4). */
KERN_SHARED static bool KF(strip_plain)(float *s, float scale, const float *m_old,
                                        float *m_new, float *sum)
{
    return KF(strip_plain_rows)(KMR, s, scale, m_old, m_new, sum);
}

/*
 * strip_plain for a tile narrower than KERN_BK (cols keys, the last
 * vector masked: a short sequence's whole tile) and any rows <= KMR: the
 * same phases, row by row inside each, with the arithmetic of score_row's
 * and exp_sum's tails (the lanes past cols -inf for the maximum, left out
 * of the sum, not stored), so the bits are the row-by-row path's. False,
 * with the strip untouched, when a score overflowed or a row is all -inf.
 */
KERN_SHARED static bool KF(strip_plain_narrow)(float *s, int rows, int64_t cols, float scale,
                                               const float *m_old, float *m_new, float *sum)
{
    const vf vs = vset1(scale);
    const int64_t full = cols / VW * VW;
    const vmask tail = vmask_first((int)(cols - full));
    vmask bad = vmask_first(0);
    vf m[KMR];
    for (int r = 0; r < rows; r++) {
        const float *x = s + r * KERN_BK;
        m[r] = vset1(-INFINITY);
        for (int64_t j = 0; j < full; j += VW) {
            vf y = vmul(vload(x + j), vs);
            m[r] = vmax(m[r], y);
            bad |= vbad(y);
        }
        if (full < cols) {
            vf y = vkeep_range(vmul(vload_m(x + full, tail), vs), 0, cols - full);
            m[r] = vmax(m[r], y);
            bad |= vbad(y);
        }
    }
    if (!vmask_none(bad))
        return false;
    for (int r = 0; r < rows; r++) {
        float tile = vhmax(m[r]);
        m_new[r] = tile > m_old[r] ? tile : m_old[r];
        if (m_new[r] == -INFINITY)
            return false;
    }
    for (int r = 0; r < rows; r++) {
        float *x = s + r * KERN_BK;
        const vf shift = vset1(m_new[r]);
        vf acc = vzero();
        for (int64_t j = 0; j < full; j += VW) {
            vf e = vexp(vsub(vmul(vload(x + j), vs), shift));
            vstore(x + j, e);
            acc = vadd(acc, e);
        }
        if (full < cols) {
            vf e = vexp(vsub(vmul(vload_m(x + full, tail), vs), shift));
            vstore_m(x + full, e, tail);
            acc = vadd(acc, vmasked(e, tail));
        }
        sum[r] = vhsum(acc);
    }
    return true;
}

/* Do rows i .. i + rows of tile t all see all its keys, with nothing but
 * the scale on their scores (the narrow strip's condition)? */
static inline bool KF(rows_see_all)(const sdpa_call *c, const sdpa_tile *t, int64_t i, int rows)
{
    if (!c->plain)
        return false;
    int64_t lo, hi;
    sdpa_row_range(c, i, t->j0, t->cols, &lo, &hi);
    if (hi < t->cols || lo > 0)
        return false;
    sdpa_row_range(c, i + rows - 1, t->j0, t->cols, &lo, &hi);
    return lo == 0 && hi == t->cols;
}

/* Do all KMR rows of the strip from row i see all KERN_BK keys of the
 * tile, with nothing but the scale on their scores? */
static inline bool KF(strip_sees_all)(const sdpa_call *c, const sdpa_tile *t, int64_t i,
                                      int rows)
{
    if (!c->plain || rows != KMR || t->cols != KERN_BK)
        return false;
    /* The visible keys only widen down the rows (causal, window): the first
     * row's end and the last row's start bound them all. */
    int64_t lo, hi;
    sdpa_row_range(c, i, t->j0, t->cols, &lo, &hi);
    if (hi < t->cols)
        return false;
    sdpa_row_range(c, i + rows - 1, t->j0, t->cols, &lo, &hi);
    return lo == 0;
}

/*
 * The row steps of the forward for the strip of `rows` query rows from row
 * r0 of tile t, whose scores q k^T are in s [rows, KERN_BK], row by row:
 * each row's final scores become its weights P = exp(x - m) in place (m
 * the row's running maximum), folded into the row's state, the optional
 * outputs fed. With `bf16` every weight is rounded to bfloat16 before it is
 * summed and kept: the row's sum is then the sum of the very weights that
 * multiply v.
 */
static inline __attribute__((always_inline)) void
KF(fwd_rows)(const sdpa_call *c, const sdpa_tile *t, sdpa_fwd_state *st, float *s, int64_t r0,
             int rows, const bool bf16)
{
    const int64_t d_v = c->p->d_v, ldo = c->ldo;
    for (int r = 0; r < rows; r++) {
        const int64_t row = r0 + r, i = t->i0 + row;
        float *x = s + r * KERN_BK;
        if (st->stats != NULL)
            sdpa_fwd_stats_raw(st, x, t->cols);
        float m_old = st->m[row];
        float m_tile = KF(score_row)(c, t, i, x, NULL);
        if (isnan(m_tile)) {
            /* Scores overflowed: the row is redone in double at the end (a
             * NaN sum says so); here it contributes nothing. */
            st->l[row] = NAN;
            memset(x, 0, (size_t)t->cols * sizeof *x);
            continue;
        }
        float m_row = m_tile > m_old ? m_tile : m_old;
        if (m_row == -INFINITY) {
            /* Nothing visible in this row yet: P is 0, the state stays 0. */
            memset(x, 0, (size_t)t->cols * sizeof *x);
            if (st->weights != NULL)
                sdpa_fwd_keep_weights(c, st, t, row, x);
            continue;
        }
        if (st->stats != NULL)
            sdpa_fwd_stats_scores(st, row, x, t->cols, m_old, m_row);
        KF(fold_row)(st, row, m_old, m_row, KF(exp_sum_as)(x, t->cols, m_row, bf16), d_v, ldo);
        if (st->stats != NULL)
            sdpa_fwd_stats_entropy(st, row, x, t->cols, m_row);
        if (st->weights != NULL)
            sdpa_fwd_keep_weights(c, st, t, row, x);
    }
}

/* Whether the strip of `rows` rows from row r0 of tile t may take its row
 * steps at once: no optional outputs, every row seeing every key with
 * nothing but the scale. */
static inline bool KF(fwd_strip_plain)(const sdpa_call *c, const sdpa_tile *t,
                                       const sdpa_fwd_state *st, int64_t r0, int rows)
{
    return st->stats == NULL && st->weights == NULL &&
           KF(strip_sees_all)(c, t, t->i0 + r0, rows);
}

/* --------------------------------------------------------------- backward */

/*
 * One row of the backward's elementwise step, given the row's final scores
 * x and dP = dO v^T:
 *   p  = exp(x - m) / l            (the weight, rebuilt as the forward made it)
 *   ds = scale * p * (dp - delta)  (dS, times the scale both products need;
 *                                   exactly 0 where p == 1, a one-hot row)
 * m and l kept apart rather than as one log-sum-exp: x - m is exact for the
 * scores near the maximum whatever the size of m, so any constant shift of
 * the row gives the same weights and gradients.
 */
KERN_SHARED static void KF(softmax_grad_row)(float *x, float *dp, int64_t n, float m, float inv_l,
                                 float delta, float scale, const float *capped)
{
    const vf vm = vset1(m), vinv = vset1(inv_l), vd = vset1(delta), vs = vset1(scale);
    for (int64_t j = 0; j < n; j += VW) {
        vmask keep = vmask_first((int)KMIN((int64_t)VW, n - j));
        vf pr = vmul(vexp(vsub(vload_m(x + j, keep), vm)), vinv);
        vstore_m(x + j, pr, keep);
        vf g = vmul(vmul(pr, vsub(vload_m(dp + j, keep), vd)), vs);
        if (capped != NULL) {
            /* Through the soft cap: d(c tanh(s/c))/ds = 1 - tanh^2. */
            vf th = vload_m(capped + j, keep);
            g = vmul(g, vsub(vset1(1.0f), vmul(th, th)));
        }
        vstore_m(dp + j, vmasked(g, vnot_one(pr)), keep);
    }
}

/*
 * score_row and softmax_grad_row for a strip of n <= KMR rows that all see
 * all KERN_BK keys of the tile with nothing but the scale (rows_see_all),
 * every row with some weight: the same operations in the same order, the
 * rows side by side so that their exponentials overlap (see strip_plain).
 */
static inline __attribute__((always_inline)) void
KF(bwd_strip_plain)(float *ps, float *ds, const attn_softmax_row *rows, const float *delta,
                    float scale, int n)
{
    const vf vs = vset1(scale);
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++) {
        if (r >= n)
            break;
        const vf vm = vset1(rows[r].max), vinv = vset1(1.0f / rows[r].sum);
        const vf vd = vset1(delta[r]);
#pragma GCC unroll 8
        for (int v = 0; v < KERN_BV; v++) {
            float *x = ps + r * KERN_BK + v * VW, *dp = ds + r * KERN_BK + v * VW;
            vf pr = vmul(vexp(vsub(vmul(vload(x), vs), vm)), vinv);
            vstore(x, pr);
            vf g = vmul(vmul(pr, vsub(vload(dp), vd)), vs);
            vstore(dp, vmasked(g, vnot_one(pr)));
        }
    }
}

/*
 * The row steps of the backward for the strip of `rows` query rows from row
 * r0 of tile t, given its scores q k^T in ps and dP = dO v^T in ds (both
 * [rows, KERN_BK]): ps becomes P, ds becomes dS (times the scale), row by
 * row or, where every row sees every key with nothing but the scale, the
 * strip at once. A fully masked row (l = 0) is zeroed outright.
 */
static inline __attribute__((always_inline)) void
KF(bwd_strip_steps)(const sdpa_call *c, const sdpa_tile *t, const sdpa_bwd_state *st,
                    float *ps, float *ds, int64_t r0, int rows)
{
    const attn_sdpa_params *p = c->p;
    const int64_t cols = t->cols;
    bool all_weighted = true;
    for (int r = 0; r < rows; r++)
        all_weighted &= st->rows[r0 + r].sum > 0.0f;
    if (all_weighted && cols == KERN_BK && KF(rows_see_all)(c, t, t->i0 + r0, rows)) {
        /* A whole strip with its row count known, so its loops unroll. */
        if (rows == KMR)
            KF(bwd_strip_plain)(ps, ds, st->rows + r0, st->delta + r0, p->scale, KMR);
        else
            KF(bwd_strip_plain)(ps, ds, st->rows + r0, st->delta + r0, p->scale, rows);
        return;
    }
    for (int r = 0; r < rows; r++) {
        const int64_t row = r0 + r;
        float *x = ps + r * KERN_BK, *g = ds + r * KERN_BK;
        const attn_softmax_row sm = st->rows[row];
        if (!(sm.sum > 0.0f)) {
            memset(x, 0, (size_t)cols * sizeof *x);
            memset(g, 0, (size_t)cols * sizeof *g);
            continue;
        }
        float *capped = p->variants.softcap > 0.0f ? st->capped : NULL;
        KF(score_row)(c, t, t->i0 + row, x, capped);
        KF(softmax_grad_row)(x, g, cols, sm.max, 1.0f / sm.sum, st->delta[row], p->scale,
                             capped);
    }
}

#endif /* ATTN_KERN_STEPS_H */
