/*
 * The pieces of a tile that every kernel shares: where a head's rows are,
 * which sequence of a ragged batch a unit works in, which keys the causal
 * mask leaves a block of rows, and the hooks through which a forward
 * kernel feeds the optional outputs (statistics, weights). The arithmetic
 * itself is in the kernels (kern.h).
 */
#include <math.h>
#include <string.h>

#include "kern.h"

sdpa_call sdpa_call_of(const attn_sdpa_params *p, const void *q, const void *k,
                       const void *v)
{
    const attn_sdpa_dtypes *dt = &p->dtype;
    const bool q16 = dt->q == ATTN_DTYPE_BFLOAT16, k16 = dt->k == ATTN_DTYPE_BFLOAT16,
               v16 = dt->v == ATTN_DTYPE_BFLOAT16;
    const bool bnhd = p->layout == ATTN_LAYOUT_BNHD;
    const attn_variants *var = &p->variants;
    int64_t before = SDPA_FAR, after = SDPA_FAR;
    if (var->window && var->window_left >= 0)
        before = var->window_left;
    if (var->window && var->window_right >= 0)
        after = var->window_right;
    if (p->causal && after > 0)
        after = 0;
    return (sdpa_call){
        .p = p, .q = q16 ? NULL : q, .k = k16 ? NULL : k, .v = v16 ? NULL : v,
        .q16 = q16 ? q : NULL, .k16 = k16 ? k : NULL, .v16 = v16 ? v : NULL,
        .group = p->heads_q / p->heads_kv,
        .offset = p->n_k - p->n_q,
        .ldq = bnhd ? p->heads_q * p->d_k : p->d_k,
        .ldk = bnhd ? p->heads_kv * p->d_k : p->d_k,
        .ldv = bnhd ? p->heads_kv * p->d_v : p->d_v,
        .ldo = bnhd ? p->heads_q * p->d_v : p->d_v,
        .before = before, .after = after,
        .plain = p->mask.kind == ATTN_MASK_NONE && var->alibi_slopes == NULL &&
                 !(var->softcap > 0.0f),
        .q_lo = 0, .q_hi = p->n_q, .k_lo = 0, .k_hi = p->n_k,
        .bf16 = p->precision == ATTN_PRECISION_BFLOAT16,
    };
}

int64_t sdpa_seq_count(const attn_sdpa_params *p)
{
    return p->ragged.seqs > 0 ? p->ragged.seqs : p->batch;
}

/* (a field added to sdpa_call goes into the initializer below too) */
_Static_assert(sizeof(void *) != 8 || sizeof(sdpa_call) == 168, "sdpa_call_seq: every field");

sdpa_call sdpa_call_seq(const sdpa_call *c, int64_t s, int64_t *b)
{
    const attn_ragged *r = &c->p->ragged;
    if (r->seqs == 0) {
        *b = s;
        return *c;
    }
    const int64_t *cu_k = r->cu_seqlens_k != NULL ? r->cu_seqlens_k : r->cu_seqlens_q;
    /* Query row i of the sequence sits at position i + offset among the
     * packed keys: bottom-right within its own sequence. The fields as an
     * initializer, not stored into a copy of *c: a copy that is then
     * copied out reads each changed field back as part of a wider load,
     * which waits until the field's store has gone to the cache (a
     * microsecond's item spent a tenth of its time there). */
    *b = 0;
    return (sdpa_call){.p = c->p, .q = c->q, .k = c->k, .v = c->v, .q16 = c->q16,
                       .k16 = c->k16, .v16 = c->v16, .group = c->group,
                       .offset = cu_k[s + 1] - r->cu_seqlens_q[s + 1], .ldq = c->ldq,
                       .ldk = c->ldk, .ldv = c->ldv, .ldo = c->ldo, .before = c->before,
                       .after = c->after, .plain = c->plain, .q_lo = r->cu_seqlens_q[s],
                       .q_hi = r->cu_seqlens_q[s + 1], .k_lo = cu_k[s], .k_hi = cu_k[s + 1],
                       .bf16 = c->bf16, .out_stream = c->out_stream};
}

static int64_t clamp64(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

void sdpa_key_range(const sdpa_call *c, int64_t i0, int64_t rows, int64_t *begin,
                    int64_t *end)
{
    /* The first row sees the earliest keys, the last row the latest. */
    *begin = clamp64(i0 + c->offset - c->before, c->k_lo, c->k_hi);
    *end = clamp64(i0 + rows - 1 + c->offset + c->after + 1, c->k_lo, c->k_hi);
    if (*end < *begin)
        *end = *begin;
}

void sdpa_query_range(const sdpa_call *c, int64_t j0, int64_t cols, int64_t *begin,
                      int64_t *end)
{
    /* Row i sees key j iff j - after <= p_i <= j + before. */
    *begin = clamp64(j0 - c->after - c->offset, c->q_lo, c->q_hi);
    *end = clamp64(j0 + cols - 1 + c->before - c->offset + 1, c->q_lo, c->q_hi);
    if (*end < *begin)
        *end = *begin;
}

float sdpa_alibi_slope(const sdpa_call *c, int64_t b, int64_t h)
{
    const attn_variants *var = &c->p->variants;
    return var->alibi_slopes == NULL ? 0.0f
                                     : var->alibi_slopes[b * var->alibi_batch_stride + h];
}

sdpa_src sdpa_src_at(sdpa_src s, int64_t at)
{
    return (sdpa_src){.f32 = s.f32 != NULL ? s.f32 + at : NULL,
                      .bf16 = s.bf16 != NULL ? s.bf16 + at : NULL};
}

sdpa_src sdpa_src_q(const sdpa_call *c, int64_t b, int64_t h)
{
    const attn_sdpa_params *p = c->p;
    return sdpa_src_at((sdpa_src){c->q, c->q16},
                       sdpa_head_at(p, b, h, p->heads_q, p->n_q, p->d_k));
}

sdpa_src sdpa_src_k(const sdpa_call *c, int64_t b, int64_t h)
{
    const attn_sdpa_params *p = c->p;
    return sdpa_src_at((sdpa_src){c->k, c->k16},
                       sdpa_head_at(p, b, h / c->group, p->heads_kv, p->n_k, p->d_k));
}

sdpa_src sdpa_src_v(const sdpa_call *c, int64_t b, int64_t h)
{
    const attn_sdpa_params *p = c->p;
    return sdpa_src_at((sdpa_src){c->v, c->v16},
                       sdpa_head_at(p, b, h / c->group, p->heads_kv, p->n_k, p->d_v));
}

float sdpa_src_value(sdpa_src s, int64_t i)
{
    if (s.f32 != NULL)
        return s.f32[i];
    const uint32_t bits = (uint32_t)s.bf16[i] << 16;
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

void sdpa_src_widen(sdpa_src s, int64_t count, float *dst)
{
    for (int64_t i = 0; i < count; i++)
        dst[i] = sdpa_src_value(s, i);
}

/* ------------------------------------------------- the forward's hooks */

void sdpa_fwd_stats_raw(sdpa_fwd_state *st, const float *s, int64_t cols)
{
    memcpy(st->raw, s, (size_t)cols * sizeof *s);
}

void sdpa_fwd_stats_scores(sdpa_fwd_state *st, int64_t row, const float *x, int64_t cols,
                           float m_old, float m_new)
{
    sdpa_stats_scores(st->stats, st->raw, x, cols, st->scale, st->softcap);
    memcpy(st->x, x, (size_t)cols * sizeof *x);
    if (m_new > m_old) {
        /* sum p (x - m), re-centred on the new maximum (before l is). */
        double shrink = m_old == -INFINITY ? 0.0 : exp((double)m_old - m_new);
        st->ent[row] = shrink == 0.0 ? 0.0
                                     : shrink * (st->ent[row] +
                                                 ((double)m_old - m_new) * st->l[row]);
    }
}

void sdpa_fwd_stats_entropy(sdpa_fwd_state *st, int64_t row, const float *p, int64_t cols,
                            float m_new)
{
    double e = 0.0;
    for (int64_t j = 0; j < cols; j++)
        if (p[j] > 0.0f)
            e += (double)p[j] * ((double)st->x[j] - m_new);
    st->ent[row] += e;
}

void sdpa_fwd_keep_weights(const sdpa_call *c, sdpa_fwd_state *st, const sdpa_tile *t,
                           int64_t row, const float *p)
{
    float *w = st->weights + row * c->p->n_k + t->j0;
    memcpy(w, p, (size_t)t->cols * sizeof *w);
    st->tile_max[row * st->k_tiles + st->kt] = st->m[row];
}
