/*
 * Memory as a budget: what libattn holds for shapes whose cost is not in
 * their FLOPs (a narrow key tail with a huge d_k, the head mean of many
 * heads' weights), measured as the peak resident memory of a child process
 * that makes the call; and the head mean's values against the per-head
 * weights of an independent double-precision reference.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attn.h"
#include "support/ref.h"
#include "support/sdpa_case.h"

#define MiB (1024.0 * 1024.0)

/* Under AddressSanitizer freed blocks wait in quarantine and every block
 * has red zones: the peak is larger than what the code holds at once. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

/* A bound on memory growth, looser under the sanitizers. */
#define ALLOWED(mib) ((SANITIZED ? 3 * (mib) + 128 : (mib)) * MiB)

/* Resident bytes of this process now (VmRSS). */
static double rss_now(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lf kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib * 1024.0;
}

/* Runs fn(ctx) in a child process and returns how many bytes its resident
 * memory grew at its peak beyond what it started with (fn's own
 * allocations, whatever they were); a failing fn fails the test. */
static double peak_growth(bool (*fn)(void *ctx), void *ctx)
{
    fflush(NULL);
    double before = rss_now();
    pid_t pid = fork();
    ck_assert_msg(pid >= 0, "fork failed");
    if (pid == 0)
        _exit(fn(ctx) ? 0 : 1);
    int status = 0;
    struct rusage ru;
    ck_assert_msg(wait4(pid, &status, 0, &ru) == pid, "wait4 failed");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "the child's call failed (status %d)", status);
    return (double)ru.ru_maxrss * 1024.0 - before;
}

/* ------------------------------------------------ narrow key tails */

typedef struct {
    attn_sdpa_params p;
    bool backward;
} narrow_call;

/* q [1, 2, 1, d_k], k [1, 1, 1, d_k], v [1, 1, 1, 1]: two query heads
 * share the one key head, so the forward packs k once for both. */
static bool run_narrow(void *ctx)
{
    const narrow_call *nc = ctx;
    const attn_sdpa_params *p = &nc->p;
    const int64_t nq = p->heads_q * p->n_q * p->d_k, nk = p->n_k * p->d_k;
    const int64_t nv = p->n_k * p->d_v, no = p->heads_q * p->n_q * p->d_v;
    float *q = calloc((size_t)nq, sizeof *q), *k = calloc((size_t)nk, sizeof *k);
    float *v = calloc((size_t)nv, sizeof *v), *out = calloc((size_t)no, sizeof *out);
    float *dout = calloc((size_t)no, sizeof *dout);
    attn_softmax_row *rows = calloc((size_t)(p->heads_q * p->n_q), sizeof *rows);
    if (!q || !k || !v || !out || !dout || !rows)
        return false;
    for (int64_t i = 0; i < nq; i++)
        q[i] = 1e-3f;
    for (int64_t i = 0; i < nk; i++)
        k[i] = (float)(i % 7) * 1e-3f;
    for (int64_t i = 0; i < nv; i++)
        v[i] = 1.0f + (float)i;
    for (int64_t i = 0; i < no; i++)
        dout[i] = 1.0f;
    attn_error err = {0};
    if (attn_sdpa_forward(p, q, k, v, out, rows, NULL, NULL, &err) != ATTN_OK)
        return false;
    /* One key: every weight is 1, the output is v. */
    for (int64_t i = 0; i < no && p->n_k == 1; i++)
        if (out[i] != v[0])
            return false;
    bool ok = true;
    if (nc->backward) {
        float *dq = malloc((size_t)nq * sizeof *dq), *dk = malloc((size_t)nk * sizeof *dk);
        float *dv = malloc((size_t)nv * sizeof *dv);
        ok = dq && dk && dv &&
             attn_sdpa_backward(p, q, k, v, out, rows, dout, dq, dk, dv, &err) == ATTN_OK;
        /* One key: dv sums dout over the query rows, dq and dk are 0. */
        for (int64_t i = 0; ok && i < nv && p->n_k == 1; i++)
            ok = dv[i] == (float)(p->heads_q * p->n_q);
        for (int64_t i = 0; ok && i < nk && p->n_k == 1; i++)
            ok = dk[i] == 0.0f;
        free(dq);
        free(dk);
        free(dv);
    }
    free(q);
    free(k);
    free(v);
    free(out);
    free(dout);
    free(rows);
    return ok;
}

START_TEST(narrow_key_tail_with_huge_d_k_packs_no_more_than_its_keys)
{
    /* n_k = 1, d_k = 4e6: q 32 MB, k 16 MB. A panel padded to 64 keys
     * would be 1 GB (per worker in the backward); packed as wide as the
     * keys it is 16 MB. */
    narrow_call nc = {.p = sdpa_shape(1, 2, 1, 1, 1, 4000000, 1)};
    nc.p.threads = 2;
    double fwd = peak_growth(run_narrow, &nc);
    note("forward peak growth, MiB", fwd / MiB);
    ck_assert_msg(fwd < ALLOWED(200), "the forward grew by %.0f MiB (inputs 48 MiB)", fwd / MiB);
    nc.backward = true;
    double bwd = peak_growth(run_narrow, &nc);
    note("backward peak growth, MiB", bwd / MiB);
    ck_assert_msg(bwd < ALLOWED(500), "the backward grew by %.0f MiB (inputs and gradients "
                  "96 MiB)", bwd / MiB);
    /* Three keys (a tail narrower than a vector) over two query rows. */
    nc.p = sdpa_shape(1, 2, 1, 2, 3, 1000000, 1);
    nc.p.threads = 2;
    double three = peak_growth(run_narrow, &nc);
    ck_assert_msg(three < ALLOWED(300), "three keys: grew by %.0f MiB", three / MiB);
}
END_TEST

/* ------------------------------------------------------- head mean */

START_TEST(head_mean_of_weights_matches_reference_average_of_heads)
{
    /* Shapes across the query blocks (96 rows) and key tiles, with GQA,
     * causal and a boolean mask, on one thread and two. */
    const struct {
        int64_t b, hq, hkv, nq, nk, d;
        bool causal, mask;
        int threads;
    } cases[] = {
        {2, 6, 3, 200, 70, 5, true, false, 2},
        {1, 5, 5, 97, 130, 3, false, true, 2},
        {3, 4, 1, 9, 1, 2, false, false, 1},
        {1, 33, 11, 130, 129, 4, true, true, 1},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        attn_sdpa_params p = sdpa_shape(cases[ci].b, cases[ci].hq, cases[ci].hkv, cases[ci].nq,
                                        cases[ci].nk, cases[ci].d, cases[ci].d);
        p.causal = cases[ci].causal;
        p.threads = cases[ci].threads;
        sdpa_case c;
        case_init(&c, &p, 40 + ci, 2.0);
        if (cases[ci].mask) {
            int64_t shape[2] = {p.n_q, p.n_k};
            case_mask(&c, ATTN_MASK_BOOL, 2, shape, 41 + ci);
        }
        ref_fwd want;
        reference_forward(&c, &want, true);
        const int64_t plane = p.n_q * p.n_k;
        float *mean = nan_floats((size_t)(p.batch * plane));
        float *out = nan_floats(c.n_out);
        c.lib.weights_mean = true;
        attn_error err = {0};
        ASSERT_OK(attn_sdpa_forward(&c.lib, c.q, c.k, c.v, out, NULL, mean, NULL, &err), err);
        double worst = 0;
        int64_t at = 0;
        for (int64_t b = 0; b < p.batch; b++)
            for (int64_t e = 0; e < plane; e++) {
                double sum = 0;
                for (int64_t h = 0; h < p.heads_q; h++)
                    sum += want.weights[(b * p.heads_q + h) * plane + e];
                double d = fabs(mean[b * plane + e] - sum / (double)p.heads_q);
                if (!(d <= worst)) {
                    worst = d;
                    at = b * plane + e;
                }
            }
        ck_assert_msg(worst <= 1e-6, "case %zu: mean weight [%lld] off by %.3g", ci,
                      (long long)at, worst);
        ck_assert_msg(rel_err(out, want.out, c.n_out) <= TOL_FORWARD,
                      "case %zu: the output changed with the head mean", ci);
        free(mean);
        free(out);
        ref_fwd_free(&want);
        case_free(&c);
    }
}
END_TEST

typedef struct {
    int64_t heads, n;
} mean_call;

/* d = 1 self-attention of `heads` heads over n positions, head mean only. */
static bool run_mean(void *ctx)
{
    const mean_call *mc = ctx;
    attn_sdpa_params p = sdpa_shape(1, mc->heads, mc->heads, mc->n, mc->n, 1, 1);
    p.threads = 2;
    p.weights_mean = true;
    const int64_t count = mc->heads * mc->n;
    float *x = malloc((size_t)count * sizeof *x), *out = malloc((size_t)count * sizeof *out);
    float *mean = malloc((size_t)(mc->n * mc->n) * sizeof *mean);
    if (!x || !out || !mean)
        return false;
    for (int64_t i = 0; i < count; i++)
        x[i] = (float)(i % 13) * 0.1f;
    attn_error err = {0};
    bool ok = attn_sdpa_forward(&p, x, x, x, out, NULL, mean, NULL, &err) == ATTN_OK;
    /* Every row of the mean sums to 1. */
    for (int64_t i = 0; ok && i < mc->n; i++) {
        double s = 0;
        for (int64_t j = 0; j < mc->n; j++)
            s += mean[i * mc->n + j];
        ok = fabs(s - 1.0) < 1e-4;
    }
    free(x);
    free(out);
    free(mean);
    return ok;
}

START_TEST(head_mean_of_many_heads_never_holds_every_heads_weights)
{
    /* 512 heads over 512 positions: every head's weights would be 512 MiB;
     * the mean is 1 MiB, a block of rows per worker a few hundred KiB. */
    mean_call mc = {.heads = 512, .n = 512};
    double grew = peak_growth(run_mean, &mc);
    note("head mean peak growth, MiB", grew / MiB);
    ck_assert_msg(grew < ALLOWED(48), "the head mean grew by %.0f MiB", grew / MiB);
}
END_TEST

/* ------------------------------------------- the estimate is a bound */


typedef struct {
    attn_sdpa_params p;
    bool weights, stats, backward;
    double caller; /* bytes of the caller's tensors, set by the child */
} bound_call;

static float *filled(int64_t n, float x)
{
    float *a = malloc((size_t)(n > 0 ? n : 1) * sizeof *a);
    for (int64_t i = 0; a && i < n; i++)
        a[i] = x * (float)(1 + i % 5);
    return a;
}

static bool run_bound(void *ctx)
{
    bound_call *bc = ctx;
    const attn_sdpa_params *p = &bc->p;
    const int64_t B = p->batch, nq = B * p->heads_q * p->n_q, nk = B * p->heads_kv * p->n_k;
    const int64_t w_count = B * (p->weights_mean ? 1 : p->heads_q) * p->n_q * p->n_k;
    float *q = filled(nq * p->d_k, 1e-2f), *k = filled(nk * p->d_k, 2e-2f);
    float *v = filled(nk * p->d_v, 1.0f), *out = filled(nq * p->d_v, 0);
    float *dout = filled(nq * p->d_v, 1.0f);
    float *w = bc->weights ? filled(w_count, 0) : NULL;
    attn_softmax_row *rows = calloc((size_t)nq, sizeof *rows);
    float *dq = bc->backward ? filled(nq * p->d_k, 0) : NULL;
    float *dk = bc->backward ? filled(nk * p->d_k, 0) : NULL;
    float *dv = bc->backward ? filled(nk * p->d_v, 0) : NULL;
    attn_stats st;
    attn_error err = {0};
    bool ok = attn_sdpa_forward(p, q, k, v, out, rows, w, bc->stats ? &st : NULL, &err) ==
              ATTN_OK;
    if (ok && bc->backward)
        ok = attn_sdpa_backward(p, q, k, v, out, rows, dout, dq, dk, dv, &err) == ATTN_OK;
    return ok;
}

START_TEST(workspace_estimate_bounds_what_the_calls_hold)
{
    bound_call cases[] = {
        {.p = sdpa_shape(1, 2, 1, 1, 1, 4000000, 1), .backward = true},
        {.p = sdpa_shape(2, 4, 2, 700, 900, 64, 32), .weights = true, .stats = true,
         .backward = true},
        {.p = sdpa_shape(1, 8, 8, 300, 300, 16, 16), .weights = true},
        {.p = sdpa_shape(1, 2, 2, 2000, 3000, 32, 32), .backward = true},
        {.p = sdpa_shape(1, 1, 1, 5, 100000, 64, 64), .backward = true},
        /* Ragged batches: one long sequence among short ones (split in the
         * backward), causal, with RoPE's table, the weights and statistics;
         * and the head mean of the weights. */
        {.p = sdpa_shape(1, 4, 2, 3000, 3000, 64, 32), .weights = true, .stats = true,
         .backward = true},
        {.p = sdpa_shape(1, 16, 4, 3000, 3000, 32, 32), .weights = true, .stats = true},
    };
    cases[2].p.weights_mean = true;
    cases[3].p.variants.rope_base = 10000.0f;
    static const int64_t cu[] = {0, 5, 2500, 2503, 2990, 3000};
    cases[5].p.ragged = (attn_ragged){.seqs = 5, .cu_seqlens_q = cu};
    cases[5].p.causal = true;
    cases[5].p.variants.rope_base = 10000.0f;
    cases[6].p.ragged = cases[5].p.ragged; /* and the head mean, sequence by sequence */
    cases[6].p.weights_mean = true;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bound_call *bc = &cases[i];
        attn_sdpa_params *p = &bc->p;
        p->threads = 2;
        const double B = (double)p->batch, nq = B * p->heads_q * p->n_q;
        const double nk = B * p->heads_kv * p->n_k;
        double caller = 4 * (nq * p->d_k * 2 + nk * p->d_k * 2 + nk * p->d_v * 2 +
                             nq * p->d_v * 2) + 8 * nq;
        if (bc->weights)
            caller += 4 * B * (p->weights_mean ? 1 : p->heads_q) * (double)p->n_q * p->n_k;
        double estimate = attn_sdpa_workspace(p, bc->weights, bc->stats, bc->backward);
        double grew = peak_growth(run_bound, bc);
        /* Pages of the allocator, thread stacks: a few MiB beyond. */
        double bound = SANITIZED ? 3 * (caller + estimate) + 128 * MiB
                                 : caller + estimate + 16 * MiB;
        ck_assert_msg(grew <= bound,
                      "case %zu: grew by %.1f MiB, beyond the caller's %.1f MiB and the "
                      "estimated %.1f MiB",
                      i, grew / MiB, caller / MiB, estimate / MiB);
        /* And not wildly above: an estimate that says 10x is no budget. */
        ck_assert_msg(SANITIZED || estimate <= 4 * (grew > caller ? grew - caller : 0) + 32 * MiB,
                      "case %zu: estimated %.1f MiB, used %.1f MiB", i, estimate / MiB,
                      (grew - caller) / MiB);
    }
}
END_TEST

/* ------------------------------------------------ attention over a cache */

typedef struct {
    const attn_kv_cache *cache;
    attn_kv_params p;
} kv_call_ctx;

static bool run_kv(void *ctx)
{
    const kv_call_ctx *kc = ctx;
    attn_kv_info info;
    attn_kv_info_get(kc->cache, &info);
    const int64_t rows = kc->p.heads_q * kc->p.n_q;
    float *q = filled(rows * info.config.head_dim, 1e-2f);
    float *out = filled(rows * info.config.value_dim, 0);
    attn_error err = {0};
    bool ok = q && out && attn_kv_forward(kc->cache, &kc->p, q, out, NULL, &err) == ATTN_OK;
    free(q);
    free(out);
    return ok;
}

/* attn_kv_forward_workspace bounds what the call holds beyond its q and
 * out, and not wildly: decoding in many runs (their partial outputs),
 * prefilling 16-bit pages (each worker's widened page), and bfloat16
 * products (each worker's page panel and rows: no copy of the cache, whose
 * float32 read-out would be 32 MiB here, beyond the bound). The cache is
 * made before the child starts, so only the call's memory is measured. */
START_TEST(kv_workspace_estimate_bounds_what_the_calls_hold)
{
    const struct {
        attn_kv_dtype dtype;
        int64_t heads_kv, d_k, d_v, length, heads_q, n_q;
        attn_precision precision;
    } cases[] = {
        {ATTN_KV_FLOAT32, 2, 8, 512, 16384, 128, 1, ATTN_PRECISION_FLOAT32},
        {ATTN_KV_FLOAT16, 2, 64, 64, 8192, 4, 300, ATTN_PRECISION_FLOAT32},
        {ATTN_KV_BFLOAT16, 4, 64, 64, 16384, 16, 1, ATTN_PRECISION_BFLOAT16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const attn_kv_config cfg = {.num_kv_heads = cases[i].heads_kv,
                                    .head_dim = cases[i].d_k, .value_dim = cases[i].d_v,
                                    .dtype = cases[i].dtype};
        attn_kv_cache *cache = NULL;
        attn_error err = {0};
        ck_assert_int_eq(attn_kv_create(&cfg, &cache, &err), ATTN_OK);
        const int64_t chunk = 1024;
        float *k = filled(cfg.num_kv_heads * chunk * cfg.head_dim, 2e-2f);
        float *v = filled(cfg.num_kv_heads * chunk * cfg.value_dim, 1.0f);
        for (int64_t at = 0; at < cases[i].length; at += chunk)
            ck_assert_int_eq(attn_kv_append(cache, chunk, k, v, 0.0f, &err), ATTN_OK);
        free(k);
        free(v);
        kv_call_ctx kc = {.cache = cache,
                          .p = {.heads_q = cases[i].heads_q, .n_q = cases[i].n_q,
                                .scale = attn_default_scale(cfg.head_dim), .causal = true,
                                .threads = 2, .precision = cases[i].precision}};
        const double rows = (double)(cases[i].heads_q * cases[i].n_q);
        const double caller = 4 * rows * (double)(cfg.head_dim + cfg.value_dim) * 2;
        double estimate = attn_kv_forward_workspace(&cfg, cases[i].length, &kc.p);
        double grew = peak_growth(run_kv, &kc);
        attn_kv_free(cache);
        double bound = SANITIZED ? 3 * (caller + estimate) + 128 * MiB
                                 : caller + estimate + 16 * MiB;
        ck_assert_msg(grew <= bound,
                      "case %zu: grew by %.1f MiB, beyond the caller's %.1f MiB and the "
                      "estimated %.1f MiB",
                      i, grew / MiB, caller / MiB, estimate / MiB);
        ck_assert_msg(SANITIZED || estimate <= 4 * (grew > caller ? grew - caller : 0) + 32 * MiB,
                      "case %zu: estimated %.1f MiB, used %.1f MiB", i, estimate / MiB,
                      (grew - caller) / MiB);
        /* The terms that are certain: the runs' partial outputs when
         * decoding (16 runs of [H_q, value_dim] floats here); with bfloat16
         * products, nothing that grows with the cached length: far below
         * a float32 copy of the cache. */
        if (i == 0)
            ck_assert(estimate >= 16 * rows * (double)cfg.value_dim * 4);
        if (i == 2)
            ck_assert(estimate < 4.0 * (double)(cfg.num_kv_heads * cases[i].length) *
                                     (double)(cfg.head_dim + cfg.value_dim) / 16);
    }
}
END_TEST

static Suite *memory_suite(void)
{
    Suite *s = suite_create("memory");
    TCase *tc = tcase_create("lib");
    tcase_set_tags(tc, "kernel");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, narrow_key_tail_with_huge_d_k_packs_no_more_than_its_keys);
    tcase_add_test(tc, head_mean_of_weights_matches_reference_average_of_heads);
    tcase_add_test(tc, head_mean_of_many_heads_never_holds_every_heads_weights);
    tcase_add_test(tc, workspace_estimate_bounds_what_the_calls_hold);
    tcase_add_test(tc, kv_workspace_estimate_bounds_what_the_calls_hold);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(memory_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
