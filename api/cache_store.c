/*
 * The KV caches of a server: a hash table by id, a list in order of last
 * use, and one budget of bytes (--cache-memory) over every cache.
 *
 * Why a budget with eviction rather than a refusal: a decoding client that
 * goes away without deleting its cache leaves it behind, and a server that
 * refused new caches until --cache-idle passed would be stalled by one
 * careless client. So room is made by dropping the caches nobody has used
 * for longest, and only caches in use right now (held by a request) are
 * safe: when nothing idle is left to drop, the answer is 503 with
 * Retry-After, since the busy caches will be idle soon.
 *
 * Idle expiry (--cache-idle) is judged whenever the store is entered (every
 * cache request, and every /metrics scrape through api_caches_stats_get):
 * the oldest entries of the use list are the only candidates, so a sweep
 * costs only what it drops.
 */
#include "cache_store.h"
#include "request.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* Buckets of the id table: ids are random, so their first bytes spread
 * them evenly; chains grow only past tens of thousands of caches. */
#define BUCKETS 4096

struct api_caches {
    pthread_mutex_t lock;
    double memory;       /* the budget, bytes (<= 0: no cache may be made) */
    double idle_seconds; /* an idle cache older than this is dropped (<= 0: never) */
    size_t bytes;        /* every cache's, those removed but still held included */
    int64_t count;       /* in the table */
    uint64_t evicted_memory, evicted_idle;
    cache_entry *oldest, *newest; /* the use list: every entry in the table */
    cache_entry *bucket[BUCKETS];
};

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

api_caches *api_caches_new(double memory, double idle_seconds)
{
    api_caches *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    pthread_mutex_init(&s->lock, NULL);
    s->memory = memory;
    s->idle_seconds = idle_seconds;
    return s;
}

static void entry_free(cache_entry *e)
{
    attn_kv_free(e->kv);
    free(e->owner);
    pthread_mutex_destroy(&e->turn_lock);
    pthread_cond_destroy(&e->turn_cond);
    free(e);
}

void api_caches_free(api_caches *s)
{
    if (!s)
        return;
    for (cache_entry *e = s->oldest, *next; e; e = next) {
        next = e->newer;
        entry_free(e);
    }
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static unsigned bucket_of(const char *id)
{
    unsigned h = 2166136261u; /* FNV-1a over the id's text */
    for (const char *p = id; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    return h % BUCKETS;
}

/* --------------------------------------------- the use list (store locked) */

static void unlink_use(api_caches *s, cache_entry *e)
{
    if (e->older)
        e->older->newer = e->newer;
    else
        s->oldest = e->newer;
    if (e->newer)
        e->newer->older = e->older;
    else
        s->newest = e->older;
    e->older = e->newer = NULL;
}

static void push_newest(api_caches *s, cache_entry *e)
{
    e->older = s->newest;
    e->newer = NULL;
    if (s->newest)
        s->newest->newer = e;
    else
        s->oldest = e;
    s->newest = e;
}

static void touch(api_caches *s, cache_entry *e)
{
    e->last_used = now_seconds();
    unlink_use(s, e);
    push_newest(s, e);
}

/* Out of the table and the list; freed now when nobody holds it. */
static void take_out(api_caches *s, cache_entry *e)
{
    cache_entry **p = &s->bucket[bucket_of(e->id)];
    while (*p && *p != e)
        p = &(*p)->next_in_bucket;
    if (*p)
        *p = e->next_in_bucket;
    unlink_use(s, e);
    e->removed = true;
    s->count--;
    if (e->refs == 0) {
        s->bytes -= e->bytes;
        entry_free(e);
    }
}

/* Drops the idle caches unused for longer than --cache-idle. */
static void sweep(api_caches *s)
{
    if (s->idle_seconds <= 0)
        return;
    double before = now_seconds() - s->idle_seconds;
    for (cache_entry *e = s->oldest, *next; e && e->last_used < before; e = next) {
        next = e->newer;
        if (e->refs == 0) {
            take_out(s, e);
            s->evicted_idle++;
        }
    }
}

/* Evicts idle caches, least recently used first (never `keep`), until
 * `delta` more bytes fit; false when they are not enough. */
static bool make_room(api_caches *s, size_t delta, const cache_entry *keep)
{
    cache_entry *e = s->oldest;
    while ((double)s->bytes + (double)delta > s->memory) {
        while (e && (e->refs > 0 || e == keep))
            e = e->newer;
        if (!e)
            return false;
        cache_entry *next = e->newer;
        take_out(s, e);
        s->evicted_memory++;
        e = next;
    }
    return true;
}

static bool full(api_error *err, size_t delta, const api_caches *s)
{
    return api_fail(err, 503, "cache_memory_full", "",
                    "the KV caches need %zu more bytes and the %.0f bytes of --cache-memory "
                    "are held by caches in use right now; retry shortly, or delete caches "
                    "you no longer need",
                    delta, s->memory);
}

/* ----------------------------------------------------------- the table */

static bool new_id(char *id)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    unsigned char bits[16];
    size_t got = 0;
    while (got < sizeof bits) {
        ssize_t n = getrandom(bits + got, sizeof bits - got, 0);
        if (n < 0 && errno != EINTR)
            return false;
        if (n > 0)
            got += (size_t)n;
    }
    /* 128 bits, six at a time: 21 full characters and the last 2 bits. */
    unsigned acc = 0, have = 0;
    int out = 0;
    for (size_t i = 0; i < sizeof bits; i++) {
        acc = acc << 8 | bits[i];
        have += 8;
        while (have >= 6) {
            id[out++] = alphabet[acc >> (have - 6) & 63];
            have -= 6;
        }
    }
    id[out++] = alphabet[(acc << (6 - have)) & 63];
    id[out] = '\0';
    return out == CACHE_ID_LEN;
}

static cache_entry *find(const api_caches *s, const char *id)
{
    for (cache_entry *e = s->bucket[bucket_of(id)]; e; e = e->next_in_bucket)
        if (!strcmp(e->id, id))
            return e;
    return NULL;
}

/* Whether `owner` may use a cache made by `made_by`: the same key, or no
 * keys at all. Every byte is compared, so the time says nothing of where
 * two keys differ. */
static bool same_owner(const char *made_by, const char *owner)
{
    if (!made_by || !owner)
        return !made_by && !owner;
    size_t la = strlen(made_by), lb = strlen(owner);
    unsigned char diff = la != lb;
    for (size_t i = 0; i < la && i < lb; i++)
        diff |= (unsigned char)(made_by[i] ^ owner[i]);
    return diff == 0;
}

/* An id given by the caller: 16 to 64 base64url characters (a load
 * balancer's 32 hex digits are). */
static bool id_text(const char *id)
{
    size_t n = strspn(id, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_");
    return id[n] == '\0' && n >= 16 && n <= CACHE_ID_MAX;
}

cache_entry *cache_create(api_caches *s, const attn_kv_config *config, const char *owner,
                          const char *id, api_error *err)
{
    if (id && !id_text(id)) {
        api_fail(err, 400, "invalid_value", "X-Cache-Id",
                 "X-Cache-Id must be 16 to %d characters of A-Z, a-z, 0-9, - and _ "
                 "(it becomes the cache's id)", CACHE_ID_MAX);
        return NULL;
    }
    size_t bytes = attn_kv_bytes_empty(config);
    if ((double)bytes > s->memory) {
        api_fail(err, 422, "cache_memory_limit", "",
                 "an empty cache of this shape takes %zu bytes, more than this server's "
                 "--cache-memory of %.0f bytes",
                 bytes, s->memory);
        return NULL;
    }
    cache_entry *e = calloc(1, sizeof *e);
    attn_error ae = {0};
    if (e && id)
        snprintf(e->id, sizeof e->id, "%s", id);
    if (!e || (owner && !(e->owner = strdup(owner))) || (!id && !new_id(e->id)) ||
        attn_kv_create(config, &e->kv, &ae) != ATTN_OK) {
        if (ae.status != ATTN_OK && ae.status != ATTN_ERR_NOMEM)
            api_fail_attn(err, &ae);
        else
            api_fail(err, 500, "out_of_memory", "", "out of memory for a new cache");
        if (e) {
            attn_kv_free(e->kv);
            free(e->owner);
        }
        free(e);
        return NULL;
    }
    pthread_mutex_init(&e->turn_lock, NULL);
    pthread_cond_init(&e->turn_cond, NULL);
    e->config = *config;
    e->bytes = attn_kv_bytes(e->kv);
    e->refs = 1;
    pthread_mutex_lock(&s->lock);
    sweep(s);
    bool taken = find(s, e->id) != NULL;
    bool room = !taken && make_room(s, e->bytes, NULL);
    if (room) {
        s->bytes += e->bytes;
        s->count++;
        unsigned b = bucket_of(e->id);
        e->next_in_bucket = s->bucket[b];
        s->bucket[b] = e;
        e->last_used = now_seconds();
        push_newest(s, e);
    }
    pthread_mutex_unlock(&s->lock);
    if (taken)
        api_fail(err, 409, "cache_exists", "X-Cache-Id",
                 "a cache with the id %s exists already; leave X-Cache-Id out for a random id",
                 e->id);
    else if (!room)
        full(err, e->bytes, s);
    if (!room) {
        entry_free(e);
        return NULL;
    }
    return e;
}

cache_entry *cache_acquire(api_caches *s, const char *id, const char *owner, api_error *err)
{
    pthread_mutex_lock(&s->lock);
    sweep(s);
    cache_entry *e = id ? find(s, id) : NULL;
    if (e && same_owner(e->owner, owner)) {
        e->refs++;
        touch(s, e);
    } else {
        e = NULL;
    }
    pthread_mutex_unlock(&s->lock);
    if (!e)
        api_fail(err, 404, "cache_not_found", "",
                 "no KV cache %s%.40s%s here: it was never made, or was deleted, evicted "
                 "or dropped after --cache-idle (create a new one with POST /v1/caches)",
                 id ? "\"" : "", id ? id : "", id ? "\"" : "");
    return e;
}

void cache_release(api_caches *s, cache_entry *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&s->lock);
    if (--e->refs == 0 && e->removed) {
        s->bytes -= e->bytes;
        entry_free(e);
    } else if (!e->removed) {
        touch(s, e); /* idle from now on: its idle time counts from here */
    }
    pthread_mutex_unlock(&s->lock);
}

void cache_remove(api_caches *s, cache_entry *e)
{
    pthread_mutex_lock(&s->lock);
    if (!e->removed)
        take_out(s, e); /* held by the caller: freed at its release */
    pthread_mutex_unlock(&s->lock);
}

void cache_turn_begin(cache_entry *e)
{
    pthread_mutex_lock(&e->turn_lock);
    uint64_t mine = e->next_ticket++;
    while (e->serving != mine)
        pthread_cond_wait(&e->turn_cond, &e->turn_lock);
    pthread_mutex_unlock(&e->turn_lock);
}

bool cache_turn_try_begin(cache_entry *e)
{
    pthread_mutex_lock(&e->turn_lock);
    bool free_now = e->serving == e->next_ticket;
    if (free_now)
        e->next_ticket++;
    pthread_mutex_unlock(&e->turn_lock);
    return free_now;
}

void cache_turn_end(cache_entry *e)
{
    pthread_mutex_lock(&e->turn_lock);
    e->serving++;
    pthread_cond_broadcast(&e->turn_cond);
    pthread_mutex_unlock(&e->turn_lock);
}

bool cache_reserve(api_caches *s, cache_entry *e, size_t delta, api_error *err)
{
    if ((double)e->bytes + (double)delta > s->memory)
        return api_fail(err, 422, "cache_memory_limit", "k",
                        "this append would make the cache %zu bytes, more than this "
                        "server's --cache-memory of %.0f bytes for every cache together",
                        e->bytes + delta, s->memory);
    pthread_mutex_lock(&s->lock);
    bool room = make_room(s, delta, e);
    if (room) {
        s->bytes += delta;
        e->bytes += delta;
    }
    pthread_mutex_unlock(&s->lock);
    return room || full(err, delta, s);
}

void cache_settle(api_caches *s, cache_entry *e)
{
    size_t held = attn_kv_bytes(e->kv);
    pthread_mutex_lock(&s->lock);
    s->bytes = s->bytes - e->bytes + held;
    e->bytes = held;
    e->length = attn_kv_length(e->kv);
    pthread_mutex_unlock(&s->lock);
}

int64_t cache_length(api_caches *s, cache_entry *e)
{
    pthread_mutex_lock(&s->lock);
    int64_t n = e->length;
    pthread_mutex_unlock(&s->lock);
    return n;
}

size_t cache_bytes(api_caches *s, cache_entry *e)
{
    pthread_mutex_lock(&s->lock);
    size_t n = e->bytes;
    pthread_mutex_unlock(&s->lock);
    return n;
}

void api_caches_stats_get(api_caches *s, api_caches_stats *st)
{
    pthread_mutex_lock(&s->lock);
    sweep(s);
    *st = (api_caches_stats){.caches = s->count, .bytes = (double)s->bytes,
                             .evicted_memory = s->evicted_memory,
                             .evicted_idle = s->evicted_idle};
    pthread_mutex_unlock(&s->lock);
}
