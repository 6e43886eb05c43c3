/*
 * The KV caches a server holds (cache_store.c), private to api/: a table of
 * libattn caches by id, one budget of bytes over all of them, and the order
 * in which they were last used.
 *
 * A request holds a cache from cache_acquire to cache_release (a count, so
 * that a cache deleted or found expired while a request uses it is freed by
 * the last of them). A held cache is busy: it is never evicted nor expired,
 * and the budget's room is found by evicting idle caches, least recently
 * used first. Changes to one cache are serialised by its turn
 * (cache_turn_begin / cache_turn_end): first come, first served.
 */
#ifndef API_CACHE_STORE_H
#define API_CACHE_STORE_H

#include "api.h"
#include "attn.h"

#include <pthread.h>

/* 128 random bits in base64url without padding: 22 characters; an id
 * given by a load balancer may have up to CACHE_ID_MAX. */
#define CACHE_ID_LEN 22
#define CACHE_ID_MAX 64

typedef struct cache_entry cache_entry;

struct cache_entry {
    char id[CACHE_ID_MAX + 1];
    char *owner;        /* the API key that made it, or NULL */
    attn_kv_cache *kv;
    attn_kv_config config; /* the cache's, fixed: read without its turn */
    size_t bytes;       /* counted in the store's budget: attn_kv_bytes(kv) */
    double max_key_norm; /* an upper bound of every cached key's Euclidean norm
                          * (read and written in the cache's turn) */
    int64_t length;     /* attn_kv_length(kv) at the last settle (store's lock) */
    /* below: the store's, under its lock */
    double last_used;   /* monotonic seconds */
    int refs;           /* requests holding it */
    bool removed;       /* out of the table (deleted, evicted, expired) */
    cache_entry *older, *newer; /* the use order, oldest first */
    cache_entry *next_in_bucket;
    /* the turn: tickets handed out in order, served in order */
    pthread_mutex_t turn_lock;
    pthread_cond_t turn_cond;
    uint64_t next_ticket, serving;
};

/* A new cache of this configuration in the table, held (refs 1); NULL with
 * err filled: 503 cache_memory_full (nothing idle to evict), 422 when it
 * could never fit, 500 out of memory. Its id is 128 random bits, or `id`
 * when given (a load balancer's choice, see api_cache_create): 400 when it
 * is not 16 to 64 base64url characters, 409 cache_exists when taken. */
cache_entry *cache_create(api_caches *s, const attn_kv_config *config, const char *owner,
                          const char *id, api_error *err);

/* The cache `id` held for a request of `owner`; NULL with 404
 * cache_not_found when there is none for this owner. */
cache_entry *cache_acquire(api_caches *s, const char *id, const char *owner, api_error *err);

/* Lets go of a held cache (NULL is fine); the last holder of a removed cache
 * frees it and gives its bytes back to the budget. */
void cache_release(api_caches *s, cache_entry *e);

/* Takes the cache out of the table (DELETE); its memory goes when its
 * last holder lets go. */
void cache_remove(api_caches *s, cache_entry *e);

/* Waits for this request's turn on the cache, and ends it. Turns go in the
 * order requests ask for them, which for requests from different
 * connections is about the order they arrived (two taken off the compute
 * queue together may ask in either order). */
void cache_turn_begin(cache_entry *e);
void cache_turn_end(cache_entry *e);
/* Begins this request's turn only if nobody holds or awaits one: true when
 * it did (cache_turn_end ends it), false when cache_turn_begin would have
 * waited (nothing changed). */
bool cache_turn_try_begin(cache_entry *e);

/* During a turn: makes room for the cache to hold `delta` more bytes,
 * evicting idle caches as needed (503 cache_memory_full when they are not
 * enough, 422 when the cache alone would not fit); and says what it holds
 * after a change (a truncate, a failed append). */
bool cache_reserve(api_caches *s, cache_entry *e, size_t delta, api_error *err);
void cache_settle(api_caches *s, cache_entry *e);

/* The length and bytes as of the last change (outside the cache's turn,
 * where reading the cache itself would race with a change). */
int64_t cache_length(api_caches *s, cache_entry *e);
size_t cache_bytes(api_caches *s, cache_entry *e);

#endif /* API_CACHE_STORE_H */
