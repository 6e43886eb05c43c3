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
 * pair and adds straight into dq. Otherwise each pair is split S ways (key
 * tiles s, s + S, s + 2S, ... to split s: interleaved, so causal splits cost
 * alike), and split s adds into its own copy of dq, summed in split order at
 * the end. Either way which thread runs which unit changes nothing: the
 * result is the same for a given thread count, bit for bit.
 *
 * In bfloat16 (ATTN_PRECISION_BFLOAT16) q and dO are rounded once, before
 * the units, into the two forms the products read (pairs along each row,
 * for the scores and dP; pairs of rows, for dk and dv: a query tile then
 * starts at an even row); a unit rounds its key tile's k and v.
 */
#include <stdlib.h>
#include <string.h>

#include "kern.h"

typedef struct {
    float *kt, *vt; /* [d_k, KERN_BK], [d_v, KERN_BK] */
    float *p, *ds;  /* [KERN_BWD_BQ, KERN_BK] */
    float *capped;  /* [KERN_BK] */
    /* In bfloat16: the key tile as sdpa_bwd_keys.kp, vp, kr, and the
     * workspaces of sdpa_bwd_state.dsb, pp, dsp. */
    uint32_t *kp, *vp, *kr, *dsb, *pp, *dsp;
    void *block;
} bwd_worker;

/* q and dO rounded to bfloat16, per (batch, query head), in the forms of
 * sdpa_bwd_state: pairs along each row (qb [n_q, ceil(d_k / 2)], dob [n_q,
 * ceil(d_v / 2)]) and pairs of rows (qr [ceil(n_q / 2), d_k], dor
 * [ceil(n_q / 2), d_v]). */
typedef struct {
    uint32_t *qb, *dob, *qr, *dor;
    int64_t dk2, dv2, nq2;
} bwd_bf16;

typedef struct {
    sdpa_call call;
    const attn_kern *kern;
    const attn_kern_bf16 *kern_bf16; /* in bfloat16, else NULL */
    bwd_bf16 b16;
    const attn_softmax_row *rows;
    sdpa_src dout; /* float32 unless in bfloat16 */
    const float *delta;
    float *dq, *dk, *dv;
    float **dq_split; /* [splits]: dq itself, then the copies */
    int64_t k_tiles, splits;
    bwd_worker *workers;
} bwd_job;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static void backward_unit(void *ctx, int64_t u, int worker)
{
    const bwd_job *job = ctx;
    const sdpa_call *c = &job->call;
    const attn_sdpa_params *p = c->p;
    const bwd_worker *w = &job->workers[worker];
    const int64_t pair = u / job->splits, split = u % job->splits;
    const int64_t b = pair / p->heads_kv, hk = pair % p->heads_kv;
    float *dq = job->dq_split[split];
    const int64_t k_at = sdpa_head_at(p, b, hk, p->heads_kv, p->n_k, p->d_k);
    const int64_t v_at = sdpa_head_at(p, b, hk, p->heads_kv, p->n_k, p->d_v);
    for (int64_t kt = split; kt < job->k_tiles; kt += job->splits) {
        if (attn_cancelled(p->cancel))
            return;
        sdpa_tile t = {.b = b, .j0 = kt * KERN_BK};
        t.cols = min64(p->n_k - t.j0, KERN_BK);
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
        const attn_kern_bf16 *kb = job->kern_bf16;
        sdpa_bwd_keys keys = {.kt = w->kt, .vt = w->vt, .k = k.f32};
        if (kb != NULL) {
            /* Pairs of rows from an even row (the row before sees none of
             * these keys: its P is 0). */
            i_start -= i_start % 2;
            sdpa_bf16_pack_t(kb, k, c->ldk, t.cols, p->d_k, w->kp);
            sdpa_bf16_pack_t(kb, v, c->ldv, t.cols, p->d_v, w->vp);
            sdpa_bf16_row_pairs(kb, k, c->ldk, t.cols, p->d_k, w->kr, p->d_k, KERN_BK / 2, true);
            keys.kp = w->kp;
            keys.vp = w->vp;
            keys.kr = w->kr;
        } else {
            job->kern->pack_t(k.f32, c->ldk, t.cols, p->d_k, w->kt);
            job->kern->pack_t(v.f32, c->ldv, t.cols, p->d_v, w->vt);
        }
        for (t.h = hk * c->group; t.h < (hk + 1) * c->group; t.h++) {
            const int64_t bh = b * p->heads_q + t.h;
            const int64_t q_at = sdpa_head_at(p, b, t.h, p->heads_q, p->n_q, p->d_k);
            const int64_t o_at = sdpa_head_o_at(c, b, t.h);
            for (t.i0 = i_start; t.i0 < i_end; t.i0 += KERN_BWD_BQ) {
                t.rows = min64(i_end - t.i0, KERN_BWD_BQ);
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
                    st.qr = h->qr + (bh * h->nq2 + t.i0 / 2) * p->d_k;
                    st.dor = h->dor + (bh * h->nq2 + t.i0 / 2) * p->d_v;
                    st.dsb = w->dsb;
                    st.pp = w->pp;
                    st.dsp = w->dsp;
                    kb->backward_tile(c, &t, &keys, &st);
                    continue;
                }
                job->kern->backward_tile(c, &t, &keys, &st);
            }
        }
    }
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
            s += (double)sdpa_src_value(j->dout, at + c) * j->out[at + c];
        j->delta[r] = (float)s;
    }
    for (int64_t s = 0; s < j->splits; s++)
        memset(j->dq_split[s] + r0 * p->d_k, 0, (size_t)((r1 - r0) * p->d_k) * sizeof(float));
}

typedef struct {
    const sdpa_call *call;
    const attn_kern_bf16 *kern;
    sdpa_src dout;
    const bwd_bf16 *b16;
} round_job;

/* Unit: one (batch, query head): its q and dO rows rounded, both forms. */
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
    sdpa_bf16_row_pairs(j->kern, q, c->ldq, p->n_q, p->d_k, h->qr + bh * h->nq2 * p->d_k,
                        p->d_k, h->nq2, false);
    sdpa_bf16_row_pairs(j->kern, dout, c->ldo, p->n_q, p->d_v, h->dor + bh * h->nq2 * p->d_v,
                        p->d_v, h->nq2, false);
}

typedef struct {
    float **dq_split;
    int64_t splits, count;
} reduce_job;

/* dq += the copies of splits 1 .. S-1, in that order. */
static void reduce_block(void *ctx, int64_t block, int worker)
{
    (void)worker;
    const reduce_job *j = ctx;
    int64_t f0 = block * BWD_SUM_BLOCK, f1 = min64(f0 + BWD_SUM_BLOCK, j->count);
    float *dq = j->dq_split[0];
    for (int64_t s = 1; s < j->splits; s++) {
        const float *copy = j->dq_split[s];
        for (int64_t f = f0; f < f1; f++)
            dq[f] += copy[f];
    }
}

static int64_t blocks(int64_t count, int64_t per_block)
{
    return (count + per_block - 1) / per_block;
}

/* Splits per pair: 1 when the pairs alone give every thread two units or
 * more; otherwise one per thread (at most one per key tile), each a copy of
 * dq more. */
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

static bwd_worker *alloc_workers(int n, const attn_sdpa_params *p, bool bf16)
{
    bwd_worker *w = calloc((size_t)n, sizeof *w);
    if (w == NULL)
        return NULL;
    const int64_t panel_k = p->d_k * KERN_BK, panel_v = p->d_v * KERN_BK;
    const int64_t tile = (int64_t)KERN_BWD_BQ * KERN_BK;
    /* In bfloat16, words (as many as floats, each a multiple of 16): kp,
     * vp and kr, dsb, pp and dsp. */
    const int64_t kp = (p->d_k + 1) / 2 * KERN_BK, vp = (p->d_v + 1) / 2 * KERN_BK;
    const int64_t kr = KERN_BK / 2 * ((p->d_k + 15) / 16 * 16);
    const int64_t dsb = KERN_MR_MAX * KERN_BK / 2, pairs = tile / 2;
    const int64_t words = bf16 ? kp + vp + kr + dsb + 2 * pairs : 0;
    for (int i = 0; i < n; i++) {
        float *b = sdpa_alloc(panel_k + panel_v + 2 * tile + KERN_BK + words, sizeof(float));
        if (b == NULL) {
            free_workers(w, n);
            return NULL;
        }
        w[i].block = b;
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
    const int64_t pairs = p->batch * p->heads_kv;
    bwd_job job = {
        .call = sdpa_call_of(p, q, k, v),
        .kern = kernels->f32,
        .rows = rows,
        .dout = p->dtype.dout == ATTN_DTYPE_BFLOAT16 ? (sdpa_src){.bf16 = dout}
                                                     : (sdpa_src){.f32 = dout},
        .dq = dq, .dk = dk, .dv = dv,
        .k_tiles = (p->n_k + KERN_BK - 1) / KERN_BK,
    };
    int threads = sdpa_threads(p, pairs * job.k_tiles, 2.5 * attn_sdpa_flops(p));
    bool cancelled = false;
    job.splits = splits_for(threads, pairs, job.k_tiles);
    float *delta = sdpa_alloc(n_rows, sizeof(float));
    job.dq_split = calloc((size_t)job.splits, sizeof *job.dq_split);
    job.workers = alloc_workers(threads, p, job.call.bf16);
    bool ok = delta != NULL && job.dq_split != NULL && job.workers != NULL;
    bwd_bf16 *h = &job.b16;
    if (ok && job.call.bf16) {
        job.kern_bf16 = kernels->bf16;
        const int64_t heads = p->batch * p->heads_q;
        h->dk2 = (p->d_k + 1) / 2;
        h->dv2 = (p->d_v + 1) / 2;
        h->nq2 = (p->n_q + 1) / 2;
        h->qb = sdpa_alloc(heads * p->n_q * h->dk2, sizeof(uint32_t));
        h->dob = sdpa_alloc(heads * p->n_q * h->dv2, sizeof(uint32_t));
        h->qr = sdpa_alloc(heads * h->nq2 * p->d_k, sizeof(uint32_t));
        h->dor = sdpa_alloc(heads * h->nq2 * p->d_v, sizeof(uint32_t));
        ok = h->qb != NULL && h->dob != NULL && h->qr != NULL && h->dor != NULL;
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
    }
    if (ok) {
        prologue_job pro = {.call = &job.call, .dout = job.dout, .out = out, .delta = delta,
                            .dq_split = job.dq_split, .splits = job.splits,
                            .rows = n_rows};
        attn_parallel_for_until(threads, blocks(n_rows, BWD_ROW_BLOCK), prologue_block, &pro,
                                p->cancel);
        job.delta = delta;
        if (job.kern_bf16 != NULL) {
            round_job rj = {.call = &job.call, .kern = job.kern_bf16, .dout = job.dout,
                            .b16 = h};
            attn_parallel_for_until(threads, p->batch * p->heads_q, round_head, &rj, p->cancel);
        }
        attn_parallel_for_until(threads, pairs * job.splits, backward_unit, &job, p->cancel);
        cancelled = attn_cancelled(p->cancel);
    }
    if (ok && !cancelled) {
        reduce_job red = {.dq_split = job.dq_split, .splits = job.splits,
                          .count = n_rows * p->d_k};
        if (job.splits > 1)
            attn_parallel_for(threads, blocks(red.count, BWD_SUM_BLOCK), reduce_block, &red);
        if (rope)
            ok = sdpa_rope(&job.call, threads, dq, dk, dq, dk, true) == ATTN_OK;
    }
    free(q_rot);
    free(k_rot);
    free(h->qb);
    free(h->dob);
    free(h->qr);
    free(h->dor);
    for (int64_t i = 1; job.dq_split != NULL && i < job.splits; i++)
        free(job.dq_split[i]);
    free(job.dq_split);
    free_workers(job.workers, threads);
    free(delta);
    if (!ok)
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the backward pass");
    if (cancelled)
        return attn_fail(err, ATTN_ERR_CANCELLED, "the call was cancelled");
    return ATTN_OK;
}
