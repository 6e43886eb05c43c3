/*
 * SIGTERM, SIGINT and SIGHUP become bytes on a pipe that main reads, so the
 * drain and the reload of the API keys are ordinary code and nothing but
 * write(2) runs in signal context. (Blocking
 * the signals and using sigwait would not do: OpenBLAS starts its threads
 * before main, with the signals unblocked, and a process-directed signal
 * may be delivered to any of them.) SIGPIPE is ignored: a client that hangs
 * up is the transport's business, not a reason to die.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static int pipe_fd[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    ssize_t w = write(pipe_fd[1], &b, 1); /* a full pipe already says "stop" */
    (void)w;
    errno = saved;
}

bool signals_install(void)
{
    if (pipe2(pipe_fd, O_CLOEXEC | O_NONBLOCK) != 0)
        return false;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return true;
}

/* Waits up to timeout_ms (-1: for ever) for a signal; returns it, or 0. */
static int next_signal(int timeout_ms)
{
    struct pollfd p = {.fd = pipe_fd[0], .events = POLLIN};
    for (;;) {
        int n = poll(&p, 1, timeout_ms);
        if (n < 0 && errno == EINTR)
            continue; /* the handler ran in this thread; the byte is there */
        if (n <= 0)
            return 0;
        unsigned char b;
        if (read(pipe_fd[0], &b, 1) == 1)
            return b;
    }
}

int signals_wait(void)
{
    return next_signal(-1);
}

bool signals_poll(int timeout_ms)
{
    int sig;
    /* A SIGHUP during the drain reloads nothing and stops nothing. */
    while ((sig = next_signal(timeout_ms)) == SIGHUP)
        ;
    return sig != 0;
}
