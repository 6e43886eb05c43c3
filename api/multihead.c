/*
 * POST /v1/multihead — multi-head attention (Eq. 12-13) in the chapter's
 * convention, Q = X W_Q + b_Q (weights [d_in, d_out], multiplied on the
 * right), with grouped-query heads, cross-attention and gradients.
 *
 * Request tensors (B? present when x has rank 3):
 *   x [B?, n, d_model]   context [B?, m, d_ctx] (absent: m = n, d_ctx = d_model)
 *   w_q [d_model, h*d_k]   w_k [d_ctx, h_kv*d_k]   w_v [d_ctx, h_kv*d_v]
 *   w_o [h*d_v, d_out] (absent: d_out = h*d_v, the heads concatenated)
 *   b_q [h*d_k]  b_k [h_kv*d_k]  b_v [h_kv*d_v]  b_o [d_out]
 * output [B?, n, d_out]; weights [B?, h, n, m] per head or [B?, n, m] for
 * "mean"; lse [B?, h, n]; grad: one entry per differentiable input given,
 * shaped like it. The variants (window, alibi_slopes [h] or [B, h],
 * softcap, rope) apply per head after the projections (api/variants.c).
 */
#include "request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The differentiable inputs come first, in the order of attn_mha_inputs. */
enum {
    F_X, F_CONTEXT, F_W_Q, F_W_K, F_W_V, F_W_O, F_B_Q, F_B_K, F_B_V, F_B_O,
    N_INPUTS,
    F_NUM_HEADS = N_INPUTS, F_NUM_KV_HEADS, F_CAUSAL, F_MASK, F_SCALE,
    F_RETURN_WEIGHTS, F_RETURN_STATS, F_GRAD_OUTPUT, F_OUTPUT_ENCODING, F_OUTPUT_DTYPE,
    F_WINDOW, F_ALIBI_SLOPES, F_SOFTCAP, F_ROPE, F_RETURN_LSE, F_SEQ_LENS, F_SEQ_LENS_CONTEXT,
    F_PRECISION, F_COUNT
};

static const api_field api_multihead_fields[] = {
    [F_X] = {"x", API_FIELD_TENSOR, true},
    [F_CONTEXT] = {"context", API_FIELD_TENSOR, false},
    [F_W_Q] = {"w_q", API_FIELD_TENSOR, true},
    [F_W_K] = {"w_k", API_FIELD_TENSOR, true},
    [F_W_V] = {"w_v", API_FIELD_TENSOR, true},
    [F_W_O] = {"w_o", API_FIELD_TENSOR, false},
    [F_B_Q] = {"b_q", API_FIELD_TENSOR, false},
    [F_B_K] = {"b_k", API_FIELD_TENSOR, false},
    [F_B_V] = {"b_v", API_FIELD_TENSOR, false},
    [F_B_O] = {"b_o", API_FIELD_TENSOR, false},
    [F_NUM_HEADS] = {"num_heads", API_FIELD_INTEGER, true},
    [F_NUM_KV_HEADS] = {"num_kv_heads", API_FIELD_INTEGER, false},
    [F_CAUSAL] = {"causal", API_FIELD_BOOL, false},
    [F_MASK] = {"mask", API_FIELD_MASK, false},
    [F_SCALE] = {"scale", API_FIELD_NUMBER, false},
    [F_RETURN_WEIGHTS] = {"return_weights", API_FIELD_WEIGHTS, false},
    [F_RETURN_STATS] = {"return_stats", API_FIELD_BOOL, false},
    [F_GRAD_OUTPUT] = {"grad_output", API_FIELD_TENSOR, false},
    [F_OUTPUT_ENCODING] = {"output_encoding", API_FIELD_ENCODING, false},
    [F_OUTPUT_DTYPE] = {"output_dtype", API_FIELD_DTYPE, false},
    [F_WINDOW] = {"window", API_FIELD_WINDOW, false},
    [F_ALIBI_SLOPES] = {"alibi_slopes", API_FIELD_TENSOR, false},
    [F_SOFTCAP] = {"softcap", API_FIELD_NUMBER, false},
    [F_ROPE] = {"rope", API_FIELD_ROPE, false},
    [F_RETURN_LSE] = {"return_lse", API_FIELD_BOOL, false},
    [F_SEQ_LENS] = {"seq_lens", API_FIELD_LENGTHS, false},
    [F_SEQ_LENS_CONTEXT] = {"seq_lens_context", API_FIELD_LENGTHS, false},
    [F_PRECISION] = {"precision", API_FIELD_PRECISION, false},
};

/* For messages about the gradients, in the order of the inputs. */
static const char *const grad_what[N_INPUTS] = {
    "the gradient of x",   "the gradient of context", "the gradient of w_q",
    "the gradient of w_k", "the gradient of w_v",     "the gradient of w_o",
    "the gradient of b_q", "the gradient of b_k",     "the gradient of b_v",
    "the gradient of b_o",
};

typedef struct {
    attn_mha_params p;
    int rank;               /* of x (and context): 2 or 3 */
    bool want_mean;         /* return_weights: "mean" */
    int out, weights, lse;  /* the planned results, -1 when not asked */
    int grad[N_INPUTS];     /* the planned gradients, -1 for inputs not given */
    attn_softmax_row *rows; /* [B, h, n] for lse */
    api_ragged ragged;      /* seq_lens, seq_lens_context: p.ragged points into it */
} multihead_state;

static multihead_state *state(const api_call *c)
{
    return c->state;
}

#define MISMATCH(field, ...) api_fail(err, 422, "shape_mismatch", field, __VA_ARGS__)
#define LL(x) ((long long)(x))

static const codec_tensor *given(const api_call *c, int f)
{
    return c->f[f].present ? &c->f[f].tensor : NULL;
}

/* A weight [rows, cols] whose rows must be `rows`; `rows_of` says where
 * that number comes from ("x has d_model="), the number follows it. */
static bool check_weight(const codec_tensor *w, const char *field, int64_t rows,
                         const char *rows_of, const char *form, api_error *err)
{
    if (!api_check_rank(w, field, 2, 2, form, err))
        return false;
    if (w->shape[0] != rows)
        return MISMATCH(field, "%s has %lld row%s but %s%lld", field,
                        LL(w->shape[0]), w->shape[0] == 1 ? "" : "s", rows_of,
                        LL(rows));
    return true;
}

/* A bias [len] that must match the columns of its projection. */
static bool check_bias(const codec_tensor *b, const char *field, int64_t len,
                       const char *of, api_error *err)
{
    if (!b)
        return true;
    if (b->rank != 1 || b->shape[0] < 1) {
        char form[64];
        snprintf(form, sizeof form, "[%lld]", LL(len));
        return api_check_rank(b, field, 1, 1, form, err);
    }
    if (b->shape[0] != len)
        return MISMATCH(field, "%s has %lld entries but %s has %lld columns",
                        field, LL(b->shape[0]), of, LL(len));
    return true;
}

/* x and context: ranks, batch, and the sizes n, m, d_model, d_ctx. */
static bool validate_sequences(api_call *c, api_error *err)
{
    const codec_tensor *x = given(c, F_X), *ctx = given(c, F_CONTEXT);
    if (!api_check_rank(x, "x", 2, 3, "[n, d_model] or [batch, n, d_model]", err))
        return false;
    int r = state(c)->rank = x->rank;
    attn_mha_params *p = &state(c)->p;
    p->batch = r == 3 ? x->shape[0] : 1;
    p->n = x->shape[r - 2];
    p->d_model = x->shape[r - 1];
    p->m = p->n;
    p->d_ctx = p->d_model;
    if (!ctx)
        return true;
    if (!api_check_rank(ctx, "context", 2, 3, "[m, d_ctx] or [batch, m, d_ctx]", err))
        return false;
    if (ctx->rank != r)
        return MISMATCH("context", "context has rank %d but x has rank %d; they "
                        "must have the same rank", ctx->rank, r);
    if (r == 3 && ctx->shape[0] != p->batch)
        return MISMATCH("context", "context has batch %lld but x has batch %lld",
                        LL(ctx->shape[0]), LL(p->batch));
    p->m = ctx->shape[r - 2];
    p->d_ctx = ctx->shape[r - 1];
    return true;
}

static bool validate_heads(api_call *c, api_error *err)
{
    attn_mha_params *p = &state(c)->p;
    p->heads = c->f[F_NUM_HEADS].integer;
    p->kv_heads = c->f[F_NUM_KV_HEADS].present ? c->f[F_NUM_KV_HEADS].integer
                                               : p->heads;
    if (p->heads < 1)
        return api_fail(err, 422, "invalid_value", "num_heads",
                        "num_heads must be at least 1, got %lld", LL(p->heads));
    if (p->kv_heads < 1)
        return api_fail(err, 422, "invalid_value", "num_kv_heads",
                        "num_kv_heads must be at least 1, got %lld", LL(p->kv_heads));
    if (p->heads % p->kv_heads != 0)
        return api_fail(err, 422, "invalid_value", "num_kv_heads",
                        "num_heads=%lld is not a multiple of num_kv_heads=%lld "
                        "(each key/value head serves a whole group of query heads)",
                        LL(p->heads), LL(p->kv_heads));
    return true;
}

/* The projections fix d_k, d_v and d_out. */
static bool validate_weights(api_call *c, api_error *err)
{
    attn_mha_params *p = &state(c)->p;
    /* what fixes the rows of each weight, for messages */
    const char *rows_q = "x has d_model=";
    const char *rows_kv = given(c, F_CONTEXT) ? "context has d_ctx=" : "x has d_model=";

    const codec_tensor *w_q = given(c, F_W_Q), *w_k = given(c, F_W_K),
                     *w_v = given(c, F_W_V), *w_o = given(c, F_W_O);
    if (!check_weight(w_q, "w_q", p->d_model, rows_q, "[d_model, num_heads*d_k]", err))
        return false;
    if (w_q->shape[1] % p->heads != 0)
        return MISMATCH("w_q", "w_q has %lld columns, not a multiple of num_heads=%lld",
                        LL(w_q->shape[1]), LL(p->heads));
    p->d_k = w_q->shape[1] / p->heads;

    if (!check_weight(w_k, "w_k", p->d_ctx, rows_kv, "[d_ctx, num_kv_heads*d_k]", err))
        return false;
    if (w_k->shape[1] != p->kv_heads * p->d_k)
        return MISMATCH("w_k", "w_k has %lld columns but needs num_kv_heads*d_k = "
                        "%lld*%lld = %lld (d_k=%lld from w_q)", LL(w_k->shape[1]),
                        LL(p->kv_heads), LL(p->d_k), LL(p->kv_heads * p->d_k),
                        LL(p->d_k));

    if (!check_weight(w_v, "w_v", p->d_ctx, rows_kv, "[d_ctx, num_kv_heads*d_v]", err))
        return false;
    if (w_v->shape[1] % p->kv_heads != 0)
        return MISMATCH("w_v", "w_v has %lld columns, not a multiple of num_kv_heads=%lld",
                        LL(w_v->shape[1]), LL(p->kv_heads));
    p->d_v = w_v->shape[1] / p->kv_heads;

    p->d_out = p->heads * p->d_v;
    if (w_o) {
        if (!check_weight(w_o, "w_o", p->heads * p->d_v,
                          "the heads give num_heads*d_v = ",
                          "[num_heads*d_v, d_out]", err))
            return false;
        p->d_out = w_o->shape[1];
    } else if (given(c, F_B_O)) {
        return api_fail(err, 422, "invalid_value", "b_o",
                        "b_o needs w_o: without w_o the output is the heads "
                        "concatenated, with no output projection to add a bias to");
    }
    return check_bias(given(c, F_B_Q), "b_q", p->heads * p->d_k, "w_q", err) &&
           check_bias(given(c, F_B_K), "b_k", p->kv_heads * p->d_k, "w_k", err) &&
           check_bias(given(c, F_B_V), "b_v", p->kv_heads * p->d_v, "w_v", err) &&
           check_bias(given(c, F_B_O), "b_o", p->d_out, "w_o", err);
}

/* An upper bound of |scale * q.k + bias| over every score: each projected
 * row is at most |input row| * |W|_F + |b| (Cauchy-Schwarz per column). An
 * additive mask that large is blamed on itself. */
static double score_bound(const api_call *c, const char **blame)
{
    const attn_mha_params *p = &state(c)->p;
    const codec_tensor *x = given(c, F_X), *ctx = given(c, F_CONTEXT);
    const codec_tensor *kv_in = ctx ? ctx : x;
    const codec_tensor *b_q = given(c, F_B_Q), *b_k = given(c, F_B_K);
    double q = api_max_row_norm(x->f32, x->count / p->d_model, p->d_model) *
                   api_norm(c->f[F_W_Q].tensor.f32, c->f[F_W_Q].tensor.count) +
               (b_q ? api_norm(b_q->f32, b_q->count) : 0);
    double k = api_max_row_norm(kv_in->f32, kv_in->count / p->d_ctx, p->d_ctx) *
                   api_norm(c->f[F_W_K].tensor.f32, c->f[F_W_K].tensor.count) +
               (b_k ? api_norm(b_k->f32, b_k->count) : 0);
    double bias = p->mask.kind == ATTN_MASK_BIAS
                      ? api_max_abs(c->f[F_MASK].tensor.f32, c->f[F_MASK].tensor.count)
                      : 0;
    double qk = fmax(p->scale, 1.0) * q * k;
    double alibi = api_alibi_bound(&p->variants, &c->f[F_ALIBI_SLOPES].tensor, p->n, p->m);
    *blame = alibi > qk && alibi > bias ? "alibi_slopes times the distances"
             : bias > qk                ? "the additive mask's values"
                                        : "x, context and the projections";
    return qk + bias + alibi;
}

/* The attention over [B, h, n, m], and the projections around it (their
 * FLOPs: libattn runs each as a few large products over every head). */
static void cost(const api_call *c, api_cost_terms *t)
{
    const multihead_state *st = state(c);
    const attn_mha_params *p = &st->p;
    double B = (double)p->batch, h = (double)p->heads;
    double forward = attn_mha_flops(p);
    /* attn_mha_flops counts an output projection; without w_o there is none. */
    bool w_o = given(c, F_W_O) != NULL;
    if (!w_o)
        forward -= 2.0 * B * (double)p->n * h * (double)p->d_v * (double)p->d_out;
    t->flops = forward;
    /* libattn runs every head in one call over the [B, n, h, d] layout, so
     * a head costs a quarter of a separate SDPA head (measured: 10000 heads
     * of width 1 over 2 rows, 0.2 us each against 0.6-0.95 us). */
    t->pairs = B * h / 4;
    t->rows = B * h * (double)p->n;
    t->scores = t->rows * (double)p->m;
    if (st->ragged.seqs > 0) {
        /* a ragged batch: each sequence's (query, key) block, and its heads */
        t->pairs = (double)st->ragged.seqs * h / 4;
        t->scores = h * st->ragged.pairs;
    }
    t->masked = p->mask.kind != ATTN_MASK_NONE;
    /* computed per head even when only the mean is sent (in a block of
     * rows at a time) */
    t->weights = st->weights >= 0 ? t->scores : 0;
    t->averaged = st->want_mean ? t->scores : 0;
    /* the variants, per head, as attn_mha_flops counts the attention */
    attn_sdpa_params inner = {
        .batch = p->batch, .heads_q = p->heads, .heads_kv = p->kv_heads, .n_q = p->n,
        .n_k = p->m, .d_k = p->d_k, .d_v = p->d_v, .causal = p->causal,
        .variants = p->variants, .ragged = p->ragged,
    };
    api_variant_cost(&inner, t);
    /* Memory: the projections of every head and the attention's
     * workspaces, for the most threads the request may get; the softmax
     * rows kept for the lse. */
    attn_mha_params at_most = *p;
    at_most.threads = api_max_threads(&c->lim);
    at_most.weights_mean = st->want_mean;
    t->workspace = attn_mha_workspace(&at_most, w_o, st->weights >= 0, c->want_stats,
                                      c->want_grad) +
                   (st->lse >= 0 ? t->rows * (double)sizeof(attn_softmax_row) : 0) +
                   /* a ragged batch's offsets of the rows and of the context's */
                   2.0 * (double)(st->ragged.seqs + 1) * (double)sizeof(int64_t);
    /* The projections stay float32 (OpenBLAS): only the attention's
     * products are bfloat16. */
    if (p->precision == ATTN_PRECISION_BFLOAT16) {
        t->bf16_flops = attn_sdpa_flops(&inner);
        t->rounded = B * ((double)p->heads * (double)p->n * (double)p->d_k +
                          (double)p->kv_heads * (double)p->m * (double)(p->d_k + p->d_v));
    }
}

static void workspace_what(const api_call *c, char *buf, size_t cap)
{
    const attn_mha_params *p = &state(c)->p;
    snprintf(buf, cap,
             "the projections of %lld head%s (q [%lld, %lld, %lld], k and v [%lld, %lld, "
             "%lld]) and the attention's tiles",
             (long long)p->heads, p->heads == 1 ? "" : "s", (long long)p->batch,
             (long long)p->n, (long long)(p->heads * p->d_k), (long long)p->batch,
             (long long)p->m, (long long)(p->kv_heads * p->d_k));
}

static bool validate(api_call *c, api_error *err)
{
    multihead_state *st = state(c);
    if (!validate_sequences(c, err) || !validate_heads(c, err) ||
        !validate_weights(c, err))
        return false;
    attn_mha_params *p = &st->p;
    p->threads = 1;
    p->causal = c->f[F_CAUSAL].present && c->f[F_CAUSAL].flag;
    p->scale = c->f[F_SCALE].present ? c->f[F_SCALE].number
                                     : attn_default_scale(p->d_k);
    p->precision = c->f[F_PRECISION].present ? c->f[F_PRECISION].precision
                                             : ATTN_PRECISION_FLOAT32;
    if (!(p->scale > 0))
        return api_fail(err, 422, "invalid_value", "scale",
                        "scale must be greater than 0 (as a float32), got %g",
                        (double)c->f[F_SCALE].number);
    if (c->f[F_SEQ_LENS_CONTEXT].present && !given(c, F_CONTEXT))
        return api_fail(err, 422, "invalid_value", "seq_lens_context",
                        "seq_lens_context gives the lengths of context's sequences, but there "
                        "is no context: in self-attention the keys are x's rows, split by "
                        "seq_lens");
    static const api_ragged_names names = {"seq_lens", "seq_lens_context", "x", "n",
                                           "context", "m"};
    if (!api_ragged_setup(&c->f[F_SEQ_LENS], &c->f[F_SEQ_LENS_CONTEXT], p->batch, p->n, p->m,
                          &names, &st->ragged, err))
        return false;
    p->ragged = api_ragged_lib(&st->ragged);
    int64_t scores[4] = {p->batch, p->heads, p->n, p->m};
    if (c->f[F_MASK].present &&
        !api_mask_setup(&c->f[F_MASK].tensor, 4, scores, p->batch, p->heads,
                        p->n, p->m, &p->mask, err))
        return api_ragged_mask_hint(&st->ragged, err);
    const api_variant_values variants = {&c->f[F_WINDOW], &c->f[F_ALIBI_SLOPES],
                                         &c->f[F_SOFTCAP], &c->f[F_ROPE]};
    const api_variant_shape heads = {p->batch, p->heads, p->d_k, "num_heads"};
    if (!api_variants_setup(&variants, &heads, &p->variants, err))
        return false;

    int r = st->rank, lead = r == 3; /* whether B is shown */
    int64_t out_shape[3] = {p->batch, p->n, p->d_out};
    if (c->want_grad &&
        !api_check_shape(&c->f[F_GRAD_OUTPUT].tensor, "grad_output", r,
                         out_shape + !lead, "the output [batch?, n, d_out]", err))
        return false;

    bool want_weights = c->f[F_RETURN_WEIGHTS].present && c->f[F_RETURN_WEIGHTS].flag;
    st->want_mean = want_weights && c->f[F_RETURN_WEIGHTS].mean;
    int64_t heads_shape[4] = {p->batch, p->heads, p->n, p->m};
    int64_t mean_shape[3] = {p->batch, p->n, p->m};
    st->out = api_plan(c, "output", false, "the output", r, out_shape + !lead);
    st->weights = !want_weights ? -1
                  : st->want_mean ? api_plan(c, "weights", false, "the weights", r,
                                             mean_shape + !lead)
                                  : api_plan(c, "weights", false, "the weights", r + 1,
                                             heads_shape + !lead);
    bool want_lse = c->f[F_RETURN_LSE].present && c->f[F_RETURN_LSE].flag;
    st->lse = want_lse ? api_plan(c, "lse", false, "the lse", r, heads_shape + !lead) : -1;
    if (want_lse)
        c->results[st->lse].empty_rows = true;
    for (int i = 0; i < N_INPUTS; i++)
        st->grad[i] = c->want_grad && c->f[i].present
                          ? api_plan(c, api_multihead_fields[i].name, true, grad_what[i],
                                     c->f[i].tensor.rank, c->f[i].tensor.shape)
                          : -1;
    return true;
}

static const float *data(const api_call *c, int f)
{
    return api_field_data(c, f);
}

static float *result(api_call *c, int index)
{
    return index >= 0 ? c->results[index].data : NULL;
}

static bool compute(api_call *c, int threads, api_error *err)
{
    multihead_state *st = state(c);
    attn_mha_params *p = &st->p;
    p->threads = threads;
    /* "mean": libattn averages the heads itself, without their [B, h, n, m]. */
    p->weights_mean = st->want_mean;
    p->cancel = c->lim.cancel;
    float *weights = result(c, st->weights);
    if (st->lse >= 0 &&
        !(st->rows = malloc((size_t)(p->batch * p->heads * p->n) * sizeof *st->rows)))
        return api_fail(err, 500, "out_of_memory", "",
                        "out of memory for the lse of this request");
    attn_mha_inputs in = {
        .x = data(c, F_X), .context = data(c, F_CONTEXT),
        .w_q = data(c, F_W_Q), .w_k = data(c, F_W_K), .w_v = data(c, F_W_V),
        .w_o = data(c, F_W_O), .b_q = data(c, F_B_Q), .b_k = data(c, F_B_K),
        .b_v = data(c, F_B_V), .b_o = data(c, F_B_O),
    };
    attn_mha_grads g = {
        .x = result(c, st->grad[F_X]), .context = result(c, st->grad[F_CONTEXT]),
        .w_q = result(c, st->grad[F_W_Q]), .w_k = result(c, st->grad[F_W_K]),
        .w_v = result(c, st->grad[F_W_V]), .w_o = result(c, st->grad[F_W_O]),
        .b_q = result(c, st->grad[F_B_Q]), .b_k = result(c, st->grad[F_B_K]),
        .b_v = result(c, st->grad[F_B_V]), .b_o = result(c, st->grad[F_B_O]),
    };
    attn_error ae = {0};
    attn_stats *stats = c->want_stats ? &c->stats : NULL;
    /* With gradients, one call: the projections and the attention are not
     * computed twice. */
    attn_status s = c->want_grad
                        ? attn_mha_forward_backward(p, &in, result(c, st->out), st->rows, weights,
                                                    stats, data(c, F_GRAD_OUTPUT), &g, &ae)
                        : attn_mha_forward(p, &in, result(c, st->out), st->rows, weights, stats,
                                           &ae);
    if (s != ATTN_OK)
        return api_fail_attn(err, &ae);
    if (st->lse >= 0)
        api_lse_rows(st->rows, p->batch * p->heads * p->n, result(c, st->lse));
    return true;
}

static size_t meta_dims(const api_call *c, api_dim *d)
{
    const multihead_state *st = state(c);
    const attn_mha_params *p = &st->p;
    const api_dim shape[] = {
        {"batch", p->batch}, {"n", p->n}, {"m", p->m}, {"d_model", p->d_model},
        {"d_ctx", p->d_ctx}, {"heads", p->heads}, {"kv_heads", p->kv_heads},
        {"d_k", p->d_k}, {"d_v", p->d_v}, {"d_out", p->d_out},
        {"sequences", st->ragged.seqs},
    };
    const size_t n = sizeof shape / sizeof *shape - (st->ragged.seqs > 0 ? 0 : 1);
    memcpy(d, shape, n * sizeof *shape);
    return n;
}

static void release(api_call *c)
{
    multihead_state *st = state(c);
    free(st->rows);
    st->rows = NULL;
    st->p.mask = (attn_mask){0}; /* it pointed into the mask field */
    /* the lengths are kept for meta.shape; the offsets are not needed */
    int64_t seqs = st->ragged.seqs;
    api_ragged_free(&st->ragged);
    st->ragged.seqs = seqs;
    st->p.ragged = (attn_ragged){0};
}

const api_operation api_multihead_op = {
    .route = "/v1/multihead",
    .fields = api_multihead_fields,
    .n_fields = F_COUNT,
    .other = &api_attention_op,
    .f_output_encoding = F_OUTPUT_ENCODING,
    .f_output_dtype = F_OUTPUT_DTYPE,
    .f_return_stats = F_RETURN_STATS,
    .f_grad_output = F_GRAD_OUTPUT,
    .state_size = sizeof(multihead_state),
    .validate = validate,
    .cost = cost,
    .workspace_what = workspace_what,
    .score_bound = score_bound,
    .compute = compute,
    .dims = meta_dims,
    .release = release,
};
