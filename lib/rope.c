/*
 * Rotary position embedding (RoPE), rotate-half convention (GPT-NeoX,
 * Hugging Face Llama): for t < d/2 the pair (x_t, x_{t + d/2}) of a row at
 * position p turns by the angle p * base^(-2t/d):
 *   x_t'       = x_t cos - x_{t+d/2} sin
 *   x_{t+d/2}' = x_{t+d/2} cos + x_t sin
 * The gradient goes back through the inverse turn (the transpose).
 *
 *   q [B, H_q, n_q, d_k] at positions i + n_k - n_q, k [B, H_kv, n_k, d_k] at j
 *   (or [B, n, H, d]: the rows at the call's strides); in a ragged batch
 *   each sequence's rows and keys at their positions within it
 *
 * Angles, cosines and sines are computed in double and the turn is done in
 * double, so a rotated value is its exact rotation rounded once to float.
 * The table covers the positions of the call once, shared by every head:
 * O((n_q + n_k) d) memory, like the rotated copies themselves.
 */
#include <math.h>
#include <stdlib.h>

#include "sdpa.h"

typedef struct {
    double *cs;      /* [positions, d/2, 2]: cos, sin */
    int64_t pos0;    /* the first position */
    int64_t half;    /* d / 2 */
} rope_table;

typedef struct {
    const rope_table *table;
    const attn_sdpa_params *p;
    const float *src;
    float *dst;
    int64_t heads, n, ld, offset; /* rows of one head at positions row + offset */
    /* A ragged batch: the rows of sequence s start at starts[s] and are at
     * positions row + shift(s) (rope_shift); NULL otherwise. */
    const int64_t *starts;
    bool keys;
    bool inverse;
} rope_job;

/* The shift from a row of sequence s to its position: a key j of the
 * sequence sits at j - cu_k[s], a query row i at i - cu_q[s] + len_k -
 * len_q, i.e. i + cu_k[s + 1] - cu_q[s + 1] - cu_k[s]. */
static int64_t rope_shift(const attn_sdpa_params *p, bool keys, int64_t s)
{
    const attn_ragged *r = &p->ragged;
    const int64_t *cu_k = r->cu_seqlens_k != NULL ? r->cu_seqlens_k : r->cu_seqlens_q;
    return keys ? -cu_k[s] : cu_k[s + 1] - r->cu_seqlens_q[s + 1] - cu_k[s];
}

/* The sequence that row r belongs to: the last s with starts[s] <= r
 * (empty sequences before it skipped). */
static int64_t rope_seq(const int64_t *starts, int64_t seqs, int64_t r)
{
    int64_t lo = 0, hi = seqs; /* starts[lo] <= r < starts[hi] */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (starts[mid] <= r)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Rows in blocks of this many per unit of attn_parallel_for. */
#define ROPE_ROWS 256

static void rope_block(void *ctx, int64_t u, int worker)
{
    (void)worker;
    const rope_job *j = ctx;
    const attn_sdpa_params *p = j->p;
    const int64_t half = j->table->half, blocks = (j->n + ROPE_ROWS - 1) / ROPE_ROWS;
    const int64_t bh = u / blocks, r0 = u % blocks * ROPE_ROWS;
    const int64_t r1 = r0 + ROPE_ROWS < j->n ? r0 + ROPE_ROWS : j->n;
    const int64_t at = sdpa_head_at(p, bh / j->heads, bh % j->heads, j->heads, j->n, p->d_k);
    const double sign = j->inverse ? -1.0 : 1.0;
    const int64_t seqs = p->ragged.seqs;
    int64_t s = j->starts != NULL ? rope_seq(j->starts, seqs, r0) : 0;
    int64_t offset = j->starts != NULL ? rope_shift(p, j->keys, s) : j->offset;
    for (int64_t r = r0; r < r1; r++) {
        if (j->starts != NULL && r >= j->starts[s + 1]) {
            while (r >= j->starts[s + 1])
                s++;
            offset = rope_shift(p, j->keys, s);
        }
        const float *x = j->src + at + r * j->ld;
        float *y = j->dst + at + r * j->ld;
        const double *cs = j->table->cs + (r + offset - j->table->pos0) * half * 2;
        for (int64_t t = 0; t < half; t++) {
            double c = cs[2 * t], s = sign * cs[2 * t + 1];
            double a = x[t], b = x[t + half];
            y[t] = (float)(a * c - b * s);
            y[t + half] = (float)(b * c + a * s);
        }
    }
}

static void rope_apply(const rope_table *table, const attn_sdpa_params *p, int threads,
                       const float *src, float *dst, int64_t heads, int64_t n, int64_t ld,
                       int64_t offset, bool keys, bool inverse)
{
    const attn_ragged *r = &p->ragged;
    const int64_t *starts = NULL;
    if (r->seqs > 0)
        starts = keys && r->cu_seqlens_k != NULL ? r->cu_seqlens_k : r->cu_seqlens_q;
    rope_job j = {.table = table, .p = p, .src = src, .dst = dst, .heads = heads, .n = n,
                  .ld = ld, .offset = offset, .starts = starts, .keys = keys,
                  .inverse = inverse};
    attn_parallel_for(threads, p->batch * heads * ((n + ROPE_ROWS - 1) / ROPE_ROWS), rope_block,
                      &j);
}

/* The cos and sin of every position in [lo, hi) for rows of d. */
static bool rope_table_make(rope_table *table, float base, int64_t d, int64_t lo, int64_t hi)
{
    *table = (rope_table){.pos0 = lo, .half = d / 2};
    table->cs = malloc((size_t)((hi - lo) * table->half * 2) * sizeof *table->cs);
    if (table->cs == NULL)
        return false;
    for (int64_t t = 0; t < table->half; t++) {
        double freq = pow((double)base, -2.0 * (double)t / (double)d);
        for (int64_t pos = lo; pos < hi; pos++) {
            double angle = (double)pos * freq;
            table->cs[((pos - lo) * table->half + t) * 2] = cos(angle);
            table->cs[((pos - lo) * table->half + t) * 2 + 1] = sin(angle);
        }
    }
    return true;
}

attn_status sdpa_rope(const sdpa_call *c, int threads, const float *q, const float *k,
                      float *q_out, float *k_out, bool inverse)
{
    const attn_sdpa_params *p = c->p;
    /* Positions: queries offset .. offset + n_q, keys 0 .. n_k; in a
     * ragged batch those of each sequence, len_k - len_q .. len_k and 0 ..
     * len_k. */
    int64_t lo = c->offset < 0 ? c->offset : 0;
    int64_t hi = c->offset + p->n_q > p->n_k ? c->offset + p->n_q : p->n_k;
    if (p->ragged.seqs > 0) {
        lo = hi = 0;
        for (int64_t s = 0; s < p->ragged.seqs; s++) {
            int64_t b;
            const sdpa_call in = sdpa_call_seq(c, s, &b);
            const int64_t len_q = in.q_hi - in.q_lo, len_k = in.k_hi - in.k_lo;
            lo = len_k - len_q < lo ? len_k - len_q : lo;
            hi = len_k > hi ? len_k : hi;
        }
    }
    rope_table table;
    if (!rope_table_make(&table, p->variants.rope_base, p->d_k, lo, hi))
        return ATTN_ERR_NOMEM;
    if (q != NULL)
        rope_apply(&table, p, threads, q, q_out, p->heads_q, p->n_q, c->ldq, c->offset, false,
                   inverse);
    if (k != NULL)
        rope_apply(&table, p, threads, k, k_out, p->heads_kv, p->n_k, c->ldk, 0, true, inverse);
    free(table.cs);
    return ATTN_OK;
}

attn_status sdpa_rope_at(float base, int64_t d, int threads, const float *src, float *dst,
                         int64_t heads, int64_t n, int64_t pos0)
{
    /* The table covers the rows' positions only: a key appended at
     * position 30000 costs one row of cos and sin, not 30000. */
    rope_table table;
    if (!rope_table_make(&table, base, d, pos0, pos0 + n))
        return ATTN_ERR_NOMEM;
    const attn_sdpa_params p = {.batch = 1, .d_k = d, .layout = ATTN_LAYOUT_BHND};
    rope_apply(&table, &p, threads, src, dst, heads, n, d, pos0, false, false);
    free(table.cs);
    return ATTN_OK;
}

attn_status sdpa_rope_inputs(sdpa_call *c, int threads, float *q_rot, float *k_rot)
{
    const attn_sdpa_params *p = c->p;
    const float *q = c->q, *k = c->k;
    if (c->q16 != NULL) {
        sdpa_src_widen((sdpa_src){.bf16 = c->q16}, p->batch * p->heads_q * p->n_q * p->d_k,
                       q_rot);
        q = q_rot;
    }
    if (c->k16 != NULL) {
        sdpa_src_widen((sdpa_src){.bf16 = c->k16}, p->batch * p->heads_kv * p->n_k * p->d_k,
                       k_rot);
        k = k_rot;
    }
    attn_status s = sdpa_rope(c, threads, q, k, q_rot, k_rot, false);
    c->q = q_rot;
    c->k = k_rot;
    c->q16 = c->k16 = NULL;
    return s;
}
