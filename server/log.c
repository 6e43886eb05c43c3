/*
 * The access log and the few events around it, on stderr, as text or as one
 * JSON object per line. Lines only ever go out whole in a write(2), so that
 * lines from different I/O threads never interleave.
 *
 * Access-log lines are buffered per I/O thread, as nginx's `access_log ...
 * buffer= flush=` does: a write(2) per request was a tenth of the CPU time
 * of a small request. A flusher thread writes a buffer out at most
 * LOG_FLUSH_MS after its first line (and sleeps while nothing is pending);
 * a full buffer, every event line and log_flush write out at once, so the
 * log keeps its order around events and loses nothing at a clean exit.
 */
#include "server.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LOG_BUFFER 8192
#define LOG_FLUSH_MS 50

struct srv_log_buffer {
    pthread_mutex_t lock;
    size_t len;
    srv_log_buffer *next;
    char data[LOG_BUFFER];
};

/* This thread's buffer in the (one) log of the process: a cache of the
 * lookup, not state of its own. */
static _Thread_local srv_log_buffer *mine;

static void emit(const char *line, size_t len);

/* Writes out every buffer; log->lock held. */
static void flush_all_locked(srv_log *log)
{
    for (srv_log_buffer *b = log->buffers; b; b = b->next) {
        pthread_mutex_lock(&b->lock);
        if (b->len)
            emit(b->data, b->len);
        b->len = 0;
        pthread_mutex_unlock(&b->lock);
    }
}

static void *flusher_main(void *arg)
{
    srv_log *log = arg;
    pthread_mutex_lock(&log->lock);
    while (!log->flusher_stop) {
        if (!log->pending) {
            pthread_cond_wait(&log->flush_wanted, &log->lock);
            continue;
        }
        /* Let a batch gather: one write for many requests. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += LOG_FLUSH_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&log->flush_wanted, &log->lock, &ts);
        log->pending = false;
        flush_all_locked(log);
    }
    pthread_mutex_unlock(&log->lock);
    return NULL;
}

void log_init(srv_log *log, log_format fmt)
{
    log->format = fmt;
    pthread_mutex_init(&log->lock, NULL);
    pthread_cond_init(&log->flush_wanted, NULL);
    log->buffers = NULL;
    log->pending = false;
    pthread_mutex_lock(&log->lock);
    log->flusher_stop = false;
    log->flusher_running = pthread_create(&log->flusher, NULL, flusher_main, log) == 0;
    pthread_mutex_unlock(&log->lock);
}

void log_flush(srv_log *log)
{
    pthread_mutex_lock(&log->lock);
    flush_all_locked(log);
    pthread_mutex_unlock(&log->lock);
}

void log_shutdown(srv_log *log)
{
    pthread_mutex_lock(&log->lock);
    log->flusher_stop = true;
    pthread_cond_signal(&log->flush_wanted);
    bool running = log->flusher_running;
    log->flusher_running = false;
    pthread_mutex_unlock(&log->lock);
    if (running)
        pthread_join(log->flusher, NULL);
    pthread_mutex_lock(&log->lock);
    flush_all_locked(log);
    /* Only after http_stop: no I/O thread logs any more. */
    while (log->buffers) {
        srv_log_buffer *b = log->buffers;
        log->buffers = b->next;
        pthread_mutex_destroy(&b->lock);
        free(b);
    }
    mine = NULL;
    pthread_mutex_unlock(&log->lock);
}

/* This thread's buffer, made on its first line; NULL without a flusher or
 * without memory, and then lines are written at once. */
static srv_log_buffer *my_buffer(srv_log *log)
{
    if (mine)
        return mine;
    pthread_mutex_lock(&log->lock);
    if (log->flusher_running) {
        mine = malloc(sizeof *mine);
        if (mine) {
            pthread_mutex_init(&mine->lock, NULL);
            mine->len = 0;
            mine->next = log->buffers;
            log->buffers = mine;
        }
    }
    pthread_mutex_unlock(&log->lock);
    return mine;
}

static void emit_buffered(srv_log *log, const char *line, size_t len)
{
    srv_log_buffer *b = my_buffer(log);
    if (!b || len > LOG_BUFFER) {
        emit(line, len);
        return;
    }
    pthread_mutex_lock(&b->lock);
    if (b->len + len > LOG_BUFFER) {
        emit(b->data, b->len);
        b->len = 0;
    }
    bool first = b->len == 0;
    memcpy(b->data + b->len, line, len);
    b->len += len;
    pthread_mutex_unlock(&b->lock);
    if (first) {
        pthread_mutex_lock(&log->lock);
        if (!log->pending) {
            log->pending = true;
            pthread_cond_signal(&log->flush_wanted);
        }
        pthread_mutex_unlock(&log->lock);
    }
}

size_t json_escape(char *buf, size_t cap, const char *s)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char tmp[8];
        size_t k;
        if (*p == '"' || *p == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)*p;
            k = 2;
        } else if (*p < 0x20 || *p >= 0x7f) {
            /* Bytes beyond ASCII are escaped one by one: a path is not
             * necessarily valid UTF-8, and the log line must stay JSON. */
            k = (size_t)snprintf(tmp, sizeof tmp, "\\u%04x", *p);
        } else {
            tmp[0] = (char)*p;
            k = 1;
        }
        if (n + k < cap)
            memcpy(buf + n, tmp, k);
        n += k;
    }
    if (cap)
        buf[n < cap ? n : cap - 1] = '\0';
    return n;
}

/* Like json_escape, for the text format: printable ASCII kept, the rest as
 * \xNN, so that a request path cannot forge a log line. */
static void text_escape(char *buf, size_t cap, const char *s)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && n + 5 < cap; p++) {
        if (*p > 0x20 && *p < 0x7f && *p != '"' && *p != '\\')
            buf[n++] = (char)*p;
        else
            n += (size_t)snprintf(buf + n, cap - n, "\\x%02x", *p);
    }
    buf[n] = '\0';
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

static void emit(const char *line, size_t len)
{
    /* A failed log write has nowhere to be reported; the request goes on. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

/* A small line builder: hand-rolled because snprintf with a dozen
 * conversions, a float among them, was the largest user-space cost of a
 * /healthz request. */
typedef struct {
    char *p, *end;
} line_buf;

static void put(line_buf *b, const char *s)
{
    while (*s && b->p < b->end)
        *b->p++ = *s++;
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
    const char *remote = r->remote;
    char ts[40], method[40], path[1024], line[1400];
    line_buf b = {line, line + sizeof line - 1};
    timestamp(ts, sizeof ts);
    if (log->format == LOG_JSON) {
        json_escape(method, sizeof method, r->method ? r->method : "");
        json_escape(path, sizeof path, r->path ? r->path : "");
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
        put(&b, ",\"bytes\":");
        put_uint(&b, r->bytes_out);
        put(&b, ",\"duration_ms\":");
        put_ms(&b, seconds);
        put(&b, "}");
    } else {
        text_escape(method, sizeof method, r->method ? r->method : "");
        text_escape(path, sizeof path, r->path ? r->path : "");
        put(&b, ts);
        put(&b, " ");
        put(&b, remote);
        put(&b, " \"");
        put(&b, method);
        put(&b, " ");
        put(&b, path);
        put(&b, "\" ");
        put_uint(&b, (unsigned)r->status);
        put(&b, " ");
        put_uint(&b, r->bytes_out);
        put(&b, " ");
        put_ms(&b, seconds);
        put(&b, "ms");
    }
    *b.p++ = '\n'; /* end - 1 kept room for it */
    emit_buffered(log, line, (size_t)(b.p - line));
}

void log_event(srv_log *log, const char *level, const char *fmt, ...)
{
    char ts[40], msg[512], esc[1100], line[1300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = strlen(msg);
    while (len && msg[len - 1] == '\n') /* libmicrohttpd's messages end in one */
        msg[--len] = '\0';
    timestamp(ts, sizeof ts);
    int n;
    if (log->format == LOG_JSON) {
        json_escape(esc, sizeof esc, msg);
        n = snprintf(line, sizeof line, "{\"time\":\"%s\",\"level\":\"%s\",\"message\":\"%s\"}\n",
                     ts, level, esc);
    } else {
        n = snprintf(line, sizeof line, "%s %s %s\n", ts, level, msg);
    }
    /* The access lines before this event go out before it. */
    log_flush(log);
    if (n > 0)
        emit(line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}
