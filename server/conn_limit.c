/*
 * Which connections attnd holds, and which it lets go: the one policy that
 * keeps any client, or any few, from taking the connections everyone needs.
 *
 * Held and refused. attnd holds at most --max-connections (N) connections.
 * libmicrohttpd is given room for conn_limit_room(N) more, which are never
 * held: they serve to tell a refused connection so (a JSON 503
 * too_many_connections, Retry-After: 1, Connection: close, to its first
 * request) and to close a shed one, so that no client is left waiting in
 * the listen backlog for an answer that never comes. A new connection is
 * refused
 *   - when its address already holds --max-conns-per-ip (default 0, none);
 *   - under pressure, from 7/8 of N held on, when its address holds the most
 *     (any other address is still let in), so that a flood from one address
 *     (slow clients, a runaway load generator) stops there and leaves the
 *     last eighth to everyone else. While connections are plentiful nothing
 *     is refused: a proxy or a load generator may hold thousands from one
 *     address;
 *   - at N, when every held connection is serving a request.
 * Otherwise it is held; at N the idlest held connection is shed (closed) to
 * make its room: the one that has waited longest for its next request's
 * headers (an idle keep-alive connection, or one sending its headers slowly)
 * or whose body has not moved for longest, whichever has been idle longer.
 * A connection whose request is being computed or answered is never shed.
 * So k addresses holding incomplete requests cannot keep a (k+1)-th from
 * being answered: its connection takes the place of the oldest of theirs.
 *
 * Deadlines. Every request's headers must have arrived, whole, within
 * --header-timeout seconds of when its connection began to wait for them
 * (its accept, or the end of the answer before): a total, not an idle time
 * that every byte restarts (libmicrohttpd's --timeout), so that a client
 * sending a byte now and then holds its connection that long and no longer.
 * An idle keep-alive connection is closed then too, as a server that closes
 * idle keep-alive connections after seconds (Node's 5 s, nginx's 75 s) does.
 * A refused connection has REFUSED_TIMEOUT seconds to ask.
 *
 * The drain. Once draining, a connection whose request's body is still
 * arriving is shed as soon as its body has not moved for
 * DRAIN_BODY_STALL_S, and every one DRAIN_BODY_GRACE_S into the drain: a
 * client trickling its body must not hold the exit. Not at once: a body
 * sent whole a moment before the signal may still sit in the socket's
 * buffer, unread by a busy I/O thread, and shedding it would lose a
 * request its client had every right to see answered (503 or computed).
 *
 * Flooders. An address with REFUSED_SLACK refused connections still waiting
 * for their 503 gets its further connections that would be refused closed at
 * accept, without an answer, so that refusals cannot fill the room.
 *
 * Mechanics. Counts move when libmicrohttpd reports a connection started or
 * closed; the accept callback only judges (one I/O thread may let in one
 * more past a mark while another is between the two). A connection is
 * shed by shutting its socket down under this file's lock: libmicrohttpd
 * sees the end of the stream and closes it as it would any other, and its
 * report of the close takes the same lock before the socket is closed, so
 * the descriptor shut down is always still the connection's. Deadlines are
 * enforced by conn_watch.c's thread, every WATCH_PERIOD_MS.
 *
 * Addresses are whole: an IPv4 address, or an IPv6 address (an IPv4-mapped
 * one counts as its IPv4 address). Behind a load balancer every connection
 * comes from the balancer's address, so a per-address limit there must
 * cover all of its connections (or be 0, none).
 */
#include "server.h"

#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct srv_client {
    unsigned char addr[16]; /* IPv6, or IPv4 in its mapped form */
    int open;               /* connections from addr counted, until closed */
    int held;               /* ... of them held */
    int refused;            /* ... refused and still open */
    srv_client *next;
};

int conn_limit_room(int max_connections)
{
    return max_connections / 8 + 64;
}

bool conn_limit_init(srv_conn_limit *cl, const attnd_config *cfg)
{
    memset(cl, 0, sizeof *cl);
    cl->max_per_ip = cfg->max_conns_per_ip;
    cl->cap = cfg->max_connections;
    cl->pressure = cl->cap - cl->cap / 8;
    cl->header_timeout = cfg->header_timeout;
    pthread_mutex_init(&cl->lock, NULL);
    for (int i = 0; i < N_REFUSE; i++)
        atomic_init(&cl->refusals[i], 0);
    for (int i = 0; i < N_SHED; i++)
        atomic_init(&cl->sheds[i], 0);
    /* One address holds at most what attnd holds (and a few more that the
     * I/O threads let in at once); more is counted at the top. */
    cl->holding_cap = cl->cap + 256;
    cl->holding = calloc((size_t)cl->holding_cap, sizeof *cl->holding);
    return cl->holding != NULL;
}

/* ---------------------------------------------------------- addresses */

/* An address's held count moves from `from` to `to` (one step; lock held). */
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

/* ---------------------------------------------------------------- lists */

static conn_list *list_of(srv_conn_limit *cl, conn_state state)
{
    switch (state) {
    case CONN_WAITING: return &cl->waiting;
    case CONN_READING: return &cl->reading;
    case CONN_COMPUTING: return &cl->computing;
    case CONN_REFUSED: return &cl->refused;
    case CONN_SERVING:
    case CONN_SHED: break;
    }
    return NULL;
}

static void unlink_cx(srv_conn_limit *cl, srv_connection *cx)
{
    conn_list *l = list_of(cl, cx->state);
    if (!l)
        return;
    if (cx->prev)
        cx->prev->next = cx->next;
    else
        l->head = cx->next;
    if (cx->next)
        cx->next->prev = cx->prev;
    else
        l->tail = cx->prev;
    cx->prev = cx->next = NULL;
    l->count--;
}

/* Moves cx to `state` (lock held): out of its list, onto the end of the
 * new one's, so that a list is in the order its connections joined. */
static void set_state(srv_conn_limit *cl, srv_connection *cx, conn_state state)
{
    unlink_cx(cl, cx);
    cx->state = state;
    conn_list *l = list_of(cl, state);
    if (!l)
        return;
    cx->prev = l->tail;
    cx->next = NULL;
    if (l->tail)
        l->tail->next = cx;
    else
        l->head = cx;
    l->tail = cx;
    l->count++;
}

static bool is_held(conn_state s)
{
    return s != CONN_REFUSED && s != CONN_SHED;
}

/* Closes cx's socket under libmicrohttpd (lock held): see "Mechanics". */
static void shed(srv_conn_limit *cl, srv_connection *cx, int reason)
{
    if (is_held(cx->state)) {
        cl->held--;
        if (cx->client) {
            cx->client->held--;
            move(cl, cx->client->held + 1, cx->client->held);
        }
    } else if (cx->state == CONN_REFUSED && cx->client) {
        cx->client->refused--;
    }
    set_state(cl, cx, CONN_SHED);
    shutdown(cx->fd, SHUT_RDWR);
    if (reason >= 0)
        atomic_fetch_add_explicit(&cl->sheds[reason], 1, memory_order_relaxed);
}

/* The held connection idle longest that may be shed, or NULL. */
static srv_connection *idlest(srv_conn_limit *cl)
{
    srv_connection *best = cl->waiting.head; /* the list is oldest first */
    for (srv_connection *cx = cl->reading.head; cx; cx = cx->next)
        if (!best || cx->since < best->since)
            best = cx;
    return best;
}

/* ------------------------------------------------------------- admission */

/* Why a new connection from c (NULL: an address with none) would be
 * refused before the cap is looked at, or REFUSE_NONE (lock held). */
static conn_refusal verdict(const srv_conn_limit *cl, const srv_client *c)
{
    int mine = c ? c->held : 0;
    if (cl->max_per_ip > 0 && mine >= cl->max_per_ip)
        return REFUSE_PER_IP;
    if (cl->held >= cl->pressure && mine > 0 && mine >= cl->most)
        return REFUSE_PRESSURE;
    return REFUSE_NONE;
}

bool conn_limit_accept(srv_conn_limit *cl, const struct sockaddr *sa)
{
    unsigned char key[16];
    if (!key_of(sa, key))
        return true;
    srv_client **link;
    pthread_mutex_lock(&cl->lock);
    srv_client *c = find(cl, key, &link);
    conn_refusal why = verdict(cl, c);
    if (why == REFUSE_NONE && cl->held >= cl->cap && !idlest(cl))
        why = REFUSE_FULL;
    bool close = why != REFUSE_NONE && c && c->refused >= REFUSED_SLACK;
    pthread_mutex_unlock(&cl->lock);
    if (close)
        atomic_fetch_add_explicit(&cl->refusals[why], 1, memory_order_relaxed);
    return !close;
}

void conn_limit_open(srv_conn_limit *cl, srv_connection *cx, const struct sockaddr *sa)
{
    unsigned char key[16];
    bool ip = key_of(sa, key);
    srv_client **link;
    pthread_mutex_lock(&cl->lock);
    srv_client *c = ip ? find(cl, key, &link) : NULL;
    if (ip && !c && (c = calloc(1, sizeof *c)) != NULL) {
        memcpy(c->addr, key, 16);
        *link = c;
    }
    /* Without a node (not IP, or no memory) the connection is held and
     * counted only in the totals. */
    cx->client = c;
    conn_refusal why = verdict(cl, c);
    if (why == REFUSE_NONE && cl->held >= cl->cap) {
        srv_connection *victim = idlest(cl);
        if (victim)
            shed(cl, victim, SHED_IDLEST);
        else
            why = REFUSE_FULL;
    }
    cl->open++;
    if (c)
        c->open++;
    cx->refused = why;
    cx->since = srv_now_coarse();
    cx->prev = cx->next = NULL;
    cx->state = CONN_SERVING; /* in no list yet */
    if (why != REFUSE_NONE) {
        if (c)
            c->refused++;
        set_state(cl, cx, CONN_REFUSED);
        atomic_fetch_add_explicit(&cl->refusals[why], 1, memory_order_relaxed);
    } else {
        cl->held++;
        if (c) {
            c->held++;
            move(cl, c->held - 1, c->held);
        }
        set_state(cl, cx, CONN_WAITING);
    }
    pthread_mutex_unlock(&cl->lock);
}

void conn_limit_close(srv_conn_limit *cl, srv_connection *cx)
{
    pthread_mutex_lock(&cl->lock);
    srv_client *c = cx->client;
    if (is_held(cx->state)) {
        cl->held--;
        if (c) {
            c->held--;
            move(cl, c->held + 1, c->held);
        }
    } else if (cx->state == CONN_REFUSED && c) {
        c->refused--;
    }
    set_state(cl, cx, CONN_SHED); /* out of every list */
    cl->open--;
    srv_client **link;
    /* The node lives while it counts a connection, so c is still valid. */
    if (c && --c->open <= 0 && find(cl, c->addr, &link) == c) {
        *link = c->next;
        free(c);
    }
    cx->client = NULL;
    pthread_mutex_unlock(&cl->lock);
}

/* ---------------------------------------------------------- transitions */

/* Moves a held cx from one of the states `from` (a bit per conn_state) to
 * `to`; `restart`: its idle time starts again now. */
static void transition(srv_connection *cx, unsigned from, conn_state to, bool restart)
{
    srv_conn_limit *cl = &cx->srv->conn_limit;
    double now = restart ? srv_now_coarse() : 0;
    pthread_mutex_lock(&cl->lock);
    if (from & (1u << cx->state)) {
        if (restart)
            cx->since = now;
        if (cx->state != to)
            set_state(cl, cx, to);
    }
    pthread_mutex_unlock(&cl->lock);
}

#define FROM(s) (1u << (s))

void conn_reading(srv_connection *cx)
{
    transition(cx, FROM(CONN_WAITING), CONN_READING, true);
}

void conn_progress(srv_connection *cx)
{
    transition(cx, FROM(CONN_READING), CONN_READING, true);
}

void conn_serving(srv_connection *cx)
{
    transition(cx, FROM(CONN_WAITING) | FROM(CONN_READING), CONN_SERVING, false);
}

void conn_computing(srv_connection *cx)
{
    transition(cx, FROM(CONN_READING) | FROM(CONN_SERVING), CONN_COMPUTING, false);
}

void conn_computed(srv_connection *cx)
{
    transition(cx, FROM(CONN_COMPUTING), CONN_SERVING, false);
}

void conn_waiting(srv_connection *cx)
{
    transition(cx, FROM(CONN_READING) | FROM(CONN_SERVING) | FROM(CONN_COMPUTING),
               CONN_WAITING, true);
}

/* ------------------------------------------------------------- deadlines */

void conn_limit_sweep(srv_conn_limit *cl, double now, bool draining)
{
    pthread_mutex_lock(&cl->lock);
    while (cl->waiting.head && now - cl->waiting.head->since >= cl->header_timeout)
        shed(cl, cl->waiting.head, SHED_HEADER_TIMEOUT);
    while (cl->refused.head && now - cl->refused.head->since >= REFUSED_TIMEOUT)
        shed(cl, cl->refused.head, -1);
    if (draining && cl->drain_began == 0)
        cl->drain_began = now;
    for (srv_connection *cx = cl->reading.head, *next; draining && cx; cx = next) {
        next = cx->next;
        if (now - cx->since >= DRAIN_BODY_STALL_S || now - cl->drain_began >= DRAIN_BODY_GRACE_S)
            shed(cl, cx, SHED_DRAIN);
    }
    pthread_mutex_unlock(&cl->lock);
}

/* ----------------------------------------------------- clients gone away */

/* A client that has closed (or only shut down its sending side, as nginx
 * also counts it) or reset its connection: the peer's FIN or RST, whatever
 * it sent before. */
static bool hung_up(short revents)
{
    return (revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

bool conn_client_gone(const srv_connection *cx)
{
    struct pollfd p = {.fd = cx->fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) == 1 && hung_up(p.revents);
}

void conn_limit_check_computing(srv_conn_limit *cl,
                                bool (*gone)(srv_connection *cx, void *arg), void *arg)
{
    pthread_mutex_lock(&cl->lock);
    int n = cl->computing.count, k = 0, taken = 0;
    struct pollfd *fds = n ? malloc((size_t)n * sizeof *fds) : NULL;
    srv_connection **who = n ? malloc((size_t)n * sizeof *who) : NULL;
    if (fds && who)
        for (srv_connection *cx = cl->computing.head; cx && k < n; cx = cx->next)
            if (!atomic_load(&cx->request.cancel)) { /* told once is enough */
                fds[k] = (struct pollfd){.fd = cx->fd, .events = POLLRDHUP};
                who[k++] = cx;
            }
    /* The sockets of suspended connections stay open while the lock is held
     * (conn_computed takes it before a connection is resumed). */
    if (k > 0 && poll(fds, (nfds_t)k, 0) > 0)
        for (int i = 0; i < k; i++)
            if (hung_up(fds[i].revents) && gone(who[i], arg)) {
                set_state(cl, who[i], CONN_SERVING);
                who[taken++] = who[i];
            }
    pthread_mutex_unlock(&cl->lock);
    /* Suspended and out of the queue, they are nobody else's to resume. */
    for (int i = 0; i < taken; i++)
        http_resume(&who[i]->request);
    free(fds);
    free(who);
}

/* ------------------------------------------------------------ counters */

int conn_limit_open_now(srv_conn_limit *cl)
{
    pthread_mutex_lock(&cl->lock);
    int n = cl->open;
    pthread_mutex_unlock(&cl->lock);
    return n;
}

int conn_limit_held_now(srv_conn_limit *cl)
{
    pthread_mutex_lock(&cl->lock);
    int n = cl->held;
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
