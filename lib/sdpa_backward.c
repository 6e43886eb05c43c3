/*
 * attn_sdpa_backward (Eq. 16-18), FlashAttention-2 style.
 *   q [B,H_q,n_q,d_k], k [B,H_kv,n_k,d_k], v [B,H_kv,n_k,d_v],
 *   out, dout [B,H_q,n_q,d_v], rows [B,H_q,n_q] (softmax max and sum)
 *   -> dq [B,H_q,n_q,d_k], dk [B,H_kv,n_k,d_k], dv [B,H_kv,n_k,d_v]
 * (in ATTN_LAYOUT_BNHD the tensors are [B, n, H, d] instead; see attn.h).
 *
 * A work unit owns key tiles of one (batch, key/value head) pair: for each
 * of its tiles it packs k_t^T and v_t^T once, then visits every query tile
 * of every query head that shares the pair, so it alone writes its rows of
 * dk and dv (the GQA sum happens inside the unit).
 *
 * dq rows receive contributions from every key tile. When there are enough
 * pairs to keep every thread busy, a unit takes all the key tiles of its
 * pair and adds into dq. Otherwise each pair is split S ways (key tiles s,
 * s + S, s + 2S, ... to split s: interleaved, so causal splits cost alike),
 * and split s adds into its own copy of dq, added in split order at the
 * end. The long sums are blocked: dq's float partials are folded into
 * double sums every SDPA_FOLD_TILES key tiles of a unit, dk's and dv's
 * (in the worker, written when the key tile is done) every
 * SDPA_FOLD_TILES query tiles. Either way which thread runs which unit changes nothing: the
 * result is the same for a given thread count, bit for bit.
 */
#include <stdlib.h>
#include <string.h>

#include "kern.h"

typedef struct {
    float *kt, *vt; /* [d_k, ld], [d_v, ld], ld = kern_panel_ld(n_k) at most */
    float *p, *ds;  /* [KERN_BWD_BQ, KERN_BK] */
    float *capped;  /* [KERN_BK] */
    float *dk_part, *dv_part; /* [ld, d_k], [ld, d_v]: the key tile's float partials */
    double *dk, *dv;          /* [ld, d_k], [ld, d_v]: and its sums */
    void *block;
} bwd_worker;

typedef struct {
    sdpa_call call;
    const attn_kern *kern;
    const attn_softmax_row *rows;
    const float *dout, *delta;
    float *dq, *dk, *dv;
    float **dq_part;   /* [splits]: each split's float partials of dq: dq itself, then copies */
    double **dq_sum;   /* [splits]: and their sums (the layout of dq) */
    int64_t k_tiles, splits;
    bwd_worker *workers;
} bwd_job;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* acc [n] += part [n], and part back to 0: a float partial folded in. */
static void fold(double *acc, float *part, int64_t n)
{
    for (int64_t e = 0; e < n; e++) {
        acc[e] += part[e];
        part[e] = 0.0f;
    }
}

/* Folds the float partials of dq of every query head of pair (b, hk) into
 * the split's double sums. */
static void fold_dq(const bwd_job *job, int64_t split, int64_t b, int64_t hk)
{
    const sdpa_call *c = &job->call;
    const attn_sdpa_params *p = c->p;
    for (int64_t h = hk * c->group; h < (hk + 1) * c->group; h++) {
        const int64_t q_at = sdpa_head_at(p, b, h, p->heads_q, p->n_q, p->d_k);
        for (int64_t i = 0; i < p->n_q; i++)
            fold(job->dq_sum[split] + q_at + i * c->ldq, job->dq_part[split] + q_at + i * c->ldq,
                 p->d_k);
    }
}

static void backward_unit(void *ctx, int64_t u, int worker)
{
    const bwd_job *job = ctx;
    const sdpa_call *c = &job->call;
    const attn_sdpa_params *p = c->p;
    const bwd_worker *w = &job->workers[worker];
    const int64_t pair = u / job->splits, split = u % job->splits;
    const int64_t b = pair / p->heads_kv, hk = pair % p->heads_kv;
    float *dq = job->dq_part[split];
    const int64_t k_at = sdpa_head_at(p, b, hk, p->heads_kv, p->n_k, p->d_k);
    const int64_t v_at = sdpa_head_at(p, b, hk, p->heads_kv, p->n_k, p->d_v);
    int64_t key_tiles = 0; /* since dq was last folded */
    for (int64_t kt = split; kt < job->k_tiles; kt += job->splits) {
        sdpa_tile t = {.b = b, .j0 = kt * KERN_BK};
        t.cols = min64(p->n_k - t.j0, KERN_BK);
        const float *k = c->k + k_at + t.j0 * c->ldk, *v = c->v + v_at + t.j0 * c->ldv;
        float *dk = job->dk + k_at + t.j0 * c->ldk, *dv = job->dv + v_at + t.j0 * c->ldv;
        const int64_t nk = t.cols * p->d_k, nv = t.cols * p->d_v;
        memset(w->dk, 0, (size_t)nk * sizeof *w->dk);
        memset(w->dv, 0, (size_t)nv * sizeof *w->dv);
        memset(w->dk_part, 0, (size_t)nk * sizeof *w->dk_part);
        memset(w->dv_part, 0, (size_t)nv * sizeof *w->dv_part);
        int64_t i_start, i_end; /* the query rows that see these keys */
        sdpa_query_range(c, t.j0, t.cols, &i_start, &i_end);
        const int64_t ld = kern_panel_ld(t.cols);
        const sdpa_bwd_keys keys = {.kt = w->kt, .vt = w->vt, .ld = ld, .k = k};
        if (i_start < i_end) { /* otherwise no query sees these keys: gradients 0 */
            job->kern->pack_t(k, c->ldk, t.cols, p->d_k, w->kt, ld);
            job->kern->pack_t(v, c->ldv, t.cols, p->d_v, w->vt, ld);
        }
        int64_t query_tiles = 0; /* since dk and dv were last folded */
        for (t.h = hk * c->group; i_start < i_end && t.h < (hk + 1) * c->group; t.h++) {
            const int64_t bh = b * p->heads_q + t.h;
            const int64_t q_at = sdpa_head_at(p, b, t.h, p->heads_q, p->n_q, p->d_k);
            const int64_t o_at = sdpa_head_o_at(c, b, t.h);
            for (t.i0 = i_start; t.i0 < i_end; t.i0 += KERN_BWD_BQ) {
                t.rows = min64(i_end - t.i0, KERN_BWD_BQ);
                const int64_t row = bh * p->n_q + t.i0;
                const sdpa_bwd_state st = {
                    .p = w->p, .ds = w->ds, .capped = w->capped,
                    .rows = job->rows + row, .delta = job->delta + row,
                    .dout = job->dout + o_at + t.i0 * c->ldo,
                    .dq = dq + q_at + t.i0 * c->ldq,
                    .dk = w->dk_part, .dv = w->dv_part,
                };
                job->kern->backward_tile(c, &t, &keys, &st);
                if (++query_tiles == SDPA_FOLD_TILES) {
                    fold(w->dk, w->dk_part, nk);
                    fold(w->dv, w->dv_part, nv);
                    query_tiles = 0;
                }
            }
        }
        for (int64_t j = 0; j < t.cols; j++) {
            for (int64_t e = 0; e < p->d_k; e++)
                dk[j * c->ldk + e] = (float)(w->dk[j * p->d_k + e] + w->dk_part[j * p->d_k + e]);
            for (int64_t e = 0; e < p->d_v; e++)
                dv[j * c->ldv + e] = (float)(w->dv[j * p->d_v + e] + w->dv_part[j * p->d_v + e]);
        }
        if (i_start < i_end && ++key_tiles == SDPA_FOLD_TILES) {
            fold_dq(job, split, b, hk);
            key_tiles = 0;
        }
    }
}

/* The O(rows d) steps around the tiles, spread over the workers in blocks. */
#define BWD_ROW_BLOCK 2048
#define BWD_SUM_BLOCK (64 * 1024) /* floats */

typedef struct {
    const sdpa_call *call;
    const float *dout, *out;
    float *delta;
    float **dq_part;
    double **dq_sum;
    int64_t splits, rows;
} prologue_job;

/* delta [B, H_q, n_q] = rowsum(dout * out), the softmax's correction term;
 * and every copy of dq zeroed (rows r0 .. r1 of it, in memory order), since
 * the units add into them. */
static void prologue_block(void *ctx, int64_t block, int worker)
{
    (void)worker;
    const prologue_job *j = ctx;
    const attn_sdpa_params *p = j->call->p;
    int64_t r0 = block * BWD_ROW_BLOCK, r1 = min64(r0 + BWD_ROW_BLOCK, j->rows);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i = r % p->n_q, bh = r / p->n_q;
        int64_t at = sdpa_head_o_at(j->call, bh / p->heads_q, bh % p->heads_q) + i * j->call->ldo;
        double s = 0.0;
        for (int64_t c = 0; c < p->d_v; c++)
            s += (double)j->dout[at + c] * j->out[at + c];
        j->delta[r] = (float)s;
    }
    for (int64_t s = 0; s < j->splits; s++) {
        memset(j->dq_part[s] + r0 * p->d_k, 0, (size_t)((r1 - r0) * p->d_k) * sizeof(float));
        memset(j->dq_sum[s] + r0 * p->d_k, 0, (size_t)((r1 - r0) * p->d_k) * sizeof(double));
    }
}

typedef struct {
    float **dq_part;
    double **dq_sum;
    int64_t splits, count;
} reduce_job;

/* dq = the sums and partials of splits 0 .. S-1, added in double in that
 * order (split 0's partials are dq itself). */
static void reduce_block(void *ctx, int64_t block, int worker)
{
    (void)worker;
    const reduce_job *j = ctx;
    int64_t f0 = block * BWD_SUM_BLOCK, f1 = min64(f0 + BWD_SUM_BLOCK, j->count);
    double *sum = j->dq_sum[0];
    for (int64_t s = 0; s < j->splits; s++) {
        const float *part = j->dq_part[s];
        const double *other = j->dq_sum[s];
        for (int64_t f = f0; f < f1; f++)
            sum[f] += (s > 0 ? other[f] : 0.0) + part[f];
    }
    for (int64_t f = f0; f < f1; f++)
        j->dq_part[0][f] = (float)sum[f];
}

static int64_t blocks(int64_t count, int64_t per_block)
{
    return (count + per_block - 1) / per_block;
}

/* Splits per pair: 1 when the pairs alone give every thread two units or
 * more; otherwise one per thread (at most one per key tile), each with its
 * own partials and sums of dq. */
static int64_t splits_for(int threads, int64_t pairs, int64_t k_tiles)
{
    if (threads <= 1 || pairs >= 2 * (int64_t)threads)
        return 1;
    return min64(threads, k_tiles);
}

static void free_workers(bwd_worker *w, int n)
{
    for (int i = 0; w != NULL && i < n; i++)
        free(w[i].block);
    free(w);
}

static bwd_worker *alloc_workers(int n, const attn_sdpa_params *p)
{
    bwd_worker *w = calloc((size_t)n, sizeof *w);
    if (w == NULL)
        return NULL;
    /* Panels as wide as the widest tile: n_k < 64 keys pack no more. */
    const int64_t keys = kern_panel_ld(p->n_k);
    const int64_t panel_k = p->d_k * keys, panel_v = p->d_v * keys;
    const int64_t tile = (int64_t)KERN_BWD_BQ * KERN_BK;
    /* The double sums first (their alignment), then the floats. */
    const int64_t floats = 2 * (panel_k + panel_v) + 2 * tile + KERN_BK;
    for (int i = 0; i < n; i++) {
        double *d = sdpa_alloc(panel_k + panel_v + (floats + 1) / 2, sizeof(double));
        if (d == NULL) {
            free_workers(w, n);
            return NULL;
        }
        w[i].block = d;
        w[i].dk = d;
        w[i].dv = d + panel_k;
        float *b = (float *)(void *)(d + panel_k + panel_v);
        w[i].p = b;
        w[i].ds = b + tile;
        w[i].kt = b + 2 * tile;
        w[i].vt = w[i].kt + panel_k;
        w[i].dk_part = w[i].vt + panel_v;
        w[i].dv_part = w[i].dk_part + panel_k;
        w[i].capped = w[i].dv_part + panel_v;
    }
    return w;
}

attn_status attn_sdpa_backward(const attn_sdpa_params *p, const float *q,
                               const float *k, const float *v,
                               const float *out, const attn_softmax_row *rows,
                               const float *dout, float *dq, float *dk,
                               float *dv, attn_error *err)
{
    attn_status s = sdpa_check_params(p, false, err);
    if (s != ATTN_OK)
        return s;
    if (q == NULL || k == NULL || v == NULL || out == NULL || rows == NULL ||
        dout == NULL || dq == NULL || dk == NULL || dv == NULL)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "q, k, v, out, rows, dout, dq, dk and dv must not be NULL");

    const int64_t n_rows = p->batch * p->heads_q * p->n_q;
    const int64_t pairs = p->batch * p->heads_kv;
    bwd_job job = {
        .call = sdpa_call_of(p, q, k, v),
        .kern = attn_kern_get(),
        .rows = rows, .dout = dout, .dq = dq, .dk = dk, .dv = dv,
        .k_tiles = (p->n_k + KERN_BK - 1) / KERN_BK,
    };
    int threads = sdpa_threads(p, pairs * job.k_tiles, 2.5 * attn_sdpa_flops(p));
    job.splits = splits_for(threads, pairs, job.k_tiles);
    float *delta = sdpa_alloc(n_rows, sizeof(float));
    job.dq_part = calloc((size_t)job.splits, sizeof *job.dq_part);
    job.dq_sum = calloc((size_t)job.splits, sizeof *job.dq_sum);
    job.workers = alloc_workers(threads, p);
    bool ok = delta != NULL && job.dq_part != NULL && job.dq_sum != NULL &&
              job.workers != NULL;
    /* With RoPE the scores come from rotated copies of q and k, and the
     * gradients they give are turned back at the end. */
    const bool rope = p->variants.rope_base > 0.0f;
    float *q_rot = NULL, *k_rot = NULL;
    if (ok && rope) {
        q_rot = sdpa_alloc(p->batch * p->heads_q * p->n_q * p->d_k, sizeof(float));
        k_rot = sdpa_alloc(p->batch * p->heads_kv * p->n_k * p->d_k, sizeof(float));
        ok = q_rot != NULL && k_rot != NULL &&
             sdpa_rope(&job.call, threads, q, k, q_rot, k_rot, false) == ATTN_OK;
        job.call.q = q_rot;
        job.call.k = k_rot;
    }
    if (ok)
        job.dq_part[0] = dq;
    for (int64_t i = 0; ok && i < job.splits; i++)
        ok = (job.dq_sum[i] = sdpa_alloc(n_rows * p->d_k, sizeof(double))) != NULL &&
             (i == 0 || (job.dq_part[i] = sdpa_alloc(n_rows * p->d_k, sizeof(float))) != NULL);
    if (ok) {
        prologue_job pro = {.call = &job.call, .dout = dout, .out = out, .delta = delta,
                            .dq_part = job.dq_part, .dq_sum = job.dq_sum,
                            .splits = job.splits, .rows = n_rows};
        attn_parallel_for(threads, blocks(n_rows, BWD_ROW_BLOCK), prologue_block, &pro);
        job.delta = delta;
        attn_parallel_for(threads, pairs * job.splits, backward_unit, &job);
        reduce_job red = {.dq_part = job.dq_part, .dq_sum = job.dq_sum, .splits = job.splits,
                          .count = n_rows * p->d_k};
        attn_parallel_for(threads, blocks(red.count, BWD_SUM_BLOCK), reduce_block, &red);
        if (rope)
            ok = sdpa_rope(&job.call, threads, dq, dk, dq, dk, true) == ATTN_OK;
    }
    free(q_rot);
    free(k_rot);
    for (int64_t i = 0; job.dq_sum != NULL && i < job.splits; i++) {
        free(job.dq_sum[i]);
        if (i > 0 && job.dq_part != NULL)
            free(job.dq_part[i]);
    }
    free(job.dq_part);
    free(job.dq_sum);
    free_workers(job.workers, threads);
    free(delta);
    if (!ok)
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the backward pass");
    return ATTN_OK;
}
