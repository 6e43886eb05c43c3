/*
 * Walking validated JSON text without building it: the end of a value
 * (codec_skip_value) and the members of an object (codec_members). Both
 * trust the validator for the grammar but still never read past `end`.
 */
#include "codec_internal.h"

#include <stdio.h>
#include <string.h>

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

/* The byte after the array or object that starts at p: brackets counted,
 * strings jumped over. Tensor rows are long runs of digits and commas,
 * passed over 8 bytes at a time. */
static cursor skip_container(cursor p, cursor end)
{
    long depth = 0;
    while (p < end) {
#if defined(__SSE2__)
        /* 16 bytes a step: '"' and, as bytes | 0x20, '{' for '[' and '{',
         * '}' for ']' and '}' */
        if (end - p >= 16) {
            __m128i x = _mm_loadu_si128((const __m128i *)(const void *)p);
            __m128i lower = _mm_or_si128(x, _mm_set1_epi8(0x20));
            __m128i hit = _mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8('"')),
                                       _mm_or_si128(_mm_cmpeq_epi8(lower, _mm_set1_epi8('{')),
                                                    _mm_cmpeq_epi8(lower, _mm_set1_epi8('}'))));
            unsigned mask = (unsigned)_mm_movemask_epi8(hit);
            if (!mask) {
                p += 16;
                continue;
            }
            p += __builtin_ctz(mask);
        }
#endif
        if (end - p >= 8 && !may_be_structural(codec_load8(p))) {
            p += 8;
            continue;
        }
        char c = *p;
        if (c == '"') {
            p = skip_string(p, end);
            continue;
        }
        if (c == '[' || c == '{')
            depth++;
        else if ((c == ']' || c == '}') && --depth == 0)
            return p + 1;
        p++;
    }
    return end;
}

const char *codec_skip_value(const char *p, const char *end)
{
    p = codec_skip_ws(p, end);
    if (p == end)
        return end;
    if (*p == '"')
        return skip_string(p, end);
    if (*p == '[' || *p == '{')
        return skip_container(p, end);
    /* a number or a literal: runs to the next delimiter */
    while (p < end && *p != ',' && *p != ']' && *p != '}' && *p != ' ' && *p != '\n' &&
           *p != '\r' && *p != '\t')
        p++;
    return p;
}

/* ------------------------------------------------------------- objects */

/* Is the key of member n (its text at key_text) the key of an earlier one?
 * Keys that did not fit (or hold a NUL) are compared through their text. */
static bool seen_before(const codec_member *m, size_t n, cursor key_text, cursor end)
{
    bool whole = !m[n].key_too_long;
    for (size_t i = 0; i < n; i++) {
        if (whole && !m[i].key_too_long) {
            if (strcmp(m[i].key, m[n].key) == 0)
                return true;
        } else if (whole == !m[i].key_too_long &&
                   codec_string_equal(m[i].key_text, key_text, end))
            return true;
    }
    return false;
}

/* Reads the key at p (its opening quote) into m; returns the byte after it. */
static cursor read_key(cursor p, cursor end, codec_member *m)
{
    cursor after;
    m->key_text = p;
    size_t klen = codec_string_decode(p, end, m->key, sizeof m->key - 1, &after);
    bool whole = klen < sizeof m->key && memchr(m->key, '\0', klen) == NULL;
    m->key[klen < sizeof m->key ? klen : sizeof m->key - 1] = '\0';
    m->key_too_long = !whole;
    return after;
}

/* How messages name the object `where`: the top level is the body. */
static const char *object_name(const char *where)
{
    return where[0] ? where : "the request body";
}

static bool too_many(cursor text, cursor at, size_t max, const char *where, codec_error *err)
{
    return codec_fail(err, CODEC_ERR_TOO_MANY_MEMBERS, where, text, at,
                      "%s has more than %zu fields", object_name(where), max);
}

/* Member n of out (its key read) must not repeat an earlier one. */
static bool check_new(cursor text, codec_member *out, size_t n, cursor end, const char *where,
                      codec_error *err)
{
    codec_member *m = &out[n];
    if (!seen_before(out, n, m->key_text, end))
        return true;
    char field[sizeof err->field], shown[80];
    /* "q.shape", cut to what err->field holds */
    int w = snprintf(field, sizeof field, "%s%s%s", where, where[0] ? "." : "", m->key);
    if (w < 0)
        field[0] = '\0';
    return codec_fail(err, CODEC_ERR_DUPLICATE_KEY, field, text, m->key_text,
                      "the key \"%s\" appears twice in %s",
                      codec_member_key_shown(m, shown, sizeof shown), object_name(where));
}

bool codec_members_at(cursor text, cursor start, cursor end, codec_member *out, size_t max,
                      size_t *count, const char *where, codec_error *err)
{
    cursor p = codec_skip_ws(start, end);
    *count = 0;
    if (p == end || *p != '{') {
        if (where[0])
            return codec_fail(err, CODEC_ERR_WRONG_TYPE, where, text, p,
                              "%s must be a JSON object", where);
        return codec_fail(err, CODEC_ERR_WRONG_TYPE, "", text, p,
                          "the request body must be a JSON object");
    }
    p = codec_skip_ws(p + 1, end);
    size_t n = 0;
    while (p < end && *p == '"') {
        if (n == max)
            return too_many(text, p, max, where, err);
        codec_member *m = &out[n];
        p = codec_skip_ws(read_key(p, end, m), end);
        if (p < end && *p == ':')
            p = codec_skip_ws(p + 1, end);
        m->value = p;
        m->value_end = codec_skip_value(p, end);
        if (!check_new(text, out, n, end, where, err))
            return false;
        *count = ++n;
        p = codec_skip_ws(m->value_end, end);
        if (p == end || *p != ',')
            break;
        p = codec_skip_ws(p + 1, end);
    }
    return true;
}

bool codec_members(const char *p, const char *end, codec_member *out, size_t max,
                   size_t *count, const char *where, codec_error *err)
{
    return codec_members_at(p, p, end, out, max, count, where, err);
}

bool codec_doc_members(const codec_doc *doc, codec_member *out, size_t max, size_t *count,
                       const char *where, codec_error *err)
{
    *count = 0;
    if (doc->members > doc->cap && max > doc->cap) /* more than were noted */
        return codec_members_at(doc->text, doc->text, doc->end, out, max, count, where, err);
    for (size_t i = 0; i < doc->members; i++) {
        if (i == max)
            return too_many(doc->text, i < doc->cap ? doc->spans[i].key_text : NULL, max,
                            where, err);
        const codec_span *span = &doc->spans[i];
        read_key(span->key_text, doc->end, &out[i]);
        out[i].value = span->value;
        out[i].value_end = span->value_end;
        if (!check_new(doc->text, out, i, doc->end, where, err))
            return false;
        *count = i + 1;
    }
    return true;
}

const char *codec_member_key_shown(const codec_member *m, char *out, size_t cap)
{
    /* the key decoded (its closing quote lies before the value), then
     * escaped; a key longer than the buffer is cut at a character */
    char key[256];
    size_t n = codec_string_decode(m->key_text, m->value, key, sizeof key, NULL);
    bool cut = n > sizeof key;
    if (cut)
        n = codec_utf8_uncut(key, sizeof key);
    size_t need = codec_escape_text(out, cap > 3 ? cap - 3 : cap, key, n, 0);
    if (cut || need >= cap - 3) {
        size_t w = strlen(out);
        memcpy(out + w, "...", 4);
    }
    return out;
}
