/*
 * The access log and the few events around it, on stderr, as text or as one
 * JSON object per line.
 *
 * Logging never holds up serving. The threads that serve only ever copy a
 * line into a buffer of their own (as nginx's `access_log ... buffer=
 * flush=` does: a write(2) per request was a tenth of the CPU time of a small
 * request); one flusher thread takes the buffers (swapping in an empty one
 * under the buffer's lock, a pointer swap) and writes them to stderr. It
 * writes only what poll(2) says the sink can take, at most PIPE_BUF bytes at
 * a time, so that it never blocks either, and lines never interleave. When
 * nobody reads stderr (a full pipe), the buffers fill, and then new lines
 * are dropped and counted (attnd_log_dropped_total in /metrics); once the
 * sink takes lines again, one line says how many were lost.
 *
 * A buffer is written out at most LOG_FLUSH_MS after its first line, or as
 * soon as it is a quarter full, or at once for an event line; the flusher
 * sleeps while nothing is pending. At exit log_shutdown writes what is left,
 * waiting for a full sink at most LOG_EXIT_WAIT_MS.
 */
#include "server.h"

#include "json/codec.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* 128 KiB per thread: at ~50k lines/s per I/O thread (a small-request
 * benchmark) a quarter of it is ~8 ms of lines, well within reach of the
 * flusher, so a working sink never drops a line. */
#define LOG_BUFFER (128u * 1024)
#define LOG_WAKE_AT (LOG_BUFFER / 4)
#define LOG_FLUSH_MS 50
#define LOG_EXIT_WAIT_MS 1000

struct srv_log_buffer {
    pthread_mutex_t lock;
    size_t len;
    char *data;              /* LOG_BUFFER bytes; swapped by the flusher */
    srv_log_buffer *next;
};

/* This thread's buffer in the (one) log of the process: a cache of the
 * lookup, not state of its own. */
static _Thread_local srv_log_buffer *mine;

/* ---------------------------------------------------------------- sink */

/* Waits up to timeout_ms for stderr to take bytes. */
static bool sink_ready(int timeout_ms)
{
    struct pollfd p = {.fd = STDERR_FILENO, .events = POLLOUT};
    int n;
    do
        n = poll(&p, 1, timeout_ms);
    while (n < 0 && errno == EINTR);
    /* POLLERR/POLLHUP (nobody at the other end): the write fails at once
     * rather than blocking, so it is "ready" in the sense that matters. */
    return n > 0;
}

static size_t count_lines(const char *s, size_t n)
{
    size_t lines = 0;
    for (const char *p = s; (p = memchr(p, '\n', (size_t)(s + n - p))); p++)
        lines++;
    return lines;
}

/*
 * Writes s[0..n) (whole lines) to stderr in pieces of at most PIPE_BUF
 * bytes, each cut at a line end and written only when poll says the sink
 * has room: for a pipe that means a free page, so the write completes
 * without blocking and atomically. While the sink stays full it waits in
 * slices of LOG_FLUSH_MS, giving up (the rest counted as dropped) when
 * `give_up` says so or after `max_wait_ms` (-1: no limit). A failed write
 * (EBADF, EPIPE) drops the rest: there is nowhere else to say it.
 */
static bool sink_write(srv_log *log, const char *s, size_t n, int max_wait_ms,
                       const atomic_bool *give_up)
{
    int waited = 0;
    while (n > 0) {
        if (!sink_ready(LOG_FLUSH_MS)) {
            waited += LOG_FLUSH_MS;
            if ((give_up && atomic_load(give_up)) ||
                (max_wait_ms >= 0 && waited >= max_wait_ms))
                break;
            continue;
        }
        size_t k = n;
        if (k > PIPE_BUF) { /* cut after the last line end that fits */
            const char *nl = memrchr(s, '\n', PIPE_BUF);
            k = nl ? (size_t)(nl - s) + 1 : PIPE_BUF;
        }
        ssize_t w = write(STDERR_FILENO, s, k);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        s += w;
        n -= (size_t)w;
    }
    if (n == 0)
        return true;
    atomic_fetch_add(&log->dropped, count_lines(s, n) + (s[n - 1] != '\n'));
    return false;
}

/* ------------------------------------------------------------- flusher */

static void announce_drops(srv_log *log, char *line, size_t cap);
static size_t log_format_event(const srv_log *log, char *line, size_t cap, const char *level,
                               const char *msg);

/* Writes out every buffer, swapping each for `spare` (which comes back
 * holding the last one's old storage). Called without log->lock. After one
 * buffer gave up on a full sink, the others do not wait again. */
static void flush_round(srv_log *log, char **spare, int max_wait_ms)
{
    pthread_mutex_lock(&log->lock);
    srv_log_buffer *first = log->buffers; /* the list only ever grows at its head */
    pthread_mutex_unlock(&log->lock);
    for (srv_log_buffer *b = first; b; b = b->next) {
        pthread_mutex_lock(&b->lock);
        size_t n = b->len;
        char *full = b->data;
        if (n) {
            b->data = *spare;
            b->len = 0;
            *spare = full;
        }
        pthread_mutex_unlock(&b->lock);
        if (n && !sink_write(log, full, n, max_wait_ms, &log->flusher_stop))
            max_wait_ms = 0;
    }
    char line[200];
    announce_drops(log, line, sizeof line);
}

static void *flusher_main(void *arg)
{
    srv_log *log = arg;
    char *spare = log->spare;
    pthread_mutex_lock(&log->lock);
    while (!atomic_load(&log->flusher_stop)) {
        if (!log->pending) {
            pthread_cond_wait(&log->flush_wanted, &log->lock);
            continue;
        }
        if (!log->urgent) {
            /* Let a batch gather: one write for many requests. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += LOG_FLUSH_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&log->flush_wanted, &log->lock, &ts);
        }
        log->pending = log->urgent = false;
        pthread_mutex_unlock(&log->lock);
        flush_round(log, &spare, -1);
        pthread_mutex_lock(&log->lock);
    }
    pthread_mutex_unlock(&log->lock);
    log->spare = spare;
    return NULL;
}

static void wake_flusher(srv_log *log, bool urgent)
{
    pthread_mutex_lock(&log->lock);
    if (!log->pending || (urgent && !log->urgent)) {
        log->pending = true;
        log->urgent = log->urgent || urgent;
        pthread_cond_signal(&log->flush_wanted);
    }
    pthread_mutex_unlock(&log->lock);
}

void log_init(srv_log *log, log_format fmt)
{
    log->format = fmt;
    pthread_mutex_init(&log->lock, NULL);
    pthread_cond_init(&log->flush_wanted, NULL);
    log->buffers = NULL;
    log->pending = log->urgent = false;
    atomic_store(&log->dropped, 0);
    log->dropped_announced = 0;
    atomic_store(&log->flusher_stop, false);
    log->spare = malloc(LOG_BUFFER);
    log->flusher_running = log->spare &&
        pthread_create(&log->flusher, NULL, flusher_main, log) == 0;
}

/* Stops the flusher and writes out what the buffers hold; they stay, for
 * threads that may still log. */
static void stop_and_write_out(srv_log *log)
{
    if (log->flusher_running) {
        pthread_mutex_lock(&log->lock);
        atomic_store(&log->flusher_stop, true);
        pthread_cond_signal(&log->flush_wanted);
        pthread_mutex_unlock(&log->lock);
        /* The flusher gives up on a full sink within LOG_FLUSH_MS of the
         * stop, so this join is short. */
        pthread_join(log->flusher, NULL);
        log->flusher_running = false;
    }
    if (log->spare)
        flush_round(log, &log->spare, LOG_EXIT_WAIT_MS);
}

void log_flush(srv_log *log)
{
    stop_and_write_out(log);
}

void log_shutdown(srv_log *log)
{
    /* Only after http_stop: no I/O thread logs any more. */
    stop_and_write_out(log);
    pthread_mutex_lock(&log->lock);
    while (log->buffers) {
        srv_log_buffer *b = log->buffers;
        log->buffers = b->next;
        pthread_mutex_destroy(&b->lock);
        free(b->data);
        free(b);
    }
    mine = NULL;
    free(log->spare);
    log->spare = NULL;
    pthread_mutex_unlock(&log->lock);
}

unsigned long log_dropped(srv_log *log)
{
    return atomic_load_explicit(&log->dropped, memory_order_relaxed);
}

/* This thread's buffer, made on its first line; NULL without a flusher or
 * without memory. */
static srv_log_buffer *my_buffer(srv_log *log)
{
    if (mine)
        return mine;
    if (!log->flusher_running)
        return NULL;
    srv_log_buffer *b = malloc(sizeof *b);
    char *data = malloc(LOG_BUFFER);
    if (!b || !data) {
        free(b);
        free(data);
        return NULL;
    }
    pthread_mutex_init(&b->lock, NULL);
    b->len = 0;
    b->data = data;
    pthread_mutex_lock(&log->lock);
    b->next = log->buffers;
    log->buffers = b;
    pthread_mutex_unlock(&log->lock);
    return mine = b;
}

/* Queues one whole line (never blocks): dropped and counted when this
 * thread's buffer is full. Without a flusher (before log_init, after
 * log_shutdown) the line is written only if the sink has room now. */
static void emit(srv_log *log, const char *line, size_t len, bool urgent)
{
    srv_log_buffer *b = my_buffer(log);
    if (!b) {
        if (sink_ready(0)) {
            ssize_t w = write(STDERR_FILENO, line, len);
            if (w == (ssize_t)len)
                return;
        }
        atomic_fetch_add(&log->dropped, 1);
        return;
    }
    pthread_mutex_lock(&b->lock);
    size_t before = b->len;
    bool fits = before + len <= LOG_BUFFER;
    if (fits) {
        memcpy(b->data + before, line, len);
        b->len += len;
    }
    pthread_mutex_unlock(&b->lock);
    if (!fits) {
        atomic_fetch_add(&log->dropped, 1);
        return;
    }
    if (urgent || before == 0 || (before < LOG_WAKE_AT && before + len >= LOG_WAKE_AT))
        wake_flusher(log, urgent || before + len >= LOG_WAKE_AT);
}

/* "N log lines were dropped" once the sink takes lines again; flusher only. */
static void announce_drops(srv_log *log, char *line, size_t cap)
{
    unsigned long dropped = log_dropped(log);
    if (dropped == log->dropped_announced || !sink_ready(0))
        return;
    unsigned long lost = dropped - log->dropped_announced;
    log->dropped_announced = dropped;
    char msg[160];
    snprintf(msg, sizeof msg,
             "%lu log line%s dropped: the log sink (stderr) was full; "
             "attnd_log_dropped_total counts them", lost, lost == 1 ? " was" : "s were");
    size_t n = log_format_event(log, line, cap, "warn", msg);
    sink_write(log, line, n, 0, NULL);
}

/* For the JSON format: the inside of a JSON string, in ASCII, cut (between
 * whole escapes) to what buf holds. */
static void escape_json(char *buf, size_t cap, const char *s)
{
    if (!s)
        s = "";
    codec_escape_text(buf, cap, s, strlen(s), CODEC_ESCAPE_ASCII);
}

/* For the text format: printable ASCII kept, the rest as \xNN, so that a
 * request path cannot forge a log line; written as long as the escaped
 * text stays 5 bytes short of `cap`. */
static const bool plain[256] = {
    [0x21] = true, [0x23 ... 0x5b] = true, [0x5d ... 0x7e] = true, /* not '"', '\\' */
};

static bool plain_byte(unsigned char c)
{
    return plain[c];
}

/* ISO 8601 UTC with milliseconds. The seconds part is formatted once per
 * second per thread: strftime and the time zone code would otherwise cost
 * more than the rest of an access-log line. */
static void timestamp(char *buf, size_t cap)
{
    static _Thread_local time_t cached_sec = -1;
    static _Thread_local char cached[32];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (ts.tv_sec != cached_sec) {
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        strftime(cached, sizeof cached, "%Y-%m-%dT%H:%M:%S", &tm);
        cached_sec = ts.tv_sec;
    }
    /* The milliseconds by hand too: snprintf here was half of log_request. */
    int ms = (int)(ts.tv_nsec / 1000000);
    size_t n = strlen(cached);
    if (cap < 6)
        return;
    if (n > cap - 6)
        n = cap - 6;
    memcpy(buf, cached, n);
    buf[n] = '.';
    buf[n + 1] = (char)('0' + ms / 100);
    buf[n + 2] = (char)('0' + ms / 10 % 10);
    buf[n + 3] = (char)('0' + ms % 10);
    buf[n + 4] = 'Z';
    buf[n + 5] = '\0';
}

/* A small line builder: hand-rolled because snprintf with a dozen
 * conversions, a float among them, was the largest user-space cost of a
 * /healthz request. */
typedef struct {
    char *p, *end;
} line_buf;

static void put_n(line_buf *b, const char *s, size_t n)
{
    size_t room = (size_t)(b->end - b->p);
    if (n > room)
        n = room;
    memcpy(b->p, s, n);
    b->p += n;
}

static void put(line_buf *b, const char *s)
{
    put_n(b, s, strlen(s));
}

/* s escaped for the text format (plain_byte), straight into the line:
 * runs of plain bytes copied whole. */
static void put_escaped(line_buf *b, const char *s, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    const unsigned char *p = (const unsigned char *)s;
    while (*p && n + 5 < cap) {
        const unsigned char *run = p;
        size_t most = cap - 5 - n;
        while (*p && plain_byte(*p) && (size_t)(p - run) < most)
            p++;
        put_n(b, (const char *)run, (size_t)(p - run));
        n += (size_t)(p - run);
        if (!*p || n + 5 >= cap || plain_byte(*p))
            continue;
        if (b->end - b->p < 4)
            return;
        b->p[0] = '\\';
        b->p[1] = 'x';
        b->p[2] = hex[*p >> 4];
        b->p[3] = hex[*p & 15];
        b->p += 4;
        n += 4;
        p++;
    }
}

static void put_uint(line_buf *b, unsigned long long v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n && b->p < b->end)
        *b->p++ = tmp[--n];
}

/* Milliseconds with three decimals, from seconds. */
static void put_ms(line_buf *b, double seconds)
{
    unsigned long long us = seconds > 0 ? (unsigned long long)(seconds * 1e6 + 0.5) : 0;
    put_uint(b, us / 1000);
    char frac[5] = {'.', (char)('0' + us / 100 % 10), (char)('0' + us / 10 % 10),
                    (char)('0' + us % 10), 0};
    put(b, frac);
}

void log_request(srv_log *log, const srv_request *r, double seconds)
{
    const char *remote = r->connection->remote;
    char ts[40], line[2000];
    line_buf b = {line, line + sizeof line - 1};
    timestamp(ts, sizeof ts);
    if (log->format == LOG_JSON) {
        char method[40], path[1024], agent[300];
        escape_json(method, sizeof method, r->method);
        escape_json(path, sizeof path, r->path);
        put(&b, "{\"time\":\"");
        put(&b, ts);
        put(&b, "\",\"remote\":\"");
        put(&b, remote);
        put(&b, "\",\"method\":\"");
        put(&b, method);
        put(&b, "\",\"path\":\"");
        put(&b, path);
        put(&b, "\",\"status\":");
        put_uint(&b, (unsigned)r->status);
        if (r->error_code) { /* a literal of ours: nothing to escape */
            put(&b, ",\"code\":\"");
            put(&b, r->error_code);
            put(&b, "\"");
        }
        put(&b, ",\"bytes\":");
        put_uint(&b, r->bytes_out);
        put(&b, ",\"duration_ms\":");
        put_ms(&b, seconds);
        put(&b, ",\"request_id\":\"");
        put(&b, r->id); /* request_id.c keeps '"' and '\\' out of it */
        put(&b, "\"");
        if (r->user_agent) {
            escape_json(agent, sizeof agent, r->user_agent);
            put(&b, ",\"user_agent\":\"");
            put(&b, agent);
            put(&b, "\"");
        }
        put(&b, "}");
    } else {
        put(&b, ts);
        put(&b, " ");
        put(&b, remote);
        put(&b, " \"");
        put_escaped(&b, r->method ? r->method : "", 40);
        put(&b, " ");
        put_escaped(&b, r->path ? r->path : "", 1024);
        put(&b, "\" ");
        put_uint(&b, (unsigned)r->status);
        put(&b, " ");
        put_uint(&b, r->bytes_out);
        put(&b, " ");
        put_ms(&b, seconds);
        put(&b, "ms id=");
        put(&b, r->id);
    }
    *b.p++ = '\n'; /* end - 1 kept room for it */
    emit(log, line, (size_t)(b.p - line), false);
}

/* An event line ("time level message"), or its JSON object, with its
 * newline, in line[0..cap); returns its length. Control characters in the
 * message (a client's bytes quoted by libmicrohttpd) cannot break the line. */
static size_t log_format_event(const srv_log *log, char *line, size_t cap, const char *level,
                               const char *msg)
{
    char ts[40], esc[1100];
    timestamp(ts, sizeof ts);
    int n;
    if (log->format == LOG_JSON) {
        escape_json(esc, sizeof esc, msg);
        n = snprintf(line, cap, "{\"time\":\"%s\",\"level\":\"%s\",\"message\":\"%s\"}\n",
                     ts, level, esc);
    } else {
        size_t k = 0;
        for (const unsigned char *p = (const unsigned char *)msg; *p && k + 1 < sizeof esc; p++)
            esc[k++] = *p < 0x20 || *p == 0x7f ? ' ' : (char)*p;
        esc[k] = '\0';
        n = snprintf(line, cap, "%s %s %s\n", ts, level, esc);
    }
    if (n < 0)
        return 0;
    if ((size_t)n >= cap) { /* cut short, but still one line */
        line[cap - 2] = '\n';
        return cap - 1;
    }
    return (size_t)n;
}

void log_event(srv_log *log, const char *level, const char *fmt, ...)
{
    char msg[512], line[1300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = strlen(msg);
    while (len && msg[len - 1] == '\n') /* libmicrohttpd's messages end in one */
        msg[--len] = '\0';
    size_t n = log_format_event(log, line, sizeof line, level, msg);
    if (n)
        emit(log, line, n, true);
}
