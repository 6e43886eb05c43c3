/*
 * One query row of the forward pass in double precision: the fallback for
 * the rare row whose float accumulation overflowed. An output row is the
 * weighted mean of rows of v, so it is finite whenever v is, but the
 * unnormalised sum sum_j exp(x_j - m) v_j the kernels accumulate can pass
 * float32's maximum on the way (v near 3e38); scores q.k can overflow too.
 * In double neither happens for finite float inputs. In bfloat16 the
 * operands are rounded as the kernels round them (the weights are not).
 */
#include <math.h>
#include <stdlib.h>

#include "bf16.h"
#include "sdpa.h"

/* Element i of an operand of the products as the call's precision reads it. */
static double operand(const sdpa_call *c, sdpa_src s, int64_t i)
{
    const float x = sdpa_src_value(s, i);
    return c->bf16 ? (double)bf16_round(x) : (double)x;
}

double attn_softmax_lse(attn_softmax_row row)
{
    return row.sum > 0.0f ? (double)row.max + log((double)row.sum) : -INFINITY;
}

/* The final score of (query i, key j) in double; false when the key is
 * hidden from the query (causal, boolean mask). */
static bool score_exact(const sdpa_call *c, int64_t b, int64_t h, int64_t i, int64_t j,
                        sdpa_src q_row, double *x)
{
    const attn_sdpa_params *p = c->p;
    const int64_t pos = i + c->offset;
    if (j < pos - c->before || j > pos + c->after)
        return false;
    const attn_mask *m = &p->mask;
    int64_t at = b * m->stride[0] + h * m->stride[1] + i * m->stride[2] + j * m->stride[3];
    if ((m->kind == ATTN_MASK_BOOL && m->allowed[at] == 0) ||
        (m->kind == ATTN_MASK_BIAS && m->bias[at] == -INFINITY))
        return false;
    const sdpa_src k_row = sdpa_src_at(sdpa_src_k(c, b, h), j * c->ldk);
    double s = 0.0;
    for (int64_t t = 0; t < p->d_k; t++)
        s += operand(c, q_row, t) * operand(c, k_row, t);
    s *= p->scale;
    const float cap = p->variants.softcap;
    if (cap > 0.0f)
        s = cap * tanh(s / cap);
    s -= (double)sdpa_alibi_slope(c, b, h) * (double)llabs(pos - j);
    *x = s + (m->kind == ATTN_MASK_BIAS ? (double)m->bias[at] : 0.0);
    return true;
}

attn_softmax_row sdpa_forward_row_exact(const sdpa_call *c, int64_t b, int64_t h, int64_t i,
                                        float *out, float *weights)
{
    const attn_sdpa_params *p = c->p;
    const sdpa_src q_row = sdpa_src_at(sdpa_src_q(c, b, h), i * c->ldq);
    const sdpa_src v = sdpa_src_v(c, b, h);
    /* The keys of the row's sequence (every key when not ragged); the
     * caller's weights elsewhere are 0 already. */
    double m = -INFINITY, x;
    for (int64_t j = c->k_lo; j < c->k_hi; j++)
        if (score_exact(c, b, h, i, j, q_row, &x) && x > m)
            m = x;
    double l = 0.0;
    for (int64_t j = c->k_lo; j < c->k_hi; j++)
        if (score_exact(c, b, h, i, j, q_row, &x))
            l += exp(x - m);
    for (int64_t t = 0; t < p->d_v; t++)
        out[t] = 0.0f;
    for (int64_t j = c->k_lo; weights != NULL && j < c->k_hi; j++)
        weights[j] = l > 0.0 && score_exact(c, b, h, i, j, q_row, &x) ? (float)(exp(x - m) / l)
                                                                      : 0.0f;
    if (!(l > 0.0))
        return (attn_softmax_row){.max = -INFINITY, .sum = 0.0f};
    /* Normalised terms: every partial sum stays within max |v|. */
    for (int64_t t0 = 0; t0 < p->d_v; t0 += 64) {
        double acc[64] = {0};
        int64_t width = p->d_v - t0 < 64 ? p->d_v - t0 : 64;
        for (int64_t j = c->k_lo; j < c->k_hi; j++) {
            if (!score_exact(c, b, h, i, j, q_row, &x))
                continue;
            double a = exp(x - m) / l;
            const sdpa_src v_row = sdpa_src_at(v, j * c->ldv + t0);
            for (int64_t t = 0; t < width; t++)
                acc[t] += a * operand(c, v_row, t);
        }
        for (int64_t t = 0; t < width; t++)
            out[t0 + t] = (float)acc[t];
    }
    return (attn_softmax_row){.max = (float)m, .sum = (float)l};
}
