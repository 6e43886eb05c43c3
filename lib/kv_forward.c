/*
 * attn_kv_forward: attention of new queries over a KV cache's pages.
 *   q [H_q, n_q, d_k], cache (H_kv heads, length positions)
 *   -> out [H_q, n_q, d_v], optional rows [H_q, n_q] (softmax max and sum)
 *
 * Two routes, by the query rows each key/value head serves (R = group *
 * n_q, group = H_q / H_kv):
 *
 * Decode (R <= ATTN_KV_DECODE_ROWS), flash-decoding. The pages the rows can
 * see are cut into `runs` runs of consecutive pages (KV_RUN_PAGES or more
 * each), and the key/value heads into `parts`; a unit is (run, part), and
 * the units are shared among the threads. A unit reads each page of its
 * run, the blocks of its heads one after the other (a contiguous stretch
 * of memory, a whole page when parts is 1), once for all R rows of each
 * group (the kernel's decode: the group's rows are the rows of the tile),
 * and keeps each row's online softmax state: the running maximum m, the
 * sum l of exp(x - m) and the unnormalised output. With one run the unit
 * finishes its rows itself, exactly as the tiled forward does; with
 * several, each unit's state is a partial and the partials of a row are
 * merged as shards are merged through their log-sum-exp:
 *   M = max_c m_c,  L = sum_c l_c e^(m_c - M),  o = sum_c o_c e^(m_c - M) / L
 * in double. The runs depend on the visible pages only, and cutting the
 * heads changes no operation of any row, so the result is the same
 * whatever the thread count. Parts exist so that a short cache still
 * feeds every thread; a long one is read in whole pages (runs of at most
 * 512 KiB and more of contiguous memory in the usual shapes, where the
 * blocks of one head, 32 KiB apart pages, would stream at half the speed).
 *
 * Prefill (more rows): the tiled forward's own kernel (forward_tile), a
 * unit per block of KERN_FWD_BQ query rows of one head, over the pages as
 * key tiles. A float32 page is the k^T panel forward_tile reads, as it
 * is; a 16-bit page is widened into the worker's panel and value tile
 * first, once per unit and page (O(page) memory; converting inside the
 * product instead would redo it for every strip of rows). The output rows
 * are summed as the forward sums them: float partials folded into double
 * every SDPA_FOLD_TILES pages, each row finished as (acc + o) / l.
 *
 * Extra memory: the rotated queries (with rope), a few rows per worker,
 * and for several runs the partials, at most KV_MAX_RUNS outputs.
 *
 * bfloat16 products (ATTN_PRECISION_BFLOAT16): kv_forward_bf16.c, over
 * the pages as they are stored, attn_sdpa_forward's bits.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kv.h"

/* A run is at least this many pages (1024 positions): below, reading
 * them costs less than a merge and a thread more. */
#define KV_RUN_PAGES 16
/* At most this many runs: as many as the most threads a call uses
 * (SDPA_MAX_THREADS); their partials are at most this many outputs. */
#define KV_MAX_RUNS 64

const attn_kv_kern *attn_kv_kern_of(attn_kernel_kind kind)
{
    if (!attn_kernel_supported(kind))
        return NULL;
    switch (kind) {
#if defined(__x86_64__)
    case ATTN_KERNEL_AVX512:
        return &attn_kv_kern_avx512;
    case ATTN_KERNEL_AVX2:
        return &attn_kv_kern_avx2;
#endif
    case ATTN_KERNEL_GENERIC:
        return &attn_kv_kern_generic;
    default:
        return NULL;
    }
}

const attn_kv_kern *attn_kv_kern_get(void)
{
    return attn_kv_kern_of(attn_kernel());
}

/* One worker's workspaces. */
typedef struct {
    float *strip;        /* [KERN_MR_MAX, KERN_BK] */
    float *m;            /* [KERN_FWD_BQ] (prefill) */
    double *l;           /* [KERN_FWD_BQ] (prefill) */
    /* Prefill, the forward's blocked summation: the row maxima at the last
     * fold [KERN_FWD_BQ], and the output rows folded so far in double
     * [KERN_FWD_BQ, d_v]. */
    float *m_tile;
    double *acc;
    float *kt, *v;       /* [d_k, KERN_BK], [KERN_BK, d_v]: a widened page (prefill, 16-bit) */
} kv_worker;

typedef struct {
    kv_call kc;
    const attn_kern *kern;
    const attn_kv_kern *kv;
    float *out;
    attn_softmax_row *rows;
    kv_worker *workers;
    /* Decode: */
    int64_t tile_first, tiles, runs, parts, k_end;
    float *m;       /* [runs, H_kv, R] */
    double *l;      /* [runs, H_kv, R] */
    float *partial; /* [runs, H_kv, R, d_v], with several runs */
    /* Prefill: */
    int64_t q_tiles;
} kv_job;

/* The last step of row (h, i), whose unnormalised output (acc [d_v] folded
 * in double, NULL for none, plus o's float rows when `partial`) and softmax
 * state (m, l) are complete: o = (acc + o) / l, and the row's softmax
 * maximum and sum (to rows [H_q, n_q], when not NULL); a row whose float
 * accumulation overflowed is redone in double. attn_sdpa_forward's last
 * step, operation for operation. */
void kv_finish_row(const kv_call *kc, attn_softmax_row *rows, int64_t h, int64_t i, float *o,
                   const double *acc, bool partial, float m, double l)
{
    const sdpa_call *c = &kc->call;
    const attn_sdpa_params *p = c->p;
    bool finite = sdpa_finish_row(o, acc, partial, l, p->d_v);
    attn_softmax_row sm = {.max = l > 0.0 ? m : -INFINITY, .sum = (float)l};
    bool sm_finite = isfinite(sm.sum) && (l == 0.0 || isfinite(sm.max));
    if (!sm_finite || !finite) {
        const float *q_row = c->q + (h * p->n_q + i) * p->d_k;
        attn_softmax_row exact = kv_forward_row_exact(kc, h, i, q_row, o);
        if (!sm_finite)
            sm = exact;
    }
    if (rows != NULL)
        rows[h * p->n_q + i] = sm;
}

static void finish_row(const kv_job *job, int64_t h, int64_t i, float *o, const double *acc,
                       bool partial, float m, double l)
{
    kv_finish_row(&job->kc, job->rows, h, i, o, acc, partial, m, l);
}

/* ---------------------------------------------------------------- decode */

/* Unit u: run u / parts, heads of part u % parts. Its state: rows
 * (run * H_kv + g) * R + r for its heads g. */
static void decode_unit(void *ctx, int64_t u, int worker)
{
    const kv_job *job = ctx;
    const attn_sdpa_params *p = job->kc.call.p;
    const int64_t R = job->kc.rows, d_v = p->d_v, heads = p->heads_kv;
    const int64_t run = u / job->parts, part = u % job->parts;
    const kv_unit unit = {
        .g_begin = part * heads / job->parts,
        .g_end = (part + 1) * heads / job->parts,
        .tile_begin = job->tile_first + run * job->tiles / job->runs,
        .tile_end = job->tile_first + (run + 1) * job->tiles / job->runs,
        .k_end = job->k_end,
    };
    const int64_t first = (run * heads + unit.g_begin) * R, rows = (unit.g_end - unit.g_begin) * R;
    float *out = job->runs == 1 ? job->out + first * d_v : job->partial + first * d_v;
    sdpa_fwd_state st = {.strip = job->workers[worker].strip, .m = job->m + first,
                         .l = job->l + first, .out = out};
    for (int64_t r = 0; r < rows; r++) {
        st.m[r] = -INFINITY;
        st.l[r] = 0.0;
    }
    job->kv->decode[job->kc.cache->config.dtype](&job->kc, &unit, &st);
    if (job->runs == 1)
        for (int64_t r = 0; r < rows; r++) {
            /* Row r of the unit: head g_begin + r / R's group, row r % R. */
            const int64_t g = unit.g_begin + r / R, gr = r % R;
            finish_row(job, g * job->kc.call.group + gr / p->n_q, gr % p->n_q, out + r * d_v,
                       NULL, true, st.m[r], st.l[r]);
        }
}

/* Unit g: the rows of key/value head g, each from its runs' partials. */
static void merge_head(void *ctx, int64_t g, int worker)
{
    (void)worker;
    const kv_job *job = ctx;
    const sdpa_call *c = &job->kc.call;
    const attn_sdpa_params *p = c->p;
    const int64_t R = job->kc.rows, d_v = p->d_v, runs = job->runs;
    /* Run k holds row r of head g at (k * H_kv + g) * R + r. */
    const int64_t run_step = p->heads_kv * R;
    for (int64_t r = 0; r < R; r++) {
        const int64_t h = g * c->group + r / p->n_q, i = r % p->n_q;
        float *o = job->out + (g * R + r) * d_v;
        const int64_t first = g * R + r;
        float big = -INFINITY;
        bool overflowed = false;
        for (int64_t k = 0; k < runs; k++) {
            const double l = job->l[first + k * run_step];
            overflowed |= isnan(l);
            if (l > 0.0 && job->m[first + k * run_step] > big)
                big = job->m[first + k * run_step];
        }
        if (!overflowed && big == -INFINITY) { /* no key visible to the row */
            memset(o, 0, (size_t)d_v * sizeof *o);
            if (job->rows != NULL)
                job->rows[h * p->n_q + i] = (attn_softmax_row){.max = -INFINITY, .sum = 0.0f};
            continue;
        }
        double weight[KV_MAX_RUNS], sum = 0.0;
        for (int64_t k = 0; !overflowed && k < runs; k++) {
            const double l = job->l[first + k * run_step];
            weight[k] = l > 0.0 ? exp((double)job->m[first + k * run_step] - big) : 0.0;
            sum += l * weight[k];
        }
        bool finite = !overflowed && isfinite(sum);
        for (int64_t t = 0; finite && t < d_v; t++) {
            double acc = 0.0;
            for (int64_t k = 0; k < runs; k++)
                if (weight[k] > 0.0)
                    acc += weight[k] * job->partial[(first + k * run_step) * d_v + t];
            o[t] = (float)(acc / sum);
            finite = isfinite(o[t]);
        }
        attn_softmax_row sm = {.max = big, .sum = (float)sum};
        if (!finite || !isfinite(sm.sum)) {
            const float *q_row = c->q + (h * p->n_q + i) * p->d_k;
            sm = kv_forward_row_exact(&job->kc, h, i, q_row, o);
        }
        if (job->rows != NULL)
            job->rows[h * p->n_q + i] = sm;
    }
}

/* The runs of a decode call, and how many parts the heads are cut into
 * for `threads`; false when the rows see no key at all. Only the runs
 * change the arithmetic (the merge); the parts do not. */
static bool plan_decode(kv_job *job, int threads)
{
    const sdpa_call *c = &job->kc.call;
    int64_t k_begin, k_end;
    sdpa_key_range(c, 0, c->p->n_q, &k_begin, &k_end);
    if (k_begin == k_end)
        return false;
    job->k_end = k_end;
    job->tile_first = k_begin / ATTN_KV_PAGE;
    job->tiles = (k_end + ATTN_KV_PAGE - 1) / ATTN_KV_PAGE - job->tile_first;
    const int64_t runs = (job->tiles + KV_RUN_PAGES - 1) / KV_RUN_PAGES;
    job->runs = runs < KV_MAX_RUNS ? runs : KV_MAX_RUNS;
    /* Enough units for every thread to take about four, so that uneven
     * ones even out; whole pages a unit where there are. */
    const int64_t want = 4 * (int64_t)threads, heads = c->p->heads_kv;
    const int64_t parts = job->runs >= want ? 1 : (want + job->runs - 1) / job->runs;
    job->parts = parts < heads ? parts : heads;
    return true;
}

/* --------------------------------------------------------------- prefill */

static void prefill_unit(void *ctx, int64_t u, int worker)
{
    const kv_job *job = ctx;
    const sdpa_call *c = &job->kc.call;
    const attn_sdpa_params *p = c->p;
    const attn_kv_cache *cache = job->kc.cache;
    kv_worker *w = &job->workers[worker];
    sdpa_tile t = {.h = u / job->q_tiles, .i0 = u % job->q_tiles * KERN_FWD_BQ};
    t.rows = p->n_q - t.i0 < KERN_FWD_BQ ? p->n_q - t.i0 : KERN_FWD_BQ;
    float *out = job->out + (t.h * p->n_q + t.i0) * p->d_v;
    for (int64_t r = 0; r < t.rows; r++) {
        w->m[r] = w->m_tile[r] = -INFINITY;
        w->l[r] = 0.0;
    }
    memset(w->acc, 0, (size_t)(t.rows * p->d_v) * sizeof *w->acc);
    sdpa_fwd_state st = {.strip = w->strip, .m = w->m, .l = w->l, .out = out,
                         .scale = p->scale, .softcap = p->variants.softcap};
    int64_t k_begin, k_end;
    sdpa_key_range(c, t.i0, t.rows, &k_begin, &k_end);
    const int64_t k_first = k_begin / KERN_BK * KERN_BK;
    if (k_begin == k_end)
        memset(out, 0, (size_t)(t.rows * p->d_v) * sizeof *out);
    const attn_kv_dtype dtype = cache->config.dtype;
    int64_t since_fold = 0; /* tiles in the float rows, as the forward counts them */
    for (t.j0 = k_first; t.j0 < k_end; t.j0 += KERN_BK) {
        /* Cancelled: the rows are left unfinished (the call's outputs are
         * unspecified then), as attn_sdpa_forward leaves them. */
        if (attn_cancelled(p->cancel))
            return;
        if (since_fold == SDPA_FOLD_TILES) {
            sdpa_fold_rows(w->acc, w->m_tile, w->m, out, p->d_v, t.rows, p->d_v, true);
            since_fold = 0;
        }
        st.kt = t.j0 / KERN_BK;
        st.accumulate = since_fold++ > 0;
        t.cols = k_end - t.j0 < KERN_BK ? k_end - t.j0 : KERN_BK;
        const unsigned char *block = kv_head_block(cache, st.kt, t.h / c->group);
        /* A page is a whole panel of KERN_BK keys (zero past the cached
         * ones), however few of them the tile reads. */
        kern_keys keys = {.ld = KERN_BK};
        if (dtype == ATTN_KV_FLOAT32) {
            keys.kt = (const float *)(const void *)block;
            keys.v = (const float *)(const void *)(block + cache->v_offset);
        } else {
            job->kv->widen(dtype, block, w->kt, p->d_k * KERN_BK);
            job->kv->widen(dtype, block + cache->v_offset, w->v, t.cols * p->d_v);
            keys.kt = w->kt;
            keys.v = w->v;
        }
        job->kern->forward_tile(c, &t, &keys, &st);
        sdpa_fold_rows(w->acc, w->m_tile, w->m, out, p->d_v, t.rows, p->d_v, false);
    }
    for (int64_t r = 0; r < t.rows; r++)
        finish_row(job, t.h, t.i0 + r, out + r * p->d_v, w->acc + r * p->d_v, since_fold > 0,
                   w->m[r], w->l[r]);
}

/* ------------------------------------------------------------- the call */

/* The sdpa parameters of attention over the cache, for the checks, the
 * flops and the kernels. */
static attn_sdpa_params sdpa_params_at(const attn_kv_config *config, int64_t length,
                                       const attn_kv_params *kp)
{
    attn_sdpa_params sp = {
        .batch = 1, .heads_q = kp->heads_q, .heads_kv = config->num_kv_heads,
        .n_q = kp->n_q, .n_k = length > 0 ? length : 1,
        .d_k = config->head_dim, .d_v = config->value_dim, .scale = kp->scale,
        .causal = kp->causal, .mask = {.kind = ATTN_MASK_NONE}, .threads = kp->threads,
        .layout = ATTN_LAYOUT_BHND, .variants = kp->variants, .cancel = kp->cancel,
    };
    sp.variants.alibi_batch_stride = 0;
    return sp;
}

static attn_sdpa_params sdpa_params_of(const attn_kv_cache *cache, const attn_kv_params *kp)
{
    return sdpa_params_at(&cache->config, cache->length, kp);
}

double attn_kv_forward_flops(const attn_kv_cache *cache, const attn_kv_params *kp)
{
    if (cache == NULL || kp == NULL || cache->length == 0)
        return 0.0;
    attn_sdpa_params sp = sdpa_params_of(cache, kp);
    return sdpa_check_params(&sp, false, NULL) == ATTN_OK ? attn_sdpa_flops(&sp) : 0.0;
}

static void free_workers(kv_worker *w, int n)
{
    for (int i = 0; w != NULL && i < n; i++)
        sdpa_free(w[i].strip);
    free(w);
}

/* Floats of one worker's block (alloc_workers lays it out). */
static int64_t worker_floats(const attn_sdpa_params *p, bool prefill, bool widen)
{
    const int64_t strip = KERN_MR_MAX * KERN_BK, rows = prefill ? KERN_FWD_BQ : 0;
    const int64_t kt = widen ? p->d_k * KERN_BK : 0, v = widen ? KERN_BK * p->d_v : 0;
    return (strip + 15) / 16 * 16 + (rows + 15) / 16 * 16 + (2 * rows + 15) / 16 * 16 +
           (rows + 15) / 16 * 16 + (2 * rows * p->d_v + 15) / 16 * 16 + (kt + 15) / 16 * 16 + v;
}

/* Each worker's workspaces in one block. */
static kv_worker *alloc_workers(int n, const attn_sdpa_params *p, bool prefill, bool widen)
{
    kv_worker *w = calloc((size_t)n, sizeof *w);
    if (w == NULL)
        return NULL;
    const int64_t strip = KERN_MR_MAX * KERN_BK, rows = prefill ? KERN_FWD_BQ : 0;
    const int64_t kt = widen ? p->d_k * KERN_BK : 0;
    /* Floats, each part rounded up to whole cache lines (16 floats). */
    const int64_t at_m = (strip + 15) / 16 * 16, at_l = at_m + (rows + 15) / 16 * 16;
    const int64_t at_mt = at_l + (2 * rows + 15) / 16 * 16, at_acc = at_mt + (rows + 15) / 16 * 16;
    const int64_t at_kt = at_acc + (2 * rows * p->d_v + 15) / 16 * 16;
    const int64_t at_v = at_kt + (kt + 15) / 16 * 16;
    for (int i = 0; i < n; i++) {
        float *b = sdpa_alloc(worker_floats(p, prefill, widen), sizeof(float));
        if (b == NULL) {
            free_workers(w, n);
            return NULL;
        }
        w[i] = (kv_worker){.strip = b, .m = b + at_m, .l = (double *)(void *)(b + at_l),
                           .m_tile = b + at_mt, .acc = (double *)(void *)(b + at_acc), .kt = b + at_kt, .v = b + at_v};
    }
    return w;
}

attn_status attn_kv_forward(const attn_kv_cache *cache, const attn_kv_params *kp,
                            const float *q, float *out, attn_softmax_row *rows,
                            attn_error *err)
{
    if (cache == NULL || kp == NULL || q == NULL || out == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "cache, params, q and out must not be NULL");
    if (kp->precision != ATTN_PRECISION_FLOAT32 && kp->precision != ATTN_PRECISION_BFLOAT16)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "precision %d is neither float32 (0) nor bfloat16 (1)",
                         (int)kp->precision);
    if (kp->cancel != NULL && atomic_load_explicit(kp->cancel, memory_order_relaxed))
        return attn_fail(err, ATTN_ERR_CANCELLED, "cancelled before the attention began");
    attn_sdpa_params sp = sdpa_params_of(cache, kp);
    attn_status s = sdpa_check_params(&sp, false, err);
    if (s != ATTN_OK)
        return s;
    if (cache->length > 0 && kp->variants.rope_base != cache->rope_base)
        return kv_rope_mismatch(err, cache->rope_base, "this attention", kp->variants.rope_base);
    const int64_t n_rows = kp->heads_q * kp->n_q, d_v = sp.d_v;
    if (cache->length == 0) {
        /* Nothing to see: every row is fully masked. */
        memset(out, 0, (size_t)(n_rows * d_v) * sizeof *out);
        for (int64_t r = 0; rows != NULL && r < n_rows; r++)
            rows[r] = (attn_softmax_row){.max = -INFINITY, .sum = 0.0f};
        return ATTN_OK;
    }
    if (kp->precision == ATTN_PRECISION_BFLOAT16)
        return kv_forward_bf16(cache, &sp, q, out, rows, err);

    kv_job job = {.kern = attn_kern_get(), .kv = attn_kv_kern_get(), .out = out, .rows = rows};
    float *q_rot = NULL;
    if (kp->variants.rope_base > 0.0f) {
        /* Query i at position length - n_q + i, as the keys were at theirs. */
        q_rot = sdpa_alloc(n_rows * sp.d_k, sizeof *q_rot);
        if (q_rot == NULL || sdpa_rope_at(kp->variants.rope_base, sp.d_k, 1, q, q_rot,
                                          kp->heads_q, kp->n_q,
                                          cache->length - kp->n_q) != ATTN_OK) {
            sdpa_free(q_rot);
            return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the rotated queries");
        }
    }
    job.kc = (kv_call){.call = sdpa_call_of(&sp, q_rot != NULL ? q_rot : q, NULL, NULL),
                       .cache = cache};
    job.kc.rows = job.kc.call.group * sp.n_q;
    const bool decode = job.kc.rows <= ATTN_KV_DECODE_ROWS;
    const double flops = attn_sdpa_flops(&sp);
    int threads;
    if (decode) {
        if (!plan_decode(&job, sdpa_threads(&sp, INT64_MAX, flops))) {
            sdpa_free(q_rot);
            memset(out, 0, (size_t)(n_rows * d_v) * sizeof *out);
            for (int64_t r = 0; rows != NULL && r < n_rows; r++)
                rows[r] = (attn_softmax_row){.max = -INFINITY, .sum = 0.0f};
            return ATTN_OK;
        }
        threads = sdpa_threads(&sp, job.runs * job.parts, flops);
    } else {
        job.q_tiles = (sp.n_q + KERN_FWD_BQ - 1) / KERN_FWD_BQ;
        threads = sdpa_threads(&sp, sp.heads_q * job.q_tiles, flops);
    }
    job.workers = alloc_workers(threads, &sp, !decode, !decode && cache->config.dtype != ATTN_KV_FLOAT32);
    bool ok = job.workers != NULL;
    if (ok && decode) {
        job.m = sdpa_alloc(job.runs * n_rows, sizeof *job.m);
        job.l = sdpa_alloc(job.runs * n_rows, sizeof *job.l);
        if (job.runs > 1)
            job.partial = sdpa_alloc(job.runs * n_rows * d_v, sizeof *job.partial);
        ok = job.m != NULL && job.l != NULL && (job.runs == 1 || job.partial != NULL);
    }
    /* A cancelled call starts no unit more (and no merge): a decode unit
     * is a run of pages, a prefill unit looks again at every page. */
    if (ok && decode) {
        attn_parallel_for_until(threads, job.runs * job.parts, decode_unit, &job, kp->cancel);
        if (job.runs > 1 && !attn_cancelled(kp->cancel))
            attn_parallel_for_until(threads, sp.heads_kv, merge_head, &job, kp->cancel);
    } else if (ok) {
        attn_parallel_for_until(threads, sp.heads_q * job.q_tiles, prefill_unit, &job,
                                kp->cancel);
    }
    sdpa_free(job.m);
    sdpa_free(job.l);
    sdpa_free(job.partial);
    free_workers(job.workers, threads);
    sdpa_free(q_rot);
    if (!ok)
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the attention's workspaces");
    if (attn_cancelled(kp->cancel))
        return attn_fail(err, ATTN_ERR_CANCELLED, "the call was cancelled");
    return ATTN_OK;
}

/* ------------------------------------------------------------ its memory */

/* Bytes of n items of `size`, as sdpa_alloc takes them: whole cache lines. */
static double lines(double n, double size)
{
    return ceil(n * size / 64.0) * 64.0;
}

/* The allocations of attn_kv_forward above, term by term, each at its
 * largest: every thread `threads` allows, the most runs `length` can be
 * cut into (whatever the rows see of it), every buffer the variants ask
 * for. */
double attn_kv_forward_workspace(const attn_kv_config *config, int64_t length,
                                 const attn_kv_params *kp)
{
    if (config == NULL || kp == NULL || length <= 0 || kp->heads_q < 1 || kp->n_q < 1 ||
        config->num_kv_heads < 1)
        return 0.0;
    const attn_sdpa_params sp = sdpa_params_at(config, length, kp);
    const double n_rows = (double)kp->heads_q * (double)kp->n_q;
    const double q_rot = kp->variants.rope_base > 0.0f ? lines(n_rows * (double)sp.d_k, 4) : 0;
    if (kp->precision == ATTN_PRECISION_BFLOAT16)
        return q_rot + kv_forward_bf16_workspace(&sp);
    const int64_t group = kp->heads_q / config->num_kv_heads;
    const bool decode = group * kp->n_q <= ATTN_KV_DECODE_ROWS;
    const double threads = kp->threads < 1 ? 1
                           : kp->threads < SDPA_MAX_THREADS ? kp->threads
                                                            : SDPA_MAX_THREADS;
    const bool widen = !decode && config->dtype != ATTN_KV_FLOAT32;
    double bytes = q_rot + threads * ((double)sizeof(kv_worker) +
                                      lines((double)worker_floats(&sp, !decode, widen), 4));
    if (decode) {
        const int64_t pages = (length + ATTN_KV_PAGE - 1) / ATTN_KV_PAGE;
        const int64_t runs_all = (pages + KV_RUN_PAGES - 1) / KV_RUN_PAGES;
        const double runs = (double)(runs_all < KV_MAX_RUNS ? runs_all : KV_MAX_RUNS);
        bytes += lines(runs * n_rows, 4) + lines(runs * n_rows, 8) +
                 (runs > 1 ? lines(runs * n_rows * (double)sp.d_v, 4) : 0);
    }
    return bytes;
}
