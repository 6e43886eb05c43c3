/*
 * The framing of a request (RFC 9112 §6): how long its body is, judged from
 * the headers before a byte of the body is read, so that every answer is one
 * well-formed HTTP response with a JSON body.
 *
 *   Transfer-Encoding other than chunked      501 not_implemented
 *   Transfer-Encoding and Content-Length      400 invalid_framing (smuggling)
 *   Content-Length not a decimal uint64       400 invalid_framing
 *   two different Content-Length values       400 invalid_framing
 *   a request target longer than 8 KiB        414 uri_too_long
 *   header fields of more than 12 KiB         431 header_too_large
 *
 * libmicrohttpd 0.9.75 checks the first Content-Length itself, as soon as
 * the headers are in, and when it is malformed it queues an HTML 400 (413
 * above 2^64) and never calls the access handler; by a bug of that version
 * it then builds the status line and headers a second time, so the client
 * got them twice and then the HTML body. The only sign of it that reaches
 * attnd is the message libmicrohttpd logs at that moment, on the I/O thread
 * that parsed those headers: http.c notes which request that thread read
 * last (the URI callback), and framing_malformed_length, after checking
 * that request's Content-Length is indeed malformed, writes attnd's JSON
 * answer straight to its socket and shuts the socket for writing, so that
 * libmicrohttpd's own answer fails to go out and it closes the connection.
 * Over TLS the socket carries records, not text: there the connection is
 * only shut, without an answer. Should another libmicrohttpd log other
 * words, its own answer goes out as before.
 *
 * Beyond the connection's 16 KiB buffer (MHD_OPTION_CONNECTION_MEMORY_LIMIT
 * in http.c) the request never reaches attnd: libmicrohttpd answers 414 or
 * 431 itself with a one-line HTML body (compiled into the library), or,
 * when not even that fits, closes the connection. The limits above keep
 * every request that does reach attnd to a JSON answer.
 */
#include "server.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* Longest request target answered, and most header bytes (names and
 * values): as nginx's large_client_header_buffers 8k, and within
 * libmicrohttpd's 16 KiB connection buffer. */
#define MAX_TARGET 8192
#define MAX_HEADER_BYTES 12288

/* A Content-Length as libmicrohttpd reads it: decimal digits only, at most
 * 2^64 - 1. */
static bool parse_length(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (!*s)
        return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return false;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

/* Is the header name key[0..n) `name` (whose length is n), in any case? */
static bool named(const char *key, size_t n, const char *name)
{
    return !strncasecmp(key, name, n);
}

static enum MHD_Result collect(void *cls, enum MHD_ValueKind kind, const char *key,
                               size_t key_size, const char *value, size_t value_size)
{
    (void)kind;
    (void)value_size;
    srv_headers *h = cls;
    if (!value)
        value = "";
    /* The five names have five lengths: one compare of the name at most. */
    switch (key_size) {
    case 12:
        if (!h->content_type && named(key, 12, MHD_HTTP_HEADER_CONTENT_TYPE))
            h->content_type = value;
        break;
    case 6:
        if (!h->origin && named(key, 6, MHD_HTTP_HEADER_ORIGIN))
            h->origin = value;
        break;
    case 13:
        if (!h->authorization && named(key, 13, MHD_HTTP_HEADER_AUTHORIZATION))
            h->authorization = value;
        break;
    case 14:
        if (named(key, 14, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
            uint64_t v = 0;
            bool ok = parse_length(value, &v);
            if (h->n_length == 0) {
                h->length = value;
                h->value = v;
                h->length_ok = ok;
            } else if (!h->differing && (!ok || v != h->value)) {
                h->differing = value;
            }
            h->n_length++;
        }
        break;
    case 17:
        if (named(key, 17, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
            if (!h->n_encoding)
                h->encoding = value;
            h->n_encoding++;
            h->only_chunked = h->only_chunked && !strcasecmp(value, "chunked");
        }
        break;
    }
    return MHD_YES;
}

void headers_read(struct MHD_Connection *c, srv_headers *h)
{
    *h = (srv_headers){.only_chunked = true};
    MHD_get_connection_values_n(c, MHD_HEADER_KIND, collect, h);
}

static const char *reason(int status)
{
    switch (status) {
    case 400: return "Bad Request";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    default: return "Error";
    }
}

/* Writes the whole answer to the socket behind libmicrohttpd, which has
 * queued one of its own, and shuts the socket for writing. */
static void write_directly(srv_request *r, int status, const char *body, size_t len)
{
    const union MHD_ConnectionInfo *tls =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    const union MHD_ConnectionInfo *fd =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    r->status = status;
    r->bytes_out = 0;
    if (!fd)
        return;
    if (tls && tls->tls_session) { /* no answer: see above */
        shutdown(fd->connect_fd, SHUT_RDWR);
        return;
    }
    char head[512];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n%s%s%s\r\n",
                     status, reason(status), len, r->origin ? "Access-Control-Allow-Origin: " : "",
                     r->origin ? r->origin : "", r->origin ? "\r\n" : "");
    if (n < 0 || (size_t)n >= sizeof head)
        return;
    /* The socket's buffer is empty at this point of a request: a few hundred
     * bytes go out at once, or not at all. */
    struct iovec parts[2] = {{head, (size_t)n}, {(void *)body, len}};
    struct msghdr msg = {.msg_iov = parts, .msg_iovlen = 2};
    ssize_t w = sendmsg(fd->connect_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w == (ssize_t)((size_t)n + len))
        r->bytes_out = len;
    /* What the client sent after its headers is read away, so that closing
     * the socket does not reset the connection under the answer. */
    char sink[4096];
    for (int i = 0; i < 16 && recv(fd->connect_fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++)
        ;
    shutdown(fd->connect_fd, SHUT_WR);
}

static framing_result refuse(srv_request *r, int status, const char *code,
                             const char *message)
{
    api_error e;
    api_fail(&e, status, code, "", "%s", message);
    size_t len = 0;
    char *body = api_error_json(&e, &len);
    http_reply_owned(r, status, "application/json", body, len, NULL);
    return FRAMING_REFUSED;
}

static void length_message(char *msg, size_t cap, const char *value)
{
    snprintf(msg, cap, "Content-Length \"%.40s\" is not a byte count (decimal digits, "
             "below 2^64)", value);
}

framing_result framing_check(srv_request *r, const srv_headers *h, uint64_t *length,
                             bool *has_length)
{
    char msg[200];
    *has_length = false;
    size_t target = r->target_len > strlen(r->path) ? r->target_len : strlen(r->path);
    if (target > MAX_TARGET) {
        snprintf(msg, sizeof msg, "the request target is longer than %d bytes", MAX_TARGET);
        return refuse(r, 414, "uri_too_long", msg);
    }
    const union MHD_ConnectionInfo *size =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    if (size && size->header_size > MAX_HEADER_BYTES + target) {
        snprintf(msg, sizeof msg, "the request's header fields are larger than %d bytes",
                 MAX_HEADER_BYTES);
        return refuse(r, 431, "header_too_large", msg);
    }
    if (h->n_encoding) {
        if (!h->only_chunked || h->n_encoding > 1) {
            snprintf(msg, sizeof msg,
                     "Transfer-Encoding \"%.60s\" is not supported: send the body with "
                     "Content-Length, or with Transfer-Encoding: chunked alone", h->encoding);
            return refuse(r, 501, "not_implemented", msg);
        }
        if (h->n_length)
            return refuse(r, 400, "invalid_framing",
                          "a request may not carry both Transfer-Encoding and Content-Length "
                          "(RFC 9112 section 6.3)");
        return FRAMING_OK;
    }
    if (!h->n_length)
        return FRAMING_OK;
    if (!h->length_ok) { /* libmicrohttpd answers these itself (see above) */
        length_message(msg, sizeof msg, h->length);
        return refuse(r, 400, "invalid_framing", msg);
    }
    if (h->differing) {
        snprintf(msg, sizeof msg,
                 "Content-Length is given more than once with different values (%.30s and "
                 "%.30s); send it once", h->length, h->differing);
        return refuse(r, 400, "invalid_framing", msg);
    }
    *length = h->value;
    *has_length = true;
    return FRAMING_OK;
}

void framing_malformed_length(srv_request *r, const char *uri)
{
    const char *value = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND,
                                                    MHD_HTTP_HEADER_CONTENT_LENGTH);
    uint64_t unused;
    if (!value || parse_length(value, &unused))
        return; /* not the request libmicrohttpd is refusing */
    char msg[200];
    length_message(msg, sizeof msg, value);
    api_error e;
    api_fail(&e, 400, "invalid_framing", "", "%s", msg);
    size_t len = 0;
    char *body = api_error_json(&e, &len);
    if (!body)
        return;
    /* The access handler never sees this request: it is logged and counted
     * here (its method is not known to attnd: "-"). */
    int label;
    bool known;
    routes_match(r->srv, "", uri, &known, &label);
    r->method = "-";
    r->path = uri;
    r->label = label;
    r->t_start = srv_now();
    r->origin = NULL;
    write_directly(r, 400, body, len);
    free(body);
    metrics_request_start(&r->srv->metrics);
    log_request(&r->srv->log, r, srv_now() - r->t_start);
    metrics_request_done(&r->srv->metrics, label, r->status, srv_now() - r->t_start, 0,
                         r->bytes_out);
}
