/*
 * Tensors in, in the three forms the API accepts: nested arrays (tensor_arrays.c
 * reads them), the flat {"shape", "data"} object and the
 * {"shape", "dtype", "base64"} object.
 *
 * A declared shape is checked against the data (the length of the text)
 * before anything of the declared size is allocated, so a small body cannot
 * ask for a large buffer.
 */
#include "codec_internal.h"
#include "json_string.h"

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

/* "dtype": "float32" (the default), "float16" or "bfloat16" (base64 only)
 * or, for masks, "bool". */
static bool read_dtype(const json_member *m, const char *field, bool accept_bool,
                       api_dtype *dtype, api_error *err)
{
    char sub[64];
    join(sub, sizeof sub, field, "dtype");
    cursor s, s_end;
    bool escaped;
    char name[16] = "";
    const char *choices = accept_bool ? "\"float32\", \"float16\", \"bfloat16\" or \"bool\""
                                      : "\"float32\", \"float16\" or \"bfloat16\"";
    if (!string_span(m->value, m->value_end, &s, &s_end, &escaped))
        return api_fail(err, 400, "wrong_type", sub, "%s must be a string (%s)", sub, choices);
    size_t nlen = json_string_decode(s - 1, m->value_end, name, sizeof name - 1, NULL);
    name[nlen < sizeof name ? nlen : sizeof name - 1] = '\0';
    static const api_dtype known[] = {API_F32, API_F16, API_BF16, API_BOOL};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (strlen(api_dtype_name(known[i])) == nlen && strcmp(name, api_dtype_name(known[i])) == 0 &&
            (known[i] != API_BOOL || accept_bool)) {
            *dtype = known[i];
            return true;
        }
    char shown[80];
    json_escape_text(shown, sizeof shown, name, nlen < sizeof name ? nlen : sizeof name - 1, 0);
    return api_fail(err, 400, "wrong_type", sub, "%s is \"%s\"; use %s", sub, shown, choices);
}

/* A declared shape, or the 422 that reading it gave: that is reported only
 * once the data's types are known to be right (400s come first). */
typedef struct {
    int rank;
    int64_t dims[API_MAX_RANK];
    int64_t count;
    bool bad;
    api_error err;
} declared_shape;

static size_t dtype_size(api_dtype dtype)
{
    return dtype == API_F32 ? 4 : dtype == API_BOOL ? 1 : 2;
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

/* Elements must be finite, as numbers in the text must be: float32, or
 * float16 / bfloat16 (an exponent of all ones is an infinity or a NaN). */
static bool check_finite(const uint8_t *bytes, size_t n, api_dtype dtype, const char *sub,
                         api_error *err)
{
    for (size_t i = 0; i < n; i++) {
        bool nan;
        if (dtype == API_F32) {
            uint32_t u = (uint32_t)bytes[4 * i] | (uint32_t)bytes[4 * i + 1] << 8 |
                         (uint32_t)bytes[4 * i + 2] << 16 | (uint32_t)bytes[4 * i + 3] << 24;
            if ((u & 0x7f800000u) != 0x7f800000u)
                continue;
            nan = (u & 0x7fffffu) != 0;
        } else {
            unsigned h = (unsigned)bytes[2 * i] | (unsigned)bytes[2 * i + 1] << 8;
            unsigned exponent = dtype == API_F16 ? 0x7c00 : 0x7f80;
            if ((h & exponent) != exponent)
                continue;
            nan = (h & ~(exponent | 0x8000u)) != 0;
        }
        return api_fail(err, 400, "invalid_number", sub,
                        "%s element %zu is %s; values must be finite", sub, i,
                        nan ? "NaN" : "infinite");
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

/* The bytes of base64 text s[0..len) into a malloc'd *bytes (*have of
 * them: sized by the text, never by a declared shape). */
static bool base64_bytes(cursor s, size_t len, const char *sub, uint8_t **bytes, size_t *have,
                         api_error *err)
{
    if (!api_base64_decoded_len(s, len, have))
        return api_fail(err, 400, "invalid_base64", sub,
                        "%s is not base64: its length (%zu) is not a multiple of 4 or it has "
                        "more than two '=' (standard alphabet, padded, no whitespace)", sub, len);
    *bytes = malloc(*have ? *have : 1);
    if (!*bytes)
        return api_fail(err, 500, "out_of_memory", sub, "out of memory while reading %s", sub);
    api_advise_huge(*bytes, *have);
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

/* The decoded bytes as the tensor's elements: float32 in place (swapped on
 * a big-endian machine), float16 / bfloat16 widened into a new buffer,
 * bools as they are. Takes bytes over (freed or kept). */
static bool bytes_to_tensor(uint8_t *bytes, const char *sub, api_dtype dtype,
                            const declared_shape *ds, api_tensor *t, api_error *err)
{
    size_t count = (size_t)ds->count;
    t->dtype = dtype == API_BOOL ? API_BOOL : API_F32;
    t->rank = ds->rank;
    memcpy(t->shape, ds->dims, (size_t)ds->rank * sizeof ds->dims[0]);
    t->count = ds->count;
    if (count == 0) {
        free(bytes);
        return true;
    }
    if (dtype == API_BOOL) {
        t->b8 = bytes;
        return true;
    }
    if (dtype == API_F32) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        for (size_t i = 0; i < count; i++) {
            uint32_t u;
            memcpy(&u, bytes + 4 * i, 4);
            u = __builtin_bswap32(u);
            memcpy(bytes + 4 * i, &u, 4);
        }
#endif
        t->f32 = (float *)(void *)bytes;
        return true;
    }
    t->f32 = malloc(count * sizeof(float));
    if (!t->f32) {
        free(bytes);
        return api_fail(err, 500, "out_of_memory", sub, "out of memory while reading %s", sub);
    }
    api_advise_huge(t->f32, count * sizeof(float));
    api_half_to_f32(dtype, bytes, t->f32, count, api_half_best_path());
    free(bytes);
    return true;
}

/* The order of the checks: the text is base64 (400), its elements are
 * finite (400), the shape was valid (422, deferred), the byte count fits
 * the shape (422), bools are 0 or 1 (422). */
static bool decode_base64_form(const json_member *m_b64, const char *field, api_dtype dtype,
                               const declared_shape *ds, api_tensor *t, api_error *err)
{
    char sub[64];
    join(sub, sizeof sub, field, "base64");
    cursor s;
    size_t len = 0, have = 0;
    char *copy;
    if (!base64_text(m_b64, sub, &s, &len, &copy, err))
        return false;
    uint8_t *bytes = NULL;
    size_t elem = dtype_size(dtype);
    bool ok = base64_bytes(s, len, sub, &bytes, &have, err) &&
              (dtype == API_BOOL || check_finite(bytes, have / elem, dtype, sub, err));
    free(copy);
    if (ok && ds->bad) {
        *err = ds->err;
        ok = false;
    }
    /* read_shape bounded count by INT64_MAX / 8 */
    if (ok && have != (size_t)ds->count * elem) {
        char st[160];
        shape_text(st, sizeof st, ds->dims, ds->rank);
        ok = api_fail(err, 422, "shape_mismatch", sub, "%s holds %zu bytes but shape %s of %s needs %zu",
                      sub, have, st, api_dtype_name(dtype), (size_t)ds->count * elem);
    }
    if (ok && dtype == API_BOOL)
        ok = check_bool_bytes(bytes, ds->count, sub, err);
    if (!ok) {
        free(bytes);
        return false;
    }
    return bytes_to_tensor(bytes, sub, dtype, ds, t, err);
}

/* --------------------------------------------------------------- flat form */

/* The data array is read (its size bounded by the text; its types are
 * the 400s), then held against the declared shape (the 422s). */
static bool decode_flat_form(const json_member *m_data, const char *field, bool accept_bool,
                             api_dtype dtype, bool declared, const declared_shape *ds,
                             api_tensor *t, api_error *err)
{
    char sub[64];
    join(sub, sizeof sub, field, "data");
    if (dtype == API_F16 || dtype == API_BF16) {
        join(sub, sizeof sub, field, "dtype");
        return api_fail(err, 400, "wrong_type", sub,
                        "%s is \"%s\", which is for base64 data; \"data\" holds JSON numbers "
                        "(use \"float32\" or no dtype)", sub, api_dtype_name(dtype));
    }
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
    if (ds->bad) {
        tensor_store_free(&s);
        *err = ds->err;
        return false;
    }
    if ((int64_t)s.n != ds->count) {
        char st[160];
        shape_text(st, sizeof st, ds->dims, ds->rank);
        tensor_store_free(&s);
        return api_fail(err, 422, "shape_mismatch", sub,
                        "%s has %lld elements but shape %s needs %lld", sub,
                        (long long)data_shape[0], st, (long long)ds->count);
    }
    tensor_store_to_tensor(&s, ds->rank, ds->dims, t);
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
            char shown[80];
            join(sub, sizeof sub, field, m[i].key_too_long ? "..." : m[i].key);
            return api_fail(err, 400, "unknown_field", sub,
                            "%s has an unknown field \"%s\"; a tensor object has \"shape\" and "
                            "\"data\", or \"shape\", \"dtype\" and \"base64\"", field,
                            json_member_key_shown(&m[i], shown, sizeof shown));
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
    declared_shape ds = {0};
    if (!read_shape(tm.shape->value, tm.shape->value_end, field, &ds.rank, ds.dims, &ds.count,
                    &ds.err)) {
        if (ds.err.status != 422) { /* not even an array of numbers: a 400 now */
            *err = ds.err;
            return false;
        }
        ds.bad = true;
    }
    if (tm.base64)
        return decode_base64_form(tm.base64, field, dtype, &ds, t, err);
    return decode_flat_form(tm.data, field, accept_bool, dtype, tm.dtype != NULL, &ds, t, err);
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
