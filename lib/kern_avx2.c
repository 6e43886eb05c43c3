/*
 * libattn's kernels for AVX2 + FMA (compiled with -mavx2 -mfma -mf16c; run only
 * where attn_kernel() found the instructions). The register block is 6 rows
 * x 2 vectors (16 columns): 12 accumulators, 2 loaded vectors and one
 * broadcast of the 16 ymm registers.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

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

/* An 8 x 8 block: pairs of rows interleaved, quadruples within each 128-bit
 * lane (4 x 4 transposed per lane), then the lanes of two halves swapped. */
static inline void vtranspose(const float *src, int64_t lds, float *dst, int64_t ldd)
{
    vf a[8], b[8];
    for (int i = 0; i < 4; i++) {
        vf x = vload(src + (2 * i) * lds), y = vload(src + (2 * i + 1) * lds);
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
#include "kern_kv_body.h"

#endif /* __x86_64__ */
