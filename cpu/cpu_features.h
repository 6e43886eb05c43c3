/*
 * What this CPU can run, asked of it once per process.
 *
 * Shared by libattn (its kernels, its report on OpenBLAS) and the tensor
 * codec (its row classifier and its float16 conversions), which know nothing
 * of each other: this header depends on nothing but the C library, and
 * cpu_features.c is compiled into each library that uses it.
 *
 * A bit is set only when the CPU has the instructions and the operating
 * system saves the registers they use (XCR0): a CPU with AVX-512 under an
 * OS that does not save the ZMM registers reports no AVX-512 at all.
 */
#ifndef CPU_FEATURES_H
#define CPU_FEATURES_H

#include <stdbool.h>

enum {
    CPU_AVX = 1u << 0,
    CPU_AVX2 = 1u << 1,
    CPU_FMA = 1u << 2,
    CPU_F16C = 1u << 3,
    CPU_AVX512F = 1u << 4,
    CPU_AVX512BW = 1u << 5,
    CPU_AVX512DQ = 1u << 6,
    CPU_AVX512VL = 1u << 7,
    CPU_AVX512_BF16 = 1u << 8,
    /* AMX: the CPU has the tiles and the OS supports their state. Linux
     * still refuses a process the tile data until it asks for it: call
     * cpu_amx_request() before the first tile instruction. */
    CPU_AMX_TILE = 1u << 9,
    CPU_AMX_BF16 = 1u << 10,
};

/* The CPU_* bits of this CPU (0 on other architectures), probed on the
 * first call, from any thread (pthread_once). */
unsigned cpu_features(void);

/* Whether the CPU has every feature of `all` (a set of CPU_* bits). */
bool cpu_has(unsigned all);

/* Asks Linux for this process's permission to use the AMX tile data
 * (arch_prctl ARCH_REQ_XCOMP_PERM), once; true when AMX may be used: the
 * CPU has it and the permission is granted. Without it, the first tile
 * instruction kills the process with SIGILL. */
bool cpu_amx_request(void);

#endif /* CPU_FEATURES_H */
