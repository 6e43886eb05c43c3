/*
 * The framing of a request (RFC 9112 §6): how long its body is, judged from
 * the headers before a byte of the body is read, so that every answer is one
 * well-formed HTTP response with a JSON body.
 *
 *   a field name that is not a token          400 invalid_header
 *     (whitespace before the colon: "Content-Length : 5" is no
 *     Content-Length to libmicrohttpd, whose body would then be read as the
 *     next request; RFC 9112 section 5.1 makes it a 400)
 *   a target that decodes to a NUL (%00)      400 invalid_target
 *   Transfer-Encoding other than chunked      501 not_implemented
 *   Transfer-Encoding and Content-Length      400 invalid_framing (smuggling)
 *   Content-Length not a decimal uint64       400 invalid_framing
 *   two different Content-Length values       400 invalid_framing
 *   a request target longer than 8 KiB        414 uri_too_long
 *   header fields of more than 12 KiB         431 header_too_large
 *
 * Every refusal here closes the connection after its answer: once the
 * framing of a request is in doubt, nothing after it can be trusted to be
 * the next request. A malformed Content-Length is refused by libmicrohttpd
 * itself before attnd sees the request: mhd_quirks.c says what attnd does
 * about it.
 *
 * Beyond the connection's 32 KiB buffer (MHD_OPTION_CONNECTION_MEMORY_LIMIT
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

/* Longest request target answered, and most header bytes (names and
 * values): as nginx's large_client_header_buffers 8k, and within
 * libmicrohttpd's 32 KiB connection buffer. */
#define MAX_TARGET 8192
#define MAX_HEADER_BYTES 12288

bool framing_parse_length(const char *s, uint64_t *out)
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

/* RFC 9110 section 5.6.2: a field name is a token, one or more of these.
 * The punctuation as cases (one bit test), not a strchr call: nearly every
 * name has a '-' in it (Content-Length), and every request's headers pass
 * here. */
static bool token_char(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return true;
    switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+':
    case '-': case '.': case '^': case '_': case '`': case '|': case '~':
        return true;
    default:
        return false;
    }
}

static bool is_token(const char *key, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!token_char((unsigned char)key[i]))
            return false;
    return true;
}

static enum MHD_Result collect(void *cls, enum MHD_ValueKind kind, const char *key,
                               size_t key_size, const char *value, size_t value_size)
{
    (void)kind;
    (void)value_size;
    srv_headers *h = cls;
    if (!value)
        value = "";
    if (!h->bad_name && !is_token(key, key_size)) {
        h->bad_name = key;
        h->bad_name_len = key_size;
    }
    /* The names have few lengths: one or two compares of a name at most. */
    switch (key_size) {
    case 12:
        if (!h->content_type && named(key, 12, MHD_HTTP_HEADER_CONTENT_TYPE))
            h->content_type = value;
        else if (!h->request_id && named(key, 12, "X-Request-ID"))
            h->request_id = value;
        break;
    case 10:
        if (!h->user_agent && named(key, 10, MHD_HTTP_HEADER_USER_AGENT))
            h->user_agent = value;
        break;
    case 6:
        if (!h->origin && named(key, 6, MHD_HTTP_HEADER_ORIGIN))
            h->origin = value;
        break;
    case 13:
        if (!h->authorization && named(key, 13, MHD_HTTP_HEADER_AUTHORIZATION))
            h->authorization = value;
        break;
    case 29:
        if (!h->preflight_method && named(key, 29, "Access-Control-Request-Method"))
            h->preflight_method = value;
        break;
    case 14:
        if (named(key, 14, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
            uint64_t v = 0;
            bool ok = framing_parse_length(value, &v);
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
    case 31:
        if (!h->inference_header && named(key, 31, "Inference-Header-Content-Length"))
            h->inference_header = value;
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

static framing_result refuse(srv_request *r, int status, const char *code,
                             const char *message)
{
    http_reply_error_close(r, status, code, message);
    return FRAMING_REFUSED;
}

/* The field name as the message shows it: printable, whitespace named. */
static void show_name(char *out, size_t cap, const char *name, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c == ' ' || c == '\t') {
            int w = snprintf(out + o, cap - o, c == ' ' ? "<SP>" : "<TAB>");
            o += w > 0 ? (size_t)w : 0;
        } else {
            out[o++] = c > 0x20 && c < 0x7f && c != '"' ? (char)c : '?';
        }
    }
    out[o < cap ? o : cap - 1] = '\0';
}

void framing_length_message(char *msg, size_t cap, const char *value)
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
    if (r->connection->nul_in_target)
        return refuse(r, 400, "invalid_target",
                      "the request target holds a NUL byte (or %00, which decodes to one): no "
                      "path or query argument may contain one");
    if (h->bad_name) {
        char name[80];
        show_name(name, sizeof name, h->bad_name, h->bad_name_len < 40 ? h->bad_name_len : 40);
        bool space = memchr(h->bad_name, ' ', h->bad_name_len) ||
                     memchr(h->bad_name, '\t', h->bad_name_len);
        snprintf(msg, sizeof msg,
                 space ? "the header field name \"%s\" contains whitespace; none may come "
                         "before the colon (RFC 9112 section 5.1)"
                       : "the header field name \"%s\" is not a token (RFC 9110 section "
                         "5.1)", name);
        return refuse(r, 400, "invalid_header", msg);
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
        framing_length_message(msg, sizeof msg, h->length);
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
