/*
 * Reading the members of a request body against an operation's field table:
 * the one place where unknown, missing and mistyped fields are refused.
 *
 * Tensors go through the codec (codec_doc_tensor); the other values are
 * scalars read from their text in place by the codec's readers: numbers as
 * the tensors' numbers are, so that "scale": 0.1 rounds to float32 exactly
 * as a tensor's 0.1 does and 1e39 is refused the same way, integers exactly
 * (from their digits, not a rounded double), strings with their escapes
 * resolved.
 */
#include "request.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Edit distance with adjacent transpositions (optimal string alignment),
 * case-insensitive, so that "casual" is one edit from "causal". */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 64;
    unsigned char d[64][64]; /* distances are at most 63 */
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (unsigned char)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (unsigned char)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int ca = tolower((unsigned char)a[i - 1]);
            int cb = tolower((unsigned char)b[j - 1]);
            unsigned best = d[i - 1][j - 1] + (unsigned)(ca != cb);
            if (d[i - 1][j] + 1u < best)
                best = d[i - 1][j] + 1u;
            if (d[i][j - 1] + 1u < best)
                best = d[i][j - 1] + 1u;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb &&
                d[i - 2][j - 2] + 1u < best)
                best = d[i - 2][j - 2] + 1u;
            d[i][j] = (unsigned char)best;
        }
    }
    return d[la][lb];
}

/* The field name nearest to `key`, when near enough to be a likely typo:
 * at most two edits, and fewer than half the name's letters (so that "x"
 * is not offered "q"). */
const char *api_nearest_field(const char *key, const api_field *schema, size_t n)
{
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(key, schema[i].name);
        if (d < best_d && (d == 0 || 2 * d < strlen(schema[i].name))) {
            best = schema[i].name;
            best_d = d;
        }
    }
    return best;
}

static bool has_field(const char *key, const api_field *schema, size_t n)
{
    for (size_t i = 0; schema && i < n; i++)
        if (strcmp(key, schema[i].name) == 0)
            return true;
    return false;
}

static bool unknown_field(const codec_member *m, const api_field *schema,
                          size_t n, const api_field *other, size_t n_other,
                          const char *other_route, api_error *err)
{
    const char *shown = m->key_too_long ? "..." : "";
    char key[80]; /* the whole key, escaped: "q\u0000x" is not cut at its NUL */
    codec_member_key_shown(m, key, sizeof key);
    if (!m->key_too_long && has_field(m->key, other, n_other))
        return api_fail(err, 400, "unknown_field", m->key,
                        "unknown field \"%s\" (it belongs to %s)", m->key,
                        other_route);
    const char *near = m->key_too_long ? NULL : api_nearest_field(m->key, schema, n);
    if (near)
        return api_fail(err, 400, "unknown_field", m->key,
                        "unknown field \"%s\" (did you mean \"%s\"?)", m->key,
                        near);
    char names[400] = "";
    size_t used = 0;
    for (size_t i = 0; i < n && used < sizeof names; i++)
        used += (size_t)snprintf(names + used, sizeof names - used, "%s%s",
                                 i ? ", " : "", schema[i].name);
    /* A key cut short (too long, or an escaped NUL: "q\u0000") is named
     * with the "..." too, so that `field` never names a real field. */
    char field[sizeof err->field];
    snprintf(field, sizeof field, "%.*s%s", (int)(sizeof field - 1 - strlen(shown)), m->key,
             shown);
    return api_fail(err, 400, "unknown_field", field,
                    "unknown field \"%s\"; the fields are %s", key, names);
}

/* A string value, decoded (escapes resolved) into text[0..cap) and
 * NUL-terminated; a longer one is cut, which only shortens the message that
 * quotes it. An escaped NUL ("nested\u0000x" is valid JSON) ends the text
 * with a visible "\u0000...", so that the value matches no allowed one and
 * the message shows why. */
void api_string_value(const codec_member *m, char *text, size_t cap)
{
    size_t n = codec_string_decode(m->value, m->value_end, text, cap - 1, NULL);
    if (n > cap - 1)
        n = cap - 1;
    text[n] = '\0';
    size_t len = strlen(text);
    if (len < n)
        snprintf(text + len, cap - len, "\\u0000...");
}

static bool wrong_type(const api_field *f, const codec_member *m,
                       const char *wanted, api_error *err)
{
    return api_fail(err, 400, "wrong_type", f->name, "%s must be %s, got %s",
                    f->name, wanted, codec_kind_name(*m->value));
}

static bool read_bool(const api_field *f, const codec_member *m, api_value *v,
                      api_error *err)
{
    if (*m->value != 't' && *m->value != 'f')
        return wrong_type(f, m, "true or false (a JSON boolean, not 0/1 or a string)",
                          err);
    v->flag = *m->value == 't';
    return true;
}

static bool read_number(const api_field *f, const codec_member *m,
                        api_value *v, api_error *err)
{
    if (*m->value != '-' && !isdigit((unsigned char)*m->value))
        return wrong_type(f, m, "a number", err);
    const char *stop;
    if (!codec_parse_float(m->value, m->value_end, &stop, &v->number))
        return api_fail(err, 400, "invalid_number", f->name,
                        "%s=%.*s is not finite as a float32 (largest is about 3.4e38)",
                        f->name, (int)(m->value_end - m->value < 40 ? m->value_end - m->value : 40),
                        m->value);
    return true;
}

/* The integer whose JSON text (a validated value) is [p, end), for `field`
 * (`name` in messages: "num_heads", "window[1]"): 400 wrong_type for
 * anything but a number without a fractional part, 422 invalid_value
 * beyond +-1e15 (or written in 64 bytes or more). */
static bool integer_value(const char *field, const char *name, const char *p,
                          const char *end, int64_t *out, api_error *err)
{
    if (*p != '-' && !isdigit((unsigned char)*p))
        return api_fail(err, 400, "wrong_type", field, "%s must be an integer, got %s",
                        name, codec_kind_name(*p));
    int len = (int)(end - p);
    if (len >= 64)
        return api_fail(err, 422, "invalid_value", field,
                        "%s=%.40s... is out of range", name, p);
    const char *stop;
    switch (codec_parse_integer(p, end, 1000000000000000, &stop, out)) {
    case CODEC_INT_OK:
        return true;
    case CODEC_INT_FRACTION:
        return api_fail(err, 400, "wrong_type", field, "%s must be an integer, got %.*s", name,
                        len, p);
    case CODEC_INT_RANGE:
        break;
    }
    return api_fail(err, 422, "invalid_value", field, "%s=%.*s is out of range", name, len, p);
}

static bool read_integer(const api_field *f, const codec_member *m,
                         api_value *v, api_error *err)
{
    return integer_value(f->name, f->name, m->value, m->value_end, &v->integer, err);
}

/* "window": [left, right]. The form (an array of exactly two integers) is
 * the field's type, so anything else is 400; whether the numbers make a
 * window (>= -1) is judged with the other options (api_variants_setup). */
static bool read_window(const api_field *f, const codec_member *m, api_value *v,
                        api_error *err)
{
    static const char *const FORM =
        "[left, right], an array of two integers (-1: unbounded on that side)";
    const char *p = m->value, *end = m->value_end;
    if (*p != '[')
        return wrong_type(f, m, FORM, err);
    p = codec_skip_ws(p + 1, end);
    int count = 0;
    while (p < end && *p != ']') {
        if (count == 2)
            return api_fail(err, 400, "wrong_type", f->name,
                            "%s has more than two entries; it must be %s", f->name, FORM);
        const char *after = codec_skip_value(p, end);
        char name[80];
        snprintf(name, sizeof name, "%s[%d]", f->name, count);
        if (!integer_value(f->name, name, p, after, &v->pair[count], err))
            return false;
        count++;
        p = codec_skip_ws(after, end);
        if (p < end && *p == ',')
            p = codec_skip_ws(p + 1, end);
    }
    if (count != 2)
        return api_fail(err, 400, "wrong_type", f->name, "%s has %d entr%s; it must be %s",
                        f->name, count, count == 1 ? "y" : "ies", FORM);
    return true;
}

/* "rope": {"base": b}: an object whose one member is the base, so that a
 * misspelt option ("theta", "bse") is refused as an unknown field is.
 * Whether b makes a rotation (> 0) is judged with the shapes. */
static bool read_rope(const api_field *f, const codec_member *m, api_value *v,
                      api_error *err)
{
    if (*m->value != '{')
        return wrong_type(f, m, "an object {\"base\": number}", err);
    codec_member members[4];
    size_t count = 0;
    char sub[sizeof err->field];
    codec_error ce;
    if (!codec_members(m->value, m->value_end, members, 4, &count, f->name, &ce)) {
        if (ce.kind == CODEC_ERR_TOO_MANY_MEMBERS)
            return api_fail(err, 400, "unknown_field", f->name,
                            "%s has too many fields; it is {\"base\": number}", f->name);
        return api_fail_codec(err, &ce);
    }
    const codec_member *base = NULL;
    for (size_t i = 0; i < count; i++) {
        if (!members[i].key_too_long && strcmp(members[i].key, "base") == 0) {
            base = &members[i];
            continue;
        }
        char key[44]; /* 40 bytes of it, then "..." */
        codec_member_key_shown(&members[i], key, sizeof key);
        snprintf(sub, sizeof sub, "%s.%s", f->name, key);
        return api_fail(err, 400, "unknown_field", sub,
                        "%s has an unknown field \"%s\"; its only field is \"base\" "
                        "(the rotary base, e.g. 10000)", f->name, key);
    }
    snprintf(sub, sizeof sub, "%s.base", f->name);
    if (!base || *base->value == 'n')
        return api_fail(err, 400, "missing_field", sub,
                        "%s needs \"base\" (the rotary base, e.g. {\"base\": 10000})%s",
                        f->name, base ? " (it is null)" : "");
    const api_field as_number = {sub, API_FIELD_NUMBER, true};
    return read_number(&as_number, base, v, err);
}

static bool out_of_memory(const api_field *f, api_error *err)
{
    return api_fail(err, 500, "out_of_memory", f->name,
                    "out of memory while reading %s", f->name);
}

/* "seq_lens": [n_1, ..., n_B], an array of integers (400 for anything
 * else), each >= 0 (422 invalid_value naming the entry). Whether they fit
 * the tensors is judged with the shapes (api_ragged_setup). */
static bool read_lengths(const api_field *f, const codec_member *m, api_value *v,
                         api_error *err)
{
    static const char *const FORM = "an array of integers >= 0, one length per sequence";
    const char *p = m->value, *end = m->value_end;
    if (*p != '[')
        return wrong_type(f, m, FORM, err);
    int64_t count = 0; /* a first pass counts the entries, the second reads them */
    for (const char *e = codec_skip_ws(p + 1, end); e < end && *e != ']';) {
        count++;
        e = codec_skip_ws(codec_skip_value(e, end), end);
        if (e < end && *e == ',')
            e = codec_skip_ws(e + 1, end);
    }
    v->lengths = malloc((size_t)(count > 0 ? count : 1) * sizeof *v->lengths);
    if (!v->lengths)
        return out_of_memory(f, err);
    v->count = count;
    int64_t i = 0;
    for (const char *e = codec_skip_ws(p + 1, end); e < end && *e != ']'; i++) {
        const char *after = codec_skip_value(e, end);
        char name[80];
        snprintf(name, sizeof name, "%s[%lld]", f->name, (long long)i);
        bool ok = integer_value(f->name, name, e, after, &v->lengths[i], err);
        if (ok && v->lengths[i] < 0)
            ok = api_fail(err, 422, "invalid_value", f->name,
                          "%s is %lld; a length must be >= 0 (0: an empty sequence)", name,
                          (long long)v->lengths[i]);
        if (!ok) {
            free(v->lengths);
            v->lengths = NULL;
            return false;
        }
        e = codec_skip_ws(after, end);
        if (e < end && *e == ',')
            e = codec_skip_ws(e + 1, end);
    }
    return true;
}

static bool read_encoding(const api_field *f, const codec_member *m,
                          api_value *v, api_error *err)
{
    if (*m->value != '"')
        return wrong_type(f, m, "one of \"nested\", \"flat\", \"base64\"", err);
    char s[64];
    api_string_value(m, s, sizeof s);
    bool ok = true;
    if (strcmp(s, "nested") == 0)
        v->encoding = CODEC_ENC_NESTED;
    else if (strcmp(s, "flat") == 0)
        v->encoding = CODEC_ENC_FLAT;
    else if (strcmp(s, "base64") == 0)
        v->encoding = CODEC_ENC_BASE64;
    else
        ok = api_fail(err, 422, "invalid_value", f->name,
                      "%s must be one of \"nested\", \"flat\", \"base64\", got \"%.40s\"",
                      f->name, s);
    return ok;
}

static bool read_dtype(const api_field *f, const codec_member *m, api_value *v,
                       api_error *err)
{
    if (*m->value != '"')
        return wrong_type(f, m, "one of \"float32\", \"float16\", \"bfloat16\"", err);
    char s[64];
    api_string_value(m, s, sizeof s);
    static const codec_dtype dtypes[] = {CODEC_F32, CODEC_F16, CODEC_BF16};
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (strcmp(s, codec_dtype_name(dtypes[i])) == 0) {
            v->dtype = dtypes[i];
            return true;
        }
    return api_fail(err, 422, "invalid_value", f->name,
                    "%s must be one of \"float32\", \"float16\", \"bfloat16\", got \"%.40s\"",
                    f->name, s);
}

/* "precision": "float32" | "bfloat16" (attn.h states the arithmetic of each). */
static bool read_precision(const api_field *f, const codec_member *m, api_value *v,
                           api_error *err)
{
    if (*m->value != '"')
        return wrong_type(f, m, "one of \"float32\", \"bfloat16\"", err);
    char s[64];
    api_string_value(m, s, sizeof s);
    if (strcmp(s, "float32") == 0)
        v->precision = ATTN_PRECISION_FLOAT32;
    else if (strcmp(s, "bfloat16") == 0)
        v->precision = ATTN_PRECISION_BFLOAT16;
    else
        return api_fail(err, 422, "invalid_value", f->name,
                        "%s must be one of \"float32\", \"bfloat16\", got \"%.40s\"%s", f->name,
                        s, strcmp(s, "bf16") == 0 ? " (bfloat16 is spelt out)" : "");
    return true;
}

bool api_output_encoding(const api_value *encoding, const api_value *dtype, codec_encoding *out,
                         api_error *err)
{
    *out = encoding->present ? encoding->encoding : CODEC_ENC_NESTED;
    if (!dtype->present)
        return true;
    if (*out != CODEC_ENC_BASE64)
        return api_fail(err, 422, "invalid_value", "output_dtype",
                        "output_dtype is the dtype of base64 outputs; it needs "
                        "\"output_encoding\": \"base64\" (the numbers of nested and flat "
                        "outputs are float32 already)");
    *out = dtype->dtype == CODEC_F16 ? CODEC_ENC_BASE64_F16
         : dtype->dtype == CODEC_BF16 ? CODEC_ENC_BASE64_BF16 : CODEC_ENC_BASE64;
    return true;
}

static bool read_weights_mode(const api_field *f, const codec_member *m,
                              api_value *v, api_error *err)
{
    if (*m->value == 't' || *m->value == 'f') {
        v->flag = *m->value == 't';
        return true;
    }
    if (*m->value != '"')
        return wrong_type(f, m, "true, false or \"mean\"", err);
    char s[64];
    api_string_value(m, s, sizeof s);
    bool ok = strcmp(s, "mean") == 0;
    if (ok)
        v->flag = v->mean = true;
    else
        api_fail(err, 422, "invalid_value", f->name,
                 "%s must be true, false or \"mean\", got \"%.40s\"", f->name, s);
    return ok;
}

/* Base64 can carry what JSON numbers cannot: NaN and infinities. Attention
 * over them has no meaning, so they are refused like 1e39; but for an
 * additive mask -inf means "hidden" (PyTorch's and Hugging Face's masks are
 * built so), and so does any value at or below API_MASK_HIDDEN (they use
 * torch.finfo(float32).min, -3.4e38): such a value becomes -inf, which
 * libattn treats exactly as a boolean false. Nested arrays hold JSON
 * numbers only, which the codec has already refused when not finite as a
 * float32. */
#define API_MASK_HIDDEN (-1e30f)

/* The first element of x[0..n) that is not finite, or -1: by blocks, each
 * scanned without a branch per element (an exponent of all ones is a NaN
 * or an infinity), which the compiler turns into vector code; a block
 * with one is looked at again for its index. The codec refuses such a
 * base64 element already (its check_finite), so this is the API's own
 * guarantee, kept cheap: element by element, a decode step's q, k and v
 * (6144 floats) took ~1.5 us of the step's decoding. */
static int64_t first_not_finite(const float *x, int64_t n)
{
    enum { BLOCK = 1024 };
    for (int64_t b = 0; b < n; b += BLOCK) {
        const int64_t e = n - b > BLOCK ? b + BLOCK : n;
        uint32_t bad = 0;
        for (int64_t i = b; i < e; i++) {
            uint32_t u;
            memcpy(&u, &x[i], sizeof u);
            bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
        }
        for (int64_t i = b; bad && i < e; i++)
            if (!isfinite(x[i]))
                return i;
    }
    return -1;
}

static bool check_finite_input(const api_field *f, const codec_member *m,
                               codec_tensor *t, api_error *err)
{
    const bool mask = f->kind == API_FIELD_MASK;
    if (t->dtype != CODEC_F32 || (!mask && *m->value == '['))
        return true;
    if (!mask) {
        int64_t i = first_not_finite(t->f32, t->count);
        if (i >= 0)
            return api_fail(err, 400, "invalid_number", f->name,
                            "%s[%lld] (row-major) is not a finite float32", f->name,
                            (long long)i);
        return true;
    }
    for (int64_t i = 0; i < t->count; i++) {
        if (t->f32[i] <= API_MASK_HIDDEN) {
            t->f32[i] = -INFINITY;
            continue;
        }
        if (!isfinite(t->f32[i]) && *m->value != '[')
            return api_fail(err, 400, "invalid_number", f->name,
                            "%s[%lld] (row-major) is not a finite float32 (an additive mask "
                            "may hide a key with -inf or any value at or below -1e30)",
                            f->name, (long long)i);
    }
    return true;
}

static bool read_tensor(const codec_doc *doc, const api_field *f, const codec_member *m,
                        api_value *v, api_error *err)
{
    bool is_mask = f->kind == API_FIELD_MASK;
    codec_error ce;
    bool ok = f->kind == API_FIELD_OPERAND
                  ? codec_doc_tensor_words(doc, m->value, m->value_end, f->name, &v->tensor, &ce)
                  : codec_doc_tensor(doc, m->value, m->value_end, f->name, is_mask, &v->tensor,
                                     &ce);
    if (!ok)
        return api_fail_codec(err, &ce);
    if (!check_finite_input(f, m, &v->tensor, err)) {
        codec_tensor_free(&v->tensor);
        return false;
    }
    return true;
}

bool api_read_value(const codec_doc *doc, const api_field *f, const codec_member *m,
                    api_value *v, api_error *err)
{
    switch (f->kind) {
    case API_FIELD_TENSOR:
    case API_FIELD_OPERAND:
    case API_FIELD_MASK: return read_tensor(doc, f, m, v, err);
    case API_FIELD_BOOL: return read_bool(f, m, v, err);
    case API_FIELD_NUMBER: return read_number(f, m, v, err);
    case API_FIELD_INTEGER: return read_integer(f, m, v, err);
    case API_FIELD_ENCODING: return read_encoding(f, m, v, err);
    case API_FIELD_WEIGHTS: return read_weights_mode(f, m, v, err);
    case API_FIELD_DTYPE: return read_dtype(f, m, v, err);
    case API_FIELD_WINDOW: return read_window(f, m, v, err);
    case API_FIELD_ROPE: return read_rope(f, m, v, err);
    case API_FIELD_LENGTHS: return read_lengths(f, m, v, err);
    case API_FIELD_PRECISION: return read_precision(f, m, v, err);
    }
    return api_fail(err, 500, "internal", f->name, "field %s has no reader", f->name);
}

bool api_read_fields(const codec_doc *doc, const api_field *schema, size_t n_fields,
                     const api_field *other, size_t n_other, const char *other_route,
                     api_value *values, api_error *err)
{
    codec_member members[API_MAX_FIELDS];
    size_t count = 0;
    codec_error ce;
    if (!codec_doc_members(doc, members, API_MAX_FIELDS, &count, "", &ce))
        return api_fail_codec(err, &ce);

    /* Which member holds each field; names first, so that a typo is
     * reported before anything else and no tensor is decoded in vain. */
    const codec_member *of_field[API_MAX_FIELDS] = {0};
    for (size_t i = 0; i < count; i++) {
        size_t f = 0;
        while (f < n_fields && (members[i].key_too_long ||
                                strcmp(members[i].key, schema[f].name) != 0))
            f++;
        if (f == n_fields)
            return unknown_field(&members[i], schema, n_fields, other, n_other,
                                 other_route, err);
        of_field[f] = &members[i];
    }
    for (size_t f = 0; f < n_fields; f++) {
        bool is_null = of_field[f] && *of_field[f]->value == 'n';
        if (schema[f].required && (!of_field[f] || is_null))
            return api_fail(err, 400, "missing_field", schema[f].name,
                            "the field \"%s\" is required%s", schema[f].name,
                            is_null ? " (it is null)" : "");
    }

    memset(values, 0, n_fields * sizeof *values);
    for (size_t f = 0; f < n_fields; f++) {
        const codec_member *m = of_field[f];
        if (!m || *m->value == 'n')
            continue;
        if (!api_read_value(doc, &schema[f], m, &values[f], err)) {
            api_values_free(values, n_fields);
            return false;
        }
        values[f].present = true;
    }
    return true;
}

void api_values_free(api_value *values, size_t n_fields)
{
    /* (every field of the table, twice a request, most of them absent:
     * free(NULL) is a call each, so only what is there is freed) */
    for (size_t f = 0; f < n_fields; f++) {
        if (values[f].tensor.f32 || values[f].tensor.b8 || values[f].tensor.bf16)
            codec_tensor_free(&values[f].tensor);
        if (values[f].lengths) {
            free(values[f].lengths);
            values[f].lengths = NULL;
        }
        values[f].present = false;
    }
}

bool api_operand_setup(api_value *v, const char *field, attn_precision precision,
                       attn_dtype *dtype, api_error *err)
{
    *dtype = ATTN_DTYPE_FLOAT32;
    if (!v->present || v->tensor.dtype != CODEC_BF16)
        return true;
    if (precision == ATTN_PRECISION_BFLOAT16) {
        *dtype = ATTN_DTYPE_BFLOAT16;
        return true;
    }
    codec_error ce;
    return codec_tensor_widen(&v->tensor, field, &ce) || api_fail_codec(err, &ce);
}

const void *api_field_operand(const api_call *c, int field)
{
    const codec_tensor *t = &c->f[field].tensor;
    if (!c->f[field].present)
        return NULL;
    return t->dtype == CODEC_BF16 ? (const void *)t->bf16 : (const void *)t->f32;
}
