/*
 * The bounded compute queue. At most `threads` requests compute at once and
 * at most `queue` more wait for a slot; beyond that a request is refused at
 * once (503 overloaded) rather than left to time out.
 *
 * What runs where is decided by the request's estimated work (api_cost.work,
 * from its shapes), never by the size of its body: the I/O threads must
 * answer /healthz, /readyz and /metrics within milliseconds whatever the
 * compute requests ask for (a 4 KB multi-head body can ask for seconds).
 *   - A body whose decoding is itself tiny work is decoded and costed on
 *     the I/O thread that read it. If the whole request is tiny too
 *     (INLINE_MAX_WORK, about a tenth of a millisecond) and a slot is free
 *     with nobody waiting, it is computed right there: handing microseconds
 *     of work to a worker would cost two thread wake-ups and the suspension
 *     of the connection, more than the attention itself. It takes a slot
 *     like any other, so it counts against --threads and --queue. A step
 *     over a KV cache is computed there only when the cache's turn is free
 *     at that moment (api_execute_now): an I/O thread never waits for a
 *     turn that another request holds, however long that one computes.
 *   - Everything else waits in the queue for a worker with its connection
 *     suspended (decoded already, or still a body that the worker decodes).
 *
 * Answers hold memory until the client has read them, after the slot is
 * released; the bytes of every answer in flight are counted against
 * --max-response. An answer's room is reserved (its estimate, an upper
 * bound) before it is computed, settled to what the finished body holds,
 * and returned when the request completes. One that does not fit beside the
 * others is refused with 503 and Retry-After; one that could not fit even
 * alone is the API's 422 response_too_large.
 *
 * Memory likewise: a request's estimated peak (api_cost.memory: body,
 * inputs, libattn's workspaces, results, answer) is reserved against
 * --max-memory from the moment it is costed until its answer is built, and
 * one that does not fit beside the others is refused with 503 and
 * Retry-After; one larger than --max-request-memory is the API's 422
 * memory_limit.
 *
 * Cores: libattn runs each call on threads of its own. A request that
 * starts while nothing else computes or waits gets every core (the
 * configured `threads`); one that starts beside others gets one, so that a
 * busy server runs about one thread per core instead of threads^2.
 */
#include "server.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

/* Work (FLOP-equivalents, ~2e10 a second on one core of the development
 * machine) that may run on an I/O thread: ~0.1 ms. A tiny request (n = d =
 * 4) is ~6e4; inline it takes ~10 us of CPU instead of 16-20 us. */
#define INLINE_MAX_WORK 2e6

/* A body whose decoding is tiny work, decoded on the I/O thread that read
 * it. */
static bool decoded_on_io_thread(size_t body_bytes)
{
    return api_decode_work(body_bytes) <= INLINE_MAX_WORK / 2;
}

/* The request's limits; its arrival on api_now_ms's clock (the same
 * monotonic clock as srv_now, in ms) makes meta.timing_ms.total count from
 * the request's headers. */
api_limits compute_limits(const srv_request *r, int threads)
{
    const srv_server *srv = r->srv;
    return (api_limits){.max_work = srv->cfg->max_work,
                        .max_response = (double)srv->cfg->max_response,
                        .max_memory = (double)srv->cfg->max_request_memory,
                        .threads = threads,
                        .max_threads = srv->cfg->threads,
                        .arrival_ms = r->t_start * 1e3,
                        .caches = srv->caches,
                        .cache_id = r->path_id,
                        .owner = r->has_owner ? r->owner : NULL,
                        .cancel = &r->cancel};
}

/* The pool (pool.c) may keep idle what the memory budget leaves beside the
 * reservations of the requests queued or computing: its idle blocks count
 * against --max-memory like a request's, and a request admitted into the
 * room they held makes them go. Under q->lock, so that the limits follow
 * one another in the order of the reservations. */
static void pool_fit(srv_server *srv)
{
    srv_compute *q = &srv->compute;
    double room = q->memory_budget - q->memory_pending;
    pool_set_limit(srv->pool, room > 0 ? (size_t)room : 0);
}

/* The decoded tensors, libattn's workspaces and the results come from the
 * pool too. */
static void *pool_give(void *pool, size_t bytes) { return pool_alloc(pool, bytes); }
static void *pool_regive(void *pool, void *p, size_t bytes) { return pool_realloc(pool, p, bytes); }
static void pool_take(void *pool, void *p) { pool_free(pool, p); }

/* Reserves the room of an answer in the response budget and the request's
 * peak memory in the memory budget, both or neither: false, with the
 * refusal in r->refusal, when one is spent. A request alone in the memory
 * budget is always let in (its own limit, --max-request-memory, has judged
 * it), so that no request waits for room it can never have. */
static bool reserve(srv_request *r, const api_cost *cost)
{
    srv_compute *q = &r->srv->compute;
    pthread_mutex_lock(&q->lock);
    bool answer = q->response_pending + cost->response_bytes <= q->response_budget;
    bool memory = q->memory_pending == 0 ||
                  q->memory_pending + cost->memory <= q->memory_budget;
    if (answer && memory) {
        q->response_pending += cost->response_bytes;
        q->memory_pending += cost->memory;
        pool_fit(r->srv);
    }
    pthread_mutex_unlock(&q->lock);
    if (!answer || !memory) {
        r->refusal = !answer ? STOCK_RESPONSES_PENDING : STOCK_MEMORY_PENDING;
        return false;
    }
    r->reserved = cost->response_bytes;
    r->memory_reserved = cost->memory;
    return true;
}

/* The request's peak memory, reserved while it was computed, is free.
 * Under q->lock. */
static void release_memory_locked(srv_request *r)
{
    if (r->memory_reserved == 0)
        return;
    r->srv->compute.memory_pending -= r->memory_reserved;
    pool_fit(r->srv);
    r->memory_reserved = 0;
}

static void release_memory(srv_request *r)
{
    if (r->memory_reserved == 0)
        return;
    srv_compute *q = &r->srv->compute;
    pthread_mutex_lock(&q->lock);
    release_memory_locked(r);
    pthread_mutex_unlock(&q->lock);
}

/* After the answer is built: its reservation becomes what it holds, and
 * what computing it held is released, in one turn of the lock. */
static void settle(srv_request *r)
{
    double held = r->res.body ? (double)(r->res.body_cap + api_response_bytes(&r->res) -
                                         r->res.body_len)
                              : 0;
    srv_compute *q = &r->srv->compute;
    pthread_mutex_lock(&q->lock);
    q->response_pending += held - r->reserved;
    release_memory_locked(r);
    pthread_mutex_unlock(&q->lock);
    r->reserved = held;
}

void compute_release(srv_request *r)
{
    if (r->call) { /* prepared but never computed (the drain, a refusal) */
        api_call_free(r->call);
        r->call = NULL;
    }
    release_memory(r);
    if (r->reserved == 0)
        return;
    srv_compute *q = &r->srv->compute;
    pthread_mutex_lock(&q->lock);
    q->response_pending -= r->reserved;
    pthread_mutex_unlock(&q->lock);
    r->reserved = 0;
}

/* The api call of r's body, in the protocol of its route. */
static api_call *prepare_call(srv_request *r, const api_limits *lim, api_cost *cost)
{
    if (r->route->oip)
        return api_prepare_oip(r->route->op, body_of(r), r->body_len, r->json_length, lim,
                               cost, &r->res);
    return api_prepare(r->route->op, body_of(r), r->body_len, lim, cost, &r->res);
}

/* Decodes and costs r's body into r->call; false when the answer is known
 * already (an error in r->res, or the budget's refusal). */
static bool prepare(srv_request *r, int threads)
{
    api_limits lim = compute_limits(r, threads);
    api_cost cost;
    r->call = prepare_call(r, &lim, &cost);
    if (!r->call)
        return false;
    if (!reserve(r, &cost)) {
        api_call_free(r->call);
        r->call = NULL;
        return false;
    }
    return true;
}

/* Computes a prepared (or still raw) request that waited `wait` seconds
 * for its slot; r->res is its answer. `now`: on an I/O thread, which must
 * not wait for another request (a KV cache's turn): false then, with the
 * request as it was. */
static bool run(srv_request *r, int others, double wait, bool now)
{
    int threads = others == 0 ? r->srv->compute.slots : 1;
    if (!r->call && !prepare(r, threads))
        return true;
    if (now) {
        if (!api_execute_now(r->call, threads, &r->res))
            return false;
    } else {
        api_execute(r->call, threads, &r->res);
    }
    r->call = NULL;
    settle(r);
    if (!atomic_load(&r->cancel))
        metrics_computed(&r->srv->metrics, r->label, wait, r->res.compute_ms * 1e-3);
    return true;
}

/* How much lower than the I/O threads a compute worker runs (nice). */
#define WORKER_NICE 10

/*
 * A compute worker (and the helper threads libattn keeps for it, which take
 * its class) yields to the I/O threads: SCHED_BATCH at nice +10, so that a
 * request to refuse, a probe or a tiny request gets a core soon after it
 * wakes instead of after the computation's time slice, and so that an
 * overloaded server can still say so. Not SCHED_IDLE: a SCHED_IDLE thread
 * runs only when nothing else in its cgroup wants the core, so any busy
 * neighbour (a load generator beside attnd, 32 threads reconnecting in a
 * loop) starves the computations outright, and a drain that should take
 * milliseconds takes the neighbour's whole run. Alone on a core, a
 * computation runs as fast as at normal priority. Lowering one's own
 * priority needs no privilege; where it fails nothing else changes.
 */
static void yield_to_io_threads(void)
{
#ifdef __linux__ /* per-thread policy and nice are Linux's */
    struct sched_param none = {0};
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &none);
    id_t self = (id_t)gettid();
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, self);
    if (errno == 0)
        (void)setpriority(PRIO_PROCESS, self, nice + WORKER_NICE);
#endif
}

/*
 * How long (ns) a worker that has just finished a request polls for the
 * next before it blocks. Waking a blocked thread takes a system call on
 * each side and a pass through the scheduler, and on a virtual machine
 * whose idle cores halt at once, tens of microseconds more to bring the
 * core back: a toll that every request of a client decoding token by token
 * paid, since its next step comes a few hundred microseconds after its
 * answer. A worker polling meanwhile takes that step at once and keeps its
 * core awake for the answer's way out (the I/O thread's wake-up, the
 * client's). Bounded, at the worker's low priority, yielding the core
 * every few steps, and given up once a yield has let another thread run
 * for a while: on a busy machine the core is worth more to others (even
 * at nice +10 a spinning thread takes a tenth of a core from a nice 0 one)
 * than a wake-up saved.
 */
#define WORKER_POLL_NS 300000
#define WORKER_YIELDED_NS 50000

/* Polls, without the lock, until a request is queued (or the stop posted)
 * after `seen`, or WORKER_POLL_NS have passed, or the core was wanted.
 * Called and returning with q->lock held; counted in q->polling meanwhile,
 * so that compute_submit wakes no blocked worker for a request a polling
 * one will take. */
static void poll_for_work(srv_compute *q)
{
    unsigned seen = atomic_load_explicit(&q->posted, memory_order_relaxed);
    q->polling++;
    pthread_mutex_unlock(&q->lock);
    double end = srv_now() + WORKER_POLL_NS * 1e-9;
    for (int k = 1; atomic_load_explicit(&q->posted, memory_order_relaxed) == seen; k++) {
        if ((k & 15) == 0) {
            double now = srv_now();
            if (now > end)
                break;
            sched_yield();
            if (srv_now() - now > WORKER_YIELDED_NS * 1e-9)
                break;
        } else {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
    }
    pthread_mutex_lock(&q->lock);
    q->polling--;
}

/* How long (s) a request must have waited in the queue before its worker
 * looks whether its client is still there. */
#define GONE_LOOK_AFTER 1e-3

static void *worker_main(void *arg)
{
    srv_compute *q = &((srv_server *)arg)->compute;
    yield_to_io_threads();
    pthread_mutex_lock(&q->lock);
    bool finished_one = false;
    for (;;) {
        if (finished_one && !q->stopping && !q->head)
            poll_for_work(q);
        while (!q->stopping && !(q->head && q->running < q->slots) && !q->expected)
            pthread_cond_wait(&q->work, &q->lock);
        /* Whichever worker comes out first answers a wake-up asked for
         * ahead of a body (compute_expect), so that none stays owed. */
        if (q->expected)
            q->expected--;
        if (!q->stopping && !(q->head && q->running < q->slots)) {
            finished_one = true; /* woken ahead of a request: poll for it */
            continue;
        }
        if (!q->head)
            break; /* stopping, and nothing left */
        srv_request *r = q->head;
        q->head = r->next;
        if (!q->head)
            q->tail = NULL;
        q->waiting--;
        int others = q->running + q->waiting;
        q->running++;
        pthread_mutex_unlock(&q->lock);

        metrics_queued(&r->srv->metrics, r->label, -1);
        /* A request whose client left while it queued is not started. One
         * taken within GONE_LOOK_AFTER of its queueing is not looked at:
         * its client sent its body just now, and the look is a system call
         * (about a microsecond on a virtual machine) on the way of every
         * decoding step; the watcher stops it like any computation if its
         * client has gone all the same. */
        double wait = srv_now() - r->t_queued;
        if (!atomic_load(&r->cancel) && wait > GONE_LOOK_AFTER &&
            conn_client_gone(r->connection))
            atomic_store(&r->cancel, 1);
        if (!atomic_load(&r->cancel))
            run(r, others, wait, false);

        pthread_mutex_lock(&q->lock);
        q->running--;
        /* The slot freed is this worker's, which takes the next request
         * itself; another is woken only for the ones after it. */
        if (q->head && q->head->next)
            pthread_cond_signal(&q->work);
        bool idle = !q->head && q->running == 0;
        pthread_mutex_unlock(&q->lock);
        /* Nothing computes or waits: libattn's helpers would poll on for a
         * next call that cannot come before the next request, at this
         * worker's low priority, and a thread woken on a core where one
         * polls (the I/O thread this resume wakes, the client) waits for
         * the poll to end: the scheduler does not hand it the core at the
         * poller's sched_yield. A decode step of 2048 positions waited
         * ~60 us for it (docs/benchmarks.md). */
        if (idle)
            api_threads_rest();
        atomic_store(&r->computed, true);
        conn_computed(r->connection);
        http_resume(r);
        pthread_mutex_lock(&q->lock);
        finished_one = true;
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

bool compute_start(srv_server *srv)
{
    srv_compute *q = &srv->compute;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->work, NULL);
    q->slots = srv->cfg->threads;
    q->queue_max = srv->cfg->queue;
    q->running = q->waiting = q->polling = q->expected = 0;
    atomic_init(&q->posted, 0);
    q->head = q->tail = NULL;
    q->stopping = false;
    q->response_budget = (double)srv->cfg->max_response;
    q->response_pending = 0;
    q->memory_budget = (double)srv->cfg->max_memory;
    q->memory_pending = 0;
    if (!(srv->pool = pool_shared()))
        return false;
    pool_fit(srv);
    api_set_allocator(&(api_allocator){
        .alloc = pool_give, .realloc = pool_regive, .free = pool_take, .ctx = srv->pool});
    q->workers = calloc((size_t)q->slots, sizeof *q->workers);
    if (!q->workers)
        return false;
    for (q->n_workers = 0; q->n_workers < q->slots; q->n_workers++)
        if (pthread_create(&q->workers[q->n_workers], NULL, worker_main, srv) != 0)
            break;
    return q->n_workers > 0;
}

compute_result compute_submit(srv_request *r)
{
    srv_compute *q = &r->srv->compute;
    r->refusal = -1;
    /* Every slot busy and the queue full: nothing this request could be
     * would run now, so it is refused before its body is read for errors
     * (a burst of refusals then costs the I/O thread least, when its core
     * is the most contended). */
    pthread_mutex_lock(&q->lock);
    bool full = q->running + q->waiting >= q->slots + q->queue_max;
    pthread_mutex_unlock(&q->lock);
    if (full)
        return COMPUTE_OVERLOADED;
    /* Decoding a small body is tiny work: do it here and know the cost. A
     * refusal (400, 422, the budget) is then answered without a queue. */
    double work = 0;
    if (decoded_on_io_thread(r->body_len)) {
        api_limits lim = compute_limits(r, 1);
        api_cost cost;
        r->call = prepare_call(r, &lim, &cost);
        if (!r->call)
            return COMPUTE_DONE;
        if (!reserve(r, &cost)) {
            compute_release(r);
            return COMPUTE_DONE;
        }
        work = cost.work;
    }

    pthread_mutex_lock(&q->lock);
    if (r->call && work <= INLINE_MAX_WORK && q->running < q->slots && q->waiting == 0) {
        int others = q->running++;
        pthread_mutex_unlock(&q->lock);
        bool done = run(r, others, 0, true);
        pthread_mutex_lock(&q->lock);
        q->running--;
        if (q->waiting)
            pthread_cond_signal(&q->work);
        if (done) {
            pthread_mutex_unlock(&q->lock);
            return COMPUTE_DONE;
        }
        /* a KV cache's turn is another request's: queued like any other */
    }
    if (q->running + q->waiting >= q->slots + q->queue_max) {
        pthread_mutex_unlock(&q->lock);
        compute_release(r);
        return COMPUTE_OVERLOADED;
    }
    q->waiting++; /* the place is taken now; the request joins the list below */
    pthread_mutex_unlock(&q->lock);

    /* Suspended before any worker can see it, so that the worker's resume
     * always finds a suspended connection; and watched (conn_watch.c) from
     * then until a worker is done with it. */
    atomic_store(&r->computed, false);
    MHD_suspend_connection(r->conn);
    conn_computing(r->connection);
    r->next = NULL;
    r->t_queued = srv_now();
    metrics_queued(&r->srv->metrics, r->label, +1);
    pthread_mutex_lock(&q->lock);
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    atomic_fetch_add_explicit(&q->posted, 1, memory_order_relaxed);
    /* A worker polling for work, or woken to poll for this very request
     * (compute_expect), takes it without being woken (again). */
    bool wake = q->waiting > q->polling + q->expected;
    pthread_mutex_unlock(&q->lock);
    if (wake)
        pthread_cond_signal(&q->work);
    return COMPUTE_QUEUED;
}

/*
 * A request for attention over a KV cache is a step of a client decoding
 * token by token, which sends its next step only when it has this one's
 * answer: the step's whole latency is the client's. Its headers come before
 * its body. A worker still polling from its last request takes the request
 * when it is queued; but after a long step (a cache of tens of thousands of
 * positions) the client's own turn-around often outlasts the poll, and the
 * worker woken only when the request is queued costs the step its wake-up
 * (about 20 us on a virtual machine whose idle cores halt). Woken here,
 * the worker comes up while the body is read and decoded, and polls.
 *
 * Only for a body that arrives well within the poll (EXPECT_MAX_BODY: a
 * step's q, k and v, base64, are tens of KiB), only an idle worker and
 * only one at a time: nothing running or queued is displaced, and a
 * request whose body never comes costs one worker one bounded poll, at its
 * low priority and yielding.
 */
#define EXPECT_MAX_BODY ((uint64_t)128 << 10)

void compute_expect(srv_server *srv, uint64_t body_bytes)
{
    /* A body decoded on the I/O thread may be computed there too (its
     * cache's turn free, its work tiny): a worker woken for it would poll
     * for nothing. */
    if (body_bytes > EXPECT_MAX_BODY || decoded_on_io_thread(body_bytes))
        return;
    srv_compute *q = &srv->compute;
    pthread_mutex_lock(&q->lock);
    bool wake = !q->stopping && q->polling == 0 && q->expected == 0 &&
                q->running + q->waiting < q->n_workers;
    if (wake)
        q->expected++;
    pthread_mutex_unlock(&q->lock);
    if (wake)
        pthread_cond_signal(&q->work);
}

bool compute_unqueue(srv_request *r)
{
    srv_compute *q = &r->srv->compute;
    pthread_mutex_lock(&q->lock);
    srv_request **p = &q->head, *prev = NULL;
    while (*p && *p != r) {
        prev = *p;
        p = &(*p)->next;
    }
    bool found = *p == r;
    if (found) {
        *p = r->next;
        if (q->tail == r)
            q->tail = prev;
        q->waiting--;
    }
    pthread_mutex_unlock(&q->lock);
    if (found)
        metrics_queued(&r->srv->metrics, r->label, -1);
    return found;
}

int compute_running(srv_server *srv)
{
    srv_compute *q = &srv->compute;
    pthread_mutex_lock(&q->lock);
    int n = q->running;
    pthread_mutex_unlock(&q->lock);
    return n;
}

double compute_response_pending(srv_server *srv)
{
    srv_compute *q = &srv->compute;
    pthread_mutex_lock(&q->lock);
    double n = q->response_pending;
    pthread_mutex_unlock(&q->lock);
    return n;
}

double compute_memory_pending(srv_server *srv)
{
    srv_compute *q = &srv->compute;
    pthread_mutex_lock(&q->lock);
    double n = q->memory_pending;
    pthread_mutex_unlock(&q->lock);
    return n;
}

void compute_stop(srv_server *srv)
{
    srv_compute *q = &srv->compute;
    pthread_mutex_lock(&q->lock);
    q->stopping = true;
    atomic_fetch_add_explicit(&q->posted, 1, memory_order_relaxed);
    pthread_cond_broadcast(&q->work);
    pthread_mutex_unlock(&q->lock);
    for (int i = 0; i < q->n_workers; i++)
        pthread_join(q->workers[i], NULL);
    free(q->workers);
    q->workers = NULL;
    q->n_workers = 0;
    pool_set_limit(srv->pool, 0); /* nothing more to serve: unmapped */
}
