/*
 * The option table and everything that walks it: defaults, ATTND_* variables,
 * command-line flags, --help, and the /v1/info limits.
 */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum {
    OPT_ADDR,    /* numeric IPv4 or IPv6 address */
    OPT_INT,     /* integer within [min, max] */
    OPT_BYTES,   /* integer with an optional KiB/MiB/GiB suffix */
    OPT_NUMBER,  /* finite number (1e12) within [min, max] */
    OPT_CHOICE,  /* one of `choices`, stored as its index */
    OPT_ORIGINS, /* repeatable / comma-separated list of CORS origins */
    OPT_PATH,    /* a file name ("" for none) */
    OPT_ACTION,  /* --help, --version: no value */
} opt_type;

typedef struct {
    const char *name;    /* flag without "--"; env is ATTND_ + NAME with '-' -> '_' */
    char short_name;     /* the one-letter flag ("-h"), or 0 */
    const char *metavar; /* shown in --help */
    opt_type type;
    size_t offset;       /* where the value lives in attnd_config */
    const char *def;     /* default, parsed like any other value */
    int (*def_fn)(void); /* default computed at run time (instead of def) */
    double min, max;
    const char *const *choices;
    bool limit;          /* reported under "limits" in /v1/info */
    const char *help;
} opt_row;

static int online_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

/* Half the cores, at least one, at most eight: an I/O thread only parses HTTP
 * and answers tiny requests, and every thread beyond the first adds the
 * wake-ups of a connection moving between threads and takes a core from the
 * compute workers and from whatever else the machine runs (the load
 * balancer, or the client: on 2 cores, two I/O threads beside a local
 * client served small requests 25% slower than one, make bench). */
static int default_io_threads(void)
{
    int n = online_cores() / 2;
    return n < 1 ? 1 : n > 8 ? 8 : n;
}

static const char *const log_formats[] = {"text", "json", NULL};

#define OFF(field) offsetof(attnd_config, field)

static const opt_row options[] = {
    {.name = "bind", .metavar = "ADDR", .type = OPT_ADDR, .offset = OFF(bind),
     .def = "127.0.0.1",
     .help = "address to listen on (IPv4 or IPv6; 0.0.0.0 for every interface)"},
    {.name = "port", .metavar = "N", .type = OPT_INT, .offset = OFF(port), .def = "8080",
     .min = 0, .max = 65535, .help = "TCP port (0 picks a free one)"},
    {.name = "threads", .metavar = "N", .type = OPT_INT, .offset = OFF(threads),
     .def_fn = online_cores, .min = 1, .max = 256, .limit = true,
     .help = "requests computed at once, and the cores they share (default: cores)"},
    {.name = "io-threads", .metavar = "N", .type = OPT_INT, .offset = OFF(io_threads),
     .def_fn = default_io_threads, .min = 1, .max = 64, .limit = true,
     .help = "threads that read requests and write answers (default: half the cores)"},
    {.name = "max-body", .metavar = "BYTES", .type = OPT_BYTES, .offset = OFF(max_body),
     .def = "64MiB", .min = 1024, .max = 4294967296.0, .limit = true,
     .help = "larger request bodies get 413 (suffixes KiB, MiB, GiB)"},
    {.name = "max-work", .metavar = "FLOPS", .type = OPT_NUMBER, .offset = OFF(max_work),
     .def = "1e12", .min = 1, .max = 1e18, .limit = true,
     .help = "requests needing more work get 422: FLOPs, and every other cost "
             "(heads, rows, scores, answer bytes) as the FLOPs it takes the time of"},
    /* 256 MiB: an answer of 13M numbers as text, 50M in base64; the bytes
     * that clients slow to read can make the server hold. */
    {.name = "max-response", .metavar = "BYTES", .type = OPT_BYTES,
     .offset = OFF(max_response), .def = "256MiB", .min = 65536, .max = 1099511627776.0,
     .limit = true,
     .help = "bytes that the answers in flight may hold together: one that could be "
             "larger gets 422, one that does not fit beside the others 503"},
    /* Together the defaults below fit a container of 1 GiB: requests
     * computing or queued 512 MiB, bodies arriving 128 MiB, answers being
     * sent 256 MiB (--max-response), and attnd itself a few tens of MiB. */
    {.name = "max-request-memory", .metavar = "BYTES", .type = OPT_BYTES,
     .offset = OFF(max_request_memory), .def = "256MiB", .min = 1048576,
     .max = 1099511627776.0, .limit = true,
     .help = "a request whose estimated peak memory (body, inputs, workspaces, results, "
             "answer) is larger gets 422, before anything is allocated"},
    {.name = "max-memory", .metavar = "BYTES", .type = OPT_BYTES, .offset = OFF(max_memory),
     .def = "512MiB", .min = 1048576, .max = 1099511627776.0, .limit = true,
     .help = "bytes the requests queued or computing may hold together (their estimates); "
             "one that does not fit beside the others gets 503"},
    {.name = "max-body-memory", .metavar = "BYTES", .type = OPT_BYTES,
     .offset = OFF(max_body_memory), .def = "128MiB", .min = 65536,
     .max = 1099511627776.0, .limit = true,
     .help = "bytes the request bodies being received may hold together (buffers grow as "
             "bytes arrive); a body that does not fit beside the others gets 503"},
    {.name = "queue", .metavar = "N", .type = OPT_INT, .offset = OFF(queue), .def = "64",
     .min = 0, .max = 100000, .limit = true,
     .help = "requests that may wait for a compute slot; beyond that 503"},
    {.name = "timeout", .metavar = "SECONDS", .type = OPT_INT, .offset = OFF(timeout),
     .def = "30", .min = 1, .max = 86400, .limit = true,
     .help = "a connection silent this long while its request is read or answered is "
             "closed"},
    /* A total, not an idle time: a client sending a byte now and then holds
     * its connection this long at most. 10 s is ample for any client on any
     * network, and it closes idle keep-alive connections as soon (nginx's
     * default keeps them 75 s, Node's 5 s). */
    {.name = "header-timeout", .metavar = "SECONDS", .type = OPT_INT,
     .offset = OFF(header_timeout), .def = "10", .min = 1, .max = 3600, .limit = true,
     .help = "a request's headers must all arrive within this long of when its connection "
             "began waiting for them (idle keep-alive connections included), or it is "
             "closed"},
    /* Below Kubernetes' default grace period of 30 s (which a preStop hook
     * also spends), so that attnd exits on its own before SIGKILL. */
    {.name = "drain-timeout", .metavar = "SECONDS", .type = OPT_INT,
     .offset = OFF(drain_timeout), .def = "20", .min = 0, .max = 86400, .limit = true,
     .help = "after SIGTERM, requests whose bodies are still arriving are dropped within a second "
             "and those computing may finish for this long; then attnd exits"},
    /* Every connection holds a file descriptor and libmicrohttpd's 32 KiB
     * buffer for it (touched once it has served a request): 4096 is 128 MiB
     * at most, and four times what a load generator or a proxy in front
     * usually opens. Past it new connections wait in the listen backlog. */
    {.name = "max-connections", .metavar = "N", .type = OPT_INT,
     .offset = OFF(max_connections), .def = "4096", .min = 16, .max = 1000000,
     .limit = true,
     .help = "connections held at once: past it the idlest is closed for a new one, or, "
             "when all are busy, the new one gets 503; from 7/8 of it on, a new connection "
             "from the address holding the most gets 503"},
    /* None by default: a load balancer, a proxy or a load generator opens
     * hundreds of connections from one address, and no common server
     * (nginx, HAProxy, Envoy, Triton) limits them by default. A flood from
     * one address is met by --max-connections' rule instead. */
    {.name = "max-conns-per-ip", .metavar = "N", .type = OPT_INT,
     .offset = OFF(max_conns_per_ip), .def = "0", .min = 0, .max = 100000, .limit = true,
     .help = "connections one client address may hold; past that 503 (0: no limit)"},
    /* 1 GiB: a 4-layer decoder's caches of 8 kv-heads x 128 x 32k positions
     * in bfloat16 (128 MiB a layer); a budget the operator sizes to the
     * machine, since caches stay between requests. */
    {.name = "cache-memory", .metavar = "BYTES", .type = OPT_BYTES,
     .offset = OFF(cache_memory), .def = "1GiB", .min = 0, .max = 1099511627776.0,
     .limit = true,
     .help = "bytes every KV cache (POST /v1/caches) together may hold; idle caches are "
             "evicted, least recently used first, to make room (0: no caches)"},
    /* 10 minutes: longer than any pause between the steps of a live
     * decoding, short enough that abandoned caches do not linger. */
    {.name = "cache-idle", .metavar = "SECONDS", .type = OPT_INT, .offset = OFF(cache_idle),
     .def = "600", .min = 1, .max = 604800, .limit = true,
     .help = "a KV cache no request has used for this long is dropped"},
    /* Any origin by default: attnd takes no credentials or cookies, so a web
     * page gains nothing through CORS that a direct request would not have,
     * and notebooks and web clients work out of the box. */
    {.name = "cors-origin", .metavar = "ORIGIN", .type = OPT_ORIGINS,
     .offset = OFF(n_origins), .def = "*",
     .help = "allow cross-origin requests from ORIGIN (repeatable, comma-separated; "
             "* for any, \"\" for none)"},
    {.name = "api-key-file", .metavar = "PATH", .type = OPT_PATH,
     .offset = OFF(api_key_file), .def = "",
     .help = "require Authorization: Bearer KEY on every route but /healthz and /readyz, "
             "KEY one of the lines of PATH, 16 bytes or more (re-read on SIGHUP)"},
    {.name = "tls-cert", .metavar = "PATH", .type = OPT_PATH, .offset = OFF(tls_cert),
     .def = "", .help = "serve HTTPS with this PEM certificate (chain), with --tls-key"},
    {.name = "tls-key", .metavar = "PATH", .type = OPT_PATH, .offset = OFF(tls_key),
     .def = "", .help = "the PEM private key of --tls-cert"},
    {.name = "log-format", .metavar = "text|json", .type = OPT_CHOICE,
     .offset = OFF(log_format), .def = "text", .choices = log_formats,
     .help = "access log format on stderr"},
    {.name = "version", .short_name = 'V', .type = OPT_ACTION,
     .help = "print the version and exit"},
    {.name = "help", .short_name = 'h', .type = OPT_ACTION, .help = "print this help and exit"},
};
#define N_OPTIONS (sizeof options / sizeof options[0])

static bool fail(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool fail(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return false;
}

static void env_name(const opt_row *o, char *buf, size_t len)
{
    size_t i = (size_t)snprintf(buf, len, "ATTND_");
    for (const char *s = o->name; *s && i + 1 < len; s++)
        buf[i++] = *s == '-' ? '_' : (char)toupper((unsigned char)*s);
    buf[i] = '\0';
}

static bool parse_int64(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return false;
    *out = v;
    return true;
}

static bool parse_bytes(const char *s, double *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *s == '-')
        return false;
    double mul = 1;
    if (!strcasecmp(end, "k") || !strcasecmp(end, "kib"))
        mul = 1024.0;
    else if (!strcasecmp(end, "m") || !strcasecmp(end, "mib"))
        mul = 1024.0 * 1024;
    else if (!strcasecmp(end, "g") || !strcasecmp(end, "gib"))
        mul = 1024.0 * 1024 * 1024;
    else if (*end)
        return false;
    *out = (double)v * mul;
    return true;
}

static bool add_origins(attnd_config *cfg, const char *list, const char *who,
                        char *err, size_t len)
{
    const char *p = list;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        const char *start = p;
        while (*p && *p != ',')
            p++;
        const char *end = p;
        while (end > start && end[-1] == ' ')
            end--;
        size_t n = (size_t)(end - start);
        if (n == 0)
            continue;
        for (size_t i = 0; i < n; i++)
            if (!isgraph((unsigned char)start[i]))
                return fail(err, len, "%s: origin \"%.*s\" contains a space or control character",
                            who, (int)n, start);
        if (n >= sizeof cfg->origins[0])
            return fail(err, len, "%s: origin \"%.40s...\" is too long", who, start);
        if (cfg->n_origins == CFG_MAX_ORIGINS)
            return fail(err, len, "%s: at most %d origins", who, CFG_MAX_ORIGINS);
        memcpy(cfg->origins[cfg->n_origins], start, n);
        cfg->origins[cfg->n_origins][n] = '\0';
        cfg->n_origins++;
    }
    return true;
}

/* Parses `value` for option o into cfg; `who` names the source in messages. */
static bool set_value(attnd_config *cfg, const opt_row *o, const char *value,
                      const char *who, char *err, size_t len)
{
    char *field = (char *)cfg + o->offset;
    long long iv;
    double dv;
    switch (o->type) {
    case OPT_ADDR: {
        unsigned char tmp[sizeof(struct in6_addr)];
        if (strlen(value) >= sizeof cfg->bind ||
            (inet_pton(AF_INET, value, tmp) != 1 && inet_pton(AF_INET6, value, tmp) != 1))
            return fail(err, len, "%s: \"%s\" is not an IPv4 or IPv6 address", who, value);
        strcpy(field, value);
        return true;
    }
    case OPT_INT:
        if (!parse_int64(value, &iv))
            return fail(err, len, "%s: \"%s\" is not an integer", who, value);
        if (iv < o->min || iv > o->max)
            return fail(err, len, "%s: %lld is out of range %.0f..%.0f", who, iv, o->min, o->max);
        *(int *)field = (int)iv;
        return true;
    case OPT_BYTES:
        if (!parse_bytes(value, &dv))
            return fail(err, len, "%s: \"%s\" is not a byte count (e.g. 1048576 or 64MiB)",
                        who, value);
        if (dv < o->min || dv > o->max)
            return fail(err, len, "%s: %s is out of range %.0f..%.0f bytes", who, value,
                        o->min, o->max);
        *(int64_t *)field = (int64_t)dv;
        return true;
    case OPT_NUMBER: {
        char *end;
        errno = 0;
        dv = strtod(value, &end);
        if (errno || end == value || *end || !isfinite(dv))
            return fail(err, len, "%s: \"%s\" is not a finite number", who, value);
        if (dv < o->min || dv > o->max)
            return fail(err, len, "%s: %s is out of range %g..%g", who, value, o->min, o->max);
        *(double *)field = dv;
        return true;
    }
    case OPT_CHOICE:
        for (int i = 0; o->choices[i]; i++)
            if (!strcmp(value, o->choices[i])) {
                *(int *)field = i;
                return true;
            }
        return fail(err, len, "%s: \"%s\" is not one of %s", who, value, o->metavar);
    case OPT_ORIGINS:
        return add_origins(cfg, value, who, err, len);
    case OPT_PATH:
        if (strlen(value) >= CFG_MAX_PATH)
            return fail(err, len, "%s: the file name is longer than %d bytes", who,
                        CFG_MAX_PATH - 1);
        strcpy(field, value);
        return true;
    case OPT_ACTION:
        break;
    }
    return fail(err, len, "%s: takes no value", who);
}

static const opt_row *find_option(const char *name, size_t n)
{
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (strlen(options[i].name) == n && !strncmp(options[i].name, name, n))
            return &options[i];
    return NULL;
}

/* The action with that one-letter flag (only actions have one), or NULL. */
static const opt_row *find_short(char c)
{
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (options[i].short_name == c)
            return &options[i];
    return NULL;
}

cfg_result config_load(attnd_config *cfg, int argc, char **argv, char *err,
                       size_t err_len)
{
    memset(cfg, 0, sizeof *cfg);
    char who[64];
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const opt_row *o = &options[i];
        if (o->type == OPT_ACTION)
            continue;
        if (o->def_fn)
            *(int *)((char *)cfg + o->offset) = o->def_fn();
        else if (!set_value(cfg, o, o->def, "default", err, err_len))
            return CFG_ERROR;
        env_name(o, who, sizeof who);
        const char *env = getenv(who);
        if (env && *env && o->type == OPT_ORIGINS)
            cfg->n_origins = 0; /* the variable replaces the default origins */
        if (env && *env && !set_value(cfg, o, env, who, err, err_len))
            return CFG_ERROR;
    }

    bool origins_from_flags = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const opt_row *short_flag = arg[0] == '-' && arg[1] && arg[1] != '-' && !arg[2]
                                        ? find_short(arg[1]) : NULL;
        if (short_flag)
            return !strcmp(short_flag->name, "help") ? CFG_HELP : CFG_VERSION;
        if (strncmp(arg, "--", 2) != 0) {
            fail(err, err_len, "unexpected argument \"%s\"", arg);
            return CFG_ERROR;
        }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        const opt_row *o = find_option(name, name_len);
        if (!o) {
            fail(err, err_len, "unknown option \"%.*s\"", (int)(name_len + 2), arg);
            return CFG_ERROR;
        }
        if (o->type == OPT_ACTION) {
            if (eq) {
                fail(err, err_len, "--%s takes no value", o->name);
                return CFG_ERROR;
            }
            return !strcmp(o->name, "help") ? CFG_HELP : CFG_VERSION;
        }
        const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!value) {
            fail(err, err_len, "--%s needs a value (%s)", o->name, o->metavar);
            return CFG_ERROR;
        }
        /* Flags replace the origins an environment variable gave, and add up
         * among themselves. */
        if (o->type == OPT_ORIGINS && !origins_from_flags) {
            cfg->n_origins = 0;
            origins_from_flags = true;
        }
        snprintf(who, sizeof who, "--%s", o->name);
        if (!set_value(cfg, o, value, who, err, err_len))
            return CFG_ERROR;
    }
    return CFG_OK;
}

void config_help(FILE *out)
{
    fprintf(out, "usage: attnd [options]\n\n"
                 "attnd serves scaled dot-product and multi-head attention over HTTP.\n"
                 "Every option can also be set by the environment variable shown.\n\n");
    char env[64], flag[64];
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const opt_row *o = &options[i];
        if (o->short_name)
            snprintf(flag, sizeof flag, "-%c, --%s", o->short_name, o->name);
        else
            snprintf(flag, sizeof flag, "--%s%s%s", o->name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
        fprintf(out, "  %-24s %s\n", flag, o->help);
        if (o->type == OPT_ACTION)
            continue;
        env_name(o, env, sizeof env);
        if (o->def_fn)
            fprintf(out, "  %-24s [env %s, default %d here]\n", "", env, o->def_fn());
        else
            fprintf(out, "  %-24s [env %s, default %s]\n", "", env, *o->def ? o->def : "none");
    }
    fprintf(out, "\nOnce it runs, open http://127.0.0.1:8080/ (the page; the address and "
                 "port as --bind and --port say)\nor read the API at /openapi.yaml "
                 "(/openapi.json).\n");
}

void config_limits_json(const attnd_config *cfg, codec_buf *out)
{
    codec_buf_puts(out, "{");
    bool first = true;
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const opt_row *opt = &options[i];
        if (!opt->limit)
            continue;
        const char *field = (const char *)cfg + opt->offset;
        codec_buf_printf(out, "%s\"", first ? "" : ", ");
        for (const char *s = opt->name; *s; s++)
            codec_buf_append(out, *s == '-' ? "_" : s, 1);
        codec_buf_puts(out, "\": ");
        switch (opt->type) {
        case OPT_INT:
            codec_buf_printf(out, "%d", *(const int *)field);
            break;
        case OPT_BYTES:
            codec_buf_printf(out, "%lld", (long long)*(const int64_t *)field);
            break;
        case OPT_NUMBER:
            codec_buf_printf(out, "%.17g", *(const double *)field);
            break;
        default:
            codec_buf_puts(out, "null");
            break;
        }
        first = false;
    }
    codec_buf_puts(out, "}");
}
