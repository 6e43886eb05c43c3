/*
 * Kernel speed: libattn's attention against the machine's limit, every
 * figure measured in one run, in turns.
 *
 *   kernel info                  CPU model, cores, OpenBLAS corename/config
 *   kernel table THREADS [SECS]  every measurement below, about SECS seconds
 *                                of rounds (default 40) after a warm-up
 *   kernel child                 (started by `table`) runs the tasks it is
 *                                sent on stdin, one a line
 *
 * The machine's limit is measured two ways: OpenBLAS's square sgemm under
 * each OpenBLAS kernel this CPU can run, and a loop of nothing but fused
 * multiply-adds (bench/peak.c). OpenBLAS picks its kernel once, at load
 * time, from OPENBLAS_CORETYPE or the CPU model, so each kernel lives in a
 * child process of its own: OPENBLAS_CORETYPE unset, SkylakeX and
 * Cooperlake (AVX-512, the latter with BF16), Haswell (AVX2+FMA) and
 * Prescott (SSE3). This process never sets it: its own figures are those
 * of the environment it was given. A child that crashes (OpenBLAS's AVX-512
 * kernels have on some CPUs) is reported and not counted. Children whose
 * OpenBLAS reports the same core as an earlier one measure no sgemm of
 * their own (unset is often one of the others).
 *
 * libattn's kernels are chosen once per process too (ATTN_KERNEL), so each
 * kernel the CPU has runs the n=4096 forward in a child of its own.
 *
 * Taking turns: every round runs each measurement once, here or in its
 * child, one after the other, and each figure is the best of the rounds.
 * Whatever else runs on the (shared) machine then disturbs the things
 * compared alike, and their ratios hold. A child replies only once its
 * OpenBLAS workers have stopped spinning, so they take no core from the
 * measurement after them. A turn repeats a short task until it takes about
 * a quarter of a second and counts the mean.
 *
 * Output is one "key value" pair a line, for bench/run.sh's table.
 *
 * Shapes: sdpa q, k, v, out, dout, dq, dk, dv [B, H, N, D], rows [B, H, N] (softmax max and sum);
 * mha x [B, N, Dm], w_q, w_k, w_v, w_o [Dm, Dm], out, dout [B, N, Dm].
 */
#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attn.h"
#include "peak.h"

extern char **environ;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes);
    if (p == NULL) {
        fprintf(stderr, "kernel: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* Normal-ish values (sum of uniforms): what activations look like. On a
 * cache line's boundary, as attnd's tensors and PyTorch's are (malloc's
 * large blocks start 16 bytes into a line, and every row would straddle
 * one line more than it fills). */
static float *alloc_random(size_t count, unsigned *seed, float scale)
{
    float *x = aligned_alloc(64, (count * sizeof *x + 63) / 64 * 64);
    if (x == NULL) {
        fprintf(stderr, "kernel: out of memory (%zu floats)\n", count);
        exit(1);
    }
    for (size_t i = 0; i < count; i++) {
        float s = 0.0f;
        for (int j = 0; j < 4; j++)
            s += (float)rand_r(seed) / (float)RAND_MAX - 0.5f;
        x[i] = s * 1.7f * scale;
    }
    return x;
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
    printf("attn_kernel %s\n", attn_kernel_name());
    printf("attn_bf16 %s\n", attn_bf16_name());
    return 0;
}

/* ================================================================ tasks */

/*
 * A task is one line of text, the same whether it runs here or in a child:
 *   sgemm THREADS SIZE                 C = A B, all [SIZE, SIZE], on THREADS
 *                                      OpenBLAS threads
 *   sdpa full|causal|fwdbwd THREADS B H N D [bf16]   (bf16: in bfloat16 precision)
 *   ragged full|fwdbwd THREADS H D BATCH   a ragged batch of sequences packed
 *                                      along the rows, q, k, v [H, n, D]
 *   padded full|fwdbwd THREADS H D BATCH   the same batch padded to its longest
 *                                      sequence, [B, H, longest, D], with a
 *                                      key-padding mask [B, 1, 1, longest]
 *                                      (what a client without seq_lens sends)
 *   mha fwd|fwdbwd THREADS B N DMODEL HEADS   causal, with W_O, no biases
 *   peak avx2|avx512 THREADS ITERS     bench/peak.c
 *   stream THREADS H D BATCH           one pass over a ragged batch's tensors,
 *                                      out = q + k v element by element on
 *                                      THREADS threads: the memory traffic of
 *                                      its forward (q, k, v read, the output
 *                                      written) and nothing else
 * BATCH is log48 (48 sequences of lengths log-uniform over 16 .. 2048, about
 * 20k rows), short2000 (2000 of 1 .. 16) or mixed501 (one of 4096, first,
 * then 500 of 1 .. 32: nearly all the work in one sequence, which only
 * units cut by work share between the threads), from a fixed seed; short20
 * and short200 are short2000's first 20 and 200 sequences (their tensors
 * in the caches: the items' arithmetic without the memory's share).
 * Its buffers are made on first use and kept for the next turns.
 */
typedef enum { T_SGEMM, T_SDPA, T_RAGGED, T_PADDED, T_MHA, T_PEAK, T_STREAM } task_kind;
enum { SDPA_FULL, SDPA_CAUSAL, SDPA_FWDBWD };
enum { MHA_FWD, MHA_FWDBWD };

typedef struct {
    char text[96];
    task_kind kind;
    int mode, threads;
    bool bf16; /* sdpa in ATTN_PRECISION_BFLOAT16 */
    long long a[4]; /* sgemm: size; sdpa: B H N D; mha: B N DMODEL HEADS; peak: iters;
                     * ragged, padded: B H N D of the tensors sent */
    int64_t *cu;    /* ragged, padded: the batch's offsets [seqs + 1] */
    int64_t seqs;
    uint8_t *keep;  /* padded: the key-padding mask [B, 1, 1, N] */
    double pairs;   /* ragged, padded: sum of the sequences' lengths squared */
    /* Buffers, made on first use. */
    bool ready;
    float *f[12];
    attn_softmax_row *lse; /* the forward's softmax rows, for the backward */
    attn_sdpa_params sdpa;
    attn_mha_params mha;
} task;

/* The lengths of a BATCH (see the tasks above) into len [2000]; returns
 * how many, or 0 for an unknown name. The same numbers in every process
 * (a fixed seed, no libc random). */
static int64_t batch_lengths(const char *name, int64_t *len)
{
    const bool mixed = strcmp(name, "mixed501") == 0;
    int64_t n = strcmp(name, "log48") == 0       ? 48
                : strcmp(name, "short2000") == 0 ? 2000
                : strcmp(name, "short200") == 0  ? 200
                : strcmp(name, "short20") == 0   ? 20
                : mixed                          ? 501
                                                 : 0;
    /* (the seed gives log48 19963 rows, the longest 2023) */
    uint64_t x = n == 48 ? 22 : 7;
    for (int64_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(x >> 11) * 0x1.0p-53;
        len[i] = n == 48 ? (int64_t)lround(16.0 * pow(128.0, u))
                 : mixed ? (i == 0 ? 4096 : 1 + (int64_t)(u * 32.0))
                         : 1 + (int64_t)(u * 16.0);
    }
    return n;
}

/* A ragged or padded task's batch: offsets, the shapes of its tensors. */
static bool batch_setup(task *t, const char *name)
{
    static int64_t len[2000];
    t->seqs = batch_lengths(name, len);
    if (t->seqs == 0)
        return false;
    t->cu = xmalloc((size_t)(t->seqs + 1) * sizeof *t->cu);
    t->cu[0] = 0;
    int64_t longest = 0;
    for (int64_t i = 0; i < t->seqs; i++) {
        t->cu[i + 1] = t->cu[i] + len[i];
        longest = len[i] > longest ? len[i] : longest;
        t->pairs += (double)len[i] * (double)len[i];
    }
    long long h = t->a[0], d = t->a[1];
    if (t->kind == T_RAGGED || t->kind == T_STREAM) {
        t->a[0] = 1, t->a[1] = h, t->a[2] = t->cu[t->seqs], t->a[3] = d;
    } else {
        t->a[0] = t->seqs, t->a[1] = h, t->a[2] = longest, t->a[3] = d;
        t->keep = xmalloc((size_t)(t->seqs * longest));
        for (int64_t b = 0; b < t->seqs; b++)
            for (int64_t j = 0; j < longest; j++)
                t->keep[b * longest + j] = j < len[b];
    }
    return true;
}

/* The libattn parameters of an sdpa or mha task. */
static void task_params(task *t)
{
    const long long *a = t->a;
    if (t->kind == T_SDPA || t->kind == T_RAGGED || t->kind == T_PADDED)
        t->sdpa = (attn_sdpa_params){
            .batch = a[0], .heads_q = a[1], .heads_kv = a[1], .n_q = a[2], .n_k = a[2],
            .d_k = a[3], .d_v = a[3], .scale = attn_default_scale(a[3]),
            .causal = t->mode == SDPA_CAUSAL, .mask = {.kind = ATTN_MASK_NONE},
            .threads = t->threads,
            .precision = t->bf16 ? ATTN_PRECISION_BFLOAT16 : ATTN_PRECISION_FLOAT32,
        };
    if (t->kind == T_RAGGED)
        t->sdpa.ragged = (attn_ragged){.seqs = t->seqs, .cu_seqlens_q = t->cu};
    if (t->kind == T_PADDED) {
        const int64_t shape[4] = {a[0], 1, 1, a[2]};
        t->sdpa.mask = (attn_mask){.kind = ATTN_MASK_BOOL, .allowed = t->keep};
        attn_mask_broadcast(&t->sdpa.mask, 4, shape, a[0], a[1], a[2], a[2], NULL);
    }
    if (t->kind == T_MHA)
        t->mha = (attn_mha_params){
            .batch = a[0], .n = a[1], .m = a[1], .d_model = a[2], .d_ctx = a[2],
            .heads = a[3], .kv_heads = a[3], .d_k = a[2] / a[3], .d_v = a[2] / a[3],
            .d_out = a[2], .scale = attn_default_scale(a[2] / a[3]), .causal = true,
            .mask = {.kind = ATTN_MASK_NONE}, .threads = t->threads,
        };
}

static bool parse_task(const char *text, task *t)
{
    char kind[16], mode[16], batch[16], precision[16];
    memset(t, 0, sizeof *t);
    snprintf(t->text, sizeof t->text, "%s", text);
    long long *a = t->a;
    if (sscanf(text, "sgemm %d %lld", &t->threads, &a[0]) == 2) {
        t->kind = T_SGEMM;
    } else if (sscanf(text, "%15s %15s %d %lld %lld %lld %lld", kind, mode, &t->threads,
                      &a[0], &a[1], &a[2], &a[3]) == 7 && strcmp(kind, "sdpa") == 0) {
        t->kind = T_SDPA;
        int fields = sscanf(text, "%*s %*s %*d %*d %*d %*d %*d %15s", precision);
        if (fields == 1 && strcmp(precision, "bf16") != 0)
            return false;
        t->bf16 = fields == 1;
        if (strcmp(mode, "full") == 0) t->mode = SDPA_FULL;
        else if (strcmp(mode, "causal") == 0) t->mode = SDPA_CAUSAL;
        else if (strcmp(mode, "fwdbwd") == 0) t->mode = SDPA_FWDBWD;
        else return false;
    } else if (sscanf(text, "%15s %15s %d %lld %lld %15s", kind, mode, &t->threads, &a[0], &a[1],
                      batch) == 6 &&
               (strcmp(kind, "ragged") == 0 || strcmp(kind, "padded") == 0)) {
        t->kind = kind[0] == 'r' ? T_RAGGED : T_PADDED;
        if (strcmp(mode, "full") == 0) t->mode = SDPA_FULL;
        else if (strcmp(mode, "fwdbwd") == 0) t->mode = SDPA_FWDBWD;
        else return false;
        if (a[0] < 1 || a[1] < 1 || !batch_setup(t, batch)) return false;
    } else if (sscanf(text, "stream %d %lld %lld %15s", &t->threads, &a[0], &a[1], batch) == 4) {
        t->kind = T_STREAM;
        if (a[0] < 1 || a[1] < 1 || !batch_setup(t, batch)) return false;
    } else if (sscanf(text, "%15s %15s %d %lld %lld %lld %lld", kind, mode, &t->threads,
                      &a[0], &a[1], &a[2], &a[3]) == 7 && strcmp(kind, "mha") == 0) {
        t->kind = T_MHA;
        if (strcmp(mode, "fwd") == 0) t->mode = MHA_FWD;
        else if (strcmp(mode, "fwdbwd") == 0) t->mode = MHA_FWDBWD;
        else return false;
        if (a[3] < 1 || a[2] % a[3] != 0) return false;
    } else if (sscanf(text, "peak %15s %d %lld", mode, &t->threads, &a[0]) == 3) {
        t->kind = T_PEAK;
        if (strcmp(mode, "avx512") == 0) t->mode = PEAK_AVX512;
        else if (strcmp(mode, "avx2") == 0) t->mode = PEAK_AVX2;
        else return false;
    } else {
        return false;
    }
    for (int i = 0; i < 4; i++)
        if (a[i] < 0) return false;
    if (t->threads < 1 || a[0] < 1)
        return false;
    task_params(t);
    return true;
}

/* Nominal FLOPs of one run: sgemm 2 s^3; the SDPA forward 4 B H N^2 D, the
 * two products of the full matrix in either precision (no discount for the
 * causal mask, so that causal and full compare as times; the backward not
 * counted); a ragged batch's, padded or not, 4 H D sum(len^2): the pairs
 * that exist, so that the padded batch's rate is its useful one; multi-head attention's forward as attn_mha_flops counts it. */
static double task_flops(const task *t)
{
    const long long *a = t->a;
    switch (t->kind) {
    case T_SGEMM:
        return 2.0 * (double)a[0] * (double)a[0] * (double)a[0];
    case T_SDPA:
        return 4.0 * (double)a[0] * (double)a[1] * (double)a[2] * (double)a[2] * (double)a[3];
    case T_RAGGED:
    case T_PADDED:
        return 4.0 * (double)a[1] * t->pairs * (double)a[3];
    case T_MHA:
        return attn_mha_flops(&t->mha);
    case T_PEAK:
        return peak_flops((peak_isa)t->mode, t->threads, (long)a[0]);
    case T_STREAM:
        return 0; /* a time, compared with the batch's forward */
    }
    return 0;
}

static void task_prepare(task *t)
{
    unsigned seed = 7;
    const long long *a = t->a;
    if (t->kind == T_SGEMM) {
        size_t count = (size_t)(a[0] * a[0]);
        for (int i = 0; i < 3; i++)
            t->f[i] = alloc_random(count, &seed, 1.0f);
    } else if (t->kind == T_SDPA || t->kind == T_RAGGED || t->kind == T_PADDED ||
               t->kind == T_STREAM) {
        size_t count = (size_t)(a[0] * a[1] * a[2] * a[3]);
        for (int i = 0; i < 8; i++) /* q k v dout out dq dk dv */
            t->f[i] = alloc_random(count, &seed, 1.0f);
        t->lse = xmalloc((size_t)(a[0] * a[1] * a[2]) * sizeof *t->lse);
    } else if (t->kind == T_MHA) {
        int64_t b = a[0], n = a[1], dm = a[2];
        size_t acts = (size_t)(b * n * dm), weights = (size_t)(dm * dm);
        /* Weights ~ 1/sqrt(d_model), as an initialised layer has them. */
        float w_scale = 1.0f / sqrtf((float)dm);
        t->f[0] = alloc_random(acts, &seed, 1.0f);    /* x */
        t->f[1] = alloc_random(acts, &seed, 1.0f);    /* dout */
        t->f[2] = alloc_random(acts, &seed, 1.0f);    /* out */
        t->f[3] = alloc_random(acts, &seed, 1.0f);    /* dx */
        for (int i = 0; i < 4; i++) {                 /* w_q w_k w_v w_o */
            t->f[4 + i] = alloc_random(weights, &seed, w_scale);
            t->f[8 + i] = alloc_random(weights, &seed, 1.0f); /* their gradients */
        }
    }
    t->ready = true;
}

/* A stream task's share: elements [lo, hi) of out = q + k v. */
typedef struct {
    const float *q, *k, *v;
    float *out;
    size_t lo, hi;
} stream_part;

static void *stream_run(void *arg)
{
    const stream_part *s = arg;
    for (size_t i = s->lo; i < s->hi; i++)
        s->out[i] = s->q[i] + s->k[i] * s->v[i];
    return NULL;
}

/* out = q + k v over the task's tensors, in THREADS contiguous shares. */
static bool stream_once(task *t)
{
    enum { MOST = 16 };
    const size_t count = (size_t)(t->a[0] * t->a[1] * t->a[2] * t->a[3]);
    const int n = t->threads < MOST ? t->threads : MOST;
    pthread_t th[MOST];
    stream_part part[MOST];
    int started = 0;
    for (int i = 0; i < n; i++) {
        part[i] = (stream_part){t->f[0], t->f[1], t->f[2], t->f[4], count * (size_t)i / (size_t)n,
                                count * (size_t)(i + 1) / (size_t)n};
        if (i > 0 && pthread_create(&th[i], NULL, stream_run, &part[i]) == 0)
            started |= 1 << i;
        else if (i > 0)
            stream_run(&part[i]);
    }
    stream_run(&part[0]);
    for (int i = 1; i < n; i++)
        if (started & (1 << i))
            pthread_join(th[i], NULL);
    return true;
}

/* One run of the task; false (with a message on stderr) when libattn fails. */
static bool task_run_once(task *t)
{
    attn_error err = {0};
    float **f = t->f;
    switch (t->kind) {
    case T_SGEMM: {
        int n = (int)t->a[0];
        openblas_set_num_threads(t->threads);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, f[0], n,
                    f[1], n, 0.0f, f[2], n);
        return true;
    }
    case T_SDPA:
    case T_RAGGED:
    case T_PADDED:
        if (attn_sdpa_forward(&t->sdpa, f[0], f[1], f[2], f[4],
                              t->mode == SDPA_FWDBWD ? t->lse : NULL, NULL, NULL,
                              &err) != ATTN_OK)
            break;
        if (t->mode == SDPA_FWDBWD &&
            attn_sdpa_backward(&t->sdpa, f[0], f[1], f[2], f[4], t->lse, f[3], f[5], f[6],
                               f[7], &err) != ATTN_OK)
            break;
        return true;
    case T_MHA: {
        attn_mha_inputs in = {.x = f[0], .w_q = f[4], .w_k = f[5], .w_v = f[6], .w_o = f[7]};
        attn_mha_grads g = {.x = f[3], .w_q = f[8], .w_k = f[9], .w_v = f[10], .w_o = f[11]};
        /* Forward and backward as a training step (and the API) runs them:
         * one call, nothing computed twice. */
        attn_status st = t->mode == MHA_FWDBWD
                             ? attn_mha_forward_backward(&t->mha, &in, f[2], NULL, NULL, NULL, f[1],
                                                         &g, &err)
                             : attn_mha_forward(&t->mha, &in, f[2], NULL, NULL, NULL, &err);
        if (st != ATTN_OK)
            break;
        return true;
    }
    case T_STREAM:
        return stream_once(t);
    case T_PEAK:
        if (peak_run_s((peak_isa)t->mode, t->threads, (long)t->a[0]) < 0) {
            snprintf(err.message, sizeof err.message, "could not start %d threads", t->threads);
            break;
        }
        return true;
    }
    fprintf(stderr, "kernel: %s: %s\n", t->text, err.message);
    return false;
}

/* `reps` runs; the mean seconds of one, or -1 on failure. After threaded
 * sgemm, waits until OpenBLAS's idle workers have stopped spinning (about
 * 2^28 cycles) so that they take no core from whatever is measured next. */
static double task_run(task *t, int reps)
{
    if (!t->ready)
        task_prepare(t);
    double t0 = now_s();
    for (int r = 0; r < reps; r++)
        if (!task_run_once(t))
            return -1;
    double s = (now_s() - t0) / reps;
    if (t->kind == T_SGEMM) {
        openblas_set_num_threads(1);
        if (t->threads > 1)
            sleep_s(0.3);
    }
    return s;
}

/* This process's tasks, by their text. */
static task *tasks[64];
static int n_tasks;

static task *task_get(const char *text)
{
    for (int i = 0; i < n_tasks; i++)
        if (strcmp(tasks[i]->text, text) == 0)
            return tasks[i];
    task *t = xmalloc(sizeof *t);
    if (n_tasks == (int)(sizeof tasks / sizeof tasks[0]) || !parse_task(text, t)) {
        free(t);
        return NULL;
    }
    return tasks[n_tasks++] = t;
}

/* ================================================================ child */

/*
 * A child says "ready COREName KERNEL BF16" once, then answers each line
 * "REPS TASK" with "ok SECONDS" (the mean of one run) or "error".
 */
static int cmd_child(void)
{
    char line[256];
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready %s %s %s\n", openblas_get_corename(), attn_kernel_name(), attn_bf16_name());
    while (fgets(line, sizeof line, stdin) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        int reps = 0, used = 0;
        task *t = NULL;
        if (sscanf(line, "%d %n", &reps, &used) == 1 && reps >= 1)
            t = task_get(line + used);
        double s = t != NULL ? task_run(t, reps) : -1;
        if (s >= 0)
            printf("ok %.9f\n", s);
        else
            printf("error\n");
    }
    return 0;
}

/* ================================================================ table */

typedef struct {
    const char *label;     /* in the output keys */
    const char *var;       /* the environment variable it changes */
    const char *value;     /* its value; NULL: unset */
    bool blas;             /* one of the OpenBLAS kernels (measures sgemm) */
    pid_t pid;
    int to, from;          /* its stdin, its stdout */
    char buf[512];
    size_t len;
    bool alive;
    char core[64], kernel[32], bf16[32];
    char death[160];       /* why it is not counted */
} child;

/* Environment for a child: ours with `var` set to `value` (or removed).
 * *owned is the one string it allocated (or NULL). */
static char **child_env(const char *var, const char *value, char **owned)
{
    size_t n = 0;
    while (environ[n] != NULL)
        n++;
    char **env = xmalloc((n + 2) * sizeof *env);
    size_t k = 0, len = strlen(var);
    for (size_t i = 0; i < n; i++)
        if (!(strncmp(environ[i], var, len) == 0 && environ[i][len] == '='))
            env[k++] = environ[i];
    *owned = NULL;
    if (value != NULL) {
        size_t cap = len + strlen(value) + 2;
        *owned = env[k++] = xmalloc(cap);
        snprintf(*owned, cap, "%s=%s", var, value);
    }
    env[k] = NULL;
    return env;
}

static void child_dead(child *c, const char *why)
{
    if (!c->alive)
        return;
    c->alive = false;
    close(c->to);
    close(c->from);
    int st = 0;
    kill(c->pid, SIGKILL); /* a no-op when it has exited already */
    waitpid(c->pid, &st, 0);
    if (WIFSIGNALED(st) && WTERMSIG(st) != SIGKILL)
        snprintf(c->death, sizeof c->death, "crashed (%s)", strsignal(WTERMSIG(st)));
    else if (WIFEXITED(st) && WEXITSTATUS(st) != 0)
        snprintf(c->death, sizeof c->death, "exited with status %d", WEXITSTATUS(st));
    else
        snprintf(c->death, sizeof c->death, "%s", why);
    fprintf(stderr, "kernel: child %s=%s: %s\n", c->var, c->value ? c->value : "(unset)",
            c->death);
}

/* A line from the child into `out`, waiting at most `timeout_s`. */
static bool child_read(child *c, char *out, size_t cap, double timeout_s)
{
    double end = now_s() + timeout_s;
    for (;;) {
        char *nl = memchr(c->buf, '\n', c->len);
        if (nl != NULL) {
            size_t n = (size_t)(nl - c->buf);
            snprintf(out, cap, "%.*s", (int)n, c->buf);
            memmove(c->buf, nl + 1, c->len - n - 1);
            c->len -= n + 1;
            return true;
        }
        double left = end - now_s();
        struct pollfd p = {.fd = c->from, .events = POLLIN};
        int r = left > 0 ? poll(&p, 1, (int)(left * 1000) + 1) : 0;
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            child_dead(c, "did not answer in time");
            return false;
        }
        ssize_t got = read(c->from, c->buf + c->len, sizeof c->buf - 1 - c->len);
        if (got <= 0 || c->len + (size_t)got >= sizeof c->buf - 1) {
            child_dead(c, "closed its output");
            return false;
        }
        c->len += (size_t)got;
    }
}

static void child_start(child *c, const char *self)
{
    int in[2], out[2];
    c->alive = false;
    /* Close-on-exec: a later child must not hold this one's stdin open. */
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
        snprintf(c->death, sizeof c->death, "could not make pipes");
        return;
    }
    /* Everything the child needs is made before fork: this process has
     * OpenBLAS's threads, so between fork and exec only exec is safe. */
    char *owned;
    char **env = child_env(c->var, c->value, &owned);
    char *argv[] = {(char *)"kernel", (char *)"child", NULL};
    pid_t pid = fork();
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        execve(self, argv, env);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    free(owned);
    free(env);
    if (pid < 0) {
        close(in[1]), close(out[0]);
        snprintf(c->death, sizeof c->death, "could not fork");
        return;
    }
    c->pid = pid, c->to = in[1], c->from = out[0], c->alive = true, c->len = 0;
    char line[256];
    if (!child_read(c, line, sizeof line, 60))
        return;
    if (sscanf(line, "ready %63s %31s %31s", c->core, c->kernel, c->bf16) != 3)
        child_dead(c, "said something else than ready");
}

/* One turn in the child: the mean seconds of one run, or -1. */
static double child_run(child *c, const char *task_text, int reps)
{
    if (!c->alive)
        return -1;
    char line[256];
    int n = snprintf(line, sizeof line, "%d %s\n", reps, task_text);
    if (write(c->to, line, (size_t)n) != n) {
        child_dead(c, "could not be written to");
        return -1;
    }
    /* Generous: a Prescott forward at n=4096 takes a second or so. */
    if (!child_read(c, line, sizeof line, 900))
        return -1;
    double s;
    if (sscanf(line, "ok %lf", &s) == 1)
        return s;
    return -1;
}

/* One measurement: a task, here (who == NULL) or in a child, in every round. */
typedef struct {
    char key[48];
    child *who;
    char text[96];
    double flops;
    int reps;
    double best; /* seconds of one run, best of the rounds; INFINITY if none */
    double round_s[30]; /* each round's seconds (-1: failed) */
} turn;

static double turn_run(turn *u, int reps)
{
    if (u->who != NULL)
        return child_run(u->who, u->text, reps);
    task *t = task_get(u->text);
    return t != NULL ? task_run(t, reps) : -1;
}

/* The table's turns: every one, or (only_ragged) the ragged batches' and
 * the dense turns they are compared with, with no child process. */
static int cmd_table(int threads, double budget_s, bool only_ragged)
{
    signal(SIGPIPE, SIG_IGN);
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        fprintf(stderr, "kernel: cannot find my own executable\n");
        return 1;
    }
    self[sl] = '\0';

    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");

    /* The OpenBLAS kernels this CPU can run, the environment's default
     * first; Prescott last, so that when unset picks it, unset measures it. */
    child kids[12];
    int n_kids = 0;
    const bool all = !only_ragged;
    kids[n_kids++] = (child){.label = "unset", .var = "OPENBLAS_CORETYPE", .blas = true};
    if (avx512)
        kids[n_kids++] = (child){.label = "SkylakeX", .var = "OPENBLAS_CORETYPE",
                                 .value = "SkylakeX", .blas = true};
    if (bf16)
        kids[n_kids++] = (child){.label = "Cooperlake", .var = "OPENBLAS_CORETYPE",
                                 .value = "Cooperlake", .blas = true};
    if (avx2)
        kids[n_kids++] = (child){.label = "Haswell", .var = "OPENBLAS_CORETYPE",
                                 .value = "Haswell", .blas = true};
    int prescott = n_kids;
    kids[n_kids++] = (child){.label = "Prescott", .var = "OPENBLAS_CORETYPE",
                             .value = "Prescott", .blas = true};
    int first_kernel = n_kids;
    for (int k = ATTN_KERNEL_GENERIC; k <= ATTN_KERNEL_AVX512; k++)
        if (attn_kernel_supported((attn_kernel_kind)k)) {
            const char *name = attn_kernel_kind_name((attn_kernel_kind)k);
            kids[n_kids++] = (child){.label = name, .var = "ATTN_KERNEL", .value = name};
        }
    /* The environment as given, started like the others: the Prescott
     * child's forward is compared with this one, two children taking turns,
     * rather than with this process's. */
    int env_kid = n_kids;
    kids[n_kids++] = (child){.label = "env", .var = "ATTND_BENCH_CHILD", .value = "env"};
    /* bfloat16 products emulated (what a CPU without AVX512_BF16 runs),
     * when this process has the instruction. */
    int bf16_emu_kid = -1;
    if (attn_bf16() != ATTN_BF16_EMULATED) {
        bf16_emu_kid = n_kids;
        kids[n_kids++] = (child){.label = "bf16_emulated", .var = "ATTN_BF16",
                                 .value = "emulated"};
    }
    if (only_ragged)
        n_kids = 0;
    for (int i = 0; i < n_kids; i++)
        child_start(&kids[i], self);

    printf("threads %d\n", threads);
    printf("core %s\n", openblas_get_corename());
    printf("kernel %s\n", attn_kernel_name());
    printf("bf16 %s\n", attn_bf16_name());
    const char *env_core = getenv("OPENBLAS_CORETYPE");
    printf("env_coretype %s\n", env_core != NULL ? (*env_core ? env_core : "(empty)") : "(unset)");
    for (int i = 0; i < n_kids; i++) {
        child *c = &kids[i];
        const char *pre = c->blas ? "blas" : "kernel";
        if (c->alive)
            printf("%s_%s_core %s %s %s\n", pre, c->label, c->core, c->kernel, c->bf16);
        else
            printf("%s_%s_dead %s\n", pre, c->label, c->death);
    }

    /* The rounds' measurements, in the order they take turns. */
    char buf[96];
    turn turns[40];
    int n_turns = 0;
#define TURN(who_, key_, ...)                                                   \
    do {                                                                        \
        snprintf(buf, sizeof buf, __VA_ARGS__);                                 \
        turns[n_turns] = (turn){.who = (who_), .best = INFINITY, .reps = 1};    \
        snprintf(turns[n_turns].key, sizeof turns[n_turns].key, "%s", (key_));  \
        snprintf(turns[n_turns].text, sizeof turns[n_turns].text, "%s", buf);   \
        n_turns++;                                                              \
    } while (0)

    /* sgemm of about the work of one n=4096, d=64 forward (2 * 2560^3 =
     * 33.6 GFLOP against 34.4), on the same cores. */
    const int gemm = 2560;
    for (int i = 0; all && i < first_kernel; i++) {
        child *c = &kids[i];
        bool again = false;
        for (int j = 0; j < i; j++)
            again |= kids[j].alive && c->alive && strcmp(kids[j].core, c->core) == 0;
        if (!c->alive)
            continue;
        if (again) {
            printf("blas_%s_same %s\n", c->label, c->core);
            continue;
        }
        char key[48];
        snprintf(key, sizeof key, "sgemm_%s", c->label);
        TURN(c, key, "sgemm %d %d", threads, gemm);
    }
    for (int isa = 0; all && isa < N_PEAK; isa++)
        if (peak_isa_supported((peak_isa)isa)) {
            char key[48];
            snprintf(key, sizeof key, "peak_%s", peak_isa_name((peak_isa)isa));
            /* ~0.1 s at 3 GHz; turns repeat it to a quarter of a second. */
            TURN(NULL, key, "peak %s %d %d", peak_isa_name((peak_isa)isa), threads, 20000000);
        }
    TURN(NULL, "fwd", "sdpa full %d 1 8 4096 64", threads);
    if (all) {
        TURN(&kids[env_kid], "fwd_env", "sdpa full %d 1 8 4096 64", threads);
        TURN(&kids[prescott], "fwd_prescott", "sdpa full %d 1 8 4096 64", threads);
    }
    /* And with the widest OpenBLAS kernels: how much the forward still
     * owes to OpenBLAS. */
    for (int i = 1; all && i < prescott; i++)
        if (kids[i].alive) {
            printf("fwd_blas_wide_core %s\n", kids[i].label);
            TURN(&kids[i], "fwd_blas_wide", "sdpa full %d 1 8 4096 64", threads);
            break;
        }
    for (int i = first_kernel; all && i < env_kid; i++) {
        /* The portable kernel is an order of magnitude slower: two heads
         * instead of eight keep its turn as short as the others'. */
        int heads = strcmp(kids[i].label, "generic") == 0 ? 2 : 8;
        char key[48];
        snprintf(key, sizeof key, "fwd_kernel_%s", kids[i].label);
        printf("%s_heads %d\n", key, heads);
        TURN(&kids[i], key, "sdpa full %d 1 %d 4096 64", threads, heads);
    }
    if (all)
        TURN(NULL, "causal", "sdpa causal %d 1 8 4096 64", threads);
    TURN(NULL, "fwdbwd", "sdpa fwdbwd %d 1 8 4096 64", threads);
    if (all) {
        TURN(NULL, "fwd_d128", "sdpa full %d 1 8 4096 128", threads);
        TURN(NULL, "fwd_batch", "sdpa full %d 64 8 64 64", threads);
        /* bfloat16, each right after or before its float32 twin above. */
        TURN(NULL, "fwd_bf16", "sdpa full %d 1 8 4096 64 bf16", threads);
        TURN(NULL, "fwd_bf16_d128", "sdpa full %d 1 8 4096 128 bf16", threads);
        TURN(NULL, "fwdbwd_bf16", "sdpa fwdbwd %d 1 8 4096 64 bf16", threads);
        if (bf16_emu_kid >= 0 && kids[bf16_emu_kid].alive) {
            TURN(&kids[env_kid], "fwd_env_f32", "sdpa full %d 1 8 4096 64", threads);
            TURN(&kids[bf16_emu_kid], "fwd_bf16_emulated", "sdpa full %d 1 8 4096 64 bf16",
                 threads);
        }
    }
    /* Ragged batches: the packed batch, the same batch padded to its
     * longest with a key-padding mask (what a client without seq_lens
     * sends), and 2000 short sequences, compared with the dense n=4096
     * turns above. */
    TURN(NULL, "ragged_fwd", "ragged full %d 8 64 log48", threads);
    TURN(NULL, "padded_fwd", "padded full %d 8 64 log48", threads);
    TURN(NULL, "ragged_fwdbwd", "ragged fwdbwd %d 8 64 log48", threads);
    TURN(NULL, "padded_fwdbwd", "padded fwdbwd %d 8 64 log48", threads);
    TURN(NULL, "ragged_short_fwd", "ragged full %d 8 64 short2000", threads);
    /* What the short batch's forward cannot go below: its tensors read and
     * its output written once (a few FLOPs a byte: the memory decides). */
    TURN(NULL, "stream_short", "stream %d 8 64 short2000", threads);
    TURN(NULL, "ragged_mixed_fwd", "ragged full %d 8 64 mixed501", threads);
    {
        static int64_t len[2000];
        const char *names[] = {"log48", "short2000", "mixed501"};
        for (int b = 0; b < 3; b++) {
            int64_t n = batch_lengths(names[b], len), rows = 0, longest = 0;
            for (int64_t i = 0; i < n; i++) {
                rows += len[i];
                longest = len[i] > longest ? len[i] : longest;
            }
            printf("batch_%s %lld sequences %lld rows %lld longest\n", names[b], (long long)n,
                   (long long)rows, (long long)longest);
        }
    }
    if (all) {
        TURN(NULL, "mha_fwd", "mha fwd %d 8 512 512 8", threads);
        TURN(NULL, "mha_fwdbwd", "mha fwdbwd %d 8 512 512 8", threads);
    }
#undef TURN
    for (int i = 0; i < n_turns; i++) {
        task probe;
        if (!parse_task(turns[i].text, &probe)) {
            fprintf(stderr, "kernel: bad task %s\n", turns[i].text);
            return 1;
        }
        turns[i].flops = task_flops(&probe);
    }

    /* The warm-up round: buffers, caches, thread start-up, and how many
     * runs make a turn of about a quarter of a second. */
    double t_warm = now_s();
    for (int i = 0; i < n_turns; i++) {
        double s = turn_run(&turns[i], 1);
        fprintf(stderr, "kernel: warm-up %s: %.3f s\n", turns[i].key, s);
        if (s > 0) {
            int reps = (int)ceil(0.25 / s);
            turns[i].reps = reps < 1 ? 1 : reps > 1000 ? 1000 : reps;
        }
    }
    double warm = now_s() - t_warm;
    fprintf(stderr, "kernel: %d turns a round, warm-up %.1f s\n", n_turns, warm);
    /* Rounds for as long as the budget lasts (at least 3, at most 30),
     * counted by the rounds' own time: the warm-up also makes every
     * buffer and starts the children, and takes several rounds' time. */
    const double t_rounds = now_s();
    double last = 0;
    int rounds = 0;
    while (rounds < 30 && (rounds < 3 || now_s() - t_rounds + last <= budget_s)) {
        const double t_round = now_s();
        for (int i = 0; i < n_turns; i++) {
            double s = turn_run(&turns[i], turns[i].reps);
            turns[i].round_s[rounds] = s;
            if (s > 0 && s < turns[i].best)
                turns[i].best = s;
        }
        last = now_s() - t_round;
        rounds++;
    }
    fprintf(stderr, "kernel: %d rounds in %.1f s\n", rounds, now_s() - t_rounds);

    printf("rounds %d\n", rounds);
    for (int i = 0; i < n_turns; i++) {
        turn *u = &turns[i];
        if (!isfinite(u->best)) {
            printf("%s_failed %s\n", u->key,
                   u->who != NULL && !u->who->alive ? u->who->death : "error");
            continue;
        }
        printf("%s_s %.6f\n", u->key, u->best);
        printf("%s_gflops %.2f\n", u->key, u->flops / u->best * 1e-9);
    }
    /* Ratios taken within each round, for their spread: the time of the
     * first turn over the second's, measured a few seconds apart. */
    static const char *const pairs[][3] = {
        {"ragged_vs_dense_fwd", "fwd", "ragged_fwd"},
        {"padded_vs_ragged_fwd", "padded_fwd", "ragged_fwd"},
        {"ragged_vs_dense_fwdbwd", "fwdbwd", "ragged_fwdbwd"},
        {"padded_vs_ragged_fwdbwd", "padded_fwdbwd", "ragged_fwdbwd"},
        {"short_vs_dense_fwd", "fwd", "ragged_short_fwd"},
        {"short_vs_stream", "ragged_short_fwd", "stream_short"},
        {"mixed_vs_dense_fwd", "fwd", "ragged_mixed_fwd"},
        {"bf16_fwd", "fwd", "fwd_bf16"},
        {"bf16_fwd_d128", "fwd_d128", "fwd_bf16_d128"},
        {"bf16_fwdbwd", "fwdbwd", "fwdbwd_bf16"},
        {"bf16_emulated_fwd", "fwd_env_f32", "fwd_bf16_emulated"},
    };
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        const turn *x = NULL, *y = NULL;
        for (int i = 0; i < n_turns; i++) {
            if (strcmp(turns[i].key, pairs[p][1]) == 0)
                x = &turns[i];
            if (strcmp(turns[i].key, pairs[p][2]) == 0)
                y = &turns[i];
        }
        if (x == NULL || y == NULL)
            continue;
        double r[30];
        int n = 0;
        for (int k = 0; k < rounds; k++)
            if (x->round_s[k] > 0 && y->round_s[k] > 0)
                r[n++] = x->round_s[k] / y->round_s[k];
        if (n == 0)
            continue;
        for (int i = 1; i < n; i++) /* insertion sort: a handful */
            for (int j = i; j > 0 && r[j] < r[j - 1]; j--) {
                double t = r[j];
                r[j] = r[j - 1];
                r[j - 1] = t;
            }
        printf("%s_rounds %d\n", pairs[p][0], n);
        printf("%s_min %.3f\n%s_median %.3f\n%s_max %.3f\n", pairs[p][0], r[0], pairs[p][0],
               n % 2 ? r[n / 2] : 0.5 * (r[n / 2 - 1] + r[n / 2]), pairs[p][0], r[n - 1]);
    }
    for (int i = 0; i < n_kids; i++)
        if (kids[i].alive) {
            close(kids[i].to); /* EOF: the child exits */
            int st;
            waitpid(kids[i].pid, &st, 0);
            close(kids[i].from);
        }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "info") == 0)
        return cmd_info();
    if (argc == 2 && strcmp(argv[1], "child") == 0)
        return cmd_child();
    if ((argc >= 3 && argc <= 5) && strcmp(argv[1], "table") == 0 &&
        (argc < 5 || strcmp(argv[4], "ragged") == 0))
        return cmd_table(atoi(argv[2]), argc >= 4 ? atof(argv[3]) : 40.0, argc == 5);
    fprintf(stderr, "usage: kernel info | table THREADS [SECONDS [ragged]]\n");
    return 2;
}
