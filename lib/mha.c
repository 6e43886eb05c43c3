/*
 * The shared half of multi-head attention (Eq. 12-13): checking the shapes,
 * the head-blocked projections, and the projected attention that the forward
 * and the backward pass both start from.
 *
 *   x [B, n, d_model], context [B, m, d_ctx] (x itself for self-attention)
 *   q = x W_Q + b_Q        -> [B, h,    n, d_k]   (head i: columns i*d_k ..)
 *   k = context W_K + b_K  -> [B, h_kv, m, d_k]
 *   v = context W_V + b_V  -> [B, h_kv, m, d_v]
 *   o = attention(q, k, v) -> [B, h,    n, d_v]
 *   out = concat_i(o_i) W_O + b_O -> [B, n, d_out]
 */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"
#include "mha.h"

/* Rows of activations (and columns of the concatenated side) per task:
 * large enough that one GEMM amortises its packing, small enough that
 * n = 512 still feeds several threads. */
#define MHA_BLOCK 128

/* Below this many FLOPs a product runs on the calling thread: starting
 * threads costs tens of microseconds, as much as the product itself. */
#define MHA_PARALLEL_MIN_FLOPS 4e6

/* Largest element count we let a buffer have: bytes must fit a ptrdiff_t. */
#define MHA_MAX_ELEMS ((int64_t)(PTRDIFF_MAX / sizeof(float)))

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t blocks_of(int64_t count, int64_t block)
{
    return (count + block - 1) / block;
}

/* Head i's block of a weight, seen as the right-hand factor of the split
 * (cat -> heads, a d_cat x d_head matrix) or of the join (heads -> cat, a
 * d_head x d_cat matrix). Each weight is stored the natural way for one of
 * the two directions and is read transposed for the other. */
static const float *head_block(const mha_layout *l, const float *w,
                               mha_orient orient, int64_t head, int *ld)
{
    if (orient == MHA_W_IN) {
        *ld = (int)(l->heads * l->d_head);
        return w + head * l->d_head;
    }
    *ld = (int)l->d_cat;
    return w + head * l->d_head * l->d_cat;
}

/* Fills rows x width of c (row stride ld) with the vector `bias`. */
static void fill_rows(float *c, int64_t rows, int64_t width, int64_t ld,
                      const float *bias)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < width; j++)
            c[r * ld + j] = bias[j];
}

static attn_status run(const mha_layout *l, int64_t count,
                       void (*fn)(void *, int64_t, int), void *ctx,
                       attn_error *err)
{
    attn_status s = attn_parallel_for(l->threads, count, fn, ctx);
    if (s != ATTN_OK)
        return attn_fail(err, s, "out of memory starting threads for a projection");
    return ATTN_OK;
}

/* ------------------------------------------------------------------ split */

typedef struct {
    const mha_layout *l;
    const float *cat, *w, *bias;
    mha_orient orient;
    float *heads;
    int64_t row_blocks;
} split_task;

/* One (batch, head, row block): heads[b, i, r0:r1] = cat[b, r0:r1] · block_i. */
static void split_one(void *ctx, int64_t t, int worker)
{
    (void)worker;
    const split_task *st = ctx;
    const mha_layout *l = st->l;
    int64_t blk = t % st->row_blocks;
    int64_t head = (t / st->row_blocks) % l->heads;
    int64_t b = t / (st->row_blocks * l->heads);
    int64_t r0 = blk * MHA_BLOCK, rows = min64(l->rows - r0, MHA_BLOCK);
    const float *a = st->cat + (b * l->rows + r0) * l->d_cat;
    float *c = st->heads + ((b * l->heads + head) * l->rows + r0) * l->d_head;

    if (st->w == NULL) {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < l->d_head; j++)
                c[r * l->d_head + j] = a[r * l->d_cat + head * l->d_head + j];
        return;
    }
    float beta = 0.0f;
    if (st->bias) {
        fill_rows(c, rows, l->d_head, l->d_head, st->bias + head * l->d_head);
        beta = 1.0f;
    }
    int ldb;
    const float *bw = head_block(l, st->w, st->orient, head, &ldb);
    cblas_sgemm(CblasRowMajor, CblasNoTrans,
                st->orient == MHA_W_IN ? CblasNoTrans : CblasTrans,
                (int)rows, (int)l->d_head, (int)l->d_cat, 1.0f, a, (int)l->d_cat,
                bw, ldb, beta, c, (int)l->d_head);
}

attn_status mha_split(const mha_layout *l, const float *cat, const float *w,
                      mha_orient orient, const float *bias, float *heads,
                      attn_error *err)
{
    split_task st = {l, cat, w, bias, orient, heads,
                     blocks_of(l->rows, MHA_BLOCK)};
    return run(l, l->batch * l->heads * st.row_blocks, split_one, &st, err);
}

/* ------------------------------------------------------------------- join */

typedef struct {
    const mha_layout *l;
    const float *heads, *w, *bias;
    mha_orient orient;
    bool accumulate;
    float *cat;
    int64_t row_blocks, col_blocks;
} join_task;

/* One (batch, row block, column block) of cat:
 *   cat[b, r0:r1, c0:c1] (+)= Σ_i heads[b, i, r0:r1] · block_i[:, c0:c1]
 * The heads are summed inside one task so that no two tasks write the same
 * numbers; columns are split too so that a short sequence (one row block)
 * with a wide output still feeds every thread. */
static void join_one(void *ctx, int64_t t, int worker)
{
    (void)worker;
    const join_task *jt = ctx;
    const mha_layout *l = jt->l;
    int64_t cb = t % jt->col_blocks, rb = (t / jt->col_blocks) % jt->row_blocks;
    int64_t b = t / (jt->col_blocks * jt->row_blocks);
    int64_t r0 = rb * MHA_BLOCK, rows = min64(l->rows - r0, MHA_BLOCK);
    int64_t c0 = cb * MHA_BLOCK, cols = min64(l->d_cat - c0, MHA_BLOCK);
    float *c = jt->cat + (b * l->rows + r0) * l->d_cat + c0;

    for (int64_t head = 0; head < l->heads; head++) {
        const float *a = jt->heads + ((b * l->heads + head) * l->rows + r0) * l->d_head;
        if (jt->w == NULL) {
            /* concatenation: columns c0..c1 of cat are those of the heads
             * whose blocks overlap them */
            int64_t lo = head * l->d_head;
            int64_t j0 = lo > c0 ? lo : c0, j1 = min64(lo + l->d_head, c0 + cols);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = j0; j < j1; j++) {
                    float value = a[r * l->d_head + (j - lo)];
                    float *dst = c + r * l->d_cat + (j - c0);
                    *dst = jt->accumulate ? *dst + value : value;
                }
            continue;
        }
        int ldb;
        const float *bw = head_block(l, jt->w, jt->orient, head, &ldb);
        /* columns c0..c1 of block_i: later columns of W_O's row block, or
         * later rows of W_IN's column block (read transposed) */
        bw += jt->orient == MHA_W_OUT ? c0 : c0 * ldb;
        float beta = (head > 0 || jt->accumulate) ? 1.0f : 0.0f;
        cblas_sgemm(CblasRowMajor, CblasNoTrans,
                    jt->orient == MHA_W_OUT ? CblasNoTrans : CblasTrans,
                    (int)rows, (int)cols, (int)l->d_head, 1.0f, a,
                    (int)l->d_head, bw, ldb, beta, c, (int)l->d_cat);
    }
    if (jt->bias)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < cols; j++)
                c[r * l->d_cat + j] += jt->bias[c0 + j];
}

attn_status mha_join(const mha_layout *l, const float *heads, const float *w,
                     mha_orient orient, const float *bias, bool accumulate,
                     float *cat, attn_error *err)
{
    join_task jt = {l, heads, w, bias, orient, accumulate, cat,
                    blocks_of(l->rows, MHA_BLOCK), blocks_of(l->d_cat, MHA_BLOCK)};
    return run(l, l->batch * jt.row_blocks * jt.col_blocks, join_one, &jt, err);
}

/* ------------------------------------------------------- weight gradients */

typedef struct {
    const mha_layout *l;
    const float *cat, *heads;
    mha_orient orient;
    float *dw;
    int64_t cat_blocks;
} wgrad_task;

/* One (head, block of d_cat): the part of head i's weight block that touches
 * those d_cat features, summed over the batch (so tasks never share output). */
static void wgrad_one(void *ctx, int64_t t, int worker)
{
    (void)worker;
    const wgrad_task *wt = ctx;
    const mha_layout *l = wt->l;
    int64_t head = t / wt->cat_blocks, blk = t % wt->cat_blocks;
    int64_t c0 = blk * MHA_BLOCK, width = min64(l->d_cat - c0, MHA_BLOCK);

    for (int64_t b = 0; b < l->batch; b++) {
        const float *cat = wt->cat + b * l->rows * l->d_cat + c0;
        const float *hd = wt->heads + (b * l->heads + head) * l->rows * l->d_head;
        float beta = b > 0 ? 1.0f : 0.0f;
        if (wt->orient == MHA_W_IN) {
            /* dW[c0:c1, head block] += cat[b][:, c0:c1]ᵀ · heads[b, i] */
            float *c = wt->dw + c0 * l->heads * l->d_head + head * l->d_head;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)width,
                        (int)l->d_head, (int)l->rows, 1.0f, cat, (int)l->d_cat,
                        hd, (int)l->d_head, beta, c, (int)(l->heads * l->d_head));
        } else {
            /* dW[head block, c0:c1] += heads[b, i]ᵀ · cat[b][:, c0:c1] */
            float *c = wt->dw + head * l->d_head * l->d_cat + c0;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)l->d_head,
                        (int)width, (int)l->rows, 1.0f, hd, (int)l->d_head, cat,
                        (int)l->d_cat, beta, c, (int)l->d_cat);
        }
    }
}

attn_status mha_weight_grad(const mha_layout *l, const float *cat,
                            const float *heads, mha_orient orient, float *dw,
                            attn_error *err)
{
    wgrad_task wt = {l, cat, heads, orient, dw, blocks_of(l->d_cat, MHA_BLOCK)};
    return run(l, l->heads * wt.cat_blocks, wgrad_one, &wt, err);
}

/* --------------------------------------------------------- bias gradients */

/* Columns summed per pass: a double accumulator on the stack, and each row
 * read contiguously. Summing in double keeps B*rows terms accurate. */
#define MHA_SUM_CHUNK 64

/* db[j] = Σ over `count` matrices of [rows, width] (matrix t at src + t*step,
 * row stride ld) of column j. */
static void column_sums(const float *src, int64_t count, int64_t step,
                        int64_t rows, int64_t width, int64_t ld, float *db)
{
    for (int64_t j0 = 0; j0 < width; j0 += MHA_SUM_CHUNK) {
        int64_t cw = min64(width - j0, MHA_SUM_CHUNK);
        double acc[MHA_SUM_CHUNK] = {0};
        for (int64_t t = 0; t < count; t++)
            for (int64_t r = 0; r < rows; r++) {
                const float *row = src + t * step + r * ld + j0;
                for (int64_t j = 0; j < cw; j++)
                    acc[j] += row[j];
            }
        for (int64_t j = 0; j < cw; j++)
            db[j0 + j] = (float)acc[j];
    }
}

void mha_bias_grad_heads(const mha_layout *l, const float *dheads, float *db)
{
    int64_t per_head = l->rows * l->d_head;
    for (int64_t head = 0; head < l->heads; head++)
        column_sums(dheads + head * per_head, l->batch, l->heads * per_head,
                    l->rows, l->d_head, l->d_head, db + head * l->d_head);
}

void mha_bias_grad_cat(const mha_layout *l, const float *dcat, float *db)
{
    column_sums(dcat, 1, 0, l->batch * l->rows, l->d_cat, l->d_cat, db);
}

/* ------------------------------------------------------ checking the call */

/* *acc *= f, false when the product would exceed MHA_MAX_ELEMS. */
static bool mul_fits(int64_t *acc, int64_t f)
{
    if (f != 0 && *acc > MHA_MAX_ELEMS / f)
        return false;
    *acc *= f;
    return true;
}

static bool elems_fit(int64_t a, int64_t b, int64_t c, int64_t d)
{
    int64_t acc = 1;
    return mul_fits(&acc, a) && mul_fits(&acc, b) && mul_fits(&acc, c) &&
           mul_fits(&acc, d);
}

static attn_status check_dims(const attn_mha_params *p, bool has_context,
                              attn_error *err)
{
    const struct { const char *name; int64_t value; } dims[] = {
        {"batch", p->batch},     {"n", p->n},         {"m", p->m},
        {"d_model", p->d_model}, {"d_ctx", p->d_ctx}, {"heads", p->heads},
        {"kv_heads", p->kv_heads}, {"d_k", p->d_k},   {"d_v", p->d_v},
        {"d_out", p->d_out},
    };
    /* Every size is also a BLAS dimension or leading dimension (an int). */
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].value < 1 || dims[i].value > INT_MAX)
            return attn_fail(err, ATTN_ERR_INVALID,
                             "multi-head attention: %s must be in [1, %d], got %lld",
                             dims[i].name, INT_MAX, (long long)dims[i].value);
    if (p->heads % p->kv_heads != 0)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "multi-head attention: kv_heads=%lld does not divide heads=%lld",
                         (long long)p->kv_heads, (long long)p->heads);
    if (!has_context && (p->m != p->n || p->d_ctx != p->d_model))
        return attn_fail(err, ATTN_ERR_INVALID,
                         "self-attention (no context) needs m == n and d_ctx == d_model, "
                         "got m=%lld n=%lld d_ctx=%lld d_model=%lld",
                         (long long)p->m, (long long)p->n, (long long)p->d_ctx,
                         (long long)p->d_model);
    if (p->threads < 1)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "multi-head attention: threads must be >= 1, got %d", p->threads);
    if (!isfinite(p->scale) || !(p->scale > 0.0f))
        return attn_fail(err, ATTN_ERR_INVALID,
                         "multi-head attention: scale must be finite and > 0, got %g",
                         (double)p->scale);

    /* Widths of the concatenated heads are leading dimensions too. */
    const struct { const char *name; int64_t heads, width; } widths[] = {
        {"heads*d_k", p->heads, p->d_k},    {"heads*d_v", p->heads, p->d_v},
        {"kv_heads*d_k", p->kv_heads, p->d_k}, {"kv_heads*d_v", p->kv_heads, p->d_v},
    };
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (widths[i].heads > INT_MAX / widths[i].width)
            return attn_fail(err, ATTN_ERR_INVALID,
                             "multi-head attention: %s = %lld*%lld exceeds %d",
                             widths[i].name, (long long)widths[i].heads,
                             (long long)widths[i].width, INT_MAX);

    const struct { const char *name; int64_t a, b, c, d; } sizes[] = {
        {"x", p->batch, p->n, p->d_model, 1},
        {"context", p->batch, p->m, p->d_ctx, 1},
        {"w_q", p->d_model, p->heads, p->d_k, 1},
        {"w_k", p->d_ctx, p->kv_heads, p->d_k, 1},
        {"w_v", p->d_ctx, p->kv_heads, p->d_v, 1},
        {"w_o", p->heads, p->d_v, p->d_out, 1},
        {"out", p->batch, p->n, p->d_out, 1},
        {"q", p->batch, p->heads, p->n, p->d_k},
        {"k", p->batch, p->kv_heads, p->m, p->d_k},
        {"v", p->batch, p->kv_heads, p->m, p->d_v},
        {"the attention output", p->batch, p->heads, p->n, p->d_v},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (!elems_fit(sizes[i].a, sizes[i].b, sizes[i].c, sizes[i].d))
            return attn_fail(err, ATTN_ERR_INVALID,
                             "multi-head attention: %s would have too many elements",
                             sizes[i].name);
    return ATTN_OK;
}

static attn_status check_inputs(const attn_mha_params *p, const attn_mha_inputs *in,
                                attn_error *err)
{
    const struct { const char *name; const float *ptr; } required[] = {
        {"x", in->x}, {"w_q", in->w_q}, {"w_k", in->w_k}, {"w_v", in->w_v},
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (required[i].ptr == NULL)
            return attn_fail(err, ATTN_ERR_INVALID,
                             "multi-head attention: %s is required", required[i].name);
    if (in->w_o == NULL && in->b_o != NULL)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "multi-head attention: b_o is given without w_o");
    if (in->w_o == NULL && p->d_out != p->heads * p->d_v)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "multi-head attention without w_o outputs the concatenated heads: "
                         "d_out must be heads*d_v = %lld, got %lld",
                         (long long)(p->heads * p->d_v), (long long)p->d_out);
    switch (p->mask.kind) {
    case ATTN_MASK_NONE:
        break;
    case ATTN_MASK_BOOL:
        if (p->mask.allowed == NULL)
            return attn_fail(err, ATTN_ERR_INVALID,
                             "multi-head attention: boolean mask without data");
        break;
    case ATTN_MASK_BIAS:
        if (p->mask.bias == NULL)
            return attn_fail(err, ATTN_ERR_INVALID,
                             "multi-head attention: bias mask without data");
        break;
    default:
        return attn_fail(err, ATTN_ERR_INVALID,
                         "multi-head attention: unknown mask kind %d", (int)p->mask.kind);
    }
    return ATTN_OK;
}

attn_status mha_prepare(const attn_mha_params *p, const attn_mha_inputs *in,
                        bool want_weights, mha_state *st, attn_error *err)
{
    *st = (mha_state){0};
    if (p == NULL || in == NULL)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "multi-head attention: params and inputs are required");
    attn_status s = check_dims(p, in->context != NULL, err);
    if (s == ATTN_OK)
        s = check_inputs(p, in, err);
    if (s != ATTN_OK)
        return s;
    if (want_weights && !elems_fit(p->batch, p->heads, p->n, p->m))
        return attn_fail(err, ATTN_ERR_INVALID,
                         "multi-head attention: weights [B, h, n, m] would have too many elements");

    st->sdpa = (attn_sdpa_params){
        .batch = p->batch, .heads_q = p->heads, .heads_kv = p->kv_heads,
        .n_q = p->n, .n_k = p->m, .d_k = p->d_k, .d_v = p->d_v,
        .scale = p->scale, .causal = p->causal, .mask = p->mask,
        .threads = p->threads,
    };
    /* One decision for every product of the call, from the largest of them. */
    double flops = attn_mha_flops(p) - attn_sdpa_flops(&st->sdpa);
    int threads = flops < MHA_PARALLEL_MIN_FLOPS ? 1 : p->threads;

    st->lq = (mha_layout){p->batch, p->n, p->heads, p->d_model, p->d_k, threads};
    st->lk = (mha_layout){p->batch, p->m, p->kv_heads, p->d_ctx, p->d_k, threads};
    st->lv = (mha_layout){p->batch, p->m, p->kv_heads, p->d_ctx, p->d_v, threads};
    st->lo = (mha_layout){p->batch, p->n, p->heads, p->d_out, p->d_v, threads};
    st->ctx = in->context ? in->context : in->x;
    return ATTN_OK;
}

static float *alloc_floats(int64_t a, int64_t b, int64_t c, int64_t d)
{
    return malloc((size_t)(a * b * c * d) * sizeof(float));
}

attn_status mha_attend(const attn_mha_params *p, const attn_mha_inputs *in,
                       mha_state *st, bool want_lse, float *weights,
                       attn_stats *stats, attn_error *err)
{
    st->q = alloc_floats(p->batch, p->heads, p->n, p->d_k);
    st->k = alloc_floats(p->batch, p->kv_heads, p->m, p->d_k);
    st->v = alloc_floats(p->batch, p->kv_heads, p->m, p->d_v);
    st->o = alloc_floats(p->batch, p->heads, p->n, p->d_v);
    if (want_lse)
        st->lse = malloc((size_t)(p->batch * p->heads * p->n) * sizeof *st->lse);
    if (!st->q || !st->k || !st->v || !st->o || (want_lse && !st->lse)) {
        mha_state_free(st);
        return attn_fail(err, ATTN_ERR_NOMEM,
                         "out of memory for the projections of multi-head attention");
    }

    attn_blas_init();
    attn_status s = mha_split(&st->lq, in->x, in->w_q, MHA_W_IN, in->b_q, st->q, err);
    if (s == ATTN_OK)
        s = mha_split(&st->lk, st->ctx, in->w_k, MHA_W_IN, in->b_k, st->k, err);
    if (s == ATTN_OK)
        s = mha_split(&st->lv, st->ctx, in->w_v, MHA_W_IN, in->b_v, st->v, err);
    if (s == ATTN_OK)
        s = attn_sdpa_forward(&st->sdpa, st->q, st->k, st->v, st->o, st->lse,
                              weights, stats, err);
    if (s != ATTN_OK)
        mha_state_free(st);
    return s;
}

void mha_state_free(mha_state *st)
{
    free(st->q);
    free(st->k);
    free(st->v);
    free(st->o);
    free(st->lse);
    st->q = st->k = st->v = st->o = NULL;
    st->lse = NULL;
}
