/*
 * One query row of attention over a cache in double precision: the
 * fallback for the rare row whose float accumulation overflowed (scores
 * past float32's range, or values near it whose weighted sum passed it on
 * the way), as sdpa_exact.c is for attn_sdpa_forward. The keys and values
 * are read from the pages one element at a time: slow, and only ever run
 * for such rows.
 */
#include <math.h>
#include <stdlib.h>

#include "bf16.h"
#include "kv.h"

static double stored(const attn_kv_cache *c, const unsigned char *base, int64_t at)
{
    uint16_t h;
    float f;
    switch (c->config.dtype) {
    case ATTN_KV_FLOAT16:
        memcpy(&h, base + at * 2, 2);
        return kv_f16_to_f32(h);
    case ATTN_KV_BFLOAT16:
        memcpy(&h, base + at * 2, 2);
        return kv_bf16_to_f32(h);
    case ATTN_KV_FLOAT32:
        break;
    }
    memcpy(&f, base + at * 4, 4);
    return f;
}

/* An operand of the products as the call's precision reads it: in
 * bfloat16 rounded as the kernels round it (the weights are not). */
static double element(const kv_call *kc, const unsigned char *base, int64_t at)
{
    const double x = stored(kc->cache, base, at);
    return kc->call.bf16 ? (double)bf16_round((float)x) : x;
}

/* The final score of query (h, i) against key j in double; false when
 * the causal mask or the window hides it. */
static bool score_exact(const kv_call *kc, int64_t h, int64_t i, int64_t j, const float *q_row,
                        double *x)
{
    const sdpa_call *c = &kc->call;
    const attn_sdpa_params *p = c->p;
    const int64_t pos = i + c->offset;
    if (j < pos - c->before || j > pos + c->after)
        return false;
    const unsigned char *kt = kv_head_block(kc->cache, j / ATTN_KV_PAGE, h / c->group);
    double s = 0.0;
    for (int64_t t = 0; t < p->d_k; t++)
        s += (kc->call.bf16 ? (double)bf16_round(q_row[t]) : (double)q_row[t]) *
             element(kc, kt, t * ATTN_KV_PAGE + j % ATTN_KV_PAGE);
    s *= p->scale;
    const float cap = p->variants.softcap;
    if (cap > 0.0f)
        s = cap * tanh(s / cap);
    *x = s - (double)sdpa_alibi_slope(c, 0, h) * (double)llabs(pos - j);
    return true;
}

attn_softmax_row kv_forward_row_exact(const kv_call *kc, int64_t h, int64_t i,
                                      const float *q_row, float *out)
{
    const attn_sdpa_params *p = kc->call.p;
    double m = -INFINITY, x;
    for (int64_t j = 0; j < p->n_k; j++)
        if (score_exact(kc, h, i, j, q_row, &x) && x > m)
            m = x;
    double l = 0.0;
    for (int64_t j = 0; j < p->n_k; j++)
        if (score_exact(kc, h, i, j, q_row, &x))
            l += exp(x - m);
    for (int64_t t = 0; t < p->d_v; t++)
        out[t] = 0.0f;
    if (!(l > 0.0))
        return (attn_softmax_row){.max = -INFINITY, .sum = 0.0f};
    /* Normalised terms: every partial sum stays within max |v|. */
    for (int64_t t0 = 0; t0 < p->d_v; t0 += 64) {
        double acc[64] = {0};
        const int64_t width = p->d_v - t0 < 64 ? p->d_v - t0 : 64;
        for (int64_t j = 0; j < p->n_k; j++) {
            if (!score_exact(kc, h, i, j, q_row, &x))
                continue;
            const double a = exp(x - m) / l;
            const unsigned char *v = kv_head_block(kc->cache, j / ATTN_KV_PAGE, h / kc->call.group) +
                                     kc->cache->v_offset;
            const int64_t row = j % ATTN_KV_PAGE * p->d_v + t0;
            for (int64_t t = 0; t < width; t++)
                acc[t] += a * element(kc, v, row + t);
        }
        for (int64_t t = 0; t < width; t++)
            out[t0 + t] = (float)acc[t];
    }
    return (attn_softmax_row){.max = (float)m, .sum = (float)l};
}
