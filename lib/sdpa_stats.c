/* The chapter's variance analysis (Theorem 1, Corollary 1), accumulated in
 * double per work unit and merged at the end. Score moments (of the raw and
 * of the scaled, soft-capped scores) are combined row by row with Chan's
 * parallel formula: each row of a tile contributes its own mean and sum of
 * squared deviations (two passes over a row that is in cache), so the
 * variance never comes from subtracting two large sums. */
#include <math.h>

#include "sdpa.h"

void sdpa_stats_init(sdpa_stats_acc *a)
{
    *a = (sdpa_stats_acc){.entropy_min = INFINITY, .entropy_max = -INFINITY};
}

/* Moments of one sample: count, mean and sum of squared deviations. */
typedef struct {
    int64_t n;
    double mean, m2;
} moments;

/* Chan's merge of b into (n_a, *mean, *m2). */
static void merge(int64_t n_a, double *mean, double *m2, moments b)
{
    if (b.n == 0)
        return;
    if (n_a == 0) {
        *mean = b.mean;
        *m2 = b.m2;
        return;
    }
    double na = (double)n_a, nb = (double)b.n, total = na + nb;
    double delta = b.mean - *mean;
    *mean += delta * nb / total;
    *m2 += b.m2 + delta * delta * na * nb / total;
}

static double scaled_value(float raw, float scale, float softcap)
{
    double s = (double)scale * raw;
    return softcap > 0.0f ? softcap * tanh(s / softcap) : s;
}

/* Two passes over a row that is in cache: its mean, then its deviations. */
static moments row_moments(const float *raw, const float *x, int64_t cols, float scale,
                           float softcap, bool scaled)
{
    moments r = {0, 0.0, 0.0};
    double sum = 0.0;
    for (int64_t j = 0; j < cols; j++)
        if (x[j] != -INFINITY) {
            sum += scaled ? scaled_value(raw[j], scale, softcap) : raw[j];
            r.n++;
        }
    if (r.n == 0)
        return r;
    r.mean = sum / (double)r.n;
    for (int64_t j = 0; j < cols; j++)
        if (x[j] != -INFINITY) {
            double d = (scaled ? scaled_value(raw[j], scale, softcap) : raw[j]) - r.mean;
            r.m2 += d * d;
        }
    return r;
}

void sdpa_stats_scores(sdpa_stats_acc *a, const float *raw, const float *x, int64_t cols,
                       float scale, float softcap)
{
    moments r = row_moments(raw, x, cols, scale, softcap, false);
    if (r.n == 0)
        return;
    moments s = row_moments(raw, x, cols, scale, softcap, true);
    merge(a->count, &a->mean, &a->m2, r);
    merge(a->count, &a->scaled_mean, &a->scaled_m2, s);
    a->count += r.n;
}

void sdpa_stats_row(sdpa_stats_acc *a, double entropy, double max_weight)
{
    a->rows++;
    a->entropy_sum += entropy;
    a->entropy_min = entropy < a->entropy_min ? entropy : a->entropy_min;
    a->entropy_max = entropy > a->entropy_max ? entropy : a->entropy_max;
    a->max_weight_sum += max_weight;
}

void sdpa_stats_merge(sdpa_stats_acc *into, const sdpa_stats_acc *from)
{
    merge(into->count, &into->mean, &into->m2, (moments){from->count, from->mean, from->m2});
    merge(into->count, &into->scaled_mean, &into->scaled_m2,
          (moments){from->count, from->scaled_mean, from->scaled_m2});
    into->count += from->count;
    into->rows += from->rows;
    into->entropy_sum += from->entropy_sum;
    into->entropy_min = from->entropy_min < into->entropy_min ? from->entropy_min
                                                              : into->entropy_min;
    into->entropy_max = from->entropy_max > into->entropy_max ? from->entropy_max
                                                              : into->entropy_max;
    into->max_weight_sum += from->max_weight_sum;
}

void sdpa_stats_finish(const sdpa_stats_acc *a, attn_stats *out)
{
    *out = (attn_stats){.scores_count = a->count, .rows_count = a->rows};
    if (a->count > 0) {
        out->scores_mean = a->mean;
        out->scores_var = a->m2 / (double)a->count;
        out->scaled_mean = a->scaled_mean;
        out->scaled_var = a->scaled_m2 / (double)a->count;
    }
    if (a->rows > 0) {
        out->entropy_mean = a->entropy_sum / (double)a->rows;
        out->entropy_min = a->entropy_min;
        out->entropy_max = a->entropy_max;
        out->max_weight_mean = a->max_weight_sum / (double)a->rows;
    }
}
