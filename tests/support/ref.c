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

/* Query i's position, aligned bottom-right with the keys. */
static int64_t q_pos(const attn_sdpa_params *p, int64_t i)
{
    return i + p->n_k - p->n_q;
}

bool ref_visible(const attn_sdpa_params *p, int64_t b, int64_t h, int64_t i,
                 int64_t j, double *bias)
{
    *bias = 0.0;
    const int64_t pos = q_pos(p, i);
    if (p->causal && j > pos)
        return false;
    const attn_variants *var = &p->variants;
    if (var->window && var->window_left >= 0 && j < pos - var->window_left)
        return false;
    if (var->window && var->window_right >= 0 && j > pos + var->window_right)
        return false;
    if (var->alibi_slopes != NULL) {
        double slope = var->alibi_slopes[b * var->alibi_batch_stride + h];
        *bias -= slope * (double)(pos > j ? pos - j : j - pos);
    }
    const int64_t *s = p->mask.stride;
    int64_t at = b * s[0] + h * s[1] + i * s[2] + j * s[3];
    if (p->mask.kind == ATTN_MASK_BOOL)
        return p->mask.allowed[at] != 0;
    if (p->mask.kind == ATTN_MASK_BIAS)
        *bias += p->mask.bias[at];
    return true;
}

/* x rotated as RoPE turns it at position pos (turn < 0: the inverse),
 * into y: pairs (t, t + d/2) by pos * base^(-2t/d), straight from the
 * definition. Without RoPE, y = x. */
static void rope_turn(const attn_sdpa_params *p, const double *x, int64_t pos, int turn,
                      double *y)
{
    const int64_t d = p->d_k, half = d / 2;
    if (!(p->variants.rope_base > 0.0f)) {
        memcpy(y, x, sizeof *y * (size_t)d);
        return;
    }
    for (int64_t t = 0; t < half; t++) {
        double angle = (double)pos * pow((double)p->variants.rope_base, -2.0 * t / (double)d);
        double c = cos(angle), s = turn * sin(angle);
        y[t] = x[t] * c - x[t + half] * s;
        y[t + half] = x[t + half] * c + x[t] * s;
    }
}

/* q . k of (b, h, i) and key j, both rotated when RoPE is on. */
static double raw_score(const attn_sdpa_params *p, const double *q,
                        const double *k, int64_t b, int64_t h, int64_t i,
                        int64_t j)
{
    double qi[1024], kj[1024]; /* the tests keep d_k <= 1024 */
    rope_turn(p, q + q_index(p, b, h, i, p->d_k), q_pos(p, i), 1, qi);
    rope_turn(p, k + kv_index(p, b, kv_head(p, h), j, p->d_k), j, 1, kj);
    double s = 0.0;
    for (int64_t c = 0; c < p->d_k; c++)
        s += qi[c] * kj[c];
    return s;
}

/* The scaled score, soft-capped: the S~ of the statistics. */
static double scaled_score(const attn_sdpa_params *p, double raw)
{
    double s = (double)p->scale * raw, cap = p->variants.softcap;
    return cap > 0.0 ? cap * tanh(s / cap) : s;
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
            w[j] = scaled_score(p, raw_score(p, q, k, b, h, i, j)) + bias;
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
                /* Gradients of the rotated q_i and k_j, turned back at the
                 * end: the rotation is linear, its transpose its inverse. */
                double qi[1024], kj[1024], dqi[1024] = {0}, dkj[1024];
                rope_turn(p, q + q_index(p, b, h, i, p->d_k), q_pos(p, i), 1, qi);
                for (int64_t j = 0; j < p->n_k; j++) {
                    double ds = w[j] * (dw[j] - dot) * scale;
                    if (ds == 0.0)
                        continue;
                    if (p->variants.softcap > 0.0f) {
                        /* through c tanh(x / c): times 1 - tanh^2 */
                        double t = tanh(scale * raw_score(p, q, k, b, h, i, j) /
                                        p->variants.softcap);
                        ds *= 1.0 - t * t;
                    }
                    rope_turn(p, k + kv_index(p, b, g, j, p->d_k), j, 1, kj);
                    double dk_rot[1024];
                    for (int64_t c = 0; c < p->d_k; c++) {
                        dqi[c] += ds * kj[c];
                        dk_rot[c] = ds * qi[c];
                    }
                    rope_turn(p, dk_rot, j, -1, dkj);
                    double *dk_row = dk + kv_index(p, b, g, j, p->d_k);
                    for (int64_t c = 0; c < p->d_k; c++)
                        dk_row[c] += dkj[c];
                }
                rope_turn(p, dqi, q_pos(p, i), -1, dq + q_index(p, b, h, i, p->d_k));
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
    double sq = 0.0, scaled_sum = 0.0, scaled_sq = 0.0;
    double ent_sum = 0.0, maxw_sum = 0.0;
    double ent_min = INFINITY, ent_max = -INFINITY;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < p->n_q; i++) {
                for (int64_t j = 0; j < p->n_k; j++) {
                    double bias;
                    if (ref_visible(p, b, h, i, j, &bias)) {
                        double raw = raw_score(p, q, k, b, h, i, j);
                        sq += (raw - mean) * (raw - mean);
                        scaled_sum += scaled_score(p, raw);
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
    double scaled_mean = st->scores_count ? scaled_sum / (double)st->scores_count : 0.0;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < p->n_q; i++)
                for (int64_t j = 0; j < p->n_k; j++) {
                    double bias;
                    if (ref_visible(p, b, h, i, j, &bias)) {
                        double d = scaled_score(p, raw_score(p, q, k, b, h, i, j)) - scaled_mean;
                        scaled_sq += d * d;
                    }
                }
    free(w);
    if (st->scores_count) {
        st->scores_mean = mean;
        st->scores_var = sq / (double)st->scores_count;
        st->scaled_mean = scaled_mean;
        st->scaled_var = scaled_sq / (double)st->scores_count;
    }
    if (st->rows_count) {
        st->entropy_mean = ent_sum / (double)st->rows_count;
        st->entropy_min = ent_min;
        st->entropy_max = ent_max;
        st->max_weight_mean = maxw_sum / (double)st->rows_count;
    }
}
