/*
 * How this process runs the bfloat16 products (attn_bf16): with AMX tiles
 * where the avx512 kernel runs on a CPU with AMX-BF16 (and AVX512_BF16,
 * whose vectors the rest of that kernel uses) and Linux grants the tile
 * state, with vdpbf16ps where the avx512 kernel runs on a CPU with
 * AVX512_BF16, emulated by the kernel in use everywhere else, decided once
 * after the kernel, or as ATTN_BF16=emulated|avx512_bf16|amx forces it
 * when this kernel on this CPU can run it. Every way gives the
 * instruction's bits, so forcing one on a CPU that has another is how the
 * tests compare them.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_features.h"
#include "kern.h"

static const char *const NAMES[] = {
    [ATTN_BF16_EMULATED] = "emulated",
    [ATTN_BF16_AVX512_BF16] = "avx512_bf16",
    [ATTN_BF16_AMX] = "amx",
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
    /* kern_amx_bf16.c besides, AMX-TILE and AMX-BF16, and the permission
     * asked last (the first tile instruction without it is SIGILL) */
    case ATTN_BF16_AMX:
        return kind == ATTN_KERNEL_AVX512 &&
               cpu_has(CPU_AVX512_BF16 | CPU_AVX512BW | CPU_AMX_TILE | CPU_AMX_BF16) &&
               cpu_amx_request();
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
    return kind >= ATTN_BF16_EMULATED && kind <= ATTN_BF16_AMX ? NAMES[kind] : "unknown";
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
    chosen = attn_bf16_supported(ATTN_BF16_AMX)           ? ATTN_BF16_AMX
             : attn_bf16_supported(ATTN_BF16_AVX512_BF16) ? ATTN_BF16_AVX512_BF16
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
        return path == ATTN_BF16_AMX           ? &attn_kern_bf16_amx
               : path == ATTN_BF16_AVX512_BF16 ? &attn_kern_bf16_avx512bf16
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
