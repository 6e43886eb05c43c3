/*
 * attnd's configuration: every option is one row of the table in config.c
 * (flag, ATTND_* variable, default, bounds, --help line, /v1/info entry), in
 * the manner of Redis's static_configs[]. Parsing, --help and the "limits"
 * object of /v1/info all walk that table, so an option is declared once.
 *
 * Precedence: default < environment variable < command-line flag.
 */
#ifndef ATTND_CONFIG_H
#define ATTND_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "json/codec.h"

#define ATTND_VERSION "1.0.0"
#define CFG_MAX_ORIGINS 16
#define CFG_MAX_PATH 1024

typedef enum { LOG_TEXT = 0, LOG_JSON = 1 } log_format;

typedef struct {
    char bind[64];       /* address to listen on */
    int port;            /* 0: any free port */
    int threads;         /* requests computing at once, and the core budget */
    int io_threads;      /* libmicrohttpd's threads: HTTP parsing, tiny requests */
    int64_t max_body;    /* bytes; a larger body is a 413 */
    double max_work;     /* work units (FLOP-equivalents); a request needing more is a 422 */
    int64_t max_response; /* bytes all answers in flight may hold; one larger is a 422 */
    int64_t max_request_memory; /* bytes one request may hold at its peak; more is a 422 */
    int64_t max_memory;  /* bytes the requests queued or computing may hold together */
    int64_t max_body_memory; /* bytes the bodies being received may hold together */
    int queue;           /* requests that may wait for a compute slot */
    int timeout;         /* seconds a connection may stay idle mid-request */
    int header_timeout;  /* seconds a request's headers may take, in all */
    int drain_timeout;   /* seconds the drain after SIGTERM may take */
    int max_connections; /* connections held at once */
    int max_conns_per_ip; /* connections one client address may hold; 0: any */
    int log_format;      /* log_format */
    int n_origins;       /* allowed CORS origins ("*" allows any) */
    char origins[CFG_MAX_ORIGINS][256];
    char api_key_file[CFG_MAX_PATH]; /* "" : no key needed */
    char tls_cert[CFG_MAX_PATH];     /* PEM; "" : plain HTTP */
    char tls_key[CFG_MAX_PATH];
} attnd_config;

typedef enum {
    CFG_OK = 0,
    CFG_HELP,    /* --help given: print config_help() and exit 0 */
    CFG_VERSION, /* --version given */
    CFG_ERROR,   /* err says what is wrong; exit 2 */
} cfg_result;

/* Fills cfg from the defaults, the ATTND_* environment and argv. */
cfg_result config_load(attnd_config *cfg, int argc, char **argv, char *err,
                       size_t err_len);

/* The --help text, one line per table row. */
void config_help(FILE *out);

/* Appends the /v1/info "limits" object ({"max_body": 67108864, ...}). */
void config_limits_json(const attnd_config *cfg, codec_buf *out);

#endif /* ATTND_CONFIG_H */
