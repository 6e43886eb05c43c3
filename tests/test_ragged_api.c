/*
 * Ragged batches through the API ("seq_lens", "seq_lens_k" on
 * /v1/attention; "seq_lens", "seq_lens_context" on /v1/multihead), without
 * sockets: a packed request's answer, sequence by sequence, is the answer
 * of that sequence sent alone as an ordinary request (output, weights,
 * lse, every gradient; the weights' zeros outside the blocks, null lse and
 * zero gradients where a sequence has no keys or no queries), and the
 * one-key-per-query case is checked against its closed form. Then every
 * error the fields can give, and the cost: meta.flops and meta.work count
 * the blocks only, so --max-work admits a packed batch that padding would
 * not fit, while --max-response judges the whole weights matrix sent.
 */
#include "api.h"
#include "attn.h"

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const api_limits LIM = {.max_work = 0, .threads = 2};

/* ------------------------------------------------------------ helpers */

static uint64_t rng_state = 777;
static float rnd(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(rng_state >> 40) / (double)(1ULL << 24) * 2.0 - 1.0);
}

static float *rnd_floats(int64_t n)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        x[i] = rnd();
    return x;
}

/* Nested arrays of x [shape]. */
static json_t *tensor(const float *x, int rank, const int64_t *shape)
{
    json_t *a = json_array();
    int64_t inner = 1;
    for (int i = 1; i < rank; i++)
        inner *= shape[i];
    for (int64_t i = 0; i < shape[0]; i++)
        json_array_append_new(a, rank == 1 ? json_real(x[i])
                                           : tensor(x + i * inner, rank - 1, shape + 1));
    return a;
}

static json_t *lengths(const int64_t *len, int64_t n)
{
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(len[i]));
    return a;
}

/* The body (taken) through api_handle: the parsed answer, status checked. */
static json_t *post(api_op op, json_t *body, int status)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    api_response res;
    api_handle(op, text, strlen(text), &LIM, &res);
    free(text);
    json_error_t je;
    json_t *j = json_loadb(res.body, res.body_len, 0, &je);
    ck_assert_msg(j != NULL, "answer is not JSON: %s", je.text);
    ck_assert_msg(res.status == status, "status %d, wanted %d: %.*s", res.status, status,
                  (int)(res.body_len < 600 ? res.body_len : 600), res.body);
    api_response_free(&res);
    return j;
}

/* Every number of a nested answer, in order (null, a row that sees no
 * key in lse, as -inf). */
static void flatten(json_t *j, float *out, int64_t *at)
{
    if (json_is_array(j)) {
        for (size_t i = 0; i < json_array_size(j); i++)
            flatten(json_array_get(j, i), out, at);
        return;
    }
    out[(*at)++] = json_is_null(j) ? -INFINITY : (float)json_number_value(j);
}

static float *numbers(json_t *j, int64_t count)
{
    ck_assert_msg(j != NULL, "no such tensor in the answer");
    float *out = calloc((size_t)count + 1, sizeof *out);
    int64_t at = 0;
    flatten(j, out, &at);
    ck_assert_int_eq(at, count);
    return out;
}

/* |a - b| <= tol (1 + |b|) for every element, naming the worst. */
static void assert_close(const char *what, const float *a, const float *b, int64_t n, double tol)
{
    double worst = 0;
    int64_t at = -1;
    for (int64_t i = 0; i < n; i++) {
        if (a[i] == b[i])
            continue; /* -inf == -inf included */
        double e = fabs((double)a[i] - (double)b[i]) / (1 + fabs((double)b[i]));
        if (!(e <= worst)) {
            worst = e;
            at = i;
        }
    }
    ck_assert_msg(!(worst > tol), "%s: element %lld is %.9g, wanted %.9g", what,
                  (long long)at, at >= 0 ? (double)a[at] : 0.0, at >= 0 ? (double)b[at] : 0.0);
}

static void assert_zero(const char *what, const float *a, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (a[i] != 0.0f)
            ck_abort_msg("%s: element %lld is %g, not 0", what, (long long)i, (double)a[i]);
}

static json_t *error_of(json_t *j)
{
    return json_object_get(j, "error");
}

/* ------------------------------------------------------- /v1/attention */

/* Heads of q, of k and v, widths, and the sequences. */
typedef struct {
    int64_t hq, hk, d;
    int64_t seqs;
    const int64_t *lq, *lk;
    const char *options; /* JSON members of the request, besides the tensors */
} attention_case;

/* Rows [r0, r0 + rows) of every head of x [heads, n, d] into a new [heads, rows, d]. */
static float *rows_of(const float *x, int64_t heads, int64_t n, int64_t d, int64_t r0,
                      int64_t rows)
{
    float *y = malloc((size_t)(heads * rows * d + 1) * sizeof *y);
    for (int64_t h = 0; h < heads; h++)
        memcpy(y + h * rows * d, x + (h * n + r0) * d, (size_t)(rows * d) * sizeof *y);
    return y;
}

static void check_attention(const attention_case *ac)
{
    const int64_t hq = ac->hq, hk = ac->hk, d = ac->d;
    int64_t nq = 0, nk = 0;
    for (int64_t s = 0; s < ac->seqs; s++) {
        nq += ac->lq[s];
        nk += ac->lk[s];
    }
    float *q = rnd_floats(hq * nq * d), *k = rnd_floats(hk * nk * d), *v = rnd_floats(hk * nk * d);
    float *dout = rnd_floats(hq * nq * d);
    const int64_t sq[3] = {hq, nq, d}, sk[3] = {hk, nk, d};
    json_t *opts = json_loads(ac->options, 0, NULL);
    ck_assert_ptr_nonnull(opts);

    json_t *body = json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:b,s:b}", "q", tensor(q, 3, sq), "k",
                             tensor(k, 3, sk), "v", tensor(v, 3, sk), "grad_output",
                             tensor(dout, 3, sq), "seq_lens", lengths(ac->lq, ac->seqs),
                             "seq_lens_k", lengths(ac->lk, ac->seqs), "return_weights", 1,
                             "return_lse", 1);
    json_object_update(body, opts);
    json_t *all = post(API_OP_ATTENTION, body, 200);
    float *out = numbers(json_object_get(all, "output"), hq * nq * d);
    float *w = numbers(json_object_get(all, "weights"), hq * nq * nk);
    float *lse = numbers(json_object_get(all, "lse"), hq * nq);
    json_t *grad = json_object_get(all, "grad");
    float *gq = numbers(json_object_get(grad, "q"), hq * nq * d);
    float *gk = numbers(json_object_get(grad, "k"), hk * nk * d);
    float *gv = numbers(json_object_get(grad, "v"), hk * nk * d);
    json_t *shape = json_object_get(json_object_get(all, "meta"), "shape");
    ck_assert_int_eq(json_integer_value(json_object_get(shape, "sequences")), ac->seqs);

    int64_t q0 = 0, k0 = 0;
    char what[96];
    for (int64_t s = 0; s < ac->seqs; q0 += ac->lq[s], k0 += ac->lk[s], s++) {
        const int64_t lq = ac->lq[s], lk = ac->lk[s];
        for (int64_t h = 0; h < hq; h++)
            for (int64_t i = q0; i < q0 + lq; i++) {
                /* weights outside the sequence's keys: exactly 0 */
                const float *row = w + (h * nq + i) * nk;
                snprintf(what, sizeof what, "sequence %lld: weights outside its keys",
                         (long long)s);
                assert_zero(what, row, k0);
                assert_zero(what, row + k0 + lk, nk - k0 - lk);
            }
        if (lq == 0 || lk == 0) {
            /* Queries without keys: zero rows, null lse, zero dq; keys
             * without queries: zero dk and dv. */
            for (int64_t h = 0; h < hq; h++) {
                snprintf(what, sizeof what, "sequence %lld (no keys): output", (long long)s);
                assert_zero(what, out + (h * nq + q0) * d, lq * d);
                assert_zero(what, gq + (h * nq + q0) * d, lq * d);
                for (int64_t i = 0; i < lq; i++)
                    ck_assert_msg(lse[h * nq + q0 + i] == -INFINITY,
                                  "sequence %lld: lse of a row without keys is not null",
                                  (long long)s);
            }
            for (int64_t h = 0; h < hk; h++) {
                snprintf(what, sizeof what, "sequence %lld (no queries): dk, dv", (long long)s);
                assert_zero(what, gk + (h * nk + k0) * d, lk * d);
                assert_zero(what, gv + (h * nk + k0) * d, lk * d);
            }
            continue;
        }
        /* The sequence alone, as an ordinary request. */
        float *qs = rows_of(q, hq, nq, d, q0, lq), *ds = rows_of(dout, hq, nq, d, q0, lq);
        float *ks = rows_of(k, hk, nk, d, k0, lk), *vs = rows_of(v, hk, nk, d, k0, lk);
        const int64_t tq[3] = {hq, lq, d}, tk[3] = {hk, lk, d};
        json_t *alone = json_pack("{s:o,s:o,s:o,s:o,s:b,s:b}", "q", tensor(qs, 3, tq), "k",
                                  tensor(ks, 3, tk), "v", tensor(vs, 3, tk), "grad_output",
                                  tensor(ds, 3, tq), "return_weights", 1, "return_lse", 1);
        json_object_update(alone, opts);
        json_t *one = post(API_OP_ATTENTION, alone, 200);
        float *o1 = numbers(json_object_get(one, "output"), hq * lq * d);
        float *w1 = numbers(json_object_get(one, "weights"), hq * lq * lk);
        float *l1 = numbers(json_object_get(one, "lse"), hq * lq);
        json_t *g1 = json_object_get(one, "grad");
        float *gq1 = numbers(json_object_get(g1, "q"), hq * lq * d);
        float *gk1 = numbers(json_object_get(g1, "k"), hk * lk * d);
        float *gv1 = numbers(json_object_get(g1, "v"), hk * lk * d);
        float *got = rows_of(out, hq, nq, d, q0, lq), *got_q = rows_of(gq, hq, nq, d, q0, lq);
        float *got_k = rows_of(gk, hk, nk, d, k0, lk), *got_v = rows_of(gv, hk, nk, d, k0, lk);
        snprintf(what, sizeof what, "sequence %lld: output", (long long)s);
        assert_close(what, got, o1, hq * lq * d, 1e-6);
        snprintf(what, sizeof what, "sequence %lld: dq", (long long)s);
        assert_close(what, got_q, gq1, hq * lq * d, 1e-5);
        snprintf(what, sizeof what, "sequence %lld: dk", (long long)s);
        assert_close(what, got_k, gk1, hk * lk * d, 1e-5);
        snprintf(what, sizeof what, "sequence %lld: dv", (long long)s);
        assert_close(what, got_v, gv1, hk * lk * d, 1e-5);
        for (int64_t h = 0; h < hq; h++)
            for (int64_t i = 0; i < lq; i++) {
                snprintf(what, sizeof what, "sequence %lld: weights of its keys", (long long)s);
                assert_close(what, w + (h * nq + q0 + i) * nk + k0, w1 + (h * lq + i) * lk, lk,
                             1e-6);
                snprintf(what, sizeof what, "sequence %lld: lse", (long long)s);
                assert_close(what, lse + h * nq + q0 + i, l1 + h * lq + i, 1, 1e-6);
            }
        free(qs), free(ds), free(ks), free(vs), free(o1), free(w1), free(l1);
        free(gq1), free(gk1), free(gv1), free(got), free(got_q), free(got_k), free(got_v);
        json_decref(one);
    }
    free(q), free(k), free(v), free(dout), free(out), free(w), free(lse);
    free(gq), free(gk), free(gv);
    json_decref(all);
    json_decref(opts);
}

/* Empty sequences first, between and last; keys without queries and
 * queries without keys; lengths that cross the kernels' tiles. */
static const int64_t LQ[] = {0, 3, 5, 0, 2, 70, 1, 4};
static const int64_t LK[] = {2, 4, 5, 3, 0, 66, 1, 0};
#define SEQS (int64_t)(sizeof LQ / sizeof *LQ)

START_TEST(attention_each_sequence_is_the_sequence_sent_alone)
{
    const char *options[] = {
        "{}",
        "{\"causal\": true}",
        "{\"causal\": true, \"window\": [3, 0], \"alibi_slopes\": [0.5, 0.25]}",
        "{\"softcap\": 2.5, \"rope\": {\"base\": 100}, \"scale\": 0.7}",
        "{\"precision\": \"bfloat16\"}",
        "{\"precision\": \"bfloat16\", \"causal\": true, \"rope\": {\"base\": 100}}",
    };
    for (size_t i = 0; i < sizeof options / sizeof *options; i++) {
        attention_case ac = {.hq = 2, .hk = 1, .d = 4, .seqs = SEQS, .lq = LQ, .lk = LK,
                             .options = options[i]};
        check_attention(&ac);
    }
}
END_TEST

START_TEST(attention_seq_lens_alone_splits_the_keys_alike)
{
    /* Without seq_lens_k the keys have the queries' lengths. */
    static const int64_t len[] = {4, 1, 0, 9};
    const int64_t n = 14, s3[3] = {1, n, 3};
    float *x = rnd_floats(n * 3);
    json_t *both = json_pack("{s:o,s:o,s:o,s:o,s:o,s:b}", "q", tensor(x, 3, s3), "k",
                             tensor(x, 3, s3), "v", tensor(x, 3, s3), "seq_lens",
                             lengths(len, 4), "seq_lens_k", lengths(len, 4), "causal", 1);
    json_t *one = json_pack("{s:o,s:o,s:o,s:o,s:b}", "q", tensor(x, 3, s3), "k",
                            tensor(x, 3, s3), "v", tensor(x, 3, s3), "seq_lens",
                            lengths(len, 4), "causal", 1);
    json_t *a = post(API_OP_ATTENTION, both, 200), *b = post(API_OP_ATTENTION, one, 200);
    ck_assert(json_equal(json_object_get(a, "output"), json_object_get(b, "output")));
    json_decref(a), json_decref(b);
    free(x);
}
END_TEST

START_TEST(attention_thousands_of_one_row_sequences)
{
    /* One key per query: every weight is 1, the output is that key's
     * value, the lse its scaled score. */
    enum { N = 2000, D = 2 };
    int64_t *ones = malloc(N * sizeof *ones);
    for (int i = 0; i < N; i++)
        ones[i] = 1;
    const int64_t s2[2] = {N, D};
    float *q = rnd_floats(N * D), *k = rnd_floats(N * D), *v = rnd_floats(N * D);
    json_t *body = json_pack("{s:o,s:o,s:o,s:o,s:b,s:s}", "q", tensor(q, 2, s2), "k",
                             tensor(k, 2, s2), "v", tensor(v, 2, s2), "seq_lens",
                             lengths(ones, N), "return_lse", 1, "output_encoding", "flat");
    json_t *j = post(API_OP_ATTENTION, body, 200);
    float *out = numbers(json_object_get(json_object_get(j, "output"), "data"), N * D);
    float *lse = numbers(json_object_get(json_object_get(j, "lse"), "data"), N);
    ck_assert_int_eq(memcmp(out, v, sizeof(float) * N * D), 0);
    for (int i = 0; i < N; i++) {
        double score = ((double)q[2 * i] * k[2 * i] + (double)q[2 * i + 1] * k[2 * i + 1]) /
                       sqrt(2.0);
        ck_assert_msg(fabs(lse[i] - score) <= 1e-6 * (1 + fabs(score)), "row %d: lse %g, want %g",
                      i, (double)lse[i], score);
    }
    free(ones), free(q), free(k), free(v), free(out), free(lse);
    json_decref(j);
}
END_TEST

START_TEST(attention_rank4_with_one_batch_entry)
{
    static const int64_t len[] = {2, 3};
    const int64_t s4[4] = {1, 2, 5, 4};
    float *x = rnd_floats(2 * 5 * 4);
    json_t *j = post(API_OP_ATTENTION,
                     json_pack("{s:o,s:o,s:o,s:o}", "q", tensor(x, 4, s4), "k", tensor(x, 4, s4),
                               "v", tensor(x, 4, s4), "seq_lens", lengths(len, 2)),
                     200);
    ck_assert(json_is_array(json_object_get(j, "output")));
    json_decref(j);
    free(x);
}
END_TEST

/* ------------------------------------------------------- /v1/multihead */

/* x [n, 6], context [m, 5] (or none), two query heads over one key/value
 * head of width 2, w_o [4, 3], every bias. */
static void check_multihead(const int64_t *ln, const int64_t *lm, int64_t seqs, bool context,
                            const char *options)
{
    const int64_t dm = 6, dc = context ? 5 : 6;
    int64_t n = 0, m = 0;
    for (int64_t s = 0; s < seqs; s++) {
        n += ln[s];
        m += context ? lm[s] : ln[s];
    }
    float *x = rnd_floats(n * dm), *c = rnd_floats(m * dc), *dout = rnd_floats(n * 3);
    const char *wname[] = {"w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o"};
    const int64_t wshape[][2] = {{dm, 4}, {dc, 2}, {dc, 2}, {4, 3}, {4, 0}, {2, 0}, {2, 0},
                                 {3, 0}};
    float *wt[8];
    json_t *weights = json_object();
    for (int i = 0; i < 8; i++) {
        int rank = wshape[i][1] ? 2 : 1;
        wt[i] = rnd_floats(wshape[i][0] * (rank == 2 ? wshape[i][1] : 1));
        json_object_set_new(weights, wname[i], tensor(wt[i], rank, wshape[i]));
    }
    json_t *opts = json_loads(options, 0, NULL);
    ck_assert_ptr_nonnull(opts);
    const int64_t sx[2] = {n, dm}, sc[2] = {m, dc}, so[2] = {n, 3};
    json_t *body = json_pack("{s:o,s:o,s:i,s:i,s:o,s:s,s:b}", "x", tensor(x, 2, sx),
                             "grad_output", tensor(dout, 2, so), "num_heads", 2,
                             "num_kv_heads", 1, "seq_lens", lengths(ln, seqs),
                             "return_weights", "mean", "return_lse", 1);
    if (context) {
        json_object_set_new(body, "context", tensor(c, 2, sc));
        json_object_set_new(body, "seq_lens_context", lengths(lm, seqs));
    }
    json_object_update(body, weights);
    json_object_update(body, opts);
    json_t *all = post(API_OP_MULTIHEAD, body, 200);
    float *out = numbers(json_object_get(all, "output"), n * 3);
    float *mean = numbers(json_object_get(all, "weights"), n * m);
    float *lse = numbers(json_object_get(all, "lse"), 2 * n);
    json_t *grad = json_object_get(all, "grad");
    float *gx = numbers(json_object_get(grad, "x"), n * dm);
    float *gc = context ? numbers(json_object_get(grad, "context"), m * dc) : NULL;
    /* The weights' gradients: the sum of each sequence's alone. */
    float *gw[8], *sum[8];
    for (int i = 0; i < 8; i++) {
        int64_t count = wshape[i][0] * (wshape[i][1] ? wshape[i][1] : 1);
        gw[i] = numbers(json_object_get(grad, wname[i]), count);
        sum[i] = calloc((size_t)count, sizeof *sum[i]);
    }
    int64_t x0 = 0, c0 = 0;
    char what[96];
    for (int64_t s = 0; s < seqs; x0 += ln[s], c0 += context ? lm[s] : ln[s], s++) {
        const int64_t rn = ln[s], rm = context ? lm[s] : ln[s];
        for (int64_t i = x0; i < x0 + rn; i++) {
            snprintf(what, sizeof what, "sequence %lld: mean weights outside its keys",
                     (long long)s);
            assert_zero(what, mean + i * m, c0);
            assert_zero(what, mean + i * m + c0 + rm, m - c0 - rm);
        }
        if (rn == 0 || rm == 0) {
            /* queries without keys: no attention, the output is b_o;
             * context rows nothing reads: zero gradient */
            for (int64_t i = 0; i < 2 * rn; i++)
                ck_assert(lse[(i / rn) * n + x0 + i % rn] == -INFINITY);
            if (gc != NULL) {
                snprintf(what, sizeof what, "sequence %lld (no queries): d context",
                         (long long)s);
                assert_zero(what, gc + c0 * dc, rm * dc);
            }
            if (rn > 0) {
                snprintf(what, sizeof what, "sequence %lld (no keys): dx", (long long)s);
                assert_zero(what, gx + x0 * dm, rn * dm);
                /* no keys: attention gives 0, out = 0 W_O + b_O */
                for (int64_t i = 0; i < rn; i++)
                    assert_close("output of a sequence without keys: b_o", out + (x0 + i) * 3,
                                 wt[7], 3, 1e-6);
                /* ... and it still adds its rows to db_o */
                for (int64_t i = 0; i < rn; i++)
                    for (int t = 0; t < 3; t++)
                        sum[7][t] += dout[(x0 + i) * 3 + t];
            }
            continue;
        }
        const int64_t tx[2] = {rn, dm}, tc[2] = {rm, dc}, to[2] = {rn, 3};
        json_t *alone = json_pack("{s:o,s:o,s:i,s:i,s:s,s:b}", "x", tensor(x + x0 * dm, 2, tx),
                                  "grad_output", tensor(dout + x0 * 3, 2, to), "num_heads", 2,
                                  "num_kv_heads", 1, "return_weights", "mean", "return_lse", 1);
        if (context)
            json_object_set_new(alone, "context", tensor(c + c0 * dc, 2, tc));
        json_object_update(alone, weights);
        json_object_update(alone, opts);
        json_t *one = post(API_OP_MULTIHEAD, alone, 200);
        float *o1 = numbers(json_object_get(one, "output"), rn * 3);
        float *m1 = numbers(json_object_get(one, "weights"), rn * rm);
        float *l1 = numbers(json_object_get(one, "lse"), 2 * rn);
        json_t *g1 = json_object_get(one, "grad");
        float *gx1 = numbers(json_object_get(g1, "x"), rn * dm);
        snprintf(what, sizeof what, "sequence %lld: output", (long long)s);
        assert_close(what, out + x0 * 3, o1, rn * 3, 1e-5);
        snprintf(what, sizeof what, "sequence %lld: dx", (long long)s);
        assert_close(what, gx + x0 * dm, gx1, rn * dm, 1e-4);
        if (gc != NULL) {
            float *gc1 = numbers(json_object_get(g1, "context"), rm * dc);
            snprintf(what, sizeof what, "sequence %lld: d context", (long long)s);
            assert_close(what, gc + c0 * dc, gc1, rm * dc, 1e-4);
            free(gc1);
        }
        for (int64_t i = 0; i < rn; i++) {
            snprintf(what, sizeof what, "sequence %lld: mean weights", (long long)s);
            assert_close(what, mean + (x0 + i) * m + c0, m1 + i * rm, rm, 1e-6);
            for (int h = 0; h < 2; h++) {
                snprintf(what, sizeof what, "sequence %lld: lse", (long long)s);
                assert_close(what, lse + h * n + x0 + i, l1 + h * rn + i, 1, 1e-5);
            }
        }
        for (int i = 0; i < 8; i++) {
            int64_t count = wshape[i][0] * (wshape[i][1] ? wshape[i][1] : 1);
            float *g = numbers(json_object_get(g1, wname[i]), count);
            for (int64_t e = 0; e < count; e++)
                sum[i][e] += g[e];
            free(g);
        }
        free(o1), free(m1), free(l1), free(gx1);
        json_decref(one);
    }
    for (int i = 0; i < 8; i++) {
        int64_t count = wshape[i][0] * (wshape[i][1] ? wshape[i][1] : 1);
        snprintf(what, sizeof what, "gradient of %s: the sum over the sequences", wname[i]);
        assert_close(what, gw[i], sum[i], count, 1e-4);
        free(gw[i]), free(sum[i]), free(wt[i]);
    }
    free(x), free(c), free(dout), free(out), free(mean), free(lse), free(gx), free(gc);
    json_decref(all);
    json_decref(weights);
    json_decref(opts);
}

START_TEST(multihead_each_sequence_is_the_sequence_sent_alone)
{
    static const int64_t ln[] = {3, 0, 70, 1, 2}, lm[] = {2, 4, 65, 1, 0};
    check_multihead(ln, lm, 5, true, "{\"causal\": true}");
    check_multihead(ln, lm, 5, true, "{\"window\": [2, 2], \"rope\": {\"base\": 50}}");
    static const int64_t self[] = {4, 0, 1, 66};
    check_multihead(self, NULL, 4, false, "{\"causal\": true, \"alibi_slopes\": [1, 0.5]}");
    check_multihead(ln, lm, 5, true, "{\"causal\": true, \"precision\": \"bfloat16\"}");
}
END_TEST

/* --------------------------------------------------------------- errors */

/* The body `json` (a format for json_pack, its arguments after) fails with
 * status, code and field, and the message holds `says`. */
static void expect_error(api_op op, json_t *body, int status, const char *code,
                         const char *field, const char *says)
{
    json_t *j = post(op, body, status);
    json_t *e = error_of(j);
    ck_assert_str_eq(json_string_value(json_object_get(e, "code")), code);
    ck_assert_str_eq(json_string_value(json_object_get(e, "field")), field);
    const char *msg = json_string_value(json_object_get(e, "message"));
    ck_assert_msg(strstr(msg, says) != NULL, "no \"%s\" in: %s", says, msg);
    json_decref(j);
}

/* q, k, v of [n_q, 2], [n_k, 2] (rank 2), plus `extra` members. */
static json_t *qkv(int64_t nq, int64_t nk, const char *extra)
{
    const int64_t sq[2] = {nq, 2}, sk[2] = {nk, 2};
    float *a = rnd_floats(nq * 2), *b = rnd_floats(nk * 2);
    json_t *j = json_pack("{s:o,s:o,s:o}", "q", tensor(a, 2, sq), "k", tensor(b, 2, sk), "v",
                          tensor(b, 2, sk));
    json_t *more = json_loads(extra, 0, NULL);
    ck_assert_msg(more != NULL, "bad test body: %s", extra);
    json_object_update(j, more);
    json_decref(more);
    free(a), free(b);
    return j;
}

START_TEST(attention_errors_name_the_field_and_the_numbers)
{
    const api_op A = API_OP_ATTENTION;
    expect_error(A, qkv(5, 5, "{\"seq_lens\": [2, 2]}"), 422, "shape_mismatch", "seq_lens",
                 "seq_lens sums to 4 but q has n_q = 5");
    expect_error(A, qkv(5, 7, "{\"seq_lens\": [2, 3], \"seq_lens_k\": [3, 3]}"), 422,
                 "shape_mismatch", "seq_lens_k", "seq_lens_k sums to 6 but k has n_k = 7");
    expect_error(A, qkv(5, 5, "{\"seq_lens\": [2, -1, 4]}"), 422, "invalid_value", "seq_lens",
                 "seq_lens[1] is -1");
    expect_error(A, qkv(5, 5, "{\"seq_lens\": [5], \"seq_lens_k\": [-5, 10]}"), 422,
                 "invalid_value", "seq_lens_k", "seq_lens_k[0] is -5");
    expect_error(A, qkv(5, 5, "{\"seq_lens_k\": [2, 3]}"), 422, "invalid_value", "seq_lens_k",
                 "seq_lens_k needs seq_lens");
    expect_error(A, qkv(5, 5, "{\"seq_lens\": [2, 3], \"seq_lens_k\": [5]}"), 422,
                 "shape_mismatch", "seq_lens_k", "seq_lens_k has 1 lengths but seq_lens has 2");
    expect_error(A, qkv(5, 7, "{\"seq_lens\": [2, 3]}"), 422, "shape_mismatch", "seq_lens_k",
                 "k has n_k = 7 rows but seq_lens sums to 5");
    expect_error(A, qkv(5, 5, "{\"seq_lens\": []}"), 422, "shape_mismatch", "seq_lens",
                 "sums to 0");
    /* A padding mask [B, 1, 1, n] is not what a packed batch takes. */
    expect_error(A, qkv(5, 5, "{\"seq_lens\": [2, 3], \"mask\": [[true, true, false]]}"), 422,
                 "shape_mismatch", "mask", "packed rows and keys");
    /* A batch dimension of more than one entry. */
    const int64_t s4[4] = {2, 1, 3, 2};
    float *x = rnd_floats(12);
    expect_error(A,
                 json_pack("{s:o,s:o,s:o,s:[i,i]}", "q", tensor(x, 4, s4), "k", tensor(x, 4, s4),
                           "v", tensor(x, 4, s4), "seq_lens", 1, 2),
                 422, "invalid_value", "seq_lens", "batch dimension of 2");
    free(x);
    /* The form: an array of integers. */
    const char *wrong[] = {"{\"seq_lens\": 5}", "{\"seq_lens\": [2.5, 2.5]}",
                           "{\"seq_lens\": [\"5\"]}", "{\"seq_lens\": [true]}",
                           "{\"seq_lens\": {\"a\": 5}}", "{\"seq_lens\": [[5]]}"};
    for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++)
        expect_error(A, qkv(5, 5, wrong[i]), 400, "wrong_type", "seq_lens", "seq_lens");
    expect_error(A, qkv(5, 5, "{\"seq_len\": [5]}"), 400, "unknown_field", "seq_len",
                 "did you mean \"seq_lens\"");
    expect_error(A, qkv(5, 5, "{\"seq_lens_context\": [5]}"), 400, "unknown_field",
                 "seq_lens_context", "/v1/multihead");
    /* null is the default: no ragged batch */
    json_t *j = post(A, qkv(5, 5, "{\"seq_lens\": null, \"seq_lens_k\": null}"), 200);
    ck_assert_ptr_null(json_object_get(json_object_get(json_object_get(j, "meta"), "shape"),
                                       "sequences"));
    json_decref(j);
}
END_TEST

/* x [n, 2] (rank 2, or [B, n, 2]), w_q = w_k = w_v [2, 2], one head, plus `extra`. */
static json_t *mha(int64_t batch, int64_t n, int64_t m, const char *extra)
{
    const int64_t s3[3] = {batch, n, 2}, c3[3] = {batch, m, 2}, w2[2] = {2, 2};
    float *x = rnd_floats((batch > 0 ? batch : 1) * (n > m ? n : m) * 2), *w = rnd_floats(4);
    int rank = batch > 0 ? 3 : 2;
    const int64_t *sx = batch > 0 ? s3 : s3 + 1, *sc = batch > 0 ? c3 : c3 + 1;
    json_t *j = json_pack("{s:o,s:o,s:o,s:o,s:i}", "x", tensor(x, rank, sx), "w_q",
                          tensor(w, 2, w2), "w_k", tensor(w, 2, w2), "w_v", tensor(w, 2, w2),
                          "num_heads", 1);
    if (m > 0)
        json_object_set_new(j, "context", tensor(x, rank, sc));
    json_t *more = json_loads(extra, 0, NULL);
    ck_assert_msg(more != NULL, "bad test body: %s", extra);
    json_object_update(j, more);
    json_decref(more);
    free(x), free(w);
    return j;
}

START_TEST(multihead_errors_name_the_field_and_the_numbers)
{
    const api_op M = API_OP_MULTIHEAD;
    expect_error(M, mha(0, 4, 0, "{\"seq_lens\": [1, 2]}"), 422, "shape_mismatch", "seq_lens",
                 "seq_lens sums to 3 but x has n = 4");
    expect_error(M, mha(0, 4, 6, "{\"seq_lens\": [1, 3], \"seq_lens_context\": [1, 1]}"), 422,
                 "shape_mismatch", "seq_lens_context",
                 "seq_lens_context sums to 2 but context has m = 6");
    expect_error(M, mha(0, 4, 6, "{\"seq_lens\": [1, 3]}"), 422, "shape_mismatch",
                 "seq_lens_context", "context has m = 6 rows but seq_lens sums to 4");
    expect_error(M, mha(0, 4, 0, "{\"seq_lens\": [4], \"seq_lens_context\": [4]}"), 422,
                 "invalid_value", "seq_lens_context", "there is no context");
    expect_error(M, mha(0, 4, 4, "{\"seq_lens_context\": [4]}"), 422, "invalid_value",
                 "seq_lens_context", "seq_lens_context needs seq_lens");
    expect_error(M, mha(0, 4, 0, "{\"seq_lens\": [5, -1]}"), 422, "invalid_value", "seq_lens",
                 "seq_lens[1] is -1");
    expect_error(M, mha(2, 4, 0, "{\"seq_lens\": [4, 4]}"), 422, "invalid_value", "seq_lens",
                 "batch dimension of 2");
    expect_error(M, mha(0, 4, 0, "{\"seq_lens\": [1, 3], \"mask\": [[true, false]]}"), 422,
                 "shape_mismatch", "mask", "packed rows and keys");
    expect_error(M, mha(0, 4, 0, "{\"seq_lens\": 4}"), 400, "wrong_type", "seq_lens",
                 "seq_lens");
    expect_error(M, mha(0, 4, 4, "{\"seq_lens\": [4], \"seq_lens_k\": [4]}"), 400,
                 "unknown_field", "seq_lens_k", "/v1/attention");
}
END_TEST

/* ----------------------------------------------------------------- cost */

static api_cost cost_of(api_op op, json_t *body)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    api_cost cost;
    api_response res;
    api_call *c = api_prepare(op, text, strlen(text), &LIM, &cost, &res);
    ck_assert_msg(c != NULL, "refused: %s", res.body);
    api_call_free(c);
    free(text);
    return cost;
}

START_TEST(flops_and_work_count_only_the_blocks)
{
    /* 40 sequences of 1 .. 40 rows (820 in all), 8 heads of d = 1 (the
     * scores' cost, not the body's): the blocks are sum l^2 = 22140 pairs
     * a head of 820^2 = 672400. */
    enum { S = 40, H = 8, D = 1, N = S * (S + 1) / 2 };
    int64_t len[S];
    double pairs = 0;
    for (int i = 0; i < S; i++) {
        len[i] = i + 1;
        pairs += (double)len[i] * (double)len[i];
    }
    const int64_t s3[3] = {H, N, D};
    float *x = rnd_floats(H * N * D);
    json_t *packed = json_pack("{s:o,s:o,s:o,s:o,s:s}", "q", tensor(x, 3, s3), "k",
                               tensor(x, 3, s3), "v", tensor(x, 3, s3), "seq_lens",
                               lengths(len, S), "output_encoding", "base64");
    json_t *dense = json_pack("{s:o,s:o,s:o,s:s}", "q", tensor(x, 3, s3), "k", tensor(x, 3, s3),
                              "v", tensor(x, 3, s3), "output_encoding", "base64");
    char *packed_text = json_dumps(packed, JSON_COMPACT);
    api_cost c_packed = cost_of(API_OP_ATTENTION, packed);
    api_cost c_dense = cost_of(API_OP_ATTENTION, dense);
    ck_assert_double_eq(c_packed.flops, 2.0 * H * pairs * (D + D));
    ck_assert_msg(c_packed.work < c_dense.work / 4, "work %g of the dense %g", c_packed.work,
                  c_dense.work);
    /* A limit between the two admits the packed batch and refuses padding. */
    api_limits lim = {.max_work = (c_packed.work + c_dense.work) / 2, .threads = 2};
    api_response res;
    api_handle(API_OP_ATTENTION, packed_text, strlen(packed_text), &lim, &res);
    ck_assert_msg(res.status == 200, "%s", res.body);
    json_t *j = json_loadb(res.body, res.body_len, 0, NULL);
    ck_assert_double_eq(json_number_value(json_object_get(json_object_get(j, "meta"), "flops")),
                        c_packed.flops);
    json_decref(j);
    api_response_free(&res);
    free(packed_text);
    /* The multi-head route counts its attention the same way. */
    int64_t two[2] = {300, 1};
    api_cost mh = cost_of(API_OP_MULTIHEAD, mha(0, 301, 0, "{}"));
    json_t *mh_packed = mha(0, 301, 0, "{}");
    json_object_set_new(mh_packed, "seq_lens", lengths(two, 2));
    api_cost mh_ragged = cost_of(API_OP_MULTIHEAD, mh_packed);
    /* attention 2 * 1 head * pairs * (d_k + d_v): 301^2 dense, 300^2 + 1 packed */
    ck_assert_double_eq(mh.flops - mh_ragged.flops, 2.0 * (301.0 * 301 - 300.0 * 300 - 1) * 4);
    free(x);
}
END_TEST

START_TEST(weights_are_the_whole_matrix_within_max_response)
{
    /* 40 sequences of 1 .. 40 rows (820), one head: the blocks hold 22140
     * weights, the matrix sent 820^2 = 672400 (2.7 MB as base64 float32).
     * --max-response judges the matrix sent, zeros included. */
    enum { S = 40, N = S * (S + 1) / 2 };
    int64_t len[S];
    for (int i = 0; i < S; i++)
        len[i] = i + 1;
    const int64_t s2[2] = {N, 2};
    float *x = rnd_floats(N * 2);
    json_t *body = json_pack("{s:o,s:o,s:o,s:o,s:b,s:s}", "q", tensor(x, 2, s2), "k",
                             tensor(x, 2, s2), "v", tensor(x, 2, s2), "seq_lens",
                             lengths(len, S), "return_weights", 1, "output_encoding", "base64");
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    const double matrix_b64 = 4.0 * N * N * 4 / 3;
    const struct {
        double limit;
        int status;
    } cases[] = {{matrix_b64 / 2, 422}, {matrix_b64 * 1.5, 200}};
    for (size_t i = 0; i < 2; i++) {
        api_limits lim = {.max_response = cases[i].limit, .threads = 2};
        api_response res;
        api_handle(API_OP_ATTENTION, text, strlen(text), &lim, &res);
        ck_assert_msg(res.status == cases[i].status, "limit %g: status %d: %.300s",
                      cases[i].limit, res.status, res.body);
        json_t *j = json_loadb(res.body, res.body_len, 0, NULL);
        ck_assert_ptr_nonnull(j);
        if (cases[i].status == 422) {
            json_t *e = error_of(j);
            ck_assert_str_eq(json_string_value(json_object_get(e, "code")), "response_too_large");
        } else {
            /* The whole [n, n] matrix came back, zeros outside the blocks. */
            json_t *w = json_object_get(j, "weights");
            json_t *shape = json_object_get(w, "shape");
            ck_assert_int_eq(json_integer_value(json_array_get(shape, 0)), N);
            ck_assert_int_eq(json_integer_value(json_array_get(shape, 1)), N);
            ck_assert_int_ge((long long)strlen(json_string_value(json_object_get(w, "base64"))),
                             (long long)(matrix_b64 - 4));
        }
        json_decref(j);
        api_response_free(&res);
    }
    free(text);
    free(x);
}
END_TEST

/* ------------------------------------------------------------------ /v2 */

/* A /v2 infer body (text) through api_prepare_oip and api_execute: the
 * parsed answer, status checked. */
static json_t *post_oip(const char *text, int status)
{
    api_cost cost;
    api_response res;
    api_call *c = api_prepare_oip(API_OP_ATTENTION, text, strlen(text), NULL, &LIM, &cost, &res);
    if (c != NULL)
        api_execute(c, LIM.threads, &res);
    json_error_t je;
    json_t *j = json_loadb(res.body, res.body_len, 0, &je);
    ck_assert_msg(j != NULL, "answer is not JSON: %s", je.text);
    ck_assert_msg(res.status == status, "status %d, wanted %d: %.*s", res.status, status,
                  (int)(res.body_len < 600 ? res.body_len : 600), res.body);
    api_response_free(&res);
    return j;
}

/* The flat data of q, k and v ([n, 2] each, the same rows) in datatype dt,
 * with the parameters given. */
static char *oip_body(const char *params, const char *dt, const float *x, int n)
{
    char data[1024] = "", *at = data;
    for (int i = 0; i < 2 * n; i++)
        at += snprintf(at, sizeof data - (size_t)(at - data), "%s%.9g", i ? "," : "",
                       (double)x[i]);
    char *body = malloc(4096);
    char in[1200];
    snprintf(in, sizeof in, "\"shape\":[%d,2],\"datatype\":\"%s\",\"data\":[%s]}", n, dt, data);
    snprintf(body, 4096,
             "{\"parameters\":%s,\"inputs\":[{\"name\":\"q\",%s,{\"name\":\"k\",%s,"
             "{\"name\":\"v\",%s]}",
             params, in, in, in);
    return body;
}

START_TEST(v2_infer_takes_seq_lens_as_parameters)
{
    /* 7 rows in sequences of 3, 0 and 4 queries over 2, 1 and 4 keys (the
     * keys are the first 7 rows too); values multiples of 1/8, exact in
     * bfloat16, so that BF16 inputs (widened: the precision is float32
     * unless the request asks for bfloat16) give the FP32 answer's bits. */
    enum { N = 7 };
    float x[2 * N];
    for (int i = 0; i < 2 * N; i++)
        x[i] = (float)((i * 5) % 11 - 5) / 8.0f;
    const char *params = "{\"seq_lens\":[3,0,4],\"seq_lens_k\":[2,1,4],\"causal\":true}";
    char *b32 = oip_body(params, "FP32", x, N), *b16 = oip_body(params, "BF16", x, N);
    json_t *a32 = post_oip(b32, 200), *a16 = post_oip(b16, 200);
    json_t *out32 = json_object_get(json_array_get(json_object_get(a32, "outputs"), 0), "data");
    json_t *out16 = json_object_get(json_array_get(json_object_get(a16, "outputs"), 0), "data");
    ck_assert_msg(json_array_size(out32) == 2 * N, "%zu numbers", json_array_size(out32));
    ck_assert_msg(json_equal(out32, out16), "BF16 inputs answer otherwise than FP32 ones");

    /* /v1 with the same lengths: the same numbers. */
    const int64_t s2[2] = {N, 2};
    const int64_t lq[3] = {3, 0, 4}, lk[3] = {2, 1, 4};
    json_t *v1 = post(API_OP_ATTENTION,
                      json_pack("{s:o,s:o,s:o,s:o,s:o,s:b}", "q", tensor(x, 2, s2), "k",
                                tensor(x, 2, s2), "v", tensor(x, 2, s2), "seq_lens",
                                lengths(lq, 3), "seq_lens_k", lengths(lk, 3), "causal", 1),
                      200);
    json_t *rows = json_object_get(v1, "output");
    for (int i = 0; i < N; i++)
        for (int d = 0; d < 2; d++) {
            double a = json_number_value(json_array_get(json_array_get(rows, (size_t)i), (size_t)d));
            double b = json_number_value(json_array_get(out32, (size_t)(2 * i + d)));
            ck_assert_msg(a == b, "row %d column %d: /v1 %g, /v2 %g", i, d, a, b);
        }

    /* Lengths that do not add up are the /v1 error, naming seq_lens. */
    char *bad = oip_body("{\"seq_lens\":[3,5]}", "FP32", x, N);
    json_t *e = post_oip(bad, 422);
    const char *msg = json_string_value(json_object_get(e, "error"));
    ck_assert_msg(msg != NULL && strstr(msg, "seq_lens") != NULL, "%s", msg ? msg : "(none)");
    json_decref(e);
    json_decref(v1);
    json_decref(a32);
    json_decref(a16);
    free(b32);
    free(b16);
    free(bad);
}
END_TEST

static Suite *ragged_api_suite(void)
{
    Suite *s = suite_create("ragged_api");
    TCase *tc = tcase_create("routes");
    tcase_set_tags(tc, "kernel"); /* numbers: again on each kernel (run-suites.sh) */
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, attention_each_sequence_is_the_sequence_sent_alone);
    tcase_add_test(tc, attention_seq_lens_alone_splits_the_keys_alike);
    tcase_add_test(tc, attention_thousands_of_one_row_sequences);
    tcase_add_test(tc, attention_rank4_with_one_batch_entry);
    tcase_add_test(tc, multihead_each_sequence_is_the_sequence_sent_alone);
    tcase_add_test(tc, v2_infer_takes_seq_lens_as_parameters);
    suite_add_tcase(s, tc);
    tc = tcase_create("errors");
    tcase_add_test(tc, attention_errors_name_the_field_and_the_numbers);
    tcase_add_test(tc, multihead_errors_name_the_field_and_the_numbers);
    suite_add_tcase(s, tc);
    tc = tcase_create("cost");
    tcase_add_test(tc, flops_and_work_count_only_the_blocks);
    tcase_add_test(tc, weights_are_the_whole_matrix_within_max_response);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(ragged_api_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
