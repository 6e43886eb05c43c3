/* Private to the SDPA kernels: the call geometry shared by the forward and
 * backward loops, the tile routines they are built around, and the pieces
 * (masks, statistics, validation) those routines use. */
#ifndef ATTN_SDPA_H
#define ATTN_SDPA_H

#include "internal.h"

/*
 * Tile sizes. The forward pass streams key tiles of SDPA_FWD_BK columns past
 * a block of SDPA_FWD_BQ query rows: wide key tiles keep the two sgemm calls
 * per tile efficient (P V has inner dimension BK), and the score tile
 * (BQ x BK floats = 256 KiB) plus one key and one value tile stay in a
 * core's L2 while the softmax passes over it. 128 query rows keep the
 * causal diagonal's wasted triangle small (about BQ / 2n of the work).
 * The backward pass does five products per tile and keeps two tiles (P and
 * dS, 512 KiB each, together half a core's L2). Each of its units streams
 * every query row's q, dO and dq past one key tile, so wider key tiles mean
 * fewer passes over them, and taller query tiles longer dK and dV products:
 * 512 x 256 measured 5-7% faster than 256 x 128 at n = 4096, at the price
 * of a larger wasted triangle on the causal diagonal (about BK / 2n).
 * Within the noise of a shared machine the products themselves run at the
 * same rate for every tile shape from 128 to 512.
 */
#ifndef SDPA_FWD_BQ
#define SDPA_FWD_BQ 128
#endif
#ifndef SDPA_FWD_BK
#define SDPA_FWD_BK 512
#endif
#ifndef SDPA_BWD_BQ
#define SDPA_BWD_BQ 512
#endif
#ifndef SDPA_BWD_BK
#define SDPA_BWD_BK 256
#endif

/* Below this many nominal FLOPs a call runs on one thread: starting threads
 * costs more than it saves. */
#define SDPA_MIN_PARALLEL_FLOPS 2e6

/* At most this many threads per call, whatever `threads` asks: each worker
 * holds its own tiles, and OpenBLAS (built for 64 threads) keeps a fixed
 * table of per-caller buffers that concurrent callers share. */
#define SDPA_MAX_THREADS 64

/* The tensors of one call and the numbers derived from the parameters. */
typedef struct {
    const attn_sdpa_params *p;
    const float *q, *k, *v;
    int64_t group;  /* query heads per key/value head, H_q / H_kv */
    int64_t offset; /* n_k - n_q: query i sees key j iff j <= i + offset */
} sdpa_call;

/* Query rows [i0, i0 + rows) of head h in batch b, against keys [j0, j0 + cols). */
typedef struct {
    int64_t b, h;
    int64_t i0, rows;
    int64_t j0, cols;
} sdpa_tile;

/* Which parts of the mask sdpa_mask_tile applies. */
enum {
    SDPA_HIDE = 1, /* causal and boolean: hidden scores become -inf */
    SDPA_BIAS = 2, /* an additive bias */
};

/* q of head (b, h): [n_q, d_k]; k, v of its key/value head: [n_k, d_k], [n_k, d_v]. */
const float *sdpa_head_q(const sdpa_call *c, int64_t b, int64_t h);
const float *sdpa_head_k(const sdpa_call *c, int64_t b, int64_t h);
const float *sdpa_head_v(const sdpa_call *c, int64_t b, int64_t h);

/* Last key column (exclusive) that any row of [i0, i0 + rows) may see. */
int64_t sdpa_causal_end(const sdpa_call *c, int64_t i0, int64_t rows);

/* scores [rows, ld]: alpha * Q_tile K_tile^T, one sgemm. */
void sdpa_scores(const sdpa_call *c, const sdpa_tile *t, float alpha, float *scores,
                 int64_t ld);

/* Applies the parts `what` of the causal and explicit masks to scores [rows, ld]. */
void sdpa_mask_tile(const sdpa_call *c, const sdpa_tile *t, unsigned what,
                    float *scores, int64_t ld);

/* One row of the explicit mask starting at element `base` (mask.c). */
void sdpa_mask_row_bias(const attn_mask *mask, int64_t base, float *x, int64_t cols);
void sdpa_mask_row_hide(const attn_mask *mask, int64_t base, float *x, int64_t cols);

/* ------------------------------------------------------------ statistics */

/* A worker's running statistics; merged across workers at the end. Means
 * and squared deviations are combined with Chan's formula, so the variance
 * does not suffer the cancellation of sum-of-squares. */
typedef struct {
    int64_t count;    /* visible scores */
    double mean, m2;  /* of the raw scores */
    int64_t rows;     /* rows not fully masked */
    double entropy_sum, entropy_min, entropy_max, max_weight_sum;
} sdpa_stats_acc;

void sdpa_stats_init(sdpa_stats_acc *a);
/* Raw scores [rows, ld] of a tile, hidden ones already -inf. */
void sdpa_stats_scores(sdpa_stats_acc *a, const float *scores, int64_t ld,
                       int64_t rows, int64_t cols);
void sdpa_stats_row(sdpa_stats_acc *a, double entropy, double max_weight);
void sdpa_stats_merge(sdpa_stats_acc *into, const sdpa_stats_acc *from);
void sdpa_stats_finish(const sdpa_stats_acc *a, float scale, attn_stats *out);

/* ------------------------------------------------------------ tile steps */

/* A forward worker's state for one query tile [rows]: running row maxima m
 * and sums l of the online softmax, and the unnormalised output rows. */
typedef struct {
    float *scores;         /* [rows, ld] workspace; P after a step */
    int64_t ld;            /* min(n_k, SDPA_FWD_BK): a tiny call gets a tiny tile */
    float *m;              /* [rows] */
    double *l;             /* [rows]; double, so that long rows sum without drift */
    float *out;            /* [rows, d_v] = sum_j exp(x_j - m) v_j, ld d_v */
    sdpa_stats_acc *stats; /* NULL unless statistics were asked for */
    double *ent;           /* [rows] sum_j exp(x_j - m) (x_j - m), with stats */
    float *row_copy;       /* [ld] workspace, with stats */
} sdpa_fwd_state;

/* Folds key tile t into the state: scores, masks, online softmax, P V. */
void sdpa_forward_tile(const sdpa_call *c, const sdpa_tile *t, sdpa_fwd_state *st);

/* A backward worker's view of one (query tile, key tile) pair. */
typedef struct {
    float *p, *dp;      /* [SDPA_BWD_BQ, SDPA_BWD_BK] workspaces */
    const double *lse;  /* [rows] from the forward pass */
    const float *delta; /* [rows] rowsum(dO * O) */
    const float *dout;  /* [rows, d_v] */
    float *dq;          /* [rows, d_k] accumulated */
    float *dk, *dv;     /* [cols, d_k], [cols, d_v] accumulated */
} sdpa_bwd_state;

/* Adds the tile's contributions to dq, dk and dv (FlashAttention-2). */
void sdpa_backward_tile(const sdpa_call *c, const sdpa_tile *t, const sdpa_bwd_state *st);

/* ------------------------------------------------------------ validation */

/* Checks the parameters of an SDPA call (and that weights [B,H_q,n_q,n_k]
 * is addressable when `with_weights`). */
attn_status sdpa_check_params(const attn_sdpa_params *p, bool with_weights,
                              attn_error *err);

/* Threads worth starting for `units` units of `flops` total work. */
int sdpa_threads(const attn_sdpa_params *p, int64_t units, double flops);

/* 64-byte aligned allocation of n floats (or doubles: `size` bytes each). */
void *sdpa_alloc(int64_t n, size_t size);

#endif /* ATTN_SDPA_H */
