/*
 * libattn's bfloat16 kernel with the AVX512_BF16 instructions vdpbf16ps and
 * vcvtne2ps2bf16 (compiled with -mavx512f -mavx512bw -mavx512bf16; run only
 * where the avx512 kernel runs and the CPU has AVX512_BF16 and AVX512BW,
 * attn_kern_bf16_of). Its vectors and row
 * steps are the avx512 kernel's (kern_avx512_ops.h, kern_steps.h), so its
 * results are those of kern_avx512.c's emulation, bit for bit.
 *
 * The product's register block is 6 rows x 4 vectors, as the float32
 * one's: each vdpbf16ps does two multiply-adds a lane, so a block of 64
 * columns takes half the instructions of the float32 block.
 *
 * Defines (names pasted by KF): attn_kern_bf16_avx512bf16, and its
 * gemm2_avx512bf16 (over block2_<n>[m][_r1]_avx512bf16), bf16_rows_avx512bf16, bf16_row_pairs_avx512bf16,
 * bf16_pack_t_avx512bf16, forward_tile_bf16_avx512bf16,
 * backward_tile_bf16_avx512bf16.
 */
#if defined(__x86_64__)

#define KF(name) name##_avx512bf16
#define KERN_KIND ATTN_KERNEL_AVX512
#define KMR 6
#define VW 16

#include "kern_avx512_ops.h"

#define KERN_BF16_PATH ATTN_BF16_AVX512_BF16
#define KMR2 6
#define KNV2 4
/* vdpbf16ps neither reads nor sets the MXCSR. */
#define KERN_BF16_BEGIN ((void)0)
#define KERN_BF16_END ((void)0)

static inline vf vdot2(vf acc, vpair a, vpair b)
{
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

#include "kern_bf16_weights_avx512.h"

#include "kern_body_bf16.h"

#endif /* __x86_64__ */
