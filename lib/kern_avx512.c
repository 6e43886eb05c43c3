/*
 * libattn's kernels for AVX-512F (this file is compiled with -mavx512f and
 * runs only where attn_kernel() found the instructions; the vector
 * operations are kern_avx512_ops.h's). The register block is 6 query rows x
 * 4 vectors (64 keys or 64 output columns): 24 accumulators and 4 loaded
 * vectors of the 32 zmm registers. The bfloat16 products here emulate
 * vdpbf16ps with two FMAs a step (4 rows x 4 vectors: the halves of each
 * operand take registers too), for CPUs without AVX512_BF16;
 * kern_avx512_bf16.c has the instruction's.
 */
#if defined(__x86_64__)

#define KF(name) name##_avx512
#define KERN_KIND ATTN_KERNEL_AVX512
#define KMR 6
#define KNV 4
#define VW 16

#include "kern_avx512_ops.h"

#define KERN_BF16_PATH ATTN_BF16_EMULATED
#define KMR2 4
#define KNV2 4

static inline vpair vbf16_weights2(vf *lo, vf *hi) { return vbf16_weights2_int(lo, hi); }

/* vdpbf16ps's step per lane: the high halves' fused multiply-add, then the
 * low halves', each rounded to nearest even, with the MXCSR flushing tiny
 * results and reading subnormal inputs as zero around the product
 * (KERN_BF16_BEGIN): the x86 FMA then decides tininess as vdpbf16ps does. */
static inline vf vdot2(vf acc, vpair a, vpair b)
{
    const __m512i high = vi(BF16_HIGH);
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(a, high)),
                          _mm512_castsi512_ps(_mm512_and_si512(b, high)), acc);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)),
                           _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), acc);
}
#define KERN_MXCSR_FTZ_DAZ 0x8040u
#define KERN_BF16_BEGIN                                                       \
    const unsigned kern_mxcsr = _mm_getcsr();                                 \
    _mm_setcsr(kern_mxcsr | KERN_MXCSR_FTZ_DAZ)
#define KERN_BF16_END _mm_setcsr(kern_mxcsr)

#include "kern_body.h"
#include "kern_body_bf16.h"

#endif /* __x86_64__ */
