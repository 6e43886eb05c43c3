/*
 * Plumbing shared by the files behind codec.h and their tests. Nothing
 * outside api/json/ needs these: handlers use codec.h (and json_string.h).
 *
 *   json_validate.c  the strict RFC 8259 check every body goes through
 *   json_object.c    skipping values, listing an object's members
 *   json_string.c    UTF-8, escaping, decoding strings
 *   tensor_arrays.c  nested arrays of numbers or booleans into a tensor
 *   tensor_decode.c  the three tensor forms (nested, flat, base64)
 *   tensor_encode.c  tensors out, in the three forms
 *   number.c         decimal text -> float32
 *   float_text.c     float32 -> shortest decimal text
 *   half.c           float16 and bfloat16 <-> float32
 *   base64.c, buf.c  base64; the growing output buffer
 */
#ifndef API_CODEC_INTERNAL_H
#define API_CODEC_INTERNAL_H

#include "codec.h"

#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ----------------------------------------------------------------- buf.c */

/* Asks that the large buffer [p, p + len) be backed by 2 MiB pages where
 * the kernel offers them (Linux's transparent huge pages in "madvise"
 * mode, the default of many distributions): a buffer's first writes then
 * fault once per 2 MiB instead of once per 4 KiB. On a virtual machine,
 * where a fault can cost 10 us, that is most of the time of reading a
 * million numbers into fresh memory. Does nothing below 4 MiB. */
void api_advise_huge(void *p, size_t len);

/* Makes room for n more bytes and returns where they go (b->len is not
 * advanced: the caller adds what it wrote), or NULL once b has failed. */
char *api_buf_reserve(api_buf *b, size_t n);

/* ------------------------------------------------------------- number.c */

/*
 * Reads the numbers of a tensor row, "1.5, -2, 3e-4", starting at a number
 * at p, into out[0..room): api_parse_number in a loop, without a call per
 * number. Stops after `room` numbers or before anything but ", <number>".
 * Returns how many were read; *stop is where the caller goes on (after the
 * last number and its whitespace, on the ',' or ']' that follows). When a
 * number is not finite as a float32, *bad is its first byte and *stop the
 * byte after it; otherwise *bad is NULL.
 */
size_t api_parse_number_row(const char *p, const char *end, float *out, size_t room,
                            const char **stop, const char **bad);

/* ----------------------------------------------------------- row_scan.c */

/* 64 bytes of a tensor row as bit masks (bit i: byte i), cut to the block
 * [0, len): the bytes up to and including the last comma that comes before
 * any byte of none of these classes. len is 0 when there is no such comma. */
typedef struct {
    uint64_t digit, zero, point, minus, comma, space; /* space: ' ', \n, \r, \t */
    unsigned len;
} row_block;

/* The classifier's instruction sets; row_scan_block uses the widest this
 * CPU runs, or the one matching ATTN_KERNEL (generic: portable). */
typedef enum { ROW_SCAN_PORTABLE, ROW_SCAN_SSE2, ROW_SCAN_AVX2, ROW_SCAN_AVX512 } row_scan_path;

bool row_scan_supported(row_scan_path path);
row_scan_path row_scan_chosen(void);
const char *row_scan_path_name(row_scan_path path);

/* Classifies the 64 bytes at p (all of them readable) into b. */
void row_scan_block(const char *p, row_block *b);
void row_scan_block_path(const char *p, row_block *b, row_scan_path path);

/* True when the block (len > 0) is, after optional whitespace, numbers
 * without an exponent part, each followed by optional whitespace and a
 * comma, every one valid JSON: what the validator would accept there. */
bool row_block_grammar(const row_block *b);

/* --------------------------------------------------------- float_text.c */

/* Room api_float_text needs: its longest text is 19 bytes
 * ("-1000000000000000.0"), and it may scribble up to 24 bytes from `out`
 * (digits are stored 8 at a time, then overwritten). */
#define API_FLOAT_TEXT_MAX 24

/* Writes the shortest decimal that reads back as f (see api_buf_float) at
 * out, which has room for API_FLOAT_TEXT_MAX bytes; returns the end. */
char *api_float_text(float f, char *out);

/* Makes room for about n more bytes if memory allows, to save the regrowing
 * on the way; unlike api_buf_reserve, failing here is not a failure of b. */
void api_buf_hint(api_buf *b, size_t n);

/* --------------------------------------------------------------- base64.c */

/* Length of the standard (RFC 4648, padded) base64 text of n bytes. */
size_t api_base64_encoded_len(size_t n);

/* Writes the base64 text of in[0..n) at out; returns the end. */
char *api_base64_encode(const uint8_t *in, size_t n, char *out);

/* The number of bytes that the base64 text s[0..len) holds, judged from its
 * length and padding alone; false when that cannot be base64 (len not a
 * multiple of 4, more than two '='). */
bool api_base64_decoded_len(const char *s, size_t len, size_t *out);

/* Decodes s[0..len) (already sized by api_base64_decoded_len) into out.
 * False on a character outside the alphabet, misplaced padding or non-zero
 * padding bits; *bad is then the offending offset in s. */
bool api_base64_decode(const char *s, size_t len, uint8_t *out, size_t *bad);

/* ---------------------------------------------------------- json_string.c */

typedef const char *cursor;

/* The value of the 4 hex digits at p, or -1. */
static inline long json_hex4(cursor p, cursor end)
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

/*
 * Decodes the JSON string whose opening quote is at p (validated text) into
 * out[0..cap): escapes resolved, \u surrogate pairs joined into UTF-8.
 * Returns the full decoded length (which may exceed cap: only cap bytes are
 * written, no NUL is added) and sets *after to the byte after the closing
 * quote. Never reads at or past end.
 */
size_t json_string_decode(const char *p, const char *end, char *out,
                          size_t cap, const char **after);

/* Do the strings whose opening quotes are at a and b (validated text) decode
 * to the same bytes? */
bool json_string_equal(const char *a, const char *b, const char *end);

/* ------------------------------------------- tensor_arrays.c (decoding) */

static inline bool tensor_starts_number(char c)
{
    return c == '-' || (unsigned char)(c - '0') < 10;
}

/* What a value starting with byte c is, in words: "a string", "null", ... */
const char *tensor_kind_of(char c);

/* "q[1][3]": the element at idx[0..n) of field, cut to cap. */
void tensor_element_name(char *dst, size_t cap, const char *field, const int64_t *idx, int n);

/* The elements read so far, in a buffer that grows by doubling. */
typedef struct {
    api_dtype dtype;
    bool typed;    /* dtype is known (first element seen, or declared) */
    bool declared; /* by a "dtype" member, which the error then names */
    float *f32;
    uint8_t *b8;
    size_t n, cap;
    size_t hint;   /* a guess at the element count, for the first allocation */
} tensor_store;

void tensor_store_free(tensor_store *s);

/* Moves a finished store into t (giving back an oversized buffer). */
void tensor_store_to_tensor(tensor_store *s, int rank, const int64_t *shape, api_tensor *t);

/*
 * Reads nested arrays at p ('[') into s, checking that they are
 * rectangular. max_depth: API_MAX_RANK for a tensor, 1 for "data" (flat).
 * On success shape[0..*rank) is filled and *after is the byte after the
 * outermost ']'. On failure err says why (field = `field`); s may hold
 * memory either way (tensor_store_free).
 */
bool tensor_read_arrays(cursor p, cursor end, const char *field, bool accept_bool,
                        int max_depth, tensor_store *s, int *rank, int64_t *shape,
                        cursor *after, api_error *err);

/* -------------------------------------------------------------- half.c */

/* The conversion paths of half.c, for the tests to hold each to the
 * portable one; the codec uses api_half_best_path(). */
typedef enum {
    API_HALF_PORTABLE,
    API_HALF_F16C,        /* AVX + F16C: float16, 8 lanes */
    API_HALF_AVX512,      /* AVX-512F: float16 and bfloat16 widening, 16 lanes */
    API_HALF_AVX512_BF16, /* and AVX512_BF16's vcvtne2ps2bf16 for narrowing */
} api_half_path;

bool api_half_path_supported(api_half_path path);
api_half_path api_half_best_path(void);

/* n little-endian 2-byte elements of dtype (API_F16 or API_BF16) at in,
 * widened into out; and back, rounded to nearest even. */
void api_half_to_f32(api_dtype dtype, const uint8_t *in, float *out, size_t n,
                     api_half_path path);
void api_f32_to_half(api_dtype dtype, const float *in, uint8_t *out, size_t n,
                     api_half_path path);

/* One element each way, the portable reference. */
float api_f16_to_f32_one(uint16_t h);
uint16_t api_f32_to_f16_one(float f);
float api_bf16_to_f32_one(uint16_t h);
uint16_t api_f32_to_bf16_one(float f);

/* ----------------------------------------------------- starting a number */

/* '-' or a digit: one load and no branch on which, since in a tensor row
 * the sign is a coin toss for a branch predictor. */
static const bool api_number_start[256] = {
    ['-'] = true, ['0'] = true, ['1'] = true, ['2'] = true, ['3'] = true,
    ['4'] = true, ['5'] = true, ['6'] = true, ['7'] = true, ['8'] = true, ['9'] = true,
};

static inline bool api_starts_number(char c)
{
    return api_number_start[(unsigned char)c];
}

/* ------------------------------------------- eight digits at a time (SWAR) */

/* The 8 bytes at p as one word, first byte lowest. */
static inline uint64_t api_load8(const char *p)
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
static inline bool api_all_digits8(uint64_t x)
{
    return (x & 0xf0f0f0f0f0f0f0f0u) == 0x3030303030303030u &&
           ((x + 0x0606060606060606u) & 0xf0f0f0f0f0f0f0f0u) == 0x3030303030303030u;
}

/* How many of the 8 bytes, from the first, are ASCII digits (0..8). A byte
 * is a digit when its high nibble is 3 and stays 3 after adding 6; a carry
 * out of a byte (>= 0xfa) only disturbs the bytes after it, which lie past
 * the first non-digit already. */
static inline int api_leading_digits8(uint64_t x)
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
static inline int api_digit_run16(const char *p)
{
#if defined(__SSE2__)
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)p);
    /* bytes - ('0' + 128): the digits become -128..-119, the rest above */
    __m128i t = _mm_sub_epi8(x, _mm_set1_epi8((char)('0' + 128)));
    unsigned digits = (unsigned)_mm_movemask_epi8(_mm_cmplt_epi8(t, _mm_set1_epi8(-128 + 10)));
    return __builtin_ctz(~digits); /* bit 16 of ~digits is set: at most 16 */
#else
    int a = api_leading_digits8(api_load8(p));
    int b = api_leading_digits8(api_load8(p + 8));
    return a + (b & -(a == 8));
#endif
}

/* The first `run` (0..8) ASCII digits of x as digit values (0..9) in the
 * last `run` bytes, i.e. with leading zeros before them (0 for no digits).
 * The bytes after the run may borrow when '0' is subtracted; they are
 * shifted out, in two steps so that no shift is by 64. */
static inline uint64_t api_digit_values(uint64_t x, int run)
{
    return (x - 0x3030303030303030u) << (4 * (8 - run)) << (4 * (8 - run));
}

/* The number that 8 digit values spell (the first byte most significant):
 * pairs, quads and the whole by multiply-adds within the lanes of a word. */
static inline uint32_t api_digits8_value(uint64_t d)
{
    d = (d * 10 + (d >> 8)) & 0x00ff00ff00ff00ffu;
    d = (d * 100 + (d >> 16)) & 0x0000ffff0000ffffu;
    d = (d * 10000 + (d >> 32)) & 0xffffffffu;
    return (uint32_t)d;
}

#endif /* API_CODEC_INTERNAL_H */
