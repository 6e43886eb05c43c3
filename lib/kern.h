/*
 * libattn's micro-kernels: what the tiling loops of sdpa_forward.c and
 * sdpa_backward.c hand to one instruction set's code, and what that code
 * gives back. Private to libattn (and its tests).
 *
 * One body, lib/kern_body.h, is written once against a handful of vector
 * operations and compiled three times (kern_generic.c, kern_avx2.c,
 * kern_avx512.c), each file defining the operations for its instruction set
 * and compiled with the matching -m flags. attn_kern_get() picks the table of
 * the kernel attn_kernel() chose, once per process.
 *
 * The hot arithmetic is one register-blocked product, used for every matrix
 * product of the forward and the backward pass:
 *   C[r][c] (+)= sum_p A(r, p) * B[p][c],   r < rows <= mr, c < cols
 * where A(r, p) = a[r * a_rs + p * a_cs] is broadcast (so A may be read
 * row-wise or transposed without a copy) and B is read by rows of vectors.
 * Only the score products need a transposed operand (q k^T, dO v^T); their
 * right-hand sides are packed once into KERN_BK-wide panels of k^T or v^T.
 */
#ifndef ATTN_KERN_H
#define ATTN_KERN_H

#include "sdpa.h"

/* Keys per packed panel and per key tile, forward and backward. 64 keys
 * make a panel of d_k x 64 floats (16 KiB at d_k = 64): a panel of k^T and
 * the tile of v it goes with stay in a core's L1 while every query row of a
 * block passes over them. A score strip (mr rows x 64) is 1.5 KiB. */
#define KERN_BK 64

/* Query rows a forward unit takes through all its key tiles, and query rows
 * per tile of the backward pass: the k^T panel and v tile are read once per
 * this many rows (16 strips of 6 rows in the AVX kernels). */
#define KERN_FWD_BQ 96
#define KERN_BWD_BQ 64

/* Largest register block of any kernel (rows of C per strip). */
#define KERN_MR_MAX 8

/* One key tile of one (batch, head), seen by the forward pass:
 *   kt [d_k, KERN_BK]   k^T of keys j0 .. j0 + cols (zero beyond cols)
 *   v  [cols, d_v]      the tile's rows of v (row stride ldv)                */
typedef struct {
    const float *kt;
    const float *v;
} kern_keys;

typedef struct attn_kern attn_kern;

struct attn_kern {
    attn_kernel_kind kind;
    int mr; /* rows per register block */

    /* C (+)= A B as above, for any rows <= mr, cols and kdim >= 0. */
    void (*gemm)(int rows, int64_t cols, int64_t kdim, const float *a, int64_t a_rs,
                 int64_t a_cs, const float *b, int64_t ldb, float *c, int64_t ldc,
                 bool accumulate);

    /* dst [cols, KERN_BK] = src^T for src [rows <= KERN_BK, cols] (row
     * stride lds); columns rows .. of dst are zero to the end of their
     * vector (a multiple of the kernel's vector width), the rest of each
     * row is left as it is. */
    void (*pack_t)(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst);

    /* Folds key tile t (keys) into the forward state of query rows t. */
    void (*forward_tile)(const sdpa_call *c, const sdpa_tile *t, const kern_keys *keys,
                         sdpa_fwd_state *st);

    /* Adds the tile's contributions to dq, dk and dv (FlashAttention-2). */
    void (*backward_tile)(const sdpa_call *c, const sdpa_tile *t, const sdpa_bwd_keys *keys,
                          const sdpa_bwd_state *st);

    /* Row helpers, exposed for the tests: x[j] = exp(x[j] - shift), the sum
     * returned (exp within 2 ulp of expf; below ATTN_EXP_MIN exactly 0);
     * the largest of x[0..n) (-INFINITY when n == 0). */
    float (*exp_sum)(float *x, int64_t n, float shift);
    float (*max)(const float *x, int64_t n);

    /* x[0..n) *= f; false when a result is not finite. */
    bool (*scale_finite)(float *x, int64_t n, float f);
};

/* Below this, expf underflows past the normal floats: flushed to 0, so a
 * hidden score has a weight of exactly 0, never a denormal. */
#define ATTN_EXP_MIN (-87.33654f)

extern const attn_kern attn_kern_generic;
#if defined(__x86_64__)
extern const attn_kern attn_kern_avx2;
extern const attn_kern attn_kern_avx512;
#endif

/* The kernel attn_kernel() chose. */
const attn_kern *attn_kern_get(void);
/* A given kernel, or NULL when this CPU (or build) cannot run it. */
const attn_kern *attn_kern_of(attn_kernel_kind kind);

#endif /* ATTN_KERN_H */
