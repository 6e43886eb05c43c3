/*
 * The shared half of multi-head attention (Eq. 12-13): checking the shapes,
 * the projections, and the projected attention that the forward and the
 * backward pass both start from.
 *
 *   x [B, n, d_model], context [B, m, d_ctx] (x itself for self-attention)
 *   q = x W_Q + b_Q        -> [B, n, h,    d_k]   (head i: columns i*d_k ..)
 *   k = context W_K + b_K  -> [B, m, h_kv, d_k]
 *   v = context W_V + b_V  -> [B, m, h_kv, d_v]
 *   o = attention(q, k, v) -> [B, n, h,    d_v]   (ATTN_LAYOUT_BNHD)
 *   out = o W_O + b_O      -> [B, n, d_out]       (o itself without W_O)
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "mha.h"
#include "sdpa.h"

/* Below this many FLOPs a call's products run on the calling thread:
 * starting threads costs tens of microseconds, as much as the product. */
#define MHA_PARALLEL_MIN_FLOPS 4e6

/* Rows (or columns) of C per task of mha_gemm: large enough that one sgemm
 * amortises its packing, small enough that every thread gets several. */
#define MHA_GEMM_BLOCK 64

/* Largest element count we let a buffer have: bytes must fit a ptrdiff_t. */
#define MHA_MAX_ELEMS ((int64_t)(PTRDIFF_MAX / sizeof(float)))

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ------------------------------------------------------------- products */

typedef struct {
    bool trans_a, trans_b, accumulate, by_rows;
    int64_t M, N, K, lda, ldb, ldc, block;
    const float *a, *b, *bias;
    float *c;
    const atomic_int *cancel;
} gemm_task;

static void gemm_block(void *ctx, int64_t t, int worker)
{
    (void)worker;
    const gemm_task *g = ctx;
    int64_t r0 = 0, rows = g->M, c0 = 0, cols = g->N;
    if (g->by_rows) {
        r0 = t * g->block;
        rows = min64(g->M - r0, g->block);
    } else {
        c0 = t * g->block;
        cols = min64(g->N - c0, g->block);
    }
    /* Rows r0.. of A are its rows (or, transposed, its columns); columns
     * c0.. of B likewise. */
    const float *a = g->a + (g->trans_a ? r0 : r0 * g->lda);
    const float *b = g->b + (g->trans_b ? c0 * g->ldb : c0);
    float *c = g->c + r0 * g->ldc + c0;
    float beta = g->accumulate ? 1.0f : 0.0f;
    if (g->bias != NULL) {
        for (int64_t r = 0; r < rows; r++)
            memcpy(c + r * g->ldc, g->bias + c0, (size_t)cols * sizeof *c);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                g->trans_b ? CblasTrans : CblasNoTrans, (int)rows, (int)cols, (int)g->K,
                1.0f, a, (int)g->lda, b, (int)g->ldb, beta, c, (int)g->ldc);
}

void mha_gemm(const mha_state *st, bool trans_a, bool trans_b, int64_t M, int64_t N,
              int64_t K, const float *a, int64_t lda, const float *b, int64_t ldb,
              const float *bias, bool accumulate, float *c, int64_t ldc)
{
    const int threads = st->threads;
    gemm_task g = {.trans_a = trans_a, .trans_b = trans_b, .accumulate = accumulate,
                   .by_rows = M >= N, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb,
                   .ldc = ldc, .a = a, .b = b, .bias = bias, .c = c,
                   .cancel = st->sdpa.cancel};
    int64_t along = g.by_rows ? M : N;
    /* Blocks of MHA_GEMM_BLOCK or more, about four per thread. */
    int64_t per = (along + 4 * (int64_t)threads - 1) / (4 * (int64_t)threads);
    g.block = per < MHA_GEMM_BLOCK ? MHA_GEMM_BLOCK : per;
    if (threads <= 1)
        g.block = along;
    attn_parallel_for_until(threads, (along + g.block - 1) / g.block, gemm_block, &g,
                            g.cancel);
}

/* Columns summed per pass: a double accumulator on the stack, and each row
 * read contiguously. Summing in double keeps many terms accurate. */
#define MHA_SUM_CHUNK 64

void mha_column_sums(const float *d, int64_t rows, int64_t n, float *db)
{
    for (int64_t j0 = 0; j0 < n; j0 += MHA_SUM_CHUNK) {
        int64_t cw = min64(n - j0, MHA_SUM_CHUNK);
        double acc[MHA_SUM_CHUNK] = {0};
        for (int64_t r = 0; r < rows; r++) {
            const float *row = d + r * n + j0;
            for (int64_t j = 0; j < cw; j++)
                acc[j] += row[j];
        }
        for (int64_t j = 0; j < cw; j++)
            db[j0 + j] = (float)acc[j];
    }
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
    if (p->precision != ATTN_PRECISION_FLOAT32 && p->precision != ATTN_PRECISION_BFLOAT16)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "multi-head attention: precision %d is not a known precision",
                         (int)p->precision);

    /* B*n and B*m are the rows of one sgemm each, widths of the
     * concatenated heads its leading dimensions: ints. */
    if (p->batch > INT_MAX / p->n || p->batch > INT_MAX / p->m)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "multi-head attention: batch*n = %lld*%lld or batch*m = %lld*%lld "
                         "is too many rows (at most %d)",
                         (long long)p->batch, (long long)p->n, (long long)p->batch,
                         (long long)p->m, INT_MAX);
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
    if (want_weights && !elems_fit(p->batch, p->weights_mean ? 1 : p->heads, p->n, p->m))
        return attn_fail(err, ATTN_ERR_INVALID,
                         "multi-head attention: weights [B, h, n, m] would have too many elements");

    st->sdpa = (attn_sdpa_params){
        .batch = p->batch, .heads_q = p->heads, .heads_kv = p->kv_heads,
        .n_q = p->n, .n_k = p->m, .d_k = p->d_k, .d_v = p->d_v,
        .scale = p->scale, .causal = p->causal, .mask = p->mask,
        .threads = p->threads, .layout = ATTN_LAYOUT_BNHD, .variants = p->variants,
        .ragged = p->ragged,
        .weights_mean = p->weights_mean,
        .cancel = p->cancel,
        .precision = p->precision,
    };
    /* The attention's own checks (the variants, a ragged batch's
     * sequences) before any projection is computed. */
    s = sdpa_check_params(&st->sdpa, want_weights, err);
    if (s != ATTN_OK)
        return s;
    /* One decision for every product of the call, from all of them. */
    double flops = attn_mha_flops(p) - attn_sdpa_flops(&st->sdpa);
    st->threads = flops < MHA_PARALLEL_MIN_FLOPS ? 1 : p->threads;
    st->ctx = in->context ? in->context : in->x;
    return ATTN_OK;
}

/* The projections are workspaces too: from the caller's allocator. */
static float *alloc_floats(int64_t a, int64_t b, int64_t c)
{
    return sdpa_alloc(a * b * c, sizeof(float));
}

attn_status mha_attend(const attn_mha_params *p, const attn_mha_inputs *in,
                       mha_state *st, bool want_rows, float *out, attn_softmax_row *rows,
                       float *weights, attn_stats *stats, attn_error *err)
{
    const int64_t B = p->batch, n = p->n, m = p->m;
    st->q = alloc_floats(B * n, p->heads, p->d_k);
    st->k = alloc_floats(B * m, p->kv_heads, p->d_k);
    st->v = alloc_floats(B * m, p->kv_heads, p->d_v);
    st->o_owned = in->w_o != NULL || out == NULL;
    st->o = st->o_owned ? alloc_floats(B * n, p->heads, p->d_v) : out;
    st->rows_owned = rows == NULL && want_rows;
    st->rows = st->rows_owned ? malloc((size_t)(B * p->heads * n) * sizeof *st->rows) : rows;
    if (!st->q || !st->k || !st->v || !st->o || (st->rows_owned && !st->rows)) {
        mha_state_free(st);
        return attn_fail(err, ATTN_ERR_NOMEM,
                         "out of memory for the projections of multi-head attention");
    }

    attn_blas_init();
    const int64_t wq = p->heads * p->d_k, wk = p->kv_heads * p->d_k, wv = p->kv_heads * p->d_v;
    mha_gemm(st, false, false, B * n, wq, p->d_model, in->x, p->d_model, in->w_q,
             wq, in->b_q, false, st->q, wq);
    mha_gemm(st, false, false, B * m, wk, p->d_ctx, st->ctx, p->d_ctx, in->w_k, wk,
             in->b_k, false, st->k, wk);
    mha_gemm(st, false, false, B * m, wv, p->d_ctx, st->ctx, p->d_ctx, in->w_v, wv,
             in->b_v, false, st->v, wv);
    attn_status s = attn_sdpa_forward(&st->sdpa, st->q, st->k, st->v, st->o, st->rows,
                                      weights, stats, err);
    if (s != ATTN_OK)
        mha_state_free(st);
    return s;
}

void mha_output(const attn_mha_params *p, const attn_mha_inputs *in, const mha_state *st,
                float *out)
{
    if (in->w_o == NULL)
        return;
    const int64_t cat = p->heads * p->d_v;
    mha_gemm(st, false, false, p->batch * p->n, p->d_out, cat, st->o, cat, in->w_o,
             p->d_out, in->b_o, false, out, p->d_out);
}

attn_status mha_finish(const attn_mha_params *p, attn_status s, attn_error *err)
{
    if (s == ATTN_OK && attn_cancelled(p->cancel))
        return attn_fail(err, ATTN_ERR_CANCELLED, "the call was cancelled");
    return s;
}

void mha_state_free(mha_state *st)
{
    sdpa_free(st->q);
    sdpa_free(st->k);
    sdpa_free(st->v);
    if (st->o_owned)
        sdpa_free(st->o);
    if (st->rows_owned)
        free(st->rows);
    st->q = st->k = st->v = st->o = NULL;
    st->rows = NULL;
}
