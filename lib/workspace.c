/*
 * What a call allocates beyond the caller's tensors, known from its
 * parameters before it runs: so that a caller (a server) can bound the
 * memory of a request before anything is allocated, as it bounds its time.
 * The sums follow the allocations of sdpa_forward.c, sdpa_backward.c,
 * mha.c and mha_backward.c term by term; each is an upper bound (every
 * worker a call may start, every optional buffer its options ask for,
 * allocations rounded up to whole cache lines).
 */
#include <math.h>

#include "kern.h"
#include "mha.h"

static double min_d(double a, double b) { return a < b ? a : b; }
static double max_d(double a, double b) { return a > b ? a : b; }

/* Bytes of n items of size, rounded up to whole cache lines. */
static double lines(double n, double size)
{
    return (double)(((int64_t)(n * size) + 63) / 64 * 64);
}

/* The most workers a call of `units` units starts: `threads`, at most
 * SDPA_MAX_THREADS, at most one per unit (sdpa_threads). */
static double workers(const attn_sdpa_params *p, double units)
{
    double t = p->threads < 1 ? 1 : p->threads < SDPA_MAX_THREADS ? p->threads
                                                                  : SDPA_MAX_THREADS;
    return units < t ? (units < 1 ? 1 : units) : t;
}

/* A ragged batch's sequences (0 for one sequence per batch entry). */
static double seqs_of(const attn_sdpa_params *p)
{
    return p->ragged.seqs > 0 ? (double)p->ragged.seqs : 0;
}

/* What a ragged batch adds to either pass: the position table of RoPE,
 * from the earliest query position (len_k - len_q >= -n_q) to the last
 * key (< n_k), a cosine and a sine per frequency. */
static double ragged_rope(const attn_sdpa_params *p)
{
    if (seqs_of(p) == 0 || !(p->variants.rope_base > 0.0f))
        return 0;
    return 8.0 * ((double)p->n_q + (double)p->n_k) * (double)(p->d_k / 2) * 2;
}

/* RoPE's rotated copies of q and k. */
static double rope_copies(const attn_sdpa_params *p)
{
    if (!(p->variants.rope_base > 0.0f))
        return 0;
    return 4.0 * (double)p->batch *
           ((double)p->heads_q * p->n_q + (double)p->heads_kv * p->n_k) * (double)p->d_k;
}

static double forward_bytes(const attn_sdpa_params *p, bool weights, bool stats)
{
    const double B = (double)p->batch, hq = (double)p->heads_q, hkv = (double)p->heads_kv;
    const double n_q = (double)p->n_q, n_k = (double)p->n_k;
    const double d_k = (double)p->d_k, d_v = (double)p->d_v;
    const double bq = KERN_FWD_BQ, bk = KERN_BK;
    const double q_tiles = ceil(n_q / bq), k_tiles = ceil(n_k / bk);
    /* The packed panels of k, as many floats as k, when more than one unit
     * reads each (otherwise each unit packs its own, in its worker). */
    const bool shared = q_tiles > 1 || p->heads_q > p->heads_kv;
    double bytes = shared ? lines(B * hkv * n_k * d_k, 4) : 0;
    /* A ragged batch: each sequence's panels in whole tiles (its key tiles
     * round up once per sequence), and the first panel of each sequence. */
    const double seqs = seqs_of(p);
    if (seqs > 0)
        bytes = lines(hkv * (k_tiles + seqs) * d_k * bk, 4) + lines(seqs + 1, 8) +
                (weights && p->weights_mean ? lines(seqs + 1, 8) : 0);
    /* In bfloat16 the panels hold k and v in pairs, padded to whole tiles
     * (a ragged batch's as many tiles as above), and each worker its
     * rounded q rows, a strip of P and a panel. */
    const bool bf16 = p->precision == ATTN_PRECISION_BFLOAT16;
    const double panel_words = ceil(d_k / 2) * bk + bk / 2 * d_v;
    if (bf16 && seqs > 0)
        bytes = lines(hkv * (k_tiles + seqs) * panel_words, 4) + lines(seqs + 1, 8) +
                (weights && p->weights_mean ? lines(seqs + 1, 8) : 0);
    else if (bf16)
        bytes = shared ? lines(B * hkv * k_tiles * panel_words, 4) : 0;
    /* A ragged batch in [B, H, n, d], worked head by head: the cost of
     * each sequence of each key/value head. */
    if (seqs > 0 && p->layout == ATTN_LAYOUT_BHND)
        bytes += lines(hkv * seqs, 8);
    /* Statistics per unit: a ragged batch's units are planned by cost, at
     * most SDPA_UNITS_MAX + 1; its head mean's are its sequences' query
     * blocks. */
    if (stats)
        bytes += (seqs > 0 ? max_d(hq * q_tiles, SDPA_UNITS_MAX + 2 + q_tiles + seqs)
                           : B * hq * q_tiles) *
                 (double)sizeof(sdpa_stats_acc);
    double worker = lines(KERN_MR_MAX * bk, 4) + lines(bq, 4) + lines(bq, 8) +
                    lines(d_k * min_d(n_k, bk), 4) + lines(KERN_MR_MAX * d_v, 4) +
                    lines(bq * d_v, 8);
    if (stats)
        worker += 2 * lines(bk, 4) + lines(bq, 8);
    if (weights)
        worker += lines(bq * k_tiles, 4);
    if (weights && p->weights_mean)
        worker += lines(min_d(n_q, bq) * n_k, 8) + lines(min_d(n_q, bq) * n_k, 4);
    if (bf16)
        worker += lines(bq * ceil(d_k / 2), 4) + lines(KERN_MR_MAX * bk / 2, 4) +
                  lines(panel_words, 4);
    double units = B * (weights && p->weights_mean ? 1 : hq) * q_tiles;
    if (seqs > 0)
        units = SDPA_UNITS_MAX + 2; /* as many workers as the threads allow */
    return bytes + workers(p, units) * (worker + sizeof(void *) * 16) + rope_copies(p) +
           ragged_rope(p);
}

static double backward_bytes(const attn_sdpa_params *p)
{
    const double rows = (double)p->batch * p->heads_q * p->n_q;
    const double d_k = (double)p->d_k, d_v = (double)p->d_v, n_k = (double)p->n_k;
    const double keys = min_d(n_k, KERN_BK), k_tiles = ceil(n_k / KERN_BK);
    const double pairs = (double)p->batch * p->heads_kv;
    const double seqs = seqs_of(p);
    /* A ragged batch's (pair, key tile)s: each sequence rounds its key
     * tiles up once. */
    const double threads = workers(p, seqs > 0 ? p->heads_kv * (k_tiles + seqs) : pairs * k_tiles);
    /* A ragged batch splits a long sequence's pairs however many pairs
     * there are. */
    const double splits = threads <= 1 || (seqs == 0 && pairs >= 2 * threads)
                              ? 1
                              : min_d(threads, k_tiles);
    const double panels = (d_k + d_v) * keys;
    double worker =
        lines(panels * 8 + (2 * panels + 2.0 * KERN_BWD_BQ * KERN_BK + KERN_BK) * 4 + 8, 1);
    double rounded = 0;
    if (p->precision == ATTN_PRECISION_BFLOAT16) {
        /* q and dO rounded, by rows and by pairs of rows (a ragged
         * batch's from each sequence's first row: no more pairs than rows,
         * and where each sequence's start); the worker's bfloat16 panels
         * and strips. */
        rounded = 2 * lines(rows * (ceil(d_k / 2) + ceil(d_v / 2)) + rows * (d_k + d_v), 4) +
                  (seqs > 0 ? lines(seqs + 1, 8) : 0);
        worker += 4 * ((ceil(d_k / 2) + ceil(d_v / 2)) * KERN_BK +
                       KERN_BK / 2 * (ceil(d_k / 16) * 16) + KERN_MR_MAX * KERN_BK / 2 +
                       KERN_BWD_BQ * KERN_BK);
    }
    /* dq's double sums for each split, and a float copy for each but the first. */
    return lines(rows, 4) + splits * lines(rows * d_k, 8) + (splits - 1) * lines(rows * d_k, 4) +
           threads * worker + rounded + rope_copies(p) + ragged_rope(p) +
           /* a ragged batch's per-sequence pair costs and splits */
           2 * lines(max_d(seqs, 1), 8);
}

double attn_sdpa_workspace(const attn_sdpa_params *p, bool weights, bool stats,
                           bool backward)
{
    if (p == NULL)
        return 0;
    double fwd = forward_bytes(p, weights, stats);
    /* The backward runs after the forward has freed its own. */
    return backward ? max_d(fwd, backward_bytes(p)) : fwd;
}

double attn_mha_workspace(const attn_mha_params *p, bool has_w_o, bool weights, bool stats,
                          bool backward)
{
    if (p == NULL)
        return 0;
    const double B = (double)p->batch, n = (double)p->n, m = (double)p->m;
    const double h = (double)p->heads, hkv = (double)p->kv_heads;
    const double d_k = (double)p->d_k, d_v = (double)p->d_v;
    /* The projections [B, n, h*d_k], [B, m, h_kv*d_k], [B, m, h_kv*d_v],
     * the heads' output [B, n, h*d_v] before w_o, the softmax rows. */
    const double q = 4 * B * n * h * d_k, k = 4 * B * m * hkv * d_k, v = 4 * B * m * hkv * d_v;
    const double o = 4 * B * n * h * d_v;
    double held = q + k + v + (has_w_o ? o : 0) + (backward ? 8 * B * h * n : 0);
    attn_sdpa_params inner = {
        .batch = p->batch, .heads_q = p->heads, .heads_kv = p->kv_heads, .n_q = p->n,
        .n_k = p->m, .d_k = p->d_k, .d_v = p->d_v, .threads = p->threads,
        .variants = p->variants, .weights_mean = p->weights_mean, .precision = p->precision,
        .ragged = p->ragged,
    };
    double peak = held + forward_bytes(&inner, weights, stats);
    if (backward) {
        /* do [B, n, h*d_v] through w_o, and the projections' gradients. */
        double grads = (has_w_o ? o : 0) + q + k + v;
        peak = max_d(peak, held + grads + backward_bytes(&inner));
    }
    return peak;
}
