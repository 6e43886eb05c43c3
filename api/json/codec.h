/*
 * The JSON text layer of api/: a strict RFC 8259 validator, an object walker,
 * and the tensor codec that reads numbers straight into float32 buffers and
 * writes them straight out. jansson is kept for everything that is not a
 * tensor (scalars, small objects, the meta and error objects), but building a
 * json_t per number is what makes a generic parser slow, so tensors never go
 * through it.
 *
 * The UTF-8 check and the string escaper that the rest of attnd uses when
 * it writes JSON by hand are in json_string.h.
 *
 * Flow for a request body:
 *   json_text_validate_spans(body)    strict check of the whole document, once,
 *                                     noting where its members lie
 *   json_spans_members(spans)         top-level members: decoded key + value span
 *   api_tensor_decode(span)           tensor fields
 *   json_loadb(span, JSON_DECODE_ANY) the other fields (jansson)
 */
#ifndef API_CODEC_H
#define API_CODEC_H

#include "api.h"

#define API_MAX_RANK 8   /* ranks above 4 are decoded only to be refused with a clear message */
#define API_MAX_DEPTH 64 /* nesting depth a body may have */

/* --------------------- strict JSON text (json_validate.c, json_object.c) */

/*
 * True when buf[0..len) is exactly one JSON value by RFC 8259, strictly:
 * no comments, trailing commas, leading zeros, NaN/Infinity, single quotes,
 * control characters in strings or invalid escapes; valid UTF-8 (no overlong
 * forms, no surrogates encoded in UTF-8); \u escapes must pair surrogates;
 * whitespace is only space, tab, LF, CR; nesting at most API_MAX_DEPTH.
 * Otherwise fills err: 400 "invalid_json", the message says what and at which
 * byte offset (line:column).
 */
bool json_text_validate(const char *buf, size_t len, api_error *err);

/* The byte just after the value that starts at p. The text must have passed
 * json_text_validate; never reads past `end`. */
const char *json_text_skip(const char *p, const char *end);

/* Whitespace as RFC 8259 has it: space, tab, LF, CR. */
static inline const char *json_skip_ws(const char *p, const char *end)
{
    /* most calls find a value byte straight away: one compare for those */
    while (p < end && (unsigned char)*p <= ' ' &&
           (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}


typedef struct {
    char key[64];           /* decoded (escapes resolved), NUL-terminated */
    bool key_too_long;      /* the decoded key did not fit, or holds a NUL (it is
                             * then no known field; json_member_key_shown shows it) */
    const char *key_text;   /* the key's opening quote in the text */
    const char *value;      /* first byte of the value */
    const char *value_end;  /* byte after the value */
} json_member;

/* Where one member of an object lies in the text. */
typedef struct {
    const char *key_text;  /* the key's opening quote */
    const char *value;     /* first byte of the value */
    const char *value_end; /* byte after the value */
} json_span;

/*
 * json_text_validate, noting on the way where the members of the text's
 * object lie (the first `cap` of them into spans; *members counts them all,
 * 0 when the value is not an object), so that json_spans_members can list
 * them without walking the text again.
 */
bool json_text_validate_spans(const char *buf, size_t len, json_span *spans, size_t cap,
                              size_t *members, api_error *err);

/*
 * Lists the members of the object whose text starts at p (at '{', validated
 * text), at most `max`. Fails with 400 "duplicate_key" (field = `where` + key)
 * when a key appears twice (compared after decoding escapes), 400
 * "too_many_fields" when there are more than `max`, or 400 "wrong_type" when
 * p is not an object. `where` names the object in messages: "" for the body,
 * "q" for a tensor object, and so on.
 */
bool json_text_members(const char *p, const char *end, json_member *out,
                       size_t max, size_t *count, const char *where,
                       api_error *err);

/* json_text_members of the object that json_text_validate_spans saw, from
 * its n members' spans (spans holds the first min(n, max) of them): the
 * same members and the same errors. */
bool json_spans_members(const json_span *spans, size_t n, const char *end, json_member *out,
                        size_t max, size_t *count, const char *where, api_error *err);

/* ------------------------- tensors (tensor_decode.c, tensor_encode.c) */

/* Element types. A decoded tensor is API_F32 or API_BOOL; API_F16 and
 * API_BF16 (IEEE binary16 and bfloat16) exist only as base64 data, read
 * into float32 exactly, and as the dtype of base64 outputs. */
typedef enum { API_F32 = 0, API_BOOL = 1, API_F16 = 2, API_BF16 = 3 } api_dtype;

typedef struct {
    api_dtype dtype;
    int rank;
    int64_t shape[API_MAX_RANK];
    int64_t count;  /* product of shape */
    float *f32;     /* API_F32: `count` floats (malloc'd; NULL when count == 0) */
    uint8_t *b8;    /* API_BOOL: `count` bytes, each 0 or 1 (malloc'd) */
} api_tensor;

/*
 * Decodes the tensor whose (validated) JSON text is [p, end):
 *   nested arrays          [[1, 2], [3, 4]]
 *   flat object            {"shape": [2, 2], "data": [1, 2, 3, 4]}
 *   base64 object          {"shape": [2, 2], "dtype": "float32", "base64": "..."}
 *                          ("dtype": "float16" or "bfloat16": 2 bytes per
 *                          element, widened to float32 exactly; "bool": one
 *                          byte per element, 0 or 1)
 * Numbers are read as JSON numbers are by Python and then converted to
 * float32 (correctly rounded to double, then to float32), as a client that
 * builds torch.tensor(json.loads(body)) would get.
 * accept_bool: true for masks, where true/false (or dtype "bool") give API_BOOL.
 * Errors (field = `field`): 400 "wrong_type" (not one of the three forms,
 * strings, nulls or objects as elements, booleans where numbers are wanted,
 * numbers mixed with booleans), 400 "unknown_field" / "missing_field" in
 * the object forms, 400 "invalid_number" (not finite as a float32, e.g.
 * 1e39, or a NaN or infinity in base64), 400 "invalid_base64", 422
 * "ragged_array", 422 "shape_mismatch" (data or base64 length does not match
 * shape), 422 "invalid_shape" (negative, non-integer or too many dimensions,
 * overflowing product). Every 400 comes before any 422: a tensor with a
 * wrong type anywhere is a 400 even when its shape is wrong too. A declared
 * shape is checked against the data before anything of its size is
 * allocated. On failure *t holds nothing to free.
 */
bool api_tensor_decode(const char *p, const char *end, const char *field,
                       bool accept_bool, api_tensor *t, api_error *err);

void api_tensor_free(api_tensor *t);

/*
 * Reads one JSON number (validated text) at p into the float32 that Python's
 * float() followed by a float32 conversion gives; *stop is the byte after it.
 * Returns false when the result is not finite as a float32 (1e39, -1e39).
 */
bool api_parse_number(const char *p, const char *end, const char **stop,
                      float *out);

/* ------------------------------------------------------- output buffer */

/* A growing byte buffer; after an allocation failure `failed` is set and
 * further appends do nothing. */
typedef struct {
    char *data;
    size_t len, cap;
    bool failed;
} api_buf;

void api_buf_append(api_buf *b, const char *s, size_t n);
void api_buf_puts(api_buf *b, const char *s);
void api_buf_printf(api_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void api_buf_free(api_buf *b);

/* Appends the shortest decimal text that reads back (as float32) as exactly
 * f: 0.1f -> "0.1", 1e-7f -> "1e-07" or "1e-7", 3.0f -> "3.0" or "3"; -0.0f
 * -> "-0.0". Non-finite values, which JSON cannot carry, are written as null. */
void api_buf_float(api_buf *b, float f);

typedef enum {
    API_ENC_NESTED = 0,      /* [[...], ...] */
    API_ENC_FLAT = 1,        /* {"shape": [...], "data": [...]} */
    API_ENC_BASE64 = 2,      /* {"shape": [...], "dtype": "float32", "base64": "..."} */
    API_ENC_BASE64_F16 = 3,  /* the same with "dtype": "float16" (2 bytes each) */
    API_ENC_BASE64_BF16 = 4, /* the same with "dtype": "bfloat16" */
} api_encoding;

/* The dtype of an encoding's elements: API_F32, API_F16 or API_BF16. */
api_dtype api_encoding_dtype(api_encoding enc);

/* Appends the JSON text of a float32 tensor of `rank` (>= 1) dims `shape`.
 * The 2-byte base64 encodings round to nearest even; values they cannot
 * hold become infinite: check with api_half_fits first. */
void api_tensor_encode(api_buf *b, const float *data, int rank,
                       const int64_t *shape, api_encoding enc);

/* Do all n values of x stay finite when rounded to `dtype` (API_F16 or
 * API_BF16)? If not, *at is the first that does not. */
bool api_half_fits(api_dtype dtype, const float *x, size_t n, size_t *at);

/* Tensors as raw bytes (raw.c): little-endian, row-major, no padding.
 * api_dtype_size: 4 for API_F32, 2 for API_F16 and API_BF16, 1 for API_BOOL.
 * api_tensor_from_bytes reads `count` elements of `dtype` (API_F32, API_F16
 * or API_BF16) into float32, exactly; api_tensor_to_bytes writes them, the
 * 2-byte dtypes rounded to nearest even (check with api_half_fits first);
 * api_tensor_round rounds x in place to the values `dtype` holds (nothing
 * for API_F32). */
size_t api_dtype_size(api_dtype dtype);
void api_tensor_from_bytes(api_dtype dtype, const uint8_t *in, float *out, size_t count);
void api_tensor_to_bytes(api_dtype dtype, const float *in, uint8_t *out, size_t count);
void api_tensor_round(api_dtype dtype, float *x, size_t count);

/* The dtype's name in the API ("float32", "float16", "bfloat16", "bool"). */
const char *api_dtype_name(api_dtype dtype);

/* A json_member's key as a message may quote it: escaped as in a JSON
 * string (an escaped NUL shows as \u0000, not as the end of the key), cut
 * with "..." to fit cap; returns out. */
const char *json_member_key_shown(const json_member *m, char *out, size_t cap);

#endif /* API_CODEC_H */
