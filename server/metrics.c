/*
 * Prometheus counters. Every request touches a handful of relaxed atomics and
 * nothing else, so the I/O threads never wait on each other to count; the
 * /metrics handler reads them one by one (a scrape may be a request or two
 * out of step between series, which Prometheus tolerates).
 */
#include "server.h"

#include "json/codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define relaxed_load(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define relaxed_add(x, v) atomic_fetch_add_explicit(&(x), (v), memory_order_relaxed)

/* The statuses attnd produces; anything else is counted under "other". */
static const int statuses[METRICS_N_STATUS] = {200, 204, 400, 401, 404, 405, 413, 414,
                                               415, 422, 431, 499, 500, 501, 503};

/* Latency buckets in seconds: from a cached /healthz (~50 us) to a large
 * multi-head gradient (tens of seconds). */
static const double buckets[METRICS_N_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};

void metrics_init(srv_metrics *m, const char *const *labels, int n)
{
    if (n > ROUTES_MAX)
        n = ROUTES_MAX;
    for (int i = 0; i < n; i++)
        m->labels[i] = labels[i];
    m->labels[n] = "other";
    m->n_labels = n + 1;
}

void metrics_request_start(srv_metrics *m)
{
    atomic_fetch_add_explicit(&m->in_flight, 1, memory_order_relaxed);
}

void metrics_request_done(srv_metrics *m, int label, int status, double seconds,
                          size_t bytes_in, size_t bytes_out)
{
    if (label < 0 || label >= m->n_labels)
        label = m->n_labels - 1;
    srv_route_counters *c = &m->counters[label];
    size_t s = 0;
    while (s < METRICS_N_STATUS && statuses[s] != status)
        s++;
    relaxed_add(c->requests[s], 1);
    size_t b = 0;
    while (b < METRICS_N_BUCKETS && seconds > buckets[b])
        b++;
    relaxed_add(c->bucket[b], 1);
    relaxed_add(c->duration_ns, (unsigned long)(seconds * 1e9));
    relaxed_add(m->bytes_received, bytes_in);
    relaxed_add(m->bytes_sent, bytes_out);
    /* Release: whoever sees the count drop sees everything this request did. */
    atomic_fetch_sub_explicit(&m->in_flight, 1, memory_order_release);
}

long metrics_in_flight(srv_metrics *m)
{
    return atomic_load_explicit(&m->in_flight, memory_order_acquire);
}

char *metrics_render(srv_server *srv, size_t *len)
{
    srv_metrics *m = &srv->metrics;
    codec_buf t = {0};

    codec_buf_printf(&t, "# HELP attnd_requests_total HTTP requests answered, by route and status.\n"
            "# TYPE attnd_requests_total counter\n");
    for (int r = 0; r < m->n_labels; r++)
        for (size_t s = 0; s <= METRICS_N_STATUS; s++) {
            unsigned long v = relaxed_load(m->counters[r].requests[s]);
            if (!v)
                continue;
            if (s < METRICS_N_STATUS)
                codec_buf_printf(&t, "attnd_requests_total{route=\"%s\",status=\"%d\"} %lu\n",
                    m->labels[r], statuses[s], v);
            else
                codec_buf_printf(&t, "attnd_requests_total{route=\"%s\",status=\"other\"} %lu\n",
                    m->labels[r], v);
        }

    codec_buf_printf(&t, "# HELP attnd_request_duration_seconds Time from the request's headers to "
            "its last response byte.\n"
            "# TYPE attnd_request_duration_seconds histogram\n");
    for (int r = 0; r < m->n_labels; r++) {
        unsigned long cumulative = 0;
        for (size_t b = 0; b <= METRICS_N_BUCKETS; b++) {
            cumulative += relaxed_load(m->counters[r].bucket[b]);
            if (b < METRICS_N_BUCKETS)
                codec_buf_printf(&t, "attnd_request_duration_seconds_bucket{route=\"%s\",le=\"%g\"} %lu\n",
                    m->labels[r], buckets[b], cumulative);
            else
                codec_buf_printf(&t, "attnd_request_duration_seconds_bucket{route=\"%s\",le=\"+Inf\"} %lu\n",
                    m->labels[r], cumulative);
        }
        codec_buf_printf(&t, "attnd_request_duration_seconds_sum{route=\"%s\"} %.9f\n", m->labels[r],
            (double)relaxed_load(m->counters[r].duration_ns) / 1e9);
        codec_buf_printf(&t, "attnd_request_duration_seconds_count{route=\"%s\"} %lu\n", m->labels[r],
            cumulative);
    }

    codec_buf_printf(&t, "# HELP attnd_in_flight_requests Requests received and not yet answered.\n"
            "# TYPE attnd_in_flight_requests gauge\n"
            "attnd_in_flight_requests %ld\n", relaxed_load(m->in_flight));
    codec_buf_printf(&t, "# HELP attnd_queue_depth Requests waiting for a compute slot.\n"
            "# TYPE attnd_queue_depth gauge\n"
            "attnd_queue_depth %d\n", compute_queue_depth(srv));
    codec_buf_printf(&t, "# HELP attnd_computing_requests Requests holding a compute slot.\n"
            "# TYPE attnd_computing_requests gauge\n"
            "attnd_computing_requests %d\n", compute_running(srv));
    codec_buf_printf(&t, "# HELP attnd_response_bytes_pending Bytes held by answers computed or "
            "being computed and not yet sent (bounded by --max-response).\n"
            "# TYPE attnd_response_bytes_pending gauge\n"
            "attnd_response_bytes_pending %.0f\n", compute_response_pending(srv));
    codec_buf_printf(&t, "# HELP attnd_log_dropped_total Log lines dropped because the log sink "
            "(stderr) was full.\n"
            "# TYPE attnd_log_dropped_total counter\n"
            "attnd_log_dropped_total %lu\n", log_dropped(&srv->log));
    codec_buf_printf(&t, "# HELP attnd_bytes_received_total Request body bytes received.\n"
            "# TYPE attnd_bytes_received_total counter\n"
            "attnd_bytes_received_total %lu\n", relaxed_load(m->bytes_received));
    codec_buf_printf(&t, "# HELP attnd_bytes_sent_total Response body bytes sent.\n"
            "# TYPE attnd_bytes_sent_total counter\n"
            "attnd_bytes_sent_total %lu\n", relaxed_load(m->bytes_sent));

    if (t.failed) {
        free(t.data);
        return NULL;
    }
    *len = t.len;
    return t.data;
}
