/*
 * API keys (--api-key-file): with a key file, every route but /healthz and
 * /readyz (and CORS preflights, which browsers send without credentials)
 * needs `Authorization: Bearer KEY` (RFC 6750), KEY one of the file's lines.
 *
 * The file: one key per line; blank lines and lines starting with '#' are
 * skipped, spaces around a key are not part of it, and a key is visible
 * ASCII without spaces (RFC 6750's b64token and more). It is read at start
 * (attnd does not start without a key) and again on SIGHUP; a reload that
 * fails keeps the keys in force. Keys are never logged, and a presented
 * token is compared with every key in time that does not depend on where
 * they differ or which key matches.
 */
#include "server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_KEY 1024
#define MAX_KEYS 65536
#define MAX_FILE (4u << 20)

struct srv_key_set {
    int count;
    char **keys;
    size_t *lengths;
};

static void key_set_free(srv_key_set *set)
{
    if (!set)
        return;
    for (int i = 0; i < set->count; i++) {
        /* explicit_bzero: the compiler may not drop it as a dead store */
        explicit_bzero(set->keys[i], set->lengths[i]);
        free(set->keys[i]);
    }
    free(set->keys);
    free(set->lengths);
    free(set);
}

static bool key_char(unsigned char c)
{
    return c > 0x20 && c < 0x7f;
}

/* Reads the key file into a new set; NULL with err filled on failure. */
static srv_key_set *read_keys(const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, err_len, "cannot read the API key file %s: %s", path, strerror(errno));
        return NULL;
    }
    srv_key_set *set = calloc(1, sizeof *set);
    char *line = malloc(MAX_KEY + 3);
    bool ok = set && line;
    int cap = 0, number = 0;
    size_t total = 0;
    if (!ok)
        snprintf(err, err_len, "out of memory reading %s", path);
    while (ok && fgets(line, MAX_KEY + 3, f)) {
        number++;
        size_t n = strlen(line);
        total += n;
        if (n == MAX_KEY + 2 && line[n - 1] != '\n') {
            ok = false;
            snprintf(err, err_len, "%s, line %d: a key is longer than %d bytes", path, number,
                     MAX_KEY);
            break;
        }
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ' ||
                     line[n - 1] == '\t'))
            line[--n] = '\0';
        size_t start = 0;
        while (start < n && (line[start] == ' ' || line[start] == '\t'))
            start++;
        if (start == n || line[start] == '#')
            continue;
        for (size_t i = start; i < n; i++)
            if (!key_char((unsigned char)line[i])) {
                ok = false;
                snprintf(err, err_len,
                         "%s, line %d: a key is visible ASCII without spaces (byte %zu is not)",
                         path, number, i + 1);
                break;
            }
        if (!ok)
            break;
        if (set->count == MAX_KEYS || total > MAX_FILE) {
            ok = false;
            snprintf(err, err_len, "%s: more than %d keys or %u bytes", path, MAX_KEYS,
                     MAX_FILE);
            break;
        }
        if (set->count == cap) {
            cap = cap ? 2 * cap : 8;
            char **keys = realloc(set->keys, (size_t)cap * sizeof *keys);
            if (keys)
                set->keys = keys;
            size_t *lengths = keys ? realloc(set->lengths, (size_t)cap * sizeof *lengths) : NULL;
            if (lengths)
                set->lengths = lengths;
            if (!keys || !lengths) {
                ok = false;
                snprintf(err, err_len, "out of memory reading %s", path);
                break;
            }
        }
        set->keys[set->count] = strndup(line + start, n - start);
        set->lengths[set->count] = n - start;
        if (!set->keys[set->count]) {
            ok = false;
            snprintf(err, err_len, "out of memory reading %s", path);
            break;
        }
        set->count++;
    }
    if (ok && ferror(f)) {
        ok = false;
        snprintf(err, err_len, "cannot read the API key file %s: %s", path, strerror(errno));
    }
    if (ok && set->count == 0) {
        ok = false;
        snprintf(err, err_len, "the API key file %s holds no key", path);
    }
    fclose(f);
    if (line) {
        explicit_bzero(line, MAX_KEY + 3);
        free(line);
    }
    if (!ok) {
        key_set_free(set);
        return NULL;
    }
    return set;
}

bool auth_init(srv_auth *a, const attnd_config *cfg, char *err, size_t err_len)
{
    a->path = cfg->api_key_file;
    a->keys = NULL;
    pthread_rwlock_init(&a->lock, NULL);
    if (!a->path[0])
        return true;
    a->keys = read_keys(a->path, err, err_len);
    return a->keys != NULL;
}

int auth_reload(srv_auth *a, char *err, size_t err_len)
{
    if (!a->path[0]) {
        snprintf(err, err_len, "no --api-key-file to read");
        return -1;
    }
    srv_key_set *fresh = read_keys(a->path, err, err_len);
    if (!fresh)
        return -1;
    pthread_rwlock_wrlock(&a->lock);
    srv_key_set *old = a->keys;
    a->keys = fresh;
    pthread_rwlock_unlock(&a->lock);
    key_set_free(old);
    return fresh->count;
}

bool auth_required(const srv_auth *a)
{
    return a->path[0] != '\0';
}

/* Whether token[0..n) equals key[0..m), in time that depends only on n and
 * m: every byte is looked at, and the lengths are folded in. */
static bool same_key(const unsigned char *token, size_t n, const unsigned char *key, size_t m)
{
    volatile unsigned char diff = (unsigned char)(n != m);
    size_t longer = n > m ? n : m;
    for (size_t i = 0; i < longer; i++)
        diff |= (unsigned char)((i < n ? token[i] : 0) ^ (i < m ? key[i] : 0));
    return diff == 0;
}

/* The token of "Bearer TOKEN" (RFC 7235: the scheme is case-insensitive,
 * then one or more spaces) at *token, *n bytes; AUTH_MISSING without one. */
static srv_auth_result bearer_token(const char *authorization, const char **token, size_t *n)
{
    if (!authorization)
        return AUTH_MISSING;
    const char *p = authorization;
    while (*p == ' ' || *p == '\t')
        p++;
    if (strncasecmp(p, "Bearer", 6) != 0 || (p[6] != ' ' && p[6] != '\t'))
        return AUTH_MISSING;
    p += 6;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t len = strlen(p);
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
        len--;
    if (len == 0 || len > MAX_KEY)
        return AUTH_INVALID;
    *token = p;
    *n = len;
    return AUTH_OK;
}

srv_auth_result auth_check(srv_auth *a, const char *authorization)
{
    if (!auth_required(a))
        return AUTH_OK;
    const char *p = NULL;
    size_t n = 0;
    srv_auth_result parsed = bearer_token(authorization, &p, &n);
    if (parsed != AUTH_OK)
        return parsed;
    bool found = false;
    pthread_rwlock_rdlock(&a->lock);
    const srv_key_set *set = a->keys;
    /* every key is compared: which one matches takes no less time */
    for (int i = 0; set && i < set->count; i++)
        found |= same_key((const unsigned char *)p, n, (const unsigned char *)set->keys[i],
                          set->lengths[i]);
    pthread_rwlock_unlock(&a->lock);
    return found ? AUTH_OK : AUTH_INVALID;
}

bool auth_key_of(const srv_auth *a, const char *authorization, char *key, size_t cap)
{
    const char *p = NULL;
    size_t n = 0;
    if (!auth_required(a) || bearer_token(authorization, &p, &n) != AUTH_OK || n + 1 > cap)
        return false;
    memcpy(key, p, n);
    key[n] = '\0';
    return true;
}

void auth_free(srv_auth *a)
{
    key_set_free(a->keys);
    a->keys = NULL;
    pthread_rwlock_destroy(&a->lock);
}
