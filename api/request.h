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

#include <jansson.h>

/* ------------------------------------------------------------- fields */

typedef enum {
    API_FIELD_TENSOR,   /* float32 tensor, any of the three encodings */
    API_FIELD_MASK,     /* tensor of booleans or numbers */
    API_FIELD_BOOL,     /* true / false (not 0 / 1) */
    API_FIELD_NUMBER,   /* a number finite as a float32 */
    API_FIELD_INTEGER,  /* a number with no fractional part */
    API_FIELD_ENCODING, /* "nested" | "flat" | "base64" */
    API_FIELD_WEIGHTS,  /* false | true | "mean" (multi-head return_weights) */
    API_FIELD_DTYPE,    /* "float32" | "float16" | "bfloat16" (output_dtype) */
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
    api_tensor tensor;     /* TENSOR, MASK */
    bool flag;             /* BOOL; WEIGHTS: true for true and for "mean" */
    bool mean;             /* WEIGHTS: "mean" */
    float number;          /* NUMBER */
    int64_t integer;       /* INTEGER */
    api_encoding encoding; /* ENCODING */
    api_dtype dtype;       /* DTYPE */
} api_value;

/* The most members a body may have; more is 400 too_many_fields. */
#define API_MAX_FIELDS 32

/*
 * Reads the members of the object `body` (validated JSON text, an object)
 * into values[i] for schema[i]. Refuses, in this order: an unknown member
 * (400 unknown_field, suggesting the nearest name), a missing required field
 * (400 missing_field), then each value in schema order: wrong JSON type
 * (400 wrong_type), a bad number (400 invalid_number), a value outside its
 * set (422 invalid_value), and whatever api_tensor_decode refuses.
 * `other` (may be NULL) is another operation's table, used only to say
 * "num_heads is a field of /v1/multihead" for a member sent to the wrong route.
 * On failure nothing is left to free.
 */
bool api_read_fields(const char *body, size_t len, const api_field *schema,
                     size_t n_fields, const api_field *other, size_t n_other,
                     const char *other_route, api_value *values,
                     api_error *err);

void api_values_free(api_value *values, size_t n_fields);

/* The encoding of the response's tensors from the output_encoding and
 * output_dtype fields (each may be absent): nested by default, base64 in
 * the dtype asked for. output_dtype with another encoding is a 422
 * invalid_value (it would change nothing). */
bool api_output_encoding(const api_value *encoding, const api_value *dtype, api_encoding *out,
                         api_error *err);

/* -------------------------------------------------------- shape checks */

/* "[2, 3, 4]" into buf (for messages). */
const char *api_shape_text(char *buf, size_t size, int rank,
                           const int64_t *shape);

/* 422 invalid_shape unless rank is in [lo, hi] and every dimension >= 1. */
bool api_check_rank(const api_tensor *t, const char *field, int lo, int hi,
                    const char *forms, api_error *err);

/* 422 shape_mismatch unless t has exactly `shape`; `what` names the thing
 * it must match ("the output"). */
bool api_check_shape(const api_tensor *t, const char *field, int rank,
                     const int64_t *shape, const char *what, api_error *err);

/* Fills mask (kind, data, strides) from a decoded mask tensor, broadcast to
 * [batch, heads, n_q, n_k]; `score_rank` is the rank of the scores the
 * client sees (a mask may not have more dimensions), `score_shape` its
 * shape for the message. 422 shape_mismatch (field "mask") otherwise. */
bool api_mask_setup(const api_tensor *t, int score_rank,
                    const int64_t *score_shape, int64_t batch, int64_t heads,
                    int64_t n_q, int64_t n_k, attn_mask *mask,
                    api_error *err);

/* 422 work_limit when `flops` exceeds lim->max_work (a limit <= 0 is none). */
bool api_check_work(double flops, const api_limits *lim, api_error *err);

/* The most numbers one response may carry. The FLOP limit bounds the work,
 * not the answer: q [n, 1] against one key is cheap yet its weights or
 * output can dwarf the request, and an answer that cannot be held in memory
 * must be refused, not attempted. 2^26 floats are 256 MiB, up to ~1 GiB as
 * text. */
#define API_MAX_RESPONSE_NUMBERS ((int64_t)1 << 26)

/* 422 work_limit when the response would carry more than
 * API_MAX_RESPONSE_NUMBERS numbers. */
bool api_check_response_size(double numbers, api_error *err);

/* Turns a libattn error into an api_error: ATTN_ERR_NOMEM -> 500
 * out_of_memory, anything else -> 422 invalid_value with lib's message. */
bool api_fail_attn(api_error *err, const attn_error *ae);

/* malloc of `count` floats, NULL on overflow or failure (count 0 gives a
 * valid 1-float block so that NULL always means failure). */
float *api_alloc_floats(int64_t count);

/* 422 numerical_overflow when any of the `count` floats of an output is
 * not finite, or would not be in the encoding's dtype (float16 past 65504). */
bool api_check_output(const float *x, int64_t count, const char *what, api_encoding enc,
                      api_error *err);

/* Largest Euclidean norm of the `rows` rows of x [rows, cols], in double. */
double api_max_row_norm(const float *x, int64_t rows, int64_t cols);

/* Largest |x[i]|; Frobenius norm sqrt(sum x[i]^2); both in double. */
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

/* Threads for libattn: lim->threads, at least 1. */
int api_threads(const api_limits *lim);

/* ------------------------------------------------------------- timing */

/* The three steps of a handler, measured with CLOCK_MONOTONIC. */
typedef struct {
    double mark;                             /* ms at the last lap */
    double decode_ms, compute_ms, encode_ms; /* 0 for steps not reached */
} api_timing;

double api_now_ms(void);

/* Adds the time since the last lap to *step and starts the next one. */
void api_lap(api_timing *t, double *step);

/* ----------------------------------------------------------- response */

/* A response tensor: its data (not owned) and the shape the client sees. */
typedef struct {
    const char *name;
    const float *data;
    int rank;
    int64_t shape[API_MAX_RANK];
} api_out_tensor;

/* Appends `"name": <tensor>` (with a leading comma unless first). */
void api_write_tensor(api_buf *b, const api_out_tensor *t, api_encoding enc,
                      bool first);

/* Appends `,"stats": {...}`, nulls where a count is 0. */
void api_write_stats(api_buf *b, const attn_stats *s);

/* One named dimension of meta.shape. */
typedef struct {
    const char *name;
    int64_t value;
} api_dim;

/* Appends `,"meta": {...}` from the `n_dims` named dimensions in `shape`,
 * the flops, and the timings, after closing the encode step (the meta's own
 * few bytes are not timed). */
void api_write_meta(api_buf *b, const api_dim *shape, size_t n_dims,
                    double flops, api_timing *t);

/* ---------------------------------------------------------- operations */

/* Each reads the members of `body` (a validated JSON object), computes and
 * appends the whole answer object to `out`; on failure fills err. */
bool api_attention(const char *body, size_t len, const api_limits *lim,
                   api_timing *t, api_buf *out, api_error *err);
bool api_multihead(const char *body, size_t len, const api_limits *lim,
                   api_timing *t, api_buf *out, api_error *err);

/* The field tables, for cross-route hints. */
extern const api_field api_attention_fields[];
extern const size_t api_attention_nfields;
extern const api_field api_multihead_fields[];
extern const size_t api_multihead_nfields;

#endif /* API_REQUEST_H */
