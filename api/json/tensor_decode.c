/*
 * Tensors in, in the three forms of SPEC §3: nested arrays (tensor_arrays.c
 * reads them), the flat {"shape", "data"} object and the
 * {"shape", "dtype", "base64"} object.
 *
 * A declared shape is checked against the data (the length of the text)
 * before anything of the declared size is allocated, so a small body cannot
 * ask for a large buffer.
 */
#include "codec_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the value at p is, in words ("missing" at the end). */
static const char *kind_at(cursor p, cursor end)
{
    p = json_skip_ws(p, end);
    return p < end ? tensor_kind_of(*p) : "missing";
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

static void shape_text(char *dst, size_t cap, const int64_t *shape, int rank)
{
    int w = snprintf(dst, cap, "[");
    for (int i = 0; i < rank && w >= 0 && (size_t)w < cap; i++)
        w += snprintf(dst + w, cap - (size_t)w, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (w >= 0 && (size_t)w < cap)
        snprintf(dst + w, cap - (size_t)w, "]");
}

/* ------------------------------------------------------------ nested form */

static bool decode_nested(cursor p, cursor end, const char *field, bool accept_bool,
                          api_tensor *t, api_error *err)
{
    /* A first guess at the element count from the text saves most of the
     * regrowing: client numbers ("0.123456789, ") take 8 bytes or more. */
    tensor_store s = {.hint = (size_t)(end - p) / 8};
    int rank;
    int64_t shape[API_MAX_RANK];
    cursor after;
    if (!tensor_read_arrays(p, end, field, accept_bool, API_MAX_RANK, &s, &rank, shape, &after,
                            err)) {
        tensor_store_free(&s);
        return false;
    }
    if (!s.typed)
        s.dtype = API_F32;
    tensor_store_to_tensor(&s, rank, shape, t);
    return true;
}

/* ------------------------------------------------------------------ shape */

/* Collects the significant digits of the number at p and the power of ten
 * that goes with them; *stop is the byte after the number. */
typedef struct {
    char digits[19];
    int nd;
    long exp10;
    bool too_long; /* non-zero digits beyond the 19th */
} decimal;

static cursor read_decimal(cursor p, cursor end, decimal *d)
{
    d->nd = 0;
    d->exp10 = 0;
    d->too_long = false;
    for (; p < end && (unsigned char)(*p - '0') < 10; p++) {
        if (d->nd == 0 && *p == '0')
            continue;
        if (d->nd < 19)
            d->digits[d->nd++] = *p;
        else {
            d->too_long = true;
            d->exp10++;
        }
    }
    if (p < end && *p == '.') {
        for (p++; p < end && (unsigned char)(*p - '0') < 10; p++) {
            if (d->nd == 0 && *p == '0') {
                d->exp10--;
                continue;
            }
            if (d->nd < 19) {
                d->digits[d->nd++] = *p;
                d->exp10--;
            } else if (*p != '0')
                d->too_long = true;
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
        d->exp10 += eneg ? -e : e;
    }
    while (d->nd > 0 && d->digits[d->nd - 1] == '0') {
        d->nd--;
        d->exp10++;
    }
    return p;
}

/* A JSON number that is a non-negative integer (2.0 and 2e1 count), at
 * most 2^62. Returns 1 for yes, 0 for not an integer / negative / too big,
 * -1 when it is not a number at all. */
static int read_dimension(cursor p, cursor end, int64_t *out, cursor *stop)
{
    if (p == end || !tensor_starts_number(*p))
        return -1;
    bool neg = *p == '-';
    decimal d;
    *stop = read_decimal(p + neg, end, &d);
    if (d.nd == 0) {
        *out = 0;
        return 1;
    }
    if (neg || d.too_long || d.exp10 < 0 || d.nd + d.exp10 > 18)
        return 0;
    int64_t v = 0;
    for (int i = 0; i < d.nd; i++)
        v = v * 10 + (d.digits[i] - '0');
    for (long i = 0; i < d.exp10; i++)
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
    p = json_skip_ws(p, end);
    if (p == end || *p != '[')
        return api_fail(err, 400, "wrong_type", sub,
                        "%s must be an array of non-negative integers; it is %s", sub,
                        p == end ? "missing" : tensor_kind_of(*p));
    p = json_skip_ws(p + 1, end);
    int r = 0;
    int64_t total = 1;
    bool overflow = false;
    bool empty = p < end && *p == ']';
    while (!empty) {
        int64_t d;
        cursor stop;
        int ok = read_dimension(p, end, &d, &stop);
        if (ok < 0)
            return api_fail(err, 400, "wrong_type", sub,
                            "%s must be an array of non-negative integers; element %d is %s",
                            sub, r, p == end ? "missing" : tensor_kind_of(*p));
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
        p = json_skip_ws(stop, end);
        if (p < end && *p == ']')
            break;
        if (p == end || *p != ',')
            return api_fail(err, 400, "invalid_json", sub, "%s is not valid JSON", sub);
        p = json_skip_ws(p + 1, end);
    }
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

/* ------------------------------------------------------------------ dtype */

/* The text of a JSON string value (between the quotes, escapes as written);
 * false when the value is not a string. */
static bool string_span(cursor p, cursor end, cursor *s, cursor *s_end, bool *escaped)
{
    p = json_skip_ws(p, end);
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

/* "dtype": "float32" (the default) or, for masks, "bool". */
static bool read_dtype(const json_member *m, const char *field, bool accept_bool,
                       api_dtype *dtype, api_error *err)
{
    char sub[64];
    join(sub, sizeof sub, field, "dtype");
    cursor s, s_end;
    bool escaped;
    char name[16] = "";
    if (!string_span(m->value, m->value_end, &s, &s_end, &escaped))
        return api_fail(err, 400, "wrong_type", sub, "%s must be a string (\"float32\"%s)", sub,
                        accept_bool ? " or \"bool\"" : "");
    size_t nlen = json_string_decode(s - 1, m->value_end, name, sizeof name - 1, NULL);
    name[nlen < sizeof name ? nlen : sizeof name - 1] = '\0';
    if (nlen == 7 && strcmp(name, "float32") == 0)
        *dtype = API_F32;
    else if (nlen == 4 && strcmp(name, "bool") == 0 && accept_bool)
        *dtype = API_BOOL;
    else
        return api_fail(err, 400, "wrong_type", sub, "%s is \"%s\"; %s", sub, name,
                        accept_bool ? "use \"float32\" or \"bool\"" : "use \"float32\"");
    return true;
}

/* ------------------------------------------------------------- base64 form */

/* The base64 text of member m: in place, or (when it holds escapes, as
 * some encoders write '/' as "\/") in a malloc'd copy sized by the text,
 * never by the declared shape; *copy is what to free. */
static bool base64_text(const json_member *m, const char *sub, cursor *s, size_t *len,
                        char **copy, api_error *err)
{
    cursor s_end;
    bool escaped;
    *copy = NULL;
    if (!string_span(m->value, m->value_end, s, &s_end, &escaped))
        return api_fail(err, 400, "wrong_type", sub, "%s must be a base64 string; it is %s", sub,
                        kind_at(m->value, m->value_end));
    if (escaped) {
        cursor q = json_skip_ws(m->value, m->value_end);
        size_t n = json_string_decode(q, m->value_end, NULL, 0, NULL);
        *copy = malloc(n ? n : 1);
        if (!*copy)
            return api_fail(err, 500, "out_of_memory", sub, "out of memory while reading %s", sub);
        json_string_decode(q, m->value_end, *copy, n, NULL);
        *s = *copy;
        s_end = *copy + n;
    }
    *len = (size_t)(s_end - *s);
    return true;
}

/* Float32 elements must be finite, as numbers in the text must be. */
static bool check_finite(const uint8_t *bytes, int64_t count, const char *sub, api_error *err)
{
    for (int64_t i = 0; i < count; i++) {
        uint32_t u;
        memcpy(&u, bytes + 4 * i, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        u = __builtin_bswap32(u);
        memcpy((uint8_t *)bytes + 4 * i, &u, 4);
#endif
        if ((u & 0x7f800000u) == 0x7f800000u)
            return api_fail(err, 400, "invalid_number", sub,
                            "%s element %lld is %s; values must be finite", sub, (long long)i,
                            (u & 0x7fffffu) ? "NaN" : "infinite");
    }
    return true;
}

static bool check_bool_bytes(const uint8_t *bytes, int64_t count, const char *sub,
                             api_error *err)
{
    for (int64_t i = 0; i < count; i++)
        if (bytes[i] > 1)
            return api_fail(err, 422, "invalid_value", sub,
                            "%s byte %lld is %u; bool elements are 0 or 1", sub, (long long)i,
                            bytes[i]);
    return true;
}

/* The elements of base64 text s[0..len) into a malloc'd *bytes of `need`. */
static bool base64_bytes(cursor s, size_t len, const char *sub, api_dtype dtype, int rank,
                         const int64_t *shape, size_t need, uint8_t **bytes, api_error *err)
{
    size_t have;
    if (!api_base64_decoded_len(s, len, &have))
        return api_fail(err, 400, "invalid_base64", sub,
                        "%s is not base64: its length (%zu) is not a multiple of 4 or it has "
                        "more than two '=' (standard alphabet, padded, no whitespace)", sub, len);
    if (have != need) {
        char st[160];
        shape_text(st, sizeof st, shape, rank);
        return api_fail(err, 422, "shape_mismatch", sub,
                        "%s holds %zu bytes but shape %s of %s needs %zu", sub, have, st,
                        dtype == API_F32 ? "float32" : "bool", need);
    }
    *bytes = malloc(need ? need : 1);
    if (!*bytes)
        return api_fail(err, 500, "out_of_memory", sub, "out of memory while reading %s", sub);
    size_t bad;
    if (!api_base64_decode(s, len, *bytes, &bad)) {
        char c = s[bad < len ? bad : 0];
        return api_fail(err, 400, "invalid_base64", sub,
                        "%s is not base64: character %zu ('%c') is not in the standard alphabet "
                        "or the padding is wrong", sub, bad,
                        (unsigned char)c >= 0x20 && (unsigned char)c < 0x7f ? c : '?');
    }
    return true;
}

static bool decode_base64_form(const json_member *m_b64, const char *field, api_dtype dtype,
                               int rank, const int64_t *shape, int64_t count, api_tensor *t,
                               api_error *err)
{
    char sub[64];
    join(sub, sizeof sub, field, "base64");
    cursor s;
    size_t len = 0;
    char *copy;
    if (!base64_text(m_b64, sub, &s, &len, &copy, err))
        return false;
    size_t elem = dtype == API_F32 ? sizeof(float) : 1;
    size_t need = (size_t)count * elem; /* read_shape bounded count by INT64_MAX / 8 */
    uint8_t *bytes = NULL;
    bool ok = base64_bytes(s, len, sub, dtype, rank, shape, need, &bytes, err) &&
              (dtype == API_F32 ? check_finite(bytes, count, sub, err)
                                : check_bool_bytes(bytes, count, sub, err));
    free(copy);
    if (!ok || count == 0) {
        free(bytes);
        bytes = NULL;
    }
    if (!ok)
        return false;
    t->dtype = dtype;
    t->rank = rank;
    memcpy(t->shape, shape, (size_t)rank * sizeof shape[0]);
    t->count = count;
    if (dtype == API_F32)
        t->f32 = (float *)(void *)bytes;
    else
        t->b8 = bytes;
    return true;
}

/* --------------------------------------------------------------- flat form */

/* The data array is read (its size bounded by the text), then held against
 * the declared shape. */
static bool decode_flat_form(const json_member *m_data, const char *field, bool accept_bool,
                             api_dtype dtype, bool declared, int rank, const int64_t *shape,
                             int64_t count, api_tensor *t, api_error *err)
{
    char sub[64];
    join(sub, sizeof sub, field, "data");
    cursor d = json_skip_ws(m_data->value, m_data->value_end);
    if (d == m_data->value_end || *d != '[')
        return api_fail(err, 400, "wrong_type", sub, "%s must be an array of %s; it is %s", sub,
                        dtype == API_BOOL ? "booleans" : "numbers",
                        d == m_data->value_end ? "missing" : tensor_kind_of(*d));
    tensor_store s = {.dtype = dtype, .typed = declared, .declared = declared,
                      .hint = (size_t)(m_data->value_end - d) / 8};
    int data_rank;
    int64_t data_shape[API_MAX_RANK];
    cursor after;
    if (!tensor_read_arrays(d, m_data->value_end, sub, accept_bool, 1, &s, &data_rank,
                            data_shape, &after, err)) {
        tensor_store_free(&s);
        return false;
    }
    if ((int64_t)s.n != count) {
        char st[160];
        shape_text(st, sizeof st, shape, rank);
        tensor_store_free(&s);
        return api_fail(err, 422, "shape_mismatch", sub,
                        "%s has %lld elements but shape %s needs %lld", sub,
                        (long long)data_shape[0], st, (long long)count);
    }
    tensor_store_to_tensor(&s, rank, shape, t);
    return true;
}

/* ------------------------------------------------------------ object forms */

/* The members of a tensor object, by name. */
typedef struct {
    const json_member *shape, *data, *dtype, *base64;
} tensor_members;

static bool find_members(cursor p, cursor end, const char *field, json_member *m,
                         tensor_members *tm, api_error *err)
{
    size_t n;
    char sub[64];
    if (!json_text_members(p, end, m, 8, &n, field, err)) {
        if (strcmp(err->code, "too_many_fields") == 0)
            return api_fail(err, 400, "unknown_field", field,
                            "%s has too many fields; a tensor object has \"shape\" and \"data\", "
                            "or \"shape\", \"dtype\" and \"base64\"", field);
        return false;
    }

    for (size_t i = 0; i < n; i++) {
        const char *k = m[i].key_too_long ? "" : m[i].key;
        if (strcmp(k, "shape") == 0)
            tm->shape = &m[i];
        else if (strcmp(k, "data") == 0)
            tm->data = &m[i];
        else if (strcmp(k, "dtype") == 0)
            tm->dtype = &m[i];
        else if (strcmp(k, "base64") == 0)
            tm->base64 = &m[i];
        else {
            join(sub, sizeof sub, field, m[i].key);
            return api_fail(err, 400, "unknown_field", sub,
                            "%s has an unknown field \"%s\"; a tensor object has \"shape\" and "
                            "\"data\", or \"shape\", \"dtype\" and \"base64\"", field, m[i].key);
        }
    }
    if (tm->data && tm->base64) {
        join(sub, sizeof sub, field, "base64");
        return api_fail(err, 400, "unknown_field", sub,
                        "%s has both \"data\" and \"base64\"; give one of them", field);
    }
    if (!tm->shape) {
        join(sub, sizeof sub, field, "shape");
        return api_fail(err, 400, "missing_field", sub, "%s needs a \"shape\"", field);
    }
    if (!tm->data && !tm->base64) {
        join(sub, sizeof sub, field, "data");
        return api_fail(err, 400, "missing_field", sub,
                        "%s needs \"data\" (an array of numbers) or \"base64\"", field);
    }
    return true;
}

static bool decode_object(cursor p, cursor end, const char *field, bool accept_bool,
                          api_tensor *t, api_error *err)
{
    json_member m[8];
    tensor_members tm = {0};
    if (!find_members(p, end, field, m, &tm, err))
        return false;
    api_dtype dtype = API_F32;
    if (tm.dtype && !read_dtype(tm.dtype, field, accept_bool, &dtype, err))
        return false;
    int rank = 0;
    int64_t shape[API_MAX_RANK], count = 0;
    if (!read_shape(tm.shape->value, tm.shape->value_end, field, &rank, shape, &count, err))
        return false;
    if (tm.base64)
        return decode_base64_form(tm.base64, field, dtype, rank, shape, count, t, err);
    return decode_flat_form(tm.data, field, accept_bool, dtype, tm.dtype != NULL, rank, shape,
                            count, t, err);
}

/* ------------------------------------------------------------ interface */

bool api_tensor_decode(const char *p, const char *end, const char *field, bool accept_bool,
                       api_tensor *t, api_error *err)
{
    memset(t, 0, sizeof *t);
    p = json_skip_ws(p, end);
    if (p < end && *p == '[')
        return decode_nested(p, end, field, accept_bool, t, err);
    if (p < end && *p == '{')
        return decode_object(p, end, field, accept_bool, t, err);
    return api_fail(err, 400, "wrong_type", field,
                    "%s must be a tensor (nested arrays of numbers, {\"shape\", \"data\"} or "
                    "{\"shape\", \"dtype\", \"base64\"}); it is %s",
                    field, p < end ? tensor_kind_of(*p) : "missing");
}

void api_tensor_free(api_tensor *t)
{
    free(t->f32);
    free(t->b8);
    t->f32 = NULL;
    t->b8 = NULL;
}
