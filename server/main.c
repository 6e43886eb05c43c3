/*
 * attnd: read the configuration, serve until SIGTERM or SIGINT, then drain
 * (stop accepting, drop the requests whose bodies are still arriving, let
 * the others finish within --drain-timeout) and exit 0. A second signal
 * during the drain stops waiting. SIGHUP reads the API keys again.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "config.h"
#include "server.h"

/* How long the drain waits for a request on a connection still open once
 * nothing is in flight (see below). 0.5 s lost requests from wrk under a
 * load average of 19 on 2 cores, whose threads then wait that long to run. */
#define DRAIN_GRACE_S 1.0

/* Descriptors the process needs besides its connections: the listening
 * socket, the I/O threads' wake-up channels, the signal pipe, stderr, a
 * key file or /proc being read. */
#define FD_RESERVE 64

/* Descriptors for n held connections: those, the room above them for
 * refused and shed ones (conn_limit.c), and the process's own. */
static rlim_t descriptors_for(int n)
{
    return (rlim_t)n + (rlim_t)conn_limit_room(n) + FD_RESERVE;
}

/* Raises the soft limit on open files to what --max-connections needs (as
 * nginx's worker_rlimit_nofile does; the hard limit is the administrator's
 * word); where the hard limit is lower, holds fewer connections and says
 * so, rather than failing accepts with EMFILE later. */
static void fit_descriptor_limit(attnd_config *cfg, srv_log *log)
{
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0)
        return;
    rlim_t want = descriptors_for(cfg->max_connections);
    if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want) {
        rlim_t was = lim.rlim_cur;
        lim.rlim_cur = lim.rlim_max == RLIM_INFINITY || lim.rlim_max >= want ? want
                                                                            : lim.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &lim) != 0)
            lim.rlim_cur = was;
    }
    if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want) {
        int fit = cfg->max_connections;
        while (fit > 16 && descriptors_for(fit) > lim.rlim_cur)
            fit -= fit / 16 > 1 ? fit / 16 : 1;
        log_event(log, "warn",
                  "--max-connections %d needs %llu open files, and this process may have "
                  "%llu (ulimit -n): holding at most %d connections",
                  cfg->max_connections, (unsigned long long)want,
                  (unsigned long long)lim.rlim_cur, fit);
        cfg->max_connections = fit;
    }
}

/* The address a browser on this machine reaches the server at. */
static void page_url(const attnd_config *cfg, bool https, int port, char *url, size_t cap)
{
    const char *host = cfg->bind;
    if (!strcmp(host, "0.0.0.0"))
        host = "127.0.0.1";
    else if (!strcmp(host, "::"))
        host = "::1";
    bool v6 = strchr(host, ':') != NULL;
    snprintf(url, cap, "%s://%s%s%s:%d/", https ? "https" : "http", v6 ? "[" : "", host,
             v6 ? "]" : "", port);
}

int main(int argc, char **argv)
{
    static attnd_config cfg;
    static srv_server srv = {.cfg = &cfg};
    char err[300];
    switch (config_load(&cfg, argc, argv, err, sizeof err)) {
    case CFG_HELP:
        config_help(stdout);
        return 0;
    case CFG_VERSION: {
        api_info info;
        api_get_info(&info);
        printf("attnd %s (libattn %s, kernel %s, bf16 %s, %s)\n", ATTND_VERSION, info.libattn,
               info.kernel, info.bf16, info.blas_config);
        return 0;
    }
    case CFG_ERROR:
        fprintf(stderr, "attnd: %s\nTry 'attnd --help'.\n", err);
        return 2;
    case CFG_OK:
        break;
    }

    /* The key file and the certificate are read before anything starts: a
     * file that cannot be used is a configuration error. */
    if (!auth_init(&srv.auth, &cfg, err, sizeof err) || !tls_init(&srv, err, sizeof err)) {
        fprintf(stderr, "attnd: %s\n", err);
        return 2;
    }

    srv_log *log = &srv.log;
    log_init(log, (log_format)cfg.log_format);
    if (!signals_install()) {
        log_event(log, "error", "cannot set up signal handling");
        return 1;
    }
    /* Once, before the port opens: a generic OpenBLAS core on a wide CPU
     * slows every projection. */
    api_info info;
    api_get_info(&info);
    if (info.blas_shortfall != NULL)
        log_event(log, "warn", "%s", info.blas_shortfall);
    fit_descriptor_limit(&cfg, log);
    if (!http_start(&srv, err, sizeof err)) {
        log_event(log, "error", "%s", err);
        return 1;
    }
    /* "listening on ADDR:PORT" is read by scripts (tests/torch_check.py). */
    log_event(log, "info",
              "attnd %s listening on %s%s%s:%d (threads %d, io-threads %d, queue %d, "
              "max-body %lld%s%s)",
              ATTND_VERSION, strchr(cfg.bind, ':') ? "[" : "", cfg.bind,
              strchr(cfg.bind, ':') ? "]" : "", http_port(&srv), cfg.threads, cfg.io_threads,
              cfg.queue,
              (long long)cfg.max_body, tls_enabled(&srv) ? ", HTTPS" : "",
              auth_required(&srv.auth) ? ", API key required" : "");
    char url[100];
    page_url(&cfg, tls_enabled(&srv), http_port(&srv), url, sizeof url);
    log_event(log, "info", "open %s in a browser; the API is described at %sopenapi.yaml",
              url, url);

    int sig;
    while ((sig = signals_wait()) == SIGHUP) {
        int keys = auth_reload(&srv.auth, err, sizeof err);
        if (keys >= 0)
            log_event(log, "info", "SIGHUP: %d API key(s) in force, read from %s", keys,
                      cfg.api_key_file);
        else if (auth_required(&srv.auth))
            log_event(log, "warn", "SIGHUP: %s; the keys in force stay", err);
        else
            log_event(log, "info", "SIGHUP: nothing to reload (no --api-key-file)");
    }
    log_event(log, "info", "%s: draining %ld in-flight request(s), for %d s at most",
              sig == SIGINT ? "SIGINT" : "SIGTERM", http_in_flight(&srv), cfg.drain_timeout);
    double deadline = srv_now() + cfg.drain_timeout;
    http_quiesce(&srv);
    /* A request whose body is stalled is dropped now, the others still
     * arriving within DRAIN_BODY_GRACE_S: none was going to be computed,
     * and a client trickling one must not hold the exit. */
    conn_limit_sweep(&srv.conn_limit, srv_now_coarse(), true);
    /* Every answer from now on says Connection: close, so each open
     * connection closes after its next request. A request may already be on
     * its way on one of them when the last one in flight finishes: wait
     * until every connection has gone, or none has had a request in flight
     * for DRAIN_GRACE_S, so that it is answered (503 shutting_down) rather
     * than reset. Idle keep-alive connections are not waited for longer. */
    bool forced = false;
    double quiet_since = srv_now();
    while (srv_now() - quiet_since < DRAIN_GRACE_S && srv_now() < deadline &&
           http_open_connections(&srv) > 0 && !(forced = signals_poll(20)))
        if (http_in_flight(&srv) > 0)
            quiet_since = srv_now();
    while (!forced && http_in_flight(&srv) > 0 && srv_now() < deadline &&
           !(forced = signals_poll(20)))
        ;
    if (forced || http_in_flight(&srv) > 0) {
        /* Workers may still hold connections; leave them to the exit, which
         * resets them. */
        log_event(log, "warn", "%s: exiting with %ld request(s) unfinished",
                  forced ? "second signal" : "drain timeout (--drain-timeout)",
                  http_in_flight(&srv));
        log_flush(log);
        return 0;
    }
    http_stop(&srv);
    auth_free(&srv.auth);
    tls_free(&srv);
    log_shutdown(log);
    log_event(log, "info", "stopped");
    return 0;
}
