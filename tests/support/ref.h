/*
 * A double-precision reference for scaled dot-product attention, written
 * independently of lib/: plain loops over every (batch, head, query, key),
 * no tiling, no online softmax, no BLAS. Tests compare libattn against it.
 *
 * It reads the same attn_sdpa_params as libattn (shapes, scale, causal,
 * mask strides over [B, H_q, n_q, n_k], the variants: window, ALiBi,
 * softcap, RoPE from their definitions) but takes its tensors in double,
 * always [B, H, n, d]:
 *   q [B,H_q,n_q,d_k], k [B,H_kv,n_k,d_k], v [B,H_kv,n_k,d_v],
 *   out [B,H_q,n_q,d_v], lse [B,H_q,n_q], weights [B,H_q,n_q,n_k].
 * Only types come from attn.h; nothing here calls libattn, so the file links
 * into every test binary with libc and libm alone.
 */
#ifndef ATTN_TEST_REF_H
#define ATTN_TEST_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attn.h"

/* Whether query i of (b, h) may see key j, and the additive bias it gets
 * (the mask's and ALiBi's). */
bool ref_visible(const attn_sdpa_params *p, int64_t b, int64_t h, int64_t i,
                 int64_t j, double *bias);

/* Forward; lse and weights may be NULL. Fully masked rows: zeros, lse -inf. */
void ref_sdpa_forward(const attn_sdpa_params *p, const double *q,
                      const double *k, const double *v, double *out,
                      double *lse, double *weights);

/* Analytic backward (Eq. 16-18) of out with respect to q, k, v given dout. */
void ref_sdpa_backward(const attn_sdpa_params *p, const double *q,
                       const double *k, const double *v, const double *dout,
                       double *dq, double *dk, double *dv);

/* The scalar loss sum(dout * out) whose gradients ref_sdpa_backward gives. */
double ref_sdpa_loss(const attn_sdpa_params *p, const double *q,
                     const double *k, const double *v, const double *dout);

/* Central finite differences of ref_sdpa_loss with step h (q, k, v are
 * perturbed in place and restored). */
void ref_sdpa_grad_fd(const attn_sdpa_params *p, double *q, double *k,
                      double *v, const double *dout, double h, double *dq,
                      double *dk, double *dv);

/* The statistics of attn_stats, from their definitions. */
void ref_sdpa_stats(const attn_sdpa_params *p, const double *q,
                    const double *k, attn_stats *st);

#endif /* ATTN_TEST_REF_H */
