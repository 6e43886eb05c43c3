/* attn_parallel_for: a fork-join loop over independent work units.
 *
 * Each worker owns a contiguous share of the units (worker w the w-th of
 * `threads` equal shares) and takes them one at a time from the front of
 * it; a worker whose share is done goes on with the others' from their
 * fronts, so uneven units (causal query tiles, whose cost grows with the
 * row index) still balance themselves without a schedule. Owning a share
 * keeps a worker on the same units call after call, where a single shared
 * counter dealt them anew each time: the calling thread (worker 0) stays
 * on its core, so the rows it wrote last time are still in that core's
 * caches rather than the other's (a few percent of a batch of short
 * sequences). The others are started per call and joined before returning,
 * so no thread outlives the call and concurrent calls share nothing. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h"

/* One worker's share of the units: [next, end). A cache line each, so
 * that the workers' counters do not share one. */
typedef struct {
    _Alignas(64) atomic_int_fast64_t next;
    int64_t end;
} share;

/* Shares beyond this many workers: they only take from the others'. */
#define MAX_SHARES 64

typedef struct {
    void (*fn)(void *ctx, int64_t i, int worker);
    void *ctx;
    int shares;
    share share[MAX_SHARES];
} loop;

typedef struct {
    loop *shared;
    int worker;
    pthread_t thread;
} worker_slot;

/* Its own share first, then the others' in turn. */
static void run_units(loop *l, int worker)
{
    for (int k = 0; k < l->shares; k++) {
        share *s = &l->share[(worker + k) % l->shares];
        for (;;) {
            int64_t i = atomic_fetch_add_explicit(&s->next, 1, memory_order_relaxed);
            if (i >= s->end)
                break;
            l->fn(l->ctx, i, worker);
        }
    }
}

static void *worker_main(void *arg)
{
    worker_slot *slot = arg;
    run_units(slot->shared, slot->worker);
    return NULL;
}

void attn_parallel_for(int threads, int64_t count,
                       void (*fn)(void *ctx, int64_t i, int worker), void *ctx)
{
    if (count <= 0)
        return;
    int64_t want = threads < count ? threads : count;
    loop l = {.fn = fn, .ctx = ctx, .shares = want < MAX_SHARES ? (int)want : MAX_SHARES};
    for (int w = 0; w < l.shares; w++) {
        atomic_init(&l.share[w].next, count * w / l.shares);
        l.share[w].end = count * (w + 1) / l.shares;
    }
    worker_slot *slots = NULL;
    if (want > 1)
        slots = malloc((size_t)(want - 1) * sizeof *slots);
    /* Without the slots, or when threads cannot start, the calling thread
     * does the remaining work alone (the shares of workers that never
     * started included): slower, never wrong. */
    int started = 0;
    if (slots != NULL) {
        for (int64_t t = 1; t < want; t++) {
            worker_slot *s = &slots[started];
            s->shared = &l;
            s->worker = (int)t;
            if (pthread_create(&s->thread, NULL, worker_main, s) != 0)
                break;
            started++;
        }
    }
    run_units(&l, 0);
    for (int t = 0; t < started; t++)
        pthread_join(slots[t].thread, NULL);
    free(slots);
}
