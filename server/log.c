/*
 * The access log and the few events around it, on stderr, as text or as one
 * JSON object per line. Each line goes out in a single write(2) so that lines
 * from different I/O threads never interleave.
 */
#include "server.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static log_format format = LOG_TEXT;

void log_init(log_format fmt)
{
    format = fmt;
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
    if (n + 6 > cap) {
        snprintf(buf, cap, "%s.%03dZ", cached, ms);
        return;
    }
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

void log_request(const srv_request *r, double seconds, const char *remote)
{
    char ts[40], method[40], path[1024], line[1400];
    line_buf b = {line, line + sizeof line - 1};
    timestamp(ts, sizeof ts);
    if (format == LOG_JSON) {
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
    emit(line, (size_t)(b.p - line));
}

void log_event(const char *level, const char *fmt, ...)
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
    if (format == LOG_JSON) {
        json_escape(esc, sizeof esc, msg);
        n = snprintf(line, sizeof line, "{\"time\":\"%s\",\"level\":\"%s\",\"message\":\"%s\"}\n",
                     ts, level, esc);
    } else {
        n = snprintf(line, sizeof line, "%s %s %s\n", ts, level, msg);
    }
    if (n > 0)
        emit(line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}
