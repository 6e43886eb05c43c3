/* The chapter's variance analysis (Theorem 1, Corollary 1), accumulated in
 * double per work unit and merged at the end. Score moments are combined row
 * by row with Chan's parallel formula: each row of a tile contributes its own
 * mean and sum of squared deviations (two passes over a row that is in
 * cache), so the variance never comes from subtracting two large sums. */
#include <math.h>

#include "sdpa.h"

void sdpa_stats_init(sdpa_stats_acc *a)
{
    *a = (sdpa_stats_acc){.entropy_min = INFINITY, .entropy_max = -INFINITY};
}

static void merge_moments(sdpa_stats_acc *a, int64_t n, double mean, double m2)
{
    if (n == 0)
        return;
    if (a->count == 0) {
        a->count = n;
        a->mean = mean;
        a->m2 = m2;
        return;
    }
    double na = (double)a->count, nb = (double)n, total = na + nb;
    double delta = mean - a->mean;
    a->mean += delta * nb / total;
    a->m2 += m2 + delta * delta * na * nb / total;
    a->count += n;
}

void sdpa_stats_scores(sdpa_stats_acc *a, const float *raw, const float *x, int64_t cols)
{
    int64_t n = 0;
    double sum = 0.0;
    for (int64_t j = 0; j < cols; j++)
        if (x[j] != -INFINITY) {
            sum += raw[j];
            n++;
        }
    if (n == 0)
        return;
    double mean = sum / (double)n, m2 = 0.0;
    for (int64_t j = 0; j < cols; j++)
        if (x[j] != -INFINITY) {
            double d = raw[j] - mean;
            m2 += d * d;
        }
    merge_moments(a, n, mean, m2);
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
    merge_moments(into, from->count, from->mean, from->m2);
    into->rows += from->rows;
    into->entropy_sum += from->entropy_sum;
    into->entropy_min = from->entropy_min < into->entropy_min ? from->entropy_min
                                                              : into->entropy_min;
    into->entropy_max = from->entropy_max > into->entropy_max ? from->entropy_max
                                                              : into->entropy_max;
    into->max_weight_sum += from->max_weight_sum;
}

void sdpa_stats_finish(const sdpa_stats_acc *a, float scale, attn_stats *out)
{
    const double s = scale;
    *out = (attn_stats){.scores_count = a->count, .rows_count = a->rows};
    if (a->count > 0) {
        out->scores_mean = a->mean;
        out->scores_var = a->m2 / (double)a->count;
        /* Moments of scale * S follow exactly from those of S. */
        out->scaled_mean = s * a->mean;
        out->scaled_var = s * s * out->scores_var;
    }
    if (a->rows > 0) {
        out->entropy_mean = a->entropy_sum / (double)a->rows;
        out->entropy_min = a->entropy_min;
        out->entropy_max = a->entropy_max;
        out->max_weight_mean = a->max_weight_sum / (double)a->rows;
    }
}
