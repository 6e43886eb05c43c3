/*
 * The memory pool: large blocks that outlive the request they served.
 *
 * A request of n = 4096 holds tens of megabytes for a few hundred
 * milliseconds (its body, its decoded tensors, libattn's workspaces, its
 * results). Mapped anew for each request, every 4 KiB page of them is
 * first touched through a page fault, microseconds each on a virtual
 * machine: thousands per request. Here a block, once freed, stays mapped
 * with its pages in, on an idle list, and the next request of a similar
 * size takes it again without a fault.
 *
 * What the pool holds idle is bounded: by `limit` (the server sets it to
 * what the memory budget, --max-memory, leaves beside the requests that
 * have reserved their share), by age (pool_reap unmaps what has been idle
 * for long), and never more than a request could have used (a block is
 * reused only for a size it suits). What is idle longest goes first.
 *
 * Blocks of POOL_MIN_BLOCK bytes and more are mappings of their own, those
 * of 2 MiB and more aligned to 2 MiB and advised to be backed by huge pages
 * (where the kernel has transparent huge pages; advice only). Smaller ones
 * are the C library's, which reuses them well, but for two blocks of 1
 * to 64 KiB a thread keeps (below). Either way a block carries a
 * header in front of it, so that pool_free knows which it is; every block
 * is 64-byte aligned, as libattn's kernels want.
 */
#include "server.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Under AddressSanitizer an idle block is poisoned, so that a use after
 * pool_free is caught as it would be after free (ASan does not see into
 * the pool's own mappings otherwise). */
#if defined(__SANITIZE_ADDRESS__)
#define POOL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define POOL_ASAN 1
#endif
#endif
#ifdef POOL_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define HUGE_PAGE ((size_t)2 << 20)
/* A mapped block's header has a page of its own in front of the data, so
 * that the data can start on a 2 MiB boundary. */
#define MAPPED_HEADER ((size_t)4096)
/* A small block's header: one cache line, keeping the data aligned. */
#define SMALL_HEADER ((size_t)64)
/* malloc aligns for max_align_t (C11): this much more always reaches a
 * 64-byte boundary. */
#define SMALL_SLACK (SMALL_HEADER - _Alignof(max_align_t))
/* Mapped blocks below 2 MiB round up to this. */
#define SMALL_GRAIN ((size_t)64 << 10)

#define MAGIC_MAPPED 0x706f6f6c6d617000ull /* "poolmap" */
#define MAGIC_SMALL 0x706f6f6c736d6c00ull  /* "poolsml" */

typedef struct pool_block pool_block;
struct pool_block {
    uint64_t magic;
    size_t cap;          /* bytes of data the block has room for */
    size_t size;         /* bytes asked for (what a move must copy) */
    size_t map_len;      /* the whole mapping, header page included */
    double idle_since;   /* on the idle list: when it came back */
    bool lent;           /* taken by pool_realloc_idle: counted in lent_bytes */
    pool_block *next;    /* on the idle list: the next older one */
    void *raw;           /* a small block: what malloc returned, to free */
};
_Static_assert(sizeof(pool_block) <= SMALL_HEADER, "a header fits one cache line");

struct srv_pool {
    pthread_mutex_t lock;
    pool_block *idle;      /* most recently freed first */
    size_t idle_bytes;     /* the idle blocks' whole mappings */
    size_t busy_bytes;     /* the mappings handed out */
    size_t lent_bytes;     /* ... of them, those pool_realloc_idle handed out */
    size_t limit;          /* idle_bytes + lent_bytes stays within this */
    unsigned long maps, reuses;
};

static pool_block *header_of(void *p)
{
    pool_block *b = (pool_block *)(void *)((char *)p - SMALL_HEADER);
    if (b->magic == MAGIC_SMALL)
        return b;
    b = (pool_block *)(void *)((char *)p - MAPPED_HEADER);
    if (b->magic != MAGIC_MAPPED) {
        /* A pointer the pool never gave: a bug to stop at, not memory to
         * corrupt quietly. */
        fprintf(stderr, "attnd: pool_free of %p, which is not the pool's\n", p);
        abort();
    }
    return b;
}

static void *data_of_small(pool_block *b)
{
    return (char *)b + SMALL_HEADER;
}

static void *data_of(pool_block *b)
{
    return (char *)b + (b->magic == MAGIC_SMALL ? SMALL_HEADER : MAPPED_HEADER);
}

srv_pool *pool_new(size_t limit)
{
    srv_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->lock, NULL);
    p->limit = limit;
    return p;
}

/* Unmaps a list of blocks (outside the lock: munmap of a large block takes
 * a while, and nobody else needs to wait for it). */
static void unmap_list(pool_block *b)
{
    while (b) {
        pool_block *next = b->next;
        UNPOISON((char *)b + MAPPED_HEADER, b->cap); /* the addresses may be mapped again */
        munmap(b, b->map_len);
        b = next;
    }
}

/* Takes idle blocks off, oldest first, until idle_bytes + lent_bytes +
 * room <= limit; returns them for unmap_list. Lock held. */
static pool_block *evict(srv_pool *p, size_t room)
{
    pool_block *out = NULL;
    while (p->idle && p->idle_bytes + p->lent_bytes + room > p->limit) {
        /* the oldest is at the tail */
        pool_block **at = &p->idle;
        while ((*at)->next)
            at = &(*at)->next;
        pool_block *b = *at;
        *at = NULL;
        p->idle_bytes -= b->map_len;
        b->next = out;
        out = b;
    }
    return out;
}

void pool_destroy(srv_pool *p)
{
    if (!p)
        return;
    unmap_list(p->idle);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* A new mapping for at least n bytes of data, its data on a 2 MiB boundary
 * when it is that large. */
static pool_block *map_block(size_t n)
{
    size_t cap = n >= HUGE_PAGE ? (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE
                                : (n + SMALL_GRAIN - 1) / SMALL_GRAIN * SMALL_GRAIN;
    if (cap < n)
        return NULL; /* overflowed */
    size_t len = MAPPED_HEADER + cap;
    size_t slack = cap >= HUGE_PAGE ? HUGE_PAGE : 0;
    if (len + slack < len)
        return NULL;
    char *raw = mmap(NULL, len + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *base = raw;
    if (slack) {
        /* the data on the first 2 MiB boundary past the header page; the
         * rest of the slack is given back on either side */
        uintptr_t data = ((uintptr_t)raw + MAPPED_HEADER + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        base = (char *)(data - MAPPED_HEADER);
        if (base > raw)
            munmap(raw, (size_t)(base - raw));
        size_t tail = (size_t)(raw + len + slack - (base + len));
        if (tail)
            munmap(base + len, tail);
#ifdef MADV_HUGEPAGE
        /* advice only: where the kernel has no huge pages nothing changes */
        (void)madvise(base + MAPPED_HEADER, cap, MADV_HUGEPAGE);
#endif
    }
    pool_block *b = (pool_block *)(void *)base;
    *b = (pool_block){.magic = MAGIC_MAPPED, .cap = cap, .map_len = len};
    return b;
}

/* May an idle block of `cap` serve `n` bytes? Not one more than twice as
 * large (beyond a huge page's rounding): that would pin memory the request
 * does not use and leave a larger request to map its own. */
static bool suits(size_t cap, size_t n)
{
    return cap >= n && cap - n <= (n > HUGE_PAGE ? n : HUGE_PAGE);
}

/* The best fit among the idle blocks for n bytes (the smallest that suits
 * it), taken off the idle list and counted busy; NULL if none suits. The
 * lock is held. */
static pool_block *take_idle(srv_pool *p, size_t n)
{
    pool_block **best = NULL;
    for (pool_block **at = &p->idle; *at; at = &(*at)->next)
        if (suits((*at)->cap, n) && (!best || (*at)->cap < (*best)->cap))
            best = at;
    if (!best)
        return NULL;
    pool_block *b = *best;
    *best = b->next;
    p->idle_bytes -= b->map_len;
    p->busy_bytes += b->map_len;
    p->reuses++;
    return b;
}

/*
 * Each thread keeps the last SPARES small blocks of SPARE_MIN to SPARE_MAX
 * bytes it freed, for its next ones of about those sizes: a request's call
 * (api_call_new, ~6 KB) and its answer text are such blocks, and past the C
 * library's per-thread caches each took its shared heap's slower path (and
 * made it first merge the small chunks freed since). A block of up to twice
 * the size asked for is taken. Freed when the thread ends.
 */
#define SPARE_MIN ((size_t)1 << 10)
#define SPARE_MAX ((size_t)64 << 10)
#define SPARES 2
static _Thread_local pool_block *spare[SPARES];
static _Thread_local bool spare_registered;
static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;

/* The key's destructor, at the thread's end (its variables are still
 * there then). */
static void spare_drop(void *unused)
{
    (void)unused;
    for (int i = 0; i < SPARES; i++) {
        if (spare[i]) {
            UNPOISON(data_of_small(spare[i]), spare[i]->cap);
            free(spare[i]->raw);
        }
        spare[i] = NULL;
    }
}

static void spare_key_init(void)
{
    (void)pthread_key_create(&spare_key, spare_drop);
}

/* Whether this thread's spares will be freed when it ends. */
static bool spare_key_set(void)
{
    if (!spare_registered)
        spare_registered = pthread_once(&spare_once, spare_key_init) == 0 &&
                           pthread_setspecific(spare_key, &spare_registered) == 0;
    return spare_registered;
}

/* A kept block for n bytes (taken from the thread's spares), or NULL. */
static pool_block *spare_take(size_t n)
{
    for (int i = 0; i < SPARES; i++) {
        pool_block *b = spare[i];
        if (b && b->cap >= n && b->cap / 2 <= n) {
            spare[i] = NULL;
            return b;
        }
    }
    return NULL;
}

/* Whether the freed small block b is kept (in an empty spare slot). */
static bool spare_keep(pool_block *b)
{
    if (b->cap < SPARE_MIN || b->cap > SPARE_MAX)
        return false;
    for (int i = 0; i < SPARES; i++)
        if (!spare[i] && spare_key_set()) {
            POISON(data_of_small(b), b->cap);
            spare[i] = b;
            return true;
        }
    return false;
}

void *pool_alloc(srv_pool *p, size_t n)
{
    if (n < POOL_MIN_BLOCK) {
        /* malloc and a step to the next 64-byte boundary, not
         * aligned_alloc: glibc's memalign splits a larger chunk every time,
         * several times the cost of a malloc served from its per-thread
         * cache, and a small request makes a handful of these. */
        size_t need = (n + 63) / 64 * 64 + SMALL_HEADER;
        pool_block *kept = spare_take(n);
        if (kept) {
            kept->magic = MAGIC_SMALL;
            kept->size = n;
            UNPOISON(data_of(kept), kept->cap);
            return data_of(kept);
        }
        void *raw = malloc(need + SMALL_SLACK);
        if (!raw)
            return NULL;
        pool_block *b = (pool_block *)(void *)((char *)raw +
                                               (-(uintptr_t)raw & (SMALL_HEADER - 1)));
        *b = (pool_block){.magic = MAGIC_SMALL, .cap = need - SMALL_HEADER, .size = n,
                          .raw = raw};
        return data_of(b);
    }
    pthread_mutex_lock(&p->lock);
    pool_block *b = take_idle(p, n);
    pthread_mutex_unlock(&p->lock);
    if (!b) {
        if (!(b = map_block(n)))
            return NULL;
        pthread_mutex_lock(&p->lock);
        p->busy_bytes += b->map_len;
        p->maps++;
        pthread_mutex_unlock(&p->lock);
    }
    b->next = NULL;
    b->size = n;
    UNPOISON(data_of(b), b->cap);
    return data_of(b);
}

void pool_free(srv_pool *p, void *ptr)
{
    if (!ptr)
        return;
    pool_block *b = header_of(ptr);
    if (b->magic == MAGIC_SMALL) {
        b->magic = 0; /* a second pool_free of it stops in header_of */
        if (!spare_keep(b))
            free(b->raw);
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->busy_bytes -= b->map_len;
    if (b->lent) {
        p->lent_bytes -= b->map_len;
        b->lent = false;
    }
    pool_block *drop = NULL;
    if (b->map_len + p->lent_bytes <= p->limit) {
        POISON(ptr, b->cap);
        drop = evict(p, b->map_len);
        b->idle_since = srv_now();
        b->next = p->idle;
        p->idle = b;
        p->idle_bytes += b->map_len;
    } else {
        b->next = NULL;
        drop = b; /* it could never be kept */
    }
    pthread_mutex_unlock(&p->lock);
    unmap_list(drop);
}

/* Unmaps a mapped block at once instead of keeping it idle; frees a small
 * one. */
static void drop(srv_pool *p, void *ptr)
{
    pool_block *b = header_of(ptr);
    if (b->magic == MAGIC_SMALL) {
        pool_free(p, ptr);
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->busy_bytes -= b->map_len;
    if (b->lent)
        p->lent_bytes -= b->map_len;
    pthread_mutex_unlock(&p->lock);
    b->next = NULL;
    unmap_list(b);
}

void *pool_grow(srv_pool *p, void *ptr, size_t n)
{
    pool_block *b = ptr ? header_of(ptr) : NULL;
    if (!b || n <= b->cap)
        return pool_realloc(p, ptr, n);
    void *moved = pool_alloc(p, n);
    if (!moved)
        return NULL;
    memcpy(moved, ptr, b->size < n ? b->size : n);
    drop(p, ptr);
    return moved;
}

void *pool_realloc(srv_pool *p, void *ptr, size_t n)
{
    if (!ptr)
        return pool_alloc(p, n);
    pool_block *b = header_of(ptr);
    if (n <= b->cap && (b->magic == MAGIC_MAPPED || n + SMALL_HEADER >= b->cap / 2)) {
        /* it fits (a small block is moved when it would shrink to less than
         * half: the C library's memory goes back for its other uses) */
        b->size = n;
        return ptr;
    }
    void *moved = pool_alloc(p, n);
    if (!moved)
        return NULL;
    memcpy(moved, ptr, b->size < n ? b->size : n);
    pool_free(p, ptr);
    return moved;
}

void *pool_realloc_idle(srv_pool *p, void *ptr, size_t n)
{
    pthread_mutex_lock(&p->lock);
    pool_block *b = take_idle(p, n);
    if (b) {
        p->lent_bytes += b->map_len;
        b->lent = true;
    }
    pthread_mutex_unlock(&p->lock);
    if (!b)
        return NULL;
    b->next = NULL;
    b->size = n;
    UNPOISON(data_of(b), b->cap);
    if (ptr) {
        pool_block *old = header_of(ptr);
        memcpy(data_of(b), ptr, old->size < n ? old->size : n);
        pool_free(p, ptr);
    }
    return data_of(b);
}

size_t pool_block_size(void *ptr)
{
    return header_of(ptr)->cap;
}

void pool_set_limit(srv_pool *p, size_t limit)
{
    pthread_mutex_lock(&p->lock);
    p->limit = limit;
    pool_block *drop = evict(p, 0);
    pthread_mutex_unlock(&p->lock);
    unmap_list(drop);
}

void pool_reap(srv_pool *p, double idle_seconds)
{
    double before = srv_now() - idle_seconds;
    pthread_mutex_lock(&p->lock);
    pool_block *drop = NULL;
    /* most recently freed first: from the first one idle too long, all are */
    pool_block **at = &p->idle;
    while (*at && (*at)->idle_since > before)
        at = &(*at)->next;
    drop = *at;
    *at = NULL;
    for (pool_block *b = drop; b; b = b->next)
        p->idle_bytes -= b->map_len;
    pthread_mutex_unlock(&p->lock);
    unmap_list(drop);
}

pool_stats pool_get_stats(srv_pool *p)
{
    pthread_mutex_lock(&p->lock);
    pool_stats s = {.idle_bytes = p->idle_bytes, .busy_bytes = p->busy_bytes,
                    .lent_bytes = p->lent_bytes, .limit = p->limit, .maps = p->maps,
                    .reuses = p->reuses};
    for (pool_block *b = p->idle; b; b = b->next)
        s.idle_blocks++;
    pthread_mutex_unlock(&p->lock);
    return s;
}

/* The process's pool: libattn's and the codec's allocations reach it
 * through function pointers that are the process's, so there is one, made
 * at the first server's start and never freed (limit 0 empties it). */
static srv_pool *shared;
static pthread_once_t shared_once = PTHREAD_ONCE_INIT;

static void shared_init(void)
{
    shared = pool_new(0);
}

srv_pool *pool_shared(void)
{
    pthread_once(&shared_once, shared_init);
    return shared;
}
