/*
 * The route table: one row per method and path. Matching, the 404/405
 * decision, the Allow header, the metrics labels and the CORS preflight all
 * follow from it, so adding a route is adding a row.
 */
#include "server.h"

#include "json/codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "page.h"

static void handle_compute(srv_request *r);
static void handle_healthz(srv_request *r);
static void handle_readyz(srv_request *r);
static void handle_metrics(srv_request *r);
static void handle_info(srv_request *r);
static void handle_openapi(srv_request *r);
static void handle_openapi_json(srv_request *r);
static void handle_cache_create(srv_request *r);
static void handle_cache_get(srv_request *r);
static void handle_cache_delete(srv_request *r);
static void handle_v2_live(srv_request *r);
static void handle_v2_ready(srv_request *r);
static void handle_v2_server(srv_request *r);
static void handle_v2_model(srv_request *r);
static void handle_v2_model_ready(srv_request *r);

static const srv_route routes[] = {
    {.method = "POST", .path = "/v1/attention", .handle = handle_compute, .has_body = true,
     .computes = true, .op = API_OP_ATTENTION},
    {.method = "POST", .path = "/v1/multihead", .handle = handle_compute, .has_body = true,
     .computes = true, .op = API_OP_MULTIHEAD},
    /* KV caches: made, read and dropped at once; attention over one is a
     * computation like the two above. {id} is one path segment. */
    {.method = "POST", .path = "/v1/caches", .handle = handle_cache_create, .has_body = true},
    {.method = "GET", .path = "/v1/caches/{id}", .handle = handle_cache_get},
    {.method = "DELETE", .path = "/v1/caches/{id}", .handle = handle_cache_delete},
    {.method = "POST", .path = "/v1/caches/{id}/attention", .handle = handle_compute,
     .has_body = true, .computes = true, .op = API_OP_CACHE_ATTENTION},
    /* For probes (a load balancer, Kubernetes): no API key needed. */
    {.method = "GET", .path = "/healthz", .handle = handle_healthz, .open = true},
    {.method = "GET", .path = "/readyz", .handle = handle_readyz, .open = true},
    {.method = "GET", .path = "/metrics", .handle = handle_metrics},
    {.method = "GET", .path = "/v1/info", .handle = handle_info},
    {.method = "GET", .path = "/openapi.yaml", .handle = handle_openapi},
    {.method = "GET", .path = "/openapi.json", .handle = handle_openapi_json},
    /* The Open Inference Protocol (KServe v2): the same operations as
     * models, and its probes (open, as /healthz and /readyz are). */
    {.method = "POST", .path = "/v2/models/attention/infer", .handle = handle_compute,
     .has_body = true, .computes = true, .op = API_OP_ATTENTION, .oip = true},
    {.method = "POST", .path = "/v2/models/multihead/infer", .handle = handle_compute,
     .has_body = true, .computes = true, .op = API_OP_MULTIHEAD, .oip = true},
    {.method = "GET", .path = "/v2/health/live", .handle = handle_v2_live, .open = true},
    {.method = "GET", .path = "/v2/health/ready", .handle = handle_v2_ready, .open = true},
    {.method = "GET", .path = "/v2", .handle = handle_v2_server},
    {.method = "GET", .path = "/v2/models/attention", .handle = handle_v2_model,
     .op = API_OP_ATTENTION},
    {.method = "GET", .path = "/v2/models/multihead", .handle = handle_v2_model,
     .op = API_OP_MULTIHEAD},
    {.method = "GET", .path = "/v2/models/attention/ready", .handle = handle_v2_model_ready,
     .op = API_OP_ATTENTION},
    {.method = "GET", .path = "/v2/models/multihead/ready", .handle = handle_v2_model_ready,
     .op = API_OP_MULTIHEAD},
    /* The page (page.c): one row per file of server/web/ it loads. */
    {.method = "GET", .path = "/", .handle = page_reply},
    {.method = "GET", .path = "/app.js", .handle = page_reply},
    {.method = "GET", .path = "/attnd.js", .handle = page_reply},
    {.method = "GET", .path = "/style.css", .handle = page_reply},
};
#define N_ROUTES (int)(sizeof routes / sizeof routes[0])
_Static_assert(N_ROUTES <= ROUTES_MAX, "raise ROUTES_MAX");

/* ------------------------------------------------------------- matching */

/* Whether `path` is the route pattern's: the same text, but that "{id}"
 * stands for one non-empty path segment. */
static bool path_matches(const char *pattern, const char *path)
{
    const char *param = strstr(pattern, "{id}");
    if (!param)
        return !strcmp(pattern, path);
    size_t head = (size_t)(param - pattern);
    if (strncmp(pattern, path, head) != 0)
        return false;
    const char *segment = path + head, *end = segment + strcspn(segment, "/");
    return end > segment && !strcmp(param + 4, end);
}

void routes_path_id(const char *pattern, const char *path, char *id, size_t cap)
{
    if (cap == 0)
        return;
    id[0] = '\0';
    const char *param = strstr(pattern, "{id}");
    if (!param)
        return;
    const char *segment = path + (param - pattern);
    /* An id longer than any attnd makes keeps its head, so that the 404
     * can still quote it; cut, it matches no real id all the same. */
    size_t n = strcspn(segment, "/");
    if (n >= cap)
        n = cap - 1;
    memcpy(id, segment, n);
    id[n] = '\0';
}

/* The first row whose pattern `path` matches (its metrics label), or -1. */
static int find_path(const srv_routes *t, const char *path)
{
    for (int i = 0; i < N_ROUTES; i++)
        if (path_matches(routes[i].path, path))
            return t->path_row[i];
    return -1;
}

const srv_route *routes_match(const srv_server *srv, const char *method, const char *path,
                              bool *path_known, int *label)
{
    int row = find_path(&srv->routes, path);
    *path_known = row >= 0;
    *label = row >= 0 ? srv->routes.label[row] : srv->routes.n_labels; /* "other" */
    if (row < 0)
        return NULL;
    bool head = !strcmp(method, "HEAD");
    for (int i = row; i < N_ROUTES; i++)
        if (path_matches(routes[i].path, path) &&
            (!strcmp(routes[i].method, method) || (head && !strcmp(routes[i].method, "GET"))))
            return &routes[i];
    return NULL;
}

const char *routes_allow(const srv_server *srv, const char *path)
{
    int row = find_path(&srv->routes, path);
    return row >= 0 ? srv->routes.allow[row] : NULL;
}

const char *routes_all_methods(const srv_server *srv)
{
    return srv->routes.all_methods;
}

const srv_canned *routes_not_allowed(const srv_server *srv, const char *path)
{
    int row = find_path(&srv->routes, path);
    return srv->routes.not_allowed[row >= 0 ? row : 0];
}

/* ------------------------------------------------------------ near misses */

/* Paths longer than this are not compared (no route is near one). */
#define NEAR_MAX_PATH 64
/* The most edits that still make a near miss. */
#define NEAR_MAX_EDITS 3

static char fold(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

/* The edits (a character inserted, deleted or replaced, or two neighbours
 * swapped: the optimal string alignment distance) that turn a into b, case
 * aside, both at most NEAR_MAX_PATH long. */
static int edits(const char *a, size_t la, const char *b, size_t lb)
{
    int rows[3][NEAR_MAX_PATH + 1]; /* row i of the table is rows[i % 3] */
    for (size_t j = 0; j <= lb; j++)
        rows[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int *prev2 = rows[(i + 1) % 3], *prev = rows[(i - 1) % 3], *cur = rows[i % 3];
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int cost = fold(a[i - 1]) != fold(b[j - 1]);
            int d = prev[j] + 1;
            if (cur[j - 1] + 1 < d)
                d = cur[j - 1] + 1;
            if (prev[j - 1] + cost < d)
                d = prev[j - 1] + cost;
            if (i > 1 && j > 1 && fold(a[i - 1]) == fold(b[j - 2]) &&
                fold(a[i - 2]) == fold(b[j - 1]) && prev2[j - 2] + 1 < d)
                d = prev2[j - 2] + 1;
            cur[j] = d;
        }
    }
    return rows[la % 3][lb];
}

/* The route path `path` is most likely a mistyping of, or NULL: within
 * NEAR_MAX_EDITS edits, and fewer than a third of the route's length (so
 * that "/x" is no miss of "/"). */
static const char *near_miss(const char *path)
{
    size_t lp = strlen(path);
    if (lp > NEAR_MAX_PATH)
        return NULL;
    const char *best = NULL;
    int best_edits = NEAR_MAX_EDITS + 1;
    for (int i = 0; i < N_ROUTES; i++) {
        const char *route = routes[i].path;
        size_t lr = strlen(route);
        size_t gap = lp > lr ? lp - lr : lr - lp;
        if (lr < 4 || lr > NEAR_MAX_PATH || gap >= (size_t)best_edits)
            continue;
        int d = edits(path, lp, route, lr);
        if (d < best_edits && 3 * (size_t)d <= lr + 2) {
            best = route;
            best_edits = d;
        }
    }
    return best;
}

bool routes_is_oip(const char *path)
{
    return !strncmp(path, "/v2", 3) && (path[3] == '\0' || path[3] == '/');
}

/* A /v2 path that is none of the routes: most likely an unknown model or
 * a model version (attnd's models have none). */
static void oip_not_found(srv_request *r)
{
    static const char models[] = "/v2/models/";
    char msg[300];
    if (!strncmp(r->path, models, sizeof models - 1)) {
        const char *name = r->path + sizeof models - 1;
        int n = (int)strcspn(name, "/");
        if (n == 9 && (!strncmp(name, "attention", 9) || !strncmp(name, "multihead", 9)) &&
            !strncmp(name + n, "/versions/", 10))
            snprintf(msg, sizeof msg, "the model %.*s has no versions: use /v2/models/%.*s "
                     "(and /ready, /infer)", n, name, n, name);
        else if (n == 9 && (!strncmp(name, "attention", 9) || !strncmp(name, "multihead", 9)))
            snprintf(msg, sizeof msg, "no such path; the model %.*s has /v2/models/%.*s, "
                     "/ready and /infer", n, name, n, name);
        else
            snprintf(msg, sizeof msg, "no model \"%.*s\": the models are attention and "
                     "multihead", n > 64 ? 64 : n, name);
    } else {
        snprintf(msg, sizeof msg, "no such path; the Open Inference Protocol routes are "
                 "/v2, /v2/health/live, /v2/health/ready and /v2/models/{attention,multihead}"
                 "[/ready, /infer]");
    }
    http_reply_error(r, 404, "not_found", msg);
}

void routes_not_found(srv_request *r)
{
    if (r->oip) {
        oip_not_found(r);
        return;
    }
    const char *near = near_miss(r->path);
    if (!near) {
        http_reply_stock(r, STOCK_NOT_FOUND);
        return;
    }
    char msg[200];
    snprintf(msg, sizeof msg,
             "no such path; did you mean %s? The API is described at GET /openapi.yaml",
             near);
    http_reply_error(r, 404, "not_found", msg);
}

/* ------------------------------------------------------------- handlers */

static void handle_compute(srv_request *r)
{
    switch (compute_submit(r)) {
    case COMPUTE_DONE:
        routes_compute_done(r);
        break;
    case COMPUTE_OVERLOADED:
        http_reply_stock(r, STOCK_OVERLOADED);
        break;
    case COMPUTE_QUEUED:
        break; /* a worker resumes the connection; on_request calls back */
    }
}

static unsigned long long to_us(double ms)
{
    return ms > 0 ? (unsigned long long)(ms * 1e3 + 0.5) : 0;
}

/* v in decimal at p (at most 20 digits); returns the end. */
static char *put_decimal(char *p, unsigned long long v)
{
    char digits[24];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = digits[--n];
    return p;
}

/* "name;dur=M.UUU" for us microseconds, at p; returns the end. Written by
 * hand, as the other numbers of an answer's headers: one snprintf of the
 * four entries cost more than the rest of a tiny request's transport (~5k
 * instructions). */
static char *put_timing(char *p, const char *name, unsigned long long us)
{
    while (*name)
        *p++ = *name++;
    memcpy(p, ";dur=", 5);
    p += 5;
    p = put_decimal(p, us / 1000);
    *p++ = '.';
    *p++ = (char)('0' + us / 100 % 10);
    *p++ = (char)('0' + us / 10 % 10);
    *p++ = (char)('0' + us % 10);
    return p;
}

void routes_compute_done(srv_request *r)
{
    api_response *res = &r->res;
    if (r->refusal >= 0) {
        http_reply_stock(r, (stock_error)r->refusal);
        return;
    }
    if (!res->body) {
        http_reply_stock(r, STOCK_OUT_OF_MEMORY);
        return;
    }
    if (res->status != 200)
        r->error_code = res->error_code; /* lives until the request ends */
    /* Microseconds as integers: float formatting would cost more than the
     * rest of a tiny request's transport. The total is the body's
     * meta.timing_ms.total, from the request's headers to its answer
     * written. */
    static const char *const names[4] = {"decode", "compute", "encode", "total"};
    unsigned long long us[4] = {to_us(res->decode_ms), to_us(res->compute_ms),
                                to_us(res->encode_ms), to_us(res->total_ms)};
    char timing[200]; /* at most 4 x (7 + 5 + 20 + 4) + 3 x 2 + 1 */
    char *p = timing;
    for (int i = 0; i < 4; i++) {
        if (i) {
            *p++ = ',';
            *p++ = ' ';
        }
        p = put_timing(p, names[i], us[i]);
    }
    *p = '\0';
    char retry[24], header_len[24];
    if (res->retry_after > 0)
        *put_decimal(retry, (unsigned long long)res->retry_after) = '\0';
    /* A /v2 answer with binary outputs: where its JSON ends. */
    if (res->header_len)
        *put_decimal(header_len, res->header_len) = '\0';
    const char *extra[9] = {"Server-Timing", timing};
    int n_extra = 2;
    if (res->location[0]) {
        extra[n_extra++] = "Location";
        extra[n_extra++] = res->location;
    }
    if (res->retry_after > 0) {
        extra[n_extra++] = "Retry-After";
        extra[n_extra++] = retry;
    }
    if (res->header_len) {
        extra[n_extra++] = "Inference-Header-Content-Length";
        extra[n_extra++] = header_len;
    }
    extra[n_extra] = NULL;
    if (res->n_blocks) {
        http_reply_blocks(r, res->status, "application/octet-stream", res, extra);
        return;
    }
    char *body = res->body;
    res->body = NULL; /* MHD frees it once sent (an answer's: back to the pool) */
    http_reply_released(r, res->status,
                        res->header_len ? "application/octet-stream" : "application/json", body,
                        res->body_len, extra, res->body_elements ? api_body_free : NULL);
}

/* An answer of the API computed on this thread: a cache's life cycle. */
static void reply_api(srv_request *r)
{
    if (r->res.status == 204) { /* DELETE: no body */
        http_reply_owned(r, 204, "application/json", strdup(""), 0, NULL);
        return;
    }
    routes_compute_done(r);
}

/* The id a load balancer chose for the new cache (docker/nginx.conf), or
 * none. */
#define CACHE_ID_HEADER "X-Cache-Id"

static void handle_cache_create(srv_request *r)
{
    api_limits lim = compute_limits(r, 1);
    lim.cache_id = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, CACHE_ID_HEADER);
    api_cache_create(body_of(r), r->body_len, &lim, &r->res);
    reply_api(r);
}

static void handle_cache_get(srv_request *r)
{
    api_limits lim = compute_limits(r, 1);
    api_cache_get(&lim, &r->res);
    reply_api(r);
}

static void handle_cache_delete(srv_request *r)
{
    api_limits lim = compute_limits(r, 1);
    api_cache_delete(&lim, &r->res);
    reply_api(r);
}

static void handle_healthz(srv_request *r)
{
    http_reply_canned(r, r->srv->routes.healthz);
}

static void handle_readyz(srv_request *r)
{
    if (http_draining(r->srv))
        http_reply_stock(r, STOCK_SHUTTING_DOWN);
    else
        http_reply_canned(r, r->srv->routes.ready);
}

static void handle_metrics(srv_request *r)
{
    size_t len = 0;
    char *text = metrics_render(r->srv, &len);
    http_reply_owned(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, NULL);
}

static void handle_info(srv_request *r)
{
    http_reply_canned(r, r->srv->routes.info);
}

static void handle_openapi(srv_request *r)
{
    http_reply_canned(r, r->srv->routes.openapi);
}

static void handle_openapi_json(srv_request *r)
{
    http_reply_canned(r, r->srv->routes.openapi_json);
}

/* The Open Inference Protocol's probes and metadata: built at start. A
 * draining server is not ready, as /readyz says. */
static void handle_v2_live(srv_request *r)
{
    http_reply_canned(r, r->srv->routes.v2_live);
}

static void handle_v2_ready(srv_request *r)
{
    if (http_draining(r->srv))
        http_reply_stock(r, STOCK_SHUTTING_DOWN);
    else
        http_reply_canned(r, r->srv->routes.v2_ready);
}

static void handle_v2_server(srv_request *r)
{
    http_reply_canned(r, r->srv->routes.v2_server);
}

static void handle_v2_model(srv_request *r)
{
    http_reply_canned(r, r->srv->routes.v2_model[r->route->op == API_OP_MULTIHEAD]);
}

static void handle_v2_model_ready(srv_request *r)
{
    if (http_draining(r->srv))
        http_reply_stock(r, STOCK_SHUTTING_DOWN);
    else
        http_reply_canned(r, r->srv->routes.v2_model_ready[r->route->op == API_OP_MULTIHEAD]);
}

/* ------------------------------------------------------------- building */

static char *build_info(const srv_server *srv, size_t *len)
{
    const attnd_config *cfg = srv->cfg;
    api_info ai;
    api_get_info(&ai);
    codec_buf t = {0};
    codec_buf_printf(&t, "{\"version\": \"%s\", \"libattn\": ", ATTND_VERSION);
    codec_buf_string(&t, ai.libattn);
    codec_buf_printf(&t, ", \"kernel\": ");
    codec_buf_string(&t, ai.kernel);
    /* how "precision": "bfloat16" runs its products: the same bits either way */
    codec_buf_printf(&t, ", \"bf16\": ");
    codec_buf_string(&t, ai.bf16);
    /* libattn keeps OpenBLAS single-threaded (attn.h) and parallelises over
     * batch, heads and tiles itself, so BLAS runs on one thread per call. */
    codec_buf_printf(&t, ", \"blas\": {\"config\": ");
    codec_buf_string(&t, ai.blas_config);
    codec_buf_printf(&t, ", \"corename\": ");
    codec_buf_string(&t, ai.blas_corename);
    codec_buf_printf(&t, ", \"threads\": 1}, \"threads\": %d, ", cfg->threads);
    /* whether they are on, never what they are */
    codec_buf_printf(&t, "\"security\": {\"api_key_required\": %s, \"tls\": %s}, ",
                     auth_required(&srv->auth) ? "true" : "false", tls_enabled(srv) ? "true" : "false");
    codec_buf_printf(&t, "\"cors_origins\": [");
    for (int i = 0; i < cfg->n_origins; i++) {
        if (i)
            codec_buf_printf(&t, ", ");
        codec_buf_string(&t, cfg->origins[i]);
    }
    codec_buf_puts(&t, "], \"limits\": ");
    config_limits_json(cfg, &t);
    codec_buf_puts(&t, "}\n");
    if (t.failed) {
        free(t.data);
        return NULL;
    }
    *len = t.len;
    return t.data;
}

static bool v2_init(srv_server *srv)
{
    srv_routes *t = &srv->routes;
    static const char live[] = "{\"live\":true}";
    static const char ready[] = "{\"ready\":true}";
    static const char server[] = "{\"name\":\"attnd\",\"version\":\"" ATTND_VERSION
                                 "\",\"extensions\":[\"binary_tensor_data\"]}";
    static const char *const ready_model[2] = {"{\"name\":\"attention\",\"ready\":true}",
                                               "{\"name\":\"multihead\",\"ready\":true}"};
    t->v2_live = canned_new(srv, 200, "application/json", live, sizeof live - 1, NULL, NULL);
    t->v2_ready = canned_new(srv, 200, "application/json", ready, sizeof ready - 1, NULL, NULL);
    t->v2_server = canned_new(srv, 200, "application/json", server, sizeof server - 1, NULL,
                              NULL);
    bool ok = t->v2_live && t->v2_ready && t->v2_server;
    for (int m = 0; m < 2; m++) {
        size_t len = 0;
        t->v2_model_body[m] = api_oip_model_metadata(m ? API_OP_MULTIHEAD : API_OP_ATTENTION,
                                                     &len);
        t->v2_model[m] = t->v2_model_body[m] ? canned_new(srv, 200, "application/json",
                                                          t->v2_model_body[m], len, NULL, NULL)
                                             : NULL;
        t->v2_model_ready[m] = canned_new(srv, 200, "application/json", ready_model[m],
                                          strlen(ready_model[m]), NULL, NULL);
        ok = ok && t->v2_model[m] && t->v2_model_ready[m];
    }
    return ok;
}

bool routes_init(srv_server *srv)
{
    srv_routes *t = &srv->routes;
    const char *labels[N_ROUTES];
    bool computes[N_ROUTES];
    int n_labels = 0;
    /* One label per path: the methods of a path share its series. */
    for (int i = 0; i < N_ROUTES; i++) {
        t->path_row[i] = i;
        for (int j = 0; j < i; j++)
            if (!strcmp(routes[j].path, routes[i].path)) {
                t->path_row[i] = t->path_row[j];
                break;
            }
        if (t->path_row[i] == i) {
            t->label[i] = n_labels;
            computes[n_labels] = routes[i].computes;
            labels[n_labels++] = routes[i].path;
        } else {
            computes[t->label[t->path_row[i]]] |= routes[i].computes;
        }
    }
    t->n_labels = n_labels;
    metrics_init(&srv->metrics, labels, computes, n_labels);

    for (int i = 0; i < N_ROUTES; i++) {
        if (t->path_row[i] != i)
            continue;
        char *a = t->allow[i];
        size_t cap = sizeof t->allow[i];
        a[0] = '\0';
        for (int j = i; j < N_ROUTES; j++) {
            if (strcmp(routes[j].path, routes[i].path))
                continue;
            snprintf(a + strlen(a), cap - strlen(a), "%s, ", routes[j].method);
            if (!strcmp(routes[j].method, "GET"))
                snprintf(a + strlen(a), cap - strlen(a), "HEAD, ");
        }
        snprintf(a + strlen(a), cap - strlen(a), "OPTIONS");
        char msg[160];
        snprintf(msg, sizeof msg, "%s accepts only %s", routes[i].path, a);
        t->not_allowed[i] = (routes_is_oip(routes[i].path) ? canned_error_oip : canned_error)(
            srv, 405, "method_not_allowed", msg, MHD_HTTP_HEADER_ALLOW, a);
        if (!t->not_allowed[i])
            return false;
    }

    /* Every method of the table, each once, in the table's order. */
    char *all = t->all_methods;
    all[0] = '\0';
    for (int i = 0; i < N_ROUTES; i++) {
        const char *m[2] = {routes[i].method, !strcmp(routes[i].method, "GET") ? "HEAD" : NULL};
        for (int k = 0; k < 2 && m[k]; k++) {
            size_t n = strlen(m[k]);
            bool listed = false;
            for (const char *p = strstr(all, m[k]); p && !listed; p = strstr(p + 1, m[k]))
                listed = (p == all || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0');
            if (!listed)
                snprintf(all + strlen(all), sizeof t->all_methods - strlen(all), "%s, ", m[k]);
        }
    }
    snprintf(all + strlen(all), sizeof t->all_methods - strlen(all), "OPTIONS");

    static const char ok[] = "{\"status\": \"ok\"}\n";
    static const char ready_text[] = "{\"status\": \"ready\"}\n";
    t->healthz = canned_new(srv, 200, "application/json", ok, sizeof ok - 1, NULL, NULL);
    t->ready = canned_new(srv, 200, "application/json", ready_text, sizeof ready_text - 1,
                          NULL, NULL);
    t->openapi = canned_new(srv, 200, "application/yaml", api_openapi_yaml,
                            api_openapi_yaml_len, NULL, NULL);
    t->openapi_json = canned_new(srv, 200, "application/json", api_openapi_json,
                                 api_openapi_json_len, NULL, NULL);
    size_t info_len = 0;
    t->info_body = build_info(srv, &info_len);
    t->info = t->info_body ? canned_new(srv, 200, "application/json", t->info_body, info_len,
                                        NULL, NULL)
                           : NULL;
    return t->healthz && t->ready && t->openapi && t->openapi_json && t->info &&
           v2_init(srv) && page_init(srv);
}

void routes_free(srv_server *srv)
{
    srv_routes *t = &srv->routes;
    for (int i = 0; i < N_ROUTES; i++) {
        canned_free(t->not_allowed[i]);
        t->not_allowed[i] = NULL;
    }
    canned_free(t->healthz);
    canned_free(t->ready);
    canned_free(t->openapi);
    canned_free(t->openapi_json);
    canned_free(t->info);
    page_free(srv);
    canned_free(t->v2_live);
    canned_free(t->v2_ready);
    canned_free(t->v2_server);
    t->v2_live = t->v2_ready = t->v2_server = NULL;
    for (int m = 0; m < 2; m++) {
        canned_free(t->v2_model[m]);
        canned_free(t->v2_model_ready[m]);
        free(t->v2_model_body[m]);
        t->v2_model[m] = t->v2_model_ready[m] = NULL;
        t->v2_model_body[m] = NULL;
    }
    free(t->info_body);
    t->healthz = t->ready = t->openapi = t->openapi_json = t->info = NULL;
    t->info_body = NULL;
}
