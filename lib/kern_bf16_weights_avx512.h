/*
 * The weights of the bfloat16 kernels that run on AVX512_BF16 (vdpbf16ps,
 * and the AMX kernel, whose one-row products use it): included by
 * kern_avx512_bf16.c and kern_amx_bf16.c after kern_avx512_ops.h, in files
 * built with -mavx512bf16.
 */
#ifndef KERN_BF16_WEIGHTS_AVX512_H
#define KERN_BF16_WEIGHTS_AVX512_H

/* Two vectors of weights (0, or normal and at most 1) rounded by
 * vcvtne2ps2bf16, which rounds them as bf16.h does (to nearest even: no
 * subnormal or overflow can arise), its halves (lo, then hi) interleaved
 * into words, and the rounded weights taken back out of the words. */
static inline vpair vbf16_weights2(vf *lo, vf *hi)
{
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25,
                                           9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                                           17, 1, 16, 0);
    __m512i w = _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(*hi, *lo));
    *lo = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    *hi = _mm512_castsi512_ps(_mm512_and_si512(w, vi(BF16_HIGH)));
    return w;
}

#endif
