/*
 * Private to lib/mha*.c: the pieces multi-head attention (Eq. 12-13) is built
 * from. A projection x W [B*n, d_in] x [d_in, h*d] leaves every head of a
 * position side by side, [B, n, h, d], which is attn_sdpa_*'s
 * ATTN_LAYOUT_BNHD: the attention reads the projections where they are, and
 * its output [B, n, h*d_v] is already the concatenation of the heads. So
 * every product around the attention is one large GEMM, split over the
 * threads by blocks of its output (mha_gemm): no per-head calls, no copies.
 */
#ifndef ATTN_MHA_H
#define ATTN_MHA_H

#include <cblas.h>

#include "attn.h"


/* db [N] = the sum of the rows of d [rows, N] (double accumulators). */
void mha_column_sums(const float *d, int64_t rows, int64_t n, float *db);

/* Everything attn_mha_forward and attn_mha_backward share: the projections of
 * the inputs and the attention over them. */
typedef struct {
    attn_sdpa_params sdpa;   /* the inner call over [B, n|m, h|h_kv, d], BNHD */
    int threads;             /* for the products (1 when they are too small to split) */
    const float *ctx;        /* context, or x for self-attention */
    float *q, *k, *v;        /* [B, n, h*d_k], [B, m, h_kv*d_k], [B, m, h_kv*d_v] */
    float *o;                /* [B, n, h*d_v]: the heads concatenated */
    bool o_owned;            /* o is ours (with w_o), not the caller's out */
    attn_softmax_row *rows;  /* [B, h, n], or NULL when not wanted */
    bool rows_owned;         /* rows is ours, not the caller's */
} mha_state;

/* C [M, N] = A B (+ C when accumulate), A [M, K] (or A^T given as [K, M]
 * when trans_a), B [K, N] (or B^T as [N, K] when trans_b), row-major with
 * leading dimensions lda, ldb, ldc; with a bias [N] (not NULL), C = A B + bias.
 * Run on up to st->threads threads by blocks of rows or columns of C: each
 * element of C is one sgemm's, so the result does not depend on the threads.
 * A block starts only while the call is not cancelled (st->sdpa.cancel). */
void mha_gemm(const mha_state *st, bool trans_a, bool trans_b, int64_t M, int64_t N,
              int64_t K, const float *a, int64_t lda, const float *b, int64_t ldb,
              const float *bias, bool accumulate, float *c, int64_t ldc);

/* Checks p and in (want_weights: the caller asks for [B,h,n,m]) and fills
 * st's shapes; allocates nothing. */
attn_status mha_prepare(const attn_mha_params *p, const attn_mha_inputs *in,
                        bool want_weights, mha_state *st, attn_error *err);

/* Allocates st's buffers, projects q, k, v and runs attn_sdpa_forward into
 * st->o. Without w_o, st->o is `out` itself (the caller's [B, n, h*d_v])
 * when out is not NULL. The softmax rows go to `rows` when it is not NULL,
 * else to a buffer of st's when want_rows (the backward needs them), else
 * nowhere. On failure st holds nothing. */
attn_status mha_attend(const attn_mha_params *p, const attn_mha_inputs *in,
                       mha_state *st, bool want_rows, float *out, attn_softmax_row *rows,
                       float *weights, attn_stats *stats, attn_error *err);

/* out [B, n, d_out] = o W_O + b_O (nothing to do without w_o: o is out). */
void mha_output(const attn_mha_params *p, const attn_mha_inputs *in, const mha_state *st,
                float *out);

/* The gradients, from the state mha_attend left (with rows). */
attn_status mha_backward_from(const attn_mha_params *p, const attn_mha_inputs *in,
                              const mha_state *st, const float *dout,
                              const attn_mha_grads *g, attn_error *err);

/* A public call's status: s, or ATTN_ERR_CANCELLED when p->cancel was set
 * (some product may then have skipped its blocks). */
attn_status mha_finish(const attn_mha_params *p, attn_status s, attn_error *err);

void mha_state_free(mha_state *st);

#endif /* ATTN_MHA_H */
