/*
 * The body of libattn's micro-kernels, written once and compiled once per
 * instruction set (kern_generic.c, kern_avx2.c, kern_avx512.c). The file that
 * includes it defines, before the #include:
 *
 *   KF(name)        the name of this instruction set's copy of `name`
 *   KMR, KNV        the register block: KMR rows x KNV vectors of C
 *   VW              floats per vector
 *   vf, vmask       a vector of VW floats, and a lane mask
 *   vzero() vset1(x) vload(p) vstore(p, x)
 *   vmask_first(n)  lanes 0 .. n-1 (0 <= n <= VW)
 *   vload_m(p, m)   masked lanes read (others 0); vstore_m(p, x, m)
 *   vadd vsub vmul vmax vfma(a, b, c) = a * b + c
 *   vhmax(x) vhsum(x)        the largest lane, the sum of the lanes
 *   vexp(x)         exp, within 2 ulp of expf; x < ATTN_EXP_MIN gives 0
 *   vkeep_range(x, lo, hi)   lanes lo <= l < hi of x, -INFINITY elsewhere
 *   vnot_one(x)     the lanes where x != 1.0f
 *   vmasked(x, m)   x in the lanes of m, 0 elsewhere
 *   vtranspose(src, lds, dst, ldd)  a VW x VW block, dst[c][r] = src[r][c]
 *   vnonfinite(x)   the lanes of x that are inf or nan; vmask_none(m)
 *   vbad(x)         the lanes of x that are +inf or nan
 *   vabs vdiv vge(a, b) (a mask) vblend(m, a, b) (a in m, b elsewhere)
 *   vcopysign(x, s) viota() (lane l holds l)
 *
 * Shapes (a tile is query rows i0 .. i0 + rows of head (b, h) against keys
 * j0 .. j0 + cols, cols <= KERN_BK):
 *   q_t [rows, d_k], k_t [cols, d_k], v_t [cols, d_v]   slices of the inputs,
 *                                   rows at the call's strides ldq, ldk, ldv
 *   kt  [d_k, KERN_BK], vt [d_v, KERN_BK]                packed k_t^T, v_t^T
 *   scores [KMR, KERN_BK]                                one strip, in L1
 */
#include <math.h>
#include <string.h>

#include "kern.h"

#define KMIN(a, b) ((a) < (b) ? (a) : (b))

/* ------------------------------------------------------------- products */

/*
 * The register block: C[r][0 .. nv*VW) (+)= sum_p A(r, p) B[p][..] for
 * r < rows <= KMR. Rows past `rows` repeat row 0 (their results are never
 * stored), so the loop body is the same for every strip. The last vector
 * reads and writes only the lanes of `last` when `masked`.
 */
static inline __attribute__((always_inline)) void
KF(block)(const int nv, const bool masked, int rows, int64_t kdim, const float *a,
          int64_t a_rs, int64_t a_cs, const float *b, int64_t ldb, float *c,
          int64_t ldc, vmask last, bool accumulate)
{
    vf acc[KMR][KNV];
    /* Row r of A at ap + off[r]: one pointer moves along p, so the loop
     * body has one address update, not one per row. */
    int64_t off[KMR];
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++)
        off[r] = (r < rows ? r : 0) * a_rs;
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++) {
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            acc[r][v] = vzero();
            if (accumulate && r < rows)
                acc[r][v] = masked && v == nv - 1 ? vload_m(c + r * ldc + v * VW, last)
                                                  : vload(c + r * ldc + v * VW);
        }
    }
    const float *ap = a, *bp = b;
#pragma GCC unroll 2
    for (int64_t p = 0; p < kdim; p++, ap += a_cs, bp += ldb) {
        vf bv[KNV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            bv[v] = masked && v == nv - 1 ? vload_m(bp + v * VW, last) : vload(bp + v * VW);
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
        for (int v = 0; v < nv; v++) {
            if (masked && v == nv - 1)
                vstore_m(c + r * ldc + v * VW, acc[r][v], last);
            else
                vstore(c + r * ldc + v * VW, acc[r][v]);
        }
    }
}

/* One instance per (vectors, masked) pair, so that each block's loops are
 * fully unrolled with its accumulators in registers. */
#define KERN_BLOCK_ARGS                                                              \
    int rows, int64_t kdim, const float *a, int64_t a_rs, int64_t a_cs, const float *b, \
        int64_t ldb, float *c, int64_t ldc, vmask last, bool accumulate
#define KERN_BLOCK_PASS rows, kdim, a, a_rs, a_cs, b, ldb, c, ldc, last, accumulate
#define KERN_BLOCK_INSTANCE(name, nv, masked)                                        \
    static void name(KERN_BLOCK_ARGS) { KF(block)(nv, masked, KERN_BLOCK_PASS); }

KERN_BLOCK_INSTANCE(KF(block_1), 1, false)
KERN_BLOCK_INSTANCE(KF(block_1m), 1, true)
#if KNV >= 2
KERN_BLOCK_INSTANCE(KF(block_2), 2, false)
KERN_BLOCK_INSTANCE(KF(block_2m), 2, true)
#endif
#if KNV >= 3
KERN_BLOCK_INSTANCE(KF(block_3), 3, false)
KERN_BLOCK_INSTANCE(KF(block_3m), 3, true)
#endif
#if KNV >= 4
KERN_BLOCK_INSTANCE(KF(block_4), 4, false)
KERN_BLOCK_INSTANCE(KF(block_4m), 4, true)
#endif

typedef void (*KF(block_fn))(KERN_BLOCK_ARGS);

static const KF(block_fn) KF(blocks)[KNV][2] = {
    {KF(block_1), KF(block_1m)},
#if KNV >= 2
    {KF(block_2), KF(block_2m)},
#endif
#if KNV >= 3
    {KF(block_3), KF(block_3m)},
#endif
#if KNV >= 4
    {KF(block_4), KF(block_4m)},
#endif
};

/* C [rows, cols] (+)= A B, in column chunks of KNV vectors. */
static void KF(gemm)(int rows, int64_t cols, int64_t kdim, const float *a, int64_t a_rs,
                     int64_t a_cs, const float *b, int64_t ldb, float *c, int64_t ldc,
                     bool accumulate)
{
    for (int64_t c0 = 0; c0 < cols; c0 += KNV * VW) {
        int64_t width = KMIN(cols - c0, (int64_t)(KNV * VW));
        int nv = (int)((width + VW - 1) / VW);
        int tail = (int)(width - (int64_t)(nv - 1) * VW);
        KF(blocks)[nv - 1][tail < VW](rows, kdim, a, a_rs, a_cs, b + c0, ldb, c + c0, ldc,
                                      vmask_first(tail), accumulate);
    }
}

/* dst [cols, KERN_BK] = src^T for src [rows, cols] (row stride lds):
 * whole VW x VW blocks by the register transpose, and dst zero from column
 * rows to the end of its vector (the kernels read whole vectors, masked
 * past the tile's keys; a short tile does not pay for zeroing the whole
 * panel). The last rows, fewer than a vector, go through the register
 * transpose too, from a block where zeros follow them (a sequence of a few
 * keys is all edge); columns past the last whole vector, one by one. */
static void KF(pack_t)(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst)
{
    const int64_t rows_v = rows / VW * VW, cols_v = cols / VW * VW;
    const int64_t padded = (rows + VW - 1) / VW * VW;
    for (int64_t r0 = 0; r0 < rows_v; r0 += VW)
        for (int64_t c0 = 0; c0 < cols_v; c0 += VW)
            vtranspose(src + r0 * lds + c0, lds, dst + c0 * KERN_BK + r0, KERN_BK);
    if (rows > rows_v && cols_v > 0) {
        _Alignas(64) float stage[VW * VW];
        memset(stage, 0, sizeof stage);
        for (int64_t c0 = 0; c0 < cols_v; c0 += VW) {
            for (int64_t r = rows_v; r < rows; r++)
                vstore(stage + (r - rows_v) * VW, vload(src + r * lds + c0));
            vtranspose(stage, VW, dst + c0 * KERN_BK + rows_v, KERN_BK);
        }
    }
    for (int64_t c = cols_v; c < cols; c++) {
        float *d = dst + c * KERN_BK;
        for (int64_t r = 0; r < rows; r++)
            d[r] = src[r * lds + c];
        for (int64_t r = rows; r < padded; r++)
            d[r] = 0.0f;
    }
}

/* ----------------------------------------------------------- row steps */

static float KF(max)(const float *x, int64_t n)
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

static float KF(exp_sum)(float *x, int64_t n, float shift)
{
    const vf s = vset1(shift);
    vf acc = vzero();
    int64_t j = 0;
    for (; j + VW <= n; j += VW) {
        vf e = vexp(vsub(vload(x + j), s));
        vstore(x + j, e);
        acc = vadd(acc, e);
    }
    if (j < n) {
        vmask m = vmask_first((int)(n - j));
        vf e = vexp(vsub(vload_m(x + j, m), s));
        vstore_m(x + j, e, m);
        acc = vadd(acc, vmasked(e, m));
    }
    return vhsum(acc);
}

static void KF(scale_row)(float *x, int64_t n, float f)
{
    const vf s = vset1(f);
    int64_t j = 0;
    for (; j + VW <= n; j += VW)
        vstore(x + j, vmul(vload(x + j), s));
    for (; j < n; j++)
        x[j] *= f;
}

/* x[0..n) *= f; false when a result is not finite (inf or nan). */
static bool KF(scale_finite)(float *x, int64_t n, float f)
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

/* The largest of x[0..n); NaN when one is NaN or +inf (scores that
 * overflowed float32: the row must be redone in double). */
static float KF(max_checked)(const float *x, int64_t n)
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
static float KF(score_row)(const sdpa_call *c, const sdpa_tile *t, int64_t i, float *x,
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

/*
 * Online softmax (FlashAttention): each row keeps its running maximum m and
 * the running sum l of exp(x - m); when a tile raises m, the sum and the
 * output accumulated so far are rescaled by exp(m_old - m_new). Subtracting
 * the maximum keeps every exponent <= 0, so nothing overflows, and the row's
 * largest score contributes exactly exp(0) = 1 (scores of +-1e4 give an
 * exact one-hot). Normalisation by l waits until the last tile.
 *
 * Per strip of KMR query rows: scores = q_strip k_t^T (one register block
 * per 64 keys), the row steps on the strip while it is in L1, then
 * out_strip += P v_t.
 */
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
 * The row steps of a whole strip at once, for a tile every row of which
 * sees all its keys, with no mask, ALiBi or soft cap, no statistics or
 * weights: `rows` rows (KMR in all but a block's last strip) of `cols`
 * keys (KERN_BK in all but a sequence's last tile: then the last of its nv
 * vectors holds `tail` keys). The rows go through each phase together, so
 * that the latency of one row's maximum and exponentials hides behind the
 * others' (row by row, each waited for its own). The arithmetic is
 * score_row's and exp_sum's, operation for operation (a short last vector
 * read and summed as they read and sum it), so the bits are those of the
 * row-by-row path. False, with the strip untouched, when a score
 * overflowed (the row-by-row path then marks that row for double).
 */
static inline __attribute__((always_inline)) bool
KF(strip_steps)(float *s, float scale, const float *m_old, float *m_new, float *sum,
                const int rows, const int nv, const bool short_last, int tail)
{
    const vf vs = vset1(scale);
    const vmask last = vmask_first(tail);
    vf m[KMR];
    vmask bad = vmask_first(0);
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++)
        m[r] = vset1(-INFINITY);
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++) {
        if (r >= rows)
            break;
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) {
            const float *p = s + r * KERN_BK + v * VW;
            vf x = short_last && v == nv - 1 ? vkeep_range(vmul(vload_m(p, last), vs), 0, tail)
                                             : vmul(vload(p), vs);
            m[r] = vmax(m[r], x);
            bad |= vbad(x);
        }
    }
    if (!vmask_none(bad))
        return false;
    vf shift[KMR], acc[KMR];
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++)
        shift[r] = acc[r] = vzero(); /* (rows past `rows` are never read) */
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++) {
        if (r >= rows)
            break;
        float tile = vhmax(m[r]);
        m_new[r] = tile > m_old[r] ? tile : m_old[r];
        shift[r] = vset1(m_new[r]);
        acc[r] = vzero();
    }
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++) {
        if (r >= rows)
            break;
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) {
            float *x = s + r * KERN_BK + v * VW;
            if (short_last && v == nv - 1) {
                vf e = vexp(vsub(vmul(vload_m(x, last), vs), shift[r]));
                vstore_m(x, e, last);
                acc[r] = vadd(acc[r], vmasked(e, last));
            } else {
                vf e = vexp(vsub(vmul(vload(x), vs), shift[r]));
                vstore(x, e);
                acc[r] = vadd(acc[r], e);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++) {
        if (r >= rows)
            break;
        sum[r] = vhsum(acc[r]);
    }
    return true;
}

/* The usual tile: KMR rows of KERN_BK keys, every loop unrolled. */
static bool KF(strip_plain)(float *s, float scale, const float *m_old, float *m_new,
                            float *sum)
{
    return KF(strip_steps)(s, scale, m_old, m_new, sum, KMR, KERN_BV, false, 0);
}

/* A block's last strip, or a sequence's last tile: fewer rows or keys. */
static bool KF(strip_short)(float *s, float scale, const float *m_old, float *m_new, float *sum,
                            int rows, int64_t cols)
{
    const int nv = (int)((cols + VW - 1) / VW), tail = (int)(cols - (int64_t)(nv - 1) * VW);
    if (tail == VW)
        return KF(strip_steps)(s, scale, m_old, m_new, sum, rows, nv, false, 0);
    return KF(strip_steps)(s, scale, m_old, m_new, sum, rows, nv, true, tail);
}

/* Do all `rows` rows of the strip from row i see all the keys of the
 * tile, with nothing but the scale on their scores? */
static inline bool KF(strip_sees_all)(const sdpa_call *c, const sdpa_tile *t, int64_t i,
                                      int rows)
{
    if (!c->plain)
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

static void KF(forward_tile)(const sdpa_call *c, const sdpa_tile *t, const kern_keys *keys,
                             sdpa_fwd_state *st)
{
    const attn_sdpa_params *p = c->p;
    const int64_t d_k = p->d_k, d_v = p->d_v, ldq = c->ldq, ldo = c->ldo;
    const float *q = sdpa_head_q(c, t->b, t->h) + t->i0 * ldq;
    float *s = st->strip;
    for (int64_t r0 = 0; r0 < t->rows; r0 += KMR) {
        const int rows = (int)KMIN((int64_t)KMR, t->rows - r0);
        KF(gemm)(rows, t->cols, d_k, q + r0 * ldq, ldq, 1, keys->kt, KERN_BK, s, KERN_BK,
                 false);
        float m_new[KMR], sum[KMR];
        const bool whole = rows == KMR && t->cols == KERN_BK;
        if (st->stats == NULL && st->weights == NULL &&
            KF(strip_sees_all)(c, t, t->i0 + r0, rows) &&
            (whole ? KF(strip_plain)(s, p->scale, st->m + r0, m_new, sum)
                   : KF(strip_short)(s, p->scale, st->m + r0, m_new, sum, rows, t->cols))) {
            for (int r = 0; r < rows; r++)
                KF(fold_row)(st, r0 + r, st->m[r0 + r], m_new[r], sum[r], d_v, ldo);
        } else {
            for (int r = 0; r < rows; r++) {
                const int64_t row = r0 + r, i = t->i0 + row;
                float *x = s + r * KERN_BK;
                if (st->stats != NULL)
                    sdpa_fwd_stats_raw(st, x, t->cols);
                float m_old = st->m[row];
                float m_tile = KF(score_row)(c, t, i, x, NULL);
                if (isnan(m_tile)) {
                    /* Scores overflowed: the row is redone in double at the
                     * end (a NaN sum says so); here it contributes nothing. */
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
                KF(fold_row)(st, row, m_old, m_row, KF(exp_sum)(x, t->cols, m_row), d_v, ldo);
                if (st->stats != NULL)
                    sdpa_fwd_stats_entropy(st, row, x, t->cols, m_row);
                if (st->weights != NULL)
                    sdpa_fwd_keep_weights(c, st, t, row, x);
            }
        }
        /* The first key tile writes the output rows, later ones add. */
        KF(gemm)(rows, d_v, t->cols, s, KERN_BK, 1, keys->v, c->ldv, st->out + r0 * ldo, ldo,
                 st->accumulate);
    }
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
static void KF(softmax_grad_row)(float *x, float *dp, int64_t n, float m, float inv_l,
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
 * score_row and softmax_grad_row for a whole strip whose rows all see all
 * the tile's keys with nothing but the scale (strip_sees_all), every row
 * with some weight: the same operations in the same order, the rows side
 * by side so that their exponentials overlap (see strip_plain).
 */
static void KF(bwd_strip_plain)(float *ps, float *ds, const attn_softmax_row *rows,
                                const float *delta, float scale)
{
    const vf vs = vset1(scale);
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++) {
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
 * FlashAttention-2's backward step for query rows t against key tile t,
 * with P rebuilt from the forward's row maxima and sums:
 *   S = q_t k_t^T, P = exp(final(S) - m) / l      [rows, cols]
 *   dP = dO v_t^T, dS = P * (dP - delta)          [rows, cols]
 *   dq += scale dS k_t   (strip by strip, while dS is in L1)
 *   dv += P^T dO         dk += scale dS^T q_t     (after the last strip)
 * A hidden score has P = 0 and contributes nothing; a fully masked row
 * (l = 0) is zeroed outright, so its gradients stay exactly 0.
 */
static void KF(backward_tile)(const sdpa_call *c, const sdpa_tile *t,
                              const sdpa_bwd_keys *keys, const sdpa_bwd_state *st)
{
    const attn_sdpa_params *p = c->p;
    const int64_t d_k = p->d_k, d_v = p->d_v, cols = t->cols;
    const int64_t ldq = c->ldq, ldk = c->ldk, ldv = c->ldv, ldo = c->ldo;
    const float *q = sdpa_head_q(c, t->b, t->h) + t->i0 * ldq;
    float *P = st->p, *dS = st->ds;
    for (int64_t r0 = 0; r0 < t->rows; r0 += KMR) {
        const int rows = (int)KMIN((int64_t)KMR, t->rows - r0);
        float *ps = P + r0 * KERN_BK, *ds = dS + r0 * KERN_BK;
        KF(gemm)(rows, cols, d_k, q + r0 * ldq, ldq, 1, keys->kt, KERN_BK, ps, KERN_BK,
                 false);
        KF(gemm)(rows, cols, d_v, st->dout + r0 * ldo, ldo, 1, keys->vt, KERN_BK, ds,
                 KERN_BK, false);
        bool all_weighted = true;
        for (int r = 0; r < rows; r++)
            all_weighted &= st->rows[r0 + r].sum > 0.0f;
        if (all_weighted && rows == KMR && cols == KERN_BK &&
            KF(strip_sees_all)(c, t, t->i0 + r0, rows)) {
            KF(bwd_strip_plain)(ps, ds, st->rows + r0, st->delta + r0, p->scale);
            KF(gemm)(rows, d_k, cols, ds, KERN_BK, 1, keys->k, ldk, st->dq + r0 * ldq, ldq,
                     true);
            continue;
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
        KF(gemm)(rows, d_k, cols, ds, KERN_BK, 1, keys->k, ldk, st->dq + r0 * ldq, ldq, true);
    }
    for (int64_t c0 = 0; c0 < cols; c0 += KMR) {
        const int keys_n = (int)KMIN((int64_t)KMR, cols - c0);
        KF(gemm)(keys_n, d_v, t->rows, P + c0, 1, KERN_BK, st->dout, ldo, st->dv + c0 * ldv,
                 ldv, true);
        KF(gemm)(keys_n, d_k, t->rows, dS + c0, 1, KERN_BK, q, ldq, st->dk + c0 * ldk, ldk,
                 true);
    }
}

/* ------------------------------------------------------------------ table */

const attn_kern KF(attn_kern) = {
    .kind = KERN_KIND,
    .mr = KMR,
    .gemm = KF(gemm),
    .pack_t = KF(pack_t),
    .forward_tile = KF(forward_tile),
    .backward_tile = KF(backward_tile),
    .exp_sum = KF(exp_sum),
    .max = KF(max),
    .scale_finite = KF(scale_finite),
};
