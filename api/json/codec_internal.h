/*
 * Plumbing shared by the files of the codec and its tests. Nothing outside
 * api/json/ needs these: users of the codec have codec.h.
 *
 *   json_validate.c  the strict RFC 8259 check every body goes through
 *   json_object.c    skipping values, listing an object's members
 *   json_string.c    UTF-8, escaping, decoding strings
 *   tensor_arrays.c  nested arrays of numbers or booleans into a tensor
 *   tensor_decode.c  the three tensor forms (nested, flat, base64)
 *   tensor_encode.c  tensors out, in the three forms
 *   number.c         decimal text -> float32 and integers
 *   row_scan.c       64 bytes of a row of numbers as bit masks
 *   float_text.c     float32 -> shortest decimal text
 *   half.c           float16 and bfloat16 <-> float32
 *   raw.c            tensors as raw little-endian bytes
 *   simd.c           what the CPU runs; the width the codec uses
 *   base64.c         base64
 *   buf.c            the growing text
 *   codec_error.c    filling a codec_error
 *   doc.c            the validator's notes for the readers
 */
#ifndef CODEC_INTERNAL_H
#define CODEC_INTERNAL_H

#include "codec.h"

#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef const char *cursor;

/* --------------------------------------------------------- codec_error.c */

/*
 * Fills e and returns false, so that a failing step can `return
 * codec_fail(...)`. `at` is the byte at fault in the text that starts at
 * `text` (offset, line and column are counted from there), or NULL when the
 * fault is not at one byte.
 */
bool codec_fail(codec_error *e, codec_error_kind kind, const char *field, cursor text,
                cursor at, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Is the error of the second class (the form is right, the sizes or values
 * are not), which gives way to an error of the first found later? */
static inline bool codec_error_is_late(const codec_error *e)
{
    return e->kind >= CODEC_ERR_RAGGED && e->kind <= CODEC_ERR_ELEMENT;
}

/* ----------------------------------------------------------------- buf.c */

/* Asks that the large buffer [p, p + len) be backed by 2 MiB pages where
 * the kernel offers them (Linux's transparent huge pages in "madvise"
 * mode, the default of many distributions): a buffer's first writes then
 * fault once per 2 MiB instead of once per 4 KiB. On a virtual machine,
 * where a fault can cost 10 us, that is most of the time of reading a
 * million numbers into fresh memory. Does nothing below 4 MiB. */
void codec_advise_huge(void *p, size_t len);

/* Makes room for n more bytes and returns where they go (b->len is not
 * advanced: the caller adds what it wrote), or NULL once b has failed. */
char *codec_buf_reserve(codec_buf *b, size_t n);

/* ----------------------------------------------------------- row_scan.c */

/* 64 bytes of a tensor row as bit masks (bit i: byte i), cut to the block
 * [0, len): the bytes up to and including the last comma that comes before
 * any byte of none of these classes. len is 0 when there is no such comma.
 * stop is where that first byte of no class is (a ']', an exponent's 'e'),
 * 64 when every byte has a class: from len to stop there is no comma, so a
 * block tried anywhere in between would be empty. */
typedef struct {
    uint64_t digit, zero, point, minus, comma, space; /* space: ' ', \n, \r, \t */
    unsigned len, stop;
} codec_row_block;

/* Classifies the 64 bytes at p (all of them readable) into b, at the width
 * in use (codec_simd_in_use) or at a given one (which the CPU must run). */
void codec_row_scan(const char *p, codec_row_block *b);
void codec_row_scan_with(const char *p, codec_row_block *b, codec_simd simd);

/* True when the block (len > 0) is, after optional whitespace, numbers
 * without an exponent part, each followed by optional whitespace and a
 * comma, every one valid JSON: what the validator would accept there. */
bool codec_row_grammar(const codec_row_block *b);

/* The points and minus signs among the 64 bytes at p (all readable), at
 * the width in use: with the bounds of a noted block's numbers, all that
 * reading them needs. */
void codec_row_signs(const char *p, uint64_t *point, uint64_t *minus);
void codec_row_signs_with(const char *p, uint64_t *point, uint64_t *minus, codec_simd simd);

/* The bytes of a block's numbers: digits, points and minus signs. */
static inline uint64_t codec_row_numbers(const codec_row_block *b)
{
    return b->digit | b->point | b->minus;
}

/* ---------------------------------------------------------- the row notes */

/* The validator notes a block of a row in the codec_doc when it holds at
 * least this many bytes: the few numbers of a shorter one (the tail of a
 * row, a row of a narrow tensor) are read one by one, which costs about
 * what a note saves, and the notes stay within 12 bytes per 32 of text. */
#define CODEC_NOTE_MIN_LEN 32

/* Notes a block (classified at p, its grammar checked) in doc; once memory
 * for notes cannot be had, stops noting (the readers classify for
 * themselves where there are no notes). */
void codec_doc_note(codec_doc *doc, cursor p, uint64_t numbers);

/* A reader's place in a document's notes, as it goes forward through the
 * text. */
typedef struct {
    const char *text;
    const uint32_t *at;
    const uint64_t *numbers;
    size_t i, n;
} codec_notes;

/* The notes of doc from the first block at or after p on. */
void codec_notes_from(codec_notes *notes, const codec_doc *doc, cursor p);

/* ------------------------------------------------------------- number.c */

/*
 * Reads the numbers of a tensor row, "1.5, -2, 3e-4", starting at a number
 * at p, into out[0..room): codec_parse_float in a loop, without a call per
 * number, and 64 bytes at a time where the row's bytes allow (with the
 * validator's notes where there are some: notes may be NULL). Stops after
 * `room` numbers or before anything but ", <number>". Returns how many were
 * read; *stop is where the caller goes on (after the last number and its
 * whitespace, on the ',' or ']' that follows). When a number is not finite
 * as a float32, *bad is its first byte and *stop the byte after it;
 * otherwise *bad is NULL.
 */
size_t codec_parse_float_row(const char *p, const char *end, float *out, size_t room,
                             const char **stop, const char **bad, codec_notes *notes);

/* ------------------------------------------------------------------ simd.c */

/* Does this CPU run the width? */
bool codec_simd_supported(codec_simd simd);

/* --------------------------------------------------------- float_text.c */

/* Room codec_float_text needs: its longest text is 19 bytes
 * ("-1000000000000000.0"), and it may scribble up to 24 bytes from `out`
 * (digits are stored 8 at a time, then overwritten). */
#define CODEC_FLOAT_TEXT_MAX 24

/* Writes the shortest decimal that reads back as f (see codec_buf_float) at
 * out, which has room for CODEC_FLOAT_TEXT_MAX bytes; returns the end. */
char *codec_float_text(float f, char *out);

/* Makes room for about n more bytes if memory allows, to save the regrowing
 * on the way; unlike codec_buf_reserve, failing here is not a failure of b. */
void codec_buf_hint(codec_buf *b, size_t n);

/* --------------------------------------------------------------- base64.c */

/* Length of the standard (RFC 4648, padded) base64 text of n bytes. */
size_t codec_base64_encoded_len(size_t n);

/* Writes the base64 text of in[0..n) at out; returns the end. */
char *codec_base64_encode(const uint8_t *in, size_t n, char *out);

/* The number of bytes that the base64 text s[0..len) holds, judged from its
 * length and padding alone; false when that cannot be base64 (len not a
 * multiple of 4, more than two '='). */
bool codec_base64_decoded_len(const char *s, size_t len, size_t *out);

/* Decodes s[0..len) (already sized by codec_base64_decoded_len) into out.
 * False on a character outside the alphabet, misplaced padding or non-zero
 * padding bits; *bad is then the offending offset in s. */
bool codec_base64_decode(const char *s, size_t len, uint8_t *out, size_t *bad);

/* The same, with AVX2 (which the CPU must run) or in plain C only. */
char *codec_base64_encode_with(const uint8_t *in, size_t n, char *out, bool avx2);
bool codec_base64_decode_with(const char *s, size_t len, uint8_t *out, size_t *bad, bool avx2);

/* ---------------------------------------------------------- json_string.c */

/* The value of the 4 hex digits at p, or -1. */
static inline long codec_hex4(cursor p, cursor end)
{
    if (end - p < 4)
        return -1;
    long v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = (unsigned char)p[i], h;
        if (c - '0' < 10)
            h = c - '0';
        else if ((c | 0x20) - 'a' < 6)
            h = (c | 0x20) - 'a' + 10;
        else
            return -1;
        v = v << 4 | h;
    }
    return v;
}

/* Do the strings whose opening quotes are at a and b (validated text) decode
 * to the same bytes? */
bool codec_string_equal(const char *a, const char *b, const char *end);

/* ---------------------------------------------------------- json_object.c */

/* codec_members, error offsets counted from `text`. */
bool codec_members_at(cursor text, cursor p, cursor end, codec_member *out, size_t max,
                      size_t *count, const char *where, codec_error *err);

/* ------------------------------------------- tensor_arrays.c (decoding) */

/* "q[1][3]": the element at idx[0..n) of field, cut to cap. */
void codec_element_name(char *dst, size_t cap, const char *field, const int64_t *idx, int n);

/* The elements read so far, in a buffer that grows by doubling. */
typedef struct {
    codec_dtype dtype;
    bool typed;    /* dtype is known (first element seen, or declared) */
    bool declared; /* by a "dtype" member, which the error then names */
    float *f32;
    uint8_t *b8;
    size_t n, cap;
    size_t hint;   /* a guess at the element count, for the first allocation */
} codec_store;

void codec_store_free(codec_store *s);

/* Moves a finished store into t (giving back an oversized buffer). */
void codec_store_to_tensor(codec_store *s, int rank, const int64_t *shape, codec_tensor *t);

/* A tensor being read: what every step of it needs. */
typedef struct {
    cursor text;       /* where error offsets count from */
    const char *field; /* the tensor's name in messages: "q" */
    bool accept_bool;  /* a mask: booleans (dtype "bool") allowed */
    bool keep_bf16;    /* base64 bfloat16 stays words (codec_doc_tensor_words) */
    codec_notes notes; /* the validator's notes on its rows; text NULL: no
                        * document, the rows are classified as they are read */
    codec_error *err;
} codec_reading;

/*
 * Reads nested arrays at p ('[') into s, checking that they are
 * rectangular. field: r->field, or the flat form's "q.data". max_depth:
 * CODEC_MAX_RANK for a tensor, 1 for "data" (flat). On success
 * shape[0..*rank) is filled and *after is the byte after the outermost
 * ']'. On failure r->err says why (field = `field`); s may hold memory
 * either way (codec_store_free).
 */
bool codec_read_arrays(codec_reading *r, const char *field, cursor p, cursor end,
                       int max_depth, codec_store *s, int *rank, int64_t *shape,
                       cursor *after);

/* -------------------------------------------------------------- half.c */

/* The conversion paths of half.c, for the tests to hold each to the
 * portable one; the codec uses codec_half_path_in_use(), which follows the
 * width in use (simd.c). */
typedef enum {
    CODEC_HALF_PORTABLE,
    CODEC_HALF_F16C,        /* AVX + F16C: float16, 8 lanes */
    CODEC_HALF_AVX512,      /* AVX-512F: float16 and bfloat16 widening, 16 lanes */
    CODEC_HALF_AVX512_BF16, /* and AVX512_BF16's vcvtne2ps2bf16 for narrowing */
} codec_half_path;

bool codec_half_path_supported(codec_half_path path);
codec_half_path codec_half_path_in_use(void);

/* n little-endian 2-byte elements of dtype (CODEC_F16 or CODEC_BF16) at in,
 * widened into out; and back, rounded to nearest even. */
void codec_half_to_f32(codec_dtype dtype, const uint8_t *in, float *out, size_t n,
                       codec_half_path path);
void codec_f32_to_half(codec_dtype dtype, const float *in, uint8_t *out, size_t n,
                       codec_half_path path);

/* One element each way, the portable reference. */
float codec_f16_to_f32_one(uint16_t h);
uint16_t codec_f32_to_f16_one(float f);
float codec_bf16_to_f32_one(uint16_t h);
uint16_t codec_f32_to_bf16_one(float f);

/* ----------------------------------------------------- starting a number */

/* '-' or a digit: one load and no branch on which, since in a tensor row
 * the sign is a coin toss for a branch predictor. */
static const bool codec_number_start[256] = {
    ['-'] = true, ['0'] = true, ['1'] = true, ['2'] = true, ['3'] = true,
    ['4'] = true, ['5'] = true, ['6'] = true, ['7'] = true, ['8'] = true, ['9'] = true,
};

static inline bool codec_starts_number(char c)
{
    return codec_number_start[(unsigned char)c];
}

/* ------------------------------------------- eight digits at a time (SWAR) */

/* The 8 bytes at p as one word, first byte lowest. */
static inline uint64_t codec_load8(const char *p)
{
    uint64_t x;
    memcpy(&x, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    x = __builtin_bswap64(x);
#endif
    return x;
}

/* Are all 8 bytes ASCII digits? Each byte is 0x30..0x3f, and adding 6
 * does not carry it past 0x3f (no carries between bytes: at most 0x45). */
static inline bool codec_all_digits8(uint64_t x)
{
    return (x & 0xf0f0f0f0f0f0f0f0u) == 0x3030303030303030u &&
           ((x + 0x0606060606060606u) & 0xf0f0f0f0f0f0f0f0u) == 0x3030303030303030u;
}

/* How many of the 8 bytes, from the first, are ASCII digits (0..8). A byte
 * is a digit when its high nibble is 3 and stays 3 after adding 6; a carry
 * out of a byte (>= 0xfa) only disturbs the bytes after it, which lie past
 * the first non-digit already. */
static inline int codec_leading_digits8(uint64_t x)
{
    uint64_t bad = ((x & 0xf0f0f0f0f0f0f0f0u) ^ 0x3030303030303030u) |
                   (((x + 0x0606060606060606u) & 0xf0f0f0f0f0f0f0f0u) ^ 0x3030303030303030u);
    /* bad has bits only in the high nibbles; shifted down 4 and with a
     * stop bit at 60, "no bad byte" counts as byte 8 without a branch */
    return (__builtin_ctzll(bad >> 4 | UINT64_C(1) << 60) + 4) / 8;
}

/* How many of the 16 bytes at p, from the first, are ASCII digits (0..16);
 * all 16 must be readable. SSE2 is part of every x86-64 CPU, so it needs no
 * dispatch; elsewhere two words of SWAR give the same answer. */
static inline int codec_digit_run16(const char *p)
{
#if defined(__SSE2__)
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)p);
    /* bytes - ('0' + 128): the digits become -128..-119, the rest above */
    __m128i t = _mm_sub_epi8(x, _mm_set1_epi8((char)('0' + 128)));
    unsigned digits = (unsigned)_mm_movemask_epi8(_mm_cmplt_epi8(t, _mm_set1_epi8(-128 + 10)));
    return __builtin_ctz(~digits); /* bit 16 of ~digits is set: at most 16 */
#else
    int a = codec_leading_digits8(codec_load8(p));
    int b = codec_leading_digits8(codec_load8(p + 8));
    return a + (b & -(a == 8));
#endif
}

/* The first `run` (0..8) ASCII digits of x as digit values (0..9) in the
 * last `run` bytes, i.e. with leading zeros before them (0 for no digits).
 * The bytes after the run may borrow when '0' is subtracted; they are
 * shifted out, in two steps so that no shift is by 64. */
static inline uint64_t codec_digit_values(uint64_t x, int run)
{
    return (x - 0x3030303030303030u) << (4 * (8 - run)) << (4 * (8 - run));
}

/* The number that 8 digit values spell (the first byte most significant):
 * pairs, quads and the whole by multiply-adds within the lanes of a word. */
static inline uint32_t codec_digits8_value(uint64_t d)
{
    d = (d * 10 + (d >> 8)) & 0x00ff00ff00ff00ffu;
    d = (d * 100 + (d >> 16)) & 0x0000ffff0000ffffu;
    d = (d * 10000 + (d >> 32)) & 0xffffffffu;
    return (uint32_t)d;
}

#endif /* CODEC_INTERNAL_H */
