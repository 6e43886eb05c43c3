/*
 * The CPU_* bits from CPUID and XCR0, once per process.
 *
 * CPUID says what the CPU implements; XCR0 (read by xgetbv, when CPUID says
 * the OS enabled it: OSXSAVE) says which register states the OS saves on a
 * context switch. An instruction set is usable only with both: AVX needs
 * the SSE and YMM states (XCR0 bits 1-2), AVX-512 also the mask and the
 * upper ZMM states (bits 5-7), AMX the tile configuration and data (17-18).
 * CPUID is asked directly rather than through __builtin_cpu_supports, which
 * knows neither F16C, AVX512_BF16 nor AMX in clang 14; and it is asked once:
 * under a hypervisor every CPUID instruction traps, microseconds each.
 */
#include "cpu_features.h"

#include <pthread.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <stdint.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif
#define CPU_X86 1
#endif

static unsigned features;
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;

#ifdef CPU_X86
/* XCR0 bits: the register states the OS saves. */
#define XSTATE_SSE (1u << 1)
#define XSTATE_YMM (1u << 2)
#define XSTATE_ZMM ((1u << 5) | (1u << 6) | (1u << 7)) /* opmask, ZMM_Hi256, Hi16_ZMM */
#define XSTATE_TILE ((1u << 17) | (1u << 18))          /* XTILECFG, XTILEDATA */

static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

static bool bit(unsigned reg, int n)
{
    return reg >> n & 1;
}

static void probe(void)
{
    unsigned a, b, c, d, f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    uint64_t xcr0 = bit(c, 27) ? read_xcr0() : 0; /* OSXSAVE */
    bool ymm = (xcr0 & (XSTATE_SSE | XSTATE_YMM)) == (XSTATE_SSE | XSTATE_YMM);
    bool zmm = ymm && (xcr0 & XSTATE_ZMM) == XSTATE_ZMM;
    bool tiles = (xcr0 & XSTATE_TILE) == XSTATE_TILE;
    if (ymm) {
        f |= bit(c, 28) ? CPU_AVX : 0;
        f |= bit(c, 12) ? CPU_FMA : 0;
        f |= bit(c, 29) ? CPU_F16C : 0;
    }
    unsigned subleaves = 0;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, subleaves, b, c, d);
        if (ymm)
            f |= bit(b, 5) ? CPU_AVX2 : 0;
        if (zmm) {
            f |= bit(b, 16) ? CPU_AVX512F : 0;
            f |= bit(b, 17) ? CPU_AVX512DQ : 0;
            f |= bit(b, 30) ? CPU_AVX512BW : 0;
            f |= bit(b, 31) ? CPU_AVX512VL : 0;
        }
        if (tiles) {
            f |= bit(d, 24) ? CPU_AMX_TILE : 0;
            f |= bit(d, 22) ? CPU_AMX_BF16 : 0;
        }
        if (subleaves >= 1 && zmm) {
            __cpuid_count(7, 1, a, b, c, d);
            f |= bit(a, 5) ? CPU_AVX512_BF16 : 0;
        }
    }
    features = f;
}
#else
static void probe(void)
{
    features = 0;
}
#endif

unsigned cpu_features(void)
{
    pthread_once(&probe_once, probe);
    return features;
}

bool cpu_has(unsigned all)
{
    return (cpu_features() & all) == all;
}

static bool amx_permitted;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void request_amx(void)
{
#if defined(CPU_X86) && defined(__linux__)
    /* Since Linux 5.16 the tile data (XTILEDATA, state component 18) is
     * refused to a process until it asks; the permission is per process. */
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    amx_permitted = cpu_has(CPU_AMX_TILE) &&
                    syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#endif
}

bool cpu_amx_request(void)
{
    pthread_once(&amx_once, request_amx);
    return amx_permitted;
}
