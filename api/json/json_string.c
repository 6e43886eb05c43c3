/*
 * JSON strings: the UTF-8 check and the escaper of codec.h, and the
 * decoder that reads a string of validated text back (escapes resolved).
 */
#include "codec_internal.h"

/* ------------------------------------------------------------------ UTF-8 */

size_t codec_utf8_sequence(const unsigned char *s, size_t avail)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    /* the second byte's range depends on the lead byte: that is where
     * overlong forms, surrogates and code points past U+10FFFF are shut out */
    unsigned lo = 0x80, hi = 0xbf;
    size_t n;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else
        return 0;
    if (avail < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return n;
}

bool codec_utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        if (*p < 0x80) {
            p++;
            continue;
        }
        size_t k = codec_utf8_sequence(p, (size_t)(end - p));
        if (!k)
            return false;
        p += k;
    }
    return true;
}

size_t codec_utf8_uncut(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    /* the last lead byte is within the last 3 bytes if a sequence is cut */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned c = u[n - back];
        if ((c & 0xc0) == 0x80)
            continue; /* a continuation byte: look further back */
        size_t want = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        return want > back ? n - back : n;
    }
    return n;
}

/* ---------------------------------------------------------------- escaping */

static const char hex_digits[16] = "0123456789abcdef";

/* \uXXXX for one UTF-16 unit at w; returns the end. */
static char *put_u(char *w, unsigned u)
{
    w[0] = '\\';
    w[1] = 'u';
    w[2] = hex_digits[u >> 12 & 15];
    w[3] = hex_digits[u >> 8 & 15];
    w[4] = hex_digits[u >> 4 & 15];
    w[5] = hex_digits[u & 15];
    return w + 6;
}

/* The escape of an ASCII byte that cannot stand as it is. */
static char *put_ascii_escape(char *w, unsigned c)
{
    static const char short_form[0x20] = {['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n',
                                          ['\r'] = 'r', ['\t'] = 't'};
    if (c == '"' || c == '\\') {
        w[0] = '\\';
        w[1] = (char)c;
        return w + 2;
    }
    if (c < 0x20 && short_form[c]) {
        w[0] = '\\';
        w[1] = short_form[c];
        return w + 2;
    }
    return put_u(w, c);
}

/* The code point of the well-formed sequence s[0..n), n >= 2. */
static unsigned code_point(const unsigned char *s, size_t n)
{
    unsigned cp = s[0] & (0x7fu >> n);
    for (size_t i = 1; i < n; i++)
        cp = cp << 6 | (s[i] & 0x3fu);
    return cp;
}

/* The text of the non-ASCII character (or stray byte) at p; *used is how
 * many bytes of input it took. */
static char *put_non_ascii(char *w, const unsigned char *p, size_t avail, unsigned flags,
                           size_t *used)
{
    size_t n = codec_utf8_sequence(p, avail);
    unsigned cp = n ? code_point(p, n) : 0xfffd;
    *used = n ? n : 1;
    if (!(flags & CODEC_ESCAPE_ASCII) && cp != 0x2028 && cp != 0x2029) {
        if (n) {
            memcpy(w, p, n);
            return w + n;
        }
        memcpy(w, "\xef\xbf\xbd", 3); /* U+FFFD in UTF-8 */
        return w + 3;
    }
    if (cp < 0x10000)
        return put_u(w, cp);
    cp -= 0x10000;
    w = put_u(w, 0xd800 + (cp >> 10));
    return put_u(w, 0xdc00 + (cp & 0x3ff));
}

/* Bytes that stand for themselves inside a JSON string. */
static inline bool plain_byte(unsigned c)
{
    return c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
}

size_t codec_escape_text(char *out, size_t cap, const char *s, size_t n, unsigned flags)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    size_t need = 0, wrote = 0, room = cap ? cap - 1 : 0;
    bool cut = false;
    while (p < end) {
        /* a run of plain bytes in one copy */
        const unsigned char *run = p;
        while (p < end && plain_byte(*p))
            p++;
        size_t k = (size_t)(p - run);
        if (k) {
            if (!cut && wrote + k <= room) {
                memcpy(out + wrote, run, k);
                wrote += k;
            } else if (!cut) {
                memcpy(out + wrote, run, room - wrote); /* ASCII: cut anywhere */
                wrote = room;
                cut = true;
            }
            need += k;
            if (p == end)
                break;
        }
        char piece[12];
        size_t used = 1;
        char *e = *p < 0x80 ? put_ascii_escape(piece, *p)
                            : put_non_ascii(piece, p, (size_t)(end - p), flags, &used);
        p += used;
        k = (size_t)(e - piece);
        if (!cut && wrote + k <= room) {
            memcpy(out + wrote, piece, k);
            wrote += k;
        } else
            cut = true;
        need += k;
    }
    if (cap)
        out[wrote] = '\0';
    return need;
}

/* --------------------------------------------------------------- decoding */

/* Walks the decoded bytes of a JSON string: escapes resolved, \u surrogate
 * pairs joined, code points written as UTF-8. */
typedef struct {
    cursor p, end;
    unsigned char pending[4];
    int n_pending, next_pending;
} string_iter;

static void iter_start(string_iter *it, const char *quote, const char *end)
{
    it->p = quote + 1;
    it->end = end;
    it->n_pending = it->next_pending = 0;
}

static void iter_pend_utf8(string_iter *it, unsigned long u)
{
    unsigned char *b = it->pending;
    if (u < 0x80) {
        b[0] = (unsigned char)u;
        it->n_pending = 1;
    } else if (u < 0x800) {
        b[0] = (unsigned char)(0xc0 | u >> 6);
        b[1] = (unsigned char)(0x80 | (u & 0x3f));
        it->n_pending = 2;
    } else if (u < 0x10000) {
        b[0] = (unsigned char)(0xe0 | u >> 12);
        b[1] = (unsigned char)(0x80 | (u >> 6 & 0x3f));
        b[2] = (unsigned char)(0x80 | (u & 0x3f));
        it->n_pending = 3;
    } else {
        b[0] = (unsigned char)(0xf0 | u >> 18);
        b[1] = (unsigned char)(0x80 | (u >> 12 & 0x3f));
        b[2] = (unsigned char)(0x80 | (u >> 6 & 0x3f));
        b[3] = (unsigned char)(0x80 | (u & 0x3f));
        it->n_pending = 4;
    }
    it->next_pending = 0;
}

/* The next decoded byte, or -1 at the closing quote (or the end). */
static int iter_next(string_iter *it)
{
    if (it->next_pending < it->n_pending)
        return it->pending[it->next_pending++];
    cursor p = it->p, end = it->end;
    if (p >= end || *p == '"')
        return -1;
    if (*p != '\\' || end - p < 2) {
        it->p = p + 1;
        return (unsigned char)*p;
    }
    unsigned char e = (unsigned char)p[1];
    it->p = p + 2;
    switch (e) {
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'u': break;
    default: return e; /* '"', '\\', '/' */
    }
    long u = codec_hex4(p + 2, end);
    if (u < 0) /* only in text that did not pass the validator */
        return 'u';
    it->p = p + 6;
    if (u >= 0xd800 && u <= 0xdbff && end - it->p >= 6 && it->p[0] == '\\' && it->p[1] == 'u') {
        long lo = codec_hex4(it->p + 2, end);
        if (lo >= 0xdc00 && lo <= 0xdfff) {
            u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
            it->p += 6;
        }
    }
    iter_pend_utf8(it, (unsigned long)u);
    return it->pending[it->next_pending++];
}

/* The byte after the closing quote. */
static const char *iter_after(const string_iter *it)
{
    return it->p < it->end ? it->p + 1 : it->end;
}

size_t codec_string_decode(const char *start, const char *end, char *out,
                           size_t cap, const char **after)
{
    cursor p = start + 1;
    /* the common case: no escapes */
    cursor q = p;
    while (q < end && *q != '"' && *q != '\\')
        q++;
    if (q == end || *q == '"') {
        size_t n = (size_t)(q - p);
        if (n && cap)
            memcpy(out, p, n < cap ? n : cap);
        if (after)
            *after = q < end ? q + 1 : end;
        return n;
    }
    string_iter it;
    iter_start(&it, start, end);
    size_t n = 0;
    for (int c; (c = iter_next(&it)) >= 0; n++)
        if (n < cap)
            out[n] = (char)c;
    if (after)
        *after = iter_after(&it);
    return n;
}

bool codec_string_equal(const char *a, const char *b, const char *end)
{
    string_iter ia, ib;
    iter_start(&ia, a, end);
    iter_start(&ib, b, end);
    for (;;) {
        int ca = iter_next(&ia), cb = iter_next(&ib);
        if (ca != cb)
            return false;
        if (ca < 0)
            return true;
    }
}
