/*
 * attn_sdpa_forward (Eq. 10): out = softmax(scale * q k^T + mask) v.
 *   q [B, H_q, n_q, d_k], k [B, H_kv, n_k, d_k], v [B, H_kv, n_k, d_v]
 *   -> out [B, H_q, n_q, d_v]; optional rows [B, H_q, n_q] (softmax max and
 *      sum), weights [B, H_q, n_q, n_k], stats.
 *
 * (In ATTN_LAYOUT_BNHD the tensors are [B, n, H, d] instead; see attn.h.)
 *
 * The call is a list of sequences: one per batch entry, or those of a
 * ragged batch (attn_ragged), each with its own query rows and keys.
 * First k is packed, once per key/value head of a sequence, into
 * KERN_BK-wide panels of
 *   kt [sequences, H_kv, key tiles, d_k, KERN_BK]   (k^T, tile by tile,
 *                                                   from the sequence's first key)
 * (one sequence per batch entry: a tile's panel only as wide as its keys,
 * the panels of a head as many floats as its keys)
 * which every query block of every query head that reads the head shares;
 * a sequence whose panels only one item reads (short sequences) has them
 * packed by that item, right before it uses them.
 * Then an item is one block of KERN_FWD_BQ query rows of one head of one
 * sequence (or, for a short sequence, its rows of each query head that
 * shares a key/value head): it streams the sequence's key tiles past its
 * rows (the kernel's forward_tile) and owns its output rows, so items run
 * in parallel without sharing anything but read-only inputs. Items go to
 * the threads in units of about equal work (attn_units_plan). Extra
 * memory: the packed copy of k, and a few rows per worker. (For the head
 * mean of the weights, not with a ragged batch, a unit is one block of one
 * batch entry through every head, which then owns its rows of the mean.)
 *
 * A row's output sums over all its keys: the kernels add each tile into
 * the float output rows, and every SDPA_FOLD_TILES tiles the block folds
 * them into a double sum (rescaled with the row's maximum as the float
 * rows are), so that the error does not grow with n_k.
 *
 * In bfloat16 (ATTN_PRECISION_BFLOAT16) a panel holds the tile's k and v
 * rounded to bfloat16, in the pairs the kernel's products read (kern.h's
 * kern_keys.kp and .vp), packed the same way (once, or by the item), and a
 * block rounds its own query rows once, before its key tiles.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kern.h"

/* One worker's workspaces, carved from a single allocation (block). */
typedef struct {
    float *strip, *m, *raw, *x, *tile_max;
    float *panel; /* [d_k, ld]: k^T of the tile, when items pack their own */
    float *m_tile; /* [KERN_FWD_BQ]: the row maxima before the tile */
    double *l, *ent;
    double *acc;  /* [KERN_FWD_BQ, d_v]: the output rows folded so far */
    /* With the head mean of the weights: one head's weights of the block,
     * and their sum over the heads so far. [KERN_FWD_BQ, n_k] each. */
    float *head_weights;
    double *mean_sum;
    /* In bfloat16: the block's q rows [KERN_FWD_BQ, ceil(d_k / 2)], a
     * strip's P [KERN_MR_MAX, KERN_BK / 2], and the tile's panel when
     * items pack their own. */
    uint32_t *qb, *pb, *panel_b;
    void *block;
} fwd_worker;

typedef struct {
    sdpa_call call;
    const attn_kern *kern;
    const attn_kern_bf16 *kern_bf16; /* in bfloat16, else NULL */
    int64_t panel_words;             /* in bfloat16: words of one packed tile */
    float *kt; /* the packed panels; NULL when no sequence shares its own */
    uint32_t *kv_b; /* in bfloat16, the same */
    /* Panels of the sequences before s: panel_at[s] ([seqs + 1], ragged),
     * or s * H_kv * k_tiles (one sequence per batch entry). A sequence with
     * none shared has panel_at[s + 1] == panel_at[s]. */
    const int64_t *panel_at;
    float *out, *weights;
    attn_softmax_row *rows;
    sdpa_stats_acc *unit_stats; /* [units], with statistics */
    int64_t k_tiles;            /* the most key tiles of a sequence */
    int64_t seqs;               /* the call's sequences (sdpa_seq_count) */
    /* The work's sequences (work.seqs) are those of each key/value head
     * in turn (a ragged batch in [B, H, n, d]): work sequence v is head
     * v / seqs of sequence v % seqs, its items only that head's. */
    bool by_head;
    /* by_head: the cost of each work sequence ([work.seqs], each
     * sequence's once a head), for the plan to read in place */
    double *head_cost;
    int64_t q_tiles;            /* query blocks of a batch entry (head mean) */
    /* The head mean of a ragged batch: the first unit of each sequence
     * ([seqs + 1], one per query block of it); NULL otherwise. */
    const int64_t *mean_at;
    sdpa_work work;
    sdpa_units units;
    fwd_worker *workers;
} fwd_job;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t tiles(int64_t n, int64_t per) { return (n + per - 1) / per; }

/* ------------------------------------------------------------- sequences */

/*
 * A sequence's panels are packed beforehand and shared when more than one
 * item reads them: several query blocks, or several query heads over more
 * than one key tile. Otherwise its items are one per key/value head, each
 * taking the sequence's query rows for every query head of the group and
 * packing the panel it reads itself (one panel, packed once, when the
 * group has several heads).
 */
static bool seq_shared(const sdpa_call *c, int64_t q_tiles, int64_t k_tiles)
{
    return q_tiles > 1 || (c->group > 1 && k_tiles > 1);
}

static int64_t first_panel(const fwd_job *job, int64_t s)
{
    return job->panel_at != NULL ? job->panel_at[s]
                                 : s * job->call.p->heads_kv * job->k_tiles;
}

/* The sequence of work sequence v (and its key/value head when the work
 * goes head by head, else -1). */
static int64_t fwd_seq(const fwd_job *job, int64_t v, int64_t *hk)
{
    *hk = job->by_head ? v / job->seqs : -1;
    return job->by_head ? v % job->seqs : v;
}

/* The items of a work sequence whose sequence's call is c: a query block
 * of one head each, or one per key/value head (every head's, or the work
 * sequence's one when by_head). */
static int64_t call_items(const fwd_job *job, const sdpa_call *c)
{
    const int64_t q_tiles = tiles(c->q_hi - c->q_lo, KERN_FWD_BQ);
    if (q_tiles == 0)
        return 0;
    if (seq_shared(c, q_tiles, tiles(c->k_hi - c->k_lo, KERN_BK)))
        return (job->by_head ? c->group : c->p->heads_q) * q_tiles;
    return job->by_head ? 1 : c->p->heads_kv;
}

static int64_t fwd_items(const void *ctx, int64_t v)
{
    const fwd_job *job = ctx;
    int64_t b, hk;
    const sdpa_call c = sdpa_call_seq(&job->call, fwd_seq(job, v, &hk), &b);
    return call_items(job, &c);
}

/* Cost of one head's query block qt: the products over the keys it sees,
 * and the per-row, per-tile and per-item steps around them (as many
 * FLOPs as they take time, roughly). */
static double block_cost(const sdpa_call *c, int64_t qt)
{
    const attn_sdpa_params *p = c->p;
    const int64_t i0 = c->q_lo + qt * KERN_FWD_BQ, rows = min64(c->q_hi - i0, KERN_FWD_BQ);
    int64_t begin, end;
    sdpa_key_range(c, i0, rows, &begin, &end);
    const double keys = (double)(end - begin), width = (double)(p->d_k + p->d_v);
    return 2.0 * (double)rows * (keys + 16.0 * (double)tiles(end - begin, KERN_BK)) * width +
           64.0 * width + 2e4;
}

static double fwd_cost(const void *ctx, int64_t v, int64_t i)
{
    const fwd_job *job = ctx;
    int64_t b, hk;
    const sdpa_call c = sdpa_call_seq(&job->call, fwd_seq(job, v, &hk), &b);
    const int64_t q_tiles = tiles(c.q_hi - c.q_lo, KERN_FWD_BQ);
    if (seq_shared(&c, q_tiles, tiles(c.k_hi - c.k_lo, KERN_BK)))
        return block_cost(&c, i % q_tiles);
    return (double)c.group * block_cost(&c, 0);
}

static double fwd_seq_cost(const void *ctx, int64_t v)
{
    const fwd_job *job = ctx;
    int64_t b, hk;
    const sdpa_call c = sdpa_call_seq(&job->call, fwd_seq(job, v, &hk), &b);
    double cost = 0.0;
    for (int64_t qt = 0; qt < tiles(c.q_hi - c.q_lo, KERN_FWD_BQ); qt++)
        cost += block_cost(&c, qt);
    return cost * (double)(job->by_head ? c.group : c.p->heads_q);
}

/* --------------------------------------------------------------- packing */

/* The sequence whose panels include panel u: the last s with
 * first_panel(s) <= u < first_panel(s + 1). */
static int64_t panel_seq(const fwd_job *job, int64_t u)
{
    if (job->panel_at == NULL)
        return u / (job->call.p->heads_kv * job->k_tiles);
    int64_t lo = 0, hi = job->seqs; /* panel_at[lo] <= u < panel_at[hi] */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (job->panel_at[mid] <= u)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

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

/* The first panel of key/value head hk of sequence s (batch entry b); its
 * tile kt is d_k * KERN_BK floats further. One sequence per batch entry:
 * a head's panels hold d_k * n_k floats, the last tile only as wide as its
 * keys. */
static float *panels_of(const fwd_job *job, int64_t s, int64_t b, int64_t hk, int64_t k_tiles)
{
    const attn_sdpa_params *p = job->call.p;
    if (job->panel_at == NULL)
        return job->kt + (b * p->heads_kv + hk) * p->n_k * p->d_k;
    return job->kt + (job->panel_at[s] + hk * k_tiles) * p->d_k * KERN_BK;
}

/* Unit: one key tile of one key/value head of a sequence. */
static void pack_unit(void *ctx, int64_t u, int worker)
{
    (void)worker;
    const fwd_job *job = ctx;
    const attn_sdpa_params *p = job->call.p;
    int64_t b, s = panel_seq(job, u);
    const sdpa_call c = sdpa_call_seq(&job->call, s, &b);
    const int64_t k_tiles = tiles(c.k_hi - c.k_lo, KERN_BK), at = u - first_panel(job, s);
    const int64_t hk = at / k_tiles, j0 = c.k_lo + at % k_tiles * KERN_BK;
    if (job->kern_bf16 != NULL) {
        /* Head hk * group of the query heads reads key/value head hk. */
        pack_bf16(job->kern_bf16, &c, b, hk * c.group, j0, min64(KERN_BK, c.k_hi - j0),
                  job->kv_b + u * job->panel_words);
        return;
    }
    const float *k = c.k + sdpa_head_at(p, b, hk, p->heads_kv, p->n_k, p->d_k) + j0 * c.ldk;
    const int64_t keys = min64(KERN_BK, c.k_hi - j0);
    job->kern->pack_t(k, c.ldk, keys, p->d_k,
                      panels_of(job, s, b, hk, k_tiles) + at % k_tiles * p->d_k * KERN_BK,
                      kern_panel_ld(keys));
}

/* --------------------------------------------------------------- weights */

/* Each tile's P went to the weights relative to the row maximum of its
 * time (tile_max); now that the final maximum m and sum l are known, every
 * tile is rescaled by exp(tile_max - m) / l. */
static void finish_weights(const fwd_job *job, const sdpa_call *c, const sdpa_tile *t,
                           const fwd_worker *w, float *weights, int64_t k_first, int64_t k_end)
{
    const attn_sdpa_params *p = job->call.p;
    for (int64_t r = 0; r < t->rows; r++) {
        float *row = weights + r * p->n_k;
        for (int64_t j0 = k_first; j0 < k_end; j0 += KERN_BK) {
            int64_t cols = min64(k_end - j0, KERN_BK);
            float m_t = w->tile_max[r * job->k_tiles + (j0 - c->k_lo) / KERN_BK];
            float f = 0.0f;
            if (w->l[r] > 0.0 && m_t != -INFINITY)
                f = (float)(exp((double)m_t - w->m[r]) / w->l[r]);
            for (int64_t j = 0; j < cols; j++)
                row[j0 + j] *= f;
        }
        /* Keys outside the tiles visited (causal, window, the other
         * sequences of a ragged batch): weight 0. */
        memset(row, 0, (size_t)k_first * sizeof *row);
        memset(row + k_end, 0, (size_t)(p->n_k - k_end) * sizeof *row);
    }
}

/* ------------------------------------------------------------------ items */

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

/* Where a block's key tiles come from: the sequence's shared panels of its
 * key/value head (tile kt at panels + kt * d_k * KERN_BK), or, when
 * panels is NULL, the worker's own panel, which holds tile *packed (-1:
 * none yet) and is packed anew for any other. */
typedef struct {
    const float *panels;
    const uint32_t *panels_b; /* in bfloat16: tile kt at panels_b + kt * panel_words */
    int64_t *packed;
} fwd_keys;

/* Query rows t->i0 .. t->i0 + t->rows of head (t->b, t->h), within the
 * sequence of c, through every key tile of the sequence they see; their
 * weights, when asked for, go to `weights` [rows, n_k]. */
static void forward_block(const fwd_job *job, fwd_worker *w, const sdpa_call *c, sdpa_tile t,
                          fwd_keys from, sdpa_stats_acc *stats, float *weights)
{
    const attn_sdpa_params *p = c->p;
    const int64_t bh = t.b * p->heads_q + t.h;
    float *out = job->out + sdpa_head_o_at(c, t.b, t.h) + t.i0 * c->ldo;
    for (int64_t r = 0; r < t.rows; r++) {
        w->m[r] = -INFINITY;
        w->l[r] = 0.0;
    }
    if (stats != NULL)
        memset(w->ent, 0, (size_t)t.rows * sizeof *w->ent);
    sdpa_fwd_state st = {.strip = w->strip, .m = w->m, .l = w->l, .out = out,
                         .weights = weights, .tile_max = w->tile_max,
                         .k_tiles = job->k_tiles, .stats = stats, .ent = w->ent,
                         .raw = w->raw, .x = w->x, .scale = p->scale,
                         .softcap = p->variants.softcap};
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
     * skipped; the last one is cut where the block's last row stops. Tiles
     * start at the sequence's first key. */
    int64_t k_begin, k_end;
    sdpa_key_range(c, t.i0, t.rows, &k_begin, &k_end);
    const int64_t k_first = c->k_lo + (k_begin - c->k_lo) / KERN_BK * KERN_BK;
    if (k_begin == k_end) /* no key at all: the first tile would have written the rows */
        for (int64_t r = 0; r < t.rows; r++)
            memset(out + r * c->ldo, 0, (size_t)p->d_v * sizeof *out);
    /* The double sums start at the first fold: a row of up to
     * SDPA_FOLD_TILES tiles (every row of a short sequence) never touches
     * them, and is finished from its float rows alone. */
    int64_t since_fold = 0; /* tiles in the float rows */
    bool folded = false;
    for (t.j0 = k_first; t.j0 < k_end; t.j0 += KERN_BK) {
        /* Cancelled: the rows are left as they are (the call's outputs
         * are unspecified then), rather than finished from partial sums. */
        if (attn_cancelled(p->cancel))
            return;
        if (since_fold == SDPA_FOLD_TILES) {
            if (!folded) {
                memset(w->acc, 0, (size_t)(t.rows * p->d_v) * sizeof *w->acc);
                memcpy(w->m_tile, w->m, (size_t)t.rows * sizeof *w->m);
                folded = true;
            }
            sdpa_fold_rows(w->acc, w->m_tile, w->m, out, c->ldo, t.rows, p->d_v, true);
            since_fold = 0;
        }
        st.kt = (t.j0 - c->k_lo) / KERN_BK;
        st.accumulate = since_fold++ > 0;
        t.cols = min64(k_end - t.j0, KERN_BK);
        /* The panel holds the tile's keys; the tile may stop short of its
         * end (causal), the panel's stride does not. */
        kern_keys keys = {.v = v != NULL ? v + t.j0 * c->ldv : NULL,
                          .ld = kern_panel_ld(min64(c->k_hi - t.j0, KERN_BK))};
        if (kb != NULL) {
            const uint32_t *panel = from.panels_b;
            if (panel != NULL) {
                panel += st.kt * job->panel_words;
            } else {
                /* (The heads of a group see the same keys and values of a tile.) */
                if (*from.packed != st.kt) {
                    pack_bf16(kb, c, t.b, t.h, t.j0, t.cols, w->panel_b);
                    *from.packed = st.kt;
                }
                panel = w->panel_b;
            }
            keys.kp = panel;
            keys.vp = panel + (p->d_k + 1) / 2 * KERN_BK;
            kb->forward_tile(c, &t, &keys, &st);
        } else {
            if (from.panels != NULL) {
                keys.kt = from.panels + st.kt * p->d_k * KERN_BK;
            } else {
                /* (The heads of a group see the same keys of a tile.) */
                keys.ld = kern_panel_ld(t.cols);
                if (*from.packed != st.kt) {
                    job->kern->pack_t(sdpa_head_k(c, t.b, t.h) + t.j0 * c->ldk, c->ldk, t.cols,
                                      p->d_k, w->panel, keys.ld);
                    *from.packed = st.kt;
                }
                keys.kt = w->panel;
            }
            job->kern->forward_tile(c, &t, &keys, &st);
        }
        if (folded)
            sdpa_fold_rows(w->acc, w->m_tile, w->m, out, c->ldo, t.rows, p->d_v, false);
    }
    if (weights != NULL)
        finish_weights(job, c, &t, w, weights, k_end > k_begin ? k_first : k_end, k_end);
    for (int64_t r = 0; r < t.rows; r++) {
        double l = w->l[r];
        float *o = out + r * c->ldo;
        /* (the kernel's vectors for the float rows alone, the same bits) */
        bool finite = folded || since_fold == 0
                          ? sdpa_finish_row(o, folded ? w->acc + r * p->d_v : NULL,
                                            since_fold > 0, l, p->d_v)
                          : job->kern->scale_wide(o, p->d_v, l > 0.0 ? 1.0 / l : 0.0);
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

/* What the items of one unit share: the worker and the unit's statistics. */
typedef struct {
    const fwd_job *job;
    fwd_worker *w;
    sdpa_stats_acc *stats;
} fwd_unit;

/* The address of row r of head h of a tensor at `base` with `heads` heads
 * of width d (row stride ld). As an integer: the prefetches below step
 * one row past a tensor's last, which a pointer may not. */
static uintptr_t row_address(const attn_sdpa_params *p, const float *base, int64_t h,
                             int64_t heads, int64_t n, int64_t d, int64_t ld, int64_t r)
{
    return (uintptr_t)base + (uintptr_t)(sdpa_head_at(p, 0, h, heads, n, d) + r * ld) *
                                 sizeof(float);
}

/* Asks the caches for rows [r0, r1) of head h of a tensor at `base` with
 * `heads` heads of width d (row stride ld), line by line: where the rows
 * follow each other (ld == d), as one range. */
static void prefetch_rows(const attn_sdpa_params *p, const float *base, int64_t h, int64_t heads,
                          int64_t n, int64_t d, int64_t ld, int64_t r0, int64_t r1, bool write)
{
    const uintptr_t f = sizeof(float);
    uintptr_t row = row_address(p, base, h, heads, n, d, ld, r0);
    const int64_t span = ld == d ? (r1 - r0) * d : d, rows = ld == d ? 1 : r1 - r0;
    for (int64_t r = 0; r < rows; r++, row += (uintptr_t)ld * f) {
        const uintptr_t end = row + (uintptr_t)span * f;
        for (uintptr_t line = row / 64 * 64; line < end; line += 64) {
            if (write)
                __builtin_prefetch((const void *)line, 1);
            else
                __builtin_prefetch((const void *)line, 0);
        }
    }
}

/* Adds rows [r0, r1) of head h of a tensor at `base` (heads of width d,
 * the rows following each other) to pf, as one range of lines. */
static void lines_of_rows(kern_prefetch *pf, const attn_sdpa_params *p, const float *base,
                          int64_t h, int64_t heads, int64_t n, int64_t d, int64_t r0, int64_t r1)
{
    const uintptr_t row = row_address(p, base, h, heads, n, d, d, r0);
    pf->at[pf->n] = row / 64 * 64;
    pf->end[pf->n] = row + (uintptr_t)((r1 - r0) * d) * sizeof(float);
    pf->n++;
}

/* Asks for the rows of item hk (its key/value head hk) of the sequence of
 * c (sdpa_call_seq's, of a ragged batch: batch 0's heads) when that is a
 * short sequence. Where they are a few ranges of lines (a head's rows
 * follow each other) and pf is not NULL (emptied before), they go into pf,
 * for the item before to ask for along its loops: k's first (the panel is
 * packed first), v's last; otherwise they are asked for now. */
static void prefetch_call(const fwd_job *job, const sdpa_call *c, int64_t hk,
                          kern_prefetch *pf)
{
    const attn_sdpa_params *p = c->p;
    /* (bfloat16 inputs are in q16, k16, v16: not asked for) */
    if (c->q == NULL || c->k == NULL || c->v == NULL || c->q_hi - c->q_lo > KERN_FWD_BQ ||
        c->k_hi - c->k_lo > KERN_BK)
        return;
    const int64_t h0 = hk * c->group, h1 = (hk + 1) * c->group;
    if (pf != NULL && c->ldq == p->d_k && c->ldk == p->d_k && c->ldv == p->d_v &&
        c->ldo == p->d_v && (c->out_stream ? 1 : 2) * c->group + 2 <= KERN_PF_RANGES) {
        lines_of_rows(pf, p, c->v, hk, p->heads_kv, p->n_k, p->d_v, c->k_lo, c->k_hi);
        for (int64_t h = h0; h < h1; h++) {
            /* (Rows written around the caches need not be there.) */
            if (!c->out_stream)
                lines_of_rows(pf, p, job->out, h, p->heads_q, p->n_q, p->d_v, c->q_lo, c->q_hi);
            lines_of_rows(pf, p, c->q, h, p->heads_q, p->n_q, p->d_k, c->q_lo, c->q_hi);
        }
        lines_of_rows(pf, p, c->k, hk, p->heads_kv, p->n_k, p->d_k, c->k_lo, c->k_hi);
        return;
    }
    for (int64_t h = h0; h < h1; h++) {
        prefetch_rows(p, c->q, h, p->heads_q, p->n_q, p->d_k, c->ldq, c->q_lo, c->q_hi, false);
        if (!c->out_stream)
            prefetch_rows(p, job->out, h, p->heads_q, p->n_q, p->d_v, c->ldo, c->q_lo, c->q_hi,
                          true);
    }
    prefetch_rows(p, c->k, hk, p->heads_kv, p->n_k, p->d_k, c->ldk, c->k_lo, c->k_hi, false);
    prefetch_rows(p, c->v, hk, p->heads_kv, p->n_k, p->d_v, c->ldv, c->k_lo, c->k_hi, false);
}

/* The same for sequence s (none past the last, or without a ragged batch). */
static void prefetch_item(const fwd_job *job, int64_t s, int64_t hk, kern_prefetch *pf)
{
    const attn_sdpa_params *p = job->call.p;
    if (pf != NULL)
        pf->n = 0;
    if (p->ragged.seqs == 0 || s >= p->ragged.seqs)
        return;
    int64_t b;
    const sdpa_call c = sdpa_call_seq(&job->call, s, &b);
    prefetch_call(job, &c, hk, pf);
}

/* Where the weights of the rows of t go (NULL: not asked for). */
static float *block_weights(const fwd_job *job, const sdpa_tile *t)
{
    const attn_sdpa_params *p = job->call.p;
    if (job->weights == NULL)
        return NULL;
    return job->weights + ((t->b * p->heads_q + t->h) * p->n_q + t->i0) * p->n_k;
}

/* The item of short sequence c (batch entry b) for key/value head hk: its
 * query rows of each query head of the group, one after the other over the
 * same panel; the lines of pf (the next item's) asked for on the way. */
static void forward_alone(const fwd_unit *u, const sdpa_call *c, int64_t b, int64_t hk,
                          kern_prefetch *pf)
{
    const fwd_job *job = u->job;
    const attn_sdpa_params *p = c->p;
    int64_t packed = -1;
    fwd_keys from = {.panels = NULL, .packed = &packed};
    sdpa_tile t = {.b = b, .i0 = c->q_lo, .rows = c->q_hi - c->q_lo};
    const int64_t keys = c->k_hi - c->k_lo;
    /* A plain float32 call without statistics or weights takes the
     * kernel's whole-sequence step, each head over the one panel; a head
     * it hands back (a row that needs more care) goes the tiled way. */
    const bool whole = job->kern_bf16 == NULL && c->plain && u->stats == NULL &&
                       job->weights == NULL && keys > 0 && keys <= KERN_BK;
    /* (The worker's panel holds min(n_k, KERN_BK) keys' rows.) */
    const int64_t ld = keys <= KERN_SHORT_LD && min64(p->n_k, KERN_BK) >= KERN_SHORT_LD
                           ? KERN_SHORT_LD
                           : kern_panel_ld(keys);
    /* the worker's panel holds the short step's (none needed when it
     * reads a few keys in place) */
    const bool in_place = keys <= KERN_SHORT_DIRECT && job->rows == NULL;
    bool panel = in_place;
    for (t.h = hk * c->group; t.h < (hk + 1) * c->group; t.h++) {
        if (whole) {
            if (!panel) {
                kern_prefetch_some(pf, KERN_PF_BEFORE_PACK);
                job->kern->pack_t(sdpa_head_k(c, b, t.h) + c->k_lo * c->ldk, c->ldk, keys,
                                  p->d_k, u->w->panel, ld);
                panel = true;
                packed = -1;
            }
            const int64_t bh = b * p->heads_q + t.h;
            float *o = job->out + sdpa_head_o_at(c, b, t.h) + t.i0 * c->ldo;
            attn_softmax_row *rows = job->rows != NULL ? job->rows + bh * p->n_q + t.i0 : NULL;
            if (job->kern->forward_short(c, b, t.h, u->w->panel, ld, o, rows, pf))
                continue;
            if (c->out_stream) /* (its streamed rows before the tiled path's stores) */
                sdpa_fence_streams();
            panel = in_place; /* forward_block packs it its own way */
        }
        kern_prefetch_some(pf, INT_MAX);
        forward_block(job, u->w, c, t, from, u->stats, block_weights(job, &t));
    }
}

/* Item i of sequence s (batch entry b, call c) that shares its panels:
 * query block i % q_tiles of head i / q_tiles. */
static void forward_shared(const fwd_unit *u, const sdpa_call *c, int64_t b, int64_t s,
                           int64_t i)
{
    const fwd_job *job = u->job;
    const int64_t q_tiles = tiles(c->q_hi - c->q_lo, KERN_FWD_BQ);
    const int64_t k_tiles = tiles(c->k_hi - c->k_lo, KERN_BK);
    sdpa_tile t = {.b = b, .h = i / q_tiles};
    t.i0 = c->q_lo + i % q_tiles * KERN_FWD_BQ;
    t.rows = min64(c->q_hi - t.i0, KERN_FWD_BQ);
    const int64_t hk = t.h / c->group;
    int64_t none = -1;
    fwd_keys from = {.panels = NULL, .packed = &none}; /* no keys: no tile is read */
    if (k_tiles > 0 && job->kv_b != NULL)
        from.panels_b = job->kv_b + (first_panel(job, s) + hk * k_tiles) * job->panel_words;
    else if (k_tiles > 0)
        from.panels = panels_of(job, s, b, hk, k_tiles);
    forward_block(job, u->w, c, t, from, u->stats, block_weights(job, &t));
}

/* Item i of sequence s (fwd_items says which items a sequence has; the
 * work not by head). */
static void forward_item(void *ctx, int64_t s, int64_t i)
{
    const fwd_unit *u = ctx;
    const fwd_job *job = u->job;
    int64_t b;
    const sdpa_call c = sdpa_call_seq(&job->call, s, &b);
    if (seq_shared(&c, tiles(c.q_hi - c.q_lo, KERN_FWD_BQ), tiles(c.k_hi - c.k_lo, KERN_BK))) {
        forward_shared(u, &c, b, s, i);
        return;
    }
    /* A short sequence's item is over in a microsecond, about the time its
     * rows take to come from memory: the next item's rows (the next
     * key/value head, or the next sequence's first) are asked for now, to
     * arrive while this one computes. */
    kern_prefetch pf;
    if (i + 1 < c.p->heads_kv)
        prefetch_item(job, s, i + 1, &pf);
    else
        prefetch_item(job, s + 1, 0, &pf);
    forward_alone(u, &c, b, i, &pf);
}

/*
 * The items of a unit in order. A ragged batch in [B, H, n, d] is worked
 * head by head (fwd_job.by_head): a unit is a run of consecutive
 * sequences of one key/value head (or two, where it ends one head and
 * starts the next), and so is a worker's share of consecutive units. A
 * head's rows of consecutive sequences are consecutive in memory, so the
 * short sequences' items read q, k, v and write the output as four long
 * streams that the hardware's prefetchers follow, instead of jumping
 * between the heads' rows every few sequences. (Each item owns its rows:
 * the order changes which rows come first, not a bit of them.)
 */
static void forward_unit(void *ctx, int64_t unit, int worker)
{
    const fwd_job *job = ctx;
    fwd_unit u = {.job = job, .w = &job->workers[worker]};
    if (job->unit_stats != NULL) {
        u.stats = &job->unit_stats[unit];
        sdpa_stats_init(u.stats);
    }
    if (!job->by_head) {
        attn_unit_items(&job->work, &job->units, unit, forward_item, &u);
        if (job->call.out_stream)
            sdpa_fence_streams();
        return;
    }
    const sdpa_item_at end = job->units.start[unit + 1];
    const int64_t seqs = job->seqs, all = job->work.seqs;
    int64_t v = job->units.start[unit].s, i = job->units.start[unit].i;
    /* v's sequence s and head hk, stepped along with v (no division an
     * item) */
    int64_t hk, s = fwd_seq(job, v, &hk);
    /* Each sequence's call is made once a head: as the next one (its rows
     * asked for), then as the one computed. calls[at] is v's; `ahead`
     * when calls[at ^ 1] is v + 1's. */
    sdpa_call calls[2];
    int64_t bs[2];
    int at = 0;
    bool ahead = false;
    if (v < all)
        calls[0] = sdpa_call_seq(&job->call, s, &bs[0]);
    while (v < end.s || (v == end.s && i < end.i)) {
        const sdpa_call *c = &calls[at];
        if (i >= call_items(job, c)) {
            if (++v >= all)
                break;
            if (++s == seqs)
                s = 0, hk++;
            i = 0;
            if (ahead)
                at ^= 1;
            else
                calls[at] = sdpa_call_seq(&job->call, s, &bs[at]);
            ahead = false;
            continue;
        }
        if (seq_shared(c, tiles(c->q_hi - c->q_lo, KERN_FWD_BQ),
                       tiles(c->k_hi - c->k_lo, KERN_BK))) {
            forward_shared(&u, c, bs[at], s, hk * c->group * tiles(c->q_hi - c->q_lo,
                                                                   KERN_FWD_BQ) + i++);
            continue;
        }
        /* A short sequence's item is over in a microsecond, about the time
         * its rows take to come from memory: the next item's rows (the
         * next sequence's, this head's or the next one's; likely this
         * worker's next unit's past the end) are asked for now, to arrive
         * while this one computes. */
        kern_prefetch pf;
        pf.n = 0;
        if (v + 1 < all) {
            const bool last = s + 1 == seqs;
            calls[at ^ 1] = sdpa_call_seq(&job->call, last ? 0 : s + 1, &bs[at ^ 1]);
            ahead = true;
            prefetch_call(job, &calls[at ^ 1], last ? hk + 1 : hk, &pf);
        }
        forward_alone(&u, c, bs[at], hk, &pf);
        i++;
    }
    /* The unit's streamed rows are in memory before its end is seen. */
    if (job->call.out_stream)
        sdpa_fence_streams();
}

/* The sequence of head mean unit u of a ragged batch: the last s with
 * mean_at[s] <= u < mean_at[s + 1]. */
static int64_t mean_seq(const fwd_job *job, int64_t u)
{
    int64_t lo = 0, hi = job->seqs; /* mean_at[lo] <= u < mean_at[hi] */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (job->mean_at[mid] <= u)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Unit, for the head mean of the weights: one query block of one sequence
 * (a batch entry, or a sequence of a ragged batch), through every head in
 * turn. Each head's weights land in the worker's rows and are added (in
 * double, so that thousands of heads average exactly) to the block's
 * sums; the unit alone writes its rows of the mean. */
static void forward_mean_unit(void *ctx, int64_t u, int worker)
{
    const fwd_job *job = ctx;
    const attn_sdpa_params *p = job->call.p;
    fwd_worker *w = &job->workers[worker];
    int64_t seq = u / job->q_tiles, qt = u % job->q_tiles, b;
    if (job->mean_at != NULL) {
        seq = mean_seq(job, u);
        qt = u - job->mean_at[seq];
    }
    const sdpa_call c = sdpa_call_seq(&job->call, seq, &b);
    const int64_t k_tiles = tiles(c.k_hi - c.k_lo, KERN_BK);
    /* Whether the sequence's panels were packed beforehand. */
    const bool packed_before = job->panel_at != NULL
                                   ? job->panel_at[seq + 1] > job->panel_at[seq]
                                   : job->kt != NULL || job->kv_b != NULL;
    sdpa_stats_acc *stats = NULL;
    if (job->unit_stats != NULL) {
        stats = &job->unit_stats[u];
        sdpa_stats_init(stats);
    }
    sdpa_tile t = {.b = b, .i0 = c.q_lo + qt * KERN_FWD_BQ};
    t.rows = min64(c.q_hi - t.i0, KERN_FWD_BQ);
    const int64_t count = t.rows * p->n_k;
    memset(w->mean_sum, 0, (size_t)count * sizeof *w->mean_sum);
    for (t.h = 0; t.h < p->heads_q; t.h++) {
        const int64_t hk = t.h / c.group;
        int64_t packed = -1;
        fwd_keys from = {.panels = NULL, .packed = &packed};
        if (k_tiles > 0 && packed_before && job->kv_b != NULL)
            from.panels_b =
                job->kv_b + (first_panel(job, seq) + hk * k_tiles) * job->panel_words;
        else if (k_tiles > 0 && packed_before)
            from.panels = panels_of(job, seq, b, hk, k_tiles);
        forward_block(job, w, &c, t, from, stats, w->head_weights);
        for (int64_t e = 0; e < count; e++)
            w->mean_sum[e] += w->head_weights[e];
    }
    float *mean = job->weights + (b * p->n_q + t.i0) * p->n_k;
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
        sdpa_free(p);
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
    };
    if (job.call.bf16) {
        job.kern_bf16 = kernels->bf16;
        job.panel_words = (p->d_k + 1) / 2 * KERN_BK + KERN_BK / 2 * p->d_v;
    }
    const bool ragged = p->ragged.seqs > 0;
    /* A ragged batch's output far larger than the cores' caches: its short
     * sequences' rows go around them (the caller reads them back from
     * memory in either case). */
    job.call.out_stream = ragged && (double)p->heads_q * (double)p->n_q * (double)p->d_v *
                                            sizeof(float) >= SDPA_STREAM_OUT_BYTES;
    job.seqs = sdpa_seq_count(p);
    job.by_head = ragged && p->layout == ATTN_LAYOUT_BHND;
    job.work = (sdpa_work){.ctx = &job, .seqs = job.seqs * (job.by_head ? p->heads_kv : 1),
                           .items = fwd_items, .cost = fwd_cost, .seq_cost = fwd_seq_cost};
    _Alignas(64) char small[SMALL_WORKSPACE];
    fwd_arena arena = {.base = small, .next = small, .end = small + sizeof small};
    /* A panel read by one item only is packed by that item, while it is
     * in cache; otherwise once for all of them, before. */
    int64_t panels = 0, *panel_at = NULL;
    if (ragged) {
        panel_at = ws_alloc(&arena, job.seqs + 1, sizeof *panel_at);
        if (job.by_head)
            job.head_cost = ws_alloc(&arena, job.work.seqs, sizeof *job.head_cost);
        if (panel_at == NULL || (job.by_head && job.head_cost == NULL)) {
            ws_free(&arena, panel_at);
            ws_free(&arena, job.head_cost);
            return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the forward pass's tiles");
        }
        panel_at[0] = 0;
        for (int64_t seq = 0; seq < job.seqs; seq++) {
            int64_t b;
            const sdpa_call c = sdpa_call_seq(&job.call, seq, &b);
            const int64_t q_tiles = tiles(c.q_hi - c.q_lo, KERN_FWD_BQ);
            const int64_t k_tiles = tiles(c.k_hi - c.k_lo, KERN_BK);
            job.k_tiles = k_tiles > job.k_tiles ? k_tiles : job.k_tiles;
            bool shared = seq_shared(&c, q_tiles, k_tiles);
            panel_at[seq + 1] = panel_at[seq] + (shared ? p->heads_kv * k_tiles : 0);
            if (job.head_cost != NULL) {
                double cost = 0.0;
                for (int64_t qt = 0; qt < q_tiles; qt++)
                    cost += block_cost(&c, qt);
                for (int64_t hk = 0; hk < p->heads_kv; hk++)
                    job.head_cost[hk * job.seqs + seq] = cost * (double)c.group;
            }
        }
        job.work.seq_costs = job.head_cost;
        panels = panel_at[job.seqs];
        job.panel_at = panel_at;
    } else {
        job.k_tiles = tiles(p->n_k, KERN_BK);
        if (seq_shared(&job.call, tiles(p->n_q, KERN_FWD_BQ), job.k_tiles))
            panels = p->batch * p->heads_kv * job.k_tiles;
    }
    attn_units_plan(&job.work, &job.units);
    /* The head mean's units take every head of a block: fewer, larger. */
    const bool mean = weights != NULL && p->weights_mean;
    job.q_tiles = tiles(p->n_q, KERN_FWD_BQ);
    int64_t run_units = mean ? p->batch * job.q_tiles : job.units.count, *mean_at = NULL;
    if (mean && ragged) {
        mean_at = ws_alloc(&arena, job.seqs + 1, sizeof *mean_at);
        if (mean_at == NULL) {
            ws_free(&arena, panel_at);
            ws_free(&arena, job.head_cost);
            return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the forward pass's tiles");
        }
        mean_at[0] = 0;
        for (int64_t seq = 0; seq < job.seqs; seq++) {
            int64_t b;
            const sdpa_call c = sdpa_call_seq(&job.call, seq, &b);
            mean_at[seq + 1] = mean_at[seq] + tiles(c.q_hi - c.q_lo, KERN_FWD_BQ);
        }
        run_units = mean_at[job.seqs];
        job.mean_at = mean_at;
    }
    int threads = sdpa_threads(p, run_units, attn_sdpa_flops(p));
    /* Ragged: panels in whole tiles; otherwise as many floats as k. */
    float *kt = panels > 0 && !job.call.bf16
                    ? ws_alloc(&arena,
                               ragged ? panels * p->d_k * KERN_BK
                                      : p->batch * p->heads_kv * p->n_k * p->d_k,
                               sizeof(float))
                    : NULL;
    uint32_t *kv_b = panels > 0 && job.call.bf16
                         ? ws_alloc(&arena, panels * job.panel_words, sizeof(uint32_t))
                         : NULL;
    job.kt = kt;
    job.kv_b = kv_b;
    if (stats != NULL)
        job.unit_stats = malloc((size_t)run_units * sizeof *job.unit_stats);
    job.workers = alloc_workers(&arena, threads, &job, stats != NULL);
    /* With RoPE the kernels read rotated copies of q and k. */
    const bool rope = p->variants.rope_base > 0.0f;
    float *q_rot = NULL, *k_rot = NULL;
    if (rope) {
        q_rot = sdpa_alloc(p->batch * p->heads_q * p->n_q * p->d_k, sizeof(float));
        k_rot = sdpa_alloc(p->batch * p->heads_kv * p->n_k * p->d_k, sizeof(float));
    }
    bool ok = (panels == 0 || kt != NULL || kv_b != NULL) && job.workers != NULL &&
              (stats == NULL || job.unit_stats != NULL) &&
              (!rope || (q_rot != NULL && k_rot != NULL));
    if (ok && rope) {
        ok = sdpa_rope_inputs(&job.call, threads, q_rot, k_rot) == ATTN_OK;
    }
    bool cancelled = false;
    if (ok) {
        attn_parallel_for_until(threads, panels, pack_unit, &job, p->cancel);
        attn_parallel_for_until(threads, run_units, mean ? forward_mean_unit : forward_unit,
                                &job, p->cancel);
        cancelled = attn_cancelled(p->cancel);
        if (stats != NULL && !cancelled) {
            for (int64_t u = 1; u < run_units; u++)
                sdpa_stats_merge(&job.unit_stats[0], &job.unit_stats[u]);
            sdpa_stats_finish(&job.unit_stats[0], stats);
        }
    }
    ws_free(&arena, kt);
    ws_free(&arena, kv_b);
    ws_free(&arena, panel_at);
    ws_free(&arena, job.head_cost);
    ws_free(&arena, mean_at);
    sdpa_free(q_rot);
    sdpa_free(k_rot);
    free(job.unit_stats);
    free_workers(&arena, job.workers, threads);
    if (!ok)
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the forward pass's tiles");
    if (cancelled)
        return attn_fail(err, ATTN_ERR_CANCELLED, "the call was cancelled");
    return ATTN_OK;
}
