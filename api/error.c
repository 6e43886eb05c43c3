/*
 * api_error: filled by whichever step fails, turned into the body
 * {"error": {"status", "code", "message", "field"}} here and nowhere else.
 */
#include "api.h"

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
 * the fixed-size fields of api_error may have cut one in half. */
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

/* Whether s[0..n) is UTF-8 as jansson accepts it for a string: no overlong
 * forms, no surrogates, nothing above U+10FFFF. */
static bool utf8_valid(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2
                   : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (len == 0 || i + len > n)
            return false;
        uint32_t cp = len == 1 ? c : c & (0x3Fu >> (len - 1));
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + k] & 0x3Fu);
        }
        static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || cp < least[len])
            return false;
        i += len;
    }
    return true;
}

/* The longest text a field of api_error may give: every byte escaped as
 * \u00XX, plus the quotes. */
#define QUOTED_MAX(cap) (6 * (cap) + 2)

/*
 * The JSON string of the text in a fixed field, at p; returns the end.
 * The text is cut to whole UTF-8 sequences, and if it is still not valid
 * UTF-8 (an overlong form, say) its bytes above ASCII become '?' (at most
 * 319 of them), so the error body always exists. Escapes are jansson's
 * compact ones: \" \\ \b \f \n \r \t, other control characters as
 * \u00XX, everything else (UTF-8 included) as it is.
 */
static char *put_string(char *p, const char *s, size_t cap)
{
    size_t n = utf8_prefix(s, strnlen(s, cap));
    bool ascii = !utf8_valid((const unsigned char *)s, n);
    if (ascii && n > 319)
        n = 319;
    *p++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (ascii && c >= 0x80)
            c = '?';
        if (c >= 0x20 && c != '"' && c != '\\') {
            *p++ = (char)c;
            continue;
        }
        *p++ = '\\';
        switch (c) {
        case '"': *p++ = '"'; break;
        case '\\': *p++ = '\\'; break;
        case '\b': *p++ = 'b'; break;
        case '\f': *p++ = 'f'; break;
        case '\n': *p++ = 'n'; break;
        case '\r': *p++ = 'r'; break;
        case '\t': *p++ = 't'; break;
        default:
            memcpy(p, "u00", 3);
            p[3] = "0123456789ABCDEF"[c >> 4];
            p[4] = "0123456789ABCDEF"[c & 15];
            p += 5;
        }
    }
    *p++ = '"';
    return p;
}

/* Written directly rather than through jansson objects (an allocation per
 * member and a sizing dump before the real one): this is the body of every
 * refused request, and the text is the same as jansson's compact dump. */
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
