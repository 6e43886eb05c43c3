/*
 * Ragged batches (attn_ragged): sequences of any lengths packed along the
 * sequence axis, each attending only to its own keys. Every case is
 * checked against per-sequence references: each sequence's slice of q, k,
 * v (and of the mask) computed alone by the double reference
 * (tests/support/ref.c), its results put back where the sequence's rows
 * are, zeros elsewhere; forward (output, lse, weights, statistics) and
 * gradients, with causal, window, ALiBi, RoPE, softcap, masks, GQA, both
 * layouts, cross lengths, empty sequences, lengths that do and do not
 * divide the tiles, thousands of one-row sequences. Then what the
 * scheduling promises: a sequence alone gives the bits of a dense call,
 * the work units share the work evenly, and bad offsets are refused.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "sdpa.h"
#include "support/ref.h"
#include "support/sdpa_case.h"

/* A ragged problem: the sequences, the options, and how the inputs are laid out. */
typedef struct {
    const char *name;
    int64_t heads_q, heads_kv, d_k, d_v;
    int64_t seqs;
    const int64_t *len_q, *len_k; /* len_k NULL: len_q */
    bool causal;
    attn_variants variants;
    bool alibi;                   /* slopes 2^(-8h/H), one per query head */
    attn_layout layout;
    attn_mask_kind mask;
    int mask_rank;                /* 1: [n_k], 2: [n_q, n_k], 3: [H, n_q, n_k], 4: [1, H, n_q, n_k] */
    bool stats, weights;
    int threads;
} ragged_spec;

typedef struct {
    attn_sdpa_params p;
    int64_t *cu_q, *cu_k;
    int64_t n_q, n_k;
    size_t n_qel, n_kel, n_vel, n_out, n_rows, n_w;
    float *q, *k, *v, *dout;
    void *mask;
    int64_t mask_shape[4];
    float slopes[16];
} ragged_case;

/* Element (h, i, c) of a packed tensor of `heads` heads of n rows of d. */
static size_t at(attn_layout layout, int64_t heads, int64_t n, int64_t d, int64_t h, int64_t i,
                 int64_t c)
{
    if (layout == ATTN_LAYOUT_BNHD)
        return (size_t)((i * heads + h) * d + c);
    return (size_t)((h * n + i) * d + c);
}

static int64_t *offsets(int64_t seqs, const int64_t *len)
{
    int64_t *cu = xcalloc((size_t)seqs + 1, sizeof *cu);
    for (int64_t s = 0; s < seqs; s++)
        cu[s + 1] = cu[s] + len[s];
    return cu;
}

static void ragged_init(ragged_case *c, const ragged_spec *sp, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->cu_q = offsets(sp->seqs, sp->len_q);
    c->cu_k = offsets(sp->seqs, sp->len_k ? sp->len_k : sp->len_q);
    c->n_q = c->cu_q[sp->seqs];
    c->n_k = c->cu_k[sp->seqs];
    attn_sdpa_params p = sdpa_shape(1, sp->heads_q, sp->heads_kv, c->n_q, c->n_k, sp->d_k, sp->d_v);
    p.causal = sp->causal;
    p.layout = sp->layout;
    p.variants = sp->variants;
    p.threads = sp->threads ? sp->threads : 2;
    p.ragged = (attn_ragged){.seqs = sp->seqs, .cu_seqlens_q = c->cu_q,
                             .cu_seqlens_k = sp->len_k ? c->cu_k : NULL};
    if (sp->alibi) {
        ck_assert(sp->heads_q <= 16);
        for (int64_t h = 0; h < sp->heads_q; h++)
            c->slopes[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)sp->heads_q);
        p.variants.alibi_slopes = c->slopes;
        p.variants.alibi_batch_stride = 0;
    }
    c->n_qel = (size_t)(sp->heads_q * c->n_q * sp->d_k);
    c->n_kel = (size_t)(sp->heads_kv * c->n_k * sp->d_k);
    c->n_vel = (size_t)(sp->heads_kv * c->n_k * sp->d_v);
    c->n_out = (size_t)(sp->heads_q * c->n_q * sp->d_v);
    c->n_rows = (size_t)(sp->heads_q * c->n_q);
    c->n_w = c->n_rows * (size_t)c->n_k;
    c->q = xcalloc(c->n_qel, sizeof *c->q);
    c->k = xcalloc(c->n_kel, sizeof *c->k);
    c->v = xcalloc(c->n_vel, sizeof *c->v);
    c->dout = xcalloc(c->n_out, sizeof *c->dout);
    uint64_t s = seed * 7919u + 3u;
    fill(c->q, c->n_qel, &s, 2.0);
    fill(c->k, c->n_kel, &s, 1.0);
    fill(c->v, c->n_vel, &s, 1.0);
    fill(c->dout, c->n_out, &s, 1.0);
    if (sp->mask != ATTN_MASK_NONE) {
        const int64_t full[4] = {1, sp->heads_q, c->n_q, c->n_k};
        int r = sp->mask_rank;
        size_t count = 1;
        for (int t = 0; t < r; t++) {
            c->mask_shape[t] = full[4 - r + t];
            count *= (size_t)c->mask_shape[t];
        }
        size_t el = sp->mask == ATTN_MASK_BOOL ? 1 : sizeof(float);
        c->mask = xcalloc(count, el);
        for (size_t i = 0; i < count; i++) {
            if (sp->mask == ATTN_MASK_BOOL)
                ((uint8_t *)c->mask)[i] = rng_uniform(&s) > -0.5;
            else
                ((float *)c->mask)[i] = (float)(2.0 * rng_uniform(&s));
        }
        p.mask.kind = sp->mask;
        p.mask.allowed = sp->mask == ATTN_MASK_BOOL ? c->mask : NULL;
        p.mask.bias = sp->mask == ATTN_MASK_BIAS ? c->mask : NULL;
        attn_error err = {0};
        attn_status st = attn_mask_broadcast(&p.mask, r, c->mask_shape, 1, sp->heads_q, c->n_q,
                                             c->n_k, &err);
        ASSERT_OK(st, err);
    }
    c->p = p;
}

static void ragged_free(ragged_case *c)
{
    free(c->cu_q);
    free(c->cu_k);
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->dout);
    free(c->mask);
}

/* What the per-sequence references give, put back into packed tensors. */
typedef struct {
    double *out, *lse, *weights, *dq, *dk, *dv;
    attn_stats stats;
} ragged_want;

/* Merges one sequence's statistics into the running whole (means and
 * population variances by their counts, in double). */
static void merge_stats(attn_stats *all, double *ent_sum, double *top_sum, const attn_stats *s)
{
    if (s->scores_count > 0) {
        double n0 = (double)all->scores_count, n1 = (double)s->scores_count, n = n0 + n1;
        double m = (n0 * all->scores_mean + n1 * s->scores_mean) / n;
        double sm = (n0 * all->scaled_mean + n1 * s->scaled_mean) / n;
        all->scores_var = (n0 * (all->scores_var + all->scores_mean * all->scores_mean) +
                           n1 * (s->scores_var + s->scores_mean * s->scores_mean)) / n - m * m;
        all->scaled_var = (n0 * (all->scaled_var + all->scaled_mean * all->scaled_mean) +
                           n1 * (s->scaled_var + s->scaled_mean * s->scaled_mean)) / n - sm * sm;
        all->scores_mean = m;
        all->scaled_mean = sm;
        all->scores_count += s->scores_count;
    }
    if (s->rows_count > 0) {
        bool first = all->rows_count == 0;
        *ent_sum += s->entropy_mean * (double)s->rows_count;
        *top_sum += s->max_weight_mean * (double)s->rows_count;
        all->entropy_min = first || s->entropy_min < all->entropy_min ? s->entropy_min
                                                                      : all->entropy_min;
        all->entropy_max = first || s->entropy_max > all->entropy_max ? s->entropy_max
                                                                      : all->entropy_max;
        all->rows_count += s->rows_count;
    }
}

/* Each sequence alone through the double reference: its slices copied
 * out as a dense [1, H, len, d] problem (its block of the mask expanded
 * in full), its answers copied back. */
static void reference(const ragged_case *c, const ragged_spec *sp, ragged_want *w)
{
    const int64_t Hq = sp->heads_q, Hk = sp->heads_kv, dk = sp->d_k, dv = sp->d_v;
    const attn_layout L = sp->layout;
    w->out = xcalloc(c->n_out, sizeof *w->out);
    w->lse = xcalloc(c->n_rows, sizeof *w->lse);
    w->weights = sp->weights ? xcalloc(c->n_w, sizeof *w->weights) : NULL;
    w->dq = xcalloc(c->n_qel, sizeof *w->dq);
    w->dk = xcalloc(c->n_kel, sizeof *w->dk);
    w->dv = xcalloc(c->n_vel, sizeof *w->dv);
    memset(&w->stats, 0, sizeof w->stats);
    double ent_sum = 0.0, top_sum = 0.0;
    for (size_t r = 0; r < c->n_rows; r++)
        w->lse[r] = -INFINITY;
    for (int64_t s = 0; s < sp->seqs; s++) {
        const int64_t q0 = c->cu_q[s], nq = c->cu_q[s + 1] - q0;
        const int64_t k0 = c->cu_k[s], nk = c->cu_k[s + 1] - k0;
        if (nq == 0 || nk == 0)
            continue; /* rows that see nothing, keys nothing sees: zeros */
        attn_sdpa_params p = sdpa_shape(1, Hq, Hk, nq, nk, dk, dv);
        p.scale = c->p.scale;
        p.causal = c->p.causal;
        p.variants = c->p.variants;
        double *q = xcalloc((size_t)(Hq * nq * dk), sizeof *q);
        double *k = xcalloc((size_t)(Hk * nk * dk), sizeof *k);
        double *v = xcalloc((size_t)(Hk * nk * dv), sizeof *v);
        double *dout = xcalloc((size_t)(Hq * nq * dv), sizeof *dout);
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < nq; i++) {
                for (int64_t t = 0; t < dk; t++)
                    q[(h * nq + i) * dk + t] = c->q[at(L, Hq, c->n_q, dk, h, q0 + i, t)];
                for (int64_t t = 0; t < dv; t++)
                    dout[(h * nq + i) * dv + t] = c->dout[at(L, Hq, c->n_q, dv, h, q0 + i, t)];
            }
        for (int64_t h = 0; h < Hk; h++)
            for (int64_t j = 0; j < nk; j++) {
                for (int64_t t = 0; t < dk; t++)
                    k[(h * nk + j) * dk + t] = c->k[at(L, Hk, c->n_k, dk, h, k0 + j, t)];
                for (int64_t t = 0; t < dv; t++)
                    v[(h * nk + j) * dv + t] = c->v[at(L, Hk, c->n_k, dv, h, k0 + j, t)];
            }
        void *mask = NULL;
        if (sp->mask != ATTN_MASK_NONE) {
            size_t el = sp->mask == ATTN_MASK_BOOL ? 1 : sizeof(float);
            mask = xcalloc((size_t)(Hq * nq * nk), el);
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t i = 0; i < nq; i++)
                    for (int64_t j = 0; j < nk; j++) {
                        const int64_t at4[4] = {0, h, q0 + i, k0 + j};
                        size_t src = numpy_index(sp->mask_rank, c->mask_shape, at4);
                        memcpy((char *)mask + (size_t)((h * nq + i) * nk + j) * el,
                               (char *)c->mask + src * el, el);
                    }
            p.mask.kind = sp->mask;
            p.mask.allowed = sp->mask == ATTN_MASK_BOOL ? mask : NULL;
            p.mask.bias = sp->mask == ATTN_MASK_BIAS ? mask : NULL;
            p.mask.stride[0] = Hq * nq * nk;
            p.mask.stride[1] = nq * nk;
            p.mask.stride[2] = nk;
            p.mask.stride[3] = 1;
        }
        double *out = xcalloc((size_t)(Hq * nq * dv), sizeof *out);
        double *lse = xcalloc((size_t)(Hq * nq), sizeof *lse);
        double *weights = sp->weights ? xcalloc((size_t)(Hq * nq * nk), sizeof *weights) : NULL;
        double *gq = xcalloc((size_t)(Hq * nq * dk), sizeof *gq);
        double *gk = xcalloc((size_t)(Hk * nk * dk), sizeof *gk);
        double *gv = xcalloc((size_t)(Hk * nk * dv), sizeof *gv);
        ref_sdpa_forward(&p, q, k, v, out, lse, weights);
        ref_sdpa_backward(&p, q, k, v, dout, gq, gk, gv);
        if (sp->stats) {
            attn_stats st;
            ref_sdpa_stats(&p, q, k, &st);
            merge_stats(&w->stats, &ent_sum, &top_sum, &st);
        }
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < nq; i++) {
                w->lse[h * c->n_q + q0 + i] = lse[h * nq + i];
                for (int64_t t = 0; t < dv; t++)
                    w->out[at(L, Hq, c->n_q, dv, h, q0 + i, t)] = out[(h * nq + i) * dv + t];
                for (int64_t t = 0; t < dk; t++)
                    w->dq[at(L, Hq, c->n_q, dk, h, q0 + i, t)] = gq[(h * nq + i) * dk + t];
                for (int64_t j = 0; weights && j < nk; j++)
                    w->weights[(size_t)((h * c->n_q + q0 + i) * c->n_k + k0 + j)] =
                        weights[(h * nq + i) * nk + j];
            }
        for (int64_t h = 0; h < Hk; h++)
            for (int64_t j = 0; j < nk; j++) {
                for (int64_t t = 0; t < dk; t++)
                    w->dk[at(L, Hk, c->n_k, dk, h, k0 + j, t)] = gk[(h * nk + j) * dk + t];
                for (int64_t t = 0; t < dv; t++)
                    w->dv[at(L, Hk, c->n_k, dv, h, k0 + j, t)] = gv[(h * nk + j) * dv + t];
            }
        free(q), free(k), free(v), free(dout), free(mask);
        free(out), free(lse), free(weights), free(gq), free(gk), free(gv);
    }
    if (w->stats.rows_count > 0) {
        w->stats.entropy_mean = ent_sum / (double)w->stats.rows_count;
        w->stats.max_weight_mean = top_sum / (double)w->stats.rows_count;
    }
}

static void want_free(ragged_want *w)
{
    free(w->out), free(w->lse), free(w->weights), free(w->dq), free(w->dk), free(w->dv);
}

static void check_stat(const char *name, const char *what, double got, double want)
{
    char label[200];
    snprintf(label, sizeof label, "%s: stats %s", name, what);
    ASSERT_ERR(fabs(got - want) / (1.0 + fabs(want)), TOL_STATS, label);
}

/* The library's forward and backward of the case against the references. */
static void check_ragged(const ragged_spec *sp, uint64_t seed)
{
    ragged_case c;
    ragged_init(&c, sp, seed);
    ragged_want w;
    reference(&c, sp, &w);

    float *out = nan_floats(c.n_out);
    float *weights = sp->weights ? nan_floats(c.n_w) : NULL;
    attn_softmax_row *rows = xcalloc(c.n_rows, sizeof *rows);
    attn_stats stats;
    attn_error err = {0};
    attn_status st = attn_sdpa_forward(&c.p, c.q, c.k, c.v, out, rows, weights,
                                       sp->stats ? &stats : NULL, &err);
    ASSERT_OK(st, err);
    double *lse = xcalloc(c.n_rows, sizeof *lse);
    for (size_t r = 0; r < c.n_rows; r++)
        lse[r] = attn_softmax_lse(rows[r]);
    char label[200];
    snprintf(label, sizeof label, "%s: out", sp->name);
    ASSERT_ERR(rel_err(out, w.out, c.n_out), TOL_FORWARD, label);
    snprintf(label, sizeof label, "%s: lse", sp->name);
    ASSERT_ERR(lse_err(lse, w.lse, c.n_rows), TOL_FORWARD, label);
    /* Without the softmax rows (nor weights or statistics) a short
     * sequence of few keys has them read in place (another order of the
     * same sums): the output as close to the reference. */
    float *bare = nan_floats(c.n_out);
    ASSERT_OK(attn_sdpa_forward(&c.p, c.q, c.k, c.v, bare, NULL, NULL, NULL, &err), err);
    snprintf(label, sizeof label, "%s: out without rows", sp->name);
    ASSERT_ERR(rel_err(bare, w.out, c.n_out), TOL_FORWARD, label);
    free(bare);
    if (weights) {
        snprintf(label, sizeof label, "%s: weights, zeros outside the blocks", sp->name);
        ASSERT_ERR(rel_err(weights, w.weights, c.n_w), TOL_FORWARD, label);
    }
    if (sp->stats) {
        ck_assert_int_eq(stats.scores_count, w.stats.scores_count);
        ck_assert_int_eq(stats.rows_count, w.stats.rows_count);
        check_stat(sp->name, "scores mean", stats.scores_mean, w.stats.scores_mean);
        check_stat(sp->name, "scores var", stats.scores_var, w.stats.scores_var);
        check_stat(sp->name, "scaled mean", stats.scaled_mean, w.stats.scaled_mean);
        check_stat(sp->name, "scaled var", stats.scaled_var, w.stats.scaled_var);
        check_stat(sp->name, "entropy mean", stats.entropy_mean, w.stats.entropy_mean);
        check_stat(sp->name, "entropy min", stats.entropy_min, w.stats.entropy_min);
        check_stat(sp->name, "entropy max", stats.entropy_max, w.stats.entropy_max);
        check_stat(sp->name, "max weight", stats.max_weight_mean, w.stats.max_weight_mean);
    }

    float *dq = nan_floats(c.n_qel), *dk = nan_floats(c.n_kel), *dv = nan_floats(c.n_vel);
    st = attn_sdpa_backward(&c.p, c.q, c.k, c.v, out, rows, c.dout, dq, dk, dv, &err);
    ASSERT_OK(st, err);
    snprintf(label, sizeof label, "%s: dq", sp->name);
    ASSERT_ERR(rel_err(dq, w.dq, c.n_qel), TOL_GRAD_ANALYTIC, label);
    snprintf(label, sizeof label, "%s: dk", sp->name);
    ASSERT_ERR(rel_err(dk, w.dk, c.n_kel), TOL_GRAD_ANALYTIC, label);
    snprintf(label, sizeof label, "%s: dv", sp->name);
    ASSERT_ERR(rel_err(dv, w.dv, c.n_vel), TOL_GRAD_ANALYTIC, label);

    free(out), free(weights), free(rows), free(lse), free(dq), free(dk), free(dv);
    want_free(&w);
    ragged_free(&c);
}

/* Lengths that cross the tiles (64 keys, 96 and 64 query rows) and land
 * on them, empty ones first, last and between. */
static const int64_t mixed_q[] = {0, 5, 17, 0, 64, 1, 130, 96, 33, 0};
static const int64_t mixed_k[] = {3, 9, 17, 4, 70, 0, 130, 64, 1, 0};
#define MIXED (int64_t)(sizeof mixed_q / sizeof *mixed_q)

START_TEST(each_sequence_matches_its_reference_alone)
{
    ragged_spec sp = {.name = "mixed lengths", .heads_q = 2, .heads_kv = 2, .d_k = 8, .d_v = 5,
                      .seqs = MIXED, .len_q = mixed_q, .weights = true, .stats = true};
    check_ragged(&sp, 1);
    sp.name = "mixed lengths, causal";
    sp.causal = true;
    check_ragged(&sp, 2);
}
END_TEST

START_TEST(cross_lengths_and_empty_key_sequences)
{
    ragged_spec sp = {.name = "cross lengths", .heads_q = 2, .heads_kv = 2, .d_k = 6, .d_v = 7,
                      .seqs = MIXED, .len_q = mixed_q, .len_k = mixed_k, .weights = true,
                      .stats = true};
    check_ragged(&sp, 3);
    sp.name = "cross lengths, causal bottom-right per sequence";
    sp.causal = true;
    check_ragged(&sp, 4);
}
END_TEST

START_TEST(variants_count_positions_within_each_sequence)
{
    const struct {
        const char *name;
        attn_variants v;
        bool alibi, causal;
    } cases[] = {
        {"window [4, 2]", {.window = true, .window_left = 4, .window_right = 2}, false, false},
        {"window [70, 0]", {.window = true, .window_left = 70, .window_right = 0}, false, false},
        {"window [3, -1] causal", {.window = true, .window_left = 3, .window_right = -1}, false,
         true},
        {"alibi", {0}, true, false},
        {"alibi causal", {0}, true, true},
        {"softcap", {.softcap = 2.0f}, false, false},
        {"rope", {.rope_base = 100.0f}, false, false},
        {"rope causal", {.rope_base = 10000.0f}, false, true},
        {"all together", {.window = true, .window_left = 40, .window_right = 3, .softcap = 3.0f,
                          .rope_base = 500.0f}, true, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ragged_spec sp = {.name = cases[i].name, .heads_q = 4, .heads_kv = 2, .d_k = 8,
                          .d_v = 4, .seqs = MIXED, .len_q = mixed_q, .len_k = mixed_k,
                          .causal = cases[i].causal, .variants = cases[i].v,
                          .alibi = cases[i].alibi, .stats = true, .weights = true};
        check_ragged(&sp, 10 + i);
    }
}
END_TEST

START_TEST(masks_are_packed_and_combine_with_the_blocks)
{
    const struct {
        attn_mask_kind kind;
        int rank;
        const char *name;
    } cases[] = {
        {ATTN_MASK_BOOL, 2, "bool mask [n_q, n_k]"},
        {ATTN_MASK_BOOL, 1, "bool mask [n_k] (key padding)"},
        {ATTN_MASK_BIAS, 3, "bias [H, n_q, n_k]"},
        {ATTN_MASK_BIAS, 4, "bias [1, H, n_q, n_k]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ragged_spec sp = {.name = cases[i].name, .heads_q = 2, .heads_kv = 1, .d_k = 8,
                          .d_v = 8, .seqs = MIXED, .len_q = mixed_q, .len_k = mixed_k,
                          .mask = cases[i].kind, .mask_rank = cases[i].rank,
                          .causal = i % 2 == 1, .stats = true, .weights = true};
        check_ragged(&sp, 30 + i);
    }
}
END_TEST

START_TEST(grouped_query_heads_short_and_long_sequences)
{
    /* Short sequences (one query block, one key tile: the group's heads
     * share the item's panel) and long ones (shared panels). */
    static const int64_t len[] = {3, 64, 200, 1, 65, 97};
    const int64_t kv[] = {1, 2};
    for (size_t i = 0; i < 2; i++) {
        ragged_spec sp = {.name = kv[i] == 1 ? "multi-query" : "grouped-query",
                          .heads_q = 4, .heads_kv = kv[i], .d_k = 16, .d_v = 8, .seqs = 6,
                          .len_q = len, .causal = i == 1, .stats = true, .weights = true};
        check_ragged(&sp, 40 + i);
    }
}
END_TEST

START_TEST(both_layouts)
{
    static const int64_t lq[] = {7, 0, 100, 33}, lk[] = {7, 5, 90, 64};
    for (int causal = 0; causal < 2; causal++) {
        ragged_spec sp = {.name = causal ? "[n, H, d] layout, causal" : "[n, H, d] layout",
                          .heads_q = 4, .heads_kv = 2, .d_k = 8, .d_v = 6, .seqs = 4,
                          .len_q = lq, .len_k = lk, .layout = ATTN_LAYOUT_BNHD,
                          .causal = causal, .variants = {.rope_base = 50.0f}, .alibi = true,
                          .weights = true};
        check_ragged(&sp, 50 + (uint64_t)causal);
    }
}
END_TEST

START_TEST(lengths_on_the_tiles)
{
    /* Every length a multiple of a tile: 64 (keys, backward rows), 96
     * (forward rows), 192 (both). */
    static const int64_t len[] = {64, 96, 192, 128, 64};
    ragged_spec sp = {.name = "lengths on the tiles", .heads_q = 2, .heads_kv = 2, .d_k = 8,
                      .d_v = 8, .seqs = 5, .len_q = len, .causal = true, .weights = true};
    check_ragged(&sp, 60);
}
END_TEST

START_TEST(thousands_of_one_row_sequences)
{
    /* Each query sees its own key only: the output is that key's value. */
    enum { SEQS = 3000 };
    int64_t *ones = xcalloc(SEQS, sizeof *ones);
    for (int i = 0; i < SEQS; i++)
        ones[i] = 1;
    ragged_spec sp = {.name = "3000 sequences of one row", .heads_q = 2, .heads_kv = 2,
                      .d_k = 4, .d_v = 3, .seqs = SEQS, .len_q = ones, .stats = true};
    check_ragged(&sp, 70);
    ragged_case c;
    ragged_init(&c, &sp, 70);
    float *out = nan_floats(c.n_out);
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&c.p, c.q, c.k, c.v, out, NULL, NULL, NULL, &err), err);
    ck_assert_int_eq(memcmp(out, c.v, c.n_out * sizeof *out), 0);
    free(out);
    ragged_free(&c);
    free(ones);
}
END_TEST

START_TEST(thousands_of_short_sequences_causal)
{
    enum { SEQS = 2000 };
    int64_t *lq = xcalloc(SEQS, sizeof *lq), *lk = xcalloc(SEQS, sizeof *lk);
    uint64_t s = 77;
    for (int i = 0; i < SEQS; i++) {
        lq[i] = 1 + (int64_t)(rng_next(&s) % 16);
        lk[i] = (int64_t)(rng_next(&s) % 17);
    }
    ragged_spec sp = {.name = "2000 sequences of 1-16 rows, 0-16 keys, causal", .heads_q = 2,
                      .heads_kv = 1, .d_k = 8, .d_v = 4, .seqs = SEQS, .len_q = lq,
                      .len_k = lk, .causal = true, .stats = true};
    check_ragged(&sp, 71);
    free(lq);
    free(lk);
}
END_TEST

START_TEST(one_long_and_many_short_on_any_thread_count)
{
    /* One sequence of 700 rows and 300 of 1-20: every thread count gives
     * the reference's answer, and the forward (whose units do not depend
     * on the threads) the same bits. */
    enum { SEQS = 301 };
    int64_t *len = xcalloc(SEQS, sizeof *len);
    uint64_t s = 5;
    len[0] = 700;
    for (int i = 1; i < SEQS; i++)
        len[i] = 1 + (int64_t)(rng_next(&s) % 20);
    float *first = NULL;
    attn_stats first_stats = {0};
    for (int threads = 1; threads <= 3; threads++) {
        ragged_spec sp = {.name = "one long, many short", .heads_q = 2, .heads_kv = 1,
                          .d_k = 16, .d_v = 16, .seqs = SEQS, .len_q = len, .causal = true,
                          .threads = threads};
        if (threads == 1)
            check_ragged(&sp, 80);
        ragged_case c;
        ragged_init(&c, &sp, 80);
        float *out = nan_floats(c.n_out);
        attn_stats stats;
        attn_error err = {0};
        ASSERT_OK(attn_sdpa_forward(&c.p, c.q, c.k, c.v, out, NULL, NULL, &stats, &err), err);
        if (first == NULL) {
            first = out;
            first_stats = stats;
        } else {
            ck_assert_msg(memcmp(first, out, c.n_out * sizeof *out) == 0,
                          "%d threads changed the forward's bits", threads);
            ck_assert_msg(memcmp(&first_stats, &stats, sizeof stats) == 0,
                          "%d threads changed the statistics' bits", threads);
            free(out);
        }
        ragged_free(&c);
    }
    free(first);
    free(len);
}
END_TEST

START_TEST(long_sequences_fold_their_sums_within_their_rows)
{
    /* More than SDPA_FOLD_TILES key tiles (and query tiles) in one
     * sequence among short ones: the forward's output rows and the
     * backward's dq, dk and dv are folded into double sums mid-sequence,
     * each over its own sequence's rows only; with two threads the long
     * pair is split, each split folding its own copy of dq, with one it
     * folds dq itself. */
    static const int64_t lq[] = {3, 1100, 2, 0}, lk[] = {5, 1150, 0, 7};
    ragged_spec sp = {.name = "long among short", .heads_q = 2, .heads_kv = 1, .d_k = 8,
                      .d_v = 8, .seqs = 4, .len_q = lq, .len_k = lk, .weights = true,
                      .stats = true, .threads = 2};
    check_ragged(&sp, 31);
    sp.name = "long among short, causal, one thread (dq folded unsplit)";
    sp.causal = true;
    sp.threads = 1;
    check_ragged(&sp, 32);
}
END_TEST

START_TEST(one_sequence_is_the_dense_call_bit_for_bit)
{
    /* A sequence of a ragged batch is computed as the dense call over its
     * slice alone: the same tiles from its first row and key, the same
     * bits. */
    static const int64_t lq[] = {150, 37, 1, 200}, lk[] = {130, 37, 64, 260};
    ragged_spec sp = {.name = "slices", .heads_q = 4, .heads_kv = 2, .d_k = 32, .d_v = 16,
                      .seqs = 4, .len_q = lq, .len_k = lk, .causal = true,
                      .variants = {.softcap = 5.0f}, .weights = true};
    ragged_case c;
    ragged_init(&c, &sp, 90);
    float *out = nan_floats(c.n_out), *weights = nan_floats(c.n_w);
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&c.p, c.q, c.k, c.v, out, NULL, weights, NULL, &err), err);
    for (int64_t s = 0; s < sp.seqs; s++) {
        const int64_t q0 = c.cu_q[s], nq = lq[s], k0 = c.cu_k[s], nk = lk[s];
        attn_sdpa_params p = c.p;
        p.ragged = (attn_ragged){0};
        p.n_q = nq;
        p.n_k = nk;
        float *q = xcalloc((size_t)(4 * nq * 32), sizeof *q), *o = nan_floats((size_t)(4 * nq * 16));
        float *k = xcalloc((size_t)(2 * nk * 32), sizeof *k), *v = xcalloc((size_t)(2 * nk * 16), sizeof *v);
        float *w = nan_floats((size_t)(4 * nq * nk));
        for (int64_t h = 0; h < 4; h++)
            memcpy(q + h * nq * 32, c.q + (h * c.n_q + q0) * 32, (size_t)(nq * 32) * sizeof *q);
        for (int64_t h = 0; h < 2; h++) {
            memcpy(k + h * nk * 32, c.k + (h * c.n_k + k0) * 32, (size_t)(nk * 32) * sizeof *k);
            memcpy(v + h * nk * 16, c.v + (h * c.n_k + k0) * 16, (size_t)(nk * 16) * sizeof *v);
        }
        ASSERT_OK(attn_sdpa_forward(&p, q, k, v, o, NULL, w, NULL, &err), err);
        for (int64_t h = 0; h < 4; h++) {
            ck_assert_msg(memcmp(o + h * nq * 16, out + (h * c.n_q + q0) * 16,
                                 (size_t)(nq * 16) * sizeof *o) == 0,
                          "sequence %lld head %lld: output differs from the dense call",
                          (long long)s, (long long)h);
            for (int64_t i = 0; i < nq; i++)
                ck_assert_msg(memcmp(w + (h * nq + i) * nk,
                                     weights + (h * c.n_q + q0 + i) * c.n_k + k0,
                                     (size_t)nk * sizeof *w) == 0,
                              "sequence %lld head %lld row %lld: weights differ",
                              (long long)s, (long long)h, (long long)i);
        }
        free(q), free(k), free(v), free(o), free(w);
    }
    free(out), free(weights);
    ragged_free(&c);
}
END_TEST

START_TEST(rows_that_overflow_are_redone_within_their_sequence)
{
    /* v near float32's largest: the kernels' unnormalised sums overflow
     * and each row is redone in double, over its own sequence's keys. */
    static const int64_t lq[] = {5, 70, 2}, lk[] = {9, 66, 3};
    ragged_spec sp = {.name = "v near 3e38", .heads_q = 2, .heads_kv = 1, .d_k = 4, .d_v = 3,
                      .seqs = 3, .len_q = lq, .len_k = lk, .causal = true};
    ragged_case c;
    ragged_init(&c, &sp, 95);
    for (size_t i = 0; i < c.n_vel; i++)
        c.v[i] = c.v[i] >= 0 ? 3e38f : -3e38f;
    ragged_want w;
    reference(&c, &sp, &w);
    float *out = nan_floats(c.n_out);
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&c.p, c.q, c.k, c.v, out, NULL, NULL, NULL, &err), err);
    ASSERT_ERR(rel_err(out, w.out, c.n_out), TOL_FORWARD, "v near 3e38: out");
    free(out);
    want_free(&w);
    ragged_free(&c);
}
END_TEST

START_TEST(flops_count_only_the_blocks)
{
    static const int64_t lq[] = {3, 0, 10}, lk[] = {5, 7, 2};
    int64_t cu_q[] = {0, 3, 3, 13}, cu_k[] = {0, 5, 12, 14};
    attn_sdpa_params p = sdpa_shape(1, 4, 2, 13, 14, 8, 6);
    p.ragged = (attn_ragged){.seqs = 3, .cu_seqlens_q = cu_q, .cu_seqlens_k = cu_k};
    double pairs = (double)(lq[0] * lk[0] + lq[1] * lk[1] + lq[2] * lk[2]);
    ck_assert_double_eq(attn_sdpa_flops(&p), 2.0 * 4 * pairs * (8 + 6));
    /* A window counts the band within each sequence: [0, 0] one key a row
     * where the sequence has one at the row's position. */
    p.variants = (attn_variants){.window = true, .window_left = 0, .window_right = 0};
    ck_assert_double_eq(attn_sdpa_flops(&p), 2.0 * 4 * (3 + 0 + 2) * (8 + 6));
}
END_TEST

START_TEST(bad_offsets_are_refused)
{
    int64_t cu_ok[] = {0, 2, 5}, cu_neg[] = {0, 3, 2}, cu_start[] = {1, 2, 5},
            cu_short[] = {0, 2, 4};
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 5, 5, 4, 4);
    float buf[64] = {0}, out[64];
    attn_error err = {0};
    const struct {
        int64_t *cu_q, *cu_k;
        int64_t batch;
        const char *says;
    } cases[] = {
        {cu_neg, NULL, 1, "decreases"},
        {cu_start, NULL, 1, "[0] is 1"},
        {cu_short, NULL, 1, "ends at 4"},
        {cu_ok, cu_short, 1, "cu_seqlens_k ends at 4"},
        {cu_ok, NULL, 2, "batch must be 1"},
        {NULL, NULL, 1, "NULL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        p.batch = cases[i].batch;
        p.ragged = (attn_ragged){.seqs = 2, .cu_seqlens_q = cases[i].cu_q,
                                 .cu_seqlens_k = cases[i].cu_k};
        attn_status st = attn_sdpa_forward(&p, buf, buf, buf, out, NULL, NULL, NULL, &err);
        ck_assert_int_eq(st, ATTN_ERR_INVALID);
        ck_assert_msg(strstr(err.message, cases[i].says) != NULL, "case %zu: \"%s\"", i,
                      err.message);
    }
}
END_TEST

/* ------------------------------------------------------------ work units */

typedef struct {
    int64_t seqs;
    int64_t long_items;
    double long_cost, short_cost;
} fake_work;

static int64_t fake_items(const void *ctx, int64_t s)
{
    const fake_work *f = ctx;
    return s == 0 ? f->long_items : 8;
}

static double fake_cost(const void *ctx, int64_t s, int64_t i)
{
    (void)i;
    const fake_work *f = ctx;
    return s == 0 ? f->long_cost : f->short_cost;
}

static double fake_seq_cost(const void *ctx, int64_t s)
{
    return (double)fake_items(ctx, s) * fake_cost(ctx, s, 0);
}

typedef struct {
    const sdpa_work *w;
    int64_t next_s, next_i, seen;
    double cost;
} walk;

static void visit(void *ctx, int64_t s, int64_t i)
{
    walk *k = ctx;
    ck_assert_msg(s == k->next_s && i == k->next_i, "item (%lld, %lld) out of order",
                  (long long)s, (long long)i);
    k->cost += k->w->cost(k->w->ctx, s, i);
    k->seen++;
    k->next_i = i + 1;
    while (k->next_s < k->w->seqs && k->next_i >= k->w->items(k->w->ctx, k->next_s)) {
        k->next_s++;
        k->next_i = 0;
    }
}

START_TEST(work_units_share_the_work_not_the_count)
{
    /* One 4096-row sequence (8 heads x 43 blocks of 96 rows over 4096
     * keys) and 500 short ones (8 heads of 20 rows over 20 keys): dealt
     * to two threads as attn_parallel_for deals units (contiguous halves),
     * each half has the same work within a few percent. */
    fake_work f = {.seqs = 501, .long_items = 8 * 43, .long_cost = 2.0 * 96 * 4096 * 128,
                   .short_cost = 2.0 * 20 * 20 * 128 + 2e4};
    const sdpa_work w = {.ctx = &f, .seqs = f.seqs, .items = fake_items, .cost = fake_cost,
                         .seq_cost = fake_seq_cost};
    for (int order = 0; order < 2; order++) {
        sdpa_units u;
        double total = attn_units_plan(&w, &u);
        ck_assert(u.count >= 2 && u.count <= SDPA_UNITS_MAX);
        walk k = {.w = &w};
        double half[2] = {0, 0};
        for (int64_t unit = 0; unit < u.count; unit++) {
            double before = k.cost;
            attn_unit_items(&w, &u, unit, visit, &k);
            half[unit >= u.count / 2] += k.cost - before;
        }
        ck_assert_int_eq(k.seen, f.long_items + 8 * (f.seqs - 1));
        ck_assert_double_eq_tol(k.cost, total, total * 1e-12);
        ck_assert_msg(fabs(half[0] - half[1]) < 0.05 * total,
                      "halves of %.3g and %.3g", half[0], half[1]);
        /* The other way round: the long sequence last. */
        f.long_items = 8;
        f.short_cost = 2.0 * 96 * 4096 * 128;
        f.long_cost = 2.0 * 20 * 20 * 128 + 2e4;
    }
}
END_TEST

START_TEST(a_small_call_is_one_unit)
{
    fake_work f = {.seqs = 3, .long_items = 2, .long_cost = 100, .short_cost = 10};
    const sdpa_work w = {.ctx = &f, .seqs = f.seqs, .items = fake_items, .cost = fake_cost,
                         .seq_cost = fake_seq_cost};
    sdpa_units u;
    attn_units_plan(&w, &u);
    ck_assert_int_eq(u.count, 1);
}
END_TEST

static Suite *ragged_suite(void)
{
    Suite *s = suite_create("ragged");
    /* The numbers depend on the kernel: run again on each (run-suites.sh). */
    TCase *tc = tcase_create("numbers");
    tcase_set_tags(tc, "kernel");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, each_sequence_matches_its_reference_alone);
    tcase_add_test(tc, cross_lengths_and_empty_key_sequences);
    tcase_add_test(tc, variants_count_positions_within_each_sequence);
    tcase_add_test(tc, masks_are_packed_and_combine_with_the_blocks);
    tcase_add_test(tc, grouped_query_heads_short_and_long_sequences);
    tcase_add_test(tc, both_layouts);
    tcase_add_test(tc, lengths_on_the_tiles);
    tcase_add_test(tc, thousands_of_one_row_sequences);
    tcase_add_test(tc, thousands_of_short_sequences_causal);
    tcase_add_test(tc, one_long_and_many_short_on_any_thread_count);
    tcase_add_test(tc, long_sequences_fold_their_sums_within_their_rows);
    tcase_add_test(tc, one_sequence_is_the_dense_call_bit_for_bit);
    tcase_add_test(tc, rows_that_overflow_are_redone_within_their_sequence);
    suite_add_tcase(s, tc);
    tc = tcase_create("promises");
    tcase_add_test(tc, flops_count_only_the_blocks);
    tcase_add_test(tc, bad_offsets_are_refused);
    tcase_add_test(tc, work_units_share_the_work_not_the_count);
    tcase_add_test(tc, a_small_call_is_one_unit);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(ragged_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
