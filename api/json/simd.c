/*
 * The codec's one switch for instruction sets: what this CPU runs, asked
 * once per process, and how wide the codec may go (codec_set_simd). The row
 * classifier (row_scan.c) and the float16 / bfloat16 conversions (half.c)
 * read the width in use from here, so that neither asks the CPU per call.
 */
#include "codec_internal.h"

#include <pthread.h>
#include <stdatomic.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SIMD_X86 1
#include <cpuid.h>
#endif

/* What the CPU (and the OS, which must save the wider registers) runs. */
static struct {
    bool avx2, avx512bw, avx, f16c, avx512f, avx512bf16;
} cpu;

static pthread_once_t probed = PTHREAD_ONCE_INIT;

static void probe(void)
{
#ifdef SIMD_X86
    __builtin_cpu_init();
    cpu.avx2 = __builtin_cpu_supports("avx2");
    cpu.avx512f = __builtin_cpu_supports("avx512f");
    cpu.avx512bw = cpu.avx512f && __builtin_cpu_supports("avx512bw");
    cpu.avx = __builtin_cpu_supports("avx");
    /* F16C (CPUID leaf 1, ECX bit 29) and AVX512_BF16 (leaf 7, subleaf 1,
     * EAX bit 5) asked of CPUID directly: clang 14's __builtin_cpu_supports
     * knows neither name. Whether the OS saves the AVX and AVX-512
     * registers is what "avx" and "avx512f" check, next to them. */
    unsigned a, b, c, d;
    cpu.f16c = cpu.avx && __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
    cpu.avx512bf16 = cpu.avx512f && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1);
#endif
}

bool codec_simd_supported(codec_simd simd)
{
    pthread_once(&probed, probe);
    switch (simd) {
    case CODEC_SIMD_PORTABLE:
        return true;
#ifdef SIMD_X86
    case CODEC_SIMD_SSE2:
        return true;
    case CODEC_SIMD_AVX2:
        return cpu.avx2;
    case CODEC_SIMD_AVX512:
        return cpu.avx512bw;
#endif
    default:
        return false;
    }
}

bool codec_half_path_supported(codec_half_path path)
{
    pthread_once(&probed, probe);
    switch (path) {
    case CODEC_HALF_PORTABLE:
        return true;
    case CODEC_HALF_F16C:
        return cpu.f16c;
    case CODEC_HALF_AVX512:
        return cpu.avx512f;
    case CODEC_HALF_AVX512_BF16:
        return cpu.avx512bf16;
    default:
        return false;
    }
}

/* The widest width this CPU runs up to `cap`. */
static codec_simd widest_upto(codec_simd cap)
{
    int s = cap > CODEC_SIMD_AVX512 ? CODEC_SIMD_AVX512 : (int)cap;
    while (s > CODEC_SIMD_PORTABLE && !codec_simd_supported((codec_simd)s))
        s--;
    return (codec_simd)s;
}

/* The width set (no limit until codec_set_simd), and the width in use that
 * follows from it, -1 until first asked for. */
static _Atomic int cap_set = CODEC_SIMD_AVX512;
static _Atomic int in_use = -1;

void codec_set_simd(codec_simd widest)
{
    atomic_store(&cap_set, (int)widest);
    atomic_store(&in_use, (int)widest_upto(widest));
}

codec_simd codec_simd_in_use(void)
{
    int s = atomic_load_explicit(&in_use, memory_order_relaxed);
    if (s >= 0)
        return (codec_simd)s;
    int unknown = -1, mine = (int)widest_upto((codec_simd)atomic_load(&cap_set));
    /* a codec_set_simd in between wins */
    if (atomic_compare_exchange_strong(&in_use, &unknown, mine))
        return (codec_simd)mine;
    return (codec_simd)unknown;
}

const char *codec_simd_name(codec_simd simd)
{
    static const char *const names[] = {"portable", "sse2", "avx2", "avx512"};
    return simd <= CODEC_SIMD_AVX512 ? names[simd] : "unknown";
}

codec_half_path codec_half_path_in_use(void)
{
    switch (codec_simd_in_use()) {
    case CODEC_SIMD_AVX512:
        return codec_half_path_supported(CODEC_HALF_AVX512_BF16) ? CODEC_HALF_AVX512_BF16
                                                                 : CODEC_HALF_AVX512;
    case CODEC_SIMD_AVX2:
        return codec_half_path_supported(CODEC_HALF_F16C) ? CODEC_HALF_F16C
                                                          : CODEC_HALF_PORTABLE;
    default:
        return CODEC_HALF_PORTABLE;
    }
}
