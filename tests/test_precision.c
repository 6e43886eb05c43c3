/*
 * Long sums: attention's reductions run over every key of a row (the
 * softmax sum, the output's weighted sum, dq) or every query of a key (dk,
 * dv), 1e5 terms and more in long-context work. Summed one float at a time
 * their error grows with the length (about one rounding per tile of 64),
 * until the answer is many times further from the exact one than PyTorch's
 * float32 is. These cases compare libattn with a double-precision loop
 * written here, at a short length and a long one, and ask that the long
 * error stay within a small multiple of the short one: that is, no drift
 * with the length, whatever it is.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "support/sdpa_case.h"

/* The exact forward and backward of one head q [n_q, d], k [n_k, d],
 * v [n_k, d], dout [n_q, d], no mask, in double, one query row at a time
 * (memory O(n_k d)). Besides each gradient, the sum of the magnitudes of
 * its terms (den_*), which is what the rounding of a sum is relative to:
 * an error is judged against it, so that cancellation in the exact answer
 * does not make any rounding look large. */
typedef struct {
    double *out, *dq, *dk, *dv;           /* [n_q, d], [n_q, d], [n_k, d], [n_k, d] */
    double den_out, den_dq, den_dk, den_dv; /* largest over elements */
} exact_head;

static void exact_attention(const attn_sdpa_params *p, const float *q, const float *k,
                            const float *v, const float *dout, exact_head *e)
{
    const int64_t n_q = p->n_q, n_k = p->n_k, d = p->d_k;
    const double scale = p->scale;
    e->out = xcalloc((size_t)(n_q * d), sizeof(double));
    e->dq = xcalloc((size_t)(n_q * d), sizeof(double));
    e->dk = xcalloc((size_t)(n_k * d), sizeof(double));
    e->dv = xcalloc((size_t)(n_k * d), sizeof(double));
    double *abs_dk = xcalloc((size_t)(n_k * d), sizeof(double));
    double *abs_dv = xcalloc((size_t)(n_k * d), sizeof(double));
    double *w = xcalloc((size_t)n_k, sizeof(double)), *dp = xcalloc((size_t)n_k, sizeof(double));
    e->den_out = e->den_dq = e->den_dk = e->den_dv = 0;
    for (int64_t i = 0; i < n_q; i++) {
        const float *qi = q + i * d, *gi = dout + i * d;
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j < n_k; j++) {
            double s = 0;
            for (int64_t t = 0; t < d; t++)
                s += (double)qi[t] * k[j * d + t];
            w[j] = s * scale;
            m = w[j] > m ? w[j] : m;
        }
        for (int64_t j = 0; j < n_k; j++)
            l += w[j] = exp(w[j] - m);
        double delta = 0;
        for (int64_t j = 0; j < n_k; j++) {
            w[j] /= l;
            double g = 0;
            for (int64_t t = 0; t < d; t++) {
                e->out[i * d + t] += w[j] * v[j * d + t];
                g += (double)gi[t] * v[j * d + t];
            }
            dp[j] = g;
        }
        for (int64_t t = 0; t < d; t++)
            delta += (double)gi[t] * e->out[i * d + t];
        double abs_dq = 0;
        for (int64_t j = 0; j < n_k; j++) {
            double ds = w[j] * (dp[j] - delta) * scale;
            for (int64_t t = 0; t < d; t++) {
                e->dq[i * d + t] += ds * k[j * d + t];
                e->dk[j * d + t] += ds * qi[t];
                e->dv[j * d + t] += w[j] * gi[t];
                abs_dk[j * d + t] += fabs(ds * qi[t]);
                abs_dv[j * d + t] += fabs(w[j] * gi[t]);
                abs_dq += fabs(ds * k[j * d + t]);
            }
        }
        e->den_dq = fmax(e->den_dq, abs_dq / (double)d);
    }
    for (int64_t f = 0; f < n_k * d; f++) {
        e->den_dk = fmax(e->den_dk, abs_dk[f]);
        e->den_dv = fmax(e->den_dv, abs_dv[f]);
    }
    for (int64_t f = 0; f < n_k * d; f++)
        e->den_out = fmax(e->den_out, fabs((double)v[f]));
    free(abs_dk);
    free(abs_dv);
    free(w);
    free(dp);
}

static void exact_free(exact_head *e)
{
    free(e->out);
    free(e->dq);
    free(e->dk);
    free(e->dv);
}

static double max_diff(const float *got, const double *want, int64_t n)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = isfinite(got[i]) ? fabs((double)got[i] - want[i]) : INFINITY;
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* The errors of libattn's answer relative to the exact one: out against
 * the largest |v| (an output is a weighted mean of rows of v), each
 * gradient against the largest sum of its terms' magnitudes. */
typedef struct {
    double out, dq, dk, dv;
} head_errors;

static head_errors errors_at(int64_t n_q, int64_t n_k, int64_t d, int threads,
                             uint64_t seed)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, n_q, n_k, d, d);
    p.threads = threads;
    float *q = xcalloc((size_t)(n_q * d), sizeof(float));
    float *k = xcalloc((size_t)(n_k * d), sizeof(float));
    float *v = xcalloc((size_t)(n_k * d), sizeof(float));
    float *g = xcalloc((size_t)(n_q * d), sizeof(float));
    /* Positive values and gradients: every long sum adds terms of one sign,
     * where a float accumulator loses the most to rounding. */
    fill(q, (size_t)(n_q * d), &seed, 1.0);
    fill(k, (size_t)(n_k * d), &seed, 1.0);
    for (int64_t f = 0; f < n_k * d; f++)
        v[f] = (float)(1.0 + 0.5 * rng_uniform(&seed));
    for (int64_t f = 0; f < n_q * d; f++)
        g[f] = (float)(1.0 + 0.5 * rng_uniform(&seed));
    float *out = nan_floats((size_t)(n_q * d)), *dq = nan_floats((size_t)(n_q * d));
    float *dk = nan_floats((size_t)(n_k * d)), *dv = nan_floats((size_t)(n_k * d));
    attn_softmax_row *rows = xcalloc((size_t)n_q, sizeof *rows);
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&p, q, k, v, out, rows, NULL, NULL, &err), err);
    ASSERT_OK(attn_sdpa_backward(&p, q, k, v, out, rows, g, dq, dk, dv, &err), err);
    exact_head e;
    exact_attention(&p, q, k, v, g, &e);
    head_errors r = {
        .out = max_diff(out, e.out, n_q * d) / e.den_out,
        .dq = max_diff(dq, e.dq, n_q * d) / e.den_dq,
        .dk = max_diff(dk, e.dk, n_k * d) / e.den_dk,
        .dv = max_diff(dv, e.dv, n_k * d) / e.den_dv,
    };
    exact_free(&e);
    free(q);
    free(k);
    free(v);
    free(g);
    free(out);
    free(dq);
    free(dk);
    free(dv);
    free(rows);
    return r;
}

/* The long error may be at most this many times the short one (or this
 * many roundings, if the short one is below a rounding). A float
 * accumulator at 1e5 keys is 10-40 times its error at 1000. */
#define DRIFT_ALLOWED 3.0

static void assert_no_drift(const char *what, double short_err, double long_err)
{
    double bound = DRIFT_ALLOWED * fmax(short_err, FLT_EPSILON);
    note(what, long_err);
    ck_assert_msg(long_err <= bound,
                  "%s: error %.3g at the long length, %.3g at the short one "
                  "(allowed %.3g): the long sum drifts",
                  what, long_err, short_err, bound);
}

START_TEST(forward_and_dq_do_not_drift_with_a_hundred_thousand_keys)
{
    /* 9 query rows (a strip and a piece), 16 wide; keys 1000 against
     * 120001 (1876 tiles, the last a narrow tail of one key). */
    head_errors s = errors_at(9, 1000, 16, 1, 5);
    head_errors l = errors_at(9, 120001, 16, 1, 6);
    assert_no_drift("out, n_k = 120001", s.out, l.out);
    assert_no_drift("dq, n_k = 120001", s.dq, l.dq);
}
END_TEST

START_TEST(dk_and_dv_do_not_drift_with_two_hundred_thousand_queries)
{
    /* Two threads: one (batch, head) pair is split over them, each split
     * with its own sums of dq; dk and dv sum 200003 query rows. */
    head_errors s = errors_at(1000, 70, 8, 2, 7);
    head_errors l = errors_at(200003, 70, 8, 2, 8);
    assert_no_drift("dk, n_q = 200003", s.dk, l.dk);
    assert_no_drift("dv, n_q = 200003", s.dv, l.dv);
}
END_TEST

static Suite *precision_suite(void)
{
    Suite *s = suite_create("precision");
    TCase *tc = tcase_create("long sums");
    tcase_set_tags(tc, "kernel");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, forward_and_dq_do_not_drift_with_a_hundred_thousand_keys);
    tcase_add_test(tc, dk_and_dv_do_not_drift_with_two_hundred_thousand_queries);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(precision_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
