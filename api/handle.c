/*
 * The one handler both compute routes share: decode -> validate -> cost ->
 * compute -> encode. An operation (attention.c, multihead.c) brings its
 * field table and the steps that differ; the sequence, the limits, the
 * results' allocation and finiteness, the statistics' overflow, the release
 * of the inputs and the writing of the answer are here, once.
 *
 * api_prepare runs the first three steps and api_execute the last two, so
 * that the server can decide from the cost whether to compute a request at
 * once, queue it, or refuse it.
 */
#include "request.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
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

/* The body must be one JSON object: the fields are its members, whose
 * places the validator notes on its way (spans, API_MAX_FIELDS of them),
 * with the rows of the tensors among them. */
bool api_check_body(codec_doc *doc, const char *body, size_t len, codec_span *spans,
                    api_error *err)
{
    codec_error ce;
    if (!codec_doc_validate(doc, body, len, spans, API_MAX_FIELDS, &ce)) {
        api_fail_codec(err, &ce);
        /* where the text stopped being JSON, to say what it looks like */
        if (ce.kind == CODEC_ERR_SYNTAX)
            api_hint_not_json(body, len, ce.offset, err);
        return false;
    }
    const char *first = codec_skip_ws(body, body + len);
    if (first < body + len && *first != '{')
        return api_fail(err, 400, "wrong_type", "",
                        "the request body must be a JSON object of fields, "
                        "e.g. {\"q\": ..., \"k\": ..., \"v\": ...}");
    return true;
}

/* The codec's instruction sets follow libattn's kernel when ATTN_KERNEL
 * chose it, so that the suites run once per kernel run each of the codec's
 * paths too; otherwise the codec uses the widest this CPU runs. */
static void match_codec_to_kernel(void)
{
    static const codec_simd for_kernel[] = {
        [ATTN_KERNEL_GENERIC] = CODEC_SIMD_PORTABLE,
        [ATTN_KERNEL_AVX2] = CODEC_SIMD_AVX2,
        [ATTN_KERNEL_AVX512] = CODEC_SIMD_AVX512,
    };
    if (attn_kernel_forced())
        codec_set_simd(for_kernel[attn_kernel()]);
}

void api_codec_setup(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, match_codec_to_kernel);
}

double api_total_ms(const api_timing *t)
{
    double ms = t->arrival > 0 ? t->mark - t->arrival
                               : t->decode_ms + t->compute_ms + t->encode_ms;
    return ms > 0 ? round(ms * 1e3) / 1e3 : 0;
}

/* The error answer, in the form of the protocol the request came in. */
static void respond_error(api_response *res, api_error *err, bool oip)
{
    if (err->status < 400 || err->status > 599 || !err->code[0])
        api_fail(err, 500, "internal", "", "internal error (no error recorded)");
    res->status = err->status;
    snprintf(res->error_code, sizeof res->error_code, "%s", err->code);
    res->body = oip ? api_error_json_oip(err, &res->body_len) : api_error_json(err, &res->body_len);
    res->body_cap = res->body ? res->body_len + 1 : 0;
    /* Every 503 is a moment's shortage (a full queue, caches all in use). */
    res->retry_after = res->status == 503 ? 1 : 0;
    if (!res->body) {
        /* Not even the error object could be built: say so in the status. */
        res->status = 500;
        res->body_len = 0;
    }
}

void api_respond_error(api_response *res, api_error *err)
{
    respond_error(res, err, false);
}

static void timings(api_response *res, const api_timing *t)
{
    res->decode_ms = t->decode_ms;
    res->compute_ms = t->compute_ms;
    res->encode_ms = t->encode_ms;
    res->total_ms = api_total_ms(t);
}

/* ---------------------------------------------------------------- plans */

int api_plan(api_call *c, const char *name, bool in_grad, const char *what, int rank,
             const int64_t *shape)
{
    api_result *r = &c->results[c->n_results];
    *r = (api_result){.name = name, .in_grad = in_grad, .what = what, .rank = rank,
                      .count = 1};
    for (int i = 0; i < rank; i++) {
        r->shape[i] = shape[i];
        r->count *= shape[i];
    }
    return c->n_results++;
}

const float *api_field_data(const api_call *c, int field)
{
    return c->f[field].present ? c->f[field].tensor.f32 : NULL;
}

size_t api_call_input_bytes(const api_call *c)
{
    size_t bytes = 0;
    for (size_t f = 0; f < c->op->n_fields; f++) {
        const codec_tensor *t = &c->f[f].tensor;
        if (c->f[f].present)
            bytes += (size_t)t->count * (t->f32 != NULL    ? sizeof *t->f32
                                         : t->bf16 != NULL ? sizeof *t->bf16
                                         : t->b8 != NULL   ? sizeof *t->b8
                                                           : 0);
    }
    return bytes;
}

void api_call_free(api_call *c)
{
    if (!c)
        return;
    if (c->op->release)
        c->op->release(c);
    api_values_free(c->f, c->op->n_fields);
    for (int i = 0; i < c->n_results; i++)
        api_free_floats(c->results[i].data);
    api_oip_free(c->oip);
    codec_tensor_release(c); /* and its state, in the same block */
}

/* The state's place after the call, aligned for anything. */
#define STATE_OFFSET \
    ((sizeof(api_call) + _Alignof(max_align_t) - 1) / _Alignof(max_align_t) * \
     _Alignof(max_align_t))

/* A call and its operation's state in one block, zeroed but for the parts
 * of the call's arrays that are written before they are read (a calloc of
 * the whole was 6 KB of zeroes for every request). The block is the API's
 * allocator's (api_set_allocator), as the tensors are: the server's pool
 * keeps it for the thread's next request. */
static api_call *call_new(const api_operation *o, const api_limits *lim)
{
    api_call *c = codec_tensor_alloc(STATE_OFFSET + o->state_size);
    if (!c)
        return NULL;
    memset(c, 0, offsetof(api_call, results));
    memset(c->f, 0, o->n_fields * sizeof c->f[0]);
    c->op = o;
    c->lim = *lim;
    c->state = (char *)c + STATE_OFFSET;
    memset(c->state, 0, o->state_size);
    return c;
}

/* ------------------------------------------------------ decode .. cost */

/* The stats and meta objects and the keys of the answer: under this. */
#define ANSWER_FRAME_BYTES 2048

#define MiB (1024.0 * 1024.0)

static bool check_cost(api_call *c, size_t body_len, api_error *err)
{
    const api_limits *lim = &c->lim;
    api_cost_terms terms = {0};
    c->op->cost(c, &terms);
    double numbers = 0, bytes = ANSWER_FRAME_BYTES;
    for (int i = 0; i < c->n_results; i++) {
        const api_result *r = &c->results[i];
        numbers += (double)r->count;
        bytes += api_encoded_bytes(r->rank, r->shape, c->enc) + 8 + strlen(r->name);
    }
    /* Memory: the body and the inputs decoded from it are held while the
     * results are computed (with libattn's workspaces); then the inputs
     * and workspaces go, and the answer's text grows as the results are
     * written into it. The peak is the larger of the two moments. */
    double inputs = 0, results = 0;
    for (size_t i = 0; i < c->op->n_fields; i++) {
        const codec_tensor *t = &c->f[i].tensor;
        inputs += t->f32 ? 4.0 * (double)t->count : t->b8 ? (double)t->count : 0;
    }
    for (int i = 0; i < c->n_results; i++)
        results += 4.0 * (double)c->results[i].count;
    double computing = inputs + results + terms.workspace;
    double memory = (double)body_len + fmax(computing, results + bytes);
    /* The backward pass does five products to the forward's two. */
    c->cost = (api_cost){
        .flops = terms.flops * (c->want_grad ? 3.5 : 1.0),
        .work = api_compute_work(&terms, c->want_stats, c->want_grad) +
                api_encode_work(numbers, c->enc) + api_decode_work(body_len),
        .response_bytes = bytes,
        .memory = memory,
    };
    if (lim->max_response > 0 && bytes > lim->max_response)
        return api_fail(err, 422, "response_too_large", "",
                        "the answer could take %.4g bytes (%.4g numbers), more than this "
                        "server's limit of %.4g bytes for one response (--max-response); "
                        "ask for less (without return_weights, a smaller batch) or use "
                        "\"output_encoding\": \"base64\"",
                        bytes, numbers, lim->max_response);
    /* Then memory, before time: what a request would hold is judged before
     * how long it takes (a server can be probed for what it admits, with
     * --max-work 1, without computing anything). */
    if (lim->max_memory > 0 && memory > lim->max_memory) {
        /* Name the largest part: what to change. */
        if (c->op->workspace_what)
            c->op->workspace_what(c, terms.workspace_what, sizeof terms.workspace_what);
        const char *why = terms.workspace_what;
        double part = terms.workspace;
        if (results > part) {
            why = "the results (with return_weights, every weight)";
            part = results;
        }
        if (inputs + (double)body_len > part) {
            why = "the request body and its decoded inputs";
            part = inputs + (double)body_len;
        }
        if (bytes > part) {
            why = "the answer's text";
            part = bytes;
        }
        return api_fail(err, 422, "memory_limit", "",
                        "this request needs about %.0f MiB of memory at its peak, more "
                        "than this server's limit of %.0f MiB for one request "
                        "(--max-request-memory); the largest part is %s, %.0f MiB "
                        "(inputs %.0f MiB, results %.0f MiB, workspaces %.0f MiB, answer "
                        "%.0f MiB); send smaller tensors or split the batch",
                        memory / MiB, lim->max_memory / MiB, why, part / MiB, inputs / MiB,
                        results / MiB, terms.workspace / MiB, bytes / MiB);
    }
    if (lim->max_work > 0 && c->cost.work > lim->max_work)
        return api_fail(err, 422, "work_limit", "",
                        "this request needs %.4g units of work (%.4g FLOPs of products, "
                        "the rest for its heads, rows, scores and the numbers of its "
                        "answer), more than this server's limit of %.4g (--max-work); "
                        "send smaller tensors or split the batch",
                        c->cost.work, c->cost.flops, lim->max_work);
    const char *blame = "the inputs";
    double bound = c->op->score_bound(c, &blame);
    return api_check_score_bound(bound, blame, err);
}

static const api_operation *operation(api_op op)
{
    switch (op) {
    case API_OP_ATTENTION: return &api_attention_op;
    case API_OP_MULTIHEAD: return &api_multihead_op;
    case API_OP_CACHE_ATTENTION: return &api_cache_attention_op;
    }
    return NULL;
}

/* The fields of a /v1 body: its members against the operation's table. */
static bool read_v1(api_call *c, const char *body, size_t len, api_error *err)
{
    const api_operation *o = c->op;
    codec_span spans[API_MAX_FIELDS];
    codec_doc doc; /* filled by check_body whatever it finds */
    bool ok = api_check_body(&doc, body, len, spans, err) &&
              api_read_fields(&doc, o->fields, o->n_fields, o->other->fields,
                              o->other->n_fields, o->other->route, c->f, err);
    codec_doc_free(&doc);
    return ok;
}

/* Both protocols: read the fields (as /v1 has them, or from an Open
 * Inference Protocol request), then the same validation and cost. */
static api_call *prepare(api_op op, const char *body, size_t len, bool oip,
                         const char *json_length, const api_limits *lim, api_cost *cost,
                         api_response *res)
{
    api_codec_setup();
    memset(res, 0, sizeof *res);
    api_error err = {0};
    api_timing t = {.arrival = lim->arrival_ms, .mark = api_now_ms()};
    const api_operation *o = operation(op);
    api_call *c = o ? call_new(o, lim) : NULL;
    bool ok;
    if (!o)
        ok = api_fail(&err, 404, "not_found", "", "unknown operation %d", (int)op);
    else if (!c)
        ok = api_fail(&err, 500, "out_of_memory", "", "out of memory for this request");
    else if (!body && len > 0)
        ok = api_fail(&err, 500, "internal", "", "no request body given");
    else if (oip)
        ok = api_oip_read(c, body ? body : "", len, json_length, &err);
    else
        ok = read_v1(c, body ? body : "", len, &err);
    if (ok) {
        c->want_stats = c->f[o->f_return_stats].present && c->f[o->f_return_stats].flag;
        c->want_grad = c->f[o->f_grad_output].present;
        ok = (oip || api_output_encoding(&c->f[o->f_output_encoding],
                                         &c->f[o->f_output_dtype], &c->enc, &err)) &&
             o->validate(c, &err) && (!oip || api_oip_plan(c, &err)) &&
             check_cost(c, len, &err);
    }
    api_lap(&t, &t.decode_ms);
    if (!ok) {
        api_call_free(c);
        timings(res, &t);
        respond_error(res, &err, oip);
        return NULL;
    }
    c->t = t;
    if (cost)
        *cost = c->cost;
    return c;
}

api_call *api_prepare(api_op op, const char *body, size_t len, const api_limits *lim,
                      api_cost *cost, api_response *res)
{
    return prepare(op, body, len, false, NULL, lim, cost, res);
}

api_call *api_prepare_oip(api_op op, const char *body, size_t len, const char *json_length,
                          const api_limits *lim, api_cost *cost, api_response *res)
{
    return prepare(op, body, len, true, json_length, lim, cost, res);
}

/* ------------------------------------------------------ compute, encode */

/* The first block of the answer's buffer: a small answer (n = d = 4 is
 * about 450 bytes) fits it without growing; larger tensors reserve their
 * room in one step when they are written. */
#define FIRST_BLOCK 1024
/* An answer that could be larger than this gets its whole room at once, the
 * cost's bound on its size: grown by doubling, a 45 MB answer went through
 * blocks of 256 KiB to 64 MiB, each copied into the next, and with the
 * allocator's pool keeping them all for the next answer. Untouched pages of
 * an over-estimate cost address space only. */
#define WHOLE_ROOM (64 * 1024)

static bool compute(api_call *c, int threads, api_error *err)
{
    for (int i = 0; i < c->n_results; i++)
        if (!(c->results[i].data = api_alloc_floats(c->results[i].count)))
            return api_fail(err, 500, "out_of_memory", "",
                            "out of memory for %s of this request", c->results[i].what);
    if (!c->op->compute(c, threads < 1 ? 1 : threads, err))
        return false;
    for (int i = 0; i < c->n_results; i++) {
        const api_result *r = &c->results[i];
        if (!(r->empty_rows ? api_check_lse(r->data, r->count, r->what, c->enc, err)
                            : api_check_output(r->data, r->count, r->what, c->enc, err)))
            return false;
    }
    const attn_stats *s = &c->stats;
    if (c->want_stats && !(isfinite(s->scores_mean) && isfinite(s->scores_var) &&
                           isfinite(s->scaled_mean) && isfinite(s->scaled_var)))
        return api_fail(err, 422, "numerical_overflow", "",
                        "the score statistics overflow; the inputs are too large in "
                        "magnitude, scale them down");
    return true;
}

/* Writes `"name":tensor` and frees the tensor: the text now holds it. */
static void emit(codec_buf *b, api_result *r, codec_encoding enc, bool first)
{
    if (!first)
        codec_buf_append(b, ",", 1);
    codec_buf_append(b, "\"", 1);
    codec_buf_puts(b, r->name);
    codec_buf_append(b, "\":", 2);
    codec_tensor_encode(b, r->data, r->rank, r->shape, enc);
    api_free_floats(r->data);
    r->data = NULL;
}

static void encode(api_call *c, codec_buf *b)
{
    codec_buf_puts(b, "{");
    bool first = true, grads = false;
    for (int i = 0; i < c->n_results; i++) {
        if (c->results[i].in_grad) {
            grads = true;
            continue;
        }
        emit(b, &c->results[i], c->enc, first);
        first = false;
    }
    if (grads) {
        codec_buf_puts(b, ",\"grad\":{");
        first = true;
        for (int i = 0; i < c->n_results; i++)
            if (c->results[i].in_grad) {
                emit(b, &c->results[i], c->enc, first);
                first = false;
            }
        codec_buf_puts(b, "}");
    }
    if (c->want_stats)
        api_write_stats(b, &c->stats);
    if (c->op->write_extra)
        c->op->write_extra(c, b);
    api_dim dims[16];
    size_t n_dims = c->op->dims(c, dims);
    api_write_meta(b, dims, n_dims, &c->cost, &c->t);
    codec_buf_puts(b, "}");
}

bool api_execute_now(api_call *c, int threads, api_response *res)
{
    if (c->op->hold_now && !c->op->hold_now(c))
        return false;
    api_execute(c, threads, res);
    return true;
}

void api_execute(api_call *c, int threads, api_response *res)
{
    memset(res, 0, sizeof *res);
    api_error err = {0};
    c->t.mark = api_now_ms();
    bool ok = compute(c, threads, &err);
    /* The inputs are not needed any more: only the answer is held now. */
    if (c->op->release)
        c->op->release(c);
    api_values_free(c->f, c->op->n_fields);
    api_lap(&c->t, &c->t.compute_ms);
    /* The answer comes from the allocator of the tensors (api_set_allocator):
     * its size follows theirs. */
    size_t room = FIRST_BLOCK;
    if (c->cost.response_bytes > WHOLE_ROOM && c->cost.response_bytes < (double)(SIZE_MAX / 2))
        room = (size_t)c->cost.response_bytes + 1;
    codec_buf out = {.data = ok ? codec_tensor_alloc(room) : NULL, .elements = true};
    bool blocks_ok = true;
    if (out.data) {
        out.cap = room;
        out.data[0] = '\0';
        if (c->oip)
            blocks_ok = api_oip_encode(c, &out, res);
        else
            encode(c, &out);
        codec_buf_append(&out, "", 1); /* a NUL after the body, for callers that want a C string */
    }
    if (ok && (!out.data || out.failed || !blocks_ok))
        ok = api_fail(&err, 500, "out_of_memory", "",
                      "out of memory while writing the response");
    timings(res, &c->t);
    bool oip = c->oip != NULL;
    api_call_free(c);
    if (!ok) {
        codec_buf_free(&out);
        api_response_free(res); /* the binary outputs, if any were handed over */
        respond_error(res, &err, oip);
        return;
    }
    /* The doubling growth may have left up to half the buffer unused; the
     * answer may wait a while for a slow client, so hand back the rest
     * (a few hundred bytes of the first block are not worth a realloc). */
    if (out.cap > out.len + out.len / 8 && out.cap - out.len > FIRST_BLOCK) {
        char *fit = codec_tensor_realloc(out.data, out.len);
        if (fit) {
            out.data = fit;
            out.cap = out.len;
        }
    }
    res->status = 200;
    res->body = out.data;
    res->body_len = out.len - 1;
    res->body_cap = out.cap;
    res->body_elements = true;
}

void api_handle(api_op op, const char *body, size_t len, const api_limits *lim,
                api_response *res)
{
    api_call *c = api_prepare(op, body, len, lim, NULL, res);
    if (c)
        api_execute(c, lim->threads, res);
}

void api_body_free(void *body)
{
    codec_tensor_release(body);
}

void api_response_free(api_response *res)
{
    if (!res)
        return;
    if (res->body_elements)
        api_body_free(res->body);
    else
        free(res->body);
    res->body = NULL;
    res->body_len = 0;
    res->body_cap = 0;
    res->body_elements = false;
    for (int i = 0; i < res->n_blocks; i++)
        codec_tensor_release(res->blocks[i].data);
    free(res->blocks);
    res->blocks = NULL;
    res->n_blocks = 0;
    res->header_len = 0;
}

size_t api_response_bytes(const api_response *res)
{
    size_t n = res->body_len;
    for (int i = 0; i < res->n_blocks; i++)
        n += res->blocks[i].len;
    return n;
}
