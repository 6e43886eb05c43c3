/*
 * Bytes in, bytes out: the libmicrohttpd daemon, the reading of request
 * bodies (with the --max-body limit and the Content-Type rule below),
 * and the queueing of responses with the headers every response carries.
 *
 * Threads: a pool of --io-threads I/O threads (config.c says why half the
 * cores), each polling its own connections, accepts connections and parses
 * HTTP; tiny requests are answered on them, large computations are handed
 * to compute.c with the connection suspended.
 * Responses that never change (/healthz, /openapi.yaml, the 404, ...) are
 * built once and shared by every request that needs no header of its own.
 */
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* A body buffer larger than this is not kept for the connection's next
 * request: idle keep-alive connections should not pin megabytes. */
#define KEEP_BODY_BUFFER (1u << 20)

struct srv_canned {
    int status;
    const char *content_type;
    const char *body;
    size_t len;
    char *owned;              /* body storage when canned_error built it */
    const char *hname, *hvalue;
    struct MHD_Response *shared;
};

double srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ responses */

/* Headers that depend on the request, not on the answer. */
static void add_request_headers(const srv_request *r, struct MHD_Response *resp)
{
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
    srv_canned *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    *c = (srv_canned){.status = status, .content_type = content_type, .body = body,
                      .len = len, .hname = hname, .hvalue = hvalue};
    c->shared = canned_build(c);
    if (!c->shared) {
        free(c);
        return NULL;
    }
    /* The shared copy carries what every request would add, so that the
     * common case (no Origin, not draining) queues it untouched. */
    if (srv->cors.enabled)
        MHD_add_response_header(c->shared, MHD_HTTP_HEADER_VARY, "Origin");
    return c;
}

srv_canned *canned_error(const srv_server *srv, int status, const char *code,
                         const char *message, const char *hname, const char *hvalue)
{
    api_error e;
    api_fail(&e, status, code, "", "%s", message);
    size_t len;
    char *body = api_error_json(&e, &len);
    if (!body)
        return NULL;
    srv_canned *c = canned_new(srv, status, "application/json", body, len, hname, hvalue);
    if (!c) {
        free(body);
        return NULL;
    }
    c->owned = body;
    return c;
}

void canned_free(srv_canned *c)
{
    if (!c)
        return;
    MHD_destroy_response(c->shared);
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

void http_reply_canned(srv_request *r, const srv_canned *c)
{
    if (!r->origin && !http_draining(r->srv)) {
        queue(r, c->status, c->shared, c->len);
        return;
    }
    struct MHD_Response *resp = canned_build(c);
    if (!resp) {
        queue(r, c->status, c->shared, c->len);
        return;
    }
    add_request_headers(r, resp);
    queue(r, c->status, resp, c->len);
    MHD_destroy_response(resp);
}

void http_reply_stock(srv_request *r, stock_error e)
{
    http_reply_canned(r, r->srv->stock[e]);
}

void http_reply_owned(srv_request *r, int status, const char *content_type,
                      char *body, size_t len, const char *const *extra)
{
    struct MHD_Response *resp =
        body ? MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE) : NULL;
    if (!resp) {
        free(body);
        http_reply_stock(r, STOCK_OUT_OF_MEMORY);
        return;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    for (; extra && extra[0]; extra += 2)
        MHD_add_response_header(resp, extra[0], extra[1]);
    add_request_headers(r, resp);
    queue(r, status, resp, len);
    MHD_destroy_response(resp);
}

/* A connection past --max-conns-per-ip: its one answer, then it closes. */
static void refuse_over_limit(srv_request *r)
{
    const srv_canned *c = r->srv->stock[STOCK_TOO_MANY_CONNECTIONS];
    struct MHD_Response *resp = canned_build(c);
    if (!resp) {
        queue(r, c->status, c->shared, c->len);
        return;
    }
    add_request_headers(r, resp);
    if (!http_draining(r->srv)) /* else it has one already */
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    queue(r, c->status, resp, c->len);
    MHD_destroy_response(resp);
}

void http_resume(srv_request *r)
{
    MHD_resume_connection(r->conn);
}

/* --------------------------------------------------------- request bodies */

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

static bool reserve(srv_request *r, size_t need)
{
    if (need <= r->body_cap)
        return true;
    char *p = realloc(r->body, need);
    if (!p)
        return false;
    r->body = p;
    r->body_cap = need;
    return true;
}

/* Checks what the headers promise before a byte of the body is read, so an
 * oversized or unreadable upload is refused without being received. Returns
 * false when a response was queued. */
static bool expect_body(srv_request *r, const srv_headers *h, uint64_t length,
                        bool has_length)
{
    if (http_draining(r->srv)) {
        http_reply_stock(r, STOCK_SHUTTING_DOWN);
        return false;
    }
    if (!readable_as_json(h->content_type)) {
        http_reply_stock(r, STOCK_UNSUPPORTED_MEDIA);
        return false;
    }
    if (has_length) {
        if (length > (uint64_t)r->srv->cfg->max_body) {
            http_reply_stock(r, STOCK_BODY_TOO_LARGE);
            return false;
        }
        /* One allocation of the announced size instead of a doubling series. */
        if (!reserve(r, length ? (size_t)length : 1))
            r->out_of_memory = true;
    }
    return true;
}

static void take_body(srv_request *r, const char *data, size_t n)
{
    size_t max_body = (size_t)r->srv->cfg->max_body;
    r->bytes_in += n;
    if (r->too_large || r->out_of_memory)
        return;
    if (r->body_len + n > max_body) {
        /* Only a chunked upload gets here (a Content-Length was checked). */
        r->too_large = true;
        return;
    }
    if (r->body_len + n > r->body_cap) {
        size_t cap = r->body_cap * 2;
        if (cap < r->body_len + n)
            cap = r->body_len + n;
        if (cap < 16384)
            cap = 16384;
        if (cap > max_body)
            cap = max_body;
        if (!reserve(r, cap)) {
            r->out_of_memory = true;
            return;
        }
    }
    memcpy(r->body + r->body_len, data, n);
    r->body_len += n;
}

/* ------------------------------------------------------------- callbacks */

static void begin_request(srv_request *r, struct MHD_Connection *c, const char *url,
                          const char *method, const srv_headers *h)
{
    r->conn = c;
    r->method = method;
    r->path = url;
    r->t_start = srv_now();
    r->route = NULL;
    r->label = -1;
    r->body_len = 0;
    r->bytes_in = 0;
    r->too_large = r->out_of_memory = false;
    r->responded = false;
    r->status = 0;
    r->bytes_out = 0;
    atomic_store_explicit(&r->computed, false, memory_order_relaxed);
    r->call = NULL;
    r->reserved = 0;
    r->refusal = -1;
    r->res = (api_response){0};
    r->in_flight = true;
    metrics_request_start(&r->srv->metrics);
    r->origin = cors_allowed(&r->srv->cors, h->origin);
}

/* The first call for a request: only the headers are known. A request
 * whose headers already doom it (its framing, too large, not JSON,
 * draining) is answered now, which makes libmicrohttpd skip its body and
 * close the connection. Everything else is answered on the last call, after the body:
 * an answer queued this early would cost the client its keep-alive. */
static void on_headers(srv_request *r, const srv_headers *h)
{
    bool path_known = false;
    r->route = routes_match(r->srv, r->method, r->path, &path_known, &r->label);
    if (r->over_limit) {
        refuse_over_limit(r);
        return;
    }
    uint64_t length = 0;
    bool has_length = false;
    if (framing_check(r, h, &length, &has_length) == FRAMING_REFUSED)
        return;
    /* The key before anything else about the request: a client without one
     * learns nothing (not even which paths exist). Preflights carry no
     * credentials (Fetch standard), and the health routes are for probes. */
    bool preflight = !r->route && path_known && !strcmp(r->method, MHD_HTTP_METHOD_OPTIONS);
    if (!(r->route && r->route->open) && !preflight) {
        srv_auth_result a = auth_check(&r->srv->auth, h->authorization);
        if (a != AUTH_OK) {
            http_reply_stock(r, a == AUTH_MISSING ? STOCK_NO_KEY : STOCK_WRONG_KEY);
            return;
        }
    }
    if (r->route && r->route->has_body)
        expect_body(r, h, length, has_length);
}

/* The last call: the whole body is in (or was discarded). */
static void on_body_done(srv_request *r)
{
    if (!r->route) {
        const char *allow = routes_allow(r->srv, r->path);
        if (!allow)
            http_reply_stock(r, STOCK_NOT_FOUND);
        else if (!strcmp(r->method, MHD_HTTP_METHOD_OPTIONS))
            cors_preflight(r, allow);
        else
            http_reply_canned(r, routes_not_allowed(r->srv, r->path));
    } else if (r->too_large) {
        http_reply_stock(r, STOCK_BODY_TOO_LARGE);
    } else if (r->out_of_memory) {
        http_reply_stock(r, STOCK_OUT_OF_MEMORY);
    } else if (atomic_load(&r->computed)) {
        routes_compute_done(r); /* resumed by a compute worker */
    } else {
        r->route->handle(r);
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls)
{
    (void)cls;
    (void)version;
    srv_request *r = *con_cls;
    if (!r) {
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        r = info ? info->socket_context : NULL;
        if (!r)
            return MHD_NO; /* no memory for this connection: drop it */
        srv_headers h;
        headers_read(c, &h);
        begin_request(r, c, url, method, &h);
        *con_cls = r;
        on_headers(r, &h);
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (r->route && r->route->has_body && !r->responded) {
            take_body(r, upload, n);
        } else {
            r->bytes_in += n; /* a body nobody reads */
            r->too_large = r->bytes_in > (size_t)r->srv->cfg->max_body;
        }
        /* A chunked upload past the limit is read to its end so that the
         * client gets its 413, but not forever. */
        if (r->too_large && r->bytes_in > 2 * (size_t)r->srv->cfg->max_body)
            return MHD_NO;
        return MHD_YES;
    }
    if (!r->responded)
        on_body_done(r);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    srv_request *r = *con_cls;
    if (!r || !r->in_flight)
        return;
    double seconds = srv_now() - r->t_start;
    if (!r->responded || toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        /* nginx's 499: the client went away before its answer was sent. */
        if (!r->responded || r->status == 0)
            r->status = 499;
    }
    log_request(&r->srv->log, r, seconds);
    compute_release(r); /* the answer's bytes, now sent or abandoned */
    api_response_free(&r->res);
    r->res = (api_response){0};
    if (r->body_cap > KEEP_BODY_BUFFER) {
        free(r->body);
        r->body = NULL;
        r->body_cap = 0;
    }
    r->in_flight = false;
    *con_cls = NULL;
    /* Last: the drain in main may end as soon as this reaches zero. */
    metrics_request_done(&r->srv->metrics, r->label, r->status, seconds, r->bytes_in,
                         r->bytes_out);
}

/* The peer's address as text, or "-". inet_ntop costs ~3k instructions, so
 * it runs once per connection rather than once per request. */
static void client_address(struct MHD_Connection *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "-");
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!info || !info->client_addr)
        return;
    const struct sockaddr *sa = info->client_addr;
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, buf,
                  (socklen_t)cap);
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, buf,
                  (socklen_t)cap);
}

/* The request whose request line this I/O thread read last: the one its
 * next libmicrohttpd message is about (framing.c). */
static _Thread_local srv_request *reading;
static _Thread_local const char *reading_uri;

static void *on_request_line(void *cls, const char *uri, struct MHD_Connection *c)
{
    (void)cls;
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    reading = info ? info->socket_context : NULL;
    reading_uri = uri;
    if (reading && !reading->in_flight) {
        reading->conn = c;
        reading->target_len = strlen(uri);
    }
    return NULL; /* the access handler's context stays unset until its first call */
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    srv_server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        srv_request *r = calloc(1, sizeof *r);
        if (r) {
            r->srv = srv;
            client_address(c, r->remote, sizeof r->remote);
            const union MHD_ConnectionInfo *info =
                MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
            r->client = conn_limit_open(&srv->conn_limit, info ? info->client_addr : NULL,
                                        &r->over_limit);
            /* libmicrohttpd 0.9.75 calls this after listing the connection
             * for timeouts, so its timeout may change here. */
            if (r->over_limit)
                MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT,
                                          (unsigned int)OVER_LIMIT_TIMEOUT);
        }
        *socket_context = r;
    } else {
        srv_request *r = *socket_context;
        if (r && reading == r)
            reading = NULL;
        if (r) {
            conn_limit_close(&srv->conn_limit, r->client);
            free(r->body);
            free(r);
        }
        *socket_context = NULL;
    }
}

static enum MHD_Result accept_policy(void *cls, const struct sockaddr *addr, socklen_t len)
{
    srv_server *srv = cls;
    (void)len;
    return conn_limit_accept(&srv->conn_limit, addr) ? MHD_YES : MHD_NO;
}

static void on_mhd_error(void *cls, const char *fmt, va_list ap)
{
    srv_server *srv = cls;
    char msg[400];
    vsnprintf(msg, sizeof msg, fmt, ap);
    log_event(&srv->log, "warn", "libmicrohttpd: %s", msg);
    /* libmicrohttpd 0.9.75's words when it refuses a request's
     * Content-Length itself (see framing.c). */
    if (reading && (!strncmp(msg, "Failed to parse `Content-Length' header", 39) ||
                    !strncmp(msg, "Too large value of 'Content-Length' header", 42))) {
        framing_malformed_length(reading, reading_uri);
        reading = NULL;
    }
}

/* ------------------------------------------------------------- lifecycle */

static bool build_stock(srv_server *srv)
{
    srv_canned **stock = srv->stock;
    char msg[160];
    snprintf(msg, sizeof msg,
             "the request body is larger than this server's limit of %lld bytes (--max-body)",
             (long long)srv->cfg->max_body);
    stock[STOCK_NOT_FOUND] = canned_error(srv, 404, "not_found",
        "no such path; the API is described at GET /openapi.yaml", NULL, NULL);
    stock[STOCK_BODY_TOO_LARGE] = canned_error(srv, 413, "body_too_large", msg, NULL, NULL);
    stock[STOCK_UNSUPPORTED_MEDIA] = canned_error(srv, 415, "unsupported_media_type",
        "the body must be JSON: send Content-Type: application/json (or none)", NULL, NULL);
    stock[STOCK_OUT_OF_MEMORY] = canned_error(srv, 500, "out_of_memory",
        "the server ran out of memory for this request; try a smaller one", NULL, NULL);
    stock[STOCK_OVERLOADED] = canned_error(srv, 503, "overloaded",
        "every compute slot is busy and the queue is full; retry shortly",
        MHD_HTTP_HEADER_RETRY_AFTER, "1");
    snprintf(msg, sizeof msg,
             "the answers waiting to be sent already hold most of this server's %lld "
             "bytes for them (--max-response); retry shortly",
             (long long)srv->cfg->max_response);
    stock[STOCK_RESPONSES_PENDING] = canned_error(srv, 503, "overloaded", msg,
        MHD_HTTP_HEADER_RETRY_AFTER, "1");
    stock[STOCK_SHUTTING_DOWN] = canned_error(srv, 503, "shutting_down",
        "this server is shutting down; retry on another replica",
        MHD_HTTP_HEADER_RETRY_AFTER, "5");
    snprintf(msg, sizeof msg,
             "this client already has the %d connections that --max-conns-per-ip allows; "
             "reuse or close one, then retry", srv->cfg->max_conns_per_ip);
    stock[STOCK_TOO_MANY_CONNECTIONS] = canned_error(srv, 503, "too_many_connections", msg,
        MHD_HTTP_HEADER_RETRY_AFTER, "1");
    /* RFC 6750 section 3: the challenge, and error="invalid_token" when a
     * token was presented but is not one of the keys. */
    stock[STOCK_NO_KEY] = canned_error(srv, 401, "unauthorized",
        "this server needs an API key: send Authorization: Bearer <key>",
        MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"attnd\"");
    stock[STOCK_WRONG_KEY] = canned_error(srv, 401, "unauthorized",
        "the bearer token is not one of this server's API keys",
        MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"attnd\", error=\"invalid_token\"");
    for (int i = 0; i < N_STOCK; i++)
        if (!stock[i])
            return false;
    return true;
}

bool http_start(srv_server *srv, char *err, size_t err_len)
{
    const attnd_config *cfg = srv->cfg;
    cors_init(&srv->cors, cfg);
    conn_limit_init(&srv->conn_limit, cfg->max_conns_per_ip);
    if (!build_stock(srv) || !routes_init(srv)) {
        snprintf(err, err_len, "out of memory building the fixed responses");
        return false;
    }
    if (!compute_start(srv)) {
        snprintf(err, err_len, "cannot start compute threads");
        return false;
    }

    struct sockaddr_storage addr = {0};
    /* poll(2), not epoll: libmicrohttpd 0.9.75 in epoll (edge-triggered)
     * mode can miss the end of a connection whose last body bytes and FIN
     * arrive together, leaving the request "in flight" until the idle
     * timeout, which also stalls a drain. At the few hundred connections a
     * replica behind a load balancer sees, poll costs the same per request. */
    unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                         MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    struct sockaddr_in *v4 = (struct sockaddr_in *)&addr;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&addr;
    if (inet_pton(AF_INET, cfg->bind, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)cfg->port);
    } else if (inet_pton(AF_INET6, cfg->bind, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)cfg->port);
        flags |= MHD_USE_IPv6;
    } else {
        snprintf(err, err_len, "cannot parse bind address %s", cfg->bind);
        return false;
    }

    /* HTTPS: the certificate and key as PEM text (tls.c). */
    struct MHD_OptionItem tls_options[] = {
        {MHD_OPTION_HTTPS_MEM_CERT, 0, srv->tls_cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, srv->tls_key},
        {MHD_OPTION_END, 0, NULL},
    };
    /* One I/O thread is libmicrohttpd's internal polling thread itself (it
     * warns that a pool of one is not used). */
    struct MHD_OptionItem pool_options[] = {
        {MHD_OPTION_THREAD_POOL_SIZE, cfg->io_threads, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    if (cfg->io_threads < 2)
        pool_options[0].option = MHD_OPTION_END;
    if (tls_enabled(srv))
        flags |= MHD_USE_TLS;
    else
        tls_options[0].option = MHD_OPTION_END;
    srv->daemon = MHD_start_daemon(
        flags, (uint16_t)cfg->port, cfg->max_conns_per_ip ? accept_policy : NULL, srv,
        on_request, srv,
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_error, srv,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_ARRAY, pool_options,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)cfg->timeout,
        /* The per-connection pool holds the request head and the read
         * buffer, and libmicrohttpd clears it after every request: 64 KiB
         * made that memset a tenth of a /healthz, 16 KiB still takes 8 KiB
         * of headers (nginx's default) and reads bodies in big enough bites. */
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(16 * 1024),
        MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv,
        MHD_OPTION_URI_LOG_CALLBACK, on_request_line, srv,
        MHD_OPTION_ARRAY, tls_options,
        MHD_OPTION_END);
    if (!srv->daemon) {
        snprintf(err, err_len, "cannot listen on %s port %d: %s", cfg->bind, cfg->port,
                 strerror(errno));
        compute_stop(srv);
        return false;
    }
    return true;
}

int http_port(const srv_server *srv)
{
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    return info ? info->port : srv->cfg->port;
}

void http_quiesce(srv_server *srv)
{
    /* Closing the listening socket at once makes new connections fail fast
     * (refused) instead of waiting in the backlog until the drain ends and
     * then being reset: a load balancer moves on to another replica. Open
     * keep-alive connections still get 503 shutting_down from /readyz. */
    MHD_socket fd = MHD_quiesce_daemon(srv->daemon);
    if (fd != MHD_INVALID_SOCKET) {
        /* Connections the kernel completed before now wait in the backlog,
         * and their clients may already have sent a request: closing the
         * socket would reset them. They are accepted here and handed to the
         * daemon, which answers them like any open connection (503
         * shutting_down). */
        for (;;) {
            struct sockaddr_storage addr;
            socklen_t len = sizeof addr;
            int c = accept4(fd, (struct sockaddr *)&addr, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (c < 0 && errno == EINTR)
                continue;
            if (c < 0)
                break; /* EAGAIN: the backlog is empty (the socket is non-blocking) */
            MHD_add_connection(srv->daemon, c, (struct sockaddr *)&addr, len); /* closes c on failure */
        }
        /* close() alone stops nothing while an I/O thread still sits in
         * poll() on the socket (poll holds a reference until the thread
         * wakes, milliseconds on a busy machine), and connections completed
         * meanwhile are reset when it lets go. Shutting the socket down
         * stops the listening now. */
        shutdown(fd, SHUT_RD);
        close(fd);
    }
    /* Only now do answers say Connection: close. Their clients reconnect at
     * once; told before the listening stopped, a reconnection could land in
     * the backlog after the last accept above and be reset with its request
     * sent. */
    atomic_store(&srv->draining, true);
}

bool http_draining(const srv_server *srv)
{
    return atomic_load_explicit(&srv->draining, memory_order_relaxed);
}

long http_in_flight(srv_server *srv)
{
    return metrics_in_flight(&srv->metrics);
}

long http_open_connections(srv_server *srv)
{
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return info ? (long)info->num_connections : 0;
}

void http_stop(srv_server *srv)
{
    MHD_stop_daemon(srv->daemon);
    srv->daemon = NULL;
    conn_limit_free(&srv->conn_limit);
    compute_stop(srv);
    routes_free(srv);
    for (int i = 0; i < N_STOCK; i++) {
        canned_free(srv->stock[i]);
        srv->stock[i] = NULL;
    }
}
