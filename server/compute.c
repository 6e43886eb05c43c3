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

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER;
static int slots, queue_max;
static int running; /* computing now */
static int waiting; /* admitted, not computing yet */
static srv_request *head, *tail;
static bool stopping;
static double max_work;
static pthread_t *workers;
static int n_workers;

static void run(srv_request *r, int others)
{
    api_limits lim = {.max_work = max_work, .threads = others == 0 ? slots : 1};
    api_handle(r->route->op, r->body, r->body_len, &lim, &r->res);
}

static void *worker_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (!stopping && !(head && running < slots))
            pthread_cond_wait(&work, &lock);
        if (!head)
            break; /* stopping, and nothing left */
        srv_request *r = head;
        head = r->next;
        if (!head)
            tail = NULL;
        waiting--;
        int others = running + waiting;
        running++;
        pthread_mutex_unlock(&lock);

        run(r, others);

        pthread_mutex_lock(&lock);
        running--;
        pthread_cond_signal(&work);
        pthread_mutex_unlock(&lock);
        atomic_store(&r->computed, true);
        http_resume(r);
        pthread_mutex_lock(&lock);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

bool compute_start(const attnd_config *cfg)
{
    slots = cfg->threads;
    queue_max = cfg->queue;
    max_work = cfg->max_work;
    stopping = false;
    workers = calloc((size_t)slots, sizeof *workers);
    if (!workers)
        return false;
    for (n_workers = 0; n_workers < slots; n_workers++)
        if (pthread_create(&workers[n_workers], NULL, worker_main, NULL) != 0)
            break;
    return n_workers > 0;
}

compute_result compute_submit(srv_request *r)
{
    pthread_mutex_lock(&lock);
    if (running < slots && waiting == 0 && r->body_len <= INLINE_MAX_BODY) {
        int others = running++;
        pthread_mutex_unlock(&lock);
        run(r, others);
        pthread_mutex_lock(&lock);
        running--;
        if (waiting)
            pthread_cond_signal(&work);
        pthread_mutex_unlock(&lock);
        return COMPUTE_DONE;
    }
    if (running + waiting >= slots + queue_max) {
        pthread_mutex_unlock(&lock);
        return COMPUTE_OVERLOADED;
    }
    waiting++; /* the place is taken now; the request joins the list below */
    pthread_mutex_unlock(&lock);

    /* Suspended before any worker can see it, so that the worker's resume
     * always finds a suspended connection. */
    atomic_store(&r->computed, false);
    MHD_suspend_connection(r->conn);
    r->next = NULL;
    pthread_mutex_lock(&lock);
    if (tail)
        tail->next = r;
    else
        head = r;
    tail = r;
    pthread_cond_signal(&work);
    pthread_mutex_unlock(&lock);
    return COMPUTE_QUEUED;
}

int compute_queue_depth(void)
{
    pthread_mutex_lock(&lock);
    int n = waiting;
    pthread_mutex_unlock(&lock);
    return n;
}

int compute_running(void)
{
    pthread_mutex_lock(&lock);
    int n = running;
    pthread_mutex_unlock(&lock);
    return n;
}

void compute_stop(void)
{
    pthread_mutex_lock(&lock);
    stopping = true;
    pthread_cond_broadcast(&work);
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < n_workers; i++)
        pthread_join(workers[i], NULL);
    free(workers);
    workers = NULL;
    n_workers = 0;
}
