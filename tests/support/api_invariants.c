/*
 * The properties of api_handle()'s answers that hold for any body (see
 * api_invariants.h). jansson is the independent judge of what is JSON: the
 * API has its own strict validator and writers, so the check does not ask
 * the code under test whether its own output is well formed.
 */
#include "api_invariants.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* 2e5 FLOPs: shapes up to about n = d = 16, under a millisecond each. */
const api_limits api_invariants_limits = {.max_work = 2e5, .threads = 1};

static bool fail(char *why, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool fail(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return false;
}

static bool nonempty_string(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_string(v) && json_string_length(v) > 0;
}

/* The error object: {"error": {"status", "code", "message", "field"?}}. */
static bool check_error(json_t *doc, int status, char *why, size_t cap)
{
    json_t *e = json_object_get(doc, "error");
    if (json_object_size(doc) != 1 || !json_is_object(e))
        return fail(why, cap, "status %d without exactly one member \"error\"", status);
    json_t *st = json_object_get(e, "status");
    /* read with JSON_DECODE_INT_AS_REAL: every number is a real */
    if (!json_is_number(st) || json_number_value(st) != (double)status)
        return fail(why, cap, "error.status is not the HTTP status %d", status);
    if (!nonempty_string(e, "code") || !nonempty_string(e, "message"))
        return fail(why, cap, "error.code or error.message missing or empty (status %d)",
                    status);
    json_t *field = json_object_get(e, "field");
    if (field && !nonempty_string(e, "field"))
        return fail(why, cap, "error.field is present but not a non-empty string");
    size_t known = 3 + (field != NULL);
    if (json_object_size(e) != known)
        return fail(why, cap, "error object has unexpected members");
    return true;
}

static bool check_one(api_op op, const char *body, size_t len, bool body_is_object,
                      char *why, size_t cap)
{
    const char *route = op == API_OP_ATTENTION ? "attention" : "multihead";
    char inner[300] = "";
    api_response res;
    api_handle(op, body, len, &api_invariants_limits, &res);
    bool ok = true;
    if (res.status != 200 && res.status != 400 && res.status != 422) {
        ok = fail(inner, sizeof inner, "status %d", res.status);
    } else if (!res.body) {
        ok = fail(inner, sizeof inner, "status %d with no body", res.status);
    } else if (strlen(res.body) != res.body_len) {
        ok = fail(inner, sizeof inner, "body_len %zu but the body has a NUL at %zu",
                  res.body_len, strlen(res.body));
    } else if (res.status == 200 && !body_is_object) {
        ok = fail(inner, sizeof inner, "200 for a body that is not one strict JSON object");
    } else {
        json_error_t jerr;
        json_t *doc = json_loadb(res.body, res.body_len,
                                 JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &jerr);
        if (!json_is_object(doc))
            ok = fail(inner, sizeof inner, "answer is not a JSON object (%s at %d): %.80s",
                      jerr.text, jerr.position, res.body);
        else if (res.status != 200)
            ok = check_error(doc, res.status, inner, sizeof inner);
        else if (!json_object_get(doc, "output") || !json_is_object(json_object_get(doc, "meta")))
            ok = fail(inner, sizeof inner, "200 without \"output\" and \"meta\"");
        json_decref(doc);
    }
    api_response_free(&res);
    if (!ok)
        fail(why, cap, "/v1/%s: %s", route, inner);
    return ok;
}

bool api_invariants_check(const char *body, size_t len, char *why, size_t cap)
{
    /* jansson's reading of the request: RFC 8259 allows \u0000 in strings,
     * and big integers are numbers like any other. */
    json_error_t jerr;
    json_t *req = json_loadb(body, len,
                             JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL,
                             &jerr);
    bool body_is_object = json_is_object(req);
    json_decref(req);
    return check_one(API_OP_ATTENTION, body, len, body_is_object, why, cap) &&
           check_one(API_OP_MULTIHEAD, body, len, body_is_object, why, cap);
}
