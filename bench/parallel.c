/*
 * The fixed cost of one attn_parallel_for call: what the backward pass pays
 * per round (three or four a call) and decoding once per token, whatever
 * the work.
 *
 *   parallel [THREADS [ROUNDS]]      (defaults: 2 threads, 20000 calls)
 *
 * Prints, for 1 and for THREADS threads, the median over 9 batches of the
 * time per call (microseconds) of
 *   empty  THREADS units that do nothing: the cost of starting and joining
 *   tiny   64 units of a few microseconds of arithmetic each
 * as lines "empty_t2_us 3.1". The units are independent of the thread that
 * runs them, so the figures compare the loop, not the work.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void empty_unit(void *ctx, int64_t i, int worker)
{
    (void)ctx;
    (void)i;
    (void)worker;
}

/* A few microseconds of dependent arithmetic, kept by a volatile store. */
static void tiny_unit(void *ctx, int64_t i, int worker)
{
    (void)worker;
    volatile double *sink = ctx;
    double x = (double)i;
    for (int k = 0; k < 300; k++)
        x = x * 0.999999 + 1e-9;
    sink[i & 63] = x;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define BATCHES 9

/* Median over BATCHES batches of the microseconds a call. */
static double per_call_us(int threads, int64_t units, void (*fn)(void *, int64_t, int),
                          void *ctx, int calls)
{
    double us[BATCHES];
    for (int w = 0; w < calls / 10; w++) /* warm-up: threads, caches, clocks */
        attn_parallel_for(threads, units, fn, ctx);
    for (int b = 0; b < BATCHES; b++) {
        double t0 = now_us();
        for (int c = 0; c < calls / BATCHES; c++)
            attn_parallel_for(threads, units, fn, ctx);
        us[b] = (now_us() - t0) / (calls / BATCHES);
    }
    qsort(us, BATCHES, sizeof *us, by_value);
    return us[BATCHES / 2];
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    int calls = argc > 2 ? atoi(argv[2]) : 20000;
    if (threads < 1 || calls < BATCHES * 10) {
        fprintf(stderr, "usage: parallel [THREADS >= 1 [ROUNDS >= 90]]\n");
        return 2;
    }
    static volatile double sink[64];
    int counts[2] = {1, threads};
    for (int k = 0; k < (threads > 1 ? 2 : 1); k++) {
        int t = counts[k];
        printf("empty_t%d_us %.2f\n", t, per_call_us(t, t, empty_unit, NULL, calls));
        printf("tiny_t%d_us %.2f\n", t, per_call_us(t, 64, tiny_unit, (void *)sink, calls / 4));
    }
    return 0;
}
