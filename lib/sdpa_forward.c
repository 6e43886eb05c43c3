/*
 * attn_sdpa_forward (Eq. 10): out = softmax(scale * q k^T + mask) v.
 *   q [B, H_q, n_q, d_k], k [B, H_kv, n_k, d_k], v [B, H_kv, n_k, d_v]
 *   -> out [B, H_q, n_q, d_v]; optional lse [B, H_q, n_q] (double),
 *      weights [B, H_q, n_q, n_k], stats.
 *
 * A work unit is one query tile of one (batch, head): it streams the key
 * tiles past its rows (sdpa_forward_tile) and owns its output rows, so units
 * run in parallel without sharing anything but read-only inputs. Extra
 * memory is one score tile and a few rows per worker.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

/* One worker's workspaces, carved from a single allocation (block). */
typedef struct {
    float *scores, *m, *row_copy;
    double *l, *ent;
    float *tile_max; /* [bq, key tiles]: m after each tile, weights only */
    sdpa_stats_acc stats;
    void *block;
} fwd_worker;

typedef struct {
    sdpa_call call;
    float *out, *weights;
    double *lse;
    bool want_stats;
    int64_t q_tiles, k_tiles;
    /* Tile extents actually needed: min(n, tile size), so that a call with
     * n = 4 does not allocate and free a 256 KiB score tile (freeing a chunk
     * that large also makes malloc consolidate its free lists). */
    int64_t bq, bk;
    fwd_worker *workers;
} fwd_job;

/* P of the tile just folded in, still relative to the running maximum
 * tile_max[., kt], goes to the caller's weights; finish_weights rescales it. */
static void keep_weights(const fwd_job *job, const sdpa_tile *t, const float *p,
                         const float *m, float *tile_max, int64_t kt)
{
    const int64_t n_q = job->call.p->n_q, n_k = job->call.p->n_k;
    const int64_t bh = t->b * job->call.p->heads_q + t->h;
    for (int64_t r = 0; r < t->rows; r++) {
        float *w = job->weights + (bh * n_q + t->i0 + r) * n_k + t->j0;
        memcpy(w, p + r * job->bk, (size_t)t->cols * sizeof *w);
        tile_max[r * job->k_tiles + kt] = m[r];
    }
}

static void finish_weights(const fwd_job *job, const sdpa_tile *t, const fwd_worker *w,
                           int64_t k_end)
{
    const int64_t n_q = job->call.p->n_q, n_k = job->call.p->n_k;
    const int64_t bh = t->b * job->call.p->heads_q + t->h;
    for (int64_t r = 0; r < t->rows; r++) {
        float *row = job->weights + (bh * n_q + t->i0 + r) * n_k;
        int64_t kt = 0;
        for (int64_t j0 = 0; j0 < k_end; j0 += SDPA_FWD_BK, kt++) {
            int64_t cols = k_end - j0 < SDPA_FWD_BK ? k_end - j0 : SDPA_FWD_BK;
            float m_t = w->tile_max[r * job->k_tiles + kt];
            float f = 0.0f;
            if (w->l[r] > 0.0 && m_t != -INFINITY)
                f = (float)(exp((double)m_t - w->m[r]) / w->l[r]);
            for (int64_t j = 0; j < cols; j++)
                row[j0 + j] *= f;
        }
        /* Keys past the causal end were never visited: weight 0. */
        memset(row + k_end, 0, (size_t)(n_k - k_end) * sizeof *row);
    }
}

static void forward_unit(void *ctx, int64_t u, int worker)
{
    const fwd_job *job = ctx;
    const sdpa_call *c = &job->call;
    const attn_sdpa_params *p = c->p;
    fwd_worker *w = &job->workers[worker];
    int64_t qt = u % job->q_tiles, bh = u / job->q_tiles;
    /* Causal query tiles grow in cost with their index: hand out the
     * expensive ones first so that the last units to finish are cheap. */
    if (p->causal)
        qt = job->q_tiles - 1 - qt;
    sdpa_tile t = {.b = bh / p->heads_q, .h = bh % p->heads_q, .i0 = qt * SDPA_FWD_BQ};
    t.rows = p->n_q - t.i0 < SDPA_FWD_BQ ? p->n_q - t.i0 : SDPA_FWD_BQ;
    float *out = job->out + (bh * p->n_q + t.i0) * p->d_v;
    memset(out, 0, (size_t)(t.rows * p->d_v) * sizeof *out);
    for (int64_t r = 0; r < t.rows; r++) {
        w->m[r] = -INFINITY;
        w->l[r] = 0.0;
        if (job->want_stats)
            w->ent[r] = 0.0;
    }
    sdpa_fwd_state st = {.scores = w->scores, .ld = job->bk, .m = w->m, .l = w->l,
                         .out = out,
                         .stats = job->want_stats ? &w->stats : NULL,
                         .ent = w->ent, .row_copy = w->row_copy};
    /* Key tiles wholly above the causal diagonal are skipped, and the last
     * one is cut at the diagonal. */
    int64_t k_end = p->causal ? sdpa_causal_end(c, t.i0, t.rows) : p->n_k;
    int64_t kt = 0;
    for (t.j0 = 0; t.j0 < k_end; t.j0 += SDPA_FWD_BK, kt++) {
        t.cols = k_end - t.j0 < SDPA_FWD_BK ? k_end - t.j0 : SDPA_FWD_BK;
        sdpa_forward_tile(c, &t, &st);
        if (job->weights != NULL)
            keep_weights(job, &t, w->scores, w->m, w->tile_max, kt);
    }
    for (int64_t r = 0; r < t.rows; r++) {
        double l = w->l[r];
        float *o = out + r * p->d_v;
        if (l > 0.0) {
            float inv = (float)(1.0 / l);
            for (int64_t j = 0; j < p->d_v; j++)
                o[j] *= inv;
        }
        if (job->lse != NULL)
            job->lse[bh * p->n_q + t.i0 + r] = l > 0.0 ? (double)w->m[r] + log(l) : -INFINITY;
        if (job->want_stats && l > 0.0)
            /* Entropy = lse - sum_j a_j x_j = log l - sum_j a_j (x_j - m);
             * the largest weight is exp(m - lse) = 1 / l. */
            sdpa_stats_row(&w->stats, log(l) - w->ent[r] / l, 1.0 / l);
    }
    if (job->weights != NULL)
        finish_weights(job, &t, w, k_end);
}

static void free_workers(fwd_worker *w, int n)
{
    for (int i = 0; w != NULL && i < n; i++)
        free(w[i].block);
    free(w);
}

/* Bytes of n items of size, rounded up to whole cache lines. */
static size_t lines(int64_t n, size_t size)
{
    return ((size_t)n * size + 63) / 64 * 64;
}

static fwd_worker *alloc_workers(int n, const fwd_job *job)
{
    fwd_worker *w = calloc((size_t)n, sizeof *w);
    if (w == NULL)
        return NULL;
    const int64_t bq = job->bq, bk = job->bk;
    const bool weights = job->weights != NULL;
    size_t bytes = lines(bq * bk, sizeof(float)) + lines(bq, sizeof(float)) +
                   lines(bq, sizeof(double));
    if (job->want_stats)
        bytes += lines(bk, sizeof(float)) + lines(bq, sizeof(double));
    if (weights)
        bytes += lines(bq * job->k_tiles, sizeof(float));
    for (int i = 0; i < n; i++) {
        sdpa_stats_init(&w[i].stats);
        char *b = sdpa_alloc((int64_t)bytes, 1);
        if (b == NULL) {
            free_workers(w, n);
            return NULL;
        }
        w[i].block = b;
        w[i].scores = (float *)(void *)b;
        b += lines(bq * bk, sizeof(float));
        w[i].m = (float *)(void *)b;
        b += lines(bq, sizeof(float));
        w[i].l = (double *)(void *)b;
        b += lines(bq, sizeof(double));
        if (job->want_stats) {
            w[i].row_copy = (float *)(void *)b;
            b += lines(bk, sizeof(float));
            w[i].ent = (double *)(void *)b;
            b += lines(bq, sizeof(double));
        }
        if (weights)
            w[i].tile_max = (float *)(void *)b;
    }
    return w;
}

attn_status attn_sdpa_forward(const attn_sdpa_params *p, const float *q,
                              const float *k, const float *v, float *out,
                              double *lse, float *weights, attn_stats *stats,
                              attn_error *err)
{
    attn_status s = sdpa_check_params(p, weights != NULL, err);
    if (s != ATTN_OK)
        return s;
    if (q == NULL || k == NULL || v == NULL || out == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "q, k, v and out must not be NULL");
    attn_blas_init();

    fwd_job job = {
        .call = {.p = p, .q = q, .k = k, .v = v, .group = p->heads_q / p->heads_kv,
                 .offset = p->n_k - p->n_q},
        .out = out, .lse = lse, .weights = weights, .want_stats = stats != NULL,
        .q_tiles = (p->n_q + SDPA_FWD_BQ - 1) / SDPA_FWD_BQ,
        .k_tiles = (p->n_k + SDPA_FWD_BK - 1) / SDPA_FWD_BK,
        .bq = p->n_q < SDPA_FWD_BQ ? (p->n_q > 1 ? p->n_q : 1) : SDPA_FWD_BQ,
        .bk = p->n_k < SDPA_FWD_BK ? (p->n_k > 1 ? p->n_k : 1) : SDPA_FWD_BK,
    };
    int64_t units = p->batch * p->heads_q * job.q_tiles;
    int threads = sdpa_threads(p, units, attn_sdpa_flops(p));
    job.workers = alloc_workers(threads, &job);
    if (job.workers == NULL)
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for %d workers' tiles", threads);
    s = attn_parallel_for(threads, units, forward_unit, &job);
    if (s == ATTN_OK && stats != NULL) {
        for (int i = 1; i < threads; i++)
            sdpa_stats_merge(&job.workers[0].stats, &job.workers[i].stats);
        sdpa_stats_finish(&job.workers[0].stats, p->scale, stats);
    }
    free_workers(job.workers, threads);
    if (s != ATTN_OK)
        return attn_fail(err, s, "could not run the forward pass's threads");
    return ATTN_OK;
}
