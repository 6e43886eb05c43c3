/*
 * Decoding over a KV cache against the machine's memory bandwidth: every
 * figure measured in one run, taking turns.
 *
 *   decode THREADS [SECS]     about SECS seconds of rounds (default 40)
 *
 * A decode step reads every cached key and value once and does little
 * arithmetic with them, so its limit is the memory's read bandwidth, not
 * the FMA units. The measurements, each once a round, one after the other:
 *   stream        THREADS threads summing a buffer of 1 GiB (four times
 *                 the largest cache, and far beyond any CPU cache), each
 *                 its share: the bytes read per second (STREAM's kind of
 *                 figure, with the same threads the decode uses)
 *   decode_bf16   attn_kv_forward of one query row per head, H_q 32,
 *   decode_f32    H_kv 8, head_dim = value_dim = 128, over 32768 cached
 *                 positions in bfloat16 / float32 pages: the bytes of K and
 *                 V read per second (length * H_kv * (d_k + d_v) * size)
 *   append_1k     one position appended to a float32 cache of 1024 / 32768
 *   append_32k    positions: the mean of 64 appends in a row (a page's
 *                 worth, its allocation included), then truncated back
 * A turn repeats its task to about a quarter of a second and counts the
 * mean. Each decode and append figure is compared with the stream (or the
 * 1k append) of the same round, so that whatever else runs on the machine
 * weighs on both alike; the ratios' median over the rounds is the figure,
 * and their smallest and largest are the spread. The same ratios per
 * second of CPU time (_cpu) say what the turns made of the time they were
 * given when other programs took the cores from them.
 *
 * Output: one "key value" pair a line, for bench/run.sh's table.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn.h"

enum { HEADS_Q = 32, HEADS_KV = 8, DIM = 128, LENGTH = 32768, APPENDS = 64, MAX_ROUNDS = 60 };
#define STREAM_BYTES ((size_t)1 << 30)

static double clock_s(clockid_t which)
{
    struct timespec ts;
    clock_gettime(which, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double now_s(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

static void *xmalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == NULL) {
        fprintf(stderr, "decode: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static void fill(float *x, size_t n, unsigned *seed)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)rand_r(seed) / (float)RAND_MAX - 0.5f;
}

/* ------------------------------------------------------------- stream */

/* 16 floats, summed four at a time: as wide as the compiler may make
 * them, and enough independent sums that the loads never wait for adds. */
typedef float v16 __attribute__((vector_size(64)));

typedef struct {
    const float *x;
    size_t n; /* floats, a multiple of 64 */
    float sum;
    pthread_t thread;
} stream_share;

static void *stream_sum(void *arg)
{
    stream_share *s = arg;
    v16 a = {0}, b = {0}, c = {0}, d = {0};
    for (size_t i = 0; i < s->n; i += 64) {
        v16 x, y, z, w;
        memcpy(&x, s->x + i, sizeof x);
        memcpy(&y, s->x + i + 16, sizeof y);
        memcpy(&z, s->x + i + 32, sizeof z);
        memcpy(&w, s->x + i + 48, sizeof w);
        a += x, b += y, c += z, d += w;
    }
    a += b + c + d;
    float sum = 0.0f;
    for (int k = 0; k < 16; k++)
        sum += a[k];
    s->sum = sum;
    return NULL;
}

/* One pass over the buffer on `threads` threads, each its contiguous
 * share, started and joined as attn_kv_forward starts and joins its own. */
static float stream_once(const float *buf, int threads)
{
    stream_share share[64];
    const size_t n = STREAM_BYTES / sizeof(float), per = n / (size_t)threads / 64 * 64;
    for (int t = 0; t < threads; t++) {
        share[t] = (stream_share){.x = buf + per * (size_t)t, .n = per};
        if (t > 0 && pthread_create(&share[t].thread, NULL, stream_sum, &share[t]) != 0) {
            fprintf(stderr, "decode: could not start a thread\n");
            exit(1);
        }
    }
    stream_sum(&share[0]);
    float total = share[0].sum;
    for (int t = 1; t < threads; t++) {
        pthread_join(share[t].thread, NULL);
        total += share[t].sum;
    }
    return total;
}

/* -------------------------------------------------------------- caches */

static attn_kv_cache *make_cache(attn_kv_dtype dtype, int64_t length, unsigned *seed)
{
    const attn_kv_config cfg = {.num_kv_heads = HEADS_KV, .head_dim = DIM, .value_dim = DIM,
                                .dtype = dtype};
    attn_kv_cache *c;
    attn_error err = {0};
    if (attn_kv_create(&cfg, &c, &err) != ATTN_OK) {
        fprintf(stderr, "decode: %s\n", err.message);
        exit(1);
    }
    enum { CHUNK = 1024 };
    float *k = xmalloc((size_t)HEADS_KV * CHUNK * DIM * sizeof *k);
    float *v = xmalloc((size_t)HEADS_KV * CHUNK * DIM * sizeof *v);
    for (int64_t at = 0; at < length; at += CHUNK) {
        const int64_t n = length - at < CHUNK ? length - at : CHUNK;
        fill(k, (size_t)(HEADS_KV * n * DIM), seed);
        fill(v, (size_t)(HEADS_KV * n * DIM), seed);
        if (attn_kv_append(c, n, k, v, 0.0f, &err) != ATTN_OK) {
            fprintf(stderr, "decode: %s\n", err.message);
            exit(1);
        }
    }
    free(k);
    free(v);
    return c;
}

/* ---------------------------------------------------------------- turns */

typedef enum { M_STREAM, M_DECODE, M_APPEND } measure_kind;

typedef struct {
    const char *key;
    measure_kind kind;
    attn_kv_cache *cache;
    double bytes;   /* read by one run (stream, decode) */
    int reps;
    double value[MAX_ROUNDS]; /* GB/s (stream, decode) or us (append), per round */
    double cpu[MAX_ROUNDS];   /* the same per second of CPU time of the whole process */
} turn;

typedef struct {
    int threads;
    const float *buf;
    const float *q;
    float *out;
    const float *k1, *v1; /* one position to append */
} bench;

static float sink;

/* Seconds of one run of the turn's task; *cpu_s the CPU seconds of all
 * the process's threads in it. */
static double run_turn(const bench *b, turn *t, int reps, double *cpu_s)
{
    attn_error err = {0};
    const double t0 = now_s(), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    for (int r = 0; r < reps; r++) {
        if (t->kind == M_STREAM) {
            sink += stream_once(b->buf, b->threads);
        } else if (t->kind == M_DECODE) {
            const attn_kv_params p = {.heads_q = HEADS_Q, .n_q = 1,
                                      .scale = attn_default_scale(DIM), .causal = true,
                                      .threads = b->threads};
            if (attn_kv_forward(t->cache, &p, b->q, b->out, NULL, &err) != ATTN_OK) {
                fprintf(stderr, "decode: %s\n", err.message);
                exit(1);
            }
        } else {
            const int64_t length = attn_kv_length(t->cache);
            for (int a = 0; a < APPENDS; a++)
                if (attn_kv_append(t->cache, 1, b->k1, b->v1, 0.0f, &err) != ATTN_OK) {
                    fprintf(stderr, "decode: %s\n", err.message);
                    exit(1);
                }
            attn_kv_truncate(t->cache, length, &err);
        }
    }
    *cpu_s = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / reps;
    return (now_s() - t0) / reps;
}

static double value_of(const turn *t, double seconds)
{
    return t->kind == M_APPEND ? seconds / APPENDS * 1e6 : t->bytes / seconds * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median, smallest and largest of n values. */
static void spread(const double *x, int n, double *median, double *lo, double *hi)
{
    double s[MAX_ROUNDS];
    memcpy(s, x, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    *median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    *lo = s[0];
    *hi = s[n - 1];
}

/* The ratio a / b round by round: its median and spread; and the median
 * of the same ratio per CPU second. */
static void print_ratio(const char *key, const turn *a, const turn *b, int rounds)
{
    double r[MAX_ROUNDS], median, lo, hi;
    for (int i = 0; i < rounds; i++)
        r[i] = a->value[i] / b->value[i];
    spread(r, rounds, &median, &lo, &hi);
    printf("%s %.3f\n%s_min %.3f\n%s_max %.3f\n", key, median, key, lo, key, hi);
    for (int i = 0; i < rounds; i++)
        r[i] = a->cpu[i] / b->cpu[i];
    spread(r, rounds, &median, &lo, &hi);
    printf("%s_cpu %.3f\n", key, median);
}

static int cmd_decode(int threads, double budget_s)
{
    unsigned seed = 11;
    bench b = {.threads = threads};
    float *buf = xmalloc(STREAM_BYTES);
    fill(buf, STREAM_BYTES / sizeof *buf, &seed);
    b.buf = buf;
    float *q = xmalloc(HEADS_Q * DIM * sizeof *q), *k1 = xmalloc(HEADS_KV * DIM * sizeof *k1);
    float *v1 = xmalloc(HEADS_KV * DIM * sizeof *v1);
    fill(q, HEADS_Q * DIM, &seed);
    fill(k1, HEADS_KV * DIM, &seed);
    fill(v1, HEADS_KV * DIM, &seed);
    b.q = q, b.k1 = k1, b.v1 = v1;
    b.out = xmalloc(HEADS_Q * DIM * sizeof *b.out);
    attn_kv_cache *bf16 = make_cache(ATTN_KV_BFLOAT16, LENGTH, &seed);
    attn_kv_cache *f32 = make_cache(ATTN_KV_FLOAT32, LENGTH, &seed);
    attn_kv_cache *small = make_cache(ATTN_KV_FLOAT32, 1024, &seed);
    const double kv_elems = (double)LENGTH * HEADS_KV * (DIM + DIM);
    turn turns[] = {
        {.key = "stream", .kind = M_STREAM, .bytes = (double)STREAM_BYTES},
        {.key = "decode_bf16", .kind = M_DECODE, .cache = bf16, .bytes = kv_elems * 2},
        {.key = "decode_f32", .kind = M_DECODE, .cache = f32, .bytes = kv_elems * 4},
        {.key = "append_1k", .kind = M_APPEND, .cache = small},
        {.key = "append_32k", .kind = M_APPEND, .cache = f32},
    };
    enum { N = sizeof turns / sizeof turns[0] };

    /* The warm-up: caches, threads, and how many runs make a turn of about
     * a quarter of a second. */
    double t_warm = now_s();
    double cpu;
    for (int i = 0; i < N; i++) {
        double s = run_turn(&b, &turns[i], 1, &cpu);
        int reps = (int)ceil(0.25 / s);
        turns[i].reps = reps < 1 ? 1 : reps > 10000 ? 10000 : reps;
    }
    double warm = now_s() - t_warm;
    int rounds = (int)(budget_s / fmax(warm, 1e-3));
    rounds = rounds < 5 ? 5 : rounds > MAX_ROUNDS ? MAX_ROUNDS : rounds;
    fprintf(stderr, "decode: %d turns a round, warm-up %.1f s, %d rounds\n", N, warm, rounds);
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < N; i++) {
            turns[i].value[r] = value_of(&turns[i], run_turn(&b, &turns[i], turns[i].reps, &cpu));
            /* Per CPU second: what a turn made of the time it was given.
             * (The per-thread figures scale by the same thread count.) */
            turns[i].cpu[r] = value_of(&turns[i], cpu);
        }

    printf("threads %d\nrounds %d\nkernel %s\n", threads, rounds, attn_kernel_name());
    printf("shape H_q=%d H_kv=%d d=%d length=%d\n", HEADS_Q, HEADS_KV, DIM, LENGTH);
    for (int i = 0; i < N; i++) {
        double median, lo, hi;
        spread(turns[i].value, rounds, &median, &lo, &hi);
        const char *unit = turns[i].kind == M_APPEND ? "us" : "gbs";
        printf("%s_%s %.2f\n%s_%s_min %.2f\n%s_%s_max %.2f\n", turns[i].key, unit, median,
               turns[i].key, unit, lo, turns[i].key, unit, hi);
    }
    print_ratio("ratio_bf16", &turns[1], &turns[0], rounds);
    print_ratio("ratio_f32", &turns[2], &turns[0], rounds);
    print_ratio("ratio_append", &turns[4], &turns[3], rounds);
    attn_kv_free(bf16);
    attn_kv_free(f32);
    attn_kv_free(small);
    free(buf), free(q), free(k1), free(v1), free(b.out);
    return sink == 12345.0f; /* keeps the sums from being optimised away */
}

int main(int argc, char **argv)
{
    if ((argc == 2 || argc == 3) && atoi(argv[1]) >= 1 && atoi(argv[1]) <= 64)
        return cmd_decode(atoi(argv[1]), argc == 3 ? atof(argv[2]) : 40.0);
    fprintf(stderr, "usage: decode THREADS [SECONDS]\n");
    return 2;
}
