/*
 * Strict JSON text (RFC 8259): the validator every body goes through once,
 * a skipper and an object walker for text that passed it.
 *
 * The validator is a loop over an explicit stack, not a recursive descent:
 * nesting is bounded by API_MAX_DEPTH, and a body of 100000 '[' is refused
 * at depth 65 without touching the C stack. The container kinds of the open
 * levels fit in one 64-bit word (bit d set: level d is an object).
 *
 * Bodies are not NUL-terminated: every read is guarded by `end`.
 */
#include "codec_internal.h"

#include <stdio.h>
#include <string.h>

_Static_assert(API_MAX_DEPTH <= 64, "the open containers must fit in a uint64_t");

typedef const unsigned char *cursor;

static inline cursor skip_ws(cursor p, cursor end)
{
    /* most calls find a value byte straight away: one compare for those */
    while (p < end && (unsigned char)*p <= ' ' &&
           (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

static inline bool is_digit(unsigned char c)
{
    return (unsigned char)(c - '0') < 10;
}

static int hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* The 4 hex digits after "\u" at p, or -1. */
static long hex4(cursor p, cursor end)
{
    if (end - p < 4)
        return -1;
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value(p[i]);
        if (h < 0)
            return -1;
        v = v << 4 | h;
    }
    return v;
}

/* Bytes that end a run of plain string characters: '"', '\\', control
 * characters and the start of a multi-byte UTF-8 sequence. */
static const bool string_special[256] = {
    [0x00 ... 0x1f] = true, ['"'] = true, ['\\'] = true, [0x80 ... 0xff] = true,
};

/* Could one of these 8 bytes be special in a string? Exact when the answer
 * is no: a control character (< 0x20), '"', '\\' or a byte >= 0x80. */
static inline bool string_special8(uint64_t x)
{
    const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
    uint64_t quote = x ^ 0x2222222222222222u, slash = x ^ 0x5c5c5c5c5c5c5c5cu;
    /* per byte: b - 0x20, quote - 1 and slash - 1 set the high bit for a
     * control character, '"' and '\\' (and only for bytes >= 0x80
     * besides, which x flags anyway); a borrow only starts at such a byte,
     * so the lowest special byte is always seen */
    return ((x - 0x2020202020202020u) | (quote - ones) | (slash - ones) | x) & highs;
}

/* Length of the well-formed UTF-8 sequence starting at p (lead byte >=
 * 0x80), or 0: Unicode 15 table 3-7, which excludes overlong forms,
 * surrogates (ED A0..BF) and code points above U+10FFFF. */
static int utf8_length(cursor p, cursor end)
{
    unsigned c = p[0];
    long avail = end - p;
    unsigned lo = 0x80, hi = 0xbf;
    int n;
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
    if (avail < n)
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (int i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xbf)
            return 0;
    return n;
}

/* What went wrong and where, for the error message. */
typedef struct {
    const char *what;
    cursor at;
} failure;

/* Checks the string whose opening quote is at p; returns the byte after the
 * closing quote, or NULL with *f filled. */
static cursor check_string(cursor p, cursor end, failure *f)
{
    p++;
    for (;;) {
        /* long strings (base64 tensors) go 8 bytes at a time */
        while (end - p >= 8 && !string_special8(api_load8((const char *)p)))
            p += 8;
        while (p < end && !string_special[*p])
            p++;
        if (p == end) {
            f->what = "unterminated string";
            f->at = p;
            return NULL;
        }
        unsigned c = *p;
        if (c == '"')
            return p + 1;
        if (c < 0x20) {
            f->what = "control character in a string (escape it)";
            f->at = p;
            return NULL;
        }
        if (c >= 0x80) {
            int n = utf8_length(p, end);
            if (!n) {
                f->what = "invalid UTF-8";
                f->at = p;
                return NULL;
            }
            p += n;
            continue;
        }
        /* backslash */
        if (end - p < 2) {
            f->what = "unterminated string";
            f->at = end;
            return NULL;
        }
        switch (p[1]) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
            p += 2;
            continue;
        case 'u':
            break;
        default:
            f->what = "invalid escape";
            f->at = p;
            return NULL;
        }
        long u = hex4(p + 2, end);
        if (u < 0) {
            f->what = "\\u needs 4 hex digits";
            f->at = p;
            return NULL;
        }
        if (u >= 0xdc00 && u <= 0xdfff) {
            f->what = "lone low surrogate escape";
            f->at = p;
            return NULL;
        }
        if (u >= 0xd800 && u <= 0xdbff) {
            long lo = -1;
            if (end - p >= 12 && p[6] == '\\' && p[7] == 'u')
                lo = hex4(p + 8, end);
            if (lo < 0xdc00 || lo > 0xdfff) {
                f->what = "high surrogate escape without a low one";
                f->at = p;
                return NULL;
            }
            p += 12;
        } else
            p += 6;
    }
}

/* Checks the number at p (at '-' or a digit); NULL with *f on failure. */
__attribute__((always_inline)) static inline cursor check_number(cursor p, cursor end,
                                                                 failure *f)
{
    cursor start = p;
    if (*p == '-')
        p++;
    if (p == end || !is_digit(*p)) {
        f->what = "invalid number";
        f->at = start;
        return NULL;
    }
    if (*p == '0') {
        p++;
        /* a leading zero is followed by no digit: the caller then sees the
         * digit where a ',' or the end belongs */
    } else {
        while (end - p >= 8 && api_all_digits8(api_load8((const char *)p)))
            p += 8;
        while (p < end && is_digit(*p))
            p++;
    }
    if (p < end && *p == '.') {
        p++;
        if (p == end || !is_digit(*p)) {
            f->what = "invalid number (digits must follow '.')";
            f->at = start;
            return NULL;
        }
        /* fractions carry most digits: a run of up to 8 per step, so that
         * the end of the run costs no mispredicted loop exit */
        for (;;) {
            if (end - p < 8) {
                while (p < end && is_digit(*p))
                    p++;
                break;
            }
            int run = api_leading_digits8(api_load8((const char *)p));
            p += run;
            if (run < 8)
                break;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p == end || !is_digit(*p)) {
            f->what = "invalid number (digits must follow the exponent)";
            f->at = start;
            return NULL;
        }
        while (p < end && is_digit(*p))
            p++;
    }
    return p;
}

static cursor check_literal(cursor p, cursor end, const char *word, failure *f)
{
    size_t n = strlen(word);
    if ((size_t)(end - p) < n || memcmp(p, word, n) != 0) {
        f->what = "invalid literal (expected a value)";
        f->at = p;
        return NULL;
    }
    return p + n;
}

/* Line and column (both from 1) of byte `at`, for people reading errors. */
static void line_column(cursor buf, cursor at, long *line, long *col)
{
    long l = 1;
    cursor line_start = buf;
    for (cursor p = buf; p < at; p++)
        if (*p == '\n') {
            l++;
            line_start = p + 1;
        }
    *line = l;
    *col = (long)(at - line_start) + 1;
}

bool json_text_validate(const char *buf, size_t len, api_error *err)
{
    cursor start = (cursor)buf, p = start, end = start + len;
    uint64_t is_object = 0; /* bit d: the container at depth d+1 */
    int depth = 0;
    failure f = {NULL, NULL};

    p = skip_ws(p, end);
value:
    if (p == end) {
        f.what = len == 0 ? "empty body (expected a JSON value)" : "unexpected end (expected a value)";
        f.at = p;
        goto fail;
    }
    switch (*p) {
    case '{':
    case '[':
        if (depth == API_MAX_DEPTH) {
            f.what = "nesting deeper than 64 levels";
            f.at = p;
            goto fail;
        }
        if (*p == '{')
            is_object |= UINT64_C(1) << depth;
        else
            is_object &= ~(UINT64_C(1) << depth);
        depth++;
        p = skip_ws(p + 1, end);
        if (p < end && *p == (is_object >> (depth - 1) & 1 ? '}' : ']')) {
            p++;
            depth--;
            goto after_value;
        }
        if (is_object >> (depth - 1) & 1)
            goto key;
        goto value;
    case '"':
        p = check_string(p, end, &f);
        break;
    case '-': case '0': case '1': case '2': case '3': case '4':
    case '5': case '6': case '7': case '8': case '9':
        p = check_number(p, end, &f);
        if (!p)
            goto fail;
        if (depth == 0 || is_object >> (depth - 1) & 1)
            goto after_value;
        /* Inside an array, numbers tend to follow numbers (a tensor row):
         * check ", <number>" in a tight loop before the general path. */
        for (;;) {
            p = skip_ws(p, end);
            if (p == end || *p != ',')
                goto after_value;
            p = skip_ws(p + 1, end);
            if (p == end || !(*p == '-' || is_digit(*p)))
                goto value;
            p = check_number(p, end, &f);
            if (!p)
                goto fail;
        }
    case 't':
        p = check_literal(p, end, "true", &f);
        break;
    case 'f':
        p = check_literal(p, end, "false", &f);
        break;
    case 'n':
        p = check_literal(p, end, "null", &f);
        break;
    default:
        f.what = "unexpected character (expected a value)";
        f.at = p;
        goto fail;
    }
    if (!p)
        goto fail;

after_value:
    p = skip_ws(p, end);
    if (depth == 0) {
        if (p == end)
            return true;
        f.what = "unexpected data after the JSON value";
        f.at = p;
        goto fail;
    }
    if (p == end) {
        f.what = "unexpected end (unclosed array or object)";
        f.at = p;
        goto fail;
    }
    if (is_object >> (depth - 1) & 1) {
        if (*p == ',') {
            p = skip_ws(p + 1, end);
            goto key;
        }
        if (*p == '}') {
            p++;
            depth--;
            goto after_value;
        }
        f.what = "expected ',' or '}'";
        f.at = p;
        goto fail;
    }
    if (*p == ',') {
        p = skip_ws(p + 1, end);
        goto value;
    }
    if (*p == ']') {
        p++;
        depth--;
        goto after_value;
    }
    f.what = "expected ',' or ']'";
    f.at = p;
    goto fail;

key:
    if (p == end || *p != '"') {
        f.what = "expected a string key";
        f.at = p;
        goto fail;
    }
    p = check_string(p, end, &f);
    if (!p)
        goto fail;
    p = skip_ws(p, end);
    if (p == end || *p != ':') {
        f.what = "expected ':' after the key";
        f.at = p;
        goto fail;
    }
    p = skip_ws(p + 1, end);
    goto value;

fail: {
    long line, col;
    line_column(start, f.at, &line, &col);
    return api_fail(err, 400, "invalid_json", "",
                    "invalid JSON: %s at byte %ld (line %ld, column %ld)", f.what,
                    (long)(f.at - start), line, col);
}
}

/* ------------------------------------------------------------ skipping */

/* The byte after the string whose opening quote is at p: the next '"'
 * that is not escaped, i.e. not preceded by an odd run of backslashes. */
static cursor skip_string(cursor p, cursor end)
{
    cursor body = p + 1;
    p = body;
    while (p < end) {
        cursor q = memchr(p, '"', (size_t)(end - p));
        if (!q)
            return end;
        size_t slashes = 0;
        while (q - slashes > body && q[-1 - (long)slashes] == '\\')
            slashes++;
        if (slashes % 2 == 0)
            return q + 1;
        p = q + 1;
    }
    return end;
}

/* Could one of these 8 bytes be '"', '[', ']', '{' or '}'? Those four
 * brackets are exactly the bytes equal to 0x59 under mask 0xd9 (along with
 * 'Y', '_', 'y' and DEL, harmless extra hits). */
static inline bool may_be_structural(uint64_t x)
{
    const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
    uint64_t brackets = (x & 0xd9d9d9d9d9d9d9d9u) ^ 0x5959595959595959u;
    uint64_t quotes = x ^ 0x2222222222222222u;
    return (((brackets - ones) & ~brackets) | ((quotes - ones) & ~quotes)) & highs;
}

const char *json_text_skip(const char *start, const char *end_)
{
    cursor p = (cursor)start, end = (cursor)end_;
    p = skip_ws(p, end);
    if (p == end)
        return end_;
    if (*p == '"')
        return (const char *)skip_string(p, end);
    if (*p != '[' && *p != '{') {
        /* a number or a literal: runs to the next delimiter */
        while (p < end && *p != ',' && *p != ']' && *p != '}' && *p != ' ' &&
               *p != '\n' && *p != '\r' && *p != '\t')
            p++;
        return (const char *)p;
    }
    /* A container: count brackets, jumping over strings. Tensor rows are
     * long runs of digits and commas, passed over 8 bytes at a time. */
    long depth = 0;
    while (p < end) {
        if (end - p >= 8 && !may_be_structural(api_load8((const char *)p))) {
            p += 8;
            continue;
        }
        unsigned char c = *p;
        if (c == '"') {
            p = skip_string(p, end);
            continue;
        }
        if (c == '[' || c == '{')
            depth++;
        else if (c == ']' || c == '}') {
            if (--depth == 0)
                return (const char *)p + 1;
        }
        p++;
    }
    return end_;
}

/* ------------------------------------------------------------- strings */

/* Walks the decoded bytes of a JSON string: escapes resolved, \u surrogate
 * pairs joined, code points written as UTF-8. */
typedef struct {
    cursor p, end;
    unsigned char pending[4];
    int n_pending, next_pending;
} string_iter;

static void iter_start(string_iter *it, const char *quote, const char *end)
{
    it->p = (cursor)quote + 1;
    it->end = (cursor)end;
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
        return *p;
    }
    unsigned char e = p[1];
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
    long u = hex4(p + 2, end);
    if (u < 0) /* only in text that did not pass the validator */
        return 'u';
    it->p = p + 6;
    if (u >= 0xd800 && u <= 0xdbff && end - it->p >= 6 && it->p[0] == '\\' && it->p[1] == 'u') {
        long lo = hex4(it->p + 2, end);
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
    return (const char *)(it->p < it->end ? it->p + 1 : it->end);
}

size_t json_string_decode(const char *start, const char *end, char *out,
                          size_t cap, const char **after)
{
    cursor p = (cursor)start + 1, e = (cursor)end;
    /* the common case: no escapes */
    cursor q = p;
    while (q < e && *q != '"' && *q != '\\')
        q++;
    if (q == e || *q == '"') {
        size_t n = (size_t)(q - p);
        if (n && cap)
            memcpy(out, p, n < cap ? n : cap);
        if (after)
            *after = (const char *)(q < e ? q + 1 : e);
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

/* Same decoded contents? For keys that could not be kept whole. */
static bool same_string(const char *a, const char *b, const char *end)
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

/* ------------------------------------------------------------- objects */

static void join_field(char *dst, size_t cap, const char *where, const char *key)
{
    if (where[0])
        snprintf(dst, cap, "%s.%s", where, key);
    else
        snprintf(dst, cap, "%s", key);
}

/* Where the key of member i begins: members are laid out in order, so it
 * is the first '"' after the object's '{' or after member i-1's value. */
static const char *key_start(const json_member *m, size_t i, const char *object,
                             const char *end)
{
    cursor p = i == 0 ? (cursor)object : (cursor)m[i - 1].value_end;
    while (p < (cursor)end && *p != '"')
        p++;
    return (const char *)p;
}

bool json_text_members(const char *start, const char *end_, json_member *out,
                       size_t max, size_t *count, const char *where,
                       api_error *err)
{
    cursor p = skip_ws((cursor)start, (cursor)end_), end = (cursor)end_;
    *count = 0;
    if (p == end || *p != '{') {
        if (where[0])
            return api_fail(err, 400, "wrong_type", where, "%s must be a JSON object", where);
        return api_fail(err, 400, "wrong_type", "", "the request body must be a JSON object");
    }
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}')
        return true;
    /* Keys that do not fit (or hold a NUL) are compared through their text;
     * where each member's key starts is kept only for those. */
    size_t n = 0;
    while (p < end && *p == '"') {
        if (n == max)
            return api_fail(err, 400, "too_many_fields", where, "%s has more than %zu fields",
                            where[0] ? where : "the request body", max);
        json_member *m = &out[n];
        const char *key_text = (const char *)p, *after;
        size_t klen = json_string_decode(key_text, end_, m->key, sizeof m->key - 1, &after);
        bool whole = klen < sizeof m->key && memchr(m->key, '\0', klen) == NULL;
        m->key[klen < sizeof m->key ? klen : sizeof m->key - 1] = '\0';
        m->key_too_long = !whole;
        p = skip_ws((cursor)after, end);
        if (p < end && *p == ':')
            p = skip_ws(p + 1, end);
        m->value = (const char *)p;
        m->value_end = json_text_skip((const char *)p, end_);
        /* duplicates, compared after decoding */
        for (size_t i = 0; i < n; i++) {
            bool dup;
            if (whole && !out[i].key_too_long)
                dup = strcmp(out[i].key, m->key) == 0;
            else if (whole != !out[i].key_too_long)
                dup = false;
            else
                dup = same_string(key_start(out, i, start, end_), key_text, end_);
            if (dup) {
                char field[sizeof err->field];
                join_field(field, sizeof field, where, m->key);
                return api_fail(err, 400, "duplicate_key", field, "the key \"%s\" appears twice in %s",
                                m->key, where[0] ? where : "the request body");
            }
        }
        n++;
        *count = n;
        p = skip_ws((cursor)m->value_end, end);
        if (p < end && *p == ',')
            p = skip_ws(p + 1, end);
        else
            break;
    }
    return true;
}
