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

#include <limits.h>

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
#define KERN_BWD_BQ 96

/* Largest register block of any kernel (rows of C per strip). */
#define KERN_MR_MAX 8

/* The row stride of a packed panel of `cols` keys: KERN_BK for a whole
 * tile, and a narrow tail (n_k < 64, or the last keys of a row) only as
 * wide as itself, so that a panel never holds more than the keys it packs
 * (n_k = 1 with d_k = 4e6 is 16 MB, not 64 keys' worth). The kernels read a
 * panel only as far as the tile's cols, with masked loads past them. */
static inline int64_t kern_panel_ld(int64_t cols)
{
    return cols < KERN_BK ? cols : KERN_BK;
}

/* The row stride of a short sequence's panel of at most this many keys,
 * where the worker's panel has room for it (forward_short): one vector of
 * the widest kernel (16 floats), so that the transpose stores whole
 * vectors, its zero rows the padding. */
#define KERN_SHORT_LD 16

/* A short sequence of at most this many keys, when its softmax rows are not
 * asked for, has its keys read where they are by forward_short (no panel
 * of k^T): its scores summed with d_k in the lanes, a few vector products
 * and a transpose-and-add a score, fewer than a panel's transposes and
 * 64-step sums for so few keys. */
#define KERN_SHORT_DIRECT 16

/* One key tile of one (batch, head), seen by the forward pass:
 *   kt [d_k, ld]        k^T of keys j0 .. j0 + cols, ld = kern_panel_ld(cols)
 *   v  [cols, d_v]      the tile's rows of v (row stride ldv)
 * and, in bfloat16, the same keys as pairs of bfloat16 in 32-bit words
 * (bf16.h; zero beyond cols):
 *   kp [ceil(d_k / 2), KERN_BK]   word (t, j): features 2t, 2t + 1 of key j
 *   vp [KERN_BK / 2, d_v]         word (u, c): column c of keys 2u, 2u + 1 */
typedef struct {
    const float *kt;
    int64_t ld;
    const float *v;
    const uint32_t *kp, *vp;
} kern_keys;

/* Lines for the caches to fetch a few at a time while a short sequence's
 * step computes: the next item's rows, byte ranges [at, end) taken from
 * the last. A core has few buffers for lines on their way (a dozen or
 * two): asked for all at once, the next item's hundred lines would stall
 * the step until most are under way; asked for along its loops, they
 * arrive while it computes. */
#define KERN_PF_RANGES 8
typedef struct {
    uintptr_t at[KERN_PF_RANGES], end[KERN_PF_RANGES];
    int n; /* ranges left */
} kern_prefetch;

/* Of the next item's lines, those asked for before a short sequence's
 * panel is packed (its first: the next panel's keys). */
#define KERN_PF_BEFORE_PACK 16

/* Asks for the next `lines` lines of pf (none when pf is NULL). A range's
 * position is kept in a register while its lines are asked for (through
 * pf's memory, each line would wait on the store of the one before). */
static inline void kern_prefetch_some(kern_prefetch *pf, int lines)
{
    if (pf == NULL)
        return;
    while (lines > 0 && pf->n > 0) {
        const int i = pf->n - 1;
        uintptr_t at = pf->at[i];
        const uintptr_t end = pf->end[i];
        for (; lines > 0 && at < end; at += 64, lines--)
            __builtin_prefetch((const void *)at, 0, 3);
        pf->at[i] = at;
        if (at >= end)
            pf->n--;
    }
}

typedef struct attn_kern attn_kern;

struct attn_kern {
    attn_kernel_kind kind;
    int mr; /* rows per register block */

    /* C (+)= A B as above, for any rows <= mr, cols and kdim >= 0. */
    void (*gemm)(int rows, int64_t cols, int64_t kdim, const float *a, int64_t a_rs,
                 int64_t a_cs, const float *b, int64_t ldb, float *c, int64_t ldc,
                 bool accumulate);

    /* dst [cols, ldd] = src^T for src [rows <= ldd, cols] (row stride
     * lds); columns rows .. ldd of dst are zero. */
    void (*pack_t)(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst,
                   int64_t ldd);

    /* Folds key tile t (keys) into the forward state of query rows t. */
    void (*forward_tile)(const sdpa_call *c, const sdpa_tile *t, const kern_keys *keys,
                         sdpa_fwd_state *st);

    /* A short sequence's query rows c->q_lo .. c->q_hi of head (b, h)
     * through all its keys at once (1 to KERN_BK of them: one tile; k^T
     * packed in kt [d_k, ld], except with at most KERN_SHORT_DIRECT keys
     * and rows NULL: then kt is not read), for a plain call (c->plain)
     * without statistics or weights: the output rows from o (row stride
     * c->ldo) and, when rows is not NULL, their softmax rows. With rows,
     * or more keys, each the bits the tiled path (forward_tile on the one
     * tile, then the rows' finish) gives; otherwise within a few roundings
     * of them (the same sums in another order). False when a row needs
     * that path (a score or an output not finite, a row that sees no key);
     * its rows may be written then. The lines of pf (NULL: none) are asked
     * for along the way, all of them by the end. */
    bool (*forward_short)(const sdpa_call *c, int64_t b, int64_t h, const float *kt,
                          int64_t ld, float *o, attn_softmax_row *rows, kern_prefetch *pf);

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

    /* x[0..n) = (float)((0.0 + (double)x[j]) * f), false when a result is
     * not finite: sdpa_finish_row for a row with no double sum. */
    bool (*scale_wide)(float *x, int64_t n, double f);
    /* acc [n] += part [n] (in double), part [n] = 0: the blocked sums' fold. */
    void (*fold_partial)(double *acc, float *part, int64_t n);
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

/*
 * The bfloat16 kernels (ATTN_PRECISION_BFLOAT16; kern_body_bf16.h): the
 * same tiling and row steps as the float32 ones, the products on pairs of
 * bfloat16 in 32-bit words (bf16.h), one vdpbf16ps step a word:
 *   C[r][c] (+)= sum_p dot2(A(r, p), B[p][c]),   r < rows <= mr, c < cols
 * with A(r, p) = a[r * a_rs + p * a_cs] broadcast and B read by rows of
 * vectors, as the float32 product. Operands are rounded once, where they
 * are converted into words (kern_body_bf16.h says which elements pair up):
 *   rows       dst [rows, ceil(cols / 2)] (row stride ldd): each row of src
 *              [rows, cols] in words (q, dO for products over their columns)
 *   row_pairs  dst [pairs, cols] (row stride ldd): two rows of src side by
 *              side in each row of words, 2u and 2u + 1, or u and
 *              u + ceil(rows / 2) when `split` (v, k, q, dO for products
 *              over rows; rows past `rows` are zero)
 *   pack_t     dst [ceil(d / 2), KERN_BK]: the words of the features of up
 *              to KERN_BK keys, transposed (k and v for the score-like
 *              products)
 */
typedef struct attn_kern_bf16 attn_kern_bf16;

struct attn_kern_bf16 {
    attn_kernel_kind kind; /* whose row steps (and vectors) it uses */
    attn_bf16_kind path;   /* how its products run */
    int mr;                /* rows per strip */

    void (*gemm)(int rows, int64_t cols, int64_t kpairs, const uint32_t *a, int64_t a_rs,
                 int64_t a_cs, const uint32_t *b, int64_t ldb, float *c, int64_t ldc,
                 bool accumulate);
    void (*rows)(const float *src, int64_t lds, int64_t rows, int64_t cols, uint32_t *dst,
                 int64_t ldd);
    void (*row_pairs)(const float *src, int64_t lds, int64_t rows, int64_t cols,
                      uint32_t *dst, int64_t ldd, int64_t pairs, bool split);
    void (*pack_t)(const float *src, int64_t lds, int64_t keys, int64_t d, uint32_t *dst);

    /* As attn_kern's, with the bfloat16 operands of kern_keys, sdpa_fwd_state
     * and sdpa_bwd_state. */
    void (*forward_tile)(const sdpa_call *c, const sdpa_tile *t, const kern_keys *keys,
                         sdpa_fwd_state *st);
    void (*backward_tile)(const sdpa_call *c, const sdpa_tile *t, const sdpa_bwd_keys *keys,
                          const sdpa_bwd_state *st);
};

extern const attn_kern_bf16 attn_kern_bf16_generic;
#if defined(__x86_64__)
extern const attn_kern_bf16 attn_kern_bf16_avx2;
extern const attn_kern_bf16 attn_kern_bf16_avx512;     /* emulated */
extern const attn_kern_bf16 attn_kern_bf16_avx512bf16; /* vdpbf16ps */
extern const attn_kern_bf16 attn_kern_bf16_amx;        /* tdpbf16ps tiles */
#endif

/* kb's rows, row_pairs and pack_t of src: from its floats by kb, or from
 * its bfloat16 words as given, to the same words (bf16_words.c). */
void sdpa_bf16_rows(const attn_kern_bf16 *kb, sdpa_src src, int64_t lds, int64_t rows,
                    int64_t cols, uint32_t *dst, int64_t ldd);
void sdpa_bf16_row_pairs(const attn_kern_bf16 *kb, sdpa_src src, int64_t lds, int64_t rows,
                         int64_t cols, uint32_t *dst, int64_t ldd, int64_t pairs, bool split);
void sdpa_bf16_pack_t(const attn_kern_bf16 *kb, sdpa_src src, int64_t lds, int64_t keys,
                      int64_t d, uint32_t *dst);

/* The bfloat16 kernel of attn_kernel() and attn_bf16(). */
const attn_kern_bf16 *attn_kern_bf16_get(void);
/* The bfloat16 kernel of a kernel and path, or NULL when this CPU (or
 * build) cannot run it. */
const attn_kern_bf16 *attn_kern_bf16_of(attn_kernel_kind kind, attn_bf16_kind path);

/* The kernels of one call: attn_sdpa_forward and attn_sdpa_backward use
 * attn_kern_get()'s and attn_kern_bf16_get()'s; the tests pass others (the
 * emulated and the vdpbf16ps bfloat16 kernels side by side, say). */
typedef struct {
    const attn_kern *f32;
    const attn_kern_bf16 *bf16;
} sdpa_kernels;

/* q, k, v and dout of the element types p->dtype names. */
attn_status attn_sdpa_forward_with(const sdpa_kernels *kernels, const attn_sdpa_params *p,
                                   const void *q, const void *k, const void *v, float *out,
                                   attn_softmax_row *rows, float *weights, attn_stats *stats,
                                   attn_error *err);
attn_status attn_sdpa_backward_with(const sdpa_kernels *kernels, const attn_sdpa_params *p,
                                    const void *q, const void *k, const void *v,
                                    const float *out, const attn_softmax_row *rows,
                                    const void *dout, float *dq, float *dk, float *dv,
                                    attn_error *err);

#endif /* ATTN_KERN_H */
