/*
 * Multi-head attention, backward (Eq. 16-18 through the projections of
 * Eq. 12-13), from the forward's state (mha_attend with rows):
 *
 *   dout [B, n, d_out] -> do [B, n, h*d_v]      (do = dout W_O^T, or dout)
 *   do -> dq [B, n, h*d_k], dk, dv [B, m, h_kv*·]   (attn_sdpa_backward, BNHD)
 *   dq -> dx = dq W_Q^T, dW_Q = x^T dq, db_Q = column sums of dq
 *   dk, dv -> dcontext (dx for self-attention), dW_K, db_K, dW_V, db_V
 *   dW_O = o^T dout, db_O = column sums of dout
 *
 * Every product is one GEMM over all heads and positions (mha_gemm). Each
 * gradient is written only when its pointer is non-NULL; for self-attention
 * dx is the sum of the paths through q, k and v.
 */
#include <stdlib.h>

#include "internal.h"
#include "mha.h"
#include "sdpa.h"

static attn_status check_grads(const attn_mha_inputs *in, const float *dout,
                               const attn_mha_grads *g, attn_error *err)
{
    if (dout == NULL || g == NULL)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "multi-head attention backward: dout and grads are required");
    if (g->context != NULL && in->context == NULL)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "multi-head attention backward: a context gradient was asked "
                         "for self-attention (no context)");
    if ((g->w_o != NULL || g->b_o != NULL) && in->w_o == NULL)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "multi-head attention backward: a w_o or b_o gradient was "
                         "asked without w_o");
    return ATTN_OK;
}

/* Gradients behind the attention: x, context, and the q, k, v projections. */
static bool wants_inner(const attn_mha_grads *g)
{
    return g->x || g->context || g->w_q || g->w_k || g->w_v || g->b_q || g->b_k ||
           g->b_v;
}

/* d_in [B*rows, d_in] (+)= d_proj [B*rows, width] W^T for W [d_in, width]. */
static void input_grad(const mha_state *st, int64_t rows, int64_t d_in, int64_t width,
                       const float *d_proj, const float *w, bool accumulate, float *d)
{
    mha_gemm(st, false, true, rows, d_in, width, d_proj, width, w, width, NULL,
             accumulate, d, d_in);
}

/* dW [d_in, width] = in^T [d_in, B*rows] d_proj [B*rows, width]. */
static void weight_grad(const mha_state *st, int64_t rows, int64_t d_in, int64_t width,
                        const float *in, const float *d_proj, float *dw)
{
    mha_gemm(st, true, false, d_in, width, rows, in, d_in, d_proj, width, NULL,
             false, dw, width);
}

/* From do to dq, dk, dv, then through the input projections. */
static attn_status backward_inner(const attn_mha_params *p, const attn_mha_inputs *in,
                                  const mha_state *st, const float *d_o,
                                  const attn_mha_grads *g, attn_error *err)
{
    const int64_t rows_q = p->batch * p->n, rows_k = p->batch * p->m;
    const int64_t wq = p->heads * p->d_k, wk = p->kv_heads * p->d_k, wv = p->kv_heads * p->d_v;
    float *dq = sdpa_alloc(rows_q * wq, sizeof *dq);
    float *dk = sdpa_alloc(rows_k * wk, sizeof *dk);
    float *dv = sdpa_alloc(rows_k * wv, sizeof *dv);
    attn_status s = ATTN_OK;
    if (!dq || !dk || !dv)
        s = attn_fail(err, ATTN_ERR_NOMEM,
                      "out of memory for the gradients of multi-head attention");
    if (s == ATTN_OK)
        s = attn_sdpa_backward(&st->sdpa, st->q, st->k, st->v, st->o, st->rows, d_o, dq,
                               dk, dv, err);
    if (s == ATTN_OK) {
        if (g->w_q)
            weight_grad(st, rows_q, p->d_model, wq, in->x, dq, g->w_q);
        if (g->w_k)
            weight_grad(st, rows_k, p->d_ctx, wk, st->ctx, dk, g->w_k);
        if (g->w_v)
            weight_grad(st, rows_k, p->d_ctx, wv, st->ctx, dv, g->w_v);
        if (g->b_q)
            mha_column_sums(dq, rows_q, wq, g->b_q);
        if (g->b_k)
            mha_column_sums(dk, rows_k, wk, g->b_k);
        if (g->b_v)
            mha_column_sums(dv, rows_k, wv, g->b_v);
        if (g->x) {
            input_grad(st, rows_q, p->d_model, wq, dq, in->w_q, false, g->x);
            /* Self-attention: x also fed k and v. */
            if (in->context == NULL) {
                input_grad(st, rows_k, p->d_ctx, wk, dk, in->w_k, true, g->x);
                input_grad(st, rows_k, p->d_ctx, wv, dv, in->w_v, true, g->x);
            }
        }
        if (g->context) {
            input_grad(st, rows_k, p->d_ctx, wk, dk, in->w_k, false, g->context);
            input_grad(st, rows_k, p->d_ctx, wv, dv, in->w_v, true, g->context);
        }
    }
    sdpa_free(dq);
    sdpa_free(dk);
    sdpa_free(dv);
    return s;
}

attn_status mha_backward_from(const attn_mha_params *p, const attn_mha_inputs *in,
                              const mha_state *st, const float *dout,
                              const attn_mha_grads *g, attn_error *err)
{
    attn_status s = check_grads(in, dout, g, err);
    if (s != ATTN_OK)
        return s;
    const int64_t rows = p->batch * p->n, cat = p->heads * p->d_v;
    /* dW_O = concat(o)^T dout and db_O = column sums of dout. */
    if (g->w_o)
        weight_grad(st, rows, cat, p->d_out, st->o, dout, g->w_o);
    if (g->b_o)
        mha_column_sums(dout, rows, p->d_out, g->b_o);
    if (!wants_inner(g))
        return ATTN_OK;
    if (in->w_o == NULL)
        return backward_inner(p, in, st, dout, g, err);
    float *d_o = sdpa_alloc(rows * cat, sizeof *d_o);
    if (d_o == NULL)
        return attn_fail(err, ATTN_ERR_NOMEM,
                         "out of memory for the gradients of multi-head attention");
    input_grad(st, rows, cat, p->d_out, dout, in->w_o, false, d_o);
    s = backward_inner(p, in, st, d_o, g, err);
    sdpa_free(d_o);
    return s;
}

attn_status attn_mha_backward(const attn_mha_params *p, const attn_mha_inputs *in,
                              const float *dout, const attn_mha_grads *g,
                              attn_error *err)
{
    mha_state st;
    attn_status s = mha_prepare(p, in, false, &st, err);
    if (s == ATTN_OK)
        s = check_grads(in, dout, g, err);
    if (s != ATTN_OK)
        return s;
    if (!wants_inner(g) && g->w_o == NULL && g->b_o == NULL)
        return ATTN_OK;
    s = mha_attend(p, in, &st, true, NULL, NULL, NULL, NULL, err);
    if (s != ATTN_OK)
        return s;
    s = mha_backward_from(p, in, &st, dout, g, err);
    mha_state_free(&st);
    return mha_finish(p, s, err);
}
