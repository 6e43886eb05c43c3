/*
 * api_error: filled by whichever step fails, turned into the body
 * {"error": {"status", "code", "message", "field"}} (or, for the Open
 * Inference Protocol, {"error": "message"}) here and nowhere else; and the
 * codec's errors turned into api_errors, here and nowhere else.
 */
#include "request.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool api_fail(api_error *e, int status, const char *code, const char *field,
              const char *fmt, ...)
{
    e->status = status;
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    snprintf(e->field, sizeof e->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

/* The status and code of each kind of the codec's errors: the form of a
 * value is the client's mistake (400), sizes that do not fit are a
 * request that cannot be computed (422). */
static const struct {
    int status;
    const char *code;
} codec_kinds[] = {
    [CODEC_ERR_SYNTAX] = {400, "invalid_json"},
    [CODEC_ERR_WRONG_TYPE] = {400, "wrong_type"},
    [CODEC_ERR_DUPLICATE_KEY] = {400, "duplicate_key"},
    [CODEC_ERR_TOO_MANY_MEMBERS] = {400, "too_many_fields"},
    [CODEC_ERR_UNKNOWN_MEMBER] = {400, "unknown_field"},
    [CODEC_ERR_MISSING_MEMBER] = {400, "missing_field"},
    [CODEC_ERR_NOT_FINITE] = {400, "invalid_number"},
    [CODEC_ERR_BASE64] = {400, "invalid_base64"},
    [CODEC_ERR_RAGGED] = {422, "ragged_array"},
    [CODEC_ERR_SHAPE] = {422, "invalid_shape"},
    [CODEC_ERR_SHAPE_MISMATCH] = {422, "shape_mismatch"},
    [CODEC_ERR_ELEMENT] = {422, "invalid_value"},
    [CODEC_ERR_NO_MEMORY] = {500, "out_of_memory"},
};

bool api_fail_codec(api_error *err, const codec_error *ce)
{
    size_t k = (size_t)ce->kind;
    if (k >= sizeof codec_kinds / sizeof codec_kinds[0] || !codec_kinds[k].code)
        return api_fail(err, 500, "internal", ce->field, "%s", ce->message);
    return api_fail(err, codec_kinds[k].status, codec_kinds[k].code, ce->field, "%s",
                    ce->message);
}

/* The longest text a field of api_error may give, quoted. */
#define QUOTED_MAX(cap) (CODEC_ESCAPED_MAX(cap) + 2)

/*
 * The JSON string of the text in a fixed field, at p; returns the end.
 * A character that the field's size cut in half is dropped; anything else
 * that is not UTF-8 becomes U+FFFD (codec_escape_text), so the error body
 * is always valid JSON.
 */
static char *put_string(char *p, const char *s, size_t cap)
{
    size_t n = codec_utf8_uncut(s, strnlen(s, cap));
    *p++ = '"';
    p += codec_escape_text(p, CODEC_ESCAPED_MAX(n) + 1, s, n, 0);
    *p++ = '"';
    return p;
}

/* Written directly into one block, the only allocation: this is the body
 * of every refused request. */
char *api_error_json(const api_error *e, size_t *len)
{
    char text[64 + QUOTED_MAX(sizeof e->code) + QUOTED_MAX(sizeof e->message) +
              QUOTED_MAX(sizeof e->field)];
    char *p = text;
    p += snprintf(p, 32, "{\"error\":{\"status\":%d", e->status);
    memcpy(p, ",\"code\":", 8);
    p = put_string(p + 8, e->code, sizeof e->code);
    memcpy(p, ",\"message\":", 11);
    p = put_string(p + 11, e->message, sizeof e->message);
    if (e->field[0]) {
        memcpy(p, ",\"field\":", 9);
        p = put_string(p + 9, e->field, sizeof e->field);
    }
    memcpy(p, "}}", 3);
    p += 2;
    size_t n = (size_t)(p - text);
    char *body = malloc(n + 1);
    if (!body)
        return NULL;
    memcpy(body, text, n + 1);
    if (len)
        *len = n;
    return body;
}

char *api_error_json_oip(const api_error *e, size_t *len)
{
    char text[16 + QUOTED_MAX(sizeof e->message)];
    char *p = text;
    memcpy(p, "{\"error\":", 9);
    p = put_string(p + 9, e->message, sizeof e->message);
    memcpy(p, "}", 2);
    p += 1;
    size_t n = (size_t)(p - text);
    char *body = malloc(n + 1);
    if (!body)
        return NULL;
    memcpy(body, text, n + 1);
    if (len)
        *len = n;
    return body;
}
