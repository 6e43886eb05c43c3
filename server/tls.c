/*
 * HTTPS (--tls-cert, --tls-key): libmicrohttpd's GnuTLS support, given the
 * certificate (chain) and its private key as PEM text read here at start.
 * A client that speaks plain HTTP to the TLS port fails the handshake and
 * its connection is closed; nothing else is disturbed.
 */
#include "server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A PEM file larger than this is not a certificate chain or a key. */
#define MAX_PEM (1u << 20)

/* The whole file as a NUL-terminated string, or NULL (err). */
static char *read_pem(const char *what, const char *path, size_t *len, char *err,
                      size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "cannot read the %s %s: %s", what, path, strerror(errno));
        return NULL;
    }
    char *text = malloc(MAX_PEM + 1);
    size_t n = text ? fread(text, 1, MAX_PEM + 1, f) : 0;
    bool failed = ferror(f);
    fclose(f);
    if (!text || failed || n == 0 || n > MAX_PEM || !strstr(text, "-----BEGIN ")) {
        if (text)
            snprintf(err, err_len, "the %s %s is %s", what, path,
                     failed ? "unreadable" : n > MAX_PEM ? "larger than 1 MiB"
                                                         : "not PEM (no -----BEGIN line)");
        else
            snprintf(err, err_len, "out of memory reading %s", path);
        free(text);
        return NULL;
    }
    text[n] = '\0';
    *len = n;
    return text;
}

bool tls_init(srv_server *srv, char *err, size_t err_len)
{
    const attnd_config *cfg = srv->cfg;
    srv->tls_cert = srv->tls_key = NULL;
    if (!cfg->tls_cert[0] && !cfg->tls_key[0])
        return true;
    if (!cfg->tls_cert[0] || !cfg->tls_key[0]) {
        snprintf(err, err_len, "--tls-cert and --tls-key go together: give both or neither");
        return false;
    }
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        snprintf(err, err_len, "this libmicrohttpd was built without TLS (GnuTLS): "
                               "--tls-cert cannot be served");
        return false;
    }
    size_t len;
    srv->tls_cert = read_pem("TLS certificate", cfg->tls_cert, &len, err, err_len);
    srv->tls_key = srv->tls_cert ? read_pem("TLS key", cfg->tls_key, &srv->tls_key_len, err,
                                            err_len)
                                 : NULL;
    if (!srv->tls_key) {
        free(srv->tls_cert);
        srv->tls_cert = NULL;
        return false;
    }
    return true;
}

bool tls_enabled(const srv_server *srv)
{
    return srv->tls_cert != NULL;
}

void tls_free(srv_server *srv)
{
    if (srv->tls_key)
        explicit_bzero(srv->tls_key, srv->tls_key_len);
    free(srv->tls_key);
    free(srv->tls_cert);
    srv->tls_key = srv->tls_cert = NULL;
}
