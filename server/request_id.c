/*
 * X-Request-ID: every answer names its request, and the access log line
 * says the same name, so that a client's report ("request 3q2+7w... failed")
 * finds its line. A client (or a proxy in front) may choose the id; one
 * that could break a log line or a header is replaced by a fresh one.
 *
 * A fresh id is 96 bits from the kernel's random generator in 16 base64url
 * characters: short, and not guessable from the ids a client has seen (a
 * counter or a seeded generator would be). getrandom(2) is called once per
 * RANDOM_POOL bytes, not once per request: each thread keeps a pool of its
 * own.
 */
#include "server.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define ID_BYTES 12
#define RANDOM_POOL (32 * ID_BYTES)

static _Thread_local unsigned char pool[RANDOM_POOL];
static _Thread_local size_t pool_used = RANDOM_POOL;

/* Where getrandom cannot be had (never on a Linux of this century), ids
 * stay unique, not unguessable: a clock and a counter, mixed. */
static void fallback_fill(unsigned char *p, size_t n)
{
    static _Atomic uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                 (atomic_fetch_add(&counter, 1) * 0x9e3779b97f4a7c15ull);
    for (size_t i = 0; i < n; i++) {
        x ^= x >> 31; /* splitmix64's finaliser, one byte per round */
        x *= 0xbf58476d1ce4e5b9ull;
        x ^= x >> 27;
        p[i] = (unsigned char)(x >> 56);
        x += 0x9e3779b97f4a7c15ull;
    }
}

static void random_bytes(unsigned char *out, size_t n)
{
    if (pool_used + n > RANDOM_POOL) {
        size_t got = 0;
        while (got < RANDOM_POOL) {
            ssize_t k = getrandom(pool + got, RANDOM_POOL - got, 0);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                break;
            got += (size_t)k;
        }
        if (got < RANDOM_POOL)
            fallback_fill(pool + got, RANDOM_POOL - got);
        pool_used = 0;
    }
    memcpy(out, pool + pool_used, n);
    /* Spent bytes are not left behind for a later reader of the pool. */
    memset(pool + pool_used, 0, n);
    pool_used += n;
}

/* Visible ASCII but the two characters a log line or a JSON string would
 * have to escape. */
static bool id_char(unsigned char c)
{
    return c > 0x20 && c < 0x7f && c != '"' && c != '\\';
}

static bool acceptable(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (n == REQUEST_ID_MAX || !id_char((unsigned char)s[n]))
            return false;
    return n > 0;
}

void request_id_set(srv_request *r, const char *given)
{
    if (given && acceptable(given)) {
        strcpy(r->id, given);
        return;
    }
    static const char b64url[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    unsigned char b[ID_BYTES];
    random_bytes(b, sizeof b);
    char *p = r->id;
    for (int i = 0; i < ID_BYTES; i += 3) {
        uint32_t v = (uint32_t)b[i] << 16 | (uint32_t)b[i + 1] << 8 | b[i + 2];
        *p++ = b64url[v >> 18];
        *p++ = b64url[v >> 12 & 63];
        *p++ = b64url[v >> 6 & 63];
        *p++ = b64url[v & 63];
    }
    *p = '\0';
}
