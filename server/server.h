/*
 * The server layer's shared vocabulary: one request record that travels from
 * the transport (http.c) through the route table (routes.c) and the compute
 * queue (compute.c) to the access log (log.c) and the counters (metrics.c).
 */
#ifndef ATTND_SERVER_H
#define ATTND_SERVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

#include "api.h"
#include "config.h"

/* ------------------------------------------------------------- requests */

typedef struct srv_request srv_request;
typedef struct srv_route srv_route;

/* A route's handler queues exactly one response (http_reply*), or hands the
 * request to the compute queue, which answers later. */
typedef void (*srv_handler)(srv_request *r);

struct srv_route {
    const char *method; /* HEAD is served by GET routes */
    const char *path;
    srv_handler handle;
    bool has_body;      /* POST: the body is read before the handler runs */
    api_op op;          /* for the compute routes */
};

/* One per connection, reused by each request on it (keep-alive), so that a
 * request costs no allocation of its own. */
struct srv_request {
    struct MHD_Connection *conn;
    const srv_route *route;  /* NULL when no route matched */
    int label;               /* metrics route label (metrics_label) */
    const char *method, *path; /* MHD's strings, valid until completion */
    const char *origin;      /* the Origin to echo back, or NULL */
    double t_start;          /* monotonic seconds at the first callback */
    char remote[46];         /* client address for the log (INET6_ADDRSTRLEN),
                              * formatted once per connection */
    bool in_flight;          /* between the first callback and completion */

    char *body;              /* accumulated request body */
    size_t body_len, body_cap;
    size_t bytes_in;         /* body bytes received, kept or not */
    bool too_large;
    bool out_of_memory;      /* the body could not be stored */

    bool responded;          /* a response has been queued */
    int status;
    size_t bytes_out;

    /* compute routes */
    atomic_bool computed;    /* set by a worker before it resumes the connection */
    bool queued_at_all;      /* went through the queue (suspended) */
    api_response res;
    srv_request *next;       /* compute queue link */
};

double srv_now(void); /* monotonic seconds */

/* ------------------------------------------------------------ http.c */

/* Starts the daemon on cfg's address with every part initialised. */
bool http_start(const attnd_config *cfg, char *err, size_t err_len);
int http_port(void);          /* the port actually bound */
void http_quiesce(void);      /* stop accepting; /readyz and new computes -> 503 */
bool http_draining(void);
long http_in_flight(void);    /* requests started and not yet completed */
void http_stop(void);         /* after the drain: close everything */

/* A response built once and served many times (freed by canned_free). */
typedef struct srv_canned srv_canned;
srv_canned *canned_new(int status, const char *content_type, const char *body,
                       size_t len, const char *hname, const char *hvalue);
/* An api_error_json body; hname/hvalue: one extra header or NULL. */
srv_canned *canned_error(int status, const char *code, const char *message,
                         const char *hname, const char *hvalue);
void canned_free(srv_canned *c);

/* The transport's own errors, built at start. */
typedef enum {
    STOCK_NOT_FOUND,          /* 404 */
    STOCK_BODY_TOO_LARGE,     /* 413 */
    STOCK_UNSUPPORTED_MEDIA,  /* 415 */
    STOCK_OUT_OF_MEMORY,      /* 500 */
    STOCK_OVERLOADED,         /* 503 + Retry-After */
    STOCK_SHUTTING_DOWN,      /* 503 + Retry-After */
    N_STOCK
} stock_error;

void http_reply_canned(srv_request *r, const srv_canned *c);
void http_reply_stock(srv_request *r, stock_error e);
/* Takes ownership of body (malloc'd). extra: NULL-terminated name/value pairs. */
void http_reply_owned(srv_request *r, int status, const char *content_type,
                      char *body, size_t len, const char *const *extra);
/* An API error body for the request (400 etc.); falls back to a canned 500. */
void http_reply_error(srv_request *r, const api_error *e);
void http_resume(srv_request *r); /* from a compute worker */

/* ----------------------------------------------------------- routes.c */

bool routes_init(const attnd_config *cfg);
void routes_free(void);
/* Finds the route for (method, path). NULL with *path_known true: 405 (the
 * path exists with other methods); NULL otherwise: 404. */
const srv_route *routes_match(const char *method, const char *path,
                              bool *path_known, int *label);
const char *routes_allow(const char *path); /* "GET, HEAD, OPTIONS" or NULL */
const srv_canned *routes_not_allowed(const char *path); /* the 405 for path */
void routes_compute_done(srv_request *r); /* answer a finished compute */

/* ---------------------------------------------------------- compute.c */

typedef enum { COMPUTE_DONE, COMPUTE_QUEUED, COMPUTE_OVERLOADED } compute_result;

bool compute_start(const attnd_config *cfg);
/* Computes r (r->route->op on r->body) now, or queues it and suspends the
 * connection, or refuses when `threads` compute and `queue` wait. */
compute_result compute_submit(srv_request *r);
int compute_queue_depth(void); /* waiting for a slot */
int compute_running(void);     /* computing now */
void compute_stop(void);

/* ---------------------------------------------------------- metrics.c */

#define METRICS_MAX_ROUTES 16
/* Route labels: 0..n-1 are the route table's paths, n is "other". */
void metrics_init(const char *const *labels, int n);
void metrics_request_done(int label, int status, double seconds, size_t bytes_in,
                          size_t bytes_out);
void metrics_in_flight(int delta);
char *metrics_render(size_t *len); /* Prometheus text, malloc'd */

/* -------------------------------------------------------------- log.c */

void log_init(log_format fmt);   /* also starts the access log's flusher */
void log_flush(void);            /* writes out buffered access-log lines */
void log_shutdown(void);         /* after http_stop: flush, stop the flusher */
void log_request(const srv_request *r, double seconds, const char *remote);
void log_event(const char *level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Writes s as the inside of a JSON string into buf; returns bytes needed. */
size_t json_escape(char *buf, size_t cap, const char *s);

/* ------------------------------------------------------------- cors.c */

void cors_init(const attnd_config *cfg);
bool cors_enabled(void);
/* The origin to echo in Access-Control-Allow-Origin, or NULL. */
const char *cors_allowed(const char *origin);
void cors_add_headers(struct MHD_Response *resp, const char *origin);
/* 204 answer to an OPTIONS request for a known path. */
void cors_preflight(srv_request *r, const char *allow);

/* ---------------------------------------------------------- signals.c */

bool signals_install(void);        /* SIGTERM/SIGINT handlers; SIGPIPE ignored */
int signals_wait(void);            /* the first SIGTERM/SIGINT */
bool signals_poll(int timeout_ms); /* another one arrived within the timeout */

#endif /* ATTND_SERVER_H */
