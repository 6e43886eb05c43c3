/*
 * Additive masks as PyTorch and Hugging Face build them: -inf (which only
 * base64 can carry) or torch.finfo(torch.float32).min (-3.4028235e38) where
 * a key is hidden. Any additive value at or below -1e30 must mask exactly
 * as a boolean false does: the same output, weights, lse, statistics and
 * gradients, bit for bit, on both routes; a value just above -1e30 is an
 * ordinary (huge) bias, seen by the statistics. +inf and NaN stay errors.
 */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"

static const api_limits LIM = {.threads = 2};

/* base64 of n little-endian float32 values. */
static char *b64_floats(const float *x, size_t n)
{
    static const char al[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *b = (const unsigned char *)x;
    size_t len = 4 * n, o = 0;
    char *out = malloc(4 * ((len + 2) / 3) + 1);
    ck_assert_ptr_nonnull(out);
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)b[i] << 16 | (i + 1 < len ? (unsigned)b[i + 1] << 8 : 0) |
                     (i + 2 < len ? b[i + 2] : 0);
        out[o++] = al[v >> 18 & 63];
        out[o++] = al[v >> 12 & 63];
        out[o++] = i + 1 < len ? al[v >> 6 & 63] : '=';
        out[o++] = i + 2 < len ? al[v & 63] : '=';
    }
    out[o] = '\0';
    return out;
}

/* The answer without its meta (timings, work), as canonical JSON text. */
static char *answer(api_op op, const char *body, int want_status)
{
    api_response res;
    api_handle(op, body, strlen(body), &LIM, &res);
    ck_assert_msg(res.status == want_status, "status %d, wanted %d: %.300s", res.status,
                  want_status, res.body ? res.body : "");
    json_error_t je;
    json_t *j = json_loadb(res.body, res.body_len, 0, &je);
    ck_assert_msg(j != NULL, "not JSON: %s", je.text);
    json_object_del(j, "meta");
    char *text = json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(j);
    api_response_free(&res);
    return text;
}

/* The hidden pattern of the cases: a 5 x 7 mask with a fully hidden row
 * (row 2), a row with one key left (row 4), scattered hidden keys. */
#define NQ 5
#define NK 7
static bool hidden(int i, int j)
{
    return i == 2 || (i == 4 && j != 3) || (i * 3 + j) % 5 == 0;
}

/* The mask field in one of the forms: a boolean mask, or an additive one
 * whose hidden entries are `value` (nested text) or -inf (base64) and whose
 * visible entries are 0, so that it means what the boolean mask means. */
static char *mask_field(const char *form, const char *value)
{
    char *buf = malloc(8192);
    ck_assert_ptr_nonnull(buf);
    size_t o = 0;
    if (!strcmp(form, "base64")) {
        float m[NQ * NK];
        for (int i = 0; i < NQ; i++)
            for (int j = 0; j < NK; j++)
                m[i * NK + j] = hidden(i, j) ? -INFINITY : 0.0f;
        char *b = b64_floats(m, NQ * NK);
        snprintf(buf, 8192, "{\"shape\": [%d, %d], \"dtype\": \"float32\", \"base64\": \"%s\"}",
                 NQ, NK, b);
        free(b);
        return buf;
    }
    o += (size_t)snprintf(buf + o, 8192 - o, "[");
    for (int i = 0; i < NQ; i++) {
        o += (size_t)snprintf(buf + o, 8192 - o, "%s[", i ? "," : "");
        for (int j = 0; j < NK; j++) {
            const char *e = !strcmp(form, "bool") ? (hidden(i, j) ? "false" : "true")
                                                  : (hidden(i, j) ? value : "0");
            o += (size_t)snprintf(buf + o, 8192 - o, "%s%s", j ? "," : "", e);
        }
        o += (size_t)snprintf(buf + o, 8192 - o, "]");
    }
    snprintf(buf + o, 8192 - o, "]");
    return buf;
}

static char *matrix(int rows, int cols, double seed)
{
    char *buf = malloc(8192);
    ck_assert_ptr_nonnull(buf);
    size_t o = (size_t)snprintf(buf, 8192, "[");
    for (int i = 0; i < rows; i++) {
        o += (size_t)snprintf(buf + o, 8192 - o, "%s[", i ? "," : "");
        for (int j = 0; j < cols; j++)
            o += (size_t)snprintf(buf + o, 8192 - o, "%s%.4f", j ? "," : "",
                                  sin(seed + 1.7 * i + 0.9 * j));
        o += (size_t)snprintf(buf + o, 8192 - o, "]");
    }
    snprintf(buf + o, 8192 - o, "]");
    return buf;
}

/* The body of each route with the given mask field, asking for every
 * output a mask affects. */
static char *body(api_op op, const char *mask)
{
    char *b = malloc(65536);
    ck_assert_ptr_nonnull(b);
    if (op == API_OP_ATTENTION) {
        char *q = matrix(NQ, 3, 0.1), *k = matrix(NK, 3, 0.7), *v = matrix(NK, 2, 1.3);
        char *g = matrix(NQ, 2, 2.1);
        snprintf(b, 65536,
                 "{\"q\": %s, \"k\": %s, \"v\": %s, \"mask\": %s, \"return_weights\": true, "
                 "\"return_stats\": true, \"return_lse\": true, \"grad_output\": %s}",
                 q, k, v, mask, g);
        free(q);
        free(k);
        free(v);
        free(g);
    } else {
        char *x = matrix(NQ, 4, 0.3), *ctx = matrix(NK, 4, 0.5), *wq = matrix(4, 6, 0.2);
        char *wk = matrix(4, 6, 0.4), *wv = matrix(4, 4, 0.6), *g = matrix(NQ, 4, 0.8);
        snprintf(b, 65536,
                 "{\"x\": %s, \"context\": %s, \"w_q\": %s, \"w_k\": %s, \"w_v\": %s, "
                 "\"num_heads\": 2, \"mask\": %s, \"return_weights\": \"mean\", "
                 "\"return_stats\": true, \"return_lse\": true, \"grad_output\": %s}",
                 x, ctx, wq, wk, wv, mask, g);
        free(x);
        free(ctx);
        free(wq);
        free(wk);
        free(wv);
        free(g);
    }
    return b;
}

static char *answer_with(api_op op, const char *form, const char *value, int status)
{
    char *m = mask_field(form, value), *b = body(op, m);
    char *a = answer(op, b, status);
    free(m);
    free(b);
    return a;
}

START_TEST(additive_minus_inf_and_float32_min_mask_exactly_as_boolean_false)
{
    const api_op ops[] = {API_OP_ATTENTION, API_OP_MULTIHEAD};
    const struct {
        const char *form, *value;
    } masking[] = {
        {"base64", NULL},            /* -inf, as float32 base64 */
        {"nested", "-3.4028235e38"}, /* torch.finfo(torch.float32).min */
        {"nested", "-1e30"},         /* the threshold itself */
        {"nested", "-7.5e33"},
    };
    for (size_t o = 0; o < 2; o++) {
        char *want = answer_with(ops[o], "bool", NULL, 200);
        for (size_t i = 0; i < sizeof masking / sizeof *masking; i++) {
            char *got = answer_with(ops[o], masking[i].form, masking[i].value, 200);
            ck_assert_msg(!strcmp(got, want),
                          "%s, hidden keys %s: the answer differs from the boolean "
                          "mask's:\n%.600s\nwant\n%.600s",
                          o ? "multihead" : "attention",
                          masking[i].value ? masking[i].value : "-inf (base64)", got, want);
            free(got);
        }
        /* Just above the threshold a value is a bias: its weights are 0 as
         * well, but the statistics count its scores. */
        char *bias = answer_with(ops[o], "nested", "-9.9e29", 200);
        ck_assert_msg(strcmp(bias, want) != 0, "%s: -9.9e29 masked like a boolean false",
                      o ? "multihead" : "attention");
        free(bias);
        free(want);
    }
}
END_TEST

START_TEST(mask_plus_inf_and_nan_in_base64_stay_invalid_numbers)
{
    const float bad[] = {INFINITY, NAN};
    for (size_t i = 0; i < 2; i++) {
        float m[NQ * NK] = {0};
        m[3] = bad[i];
        char *b64 = b64_floats(m, NQ * NK);
        char field[1024];
        snprintf(field, sizeof field,
                 "{\"shape\": [%d, %d], \"dtype\": \"float32\", \"base64\": \"%s\"}", NQ, NK,
                 b64);
        char *b = body(API_OP_ATTENTION, field);
        api_response res;
        api_handle(API_OP_ATTENTION, b, strlen(b), &LIM, &res);
        ck_assert_msg(res.status == 400 && strstr(res.body, "invalid_number") &&
                          strstr(res.body, "\"mask"),
                      "%s: %d %.300s", i ? "NaN" : "+inf", res.status, res.body);
        api_response_free(&res);
        free(b);
        free(b64);
    }
}
END_TEST

static Suite *masks_suite(void)
{
    Suite *s = suite_create("masks");
    TCase *tc = tcase_create("ecosystem");
    tcase_set_tags(tc, "kernel");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, additive_minus_inf_and_float32_min_mask_exactly_as_boolean_false);
    tcase_add_test(tc, mask_plus_inf_and_nan_in_base64_stay_invalid_numbers);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(masks_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
