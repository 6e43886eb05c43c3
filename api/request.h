/*
 * The inside of the API layer: how an operation declares its fields, reads
 * them from a body, times its steps and writes its answer. Private to api/;
 * the server sees only api.h.
 *
 * An operation is a table of fields (like Redis's static_configs[]): name,
 * kind, required. api_read_fields() walks the body's members once against
 * that table, so unknown, missing, duplicated and mistyped fields are refused
 * the same way for every route, before any tensor is decoded.
 */
#ifndef API_REQUEST_H
#define API_REQUEST_H

#include "api.h"
#include "json/codec.h"
#include "attn.h"

/* ------------------------------------------------------------- fields */

typedef enum {
    API_FIELD_TENSOR,   /* float32 tensor, any of the three encodings */
    API_FIELD_OPERAND,  /* the same, but bfloat16 base64 stays as sent (CODEC_BF16
                         * words) until the operation knows whether its
                         * products read bfloat16 (api_operand_setup) */
    API_FIELD_MASK,     /* tensor of booleans or numbers */
    API_FIELD_BOOL,     /* true / false (not 0 / 1) */
    API_FIELD_NUMBER,   /* a number finite as a float32 */
    API_FIELD_INTEGER,  /* a number with no fractional part */
    API_FIELD_ENCODING, /* "nested" | "flat" | "base64" */
    API_FIELD_WEIGHTS,  /* false | true | "mean" (multi-head return_weights) */
    API_FIELD_DTYPE,    /* "float32" | "float16" | "bfloat16" (output_dtype) */
    API_FIELD_WINDOW,   /* [left, right]: two integers */
    API_FIELD_ROPE,     /* {"base": number} */
    API_FIELD_LENGTHS,  /* [n_1, ..., n_B]: integers >= 0 (a ragged batch's lengths) */
    API_FIELD_PRECISION,/* "float32" | "bfloat16" (the products' arithmetic) */
} api_field_kind;

typedef struct {
    const char *name;
    api_field_kind kind;
    bool required;
} api_field;

/* What was read for one field; `present` is false when the field was absent
 * or null (null means "the default", as None does in PyTorch). */
typedef struct {
    bool present;
    codec_tensor tensor;     /* TENSOR, MASK */
    bool flag;             /* BOOL; WEIGHTS: true for true and for "mean" */
    bool mean;             /* WEIGHTS: "mean" */
    float number;          /* NUMBER; ROPE: the base */
    int64_t integer;       /* INTEGER */
    int64_t pair[2];       /* WINDOW: left, right */
    codec_encoding encoding; /* ENCODING */
    codec_dtype dtype;       /* DTYPE */
    attn_precision precision; /* PRECISION */
    int64_t *lengths;      /* LENGTHS: [count] (malloc'd; api_values_free frees it) */
    int64_t count;         /* LENGTHS */
} api_value;

/* The most members a body may have; more is 400 too_many_fields. */
#define API_MAX_FIELDS 32

/*
 * Reads the members of the body's object (the validated document `doc`)
 * into values[i] for schema[i]. Refuses, in this order: an unknown member
 * (400 unknown_field, suggesting the nearest name), a missing required field
 * (400 missing_field), then each value in schema order: wrong JSON type
 * (400 wrong_type), a bad number (400 invalid_number), a value outside its
 * set (422 invalid_value), and whatever codec_tensor_decode refuses.
 * `other` (may be NULL) is another operation's table, used only to say
 * "num_heads is a field of /v1/multihead" for a member sent to the wrong route.
 * On failure nothing is left to free.
 */
bool api_read_fields(const codec_doc *doc, const api_field *schema, size_t n_fields,
                     const api_field *other, size_t n_other, const char *other_route,
                     api_value *values, api_error *err);

void api_values_free(api_value *values, size_t n_fields);

/* One member's value (in the validated document doc) for the field f, by
 * its kind's reader, as api_read_fields reads it; v is not marked present.
 * For a front end that finds a field's value elsewhere than among the
 * body's members. */
bool api_read_value(const codec_doc *doc, const api_field *f, const codec_member *m,
                    api_value *v, api_error *err);

/* A string member's value (validated JSON text) into text[0..cap),
 * NUL-terminated, escapes resolved (a longer one is cut; one holding an
 * escaped NUL comes out as a value that matches no name). */
void api_string_value(const codec_member *m, char *text, size_t cap);

/* The name of schema[0..n) nearest to key, when near enough to be a likely
 * typo (at most two edits, fewer than half the name's letters), or NULL. */
const char *api_nearest_field(const char *key, const api_field *schema, size_t n);

/* The encoding of the response's tensors from the output_encoding and
 * output_dtype fields (each may be absent): nested by default, base64 in
 * the dtype asked for. output_dtype with another encoding is a 422
 * invalid_value (it would change nothing). */
bool api_output_encoding(const api_value *encoding, const api_value *dtype, codec_encoding *out,
                         api_error *err);

/* The codec's error as the API's: its kind gives the status and the code,
 * its field and message are the client's to read as they are. Returns
 * false. */
bool api_fail_codec(api_error *err, const codec_error *ce);

/* The codec's instruction sets matched to libattn's kernel (once; every
 * request calls it first). */
void api_codec_setup(void);

/* -------------------------------------------------------- shape checks */

/* "[2, 3, 4]" into buf (for messages). */
const char *api_shape_text(char *buf, size_t size, int rank,
                           const int64_t *shape);

/* 422 invalid_shape unless rank is in [lo, hi] and every dimension >= 1. */
bool api_check_rank(const codec_tensor *t, const char *field, int lo, int hi,
                    const char *forms, api_error *err);

/* 422 shape_mismatch unless t has exactly `shape`; `what` names the thing
 * it must match ("the output"). */
bool api_check_shape(const codec_tensor *t, const char *field, int rank,
                     const int64_t *shape, const char *what, api_error *err);

/* Fills mask (kind, data, strides) from a decoded mask tensor, broadcast to
 * [batch, heads, n_q, n_k]; `score_rank` is the rank of the scores the
 * client sees (a mask may not have more dimensions), `score_shape` its
 * shape for the message. 422 shape_mismatch (field "mask") otherwise. */
bool api_mask_setup(const codec_tensor *t, int score_rank,
                    const int64_t *score_shape, int64_t batch, int64_t heads,
                    int64_t n_q, int64_t n_k, attn_mask *mask,
                    api_error *err);

/* Turns a libattn error into an api_error: ATTN_ERR_NOMEM -> 500
 * out_of_memory, anything else -> 422 invalid_value with lib's message. */
bool api_fail_attn(api_error *err, const attn_error *ae);

/* `count` floats for a result, from the allocator of api_set_allocator
 * (codec_tensor_alloc), NULL on overflow or failure (count 0 gives a valid
 * 1-float block so that NULL always means failure). Freed with
 * api_free_floats. */
float *api_alloc_floats(int64_t count);
void api_free_floats(float *x);

/* 422 numerical_overflow when any of the `count` floats of an output is
 * not finite, or would not be in the encoding's dtype (float16 past 65504). */
bool api_check_output(const float *x, int64_t count, const char *what, codec_encoding enc,
                      api_error *err);

/* Largest Euclidean norm of the `rows` rows of x [rows, cols], in double. */
double api_max_row_norm(const float *x, int64_t rows, int64_t cols);

/* Largest finite |x[i]| (an additive mask's -inf hides a key, it is not a
 * score); Frobenius norm sqrt(sum x[i]^2); both in double. */
double api_max_abs(const float *x, int64_t count);
double api_norm(const float *x, int64_t count);

/*
 * 422 numerical_overflow when the scaled scores might not be finite in
 * float32. A score whose dot product overflows becomes +inf, and the
 * softmax of a row holding +inf has no finite answer, but need not come
 * out as NaN (it can come out as a silent zero row), so the output check
 * alone cannot catch it. `bound` is an upper bound of |scale * q.k + bias|
 * over every entry (Cauchy-Schwarz: max |q_i| * max |k_j|), which also
 * bounds every partial sum of the dot products in any order.
 */
bool api_check_score_bound(double bound, const char *what, api_error *err);

/* An OPERAND field for libattn: its words as they came (*dtype
 * ATTN_DTYPE_BFLOAT16) when the products read bfloat16 (`precision`),
 * otherwise widened to float32 here, once (a 500 out_of_memory when that
 * fails). Absent fields are left alone. */
bool api_operand_setup(api_value *v, const char *field, attn_precision precision,
                       attn_dtype *dtype, api_error *err);

/* The field's data as libattn reads it with the dtype api_operand_setup
 * gave: floats or bfloat16 words; NULL when absent. */
const void *api_field_operand(const api_call *c, int field);

/* Largest Euclidean norm of the rows of an OPERAND tensor [rows, cols],
 * floats or bfloat16 words, in double. */
double api_operand_max_row_norm(const codec_tensor *t, int64_t rows, int64_t cols);

/* Threads for libattn: lim->threads, at least 1. */
int api_threads(const api_limits *lim);

/* The most threads the request may be given: lim->max_threads, or threads. */
int api_max_threads(const api_limits *lim);

/* ------------------------------------------------------------- timing */

/* The three steps of a handler, measured with CLOCK_MONOTONIC. */
typedef struct {
    double arrival;                          /* ms when the request arrived, or 0 */
    double mark;                             /* ms at the last lap */
    double decode_ms, compute_ms, encode_ms; /* 0 for steps not reached */
} api_timing;

double api_now_ms(void);

/* Adds to err's message (a body that is not JSON, at byte `offset`) what
 * the body most likely is: a form submission, a NaN or an Infinity. */
void api_hint_not_json(const char *body, size_t len, size_t offset, api_error *err);

/* meta.timing_ms.total: since the arrival, or the three steps' sum without
 * one, rounded to the microsecond. */
double api_total_ms(const api_timing *t);

/* Adds the time since the last lap to *step and starts the next one. */
void api_lap(api_timing *t, double *step);

/* ----------------------------------------------------------- response */

/* Appends `,"stats": {...}`, nulls where a count is 0. */
void api_write_stats(codec_buf *b, const attn_stats *s);

/* One named dimension of meta.shape. */
typedef struct {
    const char *name;
    int64_t value;
} api_dim;

/* Appends `,"meta": {...}` from the `n_dims` named dimensions in `shape`,
 * the flops, the work, and the timings, after closing the encode step (the
 * meta's own few bytes are not timed). */
void api_write_meta(codec_buf *b, const api_dim *shape, size_t n_dims,
                    const api_cost *cost, api_timing *t);

/* ---------------------------------------------------------------- cost */

/*
 * What an operation's shapes say about its cost, counted in the units the
 * prices of api/cost.c are for. Everything is for the forward pass; the
 * skeleton multiplies by the backward's factor when gradients are asked for.
 */
typedef struct {
    double flops;      /* nominal FLOPs of every product */
    double pairs;      /* (batch, query head) pairs attended: B * H_q */
    double rows;       /* query rows over every pair: B * H_q * n_q */
    double scores;     /* (query, key) scores: B * H_q * n_q * n_k */
    double weights;    /* weights materialised (0 unless asked for) */
    double averaged;   /* weights summed into a head average */
    bool masked;       /* an explicit mask is read for every score */
    /* the variants (api_variant_cost) */
    double softcapped; /* scores through tanh (softcap) */
    double biased;     /* scores given an ALiBi term */
    double angles;     /* RoPE: (position, pair) angles whose cosine and sine are taken */
    double rotated;    /* RoPE: elements of q and k turned */
    /* Memory: the bytes computing it allocates beyond the inputs and the
     * planned results (libattn's workspaces, the operation's own buffers),
     * for lim->max_threads threads, and the largest part of it, named for
     * a message ("the projections of 4 heads of 16384 x 16384"). */
    double workspace;
    char workspace_what[120];
    /* bfloat16 precision: the part of `flops` done on bfloat16 operands
     * (priced at the rate of the way libattn runs them, attn_bf16()), and
     * the elements of q, k and v rounded to bfloat16 */
    double bf16_flops;
    double rounded;
} api_cost_terms;

/* The work of terms (backward: with the gradients), without the decoding
 * of the body and the encoding of the answer. */
double api_compute_work(const api_cost_terms *terms, bool stats, bool backward);

/* The work of encoding `numbers` numbers in `enc`. */
double api_encode_work(double numbers, codec_encoding enc);

/* The most bytes codec_tensor_encode writes for a tensor of this shape. */
double api_encoded_bytes(int rank, const int64_t *shape, codec_encoding enc);

/* ------------------------------------------------------------ variants */

/* The variant fields of a request (api/variants.c), whichever the route. */
typedef struct {
    const api_value *window, *alibi_slopes, *softcap, *rope;
} api_variant_values;

/* What they are judged against: the query heads of each sequence (named as
 * the route names them: "heads_q", "num_heads") and their width d_k. */
typedef struct {
    int64_t batch, heads_q, d_k;
    const char *heads_name;
} api_variant_shape;

/* Fills v (all off for fields absent): 422 invalid_value for a window side
 * below -1 (field "window"), a softcap or rope.base not > 0, an odd d_k with
 * rope (field "rope"); 422 shape_mismatch for slopes that are neither
 * [heads_q] nor [batch, heads_q]. v points into the slopes' tensor. */
bool api_variants_setup(const api_variant_values *f, const api_variant_shape *s,
                        attn_variants *v, api_error *err);

/* ------------------------------------------------------- ragged batches */

/* A ragged batch's lengths as libattn's offsets (attn_ragged), for the
 * queries (or x) and the keys (or context). */
typedef struct {
    int64_t seqs;           /* 0: not ragged */
    int64_t *cu_q, *cu_k;   /* [seqs + 1] each (malloc'd; api_ragged_free) */
    double pairs;           /* sum over the sequences of len_q * len_k */
} api_ragged;

/* The names a route gives the fields and the axes they split ("seq_lens",
 * "seq_lens_k", "q", "n_q", "k", "n_k"; "seq_lens", "seq_lens_context", "x",
 * "n", "context", "m"). */
typedef struct {
    const char *lens_q, *lens_k;
    const char *rows_q, *axis_q, *rows_k, *axis_k;
} api_ragged_names;

/*
 * Judges a route's lengths against its axes and fills r (nothing when
 * lens_q is absent): 422 invalid_value for lens_k without lens_q (field
 * lens_k), a batch dimension (`batch` > 1: the sequences are packed along
 * one axis), lengths that do not sum to their axis (n_q, n_k), a lens_k of
 * another count than lens_q; without lens_k the keys' lengths are lens_q's,
 * so n_k must be n_q (else lens_k is asked for). lens_k may be NULL when
 * the route has no such field (then the keys are always lens_q's).
 */
bool api_ragged_setup(const api_value *lens_q, const api_value *lens_k, int64_t batch,
                      int64_t n_q, int64_t n_k, const api_ragged_names *names, api_ragged *r,
                      api_error *err);

/* After a mask that does not fit a ragged batch's scores: says in err's
 * message that the mask is over the packed rows and keys. Returns false. */
bool api_ragged_mask_hint(const api_ragged *r, api_error *err);

/* libattn's view of r (seqs 0 when not ragged). */
attn_ragged api_ragged_lib(const api_ragged *r);

void api_ragged_free(api_ragged *r);

/* An upper bound of the ALiBi term |slope * (p_i - j)| over every score. */
double api_alibi_bound(const attn_variants *v, const codec_tensor *slopes, int64_t n_q,
                       int64_t n_k);

/* The variants' cost terms for the attention of p (what libattn computes:
 * with a window, the band and the key tiles its edges cut, in t->scores;
 * the soft-capped, ALiBi and rotated work beside it). t->rows must be set. */
void api_variant_cost(const attn_sdpa_params *p, api_cost_terms *t);

/* lse[i] = attn_softmax_lse(rows[i]) in float32: -inf for a row that sees
 * no key, which the JSON encodings write as null. */
void api_lse_rows(const attn_softmax_row *rows, int64_t count, float *lse);

/* api_check_output for an lse result: -inf is a row that sees no key (the
 * encodings carry it: null, or -inf in base64); anything else must be
 * finite and fit the output dtype. */
bool api_check_lse(const float *lse, int64_t count, const char *what, codec_encoding enc,
                   api_error *err);

/* ------------------------------------------------------------- skeleton */

/*
 * Both compute routes are one sequence of steps (api/handle.c): decode the
 * fields, validate, cost, compute, encode. An operation supplies its field
 * table and the steps that differ; everything else (the work and response
 * limits, the allocation of the results, their finiteness, the statistics'
 * overflow, the release of the inputs, writing the answer) is the
 * skeleton's, written once.
 */

/* A tensor of the answer, planned by validate (name, shape) and allocated
 * by the skeleton before compute writes it; freed once written. */
typedef struct {
    const char *name;  /* its key in the answer */
    bool in_grad;      /* under "grad" rather than at the top */
    const char *what;  /* for messages: "the output", "the gradient of q" */
    int rank;
    int64_t shape[CODEC_MAX_RANK];
    int64_t count;
    bool empty_rows;   /* lse: -inf (a row that sees no key) is an answer, not an overflow */
    float *data;
} api_result;

#define API_MAX_RESULTS 16

typedef struct api_operation api_operation;
typedef struct api_oip api_oip;

struct api_call {
    const api_operation *op;
    api_limits lim;
    api_timing t;
    api_cost cost;
    codec_encoding enc;
    bool want_stats, want_grad;
    attn_stats stats;
    int n_results;
    void *state; /* the operation's own (state_size bytes, zeroed) */
    api_oip *oip; /* the Open Inference Protocol's request (oip.h), or NULL for /v1 */
    /* The two arrays last: api_prepare zeroes everything before them, the
     * op's n_fields values, and nothing of the 6 KB it does not use. */
    api_result results[API_MAX_RESULTS]; /* [0, n_results) planned */
    api_value f[API_MAX_FIELDS]; /* the fields, in the op's table order */
};

struct api_operation {
    const char *route;                /* "/v1/attention" */
    const api_field *fields;
    size_t n_fields;
    const api_operation *other;       /* the other route, for "belongs to" hints */
    int f_output_encoding, f_output_dtype, f_return_stats, f_grad_output; /* in fields */
    size_t state_size;
    /* Checks the shapes and options and plans the results (api_plan). */
    bool (*validate)(api_call *c, api_error *err);
    /* The cost terms of the validated call. */
    void (*cost)(const api_call *c, api_cost_terms *terms);
    /* The terms' workspace named for the memory_limit message, written only
     * when that message is (formatting it for every request was a tenth of
     * a small request's decoding); NULL: cost wrote workspace_what itself. */
    void (*workspace_what)(const api_call *c, char *buf, size_t cap);
    /* An upper bound of |scaled score + bias|, and what to blame when it
     * is beyond float32 (api_check_score_bound). */
    double (*score_bound)(const api_call *c, const char **blame);
    /* Fills the planned results (and c->stats) with `threads` threads. */
    bool (*compute)(api_call *c, int threads, api_error *err);
    /* Takes now, without waiting, what compute would wait for (a KV
     * cache's turn), for a compute that follows at once; false when it is
     * held by another request. release gives back what compute did not
     * reach. NULL: compute never waits. */
    bool (*hold_now)(api_call *c);
    /* meta.shape: its dimensions into dims (at most 16); returns how many. */
    size_t (*dims)(const api_call *c, api_dim *dims);
    void (*release)(api_call *c); /* the state's own allocations; may be NULL */
    /* Writes `,"key": ...` members of its own after the results (may be NULL). */
    void (*write_extra)(const api_call *c, codec_buf *b);
};

/* Plans a result of the answer, in the order it will be written; returns
 * its index. */
int api_plan(api_call *c, const char *name, bool in_grad, const char *what, int rank,
             const int64_t *shape);

/* The fields' tensor data, NULL for a field absent. */
const float *api_field_data(const api_call *c, int field);

extern const api_operation api_attention_op, api_multihead_op, api_cache_attention_op;

/* The body must be one JSON object: its members' places into spans
 * (API_MAX_FIELDS of them), their number into *members. 400 otherwise. */
bool api_check_body(codec_doc *doc, const char *body, size_t len, codec_span *spans,
                    api_error *err);

/* res becomes err's answer: its status and JSON body (Retry-After for a 503). */
void api_respond_error(api_response *res, api_error *err);

/* ------------------------------------------- Open Inference Protocol */

/*
 * The second front end of the same calls (oip_read.c, oip_answer.c).
 * api_oip_read fills the call's fields (c->f) from an infer request:
 * body[0..len), whose JSON text ends where json_length (the
 * Inference-Header-Content-Length value, NULL when absent) says; the
 * skeleton then validates the call as it does a /v1 body's. api_oip_plan,
 * after the operation's validate, matches the outputs asked for to the
 * planned results and sets c->enc; api_oip_encode writes the answer's JSON
 * text into b and hands its binary outputs to res (header_len, blocks: see
 * api_response; the results it sends as they are leave the call), and
 * closes the encode step. False when out of memory for a block (res then
 * holds none).
 */
bool api_oip_read(api_call *c, const char *body, size_t len, const char *json_length,
                  api_error *err);
bool api_oip_plan(api_call *c, api_error *err);
bool api_oip_encode(api_call *c, codec_buf *b, api_response *res);
void api_oip_free(api_oip *o);

#endif /* API_REQUEST_H */
