/*
 * --max-conns-per-ip: how many connections one client address may hold.
 *
 * libmicrohttpd's own MHD_OPTION_PER_IP_CONNECTION_LIMIT closes a connection
 * past the limit without a word, which a client cannot tell from a crash.
 * Here every open connection is counted by address when libmicrohttpd
 * reports it started, and one past the limit is kept just long enough to
 * answer its first request with a JSON 503 (Retry-After, Connection: close).
 * So that a client cannot hold sockets by opening over-limit connections
 * that never ask anything, those are few (OVER_LIMIT_SLACK per address, past
 * which a connection is closed at accept, as libmicrohttpd would) and idle
 * for at most OVER_LIMIT_TIMEOUT seconds. The slack is counted when a
 * connection is reported started, after the accept policy has let it in;
 * each I/O thread accepts on its own, so while one is between the two
 * another may let in one more: past the slack, at most one more per other
 * I/O thread. (Counting at accept would need an uncount for a connection
 * libmicrohttpd then fails to set up, which it does not report.)
 *
 * Addresses are whole: an IPv4 address, or an IPv6 address (an IPv4-mapped
 * one counts as its IPv4 address). Behind a load balancer every connection
 * comes from the balancer's address, so the limit there must cover all of
 * its connections (or be 0, none).
 */
#include "server.h"

#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct srv_client {
    unsigned char addr[16]; /* IPv6, or IPv4 in its mapped form */
    int open;               /* connections from addr, over the limit or not */
    srv_client *next;
};

void conn_limit_init(srv_conn_limit *cl, int max_per_ip)
{
    cl->max_per_ip = max_per_ip;
    pthread_mutex_init(&cl->lock, NULL);
    memset(cl->buckets, 0, sizeof cl->buckets);
}

/* The address as 16 bytes; false for a family that is not IP (no limit). */
static bool key_of(const struct sockaddr *sa, unsigned char key[16])
{
    if (!sa)
        return false;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)(const void *)sa;
        memset(key, 0, 10);
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &v4->sin_addr, 4);
        return true;
    }
    if (sa->sa_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
        return true;
    }
    return false;
}

/* The node for key (lock held), or NULL; *link is where it hangs or would. */
static srv_client *find(srv_conn_limit *cl, const unsigned char key[16], srv_client ***link)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (int i = 0; i < 16; i++)
        h = (h ^ key[i]) * 16777619u;
    srv_client **p = &cl->buckets[h % CONN_LIMIT_BUCKETS];
    while (*p && memcmp((*p)->addr, key, 16) != 0)
        p = &(*p)->next;
    *link = p;
    return *p;
}

bool conn_limit_accept(srv_conn_limit *cl, const struct sockaddr *sa)
{
    unsigned char key[16];
    if (cl->max_per_ip == 0 || !key_of(sa, key))
        return true;
    srv_client **link;
    pthread_mutex_lock(&cl->lock);
    srv_client *c = find(cl, key, &link);
    int open = c ? c->open : 0;
    pthread_mutex_unlock(&cl->lock);
    return open < cl->max_per_ip + OVER_LIMIT_SLACK;
}

srv_client *conn_limit_open(srv_conn_limit *cl, const struct sockaddr *sa, bool *over_limit)
{
    *over_limit = false;
    unsigned char key[16];
    if (cl->max_per_ip == 0 || !key_of(sa, key))
        return NULL;
    srv_client **link;
    pthread_mutex_lock(&cl->lock);
    srv_client *c = find(cl, key, &link);
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) {
            /* Not counted, so not refused: memory is short for everyone. */
            pthread_mutex_unlock(&cl->lock);
            return NULL;
        }
        memcpy(c->addr, key, 16);
        *link = c;
    }
    *over_limit = ++c->open > cl->max_per_ip;
    pthread_mutex_unlock(&cl->lock);
    return c;
}

void conn_limit_close(srv_conn_limit *cl, srv_client *c)
{
    if (!c)
        return;
    srv_client **link;
    pthread_mutex_lock(&cl->lock);
    /* The node lives while it counts a connection, so c is still valid. */
    if (--c->open <= 0 && find(cl, c->addr, &link) == c) {
        *link = c->next;
        free(c);
    }
    pthread_mutex_unlock(&cl->lock);
}

void conn_limit_free(srv_conn_limit *cl)
{
    for (int i = 0; i < CONN_LIMIT_BUCKETS; i++)
        while (cl->buckets[i]) {
            srv_client *c = cl->buckets[i];
            cl->buckets[i] = c->next;
            free(c);
        }
    pthread_mutex_destroy(&cl->lock);
}
