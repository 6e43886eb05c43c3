/*
 * Kernel speed: libattn's SDPA against the machine's own matrix-multiply rate.
 *
 *   kernel info                      CPU model, cores, OpenBLAS corename/config
 *   kernel sgemm THREADS SIZE        square sgemm C = A B, SIZE^3, alone
 *   kernel attn THREADS H N D [SIZE] forward, causal forward, forward+backward
 *                                    taking turns; with SIZE, a square sgemm
 *                                    of SIZE^3 takes its turn too
 *
 * Output is one "key value" pair a line, for bench/run.sh to put in its table.
 *
 * libattn keeps OpenBLAS at one thread and runs `threads` threads of its own;
 * sgemm gets the same cores as OpenBLAS threads. When the two take turns in
 * one process, OpenBLAS is set to THREADS threads for each sgemm and back to
 * one after it, and the attention run waits until OpenBLAS's workers have
 * stopped spinning. Taking turns means that whatever else runs on the
 * (shared) machine disturbs both measurements alike, so their ratio holds.
 *
 * Every figure is the best of several repetitions after a warm-up run: the
 * machine is shared and noisy, and the best run is the one least disturbed.
 * Shapes (attn): q, k, v, out, dout, dq, dk, dv [1, H, N, D]; lse [1, H, N]
 * (double).
 */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "attn.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Normal-ish values (sum of uniforms): what activations look like. */
static void fill_random(float *x, size_t count, unsigned *seed)
{
    for (size_t i = 0; i < count; i++) {
        float s = 0.0f;
        for (int j = 0; j < 4; j++)
            s += (float)rand_r(seed) / (float)RAND_MAX - 0.5f;
        x[i] = s * 1.7f;
    }
}

static float *alloc_random(size_t count, unsigned *seed)
{
    float *x = malloc(count * sizeof *x);
    if (x == NULL) {
        fprintf(stderr, "kernel: out of memory (%zu floats)\n", count);
        exit(1);
    }
    fill_random(x, count, seed);
    return x;
}

/* How many timed repetitions fit in about `budget_s`, given one took `once_s`. */
static int reps_for(double once_s, double budget_s, int lo, int hi)
{
    int reps = once_s > 0 ? (int)(budget_s / once_s) : hi;
    return reps < lo ? lo : reps > hi ? hi : reps;
}

static int cmd_info(void)
{
    char model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f != NULL) {
        char line[512];
        while (fgets(line, sizeof line, f) != NULL) {
            if (strncmp(line, "model name", 10) == 0) {
                char *colon = strchr(line, ':');
                if (colon != NULL) {
                    snprintf(model, sizeof model, "%s", colon + 2);
                    model[strcspn(model, "\n")] = '\0';
                }
                break;
            }
        }
        fclose(f);
    }
    printf("cpu %s\n", model);
    printf("cores %ld\n", sysconf(_SC_NPROCESSORS_ONLN));
    printf("blas_corename %s\n", openblas_get_corename());
    printf("blas_config %s\n", openblas_get_config());
    printf("attn_version %s\n", attn_version());
    return 0;
}

/* Square sgemm operands: a, b, c [size, size]. */
typedef struct {
    int size;
    float *a, *b, *c;
} gemm_case;

static void gemm_alloc(gemm_case *g, int size)
{
    unsigned seed = 1;
    size_t count = (size_t)size * (size_t)size;
    g->size = size;
    g->a = alloc_random(count, &seed);
    g->b = alloc_random(count, &seed);
    g->c = alloc_random(count, &seed);
}

static void gemm_free(gemm_case *g)
{
    free(g->a), free(g->b), free(g->c);
}

static double gemm_flops(const gemm_case *g)
{
    return 2.0 * g->size * (double)g->size * g->size;
}

/* One sgemm on `threads` OpenBLAS threads, then OpenBLAS back at one thread
 * as libattn wants it. Returns the seconds the sgemm took. */
static double gemm_run(const gemm_case *g, int threads)
{
    int n = g->size;
    openblas_set_num_threads(threads);
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f,
                g->a, n, g->b, n, 0.0f, g->c, n);
    double t = now_s() - t0;
    openblas_set_num_threads(1);
    return t;
}

static void print_gemm(const gemm_case *g, int threads, double best)
{
    printf("sgemm_threads %d\n", threads);
    printf("sgemm_size %d\n", g->size);
    printf("sgemm_gflop %.3f\n", gemm_flops(g) * 1e-9);
    printf("sgemm_s %.6f\n", best);
    printf("sgemm_gflops %.2f\n", gemm_flops(g) / best * 1e-9);
}

static int cmd_sgemm(int threads, int size)
{
    gemm_case g;
    gemm_alloc(&g, size);
    double once = gemm_run(&g, threads);
    int reps = reps_for(once, 3.0, 3, 50);
    double best = INFINITY;
    for (int r = 0; r < reps; r++)
        best = fmin(best, gemm_run(&g, threads));
    print_gemm(&g, threads, best);
    gemm_free(&g);
    return 0;
}

typedef struct {
    attn_sdpa_params p;
    const float *q, *k, *v, *dout;
    float *out, *dq, *dk, *dv;
    double *lse;
} attn_case;

static int run_forward(attn_case *c, bool causal)
{
    attn_error err;
    c->p.causal = causal;
    if (attn_sdpa_forward(&c->p, c->q, c->k, c->v, c->out, NULL, NULL, NULL,
                          &err) != ATTN_OK) {
        fprintf(stderr, "kernel: attn_sdpa_forward: %s\n", err.message);
        return -1;
    }
    return 0;
}

static int run_forward_backward(attn_case *c)
{
    attn_error err;
    c->p.causal = false;
    if (attn_sdpa_forward(&c->p, c->q, c->k, c->v, c->out, c->lse, NULL, NULL,
                          &err) != ATTN_OK ||
        attn_sdpa_backward(&c->p, c->q, c->k, c->v, c->out, c->lse, c->dout,
                           c->dq, c->dk, c->dv, &err) != ATTN_OK) {
        fprintf(stderr, "kernel: forward+backward: %s\n", err.message);
        return -1;
    }
    return 0;
}

enum { FULL, CAUSAL, FWD_BWD, N_MODES };

static int run_mode(attn_case *c, int mode)
{
    return mode == FWD_BWD ? run_forward_backward(c) : run_forward(c, mode == CAUSAL);
}

/* OpenBLAS's idle workers spin for a while (about 2^28 cycles) before they
 * sleep; an attention run started sooner would share its cores with them. */
static void let_blas_settle(void)
{
    struct timespec pause = {.tv_sec = 0, .tv_nsec = 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
}

enum { GEMM = N_MODES }; /* best[GEMM]: the sgemm runs, when g != NULL */

/* Rounds of one run of each mode (and one sgemm first, when g is given), the
 * best time of each over the rounds: at least three rounds after a warm-up
 * round, more while they fit `budget_s`. Interleaving the modes makes their
 * ratios hold even when other work on the machine comes and goes. */
static int measure(attn_case *c, const gemm_case *g, int threads,
                   double budget_s, double best[N_MODES + 1])
{
    int rounds = 0;
    for (int r = -1; r < rounds; r++) {
        double t_round = now_s();
        double t[N_MODES + 1];
        if (g != NULL) {
            t[GEMM] = gemm_run(g, threads);
            let_blas_settle();
        }
        for (int mode = 0; mode < N_MODES; mode++) {
            double t0 = now_s();
            if (run_mode(c, mode) != 0)
                return -1;
            t[mode] = now_s() - t0;
        }
        if (r < 0) { /* the warm-up round: sets the number of rounds */
            rounds = reps_for(now_s() - t_round, budget_s, 3, 200);
            for (int i = 0; i <= N_MODES; i++)
                best[i] = INFINITY;
            continue;
        }
        for (int i = 0; i <= N_MODES; i++)
            if (i < N_MODES || g != NULL)
                best[i] = fmin(best[i], t[i]);
    }
    return 0;
}

static int cmd_attn(int threads, int64_t heads, int64_t n, int64_t d,
                    int gemm_size)
{
    unsigned seed = 7;
    size_t count = (size_t)(heads * n * d);
    attn_case c = {
        .p = {.batch = 1, .heads_q = heads, .heads_kv = heads, .n_q = n,
              .n_k = n, .d_k = d, .d_v = d, .scale = attn_default_scale(d),
              .causal = false, .mask = {.kind = ATTN_MASK_NONE},
              .threads = threads},
    };
    float *q = alloc_random(count, &seed), *k = alloc_random(count, &seed);
    float *v = alloc_random(count, &seed), *dout = alloc_random(count, &seed);
    c.q = q, c.k = k, c.v = v, c.dout = dout;
    c.out = alloc_random(count, &seed);
    c.lse = calloc((size_t)(heads * n), sizeof *c.lse);
    c.dq = alloc_random(count, &seed);
    c.dk = alloc_random(count, &seed);
    c.dv = alloc_random(count, &seed);

    /* Nominal work, as the issue counts it: 4 * B * H * n_q * n_k * d. */
    double flops = 4.0 * (double)heads * (double)n * (double)n * (double)d;
    double best[N_MODES + 1];
    gemm_case g = {0};
    if (gemm_size > 0)
        gemm_alloc(&g, gemm_size);
    int rc = measure(&c, gemm_size > 0 ? &g : NULL, threads, 6.0, best) == 0 ? 0 : 1;
    double full = best[FULL], causal = best[CAUSAL], fwd_bwd = best[FWD_BWD];
    if (rc == 0) {
        printf("n %lld\n", (long long)n);
        printf("gflop %.4f\n", flops * 1e-9);
        printf("full_s %.6f\n", full);
        printf("causal_s %.6f\n", causal);
        printf("fwdbwd_s %.6f\n", fwd_bwd);
        printf("gflops %.2f\n", flops / full * 1e-9);
        if (gemm_size > 0)
            print_gemm(&g, threads, best[GEMM]);
    }
    if (gemm_size > 0)
        gemm_free(&g);
    free(q), free(k), free(v), free(dout);
    free(c.out), free(c.lse), free(c.dq), free(c.dk), free(c.dv);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "info") == 0)
        return cmd_info();
    if (argc == 4 && strcmp(argv[1], "sgemm") == 0)
        return cmd_sgemm(atoi(argv[2]), atoi(argv[3]));
    if ((argc == 6 || argc == 7) && strcmp(argv[1], "attn") == 0)
        return cmd_attn(atoi(argv[2]), atoll(argv[3]), atoll(argv[4]),
                        atoll(argv[5]), argc == 7 ? atoi(argv[6]) : 0);
    fprintf(stderr, "usage: kernel info | sgemm THREADS SIZE | attn THREADS H N D [SGEMM_SIZE]\n");
    return 2;
}
