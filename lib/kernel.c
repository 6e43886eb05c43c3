/*
 * Which of libattn's kernels this process runs: the best the CPU supports
 * (AVX-512F, then AVX2+FMA, then portable C), decided once, or the one that
 * ATTN_KERNEL=generic|avx2|avx512 forces (tests and benchmarks run every
 * kernel this way). A forced kernel the CPU cannot run is not used: the
 * choice falls back to the best available, and attn_kernel_forced() says
 * what was asked for.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_features.h"
#include "kern.h"

static const char *const NAMES[] = {
    [ATTN_KERNEL_GENERIC] = "generic",
    [ATTN_KERNEL_AVX2] = "avx2",
    [ATTN_KERNEL_AVX512] = "avx512",
};

bool attn_kernel_supported(attn_kernel_kind kind)
{
    switch (kind) {
    case ATTN_KERNEL_GENERIC:
        return true;
#if defined(__x86_64__)
    /* What each file is compiled for (-mavx2 -mfma, -mavx512f): see Makefile. */
    case ATTN_KERNEL_AVX2:
        return cpu_has(CPU_AVX2 | CPU_FMA);
    case ATTN_KERNEL_AVX512:
        return cpu_has(CPU_AVX512F | CPU_AVX2 | CPU_FMA);
#endif
    default:
        return false;
    }
}

bool attn_kernel_parse(const char *name, attn_kernel_kind *kind)
{
    for (int i = 0; i < (int)(sizeof NAMES / sizeof NAMES[0]); i++)
        if (name != NULL && strcmp(name, NAMES[i]) == 0) {
            *kind = (attn_kernel_kind)i;
            return true;
        }
    return false;
}

const char *attn_kernel_kind_name(attn_kernel_kind kind)
{
    return kind >= ATTN_KERNEL_GENERIC && kind <= ATTN_KERNEL_AVX512 ? NAMES[kind] : "unknown";
}

static attn_kernel_kind chosen = ATTN_KERNEL_GENERIC;
static const char *forced = NULL;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
    attn_kernel_kind want;
    const char *env = getenv("ATTN_KERNEL");
    if (env != NULL && *env != '\0' && attn_kernel_parse(env, &want)) {
        forced = NAMES[want];
        if (attn_kernel_supported(want)) {
            chosen = want;
            return;
        }
    }
    if (attn_kernel_supported(ATTN_KERNEL_AVX512))
        chosen = ATTN_KERNEL_AVX512;
    else if (attn_kernel_supported(ATTN_KERNEL_AVX2))
        chosen = ATTN_KERNEL_AVX2;
    else
        chosen = ATTN_KERNEL_GENERIC;
}

attn_kernel_kind attn_kernel(void)
{
    pthread_once(&choose_once, choose);
    return chosen;
}

const char *attn_kernel_name(void)
{
    return NAMES[attn_kernel()];
}

const char *attn_kernel_forced(void)
{
    pthread_once(&choose_once, choose);
    return forced;
}

const attn_kern *attn_kern_of(attn_kernel_kind kind)
{
    if (!attn_kernel_supported(kind))
        return NULL;
    switch (kind) {
#if defined(__x86_64__)
    case ATTN_KERNEL_AVX512:
        return &attn_kern_avx512;
    case ATTN_KERNEL_AVX2:
        return &attn_kern_avx2;
#endif
    case ATTN_KERNEL_GENERIC:
        return &attn_kern_generic;
    default:
        return NULL;
    }
}

const attn_kern *attn_kern_get(void)
{
    return attn_kern_of(attn_kernel());
}
