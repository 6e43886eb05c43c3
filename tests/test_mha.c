/*
 * Suite "mha": multi-head attention (attn_mha_forward / attn_mha_backward /
 * attn_mha_flops) against an independent plain-loop double-precision
 * reference written here (projections, per-head softmax attention with the
 * bottom-right causal mask and an explicit mask, concatenation, output
 * projection), and its gradients against central finite differences of that
 * reference.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "support/ref.h"
#include "support/worst.h"

/* Forward: max |impl - ref| <= FWD_TOL * max(1, max |ref|). float32 sums of a
 * few dozen terms are good to ~1e-6; a missing scale or a transposed weight
 * is off by more than 1e-2. */
#define FWD_TOL 1e-4
/* Gradients: max |impl - fd| <= GRAD_TOL * max(max |fd|, max |impl|, 1e-3). */
#define GRAD_TOL 2e-3
/* Central differences in double: truncation ~h², rounding ~1e-16/h. */
#define FD_STEP 1e-5

/* ------------------------------------------------------------ problems */

enum { T_X, T_CTX, T_WQ, T_WK, T_WV, T_WO, T_BQ, T_BK, T_BV, T_BO, T_COUNT };
static const char *const tensor_name[T_COUNT] = {
    "x", "context", "w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o",
};

typedef struct {
    int64_t B, n, m, d_model, d_ctx, h, hk, d_k, d_v, d_out;
    bool context, w_o, b_q, b_k, b_v, b_o, causal;
    attn_mask_kind mask;
    int64_t mask_shape[4]; /* each dimension 1 (broadcast) or full */
    double mask_keep;      /* boolean mask: probability of true */
    int threads;
    uint64_t seed;
    attn_variants var; /* applied per head (the reference: tests/support/ref.c) */
    attn_precision precision; /* of the attention between the projections */
} spec;

typedef struct {
    float *f;  /* what the implementation reads */
    double *d; /* the same values, what the reference reads (and perturbs) */
    int64_t len;
} tensor;

typedef struct {
    spec s;
    float scale; /* the same float for both sides */
    tensor t[T_COUNT];
    uint8_t *allowed; /* boolean mask over mask_shape */
    float *bias;      /* numeric mask over mask_shape */
    int64_t mask_len;
} problem;

static uint64_t rng;

static double urand(void)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng >> 11) / 9007199254740992.0; /* [0, 1) */
}

static double srand1(void) { return 2.0 * urand() - 1.0; }

static void tensor_random(tensor *t, int64_t len, double amplitude)
{
    t->len = len;
    t->f = malloc((size_t)len * sizeof(float));
    t->d = malloc((size_t)len * sizeof(double));
    ck_assert(t->f && t->d);
    for (int64_t i = 0; i < len; i++) {
        t->f[i] = (float)(amplitude * srand1());
        t->d[i] = t->f[i];
    }
}

static spec base_spec(void)
{
    return (spec){.B = 2, .n = 4, .m = 4, .d_model = 6, .d_ctx = 6, .h = 4, .hk = 4,
                  .d_k = 3, .d_v = 2, .d_out = 5, .w_o = true, .b_q = true,
                  .b_k = true, .b_v = true, .b_o = true,
                  .mask_shape = {1, 1, 1, 1}, .mask_keep = 0.7, .threads = 1,
                  .seed = 1};
}

static spec cross_spec(void)
{
    spec s = base_spec();
    s.context = true;
    s.m = 7;
    s.d_ctx = 5;
    return s;
}

static void problem_make(problem *pr, spec s)
{
    memset(pr, 0, sizeof *pr);
    if (!s.context) {
        s.m = s.n;
        s.d_ctx = s.d_model;
    }
    if (!s.w_o) {
        s.d_out = s.h * s.d_v;
        s.b_o = false;
    }
    pr->s = s;
    pr->scale = (float)(1.0 / sqrt((double)s.d_k));
    rng = s.seed * 0x9E3779B97F4A7C15ULL + 12345;
    tensor_random(&pr->t[T_X], s.B * s.n * s.d_model, 1.0);
    if (s.context)
        tensor_random(&pr->t[T_CTX], s.B * s.m * s.d_ctx, 1.0);
    tensor_random(&pr->t[T_WQ], s.d_model * s.h * s.d_k, 0.8);
    tensor_random(&pr->t[T_WK], s.d_ctx * s.hk * s.d_k, 0.8);
    tensor_random(&pr->t[T_WV], s.d_ctx * s.hk * s.d_v, 0.8);
    if (s.w_o)
        tensor_random(&pr->t[T_WO], s.h * s.d_v * s.d_out, 0.8);
    if (s.b_q)
        tensor_random(&pr->t[T_BQ], s.h * s.d_k, 0.5);
    if (s.b_k)
        tensor_random(&pr->t[T_BK], s.hk * s.d_k, 0.5);
    if (s.b_v)
        tensor_random(&pr->t[T_BV], s.hk * s.d_v, 0.5);
    if (s.b_o)
        tensor_random(&pr->t[T_BO], s.d_out, 0.5);

    if (s.mask != ATTN_MASK_NONE) {
        const int64_t full[4] = {s.B, s.h, s.n, s.m};
        pr->mask_len = 1;
        for (int d = 0; d < 4; d++) {
            ck_assert(s.mask_shape[d] == 1 || s.mask_shape[d] == full[d]);
            pr->mask_len *= s.mask_shape[d];
        }
        pr->allowed = malloc((size_t)pr->mask_len);
        pr->bias = malloc((size_t)pr->mask_len * sizeof(float));
        ck_assert(pr->allowed && pr->bias);
        for (int64_t i = 0; i < pr->mask_len; i++) {
            pr->allowed[i] = urand() < s.mask_keep;
            pr->bias[i] = (float)(2.0 * srand1());
        }
    }
}

static void problem_free(problem *pr)
{
    for (int i = 0; i < T_COUNT; i++) {
        free(pr->t[i].f);
        free(pr->t[i].d);
    }
    free(pr->allowed);
    free(pr->bias);
}

static attn_mha_params params_of(const problem *pr)
{
    const spec *s = &pr->s;
    attn_mha_params p = {
        .batch = s->B, .n = s->n, .m = s->m, .d_model = s->d_model, .d_ctx = s->d_ctx,
        .heads = s->h, .kv_heads = s->hk, .d_k = s->d_k, .d_v = s->d_v,
        .d_out = s->d_out, .scale = pr->scale, .causal = s->causal,
        .threads = s->threads, .variants = s->var, .precision = s->precision,
    };
    p.mask.kind = s->mask;
    if (s->mask != ATTN_MASK_NONE) {
        p.mask.allowed = pr->allowed;
        p.mask.bias = pr->bias;
        /* A broadcast dimension has stride 0. */
        int64_t stride = 1;
        for (int d = 3; d >= 0; d--) {
            p.mask.stride[d] = s->mask_shape[d] == 1 ? 0 : stride;
            stride *= s->mask_shape[d];
        }
    }
    return p;
}

static attn_mha_inputs inputs_of(const problem *pr)
{
    return (attn_mha_inputs){
        .x = pr->t[T_X].f, .context = pr->t[T_CTX].f, .w_q = pr->t[T_WQ].f,
        .w_k = pr->t[T_WK].f, .w_v = pr->t[T_WV].f, .w_o = pr->t[T_WO].f,
        .b_q = pr->t[T_BQ].f, .b_k = pr->t[T_BK].f, .b_v = pr->t[T_BV].f,
        .b_o = pr->t[T_BO].f,
    };
}

/* ----------------------------------------------------------- reference */

typedef struct {
    double scores_sum, scores_sq, entropy_sum, entropy_min, entropy_max, max_weight_sum;
    int64_t scores_count, rows_count;
} ref_stats;

/* Element (b, head, i, j) of the mask, read from its own broadcast shape. */
static int64_t mask_index(const spec *s, int64_t b, int64_t head, int64_t i, int64_t j)
{
    const int64_t at[4] = {b, head, i, j};
    int64_t index = 0;
    for (int d = 0; d < 4; d++)
        index = index * s->mask_shape[d] + (s->mask_shape[d] == 1 ? 0 : at[d]);
    return index;
}

/* y [rows, cols] = a [rows, inner] · w [inner, cols] + bias (bias may be NULL) */
static void ref_matmul(const double *a, const double *w, const double *bias,
                       int64_t rows, int64_t inner, int64_t cols, double *y)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            double sum = bias ? bias[c] : 0.0;
            for (int64_t t = 0; t < inner; t++)
                sum += a[r * inner + t] * w[t * cols + c];
            y[r * cols + c] = sum;
        }
}

static bool has_variants(const spec *s)
{
    return s->var.window || s->var.alibi_slopes || s->var.softcap > 0.0f ||
           s->var.rope_base > 0.0f;
}

/* With the variants, the heads of batch b come from the SDPA reference
 * (which implements them from their definitions): q [n, h*d_k], k, v
 * [m, h_kv*d] of this batch in, cat [n, h*d_v] out. No mask here. */
static void heads_by_ref_sdpa(const problem *pr, int64_t b, const double *q, const double *k,
                              const double *v, double *cat)
{
    const spec *s = &pr->s;
    attn_sdpa_params p = {.batch = 1, .heads_q = s->h, .heads_kv = s->hk, .n_q = s->n,
                          .n_k = s->m, .d_k = s->d_k, .d_v = s->d_v, .scale = pr->scale,
                          .causal = s->causal, .variants = s->var, .threads = 1};
    if (s->var.alibi_slopes != NULL && s->var.alibi_batch_stride != 0)
        p.variants.alibi_slopes += b * s->var.alibi_batch_stride;
    double *qh = malloc((size_t)(s->h * s->n * s->d_k) * sizeof *qh);
    double *kh = malloc((size_t)(s->hk * s->m * s->d_k) * sizeof *kh);
    double *vh = malloc((size_t)(s->hk * s->m * s->d_v) * sizeof *vh);
    double *oh = malloc((size_t)(s->h * s->n * s->d_v) * sizeof *oh);
    if (!(qh && kh && vh && oh)) /* not ck_assert: this runs for every finite difference */
        ck_abort_msg("out of memory");
    for (int64_t h = 0; h < s->h; h++)
        for (int64_t i = 0; i < s->n; i++)
            for (int64_t t = 0; t < s->d_k; t++)
                qh[(h * s->n + i) * s->d_k + t] = q[i * s->h * s->d_k + h * s->d_k + t];
    for (int64_t h = 0; h < s->hk; h++)
        for (int64_t j = 0; j < s->m; j++) {
            for (int64_t t = 0; t < s->d_k; t++)
                kh[(h * s->m + j) * s->d_k + t] = k[j * s->hk * s->d_k + h * s->d_k + t];
            for (int64_t t = 0; t < s->d_v; t++)
                vh[(h * s->m + j) * s->d_v + t] = v[j * s->hk * s->d_v + h * s->d_v + t];
        }
    ref_sdpa_forward(&p, qh, kh, vh, oh, NULL, NULL);
    for (int64_t h = 0; h < s->h; h++)
        for (int64_t i = 0; i < s->n; i++)
            for (int64_t t = 0; t < s->d_v; t++)
                cat[i * s->h * s->d_v + h * s->d_v + t] = oh[(h * s->n + i) * s->d_v + t];
    free(qh);
    free(kh);
    free(vh);
    free(oh);
}

/*
 * out [B, n, d_out]; weights [B, h, n, m] and stats when not NULL.
 * Plain loops over the chapter's definitions: Q = X W_Q + b_Q, head i uses
 * columns i*d_k.. of Q and columns j*d_k.. of K, V with j = i / (h / h_kv).
 */
static void ref_forward(const problem *pr, double *out, double *weights, ref_stats *st)
{
    const spec *s = &pr->s;
    const double *x = pr->t[T_X].d;
    const double *ctx = s->context ? pr->t[T_CTX].d : x;
    int64_t hdk = s->h * s->d_k, kdk = s->hk * s->d_k, kdv = s->hk * s->d_v;
    int64_t hdv = s->h * s->d_v, group = s->h / s->hk;
    double *q = malloc((size_t)(s->n * hdk) * sizeof(double));
    double *k = malloc((size_t)(s->m * kdk) * sizeof(double));
    double *v = malloc((size_t)(s->m * kdv) * sizeof(double));
    double *cat = malloc((size_t)(s->n * hdv) * sizeof(double));
    double *row = malloc((size_t)s->m * sizeof(double));
    if (!(q && k && v && cat && row)) /* not ck_assert: this runs for every finite difference */
        ck_abort_msg("out of memory");
    if (st) {
        memset(st, 0, sizeof *st);
        st->entropy_min = INFINITY;
        st->entropy_max = -INFINITY;
    }

    for (int64_t b = 0; b < s->B; b++) {
        ref_matmul(x + b * s->n * s->d_model, pr->t[T_WQ].d, pr->t[T_BQ].d, s->n,
                   s->d_model, hdk, q);
        ref_matmul(ctx + b * s->m * s->d_ctx, pr->t[T_WK].d, pr->t[T_BK].d, s->m,
                   s->d_ctx, kdk, k);
        ref_matmul(ctx + b * s->m * s->d_ctx, pr->t[T_WV].d, pr->t[T_BV].d, s->m,
                   s->d_ctx, kdv, v);
        if (has_variants(s)) {
            heads_by_ref_sdpa(pr, b, q, k, v, cat);
            goto output;
        }
        for (int64_t head = 0; head < s->h; head++) {
            int64_t kvh = head / group;
            for (int64_t i = 0; i < s->n; i++) {
                double top = -INFINITY;
                for (int64_t j = 0; j < s->m; j++) {
                    bool visible = !s->causal || j <= i + (s->m - s->n);
                    double bias = 0.0;
                    if (s->mask == ATTN_MASK_BOOL)
                        visible = visible && pr->allowed[mask_index(s, b, head, i, j)];
                    if (s->mask == ATTN_MASK_BIAS)
                        bias = pr->bias[mask_index(s, b, head, i, j)];
                    if (!visible) {
                        row[j] = -INFINITY;
                        continue;
                    }
                    double score = 0.0;
                    for (int64_t t = 0; t < s->d_k; t++)
                        score += q[i * hdk + head * s->d_k + t] * k[j * kdk + kvh * s->d_k + t];
                    if (st) {
                        st->scores_sum += score;
                        st->scores_sq += score * score;
                        st->scores_count++;
                    }
                    row[j] = (double)pr->scale * score + bias;
                    top = fmax(top, row[j]);
                }
                double z = 0.0;
                for (int64_t j = 0; j < s->m; j++) {
                    row[j] = row[j] == -INFINITY ? 0.0 : exp(row[j] - top);
                    z += row[j];
                }
                double entropy = 0.0, largest = 0.0;
                for (int64_t j = 0; j < s->m; j++) {
                    row[j] = z > 0.0 ? row[j] / z : 0.0; /* fully masked: zeros */
                    if (row[j] > 0.0)
                        entropy -= row[j] * log(row[j]);
                    largest = fmax(largest, row[j]);
                    if (weights)
                        weights[((b * s->h + head) * s->n + i) * s->m + j] = row[j];
                }
                if (st && z > 0.0) {
                    st->rows_count++;
                    st->entropy_sum += entropy;
                    st->entropy_min = fmin(st->entropy_min, entropy);
                    st->entropy_max = fmax(st->entropy_max, entropy);
                    st->max_weight_sum += largest;
                }
                for (int64_t t = 0; t < s->d_v; t++) {
                    double sum = 0.0;
                    for (int64_t j = 0; j < s->m; j++)
                        sum += row[j] * v[j * kdv + kvh * s->d_v + t];
                    cat[i * hdv + head * s->d_v + t] = sum;
                }
            }
        }
    output:;
        double *ob = out + b * s->n * s->d_out;
        if (s->w_o)
            ref_matmul(cat, pr->t[T_WO].d, pr->t[T_BO].d, s->n, hdv, s->d_out, ob);
        else
            memcpy(ob, cat, (size_t)(s->n * hdv) * sizeof(double));
    }
    free(q);
    free(k);
    free(v);
    free(cat);
    free(row);
}

static int64_t out_len(const problem *pr) { return pr->s.B * pr->s.n * pr->s.d_out; }

static int64_t weights_len(const problem *pr)
{
    return pr->s.B * pr->s.h * pr->s.n * pr->s.m;
}

/* The scalar whose gradient the backward pass computes: Σ dout · out. */
static double ref_loss(const problem *pr, const float *dout)
{
    int64_t len = out_len(pr);
    double *out = malloc((size_t)len * sizeof(double));
    if (!out) /* not ck_assert: this runs for every finite difference */
        ck_abort_msg("out of memory");
    ref_forward(pr, out, NULL, NULL);
    double loss = 0.0;
    for (int64_t i = 0; i < len; i++)
        loss += (double)dout[i] * out[i];
    free(out);
    return loss;
}

/* ------------------------------------------------------------- helpers */

/*
 * bfloat16 precision (the attention's products on operands rounded to 8
 * significant bits, unit roundoff U_BF16; the projections float32) against
 * the exact reference. Rounding q and k moves a score by at most delta =
 * 2 U_BF16 scale sum_t |q_t k_t| (the largest over the problem, from the
 * projections in double), so each softmax weight by a factor within
 * e^(+-2 delta); rounding the weights and renormalising by their own sum
 * moves them by 2 U_BF16 more: sum_j |da_j| <= alpha = 2 (e^(2 delta) - 1)
 * + 2 U_BF16 over a row. A head's output sum_j a_j v_j then moves by at
 * most (alpha + U_BF16) max |v| (v rounded too), and the output projection
 * carries that through sum_c |W_O[c][col]|. The gradients are sums of
 * products of such weights (and of dS = P (dP - delta), which meets the
 * weights' error twice) with at most two more rounded factors: within
 * 4 (alpha + 2 U_BF16) of their largest magnitude (the 4 covers the two
 * meetings and the second-order terms dropped above).
 */
#define U_BF16 0x1p-8

static double max_abs_d(const double *a, int64_t len);

typedef struct {
    double alpha, vmax, wo_sum; /* as above; wo_sum 1 without w_o */
} bf16_bound;

static bf16_bound bf16_bound_of(const problem *pr)
{
    const spec *s = &pr->s;
    const double *ctx = s->context ? pr->t[T_CTX].d : pr->t[T_X].d;
    double *q = malloc((size_t)(s->B * s->n * s->h * s->d_k) * sizeof(double));
    double *k = malloc((size_t)(s->B * s->m * s->hk * s->d_k) * sizeof(double));
    double *v = malloc((size_t)(s->B * s->m * s->hk * s->d_v) * sizeof(double));
    ck_assert(q && k && v);
    ref_matmul(pr->t[T_X].d, pr->t[T_WQ].d, s->b_q ? pr->t[T_BQ].d : NULL, s->B * s->n,
               s->d_model, s->h * s->d_k, q);
    ref_matmul(ctx, pr->t[T_WK].d, s->b_k ? pr->t[T_BK].d : NULL, s->B * s->m, s->d_ctx,
               s->hk * s->d_k, k);
    ref_matmul(ctx, pr->t[T_WV].d, s->b_v ? pr->t[T_BV].d : NULL, s->B * s->m, s->d_ctx,
               s->hk * s->d_v, v);
    double big = 0.0;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->h; h++)
            for (int64_t i = 0; i < s->n; i++)
                for (int64_t j = 0; j < s->m; j++) {
                    const int64_t g = h / (s->h / s->hk);
                    double sum = 0.0;
                    for (int64_t t = 0; t < s->d_k; t++)
                        sum += fabs(q[((b * s->n + i) * s->h + h) * s->d_k + t] *
                                    k[((b * s->m + j) * s->hk + g) * s->d_k + t]);
                    big = fmax(big, sum);
                }
    const double delta = 2.0 * U_BF16 * (double)pr->scale * big;
    bf16_bound r = {.alpha = 2.0 * expm1(2.0 * delta) + 2.0 * U_BF16,
                    .vmax = max_abs_d(v, s->B * s->m * s->hk * s->d_v), .wo_sum = 1.0};
    if (s->w_o) {
        r.wo_sum = 0.0;
        for (int64_t col = 0; col < s->d_out; col++) {
            double sum = 0.0;
            for (int64_t c = 0; c < s->h * s->d_v; c++)
                sum += fabs(pr->t[T_WO].d[c * s->d_out + col]);
            r.wo_sum = fmax(r.wo_sum, sum);
        }
    }
    free(q), free(k), free(v);
    return r;
}

static bool verbose(void) { return getenv("ATTN_TEST_VERBOSE") != NULL; }

static double max_abs_d(const double *a, int64_t len)
{
    double m = 0.0;
    for (int64_t i = 0; i < len; i++)
        m = fmax(m, fabs(a[i]));
    return m;
}

static double max_abs_f(const float *a, int64_t len)
{
    double m = 0.0;
    for (int64_t i = 0; i < len; i++)
        m = fmax(m, fabs((double)a[i]));
    return m;
}

/* Runs the forward pass and checks `out` against the reference; returns the
 * relative error. */
static double check_forward(const problem *pr, const char *what)
{
    int64_t len = out_len(pr);
    float *out = malloc((size_t)len * sizeof(float));
    double *ref = malloc((size_t)len * sizeof(double));
    ck_assert(out && ref);
    attn_mha_params p = params_of(pr);
    attn_mha_inputs in = inputs_of(pr);
    attn_error err = {0};
    attn_status s = attn_mha_forward(&p, &in, out, NULL, NULL, NULL, &err);
    ck_assert_msg(s == ATTN_OK, "%s: forward failed: %s", what, err.message);
    ref_forward(pr, ref, NULL, NULL);

    /* Relative to the largest reference value; a value not finite is
     * infinitely far. */
    double mag = fmax(1.0, max_abs_d(ref, len));
    worst_elem w = {0};
    for (int64_t i = 0; i < len; i++)
        worst_note(&w, i, out[i], ref[i],
                   isfinite(out[i]) ? fabs((double)out[i] - ref[i]) / mag : INFINITY);
    double tol = FWD_TOL;
    if (pr->s.precision == ATTN_PRECISION_BFLOAT16) {
        const bf16_bound bb = bf16_bound_of(pr);
        tol = ((bb.alpha + U_BF16) * bb.vmax * bb.wo_sum) / mag + FWD_TOL;
    }
    if (verbose())
        fprintf(stderr, "mha forward %-40s rel err %.3g (bound %.3g)\n", what, w.err, tol);
    ck_assert_msg(w.err <= tol, "%s: out[%lld] = %.9g, reference %.9g: error %g > %g", what,
                  w.at, w.got, w.want, w.err, tol);
    free(out);
    free(ref);
    return w.err;
}

static float *random_floats(int64_t len, uint64_t seed)
{
    float *a = malloc((size_t)len * sizeof(float));
    ck_assert(a);
    rng = seed;
    for (int64_t i = 0; i < len; i++)
        a[i] = (float)srand1();
    return a;
}

typedef struct {
    float *g[T_COUNT]; /* buffers, NULL when the gradient is not asked */
} grads;

static attn_mha_grads grads_view(const grads *gr)
{
    return (attn_mha_grads){
        .x = gr->g[T_X], .context = gr->g[T_CTX], .w_q = gr->g[T_WQ],
        .w_k = gr->g[T_WK], .w_v = gr->g[T_WV], .w_o = gr->g[T_WO],
        .b_q = gr->g[T_BQ], .b_k = gr->g[T_BK], .b_v = gr->g[T_BV],
        .b_o = gr->g[T_BO],
    };
}

/* Asks for the gradient of every input the problem has. */
static void grads_alloc_all(const problem *pr, grads *gr)
{
    for (int i = 0; i < T_COUNT; i++) {
        gr->g[i] = NULL;
        if (pr->t[i].len > 0) {
            gr->g[i] = malloc((size_t)pr->t[i].len * sizeof(float));
            ck_assert(gr->g[i]);
            for (int64_t e = 0; e < pr->t[i].len; e++)
                gr->g[i][e] = NAN; /* must be overwritten */
        }
    }
}

static void grads_free(grads *gr)
{
    for (int i = 0; i < T_COUNT; i++)
        free(gr->g[i]);
}

/*
 * Central differences of Σ dout · ref_out with respect to tensor `which`,
 * at every element (samples == 0) or at `samples` random ones, against the
 * implementation's gradient g. Returns the largest relative error.
 */
static double check_grad_fd(problem *pr, const float *dout, int which, const float *g,
                            int samples, double floor, const char *what)
{
    tensor *t = &pr->t[which];
    int64_t count = samples > 0 ? samples : t->len;
    double *fd = malloc((size_t)count * sizeof(double));
    int64_t *at = malloc((size_t)count * sizeof(int64_t));
    ck_assert(fd && at);
    uint64_t saved = rng;
    rng = 777 + (uint64_t)which;
    /* Sampled: the first and the last element (the far edge of every block
     * of work), the rest at random. */
    for (int64_t e = 0; e < count; e++)
        at[e] = samples == 0 ? e
                : e == 0     ? 0
                : e == 1     ? t->len - 1
                             : (int64_t)(urand() * (double)t->len);
    rng = saved;

    for (int64_t e = 0; e < count; e++) {
        double orig = t->d[at[e]];
        t->d[at[e]] = orig + FD_STEP;
        double up = ref_loss(pr, dout);
        t->d[at[e]] = orig - FD_STEP;
        double down = ref_loss(pr, dout);
        t->d[at[e]] = orig;
        fd[e] = (up - down) / (2.0 * FD_STEP);
    }
    /* mag is not finite when g has a value that is not: that counts as
     * infinitely far too. */
    double mag = fmax(fmax(max_abs_d(fd, count), max_abs_f(g, t->len)), floor);
    worst_elem w = {0};
    for (int64_t e = 0; e < count; e++)
        worst_note(&w, at[e], g[at[e]], fd[e],
                   isfinite(g[at[e]]) ? fabs((double)g[at[e]] - fd[e]) / mag : INFINITY);
    double tol = GRAD_TOL;
    if (pr->s.precision == ATTN_PRECISION_BFLOAT16)
        tol += 4.0 * (bf16_bound_of(pr).alpha + 2.0 * U_BF16);
    if (verbose())
        fprintf(stderr, "mha grad    %-32s d%-7s rel err %.3g (max |g| %.3g, bound %.3g)\n",
                what, tensor_name[which], w.err, mag, tol);
    ck_assert_msg(w.err <= tol, "%s: d%s[%lld] = %g but finite differences give %g (error %g > %g)",
                  what, tensor_name[which], w.at, w.got, w.want, w.err, tol);
    free(fd);
    free(at);
    return w.err;
}

/* Backward with every gradient asked, each checked against finite
 * differences. db_k is zero in exact arithmetic (adding the same vector to
 * every key shifts a whole row of scores, and softmax ignores shifts), so
 * what float32 leaves of it is measured against the scale of the other
 * gradients rather than against itself. */
static void check_all_grads(problem *pr, int samples, const char *what)
{
    float *dout = random_floats(out_len(pr), 4242);
    grads gr;
    grads_alloc_all(pr, &gr);
    attn_mha_grads g = grads_view(&gr);
    attn_mha_params p = params_of(pr);
    attn_mha_inputs in = inputs_of(pr);
    attn_error err = {0};
    attn_status s = attn_mha_backward(&p, &in, dout, &g, &err);
    ck_assert_msg(s == ATTN_OK, "%s: backward failed: %s", what, err.message);
    double largest = 0.0;
    for (int i = 0; i < T_COUNT; i++)
        if (gr.g[i])
            largest = fmax(largest, max_abs_f(gr.g[i], pr->t[i].len));
    for (int i = 0; i < T_COUNT; i++)
        if (gr.g[i])
            check_grad_fd(pr, dout, i, gr.g[i], samples, fmax(1e-2 * largest, 1e-3), what);
    grads_free(&gr);
    free(dout);
}

/* ---------------------------------------------------------- forward tests */

START_TEST(self_attention_matches_reference_with_every_bias)
{
    problem pr;
    problem_make(&pr, base_spec());
    check_forward(&pr, "self-attention");
    problem_free(&pr);
}
END_TEST

START_TEST(cross_attention_matches_reference_when_m_ne_n_and_dctx_ne_dmodel)
{
    problem pr;
    problem_make(&pr, cross_spec());
    check_forward(&pr, "cross-attention");
    problem_free(&pr);
}
END_TEST

START_TEST(output_is_the_concatenated_heads_without_w_o)
{
    spec s = cross_spec();
    s.w_o = false;
    problem pr;
    problem_make(&pr, s);
    ck_assert_int_eq(pr.s.d_out, pr.s.h * pr.s.d_v);
    check_forward(&pr, "no w_o");
    problem_free(&pr);
}
END_TEST

START_TEST(each_bias_is_optional)
{
    /* none, then each bias alone */
    for (int which = -1; which < 4; which++) {
        spec s = cross_spec();
        s.b_q = which == 0;
        s.b_k = which == 1;
        s.b_v = which == 2;
        s.b_o = which == 3;
        s.seed = 10 + (uint64_t)(which + 1);
        problem pr;
        problem_make(&pr, s);
        char what[40];
        snprintf(what, sizeof what, "only bias %d (-1: none)", which);
        check_forward(&pr, what);
        problem_free(&pr);
    }
}
END_TEST

START_TEST(grouped_query_two_kv_heads_for_four_heads_matches_reference)
{
    spec s = cross_spec();
    s.hk = 2;
    problem pr;
    problem_make(&pr, s);
    check_forward(&pr, "GQA h=4 h_kv=2");
    problem_free(&pr);
}
END_TEST

START_TEST(multi_query_one_kv_head_matches_reference)
{
    spec s = base_spec();
    s.hk = 1;
    s.h = 3;
    problem pr;
    problem_make(&pr, s);
    check_forward(&pr, "MQA h=3 h_kv=1");
    problem_free(&pr);
}
END_TEST

START_TEST(causal_self_attention_matches_reference)
{
    spec s = base_spec();
    s.causal = true;
    s.n = 6;
    problem pr;
    problem_make(&pr, s);
    check_forward(&pr, "causal self");
    problem_free(&pr);
}
END_TEST

START_TEST(causal_cross_attention_is_aligned_bottom_right_when_n_lt_m)
{
    spec s = cross_spec(); /* n = 4, m = 7 */
    s.causal = true;
    problem pr;
    problem_make(&pr, s);
    check_forward(&pr, "causal cross n<m");

    /* Query i sees keys 0 .. i + (m - n): the first query sees 4 of the 7. */
    float *w = malloc((size_t)weights_len(&pr) * sizeof(float));
    float *out = malloc((size_t)out_len(&pr) * sizeof(float));
    ck_assert(w && out);
    attn_mha_params p = params_of(&pr);
    attn_mha_inputs in = inputs_of(&pr);
    ck_assert_int_eq(attn_mha_forward(&p, &in, out, NULL, w, NULL, NULL), ATTN_OK);
    for (int64_t b = 0; b < pr.s.B; b++)
        for (int64_t head = 0; head < pr.s.h; head++)
            for (int64_t i = 0; i < pr.s.n; i++)
                for (int64_t j = 0; j < pr.s.m; j++) {
                    float a = w[((b * pr.s.h + head) * pr.s.n + i) * pr.s.m + j];
                    if (j > i + (pr.s.m - pr.s.n))
                        ck_assert_msg(a == 0.0f, "key %lld visible to query %lld",
                                      (long long)j, (long long)i);
                    else
                        ck_assert_msg(a > 0.0f, "key %lld hidden from query %lld",
                                      (long long)j, (long long)i);
                }
    free(w);
    free(out);
    problem_free(&pr);
}
END_TEST

START_TEST(boolean_mask_broadcast_over_heads_matches_reference)
{
    spec s = cross_spec();
    s.mask = ATTN_MASK_BOOL;
    s.mask_shape[0] = s.B; /* [B, 1, n, m]: one mask per batch, every head */
    s.mask_shape[2] = s.n;
    s.mask_shape[3] = s.m;
    s.causal = true;
    problem pr;
    problem_make(&pr, s);
    check_forward(&pr, "bool mask [B,1,n,m] + causal");
    problem_free(&pr);
}
END_TEST

START_TEST(numeric_mask_per_head_matches_reference)
{
    spec s = base_spec();
    s.mask = ATTN_MASK_BIAS;
    s.mask_shape[1] = s.h; /* [1, h, n, m]: one bias per head, every batch */
    s.mask_shape[2] = s.n;
    s.mask_shape[3] = s.m;
    problem pr;
    problem_make(&pr, s);
    check_forward(&pr, "bias mask [1,h,n,m]");
    problem_free(&pr);
}
END_TEST

START_TEST(batches_are_computed_independently)
{
    spec s = cross_spec();
    s.causal = true;
    problem pr;
    problem_make(&pr, s);
    check_forward(&pr, "B=2");

    /* Batch 1 alone (B = 1) gives the second half of the B = 2 output. */
    attn_mha_params p = params_of(&pr);
    attn_mha_inputs in = inputs_of(&pr);
    float *both = malloc((size_t)out_len(&pr) * sizeof(float));
    int64_t half = out_len(&pr) / 2;
    float *one = malloc((size_t)half * sizeof(float));
    ck_assert(both && one);
    ck_assert_int_eq(attn_mha_forward(&p, &in, both, NULL, NULL, NULL, NULL), ATTN_OK);
    p.batch = 1;
    in.x += pr.s.n * pr.s.d_model;
    in.context += pr.s.m * pr.s.d_ctx;
    ck_assert_int_eq(attn_mha_forward(&p, &in, one, NULL, NULL, NULL, NULL), ATTN_OK);
    for (int64_t i = 0; i < half; i++)
        ck_assert_float_eq_tol(one[i], both[half + i], 1e-6);
    free(both);
    free(one);
    problem_free(&pr);
}
END_TEST

START_TEST(weights_rows_sum_to_one_and_match_reference)
{
    spec s = cross_spec();
    s.hk = 2;
    s.causal = true;
    problem pr;
    problem_make(&pr, s);
    int64_t wl = weights_len(&pr);
    float *w = malloc((size_t)wl * sizeof(float));
    float *out = malloc((size_t)out_len(&pr) * sizeof(float));
    float *out_plain = malloc((size_t)out_len(&pr) * sizeof(float));
    double *ref_w = malloc((size_t)wl * sizeof(double));
    double *ref_out = malloc((size_t)out_len(&pr) * sizeof(double));
    ck_assert(w && out && out_plain && ref_w && ref_out);
    attn_mha_params p = params_of(&pr);
    attn_mha_inputs in = inputs_of(&pr);
    ck_assert_int_eq(attn_mha_forward(&p, &in, out, NULL, w, NULL, NULL), ATTN_OK);
    ck_assert_int_eq(attn_mha_forward(&p, &in, out_plain, NULL, NULL, NULL, NULL), ATTN_OK);
    ref_forward(&pr, ref_out, ref_w, NULL);

    for (int64_t r = 0; r < wl / pr.s.m; r++) {
        double sum = 0.0;
        for (int64_t j = 0; j < pr.s.m; j++) {
            ck_assert(w[r * pr.s.m + j] >= 0.0f);
            ck_assert_double_eq_tol(w[r * pr.s.m + j], ref_w[r * pr.s.m + j], 1e-5);
            sum += w[r * pr.s.m + j];
        }
        ck_assert_double_eq_tol(sum, 1.0, 1e-5);
    }
    /* Asking for the weights does not change the output. */
    for (int64_t i = 0; i < out_len(&pr); i++)
        ck_assert_float_eq_tol(out[i], out_plain[i], 1e-6);
    free(w);
    free(out);
    free(out_plain);
    free(ref_w);
    free(ref_out);
    problem_free(&pr);
}
END_TEST

START_TEST(stats_cover_every_head_and_batch)
{
    spec s = cross_spec();
    s.hk = 2;
    s.causal = true;
    s.mask = ATTN_MASK_BOOL;
    s.mask_shape[2] = s.n;
    s.mask_shape[3] = s.m;
    problem pr;
    problem_make(&pr, s);
    float *out = malloc((size_t)out_len(&pr) * sizeof(float));
    double *ref_out = malloc((size_t)out_len(&pr) * sizeof(double));
    ck_assert(out && ref_out);
    attn_mha_params p = params_of(&pr);
    attn_mha_inputs in = inputs_of(&pr);
    attn_stats st;
    memset(&st, 0xff, sizeof st);
    ref_stats rs;
    ck_assert_int_eq(attn_mha_forward(&p, &in, out, NULL, NULL, &st, NULL), ATTN_OK);
    ref_forward(&pr, ref_out, NULL, &rs);

    ck_assert_int_eq(st.scores_count, rs.scores_count);
    ck_assert_int_eq(st.rows_count, rs.rows_count);
    ck_assert(rs.scores_count > 0 && rs.rows_count > 0);
    double mean = rs.scores_sum / (double)rs.scores_count;
    double var = rs.scores_sq / (double)rs.scores_count - mean * mean;
    double sc = pr.scale;
    ck_assert_double_eq_tol(st.scores_mean, mean, 1e-4 * fmax(1.0, fabs(mean)));
    ck_assert_double_eq_tol(st.scores_var, var, 1e-4 * fmax(1.0, var));
    ck_assert_double_eq_tol(st.scaled_mean, sc * mean, 1e-4 * fmax(1.0, fabs(mean)));
    ck_assert_double_eq_tol(st.scaled_var, sc * sc * var, 1e-4 * fmax(1.0, var));
    ck_assert_double_eq_tol(st.entropy_mean, rs.entropy_sum / (double)rs.rows_count, 1e-4);
    ck_assert_double_eq_tol(st.entropy_min, rs.entropy_min, 1e-4);
    ck_assert_double_eq_tol(st.entropy_max, rs.entropy_max, 1e-4);
    ck_assert_double_eq_tol(st.max_weight_mean, rs.max_weight_sum / (double)rs.rows_count,
                            1e-4);
    free(out);
    free(ref_out);
    problem_free(&pr);
}
END_TEST

START_TEST(fully_masked_query_gives_zero_heads_and_finite_grads)
{
    spec s = cross_spec();
    s.w_o = false;
    s.mask = ATTN_MASK_BOOL;
    s.mask_shape[2] = s.n;
    s.mask_shape[3] = s.m;
    s.mask_keep = 1.0;
    problem pr;
    problem_make(&pr, s);
    memset(pr.allowed + 2 * pr.s.m, 0, (size_t)pr.s.m); /* query 2 sees nothing */
    check_forward(&pr, "fully masked row");

    float *out = malloc((size_t)out_len(&pr) * sizeof(float));
    ck_assert(out);
    attn_mha_params p = params_of(&pr);
    attn_mha_inputs in = inputs_of(&pr);
    ck_assert_int_eq(attn_mha_forward(&p, &in, out, NULL, NULL, NULL, NULL), ATTN_OK);
    for (int64_t b = 0; b < pr.s.B; b++)
        for (int64_t c = 0; c < pr.s.d_out; c++)
            ck_assert_float_eq(out[(b * pr.s.n + 2) * pr.s.d_out + c], 0.0f);
    free(out);
    check_all_grads(&pr, 0, "fully masked row");
    problem_free(&pr);
}
END_TEST

START_TEST(threads_give_the_same_answer_as_one_thread)
{
    /* Large enough that the projections are split across threads, with
     * several row blocks and several blocks of d_model. */
    spec s = base_spec();
    s.B = 1;
    s.n = 300;
    s.d_model = 200;
    s.h = 4;
    s.hk = 2;
    s.d_k = 32;
    s.d_v = 32;
    s.d_out = 150;
    s.causal = true;
    problem pr;
    problem_make(&pr, s);
    int64_t len = out_len(&pr);
    float *one = malloc((size_t)len * sizeof(float));
    float *many = malloc((size_t)len * sizeof(float));
    float *dout = random_floats(len, 99);
    ck_assert(one && many);
    attn_mha_params p = params_of(&pr);
    attn_mha_inputs in = inputs_of(&pr);
    ck_assert_int_eq(attn_mha_forward(&p, &in, one, NULL, NULL, NULL, NULL), ATTN_OK);
    grads g1, g4;
    grads_alloc_all(&pr, &g1);
    grads_alloc_all(&pr, &g4);
    attn_mha_grads v1 = grads_view(&g1), v4 = grads_view(&g4);
    ck_assert_int_eq(attn_mha_backward(&p, &in, dout, &v1, NULL), ATTN_OK);
    p.threads = 4;
    ck_assert_int_eq(attn_mha_forward(&p, &in, many, NULL, NULL, NULL, NULL), ATTN_OK);
    ck_assert_int_eq(attn_mha_backward(&p, &in, dout, &v4, NULL), ATTN_OK);

    double mag = max_abs_f(one, len);
    worst_elem wo = {0};
    for (int64_t i = 0; i < len; i++)
        worst_note(&wo, i, many[i], one[i], fabs((double)one[i] - many[i]));
    ck_assert_msg(wo.err < 1e-5 * mag, "out[%lld]: %g with 1 thread, %g with 4", wo.at,
                  wo.want, wo.got);
    /* db_k is zero in exact arithmetic (see check_all_grads): what is left
     * of it is rounding, which another summation order (another thread
     * count, OpenBLAS's Haswell kernels) changes entirely; it is held to the
     * scale of the other gradients, as the finite-difference check holds it. */
    double largest = 0.0;
    for (int t = 0; t < T_COUNT; t++)
        if (g1.g[t])
            largest = fmax(largest, max_abs_f(g1.g[t], pr.t[t].len));
    for (int t = 0; t < T_COUNT; t++) {
        if (!g1.g[t])
            continue;
        double gm = t == T_BK ? largest : fmax(max_abs_f(g1.g[t], pr.t[t].len), 1e-6);
        worst_elem wg = {0};
        for (int64_t e = 0; e < pr.t[t].len; e++)
            worst_note(&wg, e, g4.g[t][e], g1.g[t][e], fabs((double)g1.g[t][e] - g4.g[t][e]));
        ck_assert_msg(wg.err <= 1e-4 * gm, "d%s[%lld]: %g with 1 thread, %g with 4",
                      tensor_name[t], wg.at, wg.want, wg.got);
    }
    /* And the threaded answer is still the reference's. */
    pr.s.threads = 4;
    check_forward(&pr, "n=300 d_model=200, 4 threads");
    grads_free(&g1);
    grads_free(&g4);
    free(one);
    free(many);
    free(dout);
    problem_free(&pr);
}
END_TEST

/* -------------------------------------------------------- gradient tests */

START_TEST(grad_self_attention_every_input_matches_finite_differences)
{
    problem pr;
    problem_make(&pr, base_spec());
    check_all_grads(&pr, 0, "self-attention");
    problem_free(&pr);
}
END_TEST

START_TEST(grad_cross_attention_every_input_matches_finite_differences)
{
    problem pr;
    problem_make(&pr, cross_spec());
    check_all_grads(&pr, 0, "cross-attention");
    problem_free(&pr);
}
END_TEST

START_TEST(grad_grouped_query_causal_masked_matches_finite_differences)
{
    spec s = cross_spec();
    s.hk = 2;
    s.causal = true;
    s.mask = ATTN_MASK_BOOL;
    s.mask_shape[0] = s.B;
    s.mask_shape[2] = s.n;
    s.mask_shape[3] = s.m;
    s.mask_keep = 0.8;
    problem pr;
    problem_make(&pr, s);
    check_all_grads(&pr, 0, "GQA causal bool mask");
    problem_free(&pr);
}
END_TEST

START_TEST(grad_multi_query_with_numeric_mask_matches_finite_differences)
{
    spec s = base_spec();
    s.hk = 1;
    s.n = 5;
    s.mask = ATTN_MASK_BIAS;
    s.mask_shape[1] = s.h;
    s.mask_shape[2] = s.n;
    s.mask_shape[3] = s.n;
    s.causal = true;
    problem pr;
    problem_make(&pr, s);
    check_all_grads(&pr, 0, "MQA causal bias mask");
    problem_free(&pr);
}
END_TEST

START_TEST(grad_without_w_o_or_biases_matches_finite_differences)
{
    spec s = cross_spec();
    s.w_o = false;
    s.b_q = s.b_k = s.b_v = false;
    problem pr;
    problem_make(&pr, s);
    check_all_grads(&pr, 0, "no w_o, no biases");

    spec t = base_spec();
    t.w_o = false;
    t.hk = 2;
    problem self;
    problem_make(&self, t);
    check_all_grads(&self, 0, "self, no w_o, GQA");
    problem_free(&self);
    problem_free(&pr);
}
END_TEST

START_TEST(grad_large_problem_across_blocks_matches_finite_differences)
{
    /* More rows than one block and d_model, d_ctx, d_out wider than one
     * block: the blocked products must meet at their edges. Sampled. */
    spec s = cross_spec();
    s.B = 1;
    s.n = 140;
    s.m = 131;
    s.d_model = 136;
    s.d_ctx = 130;
    s.h = 2;
    s.hk = 1;
    s.d_k = 4;
    s.d_v = 4;
    s.d_out = 129;
    s.causal = true;
    s.threads = 2;
    problem pr;
    problem_make(&pr, s);
    check_forward(&pr, "large cross");
    check_all_grads(&pr, 10, "large cross (sampled)");
    problem_free(&pr);
}
END_TEST

START_TEST(concatenation_straddles_blocks_without_w_o)
{
    /* h*d_v = 150 columns, head 2's block crossing column 128, and more
     * rows than one block: the concatenation (and its backward, the split of
     * dout into heads) must meet at the edges of the work units. */
    spec s = base_spec();
    s.n = 130;
    s.d_model = 20;
    s.h = 3;
    s.hk = 3;
    s.d_k = 4;
    s.d_v = 50;
    s.w_o = false;
    s.causal = true;
    s.threads = 2;
    problem pr;
    problem_make(&pr, s);
    check_forward(&pr, "concat 3x50, n=130");
    check_all_grads(&pr, 8, "concat 3x50, n=130 (sampled)");
    problem_free(&pr);
}
END_TEST

START_TEST(only_the_requested_gradients_are_written)
{
    problem pr;
    problem_make(&pr, cross_spec());
    float *dout = random_floats(out_len(&pr), 5);
    grads all;
    grads_alloc_all(&pr, &all);
    attn_mha_grads g = grads_view(&all);
    attn_mha_params p = params_of(&pr);
    attn_mha_inputs in = inputs_of(&pr);
    ck_assert_int_eq(attn_mha_backward(&p, &in, dout, &g, NULL), ATTN_OK);

    /* One gradient at a time gives the same values as all at once. */
    for (int t = 0; t < T_COUNT; t++) {
        if (!all.g[t])
            continue;
        grads one = {{0}};
        one.g[t] = malloc((size_t)pr.t[t].len * sizeof(float));
        ck_assert(one.g[t]);
        attn_mha_grads v = grads_view(&one);
        ck_assert_int_eq(attn_mha_backward(&p, &in, dout, &v, NULL), ATTN_OK);
        worst_elem w = {0};
        for (int64_t e = 0; e < pr.t[t].len; e++)
            worst_note(&w, e, one.g[t][e], all.g[t][e], fabs((double)one.g[t][e] - all.g[t][e]));
        ck_assert_msg(w.err < 1e-6, "d%s[%lld]: %g alone, %g with the others", tensor_name[t],
                      w.at, w.got, w.want);
        grads_free(&one);
    }
    /* Nothing asked: nothing to do, and fine. */
    attn_mha_grads none = {0};
    ck_assert_int_eq(attn_mha_backward(&p, &in, dout, &none, NULL), ATTN_OK);
    grads_free(&all);
    free(dout);
    problem_free(&pr);
}
END_TEST

/* ----------------------------------------------------------- flops, errors */

/* /v1/multihead applies the variants per head after the
 * projections; with gradients through them to every input. */
START_TEST(variants_apply_per_head_after_the_projections)
{
    static const float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    const attn_variants vars[] = {
        {.window = true, .window_left = 1, .window_right = 0},
        {.alibi_slopes = slopes},
        {.softcap = 0.8f},
        {.rope_base = 100.0f},
        {.window = true, .window_left = 2, .window_right = 1, .alibi_slopes = slopes,
         .softcap = 1.5f, .rope_base = 10000.0f},
    };
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        spec s = cross_spec();
        s.d_k = 4; /* RoPE needs an even d_k */
        s.hk = 2;
        s.causal = i % 2 == 1;
        s.var = vars[i];
        s.seed = 60 + i;
        problem pr;
        problem_make(&pr, s);
        char what[48];
        snprintf(what, sizeof what, "variants #%zu", i);
        check_forward(&pr, what);
        check_all_grads(&pr, 0, what);
        problem_free(&pr);
    }
}
END_TEST

/* precision bfloat16: the attention between the float32 projections
 * runs on bfloat16 operands; the forward and every gradient against the
 * exact reference within the bounds derived at U_BF16 (cross-attention
 * with grouped-query heads, causal, every bias; then self-attention over
 * 70 positions, more than one block of 64 keys, gradients sampled), and
 * not float32's answer: the rounding happened. */
START_TEST(bfloat16_attention_between_float32_projections_matches_reference)
{
    for (int shape = 0; shape < 2; shape++) {
        spec s = shape == 0 ? cross_spec() : base_spec();
        s.hk = 2;
        s.causal = true;
        s.threads = 2;
        if (shape == 1)
            s.n = 70;
        s.precision = ATTN_PRECISION_BFLOAT16;
        problem pr;
        problem_make(&pr, s);
        /* Smaller scores (W_Q and W_K a quarter as large, exactly): delta,
         * and with it the bounds, 16 times smaller, well below the errors
         * of a wrong pairing or a missing rounding's neighbour. */
        for (int w = T_WQ; w <= T_WK; w++)
            for (int64_t e = 0; e < pr.t[w].len; e++) {
                pr.t[w].f[e] *= 0.25f;
                pr.t[w].d[e] = pr.t[w].f[e];
            }
        const char *what = shape == 0 ? "bf16 GQA causal cross" : "bf16 GQA causal self n=70";
        check_forward(&pr, what);
        check_all_grads(&pr, shape == 0 ? 0 : 40, what);
        const int64_t len = out_len(&pr);
        float *o16 = malloc((size_t)len * sizeof(float)), *o32 = malloc((size_t)len * sizeof(float));
        ck_assert(o16 && o32);
        attn_mha_params p = params_of(&pr);
        attn_mha_inputs in = inputs_of(&pr);
        attn_error err = {0};
        ck_assert_int_eq(attn_mha_forward(&p, &in, o16, NULL, NULL, NULL, &err), ATTN_OK);
        p.precision = ATTN_PRECISION_FLOAT32;
        ck_assert_int_eq(attn_mha_forward(&p, &in, o32, NULL, NULL, NULL, &err), ATTN_OK);
        ck_assert_msg(memcmp(o16, o32, (size_t)len * sizeof(float)) != 0,
                      "%s: the same bits as float32", what);
        free(o16), free(o32);
        problem_free(&pr);
    }
}
END_TEST

START_TEST(flops_count_projections_attention_and_output)
{
    problem pr;
    problem_make(&pr, cross_spec());
    attn_mha_params p = params_of(&pr);
    double B = 2, n = 4, m = 7, dm = 6, dc = 5, h = 4, hk = 4, dk = 3, dv = 2, dout = 5;
    double expect = 2 * B * n * dm * h * dk + 2 * B * m * dc * hk * (dk + dv) +
                    2 * B * h * n * m * (dk + dv) + 2 * B * n * h * dv * dout;
    ck_assert_double_eq_tol(attn_mha_flops(&p), expect, 1e-6 * expect);
    problem_free(&pr);
}
END_TEST

static attn_status forward_with(const problem *pr, attn_mha_params p,
                                attn_mha_inputs in, attn_error *err)
{
    float *out = malloc((size_t)(pr->s.B * pr->s.n * pr->s.d_out + 1024) * sizeof(float));
    ck_assert(out);
    memset(err, 0, sizeof *err);
    attn_status s = attn_mha_forward(&p, &in, out, NULL, NULL, NULL, err);
    free(out);
    return s;
}

static void expect_invalid(attn_status s, const attn_error *err, const char *needle)
{
    ck_assert_int_eq(s, ATTN_ERR_INVALID);
    ck_assert_int_eq(err->status, ATTN_ERR_INVALID);
    ck_assert_msg(strstr(err->message, needle) != NULL,
                  "message \"%s\" does not mention \"%s\"", err->message, needle);
}

START_TEST(heads_not_divisible_by_kv_heads_is_invalid)
{
    problem pr;
    problem_make(&pr, base_spec()); /* h = 4 */
    attn_mha_params p = params_of(&pr);
    p.kv_heads = 3;
    attn_error err;
    expect_invalid(forward_with(&pr, p, inputs_of(&pr), &err), &err, "divide");
    problem_free(&pr);
}
END_TEST

START_TEST(b_o_without_w_o_is_invalid)
{
    problem pr;
    problem_make(&pr, base_spec());
    attn_mha_params p = params_of(&pr);
    attn_mha_inputs in = inputs_of(&pr);
    in.w_o = NULL;
    p.d_out = pr.s.h * pr.s.d_v;
    attn_error err;
    expect_invalid(forward_with(&pr, p, in, &err), &err, "b_o");

    /* Nor may its gradient be asked for. */
    in = inputs_of(&pr);
    in.w_o = NULL;
    in.b_o = NULL;
    float db_o[64], dx[256];
    attn_mha_grads g = {.x = dx, .b_o = db_o};
    float *dout = random_floats(pr.s.B * pr.s.n * p.d_out, 3);
    expect_invalid(attn_mha_backward(&p, &in, dout, &g, &err), &err, "w_o");
    free(dout);
    problem_free(&pr);
}
END_TEST

START_TEST(bad_shapes_and_missing_inputs_are_invalid)
{
    problem pr;
    problem_make(&pr, base_spec());
    attn_mha_params good = params_of(&pr), p;
    attn_mha_inputs in = inputs_of(&pr), bad;
    attn_error err;

    p = good, p.heads = 0;
    expect_invalid(forward_with(&pr, p, in, &err), &err, "heads");
    p = good, p.d_k = -1;
    expect_invalid(forward_with(&pr, p, in, &err), &err, "d_k");
    p = good, p.batch = 0;
    expect_invalid(forward_with(&pr, p, in, &err), &err, "batch");
    p = good, p.threads = 0;
    expect_invalid(forward_with(&pr, p, in, &err), &err, "threads");
    p = good, p.scale = 0.0f;
    expect_invalid(forward_with(&pr, p, in, &err), &err, "scale");
    p = good, p.scale = INFINITY;
    expect_invalid(forward_with(&pr, p, in, &err), &err, "scale");
    p = good, p.m = good.n + 1; /* self-attention reads m rows of x */
    expect_invalid(forward_with(&pr, p, in, &err), &err, "m == n");
    bad = in, bad.x = NULL;
    expect_invalid(forward_with(&pr, good, bad, &err), &err, "x");
    bad = in, bad.w_k = NULL;
    expect_invalid(forward_with(&pr, good, bad, &err), &err, "w_k");
    bad = in, bad.w_o = NULL, bad.b_o = NULL; /* d_out must then be h*d_v */
    expect_invalid(forward_with(&pr, good, bad, &err), &err, "d_out");
    p = good, p.mask.kind = ATTN_MASK_BOOL, p.mask.allowed = NULL;
    expect_invalid(forward_with(&pr, p, in, &err), &err, "mask");
    /* Products that overflow are refused before anything is allocated. */
    p = good, p.batch = INT32_MAX, p.n = INT32_MAX, p.m = INT32_MAX;
    p.d_model = p.d_ctx = INT32_MAX;
    expect_invalid(forward_with(&pr, p, in, &err), &err, "too many");
    p = good, p.heads = 1 << 20, p.kv_heads = 1, p.d_k = 1 << 12;
    expect_invalid(forward_with(&pr, p, in, &err), &err, "heads*d_k");

    memset(&err, 0, sizeof err);
    ck_assert_int_eq(attn_mha_forward(&good, &in, NULL, NULL, NULL, NULL, &err), ATTN_ERR_INVALID);
    ck_assert(err.message[0] != '\0');
    ck_assert_int_eq(attn_mha_forward(NULL, &in, NULL, NULL, NULL, NULL, NULL), ATTN_ERR_INVALID);

    /* Backward: a context gradient for self-attention, or no dout. */
    float dctx[256];
    attn_mha_grads g = {.context = dctx};
    float *dout = random_floats(out_len(&pr), 8);
    memset(&err, 0, sizeof err);
    expect_invalid(attn_mha_backward(&good, &in, dout, &g, &err), &err, "context");
    memset(&err, 0, sizeof err);
    g = (attn_mha_grads){.x = dctx};
    expect_invalid(attn_mha_backward(&good, &in, NULL, &g, &err), &err, "dout");
    free(dout);
    problem_free(&pr);
}
END_TEST

static Suite *mha_suite(void)
{
    Suite *s = suite_create("mha");
    /* Numbers computed by libattn's kernel: make test runs these cases once
     * per kernel (the tag "kernel", tests/run-suites.sh). */
    TCase *fwd = tcase_create("forward");
    tcase_set_tags(fwd, "kernel");
    tcase_set_timeout(fwd, 120);
    tcase_add_test(fwd, self_attention_matches_reference_with_every_bias);
    tcase_add_test(fwd, variants_apply_per_head_after_the_projections);
    tcase_add_test(fwd, cross_attention_matches_reference_when_m_ne_n_and_dctx_ne_dmodel);
    tcase_add_test(fwd, output_is_the_concatenated_heads_without_w_o);
    tcase_add_test(fwd, each_bias_is_optional);
    tcase_add_test(fwd, grouped_query_two_kv_heads_for_four_heads_matches_reference);
    tcase_add_test(fwd, multi_query_one_kv_head_matches_reference);
    tcase_add_test(fwd, causal_self_attention_matches_reference);
    tcase_add_test(fwd, causal_cross_attention_is_aligned_bottom_right_when_n_lt_m);
    tcase_add_test(fwd, boolean_mask_broadcast_over_heads_matches_reference);
    tcase_add_test(fwd, numeric_mask_per_head_matches_reference);
    tcase_add_test(fwd, batches_are_computed_independently);
    tcase_add_test(fwd, weights_rows_sum_to_one_and_match_reference);
    tcase_add_test(fwd, stats_cover_every_head_and_batch);
    tcase_add_test(fwd, fully_masked_query_gives_zero_heads_and_finite_grads);
    tcase_add_test(fwd, threads_give_the_same_answer_as_one_thread);
    suite_add_tcase(s, fwd);

    TCase *bwd = tcase_create("backward");
    tcase_set_tags(bwd, "kernel");
    tcase_set_timeout(bwd, 120);
    tcase_add_test(bwd, grad_self_attention_every_input_matches_finite_differences);
    tcase_add_test(bwd, grad_cross_attention_every_input_matches_finite_differences);
    tcase_add_test(bwd, grad_grouped_query_causal_masked_matches_finite_differences);
    tcase_add_test(bwd, grad_multi_query_with_numeric_mask_matches_finite_differences);
    tcase_add_test(bwd, grad_without_w_o_or_biases_matches_finite_differences);
    tcase_add_test(bwd, grad_large_problem_across_blocks_matches_finite_differences);
    tcase_add_test(bwd, concatenation_straddles_blocks_without_w_o);
    tcase_add_test(bwd, only_the_requested_gradients_are_written);
    suite_add_tcase(s, bwd);

    TCase *misc = tcase_create("contract");
    tcase_add_test(misc, bfloat16_attention_between_float32_projections_matches_reference);
    tcase_add_test(misc, flops_count_projections_attention_and_output);
    tcase_add_test(misc, heads_not_divisible_by_kv_heads_is_invalid);
    tcase_add_test(misc, b_o_without_w_o_is_invalid);
    tcase_add_test(misc, bad_shapes_and_missing_inputs_are_invalid);
    suite_add_tcase(s, misc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(mha_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
