/*
 * attn_parallel_for: a fork-join loop over independent work units, run by
 * the calling thread and helper threads that outlive the call.
 *
 * Balance. Each worker owns a contiguous share of the units (worker w the
 * w-th of `threads` equal shares) and takes them one at a time from the
 * front of it; a worker whose share is done goes on with the others' from
 * their fronts, so uneven units (causal query tiles, whose cost grows with
 * the row index) still balance themselves without a schedule. The calling
 * thread is worker 0: it owns the front share call after call and stays on
 * its core, so the rows it wrote last time are still in that core's caches
 * (a single shared counter would deal them anew each time).
 *
 * Helpers. Starting and joining a thread costs tens of microseconds, paid
 * per call by the backward pass three or four times and by decoding once a
 * token; so helpers are started once and wait for the next call, polling
 * for a moment and then blocked.
 * They are kept in crews, one per scheduling class (policy, priority and
 * nice value): a call is helped only by threads of its caller's class, and
 * a crew's threads are started by a caller of that class and inherit it, as
 * threads started for the call would. A server's compute workers
 * (SCHED_BATCH at a higher nice value, to yield to its I/O
 * threads) never get helpers that would outrank their I/O threads, and the
 * other way round.
 *
 * Concurrent callers. A call posts its units as a job to its crew; idle
 * helpers join it and take worker numbers 1, 2, ... up to threads - 1. The
 * crew grows to the most helpers one call has asked for, not to the sum
 * over callers: two callers at once share the helpers, and each call runs
 * on at most `threads` threads. The caller never waits for a helper to wake
 * up: it works through every unit no helper has taken, then waits only for
 * the helpers that joined to finish the units they hold. A job is closed
 * to latecomers when the caller is done, so a helper that wakes late finds
 * nothing to join. Nothing waits on anything but running units, so calls
 * cannot deadlock, however many callers.
 *
 * A call made from inside a unit (on the caller or on a helper) runs its
 * units on that thread alone: the outer call already uses its threads.
 *
 * Exit: the helpers of crews that no call is using are stopped and joined
 * (atexit), and the crews freed. A forked child, which has none of its
 * parent's threads, starts crews afresh.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* One worker's share of the units: [next, end). A cache line each, so
 * that the workers' counters do not share one. */
typedef struct {
    _Alignas(64) atomic_int_fast64_t next;
    int64_t end;
} share;

/* Shares beyond this many workers: they only take from the others'. */
#define MAX_SHARES 64

/* Helpers a crew may have; a call asking for more threads runs on these. */
#define MAX_HELPERS 255

/* How long (ns) a helper that finished a job polls for the next before it
 * blocks, and a caller polls for its helpers' last units before it blocks.
 * Waking a blocked thread costs a system call and a pass through the
 * scheduler, more than an empty call's own work; the backward pass posts
 * its rounds back to back. The polling yields the core every few steps, so
 * that on a busy machine it gives way to whoever else wants the core. */
#define HELPER_POLL_NS 20000
#define CALLER_POLL_NS 20000

typedef struct {
    void (*fn)(void *ctx, int64_t i, int worker);
    void *ctx;
    const atomic_int *cancel; /* NULL, or no unit starts once non-zero */
    int shares;
    share share[MAX_SHARES];
} loop;

/* Its own share first, then the others' in turn; none once cancelled (the
 * units not taken are simply left: the caller looks at the flag too). */
static void run_units(loop *l, int worker)
{
    for (int k = 0; k < l->shares; k++) {
        share *s = &l->share[(worker + k) % l->shares];
        for (;;) {
            if (attn_cancelled(l->cancel))
                return;
            int64_t i = atomic_fetch_add_explicit(&s->next, 1, memory_order_relaxed);
            if (i >= s->end)
                break;
            l->fn(l->ctx, i, worker);
        }
    }
}

/* ------------------------------------------------------------- crews */

/* Who a thread is to the scheduler. */
typedef struct {
    int policy, priority, nice;
} sched_class;

/* One call's units offered to helpers; it lives on the caller's stack. The
 * fields are guarded by the crew's lock; `active` is written under it too
 * but may be read without it. */
typedef struct job {
    loop *units;
    int want;           /* helpers wanted: threads - 1 */
    int joined;         /* helpers that took a worker number */
    atomic_int active;  /* of those, the ones still running units */
    bool blocked;       /* the caller waits on `finished` */
    pthread_cond_t finished;
    struct job *next;   /* in the crew's queue */
} job;

typedef struct crew {
    sched_class cls;
    pthread_mutex_t lock;
    pthread_cond_t wake;  /* idle helpers wait here */
    job *head, *tail;     /* jobs with room for more helpers, oldest first */
    atomic_uint posted;   /* jobs ever queued: what polling helpers watch */
    int idle;             /* helpers blocked on `wake` */
    int helpers;
    bool stop;
    int callers;          /* calls using the crew (guarded by crews_lock) */
    pthread_t thread[MAX_HELPERS];
    struct crew *next;
} crew;

static pthread_mutex_t crews_lock = PTHREAD_MUTEX_INITIALIZER;
static crew *crews;
static bool exiting; /* after exit began, every call runs on its caller alone */
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;

/* True on helpers, and on a caller while it runs units. */
static _Thread_local bool in_units;

#ifdef __linux__
/* The calling thread's id, asked of the kernel once: gettid is a system
 * call each time (about a microsecond on a virtual machine, twice a
 * decoding step otherwise). 0 until asked; a forked child forgets it
 * (after_fork_child), its one thread having another id. */
static _Thread_local pid_t own_tid;

static pid_t thread_id(void)
{
    if (own_tid == 0)
        own_tid = gettid();
    return own_tid;
}
#endif

static sched_class current_class(void)
{
    sched_class c = {0};
    struct sched_param param;
    if (pthread_getschedparam(pthread_self(), &c.policy, &param) == 0)
        c.priority = param.sched_priority;
#ifdef __linux__ /* nice is per thread on Linux */
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, (id_t)thread_id());
    if (errno == 0)
        c.nice = nice;
#endif
    return c;
}

static void dequeue(crew *c, job *j)
{
    for (job **link = &c->head, *prev = NULL; *link != NULL; prev = *link, link = &(*link)->next)
        if (*link == j) {
            *link = j->next;
            if (c->tail == j)
                c->tail = prev;
            return;
        }
}

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* One step of a wait that polls: a pause, and every 16th a yield, so that a
 * waiter on a core others want gives it to them rather than burn it. */
static inline void poll_step(int k)
{
    if ((k & 15) == 15) {
        sched_yield();
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Until ready(arg) or `ns` have passed; whether it became ready. */
static bool poll_until(bool (*ready)(const void *arg), const void *arg, int64_t ns)
{
    int64_t end = now_ns() + ns;
    for (int k = 0;; k++) {
        if (ready(arg))
            return true;
        if ((k & 15) == 15 && now_ns() > end)
            return false;
        poll_step(k);
    }
}

/* A job posted since `seen` (helpers watch the crew's count of them). */
typedef struct {
    atomic_uint *posted;
    unsigned seen;
} posted_since;

static bool job_posted(const void *arg)
{
    const posted_since *p = arg;
    return atomic_load_explicit(p->posted, memory_order_relaxed) != p->seen;
}

static bool helpers_done(const void *arg)
{
    return atomic_load_explicit((atomic_int *)arg, memory_order_acquire) == 0;
}

static void *helper_main(void *arg)
{
    crew *c = arg;
    in_units = true; /* a call from one of its units runs inline */
    pthread_mutex_lock(&c->lock);
    for (;;) {
        if (!c->stop && c->head == NULL && HELPER_POLL_NS > 0) {
            /* Not counted idle while it polls: a caller wakes nobody. */
            posted_since since = {&c->posted, atomic_load_explicit(&c->posted, memory_order_relaxed)};
            pthread_mutex_unlock(&c->lock);
            poll_until(job_posted, &since, HELPER_POLL_NS);
            pthread_mutex_lock(&c->lock);
        }
        while (!c->stop && c->head == NULL) {
            c->idle++;
            pthread_cond_wait(&c->wake, &c->lock);
            c->idle--;
        }
        if (c->stop)
            break;
        job *j = c->head;
        int worker = ++j->joined;
        if (j->joined == j->want)
            dequeue(c, j);
        atomic_fetch_add_explicit(&j->active, 1, memory_order_relaxed);
        pthread_mutex_unlock(&c->lock);
        run_units(j->units, worker);
        pthread_mutex_lock(&c->lock);
        /* Once `active` is 0 the caller may return without the lock and
         * the job is gone: it is read before, and touched after only when
         * the caller blocks (and so waits for this lock). */
        bool wake_caller = j->blocked && atomic_load_explicit(&j->active, memory_order_relaxed) == 1;
        atomic_fetch_sub_explicit(&j->active, 1, memory_order_release);
        if (wake_caller)
            pthread_cond_signal(&j->finished);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* Starts helpers until the crew has `want` (or cannot start more). Called
 * by a caller of the crew's class, whose policy, priority and nice the new
 * threads inherit; they block every signal, which are the process's
 * threads' business, not theirs. Called with c->lock held. */
static void grow(crew *c, int want)
{
    if (c->helpers >= want)
        return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (c->helpers < want) {
        if (pthread_create(&c->thread[c->helpers], NULL, helper_main, c) != 0)
            break;
#ifdef __GLIBC__
        char name[16];
        snprintf(name, sizeof name, "attn-helper-%u", (unsigned)(c->helpers + 1) % 1000u);
        pthread_setname_np(c->thread[c->helpers], name);
#endif
        c->helpers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Stops and joins a crew's helpers and frees it; no call may be using it. */
static void crew_free(crew *c)
{
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_broadcast(&c->wake);
    pthread_mutex_unlock(&c->lock);
    for (int h = 0; h < c->helpers; h++)
        pthread_join(c->thread[h], NULL);
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static void stop_crews_at_exit(void)
{
    pthread_mutex_lock(&crews_lock);
    exiting = true;
    crew **link = &crews;
    while (*link != NULL) {
        crew *c = *link;
        if (c->callers > 0) { /* a thread still computing: left alone */
            link = &c->next;
            continue;
        }
        *link = c->next;
        crew_free(c);
    }
    pthread_mutex_unlock(&crews_lock);
}

/* Around fork: every lock held, so that the child sees consistent crews;
 * the child, which has none of the helpers, forgets them. */
static void before_fork(void)
{
    pthread_mutex_lock(&crews_lock);
    for (crew *c = crews; c != NULL; c = c->next)
        pthread_mutex_lock(&c->lock);
}

static void after_fork_parent(void)
{
    for (crew *c = crews; c != NULL; c = c->next)
        pthread_mutex_unlock(&c->lock);
    pthread_mutex_unlock(&crews_lock);
}

static void after_fork_child(void)
{
#ifdef __linux__
    own_tid = 0;
#endif
    crew *c = crews;
    crews = NULL;
    while (c != NULL) {
        crew *next = c->next;
        pthread_mutex_unlock(&c->lock);
        if (c->callers == 0) /* else a vanished thread's call still points at it */
            free(c);
        c = next;
    }
    pthread_mutex_unlock(&crews_lock);
}

static void install_hooks(void)
{
    atexit(stop_crews_at_exit);
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* The crew of the calling thread's class, created when missing; NULL when
 * the process is exiting or out of memory. Counts the caller in. */
static crew *join_crew(void)
{
    sched_class cls = current_class();
    pthread_once(&hooks_once, install_hooks);
    pthread_mutex_lock(&crews_lock);
    crew *c = NULL;
    if (!exiting) {
        for (c = crews; c != NULL; c = c->next)
            if (c->cls.policy == cls.policy && c->cls.priority == cls.priority &&
                c->cls.nice == cls.nice)
                break;
        if (c == NULL && (c = calloc(1, sizeof *c)) != NULL) {
            c->cls = cls;
            pthread_mutex_init(&c->lock, NULL);
            pthread_cond_init(&c->wake, NULL);
            c->next = crews;
            crews = c;
        }
        if (c != NULL)
            c->callers++;
    }
    pthread_mutex_unlock(&crews_lock);
    return c;
}

static void leave_crew(crew *c)
{
    pthread_mutex_lock(&crews_lock);
    c->callers--;
    pthread_mutex_unlock(&crews_lock);
}

/* ------------------------------------------------------------- the loop */

void attn_parallel_for(int threads, int64_t count,
                       void (*fn)(void *ctx, int64_t i, int worker), void *ctx)
{
    attn_parallel_for_until(threads, count, fn, ctx, NULL);
}

void attn_parallel_for_until(int threads, int64_t count,
                             void (*fn)(void *ctx, int64_t i, int worker), void *ctx,
                             const atomic_int *cancel)
{
    if (count <= 0)
        return;
    int64_t want = threads < count ? threads : count;
    if (want <= 1 || in_units) {
        for (int64_t i = 0; i < count && !attn_cancelled(cancel); i++)
            fn(ctx, i, 0);
        return;
    }
    loop l = {.fn = fn, .ctx = ctx, .cancel = cancel,
              .shares = want < MAX_SHARES ? (int)want : MAX_SHARES};
    for (int w = 0; w < l.shares; w++) {
        atomic_init(&l.share[w].next, count * w / l.shares);
        l.share[w].end = count * (w + 1) / l.shares;
    }
    /* Without a crew or its helpers, the calling thread does every share
     * alone: slower, never wrong. */
    crew *c = join_crew();
    job j = {.units = &l, .want = want - 1 < MAX_HELPERS ? (int)want - 1 : MAX_HELPERS};
    int wake = 0;
    bool everyone = false;
    if (c != NULL) {
        pthread_cond_init(&j.finished, NULL);
        pthread_mutex_lock(&c->lock);
        grow(c, j.want);
        if (c->tail != NULL)
            c->tail->next = &j;
        else
            c->head = &j;
        c->tail = &j;
        atomic_fetch_add_explicit(&c->posted, 1, memory_order_relaxed);
        wake = j.want < c->idle ? j.want : c->idle;
        everyone = wake == c->idle;
        pthread_mutex_unlock(&c->lock);
        if (everyone)
            pthread_cond_broadcast(&c->wake);
        else
            for (int k = 0; k < wake; k++)
                pthread_cond_signal(&c->wake);
    }
    in_units = true;
    run_units(&l, 0);
    in_units = false;
    if (c != NULL) {
        pthread_mutex_lock(&c->lock); /* no one joins from here on */
        dequeue(c, &j);
        pthread_mutex_unlock(&c->lock);
        /* The helpers that joined hold a unit each at most: short, usually. */
        if (!poll_until(helpers_done, &j.active, CALLER_POLL_NS)) {
            pthread_mutex_lock(&c->lock);
            j.blocked = true;
            while (atomic_load_explicit(&j.active, memory_order_acquire) > 0)
                pthread_cond_wait(&j.finished, &c->lock);
            pthread_mutex_unlock(&c->lock);
        }
        pthread_cond_destroy(&j.finished);
        leave_crew(c);
    }
}

/* The helpers polling for a next call see a "post" with no job: they stop
 * polling, find the queue empty and block at once. A call posted after
 * wakes them as it would any blocked helper. */
void attn_threads_rest(void)
{
    pthread_mutex_lock(&crews_lock);
    for (crew *c = crews; c != NULL; c = c->next)
        atomic_fetch_add_explicit(&c->posted, 1, memory_order_relaxed);
    pthread_mutex_unlock(&crews_lock);
}
