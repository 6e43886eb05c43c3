/*
 * SIGTERM and SIGINT are blocked in every thread and taken synchronously by
 * main with sigwait, so no handler runs in signal context and the drain is
 * ordinary code. SIGPIPE is ignored: a client that hangs up is the
 * transport's business, not a reason to die.
 */
#include "server.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

static sigset_t stop_signals;

void signals_block(void)
{
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int signals_wait(void)
{
    int sig = 0;
    while (sigwait(&stop_signals, &sig) != 0)
        ;
    return sig;
}

bool signals_poll(int timeout_ms)
{
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    return sigtimedwait(&stop_signals, NULL, &ts) > 0;
}
