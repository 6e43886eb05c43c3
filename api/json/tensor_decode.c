/*
 * Tensors in, in their three forms: nested arrays (tensor_arrays.c reads
 * them), the flat {"shape", "data"} object and the
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
    p = codec_skip_ws(p, end);
    return p < end ? codec_kind_name(*p) : "missing";
}

/* "q.dtype": a field path, cut to fit codec_error.field. */
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

static bool decode_nested(codec_reading *r, cursor p, cursor end, codec_tensor *t)
{
    /* A first guess at the element count from the text saves most of the
     * regrowing: client numbers ("0.123456789, ") take 8 bytes or more. */
    codec_store s = {.hint = (size_t)(end - p) / 8};
    int rank;
    int64_t shape[CODEC_MAX_RANK];
    cursor after;
    if (!codec_read_arrays(r, r->field, p, end, CODEC_MAX_RANK, &s, &rank, shape, &after)) {
        codec_store_free(&s);
        return false;
    }
    if (!s.typed)
        s.dtype = CODEC_F32;
    codec_store_to_tensor(&s, rank, shape, t);
    return true;
}

/* ------------------------------------------------------------------ shape */

/* A declared shape, or the error that reading it gave: a CODEC_ERR_SHAPE
 * is reported only once the data's types are known to be right (the
 * other class comes first). */
typedef struct {
    int rank;
    int64_t dims[CODEC_MAX_RANK];
    int64_t count;
    bool bad;
    codec_error err;
} declared_shape;

/* Dimensions are integers from 0 to 2^62 (2.0 and 2e1 count). */
#define MAX_DIMENSION ((int64_t)1 << 62)

static bool read_shape(codec_reading *r, cursor p, cursor end, declared_shape *ds)
{
    codec_error *err = &ds->err;
    char sub[64];
    join(sub, sizeof sub, r->field, "shape");
    p = codec_skip_ws(p, end);
    if (p == end || *p != '[')
        return codec_fail(err, CODEC_ERR_WRONG_TYPE, sub, r->text, p,
                          "%s must be an array of non-negative integers; it is %s", sub,
                          p == end ? "missing" : codec_kind_name(*p));
    p = codec_skip_ws(p + 1, end);
    int rank = 0;
    int64_t total = 1;
    bool overflow = false;
    bool empty = p < end && *p == ']';
    while (!empty) {
        if (p == end || !codec_starts_number(*p))
            return codec_fail(err, CODEC_ERR_WRONG_TYPE, sub, r->text, p,
                              "%s must be an array of non-negative integers; element %d is %s",
                              sub, rank, p == end ? "missing" : codec_kind_name(*p));
        int64_t d;
        cursor stop;
        if (codec_parse_integer(p, end, MAX_DIMENSION, &stop, &d) != CODEC_INT_OK || d < 0) {
            int len = (int)(stop - p) > 30 ? 30 : (int)(stop - p);
            return codec_fail(err, CODEC_ERR_SHAPE, sub, r->text, p,
                              "%s[%d] is %.*s; dimensions are non-negative integers", sub, rank,
                              len, p);
        }
        if (rank == CODEC_MAX_RANK)
            return codec_fail(err, CODEC_ERR_SHAPE, sub, r->text, p,
                              "%s has more than %d dimensions", sub, CODEC_MAX_RANK);
        ds->dims[rank++] = d;
        overflow |= __builtin_mul_overflow(total, d, &total);
        p = codec_skip_ws(stop, end);
        if (p < end && *p == ']')
            break;
        if (p == end || *p != ',')
            return codec_fail(err, CODEC_ERR_SYNTAX, sub, r->text, p, "%s is not valid JSON",
                              sub);
        p = codec_skip_ws(p + 1, end);
    }
    /* The product must leave room for 4-byte elements in a size_t and an
     * int64_t: anything near that is refused long before by the body limit
     * and the work limit, but it must not wrap around. */
    if (overflow || total > INT64_MAX / 8) {
        char st[160];
        shape_text(st, sizeof st, ds->dims, rank);
        return codec_fail(err, CODEC_ERR_SHAPE, sub, r->text, NULL,
                          "%s %s has too many elements", sub, st);
    }
    ds->rank = rank;
    ds->count = total;
    return true;
}

/* ------------------------------------------------------------------ dtype */

/* The text of a JSON string value (between the quotes, escapes as written);
 * false when the value is not a string. */
static bool string_span(cursor p, cursor end, cursor *s, cursor *s_end, bool *escaped)
{
    p = codec_skip_ws(p, end);
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
static bool read_dtype(codec_reading *r, const codec_member *m, codec_dtype *dtype)
{
    char sub[64];
    join(sub, sizeof sub, r->field, "dtype");
    cursor s, s_end;
    bool escaped;
    char name[16] = "";
    const char *choices = r->accept_bool ? "\"float32\", \"float16\", \"bfloat16\" or \"bool\""
                                         : "\"float32\", \"float16\" or \"bfloat16\"";
    cursor value = codec_skip_ws(m->value, m->value_end);
    if (!string_span(m->value, m->value_end, &s, &s_end, &escaped))
        return codec_fail(r->err, CODEC_ERR_WRONG_TYPE, sub, r->text, value,
                          "%s must be a string (%s)", sub, choices);
    size_t nlen = codec_string_decode(s - 1, m->value_end, name, sizeof name - 1, NULL);
    name[nlen < sizeof name ? nlen : sizeof name - 1] = '\0';
    static const codec_dtype known[] = {CODEC_F32, CODEC_F16, CODEC_BF16, CODEC_BOOL};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (strlen(codec_dtype_name(known[i])) == nlen &&
            strcmp(name, codec_dtype_name(known[i])) == 0 &&
            (known[i] != CODEC_BOOL || r->accept_bool)) {
            *dtype = known[i];
            return true;
        }
    char shown[80];
    codec_escape_text(shown, sizeof shown, name, nlen < sizeof name ? nlen : sizeof name - 1, 0);
    return codec_fail(r->err, CODEC_ERR_WRONG_TYPE, sub, r->text, value, "%s is \"%s\"; use %s",
                      sub, shown, choices);
}

static size_t dtype_size(codec_dtype dtype)
{
    return dtype == CODEC_F32 ? 4 : dtype == CODEC_BOOL ? 1 : 2;
}

/* ------------------------------------------------------------- base64 form */

/* The base64 text of member m: in place, or (when it holds escapes, as
 * some encoders write '/' as "\/") in a malloc'd copy sized by the text,
 * never by the declared shape; *copy is what to free. */
static bool base64_text(codec_reading *r, const codec_member *m, const char *sub, cursor *s,
                        size_t *len, char **copy)
{
    cursor s_end;
    bool escaped;
    *copy = NULL;
    cursor value = codec_skip_ws(m->value, m->value_end);
    if (!string_span(m->value, m->value_end, s, &s_end, &escaped))
        return codec_fail(r->err, CODEC_ERR_WRONG_TYPE, sub, r->text, value,
                          "%s must be a base64 string; it is %s", sub,
                          kind_at(m->value, m->value_end));
    if (escaped) {
        size_t n = codec_string_decode(value, m->value_end, NULL, 0, NULL);
        *copy = malloc(n ? n : 1);
        if (!*copy)
            return codec_fail(r->err, CODEC_ERR_NO_MEMORY, sub, NULL, NULL,
                              "out of memory while reading %s", sub);
        codec_string_decode(value, m->value_end, *copy, n, NULL);
        *s = *copy;
        s_end = *copy + n;
    }
    *len = (size_t)(s_end - *s);
    return true;
}

/* Elements a block of the scan below looks at before it branches. */
#define SPECIAL_BLOCK 64

/* Whether one whole block at bytes has an element with an exponent of all
 * ones. Most tensors have none, and an exact loop (a branch an element)
 * ran at a fraction of the memory's speed on megabytes of binary tensors.
 * Here the block is folded without a branch: adding the lowest exponent
 * bit to the exponent field carries into the sign bit exactly when the
 * field is all ones, and the OR of those sums is a loop of fixed length
 * that the compiler turns into vector code. Little-endian hosts only. */
static bool block_special(const uint8_t *bytes, codec_dtype dtype)
{
    if (dtype == CODEC_F32) {
        uint32_t w[SPECIAL_BLOCK], acc = 0;
        memcpy(w, bytes, sizeof w);
        for (int j = 0; j < SPECIAL_BLOCK; j++)
            acc |= (w[j] & 0x7f800000u) + 0x00800000u;
        return (acc & 0x80000000u) != 0;
    }
    const uint16_t exponent = dtype == CODEC_F16 ? 0x7c00 : 0x7f80;
    const uint16_t low = dtype == CODEC_F16 ? 0x0400 : 0x0080;
    uint16_t w[SPECIAL_BLOCK], acc = 0;
    memcpy(w, bytes, sizeof w);
    for (int j = 0; j < SPECIAL_BLOCK; j++)
        acc |= (uint16_t)((w[j] & exponent) + low);
    return (acc & 0x8000u) != 0;
}

size_t codec_special_start(const void *bytes, size_t n, codec_dtype dtype)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint8_t *b = bytes;
    size_t size = codec_dtype_size(dtype), i = 0;
    for (; i + SPECIAL_BLOCK <= n; i += SPECIAL_BLOCK)
        if (block_special(b + i * size, dtype))
            return i;
    return i; /* the last partial block: the exact search's business */
#else
    (void)bytes;
    (void)n;
    (void)dtype;
    return 0;
#endif
}

/* Elements must be finite, as numbers in the text must be: float32, or
 * float16 / bfloat16 (an exponent of all ones is an infinity or a NaN).
 * A mask's may also be -inf: the additive masks of PyTorch and Hugging
 * Face spell "hidden" so. `at`: the base64 value, at fault as a whole. */
static bool check_finite(codec_reading *r, cursor at, const uint8_t *bytes, size_t n,
                         codec_dtype dtype, const char *sub)
{
    for (size_t i = codec_special_start(bytes, n, dtype); i < n; i++) {
        bool nan, negative;
        if (dtype == CODEC_F32) {
            uint32_t u = (uint32_t)bytes[4 * i] | (uint32_t)bytes[4 * i + 1] << 8 |
                         (uint32_t)bytes[4 * i + 2] << 16 | (uint32_t)bytes[4 * i + 3] << 24;
            if ((u & 0x7f800000u) != 0x7f800000u)
                continue;
            nan = (u & 0x7fffffu) != 0;
            negative = (u & 0x80000000u) != 0;
        } else {
            unsigned h = (unsigned)bytes[2 * i] | (unsigned)bytes[2 * i + 1] << 8;
            unsigned exponent = dtype == CODEC_F16 ? 0x7c00 : 0x7f80;
            if ((h & exponent) != exponent)
                continue;
            nan = (h & ~(exponent | 0x8000u)) != 0;
            negative = (h & 0x8000u) != 0;
        }
        if (r->accept_bool && negative && !nan)
            continue;
        return codec_fail(r->err, CODEC_ERR_NOT_FINITE, sub, r->text, at,
                          "%s element %zu is %s; values must be finite", sub, i,
                          nan ? "NaN" : "infinite");
    }
    return true;
}

static bool check_bool_bytes(codec_reading *r, cursor at, const uint8_t *bytes, int64_t count,
                             const char *sub)
{
    for (int64_t i = 0; i < count; i++)
        if (bytes[i] > 1)
            return codec_fail(r->err, CODEC_ERR_ELEMENT, sub, r->text, at,
                              "%s byte %lld is %u; bool elements are 0 or 1", sub, (long long)i,
                              bytes[i]);
    return true;
}

/* The bytes of base64 text s[0..len) into *bytes, from codec_tensor_alloc (*have of
 * them: sized by the text, never by a declared shape). `in_text`: s lies in
 * the text (not in a copy), so that a bad character's place is known. */
static bool base64_bytes(codec_reading *r, cursor s, size_t len, bool in_text, cursor value,
                         const char *sub, uint8_t **bytes, size_t *have)
{
    if (!codec_base64_decoded_len(s, len, have))
        return codec_fail(r->err, CODEC_ERR_BASE64, sub, r->text, value,
                          "%s is not base64: its length (%zu) is not a multiple of 4 or it has "
                          "more than two '=' (standard alphabet, padded, no whitespace)", sub,
                          len);
    *bytes = codec_tensor_alloc(*have ? *have : 1);
    if (!*bytes)
        return codec_fail(r->err, CODEC_ERR_NO_MEMORY, sub, NULL, NULL,
                          "out of memory while reading %s", sub);
    codec_advise_huge(*bytes, *have);
    size_t bad;
    if (!codec_base64_decode(s, len, *bytes, &bad)) {
        char c = s[bad < len ? bad : 0];
        return codec_fail(r->err, CODEC_ERR_BASE64, sub, r->text,
                          in_text && bad < len ? s + bad : value,
                          "%s is not base64: character %zu ('%c') is not in the standard "
                          "alphabet or the padding is wrong", sub, bad,
                          (unsigned char)c >= 0x20 && (unsigned char)c < 0x7f ? c : '?');
    }
    return true;
}

/* The decoded bytes as the tensor's elements: float32 in place (swapped on
 * a big-endian machine), float16 / bfloat16 widened into a new buffer,
 * bools as they are. Takes bytes over (freed or kept). */
static bool bytes_to_tensor(codec_reading *r, uint8_t *bytes, const char *sub, codec_dtype dtype,
                            const declared_shape *ds, codec_tensor *t)
{
    size_t count = (size_t)ds->count;
    t->dtype = dtype == CODEC_BOOL ? CODEC_BOOL : CODEC_F32;
    t->rank = ds->rank;
    memcpy(t->shape, ds->dims, (size_t)ds->rank * sizeof ds->dims[0]);
    t->count = ds->count;
    if (count == 0) {
        codec_tensor_release(bytes);
        return true;
    }
    if (dtype == CODEC_BOOL) {
        t->b8 = bytes;
        return true;
    }
    if (dtype == CODEC_BF16 && r->keep_bf16) {
        t->dtype = CODEC_BF16;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        for (size_t i = 0; i < count; i++) {
            uint16_t u;
            memcpy(&u, bytes + 2 * i, 2);
            u = __builtin_bswap16(u);
            memcpy(bytes + 2 * i, &u, 2);
        }
#endif
        t->bf16 = (uint16_t *)(void *)bytes;
        return true;
    }
    if (dtype == CODEC_F32) {
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
    t->f32 = codec_tensor_alloc(count * sizeof(float));
    if (!t->f32) {
        codec_tensor_release(bytes);
        return codec_fail(r->err, CODEC_ERR_NO_MEMORY, sub, NULL, NULL,
                          "out of memory while reading %s", sub);
    }
    codec_advise_huge(t->f32, count * sizeof(float));
    codec_half_to_f32(dtype, bytes, t->f32, count, codec_half_path_in_use());
    codec_tensor_release(bytes);
    return true;
}

bool codec_tensor_from_raw(const uint8_t *bytes, codec_dtype dtype, int rank,
                           const int64_t *shape, const char *field, codec_tensor *t,
                           codec_error *err)
{
    *t = (codec_tensor){0};
    codec_reading r = {.field = field, .err = err};
    declared_shape ds = {.rank = rank, .count = 1};
    for (int i = 0; i < rank; i++) {
        ds.dims[i] = shape[i];
        ds.count *= shape[i];
    }
    size_t size = (size_t)ds.count * codec_dtype_size(dtype);
    uint8_t *copy = codec_tensor_alloc(size ? size : 1);
    if (!copy)
        return codec_fail(err, CODEC_ERR_NO_MEMORY, field, NULL, NULL,
                          "out of memory while reading %s", field);
    codec_advise_huge(copy, size);
    memcpy(copy, bytes, size);
    bool ok = dtype == CODEC_BOOL ? check_bool_bytes(&r, NULL, copy, ds.count, field)
                                  : check_finite(&r, NULL, copy, (size_t)ds.count, dtype, field);
    if (!ok) {
        codec_tensor_release(copy);
        return false;
    }
    return bytes_to_tensor(&r, copy, field, dtype, &ds, t);
}

bool codec_tensor_view_raw(const uint8_t *bytes, codec_dtype dtype, int rank,
                           const int64_t *shape, const char *field, codec_tensor *t,
                           codec_error *err)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    bool in_place = dtype == CODEC_BOOL ||
                    (dtype == CODEC_F32 && (uintptr_t)bytes % _Alignof(float) == 0);
#else
    bool in_place = dtype == CODEC_BOOL;
#endif
    if (!in_place)
        return codec_tensor_from_raw(bytes, dtype, rank, shape, field, t, err);
    *t = (codec_tensor){0};
    codec_reading r = {.field = field, .err = err};
    int64_t count = 1;
    for (int i = 0; i < rank; i++)
        count *= shape[i];
    bool ok = dtype == CODEC_BOOL ? check_bool_bytes(&r, NULL, bytes, count, field)
                                  : check_finite(&r, NULL, bytes, (size_t)count, dtype, field);
    if (!ok)
        return false;
    t->dtype = dtype;
    t->rank = rank;
    memcpy(t->shape, shape, (size_t)rank * sizeof *shape);
    t->count = count;
    if (count > 0) {
        /* The caller's bytes, which the tensor only reads: the codec's
         * tensors are writable for the decoders that fill them. */
        t->borrowed = true;
        if (dtype == CODEC_BOOL)
            t->b8 = (uint8_t *)(uintptr_t)bytes;
        else
            t->f32 = (float *)(uintptr_t)bytes;
    }
    return true;
}

/* The order of the checks: the text is base64, its elements are finite
 * (the first class), the shape was valid, the byte count fits the shape,
 * bools are 0 or 1 (the second). */
static bool decode_base64_form(codec_reading *r, const codec_member *m_b64, codec_dtype dtype,
                               const declared_shape *ds, codec_tensor *t)
{
    char sub[64];
    join(sub, sizeof sub, r->field, "base64");
    cursor s, value = codec_skip_ws(m_b64->value, m_b64->value_end);
    size_t len = 0, have = 0;
    char *copy;
    if (!base64_text(r, m_b64, sub, &s, &len, &copy))
        return false;
    uint8_t *bytes = NULL;
    size_t elem = dtype_size(dtype);
    bool ok = base64_bytes(r, s, len, copy == NULL, value, sub, &bytes, &have) &&
              (dtype == CODEC_BOOL || check_finite(r, value, bytes, have / elem, dtype, sub));
    free(copy);
    if (ok && ds->bad) {
        *r->err = ds->err;
        ok = false;
    }
    /* read_shape bounded count by INT64_MAX / 8 */
    if (ok && have != (size_t)ds->count * elem) {
        char st[160];
        shape_text(st, sizeof st, ds->dims, ds->rank);
        ok = codec_fail(r->err, CODEC_ERR_SHAPE_MISMATCH, sub, NULL, NULL,
                        "%s holds %zu bytes but shape %s of %s needs %zu", sub, have, st,
                        codec_dtype_name(dtype), (size_t)ds->count * elem);
    }
    if (ok && dtype == CODEC_BOOL)
        ok = check_bool_bytes(r, value, bytes, ds->count, sub);
    if (!ok) {
        codec_tensor_release(bytes);
        return false;
    }
    return bytes_to_tensor(r, bytes, sub, dtype, ds, t);
}

/* --------------------------------------------------------------- flat form */

/* The data array is read (its size bounded by the text; its types are the
 * first class of errors), then held against the declared shape (the
 * second). */
static bool decode_flat_form(codec_reading *r, const codec_member *m_data, codec_dtype dtype,
                             bool declared, const declared_shape *ds, codec_tensor *t)
{
    char sub[64];
    join(sub, sizeof sub, r->field, "data");
    cursor d = codec_skip_ws(m_data->value, m_data->value_end);
    if (dtype == CODEC_F16 || dtype == CODEC_BF16) {
        join(sub, sizeof sub, r->field, "dtype");
        return codec_fail(r->err, CODEC_ERR_WRONG_TYPE, sub, r->text, d,
                          "%s is \"%s\", which is for base64 data; \"data\" holds JSON numbers "
                          "(use \"float32\" or no dtype)", sub, codec_dtype_name(dtype));
    }
    if (d == m_data->value_end || *d != '[')
        return codec_fail(r->err, CODEC_ERR_WRONG_TYPE, sub, r->text, d,
                          "%s must be an array of %s; it is %s", sub,
                          dtype == CODEC_BOOL ? "booleans" : "numbers",
                          d == m_data->value_end ? "missing" : codec_kind_name(*d));
    codec_store s = {.dtype = dtype, .typed = declared, .declared = declared,
                     .hint = (size_t)(m_data->value_end - d) / 8};
    int data_rank;
    int64_t data_shape[CODEC_MAX_RANK];
    cursor after;
    if (!codec_read_arrays(r, sub, d, m_data->value_end, 1, &s, &data_rank, data_shape,
                           &after)) {
        codec_store_free(&s);
        return false;
    }
    if (ds->bad) {
        codec_store_free(&s);
        *r->err = ds->err;
        return false;
    }
    if ((int64_t)s.n != ds->count) {
        char st[160];
        shape_text(st, sizeof st, ds->dims, ds->rank);
        codec_store_free(&s);
        return codec_fail(r->err, CODEC_ERR_SHAPE_MISMATCH, sub, NULL, NULL,
                          "%s has %lld elements but shape %s needs %lld", sub,
                          (long long)data_shape[0], st, (long long)ds->count);
    }
    codec_store_to_tensor(&s, ds->rank, ds->dims, t);
    return true;
}

/* ------------------------------------------------------------ object forms */

/* The members of a tensor object, by name. */
typedef struct {
    const codec_member *shape, *data, *dtype, *base64;
} tensor_members;

static bool find_members(codec_reading *r, cursor p, cursor end, codec_member *m,
                         tensor_members *tm)
{
    const char *field = r->field;
    size_t n;
    char sub[64];
    if (!codec_members_at(r->text, p, end, m, 8, &n, field, r->err)) {
        if (r->err->kind == CODEC_ERR_TOO_MANY_MEMBERS)
            return codec_fail(r->err, CODEC_ERR_UNKNOWN_MEMBER, field, r->text,
                              codec_skip_ws(p, end),
                              "%s has too many fields; a tensor object has \"shape\" and "
                              "\"data\", or \"shape\", \"dtype\" and \"base64\"", field);
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
            return codec_fail(r->err, CODEC_ERR_UNKNOWN_MEMBER, sub, r->text, m[i].key_text,
                              "%s has an unknown field \"%s\"; a tensor object has \"shape\" "
                              "and \"data\", or \"shape\", \"dtype\" and \"base64\"", field,
                              codec_member_key_shown(&m[i], shown, sizeof shown));
        }
    }
    cursor object = codec_skip_ws(p, end);
    if (tm->data && tm->base64) {
        join(sub, sizeof sub, field, "base64");
        return codec_fail(r->err, CODEC_ERR_UNKNOWN_MEMBER, sub, r->text, tm->base64->key_text,
                          "%s has both \"data\" and \"base64\"; give one of them", field);
    }
    if (!tm->shape) {
        join(sub, sizeof sub, field, "shape");
        return codec_fail(r->err, CODEC_ERR_MISSING_MEMBER, sub, r->text, object,
                          "%s needs a \"shape\"", field);
    }
    if (!tm->data && !tm->base64) {
        join(sub, sizeof sub, field, "data");
        return codec_fail(r->err, CODEC_ERR_MISSING_MEMBER, sub, r->text, object,
                          "%s needs \"data\" (an array of numbers) or \"base64\"", field);
    }
    return true;
}

static bool decode_object(codec_reading *r, cursor p, cursor end, codec_tensor *t)
{
    codec_member m[8];
    tensor_members tm = {0};
    if (!find_members(r, p, end, m, &tm))
        return false;
    codec_dtype dtype = CODEC_F32;
    if (tm.dtype && !read_dtype(r, tm.dtype, &dtype))
        return false;
    declared_shape ds = {0};
    if (!read_shape(r, tm.shape->value, tm.shape->value_end, &ds)) {
        if (!codec_error_is_late(&ds.err)) { /* not even an array of numbers: now */
            *r->err = ds.err;
            return false;
        }
        ds.bad = true;
    }
    if (tm.base64)
        return decode_base64_form(r, tm.base64, dtype, &ds, t);
    return decode_flat_form(r, tm.data, dtype, tm.dtype != NULL, &ds, t);
}

/* ------------------------------------------------------------ interface */

static bool decode(codec_reading *r, cursor p, cursor end, codec_tensor *t)
{
    memset(t, 0, sizeof *t);
    p = codec_skip_ws(p, end);
    if (p < end && *p == '[')
        return decode_nested(r, p, end, t);
    if (p < end && *p == '{')
        return decode_object(r, p, end, t);
    return codec_fail(r->err, CODEC_ERR_WRONG_TYPE, r->field, r->text, p,
                      "%s must be a tensor (nested arrays of numbers, {\"shape\", \"data\"} or "
                      "{\"shape\", \"dtype\", \"base64\"}); it is %s",
                      r->field, p < end ? codec_kind_name(*p) : "missing");
}

bool codec_tensor_decode(const char *p, const char *end, const char *field, bool accept_bool,
                         codec_tensor *t, codec_error *err)
{
    codec_reading r = {.text = p, .field = field, .accept_bool = accept_bool, .err = err};
    return decode(&r, p, end, t);
}

bool codec_doc_tensor(const codec_doc *doc, const char *p, const char *end, const char *field,
                      bool accept_bool, codec_tensor *t, codec_error *err)
{
    codec_reading r = {.text = doc->text, .field = field, .accept_bool = accept_bool,
                       .err = err};
    codec_notes_from(&r.notes, doc, p);
    return decode(&r, p, end, t);
}

bool codec_doc_tensor_words(const codec_doc *doc, const char *p, const char *end,
                            const char *field, codec_tensor *t, codec_error *err)
{
    codec_reading r = {.text = doc->text, .field = field, .keep_bf16 = true, .err = err};
    codec_notes_from(&r.notes, doc, p);
    return decode(&r, p, end, t);
}

bool codec_tensor_widen(codec_tensor *t, const char *field, codec_error *err)
{
    if (t->dtype != CODEC_BF16)
        return true;
    float *f = t->count > 0 ? codec_tensor_alloc((size_t)t->count * sizeof *f) : NULL;
    if (t->count > 0 && f == NULL)
        return codec_fail(err, CODEC_ERR_NO_MEMORY, field, NULL, NULL,
                          "out of memory while reading %s", field);
    if (f != NULL) {
        codec_advise_huge(f, (size_t)t->count * sizeof *f);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        for (int64_t i = 0; i < t->count; i++) /* the words are in host order */
            f[i] = codec_bf16_to_f32_one(t->bf16[i]);
#else
        codec_half_to_f32(CODEC_BF16, (const uint8_t *)t->bf16, f, (size_t)t->count,
                          codec_half_path_in_use());
#endif
    }
    codec_tensor_release(t->bf16);
    t->bf16 = NULL;
    t->f32 = f;
    t->dtype = CODEC_F32;
    return true;
}

void codec_tensor_free(codec_tensor *t)
{
    if (!t->borrowed) { /* mostly one of the three is held: no call for the others */
        if (t->f32)
            codec_tensor_release(t->f32);
        if (t->b8)
            codec_tensor_release(t->b8);
        if (t->bf16)
            codec_tensor_release(t->bf16);
    }
    t->borrowed = false;
    t->f32 = NULL;
    t->b8 = NULL;
    t->bf16 = NULL;
}
