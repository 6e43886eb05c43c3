/*
 * The attention variants of attn_variants (sliding window, ALiBi, logit
 * soft-capping, rotary embedding) and the softmax rows as log-sum-exp,
 * against the double reference (tests/support/ref.c, which implements each
 * variant from its definition): each alone and combined with causal, masks
 * and GQA, at shapes that cross the kernels' tiles, forward, weights, lse,
 * statistics and every gradient (finite differences on small shapes, the
 * analytic reference on larger ones). Then what they promise: a window's
 * cost is its band, keys split over shards merge exactly through the lse,
 * attention without RoPE is blind to the order of the keys and with RoPE is
 * not.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "support/ref.h"
#include "support/sdpa_case.h"

/* A problem with the variants set on both sides (the library's and the
 * reference's parameters). */
static void case_variants(sdpa_case *c, attn_variants v)
{
    c->lib.variants = v;
    c->ref.variants = v;
}

static float g_slopes[64];

/* ALiBi's slopes as the papers choose them: 2^(-8h/H) for head h = 1 .. H. */
static const float *geometric_slopes(int64_t heads, int64_t batch)
{
    ck_assert(heads * batch <= 64);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++)
            g_slopes[b * heads + h] = (float)(pow(2.0, -8.0 * (double)(h + 1) / (double)heads) *
                                              (1.0 + 0.25 * (double)b));
    return g_slopes;
}

/* Forward (out, lse, weights) and gradients for one configuration at a
 * small shape (finite differences) and a tile-crossing one (analytic). */
static void check_variant(const char *name, attn_variants v, bool causal, int64_t heads_kv)
{
    const struct { int64_t nq, nk, dk, dv; } small = {5, 7, 4, 3}, large = {70, 150, 8, 5};
    char label[128];
    for (int size = 0; size < 2; size++) {
        int64_t nq = size ? large.nq : small.nq, nk = size ? large.nk : small.nk;
        int64_t dk = size ? large.dk : small.dk, dv = size ? large.dv : small.dv;
        attn_sdpa_params p = sdpa_shape(2, 4, heads_kv, nq, nk, dk, dv);
        p.causal = causal;
        p.threads = 2;
        if (v.alibi_slopes != NULL)
            v.alibi_slopes = geometric_slopes(4, v.alibi_batch_stride ? 2 : 1);
        sdpa_case c;
        case_init(&c, &p, 900 + (uint64_t)size, 2.0);
        case_variants(&c, v);
        snprintf(label, sizeof label, "%s%s %lldx%lld", name, causal ? " causal" : "",
                 (long long)nq, (long long)nk);
        check_forward(&c, TOL_FORWARD, label);
        if (size == 0)
            check_grad_fd(&c, label);
        else
            check_grad_analytic(&c, label);
        case_free(&c);
    }
}

START_TEST(window_matches_reference_each_side_and_both)
{
    const int64_t sides[][2] = {{3, -1}, {-1, 2}, {2, 1}, {0, 0}, {40, 5}, {-1, -1}};
    for (size_t i = 0; i < sizeof sides / sizeof *sides; i++) {
        attn_variants v = {.window = true, .window_left = sides[i][0],
                           .window_right = sides[i][1]};
        char name[64];
        snprintf(name, sizeof name, "window [%lld, %lld]", (long long)sides[i][0],
                 (long long)sides[i][1]);
        check_variant(name, v, false, 4);
        check_variant(name, v, true, 2);
    }
}
END_TEST

START_TEST(alibi_matches_reference_per_head_and_per_batch)
{
    attn_variants v = {.alibi_slopes = g_slopes};
    check_variant("alibi [H]", v, false, 4);
    check_variant("alibi [H]", v, true, 1);
    v.alibi_batch_stride = 4;
    check_variant("alibi [B, H]", v, false, 2);
}
END_TEST

START_TEST(softcap_matches_reference_below_and_at_saturation)
{
    const float caps[] = {50.0f, 2.0f, 0.3f};
    for (size_t i = 0; i < sizeof caps / sizeof *caps; i++) {
        attn_variants v = {.softcap = caps[i]};
        char name[64];
        snprintf(name, sizeof name, "softcap %g", (double)caps[i]);
        check_variant(name, v, false, 4);
        check_variant(name, v, true, 2);
    }
}
END_TEST

START_TEST(rope_matches_reference_queries_behind_and_ahead_of_keys)
{
    attn_variants v = {.rope_base = 10000.0f};
    check_variant("rope", v, false, 4);
    check_variant("rope", v, true, 2);
    v.rope_base = 100.0f;
    check_variant("rope base 100", v, false, 1);
    /* n_q > n_k: queries at negative positions. */
    attn_sdpa_params p = sdpa_shape(1, 2, 2, 9, 4, 6, 2);
    sdpa_case c;
    case_init(&c, &p, 77, 1.0);
    case_variants(&c, v);
    check_forward(&c, TOL_FORWARD, "rope n_q > n_k");
    check_grad_fd(&c, "rope n_q > n_k");
    case_free(&c);
}
END_TEST

START_TEST(every_variant_at_once_with_masks_and_gqa)
{
    attn_variants v = {.window = true, .window_left = 30, .window_right = 4,
                       .alibi_slopes = g_slopes, .softcap = 5.0f, .rope_base = 500.0f};
    check_variant("all", v, false, 2);
    check_variant("all", v, true, 1);
    /* With a boolean and an additive mask, rows that see nothing at all. */
    const int64_t shape[2] = {70, 150};
    for (int kind = 0; kind < 2; kind++) {
        attn_sdpa_params p = sdpa_shape(2, 4, 2, 70, 150, 8, 5);
        p.threads = 2;
        sdpa_case c;
        case_init(&c, &p, 950 + (uint64_t)kind, 2.0);
        case_mask(&c, kind ? ATTN_MASK_BIAS : ATTN_MASK_BOOL, 2, shape, 960);
        v.alibi_slopes = geometric_slopes(4, 1);
        v.window_left = 3;
        v.window_right = 0;
        case_variants(&c, v);
        check_forward(&c, TOL_FORWARD, kind ? "all + bias mask" : "all + bool mask");
        check_grad_analytic(&c, kind ? "all + bias mask" : "all + bool mask");
        case_free(&c);
    }
}
END_TEST

/* Statistics see the scores after soft-capping, over the keys the window
 * leaves; entropy and largest weight over the final weights. */
START_TEST(stats_with_window_and_softcap_match_reference)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 1, 90, 130, 16, 8);
    p.threads = 2;
    sdpa_case c;
    case_init(&c, &p, 971, 3.0);
    attn_variants v = {.window = true, .window_left = 20, .window_right = 7, .softcap = 1.5f,
                       .rope_base = 1000.0f};
    case_variants(&c, v);
    lib_fwd got;
    lib_forward(&c, &c.lib, &got, false, true);
    attn_stats want;
    ref_sdpa_stats(&c.ref, c.qd, c.kd, &want);
    ck_assert_int_eq(got.stats.scores_count, want.scores_count);
    ck_assert_int_eq(got.stats.rows_count, want.rows_count);
    const double pairs[][2] = {
        {got.stats.scores_mean, want.scores_mean}, {got.stats.scores_var, want.scores_var},
        {got.stats.scaled_mean, want.scaled_mean}, {got.stats.scaled_var, want.scaled_var},
        {got.stats.entropy_mean, want.entropy_mean}, {got.stats.entropy_min, want.entropy_min},
        {got.stats.entropy_max, want.entropy_max},
        {got.stats.max_weight_mean, want.max_weight_mean},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
        ck_assert_msg(fabs(pairs[i][0] - pairs[i][1]) <= TOL_STATS * (1.0 + fabs(pairs[i][1])),
                      "stat %zu: %.9g, want %.9g", i, pairs[i][0], pairs[i][1]);
    lib_fwd_free(&got);
    case_free(&c);
}
END_TEST

/* The window's cost is its band: attn_sdpa_flops counts the visible pairs
 * (counted here one by one), and the kernels skip whole tiles outside. */
START_TEST(window_flops_count_the_band)
{
    attn_sdpa_params p = sdpa_shape(2, 3, 1, 1000, 1200, 16, 8);
    p.causal = true;
    p.variants = (attn_variants){.window = true, .window_left = 100, .window_right = -1};
    double pairs = 0.0;
    for (int64_t i = 0; i < p.n_q; i++)
        for (int64_t j = 0; j < p.n_k; j++) {
            int64_t pos = i + p.n_k - p.n_q;
            pairs += j <= pos && j >= pos - 100;
        }
    double want = 2.0 * 2 * 3 * pairs * (16 + 8);
    ck_assert_msg(attn_sdpa_flops(&p) == want, "flops %.17g, want %.17g", attn_sdpa_flops(&p),
                  want);
    ck_assert(attn_sdpa_flops(&p) < 0.1 * 2.0 * 2 * 3 * 1000 * 1200 * 24);
}
END_TEST

START_TEST(invalid_variants_are_refused_with_a_message)
{
    attn_sdpa_params good = sdpa_shape(1, 2, 1, 3, 3, 4, 4);
    static float q[64], out[64];
    float slopes[2] = {1.0f, NAN};
    attn_variants bad[] = {
        {.window = true, .window_left = -2, .window_right = 0},
        {.window = true, .window_left = 0, .window_right = -5},
        {.softcap = -1.0f},
        {.softcap = INFINITY},
        {.rope_base = -10.0f},
        {.rope_base = NAN},
        {.alibi_slopes = slopes},
        {.alibi_slopes = slopes, .alibi_batch_stride = 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        attn_sdpa_params p = good;
        p.variants = bad[i];
        attn_error err = {0};
        ck_assert_msg(attn_sdpa_forward(&p, q, q, q, out, NULL, NULL, NULL, &err) ==
                              ATTN_ERR_INVALID &&
                          err.message[0] != '\0',
                      "variant %zu accepted", i);
    }
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 3, 3, 5, 4); /* odd d_k */
    p.variants.rope_base = 10000.0f;
    attn_error err = {0};
    ck_assert(attn_sdpa_forward(&p, q, q, q, out, NULL, NULL, NULL, &err) == ATTN_ERR_INVALID);
    ck_assert_msg(strstr(err.message, "even") != NULL, "%s", err.message);
}
END_TEST

/* ---------------------------------------------- log-sum-exp and shards */

/* Keys split into shards, each attended on its own; the outputs merge
 * exactly through the log-sum-exp: lse = logsumexp(lse_s), o = sum_s
 * exp(lse_s - lse) o_s. Shards of 2 and of 5, with a bias mask sliced
 * along with the keys; a shard where a row sees nothing has lse -inf. */
static void merge_shards(int shards)
{
    enum { NQ = 40, NK = 300, D = 16 };
    attn_sdpa_params p = sdpa_shape(1, 2, 2, NQ, NK, D, D);
    p.threads = 2;
    sdpa_case c;
    case_init(&c, &p, 1300 + (uint64_t)shards, 2.0);
    float *bias = xcalloc((size_t)NQ * NK, sizeof *bias);
    uint64_t seed = 5;
    for (int64_t i = 0; i < NQ; i++)
        for (int64_t j = 0; j < NK; j++)
            /* row 3 sees only the keys of the first shard */
            bias[i * NK + j] = i == 3 && j >= NK / shards ? -1e30f : (float)rng_uniform(&seed);
    const int64_t mshape[2] = {NQ, NK};
    attn_error err = {0};
    p.mask.kind = ATTN_MASK_BIAS;
    p.mask.bias = bias;
    ck_assert(attn_mask_broadcast(&p.mask, 2, mshape, 1, 2, NQ, NK, &err) == ATTN_OK);
    const size_t n_out = 2 * NQ * D, n_rows = 2 * NQ;
    float *full = xcalloc(n_out, sizeof *full);
    attn_softmax_row *full_rows = xcalloc(n_rows, sizeof *full_rows);
    ck_assert(attn_sdpa_forward(&p, c.q, c.k, c.v, full, full_rows, NULL, NULL, &err) ==
              ATTN_OK);
    double *lse = xcalloc(n_rows, sizeof *lse), *acc = xcalloc(n_out, sizeof *acc);
    for (size_t r = 0; r < n_rows; r++)
        lse[r] = -INFINITY;
    float *o = xcalloc(n_out, sizeof *o);
    attn_softmax_row *rows = xcalloc(n_rows, sizeof *rows);
    float *ks = xcalloc(2 * NK * D, sizeof *ks), *vs = xcalloc(2 * NK * D, sizeof *vs);
    float *bs = xcalloc((size_t)NQ * NK, sizeof *bs);
    for (int s = 0; s < shards; s++) {
        int64_t j0 = NK * s / shards, j1 = NK * (s + 1) / shards, m = j1 - j0;
        for (int64_t h = 0; h < 2; h++)
            memcpy(ks + h * m * D, c.k + (h * NK + j0) * D, (size_t)(m * D) * sizeof *ks),
                memcpy(vs + h * m * D, c.v + (h * NK + j0) * D, (size_t)(m * D) * sizeof *vs);
        for (int64_t i = 0; i < NQ; i++)
            memcpy(bs + i * m, bias + i * NK + j0, (size_t)m * sizeof *bs);
        attn_sdpa_params ps = p;
        ps.n_k = m;
        ps.mask.bias = bs;
        const int64_t sshape[2] = {NQ, m};
        ck_assert(attn_mask_broadcast(&ps.mask, 2, sshape, 1, 2, NQ, m, &err) == ATTN_OK);
        ck_assert(attn_sdpa_forward(&ps, c.q, ks, vs, o, rows, NULL, NULL, &err) == ATTN_OK);
        /* Fold shard s into the running merge, one row at a time. */
        for (size_t r = 0; r < n_rows; r++) {
            double ls = attn_softmax_lse(rows[r]);
            if (ls == -INFINITY)
                continue;
            double merged = lse[r] == -INFINITY
                                ? ls
                                : fmax(lse[r], ls) + log1p(exp(-fabs(lse[r] - ls)));
            double keep = lse[r] == -INFINITY ? 0.0 : exp(lse[r] - merged);
            for (int64_t t = 0; t < D; t++)
                acc[r * D + t] = keep * acc[r * D + t] + exp(ls - merged) * o[r * D + t];
            lse[r] = merged;
        }
    }
    char label[64];
    double *want = xcalloc(n_out, sizeof *want), *want_lse = xcalloc(n_rows, sizeof *want_lse);
    for (size_t i = 0; i < n_out; i++)
        want[i] = full[i];
    for (size_t r = 0; r < n_rows; r++)
        want_lse[r] = attn_softmax_lse(full_rows[r]);
    float *merged = xcalloc(n_out, sizeof *merged);
    for (size_t i = 0; i < n_out; i++)
        merged[i] = (float)acc[i];
    snprintf(label, sizeof label, "%d shards: output", shards);
    ASSERT_ERR(rel_err(merged, want, n_out), 2e-6, label);
    snprintf(label, sizeof label, "%d shards: lse", shards);
    ASSERT_ERR(lse_err(lse, want_lse, n_rows), 1e-6, label);
    free(bias), free(full), free(full_rows), free(lse), free(acc), free(o), free(rows);
    free(ks), free(vs), free(bs), free(want), free(want_lse), free(merged);
    case_free(&c);
}

START_TEST(key_shards_merge_exactly_through_the_lse)
{
    merge_shards(2);
    merge_shards(5);
}
END_TEST

/* ------------------------------------------------------------ position */

/* Exercise 8: attention alone is blind to order. Permuting the keys and
 * the values together leaves every output as it was (up to the order of
 * float sums); with RoPE the scores depend on positions, so it does not. */
START_TEST(permuting_keys_changes_nothing_without_rope_and_something_with)
{
    enum { N = 24, D = 8 };
    for (int with_rope = 0; with_rope < 2; with_rope++) {
        attn_sdpa_params p = sdpa_shape(1, 1, 1, N, N, D, D);
        p.variants.rope_base = with_rope ? 10000.0f : 0.0f;
        sdpa_case c;
        case_init(&c, &p, 1400, 1.5);
        float *k2 = xcalloc(N * D, sizeof *k2), *v2 = xcalloc(N * D, sizeof *v2);
        for (int j = 0; j < N; j++) { /* reverse the keys */
            memcpy(k2 + j * D, c.k + (N - 1 - j) * D, D * sizeof *k2);
            memcpy(v2 + j * D, c.v + (N - 1 - j) * D, D * sizeof *v2);
        }
        float *o1 = xcalloc(N * D, sizeof *o1), *o2 = xcalloc(N * D, sizeof *o2);
        attn_error err = {0};
        ck_assert(attn_sdpa_forward(&p, c.q, c.k, c.v, o1, NULL, NULL, NULL, &err) == ATTN_OK);
        ck_assert(attn_sdpa_forward(&p, c.q, k2, v2, o2, NULL, NULL, NULL, &err) == ATTN_OK);
        double diff = float_diff(o1, o2, N * D);
        if (with_rope)
            ck_assert_msg(diff > 1e-2, "with RoPE, reversing the keys changed the output by "
                                       "only %.3g", diff);
        else
            ck_assert_msg(diff < 1e-6, "without RoPE, reversing the keys changed the output "
                                       "by %.3g", diff);
        free(k2), free(v2), free(o1), free(o2);
        case_free(&c);
    }
}
END_TEST

/* RoPE makes a score depend on the distance between positions only:
 * the same q and k at positions (p, p - 3) and (p + 50, p + 47) score the
 * same. */
START_TEST(rope_scores_depend_on_the_distance_only)
{
    enum { N = 60, D = 16 };
    attn_sdpa_params p = sdpa_shape(1, 1, 1, N, N, D, 1);
    p.variants.rope_base = 10000.0f;
    p.scale = 1.0f;
    float q[N * D], k[N * D], v[N] = {0};
    uint64_t seed = 9;
    float base_q[D], base_k[D];
    fill(base_q, D, &seed, 1.0);
    fill(base_k, D, &seed, 1.0);
    for (int i = 0; i < N; i++) {
        memcpy(q + i * D, base_q, sizeof base_q);
        memcpy(k + i * D, base_k, sizeof base_k);
    }
    float *w = xcalloc(N * N, sizeof *w);
    float out[N];
    attn_softmax_row rows[N];
    attn_error err = {0};
    ck_assert(attn_sdpa_forward(&p, q, k, v, out, rows, w, NULL, &err) == ATTN_OK);
    /* w[i][j] * exp(lse_i) = exp(score(i, j)): compare scores at equal distance. */
    for (int i = 3; i + 50 < N; i += 7) {
        double s1 = log(w[i * N + i - 3]) + attn_softmax_lse(rows[i]);
        double s2 = log(w[(i + 50) * N + i + 47]) + attn_softmax_lse(rows[i + 50]);
        ck_assert_msg(fabs(s1 - s2) < 1e-4, "distance 3 at %d: %.7g vs %.7g", i, s1, s2);
    }
    free(w);
}
END_TEST

static Suite *variants_suite(void)
{
    Suite *s = suite_create("variants");
    /* Numbers computed by libattn's kernel: make test runs both cases once
     * per kernel (the tag "kernel", tests/run-suites.sh). */
    TCase *tc = tcase_create("each");
    tcase_set_tags(tc, "kernel");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, window_matches_reference_each_side_and_both);
    tcase_add_test(tc, alibi_matches_reference_per_head_and_per_batch);
    tcase_add_test(tc, softcap_matches_reference_below_and_at_saturation);
    tcase_add_test(tc, rope_matches_reference_queries_behind_and_ahead_of_keys);
    tcase_add_test(tc, every_variant_at_once_with_masks_and_gqa);
    tcase_add_test(tc, stats_with_window_and_softcap_match_reference);
    tcase_add_test(tc, window_flops_count_the_band);
    tcase_add_test(tc, invalid_variants_are_refused_with_a_message);
    suite_add_tcase(s, tc);
    tc = tcase_create("promises");
    tcase_set_tags(tc, "kernel");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, key_shards_merge_exactly_through_the_lse);
    tcase_add_test(tc, permuting_keys_changes_nothing_without_rope_and_something_with);
    tcase_add_test(tc, rope_scores_depend_on_the_distance_only);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(variants_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
