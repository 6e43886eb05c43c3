/*
 * Cross-origin requests (the Fetch standard's CORS protocol): an allowed
 * Origin is echoed back with Vary: Origin, so that a cache never serves one
 * origin's answer to another. A preflight (OPTIONS with Origin and
 * Access-Control-Request-Method) carries no credentials, so it is answered
 * without an API key, and alike for every path, known or not: 204 with
 * every method of the route table and the headers the browser asked for.
 * The request it precedes gets the real answer (404, 405, 401). So a caller
 * without a key learns nothing from a preflight, not even which paths
 * exist. Any other OPTIONS is an ordinary request: it needs the key, and on
 * a known path gets 204 with that path's Allow.
 */
#include "server.h"

#include <stdlib.h>
#include <string.h>

void cors_init(srv_cors *cors, const attnd_config *cfg)
{
    cors->cfg = cfg;
    cors->enabled = cfg->n_origins > 0;
    cors->any_origin = false;
    for (int i = 0; i < cfg->n_origins; i++)
        if (!strcmp(cfg->origins[i], "*"))
            cors->any_origin = true;
}

const char *cors_allowed(const srv_cors *cors, const char *origin)
{
    if (!origin || !cors->enabled)
        return NULL;
    if (cors->any_origin)
        return origin;
    for (int i = 0; i < cors->cfg->n_origins; i++)
        if (!strcasecmp(cors->cfg->origins[i], origin))
            return origin;
    return NULL;
}

void cors_add_headers(struct MHD_Response *resp, const char *origin)
{
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
    /* Lets a page read the timings, the retry hint, the request's id,
     * where the JSON of a binary /v2 answer ends and where a new KV cache
     * lives (Location), and see Server-Timing in its own performance
     * entries. */
    MHD_add_response_header(resp, "Access-Control-Expose-Headers",
                            "Server-Timing, Retry-After, X-Request-ID, "
                            "Inference-Header-Content-Length, Location");
    MHD_add_response_header(resp, "Timing-Allow-Origin", origin);
}

static bool header_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_' || c == ',' || c == ' ';
}

/* The headers a preflight asks for are echoed when they are plain header
 * names (Authorization among them, for --api-key-file); anything odd falls
 * back to the two headers a JSON client needs. */
static const char *allowed_headers(const char *requested)
{
    if (!requested || !*requested || strlen(requested) > 512)
        return "Content-Type, Authorization";
    for (const char *p = requested; *p; p++)
        if (!header_name_char(*p))
            return "Content-Type, Authorization";
    return requested;
}

bool cors_is_preflight(const char *method, const srv_headers *h)
{
    return !strcmp(method, MHD_HTTP_METHOD_OPTIONS) && h->origin && h->preflight_method;
}

/* 204 with `allow` as Allow (a plain OPTIONS) or, for a preflight, as the
 * methods an allowed origin may use. */
static void reply_204(srv_request *r, const char *allow, bool preflight)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        http_reply_owned(r, 500, "application/json", NULL, 0, NULL);
        return;
    }
    if (!preflight)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    MHD_add_response_header(resp, "X-Request-ID", r->id);
    if (preflight && r->origin) {
        const char *requested = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND,
                                                            "Access-Control-Request-Headers");
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->origin);
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", allow);
        MHD_add_response_header(resp, "Access-Control-Allow-Headers", allowed_headers(requested));
        MHD_add_response_header(resp, "Access-Control-Max-Age", "7200");
    } else if (r->origin) {
        cors_add_headers(resp, r->origin);
    }
    if (r->srv->cors.enabled)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, "Origin");
    if (http_draining(r->srv))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    r->responded = true;
    r->status = 204;
    r->bytes_out = 0;
    MHD_queue_response(r->conn, 204, resp);
    MHD_destroy_response(resp);
}

void cors_preflight(srv_request *r)
{
    reply_204(r, routes_all_methods(r->srv), true);
}

void cors_options(srv_request *r, const char *allow)
{
    reply_204(r, allow, false);
}
