/*
 * Memory: the peak resident growth of one SDPA forward+backward pass.
 *
 *   memory THREADS N D
 *
 * Shapes: q, k, v, out, dout, dq, dk, dv [1, 1, N, D]; rows [1, 1, N] (softmax max and sum).
 * A child process allocates and touches every caller buffer, reads its peak
 * resident size (VmHWM), runs attn_sdpa_forward + attn_sdpa_backward, and
 * reads it again: the difference is what the library itself needed. One
 * N x N float32 matrix at N = 32768 would be 4 GiB; a tiled pass needs
 * O(N * D). The child is separate so that the measurement starts from a
 * fresh process and a crash or an out-of-memory kill is reported, not fatal.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attn.h"

/* A field of /proc/self/status in kB ("VmHWM", "VmRSS"), or -1. */
static long status_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL)
        return -1;
    char line[256];
    long kb = -1;
    size_t len = strlen(field);
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, field, len) == 0 && line[len] == ':') {
            kb = strtol(line + len + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kb;
}

static long maxrss_kb(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
}

static float *alloc_touched(size_t count, unsigned *seed)
{
    float *x = malloc(count * sizeof *x);
    if (x == NULL) {
        fprintf(stderr, "memory: out of memory (%zu floats)\n", count);
        exit(1);
    }
    for (size_t i = 0; i < count; i++)
        x[i] = (float)rand_r(seed) / (float)RAND_MAX - 0.5f;
    return x;
}

static int child(int threads, int64_t n, int64_t d)
{
    unsigned seed = 3;
    size_t count = (size_t)(n * d);
    float *q = alloc_touched(count, &seed), *k = alloc_touched(count, &seed);
    float *v = alloc_touched(count, &seed), *dout = alloc_touched(count, &seed);
    float *out = alloc_touched(count, &seed);
    attn_softmax_row *lse = malloc((size_t)n * sizeof *lse);
    float *dq = alloc_touched(count, &seed), *dk = alloc_touched(count, &seed);
    float *dv = alloc_touched(count, &seed);
    attn_sdpa_params p = {
        .batch = 1, .heads_q = 1, .heads_kv = 1, .n_q = n, .n_k = n,
        .d_k = d, .d_v = d, .scale = attn_default_scale(d), .causal = false,
        .mask = {.kind = ATTN_MASK_NONE}, .threads = threads,
    };

    if (lse == NULL) {
        fprintf(stderr, "memory: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < n; i++)
        lse[i] = (attn_softmax_row){0.0f, 0.0f};
    long hwm_before = status_kb("VmHWM");
    long maxrss_before = maxrss_kb();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    attn_error err;
    if (attn_sdpa_forward(&p, q, k, v, out, lse, NULL, NULL, &err) != ATTN_OK ||
        attn_sdpa_backward(&p, q, k, v, out, lse, dout, dq, dk, dv, &err) != ATTN_OK) {
        fprintf(stderr, "memory: %s\n", err.message);
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long hwm_after = status_kb("VmHWM");
    long maxrss_after = maxrss_kb();

    printf("inputs_kb %ld\n",
           (long)((8 * count * sizeof(float) + (size_t)n * sizeof(double)) / 1024));
    printf("hwm_before_kb %ld\n", hwm_before);
    printf("hwm_after_kb %ld\n", hwm_after);
    printf("maxrss_before_kb %ld\n", maxrss_before);
    printf("maxrss_after_kb %ld\n", maxrss_after);
    printf("growth_kb %ld\n", hwm_after - hwm_before);
    printf("seconds %.3f\n", (double)(t1.tv_sec - t0.tv_sec) +
                                 (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
    fflush(stdout);
    free(q), free(k), free(v), free(dout), free(out), free(lse);
    free(dq), free(dk), free(dv);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: memory THREADS N D\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    int64_t n = atoll(argv[2]), d = atoll(argv[3]);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("memory: fork");
        return 1;
    }
    if (pid == 0)
        _exit(child(threads, n, d));
    int status;
    if (waitpid(pid, &status, 0) < 0) {
        perror("memory: waitpid");
        return 1;
    }
    if (WIFSIGNALED(status)) {
        fprintf(stderr, "memory: the child died of signal %d\n", WTERMSIG(status));
        return 1;
    }
    return WEXITSTATUS(status);
}
