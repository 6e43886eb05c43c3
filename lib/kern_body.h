/*
 * The float32 body of libattn's micro-kernels, written once and compiled
 * once per instruction set (kern_generic.c, kern_avx2.c, kern_avx512.c):
 * the register-blocked product, and the forward and backward tiles built
 * from it and the row steps of kern_steps.h. The file that includes it
 * defines, before the #include, the vector operations kern_steps.h lists,
 * and:
 *
 *   KNV             vectors per row of a register block (KMR x KNV of C)
 *   KERN_KIND       the attn_kernel_kind of this copy
 *
 * Shapes (a tile is query rows i0 .. i0 + rows of head (b, h) against keys
 * j0 .. j0 + cols, cols <= KERN_BK):
 *   q_t [rows, d_k], k_t [cols, d_k], v_t [cols, d_v]   slices of the inputs,
 *                                   rows at the call's strides ldq, ldk, ldv
 *   kt  [d_k, KERN_BK], vt [d_v, KERN_BK]                packed k_t^T, v_t^T
 *   scores [KMR, KERN_BK]                                one strip, in L1
 */
#include "kern_steps.h"

/* ------------------------------------------------------------- products */

/*
 * The register block: C[r][0 .. nv*VW) (+)= sum_p A(r, p) B[p][..] for
 * r < rows <= KMR. Rows past `rows` repeat row 0 (their results are never
 * stored), so the loop body is the same for every strip. The last vector
 * reads and writes only the lanes of `last` when `masked`.
 */
static inline __attribute__((always_inline)) void
KF(block)(const int mr, const int nv, const bool masked, int rows, int64_t kdim, const float *a,
          int64_t a_rs, int64_t a_cs, const float *b, int64_t ldb, float *c,
          int64_t ldc, vmask last, bool accumulate)
{
    vf acc[KMR][KNV];
    /* Row r of A at ap + off[r]: one pointer moves along p, so the loop
     * body has one address update, not one per row. */
    int64_t off[KMR];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
        off[r] = (r < rows ? r : 0) * a_rs;
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
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
        for (int r = 0; r < mr; r++) {
            vf ab = vset1(ap[off[r]]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++)
                acc[r][v] = vfma(ab, bv[v], acc[r][v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
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
    static void name(KERN_BLOCK_ARGS) { KF(block)(KMR, nv, masked, KERN_BLOCK_PASS); }

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

/* A strip of at most KERN_SHORT_MR rows (the last of a tile of 64 rows
 * or keys in strips of 6) in whole vectors: a block of that many rows, not
 * KMR rows of which the last repeat row 0. Each element is the same sum as
 * in the KMR-row block, bit for bit. */
#define KERN_SHORT_MR 4
#if KMR > KERN_SHORT_MR
static void KF(block_short)(KERN_BLOCK_ARGS)
{
    KF(block)(KERN_SHORT_MR, KNV, false, KERN_BLOCK_PASS);
}
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
#if KMR > KERN_SHORT_MR
        if (rows <= KERN_SHORT_MR && nv == KNV && tail == VW) {
            KF(block_short)(rows, kdim, a, a_rs, a_cs, b + c0, ldb, c + c0, ldc,
                            vmask_first(tail), accumulate);
            continue;
        }
#endif
        KF(blocks)[nv - 1][tail < VW](rows, kdim, a, a_rs, a_cs, b + c0, ldb, c + c0, ldc,
                                      vmask_first(tail), accumulate);
    }
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
static void KF(forward_tile)(const sdpa_call *c, const sdpa_tile *t, const kern_keys *keys,
                             sdpa_fwd_state *st)
{
    const attn_sdpa_params *p = c->p;
    const int64_t d_k = p->d_k, d_v = p->d_v, ldq = c->ldq, ldo = c->ldo;
    const float *q = sdpa_head_q(c, t->b, t->h) + t->i0 * ldq;
    float *s = st->strip;
    for (int64_t r0 = 0; r0 < t->rows; r0 += KMR) {
        const int rows = (int)KMIN((int64_t)KMR, t->rows - r0);
        KF(gemm)(rows, t->cols, d_k, q + r0 * ldq, ldq, 1, keys->kt, keys->ld, s, KERN_BK,
                 false);
        float m_new[KMR], sum[KMR];
        if (KF(fwd_strip_plain)(c, t, st, r0, rows) &&
            KF(strip_plain)(s, p->scale, st->m + r0, m_new, sum)) {
            for (int r = 0; r < KMR; r++)
                KF(fold_row)(st, r0 + r, st->m[r0 + r], m_new[r], sum[r], d_v, ldo);
        } else if (t->cols < KERN_BK && st->stats == NULL && st->weights == NULL &&
                   KF(rows_see_all)(c, t, t->i0 + r0, rows) &&
                   KF(strip_plain_narrow)(s, rows, t->cols, p->scale, st->m + r0, m_new, sum)) {
            for (int r = 0; r < rows; r++)
                KF(fold_row)(st, r0 + r, st->m[r0 + r], m_new[r], sum[r], d_v, ldo);
        } else {
            KF(fwd_rows)(c, t, st, s, r0, rows, false);
        }
        /* The first key tile writes the output rows, later ones add. */
        KF(gemm)(rows, d_v, t->cols, s, KERN_BK, 1, keys->v, c->ldv, st->out + r0 * ldo, ldo,
                 st->accumulate);
    }
}

/* ------------------------------------------------------ short sequences */

/*
 * A short sequence (at most KERN_BK keys: one tile) through its rows of one
 * head at once, without the tiled path's state: the scores, their softmax
 * and the output rows P v, each output row written once. Two ways:
 *
 * The tiled path's arithmetic on a first tile, then the finish of a row
 * (scale_wide), operation for operation: the same bits, over k^T packed in
 * a panel. With at most VW keys (one vector of scores a row) up to KSR rows
 * go through each step together, their score sums side by side in
 * registers (a row's 64-step sum alone would wait on each FMA's latency)
 * and their reductions overlapping; with more keys, a strip of KMR rows at
 * a time. This way whenever the softmax rows are asked for: the backward
 * rebuilds the weights from them and its own scores, summed the tiled way,
 * and they must be the same sums.
 *
 * Otherwise, with at most KERN_SHORT_DIRECT keys, the keys are read where
 * they are (no panel of k^T): a strip of up to VW query rows, one row a
 * lane, goes through them key by key. A score q_i . k_j is summed with d_k
 * in the lanes (q_i's and k_j's rows multiplied vector by vector), and the
 * strip's sums of lanes for key j are taken together (vhsums: a
 * transpose-and-add tree), one vector of the strip's scores a key. The
 * softmax is then vertical (the strip's maxima and sums one vector each, no
 * reduction across lanes), and P = exp(s - m) / l is made before the
 * products, so that the output rows need no finish. Not the tiled path's
 * order of operations: its outputs differ from it by roundings
 * (tests/test_kernels.c bounds them).
 */

/* Rows of the one-vector scores block: as many as a register block holds. */
#define KSR (KMR * KNV)

/* o [rows, ..) = (P v)[rows], one register block of nv vectors: P (rows
 * [rows, keys], P(r, j) at pm[r * p_rs + j * p_cs]), the products from
 * zero, key by key (KF(block)'s order); when `scaled` each lane then
 * divided as scale_wide divides (inv = 1 / l), and written around the
 * caches when `stream` (KF(short_out) says when: whole cache lines). The
 * lanes not finite in some row. */
static inline __attribute__((always_inline)) vmask
KF(short_out_block)(const int R, const int nv, const bool masked, const bool scaled, int rows,
                    int64_t keys, const float *pm, int64_t p_rs, int64_t p_cs, const float *v,
                    int64_t ldv, float *o, int64_t ldo, vmask last, const double *inv,
                    bool stream, kern_prefetch *pf)
{
    vf acc[KMR][KNV];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int u = 0; u < nv; u++)
            acc[r][u] = vzero();
    /* Rows past `rows` repeat row 0, as in KF(block). */
    int64_t off[KMR];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        off[r] = (r < rows ? r : 0) * p_rs;
    const float *vp = v, *pp = pm;
#pragma GCC unroll 2
    for (int64_t j = 0; j < keys; j++, vp += ldv, pp += p_cs) {
        kern_prefetch_some(pf, 2);
        vf bv[KNV];
#pragma GCC unroll 4
        for (int u = 0; u < nv; u++)
            bv[u] = masked && u == nv - 1 ? vload_m(vp + u * VW, last) : vload(vp + u * VW);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            vf pr = vset1(pp[off[r]]);
#pragma GCC unroll 4
            for (int u = 0; u < nv; u++)
                acc[r][u] = vfma(pr, bv[u], acc[r][u]);
        }
    }
    /* y * 0 is 0 where y is finite, nan where it is not: one sum of
     * them, one test at the end */
    vf zeros = vzero();
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        if (r >= rows)
            break;
#pragma GCC unroll 4
        for (int u = 0; u < nv; u++) {
            vf y = scaled ? vmul_d(acc[r][u], inv[r]) : acc[r][u];
            zeros = vfma(y, vzero(), zeros);
            if (masked && u == nv - 1)
                vstore_m(o + r * ldo + u * VW, y, last);
            else if (stream)
                vstream(o + r * ldo + u * VW, y);
            else
                vstore(o + r * ldo + u * VW, y);
        }
    }
    return vnonfinite(zeros);
}

#define KERN_SHORT_ARGS                                                                   \
    int rows, int64_t keys, const float *pm, int64_t p_rs, int64_t p_cs, const float *v,  \
        int64_t ldv, float *o, int64_t ldo, vmask last, const double *inv, bool stream,   \
        kern_prefetch *pf
#define KERN_SHORT_PASS rows, keys, pm, p_rs, p_cs, v, ldv, o, ldo, last, inv, stream, pf
#define KERN_SHORT_INSTANCE(name, nv, masked, scaled)                                     \
    static vmask name(KERN_SHORT_ARGS)                                                    \
    {                                                                                     \
        return KF(short_out_block)(KMR, nv, masked, scaled, KERN_SHORT_PASS);             \
    }
#define KERN_SHORT_INSTANCES(nv)                                                          \
    KERN_SHORT_INSTANCE(KF(short_out_##nv), nv, false, false)                             \
    KERN_SHORT_INSTANCE(KF(short_out_##nv##m), nv, true, false)                           \
    KERN_SHORT_INSTANCE(KF(short_out_##nv##s), nv, false, true)                           \
    KERN_SHORT_INSTANCE(KF(short_out_##nv##ms), nv, true, true)

KERN_SHORT_INSTANCES(1)
#if KNV >= 2
KERN_SHORT_INSTANCES(2)
#endif
#if KNV >= 3
KERN_SHORT_INSTANCES(3)
#endif
#if KNV >= 4
KERN_SHORT_INSTANCES(4)
#endif

typedef vmask (*KF(short_out_fn))(KERN_SHORT_ARGS);

/* By vectors, masked, scaled. */
#define KERN_SHORT_ROW(nv)                                                                \
    {{KF(short_out_##nv), KF(short_out_##nv##s)}, {KF(short_out_##nv##m), KF(short_out_##nv##ms)}}
static const KF(short_out_fn) KF(short_outs)[KNV][2][2] = {
    KERN_SHORT_ROW(1),
#if KNV >= 2
    KERN_SHORT_ROW(2),
#endif
#if KNV >= 3
    KERN_SHORT_ROW(3),
#endif
#if KNV >= 4
    KERN_SHORT_ROW(4),
#endif
};

/* The same block for exactly R rows (rows == R) of KNV whole vectors,
 * scaled or not: no row's products repeated for the rows past a strip's.
 * Each output lane is the same sum whatever the block's rows. */
#define KERN_EXACT_INSTANCE(R)                                                            \
    static vmask KF(short_out_r##R)(KERN_SHORT_ARGS)                                      \
    {                                                                                     \
        return KF(short_out_block)(R, KNV, false, false, KERN_SHORT_PASS);                \
    }                                                                                     \
    static vmask KF(short_out_r##R##s)(KERN_SHORT_ARGS)                                   \
    {                                                                                     \
        return KF(short_out_block)(R, KNV, false, true, KERN_SHORT_PASS);                 \
    }

KERN_EXACT_INSTANCE(1)
KERN_EXACT_INSTANCE(2)
KERN_EXACT_INSTANCE(3)
KERN_EXACT_INSTANCE(4)
#if KMR >= 5
KERN_EXACT_INSTANCE(5)
#endif
#if KMR >= 6
KERN_EXACT_INSTANCE(6)
#endif
_Static_assert(KMR == 4 || KMR == 6, "an exact block for every row count up to KMR");

/* By rows - 1, scaled. */
#define KERN_EXACT_ROW(R) {KF(short_out_r##R), KF(short_out_r##R##s)}
static const KF(short_out_fn) KF(short_exact)[KMR][2] = {
    KERN_EXACT_ROW(1), KERN_EXACT_ROW(2), KERN_EXACT_ROW(3), KERN_EXACT_ROW(4),
#if KMR >= 6
    KERN_EXACT_ROW(5), KERN_EXACT_ROW(6),
#endif
};

/* Output rows from `rows` rows of their weights P (P(r, j) at pm[r *
 * p_rs + j * p_cs]), in strips of at most KMR rows split evenly (7 rows as
 * 4 and 3, not 6 and 1), a strip of whole vectors by its exact block; with
 * inv (1 / l) not NULL each row divided by its sum on the way out: the
 * lanes not finite. */
static vmask KF(short_out)(const sdpa_call *c, int rows, int64_t keys, const float *pm,
                           int64_t p_rs, int64_t p_cs, const float *v, float *o,
                           const double *inv, kern_prefetch *pf)
{
    const int64_t d_v = c->p->d_v, ldo = c->ldo;
    /* Streaming stores take whole aligned vectors, and pay off for whole
     * cache lines (a part of a line goes to memory as a slow partial
     * write): every row of whole lines. */
    enum { LINE = 64 / sizeof(float) };
    const bool stream = c->out_stream && LINE % VW == 0 &&
                        (uintptr_t)o % (LINE * sizeof(float)) == 0 && ldo % LINE == 0 &&
                        d_v % LINE == 0;
    vmask bad = vmask_first(0);
    const int strips = (rows + KMR - 1) / KMR;
    for (int s = 0, r0 = 0; s < strips; s++) {
        /* (the first rows % strips strips one row longer) */
        const int strip = rows / strips + (s < rows % strips);
        for (int64_t c0 = 0; c0 < d_v; c0 += KNV * VW) {
            const int64_t width = KMIN(d_v - c0, (int64_t)(KNV * VW));
            const int nv = (int)((width + VW - 1) / VW);
            const int tail = (int)(width - (int64_t)(nv - 1) * VW);
            const KF(short_out_fn) f = width == KNV * VW
                                           ? KF(short_exact)[strip - 1][inv != NULL]
                                           : KF(short_outs)[nv - 1][tail < VW][inv != NULL];
            bad |= f(strip, keys, pm + r0 * p_rs, p_rs, p_cs, v + c0, c->ldv, o + r0 * ldo + c0,
                     ldo, vmask_first(tail), inv != NULL ? inv + r0 : NULL, stream, pf);
        }
        r0 += strip;
    }
    return bad;
}

/*
 * Rows [R] (R a multiple of 4, rows <= R of them real) of at most VW keys
 * (`keys` the lanes that are), from row i0 of the sequence: their scores q
 * k^T in R accumulators, each the sum KF(block) makes of its lane, then
 * the softmax of every row at once, as score_row, exp_sum and the narrow
 * strip step it (row i0 + r seeing keys [lo, hi) of sdpa_row_range, all of
 * them when `whole`): P [rows, VW] into pm, inv[r] = 1 / sum, sm[r] the
 * row's maximum and sum (when not NULL). False when a score is not finite
 * or a row sees no key.
 */
static inline __attribute__((always_inline)) bool
KF(short_vector_rows)(const int R, const sdpa_call *c, int rows, int64_t keys, const float *q,
                      const float *kt, int64_t ld, int64_t i0, bool whole, float *pm,
                      double *inv, attn_softmax_row *sm, kern_prefetch *pf)
{
    const int64_t d_k = c->p->d_k, ldq = c->ldq;
    const vmask lanes = vmask_first((int)keys);
    const bool narrow = keys < VW;
    /* Each row's visible keys first, while no accumulator is live. */
    int64_t lo[KSR], hi[KSR];
    for (int r = 0; r < R; r++) {
        lo[r] = 0;
        hi[r] = keys;
        if (!whole && r < rows)
            sdpa_row_range(c, i0 + r, c->k_lo, keys, &lo[r], &hi[r]);
    }
    vf acc[KSR];
    int64_t off[KSR];
#pragma GCC unroll 24
    for (int r = 0; r < R; r++) {
        acc[r] = vzero();
        off[r] = (r < rows ? r : 0) * ldq;
    }
    kern_prefetch_some(pf, 8);
    const float *ap = q, *bp = kt;
#pragma GCC unroll 2
    for (int64_t p = 0; p < d_k; p++, ap++, bp += ld) {
        const vf bv = narrow ? vload_m(bp, lanes) : vload(bp);
#pragma GCC unroll 24
        for (int r = 0; r < R; r++)
            acc[r] = vfma(vset1(ap[off[r]]), bv, acc[r]);
    }
    const vf vs = vset1(c->p->scale);
    vmask bad = vmask_first(0);
    float m[KSR];
#pragma GCC unroll 24
    for (int r = 0; r < R; r++) {
        vf y = vmul(acc[r], vs);
        if (narrow || lo[r] > 0 || hi[r] < VW)
            y = vkeep_range(y, lo[r], hi[r]);
        acc[r] = y;
        m[r] = vhmax(y);
        if (r < rows) /* (the rows past them repeat row 0, not its range) */
            bad |= vbad(y);
    }
    bool seen = true;
#pragma GCC unroll 24
    for (int r = 0; r < R; r++)
        seen &= r >= rows || m[r] != -INFINITY;
    if (!vmask_none(bad) || !seen)
        return false;
#pragma GCC unroll 24
    for (int r = 0; r < R; r++) {
        const vf e = vexp(vsub(acc[r], vset1(m[r])));
        vstore(pm + r * VW, e);
        const float sum = vhsum(vadd(vzero(), vmasked(e, lanes)));
        inv[r] = 1.0 / (double)sum;
        if (sm != NULL && r < rows)
            sm[r] = (attn_softmax_row){.max = m[r], .sum = sum};
    }
    return true;
}

#define KERN_VROWS_ARGS                                                                    \
    const sdpa_call *c, int rows, int64_t keys, const float *q, const float *kt, int64_t ld, \
        int64_t i0, bool whole, float *pm, double *inv, attn_softmax_row *sm, kern_prefetch *pf
#define KERN_VROWS_PASS c, rows, keys, q, kt, ld, i0, whole, pm, inv, sm, pf
#define KERN_VROWS_INSTANCE(R)                                                             \
    static bool KF(short_vector_rows_##R)(KERN_VROWS_ARGS)                                 \
    {                                                                                      \
        return KF(short_vector_rows)(R, KERN_VROWS_PASS);                                  \
    }

KERN_VROWS_INSTANCE(4)
KERN_VROWS_INSTANCE(8)
KERN_VROWS_INSTANCE(12)
#if KSR >= 16
KERN_VROWS_INSTANCE(16)
#endif
#if KSR >= 20
KERN_VROWS_INSTANCE(20)
#endif
#if KSR >= 24
KERN_VROWS_INSTANCE(24)
#endif

typedef bool (*KF(vrows_fn))(KERN_VROWS_ARGS);

/* By rows rounded up to a multiple of 4. */
static const KF(vrows_fn) KF(short_vector_blocks)[KSR / 4] = {
    KF(short_vector_rows_4), KF(short_vector_rows_8), KF(short_vector_rows_12),
#if KSR >= 16
    KF(short_vector_rows_16),
#endif
#if KSR >= 20
    KF(short_vector_rows_20),
#endif
#if KSR >= 24
    KF(short_vector_rows_24),
#endif
};

/* The scores of up to R rows of q (row stride ldq; rows past `rows`
 * repeat row 0) against keys k_j (row stride ldk), unscaled: lane r of
 * st[j * VW ..] is q_r . k_j, the sum of d_k in the lanes (lane by lane from
 * zero, then vhsums); its other lanes are left alone. G keys at a time (R G
 * <= VW, at most 16 sums): one vhsums takes the G keys' R sums each, key g's
 * in lanes g R .. g R + R (vhsums adds in the same order whatever its
 * width, so each lane is the same sum whatever R and G), and each row of q
 * loaded once serves G keys. At most 8 rows, so that their addresses stay
 * in registers. */
static inline __attribute__((always_inline)) void
KF(short_scores)(const int R, const int G, int rows, int64_t keys, int64_t d_k, const float *q,
                 int64_t ldq, const float *k, int64_t ldk, float *st, kern_prefetch *pf)
{
    const float *qr[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        qr[r] = q + (r < rows ? r : 0) * ldq;
    const int64_t whole = d_k / VW * VW;
    const vmask tail = vmask_first((int)(d_k - whole));
    /* key g's lanes of a vhsums */
    vmask part[4];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
        part[g] = vmask_first((g + 1) * R) & ~vmask_first(g * R);
    for (int64_t j = 0; j < keys; j += G) {
        /* (16 lines a key: fewer calls than 4 a key, and ahead of need) */
        kern_prefetch_some(pf, 16 * G);
        /* keys past the last repeat it (their sums are not stored) */
        const float *kj[4];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++)
            kj[g] = k + (j + g < keys ? j + g : keys - 1) * ldk;
        vf acc[16];
#pragma GCC unroll 16
        for (int i = 0; i < R * G; i++)
            acc[i] = vzero();
#pragma GCC unroll 4
        for (int64_t u = 0; u < whole; u += VW) {
            vf kv[4];
#pragma GCC unroll 4
            for (int g = 0; g < G; g++)
                kv[g] = vload(kj[g] + u);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const vf qv = vload(qr[r] + u);
#pragma GCC unroll 4
                for (int g = 0; g < G; g++)
                    acc[g * R + r] = vfma(qv, kv[g], acc[g * R + r]);
            }
        }
        if (whole < d_k) {
            vf kv[4];
#pragma GCC unroll 4
            for (int g = 0; g < G; g++)
                kv[g] = vload_m(kj[g] + whole, tail);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const vf qv = vload_m(qr[r] + whole, tail);
#pragma GCC unroll 4
                for (int g = 0; g < G; g++)
                    acc[g * R + r] = vfma(qv, kv[g], acc[g * R + r]);
            }
        }
        const vf y = vhsums(R * G, acc);
        /* key j + g's sums, lanes g R .. g R + R, into lanes 0 .. R */
#pragma GCC unroll 4
        for (int g = 0; g < G; g++)
            if (j + g < keys)
                vstore_m(st + (j + g) * VW - g * R, y, part[g]);
    }
}

#define KERN_SCORES_ARGS                                                                  \
    int rows, int64_t keys, int64_t d_k, const float *q, int64_t ldq, const float *k,     \
        int64_t ldk, float *st, kern_prefetch *pf
#define KERN_SCORES_PASS rows, keys, d_k, q, ldq, k, ldk, st, pf
#define KERN_SCORES_INSTANCE(R, G)                                                        \
    static void KF(short_scores_##R)(KERN_SCORES_ARGS)                                    \
    {                                                                                     \
        KF(short_scores)(R, G, KERN_SCORES_PASS);                                         \
    }
/* The scores of a strip of rows (at most VW) into lanes 0 .. rows of st
 * [keys, VW]: 8 rows at a time, the last 4 or fewer 4 at a time (each
 * row's lane the same sum). */
#if VW >= 8
KERN_SCORES_INSTANCE(4, VW / 4 < 4 ? VW / 4 : 4)
KERN_SCORES_INSTANCE(8, VW / 8 < 2 ? VW / 8 : 2)
static void KF(strip_scores)(int rows, int64_t keys, int64_t d_k, const float *q, int64_t ldq,
                             const float *k, int64_t ldk, float *st, kern_prefetch *pf)
{
    for (int r0 = 0; r0 < rows; r0 += 8) {
        if (rows - r0 <= 4)
            KF(short_scores_4)(rows - r0, keys, d_k, q + r0 * ldq, ldq, k, ldk, st + r0, pf);
        else
            KF(short_scores_8)(rows - r0 < 8 ? rows - r0 : 8, keys, d_k, q + r0 * ldq, ldq, k,
                               ldk, st + r0, pf);
    }
}
#else
KERN_SCORES_INSTANCE(1, 1)
static void KF(strip_scores)(int rows, int64_t keys, int64_t d_k, const float *q, int64_t ldq,
                             const float *k, int64_t ldk, float *st, kern_prefetch *pf)
{
    KF(short_scores_1)(rows, keys, d_k, q, ldq, k, ldk, st, pf);
}
#endif

/*
 * Rows r0 .. r0 + rows (at most VW) of the in-place step: their scores
 * against every key (keys <= KERN_SHORT_DIRECT), the softmax of each row
 * (row i0 + r seeing the keys [lo, hi) of sdpa_row_range, all of them when
 * `whole`) and their output rows. False when a score is not finite, a row
 * sees no key or an output is not finite. (No softmax rows: see above.)
 */
static bool KF(short_direct)(const sdpa_call *c, int rows, int64_t keys, const float *q,
                             const float *k, const float *v, float *o, int64_t i0, bool whole,
                             kern_prefetch *pf)
{
    const attn_sdpa_params *p = c->p;
    float st[KERN_SHORT_DIRECT * VW];
    KF(strip_scores)(rows, keys, p->d_k, q, c->ldq, k, c->ldk, st, pf);
    /* Row r's visible keys [lo, hi) as lanes (small integers: exact) */
    vf lo = vzero(), hi_1 = vzero();
    if (!whole) {
        float lo_r[VW], hi_r[VW];
        for (int r = 0; r < VW; r++) {
            int64_t l = 0, h = keys;
            if (r < rows)
                sdpa_row_range(c, i0 + r, c->k_lo, keys, &l, &h);
            lo_r[r] = (float)l;
            hi_r[r] = (float)(h - 1);
        }
        lo = vload(lo_r);
        hi_1 = vload(hi_r);
    }
    const vf vs = vset1(p->scale), none = vset1(-INFINITY);
    /* (lanes past rows are not scores: zero, and not checked) */
    const vmask real = vmask_first(rows);
    vf m = none;
    vmask bad = vmask_first(0);
    for (int64_t j = 0; j < keys; j++) {
        vf y = vblend(real, vmul(vload(st + j * VW), vs), vzero());
        if (!whole) {
            const vf at = vset1((float)j);
            y = vblend(vge(at, lo) & vge(hi_1, at), y, none);
        }
        bad |= vbad(y);
        m = vmax(m, y);
        vstore(st + j * VW, y);
    }
    if (!vmask_none((bad | vge(none, m)) & real))
        return false;
    vf l = vzero();
    for (int64_t j = 0; j < keys; j++) {
        const vf e = vexp(vsub(vload(st + j * VW), m));
        vstore(st + j * VW, e);
        l = vadd(l, e);
    }
    const vf inv = vdiv(vset1(1.0f), l);
    for (int64_t j = 0; j < keys; j++)
        vstore(st + j * VW, vmul(vload(st + j * VW), inv));
    return vmask_none(KF(short_out)(c, rows, keys, st, 1, VW, v, o, NULL, pf));
}

/*
 * The softmax of a strip of `rows` score rows s [rows, KERN_BK] of `keys`
 * keys, row i0 + r seeing the keys [lo, hi) of sdpa_row_range (all of them
 * when `whole`): s becomes P = exp(scale s - m) in place, with m the row's
 * largest scaled score, and inv[r] = 1 / sum P, sm[r] the row's maximum
 * and sum (when not NULL). score_row's and exp_sum's operations (the
 * narrow strip's, when whole), so the same bits. False when a score is not
 * finite or a row sees no key.
 */
static bool KF(short_softmax)(const sdpa_call *c, float *s, int rows, int64_t keys, int64_t i0,
                              bool whole, double *inv, attn_softmax_row *sm)
{
    const vf vs = vset1(c->p->scale);
    for (int r = 0; r < rows; r++) {
        float *x = s + r * KERN_BK;
        int64_t lo = 0, hi = keys;
        if (!whole)
            sdpa_row_range(c, i0 + r, c->k_lo, keys, &lo, &hi);
        vf m = vset1(-INFINITY);
        vmask bad = vmask_first(0);
        for (int64_t j = 0; j < keys; j += VW) {
            const bool tail = j + VW > keys;
            vf y = vmul(tail ? vload_m(x + j, vmask_first((int)(keys - j))) : vload(x + j), vs);
            if (j < lo || j + VW > hi)
                y = vkeep_range(y, lo - j, hi - j);
            vstore(x + j, y);
            m = vmax(m, y);
            bad |= vbad(y);
        }
        const float m_row = vhmax(m);
        if (!vmask_none(bad) || m_row == -INFINITY)
            return false;
        const vf shift = vset1(m_row);
        vf acc = vzero();
        for (int64_t j = 0; j < keys; j += VW) {
            vf e = vexp(vsub(vload(x + j), shift));
            if (j + VW > keys) {
                const vmask tail = vmask_first((int)(keys - j));
                vstore_m(x + j, e, tail);
                acc = vadd(acc, vmasked(e, tail));
            } else {
                vstore(x + j, e);
                acc = vadd(acc, e);
            }
        }
        const float sum = vhsum(acc);
        inv[r] = 1.0 / (double)sum;
        if (sm != NULL)
            sm[r] = (attn_softmax_row){.max = m_row, .sum = sum};
    }
    return true;
}

/* Query rows c->q_lo .. c->q_hi of head (b, h) against every key of the
 * sequence (c->k_lo .. c->k_hi, 1 to KERN_BK of them; k^T packed in kt
 * [d_k, ld] unless KF(short_direct) reads them in place: at most
 * KERN_SHORT_DIRECT keys and rows NULL): the output rows from o (row stride
 * c->ldo) and, when rows is not NULL, their softmax rows. False when a row
 * needs the tiled path (a score not finite, a row that sees no key, an
 * output not finite); rows may have been written then. */
static bool KF(forward_short)(const sdpa_call *c, int64_t b, int64_t h, const float *kt,
                              int64_t ld, float *o, attn_softmax_row *rows, kern_prefetch *pf)
{
    const attn_sdpa_params *p = c->p;
    const int64_t ldq = c->ldq, ldo = c->ldo;
    const int64_t n = c->q_hi - c->q_lo, keys = c->k_hi - c->k_lo;
    const float *q = sdpa_head_q(c, b, h) + c->q_lo * ldq;
    const float *v = sdpa_head_v(c, b, h) + c->k_lo * c->ldv;
    /* Every row sees every key (the visible keys only widen down the rows). */
    int64_t lo, hi, lo_last, hi_last;
    sdpa_row_range(c, c->q_lo, c->k_lo, keys, &lo, &hi);
    sdpa_row_range(c, c->q_hi - 1, c->k_lo, keys, &lo_last, &hi_last);
    const bool whole = lo == 0 && hi == keys && lo_last == 0 && hi_last == keys;
    if (keys <= KERN_SHORT_DIRECT && rows == NULL) {
        const float *k = sdpa_head_k(c, b, h) + c->k_lo * c->ldk;
        bool ok = true;
        for (int64_t r0 = 0; r0 < n && ok; r0 += VW)
            ok = KF(short_direct)(c, (int)KMIN((int64_t)VW, n - r0), keys, q + r0 * ldq, k, v,
                                  o + r0 * ldo, c->q_lo + r0, whole, pf);
        kern_prefetch_some(pf, INT_MAX);
        return ok;
    }
    float pm[KSR * KERN_BK];
    double inv[KSR];
    const int block = keys <= VW ? KSR : KMR;
    int64_t done = 0; /* rows */
    for (int64_t r0 = 0; r0 < n; r0 += block) {
        const int strip = (int)KMIN((int64_t)block, n - r0);
        attn_softmax_row *sm = rows != NULL ? rows + r0 : NULL;
        int64_t ldp = KERN_BK;
        if (keys <= VW) {
            ldp = VW;
            if (!KF(short_vector_blocks)[(strip + 3) / 4 - 1](c, strip, keys, q + r0 * ldq, kt,
                                                             ld, c->q_lo + r0, whole, pm, inv,
                                                             sm, pf))
                break;
        } else {
            KF(gemm)(strip, keys, p->d_k, q + r0 * ldq, ldq, 1, kt, ld, pm, KERN_BK, false);
            if (!KF(short_softmax)(c, pm, strip, keys, c->q_lo + r0, whole, inv, sm))
                break;
        }
        if (!vmask_none(KF(short_out)(c, strip, keys, pm, ldp, 1, v, o + r0 * ldo, inv, pf)))
            break;
        done += strip;
    }
    kern_prefetch_some(pf, INT_MAX);
    return done == n;
}

#undef KSR

/* --------------------------------------------------------------- backward */

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
        KF(gemm)(rows, cols, d_k, q + r0 * ldq, ldq, 1, keys->kt, keys->ld, ps, KERN_BK,
                 false);
        KF(gemm)(rows, cols, d_v, st->dout + r0 * ldo, ldo, 1, keys->vt, keys->ld, ds,
                 KERN_BK, false);
        KF(bwd_strip_steps)(c, t, st, ps, ds, r0, rows);
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
    .forward_short = KF(forward_short),
    .backward_tile = KF(backward_tile),
    .exp_sum = KF(exp_sum),
    .max = KF(max),
    .scale_finite = KF(scale_finite),
    .scale_wide = KF(scale_wide),
    .fold_partial = KF(fold_partial),
};
