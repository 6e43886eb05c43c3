/* Double-precision reference for SDPA; see ref.h. Deliberately naive. */
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static size_t q_index(const attn_sdpa_params *p, int64_t b, int64_t h,
                      int64_t i, int64_t width)
{
    return (size_t)(((b * p->heads_q + h) * p->n_q + i) * width);
}

static size_t kv_index(const attn_sdpa_params *p, int64_t b, int64_t g,
                       int64_t j, int64_t width)
{
    return (size_t)(((b * p->heads_kv + g) * p->n_k + j) * width);
}

/* The key/value head that query head h reads. */
static int64_t kv_head(const attn_sdpa_params *p, int64_t h)
{
    return h / (p->heads_q / p->heads_kv);
}

bool ref_visible(const attn_sdpa_params *p, int64_t b, int64_t h, int64_t i,
                 int64_t j, double *bias)
{
    *bias = 0.0;
    if (p->causal && j > i + (p->n_k - p->n_q))
        return false;
    const int64_t *s = p->mask.stride;
    int64_t at = b * s[0] + h * s[1] + i * s[2] + j * s[3];
    if (p->mask.kind == ATTN_MASK_BOOL)
        return p->mask.allowed[at] != 0;
    if (p->mask.kind == ATTN_MASK_BIAS)
        *bias = p->mask.bias[at];
    return true;
}

static double raw_score(const attn_sdpa_params *p, const double *q,
                        const double *k, int64_t b, int64_t h, int64_t i,
                        int64_t j)
{
    const double *qi = q + q_index(p, b, h, i, p->d_k);
    const double *kj = k + kv_index(p, b, kv_head(p, h), j, p->d_k);
    double s = 0.0;
    for (int64_t c = 0; c < p->d_k; c++)
        s += qi[c] * kj[c];
    return s;
}

/* The weight row of query (b, h, i) into w[n_k]; returns its log-sum-exp,
 * -INFINITY when no key is visible (then w is all zeros). */
static double weight_row(const attn_sdpa_params *p, const double *q,
                         const double *k, int64_t b, int64_t h, int64_t i,
                         double *w)
{
    double row_max = -INFINITY;
    for (int64_t j = 0; j < p->n_k; j++) {
        double bias;
        if (ref_visible(p, b, h, i, j, &bias)) {
            w[j] = (double)p->scale * raw_score(p, q, k, b, h, i, j) + bias;
            if (w[j] > row_max)
                row_max = w[j];
        } else {
            w[j] = -INFINITY;
        }
    }
    if (row_max == -INFINITY) {
        for (int64_t j = 0; j < p->n_k; j++)
            w[j] = 0.0;
        return -INFINITY;
    }
    double total = 0.0;
    for (int64_t j = 0; j < p->n_k; j++) {
        w[j] = w[j] == -INFINITY ? 0.0 : exp(w[j] - row_max);
        total += w[j];
    }
    for (int64_t j = 0; j < p->n_k; j++)
        w[j] /= total;
    return row_max + log(total);
}

void ref_sdpa_forward(const attn_sdpa_params *p, const double *q,
                      const double *k, const double *v, double *out,
                      double *lse, double *weights)
{
    double *w = malloc(sizeof *w * (size_t)p->n_k);
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < p->n_q; i++) {
                double row_lse = weight_row(p, q, k, b, h, i, w);
                size_t row = q_index(p, b, h, i, 1);
                if (lse)
                    lse[row] = row_lse;
                if (weights)
                    memcpy(weights + row * (size_t)p->n_k, w,
                           sizeof *w * (size_t)p->n_k);
                double *o = out + row * (size_t)p->d_v;
                for (int64_t c = 0; c < p->d_v; c++)
                    o[c] = 0.0;
                for (int64_t j = 0; j < p->n_k; j++) {
                    const double *vj =
                        v + kv_index(p, b, kv_head(p, h), j, p->d_v);
                    for (int64_t c = 0; c < p->d_v; c++)
                        o[c] += w[j] * vj[c];
                }
            }
    free(w);
}

/*
 * With A the weights, O = A V and dO given:
 *   dV = A^T dO, dA = dO V^T, dS~ = A * (dA - rowsum(dO * O)),
 *   dQ = scale dS~ K, dK = scale dS~^T Q  (Eq. 16-18),
 * summed into the shared key/value head for grouped-query attention.
 */
void ref_sdpa_backward(const attn_sdpa_params *p, const double *q,
                       const double *k, const double *v, const double *dout,
                       double *dq, double *dk, double *dv)
{
    size_t n_dq = (size_t)(p->batch * p->heads_q * p->n_q * p->d_k);
    size_t n_dk = (size_t)(p->batch * p->heads_kv * p->n_k * p->d_k);
    size_t n_dv = (size_t)(p->batch * p->heads_kv * p->n_k * p->d_v);
    memset(dq, 0, sizeof *dq * n_dq);
    memset(dk, 0, sizeof *dk * n_dk);
    memset(dv, 0, sizeof *dv * n_dv);
    double *w = malloc(sizeof *w * (size_t)p->n_k);
    double *dw = malloc(sizeof *dw * (size_t)p->n_k);
    double scale = p->scale;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++) {
            int64_t g = kv_head(p, h);
            for (int64_t i = 0; i < p->n_q; i++) {
                weight_row(p, q, k, b, h, i, w);
                const double *doi = dout + q_index(p, b, h, i, p->d_v);
                double dot = 0.0; /* sum_j w_j dw_j = rowsum(dO * O) */
                for (int64_t j = 0; j < p->n_k; j++) {
                    const double *vj = v + kv_index(p, b, g, j, p->d_v);
                    double *dvj = dv + kv_index(p, b, g, j, p->d_v);
                    dw[j] = 0.0;
                    for (int64_t c = 0; c < p->d_v; c++) {
                        dw[j] += doi[c] * vj[c];
                        dvj[c] += w[j] * doi[c];
                    }
                    dot += w[j] * dw[j];
                }
                const double *qi = q + q_index(p, b, h, i, p->d_k);
                double *dqi = dq + q_index(p, b, h, i, p->d_k);
                for (int64_t j = 0; j < p->n_k; j++) {
                    double ds = w[j] * (dw[j] - dot) * scale;
                    if (ds == 0.0)
                        continue;
                    const double *kj = k + kv_index(p, b, g, j, p->d_k);
                    double *dkj = dk + kv_index(p, b, g, j, p->d_k);
                    for (int64_t c = 0; c < p->d_k; c++) {
                        dqi[c] += ds * kj[c];
                        dkj[c] += ds * qi[c];
                    }
                }
            }
        }
    free(w);
    free(dw);
}

double ref_sdpa_loss(const attn_sdpa_params *p, const double *q,
                     const double *k, const double *v, const double *dout)
{
    size_t n = (size_t)(p->batch * p->heads_q * p->n_q * p->d_v);
    double *out = malloc(sizeof *out * n);
    ref_sdpa_forward(p, q, k, v, out, NULL, NULL);
    double loss = 0.0;
    for (size_t i = 0; i < n; i++)
        loss += dout[i] * out[i];
    free(out);
    return loss;
}

static void fd_one(const attn_sdpa_params *p, double *x, size_t n, double *dx,
                   double *q, double *k, double *v, const double *dout,
                   double h)
{
    for (size_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + h;
        double up = ref_sdpa_loss(p, q, k, v, dout);
        x[i] = keep - h;
        double down = ref_sdpa_loss(p, q, k, v, dout);
        x[i] = keep;
        dx[i] = (up - down) / (2.0 * h);
    }
}

void ref_sdpa_grad_fd(const attn_sdpa_params *p, double *q, double *k,
                      double *v, const double *dout, double h, double *dq,
                      double *dk, double *dv)
{
    fd_one(p, q, (size_t)(p->batch * p->heads_q * p->n_q * p->d_k), dq, q, k,
           v, dout, h);
    fd_one(p, k, (size_t)(p->batch * p->heads_kv * p->n_k * p->d_k), dk, q, k,
           v, dout, h);
    fd_one(p, v, (size_t)(p->batch * p->heads_kv * p->n_k * p->d_v), dv, q, k,
           v, dout, h);
}

/* Two passes (mean, then squared deviations) so the variance is exact to
 * double rounding rather than a difference of large sums. */
void ref_sdpa_stats(const attn_sdpa_params *p, const double *q,
                    const double *k, attn_stats *st)
{
    memset(st, 0, sizeof *st);
    double *w = malloc(sizeof *w * (size_t)p->n_k);
    double sum = 0.0;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < p->n_q; i++)
                for (int64_t j = 0; j < p->n_k; j++) {
                    double bias;
                    if (ref_visible(p, b, h, i, j, &bias)) {
                        sum += raw_score(p, q, k, b, h, i, j);
                        st->scores_count++;
                    }
                }
    double mean = st->scores_count ? sum / (double)st->scores_count : 0.0;
    double sq = 0.0;
    double scale = p->scale;
    double ent_sum = 0.0, maxw_sum = 0.0;
    double ent_min = INFINITY, ent_max = -INFINITY;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < p->n_q; i++) {
                for (int64_t j = 0; j < p->n_k; j++) {
                    double bias;
                    if (ref_visible(p, b, h, i, j, &bias)) {
                        double d = raw_score(p, q, k, b, h, i, j) - mean;
                        sq += d * d;
                    }
                }
                if (weight_row(p, q, k, b, h, i, w) == -INFINITY)
                    continue;
                double ent = 0.0, top = 0.0;
                for (int64_t j = 0; j < p->n_k; j++) {
                    if (w[j] > 0.0)
                        ent -= w[j] * log(w[j]);
                    if (w[j] > top)
                        top = w[j];
                }
                st->rows_count++;
                ent_sum += ent;
                maxw_sum += top;
                ent_min = ent < ent_min ? ent : ent_min;
                ent_max = ent > ent_max ? ent : ent_max;
            }
    free(w);
    if (st->scores_count) {
        st->scores_mean = mean;
        st->scores_var = sq / (double)st->scores_count;
        st->scaled_mean = scale * mean;
        st->scaled_var = scale * scale * st->scores_var;
    }
    if (st->rows_count) {
        st->entropy_mean = ent_sum / (double)st->rows_count;
        st->entropy_min = ent_min;
        st->entropy_max = ent_max;
        st->max_weight_mean = maxw_sum / (double)st->rows_count;
    }
}
