/*
 * Plumbing shared by the files behind codec.h (json_text.c, tensor_codec.c,
 * number.c, float_text.c, base64.c, buf.c) and their tests. Nothing outside
 * the codec needs these: handlers use codec.h.
 */
#ifndef API_CODEC_INTERNAL_H
#define API_CODEC_INTERNAL_H

#include "codec.h"

#include <string.h>

/* ----------------------------------------------------------------- buf.c */

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

/* ------------------------------------------------------------ json_text.c */

/*
 * Decodes the JSON string whose opening quote is at p (validated text) into
 * out[0..cap): escapes resolved, \u surrogate pairs joined into UTF-8.
 * Returns the full decoded length (which may exceed cap: only cap bytes are
 * written, no NUL is added) and sets *after to the byte after the closing
 * quote. Never reads at or past end.
 */
size_t json_string_decode(const char *p, const char *end, char *out,
                          size_t cap, const char **after);

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
    return bad ? __builtin_ctzll(bad) / 8 : 8;
}

/* The first `run` (1..8) ASCII digits of x as digit values (0..9) in the
 * last `run` bytes, i.e. with leading zeros before them. The bytes after
 * the run may borrow when '0' is subtracted; they are shifted out. */
static inline uint64_t api_digit_values(uint64_t x, int run)
{
    return (x - 0x3030303030303030u) << (8 * (8 - run));
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
