/*
 * The page at GET / (server/web/), embedded at build time: the table that
 * tools/embed-web.sh generates, and the handler routes.c points at.
 */
#ifndef ATTND_PAGE_H
#define ATTND_PAGE_H

#include <stddef.h>

#include "server.h"

typedef struct {
    const char *path; /* "/index.html", "/app.js", ... */
    const char *body;
    size_t len;
} page_asset;

extern const page_asset page_assets[];
extern const int page_n_assets;

bool page_init(srv_server *srv);
void page_free(srv_server *srv);
/* Answers GET / (index.html) and GET /<file> of server/web/. */
void page_reply(srv_request *r);

#endif /* ATTND_PAGE_H */
