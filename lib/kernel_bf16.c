/*
 * How this process runs the bfloat16 products (attn_bf16): with
 * vdpbf16ps where the avx512 kernel runs on a CPU with AVX512_BF16,
 * emulated by the kernel in use everywhere else, decided once after the
 * kernel, or as ATTN_BF16=emulated|avx512_bf16 forces it when this kernel
 * on this CPU can run it. The emulation gives the instruction's bits, so
 * forcing it on a CPU that has the instruction is how the tests compare
 * the two.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_features.h"
#include "kern.h"

static const char *const NAMES[] = {
    [ATTN_BF16_EMULATED] = "emulated",
    [ATTN_BF16_AVX512_BF16] = "avx512_bf16",
};

/* Can the kernel `kind` run its bfloat16 products this way on this CPU? */
static bool path_supported(attn_kernel_kind kind, attn_bf16_kind path)
{
    if (!attn_kernel_supported(kind))
        return false;
    switch (path) {
    case ATTN_BF16_EMULATED:
        return true;
#if defined(__x86_64__)
    /* kern_avx512_bf16.c is compiled for AVX-512 F and BW and AVX512_BF16
     * (see Makefile) */
    case ATTN_BF16_AVX512_BF16:
        return kind == ATTN_KERNEL_AVX512 && cpu_has(CPU_AVX512_BF16 | CPU_AVX512BW);
#endif
    default:
        return false;
    }
}

bool attn_bf16_supported(attn_bf16_kind kind)
{
    return path_supported(attn_kernel(), kind);
}

bool attn_bf16_parse(const char *name, attn_bf16_kind *kind)
{
    for (int i = 0; i < (int)(sizeof NAMES / sizeof NAMES[0]); i++)
        if (name != NULL && strcmp(name, NAMES[i]) == 0) {
            *kind = (attn_bf16_kind)i;
            return true;
        }
    return false;
}

const char *attn_bf16_kind_name(attn_bf16_kind kind)
{
    return kind >= ATTN_BF16_EMULATED && kind <= ATTN_BF16_AVX512_BF16 ? NAMES[kind]
                                                                       : "unknown";
}

static attn_bf16_kind chosen = ATTN_BF16_EMULATED;
static const char *forced = NULL;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
    attn_bf16_kind want;
    const char *env = getenv("ATTN_BF16");
    if (env != NULL && *env != '\0' && attn_bf16_parse(env, &want)) {
        forced = NAMES[want];
        if (attn_bf16_supported(want)) {
            chosen = want;
            return;
        }
    }
    chosen = attn_bf16_supported(ATTN_BF16_AVX512_BF16) ? ATTN_BF16_AVX512_BF16
                                                         : ATTN_BF16_EMULATED;
}

attn_bf16_kind attn_bf16(void)
{
    pthread_once(&choose_once, choose);
    return chosen;
}

const char *attn_bf16_name(void)
{
    return NAMES[attn_bf16()];
}

const char *attn_bf16_forced(void)
{
    pthread_once(&choose_once, choose);
    return forced;
}

const attn_kern_bf16 *attn_kern_bf16_of(attn_kernel_kind kind, attn_bf16_kind path)
{
    if (!path_supported(kind, path))
        return NULL;
    switch (kind) {
#if defined(__x86_64__)
    case ATTN_KERNEL_AVX512:
        return path == ATTN_BF16_AVX512_BF16 ? &attn_kern_bf16_avx512bf16
                                             : &attn_kern_bf16_avx512;
    case ATTN_KERNEL_AVX2:
        return &attn_kern_bf16_avx2;
#endif
    case ATTN_KERNEL_GENERIC:
        return &attn_kern_bf16_generic;
    default:
        return NULL;
    }
}

const attn_kern_bf16 *attn_kern_bf16_get(void)
{
    return attn_kern_bf16_of(attn_kernel(), attn_bf16());
}
