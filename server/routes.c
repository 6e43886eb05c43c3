/*
 * The route table: one row per method and path. Matching, the 404/405
 * decision, the Allow header, the metrics labels and the CORS preflight all
 * follow from it, so adding a route is adding a row.
 */
#include "server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"

static void handle_compute(srv_request *r);
static void handle_healthz(srv_request *r);
static void handle_readyz(srv_request *r);
static void handle_metrics(srv_request *r);
static void handle_info(srv_request *r);
static void handle_openapi(srv_request *r);

static const srv_route routes[] = {
    {"POST", "/v1/attention", handle_compute, true, API_OP_ATTENTION},
    {"POST", "/v1/multihead", handle_compute, true, API_OP_MULTIHEAD},
    {"GET", "/healthz", handle_healthz, false, 0},
    {"GET", "/readyz", handle_readyz, false, 0},
    {"GET", "/metrics", handle_metrics, false, 0},
    {"GET", "/v1/info", handle_info, false, 0},
    {"GET", "/openapi.yaml", handle_openapi, false, 0},
};
#define N_ROUTES (int)(sizeof routes / sizeof routes[0])

/* Per route: the first row with its path (its metrics label), the Allow
 * value of the path, and the 405 answer naming it. */
static int path_row[N_ROUTES];
static char allow[N_ROUTES][64];
static srv_canned *not_allowed[N_ROUTES];

static srv_canned *healthz, *ready, *openapi, *info;
static char *info_body;

/* ------------------------------------------------------------- matching */

static int find_path(const char *path)
{
    for (int i = 0; i < N_ROUTES; i++)
        if (!strcmp(routes[i].path, path))
            return path_row[i];
    return -1;
}

const srv_route *routes_match(const char *method, const char *path, bool *path_known,
                              int *label)
{
    int row = find_path(path);
    *path_known = row >= 0;
    *label = row >= 0 ? row : N_ROUTES; /* N_ROUTES is "other" */
    if (row < 0)
        return NULL;
    bool head = !strcmp(method, "HEAD");
    for (int i = row; i < N_ROUTES; i++)
        if (!strcmp(routes[i].path, path) &&
            (!strcmp(routes[i].method, method) || (head && !strcmp(routes[i].method, "GET"))))
            return &routes[i];
    return NULL;
}

const char *routes_allow(const char *path)
{
    int row = find_path(path);
    return row >= 0 ? allow[row] : NULL;
}

const srv_canned *routes_not_allowed(const char *path)
{
    int row = find_path(path);
    return not_allowed[row >= 0 ? row : 0];
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

/* "name;dur=M.UUU" for us microseconds, at p; returns the end. Written by
 * hand: one snprintf of the four entries cost more than the rest of a tiny
 * request's transport (~5k instructions). */
static char *put_timing(char *p, const char *name, unsigned long long us)
{
    while (*name)
        *p++ = *name++;
    memcpy(p, ";dur=", 5);
    p += 5;
    char digits[24];
    int n = 0;
    unsigned long long ms = us / 1000;
    do {
        digits[n++] = (char)('0' + ms % 10);
        ms /= 10;
    } while (ms);
    while (n)
        *p++ = digits[--n];
    *p++ = '.';
    *p++ = (char)('0' + us / 100 % 10);
    *p++ = (char)('0' + us / 10 % 10);
    *p++ = (char)('0' + us % 10);
    return p;
}

void routes_compute_done(srv_request *r)
{
    api_response *res = &r->res;
    if (!res->body) {
        http_reply_stock(r, STOCK_OUT_OF_MEMORY);
        return;
    }
    /* Microseconds as integers: float formatting would cost more than the
     * rest of a tiny request's transport. */
    static const char *const names[4] = {"decode", "compute", "encode", "total"};
    unsigned long long us[4] = {to_us(res->decode_ms), to_us(res->compute_ms),
                                to_us(res->encode_ms), to_us((srv_now() - r->t_start) * 1e3)};
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
    const char *extra[] = {"Server-Timing", timing, NULL};
    char *body = res->body;
    res->body = NULL; /* MHD frees it once sent */
    http_reply_owned(r, res->status, "application/json", body, res->body_len, extra);
}

static void handle_healthz(srv_request *r)
{
    http_reply_canned(r, healthz);
}

static void handle_readyz(srv_request *r)
{
    if (http_draining())
        http_reply_stock(r, STOCK_SHUTTING_DOWN);
    else
        http_reply_canned(r, ready);
}

static void handle_metrics(srv_request *r)
{
    size_t len = 0;
    char *text = metrics_render(&len);
    http_reply_owned(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, NULL);
}

static void handle_info(srv_request *r)
{
    http_reply_canned(r, info);
}

static void handle_openapi(srv_request *r)
{
    http_reply_canned(r, openapi);
}

/* ------------------------------------------------------------- building */

static char *build_info(const attnd_config *cfg, size_t *len)
{
    char config[1024], corename[128], version[64], limits[512];
    json_escape(config, sizeof config, attn_blas_config());
    json_escape(corename, sizeof corename, attn_blas_corename());
    json_escape(version, sizeof version, attn_version());
    config_limits_json(cfg, limits, sizeof limits);
    size_t cap = 2048 + sizeof config;
    char *body = malloc(cap);
    if (!body)
        return NULL;
    /* libattn keeps OpenBLAS single-threaded (attn.h) and parallelises over
     * batch, heads and tiles itself, so BLAS runs on one thread per call. */
    int n = snprintf(body, cap,
                     "{\"version\": \"%s\", \"libattn\": \"%s\", "
                     "\"blas\": {\"config\": \"%s\", \"corename\": \"%s\", \"threads\": 1}, "
                     "\"threads\": %d, \"limits\": %s}\n",
                     ATTND_VERSION, version, config, corename, cfg->threads, limits);
    *len = (size_t)n < cap ? (size_t)n : cap - 1;
    return body;
}

bool routes_init(const attnd_config *cfg)
{
    const char *labels[N_ROUTES];
    int n_labels = 0;
    for (int i = 0; i < N_ROUTES; i++) {
        path_row[i] = i;
        for (int j = 0; j < i; j++)
            if (!strcmp(routes[j].path, routes[i].path)) {
                path_row[i] = path_row[j];
                break;
            }
        labels[n_labels++] = routes[i].path;
    }
    metrics_init(labels, n_labels);

    for (int i = 0; i < N_ROUTES; i++) {
        if (path_row[i] != i)
            continue;
        char *a = allow[i];
        a[0] = '\0';
        for (int j = i; j < N_ROUTES; j++) {
            if (strcmp(routes[j].path, routes[i].path))
                continue;
            snprintf(a + strlen(a), sizeof allow[i] - strlen(a), "%s, ", routes[j].method);
            if (!strcmp(routes[j].method, "GET"))
                snprintf(a + strlen(a), sizeof allow[i] - strlen(a), "HEAD, ");
        }
        snprintf(a + strlen(a), sizeof allow[i] - strlen(a), "OPTIONS");
        char msg[160];
        snprintf(msg, sizeof msg, "%s accepts only %s", routes[i].path, a);
        not_allowed[i] = canned_error(405, "method_not_allowed", msg,
                                      MHD_HTTP_HEADER_ALLOW, a);
        if (!not_allowed[i])
            return false;
    }

    static const char ok[] = "{\"status\": \"ok\"}\n";
    static const char ready_text[] = "{\"status\": \"ready\"}\n";
    healthz = canned_new(200, "application/json", ok, sizeof ok - 1, NULL, NULL);
    ready = canned_new(200, "application/json", ready_text, sizeof ready_text - 1, NULL, NULL);
    openapi = canned_new(200, "application/yaml", api_openapi_yaml, api_openapi_yaml_len,
                         NULL, NULL);
    size_t info_len = 0;
    info_body = build_info(cfg, &info_len);
    info = info_body ? canned_new(200, "application/json", info_body, info_len, NULL, NULL)
                     : NULL;
    return healthz && ready && openapi && info;
}

void routes_free(void)
{
    for (int i = 0; i < N_ROUTES; i++) {
        canned_free(not_allowed[i]);
        not_allowed[i] = NULL;
    }
    canned_free(healthz);
    canned_free(ready);
    canned_free(openapi);
    canned_free(info);
    free(info_body);
    healthz = ready = openapi = info = NULL;
    info_body = NULL;
}
