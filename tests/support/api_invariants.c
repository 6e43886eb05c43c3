/*
 * The properties of api_handle()'s answers that hold for any body (see
 * api_invariants.h). jansson is the independent judge of what is JSON: the
 * API has its own strict validator and writers, so the check does not ask
 * the code under test whether its own output is well formed. Answers are
 * also checked against each other (the same request in another output
 * encoding must give the same float32 values bit for bit) and, for
 * /v1/attention without a mask, against tests/support/ref.c's
 * double-precision reference.
 */
#include "api_invariants.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"

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

/* ------------------------------------------------------------- tensors */

/* A tensor read back from JSON in any of the three encodings. */
typedef struct {
    int rank;
    int64_t shape[8];
    int64_t count;
    float *x;
    bool has_null; /* a null element (lse of a fully masked row) */
} tensor;

static void tensor_free(tensor *t)
{
    free(t->x);
    memset(t, 0, sizeof *t);
}

static bool push(tensor *t, json_t *v, int64_t *cap)
{
    if (t->count == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        float *p = realloc(t->x, (size_t)*cap * sizeof *p);
        if (!p)
            return false;
        t->x = p;
    }
    if (json_is_null(v)) {
        t->has_null = true;
        t->x[t->count++] = NAN;
        return true;
    }
    if (!json_is_number(v))
        return false;
    t->x[t->count++] = (float)json_number_value(v);
    return true;
}

/* Nested arrays: the shape from the first element at each depth, every
 * row checked against it. */
static bool read_nested(json_t *a, tensor *t, int depth, int64_t *cap)
{
    if (!json_is_array(a))
        return depth == t->rank && push(t, a, cap);
    if (depth >= 8)
        return false;
    int64_t n = (int64_t)json_array_size(a);
    if (depth == t->rank) {
        t->shape[t->rank++] = n;
    } else if (t->shape[depth] != n) {
        return false;
    }
    for (size_t i = 0; i < json_array_size(a); i++)
        if (!read_nested(json_array_get(a, i), t, depth + 1, cap))
            return false;
    return n > 0;
}

static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Little-endian float32s from standard base64 with padding. */
static bool read_base64(const char *s, size_t len, tensor *t)
{
    if (len % 4)
        return false;
    unsigned char *bytes = malloc(len / 4 * 3 + 1);
    size_t n = 0;
    for (size_t i = 0; bytes && i < len; i += 4) {
        int v[4];
        for (int j = 0; j < 4; j++)
            v[j] = s[i + j] == '=' ? 0 : b64_value(s[i + j]);
        if (v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0) {
            free(bytes);
            return false;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                     (uint32_t)v[3];
        bytes[n++] = (unsigned char)(w >> 16);
        if (s[i + 2] != '=')
            bytes[n++] = (unsigned char)(w >> 8);
        if (s[i + 3] != '=')
            bytes[n++] = (unsigned char)w;
    }
    if (!bytes || n % 4) {
        free(bytes);
        return false;
    }
    t->count = (int64_t)(n / 4);
    t->x = malloc(n + 4);
    if (t->x)
        memcpy(t->x, bytes, n); /* the x86 and arm64 Linux targets are little-endian */
    free(bytes);
    return t->x != NULL;
}

/* Any encoding of a float32 tensor; false for anything else (booleans, a
 * dtype other than float32, a shape that does not match its data). */
static bool read_tensor(json_t *v, tensor *t)
{
    memset(t, 0, sizeof *t);
    int64_t cap = 0;
    if (json_is_array(v)) {
        if (read_nested(v, t, 0, &cap))
            return true;
        tensor_free(t);
        return false;
    }
    json_t *shape = json_object_get(v, "shape"), *dtype = json_object_get(v, "dtype");
    if (!json_is_array(shape) || json_array_size(shape) > 8 ||
        (dtype && !json_is_null(dtype) &&
         strcmp(json_string_value(dtype) ? json_string_value(dtype) : "", "float32")))
        return false;
    int64_t want = 1;
    t->rank = (int)json_array_size(shape);
    for (int i = 0; i < t->rank; i++) {
        json_t *d = json_array_get(shape, (size_t)i);
        if (!json_is_number(d) || json_number_value(d) < 0 || json_number_value(d) > 1e9)
            return false;
        t->shape[i] = (int64_t)json_number_value(d);
        want *= t->shape[i];
    }
    json_t *data = json_object_get(v, "data"), *b64 = json_object_get(v, "base64");
    bool ok = false;
    if (json_is_array(data)) {
        ok = true;
        for (size_t i = 0; ok && i < json_array_size(data); i++)
            ok = push(t, json_array_get(data, i), &cap);
    } else if (json_is_string(b64)) {
        ok = read_base64(json_string_value(b64), json_string_length(b64), t);
    }
    if (!ok || t->count != want) {
        tensor_free(t);
        return false;
    }
    return true;
}

/* ------------------------------------------- the same answer, re-encoded */

static bool same_tensor(json_t *a, json_t *b, const char *name, char *why, size_t cap)
{
    if (!a && !b)
        return true;
    tensor ta, tb;
    if (!read_tensor(a, &ta))
        return fail(why, cap, "\"%s\" is not a float32 tensor", name);
    if (!read_tensor(b, &tb)) {
        tensor_free(&ta);
        return fail(why, cap, "\"%s\" in the other encoding is not a float32 tensor", name);
    }
    bool ok = ta.rank == tb.rank && ta.count == tb.count &&
              !memcmp(ta.shape, tb.shape, (size_t)ta.rank * sizeof ta.shape[0]);
    if (!ok)
        fail(why, cap, "\"%s\" has another shape in the other encoding", name);
    for (int64_t i = 0; ok && !ta.has_null && !tb.has_null && i < ta.count; i++)
        if (memcmp(&ta.x[i], &tb.x[i], sizeof(float)) != 0)
            ok = fail(why, cap, "\"%s\"[%lld] is %.9g in one output encoding, %.9g in the other",
                      name, (long long)i, ta.x[i], tb.x[i]);
    tensor_free(&ta);
    tensor_free(&tb);
    return ok;
}

/* The request again with the other output encoding (base64, or nested when
 * it was base64): the same float32 values, bit for bit, and the same
 * statistics (libattn on one thread is deterministic). */
static bool check_encodings(api_op op, json_t *req, json_t *answer, char *why, size_t cap)
{
    if (json_object_get(req, "output_dtype"))
        return true; /* base64 outputs in float16 / bfloat16 are not the same values */
    const char *enc = json_string_value(json_object_get(req, "output_encoding"));
    json_t *again = json_deep_copy(req);
    json_object_set_new(again, "output_encoding",
                        json_string(enc && !strcmp(enc, "base64") ? "nested" : "base64"));
    char *text = json_dumps(again, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(again);
    if (!text)
        return true; /* out of memory in the test itself */
    /* The answer's bytes are part of its work (meta.work), and nested text
     * is longer than base64: a request just under --max-work in one
     * encoding may be over it in the other. */
    api_limits limits = api_invariants_limits;
    limits.max_work *= 8;
    api_response res;
    api_handle(op, text, strlen(text), &limits, &res);
    free(text);
    json_t *doc = res.status == 200
        ? json_loadb(res.body, res.body_len, JSON_DECODE_INT_AS_REAL, NULL) : NULL;
    bool ok = doc != NULL;
    if (!ok)
        fail(why, cap, "200 in one output encoding, %d in the other: %.120s", res.status,
             res.body ? res.body : "");
    static const char *const tensors[] = {"output", "weights", "lse"};
    for (size_t i = 0; ok && i < sizeof tensors / sizeof *tensors; i++)
        ok = same_tensor(json_object_get(answer, tensors[i]), json_object_get(doc, tensors[i]),
                         tensors[i], why, cap);
    json_t *grad = json_object_get(answer, "grad"), *grad2 = json_object_get(doc, "grad");
    const char *key;
    json_t *value;
    if (ok && json_object_size(grad) != json_object_size(grad2))
        ok = fail(why, cap, "\"grad\" has other members in the other output encoding");
    json_object_foreach(grad, key, value) {
        if (ok)
            ok = same_tensor(value, json_object_get(grad2, key), key, why, cap);
    }
    json_t *stats = json_object_get(answer, "stats"), *stats2 = json_object_get(doc, "stats");
    if (ok && (stats || stats2) && !json_equal(stats, stats2)) /* json_equal(NULL, NULL) is 0 */
        ok = fail(why, cap, "\"stats\" differ between output encodings");
    json_decref(doc);
    api_response_free(&res);
    return ok;
}

/* --------------------------------------- /v1/attention against ref.c */

static double *to_double(const tensor *t)
{
    double *d = malloc((size_t)(t->count ? t->count : 1) * sizeof *d);
    for (int64_t i = 0; d && i < t->count; i++)
        d[i] = t->x[i];
    return d;
}

/* When q, k, v are all there is to the request (and causal, scale and
 * what to return), its output and weights must match the double-precision
 * reference within what float32 scores allow. Other requests (masks, the
 * variants) are left to the other checks. */
static bool check_reference(json_t *req, json_t *answer, char *why, size_t cap)
{
    static const char *const plain[] = {"q", "k", "v", "causal", "scale", "return_weights",
                                        "return_stats", "grad_output", "output_encoding",
                                        "mask"};
    const char *key;
    json_t *value;
    json_object_foreach(req, key, value) {
        size_t i = 0;
        while (i < sizeof plain / sizeof *plain && strcmp(key, plain[i]))
            i++;
        if (i == sizeof plain / sizeof *plain || (!strcmp(key, "mask") && !json_is_null(value)))
            return true;
    }
    tensor q, k, v, out;
    bool have = read_tensor(json_object_get(req, "q"), &q);
    have = read_tensor(json_object_get(req, "k"), &k) && have;
    have = read_tensor(json_object_get(req, "v"), &v) && have;
    bool ok = read_tensor(json_object_get(answer, "output"), &out);
    int r = q.rank;
    if (!ok)
        fail(why, cap, "a 200 whose output is not a float32 tensor");
    /* Inputs this reader does not know (another dtype) are not compared. */
    if (!ok || !have || q.has_null || k.has_null || v.has_null || r < 2 || r > 4 ||
        k.rank != r || v.rank != r)
        goto done;
    attn_sdpa_params p = {
        .batch = r == 4 ? q.shape[0] : 1,
        .heads_q = r >= 3 ? q.shape[r - 3] : 1,
        .heads_kv = r >= 3 ? k.shape[r - 3] : 1,
        .n_q = q.shape[r - 2], .n_k = k.shape[r - 2],
        .d_k = q.shape[r - 1], .d_v = v.shape[r - 1],
        .causal = json_is_true(json_object_get(req, "causal")),
        .threads = 1,
    };
    json_t *scale = json_object_get(req, "scale");
    p.scale = json_is_number(scale) ? (float)json_number_value(scale)
                                    : (float)(1.0 / sqrt((double)p.d_k));
    int64_t n_out = p.batch * p.heads_q * p.n_q * p.d_v;
    int64_t n_w = p.batch * p.heads_q * p.n_q * p.n_k;
    if (out.count != n_out) {
        ok = fail(why, cap, "output has %lld numbers, the shapes give %lld",
                  (long long)out.count, (long long)n_out);
        goto done;
    }
    double *qd = to_double(&q), *kd = to_double(&k), *vd = to_double(&v);
    double *ref = malloc((size_t)n_out * sizeof *ref), *ref_w = malloc((size_t)n_w * sizeof *ref_w);
    if (qd && kd && vd && ref && ref_w) {
        ref_sdpa_forward(&p, qd, kd, vd, ref, NULL, ref_w);
        /* What float32 arithmetic may cost: a score is off by about
         * (d_k + 2) eps times the sum of |q||k| it adds up, a weight by about
         * that much relatively, an output by that times the largest |v|
         * plus the rounding of its n_k terms. */
        const double eps = 0x1p-24;
        int64_t group = p.heads_q / p.heads_kv;
        double s_abs = 0, v_max = 0;
        for (int64_t b = 0; b < p.batch; b++)
            for (int64_t h = 0; h < p.heads_q; h++)
                for (int64_t i = 0; i < p.n_q; i++)
                    for (int64_t j = 0; j < p.n_k; j++) {
                        const double *qi = qd + ((b * p.heads_q + h) * p.n_q + i) * p.d_k;
                        const double *kj = kd + ((b * p.heads_kv + h / group) * p.n_k + j) * p.d_k;
                        double s = 0;
                        for (int64_t c = 0; c < p.d_k; c++)
                            s += fabs(qi[c] * kj[c]);
                        s_abs = fmax(s_abs, s * p.scale);
                    }
        for (int64_t i = 0; i < v.count; i++)
            v_max = fmax(v_max, fabs(vd[i]));
        double w_tol = 4 * (double)(p.d_k + 2) * eps * s_abs + 4 * (double)(p.n_k + 4) * eps + 2e-6;
        double o_tol = v_max * w_tol + 1e-37;
        for (int64_t i = 0; ok && i < n_out; i++)
            if (!(fabs(out.x[i] - ref[i]) <= o_tol))
                ok = fail(why, cap, "output[%lld] is %.9g, the reference %.9g (tolerance %.3g)",
                          (long long)i, out.x[i], ref[i], o_tol);
        /* The tolerances above grow with the scores, so huge scores would
         * let anything through. These hold at any magnitude: an output row
         * lies within the values of the keys it sees (zeros when the causal
         * mask hides them all), and a weight row sums to 1 (or is zeros). */
        double round_tol = 4 * (double)(p.n_k + 4) * eps;
        for (int64_t row = 0; ok && row < p.batch * p.heads_q * p.n_q; row++) {
            int64_t b = row / (p.heads_q * p.n_q), h = row / p.n_q % p.heads_q, i = row % p.n_q;
            int64_t seen = p.causal ? i + p.n_k - p.n_q + 1 : p.n_k; /* keys 0..seen-1 */
            if (seen > p.n_k)
                seen = p.n_k;
            const double *vh = vd + (b * p.heads_kv + h / group) * p.n_k * p.d_v;
            for (int64_t c = 0; ok && c < p.d_v; c++) {
                double lo = seen > 0 ? INFINITY : 0, hi = seen > 0 ? -INFINITY : 0;
                for (int64_t j = 0; j < seen; j++) {
                    lo = fmin(lo, vh[j * p.d_v + c]);
                    hi = fmax(hi, vh[j * p.d_v + c]);
                }
                double o = out.x[row * p.d_v + c], t = round_tol * v_max + 1e-37;
                if (!(o >= lo - t && o <= hi + t))
                    ok = fail(why, cap, "output[%lld] is %.9g, outside [%.9g, %.9g], the values "
                              "its row sees", (long long)(row * p.d_v + c), o, lo, hi);
            }
        }
        tensor w;
        if (ok && read_tensor(json_object_get(answer, "weights"), &w)) {
            for (int64_t i = 0; ok && w.count == n_w && i < n_w; i++)
                if (!(fabs(w.x[i] - ref_w[i]) <= w_tol))
                    ok = fail(why, cap, "weights[%lld] is %.9g, the reference %.9g", (long long)i,
                              w.x[i], ref_w[i]);
            for (int64_t row = 0; ok && w.count == n_w && row < n_w / p.n_k; row++) {
                double sum = 0, want = 0;
                for (int64_t j = 0; j < p.n_k; j++) {
                    sum += w.x[row * p.n_k + j];
                    want += ref_w[row * p.n_k + j];
                }
                if (!(fabs(sum - want) <= round_tol + 1e-6))
                    ok = fail(why, cap, "weights row %lld sums to %.9g, the reference to %.9g",
                              (long long)row, sum, want);
            }
            if (ok && w.count != n_w)
                ok = fail(why, cap, "weights has %lld numbers, the shapes give %lld",
                          (long long)w.count, (long long)n_w);
            tensor_free(&w);
        }
    }
    free(qd);
    free(kd);
    free(vd);
    free(ref);
    free(ref_w);
done:
    tensor_free(&q);
    tensor_free(&k);
    tensor_free(&v);
    tensor_free(&out);
    return ok;
}

static bool check_one(api_op op, const char *body, size_t len, json_t *req,
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
    } else if (res.status == 200 && !json_is_object(req)) {
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
        else
            ok = check_encodings(op, req, doc, inner, sizeof inner) &&
                 (op != API_OP_ATTENTION || check_reference(req, doc, inner, sizeof inner));
        json_decref(doc);
    }
    api_response_free(&res);
    if (!ok)
        fail(why, cap, "/v1/%s: %s", route, inner);
    return ok;
}

/* ------------------------------------------------------------ KV caches */

/* Two caches of one store, for the whole process: one head of 2, two heads
 * of 4 (a query of 4 heads is GQA over them). Each input runs on both and
 * then truncates them to 0 again, so that every input starts from empty. */
static api_caches *cache_store;
static char cache_ids[2][32];

static bool caches_ready(void)
{
    if (cache_store)
        return true;
    cache_store = api_caches_new(1 << 20, 3600);
    static const char *const made[2] = {"{\"num_kv_heads\": 1, \"head_dim\": 2}",
                                        "{\"num_kv_heads\": 2, \"head_dim\": 4, "
                                        "\"value_dim\": 3, \"dtype\": \"bfloat16\"}"};
    api_limits lim = api_invariants_limits;
    lim.caches = cache_store;
    for (int i = 0; i < 2; i++) {
        api_response res;
        api_cache_create(made[i], strlen(made[i]), &lim, &res);
        json_t *doc = res.status == 201 ? json_loadb(res.body, res.body_len, 0, NULL) : NULL;
        const char *id = json_string_value(json_object_get(doc, "id"));
        snprintf(cache_ids[i], sizeof cache_ids[i], "%s", id ? id : "");
        json_decref(doc);
        api_response_free(&res);
    }
    return cache_ids[0][0] && cache_ids[1][0];
}

/* POST /v1/caches/{id}/attention: 200, 400 or 422 (a cache that exists,
 * with room to spare: never a 404 or a 503); the error object as for the
 * other routes; an answer with "cache" {length, bytes} and "meta", and
 * "output" exactly when the body has "q". */
static bool check_cache(const char *body, size_t len, json_t *req, char *why, size_t cap)
{
    if (!caches_ready())
        return fail(why, cap, "the fuzz target's caches could not be made");
    for (int i = 0; i < 2; i++) {
        api_limits lim = api_invariants_limits;
        lim.caches = cache_store;
        lim.cache_id = cache_ids[i];
        char inner[300] = "";
        api_response res;
        api_handle(API_OP_CACHE_ATTENTION, body, len, &lim, &res);
        bool ok = true;
        json_t *doc = res.body ? json_loadb(res.body, res.body_len, JSON_REJECT_DUPLICATES, NULL)
                               : NULL;
        if (res.status != 200 && res.status != 400 && res.status != 422)
            ok = fail(inner, sizeof inner, "status %d", res.status);
        else if (!res.body || strlen(res.body) != res.body_len)
            ok = fail(inner, sizeof inner, "status %d with no body or a NUL in it", res.status);
        else if (res.status == 200 && !json_is_object(req))
            ok = fail(inner, sizeof inner, "200 for a body that is not one strict JSON object");
        else if (!json_is_object(doc))
            ok = fail(inner, sizeof inner, "answer is not a JSON object: %.80s", res.body);
        else if (res.status != 200)
            ok = check_error(doc, res.status, inner, sizeof inner);
        else if (!json_is_integer(json_object_get(json_object_get(doc, "cache"), "length")) ||
                 !json_is_object(json_object_get(doc, "meta")))
            ok = fail(inner, sizeof inner, "200 without \"cache\".length and \"meta\"");
        else if ((json_object_get(doc, "output") != NULL) !=
                 (json_object_get(req, "q") != NULL && !json_is_null(json_object_get(req, "q"))))
            ok = fail(inner, sizeof inner, "\"output\" %s without \"q\" in the request",
                      json_object_get(doc, "output") ? "answered" : "missing");
        json_decref(doc);
        api_response_free(&res);
        static const char empty[] = "{\"truncate\": 0}";
        api_handle(API_OP_CACHE_ATTENTION, empty, sizeof empty - 1, &lim, &res);
        if (ok && res.status != 200)
            ok = fail(inner, sizeof inner, "truncating to 0 afterwards: %d", res.status);
        api_response_free(&res);
        if (!ok)
            return fail(why, cap, "/v1/caches/{id}/attention (cache %d): %s", i, inner);
    }
    return true;
}

/* ---------------------------------------- the Open Inference Protocol */

/* The product of a JSON shape, or -1 when it is not an array of numbers. */
static double shape_count(json_t *shape)
{
    if (!json_is_array(shape))
        return -1;
    double n = 1;
    for (size_t i = 0; i < json_array_size(shape); i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_number(d) || json_number_value(d) < 0)
            return -1;
        n *= json_number_value(d);
    }
    return n;
}

static size_t datatype_size(const char *datatype)
{
    return !strcmp(datatype, "FP32") ? 4 : !strcmp(datatype, "FP16") ? 2
         : !strcmp(datatype, "BF16") ? 2 : 0;
}

/* A /v2 answer: an error is exactly {"error": non-empty string}; a 200 is
 * {"model_name", "outputs": [...]} whose outputs each have a name, a
 * datatype and a shape, and either data with as many elements as the shape
 * holds, or binary_data_size bytes of the shape, which together are exactly
 * the bytes after the JSON text (header_len). */
static bool check_oip_answer(const api_response *res, const char *model, char *why, size_t cap)
{
    size_t json_len = res->header_len ? res->header_len : res->body_len;
    if (res->header_len > res->body_len)
        return fail(why, cap, "header_len %zu beyond the body's %zu bytes", res->header_len,
                    res->body_len);
    if (res->header_len && res->status != 200)
        return fail(why, cap, "binary data after an error");
    json_error_t jerr;
    json_t *doc = json_loadb(res->body, json_len,
                             JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &jerr);
    bool ok = true;
    if (!json_is_object(doc)) {
        ok = fail(why, cap, "answer is not a JSON object (%s): %.80s", jerr.text, res->body);
    } else if (res->status != 200) {
        if (json_object_size(doc) != 1 || !nonempty_string(doc, "error"))
            ok = fail(why, cap, "status %d is not exactly {\"error\": \"message\"}: %.120s",
                      res->status, res->body);
    } else {
        json_t *outputs = json_object_get(doc, "outputs");
        const char *name = json_string_value(json_object_get(doc, "model_name"));
        if (!name || strcmp(name, model) || !json_is_array(outputs) ||
            json_array_size(outputs) == 0)
            ok = fail(why, cap, "200 without model_name %s and outputs", model);
        double binary = 0;
        for (size_t i = 0; ok && i < json_array_size(outputs); i++) {
            json_t *o = json_array_get(outputs, i);
            const char *datatype = json_string_value(json_object_get(o, "datatype"));
            double count = shape_count(json_object_get(o, "shape"));
            json_t *data = json_object_get(o, "data");
            json_t *size = json_object_get(json_object_get(o, "parameters"), "binary_data_size");
            if (!nonempty_string(o, "name") || !datatype || count < 0 || !data == !size) {
                ok = fail(why, cap, "outputs[%zu] is not name, datatype, shape and data or "
                          "binary_data_size", i);
            } else if (data) {
                tensor t = {0};
                int64_t room = 0;
                bool flat = json_is_array(data);
                for (size_t j = 0; flat && j < json_array_size(data); j++)
                    flat = push(&t, json_array_get(data, j), &room) ||
                           json_is_string(json_array_get(data, j));
                if (!flat || (strcmp(datatype, "BYTES") && (double)t.count != count))
                    ok = fail(why, cap, "outputs[%zu] has %lld data for a shape of %.0f", i,
                              (long long)t.count, count);
                tensor_free(&t);
            } else {
                double want = !strcmp(datatype, "BYTES") ? json_number_value(size)
                                                         : count * (double)datatype_size(datatype);
                if (!json_is_number(size) || json_number_value(size) != want || want <= 0)
                    ok = fail(why, cap, "outputs[%zu]: binary_data_size %.0f for %s of %.0f "
                              "elements", i, json_number_value(size), datatype, count);
                binary += json_number_value(size);
            }
        }
        if (ok && binary != (double)(api_response_bytes(res) - json_len))
            ok = fail(why, cap, "the outputs announce %.0f binary bytes, %zu follow the JSON",
                      binary, api_response_bytes(res) - json_len);
        for (int i = 0; ok && i < res->n_blocks; i++)
            if (!res->blocks[i].data)
                ok = fail(why, cap, "binary block %d has no bytes", i);
    }
    json_decref(doc);
    return ok;
}

/* The body as an infer request. A body that starts with decimal digits and
 * a newline is "N\n" then a binary request: N is its
 * Inference-Header-Content-Length, so that the fuzzer explores the framing
 * (a header beyond the body, sizes that do not add up) as well as the JSON. */
static bool check_oip(api_op op, const char *body, size_t len, char *why, size_t cap)
{
    const char *model = op == API_OP_ATTENTION ? "attention" : "multihead";
    char header[24] = "";
    size_t digits = 0;
    while (digits < len && digits < 20 && body[digits] >= '0' && body[digits] <= '9')
        digits++;
    const char *json_length = NULL;
    if (digits > 0 && digits < len && body[digits] == '\n') {
        memcpy(header, body, digits);
        header[digits] = '\0';
        json_length = header;
        body += digits + 1;
        len -= digits + 1;
    }
    char inner[300] = "";
    api_response res;
    api_cost cost;
    api_call *c = api_prepare_oip(op, body, len, json_length, &api_invariants_limits, &cost, &res);
    if (c)
        api_execute(c, api_invariants_limits.threads, &res);
    bool ok = true;
    if (res.status != 200 && res.status != 400 && res.status != 422)
        ok = fail(inner, sizeof inner, "status %d", res.status);
    else if (!res.body)
        ok = fail(inner, sizeof inner, "status %d with no body", res.status);
    else
        ok = check_oip_answer(&res, model, inner, sizeof inner);
    api_response_free(&res);
    if (!ok)
        fail(why, cap, "/v2/models/%s/infer: %s", model, inner);
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
    bool ok = check_one(API_OP_ATTENTION, body, len, req, why, cap) &&
              check_one(API_OP_MULTIHEAD, body, len, req, why, cap) &&
              check_cache(body, len, req, why, cap) &&
              check_oip(API_OP_ATTENTION, body, len, why, cap) &&
              check_oip(API_OP_MULTIHEAD, body, len, why, cap);
    json_decref(req);
    return ok;
}
