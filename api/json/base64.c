/*
 * Base64 as RFC 4648 section 4 defines it: the standard alphabet, '='
 * padding to a multiple of 4 characters, no line breaks or whitespace.
 * Decoding is strict (padding bits must be zero) so that one tensor has one
 * text, which is what Python's base64.b64encode and btoa() produce.
 *
 * A tensor's text is one long run of quads, which a table lookup a
 * character converts at a fraction of the memory's speed: with AVX2, 32
 * characters are converted at once, checked and turned into their 6-bit
 * values by range comparisons, the values packed into bytes by two
 * multiply-adds and a shuffle, and the other way round for encoding. The
 * plain C below is the reference and does the rest (the tail, the
 * padding, and a block with a character outside the alphabet, to say
 * where).
 */
#include "codec_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BASE64_X86 1
#include <immintrin.h>
#endif

static const char alphabet[64] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* 1 + the 6-bit value of each character; 0 outside the alphabet ('=' too). */
static const uint8_t code_of[256] = {
    ['A'] = 1, ['B'] = 2, ['C'] = 3, ['D'] = 4, ['E'] = 5, ['F'] = 6, ['G'] = 7,
    ['H'] = 8, ['I'] = 9, ['J'] = 10, ['K'] = 11, ['L'] = 12, ['M'] = 13,
    ['N'] = 14, ['O'] = 15, ['P'] = 16, ['Q'] = 17, ['R'] = 18, ['S'] = 19,
    ['T'] = 20, ['U'] = 21, ['V'] = 22, ['W'] = 23, ['X'] = 24, ['Y'] = 25,
    ['Z'] = 26, ['a'] = 27, ['b'] = 28, ['c'] = 29, ['d'] = 30, ['e'] = 31,
    ['f'] = 32, ['g'] = 33, ['h'] = 34, ['i'] = 35, ['j'] = 36, ['k'] = 37,
    ['l'] = 38, ['m'] = 39, ['n'] = 40, ['o'] = 41, ['p'] = 42, ['q'] = 43,
    ['r'] = 44, ['s'] = 45, ['t'] = 46, ['u'] = 47, ['v'] = 48, ['w'] = 49,
    ['x'] = 50, ['y'] = 51, ['z'] = 52, ['0'] = 53, ['1'] = 54, ['2'] = 55,
    ['3'] = 56, ['4'] = 57, ['5'] = 58, ['6'] = 59, ['7'] = 60, ['8'] = 61,
    ['9'] = 62, ['+'] = 63, ['/'] = 64,
};

size_t codec_base64_encoded_len(size_t n)
{
    return (n + 2) / 3 * 4;
}

#ifdef BASE64_X86
/* The characters of 32 6-bit values (bytes 0..63): 'A' + x, 'a' + x - 26,
 * '0' + x - 52, '+' and '/', each an offset added to x. */
__attribute__((target("avx2"))) static __m256i characters_avx2(__m256i x)
{
    __m256i off = _mm256_set1_epi8('A');
    off = _mm256_blendv_epi8(off, _mm256_set1_epi8('a' - 26),
                             _mm256_cmpgt_epi8(x, _mm256_set1_epi8(25)));
    off = _mm256_blendv_epi8(off, _mm256_set1_epi8('0' - 52),
                             _mm256_cmpgt_epi8(x, _mm256_set1_epi8(51)));
    off = _mm256_blendv_epi8(off, _mm256_set1_epi8('+' - 62),
                             _mm256_cmpeq_epi8(x, _mm256_set1_epi8(62)));
    off = _mm256_blendv_epi8(off, _mm256_set1_epi8('/' - 63),
                             _mm256_cmpeq_epi8(x, _mm256_set1_epi8(63)));
    return _mm256_add_epi8(x, off);
}

/* 24 bytes at a time to 32 characters while 28 bytes can be read (each
 * 128-bit half loads 16 bytes and uses 12); returns the bytes done. */
__attribute__((target("avx2"))) static size_t encode_avx2(const uint8_t *in, size_t n,
                                                            char **out)
{
    /* Each 32-bit lane gets its 3 bytes b0 b1 b2 as b1 b0 b2 b1: the
     * 16-bit words b0:b1 and b1:b2 then hold the four 6-bit fields at bits
     * 15..10, 9..4 (first word) and 11..6, 5..0 (second word). */
    const __m256i spread = _mm256_setr_epi8(1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10,
                                            1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10);
    size_t i = 0;
    char *o = *out;
    for (; n - i >= 28; i += 24, o += 32) {
        __m128i lo = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
        __m128i hi = _mm_loadu_si128((const __m128i *)(const void *)(in + i + 12));
        __m256i w = _mm256_shuffle_epi8(_mm256_set_m128i(hi, lo), spread);
        /* Fields 1 and 3 (bits 15..10 and 11..6) down to bits 5..0 of
         * their words by a high multiply; fields 2 and 4 (9..4, 5..0) up to
         * bits 13..8 by a low one: the four values, one a byte. */
        __m256i a = _mm256_mulhi_epu16(_mm256_and_si256(w, _mm256_set1_epi32(0x0fc0fc00)),
                                       _mm256_set1_epi32(0x04000040));
        __m256i b = _mm256_mullo_epi16(_mm256_and_si256(w, _mm256_set1_epi32(0x003f03f0)),
                                       _mm256_set1_epi32(0x01000010));
        _mm256_storeu_si256((__m256i *)(void *)o, characters_avx2(_mm256_or_si256(a, b)));
    }
    *out = o;
    return i;
}

/* The 6-bit values of 32 characters into *values; false when one of them
 * is outside the alphabet ('=' included). */
__attribute__((target("avx2"))) static bool values_avx2(__m256i c, __m256i *values)
{
#define IN_RANGE(lo, hi) \
    _mm256_and_si256(_mm256_cmpgt_epi8(c, _mm256_set1_epi8((char)((lo) - 1))), \
                     _mm256_cmpgt_epi8(_mm256_set1_epi8((char)((hi) + 1)), c))
    /* Signed comparisons: bytes >= 0x80 are negative, in no range. */
    __m256i upper = IN_RANGE('A', 'Z'), lower = IN_RANGE('a', 'z'), digit = IN_RANGE('0', '9');
#undef IN_RANGE
    __m256i plus = _mm256_cmpeq_epi8(c, _mm256_set1_epi8('+'));
    __m256i slash = _mm256_cmpeq_epi8(c, _mm256_set1_epi8('/'));
    __m256i off = _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(upper, _mm256_set1_epi8(-'A')),
                        _mm256_and_si256(lower, _mm256_set1_epi8(26 - 'a'))),
        _mm256_or_si256(_mm256_and_si256(digit, _mm256_set1_epi8(52 - '0')),
                        _mm256_or_si256(_mm256_and_si256(plus, _mm256_set1_epi8(62 - '+')),
                                        _mm256_and_si256(slash, _mm256_set1_epi8(63 - '/')))));
    __m256i known = _mm256_or_si256(_mm256_or_si256(upper, lower),
                                    _mm256_or_si256(digit, _mm256_or_si256(plus, slash)));
    *values = _mm256_add_epi8(c, off);
    return _mm256_movemask_epi8(known) == -1;
}

/* 32 characters at a time to 24 bytes while `len` leaves room for the
 * 32-byte store; stops before a block with a character outside the
 * alphabet. Returns the characters done. */
__attribute__((target("avx2"))) static size_t decode_avx2(const unsigned char *s, size_t len,
                                                            uint8_t **out)
{
    /* Within a 128-bit half, the 3 bytes of each 32-bit lane (the value
     * v0 v1 v2 v3 as bits 23..0, little-endian) in text order, then the
     * two halves' 12 bytes side by side. */
    const __m256i order = _mm256_setr_epi8(2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1,
                                           2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1);
    const __m256i halves = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7);
    size_t i = 0;
    uint8_t *o = *out;
    for (; len - i >= 44; i += 32, o += 24) {
        __m256i v;
        if (!values_avx2(_mm256_loadu_si256((const __m256i *)(const void *)(s + i)), &v))
            break;
        /* v0 * 64 + v1 and v2 * 64 + v3 in each 16-bit word, then the
         * first * 4096 + the second in each 32-bit lane. */
        __m256i pairs = _mm256_maddubs_epi16(v, _mm256_set1_epi32(0x01400140));
        __m256i quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(0x00011000));
        __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(quads, order), halves);
        _mm256_storeu_si256((__m256i *)(void *)o, bytes);
    }
    *out = o;
    return i;
}
#endif

static bool wide(void)
{
#ifdef BASE64_X86
    return codec_simd_in_use() >= CODEC_SIMD_AVX2;
#else
    return false;
#endif
}

char *codec_base64_encode(const uint8_t *in, size_t n, char *out)
{
    return codec_base64_encode_with(in, n, out, wide());
}

char *codec_base64_encode_with(const uint8_t *in, size_t n, char *out, bool avx2)
{
    size_t i = 0;
#ifdef BASE64_X86
    if (avx2)
        i = encode_avx2(in, n, &out);
#else
    (void)avx2;
#endif
    for (; i + 3 <= n; i += 3) {
        uint32_t x = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[0] = alphabet[x >> 18];
        out[1] = alphabet[(x >> 12) & 63];
        out[2] = alphabet[(x >> 6) & 63];
        out[3] = alphabet[x & 63];
        out += 4;
    }
    if (n - i == 1) {
        uint32_t x = (uint32_t)in[i] << 16;
        out[0] = alphabet[x >> 18];
        out[1] = alphabet[(x >> 12) & 63];
        out[2] = '=';
        out[3] = '=';
        out += 4;
    } else if (n - i == 2) {
        uint32_t x = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
        out[0] = alphabet[x >> 18];
        out[1] = alphabet[(x >> 12) & 63];
        out[2] = alphabet[(x >> 6) & 63];
        out[3] = '=';
        out += 4;
    }
    return out;
}

bool codec_base64_decoded_len(const char *s, size_t len, size_t *out)
{
    if (len % 4 != 0)
        return false;
    size_t pad = 0;
    while (pad < len && pad < 3 && s[len - 1 - pad] == '=')
        pad++;
    if (pad > 2)
        return false;
    *out = len / 4 * 3 - pad;
    return true;
}

bool codec_base64_decode(const char *s, size_t len, uint8_t *out, size_t *bad)
{
    return codec_base64_decode_with(s, len, out, bad, wide());
}

bool codec_base64_decode_with(const char *s, size_t len, uint8_t *out, size_t *bad, bool avx2)
{
    if (len % 4 != 0) {
        *bad = len;
        return false;
    }
    const unsigned char *u = (const unsigned char *)s;
    size_t pad = 0;
    while (pad < len && pad < 2 && u[len - 1 - pad] == '=')
        pad++;
    size_t full = len - (pad ? 4 : 0); /* quads without padding */
    size_t i = 0;
#ifdef BASE64_X86
    if (avx2)
        i = decode_avx2(u, full, &out);
#else
    (void)avx2;
#endif
    for (; i < full; i += 4) {
        uint32_t c0 = code_of[u[i]], c1 = code_of[u[i + 1]],
                 c2 = code_of[u[i + 2]], c3 = code_of[u[i + 3]];
        if (!c0 || !c1 || !c2 || !c3) {
            *bad = i + (!c0 ? 0 : !c1 ? 1 : !c2 ? 2 : 3);
            return false;
        }
        uint32_t x = (c0 - 1) << 18 | (c1 - 1) << 12 | (c2 - 1) << 6 | (c3 - 1);
        out[0] = (uint8_t)(x >> 16);
        out[1] = (uint8_t)(x >> 8);
        out[2] = (uint8_t)x;
        out += 3;
    }
    if (!pad)
        return true;
    /* the last quad: 2 or 3 characters, then the padding */
    size_t keep = 4 - pad;
    uint32_t x = 0;
    for (size_t k = 0; k < keep; k++) {
        uint32_t c = code_of[u[i + k]];
        if (!c) {
            *bad = i + k;
            return false;
        }
        x |= (c - 1) << (18 - 6 * k);
    }
    /* bits that the padding says are unused must be zero */
    if ((pad == 2 && (x & 0xffff)) || (pad == 1 && (x & 0xff))) {
        *bad = i + keep - 1;
        return false;
    }
    out[0] = (uint8_t)(x >> 16);
    if (pad == 1)
        out[1] = (uint8_t)(x >> 8);
    return true;
}
