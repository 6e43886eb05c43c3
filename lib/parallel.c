/* attn_parallel_for: a fork-join loop over independent work units.
 *
 * Units are handed out one at a time from a shared atomic counter, so uneven
 * units (causal query tiles, whose cost grows with the row index) balance
 * themselves across threads without a schedule. The calling thread is
 * worker 0; the others are started per call and joined before returning,
 * so no thread outlives the call and concurrent calls share nothing. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h"

typedef struct {
    void (*fn)(void *ctx, int64_t i, int worker);
    void *ctx;
    int64_t count;
    atomic_int_fast64_t next;
} loop;

typedef struct {
    loop *shared;
    int worker;
    pthread_t thread;
} worker_slot;

static void run_units(loop *l, int worker)
{
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&l->next, 1, memory_order_relaxed);
        if (i >= l->count)
            return;
        l->fn(l->ctx, i, worker);
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
    loop l = {.fn = fn, .ctx = ctx, .count = count};
    atomic_init(&l.next, 0);
    int64_t want = threads < count ? threads : count;
    worker_slot *slots = NULL;
    if (want > 1)
        slots = malloc((size_t)(want - 1) * sizeof *slots);
    /* Without the slots, or when threads cannot start, the calling thread
     * does the remaining work alone: slower, never wrong. */
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
