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
    .backward_tile = KF(backward_tile),
    .exp_sum = KF(exp_sum),
    .max = KF(max),
    .scale_finite = KF(scale_finite),
    .scale_wide = KF(scale_wide),
    .fold_partial = KF(fold_partial),
};
