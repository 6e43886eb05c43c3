/*
 * The checks every handler shares once its fields are decoded: ranks, exact
 * shapes, mask broadcasting, finite results, the range of the scores, and
 * turning a libattn error into an API error.
 */
#include "request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *api_shape_text(char *buf, size_t size, int rank,
                           const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < rank && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld",
                                 i ? ", " : "", (long long)shape[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
    return buf;
}

bool api_check_rank(const codec_tensor *t, const char *field, int lo, int hi,
                    const char *forms, api_error *err)
{
    char s[96];
    if (t->rank < lo || t->rank > hi) {
        char ranks[32];
        snprintf(ranks, sizeof ranks, lo == hi ? "%d" : "%d to %d", lo, hi);
        return api_fail(err, 422, "invalid_shape", field,
                        "%s has rank %d (shape %s); it must have rank %s: %s",
                        field, t->rank, api_shape_text(s, sizeof s, t->rank, t->shape),
                        ranks, forms);
    }
    for (int i = 0; i < t->rank; i++)
        if (t->shape[i] < 1)
            return api_fail(err, 422, "invalid_shape", field,
                            "%s has shape %s; every dimension must be at least 1",
                            field, api_shape_text(s, sizeof s, t->rank, t->shape));
    return true;
}

bool api_check_shape(const codec_tensor *t, const char *field, int rank,
                     const int64_t *shape, const char *what, api_error *err)
{
    bool same = t->rank == rank;
    for (int i = 0; same && i < rank; i++)
        same = t->shape[i] == shape[i];
    if (same)
        return true;
    char got[96], want[96];
    return api_fail(err, 422, "shape_mismatch", field,
                    "%s has shape %s but must have the shape of %s, %s", field,
                    api_shape_text(got, sizeof got, t->rank, t->shape), what,
                    api_shape_text(want, sizeof want, rank, shape));
}

bool api_mask_setup(const codec_tensor *t, int score_rank,
                    const int64_t *score_shape, int64_t batch, int64_t heads,
                    int64_t n_q, int64_t n_k, attn_mask *mask, api_error *err)
{
    char got[96], want[96];
    attn_error ae = {0};
    bool fits = t->rank <= score_rank &&
                attn_mask_broadcast(mask, t->rank, t->shape, batch, heads, n_q,
                                    n_k, &ae) == ATTN_OK;
    if (!fits)
        return api_fail(err, 422, "shape_mismatch", "mask",
                        "mask has shape %s, which does not broadcast to the scores' "
                        "shape %s (NumPy rules: aligned on the right, each "
                        "dimension equal or 1, no more dimensions than the scores)",
                        api_shape_text(got, sizeof got, t->rank, t->shape),
                        api_shape_text(want, sizeof want, score_rank, score_shape));
    if (t->dtype == CODEC_BOOL) {
        mask->kind = ATTN_MASK_BOOL;
        mask->allowed = t->b8;
    } else {
        mask->kind = ATTN_MASK_BIAS;
        mask->bias = t->f32;
    }
    return true;
}

bool api_fail_attn(api_error *err, const attn_error *ae)
{
    if (ae->status == ATTN_ERR_NOMEM)
        return api_fail(err, 500, "out_of_memory", "",
                        "out of memory while computing attention");
    /* nginx's 499: nobody is left to read the answer (api_limits.cancel). */
    if (ae->status == ATTN_ERR_CANCELLED)
        return api_fail(err, 499, "cancelled", "",
                        "the computation was stopped: nobody waits for its answer");
    return api_fail(err, 422, "invalid_value", "", "%s",
                    ae->message[0] ? ae->message : "the library refused these inputs");
}

/* The API's allocator is the codec's: a result may leave as a block of the
 * answer, which is freed as the answer's text is (codec_tensor_release).
 * Set once, before any request (api.h). */
void api_set_allocator(const api_allocator *a)
{
    bool set = a && a->alloc && a->realloc && a->free;
    codec_set_allocator(set ? &(codec_allocator){.alloc = a->alloc, .realloc = a->realloc,
                                                 .free = a->free, .ctx = a->ctx}
                            : NULL);
    attn_set_allocator(set ? &(attn_allocator){.alloc = a->alloc, .free = a->free,
                                               .ctx = a->ctx}
                           : NULL);
}

void api_threads_rest(void)
{
    attn_threads_rest();
}

float *api_alloc_floats(int64_t count)
{
    if (count < 0 || (uint64_t)count > SIZE_MAX / sizeof(float) - 1)
        return NULL;
    return codec_tensor_alloc((count ? (size_t)count : 1) * sizeof(float));
}

void api_free_floats(float *x)
{
    codec_tensor_release(x);
}

/* The first non-finite element of x[0..n), or n. The check reads every
 * output of a request (2 M floats of a short batch), so whole blocks are
 * passed branch-free first (codec_special_start). */
static int64_t first_non_finite(const float *x, int64_t n)
{
    for (size_t at = codec_special_start(x, (size_t)n, CODEC_F32); at < (size_t)n; at++)
        if (!isfinite(x[at]))
            return (int64_t)at;
    return n;
}

bool api_check_output(const float *x, int64_t count, const char *what, codec_encoding enc,
                      api_error *err)
{
    int64_t bad = first_non_finite(x, count);
    if (bad < count)
        return api_fail(err, 422, "numerical_overflow", "",
                        "%s overflows float32 (a non-finite value at element "
                        "%lld); the inputs are too large in magnitude, scale "
                        "them down", what, (long long)bad);
    /* A 2-byte output dtype would turn values past its range into
     * infinities (as PyTorch's .to() does); the API sends no infinities. */
    codec_dtype dtype = codec_encoding_dtype(enc);
    size_t at;
    if (dtype != CODEC_F32 && count > 0 && !codec_half_fits(dtype, x, (size_t)count, &at))
        return api_fail(err, 422, "numerical_overflow", "output_dtype",
                        "%s does not fit %s: element %zu (row-major) is %g, beyond its "
                        "largest finite value (%s); ask for a wider output_dtype", what,
                        codec_dtype_name(dtype), at, (double)x[at],
                        dtype == CODEC_F16 ? "65504" : "3.3895e38");
    return true;
}

/* Interleaved partial sums below: one running sum waits out each
 * addition's latency, eight keep the adder busy (and vector code fits
 * them). The order of the additions moves a sum by ulps of a double, far
 * below anything a bound on float32 scores can notice. */
#define SUM_LANES 8

/* The sum of squares of x[0..n), in double. */
static double sum_squares(const float *x, int64_t n)
{
    double s[SUM_LANES] = {0};
    int64_t t = 0;
    for (; t + SUM_LANES <= n; t += SUM_LANES)
        for (int j = 0; j < SUM_LANES; j++)
            s[j] += (double)x[t + j] * x[t + j];
    for (; t < n; t++)
        s[0] += (double)x[t] * x[t];
    double sum = 0;
    for (int j = 0; j < SUM_LANES; j++)
        sum += s[j];
    return sum;
}

/* The same of n bfloat16 words (the high halves of float32s). */
static double sum_squares_bf16(const uint16_t *x, int64_t n)
{
    double s[SUM_LANES] = {0};
    int64_t t = 0;
    for (; t + SUM_LANES <= n; t += SUM_LANES)
        for (int j = 0; j < SUM_LANES; j++) {
            const uint32_t bits = (uint32_t)x[t + j] << 16;
            float v;
            memcpy(&v, &bits, sizeof v);
            s[j] += (double)v * v;
        }
    for (; t < n; t++) {
        const uint32_t bits = (uint32_t)x[t] << 16;
        float v;
        memcpy(&v, &bits, sizeof v);
        s[0] += (double)v * v;
    }
    double sum = 0;
    for (int j = 0; j < SUM_LANES; j++)
        sum += s[j];
    return sum;
}

double api_max_row_norm(const float *x, int64_t rows, int64_t cols)
{
    double best = 0;
    for (int64_t i = 0; i < rows; i++) {
        double sum = sum_squares(x + i * cols, cols);
        if (sum > best)
            best = sum;
    }
    return sqrt(best);
}

double api_operand_max_row_norm(const codec_tensor *t, int64_t rows, int64_t cols)
{
    if (t->dtype != CODEC_BF16)
        return api_max_row_norm(t->f32, rows, cols);
    double worst = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        double s = sum_squares_bf16(t->bf16 + r * cols, cols);
        worst = s > worst ? s : worst;
    }
    return sqrt(worst);
}

double api_max_abs(const float *x, int64_t count)
{
    double best = 0;
    for (int64_t i = 0; i < count; i++)
        if (fabs(x[i]) > best && isfinite(x[i]))
            best = fabs(x[i]);
    return best;
}

double api_norm(const float *x, int64_t count)
{
    double sum = 0;
    for (int64_t i = 0; i < count; i++)
        sum += (double)x[i] * x[i];
    return sqrt(sum);
}

bool api_check_score_bound(double bound, const char *what, api_error *err)
{
    /* A margin below FLT_MAX (3.4e38) for the rounding of the bound itself
     * and of the exponent arithmetic after it. */
    if (bound < 1e38)
        return true;
    return api_fail(err, 422, "numerical_overflow", "",
                    "%s are too large in magnitude: their scaled scores could reach "
                    "%.3g, past 1e38, too near float32's largest value (3.4e38) for the "
                    "softmax; scale them down", what, bound);
}

int api_threads(const api_limits *lim)
{
    return lim && lim->threads > 1 ? lim->threads : 1;
}

int api_max_threads(const api_limits *lim)
{
    int threads = api_threads(lim);
    return lim && lim->max_threads > threads ? lim->max_threads : threads;
}
