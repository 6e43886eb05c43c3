/*
 * Answers: the queueing of a response with the headers every response
 * carries, the canned responses (built once at start, served many times:
 * /healthz, /openapi.yaml, the page, the 405s) and the transport's stock
 * errors (404, 413, 415, 503, 401, ...).
 *
 * A canned response is served as its shared copy only while nothing about
 * the request needs a header of its own. Every answer names its request
 * (X-Request-ID), so in practice each is built for its request from the
 * canned body, which stays shared: the copy costs a response object and
 * its headers, never the body.
 */
#include "server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct srv_canned {
    int status;
    const char *content_type;
    const char *body;
    size_t len;
    char *owned;              /* body storage when canned_error built it */
    const char *code;         /* the error code of an error body, or NULL */
    const char *hname, *hvalue;
};

void http_add_request_headers(const srv_request *r, struct MHD_Response *resp)
{
    if (r->id[0])
        MHD_add_response_header(resp, "X-Request-ID", r->id);
    if (r->srv->cors.enabled)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, "Origin");
    if (r->origin)
        cors_add_headers(resp, r->origin);
    /* While draining, tell keep-alive clients to go elsewhere next time. */
    if (http_draining(r->srv))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
}

static struct MHD_Response *canned_build(const srv_canned *c)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(c->len, (void *)c->body, MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return NULL;
    if (c->content_type)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, c->content_type);
    if (c->hname)
        MHD_add_response_header(resp, c->hname, c->hvalue);
    return resp;
}

srv_canned *canned_new(const srv_server *srv, int status, const char *content_type,
                       const char *body, size_t len, const char *hname,
                       const char *hvalue)
{
    (void)srv;
    srv_canned *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    *c = (srv_canned){.status = status, .content_type = content_type, .body = body,
                      .len = len, .hname = hname, .hvalue = hvalue};
    return c;
}

static srv_canned *canned_error_as(const srv_server *srv, bool oip, int status,
                                   const char *code, const char *message, const char *hname,
                                   const char *hvalue)
{
    api_error e;
    api_fail(&e, status, code, "", "%s", message);
    size_t len;
    char *body = oip ? api_error_json_oip(&e, &len) : api_error_json(&e, &len);
    if (!body)
        return NULL;
    srv_canned *c = canned_new(srv, status, "application/json", body, len, hname, hvalue);
    if (!c) {
        free(body);
        return NULL;
    }
    c->owned = body;
    c->code = code; /* a literal of the caller's */
    return c;
}

srv_canned *canned_error(const srv_server *srv, int status, const char *code,
                         const char *message, const char *hname, const char *hvalue)
{
    return canned_error_as(srv, false, status, code, message, hname, hvalue);
}

srv_canned *canned_error_oip(const srv_server *srv, int status, const char *code,
                             const char *message, const char *hname, const char *hvalue)
{
    return canned_error_as(srv, true, status, code, message, hname, hvalue);
}

void canned_free(srv_canned *c)
{
    if (!c)
        return;
    free(c->owned);
    free(c);
}

static void queue(srv_request *r, int status, struct MHD_Response *resp, size_t len)
{
    r->responded = true;
    r->status = status;
    r->bytes_out = len;
    if (MHD_queue_response(r->conn, (unsigned)status, resp) != MHD_YES)
        r->status = 0; /* the connection is gone or in a state that takes no answer */
}

/* resp, of len bytes, with its Content-Type, the extra header pairs
 * (NULL-terminated) and r's own headers, queued as r's answer. */
static void send_with_headers(srv_request *r, int status, struct MHD_Response *resp,
                              const char *content_type, const char *const *extra, size_t len)
{
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    for (; extra && extra[0]; extra += 2)
        MHD_add_response_header(resp, extra[0], extra[1]);
    http_add_request_headers(r, resp);
    queue(r, status, resp, len);
    MHD_destroy_response(resp);
}

/* The canned answer c with r's headers, and `close` to end the connection. */
static void reply_canned(srv_request *r, const srv_canned *c, bool close)
{
    r->error_code = c->code;
    struct MHD_Response *resp = canned_build(c);
    if (!resp) {
        r->responded = true;
        r->status = 0; /* not even an answer fits: the connection is dropped */
        return;
    }
    http_add_request_headers(r, resp);
    if (close && !http_draining(r->srv)) /* else it has one already */
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    queue(r, c->status, resp, c->len);
    MHD_destroy_response(resp);
}

void http_reply_canned(srv_request *r, const srv_canned *c)
{
    reply_canned(r, c, false);
}

void http_reply_stock(srv_request *r, stock_error e)
{
    reply_canned(r, (r->oip ? r->srv->stock_oip : r->srv->stock)[e], false);
}

void http_refuse_connection(srv_request *r)
{
    static const stock_error by_reason[N_REFUSE] = {
        [REFUSE_PER_IP] = STOCK_PER_IP_LIMIT,
        [REFUSE_PRESSURE] = STOCK_PRESSURE,
        [REFUSE_FULL] = STOCK_CONNECTIONS_FULL,
    };
    conn_refusal why = r->connection->refused;
    srv_canned *const *stock = r->oip ? r->srv->stock_oip : r->srv->stock;
    reply_canned(r, stock[why > REFUSE_NONE && why < N_REFUSE ? by_reason[why]
                                                              : STOCK_CONNECTIONS_FULL],
                 true);
}

void http_reply_owned(srv_request *r, int status, const char *content_type,
                      char *body, size_t len, const char *const *extra)
{
    http_reply_released(r, status, content_type, body, len, extra, NULL);
}

void http_reply_released(srv_request *r, int status, const char *content_type, char *body,
                         size_t len, const char *const *extra, void (*release)(void *))
{
    struct MHD_Response *resp =
        !body      ? NULL
        : !release ? MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE)
                   : MHD_create_response_from_buffer_with_free_callback(len, body, release);
    if (!resp) {
        if (release)
            release(body);
        else
            free(body);
        http_reply_stock(r, STOCK_OUT_OF_MEMORY);
        return;
    }
    send_with_headers(r, status, resp, content_type, extra, len);
}

static void free_answer(void *cls)
{
    api_response *held = cls;
    api_response_free(held);
    free(held);
}

void http_reply_blocks(srv_request *r, int status, const char *content_type,
                       api_response *res, const char *const *extra)
{
    struct MHD_IoVec iov[1 + API_MAX_BLOCKS];
    api_response *held = res->n_blocks <= API_MAX_BLOCKS ? malloc(sizeof *held) : NULL;
    if (!held) {
        api_response_free(res);
        http_reply_stock(r, STOCK_OUT_OF_MEMORY);
        return;
    }
    *held = *res;
    res->body = NULL;
    res->blocks = NULL;
    res->n_blocks = 0;
    unsigned n = 0;
    iov[n++] = (struct MHD_IoVec){held->body, held->body_len};
    for (int i = 0; i < held->n_blocks; i++)
        if (held->blocks[i].len) /* an empty tensor's block sends nothing */
            iov[n++] = (struct MHD_IoVec){held->blocks[i].data, held->blocks[i].len};
    struct MHD_Response *resp = MHD_create_response_from_iovec(iov, n, free_answer, held);
    if (!resp) {
        free_answer(held);
        http_reply_stock(r, STOCK_OUT_OF_MEMORY);
        return;
    }
    send_with_headers(r, status, resp, content_type, extra, api_response_bytes(held));
}

static void reply_error(srv_request *r, int status, const char *code, const char *message,
                        bool close)
{
    api_error e;
    api_fail(&e, status, code, "", "%s", message);
    size_t len = 0;
    char *body = r->oip ? api_error_json_oip(&e, &len) : api_error_json(&e, &len);
    /* While draining every answer says Connection: close already. */
    static const char *const closing[] = {MHD_HTTP_HEADER_CONNECTION, "close", NULL};
    http_reply_owned(r, status, "application/json", body, len,
                     close && !http_draining(r->srv) ? closing : NULL);
    if (r->status == status)
        r->error_code = code; /* a literal of the caller's */
}

void http_reply_error(srv_request *r, int status, const char *code, const char *message)
{
    reply_error(r, status, code, message, false);
}

void http_reply_error_close(srv_request *r, int status, const char *code,
                            const char *message)
{
    reply_error(r, status, code, message, true);
}

/* The stock errors in one form: /v1's error objects, or /v2's. */
static bool stock_build(srv_server *srv, srv_canned **stock, bool oip)
{
    char msg[200];
    snprintf(msg, sizeof msg,
             "the request body is larger than this server's limit of %lld bytes (--max-body)",
             (long long)srv->cfg->max_body);
    stock[STOCK_NOT_FOUND] = canned_error_as(srv, oip, 404, "not_found",
        "no such path; the API is described at GET /openapi.yaml", NULL, NULL);
    stock[STOCK_BODY_TOO_LARGE] = canned_error_as(srv, oip, 413, "body_too_large", msg, NULL,
                                                  NULL);
    stock[STOCK_UNSUPPORTED_MEDIA] = canned_error_as(srv, oip, 415, "unsupported_media_type",
        oip ? "the body must be JSON, or JSON followed by binary tensors: send Content-Type: "
              "application/json or application/octet-stream (or none)"
            : "the body must be JSON: send Content-Type: application/json (or none)",
        NULL, NULL);
    stock[STOCK_OUT_OF_MEMORY] = canned_error_as(srv, oip, 500, "out_of_memory",
        "the server ran out of memory for this request; try a smaller one", NULL, NULL);
    stock[STOCK_OVERLOADED] = canned_error_as(srv, oip, 503, "overloaded",
        "every compute slot is busy and the queue is full; retry shortly",
        MHD_HTTP_HEADER_RETRY_AFTER, "1");
    snprintf(msg, sizeof msg,
             "the answers waiting to be sent already hold most of this server's %lld "
             "bytes for them (--max-response); retry shortly",
             (long long)srv->cfg->max_response);
    stock[STOCK_RESPONSES_PENDING] = canned_error_as(srv, oip, 503, "overloaded", msg,
        MHD_HTTP_HEADER_RETRY_AFTER, "1");
    snprintf(msg, sizeof msg,
             "the requests being computed already hold most of this server's %lld bytes "
             "for them (--max-memory); retry shortly",
             (long long)srv->cfg->max_memory);
    stock[STOCK_MEMORY_PENDING] = canned_error_as(srv, oip, 503, "overloaded", msg,
        MHD_HTTP_HEADER_RETRY_AFTER, "1");
    snprintf(msg, sizeof msg,
             "the request bodies being received already hold most of this server's %lld "
             "bytes for them (--max-body-memory); retry shortly",
             (long long)srv->cfg->max_body_memory);
    stock[STOCK_BODIES_PENDING] = canned_error_as(srv, oip, 503, "overloaded", msg,
        MHD_HTTP_HEADER_RETRY_AFTER, "1");
    stock[STOCK_SHUTTING_DOWN] = canned_error_as(srv, oip, 503, "shutting_down",
        "this server is shutting down; retry on another replica",
        MHD_HTTP_HEADER_RETRY_AFTER, "5");
    snprintf(msg, sizeof msg,
             "this client already has the %d connections that --max-conns-per-ip allows; "
             "reuse or close one, then retry", srv->cfg->max_conns_per_ip);
    stock[STOCK_PER_IP_LIMIT] = canned_error_as(srv, oip, 503, "too_many_connections", msg,
        MHD_HTTP_HEADER_RETRY_AFTER, "1");
    snprintf(msg, sizeof msg,
             "this server's connections are running short (--max-connections %d) and this "
             "client's address holds the most of them; reuse or close one, then retry",
             srv->cfg->max_connections);
    stock[STOCK_PRESSURE] = canned_error_as(srv, oip, 503, "too_many_connections", msg,
        MHD_HTTP_HEADER_RETRY_AFTER, "1");
    snprintf(msg, sizeof msg,
             "every one of this server's %d connections (--max-connections) is serving a "
             "request; retry shortly", srv->cfg->max_connections);
    stock[STOCK_CONNECTIONS_FULL] = canned_error_as(srv, oip, 503, "too_many_connections", msg,
        MHD_HTTP_HEADER_RETRY_AFTER, "1");
    /* RFC 6750 section 3: the challenge, and error="invalid_token" when a
     * token was presented but is not one of the keys. */
    stock[STOCK_NO_KEY] = canned_error_as(srv, oip, 401, "unauthorized",
        "this server needs an API key: send Authorization: Bearer <key>",
        MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"attnd\"");
    stock[STOCK_WRONG_KEY] = canned_error_as(srv, oip, 401, "unauthorized",
        "the bearer token is not one of this server's API keys",
        MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"attnd\", error=\"invalid_token\"");
    for (int i = 0; i < N_STOCK; i++)
        if (!stock[i])
            return false;
    return true;
}

bool stock_init(srv_server *srv)
{
    return stock_build(srv, srv->stock, false) && stock_build(srv, srv->stock_oip, true);
}

void stock_free(srv_server *srv)
{
    for (int i = 0; i < N_STOCK; i++) {
        canned_free(srv->stock[i]);
        canned_free(srv->stock_oip[i]);
        srv->stock[i] = srv->stock_oip[i] = NULL;
    }
}
