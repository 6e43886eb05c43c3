/*
 * attnd: read the configuration, serve until SIGTERM or SIGINT, then drain
 * (stop accepting, let in-flight requests finish) and exit 0. A second
 * signal during the drain stops waiting.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "attn.h"
#include "config.h"
#include "server.h"

int main(int argc, char **argv)
{
    static attnd_config cfg;
    char err[300];
    switch (config_load(&cfg, argc, argv, err, sizeof err)) {
    case CFG_HELP:
        config_help(stdout);
        return 0;
    case CFG_VERSION:
        printf("attnd %s (libattn %s, %s)\n", ATTND_VERSION, attn_version(),
               attn_blas_config());
        return 0;
    case CFG_ERROR:
        fprintf(stderr, "attnd: %s\nTry 'attnd --help'.\n", err);
        return 2;
    case CFG_OK:
        break;
    }

    log_init((log_format)cfg.log_format);
    if (!signals_install()) {
        log_event("error", "cannot set up signal handling");
        return 1;
    }
    if (!http_start(&cfg, err, sizeof err)) {
        log_event("error", "%s", err);
        return 1;
    }
    log_event("info", "attnd %s listening on %s%s%s:%d (threads %d, queue %d, max-body %lld)",
              ATTND_VERSION, strchr(cfg.bind, ':') ? "[" : "", cfg.bind,
              strchr(cfg.bind, ':') ? "]" : "", http_port(), cfg.threads, cfg.queue,
              (long long)cfg.max_body);

    int sig = signals_wait();
    log_event("info", "%s: draining %ld in-flight request(s)",
              sig == SIGINT ? "SIGINT" : "SIGTERM", http_in_flight());
    http_quiesce();
    bool forced = false;
    while (http_in_flight() > 0 && !(forced = signals_poll(20)))
        ;
    if (forced) {
        /* Workers may still hold connections; leave them to the exit. */
        log_event("warn", "second signal: exiting with %ld request(s) unfinished",
                  http_in_flight());
        log_flush();
        return 0;
    }
    http_stop();
    log_shutdown();
    log_event("info", "stopped");
    return 0;
}
