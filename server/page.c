/*
 * GET / and the files it loads, built once into canned responses.
 *
 * The page carries a Content-Security-Policy: it loads nothing but its own
 * script and style files (no inline code, no other host), so text a user
 * pastes into it can never run as script. connect-src stays open to http(s)
 * because ?api=URL may point the page at another attnd.
 */
#include "page.h"

#include <string.h>

static const char csp[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self' http: https:; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'";

static const char *content_type(const char *path)
{
    const char *dot = strrchr(path, '.');
    if (dot && !strcmp(dot, ".html"))
        return "text/html; charset=utf-8";
    if (dot && !strcmp(dot, ".js"))
        return "text/javascript; charset=utf-8";
    if (dot && !strcmp(dot, ".css"))
        return "text/css; charset=utf-8";
    return "application/octet-stream";
}

bool page_init(srv_server *srv)
{
    srv_canned **canned = srv->routes.page;
    if (page_n_assets > ROUTES_MAX)
        return false;
    for (int i = 0; i < page_n_assets; i++) {
        const page_asset *a = &page_assets[i];
        const char *type = content_type(a->path);
        bool html = !strncmp(type, "text/html", 9);
        /* Scripts and styles are never sniffed into something else. */
        canned[i] = canned_new(srv, 200, type, a->body, a->len,
                               html ? "Content-Security-Policy" : "X-Content-Type-Options",
                               html ? csp : "nosniff");
        if (!canned[i])
            return false;
    }
    return true;
}

void page_free(srv_server *srv)
{
    for (int i = 0; i < ROUTES_MAX; i++) {
        canned_free(srv->routes.page[i]);
        srv->routes.page[i] = NULL;
    }
}

void page_reply(srv_request *r)
{
    const char *path = strcmp(r->path, "/") ? r->path : "/index.html";
    for (int i = 0; i < page_n_assets; i++)
        if (!strcmp(page_assets[i].path, path)) {
            http_reply_canned(r, r->srv->routes.page[i]);
            return;
        }
    http_reply_stock(r, STOCK_NOT_FOUND); /* a route row with no file behind it */
}
