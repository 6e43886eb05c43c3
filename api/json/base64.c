/*
 * Base64 as RFC 4648 section 4 defines it: the standard alphabet, '='
 * padding to a multiple of 4 characters, no line breaks or whitespace.
 * Decoding is strict (padding bits must be zero) so that one tensor has one
 * text, which is what Python's base64.b64encode and btoa() produce.
 */
#include "codec_internal.h"

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

char *codec_base64_encode(const uint8_t *in, size_t n, char *out)
{
    size_t i = 0;
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
