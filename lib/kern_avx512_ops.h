/*
 * The vector operations of libattn's AVX-512F kernels (kern_steps.h,
 * kern_body.h and kern_body_bf16.h list them), shared by kern_avx512.c
 * (float32, and bfloat16 emulated) and kern_avx512_bf16.c (bfloat16 with
 * vdpbf16ps). Included once per file, which defines VW 16 before it.
 */
#ifndef ATTN_KERN_AVX512_OPS_H
#define ATTN_KERN_AVX512_OPS_H

#include <immintrin.h>
#include <math.h>

#include "bf16.h"
#include "kern.h"
#include "kern_exp.h"

typedef __m512 vf;
typedef __mmask16 vmask;

static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vset1(float x) { return _mm512_set1_ps(x); }
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vf x) { _mm512_storeu_ps(p, x); }
static inline void vstream(float *p, vf x) { _mm512_stream_ps(p, x); }
static inline vmask vmask_first(int n)
{
    return (vmask)(n >= VW ? 0xffffu : (1u << n) - 1u);
}
static inline vf vload_m(const float *p, vmask m) { return _mm512_maskz_loadu_ps(m, p); }
static inline void vstore_m(float *p, vf x, vmask m) { _mm512_mask_storeu_ps(p, m, x); }
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vhmax(vf x) { return _mm512_reduce_max_ps(x); }
static inline float vhsum(vf x) { return _mm512_reduce_add_ps(x); }
static inline vf vmasked(vf x, vmask m) { return _mm512_maskz_mov_ps(m, x); }
static inline vmask vnot_one(vf x)
{
    return _mm512_cmp_ps_mask(x, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ);
}
static inline vf vkeep_range(vf x, int64_t lo, int64_t hi)
{
    lo = lo < 0 ? 0 : lo > VW ? VW : lo;
    hi = hi < lo ? lo : hi > VW ? VW : hi;
    vmask keep = (vmask)(vmask_first((int)hi) & ~vmask_first((int)lo));
    return _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), keep, x);
}

static inline vf vabs(vf x) { return _mm512_abs_ps(x); }
static inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vmask vge(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
static inline vf vblend(vmask m, vf a, vf b) { return _mm512_mask_blend_ps(m, b, a); }
static inline vf vcopysign(vf x, vf s)
{
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    return _mm512_castsi512_ps(
        _mm512_or_si512(_mm512_andnot_si512(sign, _mm512_castps_si512(x)),
                        _mm512_and_si512(sign, _mm512_castps_si512(s))));
}
static inline vf viota(void)
{
    return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
static inline vmask vbad(vf x)
{
    return _mm512_cmp_ps_mask(x, _mm512_set1_ps(INFINITY), _CMP_EQ_OQ) |
           _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
}
static inline vmask vnonfinite(vf x)
{
    return _mm512_cmp_ps_mask(_mm512_sub_ps(x, x), _mm512_setzero_ps(), _CMP_NEQ_UQ);
}
static inline bool vmask_none(vmask m) { return m == 0; }

/* Lanes (float)((0.0 + (double)x) * f): a float scaled in double and rounded
 * once, as sdpa_finish_row does it (the 0.0 + keeps its sign of zero). */
static inline vf vmul_d(vf x, double f)
{
    const __m512d z = _mm512_setzero_pd(), s = _mm512_set1_pd(f);
    const __m256 x_hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
    __m256 lo = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_add_pd(z, _mm512_cvtps_pd(_mm512_castps512_ps256(x))), s));
    __m256 hi = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_add_pd(z, _mm512_cvtps_pd(x_hi)), s));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)),
                                               _mm256_castps_pd(hi), 1));
}
/* acc [VW] += part [VW] in double, and part [VW] = 0. */
static inline void vfold_d(double *acc, float *part)
{
    const __m512 x = _mm512_loadu_ps(part);
    const __m256 x_hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
    _mm512_storeu_pd(acc, _mm512_add_pd(_mm512_loadu_pd(acc),
                                        _mm512_cvtps_pd(_mm512_castps512_ps256(x))));
    _mm512_storeu_pd(acc + 8, _mm512_add_pd(_mm512_loadu_pd(acc + 8), _mm512_cvtps_pd(x_hi)));
    _mm512_storeu_ps(part, _mm512_setzero_ps());
}

/* A 16 x 16 block: pairs of rows interleaved, then quadruples within each
 * 128-bit lane (each lane now holds 4 x 4 transposed), then the lanes of
 * four rows gathered twice over. 64 shuffles for 256 floats. Rows from
 * `rows` on are read as zeros (a short sequence's keys: nothing past them
 * is touched). */
static inline __attribute__((always_inline)) void vtranspose(const float *src, int64_t lds, int rows,
                                                            float *dst, int64_t ldd)
{
    vf a[16], b[16];
    for (int i = 0; i < 8; i++) {
        vf x = 2 * i < rows ? vload(src + (2 * i) * lds) : vzero();
        vf y = 2 * i + 1 < rows ? vload(src + (2 * i + 1) * lds) : vzero();
        a[2 * i] = _mm512_unpacklo_ps(x, y);
        a[2 * i + 1] = _mm512_unpackhi_ps(x, y);
    }
    for (int i = 0; i < 4; i++) {
        b[4 * i + 0] = _mm512_shuffle_ps(a[4 * i + 0], a[4 * i + 2], 0x44);
        b[4 * i + 1] = _mm512_shuffle_ps(a[4 * i + 0], a[4 * i + 2], 0xEE);
        b[4 * i + 2] = _mm512_shuffle_ps(a[4 * i + 1], a[4 * i + 3], 0x44);
        b[4 * i + 3] = _mm512_shuffle_ps(a[4 * i + 1], a[4 * i + 3], 0xEE);
    }
    /* b[4i + c], 128-bit lane L: column 4L + c of rows 4i .. 4i+3. */
    for (int c = 0; c < 4; c++) {
        vf u0 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x88);
        vf u1 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xDD);
        vf w0 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x88);
        vf w1 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xDD);
        vstore(dst + (0 + c) * ldd, _mm512_shuffle_f32x4(u0, w0, 0x88));
        vstore(dst + (8 + c) * ldd, _mm512_shuffle_f32x4(u0, w0, 0xDD));
        vstore(dst + (4 + c) * ldd, _mm512_shuffle_f32x4(u1, w1, 0x88));
        vstore(dst + (12 + c) * ldd, _mm512_shuffle_f32x4(u1, w1, 0xDD));
    }
}

/* Lanes r < R (R = 4, 8 or 16) of the result: the sum of a[r]'s lanes, for
 * the short step's scores (kern_body.h). A tree of pairs, the same order for
 * every R: within each 128-bit quarter (0 + 2) + (1 + 3), then the quarters
 * as (0 + 1) + (2 + 3). Lanes from R on are left unspecified. */
static inline __attribute__((always_inline)) vf vhsums(const int R, const vf *a)
{
    vf b[8], c[4], d[2];
#pragma GCC unroll 8
    for (int i = 0; i < R / 2; i++)
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    /* c[i], quarter Q: rows 4i .. 4i + 3, each the sum of its quarter Q */
#pragma GCC unroll 8
    for (int i = 0; i < R / 4; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
    if (R == 4) {
        const vf x = _mm512_add_ps(c[0], _mm512_shuffle_f32x4(c[0], c[0], 0xB1));
        return _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0x4E));
    }
    /* d[i]: quarters (0 + 1) and (2 + 3) of c[2i], then of c[2i + 1] */
#pragma GCC unroll 8
    for (int i = 0; i < R / 8; i++)
        d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
    const vf e = R == 8 ? d[0] : d[1];
    return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], e, 0x88), _mm512_shuffle_f32x4(d[0], e, 0xDD));
}

/* exp (see kern_exp.h) of x[i], i < n <= 8, in place: each step for all of
 * them before the next, so that their chains of dependent operations
 * overlap. */
#define KERN_VEXPS
static inline __attribute__((always_inline)) void vexps(const int n, vf *x)
{
    vmask keep[8];
    vf k[8], r[8], p[8];
#pragma GCC unroll 8
    for (int i = 0; i < n; i++) {
        keep[i] = _mm512_cmp_ps_mask(x[i], _mm512_set1_ps(ATTN_EXP_MIN), _CMP_GE_OQ);
        r[i] = _mm512_min_ps(x[i], _mm512_set1_ps(EXP_ARG_MAX));
    }
#pragma GCC unroll 8
    for (int i = 0; i < n; i++)
        k[i] = _mm512_roundscale_ps(_mm512_mul_ps(r[i], _mm512_set1_ps(EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#pragma GCC unroll 8
    for (int i = 0; i < n; i++)
        r[i] = _mm512_fnmadd_ps(k[i], _mm512_set1_ps(EXP_LN2_HI), r[i]);
#pragma GCC unroll 8
    for (int i = 0; i < n; i++)
        r[i] = _mm512_fnmadd_ps(k[i], _mm512_set1_ps(EXP_LN2_LO), r[i]);
#pragma GCC unroll 8
    for (int i = 0; i < n; i++)
        p[i] = _mm512_fmadd_ps(_mm512_set1_ps(EXP_C7), r[i], _mm512_set1_ps(EXP_C6));
    const float c[] = {EXP_C5, EXP_C4, EXP_C3, EXP_C2, 1.0f, 1.0f};
#pragma GCC unroll 8
    for (int j = 0; j < 6; j++)
#pragma GCC unroll 8
        for (int i = 0; i < n; i++)
            p[i] = _mm512_fmadd_ps(p[i], r[i], _mm512_set1_ps(c[j]));
#pragma GCC unroll 8
    for (int i = 0; i < n; i++)
        x[i] = _mm512_maskz_scalef_ps(keep[i], p[i], k[i]);
}

/* exp: see kern_exp.h. */
static inline __attribute__((always_inline)) vf vexp(vf a)
{
    vexps(1, &a);
    return a;
}

/* ------------------------------------------------------------- bfloat16 */

typedef __m512i vpair;

static inline vpair vp_load(const uint32_t *p) { return _mm512_loadu_si512(p); }
static inline vpair vp_load_m(const uint32_t *p, vmask m) { return _mm512_maskz_loadu_epi32(m, p); }
static inline void vp_store(uint32_t *p, vpair x) { _mm512_storeu_si512(p, x); }
static inline void vp_store_m(uint32_t *p, vpair x, vmask m) { _mm512_mask_storeu_epi32(p, m, x); }
static inline vpair vp_set1(uint32_t w) { return _mm512_set1_epi32((int)w); }
static inline __m512i vi(uint32_t x) { return _mm512_set1_epi32((int)x); }

/* bf16.h's bf16_round_bits, lane by lane (low halves not yet cleared).
 * Lanes of exponent 1 .. 0xFD (where rounding can neither underflow nor
 * overflow) need only the rounding itself: when all are such, as the
 * inputs of attention nearly always are, the special cases are skipped. */
static inline __m512i vbf16_bits(vf x)
{
    const __m512i b = _mm512_castps_si512(x);
    const __m512i exp = _mm512_and_si512(b, vi(BF16_EXP));
    __m512i r = _mm512_add_epi32(
        b, _mm512_add_epi32(vi(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(b, 16), vi(1))));
    const __mmask16 ordinary =
        _mm512_cmplt_epu32_mask(_mm512_sub_epi32(exp, vi(0x00800000u)), vi(0x7E800000u));
    if (ordinary == 0xFFFFu)
        return r;
    const __m512i sign = _mm512_and_si512(b, vi(BF16_SIGN));
    const __mmask16 tiny = _mm512_cmpeq_epi32_mask(exp, _mm512_setzero_si512());
    const __mmask16 special = _mm512_cmpeq_epi32_mask(exp, vi(BF16_EXP));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_andnot_si512(vi(BF16_SIGN), b), vi(BF16_EXP));
    const __mmask16 over =
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(r, vi(BF16_EXP)), vi(BF16_EXP)) & ~special;
    r = _mm512_mask_mov_epi32(r, over, _mm512_or_si512(sign, vi(BF16_MAX_BITS)));
    r = _mm512_mask_mov_epi32(r, special, b);
    r = _mm512_mask_or_epi32(r, nan, b, vi(BF16_QUIET));
    return _mm512_mask_mov_epi32(r, tiny, sign);
}
/* Weights are 0 or normal and at most 1: nearest-even rounding alone. */
static inline vf vbf16_weight(vf x)
{
    const __m512i b = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(
        b, _mm512_add_epi32(vi(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(b, 16), vi(1))));
    return _mm512_castsi512_ps(_mm512_and_si512(r, vi(BF16_HIGH)));
}
static inline vpair vbf16_words(vf lo, vf hi)
{
    return _mm512_or_si512(_mm512_srli_epi32(vbf16_bits(lo), 16),
                           _mm512_and_si512(vbf16_bits(hi), vi(BF16_HIGH)));
}
static inline vpair vbf16_join(vf lo, vf hi)
{
    return _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(lo), 16),
                           _mm512_castps_si512(hi));
}
/* Two vectors of weights rounded in place, and their words. */
static inline vpair vbf16_weights2_int(vf *lo, vf *hi)
{
    *lo = vbf16_weight(*lo);
    *hi = vbf16_weight(*hi);
    return vbf16_join(*lo, *hi);
}
static inline void vptranspose(const uint32_t *src, int64_t lds, uint32_t *dst, int64_t ldd)
{
    vtranspose((const float *)src, lds, VW, (float *)dst, ldd);
}

#endif /* ATTN_KERN_AVX512_OPS_H */
