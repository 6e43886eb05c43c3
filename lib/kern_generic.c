/*
 * libattn's portable kernels: plain C, one float per "vector", for any CPU.
 * The same body as the vector kernels (kern_body.h), so the generic kernel
 * is the reference for their tiling; its exp is libm's expf. Its bfloat16
 * products (kern_body_bf16.h) emulate vdpbf16ps step by step in C.
 */
#include <float.h>
#include <math.h>

#include "bf16.h"
#include "kern.h"
#include "kv.h"

#define KF(name) name##_generic
#define KERN_KIND ATTN_KERNEL_GENERIC
#define KMR 4
#define KNV 4
#define VW 1

typedef float vf;
typedef unsigned vmask; /* bit 0: the one lane */

static inline vf vzero(void) { return 0.0f; }
static inline vf vset1(float x) { return x; }
static inline vf vload(const float *p) { return *p; }
static inline void vstore(float *p, vf x) { *p = x; }
static inline void vstream(float *p, vf x) { *p = x; }
static inline vmask vmask_first(int n) { return n > 0; }
static inline vf vload_m(const float *p, vmask m) { return m ? *p : 0.0f; }
static inline void vstore_m(float *p, vf x, vmask m)
{
    if (m)
        *p = x;
}
static inline vf vadd(vf a, vf b) { return a + b; }
static inline vf vsub(vf a, vf b) { return a - b; }
static inline vf vmul(vf a, vf b) { return a * b; }
static inline vf vmax(vf a, vf b) { return a > b ? a : b; }
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
static inline float vhmax(vf x) { return x; }
static inline float vhsum(vf x) { return x; }
static inline vf vmasked(vf x, vmask m) { return m ? x : 0.0f; }
static inline vmask vnot_one(vf x) { return x != 1.0f; }
static inline vf vkeep_range(vf x, int64_t lo, int64_t hi)
{
    return lo <= 0 && 0 < hi ? x : -INFINITY;
}
static inline vf vabs(vf x) { return fabsf(x); }
static inline vf vdiv(vf a, vf b) { return a / b; }
static inline vmask vge(vf a, vf b) { return a >= b; }
static inline vf vblend(vmask m, vf a, vf b) { return m ? a : b; }
static inline vf vcopysign(vf x, vf s) { return copysignf(x, s); }
static inline vf viota(void) { return 0.0f; }
static inline vmask vbad(vf x) { return x != x || x == INFINITY; }
static inline vmask vnonfinite(vf x) { return !(x - x == 0.0f); }
static inline bool vmask_none(vmask m) { return m == 0; }
static inline vf vmul_d(vf x, double f) { return (float)((0.0 + (double)x) * f); }
static inline void vfold_d(double *acc, float *part)
{
    *acc += *part;
    *part = 0.0f;
}
static inline void vtranspose(const float *src, int64_t lds, int rows, float *dst, int64_t ldd)
{
    (void)lds;
    (void)ldd;
    *dst = rows > 0 ? *src : 0.0f;
}
/* The short step's sums of lanes (kern_body.h): one lane, R = 1. */
static inline vf vhsums(const int R, const vf *a)
{
    (void)R;
    return a[0];
}
static inline vf vexp(vf a) { return a < ATTN_EXP_MIN ? 0.0f : expf(a); }

/* ------------------------------------------------------------- bfloat16 */

#define KERN_BF16_PATH ATTN_BF16_EMULATED
#define KMR2 4
#define KNV2 4
#define KERN_BF16_BEGIN ((void)0)
#define KERN_BF16_END ((void)0)

typedef uint32_t vpair;

static inline vpair vp_load(const uint32_t *p) { return *p; }
static inline vpair vp_load_m(const uint32_t *p, vmask m) { return m ? *p : 0u; }
static inline void vp_store(uint32_t *p, vpair x) { *p = x; }
static inline void vp_store_m(uint32_t *p, vpair x, vmask m)
{
    if (m)
        *p = x;
}
static inline vpair vp_set1(uint32_t w) { return w; }
static inline vf vbf16_weight(vf x) { return bf16_round(x); }
static inline vpair vbf16_words(vf lo, vf hi) { return bf16_pair(lo, hi); }
static inline vpair vbf16_join(vf lo, vf hi)
{
    uint32_t a, b;
    memcpy(&a, &lo, sizeof a);
    memcpy(&b, &hi, sizeof b);
    return (a >> 16) | b;
}
/* Two weights rounded in place, and their word. */
static inline vpair vbf16_weights2(vf *lo, vf *hi)
{
    *lo = vbf16_weight(*lo);
    *hi = vbf16_weight(*hi);
    return vbf16_join(*lo, *hi);
}
static inline void vptranspose(const uint32_t *src, int64_t lds, uint32_t *dst, int64_t ldd)
{
    (void)lds;
    (void)ldd;
    *dst = *src;
}

static inline float bf16_half(uint32_t word_bits)
{
    float f;
    memcpy(&f, &word_bits, sizeof f);
    return f;
}

/* Subnormal inputs read as zero of their sign. */
static inline float daz(float x) { return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x; }

/*
 * One of vdpbf16ps's steps, acc + a b as a fused multiply-add (a b is exact:
 * two 8-bit significands) rounded to nearest even, then flushed to zero
 * when tiny, as the x86 hardware decides it: after rounding to 24 bits
 * with an unbounded exponent. fmaf rounds to the subnormal grid instead,
 * and the two differ only for a result that fmaf rounds to exactly 2^-126:
 * the hardware flushes it when the exact value lies below the midpoint
 * 2^-126 - 2^-151 between 2^-126 and the 24-bit float below it. That exact
 * value, close to 2^-126, is the exact sum in double: a and b have 8
 * significant bits each and acc 24, and a sum within 2^-150 of 2^-126 has
 * all its bits within double's 53 (or lies too far from the midpoint for
 * double's rounding to carry it across).
 * A product that is a normal float (or exactly zero) is exact in float, and
 * then the fused step is a float addition: only the rest calls fmaf.
 */
static inline float dot2_step(float acc, float a, float b)
{
    acc = daz(acc);
    a = daz(a);
    b = daz(b);
    float p = a * b, r;
    if ((fabsf(p) >= FLT_MIN && fabsf(p) <= FLT_MAX) || a == 0.0f || b == 0.0f)
        r = p + acc;
    else
        r = fmaf(a, b, acc);
    if (fabsf(r) < FLT_MIN)
        return copysignf(0.0f, r);
    if (fabsf(r) == FLT_MIN) {
        double exact = (double)acc + (double)a * (double)b;
        if (fabs(exact) < (double)FLT_MIN - 0x1p-151)
            return copysignf(0.0f, r);
    }
    return r;
}

/* vdpbf16ps on one lane: the high halves' product first, then the low. */
static inline vf vdot2(vf acc, vpair a, vpair b)
{
    acc = dot2_step(acc, bf16_half(a & BF16_HIGH), bf16_half(b & BF16_HIGH));
    return dot2_step(acc, bf16_half(a << 16), bf16_half(b << 16));
}

#include "kern_body.h"
#include "kern_body_bf16.h"

static inline vf vload_f16(const uint16_t *p) { return kv_f16_to_f32(*p); }
static inline vf vload_bf16(const uint16_t *p) { return kv_bf16_to_f32(*p); }

#include "kern_kv_body.h"
