/*
 * attn_sdpa_backward (Eq. 16-18), FlashAttention-2 style.
 *   q [B,H_q,n_q,d_k], k [B,H_kv,n_k,d_k], v [B,H_kv,n_k,d_v],
 *   out, dout [B,H_q,n_q,d_v], lse [B,H_q,n_q]
 *   -> dq [B,H_q,n_q,d_k], dk [B,H_kv,n_k,d_k], dv [B,H_kv,n_k,d_v]
 *
 * A work unit is one key tile of one (batch, key/value head): it visits every
 * query tile of every query head that shares the key/value head, so it alone
 * writes its rows of dk and dv (the GQA sum happens inside the unit). dq
 * rows receive contributions from every key tile, so each worker adds into
 * its own copy of dq (worker 0 into dq itself) and the copies are summed at
 * the end: no locks, and O(n_q d_k) extra memory per extra worker. To keep
 * that bound when B x H is large, the (batch, key/value head) pairs are
 * processed in chunks whose dq copies fit SDPA_BWD_DQ_BUDGET bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

/* Extra dq copies of all workers together stay under this many bytes
 * (unless a single (batch, key/value head) pair needs more). */
#ifndef SDPA_BWD_DQ_BUDGET
#define SDPA_BWD_DQ_BUDGET (64 << 20)
#endif

typedef struct {
    float *p, *dp; /* [SDPA_BWD_BQ, SDPA_BWD_BK] */
    float *acc;    /* [chunk rows, d_k]: this worker's dq copy (NULL for worker 0) */
    float *dq;     /* where this worker adds the current chunk's dq rows */
} bwd_worker;

typedef struct {
    sdpa_call call;
    const double *lse;
    const float *dout, *delta;
    float *dk, *dv;
    int64_t k_tiles;
    int64_t pair0; /* first (batch, key/value head) pair of the current chunk */
    bwd_worker *workers;
} bwd_job;

static int64_t c_group(const attn_sdpa_params *p)
{
    return p->heads_q / p->heads_kv;
}

static void backward_unit(void *ctx, int64_t u, int worker)
{
    const bwd_job *job = ctx;
    const sdpa_call *c = &job->call;
    const attn_sdpa_params *p = c->p;
    const bwd_worker *w = &job->workers[worker];
    int64_t kt = u % job->k_tiles, bhk = job->pair0 + u / job->k_tiles;
    int64_t chunk_row0 = job->pair0 * c->group * p->n_q;
    int64_t b = bhk / p->heads_kv, hk = bhk % p->heads_kv;
    sdpa_tile t = {.b = b, .j0 = kt * SDPA_BWD_BK};
    t.cols = p->n_k - t.j0 < SDPA_BWD_BK ? p->n_k - t.j0 : SDPA_BWD_BK;
    float *dk = job->dk + (bhk * p->n_k + t.j0) * p->d_k;
    float *dv = job->dv + (bhk * p->n_k + t.j0) * p->d_v;
    memset(dk, 0, (size_t)(t.cols * p->d_k) * sizeof *dk);
    memset(dv, 0, (size_t)(t.cols * p->d_v) * sizeof *dv);
    /* Queries above the causal diagonal see none of these keys. */
    int64_t i_start = 0;
    if (p->causal && t.j0 - c->offset > 0)
        i_start = t.j0 - c->offset;
    for (t.h = hk * c->group; t.h < (hk + 1) * c->group; t.h++) {
        int64_t bh = b * p->heads_q + t.h;
        for (t.i0 = i_start; t.i0 < p->n_q; t.i0 += SDPA_BWD_BQ) {
            t.rows = p->n_q - t.i0 < SDPA_BWD_BQ ? p->n_q - t.i0 : SDPA_BWD_BQ;
            int64_t row = bh * p->n_q + t.i0;
            sdpa_bwd_state st = {
                .p = w->p, .dp = w->dp,
                .lse = job->lse + row, .delta = job->delta + row,
                .dout = job->dout + row * p->d_v,
                .dq = w->dq + (row - chunk_row0) * p->d_k,
                .dk = dk, .dv = dv,
            };
            sdpa_backward_tile(c, &t, &st);
        }
    }
}

/* The O(rows d) steps around the tiles, spread over the workers in blocks
 * of rows so that the other threads do not wait on them. */
#define SDPA_BWD_ROW_BLOCK 2048
#define SDPA_BWD_SUM_BLOCK (128 * 1024) /* floats */

typedef struct {
    const float *dout, *out;
    float *delta, *dq;
    int64_t rows, d_v, d_k;
} prologue_job;

/* delta [rows] = rowsum(dout * out), the softmax's correction term; and dq
 * zeroed, since worker 0 accumulates straight into it. */
static void prologue_block(void *ctx, int64_t block, int worker)
{
    (void)worker;
    const prologue_job *j = ctx;
    int64_t r0 = block * SDPA_BWD_ROW_BLOCK;
    int64_t r1 = r0 + SDPA_BWD_ROW_BLOCK < j->rows ? r0 + SDPA_BWD_ROW_BLOCK : j->rows;
    for (int64_t i = r0; i < r1; i++) {
        double s = 0.0;
        for (int64_t c = 0; c < j->d_v; c++)
            s += (double)j->dout[i * j->d_v + c] * j->out[i * j->d_v + c];
        j->delta[i] = (float)s;
    }
    memset(j->dq + r0 * j->d_k, 0, (size_t)((r1 - r0) * j->d_k) * sizeof *j->dq);
}

typedef struct {
    float *dq;              /* the chunk's rows of dq */
    const bwd_worker *workers;
    int threads;
    int64_t count;          /* floats in the chunk */
    bool clear;             /* zero the copies for the next chunk */
} reduce_job;

/* dq += every other worker's copy, one block of floats at a time. */
static void reduce_block(void *ctx, int64_t block, int worker)
{
    (void)worker;
    const reduce_job *j = ctx;
    int64_t f0 = block * SDPA_BWD_SUM_BLOCK;
    int64_t f1 = f0 + SDPA_BWD_SUM_BLOCK < j->count ? f0 + SDPA_BWD_SUM_BLOCK : j->count;
    for (int w = 1; w < j->threads; w++) {
        float *acc = j->workers[w].acc;
        for (int64_t f = f0; f < f1; f++)
            j->dq[f] += acc[f];
        if (j->clear)
            memset(acc + f0, 0, (size_t)(f1 - f0) * sizeof *acc);
    }
}

static int64_t blocks(int64_t count, int64_t per_block)
{
    return (count + per_block - 1) / per_block;
}

attn_status attn_sdpa_backward(const attn_sdpa_params *p, const float *q,
                               const float *k, const float *v,
                               const float *out, const double *lse,
                               const float *dout, float *dq, float *dk,
                               float *dv, attn_error *err)
{
    attn_status s = sdpa_check_params(p, false, err);
    if (s != ATTN_OK)
        return s;
    if (q == NULL || k == NULL || v == NULL || out == NULL || lse == NULL ||
        dout == NULL || dq == NULL || dk == NULL || dv == NULL)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "q, k, v, out, lse, dout, dq, dk and dv must not be NULL");
    attn_blas_init();

    const int64_t rows = p->batch * p->heads_q * p->n_q;
    const int64_t pairs = p->batch * p->heads_kv;
    const int64_t pair_floats = c_group(p) * p->n_q * p->d_k; /* dq of one pair */
    bwd_job job = {
        .call = {.p = p, .q = q, .k = k, .v = v, .group = c_group(p),
                 .offset = p->n_k - p->n_q},
        .lse = lse, .dout = dout, .dk = dk, .dv = dv,
        .k_tiles = (p->n_k + SDPA_BWD_BK - 1) / SDPA_BWD_BK,
    };
    int threads = sdpa_threads(p, pairs * job.k_tiles, 2.5 * attn_sdpa_flops(p));
    int64_t chunk = pairs;
    if (threads > 1) {
        int64_t fit = SDPA_BWD_DQ_BUDGET / (int64_t)sizeof(float) / (threads - 1) / pair_floats;
        chunk = fit < 1 ? 1 : fit < pairs ? fit : pairs;
        int64_t most = chunk * job.k_tiles; /* units per chunk */
        if (most < threads)
            threads = (int)most;
    }
    float *delta = sdpa_alloc(rows, sizeof(float));
    bwd_worker *workers = calloc((size_t)threads, sizeof *workers);
    bool ok = delta != NULL && workers != NULL;
    for (int i = 0; ok && i < threads; i++) {
        workers[i].p = sdpa_alloc((int64_t)SDPA_BWD_BQ * SDPA_BWD_BK, sizeof(float));
        workers[i].dp = sdpa_alloc((int64_t)SDPA_BWD_BQ * SDPA_BWD_BK, sizeof(float));
        ok = workers[i].p && workers[i].dp;
        if (ok && i > 0) {
            /* calloc: pages a worker never touches cost nothing. */
            workers[i].acc = calloc((size_t)(chunk * pair_floats), sizeof(float));
            ok = workers[i].acc != NULL;
        }
    }
    if (ok) {
        prologue_job pro = {.dout = dout, .out = out, .delta = delta, .dq = dq,
                            .rows = rows, .d_v = p->d_v, .d_k = p->d_k};
        s = attn_parallel_for(threads, blocks(rows, SDPA_BWD_ROW_BLOCK), prologue_block, &pro);
        job.delta = delta;
        job.workers = workers;
        for (job.pair0 = 0; s == ATTN_OK && job.pair0 < pairs; job.pair0 += chunk) {
            int64_t n = pairs - job.pair0 < chunk ? pairs - job.pair0 : chunk;
            float *dq_chunk = dq + job.pair0 * pair_floats;
            workers[0].dq = dq_chunk;
            for (int i = 1; i < threads; i++)
                workers[i].dq = workers[i].acc;
            s = attn_parallel_for(threads, n * job.k_tiles, backward_unit, &job);
            reduce_job red = {.dq = dq_chunk, .workers = workers, .threads = threads,
                              .count = n * pair_floats, .clear = job.pair0 + chunk < pairs};
            if (s == ATTN_OK && threads > 1)
                s = attn_parallel_for(threads, blocks(red.count, SDPA_BWD_SUM_BLOCK),
                                      reduce_block, &red);
        }
    }
    for (int i = 0; workers != NULL && i < threads; i++) {
        free(workers[i].p);
        free(workers[i].dp);
        free(workers[i].acc);
    }
    free(workers);
    free(delta);
    if (!ok)
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the backward pass");
    if (s != ATTN_OK)
        return attn_fail(err, s, "could not run the backward pass's threads");
    return ATTN_OK;
}
