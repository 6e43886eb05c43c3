/* The constants of the vector exp of the AVX kernels.
 * exp(x) = 2^n exp(r) with n = round(x / ln 2) and r = x - n ln 2 in
 * [-ln2/2, ln2/2]; ln 2 is split in two (Cody-Waite) so that n * LN2_HI is
 * exact and r keeps full precision. exp(r) is its Taylor polynomial of
 * degree 7: on |r| <= 0.347 the truncation error is below 5e-9, under half an
 * ulp, so the result is within about 1 ulp of exp and exp(0) == 1 exactly.
 * Arguments below ATTN_EXP_MIN, where 2^n would leave the normal floats, are
 * flushed to exactly 0 (so is -inf): a hidden score has a weight of exactly
 * 0, never a denormal or a NaN. */
#ifndef ATTN_KERN_EXP_H
#define ATTN_KERN_EXP_H

#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f      /* 9 significant bits: n * LN2_HI is exact */
#define EXP_LN2_LO (-2.12194440e-4f) /* ln 2 - LN2_HI */
#define EXP_ARG_MAX 88.0f            /* keeps 2^n a normal float */
#define EXP_C2 (1.0f / 2)
#define EXP_C3 (1.0f / 6)
#define EXP_C4 (1.0f / 24)
#define EXP_C5 (1.0f / 120)
#define EXP_C6 (1.0f / 720)
#define EXP_C7 (1.0f / 5040)

#endif /* ATTN_KERN_EXP_H */
