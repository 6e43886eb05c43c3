/*
 * The JSON codec: a library of its own, which knows nothing of HTTP, of
 * attention or of the API layer above it. It holds
 *
 *   - a strict RFC 8259 validator, which notes on its way where the members
 *     of the top-level object lie and where the numbers of long rows lie;
 *   - an object walker (members and their decoded keys);
 *   - the tensor codec, which reads numbers straight into float32 buffers
 *     and writes them straight out: building a node per number is what
 *     makes a general-purpose JSON parser slow on tensors;
 *   - the number readers (float32 as Python reads it, integers), the
 *     string decoder, the UTF-8 check and the escaper;
 *   - codec_buf, the growing text that everything attnd writes goes into.
 *
 * It uses no general-purpose JSON library: the few scalar fields of a body
 * are read from their text in place with the same readers as the tensors,
 * so that "scale": 0.1 rounds to float32 exactly as a tensor's 0.1 does.
 *
 * Conventions. Public names start with codec_ / CODEC_. Texts are [p, end)
 * (or a pointer and a length) and need not be NUL-terminated; nothing reads
 * at or past `end`. Every call that can fail fills a codec_error and returns
 * false, and leaves nothing to free. The only state is the instruction-set
 * switch (codec_set_simd); every call may run on any thread.
 *
 * Flow for a request body:
 *   codec_doc_validate(&doc, body, len, ...)  strict check of the whole text,
 *                                             once, noting members and rows
 *   codec_doc_members(&doc, ...)              the top-level members: decoded
 *                                             key and where the value lies
 *   codec_doc_tensor(&doc, value, ...)        a tensor field (its rows read
 *                                             with the validator's notes)
 *   codec_parse_float, codec_parse_integer,   the other fields
 *   codec_string_decode
 *   codec_doc_free(&doc)
 */
#ifndef CODEC_H
#define CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CODEC_MAX_RANK 8   /* ranks above 4 are decoded only to be refused with a clear message */
#define CODEC_MAX_DEPTH 64 /* nesting depth a text may have */

/* ---------------------------------------------------------------- errors */

/*
 * What went wrong. The kinds up to CODEC_ERR_BASE64 say that the text is
 * not of the form asked for; the kinds from CODEC_ERR_RAGGED on, that the
 * form is right but the sizes or values do not fit. A value with faults of
 * both classes is reported with the first: a tensor with a string among
 * its numbers is CODEC_ERR_WRONG_TYPE even when it is ragged too.
 */
typedef enum {
    CODEC_ERR_SYNTAX,           /* not JSON (RFC 8259, strictly) */
    CODEC_ERR_WRONG_TYPE,       /* a value of another type than asked for */
    CODEC_ERR_DUPLICATE_KEY,    /* a key twice in one object */
    CODEC_ERR_TOO_MANY_MEMBERS, /* more members than the caller takes */
    CODEC_ERR_UNKNOWN_MEMBER,   /* a tensor object's member that it does not have */
    CODEC_ERR_MISSING_MEMBER,   /* a tensor object without "shape", or without data */
    CODEC_ERR_NOT_FINITE,       /* a number beyond float32 (1e39), NaN or infinity in base64 */
    CODEC_ERR_BASE64,           /* base64 text that is not base64 */
    CODEC_ERR_RAGGED,           /* nested arrays that are not rectangular */
    CODEC_ERR_SHAPE,            /* a shape that is no shape: negative, fractional,
                                 * too many dimensions, too many elements */
    CODEC_ERR_SHAPE_MISMATCH,   /* data whose length does not match the shape */
    CODEC_ERR_ELEMENT,          /* an element out of its set (a bool byte that is not 0 or 1) */
    CODEC_ERR_NO_MEMORY,
} codec_error_kind;

typedef struct {
    codec_error_kind kind;
    /* The byte at fault, counted from the start of the text the call was
     * given (for the codec_doc_* calls: the document's start), and its line
     * and column, both from 1. line and column are 0 when the fault is not
     * at one byte (out of memory, a length that does not match a shape). */
    size_t offset;
    long line, column;
    char field[64];    /* what is at fault, as the caller named it: "q", "q.shape" */
    char message[300]; /* for people: "q[1][3] is a string; ..." (UTF-8, cut to fit) */
} codec_error;

/* ------------------------------------------------ strict JSON text */

/*
 * True when text[0..len) is exactly one JSON value by RFC 8259, strictly:
 * no comments, trailing commas, leading zeros, NaN/Infinity, single quotes,
 * control characters in strings or invalid escapes; valid UTF-8 (no overlong
 * forms, no surrogates encoded in UTF-8); \u escapes must pair surrogates;
 * whitespace is only space, tab, LF, CR; nesting at most CODEC_MAX_DEPTH.
 * Otherwise CODEC_ERR_SYNTAX, the message saying what and where:
 * "invalid JSON: expected ',' or ']' at byte 12 (line 1, column 13)".
 */
bool codec_validate(const char *text, size_t len, codec_error *err);

/* Where one member of an object lies in the text. */
typedef struct {
    const char *key_text;  /* the key's opening quote */
    const char *value;     /* first byte of the value */
    const char *value_end; /* byte after the value */
} codec_span;

/*
 * A validated text and what the validator noted on its way: where the
 * members of its top-level object lie, and the numbers of the long rows of
 * numbers it classified (which bytes belong to numbers, 64 bytes at a
 * time), so that codec_doc_tensor reads them without classifying them
 * again. The notes take at most 12 bytes for each 32 bytes of such rows;
 * when memory for them cannot be had, the readers read number by number.
 * The fields are the codec's: read them through the calls below.
 */
typedef struct {
    const char *text, *end;
    codec_span *spans;     /* the caller's: the first `cap` members */
    size_t cap, members;   /* members: all of them (0 when not an object) */
    uint32_t *block_at;    /* the rows' blocks: where each starts (bytes from text) */
    uint64_t *block_numbers; /* and its number bytes (bit i: byte i) */
    size_t n_blocks, block_cap;
} codec_doc;

/*
 * codec_validate, and on success *doc describes the text: the first `cap`
 * members' spans in spans[] (doc->members counts them all) and the rows.
 * On failure *doc holds nothing to free. The text must outlive the doc.
 */
bool codec_doc_validate(codec_doc *doc, const char *text, size_t len, codec_span *spans,
                        size_t cap, codec_error *err);

void codec_doc_free(codec_doc *doc);

/* ---------------------------------------------------------------- objects */

typedef struct {
    char key[64];           /* decoded (escapes resolved), NUL-terminated */
    bool key_too_long;      /* the decoded key did not fit, or holds a NUL (it is
                             * then no known field; codec_member_key_shown shows it) */
    const char *key_text;   /* the key's opening quote in the text */
    const char *value;      /* first byte of the value */
    const char *value_end;  /* byte after the value */
} codec_member;

/*
 * Lists the members of the object whose (validated) text starts at p, at
 * most `max`. Fails with CODEC_ERR_DUPLICATE_KEY (field = `where` + key)
 * when a key appears twice (compared after decoding escapes),
 * CODEC_ERR_TOO_MANY_MEMBERS when there are more than `max`, or
 * CODEC_ERR_WRONG_TYPE when p is not an object. `where` names the object in
 * fields and messages: "q" for a tensor object, and so on; "" for the
 * top-level one, which messages call "the request body".
 */
bool codec_members(const char *p, const char *end, codec_member *out, size_t max,
                   size_t *count, const char *where, codec_error *err);

/* codec_members of the document's top-level object, from the validator's
 * notes: the same members and the same errors, without walking the text. */
bool codec_doc_members(const codec_doc *doc, codec_member *out, size_t max, size_t *count,
                       const char *where, codec_error *err);

/* A member's key as a message may quote it: escaped as in a JSON string (an
 * escaped NUL shows as \u0000, not as the end of the key), cut with "..."
 * to fit cap; returns out. */
const char *codec_member_key_shown(const codec_member *m, char *out, size_t cap);

/* The byte just after the value that starts at p (after whitespace) in
 * validated text; never reads past `end`. */
const char *codec_skip_value(const char *p, const char *end);

/* Whitespace as RFC 8259 has it: space, tab, LF, CR. */
static inline const char *codec_skip_ws(const char *p, const char *end)
{
    /* most calls find a value byte straight away: one compare for those */
    while (p < end && (unsigned char)*p <= ' ' &&
           (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

/* What a value that starts with byte c is, in words: "a string", "null",
 * "a boolean", "an object", "an array", "a number" (or "something that is
 * not JSON"). */
const char *codec_kind_name(char c);

/* ---------------------------------------------------------------- scalars */

/*
 * Reads one JSON number (validated text) at p into the float32 that Python's
 * float() followed by a float32 conversion gives; *stop is the byte after it.
 * Returns false when the result is not finite as a float32 (1e39, -1e39).
 */
bool codec_parse_float(const char *p, const char *end, const char **stop, float *out);

typedef enum {
    CODEC_INT_OK,       /* an integer, |x| <= limit: *out holds it */
    CODEC_INT_FRACTION, /* |x| <= limit, but not an integer (2.5, 1e-400) */
    CODEC_INT_RANGE,    /* |x| > limit, integer or not */
} codec_int_result;

/*
 * Reads the JSON number (validated text) at p as an integer, exactly: its
 * decimal value decides, not a rounded double, so 2.0, 2e1 and -0 are
 * integers and 2.0000000000000000001 is not. limit is at most 10^18;
 * *stop is the byte after the number.
 */
codec_int_result codec_parse_integer(const char *p, const char *end, int64_t limit,
                                     const char **stop, int64_t *out);

/*
 * Decodes the JSON string whose opening quote is at p (validated text) into
 * out[0..cap): escapes resolved, \u surrogate pairs joined into UTF-8 (an
 * escaped NUL gives a NUL byte). Returns the full decoded length (which may
 * exceed cap: only cap bytes are written, no NUL is added) and, when after
 * is not NULL, sets *after to the byte after the closing quote.
 */
size_t codec_string_decode(const char *p, const char *end, char *out, size_t cap,
                           const char **after);

/* ---------------------------------------------------------------- tensors */

/* Element types. A decoded tensor is CODEC_F32 or CODEC_BOOL; CODEC_F16 and
 * CODEC_BF16 (IEEE binary16 and bfloat16) exist only as base64 data, read
 * into float32 exactly (or, by codec_doc_tensor_words, bfloat16 kept as
 * it was sent), and as the dtype of base64 outputs. */
typedef enum { CODEC_F32 = 0, CODEC_BOOL = 1, CODEC_F16 = 2, CODEC_BF16 = 3 } codec_dtype;

typedef struct {
    codec_dtype dtype;
    int rank;
    int64_t shape[CODEC_MAX_RANK];
    int64_t count;  /* product of shape */
    /* the elements, from codec_tensor_alloc (freed by codec_tensor_free) */
    float *f32;     /* CODEC_F32: `count` floats (NULL when count == 0) */
    uint8_t *b8;    /* CODEC_BOOL: `count` bytes, each 0 or 1 */
    uint16_t *bf16; /* CODEC_BF16: `count` bfloat16 words as sent */
    bool borrowed;  /* the elements are the caller's bytes (codec_tensor_view_raw):
                     * codec_tensor_free leaves them */
} codec_tensor;

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
 * accept_bool: true for masks, where true/false (or dtype "bool") give CODEC_BOOL.
 * Errors (field = `field`, or `field`.member): CODEC_ERR_WRONG_TYPE (not
 * one of the three forms; strings, nulls or objects as elements; booleans
 * where numbers are wanted; numbers mixed with booleans),
 * CODEC_ERR_UNKNOWN_MEMBER / CODEC_ERR_MISSING_MEMBER in the object forms,
 * CODEC_ERR_NOT_FINITE (1e39; a NaN or infinity in base64),
 * CODEC_ERR_BASE64, CODEC_ERR_RAGGED, CODEC_ERR_SHAPE_MISMATCH,
 * CODEC_ERR_SHAPE (negative, non-integer or too many dimensions,
 * overflowing product), CODEC_ERR_ELEMENT, CODEC_ERR_NO_MEMORY; in the
 * order of the kinds' classes (see codec_error_kind). A declared shape is
 * checked against the data before anything of its size is allocated. On
 * failure *t holds nothing to free.
 */
bool codec_tensor_decode(const char *p, const char *end, const char *field, bool accept_bool,
                         codec_tensor *t, codec_error *err);

/* codec_tensor_decode of a value [p, end) of the document: the same
 * tensor and errors, its rows read with the validator's notes. */
bool codec_doc_tensor(const codec_doc *doc, const char *p, const char *end, const char *field,
                      bool accept_bool, codec_tensor *t, codec_error *err);

/* codec_doc_tensor of a tensor of numbers, except that base64 bfloat16
 * data stays as it was sent: a CODEC_BF16 tensor of words (t->bf16, the
 * bytes taken as little-endian 16-bit words, every one finite), so that a
 * reader of bfloat16 needs no float32 copy. */
bool codec_doc_tensor_words(const codec_doc *doc, const char *p, const char *end,
                            const char *field, codec_tensor *t, codec_error *err);

/* A CODEC_BF16 tensor made CODEC_F32 (widened exactly, the words freed);
 * others are left as they are. False (CODEC_ERR_NO_MEMORY, field `field`,
 * t unchanged) when the floats cannot be had. */
bool codec_tensor_widen(codec_tensor *t, const char *field, codec_error *err);

void codec_tensor_free(codec_tensor *t);

/*
 * Where the elements of decoded tensors come from: by default malloc,
 * realloc and free. A server that wants one request's memory to serve the
 * next gives its own (alloc and realloc as malloc and realloc, free taking
 * what they gave or NULL; all thread-safe). Set it once, before the first
 * tensor is decoded, and keep it while a tensor it gave may be freed (NULL:
 * the default again). Only tensors' elements: texts (codec_buf) and
 * documents stay malloc's.
 */
typedef struct {
    void *(*alloc)(void *ctx, size_t bytes);
    void *(*realloc)(void *ctx, void *p, size_t bytes);
    void (*free)(void *ctx, void *p);
    void *ctx;
} codec_allocator;
void codec_set_allocator(const codec_allocator *a);
/* Element memory from that allocator (a tensor's f32, b8 or bf16). */
void *codec_tensor_alloc(size_t bytes);
void *codec_tensor_realloc(void *p, size_t bytes);
void codec_tensor_release(void *p);

/* The dtype's name ("float32", "float16", "bfloat16", "bool"). */
const char *codec_dtype_name(codec_dtype dtype);

/* ---------------------------------------------------------------- text out */

/* A growing text; after an allocation failure `failed` is set and further
 * appends do nothing, so that a writer checks once at the end. The bytes
 * are kept NUL-terminated. {0} is an empty buffer; data is malloc'd (a
 * caller may take it over and free it), or, with `elements` set, comes
 * from codec_tensor_alloc (taken over, it is freed with
 * codec_tensor_release): an answer that carries tensors is as large as
 * they are, and reused the same way. */
typedef struct {
    char *data;
    size_t len, cap;
    bool failed;
    bool elements;
} codec_buf;

void codec_buf_append(codec_buf *b, const char *s, size_t n);
void codec_buf_puts(codec_buf *b, const char *s);
void codec_buf_printf(codec_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* `"s"`: s as a JSON string (codec_escape_text, flags 0), quoted. */
void codec_buf_string(codec_buf *b, const char *s);
void codec_buf_free(codec_buf *b);

/* Appends the shortest decimal text that reads back (as float32) as exactly
 * f: 0.1f -> "0.1", 1e-7f -> "1e-07" or "1e-7", 3.0f -> "3.0" or "3"; -0.0f
 * -> "-0.0". Non-finite values, which JSON cannot carry, are written as null. */
void codec_buf_float(codec_buf *b, float f);

typedef enum {
    CODEC_ENC_NESTED = 0,      /* [[...], ...] */
    CODEC_ENC_FLAT = 1,        /* {"shape": [...], "data": [...]} */
    CODEC_ENC_BASE64 = 2,      /* {"shape": [...], "dtype": "float32", "base64": "..."} */
    CODEC_ENC_BASE64_F16 = 3,  /* the same with "dtype": "float16" (2 bytes each) */
    CODEC_ENC_BASE64_BF16 = 4, /* the same with "dtype": "bfloat16" */
} codec_encoding;

/* The dtype of an encoding's elements: CODEC_F32, CODEC_F16 or CODEC_BF16. */
codec_dtype codec_encoding_dtype(codec_encoding enc);

/* Appends the JSON text of a float32 tensor of `rank` (>= 1) dims `shape`.
 * The 2-byte base64 encodings round to nearest even; values they cannot
 * hold become infinite: check with codec_half_fits first. */
void codec_tensor_encode(codec_buf *b, const float *data, int rank, const int64_t *shape,
                         codec_encoding enc);

/* Where an exact search for the first special element (exponent all ones:
 * infinite or NaN) of the n little-endian elements of `dtype` (CODEC_F32,
 * CODEC_F16 or CODEC_BF16) at bytes must begin: the first block that may
 * hold one, or n when none does. Whole blocks are judged without a branch
 * an element, so that a clean tensor is passed at the memory's speed. */
size_t codec_special_start(const void *bytes, size_t n, codec_dtype dtype);

/* Do all n values of x stay finite when rounded to `dtype` (CODEC_F16 or
 * CODEC_BF16)? If not, *at is the first that does not. */
bool codec_half_fits(codec_dtype dtype, const float *x, size_t n, size_t *at);

/* Tensors as raw bytes (raw.c): little-endian, row-major, no padding.
 * codec_dtype_size: 4 for CODEC_F32, 2 for CODEC_F16 and CODEC_BF16, 1 for
 * CODEC_BOOL. codec_tensor_from_bytes reads `count` elements of `dtype`
 * (CODEC_F32, CODEC_F16 or CODEC_BF16) into float32, exactly;
 * codec_tensor_to_bytes writes them, the 2-byte dtypes rounded to nearest
 * even (check with codec_half_fits first); codec_tensor_round rounds x in
 * place to the values `dtype` holds (nothing for CODEC_F32). */
size_t codec_dtype_size(codec_dtype dtype);
void codec_tensor_from_bytes(codec_dtype dtype, const uint8_t *in, float *out, size_t count);
void codec_tensor_to_bytes(codec_dtype dtype, const float *in, uint8_t *out, size_t count);
void codec_tensor_round(codec_dtype dtype, float *x, size_t count);

/* A tensor of `rank` dims `shape` from its raw bytes (as above, exactly
 * codec_dtype_size(dtype) times the elements of bytes): a float32 tensor
 * for CODEC_F32, CODEC_F16 and CODEC_BF16 (widened exactly), a bool one for
 * CODEC_BOOL. Fails as the base64 form does on the same bytes:
 * CODEC_ERR_NOT_FINITE for a NaN or an infinity, CODEC_ERR_ELEMENT for a
 * bool byte that is not 0 or 1, CODEC_ERR_NO_MEMORY; then *t holds nothing
 * to free. */
/* Appends the count floats at x as raw bytes of dtype (CODEC_F32, CODEC_F16
 * or CODEC_BF16; as codec_tensor_to_bytes) to b, growing it once. */
void codec_buf_raw(codec_buf *b, codec_dtype dtype, const float *x, size_t count);

bool codec_tensor_from_raw(const uint8_t *bytes, codec_dtype dtype, int rank,
                           const int64_t *shape, const char *field, codec_tensor *t,
                           codec_error *err);

/* codec_tensor_from_raw, but without a copy where the bytes already are
 * the tensor's elements: CODEC_F32 on a little-endian machine at an
 * address aligned for a float, and CODEC_BOOL. Such a tensor is
 * `borrowed`: it points into bytes, which must outlive it unchanged (a
 * large binary body is then read once, by the checks, instead of copied
 * into fresh pages). Other dtypes are widened into memory of their own. */
bool codec_tensor_view_raw(const uint8_t *bytes, codec_dtype dtype, int rank,
                           const int64_t *shape, const char *field, codec_tensor *t,
                           codec_error *err);

/* ---------------------------------------------------------------- strings */

/*
 * Length of the well-formed UTF-8 sequence at s[0..avail) (avail >= 1): 1
 * for ASCII, 2..4 for a multi-byte sequence, 0 when the bytes there are not
 * one (Unicode 15, table 3-7: no overlong forms, no surrogates D800-DFFF,
 * nothing above U+10FFFF, no sequence cut short by avail).
 */
size_t codec_utf8_sequence(const unsigned char *s, size_t avail);

/* Is s[0..n) well-formed UTF-8 (every sequence as codec_utf8_sequence)? */
bool codec_utf8_valid(const char *s, size_t n);

/* n, less a multi-byte sequence cut short at the end of s[0..n) (its lead
 * byte announces more bytes than follow): what is left of a text that a
 * fixed-size buffer cut mid-character. */
size_t codec_utf8_uncut(const char *s, size_t n);

enum {
    /* Characters beyond ASCII as \uXXXX escapes (a surrogate pair above
     * U+FFFF), so that the text is ASCII, as Python's json.dumps writes by
     * default. Without it they are copied as UTF-8. */
    CODEC_ESCAPE_ASCII = 1u,
};

/* The most bytes codec_escape_text writes for n bytes of input (\u00XX for
 * a control character, \ufffd for a stray byte), without the NUL. */
#define CODEC_ESCAPED_MAX(n) (6 * (size_t)(n))

/*
 * Writes s[0..n) as the inside of a JSON string (no quotes) at out[0..cap).
 * Every input gives valid JSON: '"' and '\\' are escaped, control characters
 * (U+0000..U+001F, DEL) as \b \f \n \r \t or \u00XX, U+2028 and U+2029 as
 * \u2028 / \u2029 (line breaks to JavaScript), and each byte that does not
 * start a well-formed UTF-8 sequence as U+FFFD (the replacement character),
 * so that NUL bytes and broken text in s can neither end nor break the
 * string. flags: CODEC_ESCAPE_ASCII or 0.
 * Like snprintf: the output is NUL-terminated when cap > 0, cut only between
 * whole escapes or characters, and the return value is the length the whole
 * text needs (>= cap: it was cut).
 */
size_t codec_escape_text(char *out, size_t cap, const char *s, size_t n, unsigned flags);

/* ------------------------------------------------------ instruction sets */

/*
 * The widest instruction set the codec uses for its row classifier and its
 * float16 / bfloat16 conversions. Every width gives the same results; the
 * wider, the faster.
 */
typedef enum {
    CODEC_SIMD_PORTABLE, /* plain C (8 bytes a word) */
    CODEC_SIMD_SSE2,     /* every x86-64 */
    CODEC_SIMD_AVX2,     /* and F16C for float16 */
    CODEC_SIMD_AVX512,   /* AVX-512 F and BW (and BF16 for bfloat16, where the CPU has it) */
} codec_simd;

/* From now on, use the widest width this CPU runs that is not wider than
 * `widest` (without a call: the widest this CPU runs). For start-up: a
 * program that runs its own kernels at a chosen width sets the codec's to
 * match, so that a test run per width runs each of the codec's paths. */
void codec_set_simd(codec_simd widest);

/* The width in use, and a width's name: "portable", "sse2", "avx2", "avx512". */
codec_simd codec_simd_in_use(void);
const char *codec_simd_name(codec_simd simd);

#endif /* CODEC_H */
