/*
 * bfloat16 as libattn rounds to it, in scalar C: the definition that the
 * vector kernels (kern_*.c) reproduce lane by lane and that the public
 * attn_bf16_round exposes. Private to libattn.
 *
 * A bfloat16 is the top 16 bits of a float32 (sign, the same 8-bit
 * exponent, 7 stored significand bits), so rounding keeps the float32 type
 * with the low 16 bits zero:
 *   - round to nearest, ties to even, on the 16 bits dropped;
 *   - float32 subnormals (|x| < 2^-126) become zero of their sign: bfloat16
 *     arithmetic (vdpbf16ps, AMX) reads subnormal operands as zero;
 *   - a finite x that rounds past the largest finite bfloat16 (|x| >=
 *     0x1.ffp127) saturates to +-0x1.fep127, so that finite inputs stay
 *     finite; infinities stay, a NaN stays a (quiet) NaN.
 * A word of two bfloat16s (a "pair") holds element 2t in its low half and
 * element 2t + 1 in its high half, as vdpbf16ps reads them.
 */
#ifndef ATTN_BF16_H
#define ATTN_BF16_H

#include <stdint.h>
#include <string.h>

#define BF16_EXP 0x7F800000u
#define BF16_SIGN 0x80000000u
#define BF16_HIGH 0xFFFF0000u
#define BF16_MAX_BITS 0x7F7F0000u /* the largest finite bfloat16, as float bits */
#define BF16_QUIET 0x00400000u

/* The bits of float32 x rounded to bfloat16 (low half zero). */
static inline uint32_t bf16_round_bits(uint32_t b)
{
    const uint32_t exp = b & BF16_EXP, sign = b & BF16_SIGN;
    if (exp == 0)
        return sign;
    if (exp == BF16_EXP)
        return ((b & ~BF16_SIGN) > BF16_EXP ? b | BF16_QUIET : b) & BF16_HIGH;
    uint32_t r = b + 0x7FFFu + ((b >> 16) & 1u);
    if ((r & BF16_EXP) == BF16_EXP)
        return sign | BF16_MAX_BITS;
    return r & BF16_HIGH;
}

static inline float bf16_round(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    b = bf16_round_bits(b);
    memcpy(&x, &b, sizeof x);
    return x;
}

/* The pair word of two floats: bf16(lo) in the low half, bf16(hi) high. */
static inline uint32_t bf16_pair(float lo, float hi)
{
    uint32_t a, b;
    memcpy(&a, &lo, sizeof a);
    memcpy(&b, &hi, sizeof b);
    return (bf16_round_bits(a) >> 16) | bf16_round_bits(b);
}

#endif /* ATTN_BF16_H */
