/*
 * Every float32, printed and read back: the opt-in exhaustive check of the
 * codec's number text (`make exhaustive`; not part of `make test`, it takes
 * about an hour on two cores).
 *
 *   float_exhaustive [FIRST LAST]   bit patterns FIRST..LAST (default: all
 *                                   positive finite ones; negatives differ
 *                                   only by the '-', checked on a sample)
 *
 * For each finite f > 0, with D the digits codec_float_text writes (n of them):
 *  - reads back: (float)strtod(text) == f (the reader's rounding, decimal ->
 *    double -> float32, as a Python client reads it) and codec_parse_float
 *    gives f too;
 *  - shortest: no decimal of n-1 significant digits reads back as f (only
 *    the two nearest f can: they are within one unit of glibc's correctly
 *    rounded "%.*e" text of f at n-1 digits);
 *  - nearest: when glibc's correctly rounded n-digit text of f reads back,
 *    D is that text (nearest, ties to even); otherwise D is one unit from it.
 * Also counted, not failed: texts that strtof (one rounding, straight to
 * float32) reads as another float.
 * References are glibc's strtod, strtof and printf, independent of the code
 * under test. Exit status 0 when nothing failed.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json/codec.h"
#include "json/codec_internal.h"
#include "support/float_check.h"

static atomic_ulong failures, strtof_differs, checked;

static float from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

static void fail(const char *what, float f, const char *text)
{
    if (atomic_fetch_add(&failures, 1) < 50)
        fprintf(stderr, "FAIL %s: %a (%.9g) -> %s\n", what, (double)f, (double)f, text);
}

static void check_one(float f)
{
    char text[CODEC_FLOAT_TEXT_MAX + 1], why[128];
    char *e = codec_float_text(f, text);
    *e = '\0';
    if (!float_check_reads_back(text, f)) {
        fail("does not read back", f, text);
        return;
    }
    float mine;
    const char *stop;
    if (!codec_parse_float(text, e, &stop, &mine) || bits_of(mine) != bits_of(f) || stop != e)
        fail("our reader reads it as another float", f, text);
    if (bits_of(strtof(text, NULL)) != bits_of(f))
        atomic_fetch_add(&strtof_differs, 1);
    const char *wrong = float_check_shortest_nearest(f, text, why, sizeof why);
    if (wrong)
        fail(wrong, f, text);
}

typedef struct {
    uint32_t first, last;
} range;

static void *run(void *arg)
{
    const range *r = arg;
    unsigned long n = 0;
    for (uint64_t b = r->first; b <= r->last; b++) {
        float f = from_bits((uint32_t)b);
        if (!isfinite(f) || f == 0)
            continue;
        check_one(f);
        if (++n % (1u << 24) == 0) {
            unsigned long total = atomic_fetch_add(&checked, n) + n;
            n = 0;
            fprintf(stderr, "  %lu checked (at %08" PRIx64 ")\n", total, b);
        }
    }
    atomic_fetch_add(&checked, n);
    return NULL;
}

int main(int argc, char **argv)
{
    uint32_t first = 1, last = 0x7f7fffff; /* every positive finite float */
    if (argc == 3) {
        first = (uint32_t)strtoul(argv[1], NULL, 0);
        last = (uint32_t)strtoul(argv[2], NULL, 0);
    }
    /* negatives: the same text behind a '-', on a sample */
    for (uint64_t b = 1; b <= 0x7f7fffff; b += 9973) {
        char pos[32], neg[32];
        *codec_float_text(from_bits((uint32_t)b), pos) = '\0';
        *codec_float_text(-from_bits((uint32_t)b), neg) = '\0';
        if (neg[0] != '-' || strcmp(neg + 1, pos) != 0)
            fail("negative is not '-' and the positive text", -from_bits((uint32_t)b), neg);
    }
    enum { THREADS = 2 };
    pthread_t t[THREADS];
    range r[THREADS];
    uint64_t span = ((uint64_t)last - first + 1) / THREADS;
    for (int i = 0; i < THREADS; i++) {
        r[i].first = (uint32_t)(first + span * (uint64_t)i);
        r[i].last = i == THREADS - 1 ? last : (uint32_t)(first + span * (uint64_t)(i + 1) - 1);
        pthread_create(&t[i], NULL, run, &r[i]);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    printf("float_exhaustive: %lu floats in %08" PRIx32 "..%08" PRIx32 " checked, %lu failures; "
           "%lu texts read differently by strtof (one rounding)\n",
           (unsigned long)checked, first, last, (unsigned long)failures,
           (unsigned long)strtof_differs);
    return failures ? 1 : 0;
}
