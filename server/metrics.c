/*
 * Prometheus counters. Every request touches a handful of relaxed atomics and
 * nothing else, so the I/O threads never wait on each other to count; the
 * /metrics handler reads them one by one (a scrape may be a request or two
 * out of step between series, which Prometheus tolerates).
 */
#include "server.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define relaxed_load(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define relaxed_add(x, v) atomic_fetch_add_explicit(&(x), (v), memory_order_relaxed)

/* The statuses attnd produces; anything else is counted under "other". */
static const int statuses[] = {200, 204, 400, 404, 405, 413, 415, 422, 500, 503, 0};
#define N_STATUS (sizeof statuses / sizeof statuses[0])

/* Latency buckets in seconds: from a cached /healthz (~50 us) to a large
 * multi-head gradient (tens of seconds). */
static const double buckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                 0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                 1,      2.5,     5,      10,    30,     60};
#define N_BUCKETS (sizeof buckets / sizeof buckets[0])

typedef struct {
    atomic_ulong requests[N_STATUS];
    atomic_ulong bucket[N_BUCKETS + 1]; /* the last one is +Inf */
    atomic_ulong duration_ns;
} route_counters;

static const char *route_labels[METRICS_MAX_ROUTES + 1];
static int n_labels;
static route_counters counters[METRICS_MAX_ROUTES + 1];
static atomic_long in_flight;
static atomic_ulong bytes_received, bytes_sent;

void metrics_init(const char *const *labels, int n)
{
    if (n > METRICS_MAX_ROUTES)
        n = METRICS_MAX_ROUTES;
    for (int i = 0; i < n; i++)
        route_labels[i] = labels[i];
    route_labels[n] = "other";
    n_labels = n + 1;
}

void metrics_request_done(int label, int status, double seconds, size_t bytes_in,
                          size_t bytes_out)
{
    if (label < 0 || label >= n_labels)
        label = n_labels - 1;
    route_counters *c = &counters[label];
    size_t s = 0;
    while (statuses[s] && statuses[s] != status)
        s++;
    relaxed_add(c->requests[s], 1);
    size_t b = 0;
    while (b < N_BUCKETS && seconds > buckets[b])
        b++;
    relaxed_add(c->bucket[b], 1);
    relaxed_add(c->duration_ns, (unsigned long)(seconds * 1e9));
    relaxed_add(bytes_received, bytes_in);
    relaxed_add(bytes_sent, bytes_out);
}

void metrics_in_flight(int delta)
{
    relaxed_add(in_flight, delta);
}

typedef struct {
    char *data;
    size_t len, cap;
    bool failed;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...)
{
    if (t->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->data + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap * 2 + (size_t)n;
        char *p = realloc(t->data, cap);
        if (!p) {
            t->failed = true;
            return;
        }
        t->data = p;
        t->cap = cap;
    }
}

char *metrics_render(size_t *len)
{
    text t = {.cap = 8192};
    t.data = malloc(t.cap);
    if (!t.data)
        return NULL;

    put(&t, "# HELP attnd_requests_total HTTP requests answered, by route and status.\n"
            "# TYPE attnd_requests_total counter\n");
    for (int r = 0; r < n_labels; r++)
        for (size_t s = 0; s < N_STATUS; s++) {
            unsigned long v = relaxed_load(counters[r].requests[s]);
            if (!v)
                continue;
            if (statuses[s])
                put(&t, "attnd_requests_total{route=\"%s\",status=\"%d\"} %lu\n",
                    route_labels[r], statuses[s], v);
            else
                put(&t, "attnd_requests_total{route=\"%s\",status=\"other\"} %lu\n",
                    route_labels[r], v);
        }

    put(&t, "# HELP attnd_request_duration_seconds Time from the request's headers to "
            "its last response byte.\n"
            "# TYPE attnd_request_duration_seconds histogram\n");
    for (int r = 0; r < n_labels; r++) {
        unsigned long cumulative = 0;
        for (size_t b = 0; b <= N_BUCKETS; b++) {
            cumulative += relaxed_load(counters[r].bucket[b]);
            if (b < N_BUCKETS)
                put(&t, "attnd_request_duration_seconds_bucket{route=\"%s\",le=\"%g\"} %lu\n",
                    route_labels[r], buckets[b], cumulative);
            else
                put(&t, "attnd_request_duration_seconds_bucket{route=\"%s\",le=\"+Inf\"} %lu\n",
                    route_labels[r], cumulative);
        }
        put(&t, "attnd_request_duration_seconds_sum{route=\"%s\"} %.9f\n", route_labels[r],
            (double)relaxed_load(counters[r].duration_ns) / 1e9);
        put(&t, "attnd_request_duration_seconds_count{route=\"%s\"} %lu\n", route_labels[r],
            cumulative);
    }

    put(&t, "# HELP attnd_in_flight_requests Requests received and not yet answered.\n"
            "# TYPE attnd_in_flight_requests gauge\n"
            "attnd_in_flight_requests %ld\n", relaxed_load(in_flight));
    put(&t, "# HELP attnd_queue_depth Requests waiting for a compute slot.\n"
            "# TYPE attnd_queue_depth gauge\n"
            "attnd_queue_depth %d\n", compute_queue_depth());
    put(&t, "# HELP attnd_computing_requests Requests holding a compute slot.\n"
            "# TYPE attnd_computing_requests gauge\n"
            "attnd_computing_requests %d\n", compute_running());
    put(&t, "# HELP attnd_bytes_received_total Request body bytes received.\n"
            "# TYPE attnd_bytes_received_total counter\n"
            "attnd_bytes_received_total %lu\n", relaxed_load(bytes_received));
    put(&t, "# HELP attnd_bytes_sent_total Response body bytes sent.\n"
            "# TYPE attnd_bytes_sent_total counter\n"
            "attnd_bytes_sent_total %lu\n", relaxed_load(bytes_sent));

    if (t.failed) {
        free(t.data);
        return NULL;
    }
    *len = t.len;
    return t.data;
}
