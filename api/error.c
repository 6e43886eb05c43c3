/*
 * api_error: filled by whichever step fails, turned into the body
 * {"error": {"status", "code", "message", "field"}} here and nowhere else.
 */
#include "api.h"

#include <jansson.h>
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

/* Length of the longest prefix of s[0..n) that is whole UTF-8 sequences:
 * the fixed-size fields of api_error may have cut one in half, and jansson
 * (rightly) refuses a string that is not UTF-8. */
static size_t utf8_prefix(const char *s, size_t n)
{
    size_t i = 0, good = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3
                   : (c >> 3) == 30 ? 4 : 0;
        if (len == 0 || i + len > n)
            break;
        for (size_t k = 1; k < len; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80)
                return good;
        i += len;
        good = i;
    }
    return good;
}

/* A jansson string of the text in a fixed field, cut to valid UTF-8; if
 * jansson still refuses it (an overlong form, say), its bytes above ASCII
 * become '?', so the error body always exists. */
static json_t *text(const char *s, size_t cap)
{
    size_t n = utf8_prefix(s, strnlen(s, cap));
    json_t *j = json_stringn(s, n);
    if (j)
        return j;
    char ascii[320];
    if (n >= sizeof ascii)
        n = sizeof ascii - 1;
    for (size_t i = 0; i < n; i++)
        ascii[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
    return json_stringn(ascii, n);
}

char *api_error_json(const api_error *e, size_t *len)
{
    json_t *inner = json_object();
    json_t *outer = json_object();
    char *body = NULL;
    if (!inner || !outer)
        goto done;
    json_object_set_new(inner, "status", json_integer(e->status));
    json_object_set_new(inner, "code", text(e->code, sizeof e->code));
    json_object_set_new(inner, "message", text(e->message, sizeof e->message));
    if (e->field[0])
        json_object_set_new(inner, "field", text(e->field, sizeof e->field));
    if (json_object_size(inner) < 3 + (e->field[0] != 0))
        goto done;
    if (json_object_set(outer, "error", inner) != 0)
        goto done;
    /* json_dumpb, not json_dumps: jansson's growing dump buffer ignores a
     * failed append of an object key and carries on, which under memory
     * pressure gives a body with a key missing. Sizing first and dumping
     * into a block of exactly that size never appends to anything. */
    size_t need = json_dumpb(outer, NULL, 0, JSON_COMPACT);
    body = need ? malloc(need + 1) : NULL;
    if (body && json_dumpb(outer, body, need, JSON_COMPACT) != need) {
        free(body);
        body = NULL;
    }
    if (body) {
        body[need] = '\0';
        if (len)
            *len = need;
    }
done:
    json_decref(inner);
    json_decref(outer);
    return body;
}
