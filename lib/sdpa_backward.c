/*
 * attn_sdpa_backward (Eq. 16-18), FlashAttention-2 style.
 *   q [B,H_q,n_q,d_k], k [B,H_kv,n_k,d_k], v [B,H_kv,n_k,d_v],
 *   out, dout [B,H_q,n_q,d_v], rows [B,H_q,n_q] (softmax max and sum)
 *   -> dq [B,H_q,n_q,d_k], dk [B,H_kv,n_k,d_k], dv [B,H_kv,n_k,d_v]
 * (in ATTN_LAYOUT_BNHD the tensors are [B, n, H, d] instead; see attn.h).
 *
 * The call is a list of sequences: one per batch entry, or those of a
 * ragged batch (attn_ragged). An item owns key tiles of one key/value head
 * of one sequence (a pair): for each of its tiles it packs k_t^T and v_t^T
 * once, then visits every query tile of the sequence, of every query head
 * that shares the key/value head, so it alone writes its rows of dk and dv
 * (the GQA sum happens inside the item).
 *
 * dq rows receive contributions from every key tile. A pair whose work is
 * within an even share of the call's takes all its key tiles and adds
 * straight into dq. A larger one (few pairs, or one long sequence among
 * short ones) is split S ways (key tiles s, s + S, s + 2S, ... to split s:
 * interleaved, so causal splits cost alike), and split s adds into its own
 * copy of dq, summed in split order at the end. Items go to the threads in
 * units of about equal work (attn_units_plan). Either way which thread
 * runs which item changes nothing: the result is the same for a given
 * thread count, bit for bit. The long sums are blocked: every
 * SDPA_FOLD_TILES key tiles of an item its float partials of dq are folded
 * into double sums, and every 1024 query rows (SDPA_FOLD_TILES * KERN_BK,
 * whole query tiles) those of dk and dv (written when the key tile is
 * done), so that their error does not grow with n_k or n_q. (When no item
 * takes more key tiles than that, dq has no double sums: its copies are
 * added in double at the end.)
 *
 * In bfloat16 (ATTN_PRECISION_BFLOAT16) q and dO are rounded once, before
 * the items, into the two forms the products read (pairs along each row,
 * for the scores and dP; pairs of rows, for dk and dv, from each
 * sequence's first row: a query tile then starts at an even row of its
 * sequence); an item rounds its key tile's k and v.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kern.h"

typedef struct {
    float *kt, *vt; /* [d_k, ld], [d_v, ld], ld = kern_panel_ld(n_k) at most */
    double *dk_sum, *dv_sum; /* [ld, d_k], [ld, d_v]: the key tile's folded sums */
    float *p, *ds;  /* [KERN_BWD_BQ, KERN_BK] */
    float *capped;  /* [KERN_BK] */
    /* In bfloat16: the key tile as sdpa_bwd_keys.kp, vp, kr, and the
     * workspaces of sdpa_bwd_state.dsb, pp, dsp. */
    uint32_t *kp, *vp, *kr, *dsb, *pp, *dsp;
    void *block;
} bwd_worker;

/* q and dO rounded to bfloat16, per (batch, query head), in the forms of
 * sdpa_bwd_state: pairs along each row (qb [n_q, ceil(d_k / 2)], dob [n_q,
 * ceil(d_v / 2)]) and pairs of rows (qr [nq2, d_k], dor [nq2, d_v]). The
 * pairs of rows start at each sequence's first row: a ragged batch's
 * sequence s has its pairs from pair_at[s] (ceil(len / 2) of them; the
 * last row of an odd length pairs with zeros), so that a tile never takes
 * a row of the sequence before; one sequence per batch entry has nq2 =
 * ceil(n_q / 2) from pair 0. */
typedef struct {
    uint32_t *qb, *dob, *qr, *dor;
    int64_t dk2, dv2, nq2;
    int64_t *pair_at; /* [seqs + 1] of a ragged batch; NULL otherwise */
} bwd_bf16;

/* The first pair of rows of sequence s (bwd_bf16). */
static int64_t first_pair(const bwd_bf16 *h, int64_t s)
{
    return h->pair_at != NULL ? h->pair_at[s] : 0;
}

typedef struct {
    sdpa_call call;
    const attn_kern *kern;
    const attn_kern_bf16 *kern_bf16; /* in bfloat16, else NULL */
    bwd_bf16 b16;
    const attn_softmax_row *rows;
    sdpa_src dout; /* float32 unless in bfloat16 */
    const float *delta;
    float *dq, *dk, *dv;
    float **dq_split; /* [splits]: dq itself, then the copies (float partials) */
    double **dq_sum;  /* [splits]: their folded sums (the layout of dq), when dq_folds */
    int64_t splits;   /* the most of any sequence */
    bool dq_folds;    /* a split takes more than SDPA_FOLD_TILES key tiles */
    /* Per sequence of a ragged batch (one entry for them all otherwise,
     * since batch entries are alike): the cost of one pair's work, and in
     * how many splits it is done. */
    double *pair_cost;
    int64_t *seq_splits;
    sdpa_work work;
    sdpa_units units;
    bwd_worker *workers;
} bwd_job;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t tiles(int64_t n, int64_t per) { return (n + per - 1) / per; }

/* acc += part and part back to 0, for n rows of `width` (strides lda,
 * ldp): a float partial folded into its double sum (the kernel's vectors,
 * the bits of acc += part one by one). */
static void fold(const attn_kern *kern, double *acc, int64_t lda, float *part, int64_t ldp,
                 int64_t n, int64_t width)
{
    for (int64_t r = 0; r < n; r++)
        kern->fold_partial(acc + r * lda, part + r * ldp, width);
}

/* Folds the float partials of dq of every query head of key/value head hk
 * of the sequence of c (batch entry b) into the split's double sums. */
static void fold_dq(const bwd_job *job, const sdpa_call *c, int64_t split, int64_t b,
                    int64_t hk)
{
    const attn_sdpa_params *p = c->p;
    for (int64_t h = hk * c->group; h < (hk + 1) * c->group; h++) {
        const int64_t q_at = sdpa_head_at(p, b, h, p->heads_q, p->n_q, p->d_k) + c->q_lo * c->ldq;
        fold(job->kern, job->dq_sum[split] + q_at, c->ldq, job->dq_split[split] + q_at, c->ldq,
             c->q_hi - c->q_lo, p->d_k);
    }
}

/* ---------------------------------------------------------------- items */

static int64_t seq_index(const bwd_job *job, int64_t s)
{
    return job->call.p->ragged.seqs > 0 ? s : 0;
}

/* Pairs have one item per split; a sequence without keys has none (its
 * queries see nothing: their dq stays the prologue's zero). */
static int64_t bwd_items(const void *ctx, int64_t s)
{
    const bwd_job *job = ctx;
    int64_t b;
    const sdpa_call c = sdpa_call_seq(&job->call, s, &b);
    if (c.k_hi == c.k_lo)
        return 0;
    return c.p->heads_kv * job->seq_splits[seq_index(job, s)];
}

static double bwd_cost(const void *ctx, int64_t s, int64_t i)
{
    (void)i;
    const bwd_job *job = ctx;
    const int64_t at = seq_index(job, s);
    return job->pair_cost[at] / (double)job->seq_splits[at];
}

static double bwd_seq_cost(const void *ctx, int64_t s)
{
    return (double)bwd_items(ctx, s) * bwd_cost(ctx, s, 0);
}

/* The work of one key/value head of the sequence of c: for each key tile
 * its packing, and the five products over the query rows of the group's
 * heads that see it (with the row steps, as many FLOPs as they take time,
 * roughly). */
static double pair_cost_of(const sdpa_call *c)
{
    const attn_sdpa_params *p = c->p;
    const double width = (double)(3 * p->d_k + 2 * p->d_v);
    double cost = 2e4;
    for (int64_t j0 = c->k_lo; j0 < c->k_hi; j0 += KERN_BK) {
        const int64_t cols = min64(c->k_hi - j0, KERN_BK);
        int64_t i0, i1;
        sdpa_query_range(c, j0, cols, &i0, &i1);
        cost += 8.0 * (double)(cols * (p->d_k + p->d_v)) +
                (double)c->group * 2.0 * (double)(i1 - i0) * (double)(cols + 16) * width;
    }
    return cost;
}

/* What the items of one unit share: the worker. */
typedef struct {
    const bwd_job *job;
    const bwd_worker *w;
} bwd_unit;

/* Split `split` of the key tiles of key/value head hk of sequence s. */
static void backward_item(void *ctx, int64_t s, int64_t i)
{
    const bwd_unit *u = ctx;
    const bwd_job *job = u->job;
    const bwd_worker *w = u->w;
    int64_t b;
    const sdpa_call call = sdpa_call_seq(&job->call, s, &b), *c = &call;
    const attn_sdpa_params *p = c->p;
    const int64_t splits = job->seq_splits[seq_index(job, s)];
    const int64_t hk = i / splits, split = i % splits;
    float *dq = job->dq_split[split];
    const int64_t k_at = sdpa_head_at(p, b, hk, p->heads_kv, p->n_k, p->d_k);
    const int64_t v_at = sdpa_head_at(p, b, hk, p->heads_kv, p->n_k, p->d_v);
    int64_t key_tiles = 0; /* since dq was last folded */
    for (int64_t kt = split; kt < tiles(c->k_hi - c->k_lo, KERN_BK); kt += splits) {
        sdpa_tile t = {.b = b, .j0 = c->k_lo + kt * KERN_BK};
        t.cols = min64(c->k_hi - t.j0, KERN_BK);
        if (attn_cancelled(p->cancel))
            return;
        const sdpa_src k = sdpa_src_at((sdpa_src){c->k, c->k16}, k_at + t.j0 * c->ldk),
                       v = sdpa_src_at((sdpa_src){c->v, c->v16}, v_at + t.j0 * c->ldv);
        float *dk = job->dk + k_at + t.j0 * c->ldk, *dv = job->dv + v_at + t.j0 * c->ldv;
        for (int64_t j = 0; j < t.cols; j++) {
            memset(dk + j * c->ldk, 0, (size_t)p->d_k * sizeof *dk);
            memset(dv + j * c->ldv, 0, (size_t)p->d_v * sizeof *dv);
        }
        int64_t i_start, i_end; /* the query rows that see these keys */
        sdpa_query_range(c, t.j0, t.cols, &i_start, &i_end);
        if (i_start == i_end)
            continue;
        memset(w->dk_sum, 0, (size_t)(t.cols * p->d_k) * sizeof *w->dk_sum);
        memset(w->dv_sum, 0, (size_t)(t.cols * p->d_v) * sizeof *w->dv_sum);
        const attn_kern_bf16 *kb = job->kern_bf16;
        const int64_t ld = kern_panel_ld(t.cols);
        sdpa_bwd_keys keys = {.kt = w->kt, .vt = w->vt, .ld = ld, .k = k.f32};
        if (kb != NULL) {
            /* Pairs of rows from an even row of the sequence (the row
             * before sees none of these keys: its P is 0). */
            i_start -= (i_start - c->q_lo) % 2;
            sdpa_bf16_pack_t(kb, k, c->ldk, t.cols, p->d_k, w->kp);
            sdpa_bf16_pack_t(kb, v, c->ldv, t.cols, p->d_v, w->vp);
            sdpa_bf16_row_pairs(kb, k, c->ldk, t.cols, p->d_k, w->kr, p->d_k, KERN_BK / 2, true);
            keys.kp = w->kp;
            keys.vp = w->vp;
            keys.kr = w->kr;
        } else {
            job->kern->pack_t(k.f32, c->ldk, t.cols, p->d_k, w->kt, ld);
            job->kern->pack_t(v.f32, c->ldv, t.cols, p->d_v, w->vt, ld);
        }
        /* A full partial is folded before the next tile adds to it, never
         * after the last: the end adds the partials to the sums anyway
         * (here for dk and dv, in reduce_block for dq). */
        if (key_tiles == SDPA_FOLD_TILES) {
            fold_dq(job, c, split, b, hk);
            key_tiles = 0;
        }
        key_tiles++;
        /* Query rows added into dk and dv since they were last folded: at
         * most SDPA_FOLD_TILES * KERN_BK (1024) in a float partial, as many
         * as dq's partials take keys, whatever the query tile's height. */
        int64_t query_rows = 0;
        for (t.h = hk * c->group; t.h < (hk + 1) * c->group; t.h++) {
            const int64_t bh = b * p->heads_q + t.h;
            const int64_t q_at = sdpa_head_at(p, b, t.h, p->heads_q, p->n_q, p->d_k);
            const int64_t o_at = sdpa_head_o_at(c, b, t.h);
            for (t.i0 = i_start; t.i0 < i_end; t.i0 += KERN_BWD_BQ) {
                t.rows = min64(i_end - t.i0, KERN_BWD_BQ);
                if (query_rows + t.rows > SDPA_FOLD_TILES * KERN_BK) {
                    fold(job->kern, w->dk_sum, p->d_k, dk, c->ldk, t.cols, p->d_k);
                    fold(job->kern, w->dv_sum, p->d_v, dv, c->ldv, t.cols, p->d_v);
                    query_rows = 0;
                }
                query_rows += t.rows;
                const int64_t row = bh * p->n_q + t.i0;
                sdpa_bwd_state st = {
                    .p = w->p, .ds = w->ds, .capped = w->capped,
                    .rows = job->rows + row, .delta = job->delta + row,
                    .dout = kb == NULL ? job->dout.f32 + o_at + t.i0 * c->ldo : NULL,
                    .dq = dq + q_at + t.i0 * c->ldq,
                    .dk = dk, .dv = dv,
                };
                if (kb != NULL) {
                    const bwd_bf16 *h = &job->b16;
                    st.qb = h->qb + row * h->dk2;
                    st.ldqb = h->dk2;
                    st.dob = h->dob + row * h->dv2;
                    st.lddob = h->dv2;
                    const int64_t pair =
                        bh * h->nq2 + first_pair(h, s) + (t.i0 - c->q_lo) / 2;
                    st.qr = h->qr + pair * p->d_k;
                    st.dor = h->dor + pair * p->d_v;
                    st.dsb = w->dsb;
                    st.pp = w->pp;
                    st.dsp = w->dsp;
                    kb->backward_tile(c, &t, &keys, &st);
                } else {
                    job->kern->backward_tile(c, &t, &keys, &st);
                }
            }
        }
        for (int64_t j = 0; j < t.cols; j++) {
            for (int64_t e = 0; e < p->d_k; e++)
                dk[j * c->ldk + e] = (float)(w->dk_sum[j * p->d_k + e] + dk[j * c->ldk + e]);
            for (int64_t e = 0; e < p->d_v; e++)
                dv[j * c->ldv + e] = (float)(w->dv_sum[j * p->d_v + e] + dv[j * c->ldv + e]);
        }
    }
}

static void backward_unit(void *ctx, int64_t unit, int worker)
{
    const bwd_job *job = ctx;
    bwd_unit u = {.job = job, .w = &job->workers[worker]};
    attn_unit_items(&job->work, &job->units, unit, backward_item, &u);
}

/* The O(rows d) steps around the tiles, spread over the workers in blocks. */
#define BWD_ROW_BLOCK 2048
#define BWD_SUM_BLOCK (64 * 1024) /* floats */

typedef struct {
    const sdpa_call *call;
    sdpa_src dout;
    const float *out;
    float *delta;
    float **dq_split;
    double **dq_sum;
    int64_t splits, rows;
} prologue_job;

/* delta [B, H_q, n_q] = rowsum(dout * out), the softmax's correction term;
 * and every copy of dq (and its double sums, if any) zeroed (rows r0 .. r1
 * of it, in memory order), since the units add into them. */
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
        if (j->dout.f32 != NULL) {
            const float *d = j->dout.f32 + at, *o = j->out + at;
            for (int64_t c = 0; c < p->d_v; c++)
                s += (double)d[c] * o[c];
        } else {
            for (int64_t c = 0; c < p->d_v; c++)
                s += (double)sdpa_src_value(j->dout, at + c) * j->out[at + c];
        }
        j->delta[r] = (float)s;
    }
    for (int64_t s = 0; s < j->splits; s++) {
        memset(j->dq_split[s] + r0 * p->d_k, 0, (size_t)((r1 - r0) * p->d_k) * sizeof(float));
        if (j->dq_sum != NULL)
            memset(j->dq_sum[s] + r0 * p->d_k, 0,
                   (size_t)((r1 - r0) * p->d_k) * sizeof(double));
    }
}

typedef struct {
    const sdpa_call *call;
    const attn_kern_bf16 *kern;
    sdpa_src dout;
    const bwd_bf16 *b16;
} round_job;

/* Unit: one (batch, query head): its q and dO rows rounded, both forms
 * (the pairs of rows sequence by sequence). */
static void round_head(void *ctx, int64_t bh, int worker)
{
    (void)worker;
    const round_job *j = ctx;
    const sdpa_call *c = j->call;
    const attn_sdpa_params *p = c->p;
    const bwd_bf16 *h = j->b16;
    const int64_t b = bh / p->heads_q, hq = bh % p->heads_q;
    const sdpa_src q = sdpa_src_q(c, b, hq),
                   dout = sdpa_src_at(j->dout, sdpa_head_o_at(c, b, hq));
    sdpa_bf16_rows(j->kern, q, c->ldq, p->n_q, p->d_k, h->qb + bh * p->n_q * h->dk2, h->dk2);
    sdpa_bf16_rows(j->kern, dout, c->ldo, p->n_q, p->d_v, h->dob + bh * p->n_q * h->dv2,
                   h->dv2);
    const int64_t seqs = h->pair_at != NULL ? p->ragged.seqs : 1;
    for (int64_t s = 0; s < seqs; s++) {
        const int64_t lo = h->pair_at != NULL ? p->ragged.cu_seqlens_q[s] : 0;
        const int64_t hi = h->pair_at != NULL ? p->ragged.cu_seqlens_q[s + 1] : p->n_q;
        const int64_t pair = bh * h->nq2 + first_pair(h, s), pairs = (hi - lo + 1) / 2;
        sdpa_bf16_row_pairs(j->kern, sdpa_src_at(q, lo * c->ldq), c->ldq, hi - lo, p->d_k,
                            h->qr + pair * p->d_k, p->d_k, pairs, false);
        sdpa_bf16_row_pairs(j->kern, sdpa_src_at(dout, lo * c->ldo), c->ldo, hi - lo, p->d_v,
                            h->dor + pair * p->d_v, p->d_v, pairs, false);
    }
}

typedef struct {
    float **dq_split;
    double **dq_sum;
    int64_t splits, count;
} reduce_job;

/* dq = the sums and the partials of splits 0 .. S-1, added in double in
 * that order (split 0's partials are dq itself); without double sums
 * (dq_sum NULL), the partials alone. */
static void reduce_block(void *ctx, int64_t block, int worker)
{
    (void)worker;
    const reduce_job *j = ctx;
    int64_t f0 = block * BWD_SUM_BLOCK, f1 = min64(f0 + BWD_SUM_BLOCK, j->count);
    if (j->dq_sum == NULL) {
        for (int64_t f = f0; f < f1; f++) {
            double sum = 0.0;
            for (int64_t s = 0; s < j->splits; s++)
                sum += j->dq_split[s][f];
            j->dq_split[0][f] = (float)sum;
        }
        return;
    }
    double *sum = j->dq_sum[0];
    for (int64_t s = 0; s < j->splits; s++) {
        const float *part = j->dq_split[s];
        const double *other = j->dq_sum[s];
        for (int64_t f = f0; f < f1; f++)
            sum[f] += (s > 0 ? other[f] : 0.0) + part[f];
    }
    for (int64_t f = f0; f < f1; f++)
        j->dq_split[0][f] = (float)sum[f];
}

static int64_t blocks(int64_t count, int64_t per_block)
{
    return (count + per_block - 1) / per_block;
}

/* Splits of a pair of cost `cost`: 1 when it is within half a thread's
 * share of the total; otherwise as many as make it so, at most one per
 * thread and per key tile, each a copy of dq more. */
static int64_t splits_for(int threads, double cost, double total, int64_t k_tiles)
{
    if (threads <= 1)
        return 1;
    double share = total / (2.0 * threads);
    double want = ceil(cost / share);
    int64_t most = min64(threads, k_tiles);
    return want >= (double)most ? most : want > 1.0 ? (int64_t)want : 1;
}

/* job->pair_cost of the first `entries` sequences (every one of a ragged
 * batch, the first of a dense call: batch entries are alike); returns the
 * cost of the whole call into *total and its (pair, key tile)s, what the
 * thread count is judged from. */
static int64_t plan_costs(bwd_job *job, int64_t entries, double *total)
{
    *total = 0.0;
    int64_t k_tiles = 0;
    for (int64_t s = 0; s < entries; s++) {
        int64_t b;
        const sdpa_call c = sdpa_call_seq(&job->call, s, &b);
        job->pair_cost[s] = pair_cost_of(&c);
        *total += job->pair_cost[s];
        k_tiles += tiles(c.k_hi - c.k_lo, KERN_BK);
    }
    const double copies = (double)(job->work.seqs / entries);
    *total *= copies * (double)job->call.p->heads_kv;
    return k_tiles * (job->work.seqs / entries) * job->call.p->heads_kv;
}

/* Does a split of the key tiles of some sequence take more than
 * SDPA_FOLD_TILES of them (so that its partials of dq are folded)? */
static bool splits_fold(const bwd_job *job, int64_t entries)
{
    for (int64_t s = 0; s < entries; s++) {
        int64_t b;
        const sdpa_call c = sdpa_call_seq(&job->call, s, &b);
        if (job->seq_splits[s] > 0 && /* 0: a sequence without keys */
            tiles(tiles(c.k_hi - c.k_lo, KERN_BK), job->seq_splits[s]) > SDPA_FOLD_TILES)
            return true;
    }
    return false;
}

/* job->seq_splits of the first `entries` sequences, job->splits, and
 * whether dq has double sums (job->dq_folds: not when every split takes at
 * most SDPA_FOLD_TILES key tiles, as with n_k <= 1024; the copies of dq
 * are then added in double at the end, the partials alone). */
static void plan_splits(bwd_job *job, int64_t entries, int threads, double total)
{
    job->splits = 1;
    for (int64_t s = 0; s < entries; s++) {
        int64_t b;
        const sdpa_call c = sdpa_call_seq(&job->call, s, &b);
        job->seq_splits[s] =
            splits_for(threads, job->pair_cost[s], total, tiles(c.k_hi - c.k_lo, KERN_BK));
        job->splits = job->seq_splits[s] > job->splits ? job->seq_splits[s] : job->splits;
    }
    job->dq_folds = splits_fold(job, entries);
}

static void free_workers(bwd_worker *w, int n)
{
    for (int i = 0; w != NULL && i < n; i++)
        sdpa_free(w[i].block);
    free(w);
}

static bwd_worker *alloc_workers(int n, const attn_sdpa_params *p, bool bf16)
{
    bwd_worker *w = calloc((size_t)n, sizeof *w);
    if (w == NULL)
        return NULL;
    /* Panels as wide as the widest tile: n_k < 64 keys pack no more. */
    const int64_t keys = kern_panel_ld(p->n_k);
    const int64_t panel_k = p->d_k * keys, panel_v = p->d_v * keys;
    const int64_t tile = (int64_t)KERN_BWD_BQ * KERN_BK;
    /* In bfloat16, words (as many as floats, each a multiple of 16): kp,
     * vp and kr, dsb, pp and dsp. */
    const int64_t kp = (p->d_k + 1) / 2 * KERN_BK, vp = (p->d_v + 1) / 2 * KERN_BK;
    const int64_t kr = KERN_BK / 2 * ((p->d_k + 15) / 16 * 16);
    const int64_t dsb = KERN_MR_MAX * KERN_BK / 2, pairs = tile / 2;
    const int64_t words = bf16 ? kp + vp + kr + dsb + 2 * pairs : 0;
    for (int i = 0; i < n; i++) {
        /* The double sums first (their alignment), then the floats. */
        double *d = sdpa_alloc(panel_k + panel_v +
                                   (panel_k + panel_v + 2 * tile + KERN_BK + words + 1) / 2,
                               sizeof(double));
        if (d == NULL) {
            free_workers(w, n);
            return NULL;
        }
        w[i].block = d;
        w[i].dk_sum = d;
        w[i].dv_sum = d + panel_k;
        float *b = (float *)(void *)(d + panel_k + panel_v);
        w[i].p = b;
        w[i].ds = b + tile;
        w[i].kt = b + 2 * tile;
        w[i].vt = b + 2 * tile + panel_k;
        w[i].capped = b + 2 * tile + panel_k + panel_v;
        if (bf16) {
            uint32_t *u = (uint32_t *)(void *)(w[i].capped + KERN_BK);
            w[i].kp = u;
            w[i].vp = u + kp;
            w[i].kr = u + kp + vp;
            w[i].dsb = u + kp + vp + kr;
            w[i].pp = u + kp + vp + kr + dsb;
            w[i].dsp = u + kp + vp + kr + dsb + pairs;
        }
    }
    return w;
}

attn_status attn_sdpa_backward(const attn_sdpa_params *p, const float *q,
                               const float *k, const float *v,
                               const float *out, const attn_softmax_row *rows,
                               const float *dout, float *dq, float *dk,
                               float *dv, attn_error *err)
{
    if (p != NULL && !sdpa_dtypes_float32(p))
        return attn_fail(err, ATTN_ERR_INVALID,
                         "dtype names bfloat16 inputs: attn_sdpa_backward_in reads them");
    return attn_sdpa_backward_in(p, q, k, v, out, rows, dout, dq, dk, dv, err);
}

attn_status attn_sdpa_backward_in(const attn_sdpa_params *p, const void *q, const void *k,
                                  const void *v, const float *out,
                                  const attn_softmax_row *rows, const void *dout, float *dq,
                                  float *dk, float *dv, attn_error *err)
{
    const sdpa_kernels kernels = {.f32 = attn_kern_get(), .bf16 = attn_kern_bf16_get()};
    return attn_sdpa_backward_with(&kernels, p, q, k, v, out, rows, dout, dq, dk, dv, err);
}

attn_status attn_sdpa_backward_with(const sdpa_kernels *kernels, const attn_sdpa_params *p,
                                    const void *q, const void *k, const void *v,
                                    const float *out, const attn_softmax_row *rows,
                                    const void *dout, float *dq, float *dk, float *dv,
                                    attn_error *err)
{
    attn_status s = sdpa_check_params(p, false, err);
    if (s != ATTN_OK)
        return s;
    if (q == NULL || k == NULL || v == NULL || out == NULL || rows == NULL ||
        dout == NULL || dq == NULL || dk == NULL || dv == NULL)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "q, k, v, out, rows, dout, dq, dk and dv must not be NULL");

    const int64_t n_rows = p->batch * p->heads_q * p->n_q;
    bwd_job job = {
        .call = sdpa_call_of(p, q, k, v),
        .kern = kernels->f32,
        .rows = rows,
        .dout = p->dtype.dout == ATTN_DTYPE_BFLOAT16 ? (sdpa_src){.bf16 = dout}
                                                     : (sdpa_src){.f32 = dout},
        .dq = dq, .dk = dk, .dv = dv,
    };
    job.work = (sdpa_work){.ctx = &job, .seqs = sdpa_seq_count(p), .items = bwd_items,
                           .cost = bwd_cost, .seq_cost = bwd_seq_cost};
    const int64_t entries = p->ragged.seqs > 0 ? p->ragged.seqs : 1;
    job.pair_cost = malloc((size_t)entries * sizeof *job.pair_cost);
    job.seq_splits = malloc((size_t)entries * sizeof *job.seq_splits);
    int threads = 1;
    if (job.pair_cost != NULL && job.seq_splits != NULL) {
        double total;
        int64_t pair_tiles = plan_costs(&job, entries, &total);
        threads = sdpa_threads(p, pair_tiles, 2.5 * attn_sdpa_flops(p));
        plan_splits(&job, entries, threads, total);
        attn_units_plan(&job.work, &job.units);
    }
    bool cancelled = false;
    float *delta = sdpa_alloc(n_rows, sizeof(float));
    job.dq_split = calloc((size_t)job.splits, sizeof *job.dq_split);
    job.dq_sum = job.dq_folds ? calloc((size_t)job.splits, sizeof *job.dq_sum) : NULL;
    job.workers = alloc_workers(threads, p, job.call.bf16);
    bool ok = job.pair_cost != NULL && job.seq_splits != NULL && delta != NULL &&
              job.dq_split != NULL && (job.dq_sum != NULL || !job.dq_folds) &&
              job.workers != NULL;
    bwd_bf16 *h = &job.b16;
    if (ok && job.call.bf16) {
        job.kern_bf16 = kernels->bf16;
        const int64_t heads = p->batch * p->heads_q;
        h->dk2 = (p->d_k + 1) / 2;
        h->dv2 = (p->d_v + 1) / 2;
        h->nq2 = (p->n_q + 1) / 2;
        if (p->ragged.seqs > 0) {
            const int64_t *cu = p->ragged.cu_seqlens_q;
            h->pair_at = malloc((size_t)(p->ragged.seqs + 1) * sizeof *h->pair_at);
            ok = h->pair_at != NULL;
            if (ok) {
                h->pair_at[0] = 0;
                for (int64_t s = 0; s < p->ragged.seqs; s++)
                    h->pair_at[s + 1] = h->pair_at[s] + (cu[s + 1] - cu[s] + 1) / 2;
                h->nq2 = h->pair_at[p->ragged.seqs];
            }
        }
        h->qb = sdpa_alloc(heads * p->n_q * h->dk2, sizeof(uint32_t));
        h->dob = sdpa_alloc(heads * p->n_q * h->dv2, sizeof(uint32_t));
        h->qr = sdpa_alloc(heads * h->nq2 * p->d_k, sizeof(uint32_t));
        h->dor = sdpa_alloc(heads * h->nq2 * p->d_v, sizeof(uint32_t));
        ok = ok && h->qb != NULL && h->dob != NULL && h->qr != NULL && h->dor != NULL;
    }
    /* With RoPE the scores come from rotated copies of q and k, and the
     * gradients they give are turned back at the end. */
    const bool rope = p->variants.rope_base > 0.0f;
    float *q_rot = NULL, *k_rot = NULL;
    if (ok && rope) {
        q_rot = sdpa_alloc(p->batch * p->heads_q * p->n_q * p->d_k, sizeof(float));
        k_rot = sdpa_alloc(p->batch * p->heads_kv * p->n_k * p->d_k, sizeof(float));
        ok = q_rot != NULL && k_rot != NULL &&
             sdpa_rope_inputs(&job.call, threads, q_rot, k_rot) == ATTN_OK;
    }
    if (ok) {
        job.dq_split[0] = dq;
        for (int64_t i = 1; ok && i < job.splits; i++)
            ok = (job.dq_split[i] = sdpa_alloc(n_rows * p->d_k, sizeof(float))) != NULL;
        for (int64_t i = 0; ok && job.dq_sum != NULL && i < job.splits; i++)
            ok = (job.dq_sum[i] = sdpa_alloc(n_rows * p->d_k, sizeof(double))) != NULL;
    }
    if (ok) {
        prologue_job pro = {.call = &job.call, .dout = job.dout, .out = out, .delta = delta,
                            .dq_split = job.dq_split, .dq_sum = job.dq_sum,
                            .splits = job.splits, .rows = n_rows};
        attn_parallel_for_until(threads, blocks(n_rows, BWD_ROW_BLOCK), prologue_block, &pro,
                                p->cancel);
        job.delta = delta;
        if (job.kern_bf16 != NULL) {
            round_job rj = {.call = &job.call, .kern = job.kern_bf16, .dout = job.dout,
                            .b16 = h};
            attn_parallel_for_until(threads, p->batch * p->heads_q, round_head, &rj, p->cancel);
        }
        attn_parallel_for_until(threads, job.units.count, backward_unit, &job, p->cancel);
        cancelled = attn_cancelled(p->cancel);
    }
    if (ok && !cancelled && (job.splits > 1 || job.dq_sum != NULL)) {
        /* (One split without double sums has dq already.) */
        reduce_job red = {.dq_split = job.dq_split, .dq_sum = job.dq_sum,
                          .splits = job.splits, .count = n_rows * p->d_k};
        attn_parallel_for(threads, blocks(red.count, BWD_SUM_BLOCK), reduce_block, &red);
    }
    if (ok && !cancelled && rope)
        ok = sdpa_rope(&job.call, threads, dq, dk, dq, dk, true) == ATTN_OK;
    sdpa_free(q_rot);
    sdpa_free(k_rot);
    sdpa_free(h->qb);
    sdpa_free(h->dob);
    sdpa_free(h->qr);
    sdpa_free(h->dor);
    free(h->pair_at);
    for (int64_t i = 1; job.dq_split != NULL && i < job.splits; i++)
        sdpa_free(job.dq_split[i]);
    for (int64_t i = 0; job.dq_sum != NULL && i < job.splits; i++)
        sdpa_free(job.dq_sum[i]);
    free(job.dq_split);
    free(job.dq_sum);
    free_workers(job.workers, threads);
    sdpa_free(delta);
    free(job.pair_cost);
    free(job.seq_splits);
    if (!ok)
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the backward pass");
    if (cancelled)
        return attn_fail(err, ATTN_ERR_CANCELLED, "the call was cancelled");
    return ATTN_OK;
}
