/*
 * API keys (--api-key-file): with a key file, every route but /healthz and
 * /readyz (and CORS preflights, which browsers send without credentials)
 * needs `Authorization: Bearer KEY` (RFC 6750), KEY one of the file's lines.
 *
 * The file: one key per line; blank lines and lines starting with '#' are
 * skipped, spaces around a key are not part of it, and a key is 16 to 1024
 * bytes of visible ASCII without spaces (RFC 6750's b64token and more): a
 * shorter one is guessed too easily. It is read at start (attnd does not
 * start without a key) and again on SIGHUP; a reload that fails keeps the
 * keys in force. Keys are never logged, and a presented token is compared
 * with every key in time that does not depend on where they differ or which
 * key matches.
 *
 * The file is read by byte counts, never as C strings, so a NUL byte cannot
 * cut a key short ("k\0ey-very-long-secret" must not make "k" a key): a NUL
 * anywhere refuses the file. It is read within MAX_FILE bytes and
 * READ_SECONDS, whatever it is (a path that never ends, such as /dev/zero,
 * or a pipe nobody writes to), so that a reload on SIGHUP always returns to
 * the main thread, which must go on answering SIGTERM.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define MIN_KEY 16
#define MAX_KEY 1024
#define MAX_KEYS 65536
#define MAX_FILE (4u << 20)
/* The longest a reading may take (a file that is a pipe or a device). */
#define READ_SECONDS 2.0

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

/* The whole file into *text (*len bytes), at most MAX_FILE of them and
 * within READ_SECONDS; false with err filled otherwise. */
static bool read_file(const char *path, char **text, size_t *len, char *err, size_t err_len)
{
    *text = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO without a writer would block. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        snprintf(err, err_len, "cannot read the API key file %s: %s", path, strerror(errno));
        return false;
    }
    char *buf = malloc(MAX_FILE + 1);
    size_t got = 0;
    const char *why = NULL;
    double end = srv_now() + READ_SECONDS;
    while (buf && !why) {
        ssize_t n = read(fd, buf + got, MAX_FILE + 1 - got);
        if (n > 0) {
            got += (size_t)n;
            if (got > MAX_FILE)
                why = "is larger than 4 MiB";
        } else if (n == 0) {
            break;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            /* A pipe or a device with nothing yet: wait for it, not for ever. */
            double left = end - srv_now();
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) == 0)
                why = "did not end within 2 s (a pipe or a device, not a file?)";
        } else if (errno != EINTR) {
            snprintf(err, err_len, "cannot read the API key file %s: %s", path,
                     strerror(errno));
            close(fd);
            free(buf);
            return false;
        }
        if (!why && srv_now() > end)
            why = "did not end within 2 s (a pipe or a device, not a file?)";
    }
    close(fd);
    if (!buf || why) {
        if (buf) {
            explicit_bzero(buf, got);
            free(buf);
        }
        snprintf(err, err_len, "the API key file %s %s", path, why ? why : "cannot be "
                 "read: out of memory");
        return false;
    }
    *text = buf;
    *len = got;
    return true;
}

/* Adds text[0..n) as a key (it is checked); false when out of memory. */
static bool add_key(srv_key_set *set, int *cap, const char *text, size_t n)
{
    if (set->count == *cap) {
        int grown = *cap ? 2 * *cap : 8;
        char **keys = realloc(set->keys, (size_t)grown * sizeof *keys);
        if (!keys)
            return false;
        set->keys = keys;
        size_t *lengths = realloc(set->lengths, (size_t)grown * sizeof *lengths);
        if (!lengths)
            return false;
        set->lengths = lengths;
        *cap = grown;
    }
    char *key = malloc(n);
    if (!key)
        return false;
    memcpy(key, text, n);
    set->keys[set->count] = key;
    set->lengths[set->count] = n;
    set->count++;
    return true;
}

/* The keys of text[0..len); NULL with err filled when the file cannot be
 * used (err never holds a key). */
static srv_key_set *parse_keys(const char *path, const char *text, size_t len, char *err,
                               size_t err_len)
{
    const char *nul = memchr(text, '\0', len);
    if (nul) {
        int line = 1;
        for (const char *p = text; p < nul; p++)
            line += *p == '\n';
        snprintf(err, err_len, "%s, line %d: a NUL byte; a key file is text", path, line);
        return NULL;
    }
    srv_key_set *set = calloc(1, sizeof *set);
    if (!set) {
        snprintf(err, err_len, "out of memory reading %s", path);
        return NULL;
    }
    int cap = 0, number = 0;
    for (size_t at = 0; at < len;) {
        const char *line = text + at;
        const char *eol = memchr(line, '\n', len - at);
        size_t n = eol ? (size_t)(eol - line) : len - at;
        at += n + (eol != NULL);
        number++;
        size_t start = 0;
        while (start < n && (line[start] == ' ' || line[start] == '\t'))
            start++;
        while (n > start && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
            n--;
        if (start == n || line[start] == '#')
            continue;
        const char *key = line + start;
        size_t key_len = n - start;
        const char *problem = NULL;
        for (size_t i = 0; i < key_len && !problem; i++)
            if (!key_char((unsigned char)key[i]))
                problem = "a key is visible ASCII without spaces";
        if (!problem && key_len < MIN_KEY)
            problem = "a key is at least 16 bytes long (make one with: head -c 32 "
                      "/dev/urandom | base64)";
        if (!problem && key_len > MAX_KEY)
            problem = "a key is at most 1024 bytes long";
        if (!problem && set->count == MAX_KEYS)
            problem = "more than 65536 keys";
        if (problem) {
            snprintf(err, err_len, "%s, line %d: %s", path, number, problem);
            key_set_free(set);
            return NULL;
        }
        if (!add_key(set, &cap, key, key_len)) {
            snprintf(err, err_len, "out of memory reading %s", path);
            key_set_free(set);
            return NULL;
        }
    }
    if (set->count == 0) {
        snprintf(err, err_len, "the API key file %s holds no key", path);
        key_set_free(set);
        return NULL;
    }
    return set;
}

/* Reads the key file into a new set; NULL with err filled on failure. */
static srv_key_set *read_keys(const char *path, char *err, size_t err_len)
{
    char *text;
    size_t len;
    if (!read_file(path, &text, &len, err, err_len))
        return NULL;
    srv_key_set *set = parse_keys(path, text, len, err, err_len);
    explicit_bzero(text, len);
    free(text);
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

srv_auth_result auth_check(srv_auth *a, const char *authorization)
{
    if (!auth_required(a))
        return AUTH_OK;
    if (!authorization)
        return AUTH_MISSING;
    /* RFC 7235: the scheme is case-insensitive, then one or more spaces. */
    const char *p = authorization;
    while (*p == ' ' || *p == '\t')
        p++;
    if (strncasecmp(p, "Bearer", 6) != 0 || (p[6] != ' ' && p[6] != '\t'))
        return AUTH_MISSING;
    p += 6;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t n = strlen(p);
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
        n--;
    if (n == 0 || n > MAX_KEY)
        return AUTH_INVALID;
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

void auth_free(srv_auth *a)
{
    key_set_free(a->keys);
    a->keys = NULL;
    pthread_rwlock_destroy(&a->lock);
}
