/*
 * POST /v1/attention — scaled dot-product attention (Eq. 10), causal
 * (Eq. 14-15), grouped-query, with gradients (Eq. 16-18).
 *
 * Request tensors, by rank (all three the same rank):
 *   2: q [n_q, d_k]        k [n_k, d_k]        v [n_k, d_v]        (B = H = 1)
 *   3: q [H_q, n_q, d_k]   k [H_kv, n_k, d_k]  v [H_kv, n_k, d_v]  (B = 1)
 *   4: q [B, H_q, n_q, d_k] ...
 * output [..., n_q, d_v], weights [..., n_q, n_k], grad q/k/v as the inputs,
 * where "..." are q's leading dimensions.
 *
 * The handler reads as its steps: decode, validate, check the work, compute,
 * encode. Inputs are freed as soon as the computation is done and each
 * result as soon as it is written, so memory stays O(request + response).
 */
#include "request.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
    F_Q, F_K, F_V, F_CAUSAL, F_MASK, F_SCALE, F_RETURN_WEIGHTS, F_RETURN_STATS,
    F_GRAD_OUTPUT, F_OUTPUT_ENCODING, F_OUTPUT_DTYPE, F_COUNT
};

const api_field api_attention_fields[] = {
    [F_Q] = {"q", API_FIELD_TENSOR, true},
    [F_K] = {"k", API_FIELD_TENSOR, true},
    [F_V] = {"v", API_FIELD_TENSOR, true},
    [F_CAUSAL] = {"causal", API_FIELD_BOOL, false},
    [F_MASK] = {"mask", API_FIELD_MASK, false},
    [F_SCALE] = {"scale", API_FIELD_NUMBER, false},
    [F_RETURN_WEIGHTS] = {"return_weights", API_FIELD_BOOL, false},
    [F_RETURN_STATS] = {"return_stats", API_FIELD_BOOL, false},
    [F_GRAD_OUTPUT] = {"grad_output", API_FIELD_TENSOR, false},
    [F_OUTPUT_ENCODING] = {"output_encoding", API_FIELD_ENCODING, false},
    [F_OUTPUT_DTYPE] = {"output_dtype", API_FIELD_DTYPE, false},
};
const size_t api_attention_nfields = F_COUNT;

static const char *const FORMS =
    "[n, d], [heads, n, d] or [batch, heads, n, d]";

typedef struct {
    api_value f[F_COUNT];
    int rank;                      /* of q, k and v */
    int64_t q_shape[4], k_shape[4], v_shape[4];
    int64_t out_shape[4], weights_shape[4];
    attn_sdpa_params p;
    double flops;
    api_encoding enc;
    bool want_weights, want_stats, want_grad;
    float *out, *weights, *dq, *dk, *dv;
    attn_softmax_row *rows; /* [B, H_q, n_q]: the forward pass's, for the backward */
    attn_stats stats;
} attention_call;

static void release_inputs(attention_call *c)
{
    api_values_free(c->f, F_COUNT);
    c->p.mask = (attn_mask){0};
}

static void release(attention_call *c)
{
    release_inputs(c);
    free(c->out);
    free(c->rows);
    free(c->weights);
    free(c->dq);
    free(c->dk);
    free(c->dv);
}

/* B, H, n, d of a rank-2..4 tensor. */
static void dims(const api_tensor *t, int64_t *b, int64_t *h, int64_t *n,
                 int64_t *d)
{
    int r = t->rank;
    *b = r == 4 ? t->shape[0] : 1;
    *h = r >= 3 ? t->shape[r - 3] : 1;
    *n = t->shape[r - 2];
    *d = t->shape[r - 1];
}

#define MISMATCH(field, fmt, a, b)                                             \
    api_fail(err, 422, "shape_mismatch", field, fmt, (long long)(a), (long long)(b))

/* q, k and v fit together: ranks, batch, heads, n_k, d_k. */
static bool check_qkv(const api_tensor *q, const api_tensor *k,
                      const api_tensor *v, api_error *err)
{
    if (!api_check_rank(q, "q", 2, 4, FORMS, err) ||
        !api_check_rank(k, "k", 2, 4, FORMS, err) ||
        !api_check_rank(v, "v", 2, 4, FORMS, err))
        return false;
    if (k->rank != q->rank || v->rank != q->rank) {
        const char *field = k->rank != q->rank ? "k" : "v";
        int r = k->rank != q->rank ? k->rank : v->rank;
        return api_fail(err, 422, "shape_mismatch", field,
                        "%s has rank %d but q has rank %d; q, k and v must have "
                        "the same rank", field, r, q->rank);
    }
    int64_t bq, hq, nq, dq, bk, hk, nk, dk, bv, hv, nv, dv;
    dims(q, &bq, &hq, &nq, &dq);
    dims(k, &bk, &hk, &nk, &dk);
    dims(v, &bv, &hv, &nv, &dv);
    if (bk != bq)
        return MISMATCH("k", "k has batch %lld but q has batch %lld", bk, bq);
    if (bv != bq)
        return MISMATCH("v", "v has batch %lld but q has batch %lld", bv, bq);
    if (dk != dq)
        return MISMATCH("k", "k has d_k=%lld but q has d_k=%lld", dk, dq);
    if (hv != hk)
        return MISMATCH("v", "v has %lld heads but k has %lld", hv, hk);
    if (nv != nk)
        return MISMATCH("v", "v has n_k=%lld positions but k has n_k=%lld",
                        nv, nk);
    if (hq % hk != 0)
        return api_fail(err, 422, "shape_mismatch", "k",
                        "q has %lld heads, not a multiple of k's %lld heads "
                        "(grouped-query attention needs heads_q %% heads_kv == 0)",
                        (long long)hq, (long long)hk);
    return true;
}

/* The work, the size of the answer and the range of the scores, all judged
 * before anything is allocated or computed. */
static bool check_cost(attention_call *c, const api_limits *lim, api_error *err)
{
    const attn_sdpa_params *p = &c->p;
    const api_tensor *q = &c->f[F_Q].tensor, *k = &c->f[F_K].tensor,
                     *v = &c->f[F_V].tensor;
    /* The backward pass is 2.5 forwards, so forward + backward is 3.5. */
    c->flops = attn_sdpa_flops(p) * (c->want_grad ? 3.5 : 1.0);
    /* In double: with no FLOP limit the products could overflow int64. */
    double rows = (double)p->batch * (double)p->heads_q * (double)p->n_q;
    double numbers = rows * (double)p->d_v +
                     (c->want_weights ? rows * (double)p->n_k : 0) +
                     (c->want_grad ? (double)(q->count + k->count + v->count) : 0);
    if (!api_check_work(c->flops, lim, err) ||
        !api_check_response_size(numbers, err))
        return false;
    double bias = p->mask.kind == ATTN_MASK_BIAS
                      ? api_max_abs(c->f[F_MASK].tensor.f32, c->f[F_MASK].tensor.count)
                      : 0;
    double bound = fmax(p->scale, 1.0) *
                       api_max_row_norm(q->f32, q->count / p->d_k, p->d_k) *
                       api_max_row_norm(k->f32, k->count / p->d_k, p->d_k) +
                   bias;
    return api_check_score_bound(bound, "q and k", err);
}

/* Fills c->p and the shapes the client will see, or says which field
 * does not fit. */
static bool validate(attention_call *c, const api_limits *lim, api_error *err)
{
    const api_tensor *q = &c->f[F_Q].tensor, *k = &c->f[F_K].tensor,
                     *v = &c->f[F_V].tensor;
    if (!check_qkv(q, k, v, err))
        return false;
    int64_t bq, hq, nq, dq, hk, nk, dv, unused;
    dims(q, &bq, &hq, &nq, &dq);
    dims(k, &unused, &hk, &nk, &unused);
    dv = v->shape[v->rank - 1];

    int r = c->rank = q->rank;
    memcpy(c->q_shape, q->shape, sizeof c->q_shape);
    memcpy(c->k_shape, k->shape, sizeof c->k_shape);
    memcpy(c->v_shape, v->shape, sizeof c->v_shape);
    memcpy(c->out_shape, q->shape, sizeof c->out_shape);
    c->out_shape[r - 1] = dv;
    memcpy(c->weights_shape, q->shape, sizeof c->weights_shape);
    c->weights_shape[r - 1] = nk;

    c->p = (attn_sdpa_params){
        .batch = bq, .heads_q = hq, .heads_kv = hk, .n_q = nq, .n_k = nk,
        .d_k = dq, .d_v = dv,
        .scale = c->f[F_SCALE].present ? c->f[F_SCALE].number : attn_default_scale(dq),
        .causal = c->f[F_CAUSAL].present && c->f[F_CAUSAL].flag,
        .threads = api_threads(lim),
    };
    if (!(c->p.scale > 0))
        return api_fail(err, 422, "invalid_value", "scale",
                        "scale must be greater than 0 (as a float32), got %g",
                        (double)c->f[F_SCALE].number);
    if (c->f[F_MASK].present &&
        !api_mask_setup(&c->f[F_MASK].tensor, r, c->weights_shape, bq, hq, nq,
                        nk, &c->p.mask, err))
        return false;
    c->want_weights = c->f[F_RETURN_WEIGHTS].present && c->f[F_RETURN_WEIGHTS].flag;
    c->want_stats = c->f[F_RETURN_STATS].present && c->f[F_RETURN_STATS].flag;
    c->want_grad = c->f[F_GRAD_OUTPUT].present;
    if (!api_output_encoding(&c->f[F_OUTPUT_ENCODING], &c->f[F_OUTPUT_DTYPE], &c->enc, err))
        return false;
    if (c->want_grad &&
        !api_check_shape(&c->f[F_GRAD_OUTPUT].tensor, "grad_output", r,
                         c->out_shape, "the output [..., n_q, d_v]", err))
        return false;
    return check_cost(c, lim, err);
}

static bool compute(attention_call *c, api_error *err)
{
    const attn_sdpa_params *p = &c->p;
    int64_t rows = p->batch * p->heads_q * p->n_q;
    c->out = api_alloc_floats(rows * p->d_v);
    if (c->want_grad)
        c->rows = malloc((size_t)rows * sizeof *c->rows);
    if (c->want_weights)
        c->weights = api_alloc_floats(rows * p->n_k);
    if (!c->out || (c->want_grad && !c->rows) || (c->want_weights && !c->weights))
        return api_fail(err, 500, "out_of_memory", "",
                        "out of memory for the output of this request");

    const float *q = c->f[F_Q].tensor.f32, *k = c->f[F_K].tensor.f32,
                *v = c->f[F_V].tensor.f32;
    attn_error ae = {0};
    if (attn_sdpa_forward(p, q, k, v, c->out, c->rows, c->weights,
                          c->want_stats ? &c->stats : NULL, &ae) != ATTN_OK)
        return api_fail_attn(err, &ae);
    if (!api_check_output(c->out, rows * p->d_v, "the output", c->enc, err) ||
        (c->weights &&
         !api_check_output(c->weights, rows * p->n_k, "the weights", c->enc, err)))
        return false;
    if (c->want_stats) {
        double s[] = {c->stats.scores_mean, c->stats.scores_var,
                      c->stats.scaled_mean, c->stats.scaled_var};
        for (size_t i = 0; i < sizeof s / sizeof *s; i++)
            if (!isfinite(s[i]))
                return api_fail(err, 422, "numerical_overflow", "",
                                "the score statistics overflow; the inputs are "
                                "too large in magnitude, scale them down");
    }
    if (!c->want_grad)
        return true;

    const api_tensor *dout = &c->f[F_GRAD_OUTPUT].tensor;
    c->dq = api_alloc_floats(c->f[F_Q].tensor.count);
    c->dk = api_alloc_floats(c->f[F_K].tensor.count);
    c->dv = api_alloc_floats(c->f[F_V].tensor.count);
    if (!c->dq || !c->dk || !c->dv)
        return api_fail(err, 500, "out_of_memory", "",
                        "out of memory for the gradients of this request");
    if (attn_sdpa_backward(p, q, k, v, c->out, c->rows, dout->f32, c->dq, c->dk,
                           c->dv, &ae) != ATTN_OK)
        return api_fail_attn(err, &ae);
    free(c->rows);
    c->rows = NULL;
    return api_check_output(c->dq, c->f[F_Q].tensor.count, "the gradient of q", c->enc, err) &&
           api_check_output(c->dk, c->f[F_K].tensor.count, "the gradient of k", c->enc, err) &&
           api_check_output(c->dv, c->f[F_V].tensor.count, "the gradient of v", c->enc, err);
}

/* Writes one result and frees it: the text now holds it. */
static void emit(api_buf *b, const char *name, float **data, int rank,
                 const int64_t *shape, api_encoding enc, bool first)
{
    api_out_tensor t = {.name = name, .data = *data, .rank = rank};
    memcpy(t.shape, shape, (size_t)rank * sizeof *shape);
    api_write_tensor(b, &t, enc, first);
    free(*data);
    *data = NULL;
}

static void encode(attention_call *c, api_buf *b, api_timing *t)
{
    api_encoding enc = c->enc;
    int r = c->rank;
    api_buf_puts(b, "{");
    emit(b, "output", &c->out, r, c->out_shape, enc, true);
    if (c->want_weights)
        emit(b, "weights", &c->weights, r, c->weights_shape, enc, false);
    if (c->want_grad) {
        api_buf_puts(b, ",\"grad\":{");
        emit(b, "q", &c->dq, r, c->q_shape, enc, true);
        emit(b, "k", &c->dk, r, c->k_shape, enc, false);
        emit(b, "v", &c->dv, r, c->v_shape, enc, false);
        api_buf_puts(b, "}");
    }
    if (c->want_stats)
        api_write_stats(b, &c->stats);
    const attn_sdpa_params *p = &c->p;
    const api_dim shape[] = {
        {"batch", p->batch}, {"heads_q", p->heads_q}, {"heads_kv", p->heads_kv},
        {"n_q", p->n_q}, {"n_k", p->n_k}, {"d_k", p->d_k}, {"d_v", p->d_v},
    };
    api_write_meta(b, shape, sizeof shape / sizeof *shape, c->flops, t);
    api_buf_puts(b, "}");
}

bool api_attention(const char *body, size_t len, const api_limits *lim,
                   api_timing *t, api_buf *out, api_error *err)
{
    attention_call c = {0};
    bool ok = api_read_fields(body, len, api_attention_fields, F_COUNT,
                              api_multihead_fields, api_multihead_nfields,
                              "/v1/multihead", c.f, err) &&
              validate(&c, lim, err);
    api_lap(t, &t->decode_ms);
    if (!ok) {
        release(&c);
        return false;
    }
    ok = compute(&c, err);
    release_inputs(&c);
    api_lap(t, &t->compute_ms);
    if (ok)
        encode(&c, out, t);
    release(&c);
    return ok;
}
