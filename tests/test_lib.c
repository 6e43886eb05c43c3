/*
 * libattn's scaled dot-product attention against an independent reference.
 *
 * Every expected value is computed here: closed forms for the chapter's
 * worked examples and exercises, and tests/support/ref.c (plain loops in
 * double precision, finite differences for gradients) for everything else.
 * Sizes straddle the library's tiles (powers of two from 32 to 512), so an
 * off-by-one at a tile edge, a missing scale or a lost row shows up as an
 * error far above the tolerances below.
 *
 * ATTN_TEST_VERBOSE=1 prints the largest error each comparison saw.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "support/ref.h"
#include "support/sdpa_case.h"
#include "support/worst.h"
#include "kern.h" /* lib-private: the micro-kernels and their row steps */
#include "cpu_features.h"

/* ----------------------------------------------------- small functions */

START_TEST(default_scale_is_inverse_sqrt_dk)
{
    ck_assert_msg(attn_default_scale(64) == 0.125f, "d_k=64 gives %.9g",
                  (double)attn_default_scale(64));
    ck_assert_msg(attn_default_scale(1) == 1.0f, "d_k=1");
    ck_assert_msg(attn_default_scale(4) == 0.5f, "d_k=4");
    const int64_t dks[] = {2, 3, 65, 128, 1000};
    for (size_t t = 0; t < sizeof dks / sizeof dks[0]; t++) {
        double want = 1.0 / sqrt((double)dks[t]);
        double got = attn_default_scale(dks[t]);
        ck_assert_msg(fabs(got - want) <= 1e-7 * want, "d_k=%lld: %.9g",
                      (long long)dks[t], got);
    }
}
END_TEST

START_TEST(flops_count_two_products_without_mask_discount)
{
    attn_sdpa_params p = sdpa_shape(2, 4, 2, 3, 5, 7, 11);
    double want = 2.0 * 2 * 4 * 3 * 5 * (7 + 11);
    ck_assert_msg(attn_sdpa_flops(&p) == want, "flops %.17g, want %.17g",
                  attn_sdpa_flops(&p), want);
    p.causal = true;
    ck_assert_msg(attn_sdpa_flops(&p) == want, "causal discounted: %.17g",
                  attn_sdpa_flops(&p));
    attn_sdpa_params big = sdpa_shape(8, 32, 8, 4096, 4096, 128, 128);
    double want_big = 2.0 * 8 * 32 * 4096.0 * 4096.0 * 256;
    ck_assert_msg(attn_sdpa_flops(&big) == want_big, "large: %.17g",
                  attn_sdpa_flops(&big));
}
END_TEST

/* ------------------------------------- the chapter's examples/exercises */

/* Two tokens, Q = K = I (d_k = 2), V = [[1,2],[3,4]]: the scaled scores
 * of each row differ by 1/sqrt(2), so the weights are
 * softmax([0.7071, 0]) = [0.6698, 0.3302]. */
START_TEST(worked_example_1_two_tokens_weights_0_6698)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 2, 2, 2, 2);
    p.scale = attn_default_scale(2);
    const float q[4] = {1, 0, 0, 1}, k[4] = {1, 0, 0, 1};
    const float v[4] = {1, 2, 3, 4};
    float out[4], w[4];
    attn_softmax_row rows[2];
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&p, q, k, v, out, rows, w, NULL, &err), err);
    const double lse[2] = {attn_softmax_lse(rows[0]), attn_softmax_lse(rows[1])};

    ck_assert_msg(fabs(w[0] - 0.6698) < 5e-5 && fabs(w[1] - 0.3302) < 5e-5,
                  "row 0 weights %.6f %.6f, want 0.6698 0.3302", (double)w[0],
                  (double)w[1]);
    ck_assert_msg(fabs(w[2] - 0.3302) < 5e-5 && fabs(w[3] - 0.6698) < 5e-5,
                  "row 1 weights %.6f %.6f, want 0.3302 0.6698", (double)w[2],
                  (double)w[3]);
    double a = 1.0 / (1.0 + exp(-1.0 / sqrt(2.0)));
    const double want_w[4] = {a, 1 - a, 1 - a, a};
    const double want_out[4] = {3 - 2 * a, 4 - 2 * a, 1 + 2 * a, 2 + 2 * a};
    const double s = 1.0 / sqrt(2.0);
    const double want_lse[2] = {s + log(1 + exp(-s)), s + log(1 + exp(-s))};
    ASSERT_ERR(rel_err(w, want_w, 4), 1e-6, "example 1 weights");
    ASSERT_ERR(rel_err(out, want_out, 4), 1e-6, "example 1 output");
    ASSERT_ERR(lse_err(lse, want_lse, 2), 1e-6, "example 1 lse");
}
END_TEST

/* Three tokens, self-attention with Q = K = V = X, d_k = 4 (scale 1/2):
 * X X^T = [[2,0,2],[0,8,4],[2,4,4]], so the scaled scores are
 * [[1,0,1],[0,4,2],[1,2,2]] and every weight has a closed form. */
START_TEST(worked_example_2_three_tokens_closed_form)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 3, 3, 4, 4);
    const float x[12] = {1, 0, 1, 0, 0, 2, 0, 2, 1, 1, 1, 1};
    const double scaled[3][3] = {{1, 0, 1}, {0, 4, 2}, {1, 2, 2}};
    double want_w[9], want_out[12], want_lse[3];
    for (int i = 0; i < 3; i++) {
        double z = 0.0;
        for (int j = 0; j < 3; j++)
            z += exp(scaled[i][j]);
        want_lse[i] = log(z);
        for (int j = 0; j < 3; j++)
            want_w[i * 3 + j] = exp(scaled[i][j]) / z;
        for (int c = 0; c < 4; c++) {
            want_out[i * 4 + c] = 0.0;
            for (int j = 0; j < 3; j++)
                want_out[i * 4 + c] += want_w[i * 3 + j] * x[j * 4 + c];
        }
    }
    float out[12], w[9];
    attn_softmax_row rows[3];
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&p, x, x, x, out, rows, w, NULL, &err), err);
    double lse[3];
    for (int i = 0; i < 3; i++)
        lse[i] = attn_softmax_lse(rows[i]);
    /* e / (2e + 1) = 0.4223 for the first row's equal pair. */
    ck_assert_msg(fabs(w[0] - 0.4223) < 5e-5 && fabs(w[2] - 0.4223) < 5e-5 &&
                      fabs(w[1] - 0.1554) < 5e-5,
                  "row 0 weights %.5f %.5f %.5f", (double)w[0], (double)w[1],
                  (double)w[2]);
    ASSERT_ERR(rel_err(w, want_w, 9), 1e-6, "example 2 weights");
    ASSERT_ERR(rel_err(out, want_out, 12), 1e-6, "example 2 output");
    ASSERT_ERR(lse_err(lse, want_lse, 3), 1e-6, "example 2 lse");
}
END_TEST

static void exercise_5_causal(int64_t n)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, n, n, 3, 2);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, (uint64_t)n, 2.0);
    lib_fwd got;
    lib_forward(&c, &c.lib, &got, true, false);
    for (int64_t i = 0; i < n; i++) {
        double sum = 0.0;
        for (int64_t j = 0; j < n; j++) {
            float w = got.weights[i * n + j];
            if (j > i)
                ck_assert_msg(w == 0.0f, "n=%lld: weight (%lld,%lld) = %g "
                              "above the diagonal", (long long)n,
                              (long long)i, (long long)j, (double)w);
            sum += w;
        }
        ck_assert_msg(fabs(sum - 1.0) < 1e-6, "n=%lld: row %lld sums to %.9g",
                      (long long)n, (long long)i, sum);
    }
    ck_assert_msg(fabs(got.weights[0] - 1.0f) <= 1e-6,
                  "first row weight on key 0 is %.9g", (double)got.weights[0]);
    /* The first query sees only the first key: its output is v_0. */
    for (int c2 = 0; c2 < 2; c2++)
        ck_assert_msg(fabs(got.out[c2] - c.v[c2]) <= 1e-6,
                      "first output row is not v_0");
    lib_fwd_free(&got);
    char label[64];
    snprintf(label, sizeof label, "exercise 5 causal n=%lld", (long long)n);
    check_forward(&c, 1e-6, label);
    case_free(&c);
}

START_TEST(exercise_5_causal_n3_lower_triangular)
{
    exercise_5_causal(3);
}
END_TEST

START_TEST(exercise_5_causal_n4_lower_triangular)
{
    exercise_5_causal(4);
}
END_TEST

/* With all scores equal (q = 0), causal row i spreads 1/(i+1) over keys
 * 0..i, and its output is the mean of v_0..v_i: the mask's alignment is
 * visible in plain numbers. */
START_TEST(exercise_5_causal_uniform_scores_average_the_prefix)
{
    const int64_t n = 4;
    attn_sdpa_params p = sdpa_shape(1, 1, 1, n, n, 2, 1);
    p.causal = true;
    const float q[8] = {0};
    const float k[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const float v[4] = {1, 2, 4, 8};
    float out[4], w[16];
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&p, q, k, v, out, NULL, w, NULL, &err), err);
    double prefix = 0.0;
    for (int64_t i = 0; i < n; i++) {
        prefix += v[i];
        for (int64_t j = 0; j < n; j++) {
            double want = j <= i ? 1.0 / (double)(i + 1) : 0.0;
            ck_assert_msg(fabs(w[i * n + j] - want) <= 1e-7,
                          "weight (%lld,%lld) = %.9g, want %.9g", (long long)i,
                          (long long)j, (double)w[i * n + j], want);
        }
        double want_out = prefix / (double)(i + 1);
        ck_assert_msg(fabs(out[i] - want_out) <= 1e-6 * want_out,
                      "output %lld = %.9g, want %.9g", (long long)i,
                      (double)out[i], want_out);
    }
}
END_TEST

/* Scores 10 and 0 with d_k = 64 (q = e_0, k_0 = 10 e_0, k_1 = 0). */
static void exercise_6(float scale, double *w0, double *w1)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 1, 2, 64, 1);
    p.scale = scale;
    float q[64] = {0}, k[128] = {0};
    const float v[2] = {1, 0};
    q[0] = 1.0f;
    k[0] = 10.0f;
    float out[1], w[2];
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&p, q, k, v, out, NULL, w, NULL, &err), err);
    ck_assert_msg(fabs(out[0] - w[0]) <= 1e-6, "output %.9g != weight %.9g",
                  (double)out[0], (double)w[0]);
    *w0 = w[0];
    *w1 = w[1];
}

START_TEST(exercise_6_unscaled_scores_saturate_softmax)
{
    double w0, w1;
    exercise_6(1.0f, &w0, &w1);
    double want1 = exp(-10.0) / (1.0 + exp(-10.0)); /* 4.54e-5 */
    ck_assert_msg(fabs(w0 - 0.9999546) < 2e-7, "w0 = %.9g, want 0.9999546",
                  w0);
    ck_assert_msg(fabs(w1 - want1) < 1e-4 * want1 &&
                      fabs(w1 - 0.0000454) < 1e-7,
                  "w1 = %.9g, want %.9g", w1, want1);
}
END_TEST

START_TEST(exercise_6_scaled_by_inverse_sqrt_64)
{
    double w0, w1;
    exercise_6(attn_default_scale(64), &w0, &w1);
    double want0 = 1.0 / (1.0 + exp(-1.25));
    ck_assert_msg(fabs(w0 - 0.7773) < 5e-5 && fabs(w1 - 0.2227) < 5e-5,
                  "weights %.6f %.6f, want 0.7773 0.2227", w0, w1);
    ck_assert_msg(fabs(w0 - want0) < 1e-6 && fabs(w1 - (1 - want0)) < 1e-6,
                  "weights %.9f %.9f, want %.9f", w0, w1, want0);
}
END_TEST

/* --------------------------------------------- forward vs the reference */

/* Checks the reference's own analytic gradients against its finite
 * differences, so that every later comparison rests on both agreeing. */
START_TEST(reference_backward_matches_its_finite_differences)
{
    attn_sdpa_params p = sdpa_shape(2, 4, 2, 5, 3, 3, 2);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 99, 2.0);
    const int64_t shape[1] = {3};
    case_mask(&c, ATTN_MASK_BIAS, 1, shape, 4);
    double *aq = xcalloc(c.n_qel, sizeof *aq), *fq = xcalloc(c.n_qel, sizeof *fq);
    double *ak = xcalloc(c.n_kel, sizeof *ak), *fk = xcalloc(c.n_kel, sizeof *fk);
    double *av = xcalloc(c.n_vel, sizeof *av), *fv = xcalloc(c.n_vel, sizeof *fv);
    ref_sdpa_backward(&c.ref, c.qd, c.kd, c.vd, c.doutd, aq, ak, av);
    ref_sdpa_grad_fd(&c.ref, c.qd, c.kd, c.vd, c.doutd, 1e-5, fq, fk, fv);
    double worst = 0.0, big = 0.0;
    const double *a[3] = {aq, ak, av}, *f[3] = {fq, fk, fv};
    const size_t n[3] = {c.n_qel, c.n_kel, c.n_vel};
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < n[t]; i++) {
            worst = fmax(worst, fabs(a[t][i] - f[t][i]));
            big = fmax(big, fabs(f[t][i]));
        }
    ck_assert_msg(big > 0.1, "degenerate gradients");
    ASSERT_ERR(worst / big, 1e-8, "reference analytic vs finite differences");
    double *bufs[6] = {aq, fq, ak, fk, av, fv};
    for (int t = 0; t < 6; t++)
        free(bufs[t]);
    case_free(&c);
}
END_TEST

/* Ranks 2-4 as the API maps them (B = 1 and/or H = 1), sizes of 1,
 * n_q != n_k and d_k != d_v, with and without the causal mask. */
START_TEST(forward_matches_reference_small_shapes_ranks_2_to_4)
{
    static const int64_t shapes[][7] = {
        /* B, H_q, H_kv, n_q, n_k, d_k, d_v */
        {1, 1, 1, 1, 1, 1, 1},   {1, 1, 1, 1, 7, 3, 5},
        {1, 1, 1, 9, 1, 4, 2},   {1, 1, 1, 5, 8, 1, 1},
        {1, 1, 1, 17, 13, 6, 9}, {1, 3, 3, 6, 10, 4, 7},
        {1, 2, 2, 1, 5, 8, 3},   {2, 3, 3, 7, 5, 3, 4},
        {3, 2, 2, 4, 4, 5, 5},   {2, 2, 1, 6, 9, 2, 3},
        {2, 1, 1, 3, 2, 1, 6},
    };
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++)
        for (int causal = 0; causal < 2; causal++) {
            const int64_t *s = shapes[t];
            attn_sdpa_params p =
                sdpa_shape(s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
            p.causal = causal;
            sdpa_case c;
            case_init(&c, &p, t * 2 + (uint64_t)causal, 2.0);
            char label[96];
            snprintf(label, sizeof label,
                     "shape [%lld,%lld/%lld,%lld,%lld,%lld,%lld] causal=%d",
                     (long long)s[0], (long long)s[1], (long long)s[2],
                     (long long)s[3], (long long)s[4], (long long)s[5],
                     (long long)s[6], causal);
            check_forward(&c, TOL_FORWARD, label);
            case_free(&c);
        }
}
END_TEST

static const int64_t tile_sizes[] = {1,   2,   63,  64,  65,  127,
                                     128, 129, 255, 256, 257, 513};
static const int64_t widths[] = {1, 3, 64, 65};
#define N_TILE_SIZES (sizeof tile_sizes / sizeof tile_sizes[0])

static void tile_case(int64_t n_q, int64_t n_k, int64_t d_k, int64_t d_v,
                      bool causal, uint64_t seed)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, n_q, n_k, d_k, d_v);
    p.causal = causal;
    sdpa_case c;
    case_init(&c, &p, seed, 2.0);
    char label[96];
    snprintf(label, sizeof label, "n_q=%lld n_k=%lld d_k=%lld d_v=%lld%s",
             (long long)n_q, (long long)n_k, (long long)d_k, (long long)d_v,
             causal ? " causal" : "");
    check_forward(&c, TOL_FORWARD, label);
    case_free(&c);
}

START_TEST(forward_square_sizes_around_tile_boundaries)
{
    for (size_t t = 0; t < N_TILE_SIZES; t++)
        tile_case(tile_sizes[t], tile_sizes[t], widths[t % 4],
                  widths[(t + 1) % 4], false, 100 + t);
}
END_TEST

START_TEST(forward_square_causal_around_tile_boundaries)
{
    for (size_t t = 0; t < N_TILE_SIZES; t++)
        tile_case(tile_sizes[t], tile_sizes[t], widths[(t + 2) % 4],
                  widths[(t + 3) % 4], true, 200 + t);
}
END_TEST

static const int64_t uneven_pairs[][2] = {
    {1, 513},  {513, 1},  {2, 127},   {127, 2},   {63, 129},
    {129, 63}, {64, 257}, {257, 64},  {65, 128},  {128, 65},
    {255, 256}, {256, 255}, {513, 257}, {257, 513},
};
#define N_UNEVEN (sizeof uneven_pairs / sizeof uneven_pairs[0])

START_TEST(forward_nq_ne_nk_around_tile_boundaries)
{
    for (size_t t = 0; t < N_UNEVEN; t++)
        tile_case(uneven_pairs[t][0], uneven_pairs[t][1], widths[t % 4],
                  widths[(t + 3) % 4], false, 300 + t);
}
END_TEST

START_TEST(forward_causal_nq_ne_nk_around_tile_boundaries)
{
    for (size_t t = 0; t < N_UNEVEN; t++)
        tile_case(uneven_pairs[t][0], uneven_pairs[t][1], widths[(t + 1) % 4],
                  widths[(t + 2) % 4], true, 400 + t);
}
END_TEST

/* Batch and heads around tiles: each (b, h) must read its own slices. */
START_TEST(forward_batched_heads_around_tile_boundaries)
{
    attn_sdpa_params p = sdpa_shape(2, 3, 3, 65, 129, 5, 3);
    sdpa_case c;
    case_init(&c, &p, 500, 2.0);
    check_forward(&c, TOL_FORWARD, "B=2 H=3 65x129");
    case_free(&c);
    p = sdpa_shape(3, 2, 2, 130, 66, 3, 4);
    p.causal = true;
    case_init(&c, &p, 501, 2.0);
    check_forward(&c, TOL_FORWARD, "B=3 H=2 130x66 causal");
    case_free(&c);
}
END_TEST

/* More than two 512-wide key tiles, so the online softmax rescales its
 * running sums more than once; n_q > n_k with several fully masked query
 * tiles; very wide heads. */
START_TEST(forward_many_key_tiles_and_wide_heads)
{
    static const int64_t shapes[][5] = {
        /* n_q, n_k, d_k, d_v, causal */
        {3, 1100, 8, 8, 0},    {130, 1100, 16, 4, 1}, {1030, 600, 4, 4, 1},
        {70, 90, 300, 513, 0}, {70, 90, 513, 7, 1},
    };
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        const int64_t *s = shapes[t];
        attn_sdpa_params p = sdpa_shape(1, 1, 1, s[0], s[1], s[2], s[3]);
        p.causal = s[4];
        sdpa_case c;
        case_init(&c, &p, 550 + t, 2.0);
        char label[96];
        snprintf(label, sizeof label, "n_q=%lld n_k=%lld d_k=%lld d_v=%lld%s",
                 (long long)s[0], (long long)s[1], (long long)s[2],
                 (long long)s[3], s[4] ? " causal" : "");
        check_forward(&c, TOL_FORWARD, label);
        case_free(&c);
    }
    attn_sdpa_params p = sdpa_shape(1, 2, 1, 130, 1025, 65, 3);
    sdpa_case c;
    case_init(&c, &p, 560, 2.0);
    const int64_t shape[1] = {1025};
    case_mask(&c, ATTN_MASK_BIAS, 1, shape, 561);
    check_forward(&c, TOL_FORWARD, "bias [n_k] 130x1025 MQA");
    case_free(&c);
}
END_TEST

/* Without lse, weights or stats the output must be the same. */
START_TEST(forward_optional_outputs_may_be_null)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 2, 70, 40, 8, 8);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 600, 2.0);
    lib_fwd full;
    lib_forward(&c, &c.lib, &full, true, true);
    float *out = nan_floats(c.n_out);
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&c.lib, c.q, c.k, c.v, out, NULL, NULL, NULL,
                                &err),
              err);
    ASSERT_ERR(float_diff(full.out, out, c.n_out), 1e-6,
               "out without optional outputs");
    free(out);
    lib_fwd_free(&full);
    case_free(&c);
}
END_TEST

/* ------------------------------------------------------------- causal */

/* n_q < n_k (decoding with a cache): query i sees keys 0..i + n_k - n_q;
 * the single-query case sees every key. */
START_TEST(causal_bottom_right_when_nq_lt_nk)
{
    const int64_t n_q = 3, n_k = 7;
    attn_sdpa_params p = sdpa_shape(1, 1, 1, n_q, n_k, 4, 3);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 700, 2.0);
    lib_fwd got;
    lib_forward(&c, &c.lib, &got, true, false);
    for (int64_t i = 0; i < n_q; i++)
        for (int64_t j = 0; j < n_k; j++) {
            float w = got.weights[i * n_k + j];
            if (j <= i + n_k - n_q)
                ck_assert_msg(w > 0.0f, "(%lld,%lld) should be visible",
                              (long long)i, (long long)j);
            else
                ck_assert_msg(w == 0.0f, "(%lld,%lld) should be masked: %g",
                              (long long)i, (long long)j, (double)w);
        }
    lib_fwd_free(&got);
    check_forward(&c, TOL_FORWARD, "causal 3x7");
    case_free(&c);

    /* One query with causal is the same as no mask at all. */
    p = sdpa_shape(1, 1, 1, 1, 9, 4, 3);
    case_init(&c, &p, 701, 2.0);
    lib_fwd plain, causal;
    lib_forward(&c, &c.lib, &plain, true, false);
    c.lib.causal = true;
    lib_forward(&c, &c.lib, &causal, true, false);
    ASSERT_ERR(float_diff(plain.out, causal.out, c.n_out), 1e-6,
               "single causal query equals unmasked");
    ASSERT_ERR(float_diff(plain.weights, causal.weights, c.n_w), 1e-6,
               "single causal query weights");
    lib_fwd_free(&plain);
    lib_fwd_free(&causal);
    case_free(&c);
}
END_TEST

/* n_q > n_k: the first n_q - n_k queries see no key at all. */
START_TEST(causal_nq_gt_nk_top_rows_zero_with_lse_minus_inf)
{
    const int64_t n_q = 7, n_k = 3, d_v = 5;
    attn_sdpa_params p = sdpa_shape(2, 2, 2, n_q, n_k, 4, d_v);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 800, 2.0);
    lib_fwd got;
    lib_forward(&c, &c.lib, &got, true, true);
    for (size_t r = 0; r < c.n_rows; r++) {
        int64_t i = (int64_t)(r % (size_t)n_q);
        bool masked = i < n_q - n_k;
        if (masked)
            ck_assert_msg(got.lse[r] == -INFINITY, "row %zu lse %g", r,
                          (double)got.lse[r]);
        else
            ck_assert_msg(isfinite(got.lse[r]), "row %zu lse %g", r,
                          (double)got.lse[r]);
        for (int64_t c2 = 0; c2 < d_v && masked; c2++)
            ck_assert_msg(got.out[r * d_v + (size_t)c2] == 0.0f,
                          "masked row %zu output %g", r,
                          (double)got.out[r * d_v + (size_t)c2]);
        for (int64_t j = 0; j < n_k && masked; j++)
            ck_assert_msg(got.weights[r * n_k + (size_t)j] == 0.0f,
                          "masked row %zu weight %g", r,
                          (double)got.weights[r * n_k + (size_t)j]);
    }
    ck_assert_int_eq(count_nonfinite(got.out, c.n_out), 0);
    ck_assert_int_eq(count_nonfinite(got.weights, c.n_w), 0);
    ck_assert_msg(got.stats.rows_count == 2 * 2 * n_k,
                  "stats rows_count %lld", (long long)got.stats.rows_count);
    lib_fwd_free(&got);
    check_forward(&c, TOL_FORWARD, "causal 7x3");
    case_free(&c);
}
END_TEST

START_TEST(causal_nq_gt_nk_backward_gives_zero_grads_no_nan)
{
    const int64_t n_q = 6, n_k = 2, d_k = 3;
    attn_sdpa_params p = sdpa_shape(1, 2, 1, n_q, n_k, d_k, 2);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 900, 2.0);
    lib_grads g;
    lib_backward(&c, &c.lib, &g);
    ck_assert_int_eq(count_nonfinite(g.dq, c.n_qel), 0);
    ck_assert_int_eq(count_nonfinite(g.dk, c.n_kel), 0);
    ck_assert_int_eq(count_nonfinite(g.dv, c.n_vel), 0);
    for (size_t r = 0; r < c.n_rows; r++) {
        int64_t i = (int64_t)(r % (size_t)n_q);
        for (int64_t t = 0; t < d_k && i < n_q - n_k; t++)
            ck_assert_msg(g.dq[r * d_k + (size_t)t] == 0.0f,
                          "dq of masked row %zu is %g", r,
                          (double)g.dq[r * d_k + (size_t)t]);
    }
    /* The row that sees only key 0 has zero dq too: a softmax over one
     * key does not move. */
    lib_grads_free(&g);
    check_grad_fd(&c, "causal 6x2 GQA");
    case_free(&c);
}
END_TEST

START_TEST(causal_weights_zero_above_aligned_diagonal_at_tile_sizes)
{
    static const int64_t pairs[][2] = {{129, 129}, {65, 200}, {200, 65}};
    for (size_t t = 0; t < 3; t++) {
        int64_t n_q = pairs[t][0], n_k = pairs[t][1];
        attn_sdpa_params p = sdpa_shape(1, 1, 1, n_q, n_k, 8, 4);
        p.causal = true;
        sdpa_case c;
        case_init(&c, &p, 1000 + t, 2.0);
        lib_fwd got;
        lib_forward(&c, &c.lib, &got, true, false);
        int wrong = 0;
        for (int64_t i = 0; i < n_q; i++)
            for (int64_t j = 0; j < n_k; j++) {
                float w = got.weights[i * n_k + j];
                bool visible = j <= i + n_k - n_q;
                wrong += visible ? !(w > 0.0f) : w != 0.0f;
            }
        ck_assert_msg(wrong == 0, "%lldx%lld: %d weights on the wrong side",
                      (long long)n_q, (long long)n_k, wrong);
        lib_fwd_free(&got);
        case_free(&c);
    }
}
END_TEST

/* --------------------------------------------------------------- masks */

START_TEST(mask_broadcast_strides_for_each_shape)
{
    const int64_t B = 2, H = 3, n_q = 4, n_k = 5;
    struct {
        int rank;
        int64_t shape[4];
        int64_t stride[4];
    } cases[] = {
        {1, {n_k}, {0, 0, 0, 1}},
        {2, {n_q, n_k}, {0, 0, n_k, 1}},
        {3, {1, n_q, n_k}, {0, 0, n_k, 1}},
        {3, {H, 1, n_k}, {0, n_k, 0, 1}},
        {4, {B, 1, 1, n_k}, {n_k, 0, 0, 1}},
        {4, {B, H, n_q, n_k}, {H * n_q * n_k, n_q * n_k, n_k, 1}},
        {2, {n_q, 1}, {0, 0, 1, 0}},
        {0, {0}, {0, 0, 0, 0}},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        attn_mask m;
        memset(&m, 0, sizeof m);
        for (int d = 0; d < 4; d++)
            m.stride[d] = 12345; /* must be overwritten */
        attn_error err = {0};
        attn_status st = attn_mask_broadcast(&m, cases[t].rank,
                                             cases[t].shape, B, H, n_q, n_k,
                                             &err);
        ASSERT_OK(st, err);
        for (int d = 0; d < 4; d++)
            ck_assert_msg(m.stride[d] == cases[t].stride[d],
                          "case %zu: stride[%d] = %lld, want %lld", t, d,
                          (long long)m.stride[d],
                          (long long)cases[t].stride[d]);
    }
}
END_TEST

START_TEST(mask_broadcast_rejects_non_broadcastable_shapes)
{
    const int64_t B = 2, H = 3, n_q = 4, n_k = 5;
    struct {
        int rank;
        int64_t shape[5];
    } bad[] = {
        {1, {3}},                /* n_k mismatch */
        {2, {2, n_k}},           /* n_q mismatch */
        {3, {2, n_q, n_k}},      /* heads mismatch */
        {4, {3, H, n_q, n_k}},   /* batch mismatch */
        {1, {0}},                /* empty dimension */
        {2, {n_k, n_q}},         /* transposed */
        {5, {1, B, H, n_q, n_k}}, /* rank above 4 */
        {-1, {0}},               /* negative rank */
    };
    for (size_t t = 0; t < sizeof bad / sizeof bad[0]; t++) {
        attn_mask m;
        memset(&m, 0, sizeof m);
        attn_error err;
        memset(&err, 0, sizeof err);
        attn_status st = attn_mask_broadcast(&m, bad[t].rank, bad[t].shape, B,
                                             H, n_q, n_k, &err);
        ck_assert_msg(st == ATTN_ERR_INVALID, "case %zu accepted (%d)", t,
                      (int)st);
        ck_assert_msg(err.message[0] != '\0', "case %zu: empty message", t);
        ck_assert_msg(memchr(err.message, '\0', sizeof err.message) != NULL,
                      "case %zu: message not terminated", t);
        st = attn_mask_broadcast(&m, bad[t].rank, bad[t].shape, B, H, n_q,
                                 n_k, NULL);
        ck_assert_msg(st == ATTN_ERR_INVALID, "case %zu with err NULL", t);
    }
}
END_TEST

/* The five broadcast shapes of the brief against a mask expanded here. */
static const struct {
    int rank;
    int64_t shape[4];
} mask_shapes[] = {
    {1, {7}},          /* [n_k] */
    {2, {5, 7}},       /* [n_q, n_k] */
    {3, {1, 5, 7}},    /* [1, n_q, n_k] */
    {3, {4, 1, 7}},    /* [H, 1, n_k] */
    {4, {2, 1, 1, 7}}, /* [B, 1, 1, n_k] */
    {4, {2, 4, 5, 7}}, /* full */
    {2, {5, 1}},       /* [n_q, 1]: one flag per query */
    {4, {1, 4, 1, 1}}, /* [1, H, 1, 1]: one flag per head */
};
#define N_MASK_SHAPES (sizeof mask_shapes / sizeof mask_shapes[0])

static void mask_forward_cases(attn_mask_kind kind, bool causal,
                               int64_t heads_kv, const char *name)
{
    for (size_t t = 0; t < N_MASK_SHAPES; t++) {
        attn_sdpa_params p = sdpa_shape(2, 4, heads_kv, 5, 7, 3, 4);
        p.causal = causal;
        sdpa_case c;
        case_init(&c, &p, 1100 + t, 2.0);
        case_mask(&c, kind, mask_shapes[t].rank, mask_shapes[t].shape,
                  1200 + t);
        char label[96];
        snprintf(label, sizeof label, "%s mask rank %d shape #%zu", name,
                 mask_shapes[t].rank, t);
        check_forward(&c, TOL_FORWARD, label);
        case_free(&c);
    }
}

START_TEST(bool_mask_broadcast_shapes_match_reference)
{
    mask_forward_cases(ATTN_MASK_BOOL, false, 4, "bool");
}
END_TEST

START_TEST(bias_mask_broadcast_shapes_match_reference)
{
    mask_forward_cases(ATTN_MASK_BIAS, false, 4, "bias");
}
END_TEST

START_TEST(bool_mask_combined_with_causal)
{
    mask_forward_cases(ATTN_MASK_BOOL, true, 2, "bool+causal");
}
END_TEST

START_TEST(bias_mask_combined_with_causal)
{
    mask_forward_cases(ATTN_MASK_BIAS, true, 1, "bias+causal");
}
END_TEST

/* A scalar bias shifts every score equally: the weights do not move. */
START_TEST(bias_mask_scalar_changes_only_lse)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 2, 6, 9, 4, 4);
    sdpa_case c;
    case_init(&c, &p, 1300, 2.0);
    lib_fwd plain;
    lib_forward(&c, &c.lib, &plain, true, false);
    const float shift = 3.0f;
    c.lib.mask.kind = ATTN_MASK_BIAS;
    c.lib.mask.bias = &shift;
    attn_error err = {0};
    ASSERT_OK(attn_mask_broadcast(&c.lib.mask, 0, NULL, 1, 2, 6, 9, &err),
              err);
    lib_fwd biased;
    lib_forward(&c, &c.lib, &biased, true, false);
    ASSERT_ERR(float_diff(plain.weights, biased.weights, c.n_w), 1e-6,
               "weights under a constant bias");
    ASSERT_ERR(float_diff(plain.out, biased.out, c.n_out), 1e-6,
               "output under a constant bias");
    for (size_t r = 0; r < c.n_rows; r++)
        ck_assert_msg(fabs(biased.lse[r] - plain.lse[r] - shift) < 1e-5,
                      "lse row %zu moved by %g, want 3", r,
                      (double)(biased.lse[r] - plain.lse[r]));
    lib_fwd_free(&plain);
    lib_fwd_free(&biased);
    case_free(&c);
}
END_TEST

/* attn_mask reads any strides, not only those attn_mask_broadcast makes:
 * here a mask stored key-major ([n_k, n_q], so stride[2] = 1). */
START_TEST(mask_arbitrary_strides_key_major_layout)
{
    const int64_t n_q = 6, n_k = 9;
    attn_sdpa_params p = sdpa_shape(1, 2, 2, n_q, n_k, 3, 3);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 1350, 2.0);
    uint8_t *key_major = xcalloc((size_t)(n_q * n_k), 1);
    uint8_t *full = xcalloc(c.n_w, 1);
    uint64_t seed = 1351;
    for (int64_t j = 0; j < n_k; j++)
        for (int64_t i = 0; i < n_q; i++)
            key_major[j * n_q + i] = rng_uniform(&seed) > -0.3;
    for (int64_t h = 0; h < 2; h++)
        for (int64_t i = 0; i < n_q; i++)
            for (int64_t j = 0; j < n_k; j++)
                full[(h * n_q + i) * n_k + j] = key_major[j * n_q + i];
    c.lib.mask.kind = ATTN_MASK_BOOL;
    c.lib.mask.allowed = key_major;
    c.lib.mask.stride[0] = 0;
    c.lib.mask.stride[1] = 0;
    c.lib.mask.stride[2] = 1;
    c.lib.mask.stride[3] = n_q;
    c.ref.mask.kind = ATTN_MASK_BOOL;
    c.ref.mask.allowed = full;
    c.ref.mask.stride[0] = 2 * n_q * n_k;
    c.ref.mask.stride[1] = n_q * n_k;
    c.ref.mask.stride[2] = n_k;
    c.ref.mask.stride[3] = 1;
    check_forward(&c, TOL_FORWARD, "key-major bool mask");
    check_grad_fd(&c, "key-major bool mask");
    free(key_major);
    free(full);
    case_free(&c);
}
END_TEST

/* A boolean mask row of all false: zeros everywhere, lse -inf, no NaN,
 * zero gradients for that row, and stats that skip it. */
START_TEST(bool_mask_fully_masked_row_gives_zeros)
{
    const int64_t n_q = 4, n_k = 5, d_k = 3, d_v = 2;
    attn_sdpa_params p = sdpa_shape(1, 1, 1, n_q, n_k, d_k, d_v);
    sdpa_case c;
    case_init(&c, &p, 1400, 2.0);
    const int64_t shape[2] = {n_q, n_k};
    case_mask(&c, ATTN_MASK_BOOL, 2, shape, 1401);
    uint8_t *src = c.mask_src, *full = c.mask_full;
    for (int64_t j = 0; j < n_k; j++) {
        src[2 * n_k + j] = 0; /* row 2: nothing visible */
        full[2 * n_k + j] = 0;
        src[1 * n_k + j] = j == 3; /* row 1: one key */
        full[1 * n_k + j] = j == 3;
    }
    lib_fwd got;
    lib_forward(&c, &c.lib, &got, true, true);
    ck_assert_msg(got.lse[2] == -INFINITY, "lse of masked row %g",
                  (double)got.lse[2]);
    for (int64_t t = 0; t < d_v; t++)
        ck_assert_msg(got.out[2 * d_v + t] == 0.0f, "masked output %g",
                      (double)got.out[2 * d_v + t]);
    for (int64_t j = 0; j < n_k; j++) {
        ck_assert_msg(got.weights[2 * n_k + j] == 0.0f, "masked weight %g",
                      (double)got.weights[2 * n_k + j]);
        ck_assert_msg(got.weights[1 * n_k + j] == (j == 3 ? 1.0f : 0.0f),
                      "one-key row weight %lld = %.9g", (long long)j,
                      (double)got.weights[1 * n_k + j]);
    }
    ck_assert_msg(got.stats.rows_count == n_q - 1, "rows_count %lld",
                  (long long)got.stats.rows_count);
    lib_fwd_free(&got);
    check_forward(&c, TOL_FORWARD, "bool mask with empty row");

    lib_grads g;
    lib_backward(&c, &c.lib, &g);
    for (int64_t t = 0; t < d_k; t++)
        ck_assert_msg(g.dq[2 * d_k + t] == 0.0f, "dq of masked row %g",
                      (double)g.dq[2 * d_k + t]);
    lib_grads_free(&g);
    check_grad_fd(&c, "bool mask with empty row");
    case_free(&c);
}
END_TEST

/* Every row masked: all zeros, all lse -inf, stats with zero counts. */
START_TEST(bool_mask_all_false_gives_zeros_and_empty_stats)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 2, 3, 4, 2, 2);
    sdpa_case c;
    case_init(&c, &p, 1500, 2.0);
    const uint8_t none = 0;
    c.lib.mask.kind = ATTN_MASK_BOOL;
    c.lib.mask.allowed = &none;
    lib_fwd got;
    lib_forward(&c, &c.lib, &got, true, true);
    for (size_t i = 0; i < c.n_out; i++)
        ck_assert_msg(got.out[i] == 0.0f, "output %zu = %g", i,
                      (double)got.out[i]);
    for (size_t i = 0; i < c.n_w; i++)
        ck_assert_msg(got.weights[i] == 0.0f, "weight %zu", i);
    for (size_t i = 0; i < c.n_rows; i++)
        ck_assert_msg(got.lse[i] == -INFINITY, "lse %zu", i);
    attn_stats *s = &got.stats;
    ck_assert_msg(s->scores_count == 0 && s->rows_count == 0,
                  "counts %lld %lld", (long long)s->scores_count,
                  (long long)s->rows_count);
    ck_assert_msg(s->scores_mean == 0 && s->scores_var == 0 &&
                      s->scaled_mean == 0 && s->scaled_var == 0 &&
                      s->entropy_mean == 0 && s->entropy_min == 0 &&
                      s->entropy_max == 0 && s->max_weight_mean == 0,
                  "stats of nothing must be 0");
    lib_grads g;
    lib_backward(&c, &c.lib, &g);
    for (size_t i = 0; i < c.n_qel; i++)
        ck_assert_msg(g.dq[i] == 0.0f, "dq %zu = %g", i, (double)g.dq[i]);
    for (size_t i = 0; i < c.n_kel; i++)
        ck_assert_msg(g.dk[i] == 0.0f, "dk %zu = %g", i, (double)g.dk[i]);
    for (size_t i = 0; i < c.n_vel; i++)
        ck_assert_msg(g.dv[i] == 0.0f, "dv %zu = %g", i, (double)g.dv[i]);
    lib_grads_free(&g);
    lib_fwd_free(&got);
    case_free(&c);
}
END_TEST

/* Masks at tile sizes: a key-padding mask over 257 keys with causal. */
START_TEST(bool_mask_with_causal_around_tile_boundaries)
{
    attn_sdpa_params p = sdpa_shape(2, 2, 1, 129, 257, 16, 8);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 1600, 2.0);
    const int64_t shape[4] = {2, 1, 1, 257};
    case_mask(&c, ATTN_MASK_BOOL, 4, shape, 1601);
    check_forward(&c, TOL_FORWARD, "key padding 129x257 causal");
    case_free(&c);
    p = sdpa_shape(1, 2, 2, 300, 65, 8, 8);
    p.causal = true;
    case_init(&c, &p, 1602, 2.0);
    const int64_t shape2[2] = {300, 65};
    case_mask(&c, ATTN_MASK_BIAS, 2, shape2, 1603);
    check_forward(&c, TOL_FORWARD, "bias 300x65 causal");
    case_free(&c);
}
END_TEST

/* ----------------------------------------------------------------- GQA */

START_TEST(gqa_forward_hq4_hkv2_and_hkv1)
{
    const int64_t kv[2] = {2, 1};
    for (int t = 0; t < 2; t++)
        for (int causal = 0; causal < 2; causal++) {
            attn_sdpa_params p = sdpa_shape(2, 4, kv[t], 70, 66, 8, 5);
            p.causal = causal;
            sdpa_case c;
            case_init(&c, &p, 1700 + (uint64_t)(t * 2 + causal), 2.0);
            char label[64];
            snprintf(label, sizeof label, "GQA 4/%lld causal=%d",
                     (long long)kv[t], causal);
            check_forward(&c, TOL_FORWARD, label);
            case_free(&c);
        }
}
END_TEST

/* Head h must read key/value head h / 2, not h % 2: with distinct values
 * per kv head the outputs tell them apart. */
START_TEST(gqa_query_head_uses_kv_head_h_over_group)
{
    attn_sdpa_params p = sdpa_shape(1, 4, 2, 1, 1, 1, 1);
    const float q[4] = {1, 1, 1, 1}, k[2] = {1, 1}, v[2] = {10, 20};
    float out[4];
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&p, q, k, v, out, NULL, NULL, NULL, &err),
              err);
    const float want[4] = {10, 10, 20, 20};
    for (int h = 0; h < 4; h++)
        ck_assert_msg(out[h] == want[h], "head %d read value %g, want %g", h,
                      (double)out[h], (double)want[h]);
}
END_TEST

START_TEST(gqa_backward_hkv2_sums_shared_heads)
{
    attn_sdpa_params p = sdpa_shape(2, 4, 2, 4, 5, 3, 2);
    sdpa_case c;
    case_init(&c, &p, 1800, 2.0);
    check_grad_fd(&c, "GQA 4/2");
    case_free(&c);
}
END_TEST

START_TEST(gqa_backward_hkv1_multi_query)
{
    attn_sdpa_params p = sdpa_shape(1, 4, 1, 5, 4, 2, 3);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 1900, 2.0);
    check_grad_fd(&c, "MQA 4/1 causal");
    case_free(&c);
}
END_TEST

/* ------------------------------------------------------ extreme scores */

/* Scores of +-1e4: exp of the difference underflows to exactly 0, so the
 * weights are exactly one-hot and nothing overflows. */
START_TEST(extreme_scores_give_exact_one_hot_weights)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 3, 3, 1, 2);
    p.scale = 1.0f;
    const float q[3] = {100, -100, 0.01f};
    const float k[3] = {100, -100, 0};
    const float v[6] = {1, 2, 3, 4, 5, 6};
    float out[6], w[9];
    attn_softmax_row lse[3];
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&p, q, k, v, out, lse, w, NULL, &err), err);
    /* row 0: scores [1e4, -1e4, 0]; row 1: [-1e4, 1e4, 0]. */
    const float want_w0[3] = {1, 0, 0}, want_w1[3] = {0, 1, 0};
    for (int j = 0; j < 3; j++) {
        ck_assert_msg(w[j] == want_w0[j], "row 0 weight %d = %.9g", j,
                      (double)w[j]);
        ck_assert_msg(w[3 + j] == want_w1[j], "row 1 weight %d = %.9g", j,
                      (double)w[3 + j]);
    }
    ck_assert_int_eq(count_nonfinite(out, 6), 0);
    for (int i = 0; i < 3; i++)
        ck_assert(isfinite(lse[i].max) && lse[i].sum >= 1.0f && isfinite(lse[i].sum));
    ck_assert_int_eq(count_nonfinite(w, 9), 0);
    ck_assert_msg(fabs(out[0] - 1) < 1e-6 && fabs(out[1] - 2) < 1e-6,
                  "row 0 output %g %g", (double)out[0], (double)out[1]);
    ck_assert_msg(fabs(out[2] - 3) < 1e-6 && fabs(out[3] - 4) < 1e-6,
                  "row 1 output %g %g", (double)out[2], (double)out[3]);
    ck_assert_msg(fabs(attn_softmax_lse(lse[0]) - 1e4) < 1e-2 &&
                      fabs(attn_softmax_lse(lse[1]) - 1e4) < 1e-2,
                  "lse %g %g", attn_softmax_lse(lse[0]), attn_softmax_lse(lse[1]));
}
END_TEST

/* The same across forward key tiles (n_k > 1024): rows whose winning key
 * comes in the last tile make the online softmax rescale what it summed so
 * far by exp(-2e4) = 0; rows whose winner comes first see later tiles add
 * exactly nothing. */
START_TEST(extreme_scores_across_tiles_and_backward_stay_finite)
{
    const int64_t n_q = 130, n_k = 1100, late = 1050, early = 5;
    attn_sdpa_params p = sdpa_shape(1, 1, 1, n_q, n_k, 2, 1);
    p.scale = 1.0f;
    sdpa_case c;
    case_init(&c, &p, 2000, 1.0);
    for (int64_t j = 0; j < n_k; j++) {
        c.k[j * 2] = j == late ? 100.0f : -100.0f;
        c.k[j * 2 + 1] = j == early ? 100.0f : -100.0f;
        c.v[j] = (float)j;
    }
    for (int64_t i = 0; i < n_q; i++) {
        c.q[i * 2] = i % 2 ? 0.0f : 100.0f;
        c.q[i * 2 + 1] = i % 2 ? 100.0f : 0.0f;
    }
    case_sync(&c);
    lib_fwd got;
    lib_forward(&c, &c.lib, &got, true, true);
    worst_elem wo = {0}, wl = {0}, ww = {0};
    for (int64_t i = 0; i < n_q; i++) {
        int64_t win = i % 2 ? early : late;
        worst_note(&wo, i, got.out[i], (double)win, exact_err(got.out[i], (double)win));
        worst_note(&wl, i, got.lse[i], 1e4, fabs(got.lse[i] - 1e4));
        for (int64_t j = 0; j < n_k; j++)
            worst_note(&ww, i * n_k + j, got.weights[i * n_k + j], j == win ? 1.0 : 0.0,
                       exact_err(got.weights[i * n_k + j], j == win ? 1.0 : 0.0));
    }
    ck_assert_msg(wo.err == 0, "row %lld output %.9g, want %.9g", wo.at, wo.got, wo.want);
    ck_assert_msg(wl.err < 1e-2, "row %lld lse %.9g", wl.at, wl.got);
    ck_assert_msg(ww.err == 0, "weight (%lld,%lld) = %g, want %g", ww.at / n_k, ww.at % n_k,
                  ww.got, ww.want);
    ck_assert_msg(fabs(got.stats.max_weight_mean - 1.0) < 1e-9 &&
                      fabs(got.stats.entropy_max) < 1e-9,
                  "one-hot stats: max weight %g entropy max %g",
                  got.stats.max_weight_mean, got.stats.entropy_max);
    lib_fwd_free(&got);
    lib_grads g;
    lib_backward(&c, &c.lib, &g);
    ck_assert_int_eq(count_nonfinite(g.dq, c.n_qel), 0);
    ck_assert_int_eq(count_nonfinite(g.dk, c.n_kel), 0);
    ck_assert_int_eq(count_nonfinite(g.dv, c.n_vel), 0);
    /* All the weight on the winners: dv there sums dout over their rows. */
    double sum_late = 0.0, sum_early = 0.0;
    for (int64_t i = 0; i < n_q; i++)
        *(i % 2 ? &sum_early : &sum_late) += c.dout[i];
    ck_assert_msg(fabs(g.dv[late] - sum_late) < 1e-4 * (1 + fabs(sum_late)),
                  "dv[late] = %g, want %g", (double)g.dv[late], sum_late);
    ck_assert_msg(fabs(g.dv[early] - sum_early) <
                      1e-4 * (1 + fabs(sum_early)),
                  "dv[early] = %g, want %g", (double)g.dv[early], sum_early);
    worst_elem wd = {0};
    for (int64_t j = 0; j < n_k; j++)
        if (j != late && j != early)
            worst_note(&wd, j, g.dv[j], 0.0, exact_err(g.dv[j], 0.0));
    ck_assert_msg(wd.err == 0, "dv[%lld] = %g, want 0", wd.at, wd.got);
    lib_grads_free(&g);
    case_free(&c);
}
END_TEST

/* ------------------------------------------------------------ gradients */

START_TEST(grad_matches_finite_differences_plain)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 5, 5, 4, 3);
    sdpa_case c;
    case_init(&c, &p, 2100, 2.0);
    check_grad_fd(&c, "plain 5x5");
    case_free(&c);
}
END_TEST

START_TEST(grad_matches_finite_differences_causal)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 2, 6, 6, 3, 4);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 2200, 2.0);
    check_grad_fd(&c, "causal 6x6");
    case_free(&c);
}
END_TEST

START_TEST(grad_matches_finite_differences_nq_ne_nk)
{
    static const int64_t pairs[][2] = {{3, 7}, {7, 3}};
    for (int t = 0; t < 2; t++)
        for (int causal = 0; causal < 2; causal++) {
            attn_sdpa_params p =
                sdpa_shape(1, 1, 1, pairs[t][0], pairs[t][1], 2, 5);
            p.causal = causal;
            sdpa_case c;
            case_init(&c, &p, 2300 + (uint64_t)(t * 2 + causal), 2.0);
            char label[64];
            snprintf(label, sizeof label, "%lldx%lld causal=%d",
                     (long long)pairs[t][0], (long long)pairs[t][1], causal);
            check_grad_fd(&c, label);
            case_free(&c);
        }
}
END_TEST

START_TEST(grad_matches_finite_differences_with_masks)
{
    attn_sdpa_params p = sdpa_shape(2, 2, 2, 4, 5, 3, 2);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 2400, 2.0);
    const int64_t shape[3] = {2, 1, 5};
    case_mask(&c, ATTN_MASK_BIAS, 3, shape, 2401);
    check_grad_fd(&c, "bias [H,1,n_k] + causal");
    case_free(&c);
    p.causal = false;
    case_init(&c, &p, 2402, 2.0);
    const int64_t shape2[4] = {2, 2, 4, 5};
    case_mask(&c, ATTN_MASK_BOOL, 4, shape2, 2403);
    check_grad_fd(&c, "bool [B,H,n_q,n_k]");
    case_free(&c);
}
END_TEST

START_TEST(grad_matches_finite_differences_explicit_scale_rank4)
{
    attn_sdpa_params p = sdpa_shape(2, 3, 3, 3, 4, 5, 2);
    p.scale = 0.9f;
    sdpa_case c;
    case_init(&c, &p, 2500, 1.0);
    check_grad_fd(&c, "B=2 H=3 scale 0.9");
    case_free(&c);
}
END_TEST

START_TEST(grad_size_one_everything)
{
    /* One key: the softmax is constant 1, so dq = dk = 0 and dv = dout. */
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 1, 1, 1, 1);
    p.causal = true;
    const float q[1] = {0.7f}, k[1] = {-1.3f}, v[1] = {2.5f};
    const float dout[1] = {0.25f};
    float out[1], dq[1] = {NAN}, dk[1] = {NAN}, dv[1] = {NAN};
    attn_softmax_row lse[1];
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&p, q, k, v, out, lse, NULL, NULL, &err),
              err);
    ck_assert_msg(out[0] == 2.5f, "output %g", (double)out[0]);
    ck_assert_msg(fabs(attn_softmax_lse(lse[0]) - 0.7 * -1.3) < 1e-6, "lse %g",
                  attn_softmax_lse(lse[0]));
    ASSERT_OK(attn_sdpa_backward(&p, q, k, v, out, lse, dout, dq, dk, dv,
                                 &err),
              err);
    ck_assert_msg(dq[0] == 0.0f && dk[0] == 0.0f, "dq %g dk %g",
                  (double)dq[0], (double)dk[0]);
    ck_assert_msg(dv[0] == 0.25f, "dv %g", (double)dv[0]);
}
END_TEST

/* Tile-sized backward against the analytic reference: dk/dv gather from
 * several query tiles, dq from several key tiles. */
START_TEST(grad_around_tile_boundaries_matches_analytic_reference)
{
    static const int64_t shapes[][4] = {
        /* n_q, n_k, d_k, d_v */
        {65, 129, 3, 5}, {129, 65, 65, 1}, {257, 257, 8, 8}, {1, 513, 4, 4},
    };
    for (size_t t = 0; t < 4; t++)
        for (int causal = 0; causal < 2; causal++) {
            const int64_t *s = shapes[t];
            attn_sdpa_params p = sdpa_shape(1, 1, 1, s[0], s[1], s[2], s[3]);
            p.causal = causal;
            sdpa_case c;
            case_init(&c, &p, 2600 + t * 2 + (uint64_t)causal, 2.0);
            char label[64];
            snprintf(label, sizeof label, "backward %lldx%lld d=%lld/%lld%s",
                     (long long)s[0], (long long)s[1], (long long)s[2],
                     (long long)s[3], causal ? " causal" : "");
            check_grad_analytic(&c, label);
            case_free(&c);
        }
    attn_sdpa_params p = sdpa_shape(2, 4, 2, 130, 70, 16, 8);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 2700, 2.0);
    const int64_t shape[4] = {2, 1, 1, 70};
    case_mask(&c, ATTN_MASK_BOOL, 4, shape, 2701);
    check_grad_analytic(&c, "backward GQA 4/2 130x70 causal + padding");
    case_free(&c);
}
END_TEST

/* Causal with n_q > n_k at tile sizes, GQA, on two threads: key tiles
 * start their query loop below the diagonal, off the query-tile grid. */
START_TEST(grad_causal_nq_gt_nk_gqa_two_threads_matches_analytic_reference)
{
    attn_sdpa_params p = sdpa_shape(1, 4, 2, 300, 150, 8, 8);
    p.causal = true;
    p.threads = 2;
    sdpa_case c;
    case_init(&c, &p, 2750, 2.0);
    check_grad_analytic(&c, "backward GQA 300x150 causal threads=2");
    case_free(&c);
}
END_TEST

/* The API asks for weights and stats in the same forward call whose lse
 * feeds the backward pass; that path computes its scores differently
 * (raw scores first, for the statistics) and must give the same lse. */
START_TEST(grad_after_forward_with_weights_and_stats)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 1, 40, 600, 8, 4);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 2780, 2.0);
    const int64_t shape[1] = {600};
    case_mask(&c, ATTN_MASK_BIAS, 1, shape, 2781);
    lib_fwd f;
    lib_forward(&c, &c.lib, &f, true, true);
    float *dq = nan_floats(c.n_qel), *dk = nan_floats(c.n_kel);
    float *dv = nan_floats(c.n_vel);
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_backward(&c.lib, c.q, c.k, c.v, f.out, f.rows, c.dout,
                                 dq, dk, dv, &err),
              err);
    double *rq = xcalloc(c.n_qel, sizeof *rq);
    double *rk = xcalloc(c.n_kel, sizeof *rk);
    double *rv = xcalloc(c.n_vel, sizeof *rv);
    ref_sdpa_backward(&c.ref, c.qd, c.kd, c.vd, c.doutd, rq, rk, rv);
    ASSERT_ERR(rel_err(dq, rq, c.n_qel), TOL_GRAD_ANALYTIC, "dq after stats");
    ASSERT_ERR(rel_err(dk, rk, c.n_kel), TOL_GRAD_ANALYTIC, "dk after stats");
    ASSERT_ERR(rel_err(dv, rv, c.n_vel), TOL_GRAD_ANALYTIC, "dv after stats");
    free(rq);
    free(rk);
    free(rv);
    free(dq);
    free(dk);
    free(dv);
    lib_fwd_free(&f);
    case_free(&c);
}
END_TEST

/* The gradients are written, not accumulated: calling twice on buffers
 * that already hold the result gives the same numbers. */
/* Two sets of gradient buffers for one case, NaN-filled so that anything
 * the library leaves unwritten shows. */
static void grad_pair_alloc(const sdpa_case *c, float *dq[2], float *dk[2], float *dv[2])
{
    for (int r = 0; r < 2; r++) {
        dq[r] = nan_floats(c->n_qel);
        dk[r] = nan_floats(c->n_kel);
        dv[r] = nan_floats(c->n_vel);
    }
}

static void grad_pair_free(float *dq[2], float *dk[2], float *dv[2])
{
    for (int r = 0; r < 2; r++) {
        free(dq[r]);
        free(dk[r]);
        free(dv[r]);
    }
}

START_TEST(grad_overwrites_rather_than_accumulates)
{
    attn_sdpa_params p = sdpa_shape(1, 4, 2, 9, 7, 3, 3);
    sdpa_case c;
    case_init(&c, &p, 2800, 2.0);
    lib_fwd f;
    lib_forward(&c, &c.lib, &f, false, false);
    float *dq[2], *dk[2], *dv[2];
    grad_pair_alloc(&c, dq, dk, dv);
    attn_error err = {0};
    for (int r = 0; r < 2; r++)
        ASSERT_OK(attn_sdpa_backward(&c.lib, c.q, c.k, c.v, f.out, f.rows,
                                     c.dout, dq[r], dk[r], dv[r], &err),
                  err);
    ASSERT_OK(attn_sdpa_backward(&c.lib, c.q, c.k, c.v, f.out, f.rows, c.dout,
                                 dq[1], dk[1], dv[1], &err),
              err);
    ASSERT_ERR(float_diff(dq[0], dq[1], c.n_qel), 0.0, "dq twice");
    ASSERT_ERR(float_diff(dk[0], dk[1], c.n_kel), 0.0, "dk twice");
    ASSERT_ERR(float_diff(dv[0], dv[1], c.n_vel), 0.0, "dv twice");
    ck_assert_int_eq(count_nonfinite(dq[0], c.n_qel), 0);
    grad_pair_free(dq, dk, dv);
    lib_fwd_free(&f);
    case_free(&c);
}
END_TEST

/*
 * A constant added to every score of a row changes nothing (softmax is
 * shift-invariant), however large: a -2^20 padding bias or scores near 1e4
 * must not cost the backward pass its precision. Integer scores keep
 * score + bias exact in float32, so the two runs see the same softmax.
 */
START_TEST(grad_unchanged_by_a_large_constant_row_bias)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 6, 9, 3, 4);
    p.scale = 1.0f;
    sdpa_case c;
    case_init(&c, &p, 2900, 1.0);
    for (size_t i = 0; i < c.n_qel; i++)
        c.q[i] = (float)((int)(i * 7 % 3) - 1);
    for (size_t i = 0; i < c.n_kel; i++)
        c.k[i] = (float)((int)(i * 5 % 3) - 1);
    case_sync(&c);
    const float shifts[] = {1e4f, -1048576.0f, 16777216.0f};
    float *dq[2], *dk[2], *dv[2];
    grad_pair_alloc(&c, dq, dk, dv);
    attn_error err = {0};
    lib_fwd plain;
    lib_forward(&c, &c.lib, &plain, false, false);
    ASSERT_OK(attn_sdpa_backward(&c.lib, c.q, c.k, c.v, plain.out, plain.rows,
                                 c.dout, dq[0], dk[0], dv[0], &err),
              err);
    for (size_t s = 0; s < sizeof shifts / sizeof shifts[0]; s++) {
        float bias[6];
        for (int i = 0; i < 6; i++)
            bias[i] = shifts[s] + (float)(2 * i); /* exact: a different shift per row */
        attn_sdpa_params pb = c.lib;
        pb.mask.kind = ATTN_MASK_BIAS;
        pb.mask.bias = bias;
        const int64_t shape[2] = {6, 1};
        ASSERT_OK(attn_mask_broadcast(&pb.mask, 2, shape, 1, 1, 6, 9, &err), err);
        lib_fwd biased;
        lib_forward(&c, &pb, &biased, false, false);
        ASSERT_OK(attn_sdpa_backward(&pb, c.q, c.k, c.v, biased.out, biased.rows,
                                     c.dout, dq[1], dk[1], dv[1], &err),
                  err);
        char label[64];
        snprintf(label, sizeof label, "out, row bias %g", (double)shifts[s]);
        ASSERT_ERR(float_diff(plain.out, biased.out, c.n_out), 1e-6, label);
        snprintf(label, sizeof label, "dq, row bias %g", (double)shifts[s]);
        ASSERT_ERR(float_diff(dq[0], dq[1], c.n_qel), 1e-5, label);
        snprintf(label, sizeof label, "dk, row bias %g", (double)shifts[s]);
        ASSERT_ERR(float_diff(dk[0], dk[1], c.n_kel), 1e-5, label);
        snprintf(label, sizeof label, "dv, row bias %g", (double)shifts[s]);
        ASSERT_ERR(float_diff(dv[0], dv[1], c.n_vel), 1e-5, label);
        lib_fwd_free(&biased);
    }
    grad_pair_free(dq, dk, dv);
    lib_fwd_free(&plain);
    case_free(&c);
}
END_TEST

/*
 * Rows whose softmax is exactly one-hot have zero score gradients, as
 * PyTorch computes them (dS = P (dP - sum P dP) = 0); a large scale must not
 * turn the rounding difference between dP and rowsum(dO * O) into noise.
 */
START_TEST(grad_zero_for_exactly_one_hot_rows_at_large_scale)
{
    const float q[4] = {1.0f, 0.5f, 0.3f, 1.0f};
    const float k[6] = {1.0f, 0.0f, 0.0f, 1.0f, 0.7f, 0.7f};
    const float v[6] = {0.3f, -1.7f, 2.9f, 0.11f, -0.6f, 1.3f};
    const float dout[4] = {0.77f, -1.3f, 0.21f, 2.5f};
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 2, 3, 2, 2);
    p.scale = 1e4f;
    float out[4], dq[4], dk[6], dv[6];
    attn_softmax_row lse[2];
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&p, q, k, v, out, lse, NULL, NULL, &err), err);
    ASSERT_OK(attn_sdpa_backward(&p, q, k, v, out, lse, dout, dq, dk, dv, &err), err);
    /* Row 0 sees key 2 only (scores 1e4, 5e3, 1.05e4), row 1 key 1. */
    ck_assert(out[0] == v[4] && out[1] == v[5] && out[2] == v[2] && out[3] == v[3]);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(dq[i] == 0.0f, "dq[%d] = %g", i, (double)dq[i]);
    for (int i = 0; i < 6; i++)
        ck_assert_msg(dk[i] == 0.0f, "dk[%d] = %g", i, (double)dk[i]);
    const float want_dv[6] = {0, 0, dout[2], dout[3], dout[0], dout[1]};
    for (int i = 0; i < 6; i++)
        ck_assert_msg(dv[i] == want_dv[i], "dv[%d] = %g", i, (double)dv[i]);
}
END_TEST

/* ----------------------------------------------------------- properties */

START_TEST(weights_rows_sum_to_one)
{
    for (size_t t = 0; t < N_TILE_SIZES; t += 2) {
        int64_t n = tile_sizes[t];
        attn_sdpa_params p = sdpa_shape(1, 2, 2, n, tile_sizes[t + 1], 7, 2);
        p.causal = t % 4 == 0;
        sdpa_case c;
        case_init(&c, &p, 2900 + t, 3.0);
        lib_fwd got;
        lib_forward(&c, &c.lib, &got, true, false);
        int64_t n_k = p.n_k;
        /* outside: how far a weight lies outside [0, 1]; off: a row sum from 1 */
        worst_elem outside = {0}, off = {0};
        for (size_t r = 0; r < c.n_rows; r++) {
            double sum = 0.0;
            for (int64_t j = 0; j < n_k; j++) {
                float w = got.weights[r * (size_t)n_k + (size_t)j];
                worst_note(&outside, (long long)(r * (size_t)n_k + (size_t)j), w, 0.5,
                           w >= 0.0f && w <= 1.0f ? 0.0 : fabs(w - 0.5) + 1.0);
                sum += w;
            }
            worst_note(&off, (long long)r, sum, 1.0, fabs(sum - 1.0));
        }
        ck_assert_msg(outside.err == 0, "n=%lld: weight (%lld,%lld) = %g", (long long)n,
                      outside.at / n_k, outside.at % n_k, outside.got);
        ck_assert_msg(off.err < 1e-5, "n=%lld row %lld sums to %.9g", (long long)n, off.at,
                      off.got);
        lib_fwd_free(&got);
        case_free(&c);
    }
}
END_TEST

/* Exercise 2: each output coordinate is a convex combination of the
 * visible values, so it lies between their minimum and maximum. */
START_TEST(output_in_convex_hull_of_visible_values)
{
    attn_sdpa_params p = sdpa_shape(2, 2, 1, 70, 90, 5, 6);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 3000, 3.0);
    const int64_t shape[2] = {70, 90};
    case_mask(&c, ATTN_MASK_BIAS, 2, shape, 3001);
    lib_fwd got;
    lib_forward(&c, &c.lib, &got, false, false);
    const attn_sdpa_params *q = &c.ref;
    worst_elem beyond = {0};
    for (int64_t b = 0; b < q->batch; b++)
        for (int64_t h = 0; h < q->heads_q; h++)
            for (int64_t i = 0; i < q->n_q; i++)
                for (int64_t t = 0; t < q->d_v; t++) {
                    double lo = INFINITY, hi = -INFINITY, bias;
                    for (int64_t j = 0; j < q->n_k; j++) {
                        if (!ref_visible(q, b, h, i, j, &bias))
                            continue;
                        /* heads_kv = 1: every head reads the same values */
                        double x = c.v[(b * q->n_k + j) * q->d_v + t];
                        lo = fmin(lo, x);
                        hi = fmax(hi, x);
                    }
                    size_t o = (size_t)(((b * q->heads_q + h) * q->n_q + i) *
                                            q->d_v + t);
                    double y = got.out[o];
                    /* how far y lies outside [lo, hi] (infinitely when y
                     * is NaN or no value is visible) */
                    worst_note(&beyond, (long long)o, y, y < lo ? lo : hi,
                               y >= lo && y <= hi ? 0.0
                               : y < lo           ? lo - y
                               : y > hi           ? y - hi
                                                  : INFINITY);
                }
    ck_assert_msg(beyond.err <= 1e-6, "out[%lld] = %g outside the hull of its values, by %g",
                  beyond.at, beyond.got, beyond.err);
    lib_fwd_free(&got);
    case_free(&c);
}
END_TEST

/* Exercise 8: without a mask, permuting the tokens permutes the output. */
START_TEST(self_attention_permutation_equivariant)
{
    const int64_t n = 70, d = 6;
    attn_sdpa_params p = sdpa_shape(1, 1, 1, n, n, d, d);
    sdpa_case a, b;
    case_init(&a, &p, 3100, 2.0);
    case_init(&b, &p, 3100, 2.0);
    int64_t perm[70];
    for (int64_t i = 0; i < n; i++)
        perm[i] = (i * 37 + 11) % n; /* 37 is coprime with 70 */
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < d; t++) {
            b.q[i * d + t] = a.q[perm[i] * d + t];
            b.k[i * d + t] = a.k[perm[i] * d + t];
            b.v[i * d + t] = a.v[perm[i] * d + t];
        }
    lib_fwd ga, gb;
    lib_forward(&a, &a.lib, &ga, false, false);
    lib_forward(&b, &b.lib, &gb, false, false);
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < d; t++)
            worst = fmax(worst, fabs(gb.out[i * d + t] -
                                     ga.out[perm[i] * d + t]));
    ASSERT_ERR(worst, 1e-5, "permuted output vs output permuted");
    lib_fwd_free(&ga);
    lib_fwd_free(&gb);
    case_free(&a);
    case_free(&b);
}
END_TEST

/* ---------------------------------------------------------------- stats */

static void check_stats(const sdpa_case *c, const char *what)
{
    lib_fwd got;
    lib_forward(c, &c->lib, &got, false, true);
    attn_stats want;
    ref_sdpa_stats(&c->ref, c->qd, c->kd, &want);
    const attn_stats *s = &got.stats;
    ck_assert_msg(s->scores_count == want.scores_count,
                  "%s: scores_count %lld, want %lld", what,
                  (long long)s->scores_count, (long long)want.scores_count);
    ck_assert_msg(s->rows_count == want.rows_count,
                  "%s: rows_count %lld, want %lld", what,
                  (long long)s->rows_count, (long long)want.rows_count);
    struct {
        const char *name;
        double got, want;
    } v[] = {
        {"scores mean", s->scores_mean, want.scores_mean},
        {"scores var", s->scores_var, want.scores_var},
        {"scaled mean", s->scaled_mean, want.scaled_mean},
        {"scaled var", s->scaled_var, want.scaled_var},
        {"entropy mean", s->entropy_mean, want.entropy_mean},
        {"entropy min", s->entropy_min, want.entropy_min},
        {"entropy max", s->entropy_max, want.entropy_max},
        {"max weight mean", s->max_weight_mean, want.max_weight_mean},
    };
    double worst = 0.0;
    for (size_t t = 0; t < sizeof v / sizeof v[0]; t++) {
        double e = fabs(v[t].got - v[t].want) / (1.0 + fabs(v[t].want));
        ck_assert_msg(e <= TOL_STATS, "%s: %s = %.9g, want %.9g", what,
                      v[t].name, v[t].got, v[t].want);
        worst = fmax(worst, e);
    }
    char label[96];
    snprintf(label, sizeof label, "stats %s", what);
    note(label, worst);
    lib_fwd_free(&got);
}

START_TEST(stats_match_reference_without_mask)
{
    attn_sdpa_params p = sdpa_shape(2, 2, 2, 9, 11, 16, 4);
    sdpa_case c;
    case_init(&c, &p, 3200, 2.0);
    check_stats(&c, "plain");
    case_free(&c);
}
END_TEST

START_TEST(stats_match_reference_causal_bool_mask_gqa)
{
    attn_sdpa_params p = sdpa_shape(2, 4, 2, 12, 8, 8, 3);
    p.causal = true;
    p.scale = 0.3f;
    sdpa_case c;
    case_init(&c, &p, 3300, 2.0);
    const int64_t shape[2] = {12, 8};
    case_mask(&c, ATTN_MASK_BOOL, 2, shape, 3301);
    check_stats(&c, "causal+bool, n_q > n_k");
    case_free(&c);
}
END_TEST

/* A bias changes the weights (so entropy) but masks no score. */
START_TEST(stats_bias_counts_every_score)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 2, 7, 7, 4, 4);
    sdpa_case c;
    case_init(&c, &p, 3400, 2.0);
    const int64_t shape[2] = {7, 7};
    case_mask(&c, ATTN_MASK_BIAS, 2, shape, 3401);
    check_stats(&c, "bias");
    case_free(&c);
}
END_TEST

START_TEST(stats_match_reference_around_tile_boundaries)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 1, 257, 129, 64, 8);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 3500, 3.0);
    check_stats(&c, "257x129 causal");
    case_free(&c);
}
END_TEST

/* Several key tiles per row and two threads: the per-tile moments and the
 * per-worker accumulators must merge to the one-pass answer. */
START_TEST(stats_many_key_tiles_two_threads)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 2, 260, 1100, 8, 2);
    p.threads = 2;
    sdpa_case c;
    case_init(&c, &p, 3550, 3.0);
    const int64_t shape[1] = {1100};
    case_mask(&c, ATTN_MASK_BOOL, 1, shape, 3551);
    check_stats(&c, "260x1100 bool [n_k], 2 threads");
    case_free(&c);
}
END_TEST

/* -------------------------------------------------------------- threads */

static void compare_threads(sdpa_case *c, int threads, const char *what)
{
    attn_sdpa_params p1 = c->lib, pn = c->lib;
    p1.threads = 1;
    pn.threads = threads;
    lib_fwd f1, fn;
    lib_forward(c, &p1, &f1, true, true);
    lib_forward(c, &pn, &fn, true, true);
    char label[96];
    snprintf(label, sizeof label, "%s threads=%d: out", what, threads);
    ASSERT_ERR(float_diff(f1.out, fn.out, c->n_out), 1e-6, label);
    snprintf(label, sizeof label, "%s threads=%d: lse", what, threads);
    ASSERT_ERR(lse_err(fn.lse, f1.lse, c->n_rows), 1e-6, label);
    snprintf(label, sizeof label, "%s threads=%d: weights", what, threads);
    ASSERT_ERR(float_diff(f1.weights, fn.weights, c->n_w), 1e-6, label);
    ck_assert_msg(f1.stats.scores_count == fn.stats.scores_count &&
                      f1.stats.rows_count == fn.stats.rows_count &&
                      fabs(f1.stats.scores_var - fn.stats.scores_var) <=
                          1e-9 * (1 + f1.stats.scores_var) &&
                      fabs(f1.stats.entropy_mean - fn.stats.entropy_mean) <=
                          1e-9 * (1 + f1.stats.entropy_mean),
                  "%s: stats differ between 1 and %d threads", what, threads);
    lib_grads g1, gn;
    lib_backward(c, &p1, &g1);
    lib_backward(c, &pn, &gn);
    /* With few (batch, key/value head) pairs, dq is summed in one copy per
     * thread (key tiles split between them), then the copies are added: a
     * different order of the same sum, a few roundings apart; a copy that
     * did not reach the sum would be off by O(1). */
    snprintf(label, sizeof label, "%s threads=%d: dq", what, threads);
    ASSERT_ERR(float_diff(g1.dq, gn.dq, c->n_qel), 4e-6, label);
    snprintf(label, sizeof label, "%s threads=%d: dk", what, threads);
    ASSERT_ERR(float_diff(g1.dk, gn.dk, c->n_kel), 1e-6, label);
    snprintf(label, sizeof label, "%s threads=%d: dv", what, threads);
    ASSERT_ERR(float_diff(g1.dv, gn.dv, c->n_vel), 1e-6, label);
    lib_grads_free(&g1);
    lib_grads_free(&gn);
    lib_fwd_free(&f1);
    lib_fwd_free(&fn);
}

/* attn_parallel_for runs every unit exactly once, on workers numbered below
 * the threads asked for, whatever the counts (fewer units than threads,
 * shares of uneven sizes, units that take long on one worker only). */
typedef struct {
    int *runs;
    int threads;
    int bad_worker;
} pf_ctx;

static void pf_unit(void *ctx, int64_t i, int worker)
{
    pf_ctx *c = ctx;
    __atomic_fetch_add(&c->runs[i], 1, __ATOMIC_RELAXED);
    if (worker < 0 || worker >= c->threads)
        __atomic_store_n(&c->bad_worker, 1, __ATOMIC_RELAXED);
    if (i % 7 == 0) { /* uneven units: the others' shares get taken */
        volatile double x = 0;
        for (int k = 0; k < 20000; k++)
            x += k;
        (void)x;
    }
}

START_TEST(parallel_for_runs_every_unit_once)
{
    for (int threads = 1; threads <= 5; threads++)
        for (int64_t count = 0; count <= 67; count += (count < 10 ? 1 : 19)) {
            int *runs = calloc((size_t)count + 1, sizeof *runs);
            pf_ctx c = {.runs = runs, .threads = threads};
            attn_parallel_for(threads, count, pf_unit, &c);
            int64_t wrong = 0;
            while (wrong < count && runs[wrong] == 1)
                wrong++;
            ck_assert_msg(wrong == count, "threads %d, count %lld: unit %lld ran %d times",
                          threads, (long long)count, (long long)wrong, runs[wrong]);
            ck_assert_msg(!c.bad_worker, "threads %d: a worker number out of range", threads);
            free(runs);
        }
}
END_TEST

/* ---------------------------------------------------------- cancellation */

/* A multi-head problem of n rows, d_model = h * d, filled with small values. */
typedef struct {
    attn_mha_params p;
    float *x, *w, *out, *dout, *gx;
} mha_problem;

static void mha_problem_init(mha_problem *m, int64_t n, int64_t heads, int64_t d)
{
    int64_t dm = heads * d;
    m->p = (attn_mha_params){.batch = 1, .n = n, .m = n, .d_model = dm, .d_ctx = dm,
                             .heads = heads, .kv_heads = heads, .d_k = d, .d_v = d,
                             .d_out = dm, .scale = attn_default_scale(d), .threads = 1};
    uint64_t seed = 4100;
    m->x = malloc((size_t)(n * dm) * sizeof(float));
    m->w = malloc((size_t)(dm * dm) * sizeof(float));
    m->out = malloc((size_t)(n * dm) * sizeof(float));
    m->dout = malloc((size_t)(n * dm) * sizeof(float));
    m->gx = malloc((size_t)(n * dm) * sizeof(float));
    fill(m->x, (size_t)(n * dm), &seed, 1.0);
    fill(m->w, (size_t)(dm * dm), &seed, 0.2);
    fill(m->dout, (size_t)(n * dm), &seed, 1.0);
}

static void mha_problem_free(mha_problem *m)
{
    free(m->x);
    free(m->w);
    free(m->out);
    free(m->dout);
    free(m->gx);
}

/* A flag already set stops every entry point before it computes, and each
 * says so; a flag left at 0 changes no bit of any result. */
START_TEST(cancel_flag_stops_every_entry_point_and_zero_changes_nothing)
{
    attn_sdpa_params p = sdpa_shape(2, 4, 2, 200, 300, 32, 16);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 4000, 1.0);
    float *out = malloc(c.n_out * sizeof(float)), *out0 = malloc(c.n_out * sizeof(float));
    attn_softmax_row *rows = malloc(c.n_rows * sizeof *rows);
    float *dq = malloc(c.n_qel * sizeof(float)), *dk = malloc(c.n_kel * sizeof(float));
    float *dv = malloc(c.n_vel * sizeof(float)), *dq0 = malloc(c.n_qel * sizeof(float));
    attn_error e;

    atomic_int flag = 0;
    attn_sdpa_params q = c.lib;
    ck_assert_int_eq(attn_sdpa_forward(&q, c.q, c.k, c.v, out0, rows, NULL, NULL, &e), ATTN_OK);
    ck_assert_int_eq(attn_sdpa_backward(&q, c.q, c.k, c.v, out0, rows, c.dout, dq0, dk, dv, &e),
                     ATTN_OK);
    q.cancel = &flag;
    ck_assert_int_eq(attn_sdpa_forward(&q, c.q, c.k, c.v, out, rows, NULL, NULL, &e), ATTN_OK);
    ck_assert_int_eq(attn_sdpa_backward(&q, c.q, c.k, c.v, out, rows, c.dout, dq, dk, dv, &e),
                     ATTN_OK);
    ck_assert_msg(!memcmp(out, out0, c.n_out * sizeof(float)) &&
                  !memcmp(dq, dq0, c.n_qel * sizeof(float)),
                  "a flag at 0 changed the results");

    atomic_store(&flag, 1);
    ck_assert_int_eq(attn_sdpa_forward(&q, c.q, c.k, c.v, out, rows, NULL, NULL, &e),
                     ATTN_ERR_CANCELLED);
    ck_assert_ptr_nonnull(strstr(e.message, "cancelled"));
    ck_assert_int_eq(attn_sdpa_backward(&q, c.q, c.k, c.v, out0, rows, c.dout, dq, dk, dv, &e),
                     ATTN_ERR_CANCELLED);
    free(out);
    free(out0);
    free(rows);
    free(dq);
    free(dk);
    free(dv);
    free(dq0);
    case_free(&c);

    mha_problem m;
    mha_problem_init(&m, 96, 3, 8);
    attn_mha_inputs in = {.x = m.x, .w_q = m.w, .w_k = m.w, .w_v = m.w, .w_o = m.w};
    attn_mha_grads g = {.x = m.gx};
    m.p.cancel = &flag;
    atomic_store(&flag, 0);
    ck_assert_int_eq(attn_mha_forward(&m.p, &in, m.out, NULL, NULL, NULL, &e), ATTN_OK);
    ck_assert_int_eq(attn_mha_backward(&m.p, &in, m.dout, &g, &e), ATTN_OK);
    atomic_store(&flag, 1);
    ck_assert_int_eq(attn_mha_forward(&m.p, &in, m.out, NULL, NULL, NULL, &e),
                     ATTN_ERR_CANCELLED);
    ck_assert_int_eq(attn_mha_backward(&m.p, &in, m.dout, &g, &e), ATTN_ERR_CANCELLED);
    ck_assert_int_eq(attn_mha_forward_backward(&m.p, &in, m.out, NULL, NULL, NULL, m.dout, &g,
                                               &e),
                     ATTN_ERR_CANCELLED);
    mha_problem_free(&m);
}
END_TEST

typedef struct {
    const volatile float *watch; /* a value the call writes early: NaN until then */
    atomic_int *flag;
} canceller;

/* Sets the flag once the call has visibly started its work. */
static void *cancel_when_started(void *arg)
{
    canceller *c = arg;
    while (isnan(*c->watch))
        sched_yield();
    atomic_store(c->flag, 1);
    return NULL;
}

static size_t rows_written(const float *x, size_t rows, size_t width)
{
    size_t n = 0;
    for (size_t r = 0; r < rows; r++)
        n += !isnan(x[r * width + width - 1]);
    return n;
}

/* A flag set while the call runs stops it between units of work: most of
 * the output is never written (the rows start as NaN), forward and backward,
 * on one thread and on two. */
START_TEST(cancel_flag_set_midway_stops_a_long_call_early)
{
    for (int threads = 1; threads <= 2; threads++) {
        attn_sdpa_params p = sdpa_shape(1, 1, 1, 4096, 4096, 32, 32);
        p.threads = threads;
        sdpa_case c;
        case_init(&c, &p, 4001, 1.0);
        attn_sdpa_params q = c.lib;
        atomic_int flag = 0;
        q.cancel = &flag;
        float *out = nan_floats(c.n_out);
        attn_softmax_row *rows = malloc(c.n_rows * sizeof *rows);
        attn_error e;
        /* The units go out in order: query rows 0 .. 63 are the first done. */
        canceller k = {.watch = out + 63 * 32 + 31, .flag = &flag};
        pthread_t t;
        pthread_create(&t, NULL, cancel_when_started, &k);
        attn_status st = attn_sdpa_forward(&q, c.q, c.k, c.v, out, rows, NULL, NULL, &e);
        pthread_join(t, NULL);
        ck_assert_int_eq(st, ATTN_ERR_CANCELLED);
        size_t done = rows_written(out, 4096, 32);
        /* Stopped before the end: with two workers busy on two cores the
         * canceller itself may wait out a time slice before it sets the
         * flag, so how far short of the end is the scheduler's to say. */
        ck_assert_msg(done < 4096, "threads %d: %zu of 4096 rows computed after the flag",
                      threads, done);

        /* The backward from a finished forward: dk's rows start as NaN and
         * each key tile's are written (zeroed, then summed) by its unit. */
        atomic_store(&flag, 0);
        ck_assert_int_eq(attn_sdpa_forward(&q, c.q, c.k, c.v, out, rows, NULL, NULL, &e),
                         ATTN_OK);
        float *dq = nan_floats(c.n_qel), *dk = nan_floats(c.n_kel), *dv = nan_floats(c.n_vel);
        k.watch = dk + 31;
        pthread_create(&t, NULL, cancel_when_started, &k);
        st = attn_sdpa_backward(&q, c.q, c.k, c.v, out, rows, c.dout, dq, dk, dv, &e);
        pthread_join(t, NULL);
        ck_assert_int_eq(st, ATTN_ERR_CANCELLED);
        done = rows_written(dk, 4096, 32);
        ck_assert_msg(done < 4096, "threads %d: %zu of 4096 dk rows computed after the flag",
                      threads, done);
        free(out);
        free(rows);
        free(dq);
        free(dk);
        free(dv);
        case_free(&c);
    }
}
END_TEST

START_TEST(threads_1_and_2_agree_forward_and_backward)
{
    attn_sdpa_params p = sdpa_shape(2, 4, 2, 300, 200, 32, 16);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 3600, 2.0);
    const int64_t shape[4] = {2, 1, 1, 200};
    case_mask(&c, ATTN_MASK_BOOL, 4, shape, 3601);
    compare_threads(&c, 2, "GQA 300x200 causal+mask");
    case_free(&c);
}
END_TEST

/* More threads than work items or cores must change nothing either. */
START_TEST(threads_more_than_work_agree)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 5, 700, 8, 8);
    sdpa_case c;
    case_init(&c, &p, 3700, 2.0);
    compare_threads(&c, 7, "5x700");
    case_free(&c);
    p = sdpa_shape(1, 2, 1, 520, 40, 4, 4);
    case_init(&c, &p, 3701, 2.0);
    compare_threads(&c, 3, "520x40 MQA");
    case_free(&c);
}
END_TEST

/* Enough work per unit (8 key tiles of 128 x 1024 queries x 64) that both
 * workers surely take units, so each one's partial dq must reach the sum. */
START_TEST(threads_2_large_backward_sums_every_workers_dq)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 1, 1024, 1024, 64, 32);
    sdpa_case c;
    case_init(&c, &p, 3750, 1.0);
    compare_threads(&c, 2, "MQA 1024x1024 d=64");
    case_free(&c);
}
END_TEST

/* One key/value head of 2100 keys (33 key tiles, the last of 52 keys) on
 * two threads: its key tiles split two ways, each split's dq folded into
 * double every 16 of its tiles, against one thread's single run (folded
 * every 16 tiles too); causal, the splits' tiles see different rows. And
 * 1000 keys: splits without double sums, their copies added in double. */
START_TEST(threads_2_splits_of_one_pair)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 1, 300, 2100, 16, 8);
    sdpa_case c;
    case_init(&c, &p, 3760, 1.0);
    compare_threads(&c, 2, "MQA 300x2100 d=16");
    case_free(&c);
    p = sdpa_shape(1, 1, 1, 2100, 2100, 8, 8);
    p.causal = true;
    case_init(&c, &p, 3761, 1.0);
    compare_threads(&c, 2, "2100x2100 causal d=8");
    case_free(&c);
    p = sdpa_shape(1, 2, 1, 300, 1000, 16, 8);
    case_init(&c, &p, 3762, 1.0);
    compare_threads(&c, 2, "MQA 300x1000 d=16");
    case_free(&c);
}
END_TEST

typedef struct {
    const sdpa_case *c;
    float *out;
    attn_status st;
} concurrent_job;

static void *concurrent_worker(void *arg)
{
    concurrent_job *job = arg;
    attn_sdpa_params p = job->c->lib;
    p.threads = 2;
    for (int rep = 0; rep < 3 && job->st == ATTN_OK; rep++)
        job->st = attn_sdpa_forward(&p, job->c->q, job->c->k, job->c->v,
                                    job->out, NULL, NULL, NULL, NULL);
    return NULL;
}

/* Calls from several threads at once, each with its own threads, share no
 * hidden state. */
START_TEST(concurrent_calls_from_two_threads_match_sequential)
{
    attn_sdpa_params pa = sdpa_shape(1, 2, 2, 150, 150, 16, 16);
    attn_sdpa_params pb = sdpa_shape(2, 2, 1, 90, 140, 8, 4);
    pb.causal = true;
    sdpa_case a, b;
    case_init(&a, &pa, 3800, 2.0);
    case_init(&b, &pb, 3801, 2.0);
    lib_fwd sa, sb;
    lib_forward(&a, &a.lib, &sa, false, false);
    lib_forward(&b, &b.lib, &sb, false, false);
    concurrent_job ja = {&a, nan_floats(a.n_out), ATTN_OK};
    concurrent_job jb = {&b, nan_floats(b.n_out), ATTN_OK};
    pthread_t ta, tb;
    ck_assert_int_eq(pthread_create(&ta, NULL, concurrent_worker, &ja), 0);
    ck_assert_int_eq(pthread_create(&tb, NULL, concurrent_worker, &jb), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    ck_assert_int_eq(ja.st, ATTN_OK);
    ck_assert_int_eq(jb.st, ATTN_OK);
    ASSERT_ERR(float_diff(sa.out, ja.out, a.n_out), 1e-6, "concurrent a");
    ASSERT_ERR(float_diff(sb.out, jb.out, b.n_out), 1e-6, "concurrent b");
    free(ja.out);
    free(jb.out);
    lib_fwd_free(&sa);
    lib_fwd_free(&sb);
    case_free(&a);
    case_free(&b);
}
END_TEST

/* ---------------------------------------------------- invalid arguments */

/* Buffers far larger than any shape below, so that a library that reads
 * before it validates still does not crash the test. */
#define BIG 4096
static float g_in[BIG], g_out[BIG], g_out2[BIG], g_out3[BIG];
static attn_softmax_row g_lse[BIG];

static attn_sdpa_params valid_params(void)
{
    return sdpa_shape(1, 4, 2, 3, 3, 2, 2);
}

static void expect_invalid_forward(const attn_sdpa_params *p, const float *q,
                                   const float *k, const float *v, float *out,
                                   const char *why)
{
    attn_error err;
    memset(&err, 0, sizeof err);
    attn_status st =
        attn_sdpa_forward(p, q, k, v, out, NULL, NULL, NULL, &err);
    ck_assert_msg(st == ATTN_ERR_INVALID, "%s: forward returned %d", why,
                  (int)st);
    ck_assert_msg(err.status == ATTN_ERR_INVALID, "%s: err.status %d", why,
                  (int)err.status);
    ck_assert_msg(err.message[0] != '\0', "%s: empty message", why);
    ck_assert_msg(memchr(err.message, '\0', sizeof err.message) != NULL,
                  "%s: message not terminated", why);
    st = attn_sdpa_forward(p, q, k, v, out, NULL, NULL, NULL, NULL);
    ck_assert_msg(st == ATTN_ERR_INVALID, "%s: with err NULL returned %d",
                  why, (int)st);
}

static void expect_invalid_backward(const attn_sdpa_params *p,
                                    const float *dout, const char *why)
{
    attn_error err;
    memset(&err, 0, sizeof err);
    attn_status st = attn_sdpa_backward(p, g_in, g_in, g_in, g_in, g_lse,
                                        dout, g_out, g_out2, g_out3, &err);
    ck_assert_msg(st == ATTN_ERR_INVALID, "%s: backward returned %d", why,
                  (int)st);
    ck_assert_msg(err.message[0] != '\0', "%s: empty message", why);
    st = attn_sdpa_backward(p, g_in, g_in, g_in, g_in, g_lse, dout, g_out,
                            g_out2, g_out3, NULL);
    ck_assert_msg(st == ATTN_ERR_INVALID, "%s: backward, err NULL: %d", why,
                  (int)st);
}

START_TEST(valid_params_are_accepted)
{
    /* The baseline the invalid cases below each break in one way. */
    attn_sdpa_params p = valid_params();
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&p, g_in, g_in, g_in, g_out, g_lse, NULL,
                                NULL, &err),
              err);
    ASSERT_OK(attn_sdpa_backward(&p, g_in, g_in, g_in, g_in, g_lse, g_in,
                                 g_out, g_out2, g_out3, &err),
              err);
}
END_TEST

START_TEST(invalid_heads_not_divisible)
{
    attn_sdpa_params p = valid_params();
    p.heads_kv = 3; /* 4 % 3 != 0 */
    expect_invalid_forward(&p, g_in, g_in, g_in, g_out, "H_q=4 H_kv=3");
    expect_invalid_backward(&p, g_in, "H_q=4 H_kv=3");
    p.heads_kv = 8; /* more kv heads than query heads */
    expect_invalid_forward(&p, g_in, g_in, g_in, g_out, "H_q=4 H_kv=8");
    p.heads_kv = 0;
    expect_invalid_forward(&p, g_in, g_in, g_in, g_out, "H_kv=0");
    p = valid_params();
    p.heads_q = 0;
    expect_invalid_forward(&p, g_in, g_in, g_in, g_out, "H_q=0");
}
END_TEST

START_TEST(invalid_scale_not_positive_finite)
{
    const float bad[] = {0.0f, -0.0f, -0.5f, NAN, INFINITY, -INFINITY};
    const char *names[] = {"0", "-0", "-0.5", "NaN", "inf", "-inf"};
    for (size_t t = 0; t < sizeof bad / sizeof bad[0]; t++) {
        attn_sdpa_params p = valid_params();
        p.scale = bad[t];
        char why[32];
        snprintf(why, sizeof why, "scale %s", names[t]);
        expect_invalid_forward(&p, g_in, g_in, g_in, g_out, why);
        expect_invalid_backward(&p, g_in, why);
    }
}
END_TEST

START_TEST(invalid_sizes_zero_or_negative)
{
    int64_t *fields[7];
    const char *names[7] = {"batch", "heads_q", "heads_kv", "n_q",
                            "n_k",   "d_k",     "d_v"};
    for (int f = 0; f < 7; f++)
        for (int64_t bad = 0; bad >= -1; bad--) {
            attn_sdpa_params p = valid_params();
            fields[0] = &p.batch;
            fields[1] = &p.heads_q;
            fields[2] = &p.heads_kv;
            fields[3] = &p.n_q;
            fields[4] = &p.n_k;
            fields[5] = &p.d_k;
            fields[6] = &p.d_v;
            *fields[f] = bad;
            char why[48];
            snprintf(why, sizeof why, "%s = %lld", names[f], (long long)bad);
            expect_invalid_forward(&p, g_in, g_in, g_in, g_out, why);
            expect_invalid_backward(&p, g_in, why);
        }
}
END_TEST

START_TEST(invalid_threads_zero_or_negative)
{
    attn_sdpa_params p = valid_params();
    p.threads = 0;
    expect_invalid_forward(&p, g_in, g_in, g_in, g_out, "threads 0");
    expect_invalid_backward(&p, g_in, "threads 0");
    p.threads = -2;
    expect_invalid_forward(&p, g_in, g_in, g_in, g_out, "threads -2");
}
END_TEST

START_TEST(invalid_null_tensors)
{
    attn_sdpa_params p = valid_params();
    expect_invalid_forward(&p, NULL, g_in, g_in, g_out, "q NULL");
    expect_invalid_forward(&p, g_in, NULL, g_in, g_out, "k NULL");
    expect_invalid_forward(&p, g_in, g_in, NULL, g_out, "v NULL");
    expect_invalid_forward(&p, g_in, g_in, g_in, NULL, "out NULL");
    expect_invalid_backward(&p, NULL, "dout NULL");
    attn_error err = {0};
    ck_assert_msg(attn_sdpa_forward(NULL, g_in, g_in, g_in, g_out, NULL, NULL,
                                    NULL, &err) == ATTN_ERR_INVALID,
                  "params NULL");
}
END_TEST

START_TEST(invalid_mask_without_data)
{
    attn_sdpa_params p = valid_params();
    p.mask.kind = ATTN_MASK_BOOL; /* allowed left NULL */
    expect_invalid_forward(&p, g_in, g_in, g_in, g_out, "bool mask NULL");
    p.mask.kind = ATTN_MASK_BIAS; /* bias left NULL */
    expect_invalid_forward(&p, g_in, g_in, g_in, g_out, "bias mask NULL");
    p.mask.kind = (attn_mask_kind)7;
    p.mask.bias = g_in;
    expect_invalid_forward(&p, g_in, g_in, g_in, g_out, "unknown mask kind");
}
END_TEST

/* Shapes whose element counts overflow are refused before anything is
 * allocated or read (the buffers passed here are tiny). */
START_TEST(invalid_sizes_that_overflow_are_rejected)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 1, 1, 1, 1);
    p.n_q = (int64_t)1 << 62;
    p.d_k = 16;
    expect_invalid_forward(&p, g_in, g_in, g_in, g_out, "n_q * d_k overflows");
    p = sdpa_shape(1, 1, 1, 1, 1, 1, 1);
    p.batch = (int64_t)1 << 40;
    p.heads_q = p.heads_kv = (int64_t)1 << 30;
    expect_invalid_forward(&p, g_in, g_in, g_in, g_out, "B * H overflows");
    /* q, k, v fit in int64 but the weights [n_q, n_k] do not. */
    p = sdpa_shape(1, 1, 1, (int64_t)1 << 33, (int64_t)1 << 33, 1, 1);
    attn_error err;
    memset(&err, 0, sizeof err);
    attn_status st = attn_sdpa_forward(&p, g_in, g_in, g_in, g_out, NULL,
                                       g_out2, NULL, &err);
    ck_assert_msg(st == ATTN_ERR_INVALID && err.message[0] != '\0',
                  "weights of 2^66 elements accepted (%d)", (int)st);
}
END_TEST

/* ----------------------------------------------- softmax row kernels */

static const attn_kernel_kind vexp_kinds[] = {ATTN_KERNEL_GENERIC, ATTN_KERNEL_AVX2,
                                              ATTN_KERNEL_AVX512};
static const char *const vexp_names[] = {"generic", "avx2", "avx512"};

/* Every version the CPU runs: exp within a few ulp of exp in double,
 * exp(0) exactly 1, arguments below ATTN_EXP_MIN and -inf exactly 0, the
 * returned sum equal to the sum of the results, and nothing written past
 * the row (the vector tails use masked loads and stores). */
START_TEST(vexp_kinds_match_exp_and_flush_below_min)
{
    enum { MAXN = 67, GUARD = 17 };
    float x[MAXN + GUARD], arg[MAXN];
    for (size_t kd = 0; kd < 3; kd++) {
        if (attn_kern_of(vexp_kinds[kd]) == NULL)
            continue;
        double worst = 0.0;
        uint64_t seed = 4000 + kd;
        for (int64_t n = 0; n <= MAXN; n++) {
            const float shift = n % 3 == 0 ? 0.0f : 2.5f;
            for (int64_t j = 0; j < n; j++) {
                switch ((n + j) % 7) {
                case 0: x[j] = shift; break;                   /* exp(0) */
                case 1: x[j] = -INFINITY; break;               /* masked */
                case 2: x[j] = shift + ATTN_EXP_MIN - 0.01f; break;
                case 3: x[j] = shift + ATTN_EXP_MIN + 0.01f; break;
                default:
                    x[j] = shift + (float)(44.0 * rng_uniform(&seed) - 43.0);
                }
                arg[j] = x[j] - shift;
            }
            for (int g = 0; g < GUARD; g++)
                x[n + g] = 12345.0f;
            float sum = attn_kern_of(vexp_kinds[kd])->exp_sum(x, n, shift);
            double total = 0.0;
            /* exact: 0 below the minimum, 1 at 0; the rest relative */
            worst_elem exact = {0}, rel = {0};
            for (int64_t j = 0; j < n; j++) {
                total += x[j];
                if (arg[j] < ATTN_EXP_MIN || arg[j] == 0.0f) {
                    double want = arg[j] == 0.0f ? 1.0 : 0.0;
                    worst_note(&exact, j, x[j], want, exact_err(x[j], want));
                    continue;
                }
                double want = exp((double)arg[j]);
                worst_note(&rel, j, x[j], want, fabs(x[j] - want) / want);
            }
            worst = fmax(worst, rel.err);
            ck_assert_msg(exact.err == 0, "%s: exp(%g) = %.9g, want %g", vexp_names[kd],
                          (double)arg[exact.at], exact.got, exact.want);
            ck_assert_msg(rel.err < 4.8e-7, "%s: exp(%.9g) = %.9g, want %.9g",
                          vexp_names[kd], (double)arg[rel.at], rel.got, rel.want);
            int past = 0;
            while (past < GUARD && x[n + past] == 12345.0f)
                past++;
            ck_assert_msg(past == GUARD, "%s: n=%lld wrote past the row at +%d",
                          vexp_names[kd], (long long)n, past);
            ck_assert_msg(fabs(sum - total) <= 1e-6 * (1.0 + total),
                          "%s: n=%lld sum %.9g, elements add to %.9g",
                          vexp_names[kd], (long long)n, (double)sum, total);
        }
        char label[64];
        snprintf(label, sizeof label, "vexp %s relative error",
                 vexp_names[kd]);
        note(label, worst);
    }
}
END_TEST

START_TEST(vmax_kinds_find_the_maximum_at_every_position)
{
    enum { MAXN = 67 };
    float x[MAXN + 16];
    for (size_t kd = 0; kd < 3; kd++) {
        if (attn_kern_of(vexp_kinds[kd]) == NULL)
            continue;
        ck_assert_msg(attn_kern_of(vexp_kinds[kd])->max(x, 0) == -INFINITY,
                      "%s: max of nothing", vexp_names[kd]);
        int64_t wrong_n = 0, wrong_at = 0;
        float wrong = -1.0f;
        for (int64_t n = 1; n <= MAXN; n++)
            for (int64_t at = 0; at < n; at++) {
                for (int64_t j = 0; j < n; j++)
                    x[j] = j % 4 == 1 ? -INFINITY : -3.0f - (float)j;
                for (int g = 0; g < 16; g++)
                    x[n + g] = 1e30f; /* past the row: must not be read */
                x[at] = -1.0f;
                float m = attn_kern_of(vexp_kinds[kd])->max(x, n);
                if (!(m == -1.0f) && wrong == -1.0f)
                    wrong = m, wrong_n = n, wrong_at = at;
            }
        ck_assert_msg(wrong == -1.0f, "%s: n=%lld max at %lld: got %g", vexp_names[kd],
                      (long long)wrong_n, (long long)wrong_at, (double)wrong);
        for (int64_t j = 0; j < 20; j++)
            x[j] = -INFINITY;
        ck_assert_msg(attn_kern_of(vexp_kinds[kd])->max(x, 20) == -INFINITY,
                      "%s: all -inf", vexp_names[kd]);
    }
}
END_TEST

/* --------------------------------------------------- OpenBLAS's kernels */

/* attn_blas_shortfall(corename, features, msg): the corenames and feature
 * sets are given here, so every case runs on any machine. */
static bool shortfall(const char *core, unsigned cpu, char *msg, size_t cap)
{
    msg[0] = '\0';
    return attn_blas_shortfall(core, cpu, msg, cap);
}

#define CPU_AVX2_FMA (ATTN_CPU_AVX | ATTN_CPU_AVX2 | ATTN_CPU_FMA)
#define CPU_AVX512 (CPU_AVX2_FMA | ATTN_CPU_AVX512)

START_TEST(blas_shortfall_prescott_on_avx512_names_both_coretypes)
{
    char msg[512];
    ck_assert(shortfall("Prescott", CPU_AVX512, msg, sizeof msg));
    ck_assert_msg(strstr(msg, "Prescott") && strstr(msg, "SSE3") && strstr(msg, "AVX-512"),
                  "%s", msg);
    ck_assert_msg(strstr(msg, "OPENBLAS_CORETYPE=SkylakeX"), "%s", msg);
    /* 64 against 8 FLOP a cycle; Haswell's AVX2 kernels, 32 against 8. */
    ck_assert_msg(strstr(msg, "up to 8x slower"), "%s", msg);
    ck_assert_msg(strstr(msg, "or Haswell") && strstr(msg, "(up to 4x)"), "%s", msg);
}
END_TEST

START_TEST(blas_shortfall_haswell_on_avx512_costs_up_to_2x)
{
    char msg[512];
    ck_assert(shortfall("Haswell", CPU_AVX512, msg, sizeof msg));
    ck_assert_msg(strstr(msg, "up to 2x slower") && strstr(msg, "OPENBLAS_CORETYPE=SkylakeX"),
                  "%s", msg);
    ck_assert_msg(strstr(msg, "or Haswell") == NULL, "%s", msg);
    ck_assert(shortfall("zen", CPU_AVX512, msg, sizeof msg));
}
END_TEST

START_TEST(blas_shortfall_on_avx2_and_avx_cpus_names_their_coretype)
{
    char msg[512];
    ck_assert(shortfall("Nehalem", CPU_AVX2_FMA, msg, sizeof msg));
    ck_assert_msg(strstr(msg, "OPENBLAS_CORETYPE=Haswell") && strstr(msg, "up to 4x"), "%s", msg);
    ck_assert_msg(strstr(msg, "SkylakeX") == NULL, "%s", msg);
    ck_assert(shortfall("Sandybridge", CPU_AVX2_FMA, msg, sizeof msg));
    ck_assert_msg(strstr(msg, "up to 2x"), "%s", msg);
    /* AVX2 without FMA: OpenBLAS's Haswell kernels need both. */
    ck_assert(shortfall("Core2", ATTN_CPU_AVX | ATTN_CPU_AVX2, msg, sizeof msg));
    ck_assert_msg(strstr(msg, "OPENBLAS_CORETYPE=Sandybridge"), "%s", msg);
}
END_TEST

START_TEST(blas_shortfall_none_when_kernels_use_all_the_cpu_has)
{
    char msg[512];
    const char *avx512_cores[] = {"SkylakeX", "Cooperlake", "SapphireRapids", "SKYLAKEX"};
    for (size_t i = 0; i < sizeof avx512_cores / sizeof avx512_cores[0]; i++)
        ck_assert_msg(!shortfall(avx512_cores[i], CPU_AVX512, msg, sizeof msg), "%s", msg);
    ck_assert(!shortfall("Haswell", CPU_AVX2_FMA, msg, sizeof msg));
    ck_assert(!shortfall("Zen", CPU_AVX2_FMA, msg, sizeof msg));
    ck_assert(!shortfall("Sandybridge", ATTN_CPU_AVX, msg, sizeof msg));
    ck_assert(!shortfall("Prescott", 0, msg, sizeof msg));
    /* Kernels wider than the CPU (a forced coretype): nothing is lost. */
    ck_assert(!shortfall("SkylakeX", CPU_AVX2_FMA, msg, sizeof msg));
    ck_assert_str_eq(msg, "");
}
END_TEST

START_TEST(blas_shortfall_makes_no_claim_for_unknown_cores)
{
    char msg[512];
    ck_assert(!shortfall("Unknown", CPU_AVX512, msg, sizeof msg));
    ck_assert(!shortfall("ARMV8", CPU_AVX512, msg, sizeof msg));
    ck_assert(!shortfall("", CPU_AVX512, msg, sizeof msg));
    ck_assert(!shortfall(NULL, CPU_AVX512, msg, sizeof msg));
    ck_assert_str_eq(msg, "");
}
END_TEST

START_TEST(blas_shortfall_message_fits_any_buffer)
{
    char msg[16];
    memset(msg, 'x', sizeof msg);
    ck_assert(attn_blas_shortfall("Prescott", CPU_AVX512, msg, 8));
    ck_assert_uint_eq(strlen(msg), 7);
    ck_assert_int_eq(msg[9], 'x');
    ck_assert(attn_blas_shortfall("Prescott", CPU_AVX512, NULL, 0));
}
END_TEST

START_TEST(cpu_features_agree_with_the_kernels_supported)
{
    unsigned f = attn_cpu_features();
    ck_assert_int_eq(attn_kernel_supported(ATTN_KERNEL_AVX2),
                     (f & ATTN_CPU_AVX2) && (f & ATTN_CPU_FMA));
    if (f & ATTN_CPU_AVX512)
        ck_assert(attn_kernel_supported(ATTN_KERNEL_AVX512));
    if (f & ATTN_CPU_AVX2)
        ck_assert(f & ATTN_CPU_AVX);
}
END_TEST

/* Whether /proc/cpuinfo's first "flags" line lists `flag`; -1 when the
 * file cannot be read (not Linux). Linux lists an instruction set only when
 * it also saves its registers, as cpu_features() requires. */
static int cpuinfo_has(const char *flag)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL)
        return -1;
    static char line[1 << 14];
    int has = -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "flags", 5) == 0) {
            has = 0;
            for (char *t = strtok(strchr(line, ':') + 1, " \n"); t; t = strtok(NULL, " \n"))
                has |= strcmp(t, flag) == 0;
            break;
        }
    fclose(f);
    return has;
}

START_TEST(cpu_features_match_proc_cpuinfo)
{
#if defined(__x86_64__)
    static const struct {
        unsigned bit;
        const char *flag;
    } FLAGS[] = {
        {CPU_AVX, "avx"},           {CPU_AVX2, "avx2"},         {CPU_FMA, "fma"},
        {CPU_F16C, "f16c"},         {CPU_AVX512F, "avx512f"},   {CPU_AVX512BW, "avx512bw"},
        {CPU_AVX512DQ, "avx512dq"}, {CPU_AVX512VL, "avx512vl"}, {CPU_AVX512_BF16, "avx512_bf16"},
        {CPU_AMX_TILE, "amx_tile"}, {CPU_AMX_BF16, "amx_bf16"},
    };
    if (cpuinfo_has("fpu") < 0)
        return; /* no /proc/cpuinfo to hold the probe to */
    /* Under valgrind the process runs on valgrind's CPU, whose CPUID hides
     * what it cannot emulate (AVX-512 and AMX) while /proc/cpuinfo still
     * describes the host; the probe must then follow CPUID, and the
     * comparison is with the wrong machine. Valgrind preloads its
     * vgpreload_*.so into every program it runs. */
    const char *preload = getenv("LD_PRELOAD");
    if (preload != NULL && strstr(preload, "vgpreload") != NULL)
        return;
    char differ[256] = "";
    for (size_t i = 0; i < sizeof FLAGS / sizeof *FLAGS; i++)
        if (cpu_has(FLAGS[i].bit) != (cpuinfo_has(FLAGS[i].flag) == 1))
            snprintf(differ + strlen(differ), sizeof differ - strlen(differ), " %s (%s)",
                     FLAGS[i].flag, cpu_has(FLAGS[i].bit) ? "probed only" : "cpuinfo only");
    ck_assert_msg(differ[0] == '\0', "cpu_features() and /proc/cpuinfo differ on:%s", differ);
#endif
    ck_assert_uint_eq(cpu_features(), cpu_features());
    /* Permission for AMX is asked only of a CPU that has it. */
    ck_assert(!cpu_amx_request() || cpu_has(CPU_AMX_TILE));
}
END_TEST

/* --------------------------------------------------------------- suite */

static Suite *lib_suite(void)
{
    Suite *s = suite_create("lib");
    /* kernel: the group's results depend on libattn's kernel (ATTN_KERNEL),
     * and make test runs it once per kernel (the tag "kernel",
     * tests/run-suites.sh). The "kernels" group calls each one by name. */
    struct {
        const char *name;
        bool kernel;
        const TTest *tests[16];
    } groups[] = {
        {"functions", false,
         {default_scale_is_inverse_sqrt_dk,
          flops_count_two_products_without_mask_discount}},
        {"chapter", true,
         {worked_example_1_two_tokens_weights_0_6698,
          worked_example_2_three_tokens_closed_form,
          exercise_5_causal_n3_lower_triangular,
          exercise_5_causal_n4_lower_triangular,
          exercise_5_causal_uniform_scores_average_the_prefix,
          exercise_6_unscaled_scores_saturate_softmax,
          exercise_6_scaled_by_inverse_sqrt_64}},
        {"forward", true,
         {reference_backward_matches_its_finite_differences,
          forward_matches_reference_small_shapes_ranks_2_to_4,
          forward_square_sizes_around_tile_boundaries,
          forward_square_causal_around_tile_boundaries,
          forward_nq_ne_nk_around_tile_boundaries,
          forward_causal_nq_ne_nk_around_tile_boundaries,
          forward_batched_heads_around_tile_boundaries,
          forward_many_key_tiles_and_wide_heads,
          forward_optional_outputs_may_be_null}},
        {"causal", true,
         {causal_bottom_right_when_nq_lt_nk,
          causal_nq_gt_nk_top_rows_zero_with_lse_minus_inf,
          causal_nq_gt_nk_backward_gives_zero_grads_no_nan,
          causal_weights_zero_above_aligned_diagonal_at_tile_sizes}},
        {"masks", true,
         {mask_broadcast_strides_for_each_shape,
          mask_broadcast_rejects_non_broadcastable_shapes,
          bool_mask_broadcast_shapes_match_reference,
          bias_mask_broadcast_shapes_match_reference,
          bool_mask_combined_with_causal, bias_mask_combined_with_causal,
          bias_mask_scalar_changes_only_lse,
          mask_arbitrary_strides_key_major_layout,
          bool_mask_fully_masked_row_gives_zeros,
          bool_mask_all_false_gives_zeros_and_empty_stats,
          bool_mask_with_causal_around_tile_boundaries}},
        {"gqa", true,
         {gqa_forward_hq4_hkv2_and_hkv1, gqa_query_head_uses_kv_head_h_over_group,
          gqa_backward_hkv2_sums_shared_heads,
          gqa_backward_hkv1_multi_query}},
        {"extremes", true,
         {extreme_scores_give_exact_one_hot_weights,
          extreme_scores_across_tiles_and_backward_stay_finite}},
        {"gradients", true,
         {grad_matches_finite_differences_plain,
          grad_matches_finite_differences_causal,
          grad_matches_finite_differences_nq_ne_nk,
          grad_matches_finite_differences_with_masks,
          grad_matches_finite_differences_explicit_scale_rank4,
          grad_size_one_everything,
          grad_around_tile_boundaries_matches_analytic_reference,
          grad_causal_nq_gt_nk_gqa_two_threads_matches_analytic_reference,
          grad_after_forward_with_weights_and_stats,
          grad_overwrites_rather_than_accumulates,
          grad_unchanged_by_a_large_constant_row_bias,
          grad_zero_for_exactly_one_hot_rows_at_large_scale}},
        {"properties", true,
         {weights_rows_sum_to_one, output_in_convex_hull_of_visible_values,
          self_attention_permutation_equivariant}},
        {"stats", true,
         {stats_match_reference_without_mask,
          stats_match_reference_causal_bool_mask_gqa,
          stats_bias_counts_every_score,
          stats_match_reference_around_tile_boundaries,
          stats_many_key_tiles_two_threads}},
        {"threads", true,
         {threads_1_and_2_agree_forward_and_backward,
          threads_more_than_work_agree,
          threads_2_large_backward_sums_every_workers_dq,
          threads_2_splits_of_one_pair,
          concurrent_calls_from_two_threads_match_sequential,
          parallel_for_runs_every_unit_once}},
        {"cancel", false,
         {cancel_flag_stops_every_entry_point_and_zero_changes_nothing,
          cancel_flag_set_midway_stops_a_long_call_early}},
        {"kernels", false,
         {vexp_kinds_match_exp_and_flush_below_min,
          vmax_kinds_find_the_maximum_at_every_position}},
        {"blas", false,
         {blas_shortfall_prescott_on_avx512_names_both_coretypes,
          blas_shortfall_haswell_on_avx512_costs_up_to_2x,
          blas_shortfall_on_avx2_and_avx_cpus_names_their_coretype,
          blas_shortfall_none_when_kernels_use_all_the_cpu_has,
          blas_shortfall_makes_no_claim_for_unknown_cores,
          blas_shortfall_message_fits_any_buffer,
          cpu_features_agree_with_the_kernels_supported,
          cpu_features_match_proc_cpuinfo}},
        {"invalid", false,
         {valid_params_are_accepted, invalid_heads_not_divisible,
          invalid_scale_not_positive_finite, invalid_sizes_zero_or_negative,
          invalid_threads_zero_or_negative, invalid_null_tensors,
          invalid_mask_without_data,
          invalid_sizes_that_overflow_are_rejected}},
    };
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        TCase *tc = tcase_create(groups[g].name);
        if (groups[g].kernel)
            tcase_set_tags(tc, "kernel");
        /* Generous: the sanitizer build at -O1 is several times slower. */
        tcase_set_timeout(tc, 120);
        for (size_t t = 0; t < 16 && groups[g].tests[t]; t++)
            tcase_add_test(tc, groups[g].tests[t]);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(lib_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
