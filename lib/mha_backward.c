/*
 * Multi-head attention, backward (Eq. 16-18 through the projections of
 * Eq. 12-13). Stateless: the projections and the attention are recomputed,
 * then the gradient flows back
 *
 *   dout [B, n, d_out] -> do [B, h, n, d_v]           (through W_O, or un-concat)
 *   do -> dq [B, h, n, d_k], dk, dv [B, h_kv, m, ·]  (attn_sdpa_backward)
 *   dq -> dx, dW_Q, db_Q;  dk, dv -> dcontext (dx for self-attention),
 *                               dW_K, db_K, dW_V, db_V
 *
 * Each gradient is written only when its pointer is non-NULL; for
 * self-attention dx is the sum of the paths through q, k and v.
 */
#include <stdlib.h>

#include "internal.h"
#include "mha.h"

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

typedef struct {
    float *dout_heads; /* [B, h, n, d_v] */
    float *dq, *dk, *dv;
} inner_grads;

static void inner_free(inner_grads *ig)
{
    free(ig->dout_heads);
    free(ig->dq);
    free(ig->dk);
    free(ig->dv);
}

/* From do to dq, dk, dv, then through the input projections. */
static attn_status backward_inner(const attn_mha_params *p, const attn_mha_inputs *in,
                                  const float *dout, const attn_mha_grads *g,
                                  const mha_state *st, attn_error *err)
{
    const mha_layout *lq = &st->lq, *lk = &st->lk, *lv = &st->lv;
    size_t q_elems = (size_t)(p->batch * p->heads * p->n * p->d_k);
    size_t o_elems = (size_t)(p->batch * p->heads * p->n * p->d_v);
    size_t k_elems = (size_t)(p->batch * p->kv_heads * p->m * p->d_k);
    size_t v_elems = (size_t)(p->batch * p->kv_heads * p->m * p->d_v);
    inner_grads ig = {
        .dout_heads = malloc(o_elems * sizeof(float)),
        .dq = malloc(q_elems * sizeof(float)),
        .dk = malloc(k_elems * sizeof(float)),
        .dv = malloc(v_elems * sizeof(float)),
    };
    if (!ig.dout_heads || !ig.dq || !ig.dk || !ig.dv) {
        inner_free(&ig);
        return attn_fail(err, ATTN_ERR_NOMEM,
                         "out of memory for the gradients of multi-head attention");
    }

    attn_status s = mha_split(&st->lo, dout, in->w_o, MHA_W_OUT, NULL, ig.dout_heads, err);
    if (s == ATTN_OK)
        s = attn_sdpa_backward(&st->sdpa, st->q, st->k, st->v, st->o, st->lse,
                               ig.dout_heads, ig.dq, ig.dk, ig.dv, err);
    if (s == ATTN_OK && g->w_q)
        s = mha_weight_grad(lq, in->x, ig.dq, MHA_W_IN, g->w_q, err);
    if (s == ATTN_OK && g->w_k)
        s = mha_weight_grad(lk, st->ctx, ig.dk, MHA_W_IN, g->w_k, err);
    if (s == ATTN_OK && g->w_v)
        s = mha_weight_grad(lv, st->ctx, ig.dv, MHA_W_IN, g->w_v, err);
    if (s == ATTN_OK) {
        if (g->b_q)
            mha_bias_grad_heads(lq, ig.dq, g->b_q);
        if (g->b_k)
            mha_bias_grad_heads(lk, ig.dk, g->b_k);
        if (g->b_v)
            mha_bias_grad_heads(lv, ig.dv, g->b_v);
    }

    if (s == ATTN_OK && g->x) {
        s = mha_join(lq, ig.dq, in->w_q, MHA_W_IN, NULL, false, g->x, err);
        /* Self-attention: x also fed k and v. */
        if (s == ATTN_OK && in->context == NULL)
            s = mha_join(lk, ig.dk, in->w_k, MHA_W_IN, NULL, true, g->x, err);
        if (s == ATTN_OK && in->context == NULL)
            s = mha_join(lv, ig.dv, in->w_v, MHA_W_IN, NULL, true, g->x, err);
    }
    if (s == ATTN_OK && g->context) {
        s = mha_join(lk, ig.dk, in->w_k, MHA_W_IN, NULL, false, g->context, err);
        if (s == ATTN_OK)
            s = mha_join(lv, ig.dv, in->w_v, MHA_W_IN, NULL, true, g->context, err);
    }
    inner_free(&ig);
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

    bool inner = wants_inner(g);
    if (!inner && g->w_o == NULL && g->b_o == NULL)
        return ATTN_OK;
    s = mha_attend(p, in, &st, inner, NULL, NULL, err);
    if (s != ATTN_OK)
        return s;
    /* dW_O = concat(o)ᵀ dout and db_O = Σ dout need only the forward. */
    if (g->w_o)
        s = mha_weight_grad(&st.lo, dout, st.o, MHA_W_OUT, g->w_o, err);
    if (s == ATTN_OK && g->b_o)
        mha_bias_grad_cat(&st.lo, dout, g->b_o);
    if (s == ATTN_OK && inner)
        s = backward_inner(p, in, dout, g, &st, err);
    mha_state_free(&st);
    return s;
}
