/*
 * Connections by client address: the defence against one address taking
 * the connections everyone needs, and --max-conns-per-ip.
 *
 * Every open connection is counted by address when libmicrohttpd reports
 * it started, and uncounted when it closes. The daemon holds at most
 * --max-connections; from 7/8 of that on (connection pressure), a new
 * connection from the address that holds the most connections now is
 * refused at accept (closed, as the daemon would close one past its
 * limit), while any other address is still let in. So a flood from one
 * address (slow clients holding sockets, a runaway load generator) stops
 * growing at the pressure mark and leaves the last eighth to everyone
 * else, and nothing is refused while connections are plentiful: a proxy or
 * a load generator may hold thousands from one address. Which address
 * holds the most is known at once: `holding` counts the addresses by how
 * many connections they hold, so `most` moves by one step per open or
 * close.
 *
 * --max-conns-per-ip (default 0, none) is a fixed cap per address.
 * libmicrohttpd's own MHD_OPTION_PER_IP_CONNECTION_LIMIT closes a
 * connection past the limit without a word, which a client cannot tell
 * from a crash; here one past the limit is kept just long enough to answer
 * its first request with a JSON 503 (Retry-After, Connection: close). So
 * that a client cannot hold sockets by opening over-limit connections that
 * never ask anything, those are few (OVER_LIMIT_SLACK per address, past
 * which a connection is closed at accept) and idle for at most
 * OVER_LIMIT_TIMEOUT seconds.
 *
 * Both rules judge at accept what was counted when connections were
 * reported started; each I/O thread accepts on its own, so while one is
 * between the two another may let in one more: past either mark, at most
 * one more per other I/O thread. (Counting at accept would need an uncount
 * for a connection libmicrohttpd then fails to set up, which it does not
 * report.)
 *
 * Addresses are whole: an IPv4 address, or an IPv6 address (an IPv4-mapped
 * one counts as its IPv4 address). Behind a load balancer every connection
 * comes from the balancer's address, so a per-address limit there must
 * cover all of its connections (or be 0, none).
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

bool conn_limit_init(srv_conn_limit *cl, int max_per_ip, int max_connections)
{
    cl->max_per_ip = max_per_ip;
    cl->pressure = max_connections - max_connections / 8;
    pthread_mutex_init(&cl->lock, NULL);
    memset(cl->buckets, 0, sizeof cl->buckets);
    cl->open = cl->most = 0;
    atomic_store(&cl->refused_per_ip, 0);
    atomic_store(&cl->refused_pressure, 0);
    /* One address holds at most what the daemon holds (and a few more
     * that the I/O threads let in at once); more is counted at the top. */
    cl->holding_cap = max_connections + 256;
    cl->holding = calloc((size_t)cl->holding_cap, sizeof *cl->holding);
    return cl->holding != NULL;
}

/* An address's count moves from `from` to `to` (one step; lock held). */
static void move(srv_conn_limit *cl, int from, int to)
{
    int top = cl->holding_cap - 1;
    int f = from < top ? from : top, t = to < top ? to : top;
    if (f > 0)
        cl->holding[f]--;
    if (t > 0)
        cl->holding[t]++;
    if (to > cl->most)
        cl->most = to;
    while (cl->most > 0 && cl->holding[cl->most < top ? cl->most : top] == 0)
        cl->most--;
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
    if (!key_of(sa, key))
        return true;
    srv_client **link;
    pthread_mutex_lock(&cl->lock);
    srv_client *c = find(cl, key, &link);
    int mine = c ? c->open : 0;
    bool per_ip = cl->max_per_ip > 0 && mine >= cl->max_per_ip + OVER_LIMIT_SLACK;
    bool pressure = cl->open >= cl->pressure && mine > 0 && mine >= cl->most;
    pthread_mutex_unlock(&cl->lock);
    if (per_ip)
        atomic_fetch_add_explicit(&cl->refused_per_ip, 1, memory_order_relaxed);
    else if (pressure)
        atomic_fetch_add_explicit(&cl->refused_pressure, 1, memory_order_relaxed);
    return !per_ip && !pressure;
}

srv_client *conn_limit_open(srv_conn_limit *cl, const struct sockaddr *sa, bool *over_limit)
{
    *over_limit = false;
    unsigned char key[16];
    if (!key_of(sa, key))
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
    c->open++;
    cl->open++;
    move(cl, c->open - 1, c->open);
    *over_limit = cl->max_per_ip > 0 && c->open > cl->max_per_ip;
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
    c->open--;
    cl->open--;
    move(cl, c->open + 1, c->open);
    if (c->open <= 0 && find(cl, c->addr, &link) == c) {
        *link = c->next;
        free(c);
    }
    pthread_mutex_unlock(&cl->lock);
}

int conn_limit_open_now(srv_conn_limit *cl)
{
    pthread_mutex_lock(&cl->lock);
    int n = cl->open;
    pthread_mutex_unlock(&cl->lock);
    return n;
}

void conn_limit_free(srv_conn_limit *cl)
{
    for (int i = 0; i < CONN_LIMIT_BUCKETS; i++)
        while (cl->buckets[i]) {
            srv_client *c = cl->buckets[i];
            cl->buckets[i] = c->next;
            free(c);
        }
    free(cl->holding);
    cl->holding = NULL;
    pthread_mutex_destroy(&cl->lock);
}
