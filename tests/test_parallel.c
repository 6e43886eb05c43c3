/*
 * attn_parallel_for and the helper threads it keeps between calls
 * (lib/parallel.c): every unit runs once, on a worker numbered below the
 * threads asked for; the calling thread is worker 0; helpers outlive the
 * call and run at their caller's scheduling policy and nice value; calls
 * from many threads at once and calls from inside a unit are safe; a
 * forked child gets helpers of its own; a cancelled loop starts no more
 * units; helpers told to rest (attn_threads_rest) block and still serve
 * the next call, whoever else is calling meanwhile; and attention computed on the
 * helpers is the same, bit for bit, call after call and caller beside
 * caller.
 *
 * Where a test needs a helper to have taken part (not merely been
 * offered the work), the caller's first unit waits for one to show up.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attn.h"
#include "internal.h" /* lib-private: attn_parallel_for */
#include "support/sdpa_case.h"

/* --------------------------------------------------------- recording */

/* What each unit saw: how often it ran, on which thread, as which worker,
 * at which policy and nice value. */
typedef struct {
    int threads;
    int64_t count;
    atomic_int *runs;
    pthread_t *thread;
    pid_t *tid; /* not reused soon, as a pthread_t of a joined thread is */
    int *worker;
    int *policy, *nice;
    atomic_bool helper_ran;
    bool wait_for_helper; /* worker 0's units wait for a helper's first */
} record;

static void record_init(record *r, int threads, int64_t count, bool wait_for_helper)
{
    size_t n = (size_t)count + 1;
    *r = (record){.threads = threads, .count = count, .wait_for_helper = wait_for_helper};
    r->runs = xcalloc(n, sizeof *r->runs);
    r->thread = xcalloc(n, sizeof *r->thread);
    r->tid = xcalloc(n, sizeof *r->tid);
    r->worker = xcalloc(n, sizeof *r->worker);
    r->policy = xcalloc(n, sizeof *r->policy);
    r->nice = xcalloc(n, sizeof *r->nice);
    atomic_init(&r->helper_ran, false);
}

static void record_free(record *r)
{
    free(r->runs);
    free(r->thread);
    free(r->tid);
    free(r->worker);
    free(r->policy);
    free(r->nice);
}

static int own_nice(void)
{
    return getpriority(PRIO_PROCESS, (id_t)gettid());
}

/* Until a helper has run a unit, or 20 s (a machine busy with other work
 * may leave a woken helper waiting for a core for a while). */
static void wait_for_a_helper(record *r)
{
    struct timespec pause = {0, 200 * 1000};
    for (int k = 0; k < 100000 && !atomic_load(&r->helper_ran); k++)
        nanosleep(&pause, NULL);
}

static void record_unit(void *ctx, int64_t i, int worker)
{
    record *r = ctx;
    atomic_fetch_add(&r->runs[i], 1);
    r->thread[i] = pthread_self();
    r->tid[i] = gettid();
    r->worker[i] = worker;
    r->policy[i] = sched_getscheduler(0);
    r->nice[i] = own_nice();
    if (worker != 0)
        atomic_store(&r->helper_ran, true);
    else if (r->wait_for_helper)
        wait_for_a_helper(r);
}

/* Every unit ran exactly once, on a worker below `threads`; worker 0 is
 * the calling thread and no other worker is. */
static void check_record(const record *r, pthread_t caller, const char *what)
{
    int64_t worst = -1;
    for (int64_t i = 0; i < r->count && worst < 0; i++)
        if (atomic_load(&r->runs[i]) != 1)
            worst = i;
    ck_assert_msg(worst < 0, "%s: unit %lld ran %d times", what, (long long)worst,
                  worst < 0 ? 1 : atomic_load(&r->runs[worst]));
    for (int64_t i = 0; i < r->count && worst < 0; i++)
        if (r->worker[i] < 0 || r->worker[i] >= r->threads ||
            (r->worker[i] == 0) != (pthread_equal(r->thread[i], caller) != 0))
            worst = i;
    ck_assert_msg(worst < 0, "%s: unit %lld ran as worker %d (of %d threads) on %s thread",
                  what, (long long)worst, worst < 0 ? 0 : r->worker[worst], r->threads,
                  worst >= 0 && pthread_equal(r->thread[worst], caller) ? "the calling"
                                                                       : "another");
}

/* ------------------------------------------------------------- units */

START_TEST(every_unit_runs_once_on_a_worker_below_threads)
{
    const int64_t counts[] = {0, 1, 2, 3, 5, 8, 63, 64, 65, 1000};
    const int threads[] = {1, 2, 3, 4, 5, 7, 9, 70};
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++)
        for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
            record r;
            record_init(&r, threads[t], counts[k], false);
            attn_parallel_for(threads[t], counts[k], record_unit, &r);
            char what[64];
            snprintf(what, sizeof what, "threads %d, %lld units", threads[t],
                     (long long)counts[k]);
            check_record(&r, pthread_self(), what);
            record_free(&r);
        }
}
END_TEST

/* More threads than a crew may have helpers: the call still runs every
 * unit, on the helpers there are. */
START_TEST(more_threads_than_helpers_runs_every_unit)
{
    record r;
    record_init(&r, 300, 2000, false);
    attn_parallel_for(300, 2000, record_unit, &r);
    check_record(&r, pthread_self(), "300 threads, 2000 units");
    record_free(&r);
}
END_TEST

/* A helper takes part when one can: the caller's first unit waits for it. */
START_TEST(a_helper_runs_units_of_the_call)
{
    record r;
    record_init(&r, 2, 64, true);
    attn_parallel_for(2, 64, record_unit, &r);
    check_record(&r, pthread_self(), "2 threads, 64 units");
    ck_assert_msg(atomic_load(&r.helper_ran), "no helper ran a unit");
    record_free(&r);
}
END_TEST

/* --------------------------------------------------- threads that stay */

/* The threads of this process, from /proc/self/status. */
static int process_threads(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    ck_assert_ptr_nonnull(f);
    char line[256];
    int n = -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    fclose(f);
    return n;
}

typedef struct {
    int nice_step;    /* added to the thread's nice value first */
    bool batch;       /* SCHED_BATCH first */
    int threads_before, threads_after;
    int distinct_helpers;
    int policy, nice; /* the thread's own, after the changes */
    int wrong_class_units;
    bool helper_seen;
    int failures;     /* units not run exactly once, over every call */
    bool class_refused; /* the thread could not change its own class */
} caller_report;

/* Runs on a thread of its own, in a scheduling class of its own: its calls
 * have a crew nobody else uses. (No ck_assert off the test's thread.) */
static void *calls_in_a_class(void *arg)
{
    caller_report *rep = arg;
    struct sched_param none = {0};
    if (rep->batch && pthread_setschedparam(pthread_self(), SCHED_BATCH, &none) != 0)
        rep->class_refused = true;
    if (setpriority(PRIO_PROCESS, (id_t)gettid(), own_nice() + rep->nice_step) != 0)
        rep->class_refused = true;
    rep->policy = sched_getscheduler(0);
    rep->nice = own_nice();
    pid_t seen[64];
    int n_seen = 0;
    for (int call = 0; call < 201; call++) {
        record r;
        record_init(&r, 3, 48, call == 0);
        attn_parallel_for(3, 48, record_unit, &r);
        for (int64_t i = 0; i < r.count; i++) {
            rep->failures += atomic_load(&r.runs[i]) != 1;
            rep->wrong_class_units += r.policy[i] != rep->policy || r.nice[i] != rep->nice;
            if (r.worker[i] == 0)
                continue;
            rep->helper_seen = true;
            int s = 0;
            while (s < n_seen && seen[s] != r.tid[i])
                s++;
            if (s == n_seen && n_seen < 64)
                seen[n_seen++] = r.tid[i];
        }
        record_free(&r);
        if (call == 0)
            rep->threads_before = process_threads();
    }
    rep->threads_after = process_threads();
    rep->distinct_helpers = n_seen;
    return NULL;
}

static caller_report run_in_a_class(int nice_step, bool batch)
{
    caller_report rep = {.nice_step = nice_step, .batch = batch};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, calls_in_a_class, &rep), 0);
    pthread_join(t, NULL);
    ck_assert_msg(!rep.class_refused, "could not set the caller's class (nice +%d%s)",
                  nice_step, batch ? ", SCHED_BATCH" : "");
    return rep;
}

/* Threads started for one call serve the next: 201 calls with 3 threads
 * start two helpers, once, and the process's thread count stays put. */
START_TEST(helpers_outlive_the_call)
{
    caller_report rep = run_in_a_class(3, false);
    ck_assert_int_eq(rep.failures, 0);
    ck_assert_msg(rep.helper_seen, "no helper ran a unit");
    ck_assert_msg(rep.distinct_helpers <= 2, "201 calls ran on %d different helpers",
                  rep.distinct_helpers);
    ck_assert_msg(rep.threads_after == rep.threads_before,
                  "threads of the process: %d after the first call, %d after 200 more",
                  rep.threads_before, rep.threads_after);
}
END_TEST

/* A server's compute worker may run SCHED_BATCH at a higher nice value; its
 * helpers must too, and a normal caller's must not. */
START_TEST(helpers_run_at_their_callers_policy_and_nice)
{
    caller_report batch = run_in_a_class(10, true);
    ck_assert_int_eq(batch.policy, SCHED_BATCH);
    ck_assert_int_eq(batch.failures, 0);
    ck_assert_msg(batch.helper_seen, "no helper ran a unit");
    ck_assert_msg(batch.wrong_class_units == 0,
                  "%d units of a SCHED_BATCH nice %d caller ran in another class",
                  batch.wrong_class_units, batch.nice);
    caller_report normal = run_in_a_class(0, false);
    ck_assert_int_eq(normal.policy, SCHED_OTHER);
    ck_assert_msg(normal.wrong_class_units == 0,
                  "%d units of a SCHED_OTHER nice %d caller ran in another class",
                  normal.wrong_class_units, normal.nice);
    caller_report nicer = run_in_a_class(6, false);
    ck_assert_msg(nicer.wrong_class_units == 0,
                  "%d units of a nice %d caller ran in another class",
                  nicer.wrong_class_units, nicer.nice);
}
END_TEST

/* ------------------------------------------------- callers side by side */

typedef struct {
    int threads;
    int calls;
    int failures;
} side_caller;

static void *calls_side_by_side(void *arg)
{
    side_caller *c = arg;
    for (int call = 0; call < c->calls; call++) {
        int64_t count = 1 + (call * 7) % 50;
        record r;
        record_init(&r, c->threads, count, false);
        attn_parallel_for(c->threads, count, record_unit, &r);
        for (int64_t i = 0; i < count; i++)
            c->failures += atomic_load(&r.runs[i]) != 1 || r.worker[i] < 0 ||
                           r.worker[i] >= c->threads ||
                           (r.worker[i] == 0) != (pthread_equal(r.thread[i], pthread_self()) != 0);
        record_free(&r);
    }
    return NULL;
}

/* Four threads calling at once (as a server's compute workers do), with
 * different thread counts, sharing one crew: every call gets every unit
 * exactly once, nobody waits forever. */
START_TEST(concurrent_callers_each_run_every_unit_once)
{
    side_caller callers[4] = {{2, 300, 0}, {3, 300, 0}, {4, 200, 0}, {2, 300, 0}};
    pthread_t t[4];
    for (int k = 0; k < 4; k++)
        ck_assert_int_eq(pthread_create(&t[k], NULL, calls_side_by_side, &callers[k]), 0);
    for (int k = 0; k < 4; k++)
        pthread_join(t[k], NULL);
    for (int k = 0; k < 4; k++)
        ck_assert_msg(callers[k].failures == 0, "caller %d (%d threads): %d units wrong", k,
                      callers[k].threads, callers[k].failures);
}
END_TEST

/* ------------------------------------------------------------- rest */

/* How many of this process's threads are libattn's helpers, and how many
 * of those are blocked ('S' in /proc/self/task/TID/stat). */
static void count_helpers(int *helpers, int *asleep)
{
    *helpers = *asleep = 0;
    DIR *d = opendir("/proc/self/task");
    ck_assert_ptr_nonnull(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], line[512];
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue; /* gone meanwhile */
        size_t n = fread(line, 1, sizeof line - 1, f);
        fclose(f);
        line[n] = '\0';
        /* "tid (name) state ...": the name may hold spaces, not ')' here */
        char *open = strchr(line, '('), *close = strrchr(line, ')');
        if (!open || !close || close[1] != ' ')
            continue;
        if (strncmp(open + 1, "attn-helper-", 12) != 0)
            continue;
        (*helpers)++;
        *asleep += close[2] == 'S';
    }
    closedir(d);
}

/* Told to rest right after a call, the helpers block (within a bound that
 * a busy machine's scheduling fits) and the next call still gets one of
 * them; resting with no call about changes nothing else. */
START_TEST(rested_helpers_block_and_serve_the_next_call)
{
    attn_threads_rest(); /* before any crew of this class: nothing to do */
    for (int round = 0; round < 3; round++) {
        record r;
        record_init(&r, 2, 64, true);
        attn_parallel_for(2, 64, record_unit, &r);
        attn_threads_rest();
        check_record(&r, pthread_self(), "a call before a rest");
        ck_assert_msg(atomic_load(&r.helper_ran), "round %d: no helper ran a unit", round);
        record_free(&r);
        int helpers = 0, asleep = 0;
        struct timespec pause = {0, 100 * 1000};
        for (int k = 0; k < 20000; k++) { /* 2 s */
            count_helpers(&helpers, &asleep);
            if (helpers > 0 && asleep == helpers)
                break;
            nanosleep(&pause, NULL);
        }
        ck_assert_msg(helpers > 0 && asleep == helpers,
                      "round %d: %d of %d helpers blocked after a rest", round, asleep,
                      helpers);
    }
}
END_TEST

typedef struct {
    atomic_bool stop;
    long rests;
} rester;

static void *rest_until_stopped(void *arg)
{
    rester *w = arg;
    while (!atomic_load(&w->stop)) {
        attn_threads_rest();
        w->rests++;
        sched_yield();
    }
    return NULL;
}

/* Rests said from another thread while four callers compute (a server's
 * worker resting beside others): every call still runs every unit once
 * and returns. */
START_TEST(rests_beside_callers_lose_no_unit)
{
    rester w = {.rests = 0};
    atomic_init(&w.stop, false);
    pthread_t rt;
    ck_assert_int_eq(pthread_create(&rt, NULL, rest_until_stopped, &w), 0);
    side_caller callers[4] = {{2, 200, 0}, {3, 200, 0}, {4, 150, 0}, {2, 200, 0}};
    pthread_t t[4];
    for (int k = 0; k < 4; k++)
        ck_assert_int_eq(pthread_create(&t[k], NULL, calls_side_by_side, &callers[k]), 0);
    for (int k = 0; k < 4; k++)
        pthread_join(t[k], NULL);
    atomic_store(&w.stop, true);
    pthread_join(rt, NULL);
    ck_assert_msg(w.rests > 0, "the resting thread never ran");
    for (int k = 0; k < 4; k++)
        ck_assert_msg(callers[k].failures == 0, "caller %d (%d threads): %d units wrong", k,
                      callers[k].threads, callers[k].failures);
}
END_TEST

/* ------------------------------------------------------------ nesting */

typedef struct {
    pthread_t outer_thread[12];
    atomic_int inner_runs[12][10];
    atomic_int wrong_inner;
} nest;

typedef struct {
    nest *n;
    int outer;
} inner_ctx;

static void inner_unit(void *ctx, int64_t i, int worker)
{
    inner_ctx *c = ctx;
    atomic_fetch_add(&c->n->inner_runs[c->outer][i], 1);
    if (worker != 0 || !pthread_equal(pthread_self(), c->n->outer_thread[c->outer]))
        atomic_fetch_add(&c->n->wrong_inner, 1);
}

static void outer_unit(void *ctx, int64_t i, int worker)
{
    (void)worker;
    nest *n = ctx;
    n->outer_thread[i] = pthread_self();
    inner_ctx c = {n, (int)i};
    attn_parallel_for(4, 10, inner_unit, &c);
}

/* A call from inside a unit runs on that unit's thread alone, as worker
 * 0: the outer call already has its threads, and waiting on helpers busy
 * with the outer call could never end. */
START_TEST(nested_call_runs_inline_on_its_units_thread)
{
    nest *n = xcalloc(1, sizeof *n);
    attn_parallel_for(3, 12, outer_unit, n);
    for (int o = 0; o < 12; o++)
        for (int i = 0; i < 10; i++)
            ck_assert_msg(atomic_load(&n->inner_runs[o][i]) == 1,
                          "outer unit %d: inner unit %d ran %d times", o, i,
                          atomic_load(&n->inner_runs[o][i]));
    ck_assert_msg(atomic_load(&n->wrong_inner) == 0,
                  "%d inner units ran on another thread or worker", atomic_load(&n->wrong_inner));
    free(n);
}
END_TEST

/* ------------------------------------------------------ cancellation */

typedef struct {
    atomic_int flag;
    int64_t set_at;           /* the unit that sets the flag */
    atomic_int *runs;
    atomic_int after;         /* units that began with the flag already set */
} cancel_ctx;

static void cancel_unit(void *ctx, int64_t i, int worker)
{
    (void)worker;
    cancel_ctx *c = ctx;
    if (atomic_load(&c->flag))
        atomic_fetch_add(&c->after, 1);
    atomic_fetch_add(&c->runs[i], 1);
    if (i == c->set_at)
        atomic_store(&c->flag, 1);
    /* A unit long enough that the others are not all taken meanwhile. */
    struct timespec t = {0, 200000};
    nanosleep(&t, NULL);
}

/* attn_parallel_for_until starts no unit once the flag is set: on one
 * thread exactly the units up to the one that set it ran; on more, each
 * other worker may have been between its look at the flag and its unit,
 * and no more; no unit ran twice; a NULL flag runs them all. */
START_TEST(cancelled_loop_starts_no_unit_after_the_flag)
{
    const int64_t count = 400;
    for (int threads = 1; threads <= 3; threads++) {
        cancel_ctx c = {.set_at = 5, .runs = xcalloc((size_t)count, sizeof(atomic_int))};
        attn_parallel_for_until(threads, count, cancel_unit, &c, &c.flag);
        int64_t ran = 0;
        for (int64_t i = 0; i < count; i++) {
            ck_assert_msg(atomic_load(&c.runs[i]) <= 1, "unit %lld ran twice", (long long)i);
            ran += atomic_load(&c.runs[i]);
        }
        ck_assert_msg(atomic_load(&c.runs[c.set_at]) == 1, "the unit that cancels never ran");
        if (threads == 1)
            ck_assert_msg(ran == c.set_at + 1, "1 thread: %lld units ran, want %lld",
                          (long long)ran, (long long)c.set_at + 1);
        ck_assert_msg(atomic_load(&c.after) <= threads - 1,
                      "%d threads: %d units started after the flag was set", threads,
                      atomic_load(&c.after));
        ck_assert_msg(ran < count / 4, "%d threads: %lld of %lld units ran", threads,
                      (long long)ran, (long long)count);
        free(c.runs);

        cancel_ctx all = {.set_at = -1, .runs = xcalloc((size_t)count, sizeof(atomic_int))};
        attn_parallel_for_until(threads, count / 8, cancel_unit, &all, NULL);
        for (int64_t i = 0; i < count / 8; i++)
            ck_assert_int_eq(atomic_load(&all.runs[i]), 1);
        free(all.runs);
    }
}
END_TEST

/* ---------------------------------------------------------------- fork */

/* A child forked after the parent's calls has none of its helpers; its
 * own calls start new ones (a helper takes part). */
START_TEST(forked_child_gets_helpers_of_its_own)
{
    record r;
    record_init(&r, 2, 64, true);
    attn_parallel_for(2, 64, record_unit, &r);
    record_free(&r);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        record c;
        record_init(&c, 2, 64, true);
        attn_parallel_for(2, 64, record_unit, &c);
        bool ok = atomic_load(&c.helper_ran);
        for (int64_t i = 0; i < 64; i++)
            ok = ok && atomic_load(&c.runs[i]) == 1;
        record_free(&c);
        /* _exit: LeakSanitizer, at exit, would count the parent's threads,
         * still in its registry, as threads it could not stop. */
        _exit(ok ? 0 : 3);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "child: status %d (3: a unit ran twice or no helper took part)", status);
}
END_TEST

/* ---------------------------------------------------------- attention */

typedef struct {
    float *out, *dq, *dk, *dv;
} results;

static results compute(const sdpa_case *c, int threads)
{
    attn_sdpa_params p = c->lib;
    p.threads = threads;
    results r = {nan_floats(c->n_out), nan_floats(c->n_qel), nan_floats(c->n_kel),
                 nan_floats(c->n_vel)};
    attn_softmax_row *rows = xcalloc(c->n_rows, sizeof *rows);
    attn_error err = {0};
    attn_status st = attn_sdpa_forward(&p, c->q, c->k, c->v, r.out, rows, NULL, NULL, &err);
    ck_assert_msg(st == ATTN_OK, "forward: %s", err.message);
    st = attn_sdpa_backward(&p, c->q, c->k, c->v, r.out, rows, c->dout, r.dq, r.dk, r.dv, &err);
    ck_assert_msg(st == ATTN_OK, "backward: %s", err.message);
    free(rows);
    return r;
}

static void results_free(results *r)
{
    free(r->out);
    free(r->dq);
    free(r->dk);
    free(r->dv);
}

static bool same_bits(const sdpa_case *c, const results *a, const results *b)
{
    return memcmp(a->out, b->out, c->n_out * sizeof(float)) == 0 &&
           memcmp(a->dq, b->dq, c->n_qel * sizeof(float)) == 0 &&
           memcmp(a->dk, b->dk, c->n_kel * sizeof(float)) == 0 &&
           memcmp(a->dv, b->dv, c->n_vel * sizeof(float)) == 0;
}

typedef struct {
    const sdpa_case *c;
    int threads;
    results r;
} attention_caller;

static void *attention_beside(void *arg)
{
    attention_caller *a = arg;
    a->r = compute(a->c, a->threads);
    return NULL;
}

/* Which helper runs which unit changes nothing: for each thread count, the
 * forward and backward give the same bits call after call and from two
 * callers at once (GQA, causal, shapes off the tiles, enough work that the
 * helpers take part). */
START_TEST(attention_bit_identical_across_calls_and_callers)
{
    attn_sdpa_params p = sdpa_shape(2, 4, 2, 333, 290, 40, 24);
    p.causal = true;
    sdpa_case c;
    case_init(&c, &p, 4100, 2.0);
    for (int threads = 1; threads <= 4; threads++) {
        results first = compute(&c, threads);
        results again = compute(&c, threads);
        ck_assert_msg(same_bits(&c, &first, &again), "threads %d: a second call differs",
                      threads);
        attention_caller side[2] = {{&c, threads, {0}}, {&c, threads, {0}}};
        pthread_t t[2];
        for (int k = 0; k < 2; k++)
            ck_assert_int_eq(pthread_create(&t[k], NULL, attention_beside, &side[k]), 0);
        for (int k = 0; k < 2; k++)
            pthread_join(t[k], NULL);
        for (int k = 0; k < 2; k++) {
            ck_assert_msg(same_bits(&c, &first, &side[k].r),
                          "threads %d: caller %d beside another differs", threads, k);
            results_free(&side[k].r);
        }
        results_free(&first);
        results_free(&again);
    }
    case_free(&c);
}
END_TEST

/* --------------------------------------------------------------- suite */

static Suite *parallel_suite(void)
{
    Suite *s = suite_create("parallel");
    /* kernel: the group's results depend on libattn's kernel, and make test
     * runs it once per kernel (the tag "kernel", tests/run-suites.sh). */
    struct {
        const char *name;
        bool kernel;
        const TTest *tests[8];
    } groups[] = {
        {"units", false,
         {every_unit_runs_once_on_a_worker_below_threads,
          more_threads_than_helpers_runs_every_unit, a_helper_runs_units_of_the_call}},
        {"helpers", false,
         {helpers_outlive_the_call, helpers_run_at_their_callers_policy_and_nice}},
        {"callers", false,
         {concurrent_callers_each_run_every_unit_once,
          nested_call_runs_inline_on_its_units_thread, forked_child_gets_helpers_of_its_own}},
        {"cancel", false, {cancelled_loop_starts_no_unit_after_the_flag}},
        {"rest", false,
         {rested_helpers_block_and_serve_the_next_call, rests_beside_callers_lose_no_unit}},
        {"attention", true, {attention_bit_identical_across_calls_and_callers}},
    };
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        TCase *tc = tcase_create(groups[g].name);
        if (groups[g].kernel)
            tcase_set_tags(tc, "kernel");
        /* Generous: the sanitizer build at -O1 is several times slower. */
        tcase_set_timeout(tc, 120);
        for (size_t t = 0; t < 8 && groups[g].tests[t]; t++)
            tcase_add_test(tc, groups[g].tests[t]);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(parallel_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
