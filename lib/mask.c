/* Explicit masks: broadcasting a mask's shape onto [B, H_q, n_q, n_k], and
 * applying one row of it to a row of scaled scores. */
#include <math.h>

#include "sdpa.h"

attn_status attn_mask_broadcast(attn_mask *mask, int rank, const int64_t *shape,
                                int64_t batch, int64_t heads, int64_t n_q,
                                int64_t n_k, attn_error *err)
{
    if (mask == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "mask is NULL");
    if (rank < 0 || rank > 4)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "mask has rank %d; it must have 0 to 4 dimensions", rank);
    if (rank > 0 && shape == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "mask shape is NULL");
    const int64_t target[4] = {batch, heads, n_q, n_k};
    static const char *const names[4] = {"batch", "heads", "n_q", "n_k"};
    for (int a = 0; a < 4; a++)
        if (target[a] < 1)
            return attn_fail(err, ATTN_ERR_INVALID, "%s is %lld; it must be >= 1",
                             names[a], (long long)target[a]);
    int64_t stride[4] = {0, 0, 0, 0};
    int64_t step = 1; /* elements between neighbours along the current axis */
    /* Shapes align on the right (NumPy): mask axis rank-1 is n_k, and so on;
     * axes the mask lacks, and axes of length 1, broadcast with stride 0. */
    for (int a = 3, m = rank - 1; a >= 0; a--, m--) {
        if (m < 0)
            break;
        int64_t len = shape[m];
        if (len != target[a] && len != 1)
            return attn_fail(err, ATTN_ERR_INVALID,
                             "mask dimension %d has length %lld, which does not "
                             "broadcast to %s = %lld (it must be %lld or 1)",
                             m, (long long)len, names[a], (long long)target[a],
                             (long long)target[a]);
        stride[a] = len == 1 ? 0 : step;
        if (__builtin_mul_overflow(step, len, &step))
            return attn_fail(err, ATTN_ERR_INVALID, "mask is too large");
    }
    for (int a = 0; a < 4; a++)
        mask->stride[a] = stride[a];
    return ATTN_OK;
}

/* x [cols]: scores of query row i against keys j0.., with the row of the
 * mask that starts at element `base`. */
static void mask_row_bias(const attn_mask *mask, int64_t base, float *x, int64_t cols)
{
    const int64_t s = mask->stride[3];
    const float *bias = mask->bias + base;
    if (s == 1) {
        for (int64_t j = 0; j < cols; j++)
            x[j] += bias[j];
    } else {
        for (int64_t j = 0; j < cols; j++)
            x[j] += bias[j * s];
    }
}

/* A disallowed key gets -inf, which the softmax turns into a weight of
 * exactly 0 (and the statistics skip). Adding 0 or -inf from a table, rather
 * than branching, keeps random masks from costing a misprediction a key. */
static void mask_row_hide(const attn_mask *mask, int64_t base, float *x, int64_t cols)
{
    static const float add[2] = {-INFINITY, 0.0f};
    const int64_t s = mask->stride[3];
    const uint8_t *allowed = mask->allowed + base;
    for (int64_t j = 0; j < cols; j++)
        x[j] += add[allowed[j * s] != 0];
}

void sdpa_mask_row(const sdpa_call *c, int64_t b, int64_t h, int64_t i, int64_t j0,
                   float *x, int64_t cols)
{
    const attn_mask *m = &c->p->mask;
    int64_t base = b * m->stride[0] + h * m->stride[1] + i * m->stride[2] + j0 * m->stride[3];
    if (m->kind == ATTN_MASK_BIAS)
        mask_row_bias(m, base, x, cols);
    else if (m->kind == ATTN_MASK_BOOL)
        mask_row_hide(m, base, x, cols);
}
