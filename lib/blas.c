/* OpenBLAS configuration. libattn runs its own threads over independent
 * tiles (attn_parallel_for), each calling sgemm on a small tile; a threaded
 * BLAS underneath would oversubscribe the cores, so OpenBLAS is kept at one
 * thread, set once per process before the first BLAS call.
 *
 * Also here: whether the OpenBLAS kernels in use are weaker than the CPU.
 * A DYNAMIC_ARCH OpenBLAS picks its kernels from the CPU model, and a model
 * it does not know (0.3.21 on a newer Xeon, say) gets a generic SSE3 core
 * even when the CPU has AVX-512; OPENBLAS_CORETYPE overrides the choice. */
#include <pthread.h>
#include <stdio.h>
#include <strings.h>

#include <cblas.h>

#include "cpu_features.h"
#include "internal.h"

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_single_threaded(void)
{
    openblas_set_num_threads(1);
}

void attn_blas_init(void)
{
    pthread_once(&blas_once, blas_single_threaded);
}

const char *attn_blas_config(void)
{
    return openblas_get_config();
}

const char *attn_blas_corename(void)
{
    return openblas_get_corename();
}

unsigned attn_cpu_features(void)
{
    unsigned f = 0;
    f |= cpu_has(CPU_AVX) ? ATTN_CPU_AVX : 0;
    f |= cpu_has(CPU_AVX2) ? ATTN_CPU_AVX2 : 0;
    f |= cpu_has(CPU_FMA) ? ATTN_CPU_FMA : 0;
    f |= cpu_has(CPU_AVX512F | CPU_AVX512BW | CPU_AVX512DQ | CPU_AVX512VL) ? ATTN_CPU_AVX512 : 0;
    return f;
}

/* The instruction set of OpenBLAS's x86 sgemm kernels, widest last. The
 * FLOPs per cycle a core are nominal single-precision peaks with two vector
 * ports: SSE and AVX issue one multiply and one add (4 + 4, 8 + 8 lanes),
 * AVX2 and AVX-512 two FMAs (2 x 2 x 8, 2 x 2 x 16). CPUs with one 512-bit
 * FMA unit reach half the last, hence "up to" in the message. */
typedef enum { ISA_SSE, ISA_AVX, ISA_AVX2, ISA_AVX512, N_ISA } blas_isa;

static const struct {
    const char *name;          /* as the log line says it */
    int flops_per_cycle;       /* nominal, one core */
    const char *coretype;      /* an OPENBLAS_CORETYPE with these kernels */
} ISA[N_ISA] = {
    [ISA_SSE] = {"SSE3", 8, "Prescott"},
    [ISA_AVX] = {"AVX", 16, "Sandybridge"},
    [ISA_AVX2] = {"AVX2+FMA", 32, "Haswell"},
    [ISA_AVX512] = {"AVX-512", 64, "SkylakeX"},
};

/* OpenBLAS's x86 core names (openblas_get_corename(), any case) and the
 * instruction set of their sgemm kernels. AMD's Bulldozer line runs
 * 128-bit-wide AVX/FMA kernels, counted as AVX. */
static const struct {
    const char *corename;
    blas_isa isa;
} CORES[] = {
    {"katmai", ISA_SSE},      {"coppermine", ISA_SSE}, {"northwood", ISA_SSE},
    {"prescott", ISA_SSE},    {"banias", ISA_SSE},     {"atom", ISA_SSE},
    {"core2", ISA_SSE},       {"penryn", ISA_SSE},     {"dunnington", ISA_SSE},
    {"nehalem", ISA_SSE},     {"athlon", ISA_SSE},     {"opteron", ISA_SSE},
    {"opteron_sse3", ISA_SSE},{"barcelona", ISA_SSE},  {"nano", ISA_SSE},
    {"bobcat", ISA_SSE},      {"sandybridge", ISA_AVX},{"bulldozer", ISA_AVX},
    {"piledriver", ISA_AVX},  {"steamroller", ISA_AVX},{"excavator", ISA_AVX},
    {"haswell", ISA_AVX2},    {"zen", ISA_AVX2},       {"skylakex", ISA_AVX512},
    {"cooperlake", ISA_AVX512}, {"sapphirerapids", ISA_AVX512},
};

static bool core_isa(const char *corename, blas_isa *isa)
{
    for (size_t i = 0; corename != NULL && i < sizeof CORES / sizeof CORES[0]; i++)
        if (strcasecmp(corename, CORES[i].corename) == 0) {
            *isa = CORES[i].isa;
            return true;
        }
    return false;
}

static blas_isa cpu_isa(unsigned features)
{
    if ((features & ATTN_CPU_AVX512) && (features & ATTN_CPU_FMA))
        return ISA_AVX512;
    if ((features & ATTN_CPU_AVX2) && (features & ATTN_CPU_FMA))
        return ISA_AVX2;
    if (features & ATTN_CPU_AVX)
        return ISA_AVX;
    return ISA_SSE;
}

bool attn_blas_shortfall(const char *corename, unsigned cpu_features, char *msg,
                         size_t cap)
{
    blas_isa runs, could;
    if (!core_isa(corename, &runs))
        return false; /* a core we cannot place: no claim about it */
    could = cpu_isa(cpu_features);
    if (runs >= could)
        return false;
    if (msg != NULL && cap > 0) {
        /* For an AVX-512 CPU, Haswell is named too: OpenBLAS's AVX-512
         * kernels have crashed on some CPUs its version does not know. */
        char also[96] = "";
        if (could == ISA_AVX512 && runs < ISA_AVX2)
            snprintf(also, sizeof also, ", or %s for its %s ones (up to %dx)",
                     ISA[ISA_AVX2].coretype, ISA[ISA_AVX2].name,
                     ISA[ISA_AVX2].flops_per_cycle / ISA[runs].flops_per_cycle);
        snprintf(msg, cap,
                 "OpenBLAS runs its %s kernels (%s, %d FLOP/cycle a core) on a CPU "
                 "with %s (%d): the projections of multi-head attention and other "
                 "OpenBLAS products can run up to %dx slower than the CPU allows; "
                 "OPENBLAS_CORETYPE=%s in the environment selects OpenBLAS's %s "
                 "kernels%s",
                 corename, ISA[runs].name, ISA[runs].flops_per_cycle, ISA[could].name,
                 ISA[could].flops_per_cycle,
                 ISA[could].flops_per_cycle / ISA[runs].flops_per_cycle,
                 ISA[could].coretype, ISA[could].name, also);
    }
    return true;
}
