/*
 * The bfloat16 body of libattn's micro-kernels (ATTN_PRECISION_BFLOAT16),
 * compiled once per instruction set and way of running the products:
 * emulated in kern_generic.c, kern_avx2.c and kern_avx512.c, with
 * vdpbf16ps in kern_avx512_bf16.c. The tiles are the float32 body's
 * (kern_body.h), the row steps the same (kern_steps.h); only the products
 * differ: their operands are rounded to bfloat16 and packed in pairs, two
 * to a 32-bit word (bf16.h), and each word of A against a vector of words
 * of B is one vdpbf16ps step (attn.h states its arithmetic).
 *
 * The file that includes it defines, besides what kern_steps.h needs:
 *   KMR2, KNV2      the product's register block: KMR2 rows (<= KMR, a
 *                   strip is done in chunks) x KNV2 vectors
 *   KERN_KIND, KERN_BF16_PATH   this copy's attn_kernel_kind, attn_bf16_kind
 *   vpair           VW words; vp_load(p) vp_load_m(p, m) vp_store(p, x)
 *                   vp_store_m(p, x, m) vp_set1(w)
 *   vdot2(acc, a, b)  per lane: acc += a.hi b.hi, then acc += a.lo b.lo,
 *                   vdpbf16ps's fused steps (see the emulations)
 *   vbf16_words(lo, hi)        lane l: bf16(lo[l]) | bf16(hi[l]) << 16
 *   vbf16_join(lo, hi)         the same for lo, hi bfloat16 values already
 *   vbf16_weights2(&lo, &hi)   vbf16_weight of both, in place, and their words
 *   vptranspose(src, lds, dst, ldd)  vtranspose of words
 *   KERN_BF16_BEGIN, KERN_BF16_END  statements around a product (the
 *                   emulations set the MXCSR's flush-to-zero and
 *                   denormals-are-zero there, as vdpbf16ps behaves)
 *
 * Shapes, as in kern_body.h, with d2 = ceil(d / 2) words of pairs:
 *   qb [rows, dk2] (the query rows), kp [dk2, KERN_BK], vp [KERN_BK/2, d_v]
 *   pb [KMR, KERN_BK/2] one strip's P
 * (which elements pair up: see the conversions below).
 */
#include "bf16.h"
#include "kern_steps.h"

/* ------------------------------------------------------------- products */

/* A file whose products are not vdot2 steps in registers (AMX tiles)
 * defines KERN_BF16_OWN_GEMM2 and its own KF(gemm2), with the same
 * arguments and the same sums, before including this. */
#ifndef KERN_BF16_OWN_GEMM2

/*
 * The register block: C[r][0 .. nv*VW) (+)= sum_p dot2(A(r, p), B[p][..])
 * for r < rows <= R (R = KMR2, or 1 for a strip of one row: a decode's
 * query), as kern_body.h's block (rows past `rows` repeat row 0 and are
 * not stored; the last vector masked when `masked`). A row's sums are the
 * same whatever R: each row has its own accumulators.
 */
static inline __attribute__((always_inline)) void
KF(block2)(const int R, const int nv, const bool masked, int rows, int64_t kdim, const uint32_t *a,
           int64_t a_rs, int64_t a_cs, const uint32_t *b, int64_t ldb, float *c, int64_t ldc,
           vmask last, bool accumulate)
{
    vf acc[KMR2][KNV2];
    int64_t off[KMR2];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        off[r] = (r < rows ? r : 0) * a_rs;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            acc[r][v] = vzero();
            if (accumulate && r < rows)
                acc[r][v] = masked && v == nv - 1 ? vload_m(c + r * ldc + v * VW, last)
                                                  : vload(c + r * ldc + v * VW);
        }
    }
    const uint32_t *ap = a, *bp = b;
#pragma GCC unroll 2
    for (int64_t p = 0; p < kdim; p++, ap += a_cs, bp += ldb) {
        vpair bv[KNV2];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            bv[v] = masked && v == nv - 1 ? vp_load_m(bp + v * VW, last) : vp_load(bp + v * VW);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            vpair ab = vp_set1(ap[off[r]]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++)
                acc[r][v] = vdot2(acc[r][v], ab, bv[v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
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

#define KERN_BLOCK2_ARGS                                                             \
    int rows, int64_t kdim, const uint32_t *a, int64_t a_rs, int64_t a_cs,            \
        const uint32_t *b, int64_t ldb, float *c, int64_t ldc, vmask last, bool accumulate
#define KERN_BLOCK2_PASS rows, kdim, a, a_rs, a_cs, b, ldb, c, ldc, last, accumulate
/* Not inlined into gemm2: the emulations' MXCSR setting must not move
 * across their arithmetic, and a call is a wall the compiler keeps. */
#define KERN_BLOCK2_INSTANCE(name, R, nv, masked)                                    \
    static __attribute__((noinline)) void name(KERN_BLOCK2_ARGS)                      \
    {                                                                                \
        KF(block2)(R, nv, masked, KERN_BLOCK2_PASS);                                 \
    }
/* block2_<nv>[m] (KMR2 rows) and block2_<nv>[m]_r1 (one row), per vectors
 * of columns nv, the last masked (m) or not. */
#define KERN_BLOCK2_INSTANCES(nv)                                                    \
    KERN_BLOCK2_INSTANCE(KF(block2_##nv), KMR2, nv, false)                           \
    KERN_BLOCK2_INSTANCE(KF(block2_##nv##m), KMR2, nv, true)                         \
    KERN_BLOCK2_INSTANCE(KF(block2_##nv##_r1), 1, nv, false)                         \
    KERN_BLOCK2_INSTANCE(KF(block2_##nv##m_r1), 1, nv, true)

KERN_BLOCK2_INSTANCES(1)
#if KNV2 >= 2
KERN_BLOCK2_INSTANCES(2)
#endif
#if KNV2 >= 3
KERN_BLOCK2_INSTANCES(3)
#endif
#if KNV2 >= 4
KERN_BLOCK2_INSTANCES(4)
#endif

typedef void (*KF(block2_fn))(KERN_BLOCK2_ARGS);

/* [one row?][vectors - 1][masked?] */
static const KF(block2_fn) KF(blocks2)[2][KNV2][2] = {
    {
        {KF(block2_1), KF(block2_1m)},
#if KNV2 >= 2
        {KF(block2_2), KF(block2_2m)},
#endif
#if KNV2 >= 3
        {KF(block2_3), KF(block2_3m)},
#endif
#if KNV2 >= 4
        {KF(block2_4), KF(block2_4m)},
#endif
    },
    {
        {KF(block2_1_r1), KF(block2_1m_r1)},
#if KNV2 >= 2
        {KF(block2_2_r1), KF(block2_2m_r1)},
#endif
#if KNV2 >= 3
        {KF(block2_3_r1), KF(block2_3m_r1)},
#endif
#if KNV2 >= 4
        {KF(block2_4_r1), KF(block2_4m_r1)},
#endif
    },
};

/* C [rows, cols] (+)= A B on words, rows <= KMR: chunks of KMR2 rows and
 * KNV2 vectors of columns. */
static void KF(gemm2)(int rows, int64_t cols, int64_t kdim, const uint32_t *a, int64_t a_rs,
                      int64_t a_cs, const uint32_t *b, int64_t ldb, float *c, int64_t ldc,
                      bool accumulate)
{
    KERN_BF16_BEGIN;
    for (int r0 = 0; r0 < rows; r0 += KMR2) {
        const int rr = rows - r0 < KMR2 ? rows - r0 : KMR2;
        for (int64_t c0 = 0; c0 < cols; c0 += KNV2 * VW) {
            int64_t width = KMIN(cols - c0, (int64_t)(KNV2 * VW));
            int nv = (int)((width + VW - 1) / VW);
            int tail = (int)(width - (int64_t)(nv - 1) * VW);
            KF(blocks2)[rr == 1][nv - 1][tail < VW](rr, kdim, a + r0 * a_rs, a_rs, a_cs, b + c0, ldb,
                                           c + r0 * ldc + c0, ldc, vmask_first(tail),
                                           accumulate);
        }
    }
    KERN_BF16_END;
}
#endif /* KERN_BF16_OWN_GEMM2 */

/* ---------------------------------------------------------- conversions */

/*
 * Which elements share a word: a word holds element t of the summed index
 * in its low half and its partner in the high half. Over the features of
 * q, k, v and dO (the score-like products) and over a tile's keys (P v and
 * dS k), the partner of t is t + h, h = ceil(n / 2) of the n summed (the
 * halves side by side: converting is lane by lane, no shuffles); over query
 * rows (dv, dk), the partner of row 2u is row 2u + 1.
 */

/* d [ceil(n / 2)] = the words of x [n], halves paired (the high half of the
 * last word zero when n is odd). `exact`: x holds bfloat16 values already. */
static inline __attribute__((always_inline)) void
KF(split_words)(const float *x, int64_t n, uint32_t *d, const bool exact)
{
    const int64_t h = (n + 1) / 2;
    for (int64_t t = 0; t < h; t += VW) {
        vmask lo_m = vmask_first((int)KMIN((int64_t)VW, h - t));
        int64_t hi_n = KMIN((int64_t)VW, n - h - t);
        vf lo = vload_m(x + t, lo_m);
        vf hi = hi_n > 0 ? vload_m(x + h + t, vmask_first((int)hi_n)) : vzero();
        vp_store_m(d + t, exact ? vbf16_join(lo, hi) : vbf16_words(lo, hi), lo_m);
    }
}

/* dst [rows, ceil(cols / 2)] (row stride ldd) = the words of each row of
 * src [rows, cols] (row stride lds), rounded, halves paired. */
static void KF(bf16_rows)(const float *src, int64_t lds, int64_t rows, int64_t cols,
                          uint32_t *dst, int64_t ldd)
{
    for (int64_t r = 0; r < rows; r++)
        KF(split_words)(src + r * lds, cols, dst + r * ldd, false);
}

/* dst [pairs, cols] (row stride ldd): word (u, c) holds src[lo][c] and
 * src[hi][c] rounded, for rows lo = 2u, hi = 2u + 1 or, when `split`,
 * lo = u, hi = u + ceil(rows / 2); rows of src past `rows` read as zero. */
static void KF(bf16_row_pairs)(const float *src, int64_t lds, int64_t rows, int64_t cols,
                               uint32_t *dst, int64_t ldd, int64_t pairs, bool split)
{
    const int64_t h = (rows + 1) / 2;
    for (int64_t u = 0; u < pairs; u++) {
        const int64_t lo_row = split ? u : 2 * u, hi_row = split ? u + h : 2 * u + 1;
        const float *lo = src + lo_row * lds, *hi = src + hi_row * lds;
        const bool has_lo = lo_row < rows && (!split || u < h), has_hi = hi_row < rows;
        uint32_t *d = dst + u * ldd;
        for (int64_t c = 0; c < cols; c += VW) {
            vmask m = vmask_first((int)KMIN((int64_t)VW, cols - c));
            vf x0 = has_lo ? vload_m(lo + c, m) : vzero();
            vf x1 = has_hi ? vload_m(hi + c, m) : vzero();
            vp_store_m(d + c, vbf16_words(x0, x1), m);
        }
    }
}

/* Keys for the score-like products: dst [ceil(d / 2), KERN_BK], word
 * (t, j) holding features t and t + ceil(d / 2) of key j of src [keys, d]
 * (row stride lds), zero for j >= keys: each key's words (a block of
 * features at a time), then transposed. */
#define KERN_PACK_WORDS 64 /* words per block */
static void KF(bf16_pack_t)(const float *src, int64_t lds, int64_t keys, int64_t d,
                            uint32_t *dst)
{
    uint32_t rows[KERN_BK * KERN_PACK_WORDS];
    const int64_t keys_v = keys / VW * VW, h = (d + 1) / 2;
    for (int64_t w0 = 0; w0 < h; w0 += KERN_PACK_WORDS) {
        const int64_t words = KMIN(h - w0, (int64_t)KERN_PACK_WORDS), words_v = words / VW * VW;
        uint32_t *out = dst + w0 * KERN_BK;
        for (int64_t r = 0; r < keys; r++) {
            const float *x = src + r * lds;
            uint32_t *o = rows + r * KERN_PACK_WORDS;
            for (int64_t t = 0; t < words; t += VW) {
                const int64_t lo_n = KMIN((int64_t)VW, words - t);
                const int64_t hi_n = KMIN((int64_t)VW, d - h - w0 - t);
                vf lo = vload_m(x + w0 + t, vmask_first((int)lo_n));
                vf hi = hi_n > 0 ? vload_m(x + h + w0 + t, vmask_first((int)hi_n)) : vzero();
                vp_store_m(o + t, vbf16_words(lo, hi), vmask_first((int)lo_n));
            }
        }
        for (int64_t r0 = 0; r0 < keys_v; r0 += VW)
            for (int64_t c0 = 0; c0 < words_v; c0 += VW)
                vptranspose(rows + r0 * KERN_PACK_WORDS + c0, KERN_PACK_WORDS,
                            out + c0 * KERN_BK + r0, KERN_BK);
        for (int64_t c = 0; c < words; c++) {
            uint32_t *o = out + c * KERN_BK;
            for (int64_t r = c < words_v ? keys_v : 0; r < keys; r++)
                o[r] = rows[r * KERN_PACK_WORDS + c];
            for (int64_t r = keys; r < KERN_BK; r++)
                o[r] = 0;
        }
    }
}

/* ---------------------------------------------------------------- forward */

/* Without the vector file's own (KERN_VEXPS): x[i] = vexp(x[i]) for i <
 * n, one after the other. */
#ifndef KERN_VEXPS
static inline __attribute__((always_inline)) void vexps(const int n, vf *x)
{
#pragma GCC unroll 8
    for (int i = 0; i < n; i++)
        x[i] = vexp(x[i]);
}
#endif

#define KERN_V32 (32 / VW) /* vectors of half a full tile's keys */

/*
 * strip_plain (kern_steps.h) for bfloat16: KMR rows, KERN_BK keys all
 * visible, nothing but the scale; each row's weights rounded to bfloat16,
 * summed in the order of exp_sum_as, and written straight to pb as words
 * (key t with key t + 32). The same arithmetic as the row-by-row path, bit
 * for bit, with two shortcuts that change no bit: the row's largest scaled
 * score is found as the scale times its largest raw score (scaling by a
 * positive float is monotone, so this is the largest of the rounded
 * products), and a score that is not finite (or scales past float32) is
 * found by the sum of the row's raw scores, which then is not finite
 * either (a sum of finite scores that overflows only sends the strip to
 * the row-by-row path, which finds nothing wrong). False, with pb
 * untouched, when the row-by-row path must take the strip.
 */
static bool KF(strip_bf16)(const float *s, float scale, const float *m_old, float *m_new,
                           float *sum, uint32_t *pb)
{
    const vf vs = vset1(scale);
    vf m[KMR], z[KMR];
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++) {
        m[r] = vset1(-INFINITY);
        z[r] = vzero();
#pragma GCC unroll 8
        for (int v = 0; v < KERN_BV; v++) {
            vf x = vload(s + r * KERN_BK + v * VW);
            m[r] = vmax(m[r], x);
            z[r] = vadd(z[r], x);
        }
    }
    vf shift[KMR], acc[KMR];
    vmask bad = vmask_first(0);
#pragma GCC unroll 8
    for (int r = 0; r < KMR; r++) {
        float tile = vhmax(m[r]) * scale;
        bad |= vnonfinite(vadd(z[r], vset1(tile)));
        m_new[r] = tile > m_old[r] ? tile : m_old[r];
        shift[r] = vset1(m_new[r]);
        acc[r] = vzero();
    }
    if (!vmask_none(bad))
        return false;
    /* G rows' exponentials at a time, step by step (vexps): their chains
     * of dependent operations side by side. */
    enum { G = KMR % 2 == 0 ? 2 : 1 };
#pragma GCC unroll 8
    for (int r0 = 0; r0 < KMR; r0 += G) {
        vf e[G * KERN_BV]; /* row r0 + g's at e + g KERN_BV */
#pragma GCC unroll 8
        for (int g = 0; g < G; g++)
#pragma GCC unroll 8
            for (int v = 0; v < KERN_BV; v++)
                e[g * KERN_BV + v] =
                    vsub(vmul(vload(s + (r0 + g) * KERN_BK + v * VW), vs), shift[r0 + g]);
        vexps(G * KERN_BV, e);
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) {
            const int r = r0 + g;
#pragma GCC unroll 8
            for (int v = 0; v < KERN_BV / 2; v++)
                vp_store(pb + r * (KERN_BK / 2) + v * VW,
                         vbf16_weights2(&e[g * KERN_BV + v], &e[g * KERN_BV + v + KERN_BV / 2]));
#pragma GCC unroll 8
            for (int v = 0; v < KERN_BV; v++)
                acc[r] = vadd(acc[r], e[g * KERN_BV + v]);
            sum[r] = vhsum(acc[r]);
        }
    }
    return true;
}

/*
 * As kern_body.h's forward_tile, on bfloat16 operands: per strip of KMR
 * query rows, scores = qb kp (ceil(d_k / 2) steps), the row steps with each
 * weight rounded to bfloat16, then P as words and out_strip (+)= P vp. The
 * keys pair up as the panel packed them, over all of the tile's keys (the
 * unit may see fewer, t->cols: the others' weights are 0).
 */
static void KF(forward_tile_bf16)(const sdpa_call *c, const sdpa_tile *t,
                                  const kern_keys *keys, sdpa_fwd_state *st)
{
    const attn_sdpa_params *p = c->p;
    const int64_t dk2 = (p->d_k + 1) / 2, d_v = p->d_v, ldo = c->ldo;
    const int64_t panel_keys = KMIN((int64_t)KERN_BK, c->k_hi - t->j0); /* as packed */
    const int64_t key_pairs = (panel_keys + 1) / 2;
    float *s = st->strip;
    for (int64_t r0 = 0; r0 < t->rows; r0 += KMR) {
        const int rows = (int)KMIN((int64_t)KMR, t->rows - r0);
        const uint32_t *qb = st->qb + r0 * st->ldqb;
        KF(gemm2)(rows, t->cols, dk2, qb, st->ldqb, 1, keys->kp, KERN_BK, s, KERN_BK, false);
        float m_new[KMR], sum[KMR];
        bool plain = KF(fwd_strip_plain)(c, t, st, r0, rows);
        if (plain && KF(strip_bf16)(s, p->scale, st->m + r0, m_new, sum, st->pb)) {
            for (int r = 0; r < KMR; r++)
                KF(fold_row)(st, r0 + r, st->m[r0 + r], m_new[r], sum[r], d_v, ldo);
        } else {
            KF(fwd_rows)(c, t, st, s, r0, rows, true);
            for (int r = 0; r < rows; r++) {
                float *x = s + r * KERN_BK;
                memset(x + t->cols, 0, (size_t)(panel_keys - t->cols) * sizeof *x);
                KF(split_words)(x, panel_keys, st->pb + r * (KERN_BK / 2), true);
            }
        }
        /* The first key tile writes the output rows, later ones add. */
        KF(gemm2)(rows, d_v, key_pairs, st->pb, KERN_BK / 2, 1, keys->vp, d_v,
                  st->out + r0 * ldo, ldo, st->accumulate);
    }
}

/* --------------------------------------------------------------- backward */

/*
 * As kern_body.h's backward_tile, on bfloat16 operands (the tile starts at
 * an even query row, so its pairs of rows are those of st->qr and st->dor):
 *   S = qb kp, dP = dob vp, then P, dS in float32 (bwd_strip_steps)
 *   dq += dS kr         (dS rounded, in pairs of keys; strip by strip)
 *   dv += P^T dor       dk += dS^T qr   (P, dS in pairs of rows; at the end)
 */
static void KF(backward_tile_bf16)(const sdpa_call *c, const sdpa_tile *t,
                                   const sdpa_bwd_keys *keys, const sdpa_bwd_state *st)
{
    const attn_sdpa_params *p = c->p;
    const int64_t d_k = p->d_k, d_v = p->d_v, cols = t->cols;
    const int64_t dk2 = (d_k + 1) / 2, dv2 = (d_v + 1) / 2, key_pairs = (cols + 1) / 2;
    const int64_t ldq = c->ldq, ldk = c->ldk, ldv = c->ldv;
    float *P = st->p, *dS = st->ds;
    for (int64_t r0 = 0; r0 < t->rows; r0 += KMR) {
        const int rows = (int)KMIN((int64_t)KMR, t->rows - r0);
        float *ps = P + r0 * KERN_BK, *ds = dS + r0 * KERN_BK;
        KF(gemm2)(rows, cols, dk2, st->qb + r0 * st->ldqb, st->ldqb, 1, keys->kp, KERN_BK, ps,
                  KERN_BK, false);
        KF(gemm2)(rows, cols, dv2, st->dob + r0 * st->lddob, st->lddob, 1, keys->vp, KERN_BK,
                  ds, KERN_BK, false);
        KF(bwd_strip_steps)(c, t, st, ps, ds, r0, rows);
        for (int r = 0; r < rows; r++)
            KF(split_words)(ds + r * KERN_BK, cols, st->dsb + r * (KERN_BK / 2), false);
        KF(gemm2)(rows, d_k, key_pairs, st->dsb, KERN_BK / 2, 1, keys->kr, d_k,
                  st->dq + r0 * ldq, ldq, true);
    }
    const int64_t row_pairs = (t->rows + 1) / 2;
    KF(bf16_row_pairs)(P, KERN_BK, t->rows, cols, st->pp, KERN_BK, row_pairs, false);
    KF(bf16_row_pairs)(dS, KERN_BK, t->rows, cols, st->dsp, KERN_BK, row_pairs, false);
    for (int64_t c0 = 0; c0 < cols; c0 += KMR) {
        const int keys_n = (int)KMIN((int64_t)KMR, cols - c0);
        KF(gemm2)(keys_n, d_v, row_pairs, st->pp + c0, 1, KERN_BK, st->dor, d_v,
                  st->dv + c0 * ldv, ldv, true);
        KF(gemm2)(keys_n, d_k, row_pairs, st->dsp + c0, 1, KERN_BK, st->qr, d_k,
                  st->dk + c0 * ldk, ldk, true);
    }
}

/* ------------------------------------------------------------------ table */

const attn_kern_bf16 KF(attn_kern_bf16) = {
    .kind = KERN_KIND,
    .path = KERN_BF16_PATH,
    .mr = KMR,
    .gemm = KF(gemm2),
    .rows = KF(bf16_rows),
    .row_pairs = KF(bf16_row_pairs),
    .pack_t = KF(bf16_pack_t),
    .forward_tile = KF(forward_tile_bf16),
    .backward_tile = KF(backward_tile_bf16),
};
