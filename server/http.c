/*
 * Bytes in, bytes out: the libmicrohttpd daemon and its callbacks, which
 * carry each request from its headers to its completion.
 *
 * Threads: a pool of --io-threads I/O threads (config.c says why half the
 * cores), each polling its own connections, accepts connections and parses
 * HTTP; tiny requests are answered on them, large computations are handed
 * to compute.c with the connection suspended.
 *
 * One srv_connection per connection holds what outlives a request (its
 * address, its body buffer); the request on it is a srv_request inside it,
 * reset at once when the next request begins. Answers are replies.c's,
 * bodies body.c's, the judging of framing framing.c's, and what is done
 * about a known bug of the library mhd_quirks.c's.
 */
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double srv_now_coarse(void)
{
#ifdef CLOCK_MONOTONIC_COARSE
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
#else
    return srv_now();
#endif
}

void http_resume(srv_request *r)
{
    MHD_resume_connection(r->conn);
}

/* ------------------------------------------------------------- requests */

void request_begin(srv_connection *cx, const char *method, const char *path,
                   const srv_headers *h)
{
    srv_server *srv = cx->srv;
    cx->request = (srv_request){
        .srv = srv,
        .connection = cx,
        .conn = cx->conn,
        .method = method,
        .path = path,
        .target_len = cx->target_len,
        .origin = cors_allowed(&srv->cors, h->origin),
        .user_agent = h->user_agent,
        .t_start = srv_now(),
        .in_flight = true,
        .refusal = -1,
        .oip = routes_is_oip(path),
        .json_length = h->inference_header,
    };
    srv_request *r = &cx->request;
    request_id_set(r, h->request_id);
    bool path_known;
    r->route = routes_match(srv, method, path, &path_known, &r->label);
    if (r->route)
        routes_path_id(r->route->path, path, r->path_id, sizeof r->path_id);
    metrics_request_start(&srv->metrics, r->label);
}

void request_end(srv_request *r)
{
    double seconds = srv_now() - r->t_start;
    log_request(&r->srv->log, r, seconds);
    compute_release(r); /* the answer's bytes, now sent or abandoned */
    api_response_free(&r->res);
    body_trim(r->connection);
    conn_waiting(r->connection); /* for the next request, from now on */
    r->in_flight = false;
    /* Last: the drain in main may end as soon as this reaches zero. */
    metrics_request_done(&r->srv->metrics, r->label, r->status, seconds, r->bytes_in,
                         r->bytes_out);
}

/* ------------------------------------------------------------- callbacks */

/* The first call for a request: only the headers are known. A request
 * whose headers already doom it (its framing, too large, not JSON) is
 * answered now, which makes libmicrohttpd skip its body and
 * close the connection. Everything else is answered on the last call, after the body:
 * an answer queued this early would cost the client its keep-alive. */
static void on_headers(srv_request *r, const srv_headers *h)
{
    if (r->connection->refused != REFUSE_NONE) {
        http_refuse_connection(r);
        return;
    }
    uint64_t length = 0;
    bool has_length = false;
    if (framing_check(r, h, &length, &has_length) == FRAMING_REFUSED)
        return;
    /* A CORS preflight carries no credentials (Fetch standard) and is
     * answered alike for every path (on_body_done), so it reveals nothing. */
    if (cors_is_preflight(r->method, h)) {
        r->preflight = true;
        return;
    }
    /* The key before anything else about the request: a client without one
     * learns nothing (not even which paths exist). The health routes are
     * for probes. */
    if (!(r->route && r->route->open)) {
        srv_auth_result a = auth_check(&r->srv->auth, h->authorization);
        if (a != AUTH_OK) {
            http_reply_stock(r, a == AUTH_MISSING ? STOCK_NO_KEY : STOCK_WRONG_KEY);
            return;
        }
        r->has_owner = auth_key_of(&r->srv->auth, h->authorization, r->owner,
                                   sizeof r->owner);
    }
    /* Draining: the body is read but not kept, and the client is told to go
     * elsewhere once it is in. Answering before it would close the
     * connection with the body unread, and a socket closed with unread
     * bytes is reset, which can destroy the answer on its way. A client
     * trickling its body is dropped by the drain's sweep (conn_limit.c). */
    if (http_draining(r->srv) && ((has_length && length > 0) || h->n_encoding)) {
        r->drain_discard = true;
        return;
    }
    if (r->route && r->route->has_body)
        body_expect(r, h, length, has_length);
    /* A decoding step: a worker comes up while its body is read. */
    if (r->route && r->route->op == API_OP_CACHE_ATTENTION && has_length && !r->responded)
        compute_expect(r->srv, length);
}

/* The last call: the whole body is in (or was discarded). */
static void on_body_done(srv_request *r)
{
    if (r->drain_discard) {
        http_reply_stock(r, STOCK_SHUTTING_DOWN);
    } else if (r->preflight) {
        cors_preflight(r);
    } else if (!r->route) {
        const char *allow = routes_allow(r->srv, r->path);
        if (!allow)
            routes_not_found(r);
        else if (!strcmp(r->method, MHD_HTTP_METHOD_OPTIONS))
            cors_options(r, allow);
        else
            http_reply_canned(r, routes_not_allowed(r->srv, r->path));
    } else if (r->too_large) {
        http_reply_stock(r, STOCK_BODY_TOO_LARGE);
    } else if (r->bodies_full) {
        http_reply_stock(r, STOCK_BODIES_PENDING);
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
        srv_connection *cx = info ? info->socket_context : NULL;
        if (!cx)
            return MHD_NO; /* no memory for this connection: drop it */
        srv_headers h;
        headers_read(c, &h);
        request_begin(cx, method, url, &h);
        r = &cx->request;
        *con_cls = r;
        on_headers(r, &h);
        /* Reading only while a body is to come: the drain drops reading
         * connections, and the idlest of them may be shed, which must never
         * befall a request that is whole (a GET between this call and the
         * next). */
        bool body_to_come = h.n_encoding > 0 || (h.n_length > 0 && h.length_ok && h.value > 0);
        if (body_to_come && !r->responded)
            conn_reading(cx);
        else
            conn_serving(cx);
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        conn_progress(r->connection);
        if (r->route && r->route->has_body && !r->responded && !r->drain_discard) {
            body_take(r, upload, n);
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
    /* Resumed after its client went away (conn_watch.c): no answer, the
     * connection closes and the request ends as a 499. */
    if (atomic_load(&r->computed) && atomic_load(&r->cancel))
        return MHD_NO;
    if (!r->responded)
        on_body_done(r);
    conn_serving(r->connection); /* unless it went to compute */
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
    if (!r->responded || toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        /* nginx's 499: the client went away before its answer was sent. */
        if (!r->responded || r->status == 0)
            r->status = 499;
    }
    *con_cls = NULL;
    request_end(r);
}

/* The peer's address as text, or "-". inet_ntop costs ~3k instructions, so
 * it runs once per connection rather than once per request. */
static void client_address(const struct sockaddr *sa, char *buf, size_t cap)
{
    snprintf(buf, cap, "-");
    if (!sa)
        return;
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, buf,
                  (socklen_t)cap);
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, buf,
                  (socklen_t)cap);
}

static void *on_request_line(void *cls, const char *uri, struct MHD_Connection *c)
{
    (void)cls;
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_connection *cx = info ? info->socket_context : NULL;
    if (cx) {
        cx->target_len = strlen(uri);
        cx->nul_in_target = false;
        quirks_request_line(cx, uri);
    }
    return NULL; /* the access handler's context stays unset until its first call */
}

/* libmicrohttpd decodes the path and each query argument in place with
 * this. "%00" would decode to a NUL, which ends the C string there: the
 * rest of the path would be silently cut off ("/v1/attention%00/../x" served
 * as /v1/attention). Such a text is left as it came, and the request is
 * refused (framing_check), naming it as sent. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    if (!strstr(s, "%00"))
        return MHD_http_unescape(s);
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_connection *cx = info ? info->socket_context : NULL;
    if (cx)
        cx->nul_in_target = true;
    return strlen(s);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    srv_server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        srv_connection *cx = calloc(1, sizeof *cx);
        if (cx) {
            cx->srv = srv;
            cx->conn = c;
            const union MHD_ConnectionInfo *fd =
                MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
            cx->fd = fd ? fd->connect_fd : -1;
            const union MHD_ConnectionInfo *info =
                MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
            const struct sockaddr *addr = info ? info->client_addr : NULL;
            client_address(addr, cx->remote, sizeof cx->remote);
            conn_limit_open(&srv->conn_limit, cx, addr);
            /* libmicrohttpd 0.9.75 calls this after listing the connection
             * for timeouts, so its timeout may change here. */
            if (cx->refused != REFUSE_NONE)
                MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT,
                                          (unsigned int)REFUSED_TIMEOUT);
        }
        *socket_context = cx;
    } else {
        srv_connection *cx = *socket_context;
        if (cx) {
            quirks_connection_closed(cx);
            conn_limit_close(&srv->conn_limit, cx);
            body_free(cx);
            free(cx);
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
    quirks_logged(srv, msg);
}

/* ------------------------------------------------------------- lifecycle */

bool http_start(srv_server *srv, char *err, size_t err_len)
{
    const attnd_config *cfg = srv->cfg;
    cors_init(&srv->cors, cfg);
    if (!conn_limit_init(&srv->conn_limit, cfg) || !stock_init(srv) || !routes_init(srv)) {
        snprintf(err, err_len, "out of memory building the fixed responses");
        return false;
    }
    if (!compute_start(srv)) {
        snprintf(err, err_len, "cannot start compute threads");
        return false;
    }
    if (!(srv->caches = api_caches_new((double)cfg->cache_memory, cfg->cache_idle))) {
        snprintf(err, err_len, "out of memory for the KV cache store");
        compute_stop(srv);
        return false;
    }
    if (!watch_start(srv)) {
        snprintf(err, err_len, "cannot start the connection watcher");
        compute_stop(srv);
        api_caches_free(srv->caches);
        srv->caches = NULL;
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
        flags, (uint16_t)cfg->port, accept_policy, srv,
        on_request, srv,
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_error, srv,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_ARRAY, pool_options,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)cfg->timeout,
        /* attnd holds --max-connections; the room above it is for refused
         * and shed connections (conn_limit.c). Divided among the I/O
         * threads; with poll(2), not bounded by FD_SETSIZE. main raises the
         * process's descriptor limit to fit. */
        MHD_OPTION_CONNECTION_LIMIT,
        (unsigned int)(cfg->max_connections + conn_limit_room(cfg->max_connections)),
        MHD_OPTION_UNESCAPE_CALLBACK, unescape, srv,
        /* The per-connection pool holds the request head and the read
         * buffer (half of it), and libmicrohttpd clears it after every
         * request. A body is read one buffer a turn of the poll loop, a
         * poll and a recv each (a system call costs ~1 us on a virtual
         * machine): 32 KiB reads a decode step's 33 KB body in three turns
         * instead of five, for ~0.1 us more zeroing a request
         * (docs/benchmarks.md). Larger pools libmicrohttpd maps per
         * connection (a mmap and a munmap each), and 64 KiB made the
         * zeroing a tenth of a /healthz. */
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(32 * 1024),
        MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv,
        MHD_OPTION_URI_LOG_CALLBACK, on_request_line, srv,
        MHD_OPTION_ARRAY, tls_options,
        MHD_OPTION_END);
    if (!srv->daemon) {
        snprintf(err, err_len, "cannot listen on %s port %d: %s", cfg->bind, cfg->port,
                 strerror(errno));
        watch_stop(srv);
        compute_stop(srv);
        api_caches_free(srv->caches);
        srv->caches = NULL;
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
    watch_stop(srv);
    MHD_stop_daemon(srv->daemon);
    srv->daemon = NULL;
    conn_limit_free(&srv->conn_limit);
    compute_stop(srv);
    api_caches_free(srv->caches);
    srv->caches = NULL;
    routes_free(srv);
    stock_free(srv);
}
