/*
 * libattn's kernels for AVX-512F (this file is compiled with -mavx512f and
 * runs only where attn_kernel() found the instructions). The register block
 * is 6 query rows x 4 vectors (64 keys or 64 output columns): 24
 * accumulators and 4 loaded vectors of the 32 zmm registers.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

#include "kern.h"
#include "kern_exp.h"

#define KF(name) name##_avx512
#define KERN_KIND ATTN_KERNEL_AVX512
#define KMR 6
#define KNV 4
#define VW 16

typedef __m512 vf;
typedef __mmask16 vmask;

static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vset1(float x) { return _mm512_set1_ps(x); }
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vf x) { _mm512_storeu_ps(p, x); }
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

/* A 16 x 16 block: pairs of rows interleaved, then quadruples within each
 * 128-bit lane (each lane now holds 4 x 4 transposed), then the lanes of
 * four rows gathered twice over. 64 shuffles for 256 floats. */
static inline void vtranspose(const float *src, int64_t lds, float *dst, int64_t ldd)
{
    vf a[16], b[16];
    for (int i = 0; i < 8; i++) {
        vf x = vload(src + (2 * i) * lds), y = vload(src + (2 * i + 1) * lds);
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

/* exp: see kern_exp.h. */
static inline vf vexp(vf a)
{
    vmask keep = _mm512_cmp_ps_mask(a, _mm512_set1_ps(ATTN_EXP_MIN), _CMP_GE_OQ);
    a = _mm512_min_ps(a, _mm512_set1_ps(EXP_ARG_MAX));
    vf n = _mm512_roundscale_ps(_mm512_mul_ps(a, _mm512_set1_ps(EXP_LOG2E)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), a);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
    vf p = _mm512_set1_ps(EXP_C7);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

/* Halves to floats: vcvtph2ps for float16; bfloat16 is float32's upper
 * half, so zero-extended and shifted into place. */
static inline vf vload_f16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}
static inline vf vload_bf16(const uint16_t *p)
{
    __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}

#include "kern_body.h"
#include "kern_kv_body.h"

#endif /* __x86_64__ */
