/*
 * What attnd does about libmicrohttpd misbehaving, kept apart so that the
 * rest of the server is written against the library's interface only.
 *
 * A malformed Content-Length (libmicrohttpd 0.9.75 to 0.9.77). These
 * versions check the first Content-Length themselves, as soon as the
 * headers are in, and when it is malformed they queue an HTML 400 (413
 * above 2^64) and never call the access handler; 0.9.75, by a bug, then
 * builds the status line and headers a second time, so the client gets
 * them twice and then the HTML body. The only sign of it that reaches
 * attnd is the message the library logs at that moment, in English, on
 * the I/O thread that parsed those headers: the URI callback notes which
 * connection that thread read last, and when the message comes, after
 * checking that the connection's Content-Length is indeed malformed,
 * attnd writes its JSON answer straight to the socket, behind the
 * library's back, and shuts the socket for writing, so that the library's
 * own answer fails to go out and it closes the connection. Over TLS the
 * socket carries records, not text: there the connection is only shut,
 * without an answer. The request is logged and counted here, with method
 * "-" (the library does not say it).
 *
 * The words matched are those of these versions' source (connection.c);
 * libmicrohttpd 1.0 words them differently and its answer is not known to
 * be broken, so with any other version nothing here runs, and a malformed
 * Content-Length gets the library's own HTML 400.
 *
 * A raw NUL byte in the request target (the same versions). They take the
 * request line's bytes as they come, and hand the target on as a C string,
 * so "GET /v1/info\0/../x HTTP/1.1" reaches attnd as /v1/info. What the
 * URI callback gets is the target up to the space before the version, which
 * these versions overwrite with the string's NUL, the version following
 * right after it: when the NUL is followed by anything but "HTTP/", it came
 * from the client, and the request is refused as a %00 is (framing.c).
 */
#include "server.h"

#if MHD_VERSION >= 0x00097500 && MHD_VERSION < 0x00097800

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* The connection whose request line this I/O thread read last: the one
 * its next library message is about. */
static _Thread_local srv_connection *reading;
static _Thread_local const char *reading_uri;

void quirks_request_line(srv_connection *cx, const char *uri)
{
    reading = cx;
    reading_uri = uri;
    if (strncmp(uri + strlen(uri) + 1, "HTTP/", 5) != 0)
        cx->nul_in_target = true;
}

void quirks_connection_closed(srv_connection *cx)
{
    if (reading == cx)
        reading = NULL;
}

static const char *reason(int status)
{
    return status == 400 ? "Bad Request" : "Error";
}

/* Writes the whole answer to the socket behind libmicrohttpd, which has
 * queued one of its own, and shuts the socket for writing. */
static void write_directly(srv_request *r, int status, const char *body, size_t len)
{
    const union MHD_ConnectionInfo *tls =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    const union MHD_ConnectionInfo *fd =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    r->responded = true;
    r->status = status;
    r->bytes_out = 0;
    if (!fd)
        return;
    if (tls && tls->tls_session) { /* no answer: see above */
        shutdown(fd->connect_fd, SHUT_RDWR);
        return;
    }
    char head[768];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\nX-Request-ID: %s\r\n"
                     "%s%s%s\r\n",
                     status, reason(status), len, r->id,
                     r->origin ? "Access-Control-Allow-Origin: " : "",
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

/* The library refuses the request just read on cx for its malformed
 * Content-Length: answers it with JSON on the socket itself. */
static void malformed_length(srv_connection *cx, const char *uri)
{
    srv_headers h;
    headers_read(cx->conn, &h);
    uint64_t unused;
    if (!h.length || framing_parse_length(h.length, &unused))
        return; /* not the request the library is refusing */
    char msg[200];
    framing_length_message(msg, sizeof msg, h.length);
    api_error e;
    api_fail(&e, 400, "invalid_framing", "", "%s", msg);
    size_t len = 0;
    char *body = api_error_json(&e, &len);
    if (!body)
        return;
    /* The access handler never sees this request: it begins and ends here. */
    request_begin(cx, "-", uri, &h);
    srv_request *r = &cx->request;
    r->error_code = "invalid_framing";
    write_directly(r, 400, body, len);
    free(body);
    request_end(r);
}

void quirks_logged(srv_server *srv, const char *message)
{
    (void)srv;
    if (reading && (!strncmp(message, "Failed to parse `Content-Length' header", 39) ||
                    !strncmp(message, "Too large value of 'Content-Length' header", 42))) {
        malformed_length(reading, reading_uri);
        reading = NULL;
    }
}

#else /* another libmicrohttpd: nothing to work around */

void quirks_request_line(srv_connection *cx, const char *uri)
{
    (void)cx;
    (void)uri;
}

void quirks_connection_closed(srv_connection *cx)
{
    (void)cx;
}

void quirks_logged(srv_server *srv, const char *message)
{
    (void)srv;
    (void)message;
}

#endif
