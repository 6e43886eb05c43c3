/*
 * Request bodies: which Content-Types are read as JSON, the --max-body
 * limit (judged from the Content-Length before a byte is read, and counted
 * for a chunked upload), and the buffer each connection keeps for the
 * bodies of its requests.
 *
 * A buffer grows as the bytes arrive (doubling, up to the announced
 * length), never to the length a client announces before sending it: a
 * client that announces 50 MB and trickles holds what it sent. Every
 * connection's buffer counts against --max-body-memory; a body whose
 * buffer cannot grow within it is refused (503, Retry-After) and its
 * buffer freed at once, so that stalled uploads cannot add up to more.
 * Buffers come from the server's pool (pool.c), which keeps a large one's
 * pages for the next large body when it is freed.
 */
#include "server.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A body buffer larger than this is not kept for the connection's next
 * request: idle keep-alive connections should not pin megabytes. */
#define KEEP_BODY_BUFFER (1u << 20)

/* No Content-Type, curl's default form type, or JSON (any parameters, any
 * +json subtype) are read as JSON, so that `curl -d @request.json URL` works
 * as typed; anything else (multipart, say) is a 415. */
static bool readable_as_json(const char *content_type)
{
    if (!content_type)
        return true;
    const char *p = content_type;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t n = strcspn(p, "; \t");
    if (n == 0)
        return true;
    if ((n == 16 && !strncasecmp(p, "application/json", n)) ||
        (n == 33 && !strncasecmp(p, "application/x-www-form-urlencoded", n)))
        return true;
    return n > 17 && !strncasecmp(p, "application/", 12) && !strncasecmp(p + n - 5, "+json", 5);
}

/* A binary /v2 infer body (JSON, then tensor bytes) may say so. */
static bool is_octet_stream(const char *content_type)
{
    const char *p = content_type;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t n = strcspn(p, "; \t");
    return n == 24 && !strncasecmp(p, "application/octet-stream", n);
}

/* The alignment of a binary /v2 body's first tensor in the buffer:
 * malloc's (and realloc keeps a buffer's contents at the same offset). */
#define TENSOR_ALIGN _Alignof(max_align_t)

/* Where a body starts in its buffer. The API reads a binary /v2 body's
 * float32 tensors where they lie, which takes at least a float's
 * alignment: so the JSON text that precedes them (Inference-Header-Content-
 * Length bytes, known from the headers) is placed to end on a TENSOR_ALIGN
 * boundary, whatever its length. Any other body starts at 0; so does one
 * whose header is no byte count (the API refuses it). */
static size_t binary_offset(const srv_request *r)
{
    const char *p = r->json_length;
    if (!r->route->oip || !p || !*p)
        return 0;
    size_t v = 0;
    for (int i = 0; p[i]; i++) {
        if (p[i] < '0' || p[i] > '9' || i == 19)
            return 0;
        v = v * 10 + (size_t)(p[i] - '0');
    }
    return (TENSOR_ALIGN - v % TENSOR_ALIGN) % TENSOR_ALIGN;
}

char *body_of(const srv_request *r)
{
    return r->connection->body ? r->connection->body + r->body_at : NULL;
}

/* The first buffer of a body: most bodies fit it. */
#define FIRST_BODY_BUFFER 16384

/* A body announced whole (`whole` bytes) moves into an idle block of the
 * pool that holds it all, when there is one: its pages are in already,
 * whereas growing by doubling would map and fault a block at each size. It
 * is charged against --max-body-memory as its bytes arrive, like any body
 * (a client that announces much and sends little is charged for what it
 * sent); the rest of the block stays counted by the pool against
 * --max-memory, as it was while idle, and no memory is mapped for an
 * announced length. */
static bool take_whole(srv_request *r, size_t whole)
{
    srv_connection *cx = r->connection;
    char *p = pool_realloc_idle(cx->srv->pool, cx->body, whole);
    if (!p)
        return false;
    cx->body = p; /* body_cap, what is charged, is unchanged */
    return true;
}

/* Grows cx's buffer to `need` bytes within --max-body-memory; an announced
 * body (`whole` bytes, 0: not announced) first into a block of the pool
 * that holds it all, when there is one. */
static bool grow(srv_request *r, size_t need, size_t whole)
{
    srv_connection *cx = r->connection;
    if (need <= cx->body_cap)
        return true;
    if (whole > need && whole >= POOL_MIN_BLOCK &&
        (!cx->body || pool_block_size(cx->body) < whole))
        (void)take_whole(r, whole); /* then the growth below is in place */
    srv_server *srv = cx->srv;
    long long more = (long long)(need - cx->body_cap);
    long long held = atomic_fetch_add(&srv->body_memory, more) + more;
    if (held > srv->cfg->max_body_memory) {
        atomic_fetch_sub(&srv->body_memory, more);
        r->bodies_full = true;
        return false;
    }
    /* From the pool: a large body's pages stay mapped for the next one. An
     * announced body's smaller sizes go at once: the next body announced
     * whole takes the largest (take_whole). */
    char *p = whole ? pool_grow(srv->pool, cx->body, need)
                    : pool_realloc(srv->pool, cx->body, need);
    if (!p) {
        atomic_fetch_sub(&srv->body_memory, more);
        r->out_of_memory = true;
        return false;
    }
    cx->body = p;
    cx->body_cap = need;
    return true;
}

void body_free(srv_connection *cx)
{
    atomic_fetch_sub(&cx->srv->body_memory, (long long)cx->body_cap);
    pool_free(cx->srv->pool, cx->body);
    cx->body = NULL;
    cx->body_cap = 0;
}

bool body_expect(srv_request *r, const srv_headers *h, uint64_t length, bool has_length)
{
    if (http_draining(r->srv)) {
        http_reply_stock(r, STOCK_SHUTTING_DOWN);
        return false;
    }
    if (!readable_as_json(h->content_type) &&
        !(r->route->oip && is_octet_stream(h->content_type))) {
        http_reply_stock(r, STOCK_UNSUPPORTED_MEDIA);
        return false;
    }
    if (has_length && length > (uint64_t)r->srv->cfg->max_body) {
        http_reply_stock(r, STOCK_BODY_TOO_LARGE);
        return false;
    }
    r->body_expected = has_length ? (size_t)length : 0;
    r->body_at = binary_offset(r);
    return true;
}

void body_take(srv_request *r, const char *data, size_t n)
{
    srv_connection *cx = r->connection;
    size_t max_body = (size_t)r->srv->cfg->max_body;
    r->bytes_in += n;
    if (r->too_large || r->out_of_memory || r->bodies_full)
        return;
    if (r->body_len + n > max_body) {
        /* Only a chunked upload gets here (a Content-Length was checked). */
        r->too_large = true;
        return;
    }
    size_t at = r->body_at, need = at + r->body_len + n;
    if (need > cx->body_cap) {
        size_t cap = cx->body_cap * 2;
        if (cap < need)
            cap = need;
        if (cap < FIRST_BODY_BUFFER)
            cap = FIRST_BODY_BUFFER;
        /* Never past what was announced, nor past the limit. */
        if (r->body_expected >= r->body_len + n && cap > at + r->body_expected)
            cap = at + r->body_expected;
        if (cap > at + max_body)
            cap = at + max_body;
        size_t whole = r->body_expected >= r->body_len + n && r->body_expected <= max_body
                           ? at + r->body_expected
                           : 0;
        if (!grow(r, cap, whole)) {
            if (r->bodies_full) /* what it held goes back to the others */
                body_free(cx);
            return;
        }
    }
    memcpy(cx->body + at + r->body_len, data, n);
    r->body_len += n;
}

void body_trim(srv_connection *cx)
{
    if (cx->body_cap > KEEP_BODY_BUFFER)
        body_free(cx);
}
