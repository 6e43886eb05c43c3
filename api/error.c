/*
 * api_error: filled by whichever step fails, turned into the body
 * {"error": {"status", "code", "message", "field"}} here and nowhere else
 * (and, for the Open Inference Protocol, into {"error": "message"}).
 */
#include "api.h"
#include "json/json_string.h"

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

/* The longest text a field of api_error may give, quoted. */
#define QUOTED_MAX(cap) (JSON_ESCAPED_MAX(cap) + 2)

/*
 * The JSON string of the text in a fixed field, at p; returns the end.
 * A character that the field's size cut in half is dropped; anything else
 * that is not UTF-8 becomes U+FFFD (json_escape_text), so the error body
 * is always valid JSON.
 */
static char *put_string(char *p, const char *s, size_t cap)
{
    size_t n = json_utf8_uncut(s, strnlen(s, cap));
    *p++ = '"';
    p += json_escape_text(p, JSON_ESCAPED_MAX(n) + 1, s, n, 0);
    *p++ = '"';
    return p;
}

/* Written directly rather than through jansson objects (an allocation per
 * member and a sizing dump before the real one): this is the body of every
 * refused request. */
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
