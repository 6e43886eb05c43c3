/*
 * KV caches: the pages of one sequence's keys and values, and the calls
 * that change them (create, append, truncate, free) or read them back.
 * Attention over a cache is kv_forward.c; the layout of a page is kv.h's.
 *
 *   append k [H_kv, n_new, d_k], v [H_kv, n_new, d_v] (float32)
 *   -> positions length .. length + n_new - 1 of every head's pages
 *
 * Memory is counted as it is allocated: the header, the table of page
 * pointers (capacity entries, a power of two: it doubles as pages are
 * added and halves as truncates free them, so that its size depends on the
 * page count only) and the pages. attn_kv_bytes_after_append predicts it
 * with the same rule the append follows.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kv.h"

size_t attn_kv_dtype_size(attn_kv_dtype dtype)
{
    switch (dtype) {
    case ATTN_KV_FLOAT32:
        return 4;
    case ATTN_KV_FLOAT16:
    case ATTN_KV_BFLOAT16:
        return 2;
    }
    return 0;
}

const char *attn_kv_dtype_name(attn_kv_dtype dtype)
{
    switch (dtype) {
    case ATTN_KV_FLOAT32:
        return "float32";
    case ATTN_KV_FLOAT16:
        return "float16";
    case ATTN_KV_BFLOAT16:
        return "bfloat16";
    }
    return NULL;
}

/* Largest dimension accepted: far beyond any model, small enough that
 * every product of sizes below stays far from overflowing. */
#define KV_MAX_DIM ((int64_t)1 << 20)

static attn_status check_config(const attn_kv_config *cfg, attn_error *err)
{
    if (cfg == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "the cache configuration is NULL");
    const struct {
        const char *name;
        int64_t value;
    } dims[] = {{"num_kv_heads", cfg->num_kv_heads},
                {"head_dim", cfg->head_dim},
                {"value_dim", cfg->value_dim}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].value < 1 || dims[i].value > KV_MAX_DIM)
            return attn_fail(err, ATTN_ERR_INVALID, "%s is %lld; it must be 1 to %lld",
                             dims[i].name, (long long)dims[i].value, (long long)KV_MAX_DIM);
    if (attn_kv_dtype_size(cfg->dtype) == 0)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "dtype %d is not float32, float16 or bfloat16", (int)cfg->dtype);
    /* One page must be addressable (at most 2^20 x 2^21 x 64 x 4 bytes
     * would not be; refuse what size_t cannot hold). */
    int64_t bytes;
    if (__builtin_mul_overflow(cfg->num_kv_heads, cfg->head_dim + cfg->value_dim, &bytes) ||
        __builtin_mul_overflow(bytes, (int64_t)(ATTN_KV_PAGE * attn_kv_dtype_size(cfg->dtype)),
                               &bytes) ||
        (uint64_t)bytes > SIZE_MAX / 2)
        return attn_fail(err, ATTN_ERR_INVALID, "one page of this cache would be too large");
    return ATTN_OK;
}

/* ---------------------------------------------------------------- memory */

/* Entries of the page table for `pages` pages: 0 for none, else the
 * smallest power of two >= pages, at least 4. */
static int64_t table_capacity(int64_t pages)
{
    if (pages <= 0)
        return 0;
    int64_t cap = 4;
    while (cap < pages)
        cap *= 2;
    return cap;
}

static int64_t pages_for(int64_t length)
{
    return (length + ATTN_KV_PAGE - 1) / ATTN_KV_PAGE;
}

/* Header + table + pages; -1 when it does not fit in int64_t. */
static int64_t bytes_of(size_t page_bytes, int64_t pages, int64_t capacity)
{
    int64_t table, data, total;
    if (__builtin_mul_overflow(capacity, (int64_t)sizeof(unsigned char *), &table) ||
        __builtin_mul_overflow(pages, (int64_t)page_bytes, &data) ||
        __builtin_add_overflow(table, data, &total) ||
        __builtin_add_overflow(total, (int64_t)sizeof(attn_kv_cache), &total))
        return -1;
    return total;
}

size_t attn_kv_bytes_empty(const attn_kv_config *config)
{
    return check_config(config, NULL) == ATTN_OK ? sizeof(attn_kv_cache) : 0;
}

size_t attn_kv_bytes(const attn_kv_cache *c)
{
    return c == NULL ? 0 : (size_t)bytes_of(c->page_bytes, c->pages, c->capacity);
}

int64_t attn_kv_bytes_after_append(const attn_kv_cache *c, int64_t n_new)
{
    int64_t length;
    if (c == NULL || n_new < 0 || __builtin_add_overflow(c->length, n_new, &length) ||
        length > INT64_MAX - ATTN_KV_PAGE)
        return -1;
    const int64_t pages = pages_for(length);
    const int64_t cap = pages > c->capacity ? table_capacity(pages) : c->capacity;
    int64_t bytes = bytes_of(c->page_bytes, pages, cap);
    return bytes >= 0 && (uint64_t)bytes <= SIZE_MAX ? bytes : -1;
}

int64_t attn_kv_length(const attn_kv_cache *c)
{
    return c == NULL ? 0 : c->length;
}

void attn_kv_info_get(const attn_kv_cache *c, attn_kv_info *info)
{
    if (c == NULL) {
        *info = (attn_kv_info){0};
        return;
    }
    *info = (attn_kv_info){
        .config = c->config, .length = c->length, .pages = c->pages,
        .page_bytes = c->page_bytes, .bytes = attn_kv_bytes(c), .rope_base = c->rope_base,
    };
}

/* ------------------------------------------------------ create and free */

attn_status attn_kv_create(const attn_kv_config *config, attn_kv_cache **cache,
                           attn_error *err)
{
    if (cache == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "cache (the result's place) is NULL");
    *cache = NULL;
    attn_status s = check_config(config, err);
    if (s != ATTN_OK)
        return s;
    attn_kv_cache *c = calloc(1, sizeof *c);
    if (c == NULL)
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for a cache");
    c->config = *config;
    c->elem = attn_kv_dtype_size(config->dtype);
    c->v_offset = (size_t)config->head_dim * ATTN_KV_PAGE * c->elem;
    c->head_bytes = c->v_offset + (size_t)config->value_dim * ATTN_KV_PAGE * c->elem;
    c->page_bytes = c->head_bytes * (size_t)config->num_kv_heads;
    *cache = c;
    return ATTN_OK;
}

/* Frees pages [from, pages) and fits the table to what is left. */
static void drop_pages(attn_kv_cache *c, int64_t from)
{
    for (int64_t p = from; p < c->pages; p++)
        free(c->page[p]);
    c->pages = from;
    const int64_t cap = table_capacity(from);
    if (cap == c->capacity)
        return;
    if (cap == 0) {
        free(c->page);
        c->page = NULL;
        c->capacity = 0;
        return;
    }
    /* Smaller: realloc keeps the pointers. Should it fail, the larger
     * table stays, and attn_kv_bytes says so. */
    unsigned char **t = realloc(c->page, (size_t)cap * sizeof *t);
    if (t != NULL) {
        c->page = t;
        c->capacity = cap;
    }
}

void attn_kv_free(attn_kv_cache *c)
{
    if (c == NULL)
        return;
    drop_pages(c, 0);
    free(c);
}

attn_status attn_kv_truncate(attn_kv_cache *c, int64_t length, attn_error *err)
{
    if (c == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "cache is NULL");
    if (length < 0)
        return attn_fail(err, ATTN_ERR_INVALID, "truncate to %lld: it must be >= 0",
                         (long long)length);
    if (length >= c->length)
        return ATTN_OK;
    drop_pages(c, pages_for(length));
    c->length = length;
    if (length == 0)
        c->rope_base = 0.0f;
    return ATTN_OK;
}

/* ---------------------------------------------------------------- append */

/* Can the dtype hold x (finite, and finite once rounded)? */
static bool kv_fits(attn_kv_dtype dtype, float x)
{
    const uint32_t a = kv_float_bits(x) & 0x7fffffffu;
    switch (dtype) {
    case ATTN_KV_FLOAT16:
        return a < 0x477ff000u; /* 65520, the tie above 65504, rounds to infinity */
    case ATTN_KV_BFLOAT16:
        return a < 0x7f7f8000u; /* likewise above bfloat16's largest, 0x7f7f << 16 */
    case ATTN_KV_FLOAT32:
        break;
    }
    return a < 0x7f800000u;
}

/* The first element of x [heads, n, d] the dtype cannot hold, as an
 * error naming it; ATTN_OK when there is none. */
static attn_status check_values(const attn_kv_cache *c, const char *name, const float *x,
                                int64_t n, int64_t d, bool rotated, attn_error *err)
{
    const size_t count = (size_t)(c->config.num_kv_heads * n * d);
    for (size_t i = 0; i < count; i++) {
        if (kv_fits(c->config.dtype, x[i]))
            continue;
        const int64_t t = (int64_t)i % d, j = (int64_t)i / d % n, g = (int64_t)i / d / n;
        return attn_fail(err, ATTN_ERR_INVALID,
                         "%s[%lld, %lld, %lld] = %g%s: the cache's dtype %s cannot hold it",
                         name, (long long)g, (long long)j, (long long)t, (double)x[i],
                         rotated ? " once rotated (rope)" : "",
                         attn_kv_dtype_name(c->config.dtype));
    }
    return ATTN_OK;
}

static inline __attribute__((always_inline)) void store(const attn_kv_dtype dtype,
                                                       unsigned char *dst, size_t at, float x)
{
    uint16_t h;
    switch (dtype) {
    case ATTN_KV_FLOAT32:
        memcpy(dst + at * 4, &x, 4);
        return;
    case ATTN_KV_FLOAT16:
        h = kv_f32_to_f16(x);
        memcpy(dst + at * 2, &h, 2);
        return;
    case ATTN_KV_BFLOAT16:
        h = kv_f32_to_bf16(x);
        memcpy(dst + at * 2, &h, 2);
        return;
    }
}

/* Positions [from, from + n) of the cache come from rows src_row .. of
 * k and v (each [H_kv, n_all, d]); they lie in one page. One copy per
 * dtype, so that the conversion is inlined into the loops. */
static inline __attribute__((always_inline)) void
write_run_as(const attn_kv_dtype dtype, attn_kv_cache *c, int64_t from, int64_t n,
             const float *k, const float *v, int64_t n_all, int64_t src_row)
{
    const attn_kv_config *cfg = &c->config;
    const int64_t d_k = cfg->head_dim, d_v = cfg->value_dim, col = from % ATTN_KV_PAGE;
    for (int64_t g = 0; g < cfg->num_kv_heads; g++) {
        unsigned char *block = c->page[from / ATTN_KV_PAGE] + (size_t)g * c->head_bytes;
        const float *ks = k + (g * n_all + src_row) * d_k;
        const float *vs = v + (g * n_all + src_row) * d_v;
        /* Keys go in transposed: row t of the panel, columns col .. col + n. */
        for (int64_t t = 0; t < d_k; t++)
            for (int64_t j = 0; j < n; j++)
                store(dtype, block, (size_t)(t * ATTN_KV_PAGE + col + j), ks[j * d_k + t]);
        unsigned char *vb = block + c->v_offset;
        for (int64_t j = 0; j < n; j++)
            for (int64_t t = 0; t < d_v; t++)
                store(dtype, vb, (size_t)((col + j) * d_v + t), vs[j * d_v + t]);
    }
}

static void write_run(attn_kv_cache *c, int64_t from, int64_t n, const float *k,
                      const float *v, int64_t n_all, int64_t src_row)
{
    switch (c->config.dtype) {
    case ATTN_KV_FLOAT32:
        write_run_as(ATTN_KV_FLOAT32, c, from, n, k, v, n_all, src_row);
        return;
    case ATTN_KV_FLOAT16:
        write_run_as(ATTN_KV_FLOAT16, c, from, n, k, v, n_all, src_row);
        return;
    case ATTN_KV_BFLOAT16:
        write_run_as(ATTN_KV_BFLOAT16, c, from, n, k, v, n_all, src_row);
        return;
    }
}

/* Whether n_new more positions keep every size of the cache, and every
 * product of n_new with its widths, within int64_t. */
static bool append_size_fits(const attn_kv_cache *c, int64_t n_new)
{
    const attn_kv_config *cfg = &c->config;
    return attn_kv_bytes_after_append(c, n_new) >= 0 &&
           n_new <= INT64_MAX / cfg->num_kv_heads / (cfg->head_dim + cfg->value_dim);
}

/* k [H_kv, n_new, d_k] rotated by rope at positions at .. at + n_new - 1
 * into a new *k_rot (the caller frees it), each rotated key checked
 * against the dtype; on failure *k_rot is NULL. */
static attn_status rotated_keys(const attn_kv_cache *c, int64_t at, int64_t n_new,
                                const float *k, float rope_base, float **k_rot, attn_error *err)
{
    const attn_kv_config *cfg = &c->config;
    *k_rot = sdpa_alloc(cfg->num_kv_heads * n_new * cfg->head_dim, sizeof **k_rot);
    if (*k_rot == NULL)
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the rotated keys");
    attn_status s = sdpa_rope_at(rope_base, cfg->head_dim, 1, k, *k_rot, cfg->num_kv_heads,
                                 n_new, at);
    if (s == ATTN_OK)
        s = check_values(c, "k", *k_rot, n_new, cfg->head_dim, true, err);
    else
        s = attn_fail(err, s, "out of memory for the rotation's table");
    if (s != ATTN_OK) {
        sdpa_free(*k_rot);
        *k_rot = NULL;
    }
    return s;
}

attn_status attn_kv_append(attn_kv_cache *c, int64_t n_new, const float *k, const float *v,
                           float rope_base, attn_error *err)
{
    if (c == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "cache is NULL");
    if (n_new < 0)
        return attn_fail(err, ATTN_ERR_INVALID, "n_new is %lld; it must be >= 0",
                         (long long)n_new);
    if (!(rope_base >= 0.0f) || !isfinite(rope_base))
        return attn_fail(err, ATTN_ERR_INVALID,
                         "rope base %g: it must be finite and > 0 (or 0 for no rope)",
                         (double)rope_base);
    if (c->length > 0 && rope_base != c->rope_base)
        return kv_rope_mismatch(err, c->rope_base, "this append", rope_base);
    if (n_new == 0)
        return ATTN_OK;
    if (k == NULL || v == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "k and v must not be NULL");
    const attn_kv_config *cfg = &c->config;
    if (rope_base > 0.0f && cfg->head_dim % 2 != 0)
        return attn_fail(err, ATTN_ERR_INVALID, "rope needs an even head_dim; it is %lld",
                         (long long)cfg->head_dim);
    if (!append_size_fits(c, n_new))
        return attn_fail(err, ATTN_ERR_INVALID, "appending %lld positions is too large",
                         (long long)n_new);

    /* Every check first: nothing changes unless everything can. */
    attn_status s = check_values(c, "k", k, n_new, cfg->head_dim, false, err);
    if (s == ATTN_OK)
        s = check_values(c, "v", v, n_new, cfg->value_dim, false, err);
    if (s != ATTN_OK)
        return s;
    float *k_rot = NULL;
    if (rope_base > 0.0f) {
        s = rotated_keys(c, c->length, n_new, k, rope_base, &k_rot, err);
        if (s != ATTN_OK)
            return s;
        k = k_rot;
    }

    /* The new pages and, when they outgrow it, a new table: allocated
     * before anything is changed, and freed if one allocation fails. */
    const int64_t pages = pages_for(c->length + n_new);
    unsigned char **table = c->page;
    const int64_t cap = pages > c->capacity ? table_capacity(pages) : c->capacity;
    if (cap != c->capacity) {
        table = malloc((size_t)cap * sizeof *table);
        if (table != NULL && c->pages > 0)
            memcpy(table, c->page, (size_t)c->pages * sizeof *table);
    }
    int64_t made = c->pages;
    while (table != NULL && made < pages) {
        unsigned char *page = aligned_alloc(64, c->page_bytes);
        if (page == NULL)
            break;
        /* Zeroed: every byte a kernel may read (whole panel rows, past
         * the last position) is a finite number. */
        memset(page, 0, c->page_bytes);
        table[made++] = page;
    }
    if (table == NULL || made < pages) {
        for (int64_t p = c->pages; table != NULL && p < made; p++)
            free(table[p]);
        if (table != c->page)
            free(table);
        sdpa_free(k_rot);
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for %lld new pages of %zu bytes",
                         (long long)(pages - c->pages), c->page_bytes);
    }
    if (table != c->page) {
        free(c->page);
        c->page = table;
        c->capacity = cap;
    }
    c->pages = pages;

    /* Run by run, each within one page. */
    for (int64_t j = 0; j < n_new;) {
        const int64_t at = c->length + j;
        const int64_t run = ATTN_KV_PAGE - at % ATTN_KV_PAGE < n_new - j
                                ? ATTN_KV_PAGE - at % ATTN_KV_PAGE
                                : n_new - j;
        write_run(c, at, run, k, v, n_new, j);
        j += run;
    }
    if (c->length == 0)
        c->rope_base = rope_base;
    c->length += n_new;
    sdpa_free(k_rot);
    return ATTN_OK;
}

attn_status attn_kv_append_check(const attn_kv_cache *c, int64_t at, int64_t n_new,
                                 const float *k, float rope_base, attn_error *err)
{
    if (c == NULL || k == NULL || at < 0 || at > c->length || n_new < 0)
        return attn_fail(err, ATTN_ERR_INVALID, "attn_kv_append_check: bad arguments");
    const attn_kv_config *cfg = &c->config;
    if (n_new == 0 || !(rope_base > 0.0f) || cfg->head_dim % 2 != 0)
        return ATTN_OK;
    if (!append_size_fits(c, n_new))
        return attn_fail(err, ATTN_ERR_INVALID, "appending %lld positions is too large",
                         (long long)n_new);
    /* A rotated element is a cos + b sin of two elements of its row, so
     * |a| + |b| bounds it: keys under half the dtype's limit cannot
     * overflow, and need no rotation to tell (the usual case). A NaN
     * stops the scan and goes the long way, to be named. */
    const size_t count = (size_t)(cfg->num_kv_heads * n_new * cfg->head_dim);
    float big = 0.0f;
    for (size_t i = 0; i < count && !isnan(big); i++) {
        const float a = fabsf(k[i]);
        if (!(a <= big))
            big = a;
    }
    if (isnan(big))
        return check_values(c, "k", k, n_new, cfg->head_dim, false, err);
    if (kv_fits(cfg->dtype, 2.0f * big) && isfinite(2.0f * big))
        return ATTN_OK;
    float *k_rot = NULL;
    attn_status s = rotated_keys(c, at, n_new, k, rope_base, &k_rot, err);
    sdpa_free(k_rot);
    return s;
}

/* ------------------------------------------------------------------ read */

static float load(attn_kv_dtype dtype, const unsigned char *src, size_t at)
{
    uint16_t h;
    float f;
    switch (dtype) {
    case ATTN_KV_FLOAT16:
        memcpy(&h, src + at * 2, 2);
        return kv_f16_to_f32(h);
    case ATTN_KV_BFLOAT16:
        memcpy(&h, src + at * 2, 2);
        return kv_bf16_to_f32(h);
    case ATTN_KV_FLOAT32:
        break;
    }
    memcpy(&f, src + at * 4, 4);
    return f;
}

attn_status attn_kv_read(const attn_kv_cache *c, int64_t start, int64_t n, float *k, float *v,
                         attn_error *err)
{
    if (c == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "cache is NULL");
    if (start < 0 || n < 0 || start > c->length || n > c->length - start)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "positions [%lld, %lld) are not all cached (length %lld)",
                         (long long)start, (long long)(start + n), (long long)c->length);
    const attn_kv_config *cfg = &c->config;
    const int64_t d_k = cfg->head_dim, d_v = cfg->value_dim;
    for (int64_t g = 0; g < cfg->num_kv_heads; g++)
        for (int64_t j = 0; j < n; j++) {
            const int64_t pos = start + j, col = pos % ATTN_KV_PAGE;
            const unsigned char *block = kv_head_block(c, pos / ATTN_KV_PAGE, g);
            for (int64_t t = 0; k != NULL && t < d_k; t++)
                k[(g * n + j) * d_k + t] =
                    load(cfg->dtype, block, (size_t)(t * ATTN_KV_PAGE + col));
            for (int64_t t = 0; v != NULL && t < d_v; t++)
                v[(g * n + j) * d_v + t] =
                    load(cfg->dtype, block + c->v_offset, (size_t)(col * d_v + t));
        }
    return ATTN_OK;
}

/* "rotated with rope base 10000" or "not rotated (no rope)". */
static void rope_words(char *buf, size_t cap, float base)
{
    if (base > 0.0f)
        snprintf(buf, cap, "rotated with rope base %g", (double)base);
    else
        snprintf(buf, cap, "not rotated (no rope)");
}

attn_status kv_rope_mismatch(attn_error *err, float cached, const char *who, float asked)
{
    char was[64], want[64];
    rope_words(was, sizeof was, cached);
    rope_words(want, sizeof want, asked);
    return attn_fail(err, ATTN_ERR_INVALID,
                     "rope: the cached keys were appended %s; %s wants them %s", was, who, want);
}
