/*
 * The bounded compute queue. At most `threads` requests compute at once and
 * at most `queue` more wait for a slot; beyond that a request is refused at
 * once (503 overloaded) rather than left to time out.
 *
 * Small bodies are computed inline on the I/O thread that read them when a
 * slot is free and nobody waits: their work is microseconds, and handing them
 * to a worker would cost two thread wake-ups and the suspend/resume of the
 * connection, more than the attention itself. Everything else is handed to a
 * worker and the connection is suspended until the answer is ready, so the
 * I/O threads keep serving /healthz, /metrics and other connections while a
 * large request computes.
 *
 * Cores: libattn runs each call on lim.threads threads of its own. A request
 * that starts while nothing else computes or waits gets every core (the
 * configured `threads`); one that starts beside others gets one, so that a
 * busy server runs about one thread per core instead of threads^2.
 */
#include "server.h"

#include <pthread.h>
#include <stdlib.h>

/* Bodies up to this size are computed inline (see above): at most a few
 * thousand numbers, typically microseconds of attention. A small body can
 * still ask for more (many heads over a long x in /v1/multihead); then one
 * I/O thread is busy for that long while the others keep serving, and
 * --max-work bounds it. Measured on 2 cores, inline saves ~40% of the CPU
 * time of a tiny request (10 us instead of 16-20 us). */
#define INLINE_MAX_BODY 4096

static void run(srv_request *r, int others)
{
    const srv_server *srv = r->srv;
    api_limits lim = {.max_work = srv->cfg->max_work,
                      .threads = others == 0 ? srv->compute.slots : 1};
    api_handle(r->route->op, r->body, r->body_len, &lim, &r->res);
}

static void *worker_main(void *arg)
{
    srv_compute *q = &((srv_server *)arg)->compute;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        while (!q->stopping && !(q->head && q->running < q->slots))
            pthread_cond_wait(&q->work, &q->lock);
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

        run(r, others);

        pthread_mutex_lock(&q->lock);
        q->running--;
        pthread_cond_signal(&q->work);
        pthread_mutex_unlock(&q->lock);
        atomic_store(&r->computed, true);
        http_resume(r);
        pthread_mutex_lock(&q->lock);
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
    q->running = q->waiting = 0;
    q->head = q->tail = NULL;
    q->stopping = false;
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
    pthread_mutex_lock(&q->lock);
    if (q->running < q->slots && q->waiting == 0 && r->body_len <= INLINE_MAX_BODY) {
        int others = q->running++;
        pthread_mutex_unlock(&q->lock);
        run(r, others);
        pthread_mutex_lock(&q->lock);
        q->running--;
        if (q->waiting)
            pthread_cond_signal(&q->work);
        pthread_mutex_unlock(&q->lock);
        return COMPUTE_DONE;
    }
    if (q->running + q->waiting >= q->slots + q->queue_max) {
        pthread_mutex_unlock(&q->lock);
        return COMPUTE_OVERLOADED;
    }
    q->waiting++; /* the place is taken now; the request joins the list below */
    pthread_mutex_unlock(&q->lock);

    /* Suspended before any worker can see it, so that the worker's resume
     * always finds a suspended connection. */
    atomic_store(&r->computed, false);
    MHD_suspend_connection(r->conn);
    r->next = NULL;
    pthread_mutex_lock(&q->lock);
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->lock);
    return COMPUTE_QUEUED;
}

int compute_queue_depth(srv_server *srv)
{
    srv_compute *q = &srv->compute;
    pthread_mutex_lock(&q->lock);
    int n = q->waiting;
    pthread_mutex_unlock(&q->lock);
    return n;
}

int compute_running(srv_server *srv)
{
    srv_compute *q = &srv->compute;
    pthread_mutex_lock(&q->lock);
    int n = q->running;
    pthread_mutex_unlock(&q->lock);
    return n;
}

void compute_stop(srv_server *srv)
{
    srv_compute *q = &srv->compute;
    pthread_mutex_lock(&q->lock);
    q->stopping = true;
    pthread_cond_broadcast(&q->work);
    pthread_mutex_unlock(&q->lock);
    for (int i = 0; i < q->n_workers; i++)
        pthread_join(q->workers[i], NULL);
    free(q->workers);
    q->workers = NULL;
    q->n_workers = 0;
}
