/*
 * The server layer's shared vocabulary. One `srv_server` holds everything a
 * running attnd knows (the configuration, the daemon, the compute queue, the
 * counters, the log, the fixed responses); main owns it and hands it to
 * libmicrohttpd as the closure of every callback, so each part reaches the
 * others through it and no file keeps state of its own. One request record
 * travels from the transport (http.c) through the route table (routes.c) and
 * the compute queue (compute.c) to the access log (log.c) and the counters
 * (metrics.c), carrying a pointer back to its server.
 */
#ifndef ATTND_SERVER_H
#define ATTND_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "api.h"
#include "config.h"

typedef struct srv_server srv_server;
typedef struct srv_request srv_request;
typedef struct srv_connection srv_connection;
typedef struct srv_route srv_route;
typedef struct srv_canned srv_canned;

/* ------------------------------------------------------------- requests */

/* A route's handler queues exactly one response (http_reply*), or hands the
 * request to the compute queue, which answers later. */
typedef void (*srv_handler)(srv_request *r);

struct srv_route {
    const char *method; /* HEAD is served by GET routes */
    const char *path;
    srv_handler handle;
    bool has_body;      /* POST: the body is read before the handler runs */
    bool computes;      /* queues for a compute slot (metrics by route) */
    api_op op;          /* ... and computes this operation */
    bool open;          /* answered without an API key (/healthz, /readyz) */
    bool oip;           /* computes as the Open Inference Protocol's infer (/v2) */
};

/* The longest path parameter kept ({id} of /v1/caches/{id}); a longer one
 * names nothing (404). */
#define PATH_PARAM_MAX 64

/* The longest X-Request-ID taken from a client (longer ones are replaced). */
#define REQUEST_ID_MAX 128

/* One request: everything its handling learns, reset by one assignment when
 * the next request on its connection begins (http.c, request_begin). */
struct srv_request {
    srv_server *srv;
    srv_connection *connection; /* the connection it came on */
    struct MHD_Connection *conn;
    const srv_route *route;  /* NULL when no route matched */
    int label;               /* metrics route label (metrics_label) */
    const char *method, *path; /* MHD's strings, valid until completion */
    size_t target_len;       /* the request target's length, query included */
    const char *origin;      /* the Origin to echo back, or NULL */
    const char *user_agent;  /* the client's User-Agent, or NULL (for the log) */
    char id[REQUEST_ID_MAX + 1]; /* X-Request-ID: the client's, or a fresh one */
    double t_start;          /* monotonic seconds at the first callback */
    bool in_flight;          /* between the first callback and completion */
    char path_id[PATH_PARAM_MAX + 1]; /* the {id} of the route's path, or "" */
    bool has_owner;          /* keys are required: `owner` is the request's */
    char owner[1025];        /* its API key (the KV caches' owner) */
    bool preflight;          /* a CORS preflight (cors_is_preflight) */

    size_t body_len;         /* bytes of the body, at connection->body + body_at */
    size_t body_at;          /* where it starts in the buffer (body.c: a binary
                              * /v2 body's tensors start 64-byte aligned) */
    size_t body_expected;    /* the Content-Length announced, 0 without one */
    size_t bytes_in;         /* body bytes received, kept or not */
    bool too_large;
    bool out_of_memory;      /* the body could not be stored */
    bool bodies_full;        /* no room in --max-body-memory for the body: 503 */
    bool drain_discard;      /* arrived while draining: body read unkept, then 503 */

    bool responded;          /* a response has been queued */
    int status;
    size_t bytes_out;
    const char *error_code;  /* an error answer's code ("not_found"), or NULL */
    bool oip;                /* under /v2: errors are {"error": "message"} */
    const char *json_length; /* Inference-Header-Content-Length, or NULL */

    /* compute routes */
    atomic_bool computed;    /* set by a worker before it resumes the connection */
    atomic_int cancel;       /* set once its client is seen gone: libattn stops
                              * (api_limits.cancel) and the answer is dropped */
    api_call *call;          /* prepared (decoded, costed), not computed yet */
    double reserved;         /* answer bytes held against --max-response */
    double memory_reserved;  /* its estimated peak, held against --max-memory */
    int refusal;             /* a stock_error to answer instead of res, or -1 */
    double t_queued;         /* monotonic seconds when it joined the queue */
    api_response res;
    srv_request *next;       /* compute queue link */
};

/* What a connection is doing, as conn_limit.c's policy sees it. */
typedef enum {
    CONN_WAITING,   /* for the headers of its next request (idle ones too) */
    CONN_READING,   /* headers in, the body arriving */
    CONN_SERVING,   /* its handler runs or its answer goes out */
    CONN_COMPUTING, /* suspended: queued for, or holding, a compute slot */
    CONN_REFUSED,   /* not held: its first request is answered 503 */
    CONN_SHED,      /* shut down by attnd; libmicrohttpd closes it next */
} conn_state;

/* Why a connection is refused (CONN_REFUSED). */
typedef enum {
    REFUSE_NONE = 0,
    REFUSE_PER_IP,    /* its address holds --max-conns-per-ip */
    REFUSE_PRESSURE,  /* under pressure, from the address that holds the most */
    REFUSE_FULL,      /* --max-connections held, every one serving a request */
    N_REFUSE
} conn_refusal;

/* Why attnd closed a connection it held. */
typedef enum {
    SHED_IDLEST,         /* its place went to a new connection */
    SHED_HEADER_TIMEOUT, /* its request's headers missed --header-timeout */
    SHED_DRAIN,          /* its body was still arriving when the drain began */
    N_SHED
} conn_shed_reason;

/* One per connection: what outlives a request on it (keep-alive), so that
 * a request costs no allocation of its own. */
struct srv_connection {
    srv_server *srv;
    struct MHD_Connection *conn;
    int fd;                  /* its socket (shut down to shed it) */
    char remote[46];         /* client address for the log (INET6_ADDRSTRLEN),
                              * formatted once per connection */
    /* conn_limit.c's, under its lock */
    struct srv_client *client; /* its count by address, or NULL (not IP) */
    conn_state state;
    conn_refusal refused;    /* REFUSE_NONE while held */
    double since;            /* when it began waiting, or its body last moved */
    srv_connection *prev, *next; /* in the list of its state */
    bool nul_in_target;      /* the request line's target decodes to a NUL */
    char *body;              /* the request body buffer, kept between requests */
    size_t body_cap;
    size_t target_len;       /* the target of the request line read last */
    srv_request request;     /* the request on it now, or the last one */
};

double srv_now(void); /* monotonic seconds */
/* The same clock as of the last timer tick (a few ms behind, at most): for
 * the connections' idle times, which every request moves two or three
 * times and which only timeouts of a second and more ever read. */
double srv_now_coarse(void);

/* ------------------------------------------------------------ http.c */

/* Starts the daemon on srv->cfg's address with every part initialised. */
bool http_start(srv_server *srv, char *err, size_t err_len);
int http_port(const srv_server *srv);  /* the port actually bound */
void http_quiesce(srv_server *srv);    /* stop accepting; /readyz and new computes -> 503 */
bool http_draining(const srv_server *srv);
long http_in_flight(srv_server *srv); /* requests started and not yet completed */
long http_open_connections(srv_server *srv); /* client connections open now */
void http_stop(srv_server *srv);       /* after the drain: close everything */
void http_resume(srv_request *r);      /* from a compute worker */

typedef struct srv_headers srv_headers;
/* Starts the next request on cx (its fields reset at once), matches its
 * route and counts it in flight. */
void request_begin(srv_connection *cx, const char *method, const char *path,
                   const srv_headers *h);
/* The request is over (answered, or its client gone): logged, counted, and
 * what it held released. */
void request_end(srv_request *r);

/* --------------------------------------------------------- replies.c */

/* A response built once and served many times (freed by canned_free). */
srv_canned *canned_new(const srv_server *srv, int status, const char *content_type,
                       const char *body, size_t len, const char *hname,
                       const char *hvalue);
/* An api_error_json body; hname/hvalue: one extra header or NULL. */
srv_canned *canned_error(const srv_server *srv, int status, const char *code,
                         const char *message, const char *hname, const char *hvalue);
/* The same as the Open Inference Protocol has it (api_error_json_oip). */
srv_canned *canned_error_oip(const srv_server *srv, int status, const char *code,
                             const char *message, const char *hname, const char *hvalue);
void canned_free(srv_canned *c);

/* The transport's own errors, built at start. */
typedef enum {
    STOCK_NOT_FOUND,          /* 404 */
    STOCK_BODY_TOO_LARGE,     /* 413 */
    STOCK_UNSUPPORTED_MEDIA,  /* 415 */
    STOCK_OUT_OF_MEMORY,      /* 500 */
    STOCK_OVERLOADED,         /* 503 + Retry-After: the compute queue is full */
    STOCK_RESPONSES_PENDING,  /* 503 + Retry-After: --max-response is spent */
    STOCK_MEMORY_PENDING,     /* 503 + Retry-After: --max-memory is spent */
    STOCK_BODIES_PENDING,     /* 503 + Retry-After: --max-body-memory is spent */
    STOCK_SHUTTING_DOWN,      /* 503 + Retry-After */
    STOCK_PER_IP_LIMIT,       /* 503 + Retry-After: too_many_connections, per address */
    STOCK_PRESSURE,           /* ... this address holds the most under pressure */
    STOCK_CONNECTIONS_FULL,   /* ... every connection serves a request */
    STOCK_NO_KEY,             /* 401 + WWW-Authenticate: no bearer token */
    STOCK_WRONG_KEY,          /* 401 + WWW-Authenticate: not one of the keys */
    N_STOCK
} stock_error;

bool stock_init(srv_server *srv);
void stock_free(srv_server *srv);

void http_reply_canned(srv_request *r, const srv_canned *c);
void http_reply_stock(srv_request *r, stock_error e);
/* Takes ownership of body (malloc'd). extra: NULL-terminated name/value pairs. */
void http_reply_owned(srv_request *r, int status, const char *content_type,
                      char *body, size_t len, const char *const *extra);
/* The same for a body that release (not free) frees once it is sent. */
void http_reply_released(srv_request *r, int status, const char *content_type, char *body,
                         size_t len, const char *const *extra, void (*release)(void *));
/* The API's answer *res with binary blocks after its body (res->n_blocks >
 * 0), sent as they lie: takes over the body and the blocks (res is left
 * holding neither). */
void http_reply_blocks(srv_request *r, int status, const char *content_type,
                       api_response *res, const char *const *extra);
/* An error answer built for this request alone (api_error_json of it). */
void http_reply_error(srv_request *r, int status, const char *code, const char *message);
/* A refused connection (conn_limit.c): its one answer, a 503 saying
 * which rule refused it, then it closes. */
void http_refuse_connection(srv_request *r);
/* An error answer after which the connection closes: the request's framing
 * cannot be trusted, so nothing after it is read as another request. */
void http_reply_error_close(srv_request *r, int status, const char *code,
                            const char *message);
/* The headers every answer carries that depend on the request
 * (X-Request-ID, CORS, Connection: close while draining). */
void http_add_request_headers(const srv_request *r, struct MHD_Response *resp);

/* ------------------------------------------------------ request_id.c */

/* Sets r->id: `given` (the client's X-Request-ID) when it is 1 to
 * REQUEST_ID_MAX visible ASCII characters other than '"' and '\\', else a
 * fresh id of 96 random bits in 16 base64url characters. */
void request_id_set(srv_request *r, const char *given);

/* ------------------------------------------------------------ body.c */

/* Checks what the headers promise before a byte of the body is read, so
 * that an oversized or unreadable upload is refused without being
 * received (length: the Content-Length when has_length). Returns false
 * when a response was queued. */
bool body_expect(srv_request *r, const srv_headers *h, uint64_t length, bool has_length);
/* Keeps n more bytes of the body (or counts them past --max-body). */
void body_take(srv_request *r, const char *data, size_t n);
/* The body's r->body_len bytes, or NULL when none were kept. */
char *body_of(const srv_request *r);
/* Between requests: a large buffer is not kept for an idle connection. */
void body_trim(srv_connection *cx);
/* The connection is closing: its body buffer goes, and its bytes return to
 * --max-body-memory. */
void body_free(srv_connection *cx);

/* ---------------------------------------------------------- framing.c */

/* The header fields a request's handling reads, found in one walk over
 * them (each MHD_lookup_connection_value is a walk of its own). The first
 * of each, as a lookup finds; of the framing fields, what framing_check
 * needs to judge every occurrence. */
struct srv_headers {
    const char *content_type, *origin, *authorization; /* or NULL */
    const char *user_agent, *request_id;               /* or NULL */
    const char *inference_header;  /* Inference-Header-Content-Length, or NULL */
    const char *preflight_method; /* Access-Control-Request-Method, or NULL */
    const char *bad_name;    /* the first field name that is not a token */
    size_t bad_name_len;
    int n_length, n_encoding;
    const char *length;      /* the first Content-Length value */
    uint64_t value;          /* ... read, when well formed */
    bool length_ok;          /* the first is well formed */
    const char *differing;   /* a later value that is not the same number */
    const char *encoding;    /* the first Transfer-Encoding value */
    bool only_chunked;       /* every Transfer-Encoding is "chunked" */
};

void headers_read(struct MHD_Connection *c, srv_headers *h);

typedef enum {
    FRAMING_OK,      /* the body's length is known (or there is none) */
    FRAMING_REFUSED, /* a JSON error is queued */
} framing_result;

/* Checks the request's target (its size, a NUL it decodes to), its header
 * sizes and field names, and its body framing (Transfer-Encoding,
 * Content-Length, from h) before any body is read; *length is the
 * Content-Length when *has_length. */
framing_result framing_check(srv_request *r, const srv_headers *h, uint64_t *length,
                             bool *has_length);
/* A Content-Length as libmicrohttpd reads it: decimal digits only, at
 * most 2^64 - 1. */
bool framing_parse_length(const char *s, uint64_t *out);
/* The message of the 400 for a malformed Content-Length `value`. */
void framing_length_message(char *msg, size_t cap, const char *value);

/* ------------------------------------------------------- mhd_quirks.c */

/* What attnd does about the libmicrohttpd versions it knows to misbehave
 * (mhd_quirks.c says which, and why). Called from http.c's callbacks;
 * with another version, each does nothing. */
/* The URI callback: notes the connection, and a raw NUL in the target. */
void quirks_request_line(srv_connection *cx, const char *uri);
void quirks_connection_closed(srv_connection *cx);
void quirks_logged(srv_server *srv, const char *message);      /* libmicrohttpd's log */

/* ----------------------------------------------------------- routes.c */

/* Per path of the route table (indexed by its first row): the metrics
 * label, the Allow value and the 405 answer naming it; and the fixed
 * answers of the operational routes. */
#define ROUTES_MAX 32
typedef struct {
    int path_row[ROUTES_MAX];
    int label[ROUTES_MAX]; /* by first row: the path's metrics label */
    int n_labels;          /* distinct paths; label n_labels is "other" */
    char allow[ROUTES_MAX][64];
    char all_methods[64];
    srv_canned *not_allowed[ROUTES_MAX];
    srv_canned *healthz, *ready, *openapi, *openapi_json, *info;
    /* the Open Inference Protocol's: live, ready, server and model metadata,
     * model ready (attention, multihead) */
    srv_canned *v2_live, *v2_ready, *v2_server, *v2_model[2], *v2_model_ready[2];
    char *v2_model_body[2];
    char *info_body;
    srv_canned *page[ROUTES_MAX]; /* page.c: one per file of server/web/ */
} srv_routes;

bool routes_init(srv_server *srv);
void routes_free(srv_server *srv);
/* Finds the route for (method, path). NULL with *path_known true: 405 (the
 * path exists with other methods); NULL otherwise: 404. */
const srv_route *routes_match(const srv_server *srv, const char *method, const char *path,
                              bool *path_known, int *label);
/* "GET, HEAD, OPTIONS" or NULL */
const char *routes_allow(const srv_server *srv, const char *path);
/* Every method of the route table, for CORS preflights (whatever the path). */
const char *routes_all_methods(const srv_server *srv);
/* the 405 for path */
const srv_canned *routes_not_allowed(const srv_server *srv, const char *path);
/* Is path under /v2 (the Open Inference Protocol, with its error form)? */
bool routes_is_oip(const char *path);
/* The 404, which names the route the path is a near miss of, if any. */
void routes_not_found(srv_request *r);
void routes_compute_done(srv_request *r); /* answer a finished compute */
/* The {id} of `path` under the route pattern `pattern` into id ("" when it
 * has none; its first cap - 1 bytes when it is longer). */
void routes_path_id(const char *pattern, const char *path, char *id, size_t cap);

/* ------------------------------------------------------------- pool.c */

/* Blocks of this size and more are mapped by the pool and kept when freed;
 * smaller ones are the C library's. */
#define POOL_MIN_BLOCK ((size_t)256 << 10)
/* Seconds a block may stay idle before pool_reap unmaps it. */
#define POOL_IDLE_SECONDS 10.0

typedef struct srv_pool srv_pool;

typedef struct {
    size_t idle_bytes, busy_bytes, limit; /* mapped bytes, headers included */
    size_t lent_bytes;                    /* busy ones pool_realloc_idle gave */
    unsigned long idle_blocks;
    unsigned long maps, reuses;           /* blocks mapped anew, taken from idle */
} pool_stats;

/* A pool that keeps at most `limit` bytes idle. */
srv_pool *pool_new(size_t limit);
/* Unmaps the idle blocks; blocks still handed out are the holders' to free
 * before. */
void pool_destroy(srv_pool *p);
/* n bytes, 64-byte aligned, not zeroed; NULL when out of memory. */
void *pool_alloc(srv_pool *p, size_t n);
void pool_free(srv_pool *p, void *ptr); /* ptr from this pool, or NULL */
/* As realloc: the first min(old, n) bytes kept, perhaps in place. */
void *pool_realloc(srv_pool *p, void *ptr, size_t n);
/* As pool_realloc, but a block that moves is unmapped, not kept idle: for a
 * buffer growing by doubling, whose smaller sizes the next one of its kind
 * will not need. */
void *pool_grow(srv_pool *p, void *ptr, size_t n);
/* As pool_realloc to n bytes, but only into an idle block (one whose pages
 * are in already): NULL, ptr untouched, when none suits n. The block stays
 * counted against the pool's limit, as if it were idle, until it is freed:
 * its holder may be charged for less of it than it holds. */
void *pool_realloc_idle(srv_pool *p, void *ptr, size_t n);
/* The bytes a block of the pool holds (>= what was asked for). */
size_t pool_block_size(void *ptr);
/* At most `limit` bytes idle from now on (the oldest beyond it unmapped). */
void pool_set_limit(srv_pool *p, size_t limit);
/* Unmaps the blocks idle for more than idle_seconds. */
void pool_reap(srv_pool *p, double idle_seconds);
pool_stats pool_get_stats(srv_pool *p);
/* The process's pool (NULL when out of memory), which libattn's workspaces
 * and the codec's tensors come from once a server has started. */
srv_pool *pool_shared(void);

/* ---------------------------------------------------------- compute.c */

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t work;
    int slots, queue_max;
    int running;             /* computing now, inline or on a worker */
    int waiting;             /* admitted, not computing yet */
    int polling;             /* idle workers polling for work, not blocked */
    atomic_uint posted;      /* requests ever queued, and the stop: what polling workers watch */
    srv_request *head, *tail;
    bool stopping;
    pthread_t *workers;
    int n_workers;
    double response_budget;  /* --max-response */
    double response_pending; /* bytes reserved by answers in flight */
    double memory_budget;    /* --max-memory */
    double memory_pending;   /* bytes reserved by requests queued or computing */
} srv_compute;

typedef enum {
    COMPUTE_DONE,       /* r->res (or r->refusal) is the answer */
    COMPUTE_QUEUED,     /* suspended; a worker resumes the connection */
    COMPUTE_OVERLOADED, /* the slots and the queue are full: 503 */
} compute_result;

bool compute_start(srv_server *srv);
/* Decides by the request's estimated work: computes it now on this thread
 * when the work is tiny and a slot is free, queues it (suspending the
 * connection) otherwise, or refuses it when `threads` compute and `queue`
 * wait. A request whose answer does not fit the response budget is refused
 * (r->refusal). */
compute_result compute_submit(srv_request *r);
/* The API's limits and resources for r: the configured limits, its arrival,
 * the KV cache store, the cache its path names and its key. */
api_limits compute_limits(const srv_request *r, int threads);
/* The request's answer is gone (sent or abandoned): its bytes return to
 * the response budget. */
void compute_release(srv_request *r);
/* Takes r out of the queue if it is still waiting there (its client has
 * gone); true when it was, and then nobody else will resume it. Called
 * with conn_limit.c's lock held (that lock is taken before this one). */
bool compute_unqueue(srv_request *r);
int compute_running(srv_server *srv);     /* computing now */
double compute_response_pending(srv_server *srv); /* bytes */
double compute_memory_pending(srv_server *srv);   /* bytes */
void compute_stop(srv_server *srv);

/* ---------------------------------------------------------- metrics.c */

/* The statuses counted by name; anything else is "other". */
#define METRICS_N_STATUS 17
/* Histogram buckets (the last counter is +Inf). */
#define METRICS_N_BUCKETS 18

typedef struct {
    atomic_ulong bucket[METRICS_N_BUCKETS + 1]; /* observations per bucket */
    atomic_ulong sum_ns;                          /* their sum */
} srv_histogram;

typedef struct {
    atomic_ulong requests[METRICS_N_STATUS + 1];
    srv_histogram duration;  /* headers in to answer out */
    atomic_long in_flight;   /* started, not yet completed */
    /* compute routes */
    atomic_long queued;      /* waiting for a compute slot */
    srv_histogram queue_wait; /* time waiting for a slot (0 when none) */
    srv_histogram compute;   /* time computing (meta.timing_ms.compute) */
} srv_route_counters;

typedef struct {
    const char *labels[ROUTES_MAX + 1]; /* 0..n-1 the route table's paths, n "other" */
    bool computes[ROUTES_MAX + 1];      /* a compute route (queue and compute series) */
    int n_labels;
    srv_route_counters counters[ROUTES_MAX + 1];
    atomic_long in_flight;   /* requests started and not yet completed */
    atomic_ulong bytes_received, bytes_sent;
    double start_time;       /* the process's start, seconds since the epoch */
} srv_metrics;

void metrics_init(srv_metrics *m, const char *const *labels, const bool *computes, int n);
void metrics_request_start(srv_metrics *m, int label);
void metrics_request_done(srv_metrics *m, int label, int status, double seconds,
                          size_t bytes_in, size_t bytes_out);
long metrics_in_flight(srv_metrics *m);
/* A request joins (+1) or leaves (-1) the compute queue of its route. */
void metrics_queued(srv_metrics *m, int label, int delta);
/* A computed request: how long it waited for a slot and computed. */
void metrics_computed(srv_metrics *m, int label, double wait_seconds,
                      double compute_seconds);
char *metrics_render(srv_server *srv, size_t *len); /* Prometheus text, malloc'd */

/* -------------------------------------------------------------- log.c */

typedef struct srv_log_buffer srv_log_buffer;

typedef struct {
    log_format format;
    /* the per-thread buffers and the flusher that writes them out */
    pthread_mutex_t lock;
    pthread_cond_t flush_wanted;
    srv_log_buffer *buffers;   /* under lock; grows at its head only */
    bool pending, urgent;      /* under lock: lines are waiting (urgently) */
    atomic_bool flusher_stop;
    bool flusher_running;
    pthread_t flusher;
    char *spare;               /* the flusher's empty buffer to swap in */
    atomic_ulong dropped;      /* lines lost to a full sink */
    unsigned long dropped_announced; /* flusher only */
} srv_log;

void log_init(srv_log *log, log_format fmt); /* also starts the flusher */
/* For an exit that does not wait for every thread: stops the flusher and
 * writes out what is logged so far before it returns (a line logged after
 * it is lost at the exit). */
void log_flush(srv_log *log);
/* After http_stop: stops the flusher and writes what is left (waiting at
 * most a second for a full sink). */
void log_shutdown(srv_log *log);
unsigned long log_dropped(srv_log *log); /* lines dropped so far */
void log_request(srv_log *log, const srv_request *r, double seconds);
void log_event(srv_log *log, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------- cors.c */

typedef struct {
    const attnd_config *cfg;
    bool enabled;            /* some origin is allowed */
    bool any_origin;         /* "*" is among them */
} srv_cors;

void cors_init(srv_cors *cors, const attnd_config *cfg);
/* The origin to echo in Access-Control-Allow-Origin, or NULL. */
const char *cors_allowed(const srv_cors *cors, const char *origin);
void cors_add_headers(struct MHD_Response *resp, const char *origin);
/* Is this OPTIONS request a CORS preflight (Origin and
 * Access-Control-Request-Method)? */
bool cors_is_preflight(const char *method, const srv_headers *h);
/* The 204 answer to a preflight: the same for every path (all the methods
 * of the route table), so that it tells a caller without a key nothing. */
void cors_preflight(srv_request *r);
/* The 204 answer to a plain OPTIONS on a known path: Allow. */
void cors_options(srv_request *r, const char *allow);

/* ------------------------------------------------------- conn_limit.c */

/* Refused connections one address may have waiting for their 503; past
 * that a connection of that address that would be refused is closed at
 * accept. */
#define REFUSED_SLACK 16
/* Seconds a refused connection has to send its request's headers. */
#define REFUSED_TIMEOUT 2
#define CONN_LIMIT_BUCKETS 1024
/* While draining: a body that has not moved for this many seconds is
 * dropped, and every body still arriving this long into the drain. */
#define DRAIN_BODY_STALL_S 0.25
#define DRAIN_BODY_GRACE_S 0.75

typedef struct srv_client srv_client; /* one client address and its count */

/* A list of connections in one state, oldest first (conn_limit.c). */
typedef struct {
    srv_connection *head, *tail;
    int count;
} conn_list;

typedef struct {
    int max_per_ip;          /* --max-conns-per-ip; 0: no limit */
    int cap;                 /* --max-connections: connections held at most */
    int pressure;            /* held connections from which the address
                              * holding the most is refused */
    double header_timeout;   /* --header-timeout, seconds */
    pthread_mutex_t lock;
    srv_client *buckets[CONN_LIMIT_BUCKETS];
    int open;                /* connections counted now, held or not */
    int held;                /* ... held: neither refused nor shed */
    int most;                /* the most one address holds now */
    int *holding;            /* holding[k]: addresses that hold k connections */
    int holding_cap;         /* ... for k < holding_cap */
    conn_list waiting, reading, computing, refused;
    double drain_began;      /* srv_now_coarse() at the first sweep that drained; 0 before */
    atomic_ulong refusals[N_REFUSE];  /* by reason (REFUSE_NONE unused) */
    atomic_ulong sheds[N_SHED];       /* by reason */
} srv_conn_limit;

/* The connections libmicrohttpd may hold beyond --max-connections: room to
 * answer refused connections and to close shed ones. */
int conn_limit_room(int max_connections);
/* False when out of memory. */
bool conn_limit_init(srv_conn_limit *cl, const attnd_config *cfg);
/* At accept: false for a connection to close at once, unanswered (one its
 * address would have refused, with REFUSED_SLACK refusals waiting). */
bool conn_limit_accept(srv_conn_limit *cl, const struct sockaddr *sa);
/* A new connection (cx->fd set): held, perhaps in the place of the idlest
 * held connection (shed), or refused (cx->refused). */
void conn_limit_open(srv_conn_limit *cl, srv_connection *cx, const struct sockaddr *sa);
void conn_limit_close(srv_conn_limit *cl, srv_connection *cx);
/* What its request does now (cx's state moves; see conn_state). */
void conn_reading(srv_connection *cx);   /* its headers are in, a body to come */
void conn_progress(srv_connection *cx);  /* more of its body arrived */
void conn_serving(srv_connection *cx);   /* no body to come, or it is answered */
void conn_computing(srv_connection *cx); /* suspended for a compute slot */
void conn_computed(srv_connection *cx);  /* back from compute, before resuming */
void conn_waiting(srv_connection *cx);   /* its request is over */
/* Sheds what is past its deadline, and while draining every connection
 * whose body is still arriving. */
void conn_limit_sweep(srv_conn_limit *cl, double now, bool draining); /* now: srv_now_coarse() */
/* Calls gone(cx, arg) under the lock for every computing connection whose
 * client has closed its side (or reset it), once. When gone returns true
 * (it took the request out of the compute queue), the connection is resumed
 * here, after the lock is released. */
void conn_limit_check_computing(srv_conn_limit *cl,
                                bool (*gone)(srv_connection *cx, void *arg), void *arg);
/* Whether the client of a suspended connection has gone. */
bool conn_client_gone(const srv_connection *cx);
int conn_limit_open_now(srv_conn_limit *cl); /* connections counted now */
int conn_limit_held_now(srv_conn_limit *cl); /* ... held */
void conn_limit_free(srv_conn_limit *cl);

/* ------------------------------------------------------- conn_watch.c */

/* A thread that, every WATCH_PERIOD_MS, enforces conn_limit.c's deadlines
 * and drops the requests whose clients have gone while they wait for, or
 * hold, a compute slot. */
typedef struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    bool running, stop;
} srv_watch;

bool watch_start(srv_server *srv);
void watch_stop(srv_server *srv);

/* ------------------------------------------------------------- auth.c */

typedef struct srv_key_set srv_key_set;

typedef struct {
    const char *path;        /* --api-key-file, "" for none */
    pthread_rwlock_t lock;   /* readers check, SIGHUP swaps the set */
    srv_key_set *keys;
} srv_auth;

typedef enum { AUTH_OK, AUTH_MISSING, AUTH_INVALID } srv_auth_result;

/* Reads the key file, when there is one; false (err) when it cannot be
 * read or holds no key. */
bool auth_init(srv_auth *a, const attnd_config *cfg, char *err, size_t err_len);
/* Reads the key file again (SIGHUP): the number of keys now in force, or -1
 * (err) when it could not be read and the old keys stay. */
int auth_reload(srv_auth *a, char *err, size_t err_len);
bool auth_required(const srv_auth *a);
/* The value of the Authorization header (or NULL) against the keys. */
srv_auth_result auth_check(srv_auth *a, const char *authorization);
/* The key of a request that auth_check accepted, into key (cap >= 1025):
 * false when no keys are required. A KV cache belongs to the key that
 * made it. */
bool auth_key_of(const srv_auth *a, const char *authorization, char *key, size_t cap);
void auth_free(srv_auth *a);

/* -------------------------------------------------------------- tls.c */

/* Reads --tls-cert and --tls-key (both or neither); false (err) when they
 * cannot be served. */
bool tls_init(srv_server *srv, char *err, size_t err_len);
bool tls_enabled(const srv_server *srv);
void tls_free(srv_server *srv); /* the key's text is wiped */

/* ---------------------------------------------------------- signals.c */

bool signals_install(void);        /* SIGTERM/SIGINT/SIGHUP handlers; SIGPIPE ignored */
int signals_wait(void);            /* the next SIGTERM, SIGINT or SIGHUP */
bool signals_poll(int timeout_ms); /* another one arrived within the timeout */

/* ------------------------------------------------------------- server */

struct srv_server {
    const attnd_config *cfg;
    struct MHD_Daemon *daemon;
    atomic_bool draining;
    srv_canned *stock[N_STOCK];
    srv_canned *stock_oip[N_STOCK]; /* the same in the /v2 error form */
    srv_routes routes;
    srv_compute compute;
    srv_metrics metrics;
    srv_cors cors;
    srv_conn_limit conn_limit;
    srv_watch watch;
    srv_log log;
    srv_auth auth;
    srv_pool *pool;            /* pool.c: the large blocks of requests, kept for the next */
    atomic_llong body_memory;  /* bytes of every connection's body buffer (--max-body-memory) */
    api_caches *caches;        /* the KV caches (api/cache_store.c) */
    char *tls_cert, *tls_key;  /* PEM text, when serving HTTPS */
    size_t tls_key_len;
};

#endif /* ATTND_SERVER_H */
