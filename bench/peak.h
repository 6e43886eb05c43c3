/* The cores' own limit: a loop of independent fused multiply-adds per
 * instruction set, on several threads at once. See bench/peak.c. */
#ifndef BENCH_PEAK_H
#define BENCH_PEAK_H

#include <stdbool.h>

typedef enum { PEAK_AVX2, PEAK_AVX512, N_PEAK } peak_isa;

const char *peak_isa_name(peak_isa isa);  /* "avx2", "avx512" */
bool peak_isa_supported(peak_isa isa);    /* this CPU can run the loop */

/* FLOPs of one call of peak_run_s with these arguments. */
double peak_flops(peak_isa isa, int threads, long iters);

/* Runs `iters` iterations of the loop on each of `threads` threads, all
 * started together; returns the wall-clock seconds until the last ends, or
 * a negative number when a thread could not be started. */
double peak_run_s(peak_isa isa, int threads, long iters);

#endif
