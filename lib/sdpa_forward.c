/*
 * attn_sdpa_forward (Eq. 10): out = softmax(scale * q k^T + mask) v.
 *   q [B, H_q, n_q, d_k], k [B, H_kv, n_k, d_k], v [B, H_kv, n_k, d_v]
 *   -> out [B, H_q, n_q, d_v]; optional rows [B, H_q, n_q] (softmax max and
 *      sum), weights [B, H_q, n_q, n_k], stats.
 *
 * (In ATTN_LAYOUT_BNHD the tensors are [B, n, H, d] instead; see attn.h.)
 *
 * First k is packed, once per key/value head, into KERN_BK-wide panels of
 *   kt [B, H_kv, key tiles, d_k, KERN_BK]   (k^T, tile by tile; the last
 *                                            tile only as wide as its keys)
 * which every query block of every query head that reads the head shares
 * (when only one unit reads each panel, short sequences, the unit packs it
 * itself, right before it uses it).
 * Then a work unit is one block of KERN_FWD_BQ query rows of one (batch,
 * head): it streams the key tiles past its rows (the kernel's forward_tile)
 * and owns its output rows, so units run in parallel without sharing
 * anything but read-only inputs. (For the head mean of the weights a unit
 * is one block of one batch through every head, which then owns its rows of
 * the mean.) Extra memory: the packed copy of k, and a few rows per worker.
 *
 * A row's output sums over all its keys: the kernels add each tile into
 * the float output rows, and every SDPA_FOLD_TILES tiles the unit folds
 * them into a double sum (rescaled with the row's maximum as the float
 * rows are), so that the error does not grow with n_k.
 *
 * In bfloat16 (ATTN_PRECISION_BFLOAT16) a panel holds the tile's k and v
 * rounded to bfloat16, in the pairs the kernel's products read (kern.h's
 * kern_keys.kp and .vp), packed the same way (once, or by the unit), and a
 * unit rounds its own query rows once, before its key tiles.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kern.h"

/* One worker's workspaces, carved from a single allocation (block). */
typedef struct {
    float *strip, *m, *raw, *x, *tile_max;
    float *panel; /* [d_k, ld]: k^T of the tile, when units pack their own */
    float *m_tile; /* [KERN_FWD_BQ]: the row maxima before the tile */
    double *l, *ent;
    double *acc;  /* [KERN_FWD_BQ, d_v]: the output rows folded so far */
    /* With the head mean of the weights: one head's weights of the block,
     * and their sum over the heads so far. [KERN_FWD_BQ, n_k] each. */
    float *head_weights;
    double *mean_sum;
    /* In bfloat16: the unit's q rows [KERN_FWD_BQ, ceil(d_k / 2)], a
     * strip's P [KERN_MR_MAX, KERN_BK / 2], and the tile's panel when
     * units pack their own. */
    uint32_t *qb, *pb, *panel_b;
    void *block;
} fwd_worker;

typedef struct {
    sdpa_call call;
    const attn_kern *kern;
    const attn_kern_bf16 *kern_bf16; /* in bfloat16, else NULL */
    int64_t panel_words;             /* in bfloat16: words of one packed tile */
    const float *kt; /* the packed panels; NULL when each unit packs its own */
    const uint32_t *kv_b; /* in bfloat16, the same */
    float *out, *weights;
    attn_softmax_row *rows;
    sdpa_stats_acc *unit_stats; /* [units], with statistics */
    int64_t q_tiles, k_tiles;
    fwd_worker *workers;
} fwd_job;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* --------------------------------------------------------------- packing */

/* The packed panel of keys j0.. of (batch, key/value head) pair `pair`: a
 * pair's panels hold d_k * n_k floats, as many as its keys. */
static float *panel_at(const float *kt, const attn_sdpa_params *p, int64_t pair, int64_t j0)
{
    return (float *)kt + (pair * p->n_k + j0) * p->d_k;
}

typedef struct {
    const sdpa_call *call;
    const attn_kern *kern;
    const attn_kern_bf16 *kern_bf16;
    float *kt;
    uint32_t *kv_b;
    int64_t k_tiles, panel_words;
} pack_job;

/* The bfloat16 panel of keys j0 .. j0 + keys of head (b, h)'s key/value
 * head: kp [ceil(d_k / 2), KERN_BK], then vp [KERN_BK / 2, d_v]. */
static void pack_bf16(const attn_kern_bf16 *kb, const sdpa_call *c, int64_t b, int64_t h,
                      int64_t j0, int64_t keys, uint32_t *panel)
{
    const attn_sdpa_params *p = c->p;
    uint32_t *kp = panel, *vp = panel + (p->d_k + 1) / 2 * KERN_BK;
    sdpa_bf16_pack_t(kb, sdpa_src_at(sdpa_src_k(c, b, h), j0 * c->ldk), c->ldk, keys, p->d_k,
                     kp);
    sdpa_bf16_row_pairs(kb, sdpa_src_at(sdpa_src_v(c, b, h), j0 * c->ldv), c->ldv, keys,
                        p->d_v, vp, p->d_v, KERN_BK / 2, true);
}

/* Unit: one key tile of one (batch, key/value head). */
static void pack_unit(void *ctx, int64_t u, int worker)
{
    (void)worker;
    const pack_job *j = ctx;
    const attn_sdpa_params *p = j->call->p;
    int64_t pair = u / j->k_tiles, tile = u % j->k_tiles;
    int64_t j0 = tile * KERN_BK, keys = min64(KERN_BK, p->n_k - j0);
    int64_t b = pair / p->heads_kv, hk = pair % p->heads_kv;
    if (j->kern_bf16 != NULL) {
        /* Head hk * group of the query heads reads key/value head hk. */
        pack_bf16(j->kern_bf16, j->call, b, hk * j->call->group, j0, keys,
                  j->kv_b + u * j->panel_words);
        return;
    }
    const float *k = j->call->k + sdpa_head_at(p, b, hk, p->heads_kv, p->n_k, p->d_k) +
                     j0 * j->call->ldk;
    j->kern->pack_t(k, j->call->ldk, keys, p->d_k, panel_at(j->kt, p, pair, j0),
                    kern_panel_ld(keys));
}

/* --------------------------------------------------------------- weights */

/* Each tile's P went to the weights relative to the row maximum of its
 * time (tile_max); now that the final maximum m and sum l are known, every
 * tile is rescaled by exp(tile_max - m) / l. */
static void finish_weights(const fwd_job *job, const sdpa_tile *t, const fwd_worker *w,
                           float *weights, int64_t k_first, int64_t k_end)
{
    const attn_sdpa_params *p = job->call.p;
    for (int64_t r = 0; r < t->rows; r++) {
        float *row = weights + r * p->n_k;
        for (int64_t j0 = k_first; j0 < k_end; j0 += KERN_BK) {
            int64_t cols = min64(k_end - j0, KERN_BK);
            float m_t = w->tile_max[r * job->k_tiles + j0 / KERN_BK];
            float f = 0.0f;
            if (w->l[r] > 0.0 && m_t != -INFINITY)
                f = (float)(exp((double)m_t - w->m[r]) / w->l[r]);
            for (int64_t j = 0; j < cols; j++)
                row[j0 + j] *= f;
        }
        /* Keys outside the tiles visited (causal, window): weight 0. */
        memset(row, 0, (size_t)k_first * sizeof *row);
        memset(row + k_end, 0, (size_t)(p->n_k - k_end) * sizeof *row);
    }
}

/* ------------------------------------------------------------------ units */

/* Rows [rows] of a forward unit's float output rows (since the last fold,
 * row stride ldo) into their double sums acc [rows, d_v], after a tile:
 * first the sums are rescaled as the tile rescaled the float rows, where
 * it raised a row's maximum (m_tile holds each row's maximum before the
 * tile, m after it); with `fold`, the float rows are then added in, and the
 * next tile writes them afresh. */
void sdpa_fold_rows(double *acc, float *m_tile, const float *m, const float *out, int64_t ldo,
                    int64_t rows, int64_t d_v, bool fold)
{
    for (int64_t r = 0; r < rows; r++) {
        double *a = acc + r * d_v;
        if (m[r] > m_tile[r] && m_tile[r] != -INFINITY) {
            double shrink = (double)expf(m_tile[r] - m[r]);
            for (int64_t e = 0; e < d_v; e++)
                a[e] *= shrink;
        }
        m_tile[r] = m[r];
        for (int64_t e = 0; fold && e < d_v; e++)
            a[e] += out[r * ldo + e];
    }
}

/* A row's output o [d_v] = (acc + o) / l, the float rows o added only when
 * they hold tiles since the last fold (`partial`; acc NULL: nothing was
 * folded); false when it is not finite. */
bool sdpa_finish_row(float *o, const double *acc, bool partial, double l, int64_t d_v)
{
    const double inv = l > 0.0 ? 1.0 / l : 0.0;
    bool finite = true;
    for (int64_t e = 0; e < d_v; e++) {
        o[e] = (float)(((acc != NULL ? acc[e] : 0.0) + (partial ? o[e] : 0.0f)) * inv);
        finite &= isfinite(o[e]);
    }
    return finite;
}

/* Query block qt of head (b, h), through all its key tiles; its weights,
 * when asked for, go to `weights` [rows, n_k]. */
static void forward_rows(const fwd_job *job, fwd_worker *w, int64_t b, int64_t h, int64_t qt,
                         float *weights)
{
    const sdpa_call *c = &job->call;
    const attn_sdpa_params *p = c->p;
    const int64_t bh = b * p->heads_q + h;
    sdpa_tile t = {.b = b, .h = h, .i0 = qt * KERN_FWD_BQ};
    t.rows = min64(p->n_q - t.i0, KERN_FWD_BQ);
    float *out = job->out + sdpa_head_o_at(c, t.b, t.h) + t.i0 * c->ldo;
    for (int64_t r = 0; r < t.rows; r++) {
        w->m[r] = w->m_tile[r] = -INFINITY;
        w->l[r] = 0.0;
    }
    memset(w->acc, 0, (size_t)(t.rows * p->d_v) * sizeof *w->acc);
    sdpa_stats_acc *stats = NULL;
    if (job->unit_stats != NULL) {
        stats = &job->unit_stats[bh * job->q_tiles + qt];
        sdpa_stats_init(stats);
        memset(w->ent, 0, (size_t)t.rows * sizeof *w->ent);
    }
    sdpa_fwd_state st = {.strip = w->strip, .m = w->m, .l = w->l, .out = out,
                         .weights = weights, .tile_max = w->tile_max,
                         .k_tiles = job->k_tiles, .stats = stats, .ent = w->ent,
                         .raw = w->raw, .x = w->x, .scale = p->scale,
                         .softcap = p->variants.softcap};
    const int64_t pair = t.b * p->heads_kv + t.h / c->group;
    const attn_kern_bf16 *kb = job->kern_bf16;
    const float *v = kb == NULL ? sdpa_head_v(c, t.b, t.h) : NULL; /* bfloat16 reads panels */
    if (kb != NULL) {
        const int64_t dk2 = (p->d_k + 1) / 2;
        sdpa_bf16_rows(kb, sdpa_src_at(sdpa_src_q(c, t.b, t.h), t.i0 * c->ldq), c->ldq, t.rows,
                       p->d_k, w->qb, dk2);
        st.qb = w->qb;
        st.ldqb = dk2;
        st.pb = w->pb;
    }
    /* Key tiles wholly outside the causal diagonal and the window are
     * skipped; the last one is cut where the block's last row stops. */
    int64_t k_begin, k_end;
    sdpa_key_range(c, t.i0, t.rows, &k_begin, &k_end);
    const int64_t k_first = k_begin / KERN_BK * KERN_BK;
    if (k_begin == k_end) /* no key at all: the first tile would have written the rows */
        for (int64_t r = 0; r < t.rows; r++)
            memset(out + r * c->ldo, 0, (size_t)p->d_v * sizeof *out);
    int64_t since_fold = 0; /* tiles in the float rows */
    for (t.j0 = k_first; t.j0 < k_end; t.j0 += KERN_BK) {
        /* Cancelled: the rows are left as they are (the call's outputs
         * are unspecified then), rather than finished from partial sums. */
        if (attn_cancelled(p->cancel))
            return;
        if (since_fold == SDPA_FOLD_TILES) {
            sdpa_fold_rows(w->acc, w->m_tile, w->m, out, c->ldo, t.rows, p->d_v, true);
            since_fold = 0;
        }
        st.kt = t.j0 / KERN_BK;
        st.accumulate = since_fold++ > 0;
        t.cols = min64(k_end - t.j0, KERN_BK);
        /* The panel holds the tile's keys; the tile may stop short of its
         * end (causal), the panel's stride does not. */
        kern_keys keys = {.v = v != NULL ? v + t.j0 * c->ldv : NULL,
                          .ld = kern_panel_ld(min64(p->n_k - t.j0, KERN_BK))};
        if (kb != NULL) {
            const uint32_t *panel = job->kv_b;
            if (panel != NULL) {
                panel += (pair * job->k_tiles + st.kt) * job->panel_words;
            } else {
                pack_bf16(kb, c, t.b, t.h, t.j0, t.cols, w->panel_b);
                panel = w->panel_b;
            }
            keys.kp = panel;
            keys.vp = panel + (p->d_k + 1) / 2 * KERN_BK;
            kb->forward_tile(c, &t, &keys, &st);
        } else {
            if (job->kt != NULL) {
                keys.kt = panel_at(job->kt, p, pair, t.j0);
            } else {
                keys.ld = kern_panel_ld(t.cols);
                job->kern->pack_t(sdpa_head_k(c, t.b, t.h) + t.j0 * c->ldk, c->ldk, t.cols,
                                  p->d_k, w->panel, keys.ld);
                keys.kt = w->panel;
            }
            job->kern->forward_tile(c, &t, &keys, &st);
        }
        sdpa_fold_rows(w->acc, w->m_tile, w->m, out, c->ldo, t.rows, p->d_v, false);
    }
    if (weights != NULL)
        finish_weights(job, &t, w, weights, k_end > k_begin ? k_first : k_end, k_end);
    for (int64_t r = 0; r < t.rows; r++) {
        double l = w->l[r];
        float *o = out + r * c->ldo;
        bool finite = sdpa_finish_row(o, w->acc + r * p->d_v, since_fold > 0, l, p->d_v);
        attn_softmax_row sm = {.max = l > 0.0 ? w->m[r] : -INFINITY, .sum = (float)l};
        bool sm_finite = isfinite(sm.sum) && (l == 0.0 || isfinite(sm.max));
        if (!sm_finite || !finite) {
            /* The weighted sum overflowed (the row is redone in double), or
             * the scores did (then the row's maximum and sum are redone too;
             * otherwise they stay those the kernel's weights were made with). */
            float *row = weights == NULL || sm_finite ? NULL : weights + r * p->n_k;
            attn_softmax_row exact = sdpa_forward_row_exact(c, t.b, t.h, t.i0 + r, o, row);
            if (!sm_finite)
                sm = exact;
        }
        if (job->rows != NULL)
            job->rows[bh * p->n_q + t.i0 + r] = sm;
        if (stats != NULL && l > 0.0)
            /* Entropy = lse - sum_j a_j x_j = log l - sum_j a_j (x_j - m);
             * the largest weight is exp(m - lse) = 1 / l. */
            sdpa_stats_row(stats, log(l) - w->ent[r] / l, 1.0 / l);
    }
}

/* Causal query blocks grow in cost with their index: hand out the
 * expensive ones first so that the last units to finish are cheap. */
static int64_t block_of(const fwd_job *job, int64_t u)
{
    int64_t qt = u % job->q_tiles;
    return job->call.p->causal ? job->q_tiles - 1 - qt : qt;
}

/* Unit: one query block of one (batch, head). */
static void forward_unit(void *ctx, int64_t u, int worker)
{
    const fwd_job *job = ctx;
    const attn_sdpa_params *p = job->call.p;
    int64_t qt = block_of(job, u), bh = u / job->q_tiles;
    float *weights = job->weights == NULL
                         ? NULL
                         : job->weights + (bh * p->n_q + qt * KERN_FWD_BQ) * p->n_k;
    forward_rows(job, &job->workers[worker], bh / p->heads_q, bh % p->heads_q, qt, weights);
}

/* Unit, for the head mean of the weights: one query block of one batch,
 * through every head in turn. Each head's weights land in the worker's
 * rows and are added (in double, so that thousands of heads average
 * exactly) to the block's sums; the unit alone writes its rows of the mean. */
static void forward_mean_unit(void *ctx, int64_t u, int worker)
{
    const fwd_job *job = ctx;
    const attn_sdpa_params *p = job->call.p;
    fwd_worker *w = &job->workers[worker];
    int64_t qt = block_of(job, u), b = u / job->q_tiles;
    const int64_t i0 = qt * KERN_FWD_BQ, count = min64(p->n_q - i0, KERN_FWD_BQ) * p->n_k;
    memset(w->mean_sum, 0, (size_t)count * sizeof *w->mean_sum);
    for (int64_t h = 0; h < p->heads_q; h++) {
        forward_rows(job, w, b, h, qt, w->head_weights);
        for (int64_t e = 0; e < count; e++)
            w->mean_sum[e] += w->head_weights[e];
    }
    float *mean = job->weights + (b * p->n_q + i0) * p->n_k;
    const double inv = 1.0 / (double)p->heads_q;
    for (int64_t e = 0; e < count; e++)
        mean[e] = (float)(w->mean_sum[e] * inv);
}

/* ------------------------------------------------------------- workspace */

/* A small call's workspaces (the packed k and the workers' rows) come from
 * a block on attn_sdpa_forward's stack: for a few rows and keys, the heap's
 * aligned allocations cost more than the attention (n = d = 4: about a
 * third of the call). Larger ones come from the heap as before. */
#define SMALL_WORKSPACE 8192

typedef struct {
    char *base, *next, *end;
} fwd_arena;

/* n items of size, 64-byte aligned, from the arena when they fit. */
static void *ws_alloc(fwd_arena *a, int64_t n, size_t size)
{
    if (n >= 0 && (uint64_t)n <= SMALL_WORKSPACE / size) {
        size_t bytes = ((size_t)n * size + 63) / 64 * 64;
        if (bytes <= (size_t)(a->end - a->next)) {
            void *p = a->next;
            a->next += bytes;
            return p;
        }
    }
    return sdpa_alloc(n, size);
}

static void ws_free(const fwd_arena *a, void *p)
{
    uintptr_t u = (uintptr_t)p;
    if (u < (uintptr_t)a->base || u >= (uintptr_t)a->end)
        free(p);
}

/* ---------------------------------------------------------------- workers */

static void free_workers(const fwd_arena *a, fwd_worker *w, int n)
{
    for (int i = 0; w != NULL && i < n; i++)
        ws_free(a, w[i].block);
    ws_free(a, w);
}

/* Bytes of n items of size, rounded up to whole cache lines. */
static size_t lines(int64_t n, size_t size)
{
    return ((size_t)n * size + 63) / 64 * 64;
}

static fwd_worker *alloc_workers(fwd_arena *a, int n, const fwd_job *job, bool stats)
{
    fwd_worker *w = ws_alloc(a, n, sizeof *w);
    if (w == NULL)
        return NULL;
    memset(w, 0, (size_t)n * sizeof *w);
    const int64_t bq = KERN_FWD_BQ, bk = KERN_BK;
    const int64_t panel_keys = min64(job->call.p->n_k, KERN_BK), d_v = job->call.p->d_v;
    const bool weights = job->weights != NULL;
    const bool mean = weights && job->call.p->weights_mean;
    const int64_t block_weights = min64(job->call.p->n_q, bq) * job->call.p->n_k;
    size_t bytes = lines(KERN_MR_MAX * bk, sizeof(float)) + 2 * lines(bq, sizeof(float)) +
                   lines(bq, sizeof(double)) +
                   lines(job->call.p->d_k * panel_keys, sizeof(float)) +
                   lines(bq * d_v, sizeof(double));
    if (mean)
        bytes += lines(block_weights, sizeof(double)) + lines(block_weights, sizeof(float));
    if (stats)
        bytes += 2 * lines(bk, sizeof(float)) + lines(bq, sizeof(double));
    if (weights)
        bytes += lines(bq * job->k_tiles, sizeof(float));
    const int64_t dk2 = (job->call.p->d_k + 1) / 2;
    if (job->kern_bf16 != NULL)
        bytes += lines(bq * dk2, sizeof(uint32_t)) +
                 lines(KERN_MR_MAX * bk / 2, sizeof(uint32_t)) +
                 lines(job->panel_words, sizeof(uint32_t));
    for (int i = 0; i < n; i++) {
        char *b = ws_alloc(a, (int64_t)bytes, 1);
        if (b == NULL) {
            free_workers(a, w, n);
            return NULL;
        }
        w[i].block = b;
        w[i].strip = (float *)(void *)b;
        b += lines(KERN_MR_MAX * bk, sizeof(float));
        w[i].m = (float *)(void *)b;
        b += lines(bq, sizeof(float));
        w[i].l = (double *)(void *)b;
        b += lines(bq, sizeof(double));
        w[i].panel = (float *)(void *)b;
        b += lines(job->call.p->d_k * panel_keys, sizeof(float));
        w[i].m_tile = (float *)(void *)b;
        b += lines(bq, sizeof(float));
        w[i].acc = (double *)(void *)b;
        b += lines(bq * d_v, sizeof(double));
        if (mean) {
            w[i].mean_sum = (double *)(void *)b;
            b += lines(block_weights, sizeof(double));
            w[i].head_weights = (float *)(void *)b;
            b += lines(block_weights, sizeof(float));
        }
        if (stats) {
            w[i].raw = (float *)(void *)b;
            b += lines(bk, sizeof(float));
            w[i].x = (float *)(void *)b;
            b += lines(bk, sizeof(float));
            w[i].ent = (double *)(void *)b;
            b += lines(bq, sizeof(double));
        }
        if (weights) {
            w[i].tile_max = (float *)(void *)b;
            b += lines(bq * job->k_tiles, sizeof(float));
        }
        if (job->kern_bf16 != NULL) {
            w[i].qb = (uint32_t *)(void *)b;
            b += lines(bq * dk2, sizeof(uint32_t));
            w[i].pb = (uint32_t *)(void *)b;
            b += lines(KERN_MR_MAX * bk / 2, sizeof(uint32_t));
            w[i].panel_b = (uint32_t *)(void *)b;
        }
    }
    return w;
}

attn_status attn_sdpa_forward(const attn_sdpa_params *p, const float *q,
                              const float *k, const float *v, float *out,
                              attn_softmax_row *rows, float *weights, attn_stats *stats,
                              attn_error *err)
{
    if (p != NULL && !sdpa_dtypes_float32(p))
        return attn_fail(err, ATTN_ERR_INVALID,
                         "dtype names bfloat16 inputs: attn_sdpa_forward_in reads them");
    return attn_sdpa_forward_in(p, q, k, v, out, rows, weights, stats, err);
}

attn_status attn_sdpa_forward_in(const attn_sdpa_params *p, const void *q, const void *k,
                                 const void *v, float *out, attn_softmax_row *rows,
                                 float *weights, attn_stats *stats, attn_error *err)
{
    const sdpa_kernels kernels = {.f32 = attn_kern_get(), .bf16 = attn_kern_bf16_get()};
    return attn_sdpa_forward_with(&kernels, p, q, k, v, out, rows, weights, stats, err);
}

attn_status attn_sdpa_forward_with(const sdpa_kernels *kernels, const attn_sdpa_params *p,
                                   const void *q, const void *k, const void *v, float *out,
                                   attn_softmax_row *rows, float *weights, attn_stats *stats,
                                   attn_error *err)
{
    attn_status s = sdpa_check_params(p, weights != NULL, err);
    if (s != ATTN_OK)
        return s;
    if (q == NULL || k == NULL || v == NULL || out == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "q, k, v and out must not be NULL");

    fwd_job job = {
        .call = sdpa_call_of(p, q, k, v),
        .kern = kernels->f32,
        .out = out, .rows = rows, .weights = weights,
        .q_tiles = (p->n_q + KERN_FWD_BQ - 1) / KERN_FWD_BQ,
        .k_tiles = (p->n_k + KERN_BK - 1) / KERN_BK,
    };
    if (job.call.bf16) {
        job.kern_bf16 = kernels->bf16;
        job.panel_words = (p->d_k + 1) / 2 * KERN_BK + KERN_BK / 2 * p->d_v;
    }
    const int64_t units = p->batch * p->heads_q * job.q_tiles;
    const int64_t panels = p->batch * p->heads_kv * job.k_tiles;
    const bool mean = weights != NULL && p->weights_mean;
    /* The head mean's units take every head of a block: fewer, larger. */
    const int64_t run_units = mean ? p->batch * job.q_tiles : units;
    int threads = sdpa_threads(p, run_units, attn_sdpa_flops(p));
    /* A panel read by one unit only (one query block, no query heads
     * sharing the key head) is packed by that unit, while it is in cache;
     * otherwise once for all of them, before. */
    const bool shared = job.q_tiles > 1 || job.call.group > 1;
    _Alignas(64) char small[SMALL_WORKSPACE];
    fwd_arena arena = {.base = small, .next = small, .end = small + sizeof small};
    float *kt = shared && !job.call.bf16
                    ? ws_alloc(&arena, p->batch * p->heads_kv * p->n_k * p->d_k, sizeof(float))
                    : NULL;
    uint32_t *kv_b = shared && job.call.bf16
                         ? ws_alloc(&arena, panels * job.panel_words, sizeof(uint32_t))
                         : NULL;
    job.kt = kt;
    job.kv_b = kv_b;
    if (stats != NULL)
        job.unit_stats = malloc((size_t)units * sizeof *job.unit_stats);
    job.workers = alloc_workers(&arena, threads, &job, stats != NULL);
    /* With RoPE the kernels read rotated copies of q and k. */
    const bool rope = p->variants.rope_base > 0.0f;
    float *q_rot = NULL, *k_rot = NULL;
    if (rope) {
        q_rot = sdpa_alloc(p->batch * p->heads_q * p->n_q * p->d_k, sizeof(float));
        k_rot = sdpa_alloc(p->batch * p->heads_kv * p->n_k * p->d_k, sizeof(float));
    }
    bool ok = (!shared || kt != NULL || kv_b != NULL) && job.workers != NULL &&
              (stats == NULL || job.unit_stats != NULL) &&
              (!rope || (q_rot != NULL && k_rot != NULL));
    if (ok && rope) {
        ok = sdpa_rope_inputs(&job.call, threads, q_rot, k_rot) == ATTN_OK;
    }
    if (!ok) {
        ws_free(&arena, kt);
        ws_free(&arena, kv_b);
        free(q_rot);
        free(k_rot);
        free(job.unit_stats);
        free_workers(&arena, job.workers, threads);
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the forward pass's tiles");
    }
    if (shared) {
        pack_job pack = {.call = &job.call, .kern = job.kern, .kern_bf16 = job.kern_bf16,
                         .kt = kt, .kv_b = kv_b, .k_tiles = job.k_tiles,
                         .panel_words = job.panel_words};
        attn_parallel_for_until(threads, panels, pack_unit, &pack, p->cancel);
    }
    attn_parallel_for_until(threads, run_units, mean ? forward_mean_unit : forward_unit, &job,
                            p->cancel);
    const bool cancelled = attn_cancelled(p->cancel);
    if (stats != NULL && !cancelled) {
        for (int64_t u = 1; u < units; u++)
            sdpa_stats_merge(&job.unit_stats[0], &job.unit_stats[u]);
        sdpa_stats_finish(&job.unit_stats[0], stats);
    }
    ws_free(&arena, kt);
    ws_free(&arena, kv_b);
    free(q_rot);
    free(k_rot);
    free(job.unit_stats);
    free_workers(&arena, job.workers, threads);
    if (cancelled)
        return attn_fail(err, ATTN_ERR_CANCELLED, "the call was cancelled");
    return ATTN_OK;
}
