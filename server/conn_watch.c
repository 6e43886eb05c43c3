/*
 * The watcher: one thread that looks, every WATCH_PERIOD_MS, at the
 * connections nobody else is looking at.
 *
 *   - Deadlines (conn_limit.c): a request's headers that missed
 *     --header-timeout, a refused connection that did not ask in time, and,
 *     while draining, bodies still arriving: those connections are shed.
 *   - Clients gone: a connection queued for, or holding, a compute slot is
 *     suspended, so libmicrohttpd does not read it and would not notice its
 *     client leave until the answer failed to go out. Its socket is polled
 *     here instead; once the client has gone, the request is dropped: taken
 *     out of the queue if it still waits there (its place freed at once),
 *     or, if it computes, stopped through libattn's cancellation flag
 *     (api_limits.cancel) at its next unit of work. A compute worker also
 *     looks before it starts a request that waited in the queue for more
 *     than a millisecond (compute.c), so such a request whose client left
 *     while it queued is never started.
 * Either way the request ends as nginx's 499 in the log and the metrics.
 *   - Idle memory: the pool's blocks that no request has taken for
 *     POOL_IDLE_SECONDS are unmapped (pool.c), so that a server that has
 *     served a burst of large requests gives their memory back.
 */
#include "server.h"

#include <errno.h>
#include <time.h>

/* Often enough that a deadline is kept within 50 ms and an abandoned
 * computation stops within 50 ms and one unit of work; a wake-up costs a few
 * microseconds. */
#define WATCH_PERIOD_MS 50

/* The client of a computing connection has gone (conn_limit.c's lock held):
 * true when the request was still queued and is now ours to resume. */
static bool client_gone(srv_connection *cx, void *arg)
{
    (void)arg;
    srv_request *r = &cx->request;
    atomic_store(&r->cancel, 1);
    if (!compute_unqueue(r))
        return false; /* computing: its worker resumes it once libattn stops */
    atomic_store(&r->computed, true);
    return true;
}

static void *watch_main(void *arg)
{
    srv_server *srv = arg;
    srv_watch *w = &srv->watch;
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += WATCH_PERIOD_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!w->stop && pthread_cond_timedwait(&w->wake, &w->lock, &until) != ETIMEDOUT)
            ;
        if (w->stop)
            break;
        pthread_mutex_unlock(&w->lock);
        conn_limit_sweep(&srv->conn_limit, srv_now_coarse(), http_draining(srv));
        conn_limit_check_computing(&srv->conn_limit, client_gone, NULL);
        pool_reap(srv->pool, POOL_IDLE_SECONDS);
        pthread_mutex_lock(&w->lock);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

bool watch_start(srv_server *srv)
{
    srv_watch *w = &srv->watch;
    pthread_mutex_init(&w->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->wake, &attr);
    pthread_condattr_destroy(&attr);
    w->stop = false;
    w->running = pthread_create(&w->thread, NULL, watch_main, srv) == 0;
    return w->running;
}

void watch_stop(srv_server *srv)
{
    srv_watch *w = &srv->watch;
    if (!w->running)
        return;
    pthread_mutex_lock(&w->lock);
    w->stop = true;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    w->running = false;
    pthread_cond_destroy(&w->wake);
    pthread_mutex_destroy(&w->lock);
}
