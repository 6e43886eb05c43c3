/*
 * Prometheus metrics, named and typed as Prometheus' conventions ask (base
 * units, `_total` counters, `_seconds` histograms with `_bucket`, `_sum`
 * and `_count`, the client libraries' standard `process_*` family).
 *
 * Every request touches a handful of relaxed atomics and nothing else, so
 * the I/O threads never wait on each other to count; the /metrics handler
 * reads them one by one (a scrape may be a request or two out of step
 * between series, which Prometheus tolerates). The process_* values are
 * read from /proc when scraped.
 */
#include "server.h"

#include "json/codec.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define relaxed_load(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define relaxed_add(x, v) atomic_fetch_add_explicit(&(x), (v), memory_order_relaxed)

/* The statuses attnd produces; anything else is counted under "other". */
static const int statuses[METRICS_N_STATUS] = {200, 204, 400, 401, 404, 405, 413, 414,
                                               415, 422, 431, 499, 500, 501, 503};

/* Buckets in seconds: from a cached /healthz (~50 us) to a large multi-head
 * gradient (tens of seconds); the queue waits and computations of the
 * compute routes span the same range. */
static const double buckets[METRICS_N_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};

static void observe(srv_histogram *h, double seconds)
{
    if (!(seconds > 0))
        seconds = 0;
    size_t b = 0;
    while (b < METRICS_N_BUCKETS && seconds > buckets[b])
        b++;
    relaxed_add(h->bucket[b], 1);
    relaxed_add(h->sum_ns, (unsigned long)(seconds * 1e9));
}

/* When this process started, in seconds since the epoch, as the client
 * libraries report it: the kernel's boot time plus the process's start in
 * clock ticks after it (/proc/stat btime, /proc/self/stat field 22); the
 * time of this call where /proc cannot say. */
static double process_start_time(void)
{
    double now = (double)time(NULL);
    FILE *f = fopen("/proc/self/stat", "r");
    char buf[1024];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long ticks = 0;
    /* after ')': field 3 (state) is the first; starttime is field 22 */
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    if (!p || sscanf(p + 1, "%llu", &ticks) != 1)
        return now;
    f = fopen("/proc/stat", "r");
    unsigned long long btime = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "btime %llu", &btime) == 1)
            break;
    if (f)
        fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    if (!btime || hz <= 0)
        return now;
    return (double)btime + (double)ticks / (double)hz;
}

void metrics_init(srv_metrics *m, const char *const *labels, const bool *computes, int n)
{
    if (n > ROUTES_MAX)
        n = ROUTES_MAX;
    for (int i = 0; i < n; i++) {
        m->labels[i] = labels[i];
        m->computes[i] = computes[i];
    }
    m->labels[n] = "other";
    m->computes[n] = false;
    m->n_labels = n + 1;
    m->start_time = process_start_time();
}

static srv_route_counters *counters(srv_metrics *m, int label)
{
    if (label < 0 || label >= m->n_labels)
        label = m->n_labels - 1;
    return &m->counters[label];
}

void metrics_request_start(srv_metrics *m, int label)
{
    relaxed_add(counters(m, label)->in_flight, 1);
    atomic_fetch_add_explicit(&m->in_flight, 1, memory_order_relaxed);
}

void metrics_request_done(srv_metrics *m, int label, int status, double seconds,
                          size_t bytes_in, size_t bytes_out)
{
    srv_route_counters *c = counters(m, label);
    size_t s = 0;
    while (s < METRICS_N_STATUS && statuses[s] != status)
        s++;
    relaxed_add(c->requests[s], 1);
    observe(&c->duration, seconds);
    relaxed_add(m->bytes_received, bytes_in);
    relaxed_add(m->bytes_sent, bytes_out);
    relaxed_add(c->in_flight, -1);
    /* Release: whoever sees the count drop sees everything this request did. */
    atomic_fetch_sub_explicit(&m->in_flight, 1, memory_order_release);
}

long metrics_in_flight(srv_metrics *m)
{
    return atomic_load_explicit(&m->in_flight, memory_order_acquire);
}

void metrics_queued(srv_metrics *m, int label, int delta)
{
    relaxed_add(counters(m, label)->queued, delta);
}

void metrics_computed(srv_metrics *m, int label, double wait_seconds, double compute_seconds)
{
    srv_route_counters *c = counters(m, label);
    observe(&c->queue_wait, wait_seconds);
    observe(&c->compute, compute_seconds);
}

/* One histogram's series for one route. */
static void put_histogram(codec_buf *t, const char *name, const char *route, const srv_histogram *h)
{
    unsigned long cumulative = 0;
    for (size_t b = 0; b <= METRICS_N_BUCKETS; b++) {
        cumulative += relaxed_load(h->bucket[b]);
        if (b < METRICS_N_BUCKETS)
            codec_buf_printf(t, "%s_bucket{route=\"%s\",le=\"%g\"} %lu\n", name, route, buckets[b],
                             cumulative);
        else
            codec_buf_printf(t, "%s_bucket{route=\"%s\",le=\"+Inf\"} %lu\n", name, route,
                             cumulative);
    }
    codec_buf_printf(t, "%s_sum{route=\"%s\"} %.9f\n", name, route,
                     (double)relaxed_load(h->sum_ns) / 1e9);
    codec_buf_printf(t, "%s_count{route=\"%s\"} %lu\n", name, route, cumulative);
}

/* A label value as the text format wants it: \\, \" and \n escaped. */
static void put_label_value(codec_buf *t, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '\\' || *s == '"')
            codec_buf_printf(t, "\\%c", *s);
        else if (*s == '\n')
            codec_buf_printf(t, "\\n");
        else
            codec_buf_printf(t, "%c", *s);
    }
}

static void put_build_info(codec_buf *t)
{
    api_info info;
    api_get_info(&info);
    codec_buf_printf(t,
                     "# HELP attnd_build_info attnd's version, and the libattn, kernel and BLAS it "
                     "runs; always 1.\n"
                     "# TYPE attnd_build_info gauge\n"
                     "attnd_build_info{version=\"");
    put_label_value(t, ATTND_VERSION);
    codec_buf_printf(t, "\",libattn=\"");
    put_label_value(t, info.libattn);
    codec_buf_printf(t, "\",kernel=\"");
    put_label_value(t, info.kernel);
    codec_buf_printf(t, "\",blas=\"");
    put_label_value(t, info.blas_config);
    codec_buf_printf(t, "\",blas_core=\"");
    put_label_value(t, info.blas_corename);
    codec_buf_printf(t, "\"} 1\n");
}

/* The process_* family of the Prometheus client libraries, from /proc. */
static void put_process(codec_buf *t, const srv_metrics *m)
{
    struct timespec cpu;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu) == 0)
        codec_buf_printf(t,
                         "# HELP process_cpu_seconds_total Total user and system CPU time spent in "
                         "seconds.\n"
                         "# TYPE process_cpu_seconds_total counter\n"
                         "process_cpu_seconds_total %.6f\n",
                         (double)cpu.tv_sec + (double)cpu.tv_nsec * 1e-9);
    int fds = 0;
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e; d && (e = readdir(d));)
        fds += e->d_name[0] != '.';
    if (d) {
        closedir(d);
        /* less the one the listing itself held open */
        codec_buf_printf(t,
                         "# HELP process_open_fds Number of open file descriptors.\n"
                         "# TYPE process_open_fds gauge\n"
                         "process_open_fds %d\n",
                         fds - 1);
    }
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
        codec_buf_printf(t,
                         "# HELP process_max_fds Maximum number of open file descriptors.\n"
                         "# TYPE process_max_fds gauge\n"
                         "process_max_fds %llu\n",
                         (unsigned long long)lim.rlim_cur);
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0, resident = 0;
    bool statm = f && fscanf(f, "%llu %llu", &pages, &resident) == 2;
    if (f)
        fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    if (statm && page > 0)
        codec_buf_printf(t,
                         "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
                         "# TYPE process_virtual_memory_bytes gauge\n"
                         "process_virtual_memory_bytes %llu\n"
                         "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                         "# TYPE process_resident_memory_bytes gauge\n"
                         "process_resident_memory_bytes %llu\n",
                         pages * (unsigned long long)page, resident * (unsigned long long)page);
    codec_buf_printf(t,
                     "# HELP process_start_time_seconds Start time of the process since unix "
                     "epoch in seconds.\n"
                     "# TYPE process_start_time_seconds gauge\n"
                     "process_start_time_seconds %.2f\n",
                     m->start_time);
}

char *metrics_render(srv_server *srv, size_t *len)
{
    srv_metrics *m = &srv->metrics;
    codec_buf t = {0};

    codec_buf_printf(&t,
                     "# HELP attnd_requests_total HTTP requests answered, by route and status.\n"
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
    for (int r = 0; r < m->n_labels; r++)
        put_histogram(&t, "attnd_request_duration_seconds", m->labels[r],
                      &m->counters[r].duration);
    codec_buf_printf(&t,
                     "# HELP attnd_queue_wait_seconds Time a computed request waited for a compute "
                     "slot (0 when one was free).\n"
                     "# TYPE attnd_queue_wait_seconds histogram\n");
    for (int r = 0; r < m->n_labels; r++)
        if (m->computes[r])
            put_histogram(&t, "attnd_queue_wait_seconds", m->labels[r],
                          &m->counters[r].queue_wait);
    codec_buf_printf(&t, "# HELP attnd_compute_duration_seconds Time a request spent computing "
                         "(meta.timing_ms.compute).\n"
                         "# TYPE attnd_compute_duration_seconds histogram\n");
    for (int r = 0; r < m->n_labels; r++)
        if (m->computes[r])
            put_histogram(&t, "attnd_compute_duration_seconds", m->labels[r], &m->counters[r].compute);

    codec_buf_printf(&t,
                     "# HELP attnd_in_flight_requests Requests received and not yet answered, by "
                     "route.\n"
                     "# TYPE attnd_in_flight_requests gauge\n");
    for (int r = 0; r < m->n_labels; r++)
        codec_buf_printf(&t, "attnd_in_flight_requests{route=\"%s\"} %ld\n", m->labels[r],
                         relaxed_load(m->counters[r].in_flight));
    codec_buf_printf(&t, "# HELP attnd_queue_depth Requests waiting for a compute slot, by route.\n"
                         "# TYPE attnd_queue_depth gauge\n");
    for (int r = 0; r < m->n_labels; r++)
        if (m->computes[r])
            codec_buf_printf(&t, "attnd_queue_depth{route=\"%s\"} %ld\n", m->labels[r],
                             relaxed_load(m->counters[r].queued));
    codec_buf_printf(&t,
                     "# HELP attnd_computing_requests Requests holding a compute slot.\n"
                     "# TYPE attnd_computing_requests gauge\n"
                     "attnd_computing_requests %d\n",
                     compute_running(srv));
    codec_buf_printf(&t,
                     "# HELP attnd_response_bytes_pending Bytes held by answers computed or "
                     "being computed and not yet sent (bounded by --max-response).\n"
                     "# TYPE attnd_response_bytes_pending gauge\n"
                     "attnd_response_bytes_pending %.0f\n",
                     compute_response_pending(srv));
    codec_buf_printf(&t,
                     "# HELP attnd_memory_bytes_pending Estimated peak bytes of the requests "
                     "queued or computing (bounded by --max-memory).\n"
                     "# TYPE attnd_memory_bytes_pending gauge\n"
                     "attnd_memory_bytes_pending %.0f\n",
                     compute_memory_pending(srv));
    codec_buf_printf(&t,
                     "# HELP attnd_body_bytes Bytes of the request body buffers of every "
                     "connection (bounded by --max-body-memory).\n"
                     "# TYPE attnd_body_bytes gauge\n"
                     "attnd_body_bytes %lld\n",
                     (long long)atomic_load(&srv->body_memory));
    srv_conn_limit *cl = &srv->conn_limit;
    codec_buf_printf(&t,
                     "# HELP attnd_connections Client connections open.\n"
                     "# TYPE attnd_connections gauge\n"
                     "attnd_connections %d\n",
                     conn_limit_open_now(cl));
    codec_buf_printf(&t,
                     "# HELP attnd_connections_held Client connections held (counted against "
                     "--max-connections).\n"
                     "# TYPE attnd_connections_held gauge\n"
                     "attnd_connections_held %d\n",
                     conn_limit_held_now(cl));
    codec_buf_printf(&t,
                     "# HELP attnd_connections_refused_total Connections refused (a JSON 503 to "
                     "their first request, or closed at accept once their address has 16 "
                     "refusals waiting): past --max-conns-per-ip, from the address holding the "
                     "most under connection pressure, or with every connection busy.\n"
                     "# TYPE attnd_connections_refused_total counter\n"
                     "attnd_connections_refused_total{reason=\"per_ip_limit\"} %lu\n"
                     "attnd_connections_refused_total{reason=\"pressure\"} %lu\n"
                     "attnd_connections_refused_total{reason=\"full\"} %lu\n",
                     relaxed_load(cl->refusals[REFUSE_PER_IP]),
                     relaxed_load(cl->refusals[REFUSE_PRESSURE]),
                     relaxed_load(cl->refusals[REFUSE_FULL]));
    codec_buf_printf(&t,
                     "# HELP attnd_connections_closed_total Held connections that attnd closed: "
                     "the idlest, for a new connection at --max-connections; those whose "
                     "request headers missed --header-timeout; those whose body was still "
                     "arriving when the drain began.\n"
                     "# TYPE attnd_connections_closed_total counter\n"
                     "attnd_connections_closed_total{reason=\"idlest\"} %lu\n"
                     "attnd_connections_closed_total{reason=\"header_timeout\"} %lu\n"
                     "attnd_connections_closed_total{reason=\"drain\"} %lu\n",
                     relaxed_load(cl->sheds[SHED_IDLEST]),
                     relaxed_load(cl->sheds[SHED_HEADER_TIMEOUT]),
                     relaxed_load(cl->sheds[SHED_DRAIN]));
    codec_buf_printf(&t,
                     "# HELP attnd_log_dropped_total Log lines dropped because the log sink "
                     "(stderr) was full.\n"
                     "# TYPE attnd_log_dropped_total counter\n"
                     "attnd_log_dropped_total %lu\n",
                     log_dropped(&srv->log));
    codec_buf_printf(&t,
                     "# HELP attnd_bytes_received_total Request body bytes received.\n"
                     "# TYPE attnd_bytes_received_total counter\n"
                     "attnd_bytes_received_total %lu\n",
                     relaxed_load(m->bytes_received));
    codec_buf_printf(&t,
                     "# HELP attnd_bytes_sent_total Response body bytes sent.\n"
                     "# TYPE attnd_bytes_sent_total counter\n"
                     "attnd_bytes_sent_total %lu\n",
                     relaxed_load(m->bytes_sent));
    put_build_info(&t);
    put_process(&t, m);

    if (t.failed) {
        free(t.data);
        return NULL;
    }
    *len = t.len;
    return t.data;
}
