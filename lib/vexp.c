/* exp over a row, vectorised. Range reduction exp(x) = 2^n * exp(r) with
 * n = round(x / ln 2) and r = x - n ln 2 in [-ln2/2, ln2/2]; ln 2 is split
 * in two (Cody-Waite) so that n * LN2_HI is exact and r keeps full precision.
 * exp(r) is its Taylor polynomial of degree 7: on |r| <= 0.347 the truncation
 * error is below 5e-9, under half an ulp, so the result is within about 1 ulp
 * and exp(0) == 1 exactly. Arguments below ATTN_VEXP_MIN, where 2^n would
 * leave the normal floats, are flushed to exactly 0 (so are -inf); a masked
 * score therefore has a weight of exactly 0, never a denormal or a NaN. */
#include <math.h>
#include <pthread.h>

#include "attn.h"
#include "vexp.h"

#if defined(__x86_64__) || defined(__i386__)
#define ATTN_X86 1
#include <immintrin.h>
#endif

#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f      /* 9 significant bits: n * LN2_HI is exact */
#define LN2_LO (-2.12194440e-4f) /* ln 2 - LN2_HI */
#define EXP_ARG_MAX 88.0f        /* keeps 2^n a normal float in the AVX2 path */
#define C2 (1.0f / 2)
#define C3 (1.0f / 6)
#define C4 (1.0f / 24)
#define C5 (1.0f / 120)
#define C6 (1.0f / 720)
#define C7 (1.0f / 5040)

/* ------------------------------------------------------------- portable */

static float vmax_portable(const float *x, int64_t n)
{
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++)
        m = x[j] > m ? x[j] : m;
    return m;
}

static float vexp_sum_portable(float *x, int64_t n, float shift)
{
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        float a = x[j] - shift;
        float e = a < ATTN_VEXP_MIN ? 0.0f : expf(a);
        x[j] = e;
        sum += e;
    }
    return sum;
}

static void vsoftmax_grad_portable(float *s, float *dp, int64_t n, float lse,
                                   float lse_lo, float delta)
{
    for (int64_t j = 0; j < n; j++) {
        float a = (s[j] - lse) - lse_lo;
        float p = a < ATTN_VEXP_MIN ? 0.0f : expf(a);
        s[j] = p;
        /* A weight of exactly 1 makes the row one-hot: its dS is dP_j -
         * sum_k P_k dP_k = 0 exactly, which delta (from dO . O, summed in
         * another order than dP's sgemm) would miss by a rounding error
         * that the scale then multiplies. */
        dp[j] = p == 1.0f ? 0.0f : p * (dp[j] - delta);
    }
}

#ifdef ATTN_X86
/* ----------------------------------------------------------- AVX2 + FMA */

__attribute__((target("avx2,fma"))) static inline __m256 exp8(__m256 a)
{
    __m256 keep = _mm256_cmp_ps(a, _mm256_set1_ps(ATTN_VEXP_MIN), _CMP_GE_OQ);
    a = _mm256_min_ps(a, _mm256_set1_ps(EXP_ARG_MAX));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), a);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    __m256 p = _mm256_set1_ps(C7);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* 2^n built in the exponent field; lanes flushed to 0 may hold garbage
     * here (n out of range), which the final AND discards. */
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

__attribute__((target("avx2,fma"))) static __m256i tail_mask8(int64_t left)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left), lane);
}

__attribute__((target("avx2,fma"))) static float vmax_avx2(const float *x, int64_t n)
{
    __m256 m = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        m = _mm256_max_ps(m, _mm256_loadu_ps(x + j));
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    float best = vmax_portable(lanes, 8);
    for (; j < n; j++)
        best = x[j] > best ? x[j] : best;
    return best;
}

__attribute__((target("avx2,fma"))) static float vexp_sum_avx2(float *x, int64_t n,
                                                              float shift)
{
    const __m256 s = _mm256_set1_ps(shift);
    __m256 acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), s));
        _mm256_storeu_ps(x + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (j < n) {
        __m256i m = tail_mask8(n - j);
        __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(x + j, m), s));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(m));
        _mm256_maskstore_ps(x + j, m, e);
        acc = _mm256_add_ps(acc, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
           ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

__attribute__((target("avx2,fma"))) static void vsoftmax_grad_avx2(float *s, float *dp,
                                                                  int64_t n, float lse,
                                                                  float lse_lo, float delta)
{
    const __m256 l = _mm256_set1_ps(lse), lo = _mm256_set1_ps(lse_lo);
    const __m256 d = _mm256_set1_ps(delta), one = _mm256_set1_ps(1.0f);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 p = exp8(_mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), l), lo));
        _mm256_storeu_ps(s + j, p);
        __m256 g = _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dp + j), d));
        _mm256_storeu_ps(dp + j, _mm256_andnot_ps(_mm256_cmp_ps(p, one, _CMP_EQ_OQ), g));
    }
    if (j < n) {
        __m256i m = tail_mask8(n - j);
        __m256 p = exp8(_mm256_sub_ps(_mm256_sub_ps(_mm256_maskload_ps(s + j, m), l), lo));
        _mm256_maskstore_ps(s + j, m, p);
        __m256 g = _mm256_mul_ps(p, _mm256_sub_ps(_mm256_maskload_ps(dp + j, m), d));
        g = _mm256_andnot_ps(_mm256_cmp_ps(p, one, _CMP_EQ_OQ), g);
        _mm256_maskstore_ps(dp + j, m, g);
    }
}

/* -------------------------------------------------------------- AVX-512F */

__attribute__((target("avx512f"))) static inline __m512 exp16(__m512 a)
{
    __mmask16 keep = _mm512_cmp_ps_mask(a, _mm512_set1_ps(ATTN_VEXP_MIN), _CMP_GE_OQ);
    a = _mm512_min_ps(a, _mm512_set1_ps(EXP_ARG_MAX));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(a, _mm512_set1_ps(LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), a);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    __m512 p = _mm512_set1_ps(C7);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

__attribute__((target("avx512f"))) static float vmax_avx512(const float *x, int64_t n)
{
    __m512 m = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        m = _mm512_max_ps(m, _mm512_loadu_ps(x + j));
    if (j < n) {
        __mmask16 t = (__mmask16)((1u << (n - j)) - 1);
        m = _mm512_max_ps(m, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), t, x + j));
    }
    return _mm512_reduce_max_ps(m);
}

__attribute__((target("avx512f"))) static float vexp_sum_avx512(float *x, int64_t n,
                                                               float shift)
{
    const __m512 s = _mm512_set1_ps(shift);
    __m512 acc = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), s));
        _mm512_storeu_ps(x + j, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (j < n) {
        __mmask16 t = (__mmask16)((1u << (n - j)) - 1);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, x + j), s));
        _mm512_mask_storeu_ps(x + j, t, e);
        acc = _mm512_mask_add_ps(acc, t, acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}
__attribute__((target("avx512f"))) static void vsoftmax_grad_avx512(float *s, float *dp,
                                                                   int64_t n, float lse,
                                                                   float lse_lo, float delta)
{
    const __m512 l = _mm512_set1_ps(lse), lo = _mm512_set1_ps(lse_lo);
    const __m512 d = _mm512_set1_ps(delta), one = _mm512_set1_ps(1.0f);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 p = exp16(_mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), l), lo));
        _mm512_storeu_ps(s + j, p);
        __mmask16 weight_below_1 = _mm512_cmp_ps_mask(p, one, _CMP_NEQ_UQ);
        _mm512_storeu_ps(dp + j, _mm512_maskz_mul_ps(weight_below_1, p,
                                                     _mm512_sub_ps(_mm512_loadu_ps(dp + j), d)));
    }
    if (j < n) {
        __mmask16 t = (__mmask16)((1u << (n - j)) - 1);
        __m512 p = exp16(_mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, s + j), l), lo));
        _mm512_mask_storeu_ps(s + j, t, p);
        __mmask16 weight_below_1 = _mm512_cmp_ps_mask(p, one, _CMP_NEQ_UQ);
        __m512 g = _mm512_maskz_mul_ps(weight_below_1, p,
                                       _mm512_sub_ps(_mm512_maskz_loadu_ps(t, dp + j), d));
        _mm512_mask_storeu_ps(dp + j, t, g);
    }
}
#endif /* ATTN_X86 */

/* ------------------------------------------------------------- dispatch */

int attn_vexp_available(attn_vexp_kind kind)
{
    switch (kind) {
    case ATTN_VEXP_PORTABLE:
        return 1;
#ifdef ATTN_X86
    case ATTN_VEXP_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case ATTN_VEXP_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f");
#endif
    default:
        return 0;
    }
}

float attn_vexp_sum_kind(attn_vexp_kind kind, float *x, int64_t n, float shift)
{
    if (!attn_vexp_available(kind))
        return 0.0f;
    switch (kind) {
#ifdef ATTN_X86
    case ATTN_VEXP_AVX512:
        return vexp_sum_avx512(x, n, shift);
    case ATTN_VEXP_AVX2:
        return vexp_sum_avx2(x, n, shift);
#endif
    default:
        return vexp_sum_portable(x, n, shift);
    }
}

float attn_vmax_kind(attn_vexp_kind kind, const float *x, int64_t n)
{
    if (!attn_vexp_available(kind))
        return 0.0f;
    switch (kind) {
#ifdef ATTN_X86
    case ATTN_VEXP_AVX512:
        return vmax_avx512(x, n);
    case ATTN_VEXP_AVX2:
        return vmax_avx2(x, n);
#endif
    default:
        return vmax_portable(x, n);
    }
}

void attn_vsoftmax_grad_kind(attn_vexp_kind kind, float *s, float *dp, int64_t n,
                             float lse, float lse_lo, float delta)
{
    if (!attn_vexp_available(kind))
        return;
    switch (kind) {
#ifdef ATTN_X86
    case ATTN_VEXP_AVX512:
        vsoftmax_grad_avx512(s, dp, n, lse, lse_lo, delta);
        return;
    case ATTN_VEXP_AVX2:
        vsoftmax_grad_avx2(s, dp, n, lse, lse_lo, delta);
        return;
#endif
    default:
        vsoftmax_grad_portable(s, dp, n, lse, lse_lo, delta);
    }
}

static float (*vmax_best)(const float *, int64_t) = vmax_portable;
static float (*vexp_sum_best)(float *, int64_t, float) = vexp_sum_portable;
static void (*vsoftmax_grad_best)(float *, float *, int64_t, float, float,
                                  float) = vsoftmax_grad_portable;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

/* The versions of attn_kernel(), the one kernel choice of libattn. */
static void choose(void)
{
#ifdef ATTN_X86
    switch (attn_kernel()) {
    case ATTN_KERNEL_AVX512:
        vmax_best = vmax_avx512;
        vexp_sum_best = vexp_sum_avx512;
        vsoftmax_grad_best = vsoftmax_grad_avx512;
        break;
    case ATTN_KERNEL_AVX2:
        vmax_best = vmax_avx2;
        vexp_sum_best = vexp_sum_avx2;
        vsoftmax_grad_best = vsoftmax_grad_avx2;
        break;
    default:
        break;
    }
#endif
}

float attn_vmax(const float *x, int64_t n)
{
    pthread_once(&choose_once, choose);
    return vmax_best(x, n);
}

float attn_vexp_sum(float *x, int64_t n, float shift)
{
    pthread_once(&choose_once, choose);
    return vexp_sum_best(x, n, shift);
}

void attn_vsoftmax_grad(float *s, float *dp, int64_t n, float lse, float lse_lo,
                        float delta)
{
    pthread_once(&choose_once, choose);
    vsoftmax_grad_best(s, dp, n, lse, lse_lo, delta);
}
