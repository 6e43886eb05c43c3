/*
 * attn_kv_forward with bfloat16 products (ATTN_PRECISION_BFLOAT16), over
 * the cache's pages as they are stored:
 *   q [H_q, n_q, d_k], cache (H_kv heads, length positions)
 *   -> out [H_q, n_q, d_v], optional rows [H_q, n_q]
 *
 * The bfloat16 kernel (kern.h's attn_kern_bf16) reads a key tile as words
 * of two bfloat16 (bf16.h): kp [ceil(d_k / 2), KERN_BK], features t and
 * t + ceil(d_k / 2) of a key in a word, and vp [KERN_BK / 2, d_v], keys u
 * and u + ceil(keys / 2) of a column in a word. A page's head block is
 * kt [d_k, KERN_BK] and v [KERN_BK, d_v] in the cache's dtype, so each
 * word takes two rows of the block side by side (kern_kv_body.h's
 * kv_join): a bfloat16 page gives its stored halves (a subnormal read as
 * zero, as rounding its float32 value would), with no float32 copy and
 * nothing rounded; a float32 or float16 page is rounded as it is joined. A
 * page is joined once per unit (for every query head of the unit) into the
 * worker's panel: O(page) memory, where a float32 copy of the whole cache
 * would be O(length).
 *
 * Around the panels runs attn_sdpa_forward's block of query rows
 * (sdpa_forward.c's forward_block), step for step: the rows' q rounded
 * once, the key tiles (pages) in order from the block's first visible one,
 * forward_tile_bf16 on each, the float output rows folded into double every
 * SDPA_FOLD_TILES tiles, each row finished as (acc + o) / l. So the bits
 * are those of attn_sdpa_forward in bfloat16 over the cached keys and
 * values, at any length and any thread count.
 *
 * A unit is one block of KERN_FWD_BQ query rows of some query heads of one
 * group (all of them, unless the threads want more units than the groups
 * and blocks give): every head of the unit reads the panel it shares.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kv.h"

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* One worker's workspaces: the panel, a strip, and the states of the rows
 * of up to `heads` query heads (row r of the unit's head a at a * BQ + r). */
typedef struct {
    uint32_t *panel; /* kp [dk2, KERN_BK], then vp [KERN_BK / 2, d_v] */
    float *strip;    /* [KERN_MR_MAX, KERN_BK] */
    uint32_t *pb;    /* [KERN_MR_MAX, KERN_BK / 2] */
    uint32_t *qb;    /* [heads * BQ, dk2] */
    float *m, *m_tile; /* [heads * BQ] */
    double *l;         /* [heads * BQ] */
    double *acc;       /* [heads * BQ, d_v] */
} b16_worker;

typedef struct {
    kv_call kc;
    const attn_kern_bf16 *kb;
    const attn_kv_kern *kv;
    float *out;
    attn_softmax_row *rows;
    int64_t q_tiles, parts, heads; /* heads: the most query heads of a unit */
    b16_worker *workers;
} b16_job;

/* The panel of page `tile` of key/value head g, `keys` of its positions
 * in use (the others zero, whatever the page holds past the cache's
 * length): what sdpa_forward.c's pack_bf16 makes of the same keys and
 * values, joined from the page as it is stored (kern_kv_body.h's
 * kv_join). */
static void pack_page(const b16_job *job, b16_worker *w, int64_t tile, int64_t g, int64_t keys)
{
    const attn_kv_cache *cache = job->kc.cache;
    const attn_kv_dtype dtype = cache->config.dtype;
    const attn_sdpa_params *p = job->kc.call.p;
    const int64_t d_k = p->d_k, d_v = p->d_v, dk2 = (d_k + 1) / 2;
    const unsigned char *block = kv_head_block(cache, tile, g);
    uint32_t *kp = w->panel, *vp = w->panel + dk2 * KERN_BK;
    job->kv->join(dtype, block, KERN_BK, d_k, KERN_BK, kp, KERN_BK, dk2);
    job->kv->join(dtype, block + cache->v_offset, d_v, keys, d_v, vp, d_v, KERN_BK / 2);
    if (keys < KERN_BK)
        for (int64_t t = 0; t < dk2; t++)
            memset(kp + t * KERN_BK + keys, 0, (size_t)(KERN_BK - keys) * sizeof *kp);
}

/* Unit u: query block u % q_tiles of the heads of part (u / q_tiles) %
 * parts of group u / (q_tiles * parts). */
static void b16_unit(void *ctx, int64_t u, int worker)
{
    const b16_job *job = ctx;
    const sdpa_call *c = &job->kc.call;
    const attn_sdpa_params *p = c->p;
    b16_worker *w = &job->workers[worker];
    const int64_t d_k = p->d_k, d_v = p->d_v, n_q = p->n_q, dk2 = (d_k + 1) / 2;
    const int64_t g = u / (job->q_tiles * job->parts), part = u / job->q_tiles % job->parts;
    const int64_t h_begin = g * c->group + part * c->group / job->parts;
    const int64_t heads = g * c->group + (part + 1) * c->group / job->parts - h_begin;
    sdpa_tile t = {.i0 = u % job->q_tiles * KERN_FWD_BQ};
    t.rows = n_q - t.i0 < KERN_FWD_BQ ? n_q - t.i0 : KERN_FWD_BQ;
    for (int64_t a = 0; a < heads; a++) {
        const int64_t at = a * KERN_FWD_BQ;
        for (int64_t r = 0; r < t.rows; r++) {
            w->m[at + r] = w->m_tile[at + r] = -INFINITY;
            w->l[at + r] = 0.0;
        }
        memset(w->acc + at * d_v, 0, (size_t)(t.rows * d_v) * sizeof *w->acc);
        job->kb->rows(c->q + ((h_begin + a) * n_q + t.i0) * d_k, d_k, t.rows, d_k,
                      w->qb + at * dk2, dk2);
    }
    /* The keys the block's rows see; the same for every head. */
    int64_t k_begin, k_end;
    sdpa_key_range(c, t.i0, t.rows, &k_begin, &k_end);
    const int64_t k_first = k_begin / KERN_BK * KERN_BK;
    if (k_begin == k_end)
        for (int64_t a = 0; a < heads; a++)
            memset(job->out + ((h_begin + a) * n_q + t.i0) * d_v, 0,
                   (size_t)(t.rows * d_v) * sizeof(float));
    int64_t since_fold = 0; /* tiles in the float rows, as the forward counts them */
    for (t.j0 = k_first; t.j0 < k_end; t.j0 += KERN_BK) {
        if (attn_cancelled(p->cancel))
            return;
        const bool fold = since_fold == SDPA_FOLD_TILES;
        if (fold)
            since_fold = 0;
        const bool accumulate = since_fold++ > 0;
        t.cols = k_end - t.j0 < KERN_BK ? k_end - t.j0 : KERN_BK;
        pack_page(job, w, t.j0 / KERN_BK, g, min64(KERN_BK, p->n_k - t.j0));
        const kern_keys keys = {.kp = w->panel, .vp = w->panel + dk2 * KERN_BK, .ld = KERN_BK};
        for (int64_t a = 0; a < heads; a++) {
            const int64_t at = a * KERN_FWD_BQ;
            float *out = job->out + ((h_begin + a) * n_q + t.i0) * d_v;
            if (fold)
                sdpa_fold_rows(w->acc + at * d_v, w->m_tile + at, w->m + at, out, d_v, t.rows,
                               d_v, true);
            sdpa_fwd_state st = {.strip = w->strip, .m = w->m + at, .l = w->l + at,
                                 .out = out, .kt = t.j0 / KERN_BK, .accumulate = accumulate,
                                 .scale = p->scale, .softcap = p->variants.softcap,
                                 .qb = w->qb + at * dk2, .ldqb = dk2, .pb = w->pb};
            t.h = h_begin + a;
            job->kb->forward_tile(c, &t, &keys, &st);
            sdpa_fold_rows(w->acc + at * d_v, w->m_tile + at, w->m + at, out, d_v, t.rows, d_v,
                           false);
        }
    }
    for (int64_t a = 0; a < heads; a++) {
        const int64_t at = a * KERN_FWD_BQ, h = h_begin + a;
        for (int64_t r = 0; r < t.rows; r++)
            kv_finish_row(&job->kc, job->rows, h, t.i0 + r,
                          job->out + (h * n_q + t.i0 + r) * d_v, w->acc + (at + r) * d_v,
                          since_fold > 0, w->m[at + r], w->l[at + r]);
    }
}

static void free_workers(b16_worker *w, int n)
{
    for (int i = 0; w != NULL && i < n; i++)
        sdpa_free(w[i].panel);
    free(w);
}

/* The bytes of one worker's block for units of at most `heads` query
 * heads, each part on whole cache lines (64 bytes), at the offsets `at`
 * (panel, strip, pb, qb, m, m_tile, l, acc) when not NULL. */
static int64_t worker_bytes(const attn_sdpa_params *p, int64_t heads, int64_t *at)
{
#define LINES(count, size) (((int64_t)(count) * (int64_t)(size) + 63) / 64 * 64)
    const int64_t dk2 = (p->d_k + 1) / 2, rows = heads * KERN_FWD_BQ;
    const int64_t part[8] = {
        LINES(dk2 * KERN_BK + KERN_BK / 2 * p->d_v, 4), /* panel */
        LINES(KERN_MR_MAX * KERN_BK, 4),                /* strip */
        LINES(KERN_MR_MAX * KERN_BK / 2, 4),            /* pb */
        LINES(rows * dk2, 4),                           /* qb */
        LINES(rows, 4), LINES(rows, 4),                 /* m, m_tile */
        LINES(rows, 8), LINES(rows * p->d_v, 8),        /* l, acc */
    };
#undef LINES
    int64_t total = 0;
    for (int i = 0; i < 8; i++) {
        if (at != NULL)
            at[i] = total;
        total += part[i];
    }
    return total;
}

static b16_worker *alloc_workers(int n, const b16_job *job)
{
    b16_worker *w = calloc((size_t)n, sizeof *w);
    if (w == NULL)
        return NULL;
    int64_t at[8];
    const int64_t bytes = worker_bytes(job->kc.call.p, job->heads, at);
    for (int i = 0; i < n; i++) {
        char *b = sdpa_alloc(bytes, 1);
        if (b == NULL) {
            free_workers(w, n);
            return NULL;
        }
        w[i] = (b16_worker){
            .panel = (uint32_t *)(void *)(b + at[0]), .strip = (float *)(void *)(b + at[1]),
            .pb = (uint32_t *)(void *)(b + at[2]), .qb = (uint32_t *)(void *)(b + at[3]),
            .m = (float *)(void *)(b + at[4]), .m_tile = (float *)(void *)(b + at[5]),
            .l = (double *)(void *)(b + at[6]), .acc = (double *)(void *)(b + at[7]),
        };
    }
    return w;
}

double kv_forward_bf16_workspace(const attn_sdpa_params *sp)
{
    /* At most every query head of a group in a unit, one worker a thread. */
    const int64_t threads = sp->threads < 1 ? 1
                            : sp->threads < SDPA_MAX_THREADS ? sp->threads
                                                             : SDPA_MAX_THREADS;
    return (double)threads * ((double)sizeof(b16_worker) +
                              (double)worker_bytes(sp, sp->heads_q / sp->heads_kv, NULL));
}

attn_status kv_forward_bf16(const attn_kv_cache *cache, const attn_sdpa_params *sp,
                            const float *q, float *out, attn_softmax_row *rows, attn_error *err)
{
    b16_job job = {.kb = attn_kern_bf16_get(), .kv = attn_kv_kern_get(), .out = out,
                   .rows = rows};
    if (job.kb == NULL || job.kv == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "no bfloat16 kernel runs on this CPU");
    const int64_t n_rows = sp->heads_q * sp->n_q;
    float *q_rot = NULL;
    if (sp->variants.rope_base > 0.0f) {
        /* Query i at position length - n_q + i, as the keys were at theirs. */
        q_rot = sdpa_alloc(n_rows * sp->d_k, sizeof *q_rot);
        if (q_rot == NULL || sdpa_rope_at(sp->variants.rope_base, sp->d_k, 1, q, q_rot,
                                          sp->heads_q, sp->n_q,
                                          cache->length - sp->n_q) != ATTN_OK) {
            sdpa_free(q_rot);
            return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the rotated queries");
        }
    }
    /* The keys are rotated already: the kernels must not turn them again. */
    attn_sdpa_params p = *sp;
    p.precision = ATTN_PRECISION_BFLOAT16;
    p.variants.rope_base = 0.0f;
    job.kc = (kv_call){.call = sdpa_call_of(&p, q_rot != NULL ? q_rot : q, NULL, NULL),
                       .cache = cache};
    job.kc.rows = job.kc.call.group * p.n_q;
    job.q_tiles = (p.n_q + KERN_FWD_BQ - 1) / KERN_FWD_BQ;
    const double flops = attn_sdpa_flops(&p);
    /* The groups and blocks first; a group's heads are cut only where the
     * threads would otherwise wait (cutting changes no row's arithmetic). */
    const int64_t blocks = p.heads_kv * job.q_tiles, want = sdpa_threads(&p, INT64_MAX, flops);
    job.parts = blocks >= want ? 1 : min64((want + blocks - 1) / blocks, job.kc.call.group);
    job.heads = (job.kc.call.group + job.parts - 1) / job.parts;
    const int64_t units = blocks * job.parts;
    const int threads = sdpa_threads(&p, units, flops);
    job.workers = alloc_workers(threads, &job);
    if (job.workers == NULL) {
        sdpa_free(q_rot);
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the attention's workspaces");
    }
    attn_parallel_for_until(threads, units, b16_unit, &job, p.cancel);
    free_workers(job.workers, threads);
    sdpa_free(q_rot);
    if (attn_cancelled(p.cancel))
        return attn_fail(err, ATTN_ERR_CANCELLED, "the call was cancelled");
    return ATTN_OK;
}
