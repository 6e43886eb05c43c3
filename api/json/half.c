/*
 * float16 and bfloat16 <-> float32 for base64 tensors of 2-byte elements, as
 * half-precision models store them.
 *
 * Widening is exact: every float16 and bfloat16 value is a float32. The
 * narrowing rounds to nearest, ties to even, as PyTorch's .to(torch.float16)
 * and .to(torch.bfloat16) do: subnormal results are kept, values past the
 * largest finite one become infinity (a writer that must not send those
 * checks with codec_half_fits first), and a NaN stays a (quiet) NaN.
 *
 * Three paths, following the codec's width in use (simd.c, which asks
 * cpu/cpu_features.h what this CPU runs): AVX-512 (vcvtph2ps /
 * vcvtps2ph on 16 lanes, vcvtne2ps2bf16 with AVX512_BF16), F16C with AVX
 * (8 lanes), and portable C. They give the same bits for every input;
 * tests/test_codec.c holds each path the CPU supports to the portable one
 * over every float16 and bfloat16 and over every float32 rounding case.
 * vcvtne2ps2bf16 reads float32 subnormals as zero, so the few vectors that
 * hold one are redone by the portable code.
 */
#include "codec_internal.h"

#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HALF_X86 1
#endif

/* ------------------------------------------------------------ portable */

static inline uint16_t load_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline void store_le16(uint8_t *p, uint16_t h)
{
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static inline float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float codec_f16_to_f32_one(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = h >> 10 & 0x1f, m = h & 0x3ff;
    if (e == 0) /* zero or subnormal: m * 2^-24, exact in float32 */
        return from_bits(to_bits((float)m * 0x1p-24f) | sign);
    if (e == 31) /* infinity, or NaN made quiet */
        return from_bits(sign | 0x7f800000u | (m ? 0x400000u : 0) | m << 13);
    return from_bits(sign | (e + 112) << 23 | m << 13); /* rebias 15 -> 127 */
}

uint16_t codec_f32_to_f16_one(float f)
{
    uint32_t x = to_bits(f), a = x & 0x7fffffffu;
    uint16_t sign = (uint16_t)(x >> 16 & 0x8000);
    if (a > 0x7f800000u) /* NaN: quiet, the top of its payload kept */
        return (uint16_t)(sign | 0x7e00 | (a >> 13 & 0x3ff));
    if (a >= 0x477ff000u) /* from 65520 (the tie above 65504 goes up): infinity */
        return sign | 0x7c00;
    if (a >= 0x38800000u) { /* a normal float16: rebias, round at bit 13 */
        uint32_t r = a - 0x38000000u;
        r += 0xfff + (r >> 13 & 1);
        return (uint16_t)(sign | r >> 13);
    }
    if (a < 0x33000000u) /* up to 2^-25 (a tie with 0, which is even): zero */
        return sign;
    /* a subnormal float16: the 24-bit significand in units of 2^-24 */
    uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000;
    int shift = 126 - (int)e; /* 14..24 */
    uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    q += rest > half || (rest == half && (q & 1));
    return (uint16_t)(sign | q);
}

float codec_bf16_to_f32_one(uint16_t h)
{
    return from_bits((uint32_t)h << 16); /* NaNs come through as they are */
}

uint16_t codec_f32_to_bf16_one(float f)
{
    uint32_t x = to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet */
        return (uint16_t)(x >> 16 | 0x40);
    return (uint16_t)((x + 0x7fff + (x >> 16 & 1)) >> 16);
}

static void f16_to_f32_portable(const uint8_t *in, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = codec_f16_to_f32_one(load_le16(in + 2 * i));
}

static void bf16_to_f32_portable(const uint8_t *in, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = codec_bf16_to_f32_one(load_le16(in + 2 * i));
}

static void f32_to_f16_portable(const float *in, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        store_le16(out + 2 * i, codec_f32_to_f16_one(in[i]));
}

static void f32_to_bf16_portable(const float *in, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        store_le16(out + 2 * i, codec_f32_to_bf16_one(in[i]));
}

/* ----------------------------------------------------------------- x86 */

#ifdef HALF_X86
/* (x86 is little-endian: the 2-byte elements load as they are) */
#define F16C_ROUND (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(const uint8_t *in, float *out,
                                                                 size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(in + 2 * i))));
    f16_to_f32_portable(in + 2 * i, out + i, n - i);
}

__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(const float *in, uint8_t *out,
                                                                 size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(out + 2 * i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i), F16C_ROUND));
    f32_to_f16_portable(in + i, out + 2 * i, n - i);
}

__attribute__((target("avx512f"))) static void f16_to_f32_avx512(const uint8_t *in, float *out,
                                                                  size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(in + 2 * i))));
    f16_to_f32_portable(in + 2 * i, out + i, n - i);
}

__attribute__((target("avx512f"))) static void f32_to_f16_avx512(const float *in, uint8_t *out,
                                                                  size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(void *)(out + 2 * i), _mm512_cvtps_ph(_mm512_loadu_ps(in + i), F16C_ROUND));
    f32_to_f16_portable(in + i, out + 2 * i, n - i);
}

/* bfloat16 widening is a shift; 16 lanes at a time with AVX-512F. */
__attribute__((target("avx512f"))) static void bf16_to_f32_avx512(const uint8_t *in, float *out,
                                                                   size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(in + 2 * i)));
        _mm512_storeu_si512((void *)(out + i), _mm512_slli_epi32(h, 16));
    }
    bf16_to_f32_portable(in + 2 * i, out + i, n - i);
}

__attribute__((target("avx512f,avx512bf16"))) static void f32_to_bf16_avx512(const float *in,
                                                                              uint8_t *out,
                                                                              size_t n)
{
    const __m512i exponent = _mm512_set1_epi32(0x7f800000), zero = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 lo = _mm512_loadu_ps(in + i), hi = _mm512_loadu_ps(in + i + 16);
        __m512bh r = _mm512_cvtne2ps_pbh(hi, lo);
        _mm512_storeu_si512((void *)(out + 2 * i), (__m512i)r);
        /* subnormal inputs (exponent bits 0, not zero) were read as 0 */
        __mmask16 sub_lo = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(lo), exponent), zero) &
                           _mm512_cmpneq_epi32_mask(_mm512_slli_epi32(_mm512_castps_si512(lo), 1), zero);
        __mmask16 sub_hi = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(hi), exponent), zero) &
                           _mm512_cmpneq_epi32_mask(_mm512_slli_epi32(_mm512_castps_si512(hi), 1), zero);
        if (__builtin_expect(sub_lo | sub_hi, 0))
            f32_to_bf16_portable(in + i, out + 2 * i, 32);
    }
    f32_to_bf16_portable(in + i, out + 2 * i, n - i);
}
#endif

/* ------------------------------------------------------------ dispatch */

void codec_half_to_f32(codec_dtype dtype, const uint8_t *in, float *out, size_t n,
                       codec_half_path path)
{
#ifdef HALF_X86
    if (path == CODEC_HALF_AVX512 || path == CODEC_HALF_AVX512_BF16) {
        if (dtype == CODEC_F16)
            f16_to_f32_avx512(in, out, n);
        else
            bf16_to_f32_avx512(in, out, n);
        return;
    }
    if (path == CODEC_HALF_F16C && dtype == CODEC_F16) {
        f16_to_f32_f16c(in, out, n);
        return;
    }
#else
    (void)path;
#endif
    if (dtype == CODEC_F16)
        f16_to_f32_portable(in, out, n);
    else
        bf16_to_f32_portable(in, out, n);
}

void codec_f32_to_half(codec_dtype dtype, const float *in, uint8_t *out, size_t n,
                       codec_half_path path)
{
#ifdef HALF_X86
    if (dtype == CODEC_F16 && (path == CODEC_HALF_AVX512 || path == CODEC_HALF_AVX512_BF16)) {
        f32_to_f16_avx512(in, out, n);
        return;
    }
    if (dtype == CODEC_F16 && path == CODEC_HALF_F16C) {
        f32_to_f16_f16c(in, out, n);
        return;
    }
    if (dtype == CODEC_BF16 && path == CODEC_HALF_AVX512_BF16) {
        f32_to_bf16_avx512(in, out, n);
        return;
    }
#else
    (void)path;
#endif
    if (dtype == CODEC_F16)
        f32_to_f16_portable(in, out, n);
    else
        f32_to_bf16_portable(in, out, n);
}

/* The largest magnitude each dtype holds without becoming infinite when
 * rounded to nearest even: below the midpoint to the next power of two. */
bool codec_half_fits(codec_dtype dtype, const float *x, size_t n, size_t *at)
{
    /* float16: 65504 + 16 (a tie that goes to 65536, infinite);
     * bfloat16: 0x1.fep127 + 2^119 likewise */
    const uint32_t limit = dtype == CODEC_F16 ? 0x477ff000u : 0x7f7f8000u;
    for (size_t i = 0; i < n; i++)
        if ((to_bits(x[i]) & 0x7fffffffu) >= limit) {
            *at = i;
            return false;
        }
    return true;
}
