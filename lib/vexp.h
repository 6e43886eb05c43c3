/* Vector kernels over one row of a score tile, the elementwise hot spots of
 * the softmax. Each has an AVX-512F, an AVX2+FMA and a portable version; the
 * best one the CPU supports is chosen once per process. */
#ifndef ATTN_VEXP_H
#define ATTN_VEXP_H

#include <stdint.h>

/* The largest of x[0..n), -INFINITY when n == 0. */
float attn_vmax(const float *x, int64_t n);

/* x[j] = exp(x[j] - shift) in place; returns the sum of the new x.
 * exp is accurate to about 1 ulp, exp(0) is exactly 1, and arguments below
 * ATTN_VEXP_MIN (including -INFINITY) give exactly 0. Arguments must be
 * at most 88. */
float attn_vexp_sum(float *x, int64_t n, float shift);

/* The backward pass's elementwise step on one row of a tile:
 *   p[j] = exp((s[j] - lse) - lse_lo) (the attention weight, recomputed;
 *                                      lse + lse_lo is the row's log-sum-exp)
 *   dp[j] = p[j] * (dp[j] - delta)    (the score gradient dS; exactly 0
 *                                      where p[j] == 1, a one-hot row)
 * in place, with the same exp as attn_vexp_sum. */
void attn_vsoftmax_grad(float *s, float *dp, int64_t n, float lse, float lse_lo,
                        float delta);

/* Below this, expf underflows past the normal floats: flushed to 0. */
#define ATTN_VEXP_MIN (-87.33654f)

/* The individual versions, for tests that compare them. Each returns 0
 * (and does nothing) when this CPU cannot run it. */
typedef enum { ATTN_VEXP_PORTABLE, ATTN_VEXP_AVX2, ATTN_VEXP_AVX512 } attn_vexp_kind;
int attn_vexp_available(attn_vexp_kind kind);
float attn_vexp_sum_kind(attn_vexp_kind kind, float *x, int64_t n, float shift);
float attn_vmax_kind(attn_vexp_kind kind, const float *x, int64_t n);
void attn_vsoftmax_grad_kind(attn_vexp_kind kind, float *s, float *dp, int64_t n,
                             float lse, float lse_lo, float delta);

#endif /* ATTN_VEXP_H */
