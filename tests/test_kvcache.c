/*
 * KV caches (attn_kv_*): paged storage and attention over it.
 *
 * The attention is held to attn_sdpa_forward over the same keys and values
 * laid out flat, [H_kv, length, d]: the cache's keys as stored, which this
 * file rounds to float16 / bfloat16 itself (round to nearest even, computed
 * in double from the definition, not by the library's code), and checks
 * attn_kv_read against. Where the cache does the forward's operations in
 * the forward's order (the prefill route always; the decode route while
 * the visible keys are one run, up to 16 pages), the result must be the
 * same bits. Where the decode route splits the keys into runs, it must be
 * within the bound below. A double-precision reference (tests/support/ref.c)
 * checks a few cases on its own.
 *
 * The bound for split runs. Decode and forward compute each output as
 * sum_j w_j v_j / sum_j w_j from the same float scores. Each accumulates
 * the weighted values with one multiply-add a key (in its own order) and
 * rescales its running sum at most once a tile, and its weights carry the
 * exponential's error (2 ulp) and that of x - m; the decode merges its runs
 * in double and rounds once. A recursive float sum of n terms is within
 * n u of the exact one, relative to the sum of the terms' magnitudes
 * (u = 2^-24), and the weighted terms' magnitudes sum to at most max|v|
 * times the sum of the weights. So each is within
 * (n_k + 2 * tiles + 8) u max|v| of the exact output, and
 *   |decode - forward| <= 2 (n_k + 2 ceil(n_k / 64) + 8) 2^-24 max|v|.
 * That is a worst case, loose by design; the double reference checks the
 * same cases at TOL_FORWARD (2e-5 of the largest output), where a key left
 * out or counted twice shows at once.
 *
 * The suite runs once per kernel (tests/run-suites.sh sets ATTN_KERNEL).
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn.h"
#include "support/ref.h"
#include "support/sdpa_case.h"

static const attn_kv_dtype DTYPES[] = {ATTN_KV_FLOAT32, ATTN_KV_FLOAT16, ATTN_KV_BFLOAT16};

/* ------------------------------------------------------------ rounding */

/* x rounded to nearest even at `mant` bits after the point, for numbers
 * whose exponent is at least `emin` (below it, the spacing of emin: the
 * subnormals). In double, from the definition. */
static float round_to(float x, int mant, int emin)
{
    double a = fabs((double)x);
    if (a == 0.0)
        return x;
    int e;
    frexp(a, &e); /* a in [2^(e-1), 2^e) */
    int exp2 = e - 1 < emin ? emin : e - 1;
    double spacing = ldexp(1.0, exp2 - mant);
    /* a / spacing is exact (a power of two), nearbyint rounds to even. */
    return (float)copysign(nearbyint(a / spacing) * spacing, (double)x);
}

static float rounded(attn_kv_dtype dtype, float x)
{
    switch (dtype) {
    case ATTN_KV_FLOAT16:
        return round_to(x, 10, -14);
    case ATTN_KV_BFLOAT16:
        return round_to(x, 7, -126);
    case ATTN_KV_FLOAT32:
        break;
    }
    return x;
}

/* ------------------------------------------------------------- a case */

typedef struct {
    int64_t heads_kv, d_k, d_v;
    attn_kv_dtype dtype;
    int64_t heads_q, n_q, length;
    bool causal;
    attn_variants var; /* alibi_slopes: filled in by case_make when `alibi` */
    bool alibi;
    float scale; /* 0: 1/sqrt(d_k) */
    int threads;
    uint64_t seed;
    double q_amp; /* 0: 1 */
} kv_problem;

typedef struct {
    kv_problem pb;
    float *q, *k, *v;    /* as given: q [H_q, n_q, d_k], k, v [H_kv, length, d] */
    float *ks, *vs;      /* as stored, rounded here (not rotated) */
    float *slopes;       /* [H_q] with alibi */
    attn_kv_cache *cache;
    attn_kv_params kp;
    attn_sdpa_params sp; /* the forward over ks, vs */
} kv_case;

static attn_kv_config config_of(const kv_problem *pb)
{
    return (attn_kv_config){.num_kv_heads = pb->heads_kv, .head_dim = pb->d_k,
                            .value_dim = pb->d_v, .dtype = pb->dtype};
}

/* Appends positions [from, to) of k and v ([H_kv, length, d]). */
static void append_range(attn_kv_cache *cache, const kv_problem *pb, const float *k,
                         const float *v, int64_t from, int64_t to)
{
    const int64_t n = to - from;
    float *kp = xcalloc((size_t)(pb->heads_kv * n * pb->d_k), sizeof *kp);
    float *vp = xcalloc((size_t)(pb->heads_kv * n * pb->d_v), sizeof *vp);
    for (int64_t g = 0; g < pb->heads_kv; g++) {
        memcpy(kp + g * n * pb->d_k, k + (g * pb->length + from) * pb->d_k,
               (size_t)(n * pb->d_k) * sizeof *kp);
        memcpy(vp + g * n * pb->d_v, v + (g * pb->length + from) * pb->d_v,
               (size_t)(n * pb->d_v) * sizeof *vp);
    }
    attn_error err = {0};
    ASSERT_OK(attn_kv_append(cache, n, kp, vp, pb->var.rope_base, &err), err);
    free(kp);
    free(vp);
}

/* Random inputs, the cache filled in `pieces` appends of varied sizes. */
static void case_make(kv_case *c, const kv_problem *pb, int pieces)
{
    memset(c, 0, sizeof *c);
    c->pb = *pb;
    const size_t nq = (size_t)(pb->heads_q * pb->n_q * pb->d_k);
    const size_t nk = (size_t)(pb->heads_kv * pb->length * pb->d_k);
    const size_t nv = (size_t)(pb->heads_kv * pb->length * pb->d_v);
    uint64_t seed = pb->seed * 7919u + 3u;
    c->q = xcalloc(nq, sizeof *c->q);
    c->k = xcalloc(nk, sizeof *c->k);
    c->v = xcalloc(nv, sizeof *c->v);
    fill(c->q, nq, &seed, pb->q_amp > 0.0 ? pb->q_amp : 1.0);
    fill(c->k, nk, &seed, 1.0);
    fill(c->v, nv, &seed, 1.0);
    c->ks = xcalloc(nk, sizeof *c->ks);
    c->vs = xcalloc(nv, sizeof *c->vs);
    for (size_t i = 0; i < nk; i++)
        c->ks[i] = rounded(pb->dtype, c->k[i]);
    for (size_t i = 0; i < nv; i++)
        c->vs[i] = rounded(pb->dtype, c->v[i]);
    attn_variants var = pb->var;
    if (pb->alibi) {
        c->slopes = xcalloc((size_t)pb->heads_q, sizeof *c->slopes);
        for (int64_t h = 0; h < pb->heads_q; h++)
            c->slopes[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)pb->heads_q);
        var.alibi_slopes = c->slopes;
    }
    const attn_kv_config cfg = config_of(pb);
    attn_error err = {0};
    ASSERT_OK(attn_kv_create(&cfg, &c->cache, &err), err);
    /* Pieces of uneven sizes: 1, then growing, the rest last. */
    int64_t at = 0;
    for (int i = 0; i < pieces - 1 && at < pb->length; i++) {
        int64_t n = i == 0 ? 1 : (int64_t)(i * 37 % 91 + 1);
        n = n < pb->length - at ? n : pb->length - at;
        append_range(c->cache, pb, c->k, c->v, at, at + n);
        at += n;
    }
    if (at < pb->length)
        append_range(c->cache, pb, c->k, c->v, at, pb->length);
    const float scale = pb->scale > 0.0f ? pb->scale : attn_default_scale(pb->d_k);
    c->kp = (attn_kv_params){.heads_q = pb->heads_q, .n_q = pb->n_q, .scale = scale,
                             .causal = pb->causal, .variants = var,
                             .threads = pb->threads > 0 ? pb->threads : 1};
    c->sp = sdpa_shape(1, pb->heads_q, pb->heads_kv, pb->n_q, pb->length, pb->d_k, pb->d_v);
    c->sp.scale = scale;
    c->sp.causal = pb->causal;
    c->sp.variants = var;
    c->sp.threads = c->kp.threads;
}

static void case_drop(kv_case *c)
{
    attn_kv_free(c->cache);
    free(c->q), free(c->k), free(c->v), free(c->ks), free(c->vs), free(c->slopes);
}

/* What one attention call returned. */
typedef struct {
    float *out;
    attn_softmax_row *rows;
} result;

static size_t out_count(const kv_case *c)
{
    return (size_t)(c->pb.heads_q * c->pb.n_q * c->pb.d_v);
}

static size_t row_count(const kv_case *c)
{
    return (size_t)(c->pb.heads_q * c->pb.n_q);
}

static result run_cache(const kv_case *c, const attn_kv_params *kp)
{
    result r = {nan_floats(out_count(c)), xcalloc(row_count(c), sizeof *r.rows)};
    attn_error err = {0};
    ASSERT_OK(attn_kv_forward(c->cache, kp, c->q, r.out, r.rows, &err), err);
    return r;
}

/* attn_sdpa_forward over the stored keys and values (k and v as given
 * for float32, where it also applies rope the same way). */
static result run_forward(const kv_case *c)
{
    result r = {nan_floats(out_count(c)), xcalloc(row_count(c), sizeof *r.rows)};
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&c->sp, c->q, c->ks, c->vs, r.out, r.rows, NULL, NULL, &err),
              err);
    return r;
}

static void result_free(result *r)
{
    free(r->out);
    free(r->rows);
}

/* The first element whose bits differ, or -1. */
static int64_t first_difference(const void *a, const void *b, size_t n, size_t size)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * size, (const char *)b + i * size, size) != 0)
            return (int64_t)i;
    return -1;
}

static void assert_same_bits(const kv_case *c, const result *got, const result *want,
                             const char *label)
{
    int64_t at = first_difference(got->out, want->out, out_count(c), sizeof(float));
    ck_assert_msg(at < 0, "%s: out[%lld] = %.9g, the forward's %.9g", label, (long long)at,
                  at < 0 ? 0.0 : (double)got->out[at], at < 0 ? 0.0 : (double)want->out[at]);
    at = first_difference(got->rows, want->rows, row_count(c), sizeof(attn_softmax_row));
    ck_assert_msg(at < 0, "%s: row %lld's softmax (%.9g, %.9g), the forward's (%.9g, %.9g)",
                  label, (long long)at, at < 0 ? 0.0 : (double)got->rows[at].max,
                  at < 0 ? 0.0 : (double)got->rows[at].sum,
                  at < 0 ? 0.0 : (double)want->rows[at].max,
                  at < 0 ? 0.0 : (double)want->rows[at].sum);
}

/* The bound of the file's comment, over max |v| stored. */
static double split_bound(const kv_case *c)
{
    const double n = (double)c->pb.length;
    return 2.0 * (n + 2.0 * ceil(n / 64.0) + 8.0) * 0x1p-24;
}

static double max_abs(const float *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fabs((double)x[i]) > m ? fabs((double)x[i]) : m;
    return m;
}

static void assert_within_bound(const kv_case *c, const result *got, const result *want,
                                const char *label)
{
    const double vmax = max_abs(c->vs, (size_t)(c->pb.heads_kv * c->pb.length * c->pb.d_v));
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < out_count(c); i++) {
        double d = fabs((double)got->out[i] - (double)want->out[i]);
        if (!(d <= worst)) { /* NaN counts as the worst */
            worst = isnan(d) ? INFINITY : d;
            at = i;
        }
    }
    note(label, worst / vmax);
    ck_assert_msg(worst <= split_bound(c) * vmax,
                  "%s: out[%zu] = %.9g, the forward's %.9g: %.3g of max|v|, bound %.3g", label,
                  at, (double)got->out[at], (double)want->out[at], worst / vmax,
                  split_bound(c));
    for (size_t r = 0; r < row_count(c); r++) {
        double a = attn_softmax_lse(got->rows[r]), b = attn_softmax_lse(want->rows[r]);
        ck_assert_msg((a == -INFINITY) == (b == -INFINITY) &&
                          (a == -INFINITY || fabs(a - b) <= 1e-5 * (1.0 + fabs(b))),
                      "%s: row %zu's lse %.9g, the forward's %.9g", label, r, a, b);
    }
}

/* Is the cache's answer the forward's to the bit, for this case? The
 * prefill route, and a decode whose visible keys are one run. */
static bool expect_same_bits(const kv_case *c)
{
    const kv_problem *pb = &c->pb;
    if (pb->heads_q / pb->heads_kv * pb->n_q > ATTN_KV_DECODE_ROWS)
        return true;
    /* The keys rows 0 .. n_q - 1 can see, at positions length - n_q + i. */
    int64_t first = 0, last = pb->length - 1;
    if (pb->var.window && pb->var.window_left >= 0)
        first = pb->length - pb->n_q - pb->var.window_left;
    first = first < 0 ? 0 : first;
    return last / 64 - first / 64 + 1 <= 16;
}

/* The cache against the forward: same bits where expected, else within
 * the bound. */
static void check_against_forward(const kv_case *c, const char *label)
{
    result got = run_cache(c, &c->kp), want = run_forward(c);
    if (expect_same_bits(c))
        assert_same_bits(c, &got, &want, label);
    else
        assert_within_bound(c, &got, &want, label);
    result_free(&got);
    result_free(&want);
}

/* The cache against the double reference over the stored values; for
 * keys rotated before they were rounded, the reference is given the
 * stored keys turned back (in double), which it turns forward again. */
static void check_against_reference(const kv_case *c, const char *label)
{
    const kv_problem *pb = &c->pb;
    const size_t nk = (size_t)(pb->heads_kv * pb->length * pb->d_k);
    double *kd = to_double(c->ks, nk);
    if (pb->var.rope_base > 0.0f && pb->dtype != ATTN_KV_FLOAT32) {
        float *stored = xcalloc(nk, sizeof *stored);
        attn_error err = {0};
        ASSERT_OK(attn_kv_read(c->cache, 0, pb->length, stored, NULL, &err), err);
        const int64_t half = pb->d_k / 2;
        for (int64_t g = 0; g < pb->heads_kv; g++)
            for (int64_t j = 0; j < pb->length; j++)
                for (int64_t t = 0; t < half; t++) {
                    const size_t at = (size_t)((g * pb->length + j) * pb->d_k + t);
                    double angle = (double)j * pow((double)pb->var.rope_base,
                                                   -2.0 * (double)t / (double)pb->d_k);
                    double a = stored[at], b = stored[at + (size_t)half];
                    kd[at] = a * cos(angle) + b * sin(angle);
                    kd[at + (size_t)half] = b * cos(angle) - a * sin(angle);
                }
        free(stored);
    }
    double *qd = to_double(c->q, (size_t)(pb->heads_q * pb->n_q * pb->d_k));
    double *vd = to_double(c->vs, (size_t)(pb->heads_kv * pb->length * pb->d_v));
    double *out = xcalloc(out_count(c), sizeof *out), *lse = xcalloc(row_count(c), sizeof *lse);
    ref_sdpa_forward(&c->sp, qd, kd, vd, out, lse, NULL);
    result got = run_cache(c, &c->kp);
    double *got_lse = xcalloc(row_count(c), sizeof *got_lse);
    for (size_t r = 0; r < row_count(c); r++)
        got_lse[r] = attn_softmax_lse(got.rows[r]);
    char what[160];
    snprintf(what, sizeof what, "%s: output against the double reference", label);
    ASSERT_ERR(rel_err(got.out, out, out_count(c)), TOL_FORWARD, what);
    snprintf(what, sizeof what, "%s: lse against the double reference", label);
    ASSERT_ERR(lse_err(got_lse, lse, row_count(c)), 1e-5, what);
    result_free(&got);
    free(kd), free(qd), free(vd), free(out), free(lse), free(got_lse);
}

static const char *dtype_name(attn_kv_dtype d)
{
    return attn_kv_dtype_name(d);
}

/* A problem with the usual defaults: causal decode, one query row. */
static kv_problem problem(int64_t heads_q, int64_t heads_kv, int64_t length, attn_kv_dtype dt)
{
    return (kv_problem){.heads_kv = heads_kv, .d_k = 24, .d_v = 20, .dtype = dt,
                        .heads_q = heads_q, .n_q = 1, .length = length, .causal = true,
                        .threads = 2, .seed = (uint64_t)(heads_q * 131 + length), .q_amp = 3.0};
}

/* ------------------------------------------------------ attention: cases */

START_TEST(decode_is_the_forward_bit_for_bit_at_page_boundaries)
{
    const int64_t lengths[] = {1, 63, 64, 65, 127, 128, 200, 1024};
    for (size_t d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++) {
            kv_problem pb = problem(8, 2, lengths[i], DTYPES[d]);
            pb.threads = 1 + (int)(i % 4);
            kv_case c;
            case_make(&c, &pb, 3);
            char label[96];
            snprintf(label, sizeof label, "%s length %lld", dtype_name(DTYPES[d]),
                     (long long)lengths[i]);
            ck_assert(expect_same_bits(&c));
            check_against_forward(&c, label);
            case_drop(&c);
        }
}
END_TEST

START_TEST(long_decode_merges_runs_within_the_bound)
{
    const int64_t lengths[] = {1025, 1100, 4157, 20000};
    for (size_t d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++) {
            kv_problem pb = problem(4, 2, lengths[i], DTYPES[d]);
            pb.d_k = 16;
            pb.d_v = 17;
            pb.threads = 1 + (int)((i + d) % 4);
            kv_case c;
            case_make(&c, &pb, 2);
            char label[96];
            snprintf(label, sizeof label, "%s length %lld (runs)", dtype_name(DTYPES[d]),
                     (long long)lengths[i]);
            ck_assert(!expect_same_bits(&c));
            check_against_forward(&c, label);
            check_against_reference(&c, label);
            case_drop(&c);
        }
}
END_TEST

START_TEST(gqa_ratios_one_to_eight_read_their_key_value_head)
{
    const int64_t ratios[] = {1, 2, 4, 8};
    const int64_t lengths[] = {130, 1500};
    for (size_t r = 0; r < 4; r++)
        for (size_t l = 0; l < 2; l++)
            for (int64_t n_q = 1; n_q <= 3; n_q += 2) {
                kv_problem pb = problem(3 * ratios[r], 3, lengths[l], DTYPES[(r + l) % 3]);
                pb.n_q = n_q;
                pb.threads = 1 + (int)r;
                kv_case c;
                case_make(&c, &pb, 2);
                char label[96];
                snprintf(label, sizeof label, "gqa %lld:3 n_q %lld length %lld %s",
                         (long long)pb.heads_q, (long long)n_q, (long long)pb.length,
                         dtype_name(pb.dtype));
                check_against_forward(&c, label);
                if (l == 0)
                    check_against_reference(&c, label);
                case_drop(&c);
            }
}
END_TEST

/* Each variant alone and all at once, over one run and over several. */
START_TEST(every_variant_matches_the_forward)
{
    struct {
        const char *name;
        attn_variants var;
        bool alibi;
        float scale;
    } variants[] = {
        {"window [40, -1]", {.window = true, .window_left = 40, .window_right = -1}, false, 0},
        {"window [100, 0]", {.window = true, .window_left = 100, .window_right = 0}, false, 0},
        {"window [-1, 3]", {.window = true, .window_left = -1, .window_right = 3}, false, 0},
        {"alibi", {0}, true, 0},
        {"softcap 2", {.softcap = 2.0f}, false, 0},
        {"scale 0.7", {0}, false, 0.7f},
        {"rope 10000", {.rope_base = 10000.0f}, false, 0},
        {"rope 500", {.rope_base = 500.0f}, false, 0},
        {"all", {.window = true, .window_left = 300, .window_right = 2, .softcap = 5.0f,
                 .rope_base = 1000.0f}, true, 0.3f},
    };
    const int64_t lengths[] = {190, 2300};
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++)
        for (size_t l = 0; l < 2; l++)
            for (size_t d = 0; d < 3; d++) {
                kv_problem pb = problem(4, 2, lengths[l], DTYPES[d]);
                pb.n_q = 1 + (int64_t)(2 * l + d) % 4;
                pb.causal = (i + d) % 2 == 0;
                pb.var = variants[i].var;
                pb.alibi = variants[i].alibi;
                pb.scale = variants[i].scale;
                pb.threads = 1 + (int)((i + l + d) % 4);
                kv_case c;
                case_make(&c, &pb, 2);
                char label[128];
                snprintf(label, sizeof label, "%s, %s, length %lld, n_q %lld%s",
                         variants[i].name, dtype_name(pb.dtype), (long long)pb.length,
                         (long long)pb.n_q, pb.causal ? ", causal" : "");
                /* Keys rotated and then rounded are not the forward's
                 * rounded keys rotated: those go to the reference only. */
                if (pb.var.rope_base == 0.0f || pb.dtype == ATTN_KV_FLOAT32)
                    check_against_forward(&c, label);
                if (l == 0 || pb.var.rope_base > 0.0f)
                    check_against_reference(&c, label);
                case_drop(&c);
            }
}
END_TEST

START_TEST(causal_on_and_off_with_several_query_rows)
{
    for (int causal = 0; causal < 2; causal++)
        for (int64_t n_q = 1; n_q <= 8; n_q++)
            for (size_t d = 0; d < 3; d++) {
                kv_problem pb = problem(6, 3, 70 + 41 * n_q, DTYPES[d]);
                pb.n_q = n_q;
                pb.causal = causal;
                pb.threads = 1 + (int)((n_q + d) % 4);
                kv_case c;
                case_make(&c, &pb, 4);
                char label[96];
                snprintf(label, sizeof label, "%s n_q %lld %s", causal ? "causal" : "full",
                         (long long)n_q, dtype_name(pb.dtype));
                check_against_forward(&c, label);
                if (n_q % 3 == 0)
                    check_against_reference(&c, label);
                case_drop(&c);
            }
}
END_TEST

/* Many rows a group: the tiled forward's kernel over the pages. */
START_TEST(prefill_rows_are_the_forward_bit_for_bit)
{
    const struct { int64_t heads_q, heads_kv, n_q, length; } shapes[] = {
        {2, 2, 65, 65}, {2, 1, 100, 250}, {4, 2, 200, 200}, {2, 2, 97, 1300},
        /* More than SDPA_FOLD_TILES pages a row: the output folded into
         * double as the forward folds it. */
        {2, 1, 70, 1100}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (size_t d = 0; d < 3; d++)
            for (int causal = 0; causal < 2; causal++) {
                kv_problem pb = problem(shapes[s].heads_q, shapes[s].heads_kv,
                                        shapes[s].length, DTYPES[d]);
                pb.n_q = shapes[s].n_q;
                pb.causal = causal;
                pb.threads = 1 + (int)((s + d) % 4);
                if (s == 3)
                    pb.var = (attn_variants){.window = true, .window_left = 30,
                                             .window_right = 10, .softcap = 3.0f};
                kv_case c;
                case_make(&c, &pb, 3);
                ck_assert(pb.heads_q / pb.heads_kv * pb.n_q > ATTN_KV_DECODE_ROWS);
                char label[96];
                snprintf(label, sizeof label, "prefill %lldx%lld %s%s", (long long)pb.n_q,
                         (long long)pb.length, dtype_name(pb.dtype), causal ? " causal" : "");
                check_against_forward(&c, label);
                if (s == 0)
                    check_against_reference(&c, label);
                case_drop(&c);
            }
}
END_TEST

/* The runs depend on the length, not on the threads: the same bits for
 * 1 to 4 threads, one run or many. */
START_TEST(thread_counts_one_to_four_give_the_same_bits)
{
    const int64_t lengths[] = {300, 5000};
    for (size_t l = 0; l < 2; l++)
        for (size_t d = 0; d < 3; d++) {
            kv_problem pb = problem(8, 2, lengths[l], DTYPES[d]);
            pb.n_q = 2;
            kv_case c;
            case_make(&c, &pb, 2);
            c.kp.threads = 1;
            result one = run_cache(&c, &c.kp);
            for (int t = 2; t <= 4; t++) {
                c.kp.threads = t;
                result got = run_cache(&c, &c.kp);
                char label[96];
                snprintf(label, sizeof label, "%d threads against 1, length %lld, %s", t,
                         (long long)pb.length, dtype_name(pb.dtype));
                assert_same_bits(&c, &got, &one, label);
                result_free(&got);
            }
            result_free(&one);
            case_drop(&c);
        }
}
END_TEST

/* Rows that see no key: zeros and a softmax row {-inf, 0}, never NaN. */
START_TEST(rows_that_see_nothing_are_zero)
{
    for (size_t d = 0; d < 3; d++) {
        /* Causal, more queries than positions: the first rows sit before
         * position 0. Not causal, a window of [0, 0]: the same rows again. */
        for (int causal = 0; causal < 2; causal++) {
            kv_problem pb = problem(4, 2, 3, DTYPES[d]);
            pb.n_q = 7;
            pb.causal = causal;
            if (!causal)
                pb.var = (attn_variants){.window = true, .window_left = 0, .window_right = 0};
            kv_case c;
            case_make(&c, &pb, 1);
            result got = run_cache(&c, &c.kp);
            for (int64_t h = 0; h < pb.heads_q; h++)
                for (int64_t i = 0; i < pb.n_q; i++) {
                    const attn_softmax_row sm = got.rows[h * pb.n_q + i];
                    const float *o = got.out + (h * pb.n_q + i) * pb.d_v;
                    if (i < pb.n_q - pb.length) {
                        ck_assert_msg(sm.max == -INFINITY && sm.sum == 0.0f,
                                      "row %lld: (%g, %g)", (long long)i, (double)sm.max,
                                      (double)sm.sum);
                        ck_assert(max_abs(o, (size_t)pb.d_v) == 0.0);
                    } else {
                        ck_assert(sm.sum > 0.0f);
                    }
                }
            result_free(&got);
            check_against_forward(&c, causal ? "masked rows, causal" : "masked rows, window");
            case_drop(&c);
        }
        /* An empty cache: every row sees nothing. */
        attn_kv_config cfg = {.num_kv_heads = 2, .head_dim = 8, .value_dim = 3, .dtype = DTYPES[d]};
        attn_kv_cache *cache;
        attn_error err = {0};
        ASSERT_OK(attn_kv_create(&cfg, &cache, &err), err);
        float q[4 * 2 * 8] = {1}, *out = nan_floats(4 * 2 * 3);
        attn_softmax_row rows[8];
        attn_kv_params kp = {.heads_q = 4, .n_q = 2, .scale = 1.0f, .causal = true,
                             .threads = 2};
        ASSERT_OK(attn_kv_forward(cache, &kp, q, out, rows, &err), err);
        ck_assert(max_abs(out, 4 * 2 * 3) == 0.0);
        for (int r = 0; r < 8; r++)
            ck_assert(rows[r].max == -INFINITY && rows[r].sum == 0.0f);
        free(out);
        attn_kv_free(cache);
    }
}
END_TEST

/* v near float32's largest: the weighted sum overflows on the way and the
 * row is redone in double, as the forward does; scores past float32 too. */
START_TEST(overflowing_rows_are_redone_in_double)
{
    for (int which = 0; which < 2; which++) {
        kv_problem pb = problem(2, 1, 1500, ATTN_KV_FLOAT32);
        pb.n_q = 2;
        kv_case c;
        case_make(&c, &pb, 1);
        attn_kv_free(c.cache);
        const size_t nk = (size_t)(pb.length * pb.d_k), nv = (size_t)(pb.length * pb.d_v);
        if (which == 0)
            for (size_t i = 0; i < nv; i++)
                c.v[i] = c.vs[i] = c.v[i] > 0.0f ? 3.0e38f : -3.0e38f * 0.5f;
        else
            for (size_t i = 0; i < nk; i++)
                c.k[i] = c.ks[i] = c.k[i] * 1e37f;
        attn_kv_config cfg = config_of(&pb);
        attn_error err = {0};
        ASSERT_OK(attn_kv_create(&cfg, &c.cache, &err), err);
        append_range(c.cache, &pb, c.k, c.v, 0, pb.length);
        result got = run_cache(&c, &c.kp), want = run_forward(&c);
        ck_assert_int_eq(count_nonfinite(got.out, out_count(&c)), 0);
        double *w = xcalloc(out_count(&c), sizeof *w);
        for (size_t i = 0; i < out_count(&c); i++)
            w[i] = want.out[i];
        ASSERT_ERR(rel_err(got.out, w, out_count(&c)), 1e-6,
                   which == 0 ? "overflowing values" : "overflowing scores");
        free(w);
        result_free(&got);
        result_free(&want);
        case_drop(&c);
    }
}
END_TEST

/* ------------------------------------------------------- storage: cases */

static void assert_same_contents(attn_kv_cache *a, attn_kv_cache *b, const char *label)
{
    attn_kv_info ia, ib;
    attn_kv_info_get(a, &ia);
    attn_kv_info_get(b, &ib);
    ck_assert_msg(ia.length == ib.length && ia.pages == ib.pages && ia.bytes == ib.bytes,
                  "%s: length %lld / %lld, pages %lld / %lld, bytes %zu / %zu", label,
                  (long long)ia.length, (long long)ib.length, (long long)ia.pages,
                  (long long)ib.pages, ia.bytes, ib.bytes);
    const attn_kv_config *cfg = &ia.config;
    const size_t nk = (size_t)(cfg->num_kv_heads * ia.length * cfg->head_dim);
    const size_t nv = (size_t)(cfg->num_kv_heads * ia.length * cfg->value_dim);
    float *ka = xcalloc(nk, sizeof *ka), *kb = xcalloc(nk, sizeof *kb);
    float *va = xcalloc(nv, sizeof *va), *vb = xcalloc(nv, sizeof *vb);
    attn_error err = {0};
    ASSERT_OK(attn_kv_read(a, 0, ia.length, ka, va, &err), err);
    ASSERT_OK(attn_kv_read(b, 0, ib.length, kb, vb, &err), err);
    ck_assert_msg(first_difference(ka, kb, nk, sizeof *ka) < 0, "%s: keys differ", label);
    ck_assert_msg(first_difference(va, vb, nv, sizeof *va) < 0, "%s: values differ", label);
    free(ka), free(kb), free(va), free(vb);
}

/* Appending in pieces of any size (1, across page boundaries, whole
 * pages) stores, costs and attends the same as one append. */
START_TEST(append_in_pieces_equals_append_at_once)
{
    for (size_t d = 0; d < 3; d++)
        for (int rope = 0; rope < 2; rope++) {
            kv_problem pb = problem(4, 2, 777, DTYPES[d]);
            pb.var.rope_base = rope ? 10000.0f : 0.0f;
            pb.n_q = 3;
            kv_case once, pieces;
            case_make(&once, &pb, 1);
            case_make(&pieces, &pb, 20);
            char label[64];
            snprintf(label, sizeof label, "%s%s, 20 pieces", dtype_name(pb.dtype),
                     rope ? " rope" : "");
            assert_same_contents(once.cache, pieces.cache, label);
            result a = run_cache(&once, &once.kp), b = run_cache(&pieces, &pieces.kp);
            assert_same_bits(&once, &b, &a, label);
            result_free(&a);
            result_free(&b);
            /* One at a time too. */
            attn_kv_cache *ones;
            attn_kv_config cfg = config_of(&pb);
            attn_error err = {0};
            ASSERT_OK(attn_kv_create(&cfg, &ones, &err), err);
            for (int64_t j = 0; j < pb.length; j++)
                append_range(ones, &pb, once.k, once.v, j, j + 1);
            assert_same_contents(once.cache, ones, "one position at a time");
            attn_kv_free(ones);
            case_drop(&once);
            case_drop(&pieces);
        }
}
END_TEST

/* Speculative decoding's rollback: truncate, then append other tokens;
 * the cache is then the one that never saw the rolled-back ones. */
START_TEST(truncate_then_append_equals_never_appended)
{
    const int64_t keeps[] = {0, 1, 63, 64, 65, 130, 299};
    for (size_t d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof keeps / sizeof *keeps; i++) {
            kv_problem pb = problem(4, 2, 300, DTYPES[d]);
            pb.var.rope_base = i % 2 ? 10000.0f : 0.0f;
            kv_case first, second;
            case_make(&first, &pb, 3);
            pb.seed += 1000; /* other tokens after the kept ones */
            case_make(&second, &pb, 1);
            const int64_t keep = keeps[i];
            attn_error err = {0};
            ASSERT_OK(attn_kv_truncate(first.cache, keep, &err), err);
            ck_assert_int_eq(attn_kv_length(first.cache), keep);
            /* A cache built from first's kept tokens and second's others. */
            attn_kv_cache *never;
            attn_kv_config cfg = config_of(&pb);
            ASSERT_OK(attn_kv_create(&cfg, &never, &err), err);
            if (keep > 0)
                append_range(never, &pb, first.k, first.v, 0, keep);
            append_range(never, &pb, second.k, second.v, keep, pb.length);
            append_range(first.cache, &pb, second.k, second.v, keep, pb.length);
            char label[64];
            snprintf(label, sizeof label, "%s, kept %lld", dtype_name(pb.dtype),
                     (long long)keep);
            assert_same_contents(first.cache, never, label);
            kv_case other = first; /* first's queries over the other cache */
            other.cache = never;
            result a = run_cache(&first, &first.kp), b = run_cache(&other, &other.kp);
            assert_same_bits(&first, &a, &b, label);
            result_free(&a);
            result_free(&b);
            attn_kv_free(never);
            case_drop(&first);
            case_drop(&second);
        }
}
END_TEST

/* The bytes an append will add are known before it, exactly; the pages
 * are ceil(n / 64), less than a page beyond the positions' own bytes; an
 * append of one position allocates at most one page; truncate and free
 * give it all back. */
START_TEST(bytes_are_predicted_exactly_and_bounded)
{
    for (size_t d = 0; d < 3; d++) {
        const attn_kv_config cfg = {.num_kv_heads = 3, .head_dim = 10, .value_dim = 7,
                                    .dtype = DTYPES[d]};
        const size_t elem = attn_kv_dtype_size(cfg.dtype);
        const size_t row = (size_t)(cfg.num_kv_heads * (cfg.head_dim + cfg.value_dim)) * elem;
        attn_kv_cache *cache;
        attn_error err = {0};
        ASSERT_OK(attn_kv_create(&cfg, &cache, &err), err);
        const size_t empty = attn_kv_bytes(cache);
        ck_assert_uint_eq(empty, attn_kv_bytes_empty(&cfg));
        ck_assert(empty > 0 && empty < 1024);
        float *k = xcalloc(3 * 400 * 10, sizeof *k), *v = xcalloc(3 * 400 * 7, sizeof *v);
        uint64_t seed = 5;
        fill(k, 3 * 400 * 10, &seed, 1.0);
        fill(v, 3 * 400 * 7, &seed, 1.0);
        /* Appends and truncates in a pattern that crosses page boundaries
         * both ways. */
        const int64_t steps[] = {1, 62, 1, 1, 130, -5, 300, -190, 64, -64, 0, 1, -1000, 33};
        for (size_t s = 0; s < sizeof steps / sizeof *steps; s++) {
            const int64_t length = attn_kv_length(cache);
            const size_t before = attn_kv_bytes(cache);
            if (steps[s] >= 0) {
                const int64_t want = attn_kv_bytes_after_append(cache, steps[s]);
                ASSERT_OK(attn_kv_append(cache, steps[s], k, v, 0.0f, &err), err);
                ck_assert_msg((int64_t)attn_kv_bytes(cache) == want,
                              "step %zu: predicted %lld bytes, holds %zu", s, (long long)want,
                              attn_kv_bytes(cache));
            } else {
                ASSERT_OK(attn_kv_truncate(cache, length + steps[s] > 0 ? length + steps[s] : 0,
                                           &err),
                          err);
                ck_assert(attn_kv_bytes(cache) <= before);
            }
            attn_kv_info info;
            attn_kv_info_get(cache, &info);
            ck_assert_int_eq(info.page_bytes, (size_t)ATTN_KV_PAGE * row);
            ck_assert_int_eq(info.pages, (info.length + 63) / 64);
            const size_t pages = (size_t)info.pages * info.page_bytes;
            ck_assert_msg(pages < (size_t)info.length * row + info.page_bytes || info.pages == 0,
                          "%lld positions in %zu bytes of pages", (long long)info.length, pages);
            /* The rest is the header and a table of 8 bytes a page: a power
             * of two of entries, at least the pages, at most twice them
             * (or four). */
            const size_t table = info.bytes - empty - pages;
            ck_assert_msg(table % sizeof(void *) == 0, "table of %zu bytes", table);
            const size_t entries = table / sizeof(void *);
            ck_assert_msg(entries >= (size_t)info.pages &&
                              entries <= ((size_t)info.pages > 2 ? 2 * (size_t)info.pages : 4) &&
                              (entries & (entries - 1)) == 0,
                          "%zu table entries for %lld pages", entries, (long long)info.pages);
            if (steps[s] == 1)
                ck_assert(attn_kv_bytes(cache) - before <= info.page_bytes + 8 * entries);
        }
        ck_assert_int_eq(attn_kv_bytes_after_append(cache, -1), -1);
        ck_assert_int_eq(attn_kv_bytes_after_append(cache, INT64_MAX), -1);
        ASSERT_OK(attn_kv_truncate(cache, 0, &err), err);
        ck_assert_uint_eq(attn_kv_bytes(cache), empty);
        free(k);
        free(v);
        attn_kv_free(cache);
    }
}
END_TEST

/* float16 and bfloat16: the nearest value, ties to even, subnormals kept,
 * checked against rounding computed here, through attn_kv_read. */
START_TEST(stored_values_are_rounded_to_nearest_even)
{
    enum { N = 4096 };
    float *x = xcalloc(N, sizeof *x);
    uint64_t seed = 77;
    for (int i = 0; i < N; i++) {
        /* Magnitudes from float16's subnormals to its largest, ties and
         * near-ties of both formats, signs both ways. */
        double mag = ldexp(1.0 + rng_uniform(&seed) * 0.5 + 0.5, (int)(rng_next(&seed) % 40) - 26);
        x[i] = (float)(i % 2 ? -mag : mag);
        if (i % 7 == 0) /* exactly halfway between two float16 values */
            x[i] = (float)((1.0 + (double)(2 * (i % 1000) + 1) / 2048.0) * ldexp(1.0, i % 20 - 10));
        if (i % 11 == 0) /* halfway between two bfloat16 values */
            x[i] = (float)((1.0 + (double)(2 * (i % 100) + 1) / 256.0) * ldexp(1.0, i % 60 - 30));
    }
    x[0] = 65504.0f, x[1] = 65519.0f, x[2] = -65519.99f, x[3] = 0x1p-24f, x[4] = 0x1p-25f;
    x[5] = 0x1.8p-25f, x[6] = 3.0e38f, x[7] = 1e-40f, x[8] = 0.0f, x[9] = -0.0f;
    for (size_t d = 1; d < 3; d++) {
        const attn_kv_config cfg = {.num_kv_heads = 1, .head_dim = 1, .value_dim = 1,
                                    .dtype = DTYPES[d]};
        attn_kv_cache *cache;
        attn_error err = {0};
        ASSERT_OK(attn_kv_create(&cfg, &cache, &err), err);
        /* float16 cannot hold 3e38: that one is left out. */
        float *in = xcalloc(N, sizeof *in);
        for (int i = 0; i < N; i++)
            in[i] = cfg.dtype == ATTN_KV_FLOAT16 && fabsf(x[i]) > 65519.99f ? 1.0f : x[i];
        ASSERT_OK(attn_kv_append(cache, N, in, in, 0.0f, &err), err);
        float *k = xcalloc(N, sizeof *k), *v = xcalloc(N, sizeof *v);
        ASSERT_OK(attn_kv_read(cache, 0, N, k, v, &err), err);
        for (int i = 0; i < N; i++) {
            float want = rounded(cfg.dtype, in[i]);
            ck_assert_msg(memcmp(&k[i], &want, 4) == 0 && memcmp(&v[i], &want, 4) == 0,
                          "%s(%.9g) read back as %.9g / %.9g, want %.9g",
                          dtype_name(cfg.dtype), (double)in[i], (double)k[i], (double)v[i],
                          (double)want);
        }
        free(in), free(k), free(v);
        attn_kv_free(cache);
    }
    free(x);
}
END_TEST

/* A value the dtype cannot hold is refused with its tensor and index, and
 * the cache is as it was: same length, bytes and contents. */
START_TEST(values_the_dtype_cannot_hold_are_refused_and_change_nothing)
{
    const struct {
        attn_kv_dtype dtype;
        float bad;
        bool in_k;
    } cases[] = {
        {ATTN_KV_FLOAT16, 65520.0f, true},     {ATTN_KV_FLOAT16, -1e5f, false},
        {ATTN_KV_FLOAT16, INFINITY, true},     {ATTN_KV_BFLOAT16, 3.4e38f, false},
        {ATTN_KV_BFLOAT16, NAN, true},         {ATTN_KV_FLOAT32, INFINITY, false},
        {ATTN_KV_FLOAT32, NAN, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kv_problem pb = problem(2, 2, 100, cases[i].dtype);
        kv_case c;
        case_make(&c, &pb, 1);
        const size_t bytes = attn_kv_bytes(c.cache);
        float k[2 * 70 * 24], v[2 * 70 * 20];
        uint64_t seed = 3;
        fill(k, sizeof k / sizeof *k, &seed, 1.0);
        fill(v, sizeof v / sizeof *v, &seed, 1.0);
        /* Head 1, position 66, element 5. */
        if (cases[i].in_k)
            k[(70 + 66) * 24 + 5] = cases[i].bad;
        else
            v[(70 + 66) * 20 + 5] = cases[i].bad;
        attn_error err = {0};
        ck_assert(attn_kv_append(c.cache, 70, k, v, 0.0f, &err) == ATTN_ERR_INVALID);
        char want[32];
        snprintf(want, sizeof want, "%s[1, 66, 5]", cases[i].in_k ? "k" : "v");
        ck_assert_msg(strstr(err.message, want) != NULL &&
                          strstr(err.message, dtype_name(cases[i].dtype)) != NULL,
                      "message: %s", err.message);
        ck_assert_int_eq(attn_kv_length(c.cache), 100);
        ck_assert_uint_eq(attn_kv_bytes(c.cache), bytes);
        check_against_forward(&c, "after a refused append");
        case_drop(&c);
    }
}
END_TEST

/* attn_kv_append_check() says beforehand what the append at a position
 * would refuse for rope's rotation, at that position: 3e38 in both features
 * turns past float32's range at position 1 (cos 1 + sin 1 = 1.38) but not
 * at 0; small keys pass without a rotation. Nothing changes. */
START_TEST(append_check_finds_keys_that_overflow_once_rotated)
{
    attn_kv_config cfg = {.num_kv_heads = 1, .head_dim = 2, .value_dim = 2,
                          .dtype = ATTN_KV_FLOAT32};
    attn_kv_cache *cache = NULL;
    attn_error err = {0};
    ck_assert(attn_kv_create(&cfg, &cache, &err) == ATTN_OK);
    const float small[6] = {1, 2, 3, 4, 5, 6}, big[2] = {3e38f, 3e38f};
    ck_assert(attn_kv_append(cache, 3, small, small, 100.0f, &err) == ATTN_OK);
    ck_assert(attn_kv_append_check(cache, 1, 3, small, 100.0f, &err) == ATTN_OK);
    ck_assert(attn_kv_append_check(cache, 0, 1, big, 100.0f, &err) == ATTN_OK);
    ck_assert(attn_kv_append_check(cache, 1, 1, big, 0.0f, &err) == ATTN_OK);
    ck_assert(attn_kv_append_check(cache, 1, 1, big, 100.0f, &err) == ATTN_ERR_INVALID);
    ck_assert_msg(strstr(err.message, "once rotated") != NULL, "message: %s", err.message);
    ck_assert(attn_kv_append_check(cache, 4, 1, small, 100.0f, &err) == ATTN_ERR_INVALID);
    /* a NaN, as the append refuses it, and more positions than can be */
    const float nan_key[2] = {1.0f, NAN};
    ck_assert(attn_kv_append_check(cache, 1, 1, nan_key, 100.0f, &err) == ATTN_ERR_INVALID);
    ck_assert(attn_kv_append_check(cache, 1, INT64_MAX / 2, small, 100.0f, &err) ==
              ATTN_ERR_INVALID);
    ck_assert_int_eq(attn_kv_length(cache), 3);
    /* what the append itself does at that position */
    ck_assert(attn_kv_truncate(cache, 1, &err) == ATTN_OK);
    ck_assert(attn_kv_append(cache, 1, big, small, 100.0f, &err) == ATTN_ERR_INVALID);
    attn_kv_free(cache);
}
END_TEST

/* Keys rotated at one base cannot be attended or extended at another, or
 * without rope, nor unrotated keys with rope: refused in words that say
 * both. An emptied cache takes a new base. */
START_TEST(rope_must_match_the_cached_keys)
{
    kv_problem pb = problem(2, 1, 10, ATTN_KV_BFLOAT16);
    pb.var.rope_base = 10000.0f;
    kv_case c;
    case_make(&c, &pb, 1);
    attn_kv_info info;
    attn_kv_info_get(c.cache, &info);
    ck_assert(info.rope_base == 10000.0f);
    attn_error err = {0};
    float out[2 * 20];
    attn_kv_params kp = c.kp;
    kp.variants.rope_base = 0.0f;
    ck_assert(attn_kv_forward(c.cache, &kp, c.q, out, NULL, &err) == ATTN_ERR_INVALID);
    ck_assert_msg(strstr(err.message, "rope base 10000") != NULL &&
                      strstr(err.message, "not rotated") != NULL,
                  "%s", err.message);
    kp.variants.rope_base = 500.0f;
    ck_assert(attn_kv_forward(c.cache, &kp, c.q, out, NULL, &err) == ATTN_ERR_INVALID);
    ck_assert_msg(strstr(err.message, "500") != NULL, "%s", err.message);
    ck_assert(attn_kv_append(c.cache, 1, c.k, c.v, 0.0f, &err) == ATTN_ERR_INVALID);
    ck_assert_msg(strstr(err.message, "rope") != NULL, "%s", err.message);
    ck_assert_int_eq(attn_kv_length(c.cache), 10);
    /* Emptied, it starts over: unrotated keys now. */
    ASSERT_OK(attn_kv_truncate(c.cache, 0, &err), err);
    ASSERT_OK(attn_kv_append(c.cache, 1, c.k, c.v, 0.0f, &err), err);
    kp.variants.rope_base = 0.0f;
    ASSERT_OK(attn_kv_forward(c.cache, &kp, c.q, out, NULL, &err), err);
    kp.variants.rope_base = 10000.0f;
    ck_assert(attn_kv_forward(c.cache, &kp, c.q, out, NULL, &err) == ATTN_ERR_INVALID);
    case_drop(&c);
}
END_TEST

START_TEST(invalid_calls_are_refused_with_a_message)
{
    attn_kv_cache *cache = NULL;
    attn_error err = {0};
    const attn_kv_config bad[] = {
        {.num_kv_heads = 0, .head_dim = 4, .value_dim = 4},
        {.num_kv_heads = 1, .head_dim = -1, .value_dim = 4},
        {.num_kv_heads = 1, .head_dim = 4, .value_dim = 0},
        {.num_kv_heads = 1, .head_dim = 4, .value_dim = 4, .dtype = (attn_kv_dtype)7},
        {.num_kv_heads = (int64_t)1 << 40, .head_dim = 4, .value_dim = 4},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err.message[0] = '\0';
        ck_assert(attn_kv_create(&bad[i], &cache, &err) == ATTN_ERR_INVALID);
        ck_assert(cache == NULL && err.message[0] != '\0');
        ck_assert_uint_eq(attn_kv_bytes_empty(&bad[i]), 0);
    }
    kv_problem pb = problem(4, 2, 50, ATTN_KV_FLOAT32);
    kv_case c;
    case_make(&c, &pb, 1);
    float out[4 * 20];
    attn_kv_params kps[5];
    for (int i = 0; i < 5; i++)
        kps[i] = c.kp;
    kps[0].heads_q = 3;                  /* not a multiple of 2 */
    kps[1].n_q = 0;
    kps[2].scale = -1.0f;
    kps[3].threads = 0;
    kps[4].precision = (attn_precision)2;
    for (int i = 0; i < 5; i++) {
        err.message[0] = '\0';
        ck_assert_msg(attn_kv_forward(c.cache, &kps[i], c.q, out, NULL, &err) ==
                          ATTN_ERR_INVALID && err.message[0] != '\0',
                      "params %d accepted", i);
    }
    ck_assert(attn_kv_forward(c.cache, &c.kp, NULL, out, NULL, &err) == ATTN_ERR_INVALID);
    ck_assert(attn_kv_append(c.cache, -1, c.k, c.v, 0.0f, &err) == ATTN_ERR_INVALID);
    ck_assert(attn_kv_append(c.cache, 1, NULL, c.v, 0.0f, &err) == ATTN_ERR_INVALID);
    ck_assert(attn_kv_append(c.cache, 1, c.k, c.v, -3.0f, &err) == ATTN_ERR_INVALID);
    ck_assert(attn_kv_truncate(c.cache, -1, &err) == ATTN_ERR_INVALID);
    ck_assert(attn_kv_read(c.cache, 40, 11, c.k, NULL, &err) == ATTN_ERR_INVALID);
    ASSERT_OK(attn_kv_truncate(c.cache, 80, &err), err); /* beyond: nothing */
    ck_assert_int_eq(attn_kv_length(c.cache), 50);
    /* rope over an odd head_dim */
    attn_kv_config odd = {.num_kv_heads = 1, .head_dim = 5, .value_dim = 2};
    attn_kv_cache *oc;
    ASSERT_OK(attn_kv_create(&odd, &oc, &err), err);
    float kk[5] = {0}, vv[2] = {0};
    ck_assert(attn_kv_append(oc, 1, kk, vv, 100.0f, &err) == ATTN_ERR_INVALID);
    ck_assert_msg(strstr(err.message, "even") != NULL, "%s", err.message);
    attn_kv_free(oc);
    case_drop(&c);
}
END_TEST

/* attn_kv_forward_flops counts what attn_sdpa_flops counts for the same
 * attention: the window's band only. */
/* "precision" bfloat16 over a cache: attn_sdpa_forward's bfloat16 products
 * over the cached keys and values to the bit (the decode and the prefill
 * shapes, GQA, every dtype, variants), and not float32's answer. RoPE is
 * compared on float32 caches, where the forward rotates the keys as the
 * append did. */
START_TEST(bfloat16_precision_is_the_forwards_bfloat16_bit_for_bit)
{
    struct {
        const char *name;
        attn_variants var;
        bool alibi;
    } variants[] = {
        {"plain", {0}, false},
        {"window [70, 0], softcap 4", {.window = true, .window_left = 70, .window_right = 0,
                                        .softcap = 4.0f}, false},
        {"alibi", {0}, true},
        {"rope 10000", {.rope_base = 10000.0f}, false},
    };
    const int64_t n_qs[] = {1, 3, 40};
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++)
        for (size_t d = 0; d < 3; d++)
            for (size_t n = 0; n < 3; n++) {
                if (variants[i].var.rope_base > 0.0f && DTYPES[d] != ATTN_KV_FLOAT32)
                    continue;
                kv_problem pb = problem(8, 2, 70 + 61 * (int64_t)(i + d + n), DTYPES[d]);
                pb.n_q = n_qs[n];
                pb.causal = (i + n) % 2 == 0;
                pb.var = variants[i].var;
                pb.alibi = variants[i].alibi;
                pb.threads = 1 + (int)((i + d + n) % 3);
                kv_case c;
                case_make(&c, &pb, 3);
                char label[128];
                snprintf(label, sizeof label, "bfloat16, %s, %s, length %lld, n_q %lld%s",
                         variants[i].name, dtype_name(pb.dtype), (long long)pb.length,
                         (long long)pb.n_q, pb.causal ? ", causal" : "");
                attn_kv_params kp = c.kp;
                kp.precision = ATTN_PRECISION_BFLOAT16;
                result got = run_cache(&c, &kp), f32 = run_cache(&c, &c.kp);
                c.sp.precision = ATTN_PRECISION_BFLOAT16;
                result want;
                if (pb.var.rope_base > 0.0f) {
                    /* the forward rotates the keys itself: k as appended */
                    want = (result){nan_floats(out_count(&c)),
                                    xcalloc(row_count(&c), sizeof *want.rows)};
                    attn_error err = {0};
                    ASSERT_OK(attn_sdpa_forward(&c.sp, c.q, c.k, c.v, want.out, want.rows,
                                                NULL, NULL, &err), err);
                } else {
                    want = run_forward(&c);
                }
                assert_same_bits(&c, &got, &want, label);
                ck_assert_msg(first_difference(got.out, f32.out, out_count(&c),
                                               sizeof(float)) >= 0,
                              "%s: the same bits as float32 products", label);
                free(got.out), free(got.rows), free(f32.out), free(f32.rows);
                free(want.out), free(want.rows);
                case_drop(&c);
            }
}
END_TEST

/* bfloat16 precision reads the pages as stored, a page at a time, and
 * still gives attn_sdpa_forward's bits: past SDPA_FOLD_TILES (16) pages,
 * where the forward folds its float rows into double; on a last page that
 * a truncate cut in the middle (what it held past the new length must not
 * be read); for 1 to 3 threads, which cut a group's heads differently; and
 * with query heads 8 to a key/value head (a decode of 8 rows, and 5 query
 * rows each: the prefill shapes); odd widths. */
START_TEST(bfloat16_precision_over_many_pages_and_a_cut_page)
{
    for (size_t d = 0; d < 3; d++)
        for (int n = 0; n < 2; n++) {
            kv_problem pb = problem(16, 2, 1200, DTYPES[d]);
            pb.n_q = n == 0 ? 1 : 5;
            pb.causal = n == 1;
            pb.d_k = n == 0 ? 24 : 23; /* odd: a word of a feature and zero */
            pb.d_v = n == 0 ? 20 : 19;
            kv_case c;
            case_make(&c, &pb, 2);
            /* Keep 1139 positions: page 17 cut after 51 of its 64. */
            attn_error err = {0};
            const int64_t kept = 1139;
            ASSERT_OK(attn_kv_truncate(c.cache, kept, &err), err);
            float *k = xcalloc((size_t)(pb.heads_kv * kept * pb.d_k), sizeof *k);
            float *v = xcalloc((size_t)(pb.heads_kv * kept * pb.d_v), sizeof *v);
            ASSERT_OK(attn_kv_read(c.cache, 0, kept, k, v, &err), err);
            attn_sdpa_params sp = sdpa_shape(1, pb.heads_q, pb.heads_kv, pb.n_q, kept, pb.d_k,
                                             pb.d_v);
            sp.scale = c.kp.scale;
            sp.causal = pb.causal;
            sp.precision = ATTN_PRECISION_BFLOAT16;
            result want = {nan_floats(out_count(&c)), xcalloc(row_count(&c), sizeof *want.rows)};
            ASSERT_OK(attn_sdpa_forward(&sp, c.q, k, v, want.out, want.rows, NULL, NULL, &err),
                      err);
            for (int threads = 1; threads <= 3; threads++) {
                attn_kv_params kp = c.kp;
                kp.precision = ATTN_PRECISION_BFLOAT16;
                kp.threads = threads;
                result got = run_cache(&c, &kp);
                char label[128];
                snprintf(label, sizeof label, "bfloat16, %s, length %lld of 1200, n_q %lld, %d "
                         "thread%s", dtype_name(pb.dtype), (long long)kept, (long long)pb.n_q,
                         threads, threads == 1 ? "" : "s");
                assert_same_bits(&c, &got, &want, label);
                result_free(&got);
            }
            result_free(&want);
            free(k), free(v);
            case_drop(&c);
        }
}
END_TEST

/* Rows whose float sums overflow in bfloat16 are redone in double from
 * the rounded operands, as the forward redoes them: values near float32's
 * largest (the weighted sum overflows on the way), and scores past it. */
START_TEST(bfloat16_overflowing_rows_are_the_forwards)
{
    for (int which = 0; which < 2; which++) {
        kv_problem pb = problem(2, 1, 300, ATTN_KV_FLOAT32);
        pb.n_q = 2;
        kv_case c;
        case_make(&c, &pb, 1);
        attn_kv_free(c.cache);
        const size_t nk = (size_t)(pb.length * pb.d_k), nv = (size_t)(pb.length * pb.d_v);
        if (which == 0)
            for (size_t i = 0; i < nv; i++)
                c.v[i] = c.vs[i] = c.v[i] > 0.0f ? 3.0e38f : -3.0e38f * 0.5f;
        else
            for (size_t i = 0; i < nk; i++)
                c.k[i] = c.ks[i] = c.k[i] * 1e37f;
        attn_kv_config cfg = config_of(&pb);
        attn_error err = {0};
        ASSERT_OK(attn_kv_create(&cfg, &c.cache, &err), err);
        append_range(c.cache, &pb, c.k, c.v, 0, pb.length);
        attn_kv_params kp = c.kp;
        kp.precision = ATTN_PRECISION_BFLOAT16;
        c.sp.precision = ATTN_PRECISION_BFLOAT16;
        result got = run_cache(&c, &kp), want = run_forward(&c);
        ck_assert_int_eq(count_nonfinite(got.out, out_count(&c)), 0);
        double *w = xcalloc(out_count(&c), sizeof *w);
        for (size_t i = 0; i < out_count(&c); i++)
            w[i] = want.out[i];
        ASSERT_ERR(rel_err(got.out, w, out_count(&c)), 1e-6,
                   which == 0 ? "bfloat16, overflowing values" : "bfloat16, overflowing scores");
        free(w);
        result_free(&got);
        result_free(&want);
        case_drop(&c);
    }
}
END_TEST

/* A cancel flag already set: no work, ATTN_ERR_CANCELLED, with either
 * precision; unset, the call runs. */
START_TEST(a_set_cancel_flag_stops_the_attention)
{
    kv_problem pb = problem(4, 2, 300, ATTN_KV_BFLOAT16);
    kv_case c;
    case_make(&c, &pb, 2);
    atomic_int flag = 1;
    float *out = nan_floats(out_count(&c));
    for (int bf16 = 0; bf16 < 2; bf16++) {
        attn_kv_params kp = c.kp;
        kp.cancel = &flag;
        kp.precision = bf16 ? ATTN_PRECISION_BFLOAT16 : ATTN_PRECISION_FLOAT32;
        attn_error err = {0};
        atomic_store(&flag, 1);
        ck_assert_int_eq(attn_kv_forward(c.cache, &kp, c.q, out, NULL, &err),
                         ATTN_ERR_CANCELLED);
        atomic_store(&flag, 0);
        ASSERT_OK(attn_kv_forward(c.cache, &kp, c.q, out, NULL, &err), err);
    }
    free(out);
    case_drop(&c);
}
END_TEST

typedef struct {
    const volatile float *watch; /* NULL: set the flag after `pause` */
    struct timespec pause;
    atomic_int *flag;
} canceller;

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* Sets the flag once the call has visibly started (a value it writes early
 * is no longer NaN), or after a pause. */
static void *cancel_later(void *arg)
{
    canceller *c = arg;
    if (c->watch == NULL)
        nanosleep(&c->pause, NULL);
    else
        while (isnan(*c->watch))
            sched_yield();
    atomic_store(c->flag, 1);
    return NULL;
}

/* Prefill: a flag set once the first block of query rows has begun stops
 * the call at its next page (each unit looks before every page): most
 * rows are never written (they start as NaN), on one thread and on two. */
START_TEST(a_cancel_flag_set_midway_stops_a_long_prefill)
{
    for (int threads = 1; threads <= 2; threads++) {
        kv_problem pb = problem(1, 1, 4096, ATTN_KV_FLOAT32);
        pb.d_k = pb.d_v = 32;
        pb.n_q = 4096;
        pb.causal = false;
        pb.threads = threads;
        kv_case c;
        case_make(&c, &pb, 2);
        atomic_int flag = 0;
        attn_kv_params kp = c.kp;
        kp.cancel = &flag;
        float *out = nan_floats(out_count(&c));
        /* Row 0 is written by the first unit's first page. */
        canceller k = {.watch = out + 31, .flag = &flag};
        pthread_t t;
        pthread_create(&t, NULL, cancel_later, &k);
        attn_error err = {0};
        attn_status st = attn_kv_forward(c.cache, &kp, c.q, out, NULL, &err);
        pthread_join(t, NULL);
        ck_assert_int_eq(st, ATTN_ERR_CANCELLED);
        ck_assert_ptr_nonnull(strstr(err.message, "cancelled"));
        size_t done = 0;
        for (size_t r = 0; r < 4096; r++)
            done += !isnan(out[r * 32 + 31]);
        /* Short of the end: how far short is the scheduler's to say (the
         * canceller may wait out a time slice while both workers run). */
        ck_assert_msg(done < 4096, "threads %d: %zu of 4096 rows computed after the flag",
                      threads, done);
        free(out);
        case_drop(&c);
    }
}
END_TEST

/* Decoding: a flag set while the runs of pages are being read stops the
 * call at its next run, and the runs' merge never starts. Nothing the
 * decode writes before its merge is visible, so the flag comes after a
 * pause instead, and the call must say it stopped midway ("the call was
 * cancelled"); a flag seen before the call began says so instead, and an
 * unlucky schedule that finishes first is tried again, for up to 20 s: on a
 * loaded machine the canceller may wait for a core longer than a whole call.
 * The cache is 128 MiB of float32, about ten milliseconds of reading a call,
 * longer than a time slice. */
START_TEST(a_cancel_flag_set_midway_stops_a_long_decode)
{
    const int64_t heads_kv = 4, d = 64, chunk = 2048, length = 65536;
    const attn_kv_config cfg = {.num_kv_heads = heads_kv, .head_dim = d, .value_dim = d,
                                .dtype = ATTN_KV_FLOAT32};
    attn_kv_cache *cache = NULL;
    attn_error err = {0};
    ASSERT_OK(attn_kv_create(&cfg, &cache, &err), err);
    uint64_t seed = 77;
    float *kv = xcalloc((size_t)(heads_kv * chunk * d), sizeof *kv);
    fill(kv, (size_t)(heads_kv * chunk * d), &seed, 1.0);
    for (int64_t at = 0; at < length; at += chunk)
        ASSERT_OK(attn_kv_append(cache, chunk, kv, kv, 0.0f, &err), err);
    float q[8 * 64], out[8 * 64];
    fill(q, 8 * 64, &seed, 1.0);
    for (int threads = 1; threads <= 2; threads++) {
        attn_kv_params kp = {.heads_q = 8, .n_q = 1, .scale = attn_default_scale(d),
                             .causal = true, .threads = threads};
        atomic_int flag = 0;
        kp.cancel = &flag;
        /* The pause is a fraction of the call's own time, measured here
         * (a fixed one outlasted the whole call on a loaded machine), and
         * varied from attempt to attempt between a sixth and five sixths. */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        ASSERT_OK(attn_kv_forward(cache, &kp, q, out, NULL, &err), err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long call_ns = (long)((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec));
        call_ns = call_ns < 1000000000L ? call_ns : 999999999L;
        bool midway = false;
        int attempt = 0;
        for (; !midway && (attempt < 40 || seconds_since(&t1) < 20.0); attempt++) {
            atomic_store(&flag, 0);
            canceller k = {.pause = {0, call_ns / 6 * (attempt % 5 + 1)}, .flag = &flag};
            pthread_t t;
            pthread_create(&t, NULL, cancel_later, &k);
            attn_status st = attn_kv_forward(cache, &kp, q, out, NULL, &err);
            pthread_join(t, NULL);
            ck_assert_msg(st == ATTN_OK || st == ATTN_ERR_CANCELLED, "status %d: %s", (int)st,
                          err.message);
            midway = st == ATTN_ERR_CANCELLED && strstr(err.message, "before") == NULL;
        }
        ck_assert_msg(midway, "threads %d: never stopped midway in %d calls", threads, attempt);
        /* The flag down, the same call runs to its end. */
        atomic_store(&flag, 0);
        ASSERT_OK(attn_kv_forward(cache, &kp, q, out, NULL, &err), err);
    }
    free(kv);
    attn_kv_free(cache);
}
END_TEST

START_TEST(flops_are_those_of_the_same_forward)
{
    kv_problem pb = problem(8, 2, 3000, ATTN_KV_FLOAT16);
    pb.n_q = 4;
    pb.var = (attn_variants){.window = true, .window_left = 100, .window_right = -1};
    kv_case c;
    case_make(&c, &pb, 1);
    ck_assert(attn_kv_forward_flops(c.cache, &c.kp) == attn_sdpa_flops(&c.sp));
    ck_assert(attn_kv_forward_flops(c.cache, &c.kp) < 2.0 * 8 * 4 * 102 * (24 + 20) + 1);
    case_drop(&c);
}
END_TEST

static Suite *kvcache_suite(void)
{
    Suite *s = suite_create("kvcache");
    TCase *tc = tcase_create("attention");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, decode_is_the_forward_bit_for_bit_at_page_boundaries);
    tcase_add_test(tc, long_decode_merges_runs_within_the_bound);
    tcase_add_test(tc, gqa_ratios_one_to_eight_read_their_key_value_head);
    tcase_add_test(tc, every_variant_matches_the_forward);
    tcase_add_test(tc, causal_on_and_off_with_several_query_rows);
    tcase_add_test(tc, prefill_rows_are_the_forward_bit_for_bit);
    tcase_add_test(tc, thread_counts_one_to_four_give_the_same_bits);
    tcase_add_test(tc, rows_that_see_nothing_are_zero);
    tcase_add_test(tc, overflowing_rows_are_redone_in_double);
    tcase_add_test(tc, flops_are_those_of_the_same_forward);
    tcase_add_test(tc, bfloat16_precision_is_the_forwards_bfloat16_bit_for_bit);
    tcase_add_test(tc, bfloat16_precision_over_many_pages_and_a_cut_page);
    tcase_add_test(tc, bfloat16_overflowing_rows_are_the_forwards);
    tcase_add_test(tc, a_set_cancel_flag_stops_the_attention);
    tcase_add_test(tc, a_cancel_flag_set_midway_stops_a_long_prefill);
    tcase_add_test(tc, a_cancel_flag_set_midway_stops_a_long_decode);
    suite_add_tcase(s, tc);
    tc = tcase_create("storage");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, append_in_pieces_equals_append_at_once);
    tcase_add_test(tc, truncate_then_append_equals_never_appended);
    tcase_add_test(tc, bytes_are_predicted_exactly_and_bounded);
    tcase_add_test(tc, stored_values_are_rounded_to_nearest_even);
    tcase_add_test(tc, values_the_dtype_cannot_hold_are_refused_and_change_nothing);
    tcase_add_test(tc, append_check_finds_keys_that_overflow_once_rotated);
    tcase_add_test(tc, rope_must_match_the_cached_keys);
    tcase_add_test(tc, invalid_calls_are_refused_with_a_message);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(kvcache_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
