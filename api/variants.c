/*
 * The attention variants, judged the same way on both compute
 * routes: "window", "alibi_slopes", "softcap" and "rope" become libattn's
 * attn_variants, and "return_lse" turns the forward pass's softmax rows
 * into log-sum-exps. The fields' types were checked when they were read
 * (api_read_fields); what is judged here needs the shapes: the range of
 * each option, the shape of the slopes, an even d_k for the rotation.
 */
#include "request.h"

#include <math.h>

/* 422 invalid_value unless both sides are >= -1 (-1: unbounded). */
static bool window_setup(const api_value *w, attn_variants *v, api_error *err)
{
    if (!w->present)
        return true;
    for (int side = 0; side < 2; side++)
        if (w->pair[side] < -1)
            return api_fail(err, 422, "invalid_value", "window",
                            "window [%lld, %lld]: the %s side is %lld; each side must be "
                            ">= 0 keys, or -1 for unbounded",
                            (long long)w->pair[0], (long long)w->pair[1],
                            side ? "right" : "left", (long long)w->pair[side]);
    /* [-1, -1] is no window: the same answer, FLOPs and work as leaving it
     * out (with causal, meta.flops stays the nominal count causal has) */
    if (w->pair[0] == -1 && w->pair[1] == -1)
        return true;
    v->window = true;
    v->window_left = w->pair[0];
    v->window_right = w->pair[1];
    return true;
}

/* One slope per query head: [heads_q], or [batch, heads_q] for a slope per
 * sequence and head (FlashAttention's two forms). */
static bool alibi_setup(const api_value *a, const api_variant_shape *s,
                        attn_variants *v, api_error *err)
{
    if (!a->present)
        return true;
    const codec_tensor *t = &a->tensor;
    bool per_head = t->rank == 1 && t->shape[0] == s->heads_q;
    bool per_batch = t->rank == 2 && t->shape[0] == s->batch && t->shape[1] == s->heads_q;
    if (!per_head && !per_batch) {
        char got[96];
        return api_fail(err, 422, "shape_mismatch", "alibi_slopes",
                        "alibi_slopes has shape %s but must have one slope per query "
                        "head: [%s] = [%lld], or [batch, %s] = [%lld, %lld]",
                        api_shape_text(got, sizeof got, t->rank, t->shape), s->heads_name,
                        (long long)s->heads_q, s->heads_name, (long long)s->batch,
                        (long long)s->heads_q);
    }
    v->alibi_slopes = t->f32;
    v->alibi_batch_stride = per_batch ? s->heads_q : 0;
    return true;
}

bool api_variants_setup(const api_variant_values *f, const api_variant_shape *s,
                        attn_variants *v, api_error *err)
{
    *v = (attn_variants){0};
    if (!window_setup(f->window, v, err) || !alibi_setup(f->alibi_slopes, s, v, err))
        return false;
    if (f->softcap->present) {
        if (!(f->softcap->number > 0))
            return api_fail(err, 422, "invalid_value", "softcap",
                            "softcap must be greater than 0 (as a float32), got %g; leave "
                            "it out for no soft-capping", (double)f->softcap->number);
        v->softcap = f->softcap->number;
    }
    if (f->rope->present) {
        if (!(f->rope->number > 0))
            return api_fail(err, 422, "invalid_value", "rope.base",
                            "rope.base must be greater than 0 (as a float32), got %g",
                            (double)f->rope->number);
        if (s->d_k % 2 != 0)
            return api_fail(err, 422, "invalid_value", "rope",
                            "rope rotates pairs of features (t, t + d_k/2), so d_k must be "
                            "even; d_k is %lld", (long long)s->d_k);
        v->rope_base = f->rope->number;
    }
    return true;
}

double api_alibi_bound(const attn_variants *v, const codec_tensor *slopes, int64_t n_q,
                       int64_t n_k)
{
    if (!v->alibi_slopes)
        return 0;
    /* |p_i - j| with p_i = i + n_k - n_q: at most n_k - 1 (the first key
     * from the last query) or n_q - 1 (the last key from the first). */
    double distance = (double)(n_q > n_k ? n_q : n_k) - 1;
    return api_max_abs(slopes->f32, slopes->count) * distance;
}

void api_lse_rows(const attn_softmax_row *rows, int64_t count, float *lse)
{
    for (int64_t i = 0; i < count; i++)
        lse[i] = (float)attn_softmax_lse(rows[i]);
}

/* libattn's key tiles are 64 keys wide (lib/kern.h), and a tile the
 * window's edge cuts is computed whole: up to three of them a query row
 * (one at each edge, and one more where a backward block of 64 rows
 * widens the band), priced as scores. */
#define WINDOW_EDGE_KEYS (3 * 64)

void api_variant_cost(const attn_sdpa_params *p, api_cost_terms *t)
{
    const attn_variants *v = &p->variants;
    if (v->window) {
        /* attn_sdpa_flops counts the pairs of the band */
        double band = attn_sdpa_flops(p) / (2.0 * (double)(p->d_k + p->d_v));
        t->scores = fmin(t->scores, band + t->rows * WINDOW_EDGE_KEYS);
    }
    if (v->softcap > 0)
        t->softcapped = t->scores;
    if (v->alibi_slopes)
        t->biased = t->scores;
    if (v->rope_base > 0) {
        /* one table of angles over the positions of the call (queries at
         * n_k - n_q .. n_k - 1, keys at 0 .. n_k - 1), shared by the heads;
         * a ragged batch's sequences together span at most n_q + n_k */
        double positions = p->ragged.seqs > 0 ? (double)(p->n_q + p->n_k)
                                               : (double)(p->n_q > p->n_k ? p->n_q : p->n_k);
        t->angles = positions * (double)(p->d_k / 2);
        t->rotated = (double)p->batch *
                     ((double)p->heads_q * (double)p->n_q + (double)p->heads_kv * (double)p->n_k) *
                     (double)p->d_k;
    }
}

bool api_check_lse(const float *lse, int64_t count, const char *what, codec_encoding enc,
                   api_error *err)
{
    codec_dtype dtype = codec_encoding_dtype(enc);
    for (int64_t i = 0; i < count; i++) {
        if (lse[i] == -INFINITY)
            continue;
        size_t at;
        if (!isfinite(lse[i]))
            return api_fail(err, 422, "numerical_overflow", "",
                            "%s overflows float32 (a non-finite value at element %lld); the "
                            "inputs are too large in magnitude, scale them down",
                            what, (long long)i);
        if (dtype != CODEC_F32 && !codec_half_fits(dtype, lse + i, 1, &at))
            return api_fail(err, 422, "numerical_overflow", "output_dtype",
                            "%s does not fit %s: element %lld (row-major) is %g, beyond its "
                            "largest finite value; ask for a wider output_dtype", what,
                            codec_dtype_name(dtype), (long long)i, (double)lse[i]);
    }
    return true;
}
