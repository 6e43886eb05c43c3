/*
 * The API layer without sockets: request bodies go straight into
 * api_handle(), answers are parsed back with jansson and checked against a
 * double-precision reference written here (or against libattn called
 * directly on the same inputs), never against the API's own output.
 */
#include "api.h"
#include "attn.h"
#include "request.h"

#include <check.h>
#include <dirent.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "support/worst.h"

/* ------------------------------------------------------------ helpers */

static const api_limits LIM = {.max_work = 0, .threads = 2};

/* Deterministic inputs in [-1, 1), exactly representable as float32. */
static uint64_t rng_state = 12345;
static float rnd(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(rng_state >> 40) / (double)(1ULL << 24) * 2.0 - 1.0);
}
static float *rnd_tensor(int64_t count)
{
    float *x = malloc((size_t)count * sizeof *x);
    for (int64_t i = 0; i < count; i++)
        x[i] = rnd();
    return x;
}

static int64_t count_of(int rank, const int64_t *shape)
{
    int64_t c = 1;
    for (int i = 0; i < rank; i++)
        c *= shape[i];
    return c;
}

/* A growing string for building request bodies. */
typedef struct {
    char *s;
    size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Room for `more` bytes and a NUL after the text. */
static void sb_reserve(sbuf *b, size_t more)
{
    if (b->len + more + 1 > b->cap) {
        b->cap = (b->len + more + 1) * 2;
        b->s = realloc(b->s, b->cap);
    }
}

static void sb_printf(sbuf *b, const char *fmt, ...)
{
    /* Formatted once into the room there is; again only when it did not
     * fit (request bodies of megabytes are built a number at a time). */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (b->len + (size_t)n + 1 > b->cap) {
        sb_reserve(b, (size_t)n);
        va_start(ap, fmt);
        vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

typedef enum { ENC_NESTED, ENC_FLAT, ENC_BASE64 } enc;
static const char *const ENC_NAME[] = {"nested", "flat", "base64"};

static void b64_encode(sbuf *b, const unsigned char *p, size_t n)
{
    static const char A[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    sb_reserve(b, (n + 2) / 3 * 4);
    char *o = b->s + b->len;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16;
        if (i + 1 < n) v |= (unsigned)p[i + 1] << 8;
        if (i + 2 < n) v |= p[i + 2];
        *o++ = A[v >> 18];
        *o++ = A[(v >> 12) & 63];
        *o++ = i + 1 < n ? A[(v >> 6) & 63] : '=';
        *o++ = i + 2 < n ? A[v & 63] : '=';
    }
    *o = '\0';
    b->len = (size_t)(o - b->s);
}

static void nested(sbuf *b, const float *x, const uint8_t *m, int rank,
                   const int64_t *shape, int64_t *at)
{
    sb_printf(b, "[");
    for (int64_t i = 0; i < shape[0]; i++) {
        if (i)
            sb_printf(b, ",");
        if (rank == 1) {
            if (m)
                sb_printf(b, "%s", m[*at] ? "true" : "false");
            else
                sb_printf(b, "%.9g", (double)x[*at]);
            (*at)++;
        } else {
            nested(b, x, m, rank - 1, shape + 1, at);
        }
    }
    sb_printf(b, "]");
}

/* Writes a float tensor (x) or a boolean one (m) in encoding e. */
static void put_tensor(sbuf *b, const float *x, const uint8_t *m, int rank,
                       const int64_t *shape, enc e)
{
    int64_t n = count_of(rank, shape), at = 0;
    if (e == ENC_NESTED) {
        nested(b, x, m, rank, shape, &at);
        return;
    }
    sb_printf(b, "{\"shape\":[");
    for (int i = 0; i < rank; i++)
        sb_printf(b, "%s%lld", i ? "," : "", (long long)shape[i]);
    sb_printf(b, "],");
    if (e == ENC_FLAT) {
        sb_printf(b, "\"data\":[");
        for (int64_t i = 0; i < n; i++) {
            if (m)
                sb_printf(b, "%s%s", i ? "," : "", m[i] ? "true" : "false");
            else
                sb_printf(b, "%s%.9g", i ? "," : "", (double)x[i]);
        }
        sb_printf(b, "]}");
    } else {
        sb_printf(b, "\"dtype\":\"%s\",\"base64\":\"", m ? "bool" : "float32");
        if (m)
            b64_encode(b, m, (size_t)n);
        else /* little-endian float32: this test runs on little-endian hosts */
            b64_encode(b, (const unsigned char *)x, (size_t)n * 4);
        sb_printf(b, "\"}");
    }
}

static void put_field(sbuf *b, const char *name, const float *x, int rank,
                      const int64_t *shape, enc e)
{
    sb_printf(b, "%s\"%s\":", b->len > 1 ? "," : "", name);
    put_tensor(b, x, NULL, rank, shape, e);
}

/* Reads a response tensor in any encoding into a new float array; checks
 * its shape is `rank`/`shape`. */
static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Copies nested arrays of numbers of `shape` into out, in order; false
 * (after *at elements) when j is not such arrays. */
static bool flatten(json_t *j, int depth, int rank, const int64_t *shape,
                    float *out, int64_t *at)
{
    if (depth == rank) {
        if (!json_is_number(j))
            return false;
        out[(*at)++] = (float)json_number_value(j);
        return true;
    }
    if (!json_is_array(j) || (int64_t)json_array_size(j) != shape[depth])
        return false;
    for (size_t i = 0; i < json_array_size(j); i++)
        if (!flatten(json_array_get(j, i), depth + 1, rank, shape, out, at))
            return false;
    return true;
}

static float *get_tensor(json_t *j, enc e, int rank, const int64_t *shape)
{
    ck_assert_ptr_nonnull(j);
    int64_t n = count_of(rank, shape);
    float *out = calloc((size_t)n + 1, sizeof *out);
    if (e == ENC_NESTED) {
        int64_t at = 0;
        ck_assert_msg(flatten(j, 0, rank, shape, out, &at),
                      "not nested arrays of numbers of rank %d, [%lld, ...]: wrong after "
                      "element %lld", rank, (long long)shape[0], (long long)at);
        return out;
    }
    json_t *sh = json_object_get(j, "shape");
    ck_assert_msg(json_is_array(sh), "no shape");
    ck_assert_int_eq(json_array_size(sh), rank);
    for (int i = 0; i < rank; i++)
        ck_assert_int_eq(json_integer_value(json_array_get(sh, (size_t)i)), shape[i]);
    if (e == ENC_FLAT) {
        json_t *data = json_object_get(j, "data");
        ck_assert_int_eq(json_array_size(data), n);
        for (int64_t i = 0; i < n; i++)
            out[i] = (float)json_number_value(json_array_get(data, (size_t)i));
        return out;
    }
    ck_assert_str_eq(json_string_value(json_object_get(j, "dtype")), "float32");
    const char *s = json_string_value(json_object_get(j, "base64"));
    ck_assert_ptr_nonnull(s);
    unsigned char *bytes = (unsigned char *)out;
    size_t nb = 0, len = strlen(s);
    ck_assert_int_eq(len % 4, 0);
    for (size_t i = 0; i < len; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++)
            v[k] = s[i + k] == '=' ? 0 : b64_value(s[i + k]);
        unsigned w = (unsigned)(v[0] << 18 | v[1] << 12 | v[2] << 6 | v[3]);
        unsigned char three[3] = {(unsigned char)(w >> 16), (unsigned char)(w >> 8),
                                  (unsigned char)w};
        for (int k = 0; k < 3 && nb < (size_t)n * 4; k++)
            bytes[nb++] = three[k];
    }
    ck_assert_int_eq(nb, (size_t)n * 4);
    return out;
}

/* Runs the request and returns the parsed body, checking the status. */
static json_t *call(api_op op, const char *body, size_t len, const api_limits *lim,
                    int status)
{
    api_response res;
    api_handle(op, body, len, lim, &res);
    ck_assert_ptr_nonnull(res.body);
    json_error_t je;
    json_t *j = json_loadb(res.body, res.body_len, 0, &je);
    ck_assert_msg(j != NULL, "body is not JSON: %s", je.text);
    ck_assert_msg(res.status == status, "status %d, wanted %d: %.*s", res.status,
                  status, (int)(res.body_len < 400 ? res.body_len : 400), res.body);
    api_response_free(&res);
    return j;
}

static json_t *call_ok(api_op op, const sbuf *b)
{
    return call(op, b->s, b->len, &LIM, 200);
}

/* Checks the error object: status, code and field (NULL: no field). */
static void expect_error_lim(api_op op, const char *body, const api_limits *lim,
                             int status, const char *code, const char *field)
{
    json_t *j = call(op, body, strlen(body), lim, status);
    json_t *e = json_object_get(j, "error");
    ck_assert_msg(json_is_object(e), "no error object");
    ck_assert_int_eq(json_integer_value(json_object_get(e, "status")), status);
    ck_assert_str_eq(json_string_value(json_object_get(e, "code")), code);
    ck_assert_msg(json_string_length(json_object_get(e, "message")) > 10,
                  "message too short");
    json_t *f = json_object_get(e, "field");
    if (field)
        ck_assert_str_eq(json_string_value(f) ? json_string_value(f) : "(none)", field);
    else
        ck_assert_ptr_null(f);
    json_decref(j);
}

static void expect_error(api_op op, const char *body, int status,
                         const char *code, const char *field)
{
    expect_error_lim(op, body, &LIM, status, code, field);
}

static const char *error_message(json_t *j)
{
    return json_string_value(json_object_get(json_object_get(j, "error"), "message"));
}

#define ck_close(a, b, tol)                                                   \
    ck_assert_msg(fabs((double)(a) - (double)(b)) <= (tol) * (1 + fabs((double)(b))), \
                  "%s = %.9g, wanted %.9g", #a, (double)(a), (double)(b))

/* Every element of got within tol * (1 + |want|) of want: one assertion
 * for the whole tensor, naming its worst element. */
static void assert_close_all(const char *what, const float *got, const double *want,
                             int64_t n, double tol)
{
    worst_elem w = {0};
    for (int64_t i = 0; i < n; i++)
        worst_note(&w, i, got[i], want[i], rel1_err(got[i], want[i]));
    ck_assert_msg(w.err <= tol, "%s[%lld] = %.9g, wanted %.9g (error %.3g)", what, w.at, w.got,
                  w.want, w.err);
}

/* The same against float references (libattn called directly). */
static void assert_close_floats(const char *what, const float *got, const float *want,
                                int64_t n, double tol)
{
    worst_elem w = {0};
    for (int64_t i = 0; i < n; i++)
        worst_note(&w, i, got[i], want[i], rel1_err(got[i], want[i]));
    ck_assert_msg(w.err <= tol, "%s[%lld] = %.9g, libattn %.9g (error %.3g)", what, w.at,
                  w.got, w.want, w.err);
}

/* Every element of got exactly want. */
static void assert_same_floats(const char *what, const float *got, const float *want, int64_t n)
{
    worst_elem w = {0};
    for (int64_t i = 0; i < n; i++)
        worst_note(&w, i, got[i], want[i], exact_err(got[i], want[i]));
    ck_assert_msg(w.err == 0, "%s[%lld] = %.9g, libattn %.9g", what, w.at, w.got, w.want);
}

/* --------------------------------------------------- double reference */

/* One SDPA problem, everything already in the 4-D layout of attn.h. The
 * mask is given expanded to [B, H_q, n_q, n_k] (allowed or bias). */
typedef struct {
    int64_t B, Hq, Hkv, nq, nk, dk, dv;
    double scale;
    bool causal;
    const uint8_t *allowed; /* or NULL */
    const float *bias;      /* or NULL */
} ref_problem;

/* out [B,Hq,nq,dv] and weights [B,Hq,nq,nk] (either may be NULL). */
static void ref_sdpa(const ref_problem *r, const float *q, const float *k,
                     const float *v, double *out, double *weights)
{
    int64_t group = r->Hq / r->Hkv;
    double *s = malloc((size_t)r->nk * sizeof *s);
    for (int64_t b = 0; b < r->B; b++)
    for (int64_t h = 0; h < r->Hq; h++)
    for (int64_t i = 0; i < r->nq; i++) {
        int64_t g = h / group;
        const float *qi = q + ((b * r->Hq + h) * r->nq + i) * r->dk;
        int64_t row = (b * r->Hq + h) * r->nq + i;
        double mx = -INFINITY;
        for (int64_t j = 0; j < r->nk; j++) {
            const float *kj = k + ((b * r->Hkv + g) * r->nk + j) * r->dk;
            double dot = 0;
            for (int64_t t = 0; t < r->dk; t++)
                dot += (double)qi[t] * kj[t];
            s[j] = r->scale * dot;
            if (r->bias)
                s[j] += r->bias[row * r->nk + j];
            bool visible = !(r->causal && j > i + (r->nk - r->nq)) &&
                           !(r->allowed && !r->allowed[row * r->nk + j]);
            if (!visible)
                s[j] = -INFINITY;
            if (s[j] > mx)
                mx = s[j];
        }
        double sum = 0;
        for (int64_t j = 0; j < r->nk; j++) {
            s[j] = mx == -INFINITY ? 0 : exp(s[j] - mx);
            sum += s[j];
        }
        for (int64_t j = 0; j < r->nk; j++) {
            s[j] = sum > 0 ? s[j] / sum : 0;
            if (weights)
                weights[row * r->nk + j] = s[j];
        }
        if (out)
            for (int64_t t = 0; t < r->dv; t++) {
                double acc = 0;
                for (int64_t j = 0; j < r->nk; j++)
                    acc += s[j] * v[((b * r->Hkv + g) * r->nk + j) * r->dv + t];
                out[row * r->dv + t] = acc;
            }
    }
    free(s);
}

/* sum(dout * out(q)) as a function of q, for finite differences. */
static double ref_loss(const ref_problem *r, const float *q, const float *k,
                       const float *v, const float *dout)
{
    int64_t n = r->B * r->Hq * r->nq * r->dv;
    double *out = malloc((size_t)n * sizeof *out);
    ref_sdpa(r, q, k, v, out, NULL);
    double loss = 0;
    for (int64_t i = 0; i < n; i++)
        loss += out[i] * dout[i];
    free(out);
    return loss;
}

/* ------------------------------------------------- attention: results */

/* One /v1/attention request: q [B, Hq, nq, dk], k [B, Hkv, nk, dk],
 * v [B, Hkv, nk, dv], sent with their leading 4 - rank dimensions dropped
 * (rank 2: B = Hq = Hkv = 1), in encoding `in`; the answer asked in `out`. */
typedef struct {
    int rank;
    int64_t B, Hq, Hkv, nq, nk, dk, dv;
    bool causal, weights; /* weights: return_weights, checked too */
    enc in, out;
} attention_case;

/* Sends the case's request and checks its output (and weights) against the
 * double reference. */
static void check_attention(const attention_case *c)
{
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, nq = c->nq, nk = c->nk, dk = c->dk,
                  dv = c->dv;
    int64_t qs[4] = {B, Hq, nq, dk}, ks[4] = {B, Hkv, nk, dk}, vs[4] = {B, Hkv, nk, dv};
    int skip = 4 - c->rank;
    float *q = rnd_tensor(B * Hq * nq * dk), *k = rnd_tensor(B * Hkv * nk * dk),
          *v = rnd_tensor(B * Hkv * nk * dv);
    sbuf b = {0};
    sb_printf(&b, "{");
    put_field(&b, "q", q, c->rank, qs + skip, c->in);
    put_field(&b, "k", k, c->rank, ks + skip, c->in);
    put_field(&b, "v", v, c->rank, vs + skip, c->in);
    sb_printf(&b, ",\"causal\":%s,\"return_weights\":%s,\"output_encoding\":\"%s\"}",
              c->causal ? "true" : "false", c->weights ? "true" : "false", ENC_NAME[c->out]);
    json_t *j = call_ok(API_OP_ATTENTION, &b);

    ref_problem r = {B, Hq, Hkv, nq, nk, dk, dv, 1 / sqrt((double)dk), c->causal, NULL, NULL};
    double *ro = malloc((size_t)(B * Hq * nq * dv) * sizeof *ro);
    double *rw = malloc((size_t)(B * Hq * nq * nk) * sizeof *rw);
    ref_sdpa(&r, q, k, v, ro, rw);
    int64_t os[4] = {B, Hq, nq, dv}, ws[4] = {B, Hq, nq, nk};
    float *o = get_tensor(json_object_get(j, "output"), c->out, c->rank, os + skip);
    assert_close_all("output", o, ro, B * Hq * nq * dv, 1e-5);
    if (c->weights) {
        float *w = get_tensor(json_object_get(j, "weights"), c->out, c->rank, ws + skip);
        assert_close_all("weights", w, rw, B * Hq * nq * nk, 1e-5);
        free(w);
    } else {
        ck_assert_ptr_null(json_object_get(j, "weights"));
    }
    ck_assert_ptr_null(json_object_get(j, "grad"));
    ck_assert_ptr_null(json_object_get(j, "stats"));
    free(o), free(ro), free(rw), free(q), free(k), free(v), free(b.s);
    json_decref(j);
}

/* An allocator that refuses every request while `refusing` is set. */
static bool refusing;
static void *refusing_alloc(void *ctx, size_t n)
{
    (void)ctx;
    return refusing ? NULL : malloc(n);
}
static void *refusing_realloc(void *ctx, void *p, size_t n)
{
    (void)ctx;
    return refusing ? NULL : realloc(p, n);
}
static void refusing_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

/* A step appending one position and attending over the cache. */
static const char cache_step[] = "{\"k\": [[1, 0]], \"v\": [[2, 3]], \"q\": [[1, 1]]}";

/* One step over the cache of lim, with api_execute_now: whether it ran,
 * and its status. */
static bool step_now(const api_limits *lim, int *status)
{
    api_cost cost;
    api_response res;
    api_call *call =
        api_prepare(API_OP_CACHE_ATTENTION, cache_step, strlen(cache_step), lim, &cost, &res);
    ck_assert_msg(call, "prepare: %d %s", res.status, res.body ? res.body : "");
    bool ran = api_execute_now(call, 1, &res);
    if (!ran) {
        api_call_free(call);
        return false;
    }
    *status = res.status;
    api_response_free(&res);
    return true;
}

/* api_execute_now takes a cache's turn without waiting; a step that took it
 * and then failed before computing (its results' memory refused) gives it
 * back: the next step runs at once, over a cache the failure left as it was. */
START_TEST(cache_step_failing_after_its_turn_gives_the_turn_back)
{
    api_caches *caches = api_caches_new(1e9, 0);
    api_limits lim = {.threads = 1, .caches = caches};
    api_response res;
    static const char shape[] = "{\"num_kv_heads\": 1, \"head_dim\": 2}";
    api_cache_create(shape, strlen(shape), &lim, &res);
    ck_assert_int_eq(res.status, 201);
    json_t *j = json_loadb(res.body, res.body_len, 0, NULL);
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(j, "id")));
    json_decref(j);
    api_response_free(&res);
    lim.cache_id = id;

    api_set_allocator(&(api_allocator){
        .alloc = refusing_alloc, .realloc = refusing_realloc, .free = refusing_free});
    api_cost cost;
    api_call *call =
        api_prepare(API_OP_CACHE_ATTENTION, cache_step, strlen(cache_step), &lim, &cost, &res);
    ck_assert_ptr_nonnull(call);
    refusing = true;
    bool ran = api_execute_now(call, 1, &res);
    refusing = false;
    ck_assert(ran);
    ck_assert_int_eq(res.status, 500);
    ck_assert_str_eq(res.error_code, "out_of_memory");
    api_response_free(&res);
    api_set_allocator(NULL);

    int status = 0;
    ck_assert_msg(step_now(&lim, &status), "the turn was not given back");
    ck_assert_int_eq(status, 200);
    api_cache_get(&lim, &res);
    ck_assert_int_eq(res.status, 200);
    ck_assert_msg(strstr(res.body, "\"length\":1"), "the cache after one step: %s", res.body);
    api_response_free(&res);
    api_caches_free(caches);
}
END_TEST

START_TEST(attention_rank2_nested_matches_reference)
{
    check_attention(&(attention_case){.rank = 2, .B = 1, .Hq = 1, .Hkv = 1, .nq = 5, .nk = 7,
                                      .dk = 4, .dv = 3, .in = ENC_NESTED, .out = ENC_NESTED});
}
END_TEST

START_TEST(attention_rank3_is_heads_times_positions)
{
    check_attention(&(attention_case){.rank = 3, .B = 1, .Hq = 3, .Hkv = 3, .nq = 4, .nk = 6,
                                      .dk = 8, .dv = 5, .weights = true, .in = ENC_NESTED,
                                      .out = ENC_NESTED});
}
END_TEST

START_TEST(attention_rank4_grouped_query_heads)
{
    check_attention(&(attention_case){.rank = 4, .B = 2, .Hq = 4, .Hkv = 2, .nq = 3, .nk = 5,
                                      .dk = 4, .dv = 6, .weights = true, .in = ENC_FLAT,
                                      .out = ENC_NESTED});
}
END_TEST

START_TEST(attention_multi_query_single_kv_head)
{
    check_attention(&(attention_case){.rank = 3, .B = 1, .Hq = 4, .Hkv = 1, .nq = 3, .nk = 3,
                                      .dk = 2, .dv = 2, .in = ENC_NESTED, .out = ENC_FLAT});
}
END_TEST

START_TEST(attention_causal_bottom_right_when_nq_lt_nk)
{
    check_attention(&(attention_case){.rank = 2, .B = 1, .Hq = 1, .Hkv = 1, .nq = 3, .nk = 6,
                                      .dk = 4, .dv = 4, .causal = true, .weights = true,
                                      .in = ENC_NESTED, .out = ENC_NESTED});
}
END_TEST

START_TEST(attention_causal_square_rank4)
{
    check_attention(&(attention_case){.rank = 4, .B = 2, .Hq = 2, .Hkv = 2, .nq = 5, .nk = 5,
                                      .dk = 3, .dv = 3, .causal = true, .weights = true,
                                      .in = ENC_BASE64, .out = ENC_BASE64});
}
END_TEST

START_TEST(attention_every_encoding_in_and_out)
{
    for (int in = 0; in < 3; in++)
        for (int out = 0; out < 3; out++)
            check_attention(&(attention_case){.rank = 3, .B = 1, .Hq = 2, .Hkv = 2, .nq = 3,
                                              .nk = 4, .dk = 3, .dv = 2, .weights = true,
                                              .in = (enc)in, .out = (enc)out});
}
END_TEST

START_TEST(attention_weights_rows_sum_to_one_and_causal_zeros)
{
    int64_t s[2] = {4, 3};
    float *q = rnd_tensor(12), *k = rnd_tensor(12), *v = rnd_tensor(12);
    sbuf b = {0};
    sb_printf(&b, "{");
    put_field(&b, "q", q, 2, s, ENC_NESTED);
    put_field(&b, "k", k, 2, s, ENC_NESTED);
    put_field(&b, "v", v, 2, s, ENC_NESTED);
    sb_printf(&b, ",\"causal\":true,\"return_weights\":true}");
    json_t *j = call_ok(API_OP_ATTENTION, &b);
    int64_t ws[2] = {4, 4};
    float *w = get_tensor(json_object_get(j, "weights"), ENC_NESTED, 2, ws);
    for (int i = 0; i < 4; i++) {
        double sum = 0;
        for (int jj = 0; jj < 4; jj++) {
            sum += w[i * 4 + jj];
            if (jj > i)
                ck_assert_float_eq(w[i * 4 + jj], 0.0f);
        }
        ck_close(sum, 1.0, 1e-6);
    }
    ck_close(w[0], 1.0, 0); /* the first query sees only the first key */
    free(w), free(q), free(k), free(v), free(b.s);
    json_decref(j);
}
END_TEST

/* A mask of the given kind and shape, checked after broadcasting by hand. */
static void check_mask(bool boolean, int mask_rank, const int64_t *mask_shape,
                       enc e, bool causal)
{
    const int64_t B = 2, H = 2, nq = 3, nk = 4, d = 3;
    int64_t qs[4] = {B, H, nq, d}, ks[4] = {B, H, nk, d};
    float *q = rnd_tensor(B * H * nq * d), *k = rnd_tensor(B * H * nk * d),
          *v = rnd_tensor(B * H * nk * d);
    int64_t mn = count_of(mask_rank, mask_shape);
    float *bias = rnd_tensor(mn);
    uint8_t *allowed = malloc((size_t)mn);
    for (int64_t i = 0; i < mn; i++)
        allowed[i] = (i % 3) != 1;
    sbuf b = {0};
    sb_printf(&b, "{");
    put_field(&b, "q", q, 4, qs, ENC_NESTED);
    put_field(&b, "k", k, 4, ks, ENC_NESTED);
    put_field(&b, "v", v, 4, ks, ENC_NESTED);
    sb_printf(&b, ",\"mask\":");
    put_tensor(&b, boolean ? NULL : bias, boolean ? allowed : NULL, mask_rank,
               mask_shape, e);
    sb_printf(&b, ",\"causal\":%s,\"return_weights\":true}", causal ? "true" : "false");
    json_t *j = call_ok(API_OP_ATTENTION, &b);

    /* Broadcast by NumPy rules, by hand: right-aligned, size-1 dims repeat. */
    int64_t full = B * H * nq * nk, dims4[4] = {B, H, nq, nk};
    uint8_t *fa = malloc((size_t)full);
    float *fb = malloc((size_t)full * sizeof *fb);
    for (int64_t e4 = 0; e4 < full; e4++) {
        int64_t idx[4] = {e4 / (H * nq * nk), e4 / (nq * nk) % H, e4 / nk % nq, e4 % nk};
        int64_t src = 0;
        for (int a = 0; a < mask_rank; a++) {
            int64_t dim = mask_shape[a], i = idx[4 - mask_rank + a];
            src = src * dim + (dim == 1 ? 0 : i);
        }
        (void)dims4;
        fa[e4] = allowed[src];
        fb[e4] = bias[src];
    }
    ref_problem r = {B, H, H, nq, nk, d, d, 1 / sqrt((double)d), causal,
                     boolean ? fa : NULL, boolean ? NULL : fb};
    double *ro = malloc((size_t)(B * H * nq * d) * sizeof *ro);
    double *rw = malloc((size_t)full * sizeof *rw);
    ref_sdpa(&r, q, k, v, ro, rw);
    int64_t os[4] = {B, H, nq, d}, ws[4] = {B, H, nq, nk};
    float *o = get_tensor(json_object_get(j, "output"), ENC_NESTED, 4, os);
    float *w = get_tensor(json_object_get(j, "weights"), ENC_NESTED, 4, ws);
    assert_close_all("output", o, ro, B * H * nq * d, 1e-5);
    assert_close_all("weights", w, rw, full, 1e-5);
    free(o), free(w), free(ro), free(rw), free(fa), free(fb), free(bias), free(allowed);
    free(q), free(k), free(v), free(b.s);
    json_decref(j);
}

START_TEST(attention_bool_mask_broadcasts_numpy_style)
{
    int64_t key_padding[2] = {1, 4};      /* per key, every query */
    int64_t per_batch[4] = {2, 1, 3, 4};  /* per batch, shared by heads */
    int64_t full[4] = {2, 2, 3, 4};
    check_mask(true, 2, key_padding, ENC_NESTED, false);
    check_mask(true, 4, per_batch, ENC_FLAT, true);
    check_mask(true, 4, full, ENC_BASE64, false);
}
END_TEST

START_TEST(attention_bias_mask_is_added_to_scaled_scores)
{
    int64_t row[1] = {4}, plane[2] = {3, 4}, heads[3] = {2, 1, 4};
    check_mask(false, 1, row, ENC_NESTED, false);
    check_mask(false, 2, plane, ENC_BASE64, true);
    check_mask(false, 3, heads, ENC_FLAT, false);
}
END_TEST

START_TEST(attention_explicit_scale_is_used)
{
    int64_t s[2] = {3, 4};
    float *q = rnd_tensor(12), *k = rnd_tensor(12), *v = rnd_tensor(12);
    sbuf b = {0};
    sb_printf(&b, "{\"scale\":2.5");
    put_field(&b, "q", q, 2, s, ENC_NESTED);
    put_field(&b, "k", k, 2, s, ENC_NESTED);
    put_field(&b, "v", v, 2, s, ENC_NESTED);
    sb_printf(&b, "}");
    json_t *j = call_ok(API_OP_ATTENTION, &b);
    ref_problem r = {1, 1, 1, 3, 3, 4, 4, 2.5, false, NULL, NULL};
    double ro[12];
    ref_sdpa(&r, q, k, v, ro, NULL);
    float *o = get_tensor(json_object_get(j, "output"), ENC_NESTED, 2, s);
    assert_close_all("output", o, ro, 12, 1e-5);
    free(o), free(q), free(k), free(v), free(b.s);
    json_decref(j);
}
END_TEST

START_TEST(attention_null_optional_fields_mean_default)
{
    const char *body =
        "{\"q\":[[1,0]],\"k\":[[1,0],[0,1]],\"v\":[[1,2],[3,4]],\"mask\":null,"
        "\"scale\":null,\"causal\":null,\"grad_output\":null,\"output_encoding\":null}";
    json_t *j = call(API_OP_ATTENTION, body, strlen(body), &LIM, 200);
    double w0 = exp(1 / sqrt(2.0)) / (exp(1 / sqrt(2.0)) + 1);
    json_t *row = json_array_get(json_object_get(j, "output"), 0);
    ck_close(json_number_value(json_array_get(row, 0)), w0 * 1 + (1 - w0) * 3, 1e-6);
    ck_close(json_number_value(json_array_get(row, 1)), w0 * 2 + (1 - w0) * 4, 1e-6);
    json_decref(j);
}
END_TEST

START_TEST(attention_fully_masked_row_gives_zeros)
{
    const char *body =
        "{\"q\":[[1,0],[0,1]],\"k\":[[1,0],[0,1]],\"v\":[[1,2],[3,4]],"
        "\"mask\":[[false,false],[true,true]],\"return_weights\":true,"
        "\"grad_output\":[[1,1],[1,1]]}";
    json_t *j = call(API_OP_ATTENTION, body, strlen(body), &LIM, 200);
    int64_t s[2] = {2, 2};
    float *o = get_tensor(json_object_get(j, "output"), ENC_NESTED, 2, s);
    float *w = get_tensor(json_object_get(j, "weights"), ENC_NESTED, 2, s);
    float *dq = get_tensor(json_object_get(json_object_get(j, "grad"), "q"),
                           ENC_NESTED, 2, s);
    ck_assert_float_eq(o[0], 0); ck_assert_float_eq(o[1], 0);
    ck_assert_float_eq(w[0], 0); ck_assert_float_eq(w[1], 0);
    ck_assert_float_eq(dq[0], 0); ck_assert_float_eq(dq[1], 0);
    ck_close(w[2] + w[3], 1.0, 1e-6);
    free(o), free(w), free(dq);
    json_decref(j);
}
END_TEST

START_TEST(attention_stats_match_reference)
{
    int64_t s[2] = {4, 3};
    float *q = rnd_tensor(12), *k = rnd_tensor(12), *v = rnd_tensor(12);
    sbuf b = {0};
    sb_printf(&b, "{\"return_stats\":true,\"causal\":true");
    put_field(&b, "q", q, 2, s, ENC_NESTED);
    put_field(&b, "k", k, 2, s, ENC_NESTED);
    put_field(&b, "v", v, 2, s, ENC_NESTED);
    sb_printf(&b, "}");
    json_t *j = call_ok(API_OP_ATTENTION, &b);
    json_t *st = json_object_get(j, "stats");
    ck_assert_ptr_nonnull(st);

    /* Scores over the visible (causal) entries; entropy and max per row. */
    ref_problem r = {1, 1, 1, 4, 4, 3, 3, 1 / sqrt(3.0), true, NULL, NULL};
    double w[16];
    ref_sdpa(&r, q, k, v, NULL, w);
    double sum = 0, sum2 = 0, ent_sum = 0, ent_min = INFINITY, ent_max = -INFINITY,
           maxw = 0;
    int cnt = 0;
    for (int i = 0; i < 4; i++) {
        double ent = 0, mx = 0;
        for (int jj = 0; jj <= i; jj++) {
            double dot = 0;
            for (int t = 0; t < 3; t++)
                dot += (double)q[i * 3 + t] * k[jj * 3 + t];
            sum += dot, sum2 += dot * dot, cnt++;
            if (w[i * 4 + jj] > 0)
                ent -= w[i * 4 + jj] * log(w[i * 4 + jj]);
            if (w[i * 4 + jj] > mx)
                mx = w[i * 4 + jj];
        }
        ent_sum += ent, maxw += mx;
        ent_min = fmin(ent_min, ent), ent_max = fmax(ent_max, ent);
    }
    double mean = sum / cnt, var = sum2 / cnt - mean * mean;
    json_t *sc = json_object_get(st, "scores"), *ss = json_object_get(st, "scaled_scores"),
           *en = json_object_get(st, "entropy"), *mw = json_object_get(st, "max_weight");
    ck_close(json_number_value(json_object_get(sc, "mean")), mean, 1e-5);
    ck_close(json_number_value(json_object_get(sc, "var")), var, 1e-5);
    ck_close(json_number_value(json_object_get(ss, "mean")), mean / sqrt(3.0), 1e-5);
    ck_close(json_number_value(json_object_get(ss, "var")), var / 3.0, 1e-5);
    ck_close(json_number_value(json_object_get(en, "mean")), ent_sum / 4, 1e-5);
    ck_close(json_number_value(json_object_get(en, "min")), ent_min, 1e-5);
    ck_close(json_number_value(json_object_get(en, "max")), ent_max, 1e-5);
    ck_close(json_number_value(json_object_get(mw, "mean")), maxw / 4, 1e-5);
    free(q), free(k), free(v), free(b.s);
    json_decref(j);
}
END_TEST

START_TEST(attention_stats_null_when_everything_masked)
{
    const char *body = "{\"q\":[[1,0]],\"k\":[[1,0]],\"v\":[[1,2]],"
                       "\"mask\":[[false]],\"return_stats\":true}";
    json_t *j = call(API_OP_ATTENTION, body, strlen(body), &LIM, 200);
    json_t *st = json_object_get(j, "stats");
    ck_assert(json_is_null(json_object_get(json_object_get(st, "scores"), "mean")));
    ck_assert(json_is_null(json_object_get(json_object_get(st, "scaled_scores"), "var")));
    ck_assert(json_is_null(json_object_get(json_object_get(st, "entropy"), "min")));
    ck_assert(json_is_null(json_object_get(json_object_get(st, "max_weight"), "mean")));
    json_decref(j);
}
END_TEST

/* Gradients: dq by central differences of the double reference, dk and dv
 * against libattn called directly on the same inputs. */
START_TEST(attention_grad_matches_finite_differences_and_libattn)
{
    const int64_t B = 1, Hq = 4, Hkv = 2, nq = 3, nk = 4, d = 3;
    int64_t qs[3] = {Hq, nq, d}, ks[3] = {Hkv, nk, d}, os[3] = {Hq, nq, d};
    int64_t nqe = Hq * nq * d, nke = Hkv * nk * d;
    float *q = rnd_tensor(nqe), *k = rnd_tensor(nke), *v = rnd_tensor(nke),
          *dout = rnd_tensor(nqe);
    for (int e = 0; e < 3; e++) {
        sbuf b = {0};
        sb_printf(&b, "{\"causal\":true,\"output_encoding\":\"%s\"", ENC_NAME[e]);
        put_field(&b, "q", q, 3, qs, (enc)e);
        put_field(&b, "k", k, 3, ks, (enc)((e + 1) % 3));
        put_field(&b, "v", v, 3, ks, (enc)((e + 2) % 3));
        put_field(&b, "grad_output", dout, 3, os, (enc)e);
        sb_printf(&b, "}");
        json_t *j = call_ok(API_OP_ATTENTION, &b);
        json_t *g = json_object_get(j, "grad");
        ck_assert_int_eq(json_object_size(g), 3);
        float *gq = get_tensor(json_object_get(g, "q"), (enc)e, 3, qs);
        float *gk = get_tensor(json_object_get(g, "k"), (enc)e, 3, ks);
        float *gv = get_tensor(json_object_get(g, "v"), (enc)e, 3, ks);

        ref_problem r = {B, Hq, Hkv, nq, nk, d, d, 1 / sqrt((double)d), true, NULL, NULL};
        for (int64_t i = 0; i < nqe; i++) {
            float keep = q[i];
            const double h = 1e-3;
            q[i] = keep + (float)h;
            double up = ref_loss(&r, q, k, v, dout);
            q[i] = keep - (float)h;
            double down = ref_loss(&r, q, k, v, dout);
            q[i] = keep;
            double fd = (up - down) / ((double)(keep + (float)h) - (double)(keep - (float)h));
            ck_assert_msg(fabs(gq[i] - fd) < 2e-3, "dq[%lld]=%g, fd %g", (long long)i,
                          (double)gq[i], fd);
        }
        attn_sdpa_params p = {.batch = B, .heads_q = Hq, .heads_kv = Hkv, .n_q = nq,
                              .n_k = nk, .d_k = d, .d_v = d,
                              .scale = attn_default_scale(d), .causal = true,
                              .threads = 1};
        float out[36], dq[36], dk[24], dv[24];
        attn_softmax_row lse[12];
        ck_assert_int_eq(attn_sdpa_forward(&p, q, k, v, out, lse, NULL, NULL, NULL), ATTN_OK);
        ck_assert_int_eq(attn_sdpa_backward(&p, q, k, v, out, lse, dout, dq, dk, dv, NULL),
                         ATTN_OK);
        for (int64_t i = 0; i < nke; i++) {
            ck_close(gk[i], dk[i], 1e-5);
            ck_close(gv[i], dv[i], 1e-5);
        }
        free(gq), free(gk), free(gv), free(b.s);
        json_decref(j);
    }
    free(q), free(k), free(v), free(dout);
}
END_TEST

/* The meta and stats objects are compact JSON text whose numbers are as
 * jansson writes them: dimensions and flops integers, statistics reals with
 * 17 significant digits, timings reals with 6; each object re-dumped by
 * jansson from the parsed body is found verbatim in the body. */
/* Checks that object o has exactly the keys given (NULL-terminated). */
static void expect_keys(json_t *o, const char *const *keys)
{
    ck_assert(json_is_object(o));
    size_t n = 0;
    for (; keys[n]; n++)
        ck_assert_msg(json_object_get(o, keys[n]) != NULL, "no \"%s\"", keys[n]);
    ck_assert_uint_eq(json_object_size(o), n);
}

/* The stats and meta objects have the members of the contract, each a JSON
 * number of the right kind (null for a statistic over nothing). Their values
 * are pinned by the reference tests; this pins their form, whatever text
 * writes them. */
START_TEST(meta_and_stats_follow_the_contract)
{
    const char *bodies[][2] = {
        {"a", "{\"q\":[[1,0.5],[0.25,2],[3,1]],\"k\":[[1,2],[3,4]],\"v\":[[1,2],[3,4]],"
              "\"causal\":true,\"return_stats\":true}"},
        {"a", "{\"q\":[[1,0]],\"k\":[[1,0]],\"v\":[[1,2]],\"mask\":[[false]],"
              "\"return_stats\":true}"},
        {"m", "{\"x\":[[1,2],[3,4]],\"w_q\":[[1,2],[3,4]],\"w_k\":[[1,2],[3,4]],"
              "\"w_v\":[[1,2],[3,4]],\"num_heads\":2,\"return_stats\":true}"},
    };
    static const char *const mean_var[] = {"mean", "var", NULL};
    static const char *const spread[] = {"mean", "min", "max", NULL};
    static const char *const mean[] = {"mean", NULL};
    static const char *const groups[] = {"scores", "scaled_scores", "entropy", "max_weight",
                                         NULL};
    static const char *const steps[] = {"decode", "compute", "encode", "total", NULL};
    static const char *const meta_keys[] = {"shape", "flops", "work", "algorithm",
                                            "timing_ms", NULL};
    const char *const *group_keys[] = {mean_var, mean_var, spread, mean};
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        api_op op = bodies[i][0][0] == 'm' ? API_OP_MULTIHEAD : API_OP_ATTENTION;
        json_t *j = call(op, bodies[i][1], strlen(bodies[i][1]), &LIM, 200);
        bool all_masked = i == 1;
        json_t *st = json_object_get(j, "stats");
        expect_keys(st, groups);
        for (size_t g = 0; g < 4; g++) {
            json_t *grp = json_object_get(st, groups[g]);
            expect_keys(grp, group_keys[g]);
            const char *key;
            json_t *x;
            json_object_foreach(grp, key, x)
                ck_assert_msg(all_masked ? json_is_null(x) : json_is_number(x),
                              "stats.%s.%s", groups[g], key);
        }
        json_t *meta = json_object_get(j, "meta");
        expect_keys(meta, meta_keys);
        const char *key;
        json_t *x;
        json_object_foreach(json_object_get(meta, "shape"), key, x)
            ck_assert_msg(json_is_integer(x) && json_integer_value(x) >= 1, "shape.%s", key);
        json_t *flops = json_object_get(meta, "flops"), *work = json_object_get(meta, "work");
        ck_assert(json_is_integer(flops) && json_is_integer(work));
        ck_assert(json_integer_value(work) >= json_integer_value(flops));
        ck_assert_str_eq(json_string_value(json_object_get(meta, "algorithm")), "tiled");
        json_t *timing = json_object_get(meta, "timing_ms");
        expect_keys(timing, steps);
        double sum = 0;
        for (int s = 0; s < 3; s++)
            sum += json_number_value(json_object_get(timing, steps[s]));
        json_object_foreach(timing, key, x)
            ck_assert_msg(json_is_number(x) && json_number_value(x) >= 0, "timing_ms.%s", key);
        ck_assert(fabs(json_number_value(json_object_get(timing, "total")) - sum) < 2e-3);
        json_decref(j);
    }
}
END_TEST

START_TEST(attention_meta_names_dims_flops_and_timing)
{
    int64_t qs[4] = {2, 4, 3, 8}, ks[4] = {2, 2, 5, 8}, vs[4] = {2, 2, 5, 6};
    float *q = rnd_tensor(192), *k = rnd_tensor(160), *v = rnd_tensor(120);
    sbuf b = {0};
    sb_printf(&b, "{");
    put_field(&b, "q", q, 4, qs, ENC_NESTED);
    put_field(&b, "k", k, 4, ks, ENC_NESTED);
    put_field(&b, "v", v, 4, vs, ENC_NESTED);
    sb_printf(&b, "}");
    api_response res;
    api_handle(API_OP_ATTENTION, b.s, b.len, &LIM, &res);
    ck_assert_int_eq(res.status, 200);
    ck_assert_uint_eq(strlen(res.body), res.body_len);
    json_t *j = json_loadb(res.body, res.body_len, 0, NULL);
    json_t *meta = json_object_get(j, "meta"), *sh = json_object_get(meta, "shape");
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "batch")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "heads_q")), 4);
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "heads_kv")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "n_q")), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "n_k")), 5);
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "d_k")), 8);
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "d_v")), 6);
    /* two products: 2 * B * H_q * n_q * n_k * (d_k + d_v) */
    ck_close(json_number_value(json_object_get(meta, "flops")), 2.0 * 2 * 4 * 3 * 5 * 14, 0);
    ck_assert_str_eq(json_string_value(json_object_get(meta, "algorithm")), "tiled");
    json_t *t = json_object_get(meta, "timing_ms");
    double sum = 0;
    const char *steps[] = {"decode", "compute", "encode"};
    for (int i = 0; i < 3; i++) {
        json_t *x = json_object_get(t, steps[i]);
        ck_assert(json_is_number(x));
        ck_assert(json_number_value(x) >= 0);
        sum += json_number_value(x);
    }
    ck_close(json_number_value(json_object_get(t, "total")), sum, 1e-3);
    ck_assert(res.decode_ms >= 0 && res.compute_ms >= 0 && res.encode_ms >= 0);
    api_response_free(&res);
    api_response_free(&res); /* twice is harmless */
    free(q), free(k), free(v), free(b.s);
    json_decref(j);
}
END_TEST

START_TEST(attention_response_numbers_round_trip_float32)
{
    /* One key: the output is exactly v, so its text must read back as v. */
    const char *body = "{\"q\":[[0.5]],\"k\":[[0.25]],\"v\":[[0.1,1e-7,3.4028235e38,-0.0]]}";
    api_response res;
    api_handle(API_OP_ATTENTION, body, strlen(body), &LIM, &res);
    ck_assert_int_eq(res.status, 200);
    json_t *j = json_loadb(res.body, res.body_len, 0, NULL);
    json_t *row = json_array_get(json_object_get(j, "output"), 0);
    ck_assert_float_eq((float)json_number_value(json_array_get(row, 0)), 0.1f);
    ck_assert_float_eq((float)json_number_value(json_array_get(row, 1)), 1e-7f);
    ck_assert_float_eq((float)json_number_value(json_array_get(row, 2)), 3.4028235e38f);
    json_decref(j);
    api_response_free(&res);
}
END_TEST

/* ------------------------------------------------- multi-head: results */

typedef struct {
    int64_t B, n, m, d_model, d_ctx, h, h_kv, d_k, d_v, d_out;
    bool cross, has_wo, biases, causal;
    double scale; /* 0: the default 1/sqrt(d_k), not sent */
} mha_case;

typedef struct {
    float *x, *ctx, *w_q, *w_k, *w_v, *w_o, *b_q, *b_k, *b_v, *b_o;
} mha_data;

static mha_data mha_make(const mha_case *c)
{
    mha_data d = {0};
    d.x = rnd_tensor(c->B * c->n * c->d_model);
    if (c->cross)
        d.ctx = rnd_tensor(c->B * c->m * c->d_ctx);
    d.w_q = rnd_tensor(c->d_model * c->h * c->d_k);
    d.w_k = rnd_tensor(c->d_ctx * c->h_kv * c->d_k);
    d.w_v = rnd_tensor(c->d_ctx * c->h_kv * c->d_v);
    if (c->has_wo)
        d.w_o = rnd_tensor(c->h * c->d_v * c->d_out);
    if (c->biases) {
        d.b_q = rnd_tensor(c->h * c->d_k);
        d.b_k = rnd_tensor(c->h_kv * c->d_k);
        d.b_v = rnd_tensor(c->h_kv * c->d_v);
        if (c->has_wo)
            d.b_o = rnd_tensor(c->d_out);
    }
    return d;
}

static void mha_free(mha_data *d)
{
    float **all[] = {&d->x, &d->ctx, &d->w_q, &d->w_k, &d->w_v, &d->w_o,
                     &d->b_q, &d->b_k, &d->b_v, &d->b_o};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(*all[i]), *all[i] = NULL;
}

/* X W + b for X [rows, in], W [in, cols], into float (as libattn would
 * feed the attention) — the reference rounds projections to float32 too,
 * so that the comparison isolates the API from rounding differences. */
static float *ref_project(const float *x, int64_t rows, int64_t in, const float *w,
                          int64_t cols, const float *b)
{
    float *y = malloc((size_t)(rows * cols) * sizeof *y);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            double acc = b ? b[j] : 0;
            for (int64_t t = 0; t < in; t++)
                acc += (double)x[i * in + t] * w[t * cols + j];
            y[i * cols + j] = (float)acc;
        }
    return y;
}

/* [B, n, h, d] (heads side by side in columns) -> [B, h, n, d] */
static float *split_heads(const float *y, int64_t B, int64_t n, int64_t h, int64_t d)
{
    float *s = malloc((size_t)(B * n * h * d) * sizeof *s);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t hh = 0; hh < h; hh++)
                for (int64_t t = 0; t < d; t++)
                    s[((b * h + hh) * n + i) * d + t] = y[((b * n + i) * h + hh) * d + t];
    return s;
}

/* out [B, n, d_out] and per-head weights [B, h, n, m] by the chapter's
 * equations, in double (projections rounded to float32 as noted). */
static void ref_mha(const mha_case *c, const mha_data *d, const uint8_t *allowed,
                    double *out, double *weights)
{
    const float *kv_in = c->cross ? d->ctx : d->x;
    float *Q = ref_project(d->x, c->B * c->n, c->d_model, d->w_q, c->h * c->d_k, d->b_q);
    float *K = ref_project(kv_in, c->B * c->m, c->d_ctx, d->w_k, c->h_kv * c->d_k, d->b_k);
    float *V = ref_project(kv_in, c->B * c->m, c->d_ctx, d->w_v, c->h_kv * c->d_v, d->b_v);
    float *q = split_heads(Q, c->B, c->n, c->h, c->d_k);
    float *k = split_heads(K, c->B, c->m, c->h_kv, c->d_k);
    float *v = split_heads(V, c->B, c->m, c->h_kv, c->d_v);
    ref_problem r = {c->B, c->h, c->h_kv, c->n, c->m, c->d_k, c->d_v,
                     c->scale ? c->scale : 1 / sqrt((double)c->d_k), c->causal,
                     allowed, NULL};
    double *heads = malloc((size_t)(c->B * c->h * c->n * c->d_v) * sizeof *heads);
    ref_sdpa(&r, q, k, v, heads, weights);
    int64_t hd = c->h * c->d_v;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < c->n; i++) {
            double concat[64];
            for (int64_t hh = 0; hh < c->h; hh++)
                for (int64_t t = 0; t < c->d_v; t++)
                    concat[hh * c->d_v + t] = heads[((b * c->h + hh) * c->n + i) * c->d_v + t];
            for (int64_t j = 0; j < c->d_out; j++) {
                double acc;
                if (!d->w_o) {
                    acc = concat[j];
                } else {
                    acc = d->b_o ? d->b_o[j] : 0;
                    for (int64_t t = 0; t < hd; t++)
                        acc += concat[t] * d->w_o[t * c->d_out + j];
                }
                out[(b * c->n + i) * c->d_out + j] = acc;
            }
        }
    free(Q), free(K), free(V), free(q), free(k), free(v), free(heads);
}

static void mha_body(sbuf *b, const mha_case *c, const mha_data *d, enc e, int rank)
{
    int64_t xs[3] = {c->B, c->n, c->d_model}, cs[3] = {c->B, c->m, c->d_ctx};
    int skip = 3 - rank;
    sb_printf(b, "{\"num_heads\":%lld", (long long)c->h);
    if (c->h_kv != c->h)
        sb_printf(b, ",\"num_kv_heads\":%lld", (long long)c->h_kv);
    if (c->causal)
        sb_printf(b, ",\"causal\":true");
    if (c->scale)
        sb_printf(b, ",\"scale\":%.17g", c->scale);
    put_field(b, "x", d->x, rank, xs + skip, e);
    if (c->cross)
        put_field(b, "context", d->ctx, rank, cs + skip, e);
    int64_t wq[2] = {c->d_model, c->h * c->d_k}, wk[2] = {c->d_ctx, c->h_kv * c->d_k},
            wv[2] = {c->d_ctx, c->h_kv * c->d_v}, wo[2] = {c->h * c->d_v, c->d_out};
    put_field(b, "w_q", d->w_q, 2, wq, e);
    put_field(b, "w_k", d->w_k, 2, wk, e);
    put_field(b, "w_v", d->w_v, 2, wv, e);
    if (d->w_o)
        put_field(b, "w_o", d->w_o, 2, wo, e);
    if (d->b_q) {
        put_field(b, "b_q", d->b_q, 1, wq + 1, e);
        put_field(b, "b_k", d->b_k, 1, wk + 1, e);
        put_field(b, "b_v", d->b_v, 1, wv + 1, e);
    }
    if (d->b_o)
        put_field(b, "b_o", d->b_o, 1, wo + 1, e);
}

static void check_mha(mha_case c, enc e, int rank, const char *weights_mode)
{
    if (!c.cross)
        c.m = c.n, c.d_ctx = c.d_model;
    if (!c.has_wo)
        c.d_out = c.h * c.d_v;
    mha_data d = mha_make(&c);
    sbuf b = {0};
    mha_body(&b, &c, &d, e, rank);
    sb_printf(&b, ",\"return_weights\":%s,\"output_encoding\":\"%s\"}", weights_mode,
              ENC_NAME[e]);
    json_t *j = call_ok(API_OP_MULTIHEAD, &b);

    int64_t nw = c.B * c.h * c.n * c.m;
    double *ro = malloc((size_t)(c.B * c.n * c.d_out) * sizeof *ro);
    double *rw = malloc((size_t)nw * sizeof *rw);
    ref_mha(&c, &d, NULL, ro, rw);
    int skip = 3 - rank;
    int64_t os[3] = {c.B, c.n, c.d_out};
    float *o = get_tensor(json_object_get(j, "output"), e, rank, os + skip);
    assert_close_all("output", o, ro, c.B * c.n * c.d_out, 1e-4);
    if (strcmp(weights_mode, "true") == 0) {
        int64_t ws[4] = {c.B, c.h, c.n, c.m};
        float *w = get_tensor(json_object_get(j, "weights"), e, rank + 1, ws + skip);
        assert_close_all("weights", w, rw, nw, 1e-4);
        free(w);
    } else if (strcmp(weights_mode, "\"mean\"") == 0) {
        int64_t ws[3] = {c.B, c.n, c.m};
        float *w = get_tensor(json_object_get(j, "weights"), e, rank, ws + skip);
        double *mean = calloc((size_t)(c.B * c.n * c.m), sizeof *mean);
        for (int64_t bb = 0; bb < c.B; bb++)
            for (int64_t i = 0; i < c.n * c.m; i++)
                for (int64_t hh = 0; hh < c.h; hh++)
                    mean[bb * c.n * c.m + i] += rw[(bb * c.h + hh) * c.n * c.m + i] / (double)c.h;
        assert_close_all("mean weights", w, mean, c.B * c.n * c.m, 1e-4);
        free(mean);
        free(w);
    } else {
        ck_assert_ptr_null(json_object_get(j, "weights"));
    }
    json_t *sh = json_object_get(json_object_get(j, "meta"), "shape");
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "heads")), c.h);
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "kv_heads")), c.h_kv);
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "d_k")), c.d_k);
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "d_out")), c.d_out);
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "m")), c.m);
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "d_ctx")), c.d_ctx);
    free(o), free(ro), free(rw), free(b.s);
    mha_free(&d);
    json_decref(j);
}

START_TEST(multihead_self_attention_heads_concatenated)
{
    mha_case c = {.B = 1, .n = 4, .d_model = 6, .h = 2, .h_kv = 2, .d_k = 3, .d_v = 2};
    check_mha(c, ENC_NESTED, 2, "false");
}
END_TEST

START_TEST(multihead_output_projection_and_biases)
{
    mha_case c = {.B = 1, .n = 3, .d_model = 4, .h = 2, .h_kv = 2, .d_k = 2, .d_v = 3,
                  .d_out = 5, .has_wo = true, .biases = true};
    check_mha(c, ENC_FLAT, 2, "true");
}
END_TEST

START_TEST(multihead_cross_attention_from_context)
{
    mha_case c = {.B = 2, .n = 3, .m = 5, .d_model = 4, .d_ctx = 6, .h = 2, .h_kv = 2,
                  .d_k = 2, .d_v = 2, .d_out = 3, .cross = true, .has_wo = true,
                  .biases = true};
    check_mha(c, ENC_BASE64, 3, "true");
}
END_TEST

START_TEST(multihead_grouped_kv_heads_and_causal)
{
    mha_case c = {.B = 2, .n = 4, .d_model = 8, .h = 4, .h_kv = 2, .d_k = 2, .d_v = 3,
                  .d_out = 4, .has_wo = true, .causal = true};
    check_mha(c, ENC_NESTED, 3, "true");
}
END_TEST

START_TEST(multihead_explicit_scale_is_used)
{
    mha_case c = {.B = 1, .n = 3, .d_model = 4, .h = 2, .h_kv = 1, .d_k = 2, .d_v = 2,
                  .scale = 1.75};
    check_mha(c, ENC_NESTED, 2, "true");
}
END_TEST

/* Entropy and the largest weight of every row of every head, from the
 * reference weights; the raw scores from the reference projections. */
START_TEST(multihead_stats_over_every_head)
{
    mha_case c = {.B = 1, .n = 3, .m = 3, .d_model = 2, .d_ctx = 2, .h = 2, .h_kv = 2,
                  .d_k = 1, .d_v = 1, .d_out = 2, .causal = true};
    mha_data d = mha_make(&c);
    sbuf b = {0};
    mha_body(&b, &c, &d, ENC_NESTED, 2);
    sb_printf(&b, ",\"return_stats\":true}");
    json_t *j = call_ok(API_OP_MULTIHEAD, &b);
    double ro[6], rw[18];
    ref_mha(&c, &d, NULL, ro, rw);
    double ent_sum = 0, ent_min = INFINITY, ent_max = -INFINITY, maxw = 0;
    for (int r = 0; r < 6; r++) {
        double ent = 0, mx = 0;
        for (int jj = 0; jj < 3; jj++) {
            double w = rw[r * 3 + jj];
            if (w > 0)
                ent -= w * log(w);
            mx = fmax(mx, w);
        }
        ent_sum += ent, maxw += mx;
        ent_min = fmin(ent_min, ent), ent_max = fmax(ent_max, ent);
    }
    /* raw scores (d_k = 1): q_i * k_j over the causal entries of each head */
    float *Q = ref_project(d.x, 3, 2, d.w_q, 2, NULL), *K = ref_project(d.x, 3, 2, d.w_k, 2, NULL);
    double sum = 0, sum2 = 0;
    int cnt = 0;
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 3; i++)
            for (int jj = 0; jj <= i; jj++) {
                double sc = (double)Q[i * 2 + h] * K[jj * 2 + h];
                sum += sc, sum2 += sc * sc, cnt++;
            }
    json_t *st = json_object_get(j, "stats");
    ck_close(json_number_value(json_object_get(json_object_get(st, "entropy"), "mean")),
             ent_sum / 6, 1e-5);
    ck_close(json_number_value(json_object_get(json_object_get(st, "entropy"), "min")),
             ent_min, 1e-5);
    ck_close(json_number_value(json_object_get(json_object_get(st, "entropy"), "max")),
             ent_max, 1e-5);
    ck_close(json_number_value(json_object_get(json_object_get(st, "max_weight"), "mean")),
             maxw / 6, 1e-5);
    ck_close(json_number_value(json_object_get(json_object_get(st, "scores"), "mean")),
             sum / cnt, 1e-5);
    ck_close(json_number_value(json_object_get(json_object_get(st, "scores"), "var")),
             sum2 / cnt - (sum / cnt) * (sum / cnt), 1e-5);
    free(Q), free(K), free(b.s);
    mha_free(&d);
    json_decref(j);
}
END_TEST

START_TEST(multihead_integral_num_heads_and_null_defaults)
{
    const char *body =
        "{\"x\":[[1,0],[0,1]],\"w_q\":[[1,0],[0,1]],\"w_k\":[[1,0],[0,1]],"
        "\"w_v\":[[1,2],[3,4]],\"num_heads\":2.0,\"num_kv_heads\":null,\"context\":null,"
        "\"w_o\":null,\"b_o\":null,\"scale\":null,\"return_weights\":null}";
    json_t *j = call(API_OP_MULTIHEAD, body, strlen(body), &LIM, 200);
    json_t *sh = json_object_get(json_object_get(j, "meta"), "shape");
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "heads")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "kv_heads")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(sh, "d_out")), 2);
    ck_assert_ptr_null(json_object_get(j, "weights"));
    json_decref(j);
}
END_TEST

START_TEST(multihead_weights_mean_is_head_average)
{
    mha_case c = {.B = 2, .n = 3, .d_model = 4, .h = 4, .h_kv = 1, .d_k = 1, .d_v = 1};
    check_mha(c, ENC_NESTED, 3, "\"mean\"");
    mha_case c2 = {.B = 1, .n = 3, .d_model = 4, .h = 2, .h_kv = 2, .d_k = 2, .d_v = 2,
                   .causal = true};
    check_mha(c2, ENC_BASE64, 2, "\"mean\"");
}
END_TEST

START_TEST(multihead_mask_broadcasts_to_batch_heads)
{
    mha_case c = {.B = 2, .n = 3, .m = 3, .d_model = 4, .d_ctx = 4, .h = 2, .h_kv = 2,
                  .d_k = 2, .d_v = 2, .d_out = 4};
    mha_data d = mha_make(&c);
    sbuf b = {0};
    mha_body(&b, &c, &d, ENC_NESTED, 3);
    /* [B, 1, 1, m]: key padding per batch element */
    sb_printf(&b, ",\"mask\":[[[[true,true,false]]],[[[true,false,false]]]],"
                  "\"return_weights\":true,\"return_stats\":true}");
    json_t *j = call_ok(API_OP_MULTIHEAD, &b);
    uint8_t allowed[2 * 2 * 3 * 3];
    for (int bb = 0; bb < 2; bb++)
        for (int e = 0; e < 18; e++)
            allowed[bb * 18 + e] = bb == 0 ? (e % 3) < 2 : (e % 3) < 1;
    double ro[2 * 3 * 4], rw[36];
    ref_mha(&c, &d, allowed, ro, rw);
    int64_t os[3] = {2, 3, 4}, ws[4] = {2, 2, 3, 3};
    float *o = get_tensor(json_object_get(j, "output"), ENC_NESTED, 3, os);
    float *w = get_tensor(json_object_get(j, "weights"), ENC_NESTED, 4, ws);
    assert_close_all("output", o, ro, 24, 1e-4);
    assert_close_all("weights", w, rw, 36, 1e-4);
    json_t *st = json_object_get(j, "stats");
    ck_assert(json_is_number(json_object_get(json_object_get(st, "entropy"), "mean")));
    ck_assert(json_is_number(json_object_get(json_object_get(st, "scores"), "var")));
    free(o), free(w), free(b.s);
    mha_free(&d);
    json_decref(j);
}
END_TEST

/* Every given differentiable input gets a gradient, shaped like it, equal to
 * libattn's on the same inputs; b_o's is also the column sums of dout. */
START_TEST(multihead_grad_has_a_key_per_given_input)
{
    mha_case c = {.B = 2, .n = 3, .m = 4, .d_model = 4, .d_ctx = 3, .h = 2, .h_kv = 1,
                  .d_k = 2, .d_v = 2, .d_out = 3, .cross = true, .has_wo = true,
                  .biases = true};
    mha_data d = mha_make(&c);
    float *dout = rnd_tensor(c.B * c.n * c.d_out);
    int64_t os[3] = {c.B, c.n, c.d_out};
    sbuf b = {0};
    mha_body(&b, &c, &d, ENC_FLAT, 3);
    put_field(&b, "grad_output", dout, 3, os, ENC_BASE64);
    sb_printf(&b, ",\"output_encoding\":\"flat\"}");
    json_t *j = call_ok(API_OP_MULTIHEAD, &b);
    json_t *g = json_object_get(j, "grad");
    ck_assert_int_eq(json_object_size(g), 10);

    attn_mha_params p = {.batch = c.B, .n = c.n, .m = c.m, .d_model = c.d_model,
                         .d_ctx = c.d_ctx, .heads = c.h, .kv_heads = c.h_kv,
                         .d_k = c.d_k, .d_v = c.d_v, .d_out = c.d_out,
                         .scale = attn_default_scale(c.d_k), .threads = 1};
    attn_mha_inputs in = {d.x, d.ctx, d.w_q, d.w_k, d.w_v, d.w_o, d.b_q, d.b_k, d.b_v, d.b_o};
    struct { const char *name; int rank; int64_t shape[3]; float *want; } gr[10] = {
        {"x", 3, {c.B, c.n, c.d_model}, NULL},
        {"context", 3, {c.B, c.m, c.d_ctx}, NULL},
        {"w_q", 2, {c.d_model, c.h * c.d_k}, NULL},
        {"w_k", 2, {c.d_ctx, c.h_kv * c.d_k}, NULL},
        {"w_v", 2, {c.d_ctx, c.h_kv * c.d_v}, NULL},
        {"w_o", 2, {c.h * c.d_v, c.d_out}, NULL},
        {"b_q", 1, {c.h * c.d_k}, NULL},
        {"b_k", 1, {c.h_kv * c.d_k}, NULL},
        {"b_v", 1, {c.h_kv * c.d_v}, NULL},
        {"b_o", 1, {c.d_out}, NULL},
    };
    for (int i = 0; i < 10; i++)
        gr[i].want = calloc((size_t)count_of(gr[i].rank, gr[i].shape), sizeof(float));
    attn_mha_grads lg = {gr[0].want, gr[1].want, gr[2].want, gr[3].want, gr[4].want,
                         gr[5].want, gr[6].want, gr[7].want, gr[8].want, gr[9].want};
    ck_assert_int_eq(attn_mha_backward(&p, &in, dout, &lg, NULL), ATTN_OK);
    for (int i = 0; i < 10; i++) {
        float *got = get_tensor(json_object_get(g, gr[i].name), ENC_FLAT, gr[i].rank,
                                gr[i].shape);
        assert_close_floats(gr[i].name, got, gr[i].want, count_of(gr[i].rank, gr[i].shape),
                            1e-5);
        if (i == 9) { /* d b_o = sum over batch and positions of dout */
            double *s = calloc((size_t)c.d_out, sizeof *s);
            for (int64_t jj = 0; jj < c.d_out; jj++)
                for (int64_t r = 0; r < c.B * c.n; r++)
                    s[jj] += dout[r * c.d_out + jj];
            assert_close_all("grad.b_o", got, s, c.d_out, 1e-5);
            free(s);
        }
        free(got);
        free(gr[i].want);
    }
    free(dout), free(b.s);
    mha_free(&d);
    json_decref(j);
}
END_TEST

START_TEST(multihead_grad_self_attention_without_optional_inputs)
{
    const char *body =
        "{\"x\":[[1,0],[0,1],[1,1]],\"w_q\":[[1,0],[0,1]],\"w_k\":[[1,0],[0,1]],"
        "\"w_v\":[[1,2],[3,4]],\"num_heads\":1,\"grad_output\":[[1,0],[0,1],[1,1]]}";
    json_t *j = call(API_OP_MULTIHEAD, body, strlen(body), &LIM, 200);
    json_t *g = json_object_get(j, "grad");
    ck_assert_int_eq(json_object_size(g), 4);
    const char *keys[] = {"x", "w_q", "w_k", "w_v"};
    for (int i = 0; i < 4; i++)
        ck_assert_msg(json_object_get(g, keys[i]) != NULL, "no grad for %s", keys[i]);
    ck_assert_int_eq(json_array_size(json_object_get(g, "x")), 3);
    json_decref(j);
}
END_TEST

/* ---------------------------------------------------------- errors */

#define QKV "\"q\":[[1,2],[3,4]],\"k\":[[1,2],[3,4]],\"v\":[[1,2],[3,4]]"
#define MHA "\"x\":[[1,2],[3,4]],\"w_q\":[[1,2],[3,4]],\"w_k\":[[1,2],[3,4]],\"w_v\":[[1,2],[3,4]]"

START_TEST(error_invalid_json_is_400)
{
    expect_error(API_OP_ATTENTION, "{", 400, "invalid_json", NULL);
    expect_error(API_OP_ATTENTION, "{\"q\":[1,]}", 400, "invalid_json", NULL);
    expect_error(API_OP_ATTENTION, "", 400, "invalid_json", NULL);
    expect_error(API_OP_ATTENTION, "{\"q\":NaN}", 400, "invalid_json", NULL);
    expect_error(API_OP_MULTIHEAD, "{'x': 1}", 400, "invalid_json", NULL);
}
END_TEST

/* The hint on a body that is not JSON reads the codec's place of the fault
 * (codec_error.offset), wherever the validator found it: in a short value,
 * past a long row that its row classifier read 64 bytes at a time, or
 * elsewhere than at a "NaN" that the body holds in a string. */
START_TEST(invalid_json_hint_is_at_the_place_of_the_fault)
{
    static const struct {
        const char *body;
        bool hint;
    } cases[] = {
        {"{\"q\": [[1, NaN]]}", true},
        {"{\"q\": [[1, 2]], \"mask\": [[-Infinity, 0]]}", true},
        {"{\"note\": \"NaN\", \"q\": [[1, 2,]]}", false},
        {"{\n  \"q\": [[1, 2],\n        [3, NaN]]\n}", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = call(API_OP_ATTENTION, cases[i].body, strlen(cases[i].body), &LIM, 400);
        const char *msg = error_message(j);
        bool hinted = msg && strstr(msg, "NaN and Infinity are not JSON");
        ck_assert_msg(msg && hinted == cases[i].hint, "%s: %s", cases[i].body,
                      msg ? msg : "(no message)");
        json_decref(j);
    }
    /* a NaN after 300 numbers of one row, where the row classifier took over */
    sbuf b = {0};
    sb_printf(&b, "{\"q\": [[");
    for (int i = 0; i < 300; i++)
        sb_printf(&b, "%d.25, ", i);
    sb_printf(&b, "NaN]], \"k\": [[1]], \"v\": [[1]]}");
    json_t *j = call(API_OP_ATTENTION, b.s, b.len, &LIM, 400);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                     "invalid_json");
    ck_assert_msg(strstr(error_message(j), "NaN and Infinity are not JSON"), "%s",
                  error_message(j));
    json_decref(j);
    free(b.s);
}
END_TEST

START_TEST(error_body_not_an_object)
{
    expect_error(API_OP_ATTENTION, "[1,2]", 400, "wrong_type", NULL);
    expect_error(API_OP_MULTIHEAD, " 42 ", 400, "wrong_type", NULL);
    expect_error(API_OP_ATTENTION, "null", 400, "wrong_type", NULL);
}
END_TEST

START_TEST(error_duplicate_key)
{
    expect_error(API_OP_ATTENTION, "{" QKV ",\"causal\":true,\"causal\":false}", 400,
                 "duplicate_key", "causal");
    /* keys compared after decoding escapes */
    expect_error(API_OP_ATTENTION, "{" QKV ",\"q\":[[1]]}", 400, "duplicate_key", "q");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"\\u0071\":[[1]]}", 400, "duplicate_key", "q");
}
END_TEST

/* The class of an error does not depend on which fault comes
 * first in the text: every 400 (types, numbers, base64 text) before any 422
 * (shapes). */
START_TEST(error_type_comes_before_shape)
{
    expect_error(API_OP_ATTENTION, "{\"q\":[[1],null],\"k\":[[1]],\"v\":[[1]]}", 400,
                 "wrong_type", "q");
    expect_error(API_OP_ATTENTION, "{\"q\":[[1],[2]],\"k\":[[1],[2,3],[\"a\"]],\"v\":[[1]]}", 400,
                 "wrong_type", "k");
    expect_error(API_OP_ATTENTION, "{\"q\":[[1]],\"k\":[[1]],\"v\":[[1]],\"mask\":[[true],[1,2]]}",
                 400, "wrong_type", "mask");
    expect_error(API_OP_ATTENTION,
                 "{\"q\":{\"shape\":[1,1],\"base64\":\"!!!!\"},\"k\":[[1]],\"v\":[[1]]}", 400,
                 "invalid_base64", "q.base64");
    expect_error(API_OP_ATTENTION,
                 "{\"q\":{\"shape\":[1,1],\"base64\":\"AA=A\"},\"k\":[[1]],\"v\":[[1]]}", 400,
                 "invalid_base64", "q.base64");
    expect_error(API_OP_ATTENTION,
                 "{\"q\":{\"shape\":[1,-1],\"base64\":\"AA=A\"},\"k\":[[1]],\"v\":[[1]]}", 400,
                 "invalid_base64", "q.base64");
    expect_error(API_OP_MULTIHEAD,
                 "{\"x\":[[1,2],null],\"w_q\":[[1]],\"w_k\":[[1]],\"w_v\":[[1]],\"num_heads\":1}",
                 400, "wrong_type", "x");
    /* shapes alone are still 422 */
    expect_error(API_OP_ATTENTION, "{\"q\":[[1],2],\"k\":[[1]],\"v\":[[1]]}", 422,
                 "ragged_array", "q");
    expect_error(API_OP_ATTENTION,
                 "{\"q\":{\"shape\":[2,1],\"base64\":\"AACAPw==\"},\"k\":[[1]],\"v\":[[1]]}", 422,
                 "shape_mismatch", "q.base64");
    /* a key with an escaped NUL is quoted whole in the message */
    const char *body = "{" QKV ",\"q\\u0000x\":1}";
    json_t *j = call(API_OP_ATTENTION, body, strlen(body), &LIM, 400);
    ck_assert_msg(strstr(error_message(j), "\"q\\u0000x\"") != NULL, "%s", error_message(j));
    json_decref(j);
}
END_TEST

/* The value of a float16 from its definition, for the checks below. */
static double half_value(unsigned h)
{
    unsigned e = h >> 10 & 31, m = h & 1023;
    double v = e ? ldexp(1024 + m, (int)e - 25) : ldexp(m, -24);
    return h & 0x8000 ? -v : v;
}

static uint16_t *decode_half_output(json_t *t, const char *dtype, size_t *n)
{
    ck_assert_str_eq(json_string_value(json_object_get(t, "dtype")), dtype);
    const char *b64 = json_string_value(json_object_get(t, "base64"));
    size_t len = strlen(b64);
    uint16_t *h = malloc(len);
    size_t k = 0;
    for (size_t i = 0; i + 3 < len; i += 4) {
        unsigned v = (unsigned)b64_value(b64[i]) << 18 | (unsigned)b64_value(b64[i + 1]) << 12;
        if (b64[i + 2] != '=')
            v |= (unsigned)b64_value(b64[i + 2]) << 6;
        if (b64[i + 3] != '=')
            v |= (unsigned)b64_value(b64[i + 3]);
        unsigned char bytes[3] = {(unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
        int nb = b64[i + 2] == '=' ? 1 : b64[i + 3] == '=' ? 2 : 3;
        for (int b = 0; b < nb; b++, k++)
            ((unsigned char *)h)[k] = bytes[b];
    }
    *n = k / 2;
    return h;
}

/* output_dtype picks the dtype of base64 outputs; each value is
 * the float32 answer rounded to it (within half its unit), on both routes;
 * float16 and bfloat16 inputs are read as the float32 values they are. */
START_TEST(output_dtype_half_precision)
{
    const char *qkv = "\"q\":[[0.3,-1.2],[2.5,0.7]],\"k\":[[1,0.5],[-0.25,2]],"
                      "\"v\":[[1.5,-3.25],[0.125,7.75]],\"grad_output\":[[1,-1],[0.5,2]]";
    char body[512];
    snprintf(body, sizeof body, "{%s,\"output_encoding\":\"flat\"}", qkv);
    json_t *ref = call(API_OP_ATTENTION, body, strlen(body), &LIM, 200);
    snprintf(body, sizeof body, "{%s,\"output_encoding\":\"base64\",\"output_dtype\":\"float16\"}",
             qkv);
    json_t *half = call(API_OP_ATTENTION, body, strlen(body), &LIM, 200);
    const char *names[] = {"output", "q", "k", "v"};
    for (int i = 0; i < 4; i++) {
        json_t *r = i ? json_object_get(json_object_get(ref, "grad"), names[i])
                      : json_object_get(ref, "output");
        json_t *h = i ? json_object_get(json_object_get(half, "grad"), names[i])
                      : json_object_get(half, "output");
        size_t n;
        uint16_t *got = decode_half_output(h, "float16", &n);
        json_t *data = json_object_get(r, "data");
        ck_assert_uint_eq(n, json_array_size(data));
        for (size_t k = 0; k < n; k++) {
            double want = json_number_value(json_array_get(data, k));
            double unit = ldexp(1.0, (int)floor(log2(fabs(want) > 0x1p-14 ? fabs(want) : 0x1p-14)) - 10);
            ck_assert_msg(fabs(half_value(got[k]) - want) <= unit / 2, "%s[%zu]: %g vs %g",
                          names[i], k, half_value(got[k]), want);
        }
        free(got);
    }
    json_decref(ref);
    json_decref(half);
    /* bfloat16 on the multi-head route */
    const char *mha = "{" MHA ",\"num_heads\":1,\"output_encoding\":\"base64\",\"output_dtype\":\"bfloat16\"}";
    json_t *j = call(API_OP_MULTIHEAD, mha, strlen(mha), &LIM, 200);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "output"), "dtype")),
                     "bfloat16");
    json_decref(j);
    /* float16 inputs: 1.5 = 0x3e00, 0.5 = 0x3800, -2 = 0xc000, 1 = 0x3c00 */
    const char *h_in = "{\"q\":{\"shape\":[1,2],\"dtype\":\"float16\",\"base64\":\"AD4AOA==\"},"
                       "\"k\":{\"shape\":[1,2],\"dtype\":\"bfloat16\",\"base64\":\"wD8APw==\"},"
                       "\"v\":{\"shape\":[1,2],\"dtype\":\"float16\",\"base64\":\"AMAAPA==\"},"
                       "\"output_encoding\":\"flat\"}";
    const char *f_in = "{\"q\":[[1.5,0.5]],\"k\":[[1.5,0.5]],\"v\":[[-2,1]],\"output_encoding\":\"flat\"}";
    json_t *a = call(API_OP_ATTENTION, h_in, strlen(h_in), &LIM, 200);
    json_t *b = call(API_OP_ATTENTION, f_in, strlen(f_in), &LIM, 200);
    ck_assert(json_equal(json_object_get(a, "output"), json_object_get(b, "output")));
    json_decref(a);
    json_decref(b);
}
END_TEST

/* "precision": "bfloat16" gives libattn's bfloat16 answer bit for bit:
 * output, lse and every gradient, against attn_sdpa_forward and
 * attn_sdpa_backward called here on the same inputs (one thread on both
 * sides: the backward's sums are then in the same order). Inputs sent as
 * bfloat16 base64 are the same numbers as their float32 (the rounding of
 * a bfloat16 value is the value itself), so the same answer. */
START_TEST(attention_bfloat16_is_libattns_bits)
{
    const int64_t H = 2, n_q = 70, n_k = 90, d = 16;
    const int64_t sq[3] = {H, n_q, d}, sk[3] = {H, n_k, d};
    float *q = rnd_tensor(H * n_q * d), *k = rnd_tensor(H * n_k * d);
    float *v = rnd_tensor(H * n_k * d), *g = rnd_tensor(H * n_q * d);
    const api_limits one = {.threads = 1};
    sbuf b = {0};
    sb_printf(&b, "{");
    put_field(&b, "q", q, 3, sq, ENC_BASE64);
    put_field(&b, "k", k, 3, sk, ENC_BASE64);
    put_field(&b, "v", v, 3, sk, ENC_BASE64);
    put_field(&b, "grad_output", g, 3, sq, ENC_BASE64);
    sb_printf(&b, ",\"causal\":true,\"return_lse\":true,\"precision\":\"bfloat16\","
                  "\"output_encoding\":\"base64\"}");
    json_t *j = call(API_OP_ATTENTION, b.s, b.len, &one, 200);

    attn_sdpa_params p = {.batch = 1, .heads_q = H, .heads_kv = H, .n_q = n_q, .n_k = n_k,
                          .d_k = d, .d_v = d, .scale = attn_default_scale(d), .causal = true,
                          .threads = 1, .precision = ATTN_PRECISION_BFLOAT16};
    float *out = calloc((size_t)(H * n_q * d), sizeof *out);
    float *dq = calloc((size_t)(H * n_q * d), sizeof *dq);
    float *dk = calloc((size_t)(H * n_k * d), sizeof *dk), *dv = calloc((size_t)(H * n_k * d), 4);
    attn_softmax_row *rows = calloc((size_t)(H * n_q), sizeof *rows);
    attn_error ae = {0};
    ck_assert_int_eq(attn_sdpa_forward(&p, q, k, v, out, rows, NULL, NULL, &ae), ATTN_OK);
    ck_assert_int_eq(attn_sdpa_backward(&p, q, k, v, out, rows, g, dq, dk, dv, &ae), ATTN_OK);
    const struct {
        json_t *t;
        const float *want;
        int64_t n;
        const int64_t *shape;
    } checks[] = {
        {json_object_get(j, "output"), out, H * n_q * d, sq},
        {json_object_get(json_object_get(j, "grad"), "q"), dq, H * n_q * d, sq},
        {json_object_get(json_object_get(j, "grad"), "k"), dk, H * n_k * d, sk},
        {json_object_get(json_object_get(j, "grad"), "v"), dv, H * n_k * d, sk},
    };
    for (size_t i = 0; i < sizeof checks / sizeof *checks; i++) {
        float *got = get_tensor(checks[i].t, ENC_BASE64, 3, checks[i].shape);
        ck_assert_msg(memcmp(got, checks[i].want, (size_t)checks[i].n * sizeof *got) == 0,
                      "result %zu differs from libattn's bfloat16 bits", i);
        free(got);
    }
    float *lse = get_tensor(json_object_get(j, "lse"), ENC_BASE64, 2, sq);
    bool same = true;
    for (int64_t i = 0; i < H * n_q; i++)
        same &= lse[i] == (float)attn_softmax_lse(rows[i]);
    ck_assert_msg(same, "lse differs from libattn's rows");
    free(lse);
    /* and it is not the float32 answer */
    p.precision = ATTN_PRECISION_FLOAT32;
    float *f32 = calloc((size_t)(H * n_q * d), sizeof *f32);
    ck_assert_int_eq(attn_sdpa_forward(&p, q, k, v, f32, NULL, NULL, NULL, &ae), ATTN_OK);
    float *got = get_tensor(json_object_get(j, "output"), ENC_BASE64, 3, sq);
    ck_assert(memcmp(got, f32, (size_t)(H * n_q * d) * sizeof *got) != 0);
    free(got);
    json_decref(j);

    /* The same inputs rounded to bfloat16 and sent as bfloat16 base64 give
     * the same answer as their float32 values sent as float32. */
    const int64_t counts[3] = {H * n_q * d, H * n_k * d, H * n_k * d};
    float *in[3] = {q, k, v};
    uint16_t *half[3];
    for (int t = 0; t < 3; t++) {
        half[t] = malloc((size_t)counts[t] * sizeof **half);
        for (int64_t i = 0; i < counts[t]; i++) {
            in[t][i] = attn_bf16_round(in[t][i]);
            uint32_t bits;
            memcpy(&bits, &in[t][i], 4);
            half[t][i] = (uint16_t)(bits >> 16);
        }
    }
    sbuf b16 = {0}, b32 = {0};
    const char *names[3] = {"q", "k", "v"};
    const int64_t *shapes[3] = {sq, sk, sk};
    sb_printf(&b16, "{");
    sb_printf(&b32, "{");
    for (int t = 0; t < 3; t++) {
        sb_printf(&b16, "%s\"%s\":{\"shape\":[%lld,%lld,%lld],\"dtype\":\"bfloat16\",\"base64\":\"",
                  t ? "," : "", names[t], (long long)shapes[t][0], (long long)shapes[t][1],
                  (long long)shapes[t][2]);
        b64_encode(&b16, (const unsigned char *)half[t], (size_t)counts[t] * 2);
        sb_printf(&b16, "\"}");
        put_field(&b32, names[t], in[t], 3, shapes[t], ENC_BASE64);
    }
    const char *tail = ",\"precision\":\"bfloat16\",\"output_encoding\":\"base64\"}";
    sb_printf(&b16, "%s", tail);
    sb_printf(&b32, "%s", tail);
    json_t *from16 = call(API_OP_ATTENTION, b16.s, b16.len, &one, 200);
    json_t *from32 = call(API_OP_ATTENTION, b32.s, b32.len, &one, 200);
    ck_assert(json_equal(json_object_get(from16, "output"), json_object_get(from32, "output")));
    json_decref(from16);
    json_decref(from32);
    for (int t = 0; t < 3; t++)
        free(half[t]);
    free(b.s), free(b16.s), free(b32.s);
    free(q), free(k), free(v), free(g), free(out), free(dq), free(dk), free(dv), free(rows),
        free(f32);
}
END_TEST

/* A body of q [4, 37, dk], k [2, 70, dk], v [2, 70, 7], grad_output
 * [4, 37, 7] (grouped-query heads, odd widths), every value a bfloat16,
 * sent as bfloat16 base64 (`words`) or as float32 base64, causal, with a
 * boolean mask [70] over the keys, and `tail` after them. */
static void bf16_inputs_body(sbuf *b, float *const in[4], int64_t dk, bool words,
                             const char *tail)
{
    const int64_t shapes[4][3] = {{4, 37, dk}, {2, 70, dk}, {2, 70, 7}, {4, 37, 7}};
    const char *names[4] = {"q", "k", "v", "grad_output"};
    sb_printf(b, "{");
    for (int t = 0; t < 4; t++) {
        const int64_t n = count_of(3, shapes[t]);
        if (!words) {
            put_field(b, names[t], in[t], 3, shapes[t], ENC_BASE64);
            continue;
        }
        uint16_t *w = malloc((size_t)n * sizeof *w);
        for (int64_t i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, &in[t][i], 4);
            w[i] = (uint16_t)(bits >> 16);
        }
        sb_printf(b, "%s\"%s\":{\"shape\":[%lld,%lld,%lld],\"dtype\":\"bfloat16\",\"base64\":\"",
                  t ? "," : "", names[t], (long long)shapes[t][0], (long long)shapes[t][1],
                  (long long)shapes[t][2]);
        b64_encode(b, (const unsigned char *)w, (size_t)n * 2);
        sb_printf(b, "\"}");
        free(w);
    }
    /* a mask of 70 keys, every third hidden */
    sb_printf(b, ",\"mask\":[");
    for (int j = 0; j < 70; j++)
        sb_printf(b, "%s%s", j ? "," : "", j % 3 == 1 ? "false" : "true");
    sb_printf(b, "],\"causal\":true%s", tail);
}

/* The bytes a prepared body's inputs hold (api_call_input_bytes). */
static size_t input_bytes_of(const sbuf *b)
{
    api_cost cost;
    api_response res;
    api_call *c = api_prepare(API_OP_ATTENTION, b->s, b->len, &LIM, &cost, &res);
    ck_assert_msg(c != NULL, "refused: %s", res.body);
    size_t bytes = api_call_input_bytes(c);
    api_call_free(c);
    return bytes;
}

/* q, k, v and grad_output sent as bfloat16 base64 with "precision":
 * "bfloat16" go to libattn as the words they are: 2 bytes an element held
 * from decoding to the answer, no float32 copy (4 bytes an element when
 * the same values come as float32, or when float32 precision has them
 * widened); and the answer is the float32-sent one, bit for bit: output,
 * lse and every gradient, with and without RoPE (which rotates in
 * float32). */
START_TEST(attention_bfloat16_inputs_stay_words_with_the_same_bits)
{
    for (int64_t dk = 9; dk <= 10; dk++) {
        const int64_t counts[4] = {4 * 37 * dk, 2 * 70 * dk, 2 * 70 * 7, 4 * 37 * 7};
        float *in[4];
        for (int t = 0; t < 4; t++) {
            in[t] = rnd_tensor(counts[t]);
            for (int64_t i = 0; i < counts[t]; i++)
                in[t][i] = attn_bf16_round(in[t][i]);
        }
        const size_t elements = (size_t)(counts[0] + counts[1] + counts[2] + counts[3]);
        const size_t mask_bytes = 70;
        const char *tail = dk % 2 ? ",\"precision\":\"bfloat16\",\"return_lse\":true,"
                                    "\"output_encoding\":\"base64\"}"
                                  : ",\"precision\":\"bfloat16\",\"rope\":{\"base\":1000},"
                                    "\"return_lse\":true,\"output_encoding\":\"base64\"}";
        sbuf b16 = {0}, b32 = {0}, f16 = {0}, f32 = {0};
        bf16_inputs_body(&b16, in, dk, true, tail);
        bf16_inputs_body(&b32, in, dk, false, tail);
        ck_assert_uint_eq(input_bytes_of(&b16), 2 * elements + mask_bytes);
        ck_assert_uint_eq(input_bytes_of(&b32), 4 * elements + mask_bytes);
        json_t *from16 = call(API_OP_ATTENTION, b16.s, b16.len, &LIM, 200);
        json_t *from32 = call(API_OP_ATTENTION, b32.s, b32.len, &LIM, 200);
        ck_assert(json_equal(json_object_get(from16, "output"),
                             json_object_get(from32, "output")));
        ck_assert(json_equal(json_object_get(from16, "lse"), json_object_get(from32, "lse")));
        ck_assert(json_equal(json_object_get(from16, "grad"), json_object_get(from32, "grad")));
        ck_assert_ptr_nonnull(json_object_get(json_object_get(from16, "grad"), "k"));
        json_decref(from16);
        json_decref(from32);
        /* float32 products: the words are widened, as they always were */
        const char *tail32 = ",\"output_encoding\":\"base64\"}";
        bf16_inputs_body(&f16, in, dk, true, tail32);
        bf16_inputs_body(&f32, in, dk, false, tail32);
        ck_assert_uint_eq(input_bytes_of(&f16), 4 * elements + mask_bytes);
        from16 = call(API_OP_ATTENTION, f16.s, f16.len, &LIM, 200);
        from32 = call(API_OP_ATTENTION, f32.s, f32.len, &LIM, 200);
        ck_assert(json_equal(json_object_get(from16, "output"),
                             json_object_get(from32, "output")));
        ck_assert(json_equal(json_object_get(from16, "grad"), json_object_get(from32, "grad")));
        json_decref(from16);
        json_decref(from32);
        free(b16.s), free(b32.s), free(f16.s), free(f32.s);
        for (int t = 0; t < 4; t++)
            free(in[t]);
    }
}
END_TEST

/* The multi-head route passes the precision to the attention between its
 * float32 projections: libattn's attn_mha_forward_backward bits. */
START_TEST(multihead_bfloat16_is_libattns_bits)
{
    const int64_t n = 40, dm = 12, h = 4;
    const int64_t sx[2] = {n, dm}, sw[2] = {dm, dm};
    float *x = rnd_tensor(n * dm), *wq = rnd_tensor(dm * dm), *wk = rnd_tensor(dm * dm);
    float *wv = rnd_tensor(dm * dm), *wo = rnd_tensor(dm * dm), *g = rnd_tensor(n * dm);
    const api_limits one = {.threads = 1};
    sbuf b = {0};
    sb_printf(&b, "{");
    put_field(&b, "x", x, 2, sx, ENC_BASE64);
    put_field(&b, "w_q", wq, 2, sw, ENC_BASE64);
    put_field(&b, "w_k", wk, 2, sw, ENC_BASE64);
    put_field(&b, "w_v", wv, 2, sw, ENC_BASE64);
    put_field(&b, "w_o", wo, 2, sw, ENC_BASE64);
    put_field(&b, "grad_output", g, 2, sx, ENC_BASE64);
    sb_printf(&b, ",\"num_heads\":4,\"causal\":true,\"precision\":\"bfloat16\","
                  "\"output_encoding\":\"base64\"}");
    json_t *j = call(API_OP_MULTIHEAD, b.s, b.len, &one, 200);
    attn_mha_params p = {.batch = 1, .n = n, .m = n, .d_model = dm, .d_ctx = dm, .heads = h,
                         .kv_heads = h, .d_k = dm / h, .d_v = dm / h, .d_out = dm,
                         .scale = attn_default_scale(dm / h), .causal = true, .threads = 1,
                         .precision = ATTN_PRECISION_BFLOAT16};
    attn_mha_inputs in = {.x = x, .w_q = wq, .w_k = wk, .w_v = wv, .w_o = wo};
    float *out = calloc((size_t)(n * dm), 4), *dx = calloc((size_t)(n * dm), 4);
    float *dwq = calloc((size_t)(dm * dm), 4), *dwo = calloc((size_t)(dm * dm), 4);
    float *dwk = calloc((size_t)(dm * dm), 4), *dwv = calloc((size_t)(dm * dm), 4);
    attn_mha_grads gr = {.x = dx, .w_q = dwq, .w_k = dwk, .w_v = dwv, .w_o = dwo};
    attn_error ae = {0};
    ck_assert_int_eq(attn_mha_forward_backward(&p, &in, out, NULL, NULL, NULL, g, &gr, &ae),
                     ATTN_OK);
    float *got = get_tensor(json_object_get(j, "output"), ENC_BASE64, 2, sx);
    ck_assert_msg(memcmp(got, out, (size_t)(n * dm) * 4) == 0, "output differs");
    free(got);
    got = get_tensor(json_object_get(json_object_get(j, "grad"), "x"), ENC_BASE64, 2, sx);
    ck_assert_msg(memcmp(got, dx, (size_t)(n * dm) * 4) == 0, "grad x differs");
    free(got);
    got = get_tensor(json_object_get(json_object_get(j, "grad"), "w_k"), ENC_BASE64, 2, sw);
    ck_assert_msg(memcmp(got, dwk, (size_t)(dm * dm) * 4) == 0, "grad w_k differs");
    free(got);
    json_decref(j);
    free(b.s);
    free(x), free(wq), free(wk), free(wv), free(wo), free(g), free(out), free(dx), free(dwq),
        free(dwo), free(dwk), free(dwv);
}
END_TEST

/* The precision field is one of two names: anything else is refused as the
 * other enumerated fields are, and null is the default. */
START_TEST(precision_errors_and_default)
{
    expect_error(API_OP_ATTENTION, "{" QKV ",\"precision\":\"float16\"}", 422, "invalid_value",
                 "precision");
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1,\"precision\":\"bf16\"}", 422,
                 "invalid_value", "precision");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"precision\":16}", 400, "wrong_type", "precision");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"precision\":[\"bfloat16\"]}", 400, "wrong_type",
                 "precision");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"precison\":\"bfloat16\"}", 400, "unknown_field",
                 "precison");
    json_t *e = call(API_OP_ATTENTION, "{" QKV ",\"precision\":\"half\"}",
                     strlen("{" QKV ",\"precision\":\"half\"}"), &LIM, 422);
    ck_assert_ptr_nonnull(strstr(error_message(e), "\"bfloat16\""));
    json_decref(e);
    const char *absent = "{" QKV ",\"output_encoding\":\"base64\"}";
    const char *null = "{" QKV ",\"precision\":null,\"output_encoding\":\"base64\"}";
    const char *f32 = "{" QKV ",\"precision\":\"float32\",\"output_encoding\":\"base64\"}";
    json_t *a = call(API_OP_ATTENTION, absent, strlen(absent), &LIM, 200);
    json_t *nl = call(API_OP_ATTENTION, null, strlen(null), &LIM, 200);
    json_t *f = call(API_OP_ATTENTION, f32, strlen(f32), &LIM, 200);
    ck_assert(json_equal(json_object_get(a, "output"), json_object_get(nl, "output")));
    ck_assert(json_equal(json_object_get(a, "output"), json_object_get(f, "output")));
    json_decref(a);
    json_decref(nl);
    json_decref(f);
}
END_TEST

START_TEST(output_dtype_errors)
{
    /* only for base64 outputs */
    expect_error(API_OP_ATTENTION, "{" QKV ",\"output_dtype\":\"float16\"}", 422, "invalid_value",
                 "output_dtype");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"output_encoding\":\"flat\",\"output_dtype\":\"float32\"}",
                 422, "invalid_value", "output_dtype");
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1,\"output_dtype\":\"bfloat16\"}", 422,
                 "invalid_value", "output_dtype");
    expect_error(API_OP_ATTENTION,
                 "{" QKV ",\"output_encoding\":\"base64\",\"output_dtype\":\"float64\"}", 422,
                 "invalid_value", "output_dtype");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"output_encoding\":\"base64\",\"output_dtype\":16}",
                 400, "wrong_type", "output_dtype");
    /* null is the default (float32) */
    const char *ok = "{" QKV ",\"output_encoding\":\"base64\",\"output_dtype\":null}";
    json_t *j = call(API_OP_ATTENTION, ok, strlen(ok), &LIM, 200);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "output"), "dtype")),
                     "float32");
    json_decref(j);
    /* a value past float16's range is refused, not sent as an infinity;
     * bfloat16 holds it */
    const char *big = "{\"q\":[[1]],\"k\":[[1]],\"v\":[[70000]],\"output_encoding\":\"base64\","
                      "\"output_dtype\":\"float16\"}";
    expect_error(API_OP_ATTENTION, big, 422, "numerical_overflow", "output_dtype");
    const char *big_bf = "{\"q\":[[1]],\"k\":[[1]],\"v\":[[70000]],\"output_encoding\":\"base64\","
                         "\"output_dtype\":\"bfloat16\"}";
    j = call(API_OP_ATTENTION, big_bf, strlen(big_bf), &LIM, 200);
    json_decref(j);
    /* a gradient past it too */
    const char *grad = "{\"q\":[[1]],\"k\":[[1]],\"v\":[[1]],\"grad_output\":[[70000]],"
                       "\"output_encoding\":\"base64\",\"output_dtype\":\"float16\"}";
    expect_error(API_OP_ATTENTION, grad, 422, "numerical_overflow", "output_dtype");
}
END_TEST

START_TEST(error_unknown_field_casual_suggests_causal)
{
    const char *body = "{" QKV ",\"casual\":true}";
    json_t *j = call(API_OP_ATTENTION, body, strlen(body), &LIM, 400);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                     "unknown_field");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "field")),
                     "casual");
    ck_assert_ptr_nonnull(strstr(error_message(j), "\"causal\""));
    json_decref(j);
    expect_error(API_OP_ATTENTION, "{" QKV ",\"num_heads\":2}", 400, "unknown_field",
                 "num_heads");
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1,\"q\":[[1]]}", 400,
                 "unknown_field", "q");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"zzz\":1}", 400, "unknown_field", "zzz");
    /* a key cut at an escaped NUL is not reported as the field it starts with */
    expect_error(API_OP_ATTENTION, "{" QKV ",\"q\\u0000\":1}", 400, "unknown_field", "q...");
}
END_TEST

START_TEST(error_missing_required_field)
{
    expect_error(API_OP_ATTENTION, "{\"k\":[[1]],\"v\":[[1]]}", 400, "missing_field", "q");
    expect_error(API_OP_ATTENTION, "{\"q\":[[1]],\"v\":[[1]]}", 400, "missing_field", "k");
    expect_error(API_OP_ATTENTION, "{\"q\":null,\"k\":[[1]],\"v\":[[1]]}", 400,
                 "missing_field", "q");
    expect_error(API_OP_ATTENTION, "{}", 400, "missing_field", "q");
    expect_error(API_OP_MULTIHEAD, "{" MHA "}", 400, "missing_field", "num_heads");
    expect_error(API_OP_MULTIHEAD, "{\"x\":[[1]],\"num_heads\":1}", 400, "missing_field",
                 "w_q");
}
END_TEST

START_TEST(error_wrong_types)
{
    expect_error(API_OP_ATTENTION, "{" QKV ",\"causal\":1}", 400, "wrong_type", "causal");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"causal\":\"true\"}", 400, "wrong_type", "causal");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"return_weights\":0}", 400, "wrong_type",
                 "return_weights");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"return_stats\":[]}", 400, "wrong_type",
                 "return_stats");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"scale\":\"0.5\"}", 400, "wrong_type", "scale");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"scale\":true}", 400, "wrong_type", "scale");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"output_encoding\":5}", 400, "wrong_type",
                 "output_encoding");
    expect_error(API_OP_ATTENTION, "{\"q\":\"abc\",\"k\":[[1]],\"v\":[[1]]}", 400,
                 "wrong_type", "q");
    expect_error(API_OP_ATTENTION, "{\"q\":[[true]],\"k\":[[1]],\"v\":[[1]]}", 400,
                 "wrong_type", "q");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"mask\":\"all\"}", 400, "wrong_type", "mask");
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":\"2\"}", 400, "wrong_type",
                 "num_heads");
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1.5}", 400, "wrong_type",
                 "num_heads");
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1,\"return_weights\":1}", 400,
                 "wrong_type", "return_weights");
}
END_TEST

START_TEST(error_number_not_finite_as_float32)
{
    expect_error(API_OP_ATTENTION, "{\"q\":[[1e39]],\"k\":[[1]],\"v\":[[1]]}", 400,
                 "invalid_number", "q");
    expect_error(API_OP_ATTENTION, "{\"q\":[[1]],\"k\":[[1]],\"v\":[[-1e39]]}", 400,
                 "invalid_number", "v");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"scale\":1e39}", 400, "invalid_number", "scale");
    /* +inf as float32 bytes 00 00 80 7f, through base64: the field named
     * is q or a member of it ("q.base64") */
    const char *inf = "{\"q\":{\"shape\":[1,1],\"dtype\":\"float32\",\"base64\":\"AACAfw==\"},"
                      "\"k\":[[1]],\"v\":[[1]]}";
    json_t *j = call(API_OP_ATTENTION, inf, strlen(inf), &LIM, 400);
    json_t *e = json_object_get(j, "error");
    ck_assert_str_eq(json_string_value(json_object_get(e, "code")), "invalid_number");
    ck_assert_int_eq(json_string_value(json_object_get(e, "field"))[0], 'q');
    json_decref(j);
}
END_TEST

/* A base64 input's first non-finite element is named wherever it lies:
 * first, either side of blocks of 1024 (the API's own scan's), last; and a
 * later one does not hide it. Large and subnormal finite values pass. */
START_TEST(error_base64_input_names_the_first_non_finite_element)
{
    const int64_t n = 3000; /* q [1, n, 1] against one key: rows of width 1 */
    const int64_t places[] = {0, 1023, 1024, 1025, 2047, 2048, n - 1};
    const float bad[] = {INFINITY, -INFINITY, NAN, -NAN};
    float *x = malloc((size_t)n * sizeof *x);
    ck_assert_ptr_nonnull(x);
    for (size_t p = 0; p <= sizeof places / sizeof *places; p++) {
        for (int64_t i = 0; i < n; i++)
            x[i] = i % 3 == 0 ? 1e30f : i % 3 == 1 ? -FLT_TRUE_MIN : (float)i * 0.25f;
        bool clean = p == sizeof places / sizeof *places; /* the last round: none */
        int64_t at = clean ? -1 : places[p];
        if (!clean) {
            x[at] = bad[p % 4];
            if (at + 1 < n)
                x[n - 1] = INFINITY;
        }
        sbuf b = {0};
        sb_printf(&b, "{\"q\":{\"shape\":[%lld,1],\"dtype\":\"float32\",\"base64\":\"",
                  (long long)n);
        b64_encode(&b, (const unsigned char *)x, (size_t)n * sizeof *x);
        sb_printf(&b, "\"},\"k\":[[1]],\"v\":[[1]]}");
        json_t *j = call(API_OP_ATTENTION, b.s, b.len, &LIM, clean ? 200 : 400);
        if (!clean) {
            char expect[64];
            snprintf(expect, sizeof expect, "element %lld is", (long long)at);
            const char *msg = error_message(j);
            ck_assert_msg(msg && strstr(msg, expect), "at %lld: %s", (long long)at,
                          msg ? msg : "(no message)");
            ck_assert_str_eq(
                json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                "invalid_number");
        }
        json_decref(j);
        free(b.s);
    }
    free(x);
}
END_TEST

START_TEST(error_ragged_array)
{
    expect_error(API_OP_ATTENTION, "{\"q\":[[1,2],[3]],\"k\":[[1,2]],\"v\":[[1,2]]}", 422,
                 "ragged_array", "q");
    expect_error(API_OP_ATTENTION, "{\"q\":[[1,2]],\"k\":[[1,2],[[3],4]],\"v\":[[1,2]]}", 422,
                 "ragged_array", "k");
}
END_TEST

START_TEST(error_rank_outside_2_to_4)
{
    expect_error(API_OP_ATTENTION, "{\"q\":[1,2],\"k\":[[1,2]],\"v\":[[1,2]]}", 422,
                 "invalid_shape", "q");
    expect_error(API_OP_ATTENTION, "{\"q\":[[[[[1]]]]],\"k\":[[1]],\"v\":[[1]]}", 422,
                 "invalid_shape", "q");
    expect_error(API_OP_ATTENTION, "{\"q\":[[1]],\"k\":[[1]],\"v\":[1]}", 422,
                 "invalid_shape", "v");
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1,\"x\":[[[[1,2]]]]}", 400,
                 "duplicate_key", "x");
    expect_error(API_OP_MULTIHEAD,
                 "{\"x\":[[[[1,2]]]],\"w_q\":[[1],[2]],\"w_k\":[[1],[2]],\"w_v\":[[1],[2]],"
                 "\"num_heads\":1}", 422, "invalid_shape", "x");
    expect_error(API_OP_MULTIHEAD,
                 "{\"x\":[[1,2]],\"w_q\":[1,2],\"w_k\":[[1],[2]],\"w_v\":[[1],[2]],"
                 "\"num_heads\":1}", 422, "invalid_shape", "w_q");
}
END_TEST

START_TEST(error_empty_dimension)
{
    expect_error(API_OP_ATTENTION, "{\"q\":[[]],\"k\":[[1]],\"v\":[[1]]}", 422,
                 "invalid_shape", "q");
    expect_error(API_OP_ATTENTION,
                 "{\"q\":[[1]],\"k\":{\"shape\":[0,1],\"data\":[]},\"v\":[[1]]}", 422,
                 "invalid_shape", "k");
}
END_TEST

START_TEST(error_ranks_differ)
{
    expect_error(API_OP_ATTENTION, "{\"q\":[[[1,2]]],\"k\":[[1,2]],\"v\":[[1,2]]}", 422,
                 "shape_mismatch", "k");
    expect_error(API_OP_ATTENTION, "{\"q\":[[1,2]],\"k\":[[1,2]],\"v\":[[[1,2]]]}", 422,
                 "shape_mismatch", "v");
}
END_TEST

START_TEST(error_mismatched_d_k_names_both)
{
    const char *body = "{\"q\":[[1,2,3,4]],\"k\":[[1,2]],\"v\":[[1,2]]}";
    json_t *j = call(API_OP_ATTENTION, body, strlen(body), &LIM, 422);
    json_t *e = json_object_get(j, "error");
    ck_assert_str_eq(json_string_value(json_object_get(e, "code")), "shape_mismatch");
    ck_assert_str_eq(json_string_value(json_object_get(e, "field")), "k");
    ck_assert_str_eq(error_message(j), "k has d_k=2 but q has d_k=4");
    json_decref(j);
    /* k and v disagree on n_k; batch differs */
    expect_error(API_OP_ATTENTION, "{\"q\":[[1,2]],\"k\":[[1,2],[3,4]],\"v\":[[1,2]]}", 422,
                 "shape_mismatch", "v");
    expect_error(API_OP_ATTENTION,
                 "{\"q\":[[[[1]]],[[[1]]]],\"k\":[[[[1]]]],\"v\":[[[[1]]]]}", 422,
                 "shape_mismatch", "k");
}
END_TEST

START_TEST(error_heads_do_not_divide)
{
    /* H_q = 3, H_kv = 2 */
    expect_error(API_OP_ATTENTION,
                 "{\"q\":[[[1]],[[1]],[[1]]],\"k\":[[[1]],[[1]]],\"v\":[[[1]],[[1]]]}", 422,
                 "shape_mismatch", "k");
    /* w_q has 2 columns, num_heads 3 */
    const char *body = "{" MHA ",\"num_heads\":3}";
    json_t *j = call(API_OP_MULTIHEAD, body, strlen(body), &LIM, 422);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "field")),
                     "w_q");
    ck_assert_str_eq(error_message(j), "w_q has 2 columns, not a multiple of num_heads=3");
    json_decref(j);
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":2,\"num_kv_heads\":3}", 422,
                 "invalid_value", "num_kv_heads");
}
END_TEST

START_TEST(error_num_heads_below_one)
{
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":0}", 422, "invalid_value",
                 "num_heads");
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":-2}", 422, "invalid_value",
                 "num_heads");
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1,\"num_kv_heads\":0}", 422,
                 "invalid_value", "num_kv_heads");
}
END_TEST

START_TEST(error_multihead_shapes_do_not_fit)
{
    /* w_q rows != d_model */
    expect_error(API_OP_MULTIHEAD,
                 "{\"x\":[[1,2]],\"w_q\":[[1,2]],\"w_k\":[[1],[2]],\"w_v\":[[1],[2]],"
                 "\"num_heads\":1}", 422, "shape_mismatch", "w_q");
    /* w_k columns != num_kv_heads * d_k */
    expect_error(API_OP_MULTIHEAD,
                 "{\"x\":[[1,2]],\"w_q\":[[1],[2]],\"w_k\":[[1,1],[2,2]],\"w_v\":[[1],[2]],"
                 "\"num_heads\":1}", 422, "shape_mismatch", "w_k");
    /* w_o rows != num_heads * d_v */
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1,\"w_o\":[[1,2]]}", 422,
                 "shape_mismatch", "w_o");
    /* bias length */
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1,\"b_q\":[1,2,3]}", 422,
                 "shape_mismatch", "b_q");
    /* b_o without w_o */
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1,\"b_o\":[1,2]}", 422,
                 "invalid_value", "b_o");
    /* context rank and batch */
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1,\"context\":[[[1,2]]]}", 422,
                 "shape_mismatch", "context");
    /* multihead mask */
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1,\"mask\":[true,false,true]}",
                 422, "shape_mismatch", "mask");
}
END_TEST

START_TEST(error_mask_does_not_broadcast)
{
    expect_error(API_OP_ATTENTION, "{" QKV ",\"mask\":[true,false,true]}", 422,
                 "shape_mismatch", "mask");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"mask\":[[true],[false],[true]]}", 422,
                 "shape_mismatch", "mask");
    /* more dimensions than the scores [2, 2] */
    expect_error(API_OP_ATTENTION, "{" QKV ",\"mask\":[[[true,true],[true,true]]]}", 422,
                 "shape_mismatch", "mask");
}
END_TEST

START_TEST(error_grad_output_wrong_shape)
{
    expect_error(API_OP_ATTENTION, "{" QKV ",\"grad_output\":[[1,2]]}", 422,
                 "shape_mismatch", "grad_output");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"grad_output\":[[[1,2],[3,4]]]}", 422,
                 "shape_mismatch", "grad_output");
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1,\"grad_output\":[[1],[2]]}",
                 422, "shape_mismatch", "grad_output");
}
END_TEST

/* The work a request is charged (cost.work, meta.work) is what --max-work
 * is compared with: its nominal FLOPs and the rest of its cost. */
START_TEST(error_work_limit_compares_the_whole_cost)
{
    const char *body = "{" QKV "}";
    api_cost cost;
    api_response res;
    api_call *c = api_prepare(API_OP_ATTENTION, body, strlen(body), &LIM, &cost, &res);
    ck_assert_ptr_nonnull(c);
    api_call_free(c);
    /* 2 * B * H * n_q * n_k * (d_k + d_v) = 2 * 1 * 1 * 2 * 2 * (2 + 2) */
    ck_assert(cost.flops == 32);
    ck_assert(cost.work > cost.flops);
    /* At the limit it runs, and says what it was charged; beyond, 422. */
    api_limits exact = {.max_work = ceil(cost.work), .threads = 1};
    json_t *j = call(API_OP_ATTENTION, body, strlen(body), &exact, 200);
    json_t *meta = json_object_get(j, "meta");
    ck_assert_int_eq(json_integer_value(json_object_get(meta, "flops")), 32);
    ck_assert_int_eq(json_integer_value(json_object_get(meta, "work")),
                     (json_int_t)ceil(cost.work));
    json_decref(j);
    api_limits below = {.max_work = cost.work * (1 - 1e-9), .threads = 1};
    expect_error_lim(API_OP_ATTENTION, body, &below, 422, "work_limit", NULL);
    /* The gradient costs more (3.5 forwards of products), and is refused. */
    const char *grad = "{" QKV ",\"grad_output\":[[1,2],[3,4]]}";
    api_cost gcost;
    c = api_prepare(API_OP_ATTENTION, grad, strlen(grad), &LIM, &gcost, &res);
    ck_assert_ptr_nonnull(c);
    api_call_free(c);
    ck_assert(gcost.flops == 112);
    ck_assert(gcost.work > cost.work);
    expect_error_lim(API_OP_ATTENTION, grad, &exact, 422, "work_limit", NULL);
    api_limits one = {.max_work = 1, .threads = 1};
    expect_error_lim(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1}", &one, 422, "work_limit",
                     NULL);
}
END_TEST

/* The cost of a body, prepared and not executed. */
static api_cost cost_of(api_op op, const sbuf *b)
{
    api_cost cost = {0};
    api_response res;
    api_call *c = api_prepare(op, b->s, b->len, &LIM, &cost, &res);
    ck_assert_msg(c != NULL, "refused: %s", res.body);
    api_call_free(c);
    return cost;
}

/* x [2, 1] and num_heads heads of width 1 sharing one key/value head:
 * almost no FLOPs, a cost per head. */
static void many_heads_body(sbuf *b, int heads, bool w_o)
{
    float x[2] = {0.5f, -0.25f}, one = 1;
    float *w_q = malloc((size_t)heads * sizeof *w_q), *wo = NULL;
    for (int i = 0; i < heads; i++)
        w_q[i] = (float)((i % 7) - 3) / 4;
    int64_t sx[2] = {2, 1}, sq[2] = {1, heads}, s1[2] = {1, 1}, so[2] = {heads, 1};
    b->len = 0;
    sb_printf(b, "{");
    put_field(b, "x", x, 2, sx, ENC_BASE64);
    put_field(b, "w_q", w_q, 2, sq, ENC_BASE64);
    put_field(b, "w_k", &one, 2, s1, ENC_BASE64);
    put_field(b, "w_v", &one, 2, s1, ENC_BASE64);
    if (w_o) {
        wo = malloc((size_t)heads * sizeof *wo);
        for (int i = 0; i < heads; i++)
            wo[i] = 1.0f / (float)heads;
        put_field(b, "w_o", wo, 2, so, ENC_BASE64);
    }
    sb_printf(b, ",\"num_heads\":%d,\"num_kv_heads\":1,\"output_encoding\":\"base64\"}", heads);
    free(w_q);
    free(wo);
}

/* q [H, n_q, d] and k = v [H, n_k, d] of random numbers in base64, then
 * `extra` (members with their leading commas). */
static void qkv_body(sbuf *b, int64_t heads, int64_t n_q, int64_t n_k, int64_t d,
                     const char *extra)
{
    int64_t sq[3] = {heads, n_q, d}, sk[3] = {heads, n_k, d};
    float *q = rnd_tensor(heads * n_q * d), *k = rnd_tensor(heads * n_k * d);
    b->len = 0;
    sb_printf(b, "{");
    put_field(b, "q", q, 3, sq, ENC_BASE64);
    put_field(b, "k", k, 3, sk, ENC_BASE64);
    put_field(b, "v", k, 3, sk, ENC_BASE64);
    sb_printf(b, "%s}", extra);
    free(q);
    free(k);
}

/* Everything a request costs is counted, not only its FLOPs: heads, rows,
 * scores, masks, statistics, weights and the numbers of the answer. */
START_TEST(work_counts_what_flops_do_not)
{
    sbuf b = {0};
    /* 1.6e7 FLOPs, but 800000 heads: seconds of softmaxes. */
    many_heads_body(&b, 800000, false);
    api_cost heads = cost_of(API_OP_MULTIHEAD, &b);
    ck_assert_msg(heads.work > 100 * heads.flops, "work %g, flops %g", heads.work, heads.flops);
    /* With an output projection, linear in the heads, as the time is. */
    many_heads_body(&b, 800000, true);
    api_cost full = cost_of(API_OP_MULTIHEAD, &b);
    many_heads_body(&b, 400000, true);
    api_cost half = cost_of(API_OP_MULTIHEAD, &b);
    ck_assert_msg(full.work / half.work > 1.8 && full.work / half.work < 2.2,
                  "%g for twice the heads", full.work / half.work);

    /* Every option adds to the work of the same attention. */
    qkv_body(&b, 1, 256, 256, 1, ",\"output_encoding\":\"base64\"");
    api_cost plain = cost_of(API_OP_ATTENTION, &b);
    const char *extras[] = {",\"return_stats\":true,\"output_encoding\":\"base64\"",
                            ",\"return_weights\":true,\"output_encoding\":\"base64\"",
                            ",\"output_encoding\":\"nested\"",
                            ",\"mask\":[[true]],\"output_encoding\":\"base64\""};
    for (size_t i = 0; i < sizeof extras / sizeof *extras; i++) {
        qkv_body(&b, 1, 256, 256, 1, extras[i]);
        api_cost more = cost_of(API_OP_ATTENTION, &b);
        ck_assert_msg(more.work > plain.work, "%s: work %g, not more than %g", extras[i],
                      more.work, plain.work);
        ck_assert(more.flops == plain.flops);
    }
    /* The variants: softcap, ALiBi and RoPE add to the work of the same
     * products; a window leaves the band's FLOPs and work only. */
    qkv_body(&b, 1, 1024, 1024, 2, ",\"output_encoding\":\"base64\"");
    api_cost full_attention = cost_of(API_OP_ATTENTION, &b);
    const char *variants[] = {",\"softcap\":5", ",\"alibi_slopes\":[0.5]",
                              ",\"rope\":{\"base\":10000}", ",\"window\":[-1,-1]"};
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        char extra[128];
        snprintf(extra, sizeof extra, "%s,\"output_encoding\":\"base64\"", variants[i]);
        qkv_body(&b, 1, 1024, 1024, 2, extra);
        api_cost more = cost_of(API_OP_ATTENTION, &b);
        ck_assert_msg(i == 3 ? more.work >= full_attention.work : more.work > full_attention.work,
                      "%s: work %g, not more than %g", variants[i], more.work,
                      full_attention.work);
        ck_assert(more.flops == full_attention.flops);
    }
    qkv_body(&b, 1, 1024, 1024, 2, ",\"window\":[15,0],\"output_encoding\":\"base64\"");
    api_cost band = cost_of(API_OP_ATTENTION, &b);
    /* 16 keys a row of 1024 (fewer in the first rows), and tiles of 64 keys */
    ck_assert_msg(band.flops < full_attention.flops / 60, "flops %g of %g", band.flops,
                  full_attention.flops);
    ck_assert_msg(band.work < full_attention.work / 2, "work %g of %g", band.work,
                  full_attention.work);
    /* Weights as text cost far more than the weights' FLOPs. */
    qkv_body(&b, 1, 8191, 8192, 1, ",\"return_weights\":true");
    api_cost weights = cost_of(API_OP_ATTENTION, &b);
    ck_assert(weights.work > 8191.0 * 8192 * 1000);
    ck_assert(weights.response_bytes > 8191.0 * 8192 * 2);
    free(b.s);
}
END_TEST

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* How much slower per unit of work than the typical request (the median
 * of the cases) any request may be, and, over 4, faster. The prices are the
 * upper ends of what was measured, so a normal build stays near 1; the
 * sanitizers slow libattn's own loops (not OpenBLAS's) two to four times,
 * and the generic kernel does its products several times slower than the
 * others and the rest at the same speed. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifdef SANITIZED
/* Instrumented at -O1, libattn's own kernels (the generic one above all)
 * slow down ten to twenty times and OpenBLAS not at all: the band says
 * only that nothing is wildly off. */
#define WORK_TIME_BAND 40.0
#else
#define WORK_TIME_BAND 8.0
#endif

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    const char *name;
    api_op op;
    sbuf body;
} timed_case;

/* --max-work bounds time: the time per unit of work stays within one band
 * for requests whose cost lies in entirely different places (products;
 * heads; query rows; d = 1 scores; statistics; weights as text; an additive
 * mask; gradients; multi-head with many heads), each sized to a similar
 * work. Measured against the median of them, min of 3 runs each. */
START_TEST(work_bounds_time_across_request_shapes)
{
    timed_case cases[24];
    int n = 0;
    const struct {
        const char *name;
        int64_t heads, n_q, n_k, d;
        const char *extra;
    } sdpa[] = {
        {"products (the unit)", 4, 512, 512, 64, ",\"output_encoding\":\"base64\""},
        {"heads", 20000, 1, 1, 1, ",\"output_encoding\":\"base64\""},
        {"query rows", 1, 100000, 1, 1, ",\"output_encoding\":\"base64\""},
        {"scores, d = 1", 1, 2048, 2048, 1, ",\"output_encoding\":\"base64\""},
        {"statistics", 1, 1024, 1024, 1, ",\"return_stats\":true"},
        {"weights as text", 1, 256, 512, 1, ",\"return_weights\":true"},
        {"softcap, d = 2", 1, 2048, 2048, 2, ",\"softcap\":5,\"output_encoding\":\"base64\""},
        {"ALiBi, d = 2", 1, 2048, 2048, 2,
         ",\"alibi_slopes\":[0.5],\"output_encoding\":\"base64\""},
        {"window [0, 0], long", 1, 32768, 32768, 2,
         ",\"window\":[0,0],\"output_encoding\":\"base64\""},
        {"window [256, 0]", 1, 8192, 8192, 8,
         ",\"window\":[256,0],\"output_encoding\":\"base64\""},
        {"RoPE, long keys", 1, 1, 2000, 64,
         ",\"rope\":{\"base\":10000},\"output_encoding\":\"base64\""},
        {"RoPE, many heads", 64, 1, 50, 64,
         ",\"rope\":{\"base\":10000},\"output_encoding\":\"base64\""},
        {"bfloat16 products", 4, 512, 512, 64,
         ",\"precision\":\"bfloat16\",\"output_encoding\":\"base64\""},
        {"bfloat16, d = 8", 2, 1024, 1024, 8,
         ",\"precision\":\"bfloat16\",\"output_encoding\":\"base64\""},
    };
    for (size_t i = 0; i < sizeof sdpa / sizeof *sdpa; i++, n++) {
        cases[n] = (timed_case){sdpa[i].name, API_OP_ATTENTION, {0}};
        qkv_body(&cases[n].body, sdpa[i].heads, sdpa[i].n_q, sdpa[i].n_k, sdpa[i].d,
                 sdpa[i].extra);
    }
    int64_t s[3] = {1, 1024, 1}, sm[2] = {1024, 1024};
    float *q = rnd_tensor(1024), *g = rnd_tensor(1024), *m = rnd_tensor(1024 * 1024);
    for (int kind = 0; kind < 3; kind++, n++) {
        bool with_mask = kind == 1;
        const char *names[] = {"gradients, d = 1", "additive mask", "ALiBi, gradients, d = 1"};
        cases[n] = (timed_case){names[kind], API_OP_ATTENTION, {0}};
        sbuf *b = &cases[n].body;
        sb_printf(b, "{");
        put_field(b, "q", q, 3, s, ENC_BASE64);
        put_field(b, "k", g, 3, s, ENC_BASE64);
        put_field(b, "v", g, 3, s, ENC_BASE64);
        if (with_mask)
            put_field(b, "mask", m, 2, sm, ENC_BASE64);
        else
            put_field(b, "grad_output", g, 3, s, ENC_BASE64);
        sb_printf(b, "%s,\"output_encoding\":\"base64\"}",
                  kind == 2 ? ",\"alibi_slopes\":[0.25]" : "");
    }
    free(q), free(g), free(m);
    cases[n] = (timed_case){"multi-head, many heads", API_OP_MULTIHEAD, {0}};
    many_heads_body(&cases[n++].body, 10000, false);
    cases[n] = (timed_case){"multi-head, many heads, w_o", API_OP_MULTIHEAD, {0}};
    many_heads_body(&cases[n++].body, 10000, true);

    double seconds[24], work[24], per_unit[24];
    api_limits one = {.threads = 1};
    for (int i = 0; i < n; i++) {
        seconds[i] = 1e9;
        for (int rep = 0; rep < 3; rep++) {
            api_cost cost;
            api_response res;
            double t0 = now_seconds();
            api_call *c = api_prepare(cases[i].op, cases[i].body.s, cases[i].body.len, &one,
                                      &cost, &res);
            ck_assert_msg(c != NULL, "%s refused: %s", cases[i].name, res.body);
            api_execute(c, 1, &res);
            double t = now_seconds() - t0;
            ck_assert_msg(res.status == 200, "%s: %s", cases[i].name, res.body);
            api_response_free(&res);
            if (t < seconds[i])
                seconds[i] = t;
            work[i] = cost.work;
        }
        per_unit[i] = seconds[i] / work[i];
        free(cases[i].body.s);
    }
    double sorted[24];
    memcpy(sorted, per_unit, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, compare_doubles);
    double unit = sorted[n / 2]; /* seconds per unit of work, typically */
    for (int i = 0; i < n; i++) {
        double ratio = seconds[i] / (work[i] * unit);
        fprintf(stderr, "  work vs time: %-28s work %.3g  %8.2f ms  time / (work x unit) %.2f\n",
                cases[i].name, work[i], seconds[i] * 1e3, ratio);
        ck_assert_msg(ratio < WORK_TIME_BAND,
                      "%s takes %.1fx the time its work says (%.3g units, %.1f ms)",
                      cases[i].name, ratio, work[i], seconds[i] * 1e3);
        ck_assert_msg(ratio > 1 / (4 * WORK_TIME_BAND),
                      "%s is charged %.0fx the work its time says", cases[i].name, 1 / ratio);
    }
}
END_TEST

/* Seconds for api_prepare + api_execute of a body on one thread, min of
 * `reps`; *cost gets its cost. 0 when refused (res then holds why). */
static double timed_run(api_op op, const sbuf *b, const api_limits *lim, int reps,
                        api_cost *cost, api_response *refusal)
{
    double best = 1e9;
    for (int rep = 0; rep < reps; rep++) {
        api_response res;
        double t0 = now_seconds();
        api_call *c = api_prepare(op, b->s, b->len, lim, cost, &res);
        if (!c) {
            *refusal = res;
            return 0;
        }
        api_execute(c, 1, &res);
        double t = now_seconds() - t0;
        ck_assert_msg(res.status == 200, "%s", res.body);
        api_response_free(&res);
        if (t < best)
            best = t;
    }
    return best;
}

/* Requests of few FLOPs and long work, under a limit of 5e10 (about 5 s of
 * one core): each is refused up front, or done within the band of the
 * time its work says. 800000 heads of width 1 without w_o (1.6e7 FLOPs,
 * seconds when priced by FLOPs alone), and 650 heads of width 1 over 1300
 * positions. */
START_TEST(heavy_requests_of_few_flops_are_refused_or_as_fast_as_their_work)
{
    sbuf ref = {0}, b = {0};
    api_limits lim = {.max_work = 5e10, .max_response = 256 << 20, .threads = 1};
    api_cost cost;
    api_response refusal;
    qkv_body(&ref, 4, 512, 512, 64, ",\"output_encoding\":\"base64\"");
    double unit = timed_run(API_OP_ATTENTION, &ref, &lim, 3, &cost, &refusal) / cost.work;
    ck_assert(unit > 0);

    for (int example = 0; example < 2; example++) {
        if (example == 0) {
            b.len = 0;
            sb_printf(&b, "{\"x\":[[1],[2]],\"w_q\":[[");
            for (int i = 0; i < 800000; i++)
                sb_printf(&b, i ? ",%d" : "%d", i % 3 - 1);
            sb_printf(&b, "]],\"w_k\":[[1]],\"w_v\":[[1]],\"num_heads\":800000,"
                          "\"num_kv_heads\":1}");
        } else {
            b.len = 0;
            sb_printf(&b, "{\"x\":{\"shape\":[1300,1],\"data\":[1");
            for (int i = 1; i < 1300; i++)
                sb_printf(&b, ",%d", i % 2);
            sb_printf(&b, "]},\"w_q\":[[1");
            for (int i = 1; i < 650; i++)
                sb_printf(&b, ",1");
            sb_printf(&b, "]],\"w_k\":{\"shape\":[1,650],\"data\":[1");
            for (int i = 1; i < 650; i++)
                sb_printf(&b, ",1");
            sb_printf(&b, "]},\"w_v\":{\"shape\":[1,650],\"data\":[1");
            for (int i = 1; i < 650; i++)
                sb_printf(&b, ",1");
            sb_printf(&b, "]},\"num_heads\":650}");
        }
        double t0 = now_seconds();
        double took = timed_run(API_OP_MULTIHEAD, &b, &lim, 1, &cost, &refusal);
        if (took == 0) {
            double refused_in = now_seconds() - t0;
            ck_assert_int_eq(refusal.status, 422);
            ck_assert_ptr_nonnull(strstr(refusal.body, "\"work_limit\""));
            api_response_free(&refusal);
            ck_assert_msg(refused_in < 1, "example %d: refused after %.1f s", example,
                          refused_in);
        } else {
            double ratio = took / (cost.work * unit);
            ck_assert_msg(ratio < WORK_TIME_BAND, "example %d: %.1f s, %.1fx its work", example,
                          took, ratio);
        }
    }
    free(ref.s);
    free(b.s);
}
END_TEST

/* The answer never takes more bytes than its estimate, which the server
 * reserves against --max-response before computing it: for every encoding,
 * and for numbers of the longest text (large outputs, tiny weights). */
START_TEST(response_estimate_bounds_the_answer)
{
    const char *encodings[] = {"\"nested\"", "\"flat\"", "\"base64\"",
                               "\"base64\",\"output_dtype\":\"float16\"",
                               "\"base64\",\"output_dtype\":\"bfloat16\""};
    const float values[] = {-1000206000000000.0f, -1.17549435e-38f, 0.1f, -3.4028235e38f};
    sbuf b = {0};
    for (size_t e = 0; e < sizeof encodings / sizeof *encodings; e++)
        for (size_t v = 0; v < sizeof values / sizeof *values; v++)
            for (int rank = 2; rank <= 4; rank++) {
                int64_t shape[4] = {2, 3, 5, 7}, *sh = shape + (4 - rank);
                int64_t count = count_of(rank, sh);
                float *x = malloc((size_t)count * sizeof *x);
                for (int64_t i = 0; i < count; i++)
                    x[i] = values[v];
                float *zero = calloc((size_t)count, sizeof *zero); /* equal scores */
                b.len = 0;
                sb_printf(&b, "{");
                put_field(&b, "q", zero, rank, sh, ENC_BASE64);
                put_field(&b, "k", zero, rank, sh, ENC_BASE64);
                put_field(&b, "v", x, rank, sh, ENC_BASE64);
                sb_printf(&b, ",\"return_weights\":true,\"output_encoding\":%s}",
                          encodings[e]);
                api_cost cost;
                api_response res;
                api_call *c = api_prepare(API_OP_ATTENTION, b.s, b.len, &LIM, &cost, &res);
                ck_assert_ptr_nonnull(c);
                api_execute(c, 1, &res);
                if (res.status == 422 && e >= 3) { /* beyond float16's range */
                    api_response_free(&res);
                    free(x);
                    free(zero);
                    continue;
                }
                ck_assert_msg(res.status == 200, "%s", res.body);
                ck_assert_msg((double)res.body_len <= cost.response_bytes &&
                                  (double)res.body_cap <= cost.response_bytes,
                              "%s, rank %d, %g: %zu bytes (holding %zu), estimate %g",
                              encodings[e], rank, (double)values[v], res.body_len,
                              res.body_cap, cost.response_bytes);
                ck_assert(res.body_cap >= res.body_len + 1);
                api_response_free(&res);
                free(x);
                free(zero);
            }
    free(b.s);
}
END_TEST

/* --max-response bounds one answer before anything is computed: weights of
 * 2048 x 2048 (4M numbers) from a body of a few kilobytes. */
START_TEST(error_response_too_large_is_refused_before_computing)
{
    sbuf b = {0};
    qkv_body(&b, 1, 2048, 2048, 1, ",\"return_weights\":true");
    api_limits small = {.max_response = 32 << 20, .threads = 1};
    json_t *j = call(API_OP_ATTENTION, b.s, b.len, &small, 422);
    json_t *e = json_object_get(j, "error");
    ck_assert_str_eq(json_string_value(json_object_get(e, "code")), "response_too_large");
    ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(e, "message")),
                                 "--max-response"));
    json_decref(j);
    /* In base64 the same weights fit. */
    qkv_body(&b, 1, 2048, 2048, 1, ",\"return_weights\":true,\"output_encoding\":\"base64\"");
    j = call(API_OP_ATTENTION, b.s, b.len, &small, 200);
    json_decref(j);
    free(b.s);
}
END_TEST

/* A huge additive mask is named as the culprit, not q and k. */
START_TEST(error_overflowing_mask_is_blamed_on_the_mask)
{
    const char *bodies[][2] = {
        /* (at or below -1e30 an additive value hides its key instead) */
        {"a", "{\"q\":[[1,0]],\"k\":[[1,0],[0,1]],\"v\":[[1],[2]],\"mask\":[[3.4e38,0]]}"},
        {"m", "{" MHA ",\"num_heads\":1,\"mask\":[[3.4e38,0],[0,0]]}"},
    };
    for (size_t i = 0; i < 2; i++) {
        api_op op = bodies[i][0][0] == 'm' ? API_OP_MULTIHEAD : API_OP_ATTENTION;
        json_t *j = call(op, bodies[i][1], strlen(bodies[i][1]), &LIM, 422);
        json_t *e = json_object_get(j, "error");
        const char *msg = json_string_value(json_object_get(e, "message"));
        ck_assert_str_eq(json_string_value(json_object_get(e, "code")), "numerical_overflow");
        ck_assert_msg(strstr(msg, "mask") != NULL, "the mask is not named: %s", msg);
        ck_assert_msg(strstr(msg, "q and k") == NULL && strstr(msg, "projections") == NULL,
                      "blames the inputs: %s", msg);
        json_decref(j);
    }
}
END_TEST

START_TEST(error_bad_output_encoding)
{
    expect_error(API_OP_ATTENTION, "{" QKV ",\"output_encoding\":\"csv\"}", 422,
                 "invalid_value", "output_encoding");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"output_encoding\":\"Nested\"}", 422,
                 "invalid_value", "output_encoding");
    /* An escaped NUL is valid JSON: still just a value outside the set. */
    expect_error(API_OP_ATTENTION, "{" QKV ",\"output_encoding\":\"nested\\u0000x\"}",
                 422, "invalid_value", "output_encoding");
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1,\"return_weights\":\"max\"}",
                 422, "invalid_value", "return_weights");
}
END_TEST

START_TEST(error_scale_not_positive)
{
    expect_error(API_OP_ATTENTION, "{" QKV ",\"scale\":0}", 422, "invalid_value", "scale");
    expect_error(API_OP_ATTENTION, "{" QKV ",\"scale\":-0.5}", 422, "invalid_value", "scale");
    /* positive, but 0 as a float32 */
    expect_error(API_OP_ATTENTION, "{" QKV ",\"scale\":1e-50}", 422, "invalid_value", "scale");
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":1,\"scale\":0}", 422,
                 "invalid_value", "scale");
}
END_TEST

/* The output check finds the first non-finite element wherever it lies:
 * in the first or last place of a block of the blockwise scan, past it,
 * in a short tail; and lets every finite value through, the largest and
 * the subnormals included. */
START_TEST(output_check_names_the_first_non_finite_element)
{
    const int64_t counts[] = {1, 7, 4095, 4096, 4097, 12289};
    const float bad[] = {INFINITY, -INFINITY, NAN, -NAN};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
        int64_t n = counts[c];
        float *x = malloc((size_t)n * sizeof *x);
        ck_assert_ptr_nonnull(x);
        for (int64_t i = 0; i < n; i++)
            x[i] = i % 3 == 0 ? FLT_MAX : i % 3 == 1 ? -FLT_TRUE_MIN : (float)i * 0.5f;
        api_error err = {0};
        ck_assert(api_check_output(x, n, "the output", CODEC_ENC_NESTED, &err));
        const int64_t places[] = {0, 4095, 4096, 4097, 8191, n - 1};
        for (size_t p = 0; p < sizeof places / sizeof *places; p++) {
            int64_t at = places[p];
            if (at >= n)
                continue;
            float was = x[at];
            x[at] = bad[p % 4];
            if (at + 1 < n) { /* a later one does not hide it */
                float later = x[n - 1];
                x[n - 1] = INFINITY;
                ck_assert(!api_check_output(x, n, "the output", CODEC_ENC_NESTED, &err));
                x[n - 1] = later;
            } else {
                ck_assert(!api_check_output(x, n, "the output", CODEC_ENC_NESTED, &err));
            }
            char expect[64];
            snprintf(expect, sizeof expect, "at element %lld)", (long long)at);
            ck_assert_msg(strstr(err.message, expect), "n=%lld, at %lld: %s", (long long)n,
                          (long long)at, err.message);
            ck_assert_str_eq(err.code, "numerical_overflow");
            x[at] = was;
        }
        free(x);
    }
}
END_TEST

START_TEST(error_numerical_overflow_not_nan)
{
    /* scores 1e20 * 1e20 overflow float32: refused, never a NaN or a
     * silently zeroed row */
    expect_error(API_OP_ATTENTION,
                 "{\"q\":[[1e20],[1]],\"k\":[[1e20],[-1e20]],\"v\":[[1],[2]],\"scale\":1}",
                 422, "numerical_overflow", NULL);
    /* finite scores, but a bias that pushes them past float32 */
    expect_error(API_OP_ATTENTION,
                 "{\"q\":[[1e19]],\"k\":[[1e19]],\"v\":[[1]],\"scale\":1,"
                 "\"mask\":[[3e38]]}", 422, "numerical_overflow", NULL);
    /* projections that overflow */
    expect_error(API_OP_MULTIHEAD,
                 "{\"x\":[[1e20]],\"w_q\":[[1e20]],\"w_k\":[[1]],\"w_v\":[[1]],"
                 "\"num_heads\":1}", 422, "numerical_overflow", NULL);
    /* gradients of huge values overflow even when the output does not */
    expect_error(API_OP_ATTENTION,
                 "{\"q\":[[1]],\"k\":[[1],[0]],\"v\":[[3e38],[-3e38]],"
                 "\"grad_output\":[[3e38]]}", 422, "numerical_overflow", NULL);
}
END_TEST

/* The output is a weighted mean of v's rows, finite whenever v is, even
 * when n_k * max|v| is beyond float32 (as in PyTorch's float32). */
START_TEST(attention_values_near_float32_max_average_without_overflow)
{
    const char *body = "{\"q\":[[0,0]],\"k\":[[1,2],[1,2],[1,2],[1,2]],"
                       "\"v\":[[3e38,1e-3],[3e38,2e-3],[-1e38,3e-3],[3e38,4e-3]],"
                       "\"grad_output\":[[1,1]]}";
    json_t *j = call(API_OP_ATTENTION, body, strlen(body), &LIM, 200);
    int64_t so[2] = {1, 2}, sv[2] = {4, 2};
    float *o = get_tensor(json_object_get(j, "output"), ENC_NESTED, 2, so);
    ck_close(o[0], (3 * 3e38 - 1e38) / 4, 1e-6);
    ck_close(o[1], (1e-3 + 2e-3 + 3e-3 + 4e-3) / 4, 1e-6);
    /* equal scores: dv is the mean of dO, and the scores' gradients 0 */
    float *dv = get_tensor(json_object_get(json_object_get(j, "grad"), "v"), ENC_NESTED, 2, sv);
    for (int i = 0; i < 8; i++)
        ck_close(dv[i], 0.25, 1e-6);
    free(o), free(dv);
    json_decref(j);
    body = "{\"q\":[[0]],\"k\":[[1],[1]],\"v\":[[3.4028235e38],[3.4028235e38]]}";
    j = call(API_OP_ATTENTION, body, strlen(body), &LIM, 200);
    int64_t s1[2] = {1, 1};
    o = get_tensor(json_object_get(j, "output"), ENC_NESTED, 2, s1);
    ck_assert_float_eq(o[0], FLT_MAX);
    free(o);
    json_decref(j);
}
END_TEST

/* Scores of +-1e4 give the exact one-hot answer, never inf or NaN. */
START_TEST(attention_scores_of_1e4_give_exact_one_hot)
{
    const char *body = "{\"q\":[[100],[-100]],\"k\":[[100],[-100]],\"v\":[[1,2],[3,4]],"
                       "\"scale\":1,\"return_weights\":true}";
    json_t *j = call(API_OP_ATTENTION, body, strlen(body), &LIM, 200);
    int64_t s[2] = {2, 2};
    float *o = get_tensor(json_object_get(j, "output"), ENC_NESTED, 2, s);
    float *w = get_tensor(json_object_get(j, "weights"), ENC_NESTED, 2, s);
    const float want_o[4] = {1, 2, 3, 4}, want_w[4] = {1, 0, 0, 1};
    for (int i = 0; i < 4; i++) {
        ck_assert_float_eq(o[i], want_o[i]);
        ck_assert_float_eq(w[i], want_w[i]);
    }
    free(o), free(w);
    json_decref(j);
}
END_TEST

/* At most 32 members: the 33rd is refused as too many before any member
 * is read, while 32 get as far as naming the first unknown one. */
START_TEST(error_too_many_fields)
{
    for (int members = 32; members <= 33; members++) {
        sbuf b = {0};
        sb_printf(&b, "{" QKV);
        for (int i = 3; i < members; i++)
            sb_printf(&b, ",\"f%d\":1", i);
        sb_printf(&b, "}");
        if (members <= 32)
            expect_error(API_OP_ATTENTION, b.s, 400, "unknown_field", "f3");
        else
            expect_error(API_OP_ATTENTION, b.s, 400, "too_many_fields", NULL);
        free(b.s);
    }
}
END_TEST

START_TEST(error_object_built_in_one_place)
{
    api_error e;
    ck_assert(!api_fail(&e, 422, "shape_mismatch", "k", "k has d_k=%d but q has d_k=%d", 32, 64));
    size_t len = 0;
    char *s = api_error_json(&e, &len);
    ck_assert_ptr_nonnull(s);
    ck_assert_uint_eq(strlen(s), len);
    json_t *j = json_loads(s, 0, NULL);
    json_t *o = json_object_get(j, "error");
    ck_assert_int_eq(json_object_size(j), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "status")), 422);
    ck_assert_str_eq(json_string_value(json_object_get(o, "code")), "shape_mismatch");
    ck_assert_str_eq(json_string_value(json_object_get(o, "message")),
                     "k has d_k=32 but q has d_k=64");
    ck_assert_str_eq(json_string_value(json_object_get(o, "field")), "k");
    json_decref(j);
    free(s);

    /* no field: the member is omitted; a message cut inside a UTF-8
     * sequence is still valid JSON */
    char long_msg[400];
    memset(long_msg, 'a', sizeof long_msg);
    for (size_t i = 290; i + 1 < sizeof long_msg; i += 2)
        long_msg[i] = (char)0xC3, long_msg[i + 1] = (char)0xA9; /* é */
    long_msg[sizeof long_msg - 1] = 0;
    api_fail(&e, 500, "internal", "", "%s", long_msg);
    s = api_error_json(&e, &len);
    ck_assert_ptr_nonnull(s);
    j = json_loads(s, 0, NULL);
    ck_assert_ptr_nonnull(j);
    ck_assert_ptr_null(json_object_get(json_object_get(j, "error"), "field"));
    json_decref(j);
    free(s);
}
END_TEST

/* The error body is JSON that reads back as the members given: escapes,
 * UTF-8 passed through, control characters escaped, and a message that is
 * not valid UTF-8 (an overlong form) with each stray byte read as U+FFFD. */
START_TEST(error_body_reads_back_as_the_members_given)
{
    const char *messages[][2] = {
        {"plain", "plain"},
        {"quote \" backslash \\ slash / tab \t newline \n cr \r bs \b ff \f",
         "quote \" backslash \\ slash / tab \t newline \n cr \r bs \b ff \f"},
        {"controls \x01\x1f del \x7f", "controls \x01\x1f del \x7f"},
        {"utf-8 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "utf-8 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"overlong \xc0\xaf and \xc3\xa9", "overlong \xef\xbf\xbd\xef\xbf\xbd and \xc3\xa9"},
    };
    for (size_t i = 0; i < sizeof messages / sizeof *messages; i++) {
        api_error e;
        api_fail(&e, 422, "shape_mismatch", i % 2 ? "k" : "", "%s", messages[i][0]);
        size_t len = 0;
        char *got = api_error_json(&e, &len);
        ck_assert_uint_eq(len, strlen(got));
        for (const char *c = got; *c; c++)
            ck_assert_msg((unsigned char)*c >= 0x20 && *c != 0x7f, "raw control byte in %s", got);
        json_error_t je;
        json_t *j = json_loads(got, 0, &je);
        ck_assert_msg(j != NULL, "%s: %s", got, je.text);
        json_t *o = json_object_get(j, "error");
        ck_assert_int_eq(json_object_size(j), 1);
        ck_assert_int_eq(json_object_size(o), i % 2 ? 4 : 3);
        ck_assert_int_eq(json_integer_value(json_object_get(o, "status")), 422);
        ck_assert_str_eq(json_string_value(json_object_get(o, "code")), "shape_mismatch");
        ck_assert_str_eq(json_string_value(json_object_get(o, "message")), messages[i][1]);
        if (i % 2)
            ck_assert_str_eq(json_string_value(json_object_get(o, "field")), "k");
        json_decref(j);
        free(got);
    }
}
END_TEST

/* jansson reads string fields (the error object, the stats and the meta
 * are written without it): whichever of its allocations fails, the answer
 * is a complete JSON body or a bare 500, never a body with a key missing. */
static long jansson_countdown = -1;
static void *failing_malloc(size_t n)
{
    if (jansson_countdown >= 0 && jansson_countdown-- == 0)
        return NULL;
    return malloc(n);
}

START_TEST(jansson_out_of_memory_gives_500_never_broken_json)
{
    const char *bodies[][2] = {
        {"a", "{" QKV ",\"return_stats\":true,\"grad_output\":[[1,1],[1,1]]}"},
        {"a", "{" QKV ",\"casual\":true}"},
        {"m", "{" MHA ",\"num_heads\":2,\"return_weights\":\"mean\",\"output_encoding\":\"flat\"}"},
    };
    for (size_t b = 0; b < sizeof bodies / sizeof *bodies; b++) {
        api_op op = bodies[b][0][0] == 'm' ? API_OP_MULTIHEAD : API_OP_ATTENTION;
        api_response ref;
        api_handle(op, bodies[b][1], strlen(bodies[b][1]), &LIM, &ref);
        for (long n = 0; n < 200; n++) {
            api_response res;
            jansson_countdown = n;
            json_set_alloc_funcs(failing_malloc, free);
            api_handle(op, bodies[b][1], strlen(bodies[b][1]), &LIM, &res);
            bool failed = jansson_countdown < 0;
            jansson_countdown = -1;
            json_set_alloc_funcs(malloc, free);
            if (!res.body) {
                ck_assert_int_eq(res.status, 500);
                continue;
            }
            json_t *j = json_loadb(res.body, res.body_len, 0, NULL);
            ck_assert_msg(j != NULL, "body %zu, allocation %ld: %s", b, n, res.body);
            if (res.status != 500) { /* then it is the whole answer */
                ck_assert_msg(res.status == ref.status, "body %zu allocation %ld: %s", b, n, res.body);
                json_t *want = json_loadb(ref.body, ref.body_len, 0, NULL);
                json_object_del(json_object_get(j, "meta"), "timing_ms");
                json_object_del(json_object_get(want, "meta"), "timing_ms");
                ck_assert_msg(json_equal(j, want), "body %zu, allocation %ld differs", b, n);
                json_decref(want);
            }
            json_decref(j);
            api_response_free(&res);
            if (!failed)
                break;
        }
        api_response_free(&ref);
    }
}
END_TEST

/* Every n_ file of JSONTestSuite (must be rejected) gives a 400. */
START_TEST(jsontestsuite_n_files_give_400)
{
    const char *root = getenv("ATTND_TESTDATA");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/json_parsing", root ? root : "tests/data");
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "cannot open %s", dir);
    int files = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (strncmp(ent->d_name, "n_", 2) != 0)
            continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        FILE *f = fopen(path, "rb");
        ck_assert_ptr_nonnull(f);
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *buf = malloc((size_t)n + 1);
        ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
        fclose(f);
        for (int op = 0; op < 2; op++) {
            api_response res;
            api_handle((api_op)op, buf, (size_t)n, &LIM, &res);
            ck_assert_msg(res.status == 400, "%s: status %d", ent->d_name, res.status);
            json_t *j = json_loadb(res.body, res.body_len, 0, NULL);
            ck_assert_msg(j != NULL, "%s: error body is not JSON", ent->d_name);
            json_decref(j);
            api_response_free(&res);
        }
        free(buf);
        files++;
    }
    closedir(d);
    ck_assert_int_gt(files, 150);
}
END_TEST

START_TEST(unknown_operation_is_404)
{
    api_response res;
    api_handle((api_op)7, "{}", 2, &LIM, &res);
    ck_assert_int_eq(res.status, 404);
    api_response_free(&res);
}
END_TEST

START_TEST(openapi_document_is_embedded)
{
    ck_assert_uint_gt(api_openapi_yaml_len, 1000);
    ck_assert_ptr_nonnull(strstr(api_openapi_yaml, "openapi: 3.1"));
    ck_assert_ptr_nonnull(strstr(api_openapi_yaml, "/v1/attention"));
    ck_assert_ptr_nonnull(strstr(api_openapi_yaml, "/v1/multihead"));
}
END_TEST

/* ------------------------------------------------------------ suite */

/* ------------------------------------------------------------ variants */

/* The smallest valid body of each route, open for more fields: q, k, v of
 * [2, n, 4] (two heads), or x [n, 4] with w_q, w_k, w_v [4, 4] and two heads
 * of d_k = 2. */
static void variant_base(sbuf *b, api_op op, int n)
{
    int64_t s3[3] = {2, n, 4}, x2[2] = {n, 4}, w2[2] = {4, 4};
    float *x = rnd_tensor(2 * n * 4), *w = rnd_tensor(16);
    sb_printf(b, "{");
    if (op == API_OP_ATTENTION) {
        put_field(b, "q", x, 3, s3, ENC_NESTED);
        put_field(b, "k", x, 3, s3, ENC_NESTED);
        put_field(b, "v", x, 3, s3, ENC_NESTED);
    } else {
        put_field(b, "x", x, 2, x2, ENC_NESTED);
        put_field(b, "w_q", w, 2, w2, ENC_NESTED);
        put_field(b, "w_k", w, 2, w2, ENC_NESTED);
        put_field(b, "w_v", w, 2, w2, ENC_NESTED);
        sb_printf(b, ",\"num_heads\":2");
    }
    free(x), free(w);
}

/* The base body of `op` with `fields` (JSON members, no braces) added must
 * fail with status, code and field. */
static void expect_variant_error(api_op op, const char *fields, int status, const char *code,
                                 const char *field)
{
    sbuf b = {0};
    variant_base(&b, op, 3);
    sb_printf(&b, ",%s}", fields);
    expect_error(op, b.s, status, code, field);
    free(b.s);
}

static void expect_variant_ok(api_op op, const char *fields)
{
    sbuf b = {0};
    variant_base(&b, op, 3);
    sb_printf(&b, ",%s}", fields);
    json_decref(call_ok(op, &b));
    free(b.s);
}

/* The base body of `op` with `fields` added fails with `status`, and its
 * message holds each of the NULL-terminated `words`. */
static void expect_variant_message(api_op op, const char *fields, int status, ...)
{
    sbuf b = {0};
    variant_base(&b, op, 3);
    sb_printf(&b, ",%s}", fields);
    json_t *j = call(op, b.s, b.len, &LIM, status);
    va_list ap;
    va_start(ap, status);
    for (const char *w = va_arg(ap, const char *); w; w = va_arg(ap, const char *))
        ck_assert_msg(strstr(error_message(j), w), "no \"%s\" in: %s", w, error_message(j));
    va_end(ap);
    json_decref(j);
    free(b.s);
}

static const api_op BOTH_ROUTES[] = {API_OP_ATTENTION, API_OP_MULTIHEAD};

START_TEST(error_window_type_then_range)
{
    for (int r = 0; r < 2; r++) {
        api_op op = BOTH_ROUTES[r];
        const char *wrong_type[] = {
            "\"window\":3", "\"window\":\"3,3\"", "\"window\":true", "\"window\":{\"left\":1}",
            "\"window\":[]", "\"window\":[1]", "\"window\":[1,2,3]", "\"window\":[1.5,2]",
            "\"window\":[\"1\",2]", "\"window\":[null,2]", "\"window\":[[1],2]",
            "\"window\":[1,false]",
        };
        for (size_t i = 0; i < sizeof wrong_type / sizeof *wrong_type; i++)
            expect_variant_error(op, wrong_type[i], 400, "wrong_type", "window");
        const char *out_of_range[] = {"\"window\":[-2,0]", "\"window\":[0,-3]",
                                      "\"window\":[1e16,0]", "\"window\":[-1e300,1]"};
        for (size_t i = 0; i < sizeof out_of_range / sizeof *out_of_range; i++)
            expect_variant_error(op, out_of_range[i], 422, "invalid_value", "window");
        expect_variant_error(op, "\"windwo\":[1,1]", 400, "unknown_field", "windwo");
        /* -1 (unbounded), 0, integral reals, beyond n, null: all accepted */
        expect_variant_ok(op, "\"window\":[-1,-1]");
        expect_variant_ok(op, "\"window\":[0,0]");
        expect_variant_ok(op, "\"window\":[2.0, 1e3]");
        expect_variant_ok(op, "\"window\":null");
    }
}
END_TEST

/* An integer field is judged on its digits as written: 2.0 and 2e0 are 2,
 * while a fraction that a double would round away, or a tiny number that
 * it would round to 0, is no integer; messages quote the text as sent. */
START_TEST(integers_are_judged_on_their_digits)
{
    for (int r = 0; r < 2; r++) {
        api_op op = BOTH_ROUTES[r];
        expect_variant_error(op, "\"window\":[2.0000000000000000001,0]", 400, "wrong_type",
                             "window");
        expect_variant_error(op, "\"window\":[1e-400,0]", 400, "wrong_type", "window");
        expect_variant_message(op, "\"window\":[0,1.5e-1]", 400,
                               "window[1] must be an integer, got 1.5e-1", NULL);
        expect_variant_message(op, "\"window\":[1000000000000000.5,0]", 422,
                               "window[0]=1000000000000000.5 is out of range", NULL);
        expect_variant_ok(op, "\"window\":[2e0,0.00e3]");
        expect_variant_ok(op, "\"window\":[1000000000000000,-1]");
    }
    expect_error(API_OP_MULTIHEAD, "{" MHA ",\"num_heads\":2.00000000000000000001}", 400,
                 "wrong_type", "num_heads");
    const char *two = "{" MHA ",\"num_heads\":0.2e1}";
    json_decref(call(API_OP_MULTIHEAD, two, strlen(two), &LIM, 200));
}
END_TEST

/* [-1, -1] is no window (openapi: Window): a causal request with it is the
 * request without it, meta.flops included (it counted the band below the
 * diagonal, not causal's nominal n_q * n_k, before). */
START_TEST(window_unbounded_both_sides_is_no_window)
{
    for (int r = 0; r < 2; r++) {
        api_op op = BOTH_ROUTES[r];
        sbuf base = {0}, plain = {0}, window = {0};
        variant_base(&base, op, 70);
        sb_printf(&plain, "%s,\"causal\":true,\"output_encoding\":\"base64\"}", base.s);
        sb_printf(&window, "%s,\"causal\":true,\"window\":[-1,-1],\"output_encoding\":\"base64\"}",
                  base.s);
        api_cost a = cost_of(op, &plain), b = cost_of(op, &window);
        ck_assert_msg(a.flops == b.flops, "route %d: flops %g without the window, %g with [-1, -1]",
                      r, a.flops, b.flops);
        json_t *ja = call_ok(op, &plain), *jb = call_ok(op, &window);
        ck_assert(json_equal(json_object_get(ja, "output"), json_object_get(jb, "output")));
        json_t *ma = json_object_get(ja, "meta"), *mb = json_object_get(jb, "meta");
        ck_assert(json_equal(json_object_get(ma, "flops"), json_object_get(mb, "flops")));
        json_decref(ja), json_decref(jb);
        free(base.s), free(plain.s), free(window.s);
    }
}
END_TEST

START_TEST(error_window_message_names_the_side)
{
    expect_variant_message(API_OP_ATTENTION, "\"window\":[4,-2]", 422, "right", "-1", NULL);
}
END_TEST

START_TEST(error_alibi_slopes_shape_and_values)
{
    /* attention [2, 3, 4]: H_q = 2, batch 1; multihead: num_heads 2, batch 1 */
    for (int r = 0; r < 2; r++) {
        api_op op = BOTH_ROUTES[r];
        expect_variant_ok(op, "\"alibi_slopes\":[0.5,0.25]");
        expect_variant_ok(op, "\"alibi_slopes\":[[0.5,0.25]]");
        expect_variant_ok(op, "\"alibi_slopes\":{\"shape\":[1,2],\"data\":[1,2]}");
        const char *shapes[] = {"\"alibi_slopes\":[0.5]", "\"alibi_slopes\":[1,2,3]",
                                "\"alibi_slopes\":[[1,2],[3,4]]", "\"alibi_slopes\":[[1],[2]]",
                                "\"alibi_slopes\":[[[1,2]]]", "\"alibi_slopes\":0.5"};
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            expect_variant_error(op, shapes[i], i == 5 ? 400 : 422,
                                 i == 5 ? "wrong_type" : "shape_mismatch",
                                 "alibi_slopes");
        expect_variant_error(op, "\"alibi_slopes\":[1e39,1]", 400, "invalid_number", "alibi_slopes");
        /* NaN and infinity can only come in base64: refused like 1e39 */
        expect_variant_error(op, "\"alibi_slopes\":{\"shape\":[2],\"dtype\":\"float32\","
                                 "\"base64\":\"AADAfwAAgD8=\"}", 400, "invalid_number",
                             "alibi_slopes.base64");
        expect_variant_error(op, "\"alibi_slopes\":{\"shape\":[2],\"dtype\":\"float32\","
                                 "\"base64\":\"AACAfwAAgD8=\"}", 400, "invalid_number",
                             "alibi_slopes.base64");
        expect_variant_error(op, "\"alibi_slopes\":[true,false]", 400, "wrong_type", "alibi_slopes");
        expect_variant_error(op, "\"alibi_slopes\":[1,[2]]", 422, "ragged_array", "alibi_slopes");
        /* slopes that could push a score past float32 over the distances */
        expect_variant_error(op, "\"alibi_slopes\":[3e38,1]", 422, "numerical_overflow", NULL);
    }
    expect_variant_message(API_OP_ATTENTION, "\"alibi_slopes\":[1e38,1]", 422, "alibi_slopes",
                           NULL);
}
END_TEST

START_TEST(error_alibi_slopes_message_gives_both_forms)
{
    expect_variant_message(API_OP_MULTIHEAD, "\"alibi_slopes\":[1,2,3]", 422, "[3]", "num_heads",
                           "[1, 2]", NULL);
}
END_TEST

START_TEST(error_softcap_not_positive)
{
    for (int r = 0; r < 2; r++) {
        api_op op = BOTH_ROUTES[r];
        expect_variant_error(op, "\"softcap\":0", 422, "invalid_value", "softcap");
        expect_variant_error(op, "\"softcap\":-5", 422, "invalid_value", "softcap");
        expect_variant_error(op, "\"softcap\":1e-50", 422, "invalid_value", "softcap");
        expect_variant_error(op, "\"softcap\":\"30\"", 400, "wrong_type", "softcap");
        expect_variant_error(op, "\"softcap\":[30]", 400, "wrong_type", "softcap");
        expect_variant_error(op, "\"softcap\":1e39", 400, "invalid_number", "softcap");
        expect_variant_ok(op, "\"softcap\":30");
        expect_variant_ok(op, "\"softcap\":1e-30");
    }
}
END_TEST

START_TEST(error_rope_is_an_object_with_one_base)
{
    for (int r = 0; r < 2; r++) {
        api_op op = BOTH_ROUTES[r];
        expect_variant_ok(op, "\"rope\":{\"base\":10000}");
        expect_variant_ok(op, "\"rope\":{\"base\":0.5}");
        expect_variant_ok(op, "\"rope\":null");
        expect_variant_error(op, "\"rope\":10000", 400, "wrong_type", "rope");
        expect_variant_error(op, "\"rope\":true", 400, "wrong_type", "rope");
        expect_variant_error(op, "\"rope\":[10000]", 400, "wrong_type", "rope");
        expect_variant_error(op, "\"rope\":{}", 400, "missing_field", "rope.base");
        expect_variant_error(op, "\"rope\":{\"base\":null}", 400, "missing_field", "rope.base");
        expect_variant_error(op, "\"rope\":{\"base\":10000,\"theta\":1}", 400, "unknown_field",
                             "rope.theta");
        expect_variant_error(op, "\"rope\":{\"bse\":10000}", 400, "unknown_field", "rope.bse");
        /* a long key is named by its first 40 bytes and "...", a NUL in it escaped */
        expect_variant_error(op, "\"rope\":{\"base_of_the_rotation_in_radians_per_position_pair\":1}",
                             400, "unknown_field", "rope.base_of_the_rotation_in_radians_per_posi...");
        expect_variant_error(op, "\"rope\":{\"base\\u0000\":1}", 400, "unknown_field",
                             "rope.base\\u0000");
        expect_variant_error(op, "\"rope\":{\"base\":1,\"base\":2}", 400, "duplicate_key",
                             "rope.base");
        expect_variant_error(op, "\"rope\":{\"base\":\"10000\"}", 400, "wrong_type", "rope.base");
        expect_variant_error(op, "\"rope\":{\"base\":1e39}", 400, "invalid_number", "rope.base");
        expect_variant_error(op, "\"rope\":{\"base\":0}", 422, "invalid_value", "rope.base");
        expect_variant_error(op, "\"rope\":{\"base\":-10000}", 422, "invalid_value", "rope.base");
        expect_variant_error(op, "\"rope\":{\"a\":1,\"b\":2,\"c\":3,\"d\":4,\"e\":5}", 400,
                             "unknown_field", "rope");
    }
}
END_TEST

START_TEST(error_rope_needs_even_d_k)
{
    /* attention: d_k = 3 */
    const char *att = "{\"q\":[[1,2,3]],\"k\":[[1,2,3]],\"v\":[[1]],\"rope\":{\"base\":100}}";
    expect_error(API_OP_ATTENTION, att, 422, "invalid_value", "rope");
    /* multihead: w_q [2, 6] over 2 heads gives d_k = 3 */
    const char *mh = "{\"x\":[[1,2]],\"w_q\":[[1,2,3,4,5,6],[1,2,3,4,5,6]],"
                     "\"w_k\":[[1,2,3,4,5,6],[1,2,3,4,5,6]],\"w_v\":[[1,2],[3,4]],"
                     "\"num_heads\":2,\"rope\":{\"base\":100}}";
    expect_error(API_OP_MULTIHEAD, mh, 422, "invalid_value", "rope");
    json_t *j = call(API_OP_MULTIHEAD, mh, strlen(mh), &LIM, 422);
    ck_assert_msg(strstr(error_message(j), "d_k is 3"), "%s", error_message(j));
    json_decref(j);
}
END_TEST

START_TEST(error_return_lse_is_a_boolean)
{
    for (int r = 0; r < 2; r++) {
        expect_variant_error(BOTH_ROUTES[r], "\"return_lse\":1", 400, "wrong_type", "return_lse");
        expect_variant_error(BOTH_ROUTES[r], "\"return_lse\":\"true\"", 400, "wrong_type",
                             "return_lse");
        expect_variant_error(BOTH_ROUTES[r], "\"return_lsee\":true", 400, "unknown_field",
                             "return_lsee");
    }
}
END_TEST

/* lse of an answer, read in encoding e with null (nested, flat) or -inf
 * (base64) for a row that sees no key: NULL and a failure otherwise. */
static float *get_lse(json_t *j, enc e, int rank, const int64_t *shape)
{
    ck_assert_ptr_nonnull(j);
    int64_t n = count_of(rank, shape);
    if (e == ENC_BASE64)
        return get_tensor(j, e, rank, shape); /* -inf travels as its bits */
    /* Replace each null by a marker number, read, then mark -inf. */
    json_t *copy = json_deep_copy(j);
    json_t *data = e == ENC_FLAT ? json_object_get(copy, "data") : copy;
    json_t *stack[8] = {data};
    size_t top = 1;
    while (top) {
        json_t *a = stack[--top];
        for (size_t i = 0; i < json_array_size(a); i++) {
            json_t *x = json_array_get(a, i);
            if (json_is_null(x))
                json_array_set_new(a, i, json_real(-7.25e30));
            else if (json_is_array(x) && top < 8)
                stack[top++] = x;
        }
    }
    float *out = get_tensor(copy, e, rank, shape);
    for (int64_t i = 0; i < n; i++)
        if (out[i] == -7.25e30f)
            out[i] = -INFINITY;
    json_decref(copy);
    return out;
}

/* One SDPA problem with every variant, sent through /v1/attention and run
 * through libattn directly with the same parameters. */
typedef struct {
    int rank;
    int64_t B, Hq, Hkv, nq, nk, dk, dv;
    bool causal, bool_mask;
    int64_t window[2]; /* window[0] < -1: no window */
    bool alibi, alibi_per_batch;
    float softcap, rope;
} variant_case;

static void check_attention_variants(const variant_case *vc, enc e)
{
    const int64_t B = vc->B, Hq = vc->Hq, Hkv = vc->Hkv, nq = vc->nq, nk = vc->nk;
    int skip = 4 - vc->rank;
    int64_t qs[4] = {B, Hq, nq, vc->dk}, ks[4] = {B, Hkv, nk, vc->dk}, vs[4] = {B, Hkv, nk, vc->dv},
            os[4] = {B, Hq, nq, vc->dv}, ws[4] = {B, Hq, nq, nk}, ms[2] = {nq, nk},
            as[2] = {B, Hq};
    int64_t nqe = B * Hq * nq * vc->dk, nke = B * Hkv * nk * vc->dk, nve = B * Hkv * nk * vc->dv,
            noe = B * Hq * nq * vc->dv, rows = B * Hq * nq;
    float *q = rnd_tensor(nqe), *k = rnd_tensor(nke), *v = rnd_tensor(nve),
          *dout = rnd_tensor(noe), *slopes = rnd_tensor(B * Hq);
    for (int64_t i = 0; i < B * Hq; i++)
        slopes[i] = fabsf(slopes[i]) * 0.5f;
    uint8_t *allowed = malloc((size_t)(nq * nk));
    for (int64_t i = 0; i < nq * nk; i++)
        allowed[i] = rnd() < 0.6f;
    if (nq > 3)
        memset(allowed + 3 * nk, 0, (size_t)nk); /* row 3: no key at all */

    sbuf b = {0};
    sb_printf(&b, "{\"return_lse\":true,\"return_weights\":true,\"return_stats\":true,"
                  "\"causal\":%s,\"output_encoding\":\"%s\"",
              vc->causal ? "true" : "false", ENC_NAME[e]);
    put_field(&b, "q", q, vc->rank, qs + skip, e);
    put_field(&b, "k", k, vc->rank, ks + skip, e);
    put_field(&b, "v", v, vc->rank, vs + skip, e);
    put_field(&b, "grad_output", dout, vc->rank, os + skip, e);
    if (vc->bool_mask) {
        sb_printf(&b, ",\"mask\":");
        put_tensor(&b, NULL, allowed, 2, ms, e);
    }
    if (vc->window[0] >= -1)
        sb_printf(&b, ",\"window\":[%lld,%lld]", (long long)vc->window[0],
                  (long long)vc->window[1]);
    if (vc->alibi)
        put_field(&b, "alibi_slopes", slopes, vc->alibi_per_batch ? 2 : 1,
                  vc->alibi_per_batch ? as : as + 1, e);
    if (vc->softcap > 0)
        sb_printf(&b, ",\"softcap\":%.9g", (double)vc->softcap);
    if (vc->rope > 0)
        sb_printf(&b, ",\"rope\":{\"base\":%.9g}", (double)vc->rope);
    sb_printf(&b, "}");
    json_t *j = call_ok(API_OP_ATTENTION, &b);

    attn_sdpa_params p = {
        .batch = B, .heads_q = Hq, .heads_kv = Hkv, .n_q = nq, .n_k = nk, .d_k = vc->dk,
        .d_v = vc->dv, .scale = attn_default_scale(vc->dk), .causal = vc->causal,
        .threads = LIM.threads,
        .variants = {.window = vc->window[0] >= -1, .window_left = vc->window[0],
                     .window_right = vc->window[1],
                     .alibi_slopes = vc->alibi ? slopes : NULL,
                     .alibi_batch_stride = vc->alibi_per_batch ? Hq : 0,
                     .softcap = vc->softcap, .rope_base = vc->rope},
    };
    if (vc->bool_mask) {
        p.mask = (attn_mask){.kind = ATTN_MASK_BOOL, .allowed = allowed};
        ck_assert_int_eq(attn_mask_broadcast(&p.mask, 2, ms, B, Hq, nq, nk, NULL), ATTN_OK);
    }
    float *out = malloc((size_t)noe * sizeof *out), *w = malloc((size_t)(rows * nk) * sizeof *w),
          *dq = malloc((size_t)nqe * sizeof *dq), *dk = malloc((size_t)nke * sizeof *dk),
          *dv = malloc((size_t)nve * sizeof *dv);
    attn_softmax_row *sm = malloc((size_t)rows * sizeof *sm);
    attn_stats st;
    ck_assert_int_eq(attn_sdpa_forward(&p, q, k, v, out, sm, w, &st, NULL), ATTN_OK);
    ck_assert_int_eq(attn_sdpa_backward(&p, q, k, v, out, sm, dout, dq, dk, dv, NULL), ATTN_OK);

    struct {
        const char *name;
        json_t *json;
        const float *want;
        const int64_t *shape;
        int64_t n;
    } parts[] = {
        {"output", json_object_get(j, "output"), out, os, noe},
        {"weights", json_object_get(j, "weights"), w, ws, rows * nk},
        {"grad.q", json_object_get(json_object_get(j, "grad"), "q"), dq, qs, nqe},
        {"grad.k", json_object_get(json_object_get(j, "grad"), "k"), dk, ks, nke},
        {"grad.v", json_object_get(json_object_get(j, "grad"), "v"), dv, vs, nve},
    };
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        float *got = get_tensor(parts[i].json, e, vc->rank, parts[i].shape + skip);
        assert_same_floats(parts[i].name, got, parts[i].want, parts[i].n);
        free(got);
    }
    /* lse: q's leading dimensions and n_q; -inf exactly where lib's row is empty */
    float *lse = get_lse(json_object_get(j, "lse"), e, vc->rank - 1, qs + skip);
    int64_t empty = 0;
    float *want_lse = malloc((size_t)rows * sizeof *want_lse);
    for (int64_t r = 0; r < rows; r++) {
        want_lse[r] = (float)attn_softmax_lse(sm[r]);
        empty += want_lse[r] == -INFINITY;
    }
    assert_same_floats("lse", lse, want_lse, rows);
    free(want_lse);
    if (vc->bool_mask && nq > 3)
        ck_assert_int_ge(empty, B * Hq);
    json_t *js = json_object_get(j, "stats");
    ck_close(json_number_value(json_object_get(json_object_get(js, "scores"), "mean")),
             st.scores_mean, 1e-12);
    ck_close(json_number_value(json_object_get(json_object_get(js, "scaled_scores"), "var")),
             st.scaled_var, 1e-12);
    ck_close(json_number_value(json_object_get(json_object_get(js, "entropy"), "min")),
             st.entropy_min, 1e-12);
    ck_close(json_number_value(json_object_get(json_object_get(js, "max_weight"), "mean")),
             st.max_weight_mean, 1e-12);
    /* meta.flops: the band the window leaves, with the backward's 2.5 */
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(j, "meta"), "flops")),
                     (json_int_t)(attn_sdpa_flops(&p) * 3.5));

    free(lse), free(q), free(k), free(v), free(dout), free(slopes), free(allowed), free(out);
    free(w), free(dq), free(dk), free(dv), free(sm), free(b.s);
    json_decref(j);
}

START_TEST(attention_variants_match_libattn_in_every_encoding)
{
    const variant_case cases[] = {
        /* rank 4, GQA, every variant with causal and a mask, across key tiles */
        {4, 2, 4, 2, 70, 150, 8, 4, true, true, {40, 0}, true, true, 3.0f, 500.0f},
        /* rank 3, window on both sides, ALiBi per head, no causal */
        {3, 1, 2, 1, 66, 130, 6, 3, false, true, {10, 5}, true, false, 0, 0},
        /* rank 2, rope and softcap alone; n_q > n_k (negative positions) */
        {2, 1, 1, 1, 90, 65, 4, 2, false, false, {-5, 0}, false, false, 1.5f, 10000.0f},
        /* rank 2: a window that leaves the first rows no key */
        {2, 1, 1, 1, 100, 66, 4, 2, false, false, {2, 2}, false, false, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_attention_variants(&cases[i], (enc)(i % 3));
}
END_TEST

/* An independent check of the window: [0, 0] leaves each query its own
 * key only (n_q = n_k), so the output is v, the weights the identity, the
 * lse the diagonal score, and the FLOPs those of n pairs. */
START_TEST(attention_window_0_0_is_the_diagonal)
{
    const char *body = "{\"q\":[[1,2],[3,4],[5,6]],\"k\":[[1,0],[0,1],[1,1]],"
                       "\"v\":[[1,2],[3,4],[5,6]],\"window\":[0,0],\"return_lse\":true,"
                       "\"return_weights\":true,\"scale\":0.5}";
    json_t *j = call(API_OP_ATTENTION, body, strlen(body), &LIM, 200);
    int64_t s2[2] = {3, 2}, s33[2] = {3, 3}, s3[1] = {3};
    float *o = get_tensor(json_object_get(j, "output"), ENC_NESTED, 2, s2);
    float *w = get_tensor(json_object_get(j, "weights"), ENC_NESTED, 2, s33);
    float *lse = get_lse(json_object_get(j, "lse"), ENC_NESTED, 1, s3);
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(o[i], (float)(i + 1));
    for (int i = 0; i < 9; i++)
        ck_assert_float_eq(w[i], i % 4 == 0 ? 1.0f : 0.0f);
    ck_assert_float_eq(lse[0], 0.5f);  /* 0.5 * (1*1 + 2*0) */
    ck_assert_float_eq(lse[1], 2.0f);  /* 0.5 * (3*0 + 4*1) */
    ck_assert_float_eq(lse[2], 5.5f);  /* 0.5 * (5 + 6) */
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(j, "meta"), "flops")),
                     2 * 3 * (2 + 2));
    free(o), free(w), free(lse);
    json_decref(j);
}
END_TEST

/* lse of rows that see no key, in each encoding: null in nested and flat
 * (JSON has no -inf), -inf in base64; shape q's leading dimensions + n_q. */
START_TEST(attention_lse_null_for_fully_masked_rows)
{
    for (int e = 0; e < 3; e++) {
        /* row 0: the mask hides everything; row 1: causal and the mask leave key 0 */
        char body[400];
        snprintf(body, sizeof body,
                 "{\"q\":[[[1,0],[0,1]]],\"k\":[[[1,0],[0,1]]],\"v\":[[[1,2],[3,4]]],"
                 "\"mask\":[[false,false],[true,false]],\"causal\":true,\"scale\":1,"
                 "\"return_lse\":true,\"output_encoding\":\"%s\"}", ENC_NAME[e]);
        json_t *j = call(API_OP_ATTENTION, body, strlen(body), &LIM, 200);
        json_t *l = json_object_get(j, "lse");
        int64_t shape[2] = {1, 2};
        if (e == ENC_NESTED) {
            ck_assert(json_is_null(json_array_get(json_array_get(l, 0), 0)));
        } else if (e == ENC_FLAT) {
            ck_assert(json_is_null(json_array_get(json_object_get(l, "data"), 0)));
            ck_assert_int_eq(json_array_size(json_object_get(l, "shape")), 2);
        }
        float *lse = get_lse(l, (enc)e, 2, shape);
        ck_assert(isinf(lse[0]) && lse[0] < 0);
        ck_assert_float_eq(lse[1], 0.0f); /* one key, score 0 * 1 */
        free(lse);
        json_decref(j);
    }
}
END_TEST

START_TEST(attention_lse_shape_is_leading_dims_and_n_q)
{
    const char *bodies[] = {
        "{\"q\":[[1,0],[0,1],[1,1]],\"k\":[[1,0]],\"v\":[[1]],\"return_lse\":true}",
        "{\"q\":[[[1,0],[0,1],[1,1]]],\"k\":[[[1,0]]],\"v\":[[[1]]],\"return_lse\":true}",
        ("{\"q\":[[[[1,0],[0,1],[1,1]]],[[[1,0],[0,1],[1,1]]]],\"k\":[[[[1,0]]],[[[1,0]]]],"
         "\"v\":[[[[1]]],[[[1]]]],\"return_lse\":true,\"output_encoding\":\"flat\"}"),
    };
    for (int i = 0; i < 3; i++) {
        json_t *j = call(API_OP_ATTENTION, bodies[i], strlen(bodies[i]), &LIM, 200);
        json_t *l = json_object_get(j, "lse");
        if (i < 2) {
            json_t *x = l;
            for (int d = 0; d < i; d++) {
                ck_assert_int_eq(json_array_size(x), 1);
                x = json_array_get(x, 0);
            }
            ck_assert_int_eq(json_array_size(x), 3);
            ck_assert(json_is_number(json_array_get(x, 2)));
        } else {
            json_t *sh = json_object_get(l, "shape");
            ck_assert_int_eq(json_array_size(sh), 3);
            ck_assert_int_eq(json_integer_value(json_array_get(sh, 0)), 2);
            ck_assert_int_eq(json_integer_value(json_array_get(sh, 1)), 1);
            ck_assert_int_eq(json_integer_value(json_array_get(sh, 2)), 3);
        }
        json_decref(j);
    }
    const char *none = "{\"q\":[[1,0]],\"k\":[[1,0]],\"v\":[[1]],\"return_lse\":false}";
    json_t *j = call(API_OP_ATTENTION, none, strlen(none), &LIM, 200);
    ck_assert_ptr_null(json_object_get(j, "lse"));
    json_decref(j);
}
END_TEST

/* Multi-head: the variants per head after the projections, against
 * attn_mha_forward_backward with the same parameters; lse [B?, h, n]. */
static void check_multihead_variants(int rank, enc e, bool per_batch_slopes)
{
    mha_case c = {.B = rank == 3 ? 2 : 1, .n = 70, .m = 90, .d_model = 8, .d_ctx = 6, .h = 4,
                  .h_kv = 2, .d_k = 4, .d_v = 3, .d_out = 5, .cross = true, .has_wo = true,
                  .biases = true, .causal = true};
    mha_data d = mha_make(&c);
    float *slopes = rnd_tensor(c.B * c.h), *dout = rnd_tensor(c.B * c.n * c.d_out);
    int64_t as[2] = {c.B, c.h}, os[3] = {c.B, c.n, c.d_out}, ls[3] = {c.B, c.h, c.n};
    int skip = 3 - rank;
    sbuf b = {0};
    mha_body(&b, &c, &d, e, rank);
    put_field(&b, "alibi_slopes", slopes, per_batch_slopes ? 2 : 1,
              per_batch_slopes ? as : as + 1, e);
    put_field(&b, "grad_output", dout, rank, os + skip, e);
    sb_printf(&b, ",\"window\":[30,2],\"softcap\":2.5,\"rope\":{\"base\":100},"
                  "\"return_lse\":true,\"return_stats\":true,\"output_encoding\":\"%s\"}",
              ENC_NAME[e]);
    json_t *j = call_ok(API_OP_MULTIHEAD, &b);

    attn_mha_params p = {
        .batch = c.B, .n = c.n, .m = c.m, .d_model = c.d_model, .d_ctx = c.d_ctx, .heads = c.h,
        .kv_heads = c.h_kv, .d_k = c.d_k, .d_v = c.d_v, .d_out = c.d_out,
        .scale = attn_default_scale(c.d_k), .causal = true, .threads = LIM.threads,
        .variants = {.window = true, .window_left = 30, .window_right = 2,
                     .alibi_slopes = slopes, .alibi_batch_stride = per_batch_slopes ? c.h : 0,
                     .softcap = 2.5f, .rope_base = 100.0f},
    };
    attn_mha_inputs in = {.x = d.x, .context = d.ctx, .w_q = d.w_q, .w_k = d.w_k, .w_v = d.w_v,
                          .w_o = d.w_o, .b_q = d.b_q, .b_k = d.b_k, .b_v = d.b_v, .b_o = d.b_o};
    int64_t rows = c.B * c.h * c.n;
    float *out = malloc((size_t)(c.B * c.n * c.d_out) * sizeof *out);
    float *gx = malloc((size_t)(c.B * c.n * c.d_model) * sizeof *gx);
    float *gwk = malloc((size_t)(c.d_ctx * c.h_kv * c.d_k) * sizeof *gwk);
    attn_softmax_row *sm = malloc((size_t)rows * sizeof *sm);
    attn_stats st;
    attn_mha_grads g = {.x = gx, .w_k = gwk};
    ck_assert_int_eq(attn_mha_forward_backward(&p, &in, out, sm, NULL, &st, dout, &g, NULL),
                     ATTN_OK);
    float *o = get_tensor(json_object_get(j, "output"), e, rank, os + skip);
    assert_close_floats("output", o, out, c.B * c.n * c.d_out, 1e-6);
    int64_t xs[3] = {c.B, c.n, c.d_model}, wks[2] = {c.d_ctx, c.h_kv * c.d_k};
    json_t *grad = json_object_get(j, "grad");
    float *ggx = get_tensor(json_object_get(grad, "x"), e, rank, xs + skip);
    float *ggw = get_tensor(json_object_get(grad, "w_k"), e, 2, wks);
    assert_close_floats("grad.x", ggx, gx, c.B * c.n * c.d_model, 1e-5);
    assert_close_floats("grad.w_k", ggw, gwk, c.d_ctx * c.h_kv * c.d_k, 1e-5);
    /* lse within 1e-6 relative; -inf exactly where libattn's row is empty */
    float *lse = get_lse(json_object_get(j, "lse"), e, rank, ls + skip);
    worst_elem wl = {0};
    for (int64_t r = 0; r < rows; r++) {
        double want = attn_softmax_lse(sm[r]);
        worst_note(&wl, r, lse[r], want,
                   isfinite(want) ? rel1_err(lse[r], want) : exact_err(lse[r], want));
    }
    ck_assert_msg(wl.err <= 1e-6, "lse[%lld] %.9g, libattn %.9g", wl.at, wl.got, wl.want);
    json_t *js = json_object_get(j, "stats");
    ck_close(json_number_value(json_object_get(json_object_get(js, "scaled_scores"), "mean")),
             st.scaled_mean, 1e-6);
    ck_close(json_number_value(json_object_get(json_object_get(js, "entropy"), "mean")),
             st.entropy_mean, 1e-6);
    free(o), free(ggx), free(ggw), free(lse), free(out), free(gx), free(gwk), free(sm);
    free(slopes), free(dout), free(b.s);
    mha_free(&d);
    json_decref(j);
}

START_TEST(multihead_variants_per_head_match_libattn)
{
    check_multihead_variants(3, ENC_NESTED, true);
    check_multihead_variants(2, ENC_FLAT, false);
    check_multihead_variants(3, ENC_BASE64, false);
}
END_TEST

/* A window that leaves a query no key: its lse is null / -inf, per head. */
START_TEST(multihead_lse_null_for_rows_a_window_empties)
{
    for (int e = 0; e < 3; e++) {
        char body[600];
        /* n = 3 queries, m = 1 key: positions p_i = i - 2, window [0, 0]
         * leaves only query 2 (p = 0) its key */
        snprintf(body, sizeof body,
                 "{\"x\":[[1,0],[0,1],[1,1]],\"context\":[[1,2]],\"w_q\":[[1,0],[0,1]],"
                 "\"w_k\":[[1,0],[0,1]],\"w_v\":[[1,0],[0,1]],\"num_heads\":2,"
                 "\"window\":[0,0],\"return_lse\":true,\"output_encoding\":\"%s\"}",
                 ENC_NAME[e]);
        json_t *j = call(API_OP_MULTIHEAD, body, strlen(body), &LIM, 200);
        int64_t ls[2] = {2, 3};
        float *lse = get_lse(json_object_get(j, "lse"), (enc)e, 2, ls);
        for (int h = 0; h < 2; h++) {
            ck_assert(lse[h * 3] == -INFINITY && lse[h * 3 + 1] == -INFINITY);
            /* head h of query 2 is x[2][h] * context[0][h] = 1 * (h + 1), scale 1 (d_k = 1) */
            ck_assert_float_eq(lse[h * 3 + 2], (float)(h + 1));
        }
        free(lse);
        json_decref(j);
    }
}
END_TEST

/* A request over --max-request-memory whose largest part is the
 * operation's workspace: the message names it, with the shapes that make it
 * (the text is written only for this message, not for every request). */
START_TEST(memory_limit_names_the_workspace_and_its_shapes)
{
    enum { N = 2048, D = 64 };
    float *x = malloc(sizeof(float) * N * D), *w = malloc(sizeof(float) * D * D);
    for (int i = 0; i < N * D; i++)
        x[i] = 0.01f * (float)(i % 7);
    for (int i = 0; i < D * D; i++)
        w[i] = 0.01f * (float)(i % 5);
    const int64_t sx[] = {1, N, D}, sw[] = {D, D};
    sbuf b = {0};
    sb_printf(&b, "{");
    put_field(&b, "x", x, 3, sx, ENC_BASE64);
    put_field(&b, "w_q", w, 2, sw, ENC_BASE64);
    put_field(&b, "w_k", w, 2, sw, ENC_BASE64);
    put_field(&b, "w_v", w, 2, sw, ENC_BASE64);
    sb_printf(&b, ",\"num_heads\":8,\"output_encoding\":\"base64\"}");
    api_limits lim = LIM;
    lim.max_memory = 1024.0 * 1024.0;
    json_t *j = call(API_OP_MULTIHEAD, b.s, b.len, &lim, 422);
    json_t *e = json_object_get(j, "error");
    ck_assert_str_eq(json_string_value(json_object_get(e, "code")), "memory_limit");
    const char *msg = json_string_value(json_object_get(e, "message"));
    ck_assert_msg(strstr(msg, "the largest part is the projections of 8 heads (q [1, 2048, 64], "
                             "k and v [1, 2048, 64]) and the attention's tiles"),
                  "%s", msg);
    json_decref(j);
    free(x), free(w), free(b.s);
}
END_TEST

static Suite *api_suite(void)
{
    Suite *s = suite_create("api");
    /* The cases tagged "kernel" check numbers libattn's kernel computed, or
     * time them: make test runs them once per kernel (tests/run-suites.sh).
     * The errors are found before any kernel runs. */
    TCase *ok = tcase_create("attention");
    tcase_set_tags(ok, "kernel");
    tcase_set_timeout(ok, 60);
    tcase_add_test(ok, attention_rank2_nested_matches_reference);
    tcase_add_test(ok, attention_rank3_is_heads_times_positions);
    tcase_add_test(ok, attention_rank4_grouped_query_heads);
    tcase_add_test(ok, attention_multi_query_single_kv_head);
    tcase_add_test(ok, attention_causal_bottom_right_when_nq_lt_nk);
    tcase_add_test(ok, attention_causal_square_rank4);
    tcase_add_test(ok, attention_every_encoding_in_and_out);
    tcase_add_test(ok, attention_weights_rows_sum_to_one_and_causal_zeros);
    tcase_add_test(ok, attention_bool_mask_broadcasts_numpy_style);
    tcase_add_test(ok, attention_bias_mask_is_added_to_scaled_scores);
    tcase_add_test(ok, attention_explicit_scale_is_used);
    tcase_add_test(ok, attention_null_optional_fields_mean_default);
    tcase_add_test(ok, attention_fully_masked_row_gives_zeros);
    tcase_add_test(ok, attention_stats_match_reference);
    tcase_add_test(ok, attention_stats_null_when_everything_masked);
    tcase_add_test(ok, attention_grad_matches_finite_differences_and_libattn);
    tcase_add_test(ok, attention_meta_names_dims_flops_and_timing);
    tcase_add_test(ok, meta_and_stats_follow_the_contract);
    tcase_add_test(ok, attention_response_numbers_round_trip_float32);
    tcase_add_test(ok, attention_scores_of_1e4_give_exact_one_hot);
    tcase_add_test(ok, attention_values_near_float32_max_average_without_overflow);
    suite_add_tcase(s, ok);

    TCase *mh = tcase_create("multihead");
    tcase_set_tags(mh, "kernel");
    tcase_set_timeout(mh, 60);
    tcase_add_test(mh, multihead_self_attention_heads_concatenated);
    tcase_add_test(mh, multihead_output_projection_and_biases);
    tcase_add_test(mh, multihead_cross_attention_from_context);
    tcase_add_test(mh, multihead_grouped_kv_heads_and_causal);
    tcase_add_test(mh, multihead_weights_mean_is_head_average);
    tcase_add_test(mh, multihead_explicit_scale_is_used);
    tcase_add_test(mh, multihead_stats_over_every_head);
    tcase_add_test(mh, multihead_integral_num_heads_and_null_defaults);
    tcase_add_test(mh, multihead_mask_broadcasts_to_batch_heads);
    tcase_add_test(mh, multihead_grad_has_a_key_per_given_input);
    tcase_add_test(mh, multihead_grad_self_attention_without_optional_inputs);
    suite_add_tcase(s, mh);

    TCase *er = tcase_create("errors");
    tcase_set_timeout(er, 120);
    tcase_add_test(er, error_invalid_json_is_400);
    tcase_add_test(er, memory_limit_names_the_workspace_and_its_shapes);
    tcase_add_test(er, invalid_json_hint_is_at_the_place_of_the_fault);
    tcase_add_test(er, error_body_not_an_object);
    tcase_add_test(er, error_duplicate_key);
    tcase_add_test(er, error_unknown_field_casual_suggests_causal);
    tcase_add_test(er, error_type_comes_before_shape);
    tcase_add_test(er, output_dtype_half_precision);
    tcase_add_test(er, output_dtype_errors);
    tcase_add_test(er, attention_bfloat16_is_libattns_bits);
    tcase_add_test(er, attention_bfloat16_inputs_stay_words_with_the_same_bits);
    tcase_add_test(er, multihead_bfloat16_is_libattns_bits);
    tcase_add_test(er, precision_errors_and_default);
    tcase_add_test(er, error_missing_required_field);
    tcase_add_test(er, error_wrong_types);
    tcase_add_test(er, error_number_not_finite_as_float32);
    tcase_add_test(er, error_base64_input_names_the_first_non_finite_element);
    tcase_add_test(er, error_ragged_array);
    tcase_add_test(er, error_rank_outside_2_to_4);
    tcase_add_test(er, error_empty_dimension);
    tcase_add_test(er, error_ranks_differ);
    tcase_add_test(er, error_mismatched_d_k_names_both);
    tcase_add_test(er, error_heads_do_not_divide);
    tcase_add_test(er, error_num_heads_below_one);
    tcase_add_test(er, error_multihead_shapes_do_not_fit);
    tcase_add_test(er, error_mask_does_not_broadcast);
    tcase_add_test(er, error_grad_output_wrong_shape);
    tcase_add_test(er, error_work_limit_compares_the_whole_cost);
    tcase_add_test(er, error_overflowing_mask_is_blamed_on_the_mask);
    tcase_add_test(er, error_response_too_large_is_refused_before_computing);
    tcase_add_test(er, error_bad_output_encoding);
    tcase_add_test(er, error_scale_not_positive);
    tcase_add_test(er, error_numerical_overflow_not_nan);
    tcase_add_test(er, output_check_names_the_first_non_finite_element);
    tcase_add_test(er, error_too_many_fields);
    tcase_add_test(er, error_object_built_in_one_place);
    tcase_add_test(er, error_body_reads_back_as_the_members_given);
    tcase_add_test(er, jsontestsuite_n_files_give_400);
    tcase_add_test(er, jansson_out_of_memory_gives_500_never_broken_json);
    tcase_add_test(er, unknown_operation_is_404);
    tcase_add_test(er, openapi_document_is_embedded);
    suite_add_tcase(s, er);

    TCase *va = tcase_create("variants");
    tcase_set_tags(va, "kernel");
    tcase_set_timeout(va, 60);
    tcase_add_test(va, error_window_type_then_range);
    tcase_add_test(va, integers_are_judged_on_their_digits);
    tcase_add_test(va, window_unbounded_both_sides_is_no_window);
    tcase_add_test(va, error_window_message_names_the_side);
    tcase_add_test(va, error_alibi_slopes_shape_and_values);
    tcase_add_test(va, error_alibi_slopes_message_gives_both_forms);
    tcase_add_test(va, error_softcap_not_positive);
    tcase_add_test(va, error_rope_is_an_object_with_one_base);
    tcase_add_test(va, error_rope_needs_even_d_k);
    tcase_add_test(va, error_return_lse_is_a_boolean);
    tcase_add_test(va, attention_variants_match_libattn_in_every_encoding);
    tcase_add_test(va, attention_window_0_0_is_the_diagonal);
    tcase_add_test(va, attention_lse_null_for_fully_masked_rows);
    tcase_add_test(va, attention_lse_shape_is_leading_dims_and_n_q);
    tcase_add_test(va, multihead_variants_per_head_match_libattn);
    tcase_add_test(va, multihead_lse_null_for_rows_a_window_empties);
    suite_add_tcase(s, va);

    TCase *turns = tcase_create("caches");
    tcase_add_test(turns, cache_step_failing_after_its_turn_gives_the_turn_back);
    suite_add_tcase(s, turns);
    TCase *cost = tcase_create("cost");
    tcase_set_tags(cost, "kernel");
    tcase_set_timeout(cost, 120);
    tcase_add_test(cost, work_counts_what_flops_do_not);
    tcase_add_test(cost, work_bounds_time_across_request_shapes);
    tcase_add_test(cost, heavy_requests_of_few_flops_are_refused_or_as_fast_as_their_work);
    tcase_add_test(cost, response_estimate_bounds_the_answer);
    suite_add_tcase(s, cost);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(api_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
