/*
 * Tensors as JSON text, in the three forms of SPEC §3: nested arrays, the
 * flat {"shape", "data"} object and the {"shape", "dtype", "base64"} object.
 *
 * Decoding walks the (validated) text once, reading numbers straight into a
 * growing float32 buffer: no json_t per number, no recursion (the open
 * arrays are a small array of counters), and a tight loop for the innermost
 * rows, where nearly all of the bytes are. Encoding writes straight into the
 * response buffer. Every read is still bounded by `end`, so text that did
 * not pass the validator gives an error or a wrong answer, never a crash.
 */
#include "codec_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef const char *cursor;

static inline cursor skip_ws(cursor p, cursor end)
{
    /* most calls find a value byte straight away: one compare for those */
    while (p < end && (unsigned char)*p <= ' ' &&
           (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

static inline bool starts_number(char c)
{
    return c == '-' || (unsigned char)(c - '0') < 10;
}

static const char *kind_of(char c);

/* What the value at p is, in words ("missing" at the end). */
static const char *kind_at(cursor p, cursor end)
{
    p = skip_ws(p, end);
    return p < end ? kind_of(*p) : "missing";
}

static const char *kind_of(char c)
{
    switch (c) {
    case '"': return "a string";
    case 'n': return "null";
    case 't': case 'f': return "a boolean";
    case '{': return "an object";
    case '[': return "an array";
    default: return starts_number(c) ? "a number" : "something that is not JSON";
    }
}

/* "q.dtype": a field path, cut to fit api_error.field. */
static void join(char *dst, size_t cap, const char *field, const char *key)
{
    size_t a = strnlen(field, cap - 1);
    memcpy(dst, field, a);
    size_t n = a;
    if (n + 1 < cap)
        dst[n++] = '.';
    size_t k = strnlen(key, cap - 1 - n);
    memcpy(dst + n, key, k);
    dst[n + k] = '\0';
}

/* "q[1][3]" for the element at the given indices. */
static void element_name(char *dst, size_t cap, const char *field, const int64_t *idx, int n)
{
    int w = snprintf(dst, cap, "%s", field);
    for (int i = 0; i < n && w >= 0 && (size_t)w < cap; i++)
        w += snprintf(dst + w, cap - (size_t)w, "[%lld]", (long long)idx[i]);
}

static void shape_text(char *dst, size_t cap, const int64_t *shape, int rank)
{
    int w = snprintf(dst, cap, "[");
    for (int i = 0; i < rank && w >= 0 && (size_t)w < cap; i++)
        w += snprintf(dst + w, cap - (size_t)w, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (w >= 0 && (size_t)w < cap)
        snprintf(dst + w, cap - (size_t)w, "]");
}

/* ------------------------------------------------------ the element store */

typedef struct {
    api_dtype dtype;
    bool typed;   /* dtype is known (first element seen, or declared) */
    bool declared; /* by a "dtype" member, which the error then names */
    float *f32;
    uint8_t *b8;
    size_t n, cap;
    size_t hint;  /* a guess at the element count, for the first allocation */
} store;

static bool store_grow(store *s, api_error *err, const char *field)
{
    size_t cap = s->cap ? s->cap * 2 : s->hint > 1024 ? s->hint : 1024;
    size_t size = s->dtype == API_F32 ? sizeof(float) : 1;
    if (cap > SIZE_MAX / size / 2)
        return api_fail(err, 500, "out_of_memory", field, "%s is too large to hold", field);
    void *p = realloc(s->dtype == API_F32 ? (void *)s->f32 : (void *)s->b8, cap * size);
    if (!p)
        return api_fail(err, 500, "out_of_memory", field, "out of memory while reading %s", field);
    if (s->dtype == API_F32)
        s->f32 = p;
    else
        s->b8 = p;
    s->cap = cap;
    return true;
}

static void store_free(store *s)
{
    free(s->f32);
    free(s->b8);
    s->f32 = NULL;
    s->b8 = NULL;
}

/* ------------------------------------------------------- nested arrays */

/*
 * Reads nested arrays at p ('[') into s, checking that they are
 * rectangular. max_depth: API_MAX_RANK for a tensor, 1 for "data" (flat).
 * On success shape[0..*rank) is filled and *after is the byte after the
 * outermost ']'.
 */
static bool read_arrays(cursor p, cursor end, const char *field, bool accept_bool,
                        int max_depth, store *s, int *rank_out, int64_t *shape,
                        cursor *after, api_error *err)
{
    int64_t idx[API_MAX_RANK + 1] = {0}; /* elements so far in each open array */
    int depth = 0, rank = -1;
    char where[96];
    for (int i = 0; i < API_MAX_RANK; i++)
        shape[i] = -1;

open: /* p at '[' */
    if (depth == max_depth) {
        element_name(where, sizeof where, field, idx, depth);
        if (max_depth == 1)
            return api_fail(err, 400, "wrong_type", field,
                            "%s must be a flat array of numbers; %s is an array", field, where);
        return api_fail(err, 422, "invalid_shape", field,
                        "%s has more than %d dimensions", field, API_MAX_RANK);
    }
    if (rank >= 0 && depth >= rank) {
        element_name(where, sizeof where, field, idx, depth);
        return api_fail(err, 422, "ragged_array", field,
                        "%s is ragged: %s is an array where a number belongs", field, where);
    }
    idx[depth++] = 0;
    p = skip_ws(p + 1, end);
    if (p < end && *p == ']')
        goto close;

element:
    if (p == end)
        goto truncated;
    if (*p == '[')
        goto open;
    if (rank < 0)
        rank = depth;
    else if (depth != rank) {
        element_name(where, sizeof where, field, idx, depth);
        return api_fail(err, 422, "ragged_array", field,
                        "%s is ragged: %s is %s where an array belongs", field, where, kind_of(*p));
    }
    if (starts_number(*p)) {
        if (!s->typed) {
            s->dtype = API_F32;
            s->typed = true;
        } else if (s->dtype != API_F32)
            goto mixed;
        /* The innermost row: numbers separated by commas, nearly all of
         * the text, read in one call while the buffer has room. */
        if (s->n == s->cap && !store_grow(s, err, field))
            return false;
        cursor stop, bad;
        size_t got = api_parse_number_row(p, end, s->f32 + s->n, s->cap - s->n, &stop, &bad);
        s->n += got;
        idx[depth - 1] += (int64_t)got;
        if (bad) {
            element_name(where, sizeof where, field, idx, depth);
            int len = (int)(stop - bad) > 40 ? 40 : (int)(stop - bad);
            return api_fail(err, 400, "invalid_number", field,
                            "%s is %.*s, which is not finite as a float32 (|x| < 3.4e38)",
                            where, len, bad);
        }
        p = stop;
        goto after_element;
    }
    if (*p == 't' || *p == 'f') {
        if (!accept_bool) {
            element_name(where, sizeof where, field, idx, depth);
            return api_fail(err, 400, "wrong_type", field,
                            "%s must hold numbers; %s is a boolean", field, where);
        }
        if (!s->typed) {
            s->dtype = API_BOOL;
            s->typed = true;
        } else if (s->dtype != API_BOOL)
            goto mixed;
        bool v = *p == 't';
        size_t n = v ? 4 : 5;
        if ((size_t)(end - p) < n || memcmp(p, v ? "true" : "false", n) != 0)
            goto not_json;
        if (s->n == s->cap && !store_grow(s, err, field))
            return false;
        s->b8[s->n++] = v;
        idx[depth - 1]++;
        p += n;
        goto after_element;
    }
    element_name(where, sizeof where, field, idx, depth);
    return api_fail(err, 400, "wrong_type", field, "%s must hold %s; %s is %s", field,
                    accept_bool ? "numbers or booleans" : "numbers", where, kind_of(*p));

after_element:
    p = skip_ws(p, end);
    if (p == end)
        goto truncated;
    if (*p == ',') {
        p = skip_ws(p + 1, end);
        goto element;
    }
    if (*p != ']')
        goto not_json;

close: /* p at ']' */
    p++;
    {
        int d = depth - 1;
        if (rank < 0) /* an empty innermost array decides the rank */
            rank = depth;
        if (shape[d] < 0)
            shape[d] = idx[d];
        else if (shape[d] != idx[d]) {
            element_name(where, sizeof where, field, idx, d);
            if (d == 1)
                return api_fail(err, 422, "ragged_array", field,
                                "%s is ragged: row %lld has %lld elements, expected %lld", field,
                                (long long)idx[0], (long long)idx[d], (long long)shape[d]);
            return api_fail(err, 422, "ragged_array", field,
                            "%s is ragged: %s has %lld elements, expected %lld", field, where,
                            (long long)idx[d], (long long)shape[d]);
        }
    }
    if (--depth == 0) {
        *rank_out = rank;
        *after = p;
        return true;
    }
    idx[depth - 1]++;
    goto after_element;

mixed:
    element_name(where, sizeof where, field, idx, depth);
    if (s->declared)
        return api_fail(err, 400, "wrong_type", field, "%s is %s but dtype is \"%s\"", where,
                        s->dtype == API_BOOL ? "a number" : "a boolean",
                        s->dtype == API_BOOL ? "bool" : "float32");
    return api_fail(err, 400, "wrong_type", field,
                    "%s mixes numbers and booleans (at %s)", field, where);
truncated:
not_json:
    return api_fail(err, 400, "invalid_json", field, "%s is not valid JSON", field);
}

/* Moves a finished store into t (shrinking an oversized buffer). */
static void store_to_tensor(store *s, int rank, const int64_t *shape, api_tensor *t)
{
    t->dtype = s->dtype;
    t->rank = rank;
    for (int i = 0; i < rank; i++)
        t->shape[i] = shape[i];
    t->count = (int64_t)s->n;
    if (s->n == 0) {
        store_free(s);
        return;
    }
    size_t size = s->dtype == API_F32 ? sizeof(float) : 1;
    if (s->cap - s->n > 4096) {
        void *p = realloc(s->dtype == API_F32 ? (void *)s->f32 : (void *)s->b8, s->n * size);
        if (p) {
            if (s->dtype == API_F32)
                s->f32 = p;
            else
                s->b8 = p;
        }
    }
    t->f32 = s->f32;
    t->b8 = s->b8;
    s->f32 = NULL;
    s->b8 = NULL;
}

static bool decode_nested(cursor p, cursor end, const char *field, bool accept_bool,
                          api_tensor *t, api_error *err)
{
    /* A first guess at the element count from the text saves most of the
     * regrowing: client numbers ("0.123456789, ") take 8 bytes or more. */
    store s = {.hint = (size_t)(end - p) / 8};
    int rank;
    int64_t shape[API_MAX_RANK];
    cursor after;
    if (!read_arrays(p, end, field, accept_bool, API_MAX_RANK, &s, &rank, shape, &after, err)) {
        store_free(&s);
        return false;
    }
    if (!s.typed)
        s.dtype = API_F32;
    store_to_tensor(&s, rank, shape, t);
    return true;
}

/* --------------------------------------------------------- object forms */

/* A JSON number that is a non-negative integer (2.0 and 2e1 count), at
 * most 2^62. Returns 1 for yes, 0 for not an integer / negative / too big,
 * -1 when it is not a number at all. */
static int read_dimension(cursor p, cursor end, int64_t *out, cursor *stop)
{
    if (p == end || !starts_number(*p))
        return -1;
    bool neg = *p == '-';
    if (neg)
        p++;
    /* significant digits D and the power of ten that goes with them */
    char digits[20];
    int nd = 0;
    long exp10 = 0;
    bool too_long = false;
    for (; p < end && (unsigned char)(*p - '0') < 10; p++) {
        if (nd == 0 && *p == '0')
            continue;
        if (nd < 19)
            digits[nd++] = *p;
        else {
            too_long = true;
            exp10++;
        }
    }
    if (p < end && *p == '.') {
        for (p++; p < end && (unsigned char)(*p - '0') < 10; p++) {
            if (nd == 0 && *p == '0') {
                exp10--;
                continue;
            }
            if (nd < 19) {
                digits[nd++] = *p;
                exp10--;
            } else if (*p != '0')
                too_long = true;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        bool eneg = false;
        if (p < end && (*p == '+' || *p == '-'))
            eneg = *p++ == '-';
        long e = 0;
        for (; p < end && (unsigned char)(*p - '0') < 10; p++)
            if (e < 100000)
                e = e * 10 + (*p - '0');
        exp10 += eneg ? -e : e;
    }
    *stop = p;
    while (nd > 0 && digits[nd - 1] == '0') {
        nd--;
        exp10++;
    }
    if (nd == 0) {
        *out = 0;
        return 1;
    }
    if (neg || too_long || exp10 < 0 || nd + exp10 > 18)
        return 0;
    int64_t v = 0;
    for (int i = 0; i < nd; i++)
        v = v * 10 + (digits[i] - '0');
    for (long i = 0; i < exp10; i++)
        v *= 10;
    if (v > ((int64_t)1 << 62))
        return 0;
    *out = v;
    return 1;
}

static bool read_shape(cursor p, cursor end, const char *field, int *rank, int64_t *shape,
                       int64_t *count, api_error *err)
{
    char sub[64];
    join(sub, sizeof sub, field, "shape");
    p = skip_ws(p, end);
    if (p == end || *p != '[')
        return api_fail(err, 400, "wrong_type", sub,
                        "%s must be an array of non-negative integers; it is %s", sub,
                        p == end ? "missing" : kind_of(*p));
    p = skip_ws(p + 1, end);
    int r = 0;
    int64_t total = 1;
    bool overflow = false;
    if (p < end && *p == ']')
        goto done;
    for (;;) {
        int64_t d;
        cursor stop;
        int ok = read_dimension(p, end, &d, &stop);
        if (ok < 0)
            return api_fail(err, 400, "wrong_type", sub,
                            "%s must be an array of non-negative integers; element %d is %s",
                            sub, r, p == end ? "missing" : kind_of(*p));
        if (ok == 0) {
            int len = (int)(stop - p) > 30 ? 30 : (int)(stop - p);
            return api_fail(err, 422, "invalid_shape", sub,
                            "%s[%d] is %.*s; dimensions are non-negative integers", sub, r, len, p);
        }
        if (r == API_MAX_RANK)
            return api_fail(err, 422, "invalid_shape", sub, "%s has more than %d dimensions", sub,
                            API_MAX_RANK);
        shape[r++] = d;
        overflow |= __builtin_mul_overflow(total, d, &total);
        p = skip_ws(stop, end);
        if (p < end && *p == ',') {
            p = skip_ws(p + 1, end);
            continue;
        }
        if (p < end && *p == ']')
            break;
        return api_fail(err, 400, "invalid_json", sub, "%s is not valid JSON", sub);
    }
done:
    /* The product must leave room for 4-byte elements in a size_t and an
     * int64_t: anything near that is refused long before by the body limit
     * and the work limit, but it must not wrap around. */
    if (overflow || total > INT64_MAX / 8) {
        char st[160];
        shape_text(st, sizeof st, shape, r);
        return api_fail(err, 422, "invalid_shape", sub, "%s %s has too many elements", sub, st);
    }
    *rank = r;
    *count = total;
    return true;
}

/* The text of a JSON string value (between the quotes, escapes as written);
 * false when the value is not a string. */
static bool string_span(cursor p, cursor end, cursor *s, cursor *s_end, bool *escaped)
{
    p = skip_ws(p, end);
    if (p == end || *p != '"')
        return false;
    *s = ++p;
    /* the common case, no escapes: the first '"' ends it */
    cursor q = memchr(p, '"', (size_t)(end - p));
    if (!q)
        q = end;
    *escaped = memchr(p, '\\', (size_t)(q - p)) != NULL;
    if (*escaped)
        while (p < end && *p != '"') {
            if (*p == '\\')
                p++;
            p++;
        }
    else
        p = q;
    *s_end = p < end ? p : end;
    return true;
}

static bool decode_base64_form(const json_member *m_b64, const char *field, api_dtype dtype,
                               int rank, const int64_t *shape, int64_t count, api_tensor *t,
                               api_error *err)
{
    char sub[64];
    join(sub, sizeof sub, field, "base64");
    cursor s, s_end;
    bool escaped;
    if (!string_span(m_b64->value, m_b64->value_end, &s, &s_end, &escaped))
        return api_fail(err, 400, "wrong_type", sub, "%s must be a base64 string; it is %s", sub,
                        kind_at(m_b64->value, m_b64->value_end));
    /* Some encoders write '/' as "\/": undo escapes into a copy sized by
     * the text (never by the declared shape). */
    char *copy = NULL;
    if (escaped) {
        cursor q = skip_ws(m_b64->value, m_b64->value_end);
        size_t n = json_string_decode(q, m_b64->value_end, NULL, 0, NULL);
        copy = malloc(n ? n : 1);
        if (!copy)
            return api_fail(err, 500, "out_of_memory", field, "out of memory while reading %s", sub);
        json_string_decode(q, m_b64->value_end, copy, n, NULL);
        s = copy;
        s_end = copy + n;
    }
    size_t len = (size_t)(s_end - s), have;
    size_t elem = dtype == API_F32 ? sizeof(float) : 1;
    size_t need = (size_t)count * elem; /* read_shape bounded count by INT64_MAX / 8 */
    bool ok = false;
    char st[160];
    shape_text(st, sizeof st, shape, rank);
    if (!api_base64_decoded_len(s, len, &have)) {
        api_fail(err, 400, "invalid_base64", sub,
                 "%s is not base64: its length (%zu) is not a multiple of 4 or it has more than "
                 "two '=' (standard alphabet, padded, no whitespace)", sub, len);
        goto out;
    }
    if (have != need) {
        api_fail(err, 422, "shape_mismatch", sub,
                 "%s holds %zu bytes but shape %s of %s needs %zu", sub, have, st,
                 dtype == API_F32 ? "float32" : "bool", need);
        goto out;
    }
    uint8_t *bytes = malloc(need ? need : 1);
    if (!bytes) {
        api_fail(err, 500, "out_of_memory", field, "out of memory while reading %s", sub);
        goto out;
    }
    size_t bad;
    if (!api_base64_decode(s, len, bytes, &bad)) {
        free(bytes);
        char c = s[bad < len ? bad : 0];
        api_fail(err, 400, "invalid_base64", sub,
                 "%s is not base64: character %zu ('%c') is not in the standard alphabet or "
                 "the padding is wrong", sub, bad, (unsigned char)c >= 0x20 && (unsigned char)c < 0x7f ? c : '?');
        goto out;
    }
    if (dtype == API_F32) {
        float *f = (float *)(void *)bytes;
        for (int64_t i = 0; i < count; i++) {
            uint32_t u;
            memcpy(&u, bytes + 4 * i, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            u = __builtin_bswap32(u);
            memcpy(bytes + 4 * i, &u, 4);
#endif
            if ((u & 0x7f800000u) == 0x7f800000u) {
                free(bytes);
                api_fail(err, 400, "invalid_number", sub,
                         "%s element %lld is %s; values must be finite", sub, (long long)i,
                         (u & 0x7fffffu) ? "NaN" : "infinite");
                goto out;
            }
        }
        t->f32 = count ? f : NULL;
        if (!count)
            free(bytes);
    } else {
        for (int64_t i = 0; i < count; i++)
            if (bytes[i] > 1) {
                api_fail(err, 422, "invalid_value", sub,
                         "%s byte %lld is %u; bool elements are 0 or 1", sub, (long long)i,
                         bytes[i]);
                free(bytes);
                goto out;
            }
        t->b8 = count ? bytes : NULL;
        if (!count)
            free(bytes);
    }
    t->dtype = dtype;
    t->rank = rank;
    memcpy(t->shape, shape, (size_t)rank * sizeof shape[0]);
    t->count = count;
    ok = true;
out:
    free(copy);
    return ok;
}

static bool decode_object(cursor p, cursor end, const char *field, bool accept_bool,
                          api_tensor *t, api_error *err)
{
    json_member m[8];
    size_t n;
    if (!json_text_members(p, end, m, 8, &n, field, err)) {
        if (strcmp(err->code, "too_many_fields") == 0)
            return api_fail(err, 400, "unknown_field", field,
                            "%s has too many fields; a tensor object has \"shape\" and \"data\", "
                            "or \"shape\", \"dtype\" and \"base64\"", field);
        return false;
    }
    const json_member *shape_m = NULL, *data_m = NULL, *dtype_m = NULL, *b64_m = NULL;
    char sub[64];
    for (size_t i = 0; i < n; i++) {
        const char *k = m[i].key;
        if (m[i].key_too_long)
            k = "";
        if (strcmp(k, "shape") == 0)
            shape_m = &m[i];
        else if (strcmp(k, "data") == 0)
            data_m = &m[i];
        else if (strcmp(k, "dtype") == 0)
            dtype_m = &m[i];
        else if (strcmp(k, "base64") == 0)
            b64_m = &m[i];
        else {
            join(sub, sizeof sub, field, m[i].key);
            return api_fail(err, 400, "unknown_field", sub,
                            "%s has an unknown field \"%s\"; a tensor object has \"shape\" and "
                            "\"data\", or \"shape\", \"dtype\" and \"base64\"", field, m[i].key);
        }
    }
    if (data_m && b64_m) {
        join(sub, sizeof sub, field, "base64");
        return api_fail(err, 400, "unknown_field", sub,
                        "%s has both \"data\" and \"base64\"; give one of them", field);
    }
    if (!shape_m) {
        join(sub, sizeof sub, field, "shape");
        return api_fail(err, 400, "missing_field", sub, "%s needs a \"shape\"", field);
    }
    if (!data_m && !b64_m) {
        join(sub, sizeof sub, field, "data");
        return api_fail(err, 400, "missing_field", sub,
                        "%s needs \"data\" (an array of numbers) or \"base64\"", field);
    }

    /* dtype: "float32" (the default) or, for masks, "bool" */
    bool declared = dtype_m != NULL;
    api_dtype dtype = API_F32;
    if (dtype_m) {
        join(sub, sizeof sub, field, "dtype");
        cursor s, s_end;
        bool escaped;
        char name[16] = "";
        if (!string_span(dtype_m->value, dtype_m->value_end, &s, &s_end, &escaped))
            return api_fail(err, 400, "wrong_type", sub, "%s must be a string (\"float32\"%s)", sub,
                            accept_bool ? " or \"bool\"" : "");
        size_t nlen = json_string_decode(s - 1, dtype_m->value_end, name, sizeof name - 1, NULL);
        name[nlen < sizeof name ? nlen : sizeof name - 1] = '\0';
        if (nlen == 7 && strcmp(name, "float32") == 0)
            dtype = API_F32;
        else if (nlen == 4 && strcmp(name, "bool") == 0 && accept_bool)
            dtype = API_BOOL;
        else
            return api_fail(err, 400, "wrong_type", sub, "%s is \"%s\"; %s", sub, name,
                            accept_bool ? "use \"float32\" or \"bool\"" : "use \"float32\"");
    }

    int rank = 0;
    int64_t shape[API_MAX_RANK], count = 0;
    if (!read_shape(shape_m->value, shape_m->value_end, field, &rank, shape, &count, err))
        return false;

    if (b64_m)
        return decode_base64_form(b64_m, field, dtype, rank, shape, count, t, err);

    /* flat: the data array is read (its size bounded by the text), then
     * held against the declared shape */
    join(sub, sizeof sub, field, "data");
    cursor d = skip_ws(data_m->value, data_m->value_end);
    if (d == data_m->value_end || *d != '[')
        return api_fail(err, 400, "wrong_type", sub, "%s must be an array of %s; it is %s", sub,
                        dtype == API_BOOL ? "booleans" : "numbers",
                        d == data_m->value_end ? "missing" : kind_of(*d));
    store s = {.dtype = dtype, .typed = declared, .declared = declared, .hint = (size_t)(data_m->value_end - d) / 8};
    int data_rank;
    int64_t data_shape[API_MAX_RANK];
    cursor after;
    if (!read_arrays(d, data_m->value_end, sub, accept_bool, 1, &s, &data_rank, data_shape,
                     &after, err)) {
        store_free(&s);
        return false;
    }
    if ((int64_t)s.n != count) {
        char st[160];
        shape_text(st, sizeof st, shape, rank);
        store_free(&s);
        return api_fail(err, 422, "shape_mismatch", sub,
                        "%s has %lld elements but shape %s needs %lld", sub,
                        (long long)data_shape[0], st, (long long)count);
    }
    store_to_tensor(&s, rank, shape, t);
    return true;
}

/* ------------------------------------------------------------ interface */

bool api_tensor_decode(const char *p, const char *end, const char *field, bool accept_bool,
                       api_tensor *t, api_error *err)
{
    memset(t, 0, sizeof *t);
    p = skip_ws(p, end);
    if (p < end && *p == '[')
        return decode_nested(p, end, field, accept_bool, t, err);
    if (p < end && *p == '{')
        return decode_object(p, end, field, accept_bool, t, err);
    return api_fail(err, 400, "wrong_type", field,
                    "%s must be a tensor (nested arrays of numbers, {\"shape\", \"data\"} or "
                    "{\"shape\", \"dtype\", \"base64\"}); it is %s",
                    field, p < end ? kind_of(*p) : "missing");
}

void api_tensor_free(api_tensor *t)
{
    free(t->f32);
    free(t->b8);
    t->f32 = NULL;
    t->b8 = NULL;
}

/* --------------------------------------------------------------- encode */

static void put_shape(api_buf *b, int rank, const int64_t *shape)
{
    api_buf_append(b, "[", 1);
    for (int i = 0; i < rank; i++)
        api_buf_printf(b, i ? ",%lld" : "%lld", (long long)shape[i]);
    api_buf_append(b, "]", 1);
}

/* n floats as "a,b,c" (no brackets), straight into the buffer. */
static void put_row(api_buf *b, const float *x, int64_t n)
{
    /* in chunks, so that the reservation stays small for huge rows */
    while (n > 0) {
        int64_t k = n > 4096 ? 4096 : n;
        char *w = api_buf_reserve(b, (size_t)k * (API_FLOAT_TEXT_MAX + 1));
        if (!w)
            return;
        char *start = w;
        for (int64_t i = 0; i < k; i++) {
            w = api_float_text(x[i], w);
            *w++ = ',';
        }
        x += k;
        n -= k;
        if (n == 0)
            w--; /* no comma after the last */
        b->len += (size_t)(w - start);
    }
    if (b->data && !b->failed)
        b->data[b->len] = '\0';
}

/* The nested arrays of dims shape[0..rank), row-major from x. */
static void put_nested(api_buf *b, const float *x, int rank, const int64_t *shape)
{
    if (rank == 1) {
        api_buf_append(b, "[", 1);
        put_row(b, x, shape[0]);
        api_buf_append(b, "]", 1);
        return;
    }
    int64_t inner = 1;
    for (int i = 1; i < rank; i++)
        inner *= shape[i];
    api_buf_append(b, "[", 1);
    for (int64_t i = 0; i < shape[0] && !b->failed; i++) {
        if (i)
            api_buf_append(b, ",", 1);
        put_nested(b, inner ? x + i * inner : x, rank - 1, shape + 1);
    }
    api_buf_append(b, "]", 1);
}

void api_tensor_encode(api_buf *b, const float *data, int rank, const int64_t *shape,
                       api_encoding enc)
{
    int64_t count = 1;
    for (int i = 0; i < rank; i++)
        count *= shape[i];
    /* One reservation for the typical text ("-0.12345678," and brackets)
     * instead of doubling through the sizes on the way. */
    if (count > 0 && (uint64_t)count < SIZE_MAX / 16)
        api_buf_hint(b, (size_t)count * (enc == API_ENC_BASE64 ? 6 : 14) + 64);
    if (enc == API_ENC_NESTED) {
        if (rank <= 0)
            api_buf_float(b, data[0]);
        else
            put_nested(b, data, rank, shape);
        return;
    }
    api_buf_append(b, "{\"shape\":", 9);
    put_shape(b, rank, shape);
    if (enc == API_ENC_FLAT) {
        api_buf_append(b, ",\"data\":[", 9);
        put_row(b, data, count);
        api_buf_append(b, "]}", 2);
        return;
    }
    api_buf_puts(b, ",\"dtype\":\"float32\",\"base64\":\"");
    /* little-endian float32, in chunks of 3 * 4096 floats (a multiple of 3
     * bytes, so that only the last chunk has padding) */
    const size_t chunk = 3 * 4096;
    size_t total = (size_t)count * 4, done = 0;
    while (done < total && !b->failed) {
        size_t nbytes = total - done < chunk * 4 ? total - done : chunk * 4;
        const uint8_t *src = (const uint8_t *)data + done;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        static _Thread_local uint8_t le[3 * 4096 * 4];
        for (size_t i = 0; i < nbytes; i += 4) {
            uint32_t u;
            memcpy(&u, src + i, 4);
            u = __builtin_bswap32(u);
            memcpy(le + i, &u, 4);
        }
        src = le;
#endif
        char *w = api_buf_reserve(b, api_base64_encoded_len(nbytes));
        if (!w)
            return;
        char *e = api_base64_encode(src, nbytes, w);
        b->len += (size_t)(e - w);
        done += nbytes;
    }
    api_buf_append(b, "\"}", 2);
}
