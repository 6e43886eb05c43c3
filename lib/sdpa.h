/* Private to the SDPA kernels: the call geometry shared by the forward and
 * backward loops, the state the micro-kernels (kern.h) work on, and the
 * pieces (masks, statistics, weights, validation) those kernels call. */
#ifndef ATTN_SDPA_H
#define ATTN_SDPA_H

#include "internal.h"

/* Below this many nominal FLOPs a call runs on one thread: starting threads
 * costs more than it saves. */
#define SDPA_MIN_PARALLEL_FLOPS 2e6

/* At most this many threads per call, whatever `threads` asks: each worker
 * holds its own tiles. */
#define SDPA_MAX_THREADS 64

/* An input tensor as the caller gave it (attn_sdpa_params.dtype): float32,
 * or bfloat16 words; the other pointer is NULL. */
typedef struct {
    const float *f32;
    const uint16_t *bf16;
} sdpa_src;

/* The tensors of one call and the numbers derived from the parameters. */
typedef struct {
    const attn_sdpa_params *p;
    /* q, k and v as float32, or NULL when given as bfloat16 words (q16,
     * k16, v16; NULL when float32): the bfloat16 kernels' conversions read
     * either (sdpa_src), everything else reads floats. */
    const float *q, *k, *v;
    const uint16_t *q16, *k16, *v16;
    int64_t group;  /* query heads per key/value head, H_q / H_kv */
    int64_t offset; /* n_k - n_q: query i sees key j iff j <= i + offset */
    /* Row strides (in floats) of q and dq, k and dk, v and dv, out and dout:
     * d for ATTN_LAYOUT_BHND, H * d for ATTN_LAYOUT_BNHD. */
    int64_t ldq, ldk, ldv, ldo;
    /* Causal mask and window together: query i (position p_i = i + offset)
     * sees keys p_i - before .. p_i + after (SDPA_FAR: unbounded). */
    int64_t before, after;
    /* What the kernels' row step must do beyond scaling and the range. */
    bool plain; /* no explicit mask, no ALiBi, no softcap */
    /* The sequence a unit works in: query rows [q_lo, q_hi), keys [k_lo,
     * k_hi), and offset = k_hi - q_hi (sdpa_call_seq). The whole call (0
     * .. n_q, 0 .. n_k) as sdpa_call_of makes it. */
    int64_t q_lo, q_hi, k_lo, k_hi;
    bool bf16;  /* ATTN_PRECISION_BFLOAT16 */
    /* The forward's output is large and nothing reads it soon: the short
     * sequences' step writes its rows around the caches (non-temporal
     * stores, where they are whole 64-byte cache lines: the output on a
     * line boundary, its row stride and d_v multiples of 16 floats), which
     * spares the memory reading each line before it is overwritten. The one who sets
     * it fences the stores (sdpa_fence_streams) before the rows are read. */
    bool out_stream;
} sdpa_call;

/* Orders the non-temporal stores made so far (sdpa_call.out_stream) before
 * whatever follows: a plain store to the same rows, the end of a unit that
 * another thread's join waits for. */
static inline void sdpa_fence_streams(void)
{
#if defined(__x86_64__)
    __builtin_ia32_sfence();
#endif
}

/* "Unbounded": far beyond any n, yet p_i +- SDPA_FAR cannot overflow. */
#define SDPA_FAR ((int64_t)1 << 60)

/* Query rows [i0, i0 + rows) of head h in batch b, against keys [j0, j0 + cols). */
typedef struct {
    int64_t b, h;
    int64_t i0, rows;
    int64_t j0, cols;
} sdpa_tile;

/* q, k and v are of the element types p->dtype names. */
sdpa_call sdpa_call_of(const attn_sdpa_params *p, const void *q, const void *k,
                       const void *v);

/* The call's sequences: a ragged batch's, or one per batch entry. */
int64_t sdpa_seq_count(const attn_sdpa_params *p);
/* The call narrowed to sequence s, whose rows are those of batch entry
 * *b: its query rows, keys and offset (every position is counted within
 * the sequence). */
sdpa_call sdpa_call_seq(const sdpa_call *c, int64_t s, int64_t *b);

/* Offset of the first row of head h in batch b of a tensor with `heads`
 * heads of n rows of d, in the call's layout (rows then follow at the row
 * stride of the tensor). */
static inline int64_t sdpa_head_at(const attn_sdpa_params *p, int64_t b, int64_t h,
                                   int64_t heads, int64_t n, int64_t d)
{
    if (p->layout == ATTN_LAYOUT_BNHD)
        return (b * n * heads + h) * d;
    return (b * heads + h) * n * d;
}

/* q of head (b, h): [n_q, d_k]; k, v of its key/value head: [n_k, d_k],
 * [n_k, d_v]; rows at the strides ldq, ldk, ldv. (Inline, as the next
 * ones: a short sequence's item, a fraction of a microsecond, takes
 * several.) */
static inline const float *sdpa_head_q(const sdpa_call *c, int64_t b, int64_t h)
{
    const attn_sdpa_params *p = c->p;
    return c->q + sdpa_head_at(p, b, h, p->heads_q, p->n_q, p->d_k);
}
static inline const float *sdpa_head_k(const sdpa_call *c, int64_t b, int64_t h)
{
    const attn_sdpa_params *p = c->p;
    return c->k + sdpa_head_at(p, b, c->group == 1 ? h : h / c->group, p->heads_kv, p->n_k,
                               p->d_k);
}
static inline const float *sdpa_head_v(const sdpa_call *c, int64_t b, int64_t h)
{
    const attn_sdpa_params *p = c->p;
    return c->v + sdpa_head_at(p, b, c->group == 1 ? h : h / c->group, p->heads_kv, p->n_k,
                               p->d_v);
}
/* The same heads' rows as the caller gave them (float32 or bfloat16). */
sdpa_src sdpa_src_q(const sdpa_call *c, int64_t b, int64_t h);
sdpa_src sdpa_src_k(const sdpa_call *c, int64_t b, int64_t h);
sdpa_src sdpa_src_v(const sdpa_call *c, int64_t b, int64_t h);
/* s advanced by `at` elements. */
sdpa_src sdpa_src_at(sdpa_src s, int64_t at);
/* Element i of s as a float (a bfloat16 word widened exactly). */
float sdpa_src_value(sdpa_src s, int64_t i);
/* dst [count] = s [count] as floats. */
void sdpa_src_widen(sdpa_src s, int64_t count, float *dst);
/* Offsets of head (b, h)'s rows in out/dout (and dq: q's layout), and of
 * its key/value head's rows in dk and dv. */
static inline int64_t sdpa_head_o_at(const sdpa_call *c, int64_t b, int64_t h)
{
    const attn_sdpa_params *p = c->p;
    return sdpa_head_at(p, b, h, p->heads_q, p->n_q, p->d_v);
}

/* The keys [*begin, *end) of the call's sequence that some row of [i0,
 * i0 + rows) may see under the causal mask and the window (empty: *begin
 * == *end). */
void sdpa_key_range(const sdpa_call *c, int64_t i0, int64_t rows, int64_t *begin,
                    int64_t *end);
/* The query rows [*begin, *end) of the call's sequence that see some key
 * of [j0, j0 + cols). */
void sdpa_query_range(const sdpa_call *c, int64_t j0, int64_t cols, int64_t *begin,
                      int64_t *end);
/* Keys of row i visible within a tile from j0 of cols keys: [*lo, *hi),
 * relative to j0 and clipped to [0, cols]; none for a row outside the
 * call's sequence. */
static inline void sdpa_row_range(const sdpa_call *c, int64_t i, int64_t j0, int64_t cols,
                                  int64_t *lo, int64_t *hi)
{
    const int64_t pos = i + c->offset, l = pos - c->before - j0, h = pos + c->after + 1 - j0;
    *lo = l < 0 ? 0 : l > cols ? cols : l;
    *hi = h < 0 ? 0 : h > cols ? cols : h;
    if (*hi < *lo || i < c->q_lo || i >= c->q_hi)
        *hi = *lo;
}
/* slope_h of ALiBi for (b, h); 0 without. */
float sdpa_alibi_slope(const sdpa_call *c, int64_t b, int64_t h);

/* Adds the explicit mask's row (b, h, i), keys j0 .. j0 + cols, to the
 * scaled scores x: the bias, or -inf where the boolean mask hides a key. */
void sdpa_mask_row(const sdpa_call *c, int64_t b, int64_t h, int64_t i, int64_t j0,
                   float *x, int64_t cols);

/* ------------------------------------------------------------ work units */

/*
 * A call's work as units of about equal work, so that the threads share
 * it by its cost rather than by a count (one sequence of 4096 rows and
 * 500 of 20 keep every thread busy to the end). The work is a list of
 * items in a fixed order, sequence by sequence, each with an estimated
 * cost; a unit is a run of consecutive items, cut where the running cost
 * reaches an even share of the total. Tiny items (short sequences) are so
 * taken many to a unit, and a unit's overhead is paid once for them all.
 * The cuts depend on the costs only, never on the thread count, so that
 * what is merged unit by unit (statistics) comes out the same however many
 * threads run the units.
 */
typedef struct {
    int64_t s, i; /* item i of sequence s */
} sdpa_item_at;

/* At most this many units: a few hundred dispatches for any call. */
#define SDPA_UNITS_MAX 256
/* A forward's output from this size on (bytes) is written around the
 * caches where the kernels can (sdpa_call.out_stream): several times what
 * a core's caches hold, it would only push the inputs out of them. */
#define SDPA_STREAM_OUT_BYTES ((double)(16 << 20))
/* Units are not cut below this cost (FLOP-equivalents, a few microseconds
 * of one core), so that a small call is not split into dispatches that
 * cost more than their work. */
#define SDPA_UNIT_MIN_COST 1e6

typedef struct {
    const void *ctx;
    int64_t seqs;
    int64_t (*items)(const void *ctx, int64_t s);          /* items of sequence s */
    double (*cost)(const void *ctx, int64_t s, int64_t i); /* of item i of s */
    double (*seq_cost)(const void *ctx, int64_t s);        /* of all items of s */
    /* NULL, or seq_cost of every sequence ([seqs]), read in place of
     * seq_cost (a plan of many small sequences) */
    const double *seq_costs;
} sdpa_work;

typedef struct {
    int64_t count;                          /* >= 1 */
    sdpa_item_at start[SDPA_UNITS_MAX + 2]; /* unit u: [start[u], start[u + 1]) */
} sdpa_units;

/* Cuts w into units; returns the total cost. (attn_ names, as libattn.a
 * exports no other, because test_ragged calls these two.) */
double attn_units_plan(const sdpa_work *w, sdpa_units *u);

/* Calls fn(ctx, s, i) for every item of unit u, in order. */
void attn_unit_items(const sdpa_work *w, const sdpa_units *u, int64_t unit,
                     void (*fn)(void *ctx, int64_t s, int64_t i), void *ctx);

/* ------------------------------------------------------------ statistics */

/* Running statistics of one work unit; merged in unit order at the end (so
 * the result does not depend on which thread ran which unit). Means and
 * squared deviations are combined with Chan's formula, so the variance does
 * not suffer the cancellation of sum-of-squares. */
typedef struct {
    int64_t count;    /* visible scores */
    double mean, m2;  /* of the raw scores */
    double scaled_mean, scaled_m2; /* of the scaled (and soft-capped) scores */
    int64_t rows;     /* rows not fully masked */
    double entropy_sum, entropy_min, entropy_max, max_weight_sum;
} sdpa_stats_acc;

void sdpa_stats_init(sdpa_stats_acc *a);
/* The raw scores raw[j] of a row whose final scores x[j] are -inf where
 * hidden; their scaled values scale * raw[j], soft-capped when softcap > 0. */
void sdpa_stats_scores(sdpa_stats_acc *a, const float *raw, const float *x, int64_t cols,
                       float scale, float softcap);
void sdpa_stats_row(sdpa_stats_acc *a, double entropy, double max_weight);
void sdpa_stats_merge(sdpa_stats_acc *into, const sdpa_stats_acc *from);
void sdpa_stats_finish(const sdpa_stats_acc *a, attn_stats *out);

/* ------------------------------------------------------- forward state */

/* A forward unit's state for its query rows [rows]: running row maxima m
 * and sums l of the online softmax, and the unnormalised output rows.
 * Both sums run over every key of a row, n_k / KERN_BK tiles of them: l is
 * a double, and out a float partial that the caller folds into a double
 * sum every SDPA_FOLD_TILES tiles (blocked summation), so that a row of
 * 1e5 or 1e6 keys ends as close to the exact answer as a row of 1000. */
typedef struct {
    float *strip;          /* [KERN_MR_MAX, KERN_BK] scores, then P, of one strip */
    float *m;              /* [rows] */
    double *l;             /* [rows] */
    float *out;            /* [rows, d_v] = sum_j exp(x_j - m) v_j, row stride ldo,
                            * since the last fold */
    /* With weights: the unit's rows of weights [rows, n_k] and, per row and
     * key tile, the maximum P was taken against (sdpa_fwd_keep_weights). */
    float *weights;
    float *tile_max;       /* [rows, k_tiles] */
    int64_t k_tiles, kt;   /* key tiles of a row; the current one */
    bool accumulate;       /* false on the first tile after a fold: it writes out */
    /* With statistics: */
    sdpa_stats_acc *stats; /* NULL without */
    float scale, softcap;  /* for the scaled scores' statistics */
    double *ent;           /* [rows] sum_j exp(x_j - m) (x_j - m) */
    float *raw, *x;        /* [KERN_BK] copies of a row's raw and final scores */
    /* In bfloat16 (kern.h's words of two bfloat16): */
    const uint32_t *qb;    /* [rows, ceil(d_k / 2)] the unit's q rows (row stride ldqb) */
    int64_t ldqb;
    uint32_t *pb;          /* [KERN_MR_MAX, KERN_BK / 2] a strip's P */
} sdpa_fwd_state;

/* The forward kernels' hooks for the optional outputs, per strip row. */
void sdpa_fwd_stats_raw(sdpa_fwd_state *st, const float *s, int64_t cols);
void sdpa_fwd_stats_scores(sdpa_fwd_state *st, int64_t row, const float *x, int64_t cols,
                           float m_old, float m_new);
void sdpa_fwd_stats_entropy(sdpa_fwd_state *st, int64_t row, const float *p, int64_t cols,
                            float m_new);
/* P of the tile just folded in, relative to the running maximum at the
 * time, goes to the caller's weights; the forward rescales it at the end. */
void sdpa_fwd_keep_weights(const sdpa_call *c, sdpa_fwd_state *st, const sdpa_tile *t,
                           int64_t row, const float *p);

/* ------------------------------------------------------ backward state */

/* The key tile a backward unit owns, packed once for all its query rows. */
typedef struct {
    const float *kt, *vt; /* [d_k, ld], [d_v, ld]: k_t^T, v_t^T (kern_panel_ld) */
    int64_t ld;
    const float *k;       /* [cols, d_k] rows j0 .. of k (row stride ldk) */
    /* In bfloat16: k_t, v_t as kern_keys.kp [ceil(d_k / 2), KERN_BK] and
     * vp [ceil(d_v / 2), KERN_BK] (pairs of features), and kr
     * [KERN_BK / 2, d_k] (pairs of keys). */
    const uint32_t *kp, *vp, *kr;
} sdpa_bwd_keys;

/* A backward worker's view of one (query tile, key tile) pair. dq sums
 * over every key tile, dk and dv over every query tile (of every query
 * head of the group): long sums, added here in float and folded by the
 * caller into double sums every SDPA_FOLD_TILES key tiles (dq) or every
 * SDPA_FOLD_TILES * KERN_BK query rows (dk, dv) (blocked summation: the
 * error stays that of a few tiles' float sums at any length). */
typedef struct {
    float *p, *ds;                /* [KERN_BWD_BQ, KERN_BK] workspaces */
    float *capped;                /* [KERN_BK] workspace: tanh of a row, with softcap */
    const attn_softmax_row *rows; /* [rows] from the forward pass */
    const float *delta;           /* [rows] rowsum(dO * O) */
    const float *dout;            /* [rows, d_v] (row stride ldo) */
    float *dq;                    /* [rows, d_k] accumulated (ldq) */
    float *dk, *dv;               /* [cols, d_k], [cols, d_v] accumulated (ldk, ldv) */
    /* In bfloat16 (the tile's rows i0 .. start at an even row): */
    const uint32_t *qb, *dob;     /* [rows, ceil(d_k / 2)], [rows, ceil(d_v / 2)]: pairs
                                   * along q's and dO's rows (strides ldqb, lddob) */
    int64_t ldqb, lddob;
    const uint32_t *qr, *dor;     /* [ceil(rows / 2), d_k], [.., d_v]: pairs of rows */
    uint32_t *dsb;                /* [KERN_MR_MAX, KERN_BK / 2] workspace: a strip's dS */
    uint32_t *pp, *dsp;           /* [KERN_BWD_BQ / 2, KERN_BK] workspaces: P, dS by
                                   * pairs of rows */
} sdpa_bwd_state;

/* Tiles a float partial sum takes before it is folded into double. */
#define SDPA_FOLD_TILES 16

/* The forward's blocked summation of a unit's output rows (sdpa_forward.c;
 * the KV cache's prefill runs the same steps): sdpa_fold_rows after every
 * tile (folding every SDPA_FOLD_TILES tiles), sdpa_finish_row at the end. */
void sdpa_fold_rows(double *acc, float *m_tile, const float *m, const float *out, int64_t ldo,
                    int64_t rows, int64_t d_v, bool fold);
bool sdpa_finish_row(float *o, const double *acc, bool partial, double l, int64_t d_v);

/* ------------------------------------------------------ double precision */

/* Output row i of head (b, h) computed in double precision from scratch
 * (scores, softmax, weighted mean), written to out [d_v], and its weights
 * to weights [n_k] when not NULL (those of the keys of c's sequence; the
 * others are left as they are); returns the row's softmax maximum and
 * sum. For rows whose float accumulation overflowed. */
attn_softmax_row sdpa_forward_row_exact(const sdpa_call *c, int64_t b, int64_t h, int64_t i,
                                        float *out, float *weights);

/* ------------------------------------------------------------------ RoPE */

/* q_out = q rotated at the queries' positions, k_out = k at the keys' (the
 * inverse turn when `inverse`, for gradients); either pair may be NULL;
 * in place is fine. The layout and strides are c's. */
attn_status sdpa_rope(const sdpa_call *c, int threads, const float *q, const float *k,
                      float *q_out, float *k_out, bool inverse);

/* dst = src [heads, n, d] (contiguous) with row r of each head rotated at
 * position pos0 + r, at `base`, the same arithmetic as sdpa_rope. */
attn_status sdpa_rope_at(float base, int64_t d, int threads, const float *src, float *dst,
                         int64_t heads, int64_t n, int64_t pos0);
/* The inputs' rotation before the scores: q_rot = q and k_rot = k rotated
 * (bfloat16 words widened first: the rotation is float32), and c's q and k
 * made those copies. */
attn_status sdpa_rope_inputs(sdpa_call *c, int threads, float *q_rot, float *k_rot);

/* ------------------------------------------------------------ validation */

/* Checks the parameters of an SDPA call (and that weights [B,H_q,n_q,n_k]
 * is addressable when `with_weights`). */
attn_status sdpa_check_params(const attn_sdpa_params *p, bool with_weights,
                              attn_error *err);

/* Whether q, k, v and dout are all float32 (attn_sdpa_params.dtype). */
bool sdpa_dtypes_float32(const attn_sdpa_params *p);

/* Threads worth starting for `units` units of `flops` total work. */
int sdpa_threads(const attn_sdpa_params *p, int64_t units, double flops);

/* 64-byte aligned allocation of n items of `size` bytes, from the
 * allocator of attn_set_allocator: free it with sdpa_free, never free. */
void *sdpa_alloc(int64_t n, size_t size);
void sdpa_free(void *p);

#endif /* ATTN_SDPA_H */
