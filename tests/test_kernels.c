/*
 * libattn's micro-kernels (lib/kern.h) one by one, for every kernel this CPU
 * can run, against references computed here: the register-blocked product
 * against a double triple loop at shapes that fill no block exactly, the
 * packing against a plain transpose, the exponential against expf over the
 * range the softmax uses. Then what the kernels promise as a whole: the
 * [B, n, H, d] layout gives the same numbers as [B, H, n, d], results are
 * the same bit for bit call after call, an output whose sum overflows
 * float32 on the way is still right, and a constant shift of a score row
 * changes no gradient.
 *
 * The micro-kernels are tested by name, every one this CPU runs; the
 * promises through the kernel ATTN_KERNEL chose, which make test varies
 * (the cases tagged "kernel", tests/run-suites.sh).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "kern.h" /* lib-private: the micro-kernels */
#include "support/ref.h"
#include "support/sdpa_case.h"
#include "support/worst.h"

static const attn_kernel_kind KINDS[] = {ATTN_KERNEL_GENERIC, ATTN_KERNEL_AVX2,
                                         ATTN_KERNEL_AVX512};

/* A standard normal (Box-Muller). */
static double rng_normal(uint64_t *s)
{
    double u = (rng_uniform(s) + 1.0) / 2.0, v = (rng_uniform(s) + 1.0) / 2.0;
    return sqrt(-2.0 * log(u > 0 ? u : 1e-300)) * cos(6.283185307179586 * v);
}

static float *random_floats(size_t n, uint64_t *seed, double amp)
{
    float *x = xcalloc(n, sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(amp * rng_uniform(seed));
    return x;
}

/* ------------------------------------------------------------ products */

/* C = A B (+ C) for every block shape a strip can have: rows 1 .. mr,
 * widths around the vector and block widths, A read by rows and transposed;
 * nothing outside C's rows and columns may change. */
START_TEST(gemm_matches_double_reference_at_every_block_shape)
{
    const int64_t widths[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 48, 64, 65, 100, 128};
    const int64_t depths[] = {0, 1, 2, 5, 64, 67};
    enum { LDC = 140, ROWS = 8, KMAX = 67 };
    uint64_t seed = 11;
    /* One set of random operands serves every shape: A, B and C's starting
     * values (c0; C is written, so it starts from a copy each time). B is
     * copied into a buffer of its shape's size, so that the sanitizer sees
     * a read past it. */
    float *a = random_floats(70 * 70, &seed, 1.0);
    float *b_all = random_floats((size_t)(KMAX + 1) * LDC, &seed, 1.0);
    float *c0 = random_floats(ROWS * LDC, &seed, 1.0);
    float *c = xcalloc(ROWS * LDC, sizeof *c);
    for (size_t kd = 0; kd < 3; kd++) {
        const attn_kern *kk = attn_kern_of(KINDS[kd]);
        if (kk == NULL)
            continue;
        ck_assert(kk->mr >= 1 && kk->mr <= KERN_MR_MAX);
        for (int rows = 1; rows <= kk->mr; rows++)
            for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++)
                for (size_t di = 0; di < sizeof depths / sizeof *depths; di++)
                    for (int layout = 0; layout < 2; layout++)
                        for (int acc = 0; acc < 2; acc++) {
                            int64_t cols = widths[wi], kdim = depths[di];
                            /* A [rows, kdim] by rows (lda 70) or stored
                             * transposed [kdim, rows] (lda 9). */
                            int64_t a_rs = layout ? 1 : 70, a_cs = layout ? 9 : 1;
                            float *b = xcalloc((size_t)(kdim + 1) * LDC, sizeof *b);
                            memcpy(b, b_all, (size_t)(kdim + 1) * LDC * sizeof *b);
                            memcpy(c, c0, ROWS * LDC * sizeof *c);
                            kk->gemm(rows, cols, kdim, a, a_rs, a_cs, b, LDC, c, LDC, acc);
                            /* Errors relative to the tolerance, which grows
                             * with the sum of the terms' magnitudes. */
                            worst_elem inside = {0};
                            long long outside = -1; /* first element changed outside C */
                            for (int r = 0; r < ROWS; r++)
                                for (int64_t j = 0; j < LDC; j++) {
                                    float got = c[r * LDC + j];
                                    if (r >= rows || j >= cols) {
                                        if (outside < 0 && !(got == c0[r * LDC + j]))
                                            outside = r * LDC + j;
                                        continue;
                                    }
                                    double want = acc ? c0[r * LDC + j] : 0.0, mag = fabs(want);
                                    for (int64_t p = 0; p < kdim; p++) {
                                        double t = (double)a[r * a_rs + p * a_cs] *
                                                   b[p * LDC + j];
                                        want += t;
                                        mag += fabs(t);
                                    }
                                    worst_note(&inside, r * LDC + j, got, want,
                                               fabs(got - want) / (1e-6 * (mag + 1.0)));
                                }
                            ck_assert_msg(outside < 0,
                                          "%s rows %d cols %lld: wrote outside C at (%lld, %lld)",
                                          attn_kernel_kind_name(KINDS[kd]), rows,
                                          (long long)cols, outside / LDC, outside % LDC);
                            ck_assert_msg(inside.err <= 1.0,
                                          "%s rows %d cols %lld kdim %lld layout %d: C[%lld][%lld]"
                                          " = %.9g, want %.9g (%.3g times the tolerance)",
                                          attn_kernel_kind_name(KINDS[kd]), rows,
                                          (long long)cols, (long long)kdim, layout,
                                          inside.at / LDC, inside.at % LDC, inside.got,
                                          inside.want, inside.err);
                            free(b);
                        }
    }
    free(a);
    free(b_all);
    free(c);
    free(c0);
}
END_TEST

START_TEST(pack_transposes_and_zero_pads_every_shape)
{
    const int64_t rows_list[] = {1, 5, 7, 8, 9, 15, 16, 17, 31, 32, 48, 63, 64};
    const int64_t cols_list[] = {1, 4, 8, 15, 16, 17, 33, 64, 70};
    uint64_t seed = 23;
    for (size_t kd = 0; kd < 3; kd++) {
        const attn_kern *kk = attn_kern_of(KINDS[kd]);
        if (kk == NULL)
            continue;
        for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++)
            for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++)
                /* A whole tile's stride, a narrow tail's own width, and
                 * a short sequence's panel of one vector's width (its
                 * padding written by the transposes). */
                for (int narrow = 0; narrow < 3; narrow++) {
                    int64_t rows = rows_list[ri], cols = cols_list[ci], lds = cols + 3;
                    int64_t ldd = narrow == 2   ? KERN_SHORT_LD
                                  : narrow == 1 ? kern_panel_ld(rows)
                                                : KERN_BK;
                    if (rows > ldd)
                        continue;
                    float *src = random_floats((size_t)(rows * lds), &seed, 1.0);
                    float *dst = xcalloc((size_t)((cols + 1) * ldd), sizeof *dst);
                    for (int64_t i = 0; i < (cols + 1) * ldd; i++)
                        dst[i] = NAN;
                    kk->pack_t(src, lds, rows, cols, dst, ldd);
                    worst_elem w = {0};
                    for (int64_t c = 0; c < cols; c++)
                        for (int64_t r = 0; r < ldd; r++)
                            worst_note(&w, c * ldd + r, dst[c * ldd + r],
                                       r < rows ? src[r * lds + c] : 0.0f,
                                       exact_err(dst[c * ldd + r],
                                                 r < rows ? src[r * lds + c] : 0.0f));
                    ck_assert_msg(w.err == 0.0,
                                  "%s: %lldx%lld (ldd %lld): dst[%lld][%lld] = %g, want %g",
                                  attn_kernel_kind_name(KINDS[kd]), (long long)rows,
                                  (long long)cols, (long long)ldd, w.at / ldd, w.at % ldd,
                                  w.got, w.want);
                    int64_t past = 0;
                    while (past < ldd && isnan(dst[cols * ldd + past]))
                        past++;
                    ck_assert_msg(past == ldd, "%s: %lldx%lld (ldd %lld): wrote past the panel",
                                  attn_kernel_kind_name(KINDS[kd]), (long long)rows,
                                  (long long)cols, (long long)ldd);
                    free(src);
                    free(dst);
                }
    }
}
END_TEST

/* --------------------------------------------------------- exponential */

/* Distance in units in the last place between two positive floats. */
static int64_t ulps(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

/* exp(x) within 2 ulp of expf over every 61st float of [ATTN_EXP_MIN, 0]
 * (the arguments x - max the softmax takes) and of (0, 88], exp(0) exactly
 * 1, exactly 0 below ATTN_EXP_MIN and for -inf. */
START_TEST(exp_within_2_ulp_of_expf_over_the_softmax_range)
{
    enum { N = 4096 };
    float *x = xcalloc(N, sizeof *x), *arg = xcalloc(N, sizeof *arg);
    for (size_t kd = 0; kd < 3; kd++) {
        const attn_kern *kk = attn_kern_of(KINDS[kd]);
        if (kk == NULL)
            continue;
        int64_t worst = 0;
        float worst_at = 0.0f;
        /* Negative floats ordered by bit pattern: -0 up to ATTN_EXP_MIN;
         * then the positive ones up to 88. */
        const float ends[2][2] = {{-0.0f, ATTN_EXP_MIN}, {0x1p-149f, 88.0f}};
        for (int side = 0; side < 2; side++) {
            uint32_t lo, hi;
            memcpy(&lo, &ends[side][0], sizeof lo);
            memcpy(&hi, &ends[side][1], sizeof hi);
            uint32_t bits = lo;
            while (bits <= hi) {
                int n = 0;
                for (; n < N && bits <= hi; n++, bits += 61) {
                    memcpy(&arg[n], &bits, sizeof bits);
                    x[n] = arg[n];
                }
                kk->exp_sum(x, n, 0.0f);
                for (int i = 0; i < n; i++) {
                    int64_t u = ulps(x[i], expf(arg[i]));
                    if (u > worst) {
                        worst = u;
                        worst_at = arg[i];
                    }
                }
            }
        }
        ck_assert_msg(worst <= 2, "%s: exp(%.9g) is %lld ulp from expf",
                      attn_kernel_kind_name(KINDS[kd]), (double)worst_at, (long long)worst);
        float edge[5] = {0.0f, -INFINITY, ATTN_EXP_MIN - 0.01f, -1000.0f, -0.0f};
        kk->exp_sum(edge, 5, 0.0f);
        ck_assert_msg(edge[0] == 1.0f && edge[4] == 1.0f, "%s: exp(0) = %.9g",
                      attn_kernel_kind_name(KINDS[kd]), (double)edge[0]);
        ck_assert_msg(edge[1] == 0.0f && edge[2] == 0.0f && edge[3] == 0.0f,
                      "%s: exp below the minimum is not 0", attn_kernel_kind_name(KINDS[kd]));
    }
    free(x);
    free(arg);
}
END_TEST

/* The tails of the row steps: nothing read or written past n. */
START_TEST(row_steps_stay_inside_the_row)
{
    enum { MAXN = 70, GUARD = 17 };
    float x[MAXN + GUARD];
    for (size_t kd = 0; kd < 3; kd++) {
        const attn_kern *kk = attn_kern_of(KINDS[kd]);
        if (kk == NULL)
            continue;
        for (int64_t n = 0; n <= MAXN; n++) {
            for (int64_t j = 0; j < n; j++)
                x[j] = (float)j - 40.0f;
            for (int g = 0; g < GUARD; g++)
                x[n + g] = INFINITY; /* read past the row: inf or nan shows it */
            ck_assert_msg(kk->scale_finite(x, n, 0.5f), "%s: n=%lld: finite row not finite",
                          attn_kernel_kind_name(KINDS[kd]), (long long)n);
            worst_elem w = {0};
            for (int64_t j = 0; j < n + GUARD; j++)
                worst_note(&w, j, x[j], j < n ? ((float)j - 40.0f) * 0.5f : INFINITY,
                           exact_err(x[j], j < n ? ((float)j - 40.0f) * 0.5f : INFINITY));
            ck_assert_msg(w.err == 0.0, "%s: n=%lld: x[%lld] = %g, want %g",
                          attn_kernel_kind_name(KINDS[kd]), (long long)n, w.at, w.got, w.want);
            if (n > 0) {
                x[n - 1] = 3e38f;
                ck_assert_msg(!kk->scale_finite(x, n, 4.0f), "%s: overflow at n=%lld missed",
                              attn_kernel_kind_name(KINDS[kd]), (long long)n);
            }
        }
    }
}
END_TEST

/* The blocked sums' steps in the kernels' vectors: an output row divided
 * by its sum in double (scale_wide) and a float partial folded into its
 * double sum (fold_partial) give, element for element, the bits of the
 * scalar C they replace, including -0 and overflow, and touch nothing
 * past n. */
START_TEST(wide_steps_give_the_bits_of_scalar_double)
{
    enum { MAXN = 70, GUARD = 17 };
    float x[MAXN + GUARD], part[MAXN + GUARD];
    double acc[MAXN + GUARD], want_acc[MAXN + GUARD];
    uint64_t seed = 5;
    for (size_t kd = 0; kd < 3; kd++) {
        const attn_kern *kk = attn_kern_of(KINDS[kd]);
        if (kk == NULL)
            continue;
        const char *name = attn_kernel_kind_name(KINDS[kd]);
        for (int64_t n = 0; n <= MAXN; n++) {
            const double f = 1.0 / (3.0 + (double)n);
            float *src = random_floats((size_t)n + 1, &seed, 1e3);
            for (int64_t j = 0; j < n; j++)
                x[j] = j % 7 == 3 ? -0.0f : src[j];
            for (int g = 0; g < GUARD; g++)
                x[n + g] = 1.0f;
            ck_assert_msg(kk->scale_wide(x, n, f), "%s: n=%lld: finite row not finite", name,
                          (long long)n);
            for (int64_t j = 0; j < n + GUARD; j++) {
                const float in = j < n ? (j % 7 == 3 ? -0.0f : src[j]) : 1.0f;
                const float want = j < n ? (float)((0.0 + (double)in) * f) : 1.0f;
                ck_assert_msg(memcmp(&x[j], &want, sizeof want) == 0,
                              "%s: n=%lld: scale_wide x[%lld] = %a, want %a", name,
                              (long long)n, (long long)j, (double)x[j], (double)want);
            }
            if (n > 0) {
                x[n - 1] = 3e38f;
                ck_assert_msg(!kk->scale_wide(x, n, 4.0), "%s: overflow at n=%lld missed", name,
                              (long long)n);
            }
            for (int64_t j = 0; j < n + GUARD; j++) {
                part[j] = j < n ? src[j] * 1e-3f : 7.0f;
                acc[j] = want_acc[j] = (double)j / 3.0 - 1e3;
                if (j < n)
                    want_acc[j] += part[j];
            }
            kk->fold_partial(acc, part, n);
            for (int64_t j = 0; j < n + GUARD; j++) {
                ck_assert_msg(acc[j] == want_acc[j], "%s: n=%lld: fold acc[%lld] = %a, want %a",
                              name, (long long)n, (long long)j, acc[j], want_acc[j]);
                ck_assert_msg(part[j] == (j < n ? 0.0f : 7.0f),
                              "%s: n=%lld: fold part[%lld] = %g", name, (long long)n,
                              (long long)j, (double)part[j]);
            }
            free(src);
        }
    }
}
END_TEST

/* ------------------------------------------------------------- layouts */

/* [B, H, n, d] -> [B, n, H, d] */
static float *to_bnhd(const float *x, int64_t B, int64_t H, int64_t n, int64_t d)
{
    float *y = xcalloc((size_t)(B * H * n * d), sizeof *y);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < n; i++)
                memcpy(y + ((b * n + i) * H + h) * d, x + ((b * H + h) * n + i) * d,
                       (size_t)d * sizeof *y);
    return y;
}

typedef struct {
    float *out, *dq, *dk, *dv, *weights;
    attn_softmax_row *rows;
} run_result;

static void run_both(const attn_sdpa_params *p, const float *q, const float *k,
                     const float *v, const float *dout, run_result *r)
{
    size_t nq = (size_t)(p->batch * p->heads_q * p->n_q);
    size_t nk = (size_t)(p->batch * p->heads_kv * p->n_k);
    r->out = xcalloc(nq * (size_t)p->d_v, sizeof(float));
    r->dq = xcalloc(nq * (size_t)p->d_k, sizeof(float));
    r->dk = xcalloc(nk * (size_t)p->d_k, sizeof(float));
    r->dv = xcalloc(nk * (size_t)p->d_v, sizeof(float));
    r->weights = xcalloc(nq * (size_t)p->n_k, sizeof(float));
    r->rows = xcalloc(nq, sizeof *r->rows);
    attn_error err = {0};
    ck_assert_msg(attn_sdpa_forward(p, q, k, v, r->out, r->rows, r->weights, NULL, &err) ==
                      ATTN_OK,
                  "%s", err.message);
    ck_assert_msg(attn_sdpa_backward(p, q, k, v, r->out, r->rows, dout, r->dq, r->dk, r->dv,
                                     &err) == ATTN_OK,
                  "%s", err.message);
}

static void run_free(run_result *r)
{
    free(r->out);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->weights);
    free(r->rows);
}

static bool same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

static attn_sdpa_params shape(int64_t B, int64_t Hq, int64_t Hkv, int64_t nq, int64_t nk,
                              int64_t dk, int64_t dv, int threads)
{
    attn_sdpa_params p = {.batch = B, .heads_q = Hq, .heads_kv = Hkv, .n_q = nq, .n_k = nk,
                          .d_k = dk, .d_v = dv, .scale = attn_default_scale(dk),
                          .threads = threads};
    return p;
}

/* The same problem in both layouts gives the same numbers, bit for bit:
 * the layout only moves where rows are read and written. */
START_TEST(layout_bnhd_gives_the_numbers_of_bhnd_bit_for_bit)
{
    const struct { int64_t B, Hq, Hkv, nq, nk, dk, dv; bool causal; } cases[] = {
        {2, 4, 2, 70, 130, 24, 40, false},
        {1, 3, 1, 129, 65, 64, 64, true},
        {2, 2, 2, 5, 200, 17, 9, true},
    };
    uint64_t seed = 31;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        attn_sdpa_params p = shape(cases[ci].B, cases[ci].Hq, cases[ci].Hkv, cases[ci].nq,
                                   cases[ci].nk, cases[ci].dk, cases[ci].dv, 2);
        p.causal = cases[ci].causal;
        size_t nq = (size_t)(p.batch * p.heads_q * p.n_q), nk = (size_t)(p.batch * p.heads_kv * p.n_k);
        float *q = random_floats(nq * (size_t)p.d_k, &seed, 2.0);
        float *k = random_floats(nk * (size_t)p.d_k, &seed, 1.0);
        float *v = random_floats(nk * (size_t)p.d_v, &seed, 1.0);
        float *dout = random_floats(nq * (size_t)p.d_v, &seed, 1.0);
        run_result a, b;
        run_both(&p, q, k, v, dout, &a);
        attn_sdpa_params pb = p;
        pb.layout = ATTN_LAYOUT_BNHD;
        float *qb = to_bnhd(q, p.batch, p.heads_q, p.n_q, p.d_k);
        float *kb = to_bnhd(k, p.batch, p.heads_kv, p.n_k, p.d_k);
        float *vb = to_bnhd(v, p.batch, p.heads_kv, p.n_k, p.d_v);
        float *db = to_bnhd(dout, p.batch, p.heads_q, p.n_q, p.d_v);
        run_both(&pb, qb, kb, vb, db, &b);
        float *out = to_bnhd(a.out, p.batch, p.heads_q, p.n_q, p.d_v);
        float *dq = to_bnhd(a.dq, p.batch, p.heads_q, p.n_q, p.d_k);
        float *dk = to_bnhd(a.dk, p.batch, p.heads_kv, p.n_k, p.d_k);
        float *dv = to_bnhd(a.dv, p.batch, p.heads_kv, p.n_k, p.d_v);
        ck_assert_msg(same_bits(out, b.out, nq * (size_t)p.d_v), "case %zu: out", ci);
        ck_assert_msg(same_bits(dq, b.dq, nq * (size_t)p.d_k), "case %zu: dq", ci);
        ck_assert_msg(same_bits(dk, b.dk, nk * (size_t)p.d_k), "case %zu: dk", ci);
        ck_assert_msg(same_bits(dv, b.dv, nk * (size_t)p.d_v), "case %zu: dv", ci);
        ck_assert_msg(same_bits(a.weights, b.weights, nq * (size_t)p.n_k), "case %zu: weights", ci);
        ck_assert_msg(memcmp(a.rows, b.rows, nq * sizeof *a.rows) == 0, "case %zu: rows", ci);
        free(q), free(k), free(v), free(dout), free(qb), free(kb), free(vb), free(db);
        free(out), free(dq), free(dk), free(dv);
        run_free(&a);
        run_free(&b);
    }
}
END_TEST

/* ------------------------------------------------------------ promises */

/* A strip whose 64 keys every row sees, with no mask, takes the kernels'
 * whole-strip row steps, forward and backward; add a mask of zeros and the
 * same strip goes row by row. Both must give the same bits (the whole-strip steps repeat the
 * row steps' operations in the same order), also where scores overflow and
 * the row is redone in double, and beside causal strips that a diagonal
 * cuts. */
START_TEST(whole_strip_row_steps_give_the_bits_of_row_by_row)
{
    const struct { int64_t B, Hq, Hkv, nq, nk, dk, dv; bool causal; double amp; } cases[] = {
        {1, 2, 2, 200, 300, 64, 64, false, 1.0},
        {2, 2, 1, 130, 130, 32, 48, true, 2.0},
        {1, 1, 1, 96, 64, 16, 16, false, 1e19}, /* scores past float32's range */
        {1, 3, 3, 7, 640, 64, 64, false, 3.0},
        /* Tiles narrower than 64 keys (a short sequence's, the last of a
         * row): a masked vector alone, whole vectors and a tail, whole
         * vectors only, after full tiles, and past float32's range. */
        {8, 2, 2, 13, 9, 64, 64, false, 1.0},
        {2, 2, 1, 50, 37, 40, 24, false, 2.0},
        {1, 2, 2, 20, 32, 16, 16, false, 1.0},
        {1, 1, 1, 96, 200, 16, 16, false, 3.0},
        {1, 1, 1, 10, 20, 16, 16, false, 1e19},
    };
    uint64_t seed = 77;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        attn_sdpa_params p = shape(cases[ci].B, cases[ci].Hq, cases[ci].Hkv, cases[ci].nq,
                                   cases[ci].nk, cases[ci].dk, cases[ci].dv, 2);
        p.causal = cases[ci].causal;
        size_t nq = (size_t)(p.batch * p.heads_q * p.n_q), nk = (size_t)(p.batch * p.heads_kv * p.n_k);
        float *q = random_floats(nq * (size_t)p.d_k, &seed, cases[ci].amp);
        float *k = random_floats(nk * (size_t)p.d_k, &seed, 1.0);
        float *v = random_floats(nk * (size_t)p.d_v, &seed, 1.0);
        float *dout = random_floats(nq * (size_t)p.d_v, &seed, 1.0);
        float *out[2], *dq[2], *dk[2], *dv[2], zero = 0.0f;
        attn_softmax_row *rows[2];
        for (int with_mask = 0; with_mask < 2; with_mask++) {
            attn_sdpa_params pm = p;
            if (with_mask) /* one 0.0 broadcast to every score */
                pm.mask = (attn_mask){.kind = ATTN_MASK_BIAS, .bias = &zero};
            out[with_mask] = xcalloc(nq * (size_t)p.d_v, sizeof(float));
            rows[with_mask] = xcalloc(nq, sizeof *rows[0]);
            attn_error err = {0};
            ck_assert_msg(attn_sdpa_forward(&pm, q, k, v, out[with_mask], rows[with_mask], NULL,
                                            NULL, &err) == ATTN_OK,
                          "%s", err.message);
            dq[with_mask] = xcalloc(nq * (size_t)p.d_k, sizeof(float));
            dk[with_mask] = xcalloc(nk * (size_t)p.d_k, sizeof(float));
            dv[with_mask] = xcalloc(nk * (size_t)p.d_v, sizeof(float));
            ck_assert_msg(attn_sdpa_backward(&pm, q, k, v, out[with_mask], rows[with_mask], dout,
                                             dq[with_mask], dk[with_mask], dv[with_mask],
                                             &err) == ATTN_OK,
                          "%s", err.message);
        }
        ck_assert_msg(same_bits(dq[0], dq[1], nq * (size_t)p.d_k), "case %zu: dq", ci);
        ck_assert_msg(same_bits(dk[0], dk[1], nk * (size_t)p.d_k), "case %zu: dk", ci);
        ck_assert_msg(same_bits(dv[0], dv[1], nk * (size_t)p.d_v), "case %zu: dv", ci);
        ck_assert_msg(same_bits(out[0], out[1], nq * (size_t)p.d_v), "case %zu: out", ci);
        ck_assert_msg(memcmp(rows[0], rows[1], nq * sizeof *rows[0]) == 0, "case %zu: rows", ci);
        for (int i = 0; i < 2; i++) {
            free(out[i]);
            free(rows[i]);
            free(dq[i]);
            free(dk[i]);
            free(dv[i]);
        }
        free(dout);
        free(q);
        free(k);
        free(v);
    }
}
END_TEST

/*
 * A forward without softmax rows, `fast` (no mask: forward_short reads a
 * sequence of at most KERN_SHORT_DIRECT keys in place), against the tiled
 * steps' forward of the same call, `tiled`: the same bits for the rows of
 * a sequence of more keys (the panel's step repeats the tiled operations),
 * within the roundings of their two orders of the same sums for a sequence
 * of fewer (each score summed with d_k in the lanes, the weights normalized
 * before the products). The bound of a row, from its inputs (u = 2^-24, S =
 * scale * max_j sum_p |q_p k_jp| over the sequence's n keys):
 *   a score in float, either order:  ds <= (d_k + 2) u S (u S when every
 *                                    product is an integer and the sums
 *                                    exact)
 *   a weight exp(s - m) / l:         rel <= 2 (expm1(2 ds) + 4 u) + (n + 4) u
 *   an output sum_j p_j v_j:         |o - o*| <= (rel + (n + 2) u) (1 + rel) max |v|
 * and twice that between the two. A row the step hands back to the tiled
 * path (a score not finite, a row that sees no key) has the same bits.
 */
static void assert_outputs_agree(const attn_sdpa_params *p, const float *q, const float *k,
                                 const float *v, const float *fast, const float *tiled,
                                 size_t ci)
{
    const double u = 0x1p-24;
    const bool bnhd = p->layout == ATTN_LAYOUT_BNHD;
    const int64_t group = p->heads_q / p->heads_kv, seqs = p->ragged.seqs;
    const int64_t *cu_q = p->ragged.cu_seqlens_q;
    const int64_t *cu_k = p->ragged.cu_seqlens_k != NULL ? p->ragged.cu_seqlens_k : cu_q;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++) {
            const int64_t hk = h / group;
            int64_t s = 0;
            for (int64_t i = 0; i < p->n_q; i++) {
                int64_t k0 = 0, k1 = p->n_k;
                if (seqs > 0) {
                    while (cu_q[s + 1] <= i)
                        s++;
                    k0 = cu_k[s];
                    k1 = cu_k[s + 1];
                }
                const int64_t n = k1 - k0;
                const int64_t qi = bnhd ? (b * p->n_q + i) * p->heads_q + h
                                        : (b * p->heads_q + h) * p->n_q + i;
                const float *o0 = fast + qi * p->d_v, *o1 = tiled + qi * p->d_v;
                double S = 0.0, vmax = 0.0;
                bool exact = true; /* every product an integer, the sums below 2^24 */
                for (int64_t j = k0; j < k1; j++) {
                    const int64_t kj = bnhd ? (b * p->n_k + j) * p->heads_kv + hk
                                            : (b * p->heads_kv + hk) * p->n_k + j;
                    double dot = 0.0;
                    for (int64_t c = 0; c < p->d_k; c++) {
                        const double t = (double)q[qi * p->d_k + c] * (double)k[kj * p->d_k + c];
                        exact &= t == nearbyint(t);
                        dot += fabs(t);
                    }
                    exact &= dot < 0x1p24;
                    S = fmax(S, (double)p->scale * dot);
                    for (int64_t c = 0; c < p->d_v; c++)
                        vmax = fmax(vmax, fabs((double)v[kj * p->d_v + c]));
                }
                /* (exact sums in any order: the scale's rounding alone) */
                const double ds = (exact ? 1.0 : (double)(p->d_k + 2)) * u * S;
                const double rel = 2.0 * (expm1(2.0 * ds) + 4.0 * u) + (double)(n + 4) * u;
                const double bound = n > KERN_SHORT_DIRECT
                                         ? 0.0
                                         : 2.0 * (rel + (double)(n + 2) * u) * (1.0 + rel) * vmax;
                for (int64_t c = 0; c < p->d_v; c++) {
                    const bool same = memcmp(&o0[c], &o1[c], sizeof o0[c]) == 0;
                    if (!same && !(isfinite(o0[c]) &&
                                   fabs((double)o0[c] - (double)o1[c]) <= bound))
                        ck_abort_msg("case %zu: row %lld of (%lld, %lld), %lld keys, column %lld: "
                                     "%.9g against the tiled %.9g, bound %.3g",
                                     ci, (long long)i, (long long)b, (long long)h, (long long)n,
                                     (long long)c, (double)o0[c], (double)o1[c], bound);
                }
            }
        }
}

/* A short sequence (at most 64 keys: one tile) of a plain call, without
 * statistics or weights, goes through the kernel's whole-sequence step
 * (forward_short); add a mask of zeros and it goes the tiled way. Both give
 * the same bits, output and softmax rows, and without the rows the step's
 * output is within rounding of them (assert_outputs_agree: the keys read
 * in place, up to KERN_SHORT_DIRECT of them): with one vector of keys or more,
 * causal and windowed rows, grouped heads, cross lengths (rows that see no
 * key), widths off the vectors, both layouts, dense batch entries, scores
 * that overflow (those rows handed back to the tiled path), and outputs
 * large enough to be written with streaming stores. */
START_TEST(short_sequences_give_the_bits_of_the_tiled_steps)
{
    const struct {
        int64_t B, Hq, Hkv, dk, dv, seqs, max_q, max_k;
        bool causal, cross, window;
        attn_layout layout;
        double amp;
        bool every; /* the lengths 1, 2 .. max_q, then again (not drawn) */
    } cases[] = {
        {1, 2, 2, 64, 64, 300, 20, 0, false, false, false, ATTN_LAYOUT_BHND, 1.0, false},
        {1, 4, 2, 40, 24, 200, 24, 40, true, true, false, ATTN_LAYOUT_BNHD, 2.0, false},
        {1, 2, 1, 16, 16, 150, 16, 64, false, true, true, ATTN_LAYOUT_BHND, 2.0, false},
        {1, 1, 1, 64, 64, 40, 16, 0, true, false, false, ATTN_LAYOUT_BHND, 1e19, false},
        /* outputs of more than SDPA_STREAM_OUT_BYTES, written around the
         * caches: both layouts, grouped heads, rows handed back */
        {1, 8, 8, 64, 64, 1200, 16, 0, false, false, false, ATTN_LAYOUT_BHND, 1.0, false},
        {1, 8, 4, 64, 64, 1200, 16, 0, true, false, false, ATTN_LAYOUT_BNHD, 1e19, false},
        /* dense: B entries of max_q rows, max_k keys */
        {5, 2, 2, 64, 32, 0, 13, 13, false, false, false, ATTN_LAYOUT_BHND, 1.0, false},
        {3, 3, 1, 33, 64, 0, 7, 50, true, false, false, ATTN_LAYOUT_BNHD, 1.0, false},
        /* q and k of -1, 0, 1: every score exact, the bound of the rest's
         * roundings alone */
        {1, 2, 2, 64, 64, 300, 16, 0, false, false, false, ATTN_LAYOUT_BHND, 0.0, false},
        /* every row count of the output's strips (split evenly, each by
         * a block of exactly its rows where it is whole vectors): 1 to 16
         * rows with the keys in place, 17 to 70 through the panel (or the
         * tiled path past 64 keys); widths of whole blocks and widths with
         * a part of one */
        {1, 2, 2, 64, 64, 48, 16, 0, false, false, false, ATTN_LAYOUT_BHND, 1.0, true},
        {1, 2, 1, 32, 40, 48, 24, 0, true, false, false, ATTN_LAYOUT_BHND, 1.0, true},
        {1, 1, 1, 16, 128, 70, 70, 0, false, false, false, ATTN_LAYOUT_BNHD, 1.0, true},
    };
    uint64_t seed = 123;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const int64_t seqs = cases[ci].seqs;
        int64_t *cu_q = NULL, *cu_k = NULL, n_q = cases[ci].max_q, n_k = cases[ci].max_k;
        if (seqs > 0) {
            cu_q = xcalloc((size_t)seqs + 1, sizeof *cu_q);
            cu_k = xcalloc((size_t)seqs + 1, sizeof *cu_k);
            for (int64_t i = 0; i < seqs; i++) {
                int64_t lq = 1 + (cases[ci].every
                                      ? i % cases[ci].max_q
                                      : (int64_t)(rng_next(&seed) % (uint64_t)cases[ci].max_q));
                int64_t lk = cases[ci].cross
                                 ? (int64_t)(rng_next(&seed) % (uint64_t)(cases[ci].max_k + 1))
                                 : lq;
                cu_q[i + 1] = cu_q[i] + lq;
                cu_k[i + 1] = cu_k[i] + lk;
            }
            n_q = cu_q[seqs];
            n_k = cu_k[seqs];
        }
        attn_sdpa_params p = shape(cases[ci].B, cases[ci].Hq, cases[ci].Hkv, n_q, n_k,
                                   cases[ci].dk, cases[ci].dv, 2);
        p.causal = cases[ci].causal;
        p.layout = cases[ci].layout;
        if (cases[ci].window)
            p.variants = (attn_variants){.window = true, .window_left = 3, .window_right = 2};
        if (seqs > 0)
            p.ragged = (attn_ragged){.seqs = seqs, .cu_seqlens_q = cu_q,
                                     .cu_seqlens_k = cases[ci].cross ? cu_k : NULL};
        size_t nq = (size_t)(p.batch * p.heads_q * p.n_q), nk = (size_t)(p.batch * p.heads_kv * p.n_k);
        float *q = random_floats(nq * (size_t)p.d_k, &seed, cases[ci].amp);
        float *k = random_floats(nk * (size_t)p.d_k, &seed, 1.0);
        float *v = random_floats(nk * (size_t)p.d_v, &seed, 1.0);
        if (cases[ci].amp == 0.0) {
            for (size_t i = 0; i < nq * (size_t)p.d_k; i++)
                q[i] = (float)((int64_t)(rng_next(&seed) % 3) - 1);
            for (size_t i = 0; i < nk * (size_t)p.d_k; i++)
                k[i] = (float)((int64_t)(rng_next(&seed) % 3) - 1);
        }
        float *out[3], zero = 0.0f;
        attn_softmax_row *rows[3];
        for (int with_mask = 0; with_mask < 3; with_mask++) {
            attn_sdpa_params pm = p;
            if (with_mask == 1) /* one 0.0 broadcast to every score */
                pm.mask = (attn_mask){.kind = ATTN_MASK_BIAS, .bias = &zero};
            /* On cache lines, as attnd's pool gives them: the output is
             * streamed only in whole lines (a large calloc block starts 16
             * bytes into one) */
            size_t out_bytes = (nq * (size_t)p.d_v * sizeof(float) + 63) / 64 * 64;
            out[with_mask] = aligned_alloc(64, out_bytes);
            ck_assert_ptr_nonnull(out[with_mask]);
            memset(out[with_mask], 0, out_bytes);
            rows[with_mask] = xcalloc(nq, sizeof *rows[0]);
            attn_error err = {0};
            /* (the third without the softmax rows) */
            ck_assert_msg(attn_sdpa_forward(&pm, q, k, v, out[with_mask],
                                            with_mask < 2 ? rows[with_mask] : NULL, NULL, NULL,
                                            &err) == ATTN_OK,
                          "%s", err.message);
        }
        /* (the large ones are large enough, and their rows whole lines:
         * they are streamed) */
        if (ci == 4 || ci == 5)
            ck_assert((double)nq * (double)p.d_v * sizeof(float) >= SDPA_STREAM_OUT_BYTES &&
                      p.d_v % 16 == 0);
        ck_assert_msg(same_bits(out[0], out[1], nq * (size_t)p.d_v), "case %zu: out", ci);
        ck_assert_msg(memcmp(rows[0], rows[1], nq * sizeof *rows[0]) == 0, "case %zu: rows", ci);
        assert_outputs_agree(&p, q, k, v, out[2], out[1], ci);
        for (int i = 0; i < 3; i++) {
            free(out[i]);
            free(rows[i]);
        }
        free(q);
        free(k);
        free(v);
        free(cu_q);
        free(cu_k);
    }
}
END_TEST

/* Twice the same call, twice the same bits: with few (batch, head) pairs
 * the backward splits key tiles between threads, still in a fixed order. */
START_TEST(results_are_the_same_bits_call_after_call)
{
    uint64_t seed = 41;
    for (int threads = 1; threads <= 3; threads++) {
        attn_sdpa_params p = shape(1, 2, 1, 300, 700, 32, 32, threads);
        p.causal = threads == 2;
        size_t nq = 600, nk = 700;
        float *q = random_floats(nq * 32, &seed, 2.0), *k = random_floats(nk * 32, &seed, 1.0);
        float *v = random_floats(nk * 32, &seed, 1.0), *dout = random_floats(nq * 32, &seed, 1.0);
        run_result a, b;
        run_both(&p, q, k, v, dout, &a);
        run_both(&p, q, k, v, dout, &b);
        ck_assert(same_bits(a.out, b.out, nq * 32) && same_bits(a.dq, b.dq, nq * 32) &&
                  same_bits(a.dk, b.dk, nk * 32) && same_bits(a.dv, b.dv, nk * 32));
        free(q), free(k), free(v), free(dout);
        run_free(&a);
        run_free(&b);
    }
}
END_TEST

/* Values near float32's maximum: the weighted sum over the keys overflows
 * on the way, the weighted mean does not (the two routes must agree, so
 * the library does it). Scores that overflow float32 too. */
START_TEST(output_is_finite_where_the_sum_on_the_way_overflows)
{
    enum { NK = 100, D = 3 };
    attn_sdpa_params p = shape(1, 1, 1, 2, NK, D, D, 1);
    float q[2 * D] = {0.01f, 0.02f, -0.01f, 1e19f, 1e19f, 1e19f};
    float k[NK * D], v[NK * D];
    uint64_t seed = 5;
    for (int j = 0; j < NK * D; j++) {
        k[j] = (float)(1e19 * rng_uniform(&seed)) + (j % D == 0 ? 3e19f : 0.0f);
        v[j] = (float)(3e38 * (0.9 + 0.1 * rng_uniform(&seed)));
    }
    float out[2 * D], w[2 * NK];
    attn_softmax_row rows[2];
    attn_error err = {0};
    ck_assert_msg(attn_sdpa_forward(&p, q, k, v, out, rows, w, NULL, &err) == ATTN_OK, "%s",
                  err.message);
    double qd[2 * D], kd[NK * D], vd[NK * D], want[2 * D], want_w[2 * NK];
    for (int i = 0; i < 2 * D; i++)
        qd[i] = q[i];
    for (int j = 0; j < NK * D; j++)
        kd[j] = k[j], vd[j] = v[j];
    ref_sdpa_forward(&p, qd, kd, vd, want, NULL, want_w);
    worst_elem wo = {0}, ww = {0};
    for (int i = 0; i < 2 * D; i++) /* relative, and an infinity is infinitely far */
        worst_note(&wo, i, out[i], want[i],
                   isfinite(out[i]) ? fabs(out[i] - want[i]) / fabs(want[i]) : INFINITY);
    ck_assert_msg(wo.err <= 1e-6, "out[%lld] = %g, want %g", wo.at, wo.got, wo.want);
    /* The weights of the row whose scores overflowed come from double too. */
    for (int j = 0; j < 2 * NK; j++)
        worst_note(&ww, j, w[j], want_w[j], fabs(w[j] - want_w[j]));
    ck_assert_msg(ww.err <= 1e-6, "weight %lld = %g, want %g", ww.at, ww.got, ww.want);
}
END_TEST

/* The example: a row shifted by -1e20 (where both scores round to
 * the same float) must give the gradients of the shifted float scores,
 * not zeros. */
START_TEST(row_shift_of_minus_1e20_gives_the_gradients_of_equal_scores)
{
    attn_sdpa_params p = shape(1, 1, 1, 1, 2, 1, 1, 1);
    const float q[1] = {1}, k[2] = {1, 2}, v[2] = {1, 3}, dout[1] = {1};
    const float bias[2] = {-1e20f, -1e20f};
    p.mask.kind = ATTN_MASK_BIAS;
    p.mask.bias = bias;
    const int64_t mshape[1] = {2};
    attn_error err = {0};
    ck_assert(attn_mask_broadcast(&p.mask, 1, mshape, 1, 1, 1, 2, &err) == ATTN_OK);
    float out[1], dq[1], dk[2], dv[2];
    attn_softmax_row rows[1];
    ck_assert(attn_sdpa_forward(&p, q, k, v, out, rows, NULL, NULL, &err) == ATTN_OK);
    ck_assert(attn_sdpa_backward(&p, q, k, v, out, rows, dout, dq, dk, dv, &err) == ATTN_OK);
    ck_assert_msg(out[0] == 2.0f, "out %g", (double)out[0]);
    ck_assert_msg(dv[0] == 0.5f && dv[1] == 0.5f, "dv %g %g", (double)dv[0], (double)dv[1]);
    ck_assert_msg(dq[0] == 0.5f, "dq %g", (double)dq[0]);
    ck_assert_msg(dk[0] == -0.5f && dk[1] == 0.5f, "dk %g %g", (double)dk[0], (double)dk[1]);
}
END_TEST

/* Scores around 1e4 spread over several key tiles (q, k ~ N(0, 100^2),
 * 300 x 65 against 700 x 65): the backward rebuilds each weight from the
 * row maximum and sum, so dv is as accurate as float32 allows. */
START_TEST(large_scores_over_many_tiles_keep_the_gradients_accurate)
{
    enum { NQ = 300, NK = 700, D = 65 };
    attn_sdpa_params p = shape(1, 1, 1, NQ, NK, D, D, 2);
    uint64_t seed = 1234;
    float *q = xcalloc(NQ * D, sizeof *q), *k = xcalloc(NK * D, sizeof *k);
    for (int i = 0; i < NQ * D; i++)
        q[i] = (float)(100.0 * rng_normal(&seed));
    for (int i = 0; i < NK * D; i++)
        k[i] = (float)(100.0 * rng_normal(&seed));
    float *v = random_floats(NK * D, &seed, 1.0), *dout = random_floats(NQ * D, &seed, 1.0);
    run_result r;
    run_both(&p, q, k, v, dout, &r);
    double *qd = to_double(q, NQ * D), *kd = to_double(k, NK * D);
    double *vd = to_double(v, NK * D), *dod = to_double(dout, NQ * D);
    double *rq = xcalloc(NQ * D, sizeof *rq), *rk = xcalloc(NK * D, sizeof *rk);
    double *rv = xcalloc(NK * D, sizeof *rv);
    ref_sdpa_backward(&p, qd, kd, vd, dod, rq, rk, rv);
    double worst = 0.0, big = 0.0;
    for (int i = 0; i < NK * D; i++) {
        worst = fmax(worst, fabs(r.dv[i] - rv[i]));
        big = fmax(big, fabs(rv[i]));
    }
    ck_assert_msg(worst <= 1e-6 * big, "dv off by %.3g relative", worst / big);
    free(q), free(k), free(v), free(dout), free(qd), free(kd), free(vd), free(dod);
    free(rq), free(rk), free(rv);
    run_free(&r);
}
END_TEST

static Suite *kernels_suite(void)
{
    Suite *s = suite_create("kernels");
    TCase *tc = tcase_create("micro");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, gemm_matches_double_reference_at_every_block_shape);
    tcase_add_test(tc, pack_transposes_and_zero_pads_every_shape);
    tcase_add_test(tc, exp_within_2_ulp_of_expf_over_the_softmax_range);
    tcase_add_test(tc, row_steps_stay_inside_the_row);
    tcase_add_test(tc, wide_steps_give_the_bits_of_scalar_double);
    suite_add_tcase(s, tc);
    /* The micro-kernels above are each called by name; what follows runs
     * on the kernel ATTN_KERNEL chose, so make test runs it once per kernel
     * (the tag "kernel", tests/run-suites.sh). */
    tc = tcase_create("promises");
    tcase_set_tags(tc, "kernel");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, layout_bnhd_gives_the_numbers_of_bhnd_bit_for_bit);
    tcase_add_test(tc, results_are_the_same_bits_call_after_call);
    tcase_add_test(tc, whole_strip_row_steps_give_the_bits_of_row_by_row);
    tcase_add_test(tc, short_sequences_give_the_bits_of_the_tiled_steps);
    tcase_add_test(tc, output_is_finite_where_the_sum_on_the_way_overflows);
    tcase_add_test(tc, row_shift_of_minus_1e20_gives_the_gradients_of_equal_scores);
    tcase_add_test(tc, large_scores_over_many_tiles_keep_the_gradients_accurate);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    printf("kernel in use: %s\n", attn_kernel_name());
    SRunner *sr = srunner_create(kernels_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
