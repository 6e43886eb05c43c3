/*
 * api_handle: the entry the server calls. Checks that the body is strict
 * JSON and an object, hands it to the operation, and turns the outcome into
 * a response (the answer, or the one error body), timing each step.
 */
#include "request.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

double api_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void api_lap(api_timing *t, double *step)
{
    double now = api_now_ms();
    *step += now - t->mark;
    t->mark = now;
}

/* The body must be one JSON object: the fields are its members. */
static bool check_body(const char *body, size_t len, api_error *err)
{
    if (!json_text_validate(body, len, err))
        return false;
    size_t i = 0;
    while (i < len && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' ||
                       body[i] == '\r'))
        i++;
    if (i < len && body[i] != '{')
        return api_fail(err, 400, "wrong_type", "",
                        "the request body must be a JSON object of fields, "
                        "e.g. {\"q\": ..., \"k\": ..., \"v\": ...}");
    return true;
}

/* The first block of the answer's buffer: a small answer (n = d = 4 is
 * about 450 bytes) fits it without growing; larger tensors reserve their
 * room in one step when they are written. */
#define FIRST_BLOCK 1024

static void respond_error(api_response *res, api_error *err)
{
    if (err->status < 400 || err->status > 599 || !err->code[0])
        api_fail(err, 500, "internal", "", "internal error (no error recorded)");
    res->status = err->status;
    res->body = api_error_json(err, &res->body_len);
    if (!res->body) {
        /* Not even the error object could be built: say so in the status. */
        res->status = 500;
        res->body_len = 0;
    }
}

void api_handle(api_op op, const char *body, size_t len, const api_limits *lim,
                api_response *res)
{
    memset(res, 0, sizeof *res);
    api_error err = {0};
    api_timing t = {.mark = api_now_ms()};
    api_buf out = {.data = malloc(FIRST_BLOCK)};
    if (out.data) {
        out.cap = FIRST_BLOCK;
        out.data[0] = '\0';
    }
    bool ok = body != NULL || len == 0;
    if (!ok)
        api_fail(&err, 500, "internal", "", "no request body given");
    ok = ok && check_body(body ? body : "", len, &err);
    if (ok) {
        switch (op) {
        case API_OP_ATTENTION:
            ok = api_attention(body, len, lim, &t, &out, &err);
            break;
        case API_OP_MULTIHEAD:
            ok = api_multihead(body, len, lim, &t, &out, &err);
            break;
        default:
            ok = api_fail(&err, 404, "not_found", "", "unknown operation %d",
                          (int)op);
        }
    } else {
        api_lap(&t, &t.decode_ms);
    }
    if (ok) /* a NUL after the body, for callers that want a C string */
        api_buf_append(&out, "", 1);
    if (ok && out.failed)
        ok = api_fail(&err, 500, "out_of_memory", "",
                      "out of memory while writing the response");
    res->decode_ms = t.decode_ms;
    res->compute_ms = t.compute_ms;
    res->encode_ms = t.encode_ms;
    if (ok) {
        res->status = 200;
        res->body = out.data;
        res->body_len = out.len - 1;
        return;
    }
    api_buf_free(&out);
    respond_error(res, &err);
}

void api_response_free(api_response *res)
{
    if (!res)
        return;
    free(res->body);
    res->body = NULL;
    res->body_len = 0;
}
