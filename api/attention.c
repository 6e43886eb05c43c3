/*
 * POST /v1/attention — scaled dot-product attention (Eq. 10), causal
 * (Eq. 14-15), grouped-query, with gradients (Eq. 16-18).
 *
 * Request tensors, by rank (all three the same rank):
 *   2: q [n_q, d_k]        k [n_k, d_k]        v [n_k, d_v]        (B = H = 1)
 *   3: q [H_q, n_q, d_k]   k [H_kv, n_k, d_k]  v [H_kv, n_k, d_v]  (B = 1)
 *   4: q [B, H_q, n_q, d_k] ...
 * output [..., n_q, d_v], weights [..., n_q, n_k], lse [..., n_q], grad q/k/v
 * as the inputs, where "..." are q's leading dimensions. The variants
 * (window, alibi_slopes [H_q] or [B, H_q], softcap, rope) are libattn's
 * attn_variants, judged in api/variants.c.
 *
 * The steps (decode, validate, cost, compute, encode) are the skeleton's
 * (handle.c); this file has the field table, the shapes, the cost terms and
 * the call into libattn.
 */
#include "request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    F_Q, F_K, F_V, F_CAUSAL, F_MASK, F_SCALE, F_RETURN_WEIGHTS, F_RETURN_STATS,
    F_GRAD_OUTPUT, F_OUTPUT_ENCODING, F_OUTPUT_DTYPE, F_WINDOW, F_ALIBI_SLOPES, F_SOFTCAP,
    F_ROPE, F_RETURN_LSE, F_SEQ_LENS, F_SEQ_LENS_K, F_PRECISION, F_COUNT
};

static const api_field api_attention_fields[] = {
    [F_Q] = {"q", API_FIELD_OPERAND, true},
    [F_K] = {"k", API_FIELD_OPERAND, true},
    [F_V] = {"v", API_FIELD_OPERAND, true},
    [F_CAUSAL] = {"causal", API_FIELD_BOOL, false},
    [F_MASK] = {"mask", API_FIELD_MASK, false},
    [F_SCALE] = {"scale", API_FIELD_NUMBER, false},
    [F_RETURN_WEIGHTS] = {"return_weights", API_FIELD_BOOL, false},
    [F_RETURN_STATS] = {"return_stats", API_FIELD_BOOL, false},
    [F_GRAD_OUTPUT] = {"grad_output", API_FIELD_OPERAND, false},
    [F_OUTPUT_ENCODING] = {"output_encoding", API_FIELD_ENCODING, false},
    [F_OUTPUT_DTYPE] = {"output_dtype", API_FIELD_DTYPE, false},
    [F_WINDOW] = {"window", API_FIELD_WINDOW, false},
    [F_ALIBI_SLOPES] = {"alibi_slopes", API_FIELD_TENSOR, false},
    [F_SOFTCAP] = {"softcap", API_FIELD_NUMBER, false},
    [F_ROPE] = {"rope", API_FIELD_ROPE, false},
    [F_RETURN_LSE] = {"return_lse", API_FIELD_BOOL, false},
    [F_SEQ_LENS] = {"seq_lens", API_FIELD_LENGTHS, false},
    [F_SEQ_LENS_K] = {"seq_lens_k", API_FIELD_LENGTHS, false},
    [F_PRECISION] = {"precision", API_FIELD_PRECISION, false},
};

static const char *const FORMS =
    "[n, d], [heads, n, d] or [batch, heads, n, d]";

typedef struct {
    attn_sdpa_params p;
    api_ragged ragged;      /* seq_lens, seq_lens_k: p.ragged points into it */
    int out, weights, lse, dq, dk, dv; /* the planned results, -1 when not asked */
    attn_softmax_row *rows; /* [B, H_q, n_q]: the forward pass's, for lse and the backward */
} attention_state;

static attention_state *state(const api_call *c)
{
    return c->state;
}

/* B, H, n, d of a rank-2..4 tensor. */
static void dims(const codec_tensor *t, int64_t *b, int64_t *h, int64_t *n,
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
static bool check_qkv(const codec_tensor *q, const codec_tensor *k,
                      const codec_tensor *v, api_error *err)
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

/* Every score is one (query, key) pair of one query head; the two products
 * are in attn_sdpa_flops. */
static void cost(const api_call *c, api_cost_terms *t)
{
    const attention_state *st = state(c);
    const attn_sdpa_params *p = &st->p;
    double pairs = (double)p->batch * (double)p->heads_q;
    t->flops = attn_sdpa_flops(p);
    t->pairs = pairs;
    t->rows = pairs * (double)p->n_q;
    t->scores = t->rows * (double)p->n_k;
    if (st->ragged.seqs > 0) {
        /* a ragged batch: each sequence's (query, key) block, and its heads */
        t->pairs = (double)st->ragged.seqs * (double)p->heads_q;
        t->scores = (double)p->heads_q * st->ragged.pairs;
    }
    t->masked = p->mask.kind != ATTN_MASK_NONE;
    t->weights = state(c)->weights >= 0 ? t->scores : 0;
    api_variant_cost(p, t); /* a window narrows the scores, not the weights */
    /* Memory: libattn's workspaces for the most threads the request may
     * get, and the softmax rows kept for the lse and the backward. */
    attn_sdpa_params at_most = *p;
    at_most.threads = api_max_threads(&c->lim);
    bool rows = c->want_grad || state(c)->lse >= 0;
    t->workspace = attn_sdpa_workspace(&at_most, t->weights > 0, c->want_stats, c->want_grad) +
                   (rows ? t->rows * (double)sizeof(attn_softmax_row) : 0) +
                   /* a ragged batch's offsets of the rows and of the keys */
                   2.0 * (double)(st->ragged.seqs + 1) * (double)sizeof(int64_t);
    if (p->precision == ATTN_PRECISION_BFLOAT16) {
        t->bf16_flops = t->flops;
        t->rounded = (double)p->batch * ((double)p->heads_q * (double)p->n_q * (double)p->d_k +
                                         (double)p->heads_kv * (double)p->n_k *
                                             (double)(p->d_k + p->d_v));
    }
}

static void workspace_what(const api_call *c, char *buf, size_t cap)
{
    const attn_sdpa_params *p = &state(c)->p;
    snprintf(buf, cap, "libattn's tiles and packed keys for %lld head%s of %lld x %lld",
             (long long)(p->batch * p->heads_q), p->batch * p->heads_q == 1 ? "" : "s",
             (long long)p->n_q, (long long)p->n_k);
}

/* Cauchy-Schwarz: |scale q.k + bias| <= max(scale, 1) |q_i| |k_j| + max|bias|,
 * and ALiBi adds at most max|slope| times the longest distance (RoPE keeps
 * the norms; softcap only shrinks the scaled score). An additive mask or
 * slopes that large are blamed on themselves, not on q and k. */
static double score_bound(const api_call *c, const char **blame)
{
    const attn_sdpa_params *p = &state(c)->p;
    const codec_tensor *q = &c->f[F_Q].tensor, *k = &c->f[F_K].tensor;
    double bias = p->mask.kind == ATTN_MASK_BIAS
                      ? api_max_abs(c->f[F_MASK].tensor.f32, c->f[F_MASK].tensor.count)
                      : 0;
    double qk = fmax(p->scale, 1.0) * api_operand_max_row_norm(q, q->count / p->d_k, p->d_k) *
                api_operand_max_row_norm(k, k->count / p->d_k, p->d_k);
    double alibi = api_alibi_bound(&p->variants, &c->f[F_ALIBI_SLOPES].tensor, p->n_q, p->n_k);
    *blame = alibi > qk && alibi > bias ? "alibi_slopes times the distances"
             : bias > qk                ? "the additive mask's values"
                                        : "q and k";
    return qk + bias + alibi;
}

/* Fills the parameters and plans the results the client will see, or says
 * which field does not fit. */
static bool validate(api_call *c, api_error *err)
{
    attention_state *st = state(c);
    const codec_tensor *q = &c->f[F_Q].tensor, *k = &c->f[F_K].tensor,
                     *v = &c->f[F_V].tensor;
    if (!check_qkv(q, k, v, err))
        return false;
    int64_t bq, hq, nq, dq, hk, nk, dv, unused;
    dims(q, &bq, &hq, &nq, &dq);
    dims(k, &unused, &hk, &nk, &unused);
    dv = v->shape[v->rank - 1];

    int r = q->rank;
    int64_t out_shape[4], weights_shape[4];
    memcpy(out_shape, q->shape, sizeof out_shape);
    out_shape[r - 1] = dv;
    memcpy(weights_shape, q->shape, sizeof weights_shape);
    weights_shape[r - 1] = nk;

    st->p = (attn_sdpa_params){
        .batch = bq, .heads_q = hq, .heads_kv = hk, .n_q = nq, .n_k = nk,
        .d_k = dq, .d_v = dv,
        .scale = c->f[F_SCALE].present ? c->f[F_SCALE].number : attn_default_scale(dq),
        .causal = c->f[F_CAUSAL].present && c->f[F_CAUSAL].flag,
        .threads = 1,
        .precision = c->f[F_PRECISION].present ? c->f[F_PRECISION].precision
                                               : ATTN_PRECISION_FLOAT32,
    };
    if (!(st->p.scale > 0))
        return api_fail(err, 422, "invalid_value", "scale",
                        "scale must be greater than 0 (as a float32), got %g",
                        (double)c->f[F_SCALE].number);
    static const api_ragged_names names = {"seq_lens", "seq_lens_k", "q", "n_q", "k", "n_k"};
    if (!api_ragged_setup(&c->f[F_SEQ_LENS], &c->f[F_SEQ_LENS_K], bq, nq, nk, &names,
                          &st->ragged, err))
        return false;
    /* bfloat16 products read bfloat16 inputs as they came; float32 ones
     * read them widened. */
    attn_sdpa_dtypes *dt = &st->p.dtype;
    if (!api_operand_setup(&c->f[F_Q], "q", st->p.precision, &dt->q, err) ||
        !api_operand_setup(&c->f[F_K], "k", st->p.precision, &dt->k, err) ||
        !api_operand_setup(&c->f[F_V], "v", st->p.precision, &dt->v, err) ||
        !api_operand_setup(&c->f[F_GRAD_OUTPUT], "grad_output", st->p.precision, &dt->dout,
                           err))
        return false;
    if (c->f[F_MASK].present &&
        !api_mask_setup(&c->f[F_MASK].tensor, r, weights_shape, bq, hq, nq, nk,
                        &st->p.mask, err))
        return api_ragged_mask_hint(&st->ragged, err);
    const api_variant_values variants = {&c->f[F_WINDOW], &c->f[F_ALIBI_SLOPES],
                                         &c->f[F_SOFTCAP], &c->f[F_ROPE]};
    const api_variant_shape heads = {bq, hq, dq, "heads_q"};
    if (!api_variants_setup(&variants, &heads, &st->p.variants, err))
        return false;
    st->p.ragged = api_ragged_lib(&st->ragged);
    if (c->want_grad &&
        !api_check_shape(&c->f[F_GRAD_OUTPUT].tensor, "grad_output", r, out_shape,
                         "the output [..., n_q, d_v]", err))
        return false;

    bool want_weights = c->f[F_RETURN_WEIGHTS].present && c->f[F_RETURN_WEIGHTS].flag;
    st->out = api_plan(c, "output", false, "the output", r, out_shape);
    st->weights = want_weights ? api_plan(c, "weights", false, "the weights", r, weights_shape)
                               : -1;
    /* lse [..., n_q]: q's shape without d_k */
    bool want_lse = c->f[F_RETURN_LSE].present && c->f[F_RETURN_LSE].flag;
    st->lse = want_lse ? api_plan(c, "lse", false, "the lse", r - 1, q->shape) : -1;
    if (want_lse)
        c->results[st->lse].empty_rows = true;
    st->dq = st->dk = st->dv = -1;
    if (c->want_grad) {
        st->dq = api_plan(c, "q", true, "the gradient of q", r, q->shape);
        st->dk = api_plan(c, "k", true, "the gradient of k", r, k->shape);
        st->dv = api_plan(c, "v", true, "the gradient of v", r, v->shape);
    }
    return true;
}

static float *result(api_call *c, int index)
{
    return index >= 0 ? c->results[index].data : NULL;
}

static bool compute(api_call *c, int threads, api_error *err)
{
    attention_state *st = state(c);
    attn_sdpa_params *p = &st->p;
    p->threads = threads;
    p->cancel = c->lim.cancel;
    int64_t rows = p->batch * p->heads_q * p->n_q;
    if ((c->want_grad || st->lse >= 0) &&
        !(st->rows = malloc((size_t)rows * sizeof *st->rows)))
        return api_fail(err, 500, "out_of_memory", "",
                        "out of memory for the output of this request");

    const void *q = api_field_operand(c, F_Q), *k = api_field_operand(c, F_K),
               *v = api_field_operand(c, F_V);
    float *out = result(c, st->out);
    attn_error ae = {0};
    if (attn_sdpa_forward_in(p, q, k, v, out, st->rows, result(c, st->weights),
                             c->want_stats ? &c->stats : NULL, &ae) != ATTN_OK)
        return api_fail_attn(err, &ae);
    if (st->lse >= 0)
        api_lse_rows(st->rows, rows, result(c, st->lse));
    if (!c->want_grad)
        return true;
    /* The output must be finite for the backward pass to mean anything. */
    if (!api_check_output(out, rows * p->d_v, "the output", CODEC_ENC_NESTED, err))
        return false;
    if (attn_sdpa_backward_in(p, q, k, v, out, st->rows, api_field_operand(c, F_GRAD_OUTPUT),
                              result(c, st->dq), result(c, st->dk), result(c, st->dv),
                              &ae) != ATTN_OK)
        return api_fail_attn(err, &ae);
    return true;
}

static size_t meta_dims(const api_call *c, api_dim *d)
{
    const attention_state *st = state(c);
    const attn_sdpa_params *p = &st->p;
    const api_dim shape[] = {
        {"batch", p->batch}, {"heads_q", p->heads_q}, {"heads_kv", p->heads_kv},
        {"n_q", p->n_q}, {"n_k", p->n_k}, {"d_k", p->d_k}, {"d_v", p->d_v},
        {"sequences", st->ragged.seqs},
    };
    const size_t n = sizeof shape / sizeof *shape - (st->ragged.seqs > 0 ? 0 : 1);
    memcpy(d, shape, n * sizeof *shape);
    return n;
}

static void release(api_call *c)
{
    attention_state *st = state(c);
    free(st->rows);
    st->rows = NULL;
    st->p.mask = (attn_mask){0}; /* it pointed into the mask field */
    /* the lengths are kept for meta.shape; the offsets are not needed */
    int64_t seqs = st->ragged.seqs;
    api_ragged_free(&st->ragged);
    st->ragged.seqs = seqs;
    st->p.ragged = (attn_ragged){0};
}

const api_operation api_attention_op = {
    .route = "/v1/attention",
    .fields = api_attention_fields,
    .n_fields = F_COUNT,
    .other = &api_multihead_op,
    .f_output_encoding = F_OUTPUT_ENCODING,
    .f_output_dtype = F_OUTPUT_DTYPE,
    .f_return_stats = F_RETURN_STATS,
    .f_grad_output = F_GRAD_OUTPUT,
    .state_size = sizeof(attention_state),
    .validate = validate,
    .cost = cost,
    .workspace_what = workspace_what,
    .score_bound = score_bound,
    .compute = compute,
    .dims = meta_dims,
    .release = release,
};
