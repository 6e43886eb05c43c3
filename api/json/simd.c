/*
 * The codec's one switch for instruction sets: how wide the codec may go
 * (codec_set_simd), within what this CPU runs (cpu/cpu_features.h, which
 * asks the CPU once per process and knows nothing of the codec). The row
 * classifier (row_scan.c) and the float16 / bfloat16 conversions (half.c)
 * read the width in use from here, so that neither asks the CPU per call.
 */
#include "codec_internal.h"

#include <stdatomic.h>

#include "cpu_features.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SIMD_X86 1
#endif

bool codec_simd_supported(codec_simd simd)
{
    switch (simd) {
    case CODEC_SIMD_PORTABLE:
        return true;
#ifdef SIMD_X86
    case CODEC_SIMD_SSE2:
        return true;
    case CODEC_SIMD_AVX2:
        return cpu_has(CPU_AVX2);
    case CODEC_SIMD_AVX512:
        return cpu_has(CPU_AVX512F | CPU_AVX512BW);
#endif
    default:
        return false;
    }
}

bool codec_half_path_supported(codec_half_path path)
{
    switch (path) {
    case CODEC_HALF_PORTABLE:
        return true;
#ifdef SIMD_X86
    case CODEC_HALF_F16C:
        return cpu_has(CPU_AVX | CPU_F16C);
    case CODEC_HALF_AVX512:
        return cpu_has(CPU_AVX512F);
    case CODEC_HALF_AVX512_BF16:
        return cpu_has(CPU_AVX512F | CPU_AVX512_BF16);
#endif
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
