/*
 * The cores' own limit for single-precision arithmetic: every thread runs a
 * loop of fused multiply-adds on independent accumulators, nothing else (no
 * loads, no stores), so the figure is the FMA units' throughput as the
 * machine delivers it now (clock, turbo, a hypervisor's share), not a data
 * sheet's.
 *
 * Why so many accumulators: an FMA's result is ready after about 4 cycles
 * and a core starts up to 2 a cycle, so at least 8 must be in flight; 16
 * (AVX-512, 32 registers) and 12 (AVX2, 16 registers, two hold the
 * operands) leave room for CPUs with longer latencies. acc = acc * a + b
 * with a just below 1 converges to b / (1 - a): no overflow, no subnormals.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "peak.h"

enum { ACC_AVX512 = 16, ACC_AVX2 = 12 };

static const struct {
    const char *name;
    int lanes, accumulators;
} ISA[N_PEAK] = {
    [PEAK_AVX2] = {"avx2", 8, ACC_AVX2},
    [PEAK_AVX512] = {"avx512", 16, ACC_AVX512},
};

const char *peak_isa_name(peak_isa isa)
{
    return ISA[isa].name;
}

bool peak_isa_supported(peak_isa isa)
{
    __builtin_cpu_init();
    if (isa == PEAK_AVX512)
        return __builtin_cpu_supports("avx512f");
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

double peak_flops(peak_isa isa, int threads, long iters)
{
    return 2.0 * ISA[isa].lanes * ISA[isa].accumulators * (double)iters * threads;
}

__attribute__((target("avx512f"))) static float loop_avx512(long iters)
{
    __m512 a = _mm512_set1_ps(0.9999999f), b = _mm512_set1_ps(1e-7f);
    __m512 acc[ACC_AVX512];
    for (int j = 0; j < ACC_AVX512; j++)
        acc[j] = _mm512_set1_ps((float)j);
    for (long i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int j = 0; j < ACC_AVX512; j++)
            acc[j] = _mm512_fmadd_ps(acc[j], a, b);
    __m512 sum = acc[0];
    for (int j = 1; j < ACC_AVX512; j++)
        sum = _mm512_add_ps(sum, acc[j]);
    return _mm512_reduce_add_ps(sum);
}

__attribute__((target("avx2,fma"))) static float loop_avx2(long iters)
{
    __m256 a = _mm256_set1_ps(0.9999999f), b = _mm256_set1_ps(1e-7f);
    __m256 acc[ACC_AVX2];
    for (int j = 0; j < ACC_AVX2; j++)
        acc[j] = _mm256_set1_ps((float)j);
    for (long i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int j = 0; j < ACC_AVX2; j++)
            acc[j] = _mm256_fmadd_ps(acc[j], a, b);
    __m256 sum = acc[0];
    for (int j = 1; j < ACC_AVX2; j++)
        sum = _mm256_add_ps(sum, acc[j]);
    float lanes[8];
    _mm256_storeu_ps(lanes, sum);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

typedef struct {
    peak_isa isa;
    long iters;
    const atomic_int *go;
    volatile float sink; /* the result, so the loop is not optimised away */
} worker;

static void *run_worker(void *arg)
{
    worker *w = arg;
    /* A few microseconds of spinning until every thread exists: they start
     * together, and the clock starts with them. */
    while (!atomic_load(w->go))
        ;
    w->sink = w->isa == PEAK_AVX512 ? loop_avx512(w->iters) : loop_avx2(w->iters);
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double peak_run_s(peak_isa isa, int threads, long iters)
{
    enum { MAX_THREADS = 256 };
    if (threads < 1 || threads > MAX_THREADS)
        return -1;
    pthread_t tid[MAX_THREADS];
    worker w[MAX_THREADS];
    atomic_int go = 0;
    int started = 0;
    for (; started < threads; started++) {
        w[started] = (worker){.isa = isa, .iters = iters, .go = &go};
        if (pthread_create(&tid[started], NULL, run_worker, &w[started]) != 0)
            break;
    }
    if (started < threads)
        for (int i = 0; i < started; i++)
            w[i].iters = 0;
    double t0 = now_s();
    atomic_store(&go, 1);
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    double t = now_s() - t0;
    return started < threads ? -1 : t;
}
