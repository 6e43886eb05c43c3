/*
 * libattn's kernels for AVX2 + FMA (compiled with -mavx2 -mfma -mf16c; run only
 * where attn_kernel() found the instructions). The register block is 6 rows
 * x 2 vectors (16 columns): 12 accumulators, 2 loaded vectors and one
 * broadcast of the 16 ymm registers. The bfloat16 products emulate
 * vdpbf16ps with two FMAs a step (4 rows x 2 vectors: the halves of each
 * operand take registers too).
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

#include "bf16.h"
#include "kern.h"
#include "kern_exp.h"

#define KF(name) name##_avx2
#define KERN_KIND ATTN_KERNEL_AVX2
#define KMR 6
#define KNV 2
#define VW 8

typedef __m256 vf;
typedef __m256i vmask;

static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vset1(float x) { return _mm256_set1_ps(x); }
static inline vf vload(const float *p) { return _mm256_loadu_ps(p); }
static inline void vstore(float *p, vf x) { _mm256_storeu_ps(p, x); }
static inline void vstream(float *p, vf x) { _mm256_stream_ps(p, x); }
static inline vmask vmask_first(int n)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
}
static inline vf vload_m(const float *p, vmask m) { return _mm256_maskload_ps(p, m); }
static inline void vstore_m(float *p, vf x, vmask m) { _mm256_maskstore_ps(p, m, x); }
static inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline float vhmax(vf x)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
static inline float vhsum(vf x)
{
    /* Lanes paired as (0+4) + (1+5) + ..., the same order every time. */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline vf vmasked(vf x, vmask m) { return _mm256_and_ps(x, _mm256_castsi256_ps(m)); }
static inline vmask vnot_one(vf x)
{
    return _mm256_castps_si256(_mm256_cmp_ps(x, _mm256_set1_ps(1.0f), _CMP_NEQ_UQ));
}
static inline vf vkeep_range(vf x, int64_t lo, int64_t hi)
{
    lo = lo < 0 ? 0 : lo > VW ? VW : lo;
    hi = hi < lo ? lo : hi > VW ? VW : hi;
    vmask keep = _mm256_andnot_si256(vmask_first((int)lo), vmask_first((int)hi));
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, _mm256_castsi256_ps(keep));
}

static inline vf vabs(vf x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }
static inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vmask vge(vf a, vf b)
{
    return _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_GE_OQ));
}
static inline vf vblend(vmask m, vf a, vf b)
{
    return _mm256_blendv_ps(b, a, _mm256_castsi256_ps(m));
}
static inline vf vcopysign(vf x, vf s)
{
    const vf sign = _mm256_set1_ps(-0.0f);
    return _mm256_or_ps(_mm256_andnot_ps(sign, x), _mm256_and_ps(sign, s));
}
static inline vf viota(void) { return _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7); }
static inline vmask vbad(vf x)
{
    return _mm256_castps_si256(_mm256_or_ps(
        _mm256_cmp_ps(x, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ), _mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
}
static inline vmask vnonfinite(vf x)
{
    return _mm256_castps_si256(
        _mm256_cmp_ps(_mm256_sub_ps(x, x), _mm256_setzero_ps(), _CMP_NEQ_UQ));
}
static inline bool vmask_none(vmask m) { return _mm256_testz_si256(m, m); }

/* Lanes (float)((0.0 + (double)x) * f): a float scaled in double and rounded
 * once, as sdpa_finish_row does it (the 0.0 + keeps its sign of zero). */
static inline vf vmul_d(vf x, double f)
{
    const __m256d z = _mm256_setzero_pd(), s = _mm256_set1_pd(f);
    __m128 lo = _mm256_cvtpd_ps(
        _mm256_mul_pd(_mm256_add_pd(z, _mm256_cvtps_pd(_mm256_castps256_ps128(x))), s));
    __m128 hi = _mm256_cvtpd_ps(
        _mm256_mul_pd(_mm256_add_pd(z, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))), s));
    return _mm256_set_m128(hi, lo);
}
/* acc [VW] += part [VW] in double, and part [VW] = 0. */
static inline void vfold_d(double *acc, float *part)
{
    const __m256 x = _mm256_loadu_ps(part);
    _mm256_storeu_pd(acc, _mm256_add_pd(_mm256_loadu_pd(acc),
                                        _mm256_cvtps_pd(_mm256_castps256_ps128(x))));
    _mm256_storeu_pd(acc + 4, _mm256_add_pd(_mm256_loadu_pd(acc + 4),
                                            _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));
    _mm256_storeu_ps(part, _mm256_setzero_ps());
}

/* An 8 x 8 block: pairs of rows interleaved, quadruples within each 128-bit
 * lane (4 x 4 transposed per lane), then the lanes of two halves swapped.
 * Rows from `rows` on are read as zeros. */
static inline __attribute__((always_inline)) void vtranspose(const float *src, int64_t lds, int rows,
                                                            float *dst, int64_t ldd)
{
    vf a[8], b[8];
    for (int i = 0; i < 4; i++) {
        vf x = 2 * i < rows ? vload(src + (2 * i) * lds) : vzero();
        vf y = 2 * i + 1 < rows ? vload(src + (2 * i + 1) * lds) : vzero();
        a[2 * i] = _mm256_unpacklo_ps(x, y);
        a[2 * i + 1] = _mm256_unpackhi_ps(x, y);
    }
    for (int i = 0; i < 2; i++) {
        b[4 * i + 0] = _mm256_shuffle_ps(a[4 * i + 0], a[4 * i + 2], 0x44);
        b[4 * i + 1] = _mm256_shuffle_ps(a[4 * i + 0], a[4 * i + 2], 0xEE);
        b[4 * i + 2] = _mm256_shuffle_ps(a[4 * i + 1], a[4 * i + 3], 0x44);
        b[4 * i + 3] = _mm256_shuffle_ps(a[4 * i + 1], a[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        vstore(dst + c * ldd, _mm256_permute2f128_ps(b[c], b[4 + c], 0x20));
        vstore(dst + (4 + c) * ldd, _mm256_permute2f128_ps(b[c], b[4 + c], 0x31));
    }
}

/* Lanes r < R (R = 4 or 8) of the result: the sum of a[r]'s lanes, for the
 * short step's scores (kern_body.h). A tree of pairs, the same order for
 * both R: within each 128-bit half (0 + 2) + (1 + 3), then the halves.
 * Lanes from R on are left unspecified. */
static inline __attribute__((always_inline)) vf vhsums(const int R, const vf *a)
{
    vf b[4], c[2];
#pragma GCC unroll 8
    for (int i = 0; i < R / 2; i++)
        b[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    /* c[i], half H: rows 4i .. 4i + 3, each the sum of its half H */
#pragma GCC unroll 8
    for (int i = 0; i < R / 4; i++)
        c[i] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                             _mm256_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
    const vf e = R == 4 ? c[0] : c[1];
    return _mm256_add_ps(_mm256_permute2f128_ps(c[0], e, 0x20),
                         _mm256_permute2f128_ps(c[0], e, 0x31));
}

/* exp: see kern_exp.h. 2^n is built in the exponent field; lanes flushed to
 * 0 may hold garbage there (n out of range), which the final AND discards. */
static inline vf vexp(vf a)
{
    vf keep = _mm256_cmp_ps(a, _mm256_set1_ps(ATTN_EXP_MIN), _CMP_GE_OQ);
    a = _mm256_min_ps(a, _mm256_set1_ps(EXP_ARG_MAX));
    vf n = _mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(EXP_LOG2E)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), a);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    vf p = _mm256_set1_ps(EXP_C7);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

/* ------------------------------------------------------------- bfloat16 */

#define KERN_BF16_PATH ATTN_BF16_EMULATED
#define KMR2 4
#define KNV2 2

typedef __m256i vpair;

static inline vpair vp_load(const uint32_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline vpair vp_load_m(const uint32_t *p, vmask m)
{
    return _mm256_maskload_epi32((const int *)p, m);
}
static inline void vp_store(uint32_t *p, vpair x) { _mm256_storeu_si256((__m256i *)p, x); }
static inline void vp_store_m(uint32_t *p, vpair x, vmask m)
{
    _mm256_maskstore_epi32((int *)p, m, x);
}
static inline vpair vp_set1(uint32_t w) { return _mm256_set1_epi32((int)w); }
static inline __m256i vi(uint32_t x) { return _mm256_set1_epi32((int)x); }

/* bf16.h's bf16_round_bits, lane by lane (low halves not yet cleared). */
static inline __m256i vbf16_bits(vf x)
{
    const __m256i b = _mm256_castps_si256(x);
    const __m256i exp = _mm256_and_si256(b, vi(BF16_EXP)), sign = _mm256_and_si256(b, vi(BF16_SIGN));
    const __m256i tiny = _mm256_cmpeq_epi32(exp, _mm256_setzero_si256());
    const __m256i special = _mm256_cmpeq_epi32(exp, vi(BF16_EXP));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_andnot_si256(vi(BF16_SIGN), b), vi(BF16_EXP));
    __m256i r = _mm256_add_epi32(
        b, _mm256_add_epi32(vi(0x7FFF), _mm256_and_si256(_mm256_srli_epi32(b, 16), vi(1))));
    __m256i over = _mm256_andnot_si256(
        special, _mm256_cmpeq_epi32(_mm256_and_si256(r, vi(BF16_EXP)), vi(BF16_EXP)));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(sign, vi(BF16_MAX_BITS)), over);
    r = _mm256_blendv_epi8(r, _mm256_or_si256(b, _mm256_and_si256(nan, vi(BF16_QUIET))),
                           special);
    return _mm256_blendv_epi8(r, sign, tiny);
}
/* Weights are 0 or normal and at most 1: nearest-even rounding alone. */
static inline vf vbf16_weight(vf x)
{
    const __m256i b = _mm256_castps_si256(x);
    __m256i r = _mm256_add_epi32(
        b, _mm256_add_epi32(vi(0x7FFF), _mm256_and_si256(_mm256_srli_epi32(b, 16), vi(1))));
    return _mm256_castsi256_ps(_mm256_and_si256(r, vi(BF16_HIGH)));
}
static inline vpair vbf16_words(vf lo, vf hi)
{
    return _mm256_or_si256(_mm256_srli_epi32(vbf16_bits(lo), 16),
                           _mm256_and_si256(vbf16_bits(hi), vi(BF16_HIGH)));
}
static inline vpair vbf16_join(vf lo, vf hi)
{
    return _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(lo), 16),
                           _mm256_castps_si256(hi));
}
static inline void vptranspose(const uint32_t *src, int64_t lds, uint32_t *dst, int64_t ldd)
{
    vtranspose((const float *)src, lds, VW, (float *)dst, ldd);
}
/* Two vectors of weights rounded in place, and their words. */
static inline vpair vbf16_weights2(vf *lo, vf *hi)
{
    *lo = vbf16_weight(*lo);
    *hi = vbf16_weight(*hi);
    return vbf16_join(*lo, *hi);
}

/* vdpbf16ps's step per lane: the high halves' fused multiply-add, then the
 * low halves', each rounded to nearest even, with the MXCSR flushing tiny
 * results and reading subnormal inputs as zero around the product
 * (KERN_BF16_BEGIN): the x86 FMA then decides tininess as vdpbf16ps does. */
static inline vf vdot2(vf acc, vpair a, vpair b)
{
    const __m256i high = vi(BF16_HIGH);
    acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(a, high)),
                          _mm256_castsi256_ps(_mm256_and_si256(b, high)), acc);
    return _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)),
                           _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)), acc);
}
#define KERN_MXCSR_FTZ_DAZ 0x8040u
#define KERN_BF16_BEGIN                                                       \
    const unsigned kern_mxcsr = _mm_getcsr();                                 \
    _mm_setcsr(kern_mxcsr | KERN_MXCSR_FTZ_DAZ)
#define KERN_BF16_END _mm_setcsr(kern_mxcsr)

/* Halves to floats: F16C's vcvtph2ps for float16 (every AVX2 CPU has
 * F16C; attn_kernel_supported asks for it too); bfloat16 is float32's
 * upper half, so zero-extended and shifted into place. */
static inline vf vload_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}
static inline vf vload_bf16(const uint16_t *p)
{
    __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}

#include "kern_body.h"
#include "kern_body_bf16.h"
#include "kern_kv_body.h"

#endif /* __x86_64__ */
