/*
 * Private to lib/mha*.c: the pieces multi-head attention (Eq. 12-13) is built
 * from. A projection moves between two layouts of the same numbers:
 *
 *   concatenated  [B, rows, d_cat]            x, context, out, dout
 *   per head      [B, heads, rows, d_head]    what attn_sdpa_* reads/writes
 *
 * Head i owns the i-th block of d_head columns (or rows) of each weight, so
 * every product is a set of GEMMs per (batch, head, block of rows) whose
 * operand is that block, read in place through its leading dimension: no
 * transposed copy of the activations is ever made. The blocks are the units
 * of attn_parallel_for.
 */
#ifndef ATTN_MHA_H
#define ATTN_MHA_H

#include "attn.h"

/* How a weight is stored relative to the two layouts. */
typedef enum {
    MHA_W_IN,  /* [d_cat, heads*d_head]: w_q, w_k, w_v (head i: column block i) */
    MHA_W_OUT, /* [heads*d_head, d_cat]: w_o (head i: row block i) */
} mha_orient;

typedef struct {
    int64_t batch, rows, heads;
    int64_t d_cat, d_head;
    int threads; /* threads for the products (1 when they are too small to split) */
} mha_layout;

/* heads [B, h, rows, d_head] = cat [B, rows, d_cat] · block_i (+ bias [h*d_head]).
 * block_i is read transposed for MHA_W_OUT (the backward of mha_join).
 * w == NULL is the identity (d_cat == h*d_head): column block i is copied. */
attn_status mha_split(const mha_layout *l, const float *cat, const float *w,
                      mha_orient orient, const float *bias, float *heads,
                      attn_error *err);

/* cat [B, rows, d_cat] (+)= Σ_i heads[B, i] · block_i (+ bias [d_cat]).
 * block_i is read transposed for MHA_W_IN (the backward of mha_split).
 * w == NULL is the identity: the heads are concatenated. */
attn_status mha_join(const mha_layout *l, const float *heads, const float *w,
                     mha_orient orient, const float *bias, bool accumulate,
                     float *cat, attn_error *err);

/* The weight gradient of either product, written (not accumulated):
 *   MHA_W_IN   dw [d_cat, h*d_head], block i = Σ_b cat[b]ᵀ · heads[b, i]
 *   MHA_W_OUT  dw [h*d_head, d_cat], block i = Σ_b heads[b, i]ᵀ · cat[b] */
attn_status mha_weight_grad(const mha_layout *l, const float *cat,
                            const float *heads, mha_orient orient, float *dw,
                            attn_error *err);

/* Bias gradients: the column sums of the gradient on the side the bias is
 * added to. db [h*d_head] from dheads [B, h, rows, d_head]; db [d_cat] from
 * dcat [B, rows, d_cat]. */
void mha_bias_grad_heads(const mha_layout *l, const float *dheads, float *db);
void mha_bias_grad_cat(const mha_layout *l, const float *dcat, float *db);

/* Everything attn_mha_forward and attn_mha_backward share: the projections of
 * the inputs and the attention over them. */
typedef struct {
    attn_sdpa_params sdpa; /* the inner call over [B, h, n, m] */
    mha_layout lq, lk, lv; /* x -> q, context -> k, context -> v */
    mha_layout lo;         /* o (heads) -> out */
    const float *ctx;      /* context, or x for self-attention */
    float *q, *k, *v;      /* [B,h,n,d_k], [B,h_kv,m,d_k], [B,h_kv,m,d_v] */
    float *o;              /* [B,h,n,d_v] */
    double *lse;           /* [B,h,n], or NULL when not wanted */
} mha_state;

/* Checks p and in (want_weights: the caller asks for [B,h,n,m]) and fills
 * st's shapes; allocates nothing. */
attn_status mha_prepare(const attn_mha_params *p, const attn_mha_inputs *in,
                        bool want_weights, mha_state *st, attn_error *err);

/* Allocates st's buffers (lse when want_lse), projects q, k, v and runs
 * attn_sdpa_forward into st->o. On failure st holds nothing. */
attn_status mha_attend(const attn_mha_params *p, const attn_mha_inputs *in,
                       mha_state *st, bool want_lse, float *weights,
                       attn_stats *stats, attn_error *err);

void mha_state_free(mha_state *st);

#endif /* ATTN_MHA_H */
