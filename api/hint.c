/*
 * What a body that is not JSON most likely is, said in its 400: the two
 * mistakes people make most, which the validator alone can only call an
 * unexpected character.
 *   - A form submission (`q=[[1]]&k=...`): curl -d without a JSON body, or a
 *     browser form. JSON is the body itself, not a field of a form.
 *   - NaN or Infinity: Python's json.dumps and JavaScript's JSON-like
 *     printers write them, RFC 8259 has no such literal.
 * The codec decides where the text stops being JSON; this only reads what
 * is there.
 */
#include "request.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static bool name_char(char c, bool first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           (!first && ((c >= '0' && c <= '9') || c == '.' || c == '-'));
}

/* "name=" at the start of the body (after spaces). */
static bool form_encoded(const char *body, size_t len)
{
    size_t i = (size_t)(codec_skip_ws(body, body + len) - body);
    size_t start = i;
    while (i < len && name_char(body[i], i == start))
        i++;
    return i > start && i < len && body[i] == '=';
}

/* NaN or Infinity (any case, "inf" too, a sign allowed) at p, as a word. */
static bool not_finite_literal(const char *p, const char *end)
{
    if (p < end && (*p == '-' || *p == '+'))
        p++;
    static const char *const words[] = {"infinity", "nan", "inf"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(end - p) >= n && !strncasecmp(p, words[i], n) &&
            ((size_t)(end - p) == n || !name_char(p[n], false)))
            return true;
    }
    return false;
}

void api_hint_not_json(const char *body, size_t len, size_t offset, api_error *err)
{
    const char *hint = NULL;
    if (form_encoded(body, len))
        hint = "; the body looks form-encoded (q=...&k=...): send the JSON object "
               "itself, {\"q\": ..., \"k\": ..., \"v\": ...}, with Content-Type: "
               "application/json";
    else if (offset < len && not_finite_literal(body + offset, body + len))
        hint = "; NaN and Infinity are not JSON (RFC 8259 has no such literal, though "
               "Python's json.dumps writes them): send finite numbers, and hide a "
               "position with the mask rather than with -Infinity";
    size_t used = strlen(err->message);
    if (hint && used + strlen(hint) < sizeof err->message)
        memcpy(err->message + used, hint, strlen(hint) + 1);
}
