/*
 * Multi-head attention, forward (Eq. 12-13):
 *   head_i = Attention(x W_Q,i + b_Q,i, ctx W_K,j + b_K,j, ctx W_V,j + b_V,j)
 *   out    = concat(head_1 .. head_h) W_O + b_O
 * with j = i / (h / h_kv) (grouped-query) and ctx = context, or x itself.
 *
 *   x [B, n, d_model], context [B, m, d_ctx] -> out [B, n, d_out]
 *   optional weights [B, h, n, m], stats over every head
 */
#include "internal.h"
#include "mha.h"

attn_status attn_mha_forward(const attn_mha_params *p, const attn_mha_inputs *in,
                             float *out, attn_softmax_row *rows, float *weights,
                             attn_stats *stats, attn_error *err)
{
    mha_state st;
    attn_status s = mha_prepare(p, in, weights != NULL, &st, err);
    if (s != ATTN_OK)
        return s;
    if (out == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "multi-head attention: out is required");
    s = mha_attend(p, in, &st, false, out, rows, weights, stats, err);
    if (s != ATTN_OK)
        return s;
    mha_output(p, in, &st, out);
    mha_state_free(&st);
    return mha_finish(p, ATTN_OK, err);
}

attn_status attn_mha_forward_backward(const attn_mha_params *p, const attn_mha_inputs *in,
                                      float *out, attn_softmax_row *rows, float *weights,
                                      attn_stats *stats, const float *dout,
                                      const attn_mha_grads *g, attn_error *err)
{
    mha_state st;
    attn_status s = mha_prepare(p, in, weights != NULL, &st, err);
    if (s != ATTN_OK)
        return s;
    if (out == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "multi-head attention: out is required");
    s = mha_attend(p, in, &st, true, out, rows, weights, stats, err);
    if (s != ATTN_OK)
        return s;
    mha_output(p, in, &st, out);
    s = mha_backward_from(p, in, &st, dout, g, err);
    mha_state_free(&st);
    return mha_finish(p, s, err);
}

/*
 * Projections 2*B*n*d_model*h*d_k + 2*B*m*d_ctx*h_kv*(d_k + d_v), the
 * attention of the inner attn_sdpa_forward, and the output projection
 * 2*B*n*h*d_v*d_out. The params cannot say whether w_o is given, so the output
 * projection is always counted: an upper bound, which is what a work limit
 * wants; a caller without w_o may subtract it.
 */
double attn_mha_flops(const attn_mha_params *p)
{
    if (p == NULL)
        return 0.0;
    double B = (double)p->batch, n = (double)p->n, m = (double)p->m;
    double h = (double)p->heads, h_kv = (double)p->kv_heads;
    double d_k = (double)p->d_k, d_v = (double)p->d_v;
    attn_sdpa_params inner = {
        .batch = p->batch, .heads_q = p->heads, .heads_kv = p->kv_heads,
        .n_q = p->n, .n_k = p->m, .d_k = p->d_k, .d_v = p->d_v,
        .scale = p->scale, .causal = p->causal, .mask = p->mask,
        .threads = p->threads, .variants = p->variants, .ragged = p->ragged,
    };
    return 2.0 * B * n * (double)p->d_model * h * d_k +
           2.0 * B * m * (double)p->d_ctx * h_kv * (d_k + d_v) +
           attn_sdpa_flops(&inner) +
           2.0 * B * n * h * d_v * (double)p->d_out;
}
