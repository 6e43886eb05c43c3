/*
 * libattn — the numerics of self-attention, as the chapter "Self-Attention
 * Mechanism" defines them: scaled dot-product attention (Eq. 10), the causal
 * mask (Eq. 14-15), multi-head attention (Eq. 12-13) and the gradients through
 * all of them (Eq. 16-18).
 *
 * Conventions
 *   - Every tensor is float32, row-major, contiguous, owned by the caller
 *     (ATTN_PRECISION_BFLOAT16 changes the arithmetic, not the tensors;
 *     there, attn_sdpa_forward_in and attn_sdpa_backward_in also read
 *     inputs given as bfloat16, attn_dtype).
 *   - SDPA tensors are 4-D: q [B, H_q, n_q, d_k], k [B, H_kv, n_k, d_k],
 *     v [B, H_kv, n_k, d_v], out [B, H_q, n_q, d_v]. Lower-rank callers use
 *     B = 1 and/or H = 1.
 *   - Query head h uses key/value head h / (H_q / H_kv) (grouped-query
 *     attention; H_kv == H_q is ordinary multi-head, H_kv == 1 multi-query).
 *   - Causal masking is aligned bottom-right: query i may see key j iff
 *     j <= i + (n_k - n_q).
 *   - A row with no visible key ("fully masked") yields zeros: output row,
 *     weight row and its gradients. Its log-sum-exp is -INFINITY.
 *   - Errors are values: every call returns ATTN_OK or an error code and, when
 *     `err` is not NULL, a message. Nothing aborts, prints or exits.
 *   - Cancellation: the parameters of a call may point `cancel` at a flag
 *     that another thread sets non-zero when the result is no longer wanted
 *     (a server whose client has gone). The call checks it between units of
 *     its work (a tile of 64 keys, a block of a projection's rows) and, once
 *     it is set, starts no more and returns ATTN_ERR_CANCELLED; its outputs
 *     are then unspecified. NULL: the call runs to its end.
 *
 * Memory: the default algorithm tiles over query and key blocks and keeps the
 * softmax online, so the n_q x n_k matrix is never formed; extra memory is
 * O((n_q + n_k) * d) per call. Only a non-NULL `weights` argument makes the
 * caller pay for the n_q x n_k matrix, and it is the caller's buffer.
 *
 * Threads: each call runs its independent work (batch x head x query tile)
 * on at most `threads` threads, the calling thread and helper threads, and
 * is safe to call from many threads at once. Helpers are started on first
 * need and kept, blocked while idle, for later calls; they run at the
 * scheduling policy and nice value of the thread that calls, and are
 * stopped at exit. libattn keeps OpenBLAS itself single-threaded (it calls
 * openblas_set_num_threads(1) once, on first use), so that `threads` is the
 * whole of the parallelism and the cores are never oversubscribed.
 */
#ifndef ATTN_H
#define ATTN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    ATTN_OK = 0,
    ATTN_ERR_INVALID = 1,   /* shapes or options that do not fit together */
    ATTN_ERR_NOMEM = 2,     /* an allocation failed */
    ATTN_ERR_CANCELLED = 3, /* *cancel was set during the call (see below) */
} attn_status;

typedef struct {
    attn_status status;
    char message[240];
} attn_error;

/* ------------------------------------------------------------------ masks */

typedef enum {
    ATTN_MASK_NONE = 0,
    ATTN_MASK_BOOL, /* allowed[...] != 0: the query may attend to the key */
    ATTN_MASK_BIAS, /* bias[...] is added to the scaled score: finite values, or
                     * -INFINITY, which hides the key exactly as a boolean false
                     * (weight 0, and not counted in the statistics) */
} attn_mask_kind;

/*
 * An explicit mask, read through element strides over the logical shape
 * [B, H_q, n_q, n_k]; a stride of 0 broadcasts that dimension.
 * Element (b, h, i, j) is at index b*stride[0] + h*stride[1] + i*stride[2] +
 * j*stride[3] of `allowed` (BOOL) or `bias` (BIAS).
 */
typedef struct {
    attn_mask_kind kind;
    const uint8_t *allowed;
    const float *bias;
    int64_t stride[4];
} attn_mask;

/*
 * Sets mask->stride for a contiguous mask of `rank` (0..4) dimensions `shape`,
 * broadcast by NumPy rules (shapes aligned on the right; a dimension must be
 * equal or 1) to [batch, heads, n_q, n_k]. Returns ATTN_ERR_INVALID when the
 * shapes do not broadcast.
 */
attn_status attn_mask_broadcast(attn_mask *mask, int rank, const int64_t *shape,
                                int64_t batch, int64_t heads, int64_t n_q,
                                int64_t n_k, attn_error *err);

/* ------------------------------------------------------------- statistics */

/*
 * The chapter's variance analysis (Theorem 1, Corollary 1), over the entries
 * that are not masked (causal, boolean, or a bias of -inf; a finite bias
 * masks nothing):
 * mean and population variance of the raw scores S = Q K^T and of the scaled
 * scores scale * S (bias not included); and, over the rows that are not fully
 * masked, the entropy of each weight row in nats and each row's largest
 * weight. When a count is 0 the values that depend on it are 0.
 */
typedef struct {
    double scores_mean, scores_var;
    double scaled_mean, scaled_var;
    double entropy_mean, entropy_min, entropy_max;
    double max_weight_mean;
    int64_t scores_count; /* entries not masked */
    int64_t rows_count;   /* rows not fully masked */
} attn_stats;

/* ---------------------------------------------- scaled dot-product (SDPA) */

/*
 * Where the heads of a tensor are. ATTN_LAYOUT_BHND (the default) is the
 * conventions' [B, H, n, d]: a head is n contiguous rows. ATTN_LAYOUT_BNHD
 * is [B, n, H, d] (FlashAttention's (batch, seqlen, nheads, headdim)): each
 * row of a sequence holds every head side by side, as a projection
 * x W [B, n, H*d] leaves them, so multi-head attention needs no copies. The
 * layout applies to q, k, v, out and their gradients; rows, weights and the
 * mask are always indexed [B, H_q, n_q(, n_k)].
 */
typedef enum {
    ATTN_LAYOUT_BHND = 0,
    ATTN_LAYOUT_BNHD = 1,
} attn_layout;

/*
 * The attention variants of the field (all off when zero). Positions are
 * aligned bottom-right, as the causal mask is: query row i sits at position
 * p_i = i + n_k - n_q, key j at j. The final score of (i, j) is
 *   x = softcap(scale * q_i . k_j) - slope_h * |p_i - j| + bias_ij
 * (hidden keys: -inf), with q and k rotated first when rope_base > 0.
 */
typedef struct {
    /* Sliding window (FlashAttention's window_size), when `window`: query i
     * sees key j only if p_i - window_left <= j <= p_i + window_right; -1
     * leaves that side unbounded. Combines with causal (which caps the
     * right side at 0) and the masks. Key tiles wholly outside are skipped. */
    bool window;
    int64_t window_left, window_right;
    /* ALiBi (FlashAttention's convention): slope_h = alibi_slopes[b *
     * alibi_batch_stride + h] for query head h; a stride of 0 shares one
     * slope per head across the batch ([H_q]), H_q gives [B, H_q]. NULL: none. */
    const float *alibi_slopes;
    int64_t alibi_batch_stride;
    /* Logit soft-capping (Gemma 2), when > 0: the scaled score s becomes
     * softcap * tanh(s / softcap), before ALiBi and the masks. */
    float softcap;
    /* Rotary position embedding, when > 0: q and k are rotated before the
     * scores in the rotate-half convention (GPT-NeoX, Hugging Face Llama):
     * for t < d_k/2 the pair (x_t, x_{t + d_k/2}) at position p turns by the
     * angle p * rope_base^(-2t/d_k) (computed in double). d_k must be even.
     * Gradients are with respect to the q and k given, before rotation. */
    float rope_base;
} attn_variants;

/*
 * The arithmetic of the attention's matrix products.
 *
 * ATTN_PRECISION_FLOAT32 (the default, 0): float32 throughout.
 *
 * ATTN_PRECISION_BFLOAT16: the products take bfloat16 operands and
 * accumulate in float32, as bfloat16 hardware runs them; everything else
 * stays float32. Exactly:
 *   - scores S = q k^T from q and k rounded to bfloat16 (attn_bf16_round;
 *     with RoPE, after the rotation, which is float32);
 *   - the softmax in float32 (scale, soft cap, ALiBi, mask, maxima, exp,
 *     sums), FlashAttention's online softmax over blocks of 64 keys (keys
 *     64t .. 64t + 63): block t's weights p_ij = bf16(exp(x_ij - m_i(t)))
 *     with m_i(t) the row's largest final score in blocks 0 .. t, the
 *     row's sum l_i the sum of these rounded weights (earlier blocks'
 *     rescaled by exp(m_i(t-1) - m_i(t)) as the maximum grows);
 *   - out_i = sum_j p_ij bf16(v_j) / l_i, the products with v on bfloat16
 *     operands accumulated in float32 (rescaled as l_i is);
 *   - backward: P = exp(x - m) / l and dS = P (dP - delta) (with the scale
 *     and the soft cap's derivative) in float32 from the forward's rows;
 *     the five products S = q k^T, dP = dO v^T, dV = P^T dO, dQ = dS k,
 *     dK = dS^T q on bfloat16 operands (q, k, v, dO, P, dS rounded),
 *     accumulated in float32.
 * Each product is the AVX512_BF16 instruction vdpbf16ps's: per element of
 * the result, the summed index taken in pairs (lo, hi), pair by pair,
 * acc += a_hi b_hi, then acc += a_lo b_lo, each a float32 fused
 * multiply-add rounded to nearest even, with subnormal inputs read as zero
 * and subnormal results flushed to zero. The pairs: over the d features of
 * q k^T and dO v^T, feature t with t + ceil(d / 2); over a block's n keys
 * (P v, dS k), key t with t + ceil(n / 2); over query rows (dV, dK), rows 2u
 * and 2u + 1. Every way of running it
 * (attn_bf16()) gives exactly these bits, so bfloat16 results differ
 * between kernels only where float32 ones do (the order of the softmax's
 * sums, the exponential). The weights a caller asks for are the rounded
 * p_ij, normalised. Rows whose float32 sums overflow are redone in double
 * from the rounded q, k and v (weights not rounded), as in float32.
 */
typedef enum {
    ATTN_PRECISION_FLOAT32 = 0,
    ATTN_PRECISION_BFLOAT16 = 1,
} attn_precision;

/* x rounded to bfloat16 as ATTN_PRECISION_BFLOAT16 rounds its operands,
 * returned as the float of that value: to nearest, ties to even; float32
 * subnormals become zero of their sign (bfloat16 hardware reads them as
 * zero); finite values past bfloat16's largest (|x| >= 0x1.ffp127)
 * saturate to +-0x1.fep127 (3.3895e38); infinities and NaN stay. */
float attn_bf16_round(float x);

/*
 * The element type of an input of attn_sdpa_forward_in and
 * attn_sdpa_backward_in. ATTN_DTYPE_BFLOAT16 is a uint16_t word, the high
 * half of a float32 (sign, 8-bit exponent, 7 significand bits), as
 * torch.bfloat16 stores it: bfloat16 inputs go into the products as they
 * are (a subnormal read as zero of its sign, as bfloat16 hardware reads it,
 * and as attn_bf16_round would round its float32 value), with no float32
 * copy of the tensor; the results are the bits of the same call on the
 * inputs widened to float32. Only ATTN_PRECISION_BFLOAT16 takes them.
 */
typedef enum {
    ATTN_DTYPE_FLOAT32 = 0,
    ATTN_DTYPE_BFLOAT16 = 1,
} attn_dtype;

typedef struct {
    attn_dtype q, k, v, dout;
} attn_sdpa_dtypes;

/*
 * A ragged batch (FlashAttention's varlen convention): sequences of any
 * lengths packed one after another along the sequence axis, with no
 * padding. When seqs > 0, the query rows are `seqs` sequences, sequence s
 * holding rows cu_seqlens_q[s] .. cu_seqlens_q[s + 1] - 1 (so
 * cu_seqlens_q [seqs + 1] starts at 0, never decreases and ends at the
 * number of query rows); the keys and values likewise by cu_seqlens_k
 * (NULL: the same as cu_seqlens_q). Sequence s's queries attend only to
 * sequence s's keys, and every convention above holds within that pair:
 * the causal mask and the positions of the window, ALiBi and RoPE are
 * aligned bottom-right per sequence (query row r of s at position
 * r - cu_q[s] + len_k(s) - len_q(s), key j at j - cu_k[s]). A sequence may
 * be empty; a query whose key sequence is empty sees nothing (a fully
 * masked row: zeros, lse -inf). Tensors keep their packed shapes: the
 * explicit mask, the rows and the weights are indexed by the packed rows
 * and keys, and the weights are 0 outside the sequences' blocks. Only the
 * blocks are computed, and only their pairs are counted as FLOPs. The
 * arrays are the caller's and are read during the call only.
 */
typedef struct {
    int64_t seqs;                /* 0: not ragged */
    const int64_t *cu_seqlens_q; /* [seqs + 1] */
    const int64_t *cu_seqlens_k; /* [seqs + 1], or NULL: cu_seqlens_q */
} attn_ragged;

typedef struct {
    int64_t batch;    /* B >= 1; 1 for a ragged batch */
    int64_t heads_q;  /* H_q >= 1 */
    int64_t heads_kv; /* H_kv >= 1, divides H_q */
    int64_t n_q, n_k; /* >= 1 */
    int64_t d_k, d_v; /* >= 1 */
    float scale;      /* finite, > 0; the chapter's default is attn_default_scale(d_k) */
    bool causal;
    attn_mask mask; /* kind ATTN_MASK_NONE for none */
    int threads;    /* >= 1 */
    attn_layout layout;
    attn_variants variants;
    attn_ragged ragged; /* seqs 0 for one sequence per batch entry */
    /* With weights: false, weights is [B, H_q, n_q, n_k], each head's;
     * true, it is [B, n_q, n_k], their mean over the query heads, summed
     * block of rows by block of rows (in double) without the per-head
     * tensor ever existing. */
    bool weights_mean;
    const atomic_int *cancel; /* NULL, or stop once non-zero (see the top) */
    attn_precision precision; /* ATTN_PRECISION_FLOAT32 (0) unless set */
    /* Of q, k, v and dout as the _in entry points read them; all float32
     * (0) unless set, and then attn_sdpa_forward and attn_sdpa_backward
     * refuse the call (their pointers are float). */
    attn_sdpa_dtypes dtype;
} attn_sdpa_params;

/* 1 / sqrt(d_k) (Eq. 7). */
float attn_default_scale(int64_t d_k);

/*
 * What the backward pass needs of each query row's softmax, kept from the
 * forward: the row's largest final score `max` and `sum` = the sum over the
 * visible keys of exp(score - max). The two are kept apart rather than as one
 * log-sum-exp (max + log sum), so that the backward rebuilds every weight as
 * exp(score - max) / sum exactly as the forward made it, however large max
 * is: a constant shift of a whole row (a -1e20 bias, scores near 1e4) gives
 * the same gradients as no shift. A fully masked row has max = -INFINITY and
 * sum = 0.
 */
typedef struct {
    float max;
    float sum;
} attn_softmax_row;

/* The row's log-sum-exp, max + log(sum) in double; -INFINITY for a fully
 * masked row. */
double attn_softmax_lse(attn_softmax_row row);

/*
 * Forward (Eq. 10): out = softmax(scale * q k^T + mask) v.
 *   q [B,H_q,n_q,d_k], k [B,H_kv,n_k,d_k], v [B,H_kv,n_k,d_v] -> out [B,H_q,n_q,d_v]
 * Optional outputs (NULL to skip):
 *   rows    [B,H_q,n_q]      each row's softmax maximum and sum (above);
 *                            attn_sdpa_backward needs them.
 *   weights [B,H_q,n_q,n_k]  the attention weights A (materialised only here);
 *                            [B,n_q,n_k], their head mean, with weights_mean
 *   stats                    see attn_stats
 * An output is the weighted mean of finite values of v, so it is finite even
 * when the weighted sum on the way overflows float32 (v near 3e38): such
 * rows are recomputed in double precision.
 */
attn_status attn_sdpa_forward(const attn_sdpa_params *p, const float *q,
                              const float *k, const float *v, float *out,
                              attn_softmax_row *rows, float *weights, attn_stats *stats,
                              attn_error *err);

/*
 * Backward (Eq. 16-18), recomputing the scores tile by tile.
 *   dout [B,H_q,n_q,d_v], out and rows as returned by attn_sdpa_forward
 *   -> dq [B,H_q,n_q,d_k], dk [B,H_kv,n_k,d_k], dv [B,H_kv,n_k,d_v]
 * The gradients are written, not accumulated. For grouped-query attention
 * dk and dv sum over the query heads that share each key/value head.
 * Results are deterministic for a given kernel and thread count.
 */
attn_status attn_sdpa_backward(const attn_sdpa_params *p, const float *q,
                               const float *k, const float *v,
                               const float *out, const attn_softmax_row *rows,
                               const float *dout, float *dq, float *dk,
                               float *dv, attn_error *err);

/*
 * attn_sdpa_forward and attn_sdpa_backward with q, k, v (and dout) of the
 * element types p->dtype names (float or uint16_t words), the other
 * arguments as theirs.
 */
attn_status attn_sdpa_forward_in(const attn_sdpa_params *p, const void *q, const void *k,
                                 const void *v, float *out, attn_softmax_row *rows,
                                 float *weights, attn_stats *stats, attn_error *err);
attn_status attn_sdpa_backward_in(const attn_sdpa_params *p, const void *q, const void *k,
                                  const void *v, const float *out,
                                  const attn_softmax_row *rows, const void *dout, float *dq,
                                  float *dk, float *dv, attn_error *err);

/* Nominal FLOPs of the forward pass: the two matrix products,
 * 2 * B * H_q * n_q * n_k * (d_k + d_v), with no discount for masking
 * (a window counts its band; a ragged batch the pairs of its sequences'
 * blocks, len_q(s) * len_k(s) summed). The backward pass costs 2.5 times
 * as much (five products instead of two). */
double attn_sdpa_flops(const attn_sdpa_params *p);

/*
 * The most bytes attn_sdpa_forward (and, when `backward`, the
 * attn_sdpa_backward after it) allocates for p beyond the caller's tensors,
 * with weights and statistics asked for or not: known before the call, so
 * that a caller can bound a request's memory before anything is allocated.
 * An upper bound (every worker p->threads allows).
 */
double attn_sdpa_workspace(const attn_sdpa_params *p, bool weights, bool stats,
                           bool backward);

/* ------------------------------------------------ multi-head attention */

/*
 * Multi-head attention (Eq. 12-13) in the chapter's convention: projections
 * multiply on the right, Q = X W_Q + b_Q, so a weight is [d_in, d_out].
 * Head i uses the i-th contiguous block of columns of each projection.
 */
typedef struct {
    int64_t batch;          /* B >= 1; 1 for a ragged batch */
    int64_t n;              /* query positions: rows of x */
    int64_t m;              /* key positions: rows of context (n without context) */
    int64_t d_model;        /* columns of x */
    int64_t d_ctx;          /* columns of context (d_model without context) */
    int64_t heads;          /* h >= 1 */
    int64_t kv_heads;       /* h_kv >= 1, divides h */
    int64_t d_k, d_v;       /* per-head widths */
    int64_t d_out;          /* columns of w_o; h*d_v when w_o is absent */
    float scale;            /* finite, > 0 */
    bool causal;
    attn_mask mask;         /* strides over [B, h, n, m] */
    attn_variants variants; /* applied per head, after the projections */
    int threads;            /* >= 1 */
    /* A ragged batch (attn_ragged): cu_seqlens_q splits the rows of x,
     * cu_seqlens_k those of context (NULL: as x's, which self-attention
     * needs). The projections see every row alike; the attention is
     * per sequence, as attn_sdpa_params.ragged. */
    attn_ragged ragged;
    bool weights_mean;      /* weights is [B, n, m], the mean over the heads */
    const atomic_int *cancel; /* NULL, or stop once non-zero (see the top) */
    /* Of the attention between the projections; the projections (x W and
     * the output's o W_O, and their gradients) stay float32 OpenBLAS
     * products whatever it is. */
    attn_precision precision;
} attn_mha_params;

typedef struct {
    const float *x;       /* [B, n, d_model] */
    const float *context; /* [B, m, d_ctx], or NULL for self-attention */
    const float *w_q;     /* [d_model, h*d_k] */
    const float *w_k;     /* [d_ctx, h_kv*d_k] */
    const float *w_v;     /* [d_ctx, h_kv*d_v] */
    const float *w_o;     /* [h*d_v, d_out], or NULL: out is the heads concatenated */
    const float *b_q;     /* [h*d_k] or NULL */
    const float *b_k;     /* [h_kv*d_k] or NULL */
    const float *b_v;     /* [h_kv*d_v] or NULL */
    const float *b_o;     /* [d_out] or NULL (must be NULL without w_o) */
} attn_mha_inputs;

/* Gradients, each the shape of its input; set a pointer to NULL to skip it.
 * `context` must be NULL when the inputs have no context. */
typedef struct {
    float *x, *context;
    float *w_q, *w_k, *w_v, *w_o;
    float *b_q, *b_k, *b_v, *b_o;
} attn_mha_grads;

/*
 * Forward: out [B, n, d_out]; optional (NULL to skip) rows [B, h, n] (each
 * query row's softmax maximum and sum, per head), weights [B, h, n, m] (per
 * head; [B, n, m], their mean, with weights_mean) and stats (over every
 * head), as for attn_sdpa_forward.
 */
attn_status attn_mha_forward(const attn_mha_params *p, const attn_mha_inputs *in,
                             float *out, attn_softmax_row *rows, float *weights,
                             attn_stats *stats, attn_error *err);

/*
 * Backward: given dout [B, n, d_out], writes every non-NULL gradient in `g`.
 * Stateless: it recomputes the projections and the forward pass it needs.
 */
attn_status attn_mha_backward(const attn_mha_params *p, const attn_mha_inputs *in,
                              const float *dout, const attn_mha_grads *g,
                              attn_error *err);

/*
 * Forward and backward in one call: out (and weights, stats) as
 * attn_mha_forward, and the gradients as attn_mha_backward, without computing
 * the projections and the attention twice.
 */
attn_status attn_mha_forward_backward(const attn_mha_params *p, const attn_mha_inputs *in,
                                      float *out, attn_softmax_row *rows, float *weights,
                                      attn_stats *stats, const float *dout,
                                      const attn_mha_grads *g, attn_error *err);

/* Nominal FLOPs of the forward pass: projections, attention, output projection. */
double attn_mha_flops(const attn_mha_params *p);

/* The most bytes attn_mha_forward (or, when `backward`,
 * attn_mha_forward_backward) allocates for p beyond the caller's tensors:
 * the projections of every head, the attention's workspace, and the
 * projections' gradients. has_w_o: the inputs have an output projection. */
double attn_mha_workspace(const attn_mha_params *p, bool has_w_o, bool weights, bool stats,
                          bool backward);

/* --------------------------------------------------------------- KV caches */

/*
 * A KV cache holds the keys and values of one sequence, so that decoding
 * (one new token, or a few, at a time) attends over everything produced so
 * far without the caller sending it again:
 *   keys   [num_kv_heads, length, head_dim]
 *   values [num_kv_heads, length, value_dim]
 * stored as float32, float16 or bfloat16 (converted on append, rounded to
 * nearest even; the kernels read the pages as stored, widening exactly).
 *
 * Pages. The positions are kept in pages of ATTN_KV_PAGE positions of every
 * head: an append fills the last page and adds new ones, never moving what
 * is cached; a truncate frees whole pages; attn_kv_free frees everything.
 * Why 64 positions: it is the key tile of libattn's kernels, so a page
 * holds exactly one tile of every head. Inside it, head after head, each
 * head's keys are stored transposed, [head_dim, 64] (the k^T panel the
 * score products read with vectors along the keys: no horizontal sums
 * and, for float32, no packing), followed by its values [64, value_dim].
 * A page is one allocation that a decode step reads from end to end (512
 * KiB at 8 heads, head_dim = value_dim = 128 in float32, 256 KiB in
 * bfloat16): runs that long stream at about the memory's full speed, where
 * runs of one head's 32 KiB scattered over memory stream at about half of
 * it; and one page is also all the last, partly filled page can waste. A
 * new page is zeroed, so every byte a kernel may read is a finite number.
 *
 * Memory. attn_kv_bytes() is everything the cache holds: its pages, its
 * table of page pointers and its header. attn_kv_bytes_after_append() says,
 * before anything is allocated, exactly what attn_kv_bytes() will be after
 * an append succeeds, so a caller keeping a budget over many caches
 * reserves the difference first (and gives it back if the append fails);
 * after attn_kv_truncate() or attn_kv_free() it releases what the cache no
 * longer holds. The cache allocates nothing else: pages are whole
 * allocations of attn_kv_info.page_bytes each. A cache of n positions holds
 * ceil(n / 64) pages, less than one page more than
 * n * num_kv_heads * (head_dim + value_dim) * element bytes, plus its
 * bookkeeping (a header and 8 bytes per page of table, at most twice the
 * pages in use).
 *
 * RoPE. A cache stores keys as they will be attended: with rope, each key is
 * rotated at its absolute position (0, 1, ... in order of appending) when it
 * is appended, and each query at its own position when attending. The
 * cache remembers the base its keys were rotated with (0: none): the first
 * append into an empty cache sets it, and an append or attention that asks
 * for another is refused (ATTN_ERR_INVALID, the message says both), since
 * keys rotated at one base cannot be attended with another or without.
 *
 * Threads. A cache has no lock. attn_kv_forward, attn_kv_read and the
 * queries (attn_kv_info_get, attn_kv_length, attn_kv_bytes...) only read it and
 * may run together; attn_kv_append, attn_kv_truncate and attn_kv_free change
 * it and must not overlap any other call on the same cache (a server keeps
 * one lock, or one queue, per cache). Different caches share nothing.
 */

/* Positions per page. */
#define ATTN_KV_PAGE 64

typedef enum {
    ATTN_KV_FLOAT32 = 0,
    ATTN_KV_FLOAT16 = 1,  /* IEEE binary16: |x| < 65520 rounds to a finite value */
    ATTN_KV_BFLOAT16 = 2, /* float32's upper half: float32's range, 8 bits of precision */
} attn_kv_dtype;

/* 4, 2 or 2; 0 for a value that names no dtype. */
size_t attn_kv_dtype_size(attn_kv_dtype dtype);
/* "float32", "float16", "bfloat16"; NULL for a value that names no dtype. */
const char *attn_kv_dtype_name(attn_kv_dtype dtype);

typedef struct {
    int64_t num_kv_heads; /* >= 1 */
    int64_t head_dim;     /* d_k >= 1 (even, to be used with rope) */
    int64_t value_dim;    /* d_v >= 1 */
    attn_kv_dtype dtype;
} attn_kv_config;

typedef struct attn_kv_cache attn_kv_cache;

typedef struct {
    attn_kv_config config;
    int64_t length;    /* positions cached */
    int64_t pages;     /* ceil(length / ATTN_KV_PAGE) */
    size_t page_bytes; /* one page: ATTN_KV_PAGE * heads * (d_k + d_v) * element size */
    size_t bytes;      /* everything held: attn_kv_bytes() */
    float rope_base;   /* the keys were rotated with this base; 0: not rotated
                        * (meaningless while length is 0: the next append sets it) */
} attn_kv_info;

/* A new, empty cache (*cache stays NULL on failure), holding
 * attn_kv_bytes_empty(config) bytes. */
attn_status attn_kv_create(const attn_kv_config *config, attn_kv_cache **cache,
                           attn_error *err);
/* Frees the cache and every page (NULL is fine). */
void attn_kv_free(attn_kv_cache *cache);

/* What a cache of this configuration holds before its first append; 0 for
 * a configuration attn_kv_create refuses. */
size_t attn_kv_bytes_empty(const attn_kv_config *config);

/* The cache's state (all zeros for a NULL cache), its length, its bytes. */
void attn_kv_info_get(const attn_kv_cache *cache, attn_kv_info *info);
int64_t attn_kv_length(const attn_kv_cache *cache);
size_t attn_kv_bytes(const attn_kv_cache *cache);
/* attn_kv_bytes() after a successful append of n_new positions (n_new >= 0;
 * the current bytes for 0); -1 when n_new is negative or the result would
 * not fit in memory's addresses. The append allocates exactly the
 * difference. */
int64_t attn_kv_bytes_after_append(const attn_kv_cache *cache, int64_t n_new);

/*
 * Appends n_new positions after the cached ones:
 *   k [num_kv_heads, n_new, head_dim], v [num_kv_heads, n_new, value_dim]
 * (float32, contiguous, the caller's; copied, converted to the cache's
 * dtype). With rope_base > 0 key j is rotated at position length + j
 * first; rope_base must be the cache's (attn_kv_info.rope_base) unless the
 * cache is empty. All or nothing: a value that is not finite, or that the
 * dtype cannot hold (float16 beyond 65504 after rounding), is refused
 * (ATTN_ERR_INVALID, the message names the tensor and the element), and so
 * is a failed allocation (ATTN_ERR_NOMEM), and the cache is left as it was.
 * Touches only the last page and the new ones: its cost does not grow with
 * the length cached. n_new = 0 changes nothing.
 */
attn_status attn_kv_append(attn_kv_cache *cache, int64_t n_new, const float *k,
                           const float *v, float rope_base, attn_error *err);

/* Would attn_kv_append() at position `at` (the cache's length once a
 * truncate to `at` is done; at most the length) refuse the keys k for
 * what rope makes of them, a rotated key the dtype cannot hold? Changes
 * nothing: a caller that truncates and then appends checks first, so that
 * an append refused for its values leaves the cache untruncated. ATTN_OK
 * without rope, or when the keys are too small to overflow. */
attn_status attn_kv_append_check(const attn_kv_cache *cache, int64_t at, int64_t n_new,
                                 const float *k, float rope_base, attn_error *err);

/* Keeps the positions < length (a length at or beyond the cache's changes
 * nothing); frees the pages no longer needed, and the rope base too when
 * nothing is left. Fails only for a negative length. */
attn_status attn_kv_truncate(attn_kv_cache *cache, int64_t length, attn_error *err);

/* Copies positions [start, start + n) out as float32 (exactly as stored:
 * rounded to the dtype, keys rotated when appended with rope):
 *   k [num_kv_heads, n, head_dim], v [num_kv_heads, n, value_dim]
 * either may be NULL. */
attn_status attn_kv_read(const attn_kv_cache *cache, int64_t start, int64_t n, float *k,
                         float *v, attn_error *err);

typedef struct {
    int64_t heads_q; /* H_q >= 1, a multiple of the cache's num_kv_heads (GQA) */
    int64_t n_q;     /* query rows per head >= 1 */
    float scale;     /* finite, > 0; usually attn_default_scale(head_dim) */
    /* Positions are aligned bottom-right as in attn_sdpa_forward: query i
     * sits at position length - n_q + i (the last query at the last cached
     * position). Causal: it sees keys j <= its position; otherwise all. */
    bool causal;
    /* window, alibi_slopes ([H_q]; alibi_batch_stride is not read), softcap
     * and rope_base as attn_sdpa_forward defines them, at those positions.
     * rope_base must be the cache's: queries are rotated here, keys were
     * rotated when appended. */
    attn_variants variants;
    int threads; /* >= 1 */
    /* ATTN_PRECISION_FLOAT32 (0): the paged kernels below. BFLOAT16: the
     * products of attn_sdpa_forward's ATTN_PRECISION_BFLOAT16 over the
     * cached keys and values, bit for bit, at any length and thread count:
     * each page is joined into the bfloat16 kernel's words as it is read
     * (a bfloat16 cache's words as stored, no float32 copy; O(page) memory
     * per thread), and attn_sdpa_forward's blocks of query rows run over
     * the pages. */
    attn_precision precision;
    const atomic_int *cancel; /* NULL, or stop once non-zero (see the top):
                               * checked before the work and then at every
                               * unit (a run of pages when decoding, each
                               * page when prefilling or with bfloat16) */
} attn_kv_params;

/*
 * Attention of q over every cached position:
 *   q [H_q, n_q, head_dim] -> out [H_q, n_q, value_dim], optional
 *   rows [H_q, n_q] (each row's softmax maximum and sum, as attn_sdpa_forward
 *   returns them; attn_softmax_lse gives the log-sum-exp).
 * The same numbers as attn_sdpa_forward over the cached keys and values (as
 * attn_kv_read returns them), with query head h reading key/value head
 * h / (H_q / num_kv_heads). An empty cache, like any row that sees no key,
 * gives zeros (and a softmax row {-INFINITY, 0}).
 *
 * How: with few query rows per key/value head (H_q / num_kv_heads * n_q <=
 * ATTN_KV_DECODE_ROWS), flash-decoding. The visible pages are cut into
 * runs of consecutive pages, which the threads share; each reads its pages
 * whole, each head's block once for all the query rows of that head's
 * group (every query head of the group, every query row), and keeps a
 * partial output with its softmax maximum and sum; the partials are then
 * merged as shards are through their log-sum-exp. Where the runs are fewer
 * than the threads want, the heads are shared out too, which changes no
 * row's arithmetic. The runs depend on the visible length only, never on
 * `threads`: results are the same for any thread count. Up to 16 pages of
 * visible keys are one run, and then the result is bit for bit
 * attn_sdpa_forward's (same tiles, same order of operations); longer, the
 * merge makes it differ from attn_sdpa_forward by float32 rounding
 * (tests/test_kvcache.c states the bound it holds).
 * With more rows (prefill), the tiled forward's own kernel runs over the
 * pages (float32 pages are its k^T panels as they are; float16 and
 * bfloat16 pages are widened one page at a time into a panel of the
 * worker's), bit for bit attn_sdpa_forward.
 *
 * Errors: ATTN_ERR_INVALID with a message that names what is wrong in the
 * words of these parameters (heads_q, n_q, scale, window..., "rope: ...");
 * ATTN_ERR_NOMEM when a workspace cannot be had. The cache is never
 * changed.
 */
#define ATTN_KV_DECODE_ROWS 64
attn_status attn_kv_forward(const attn_kv_cache *cache, const attn_kv_params *p,
                            const float *q, float *out, attn_softmax_row *rows,
                            attn_error *err);

/* Nominal FLOPs of attn_kv_forward, counted as attn_sdpa_flops counts them
 * (the window's band only); 0 for parameters it would refuse. */
double attn_kv_forward_flops(const attn_kv_cache *cache, const attn_kv_params *p);

/* An upper bound of the bytes attn_kv_forward allocates (beyond the
 * caller's q, out and rows) when a cache of `config` holds `length`
 * positions, for p->threads threads: with few rows, each run's partial
 * outputs (up to 64 runs of [H_q, n_q, value_dim]); with many, each
 * worker's tiles; with bfloat16 products, each worker's page panel and
 * the states of its rows. Known before the call, as
 * attn_sdpa_workspace is (0 for an empty cache or nonsense). */
double attn_kv_forward_workspace(const attn_kv_config *config, int64_t length,
                                 const attn_kv_params *p);

/* ----------------------------------------------------------- workspaces */

/*
 * Where a call's workspaces come from (attn_sdpa_workspace says how much):
 * by default aligned_alloc and free. A server that wants the memory of one
 * request to serve the next (kept mapped, its pages already in) gives its
 * own. alloc returns `bytes` bytes aligned to 64, or NULL (the call then
 * fails with ATTN_ERR_NOMEM); free takes what alloc gave, or NULL. Both are
 * called from the calling thread and from libattn's helper threads, at
 * once: they must be thread-safe. The caller's tensors and a KV cache's
 * pages are never allocated through them.
 */
typedef struct {
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p);
    void *ctx;
} attn_allocator;

/* Sets the allocator (NULL: the default again). Not while a call runs: set
 * it once, before the first call, and keep it while workspaces it gave may
 * still be freed. */
void attn_set_allocator(const attn_allocator *a);

/*
 * A helper that finishes its part of a call polls for the next call for a
 * few tens of microseconds before it blocks, since a next call often comes
 * at once (the backward pass's rounds, a decode step's merge). A caller
 * that knows no call will follow soon (a server between requests) says so
 * here: every helper polling now blocks at once, leaving its core to the
 * threads that want it (a low-priority helper spinning on a core delays a
 * thread woken there by the rest of its poll). Nothing else changes; the
 * next call wakes the helpers it wants.
 */
void attn_threads_rest(void);

/* ------------------------------------------------------------- kernels */

/*
 * libattn computes the attention tiles with micro-kernels of its own, one per
 * instruction set, chosen once per process: the best the CPU supports, or
 * the one the environment variable ATTN_KERNEL=generic|avx2|avx512 forces
 * (when the CPU can run it; otherwise the best available is used).
 */
typedef enum {
    ATTN_KERNEL_GENERIC = 0, /* portable C, always available */
    ATTN_KERNEL_AVX2,        /* AVX2 + FMA */
    ATTN_KERNEL_AVX512,      /* AVX-512F */
} attn_kernel_kind;

attn_kernel_kind attn_kernel(void);               /* the kernel in use */
const char *attn_kernel_name(void);               /* "generic", "avx2" or "avx512" */
const char *attn_kernel_kind_name(attn_kernel_kind kind);
bool attn_kernel_supported(attn_kernel_kind kind);/* can this CPU run it? */
bool attn_kernel_parse(const char *name, attn_kernel_kind *kind);
/* The kernel ATTN_KERNEL asked for (its name), or NULL when it is unset or
 * names no kernel. Differs from attn_kernel_name() when the CPU lacks it. */
const char *attn_kernel_forced(void);

/*
 * How this process runs the products of ATTN_PRECISION_BFLOAT16, chosen
 * once, after the kernel: with Intel's AMX tiles (tdpbf16ps) where the
 * avx512 kernel runs on a CPU that has AMX-BF16 and AVX512_BF16 and Linux
 * grants the tile state; else with the AVX512_BF16 instruction vdpbf16ps
 * where the avx512 kernel runs on a CPU that has it; otherwise emulated
 * (each vdpbf16ps step as two float32 fused multiply-adds, subnormals
 * flushed) by the kernel in use. The results are the same bits every way.
 * ATTN_BF16=emulated|avx512_bf16|amx forces one (when this kernel on this
 * CPU can run it; otherwise the choice stays the default and
 * attn_bf16_forced() says what was asked for).
 */
typedef enum {
    ATTN_BF16_EMULATED = 0,    /* float32 FMAs of the kernel in use */
    ATTN_BF16_AVX512_BF16 = 1, /* vdpbf16ps (AVX512_BF16) */
    ATTN_BF16_AMX = 2,         /* tdpbf16ps (AMX-BF16 tiles) */
} attn_bf16_kind;

attn_bf16_kind attn_bf16(void);               /* the path in use */
const char *attn_bf16_name(void);             /* "emulated", "avx512_bf16" or "amx" */
const char *attn_bf16_kind_name(attn_bf16_kind kind);
bool attn_bf16_supported(attn_bf16_kind kind);/* with this process's kernel, on this CPU */
bool attn_bf16_parse(const char *name, attn_bf16_kind *kind);
/* The path ATTN_BF16 asked for (its name), or NULL when unset or unknown. */
const char *attn_bf16_forced(void);

/* ---------------------------------------------------------- information */

const char *attn_version(void);      /* libattn's version, "1.0.0" */
const char *attn_blas_config(void);  /* openblas_get_config() */
const char *attn_blas_corename(void);/* openblas_get_corename() */

/* Whether OpenBLAS runs weaker kernels than the CPU supports (a generic SSE3
 * core on an AVX-512 CPU, say). cpu_features is a set of ATTN_CPU_* bits;
 * attn_cpu_features() reads this CPU's. attn_blas_shortfall() is pure: when
 * the kernels of `corename` (as openblas_get_corename() names them) use a
 * narrower instruction set than `cpu_features` offers, it writes one
 * sentence into msg (what that costs, which OPENBLAS_CORETYPE changes it)
 * and returns true; otherwise, or for a core name it does not know, false. */
enum {
    ATTN_CPU_AVX = 1u << 0,
    ATTN_CPU_AVX2 = 1u << 1,
    ATTN_CPU_FMA = 1u << 2,
    ATTN_CPU_AVX512 = 1u << 3, /* F, BW, DQ and VL, as OpenBLAS's SkylakeX kernels use */
};
unsigned attn_cpu_features(void);
bool attn_blas_shortfall(const char *corename, unsigned cpu_features, char *msg, size_t cap);

#endif /* ATTN_H */
