/*
 * POST /v1/caches/{id}/attention — one step of decoding over a KV cache:
 * first `truncate` (keep the positions < truncate), then append `k` and `v`,
 * then, when `q` is given, attend q over every cached position.
 *
 *   k [H_kv, n_new, d_k], v [H_kv, n_new, d_v]   (rank 2 when H_kv is 1)
 *   q [H_q, n_q, d_k] -> output [H_q, n_q, d_v], lse [H_q, n_q]
 *                                                 (rank 2: one query head)
 * with (H_kv, d_k, d_v) the cache's, H_q a multiple of H_kv (GQA: query head
 * h reads key/value head h / (H_q / H_kv)). Causal by default, the last query
 * row at the last cached position (libattn's attn_kv_forward).
 *
 * The steps are the skeleton's (handle.c). Validation judges the shapes
 * against the cache's dimensions, which never change; the length does
 * (other requests append), so the three changes and the attention happen
 * in one turn of the cache (cache_store.h), in which the length is
 * known: what depends on it (a truncate past the end, the work limit, the
 * scores' bound, the memory) is judged there, before anything changes.
 */
#include "cache_store.h"
#include "request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    F_TRUNCATE, F_K, F_V, F_Q, F_CAUSAL, F_SCALE, F_WINDOW, F_ALIBI_SLOPES, F_SOFTCAP,
    F_ROPE, F_RETURN_LSE, F_OUTPUT_ENCODING, F_OUTPUT_DTYPE, F_PRECISION,
    /* options of /v1/attention that mean nothing here: read, then refused
     * with a reason (422) rather than as unknown fields */
    F_MASK, F_RETURN_WEIGHTS, F_RETURN_STATS, F_GRAD_OUTPUT, F_COUNT
};

static const api_field cache_attention_fields[] = {
    [F_TRUNCATE] = {"truncate", API_FIELD_INTEGER, false},
    [F_K] = {"k", API_FIELD_TENSOR, false},
    [F_V] = {"v", API_FIELD_TENSOR, false},
    [F_Q] = {"q", API_FIELD_TENSOR, false},
    [F_CAUSAL] = {"causal", API_FIELD_BOOL, false},
    [F_SCALE] = {"scale", API_FIELD_NUMBER, false},
    [F_WINDOW] = {"window", API_FIELD_WINDOW, false},
    [F_ALIBI_SLOPES] = {"alibi_slopes", API_FIELD_TENSOR, false},
    [F_SOFTCAP] = {"softcap", API_FIELD_NUMBER, false},
    [F_ROPE] = {"rope", API_FIELD_ROPE, false},
    [F_RETURN_LSE] = {"return_lse", API_FIELD_BOOL, false},
    [F_OUTPUT_ENCODING] = {"output_encoding", API_FIELD_ENCODING, false},
    [F_OUTPUT_DTYPE] = {"output_dtype", API_FIELD_DTYPE, false},
    [F_PRECISION] = {"precision", API_FIELD_PRECISION, false},
    [F_MASK] = {"mask", API_FIELD_MASK, false},
    [F_RETURN_WEIGHTS] = {"return_weights", API_FIELD_BOOL, false},
    [F_RETURN_STATS] = {"return_stats", API_FIELD_BOOL, false},
    [F_GRAD_OUTPUT] = {"grad_output", API_FIELD_TENSOR, false},
};

/* The price of one element copied into a cache, converted to its dtype:
 * about a nanosecond, as a score is (api/cost.c). */
#define PRICE_APPENDED 64.0

typedef struct {
    cache_entry *cache;  /* held from validate to release */
    attn_kv_config config;
    int64_t length_seen; /* at validation: the cost's estimate */
    int64_t n_new;       /* positions appended */
    int64_t keep;        /* truncate's value, or -1 */
    bool attend;         /* q given */
    attn_kv_params p;    /* n_q, heads_q, scale, causal, variants */
    int out, lse;        /* planned results, -1 when not asked */
    int64_t length, bytes; /* the cache after this request, for the answer */
    bool turn_held;      /* the cache's turn taken already (hold_now) */
} cache_state;

static cache_state *state(const api_call *c)
{
    return c->state;
}

/* ---------------------------------------------------------- validation */

static bool unsupported(const api_call *c, api_error *err)
{
    static const struct {
        int field;
        const char *why;
    } none[] = {
        {F_MASK, "an explicit mask is not taken over a cache; use causal, window or "
                 "truncate"},
        {F_RETURN_WEIGHTS, "the weights over a cache are not returned; use "
                           "POST /v1/attention with the keys for them"},
        {F_RETURN_STATS, "statistics over a cache are not computed; use "
                         "POST /v1/attention for them"},
        {F_GRAD_OUTPUT, "a cache keeps no gradients: decoding is inference only; use "
                        "POST /v1/attention for the backward pass"},
    };
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        const api_value *v = &c->f[none[i].field];
        if (v->present && (none[i].field != F_RETURN_WEIGHTS || v->flag) &&
            (none[i].field != F_RETURN_STATS || v->flag))
            return api_fail(err, 422, "unsupported", cache_attention_fields[none[i].field].name,
                            "%s", none[i].why);
    }
    return true;
}

/* A tensor of `heads` heads of rows `width` wide: [heads, n, width], or
 * [n, width] when heads is 1; *n gets n. */
static bool check_heads(const codec_tensor *t, const char *field, int64_t heads, int64_t width,
                        const char *width_name, int64_t *n, api_error *err)
{
    /* The shape that fits, said without writing the forms out (a snprintf
     * each for k and v was a twentieth of a decode step's decoding). */
    if (t->rank == 3 || (heads == 1 && t->rank == 2)) {
        bool sizes = true;
        for (int i = 0; i < t->rank; i++)
            sizes = sizes && t->shape[i] >= 1;
        int64_t h = t->rank == 3 ? t->shape[0] : 1, w = t->shape[t->rank - 1];
        if (sizes && h == heads && w == width) {
            *n = t->shape[t->rank - 2];
            return true;
        }
    }
    char forms[96];
    if (heads != 1)
        snprintf(forms, sizeof forms, "[%lld, n, %s]", (long long)heads, width_name);
    else
        snprintf(forms, sizeof forms, "[n, %s] or [1, n, %s]", width_name, width_name);
    if (!api_check_rank(t, field, heads == 1 ? 2 : 3, 3, forms, err))
        return false;
    int64_t h = t->rank == 3 ? t->shape[0] : 1, w = t->shape[t->rank - 1];
    char got[96];
    if (h != heads || w != width)
        return api_fail(err, 422, "shape_mismatch", field,
                        "%s has shape %s but this cache holds %lld key/value heads of "
                        "%s = %lld: %s must be %s",
                        field, api_shape_text(got, sizeof got, t->rank, t->shape),
                        (long long)heads, width_name, (long long)width, field, forms);
    *n = t->shape[t->rank - 2];
    return true;
}

static bool check_q(api_call *c, api_error *err)
{
    cache_state *st = state(c);
    const codec_tensor *q = &c->f[F_Q].tensor;
    const attn_kv_config *k = &st->config;
    if (!api_check_rank(q, "q", 2, 3, "[heads, n_q, head_dim] or [n_q, head_dim]", err))
        return false;
    int64_t heads = q->rank == 3 ? q->shape[0] : 1, d = q->shape[q->rank - 1];
    char got[96];
    if (d != k->head_dim)
        return api_fail(err, 422, "shape_mismatch", "q",
                        "q has shape %s: head_dim=%lld, but this cache's keys have "
                        "head_dim=%lld",
                        api_shape_text(got, sizeof got, q->rank, q->shape), (long long)d,
                        (long long)k->head_dim);
    if (heads % k->num_kv_heads != 0)
        return api_fail(err, 422, "shape_mismatch", "q",
                        "q has %lld heads, not a multiple of this cache's %lld key/value "
                        "heads (grouped-query attention needs num_heads %% num_kv_heads == 0)",
                        (long long)heads, (long long)k->num_kv_heads);
    st->p.heads_q = heads;
    st->p.n_q = q->shape[q->rank - 2];
    return true;
}

static bool validate(api_call *c, api_error *err)
{
    cache_state *st = state(c);
    st->out = st->lse = -1;
    st->keep = -1;
    if (!unsupported(c, err))
        return false;
    if (c->f[F_TRUNCATE].present && c->f[F_TRUNCATE].integer < 0)
        return api_fail(err, 422, "invalid_value", "truncate",
                        "truncate keeps the positions < truncate, so it must be >= 0; got "
                        "%lld",
                        (long long)c->f[F_TRUNCATE].integer);
    if (c->f[F_K].present != c->f[F_V].present)
        return api_fail(err, 400, "missing_field", c->f[F_K].present ? "v" : "k",
                        "k and v are appended together: %s is missing",
                        c->f[F_K].present ? "v" : "k");
    if (!(st->cache = cache_acquire(c->lim.caches, c->lim.cache_id, c->lim.owner, err)))
        return false;
    st->config = st->cache->config;
    st->length_seen = cache_length(c->lim.caches, st->cache);
    st->keep = c->f[F_TRUNCATE].present ? c->f[F_TRUNCATE].integer : -1;
    if (c->f[F_K].present) {
        int64_t nk, nv;
        if (!check_heads(&c->f[F_K].tensor, "k", st->config.num_kv_heads,
                         st->config.head_dim, "head_dim", &nk, err) ||
            !check_heads(&c->f[F_V].tensor, "v", st->config.num_kv_heads,
                         st->config.value_dim, "value_dim", &nv, err))
            return false;
        if (nv != nk)
            return api_fail(err, 422, "shape_mismatch", "v",
                            "v has %lld positions but k has %lld", (long long)nv,
                            (long long)nk);
        st->n_new = nk;
    }
    st->attend = c->f[F_Q].present;
    st->p = (attn_kv_params){
        .heads_q = st->config.num_kv_heads, .n_q = 1, .threads = 1,
        .precision = c->f[F_PRECISION].present ? c->f[F_PRECISION].precision
                                               : ATTN_PRECISION_FLOAT32,
        .cancel = c->lim.cancel};
    if (st->attend && !check_q(c, err))
        return false;
    st->p.scale = c->f[F_SCALE].present ? c->f[F_SCALE].number
                                        : attn_default_scale(st->config.head_dim);
    if (!(st->p.scale > 0))
        return api_fail(err, 422, "invalid_value", "scale",
                        "scale must be greater than 0 (as a float32), got %g",
                        (double)c->f[F_SCALE].number);
    st->p.causal = !c->f[F_CAUSAL].present || c->f[F_CAUSAL].flag;
    const api_variant_values variants = {&c->f[F_WINDOW], &c->f[F_ALIBI_SLOPES],
                                         &c->f[F_SOFTCAP], &c->f[F_ROPE]};
    const api_variant_shape heads = {1, st->p.heads_q, st->config.head_dim, "num_heads"};
    if (!api_variants_setup(&variants, &heads, &st->p.variants, err))
        return false;
    if (!st->attend)
        return true;
    const codec_tensor *q = &c->f[F_Q].tensor;
    int64_t out_shape[3];
    memcpy(out_shape, q->shape, sizeof out_shape);
    out_shape[q->rank - 1] = st->config.value_dim;
    st->out = api_plan(c, "output", false, "the output", q->rank, out_shape);
    if (c->f[F_RETURN_LSE].present && c->f[F_RETURN_LSE].flag) {
        st->lse = api_plan(c, "lse", false, "the lse", q->rank - 1, q->shape);
        c->results[st->lse].empty_rows = true;
    }
    return true;
}

/* ----------------------------------------------------------------- cost */

/* The positions attended over when the cache holds `length` now. */
static int64_t length_after(const cache_state *st, int64_t length)
{
    if (st->keep >= 0 && st->keep < length)
        length = st->keep;
    return length + st->n_new;
}

/* The attention over `n_k` cached positions as attn_sdpa_forward's
 * parameters, whose cost is the same: the products, the rows and the
 * variants' terms (but for RoPE's keys, rotated once when appended). */
static void terms_at(const cache_state *st, int64_t n_k, int threads, api_cost_terms *t)
{
    if (st->attend) {
        attn_sdpa_params p = {
            .batch = 1, .heads_q = st->p.heads_q, .heads_kv = st->config.num_kv_heads,
            .n_q = st->p.n_q, .n_k = n_k, .d_k = st->config.head_dim,
            .d_v = st->config.value_dim, .scale = st->p.scale, .causal = st->p.causal,
            .threads = 1, .variants = st->p.variants,
        };
        t->flops = attn_sdpa_flops(&p);
        t->pairs = (double)p.heads_q;
        t->rows = t->pairs * (double)p.n_q;
        t->scores = t->rows * (double)n_k;
        api_variant_cost(&p, t);
        if (st->p.precision == ATTN_PRECISION_BFLOAT16) {
            /* as /v1/attention's: the queries rounded once, each page
             * joined into words once per block of 96 query rows (libattn
             * reads the pages where they are: no copy of the cache) */
            t->bf16_flops = t->flops;
            t->rounded = (double)p.heads_q * (double)p.n_q * (double)p.d_k +
                         (double)p.heads_kv * (double)n_k * (double)(p.d_k + p.d_v) *
                             ceil((double)p.n_q / 96.0);
        }
        /* Memory: libattn's workspaces over the cache as it will be, for
         * the most threads the request may get (with bfloat16 products each
         * worker's page panel and rows; with float32, when decoding, each
         * run of pages' partial outputs), and the softmax rows for the lse. */
        attn_kv_params at_most = st->p;
        at_most.threads = threads;
        t->workspace = attn_kv_forward_workspace(&st->config, n_k, &at_most) +
                       (st->lse >= 0 ? t->rows * (double)sizeof(attn_softmax_row) : 0);
        snprintf(t->workspace_what, sizeof t->workspace_what,
                 "the attention's partial outputs and tiles over %lld cached positions",
                 (long long)n_k);
    }
    double h_kv = (double)st->config.num_kv_heads, d_k = (double)st->config.head_dim;
    if (st->p.variants.rope_base > 0) {
        double n_q = st->attend ? (double)st->p.n_q : 0;
        t->angles = (n_q + (double)st->n_new) * (d_k / 2);
        t->rotated = ((st->attend ? (double)st->p.heads_q : 0) * n_q +
                      h_kv * (double)st->n_new) * d_k;
    }
    /* Appending is priced as that many scores: a copy and a conversion. */
    double appended = (double)st->n_new * h_kv * (d_k + (double)st->config.value_dim);
    t->flops += appended * PRICE_APPENDED;
}

static void cost(const api_call *c, api_cost_terms *t)
{
    const cache_state *st = state(c);
    terms_at(st, length_after(st, st->length_seen), api_max_threads(&c->lim), t);
}

/* Judged in the turn, where the keys are known (compute). */
static double score_bound(const api_call *c, const char **blame)
{
    (void)c;
    *blame = "q and the cached keys";
    return 0;
}

/* -------------------------------------------------------------- compute */

/* Everything that depends on the length, judged before the cache changes
 * (the cache's turn is held): the truncate, the rope base, the work, the
 * scores' bound. */
static bool check_in_turn(api_call *c, const attn_kv_info *info, api_error *err)
{
    cache_state *st = state(c);
    if (st->keep > info->length)
        return api_fail(err, 422, "invalid_value", "truncate",
                        "truncate is %lld but the cache holds only %lld positions; truncate "
                        "keeps the positions < truncate",
                        (long long)st->keep, (long long)info->length);
    int64_t kept = st->keep >= 0 ? st->keep : info->length;
    float base = st->p.variants.rope_base;
    if (kept > 0 && (st->n_new > 0 || st->attend) && info->rope_base != base)
        return api_fail(err, 422, "invalid_value", "rope",
                        info->rope_base > 0
                            ? "the cached keys were rotated with rope base %g; every request "
                              "that appends or attends must give \"rope\": {\"base\": %g}"
                            : "the cached keys were appended without rope (base %g); a "
                              "request may not rotate now (it gives a base, the cache has "
                              "none: %g)",
                        (double)info->rope_base, (double)(info->rope_base > 0 ? info->rope_base : base));
    api_cost_terms t = {0};
    terms_at(st, length_after(st, info->length), api_max_threads(&c->lim), &t);
    if (c->lim.max_memory > 0 && t.workspace > c->lim.max_memory)
        return api_fail(err, 422, "memory_limit", "",
                        "attending over the %lld positions cached now needs about %.0f MiB "
                        "for %s, more than this server's limit of %.0f MiB for one request "
                        "(--max-request-memory); truncate the cache or send fewer query rows "
                        "at once",
                        (long long)length_after(st, info->length), t.workspace / 1048576.0,
                        t.workspace_what, c->lim.max_memory / 1048576.0);
    double work_limit = c->lim.max_work;
    if (work_limit > 0) {
        double work = api_compute_work(&t, false, false);
        if (work > work_limit)
            return api_fail(err, 422, "work_limit", "",
                            "attending over the %lld positions cached now needs %.4g units "
                            "of work, more than this server's limit of %.4g (--max-work); "
                            "truncate the cache or use a window",
                            (long long)length_after(st, info->length), work, work_limit);
    }
    if (!st->attend)
        return true;
    const codec_tensor *q = &c->f[F_Q].tensor;
    double key_norm = st->cache->max_key_norm;
    if (st->n_new > 0) {
        const codec_tensor *k = &c->f[F_K].tensor;
        double fresh = api_max_row_norm(k->f32, k->count / st->config.head_dim,
                                        st->config.head_dim);
        key_norm = fmax(key_norm, fresh);
    }
    /* float16 and bfloat16 round each element by at most 2^-8 of itself */
    double bound = fmax(st->p.scale, 1.0) * 1.01 *
                       api_max_row_norm(q->f32, q->count / st->config.head_dim,
                                        st->config.head_dim) *
                       key_norm +
                   api_alibi_bound(&st->p.variants, &c->f[F_ALIBI_SLOPES].tensor, st->p.n_q,
                                   length_after(st, info->length));
    return api_check_score_bound(bound, "q and the cached keys", err);
}

/* float16 holds |x| < 65520, bfloat16 |x| < 3.3961e38 (a larger float32
 * rounds to an infinity): a key or value beyond is refused before the cache
 * changes (libattn would refuse it too, after the truncate). */
static bool check_half(const api_call *c, api_error *err)
{
    attn_kv_dtype dtype = state(c)->config.dtype;
    if (dtype != ATTN_KV_FLOAT16 && dtype != ATTN_KV_BFLOAT16)
        return true;
    bool f16 = dtype == ATTN_KV_FLOAT16;
    for (int f = F_K; f <= F_V; f++) {
        const codec_tensor *t = &c->f[f].tensor;
        size_t at;
        if (!codec_half_fits(f16 ? CODEC_F16 : CODEC_BF16, t->f32, (size_t)t->count, &at))
            return api_fail(err, 422, "invalid_value", cache_attention_fields[f].name,
                            "%s[%zu] (row-major) is %g, beyond what this %s cache "
                            "can hold (|x| < %s)",
                            cache_attention_fields[f].name, at, (double)t->f32[at],
                            f16 ? "float16" : "bfloat16", f16 ? "65520" : "3.3961e38");
    }
    return true;
}

/* With rope, a key the cache's dtype cannot hold once rotated at its
 * position (after the truncate) is refused before the truncate, too. */
static bool check_rotated(const api_call *c, api_error *err)
{
    const cache_state *st = state(c);
    int64_t length = attn_kv_length(st->cache->kv);
    int64_t at = st->keep >= 0 && st->keep < length ? st->keep : length;
    attn_error ae = {0};
    attn_status s = attn_kv_append_check(st->cache->kv, at, st->n_new, c->f[F_K].tensor.f32,
                                         st->p.variants.rope_base, &ae);
    if (s == ATTN_ERR_INVALID)
        return api_fail(err, 422, "invalid_value", "k", "%s", ae.message);
    return s == ATTN_OK || api_fail_attn(err, &ae);
}

/* Truncates and appends. The room for the append is reserved first, as the
 * cache is before the truncate (which only frees), so that nothing changes
 * unless both can be done; what the truncate frees is settled after. */
static bool change(api_call *c, api_error *err)
{
    cache_state *st = state(c);
    api_caches *store = c->lim.caches;
    cache_entry *e = st->cache;
    attn_error ae = {0};
    if (st->n_new > 0) {
        int64_t after = attn_kv_bytes_after_append(e->kv, st->n_new);
        if (after < 0)
            return api_fail(err, 422, "cache_memory_limit", "k",
                            "appending %lld positions would make the cache larger than "
                            "memory can address", (long long)st->n_new);
        if (!check_half(c, err) || !check_rotated(c, err) ||
            !cache_reserve(store, e, (size_t)after - attn_kv_bytes(e->kv), err))
            return false;
    }
    if (st->keep >= 0) {
        attn_kv_truncate(e->kv, st->keep, &ae);
        if (st->keep == 0)
            e->max_key_norm = 0;
    }
    if (st->n_new == 0) {
        cache_settle(store, e);
        return true;
    }
    const codec_tensor *k = &c->f[F_K].tensor;
    bool ok = attn_kv_append(e->kv, st->n_new, k->f32, c->f[F_V].tensor.f32,
                             st->p.variants.rope_base, &ae) == ATTN_OK;
    cache_settle(store, e); /* what it holds: the reservation, or less */
    if (!ok)
        return api_fail_attn(err, &ae);
    e->max_key_norm = fmax(e->max_key_norm, api_max_row_norm(k->f32, k->count /
                                                               st->config.head_dim,
                                                           st->config.head_dim));
    return true;
}

static bool compute(api_call *c, int threads, api_error *err)
{
    cache_state *st = state(c);
    cache_entry *e = st->cache;
    attn_softmax_row *rows = NULL;
    if (!st->turn_held)
        cache_turn_begin(e);
    st->turn_held = false;
    attn_kv_info info;
    attn_kv_info_get(e->kv, &info);
    bool ok = check_in_turn(c, &info, err) && change(c, err);
    if (ok && st->attend) {
        st->p.threads = threads;
        int64_t n_rows = st->p.heads_q * st->p.n_q;
        attn_error ae = {0};
        if (st->lse >= 0 && !(rows = malloc((size_t)n_rows * sizeof *rows)))
            ok = api_fail(err, 500, "out_of_memory", "", "out of memory for the lse");
        else if (attn_kv_forward(e->kv, &st->p, api_field_data(c, F_Q),
                                 c->results[st->out].data, rows, &ae) != ATTN_OK)
            ok = api_fail_attn(err, &ae);
        else if (st->lse >= 0)
            api_lse_rows(rows, n_rows, c->results[st->lse].data);
    }
    st->length = attn_kv_length(e->kv);
    st->bytes = (int64_t)attn_kv_bytes(e->kv);
    cache_turn_end(e);
    free(rows);
    return ok;
}

/* The cache's turn, when nobody holds or awaits it: then compute, which
 * follows at once, does not wait for it. Declined when the cache has grown
 * since the call was costed (another request appended meanwhile): the
 * caller judged the work at the length seen then. */
static bool hold_now(api_call *c)
{
    cache_state *st = state(c);
    if (!cache_turn_try_begin(st->cache))
        return false;
    if (length_after(st, attn_kv_length(st->cache->kv)) > length_after(st, st->length_seen)) {
        cache_turn_end(st->cache);
        return false;
    }
    st->turn_held = true;
    return true;
}

/* ----------------------------------------------------------------- answer */

static void write_cache(const api_call *c, codec_buf *b)
{
    const cache_state *st = state(c);
    char text[96];
    snprintf(text, sizeof text, "%s\"cache\":{\"length\":%lld,\"bytes\":%lld}",
             c->n_results > 0 ? "," : "", (long long)st->length, (long long)st->bytes);
    codec_buf_puts(b, text);
}

static size_t meta_dims(const api_call *c, api_dim *d)
{
    const cache_state *st = state(c);
    const api_dim shape[] = {
        {"heads_q", st->attend ? st->p.heads_q : 0},
        {"heads_kv", st->config.num_kv_heads},
        {"n_q", st->attend ? st->p.n_q : 0},
        {"n_k", st->length},
        {"n_new", st->n_new},
        {"d_k", st->config.head_dim},
        {"d_v", st->config.value_dim},
    };
    memcpy(d, shape, sizeof shape);
    return sizeof shape / sizeof *shape;
}

static void release(api_call *c)
{
    cache_state *st = state(c);
    if (st->turn_held) /* taken by hold_now, compute never reached */
        cache_turn_end(st->cache);
    st->turn_held = false;
    cache_release(c->lim.caches, st->cache);
    st->cache = NULL;
}

const api_operation api_cache_attention_op = {
    .route = "/v1/caches/{id}/attention",
    .fields = cache_attention_fields,
    .n_fields = F_COUNT,
    .other = &api_multihead_op,
    .f_output_encoding = F_OUTPUT_ENCODING,
    .f_output_dtype = F_OUTPUT_DTYPE,
    .f_return_stats = F_RETURN_STATS,
    .f_grad_output = F_GRAD_OUTPUT,
    .state_size = sizeof(cache_state),
    .validate = validate,
    .cost = cost,
    .score_bound = score_bound,
    .compute = compute,
    .hold_now = hold_now,
    .dims = meta_dims,
    .release = release,
    .write_extra = write_cache,
};
