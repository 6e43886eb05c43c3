/*
 * libattn's portable kernels: plain C, one float per "vector", for any CPU.
 * The same body as the vector kernels (kern_body.h), so the generic kernel
 * is the reference for their tiling; its exp is libm's expf.
 */
#include <math.h>

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
static inline void vtranspose(const float *src, int64_t lds, float *dst, int64_t ldd)
{
    (void)lds;
    (void)ldd;
    *dst = *src;
}
static inline vf vexp(vf a) { return a < ATTN_EXP_MIN ? 0.0f : expf(a); }

#include "kern_body.h"

static inline vf vload_f16(const uint16_t *p) { return kv_f16_to_f32(*p); }
static inline vf vload_bf16(const uint16_t *p) { return kv_bf16_to_f32(*p); }

#include "kern_kv_body.h"
