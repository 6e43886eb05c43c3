/*
 * The life of a KV cache: POST /v1/caches makes one, GET /v1/caches/{id}
 * says what it holds, DELETE /v1/caches/{id} drops it. Each is a few
 * microseconds of work, answered at once; appending and attending are
 * cache_attention.c's.
 *
 * The cache object, in every answer:
 *   {"id", "num_kv_heads", "head_dim", "value_dim", "dtype", "length", "bytes"}
 */
#include "cache_store.h"
#include "request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { F_NUM_KV_HEADS, F_HEAD_DIM, F_VALUE_DIM, F_DTYPE, F_COUNT };

static const api_field create_fields[] = {
    [F_NUM_KV_HEADS] = {"num_kv_heads", API_FIELD_INTEGER, true},
    [F_HEAD_DIM] = {"head_dim", API_FIELD_INTEGER, true},
    [F_VALUE_DIM] = {"value_dim", API_FIELD_INTEGER, false},
    [F_DTYPE] = {"dtype", API_FIELD_DTYPE, false},
};

/* Larger heads or widths than any model has; a bound that keeps a page's
 * size (64 x heads x (head_dim + value_dim) x 4 bytes) far from overflow. */
#define MAX_DIM 65536

static bool check_dim(const api_value *v, const char *field, api_error *err)
{
    if (v->integer >= 1 && v->integer <= MAX_DIM)
        return true;
    return api_fail(err, 422, "invalid_value", field, "%s must be in [1, %d], got %lld", field,
                    MAX_DIM, (long long)v->integer);
}

/* The cache object into res as a 200 (or `status`) answer. */
static void respond_cache(api_response *res, int status, const cache_entry *e,
                          const attn_kv_config *config, int64_t length, size_t bytes)
{
    char text[480];
    int n = snprintf(text, sizeof text,
                     "{\"id\":\"%s\",\"num_kv_heads\":%lld,\"head_dim\":%lld,\"value_dim\":%lld,"
                     "\"dtype\":\"%s\",\"length\":%lld,\"bytes\":%zu}",
                     e->id, (long long)config->num_kv_heads, (long long)config->head_dim,
                     (long long)config->value_dim, attn_kv_dtype_name(config->dtype),
                     (long long)length, bytes);
    res->body = malloc((size_t)n + 1);
    if (!res->body) {
        api_error err;
        api_fail(&err, 500, "out_of_memory", "", "out of memory for the answer");
        api_respond_error(res, &err);
        return;
    }
    memcpy(res->body, text, (size_t)n + 1);
    res->body_len = (size_t)n;
    res->body_cap = (size_t)n + 1;
    res->status = status;
}

static attn_kv_dtype kv_dtype(codec_dtype d)
{
    switch (d) {
    case CODEC_F16: return ATTN_KV_FLOAT16;
    case CODEC_BF16: return ATTN_KV_BFLOAT16;
    default: return ATTN_KV_FLOAT32;
    }
}

void api_cache_create(const char *body, size_t len, const api_limits *lim, api_response *res)
{
    memset(res, 0, sizeof *res);
    api_error err = {0};
    api_value f[F_COUNT] = {0};
    codec_span spans[API_MAX_FIELDS];
    codec_doc doc; /* filled by api_check_body whatever it finds */
    const char *text = body ? body : "";
    bool ok = api_check_body(&doc, text, len, spans, &err) &&
              api_read_fields(&doc, create_fields, F_COUNT, NULL, 0, NULL, f, &err) &&
              check_dim(&f[F_NUM_KV_HEADS], "num_kv_heads", &err) &&
              check_dim(&f[F_HEAD_DIM], "head_dim", &err) &&
              (!f[F_VALUE_DIM].present || check_dim(&f[F_VALUE_DIM], "value_dim", &err));
    attn_kv_config config = {0};
    if (ok)
        config = (attn_kv_config){
            .num_kv_heads = f[F_NUM_KV_HEADS].integer,
            .head_dim = f[F_HEAD_DIM].integer,
            .value_dim = f[F_VALUE_DIM].present ? f[F_VALUE_DIM].integer
                                                : f[F_HEAD_DIM].integer,
            .dtype = f[F_DTYPE].present ? kv_dtype(f[F_DTYPE].dtype) : ATTN_KV_FLOAT32,
        };
    api_values_free(f, F_COUNT);
    const char *id = lim->cache_id && lim->cache_id[0] ? lim->cache_id : NULL;
    cache_entry *e = ok ? cache_create(lim->caches, &config, lim->owner, id, &err) : NULL;
    if (!e) {
        api_respond_error(res, &err);
        return;
    }
    respond_cache(res, 201, e, &config, 0, cache_bytes(lim->caches, e));
    if (res->status == 201)
        snprintf(res->location, sizeof res->location, "/v1/caches/%s", e->id);
    else /* no answer could be written: the client will never know the id */
        cache_remove(lim->caches, e);
    cache_release(lim->caches, e);
}

void api_cache_get(const api_limits *lim, api_response *res)
{
    memset(res, 0, sizeof *res);
    api_error err = {0};
    cache_entry *e = cache_acquire(lim->caches, lim->cache_id, lim->owner, &err);
    if (!e) {
        api_respond_error(res, &err);
        return;
    }
    respond_cache(res, 200, e, &e->config, cache_length(lim->caches, e),
                  cache_bytes(lim->caches, e));
    cache_release(lim->caches, e);
}

void api_cache_delete(const api_limits *lim, api_response *res)
{
    memset(res, 0, sizeof *res);
    api_error err = {0};
    cache_entry *e = cache_acquire(lim->caches, lim->cache_id, lim->owner, &err);
    if (!e) {
        api_respond_error(res, &err);
        return;
    }
    cache_remove(lim->caches, e);
    cache_release(lim->caches, e);
    res->status = 204;
}
