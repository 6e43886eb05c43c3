/*
 * The server's memory pool (server/pool.c): large blocks freed by one
 * request are kept mapped and handed to the next, within a bound on what
 * it keeps idle, and unmapped once idle for long.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn.h"
#include "server.h"

#define MiB ((size_t)1 << 20)

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i += 4096)
        p[i] = (unsigned char)(seed + i / 4096);
    if (n)
        p[n - 1] = (unsigned char)(seed ^ 0x5a);
}

static bool holds(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i += 4096)
        if (p[i] != (unsigned char)(seed + i / 4096))
            return false;
    return !n || p[n - 1] == (unsigned char)(seed ^ 0x5a);
}

START_TEST(large_block_freed_is_handed_to_the_next_request_of_its_size)
{
    srv_pool *p = pool_new(64 * MiB);
    void *a = pool_alloc(p, 8 * MiB);
    ck_assert_ptr_nonnull(a);
    fill(a, 8 * MiB, 1);
    pool_free(p, a);
    pool_stats s = pool_get_stats(p);
    ck_assert_uint_eq(s.idle_blocks, 1);
    ck_assert_uint_eq(s.busy_bytes, 0);
    void *b = pool_alloc(p, 8 * MiB - 100);
    ck_assert_ptr_eq(a, b);
    /* its pages are still the ones written: mapped all along */
    const unsigned char *x = b;
    for (size_t i = 0; i < 8 * MiB - 100; i += 4096)
        ck_assert_uint_eq(x[i], (unsigned char)(1 + i / 4096));
    s = pool_get_stats(p);
    ck_assert_uint_eq(s.maps, 1);
    ck_assert_uint_eq(s.reuses, 1);
    ck_assert_uint_eq(s.idle_bytes, 0);
    pool_free(p, b);
    pool_destroy(p);
}
END_TEST

START_TEST(blocks_are_aligned_for_kernels_and_huge_pages)
{
    srv_pool *p = pool_new(64 * MiB);
    size_t sizes[] = {1, 100, 4096, POOL_MIN_BLOCK - 1, POOL_MIN_BLOCK, 3 * MiB + 5, 16 * MiB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *x = pool_alloc(p, sizes[i]);
        ck_assert_ptr_nonnull(x);
        ck_assert_uint_eq((uintptr_t)x % 64, 0);
        if (sizes[i] >= 2 * MiB)
            ck_assert_uint_eq((uintptr_t)x % (2 * MiB), 0);
        memset(x, 0xab, sizes[i]); /* every byte asked for is there */
        pool_free(p, x);
    }
    pool_destroy(p);
}
END_TEST

START_TEST(a_small_request_does_not_take_a_much_larger_block)
{
    srv_pool *p = pool_new(256 * MiB);
    void *big = pool_alloc(p, 64 * MiB);
    pool_free(p, big);
    void *small = pool_alloc(p, POOL_MIN_BLOCK);
    ck_assert_ptr_ne(small, big);
    pool_stats s = pool_get_stats(p);
    ck_assert_uint_eq(s.idle_blocks, 1); /* the large one waits for a large request */
    /* the best fit of two that suit */
    void *a = pool_alloc(p, 12 * MiB), *b = pool_alloc(p, 10 * MiB);
    pool_free(p, a);
    pool_free(p, b);
    ck_assert_ptr_eq(pool_alloc(p, 9 * MiB), b);
    pool_free(p, b);
    pool_free(p, small);
    pool_destroy(p);
}
END_TEST

/* A small block of 1 to 64 KiB freed by a thread is that thread's next
 * one of a size it suits (at most twice as large as asked): the C library's
 * shared heap is not asked again for a request's answer text. Run on a
 * thread of its own, which has kept nothing yet; what it saw is checked
 * here. */
typedef struct {
    srv_pool *pool;
    unsigned char *a, *b, *c, *d, *e;
    bool b_whole;
} reuse_run;

static void *reuse_steps(void *arg)
{
    reuse_run *r = arg;
    srv_pool *p = r->pool;
    r->a = pool_alloc(p, 3000);
    if (!r->a)
        return NULL;
    fill(r->a, 3000, 7);
    pool_free(p, r->a);
    r->b = pool_alloc(p, 2000); /* 2000 <= 3008 <= 4000: the kept block */
    if (r->b) {
        memset(r->b, 0x11, 2000); /* every byte asked for is there */
        r->b_whole = true;
        pool_free(p, r->b);
    }
    /* too small for it (it would waste more than half), or too large */
    r->c = pool_alloc(p, 1000);
    r->d = pool_alloc(p, 4000);
    pool_free(p, r->c);
    pool_free(p, r->d);
    r->e = pool_alloc(p, 3000); /* still kept */
    pool_free(p, r->e);
    return NULL;
}

START_TEST(a_thread_reuses_its_last_small_block_for_a_size_it_suits)
{
    reuse_run r = {.pool = pool_new(0)};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, reuse_steps, &r), 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    ck_assert_ptr_nonnull(r.a);
    ck_assert_ptr_eq(r.b, r.a);
    ck_assert(r.b_whole);
    ck_assert_ptr_nonnull(r.c);
    ck_assert_ptr_nonnull(r.d);
    ck_assert_ptr_ne(r.c, r.a);
    ck_assert_ptr_ne(r.d, r.a);
    ck_assert_uint_eq((uintptr_t)r.c % 64, 0);
    ck_assert_uint_eq((uintptr_t)r.d % 64, 0);
    ck_assert_ptr_eq(r.e, r.a);
    pool_destroy(r.pool);
}
END_TEST

/* The block a thread keeps goes when the thread ends (under the
 * sanitizers, LeakSanitizer fails the suite otherwise). */
static void *keep_one(void *arg)
{
    srv_pool *p = arg;
    void *x = pool_alloc(p, 5000);
    pool_free(p, x);
    return x;
}

START_TEST(a_thread_s_kept_block_is_freed_when_it_ends)
{
    srv_pool *p = pool_new(0);
    for (int i = 0; i < 4; i++) {
        pthread_t t;
        void *kept = NULL;
        ck_assert_int_eq(pthread_create(&t, NULL, keep_one, p), 0);
        ck_assert_int_eq(pthread_join(t, &kept), 0);
        ck_assert_ptr_nonnull(kept);
    }
    pool_destroy(p);
}
END_TEST

START_TEST(idle_bytes_stay_within_the_limit_oldest_going_first)
{
    srv_pool *p = pool_new(20 * MiB);
    void *a = pool_alloc(p, 8 * MiB), *b = pool_alloc(p, 8 * MiB), *c = pool_alloc(p, 8 * MiB);
    pool_free(p, a); /* the oldest */
    pool_free(p, b);
    pool_free(p, c); /* three would be over 20 MiB: a goes */
    pool_stats s = pool_get_stats(p);
    ck_assert_uint_eq(s.idle_blocks, 2);
    ck_assert_uint_le(s.idle_bytes, 20 * MiB);
    /* A block larger than the limit is never kept. */
    void *huge = pool_alloc(p, 32 * MiB);
    pool_free(p, huge);
    s = pool_get_stats(p);
    ck_assert_uint_le(s.idle_bytes, 20 * MiB);
    ck_assert_uint_eq(s.idle_blocks, 2);
    /* A lower limit (a request reserved the room) unmaps at once, the
     * oldest first: c, the newest, stays. */
    pool_set_limit(p, 10 * MiB);
    s = pool_get_stats(p);
    ck_assert_uint_eq(s.idle_blocks, 1);
    ck_assert_ptr_eq(pool_alloc(p, 8 * MiB), c);
    pool_free(p, c);
    pool_set_limit(p, 0);
    s = pool_get_stats(p);
    ck_assert_uint_eq(s.idle_blocks, 0);
    ck_assert_uint_eq(s.idle_bytes, 0);
    pool_destroy(p);
}
END_TEST

START_TEST(blocks_idle_for_long_are_unmapped)
{
    srv_pool *p = pool_new(64 * MiB);
    void *a = pool_alloc(p, 4 * MiB), *b = pool_alloc(p, 4 * MiB);
    pool_free(p, a);
    nanosleep(&(struct timespec){.tv_nsec = 200 * 1000 * 1000}, NULL);
    pool_free(p, b);
    pool_reap(p, 60); /* nothing is that old */
    ck_assert_uint_eq(pool_get_stats(p).idle_blocks, 2);
    pool_reap(p, 0.1); /* a is, b is not */
    pool_stats s = pool_get_stats(p);
    ck_assert_uint_eq(s.idle_blocks, 1);
    ck_assert_ptr_eq(pool_alloc(p, 4 * MiB), b);
    pool_free(p, b);
    nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
    pool_reap(p, 0.01);
    s = pool_get_stats(p);
    ck_assert_uint_eq(s.idle_blocks, 0);
    ck_assert_uint_eq(s.idle_bytes, 0);
    pool_destroy(p);
}
END_TEST

START_TEST(realloc_keeps_the_bytes_across_sizes)
{
    srv_pool *p = pool_new(64 * MiB);
    /* small, growing past the threshold, then large, then in place */
    size_t steps[] = {100, 16384, POOL_MIN_BLOCK + 1, 3 * MiB, 3 * MiB + 10, 9 * MiB, 1000};
    unsigned char *x = NULL;
    size_t have = 0;
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        unsigned char *y = pool_realloc(p, x, steps[i]);
        ck_assert_ptr_nonnull(y);
        size_t kept = have < steps[i] ? have : steps[i];
        for (size_t j = 0; j < kept; j++)
            if (y[j] != (unsigned char)(j * 7 + 3))
                ck_abort_msg("byte %zu of step %zu is %u", j, i, y[j]);
        for (size_t j = kept; j < steps[i]; j++)
            y[j] = (unsigned char)(j * 7 + 3);
        if (i == 4) /* 3 MiB + 10 fits the 4 MiB block of 3 MiB */
            ck_assert_ptr_eq(y, x);
        x = y;
        have = steps[i];
    }
    pool_free(p, x);
    ck_assert_uint_eq(pool_get_stats(p).busy_bytes, 0);
    pool_destroy(p);
}
END_TEST

START_TEST(a_growing_buffer_takes_a_whole_idle_block_and_leaves_no_sizes_behind)
{
    srv_pool *p = pool_new(256 * MiB);
    /* No idle block yet: nothing is mapped for the whole, the buffer stays. */
    unsigned char *x = pool_alloc(p, 300 << 10);
    fill(x, 300 << 10, 5);
    ck_assert_ptr_null(pool_realloc_idle(p, x, 40 * MiB));
    ck_assert_uint_eq(pool_get_stats(p).maps, 1);
    ck_assert(holds(x, 300 << 10, 5));
    /* Growing by doubling: each smaller block is unmapped, none kept. */
    size_t n = 300 << 10;
    while (n < 40 * MiB) {
        n = n * 2 < 40 * MiB ? n * 2 : 40 * MiB;
        x = pool_grow(p, x, n);
        ck_assert_ptr_nonnull(x);
    }
    ck_assert(holds(x, 300 << 10, 5));
    ck_assert_uint_eq(pool_get_stats(p).idle_blocks, 0);
    ck_assert_uint_ge(pool_block_size(x), 40 * MiB);
    pool_free(p, x); /* the whole one is kept */
    ck_assert_uint_eq(pool_get_stats(p).idle_blocks, 1);
    /* The next buffer of that size takes it at once, its start copied over. */
    unsigned char *y = pool_alloc(p, 16384);
    memset(y, 7, 16384);
    unsigned char *z = pool_realloc_idle(p, y, 40 * MiB);
    ck_assert_ptr_eq(z, x);
    for (size_t i = 0; i < 16384; i++)
        if (z[i] != 7)
            ck_abort_msg("byte %zu is %u, not 7", i, z[i]);
    pool_stats s = pool_get_stats(p);
    ck_assert_uint_eq(s.idle_blocks, 0);
    ck_assert_uint_eq(s.reuses, 1);
    /* Lent, it still counts against the limit: with 64 MiB left of 100, a
     * freed block of 70 MiB is not kept. */
    ck_assert_uint_ge(s.lent_bytes, 40 * MiB);
    pool_set_limit(p, 100 * MiB);
    void *big = pool_alloc(p, 70 * MiB);
    pool_free(p, big);
    ck_assert_uint_eq(pool_get_stats(p).idle_blocks, 0);
    pool_free(p, z);
    s = pool_get_stats(p);
    ck_assert_uint_eq(s.lent_bytes, 0);
    ck_assert_uint_eq(s.idle_blocks, 1);
    pool_destroy(p);
}
END_TEST

typedef struct {
    srv_pool *p;
    unsigned seed;
    bool ok;
} worker_arg;

static void *worker(void *arg)
{
    worker_arg *w = arg;
    unsigned r = w->seed;
    w->ok = true;
    for (int i = 0; i < 200; i++) {
        r = r * 1103515245u + 12345u;
        size_t n = (size_t)(r >> 8) % (6 * MiB) + 1;
        unsigned char *x = pool_alloc(w->p, n);
        if (!x) {
            w->ok = false;
            break;
        }
        fill(x, n, r);
        sched_yield();
        if (!holds(x, n, r)) /* nobody else wrote into it */
            w->ok = false;
        pool_free(w->p, x);
        if (i % 50 == 0)
            pool_reap(w->p, 0.001);
    }
    return NULL;
}

START_TEST(threads_share_the_pool_without_sharing_blocks)
{
    srv_pool *p = pool_new(24 * MiB);
    pthread_t t[4];
    worker_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (worker_arg){.p = p, .seed = (unsigned)(i + 1) * 7919u};
        ck_assert_int_eq(pthread_create(&t[i], NULL, worker, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        ck_assert_msg(a[i].ok, "worker %d saw its block changed or failed", i);
    }
    pool_stats s = pool_get_stats(p);
    ck_assert_uint_eq(s.busy_bytes, 0);
    ck_assert_uint_le(s.idle_bytes, 24 * MiB);
    ck_assert_uint_gt(s.reuses, 0);
    pool_destroy(p);
}
END_TEST

/* An allocator for libattn that counts what it gives and takes back. */
typedef struct {
    srv_pool *pool;
    atomic_long allocs, frees;
    atomic_llong bytes; /* given out in all */
} counting;

static void *counting_alloc(void *ctx, size_t n)
{
    counting *c = ctx;
    void *p = pool_alloc(c->pool, n);
    if (p) {
        atomic_fetch_add(&c->allocs, 1);
        atomic_fetch_add(&c->bytes, (long long)n);
    }
    return p;
}

static void counting_free(void *ctx, void *p)
{
    counting *c = ctx;
    if (p)
        atomic_fetch_add(&c->frees, 1);
    pool_free(c->pool, p);
}

static void random_floats(float *x, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((seed >> 9) & 0xffff) / 32768.0f - 1.0f;
    }
}

START_TEST(libattn_workspaces_come_from_the_allocator_it_is_given_and_all_go_back)
{
    /* B=1, H=2, n=512, d=64 on two threads: the shared packed keys (more
     * than one query tile) and each worker's buffers; then the backward. */
    attn_sdpa_params p = {.batch = 1, .heads_q = 2, .heads_kv = 2, .n_q = 512, .n_k = 512,
                          .d_k = 64, .d_v = 64, .scale = attn_default_scale(64), .threads = 2};
    size_t n = 2 * 512 * 64;
    float *q = malloc(n * sizeof *q), *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
    float *dout = malloc(n * sizeof *dout);
    float *out[2], *dq[2], *dk[2], *dv[2];
    attn_softmax_row *rows[2];
    ck_assert_ptr_nonnull(q);
    random_floats(q, n, 1);
    random_floats(k, n, 2);
    random_floats(v, n, 3);
    random_floats(dout, n, 4);
    counting c = {.pool = pool_new(64 * MiB)};
    for (int run = 0; run < 2; run++) {
        /* run 0 on the default allocator, run 1 on the counting one */
        attn_set_allocator(run ? &(attn_allocator){.alloc = counting_alloc,
                                                   .free = counting_free, .ctx = &c}
                               : NULL);
        out[run] = malloc(n * sizeof(float));
        dq[run] = malloc(n * sizeof(float));
        dk[run] = malloc(n * sizeof(float));
        dv[run] = malloc(n * sizeof(float));
        rows[run] = malloc(2 * 512 * sizeof(attn_softmax_row));
        attn_error err = {0};
        ck_assert_int_eq(attn_sdpa_forward(&p, q, k, v, out[run], rows[run], NULL, NULL, &err),
                         ATTN_OK);
        ck_assert_int_eq(attn_sdpa_backward(&p, q, k, v, out[run], rows[run], dout, dq[run],
                                            dk[run], dv[run], &err),
                         ATTN_OK);
    }
    attn_set_allocator(NULL);
    ck_assert_int_gt(atomic_load(&c.allocs), 0);
    ck_assert_int_eq(atomic_load(&c.allocs), atomic_load(&c.frees));
    ck_assert_uint_eq(pool_get_stats(c.pool).busy_bytes, 0);
    /* where the memory came from changes no number */
    ck_assert_mem_eq(out[0], out[1], n * sizeof(float));
    ck_assert_mem_eq(dq[0], dq[1], n * sizeof(float));
    ck_assert_mem_eq(dk[0], dk[1], n * sizeof(float));
    ck_assert_mem_eq(dv[0], dv[1], n * sizeof(float));
    for (int run = 0; run < 2; run++) {
        free(out[run]);
        free(dq[run]);
        free(dk[run]);
        free(dv[run]);
        free(rows[run]);
    }
    free(q);
    free(k);
    free(v);
    free(dout);
    pool_destroy(c.pool);
}
END_TEST

static void *give(void *ctx, size_t n) { return counting_alloc(ctx, n); }
static void *regive(void *ctx, void *p, size_t n)
{
    counting *c = ctx;
    if (!p)
        atomic_fetch_add(&c->allocs, 1);
    return pool_realloc(c->pool, p, n);
}
static void take(void *ctx, void *p) { counting_free(ctx, p); }

static void append_b64_tensor(char **text, size_t *len, size_t *cap, const char *name,
                              const float *x, size_t n, int h, int rows, int d)
{
    static const char abc[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t bytes = n * sizeof(float), need = *len + bytes / 3 * 4 + 200;
    if (need > *cap) {
        *cap = need * 2;
        *text = realloc(*text, *cap);
        ck_assert_ptr_nonnull(*text);
    }
    *len += (size_t)sprintf(*text + *len,
                            "%s\"%s\":{\"shape\":[%d,%d,%d],\"dtype\":\"float32\",\"base64\":\"",
                            *len > 1 ? "," : "", name, h, rows, d);
    const unsigned char *b = (const unsigned char *)x; /* little-endian floats */
    for (size_t i = 0; i + 2 < bytes; i += 3) {
        unsigned v = (unsigned)b[i] << 16 | (unsigned)b[i + 1] << 8 | b[i + 2];
        for (int k = 3; k >= 0; k--)
            (*text)[*len + (size_t)(3 - k)] = abc[(v >> (6 * k)) & 63];
        *len += 4;
    }
    ck_assert_uint_eq(bytes % 3, 1); /* n*4 bytes: one left, two '=' */
    unsigned v = (unsigned)b[bytes - 1] << 16;
    (*text)[(*len)++] = abc[(v >> 18) & 63];
    (*text)[(*len)++] = abc[(v >> 12) & 63];
    *len += (size_t)sprintf(*text + *len, "==\"}");
}

/* The answer up to its meta object (which holds timings). */
static size_t answer_part(const api_response *res)
{
    const char *meta = strstr(res->body, "\"meta\"");
    ck_assert_ptr_nonnull(meta);
    return (size_t)(meta - res->body);
}

START_TEST(a_request_through_the_api_takes_its_tensors_from_the_allocator_and_gives_all_back)
{
    /* q, k, v [2, 512, 64] as base64: 256 KiB each, past POOL_MIN_BLOCK,
     * so mapped blocks are reused from one request to the next */
    int h = 2, rows = 512, d = 64;
    size_t n = (size_t)h * rows * d;
    float *x = malloc(3 * n * sizeof *x);
    ck_assert_ptr_nonnull(x);
    random_floats(x, 3 * n, 9);
    size_t len = 0, cap = 0;
    char *body = NULL;
    cap = 64;
    body = malloc(cap);
    len = (size_t)sprintf(body, "{");
    append_b64_tensor(&body, &len, &cap, "q", x, n, h, rows, d);
    append_b64_tensor(&body, &len, &cap, "k", x + n, n, h, rows, d);
    append_b64_tensor(&body, &len, &cap, "v", x + 2 * n, n, h, rows, d);
    len += (size_t)sprintf(body + len, ",\"output_encoding\":\"base64\"}");
    /* and a multi-head request with an output projection and gradients:
     * the projections and their gradients are libattn's workspaces */
    const char *mh = "{\"x\":[[1,0],[0,1],[1,1]],\"context\":[[1,2],[0,1]],"
                     "\"w_q\":[[1,0],[0,1]],\"w_k\":[[1,0],[0,1]],\"w_v\":[[1,0],[0,1]],"
                     "\"w_o\":[[1],[1]],\"num_heads\":2,\"grad_output\":[[1],[1],[1]]}";
    api_limits lim = {.threads = 2, .max_threads = 2};
    api_response plain, pooled[2], mh_plain, mh_pooled;
    api_handle(API_OP_ATTENTION, body, len, &lim, &plain);
    ck_assert_msg(plain.status == 200, "%s", plain.body);
    api_handle(API_OP_MULTIHEAD, mh, strlen(mh), &lim, &mh_plain);
    ck_assert_msg(mh_plain.status == 200, "%s", mh_plain.body);
    counting c = {.pool = pool_new(64 * MiB)};
    api_set_allocator(&(api_allocator){.alloc = give, .realloc = regive, .free = take, .ctx = &c});
    for (int i = 0; i < 2; i++) {
        api_handle(API_OP_ATTENTION, body, len, &lim, &pooled[i]);
        ck_assert_msg(pooled[i].status == 200, "%s", pooled[i].body);
    }
    long before_mh = atomic_load(&c.allocs);
    api_handle(API_OP_MULTIHEAD, mh, strlen(mh), &lim, &mh_pooled);
    ck_assert_msg(mh_pooled.status == 200, "%s", mh_pooled.body);
    ck_assert_int_gt(atomic_load(&c.allocs), before_mh);
    size_t mh_len = answer_part(&mh_plain);
    ck_assert_uint_eq(answer_part(&mh_pooled), mh_len);
    ck_assert_mem_eq(mh_pooled.body, mh_plain.body, mh_len);
    api_response_free(&mh_pooled);
    for (int i = 0; i < 2; i++) {
        /* the answers are the allocator's too, until they are freed */
        ck_assert(pooled[i].body_elements);
        size_t m = answer_part(&plain);
        ck_assert_uint_eq(answer_part(&pooled[i]), m);
        ck_assert_mem_eq(pooled[i].body, plain.body, m);
        api_response_free(&pooled[i]);
    }
    api_set_allocator(NULL);
    api_response_free(&mh_plain); /* malloc's, as it was made */
    pool_stats s = pool_get_stats(c.pool);
    ck_assert_int_gt(atomic_load(&c.allocs), 0);
    ck_assert_int_eq(atomic_load(&c.allocs), atomic_load(&c.frees));
    ck_assert_uint_eq(s.busy_bytes, 0);
    ck_assert_uint_gt(s.reuses, 0); /* the second request took the first's blocks */
    api_response_free(&plain);
    free(body);
    free(x);
    pool_destroy(c.pool);
}
END_TEST

static Suite *pool_suite(void)
{
    Suite *s = suite_create("pool");
    TCase *tc = tcase_create("pool");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, large_block_freed_is_handed_to_the_next_request_of_its_size);
    tcase_add_test(tc, blocks_are_aligned_for_kernels_and_huge_pages);
    tcase_add_test(tc, a_small_request_does_not_take_a_much_larger_block);
    tcase_add_test(tc, a_thread_reuses_its_last_small_block_for_a_size_it_suits);
    tcase_add_test(tc, a_thread_s_kept_block_is_freed_when_it_ends);
    tcase_add_test(tc, idle_bytes_stay_within_the_limit_oldest_going_first);
    tcase_add_test(tc, blocks_idle_for_long_are_unmapped);
    tcase_add_test(tc, realloc_keeps_the_bytes_across_sizes);
    tcase_add_test(tc, a_growing_buffer_takes_a_whole_idle_block_and_leaves_no_sizes_behind);
    tcase_add_test(tc, threads_share_the_pool_without_sharing_blocks);
    tcase_add_test(tc, libattn_workspaces_come_from_the_allocator_it_is_given_and_all_go_back);
    tcase_add_test(tc,
                   a_request_through_the_api_takes_its_tensors_from_the_allocator_and_gives_all_back);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(pool_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
