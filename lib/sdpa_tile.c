/*
 * The tile routines of scaled dot-product attention, around which
 * sdpa_forward.c and sdpa_backward.c put their loops (as BLIS puts its
 * macro-kernel loops around a micro-kernel). A tile is query rows
 * [i0, i0 + rows) of head (b, h) against keys [j0, j0 + cols):
 *   q_t [rows, d_k], k_t [cols, d_k], v_t [cols, d_v]   (slices of the inputs)
 *   scores [rows, cols] = scale * q_t k_t^T + bias       (a workspace, never n_q x n_k)
 * Every matrix product is one cblas_sgemm call on the tile.
 */
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "sdpa.h"
#include "vexp.h"

const float *sdpa_head_q(const sdpa_call *c, int64_t b, int64_t h)
{
    const attn_sdpa_params *p = c->p;
    return c->q + (b * p->heads_q + h) * p->n_q * p->d_k;
}

const float *sdpa_head_k(const sdpa_call *c, int64_t b, int64_t h)
{
    const attn_sdpa_params *p = c->p;
    return c->k + (b * p->heads_kv + h / c->group) * p->n_k * p->d_k;
}

const float *sdpa_head_v(const sdpa_call *c, int64_t b, int64_t h)
{
    const attn_sdpa_params *p = c->p;
    return c->v + (b * p->heads_kv + h / c->group) * p->n_k * p->d_v;
}

int64_t sdpa_causal_end(const sdpa_call *c, int64_t i0, int64_t rows)
{
    int64_t end = i0 + rows + c->offset; /* last row sees keys < end */
    if (end < 0)
        return 0;
    return end < c->p->n_k ? end : c->p->n_k;
}

void sdpa_scores(const sdpa_call *c, const sdpa_tile *t, float alpha, float *scores,
                 int64_t ld)
{
    const int64_t d_k = c->p->d_k;
    const float *q = sdpa_head_q(c, t->b, t->h) + t->i0 * d_k;
    const float *k = sdpa_head_k(c, t->b, t->h) + t->j0 * d_k;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)t->rows, (int)t->cols,
                (int)d_k, alpha, q, (int)d_k, k, (int)d_k, 0.0f, scores, (int)ld);
}

void sdpa_mask_tile(const sdpa_call *c, const sdpa_tile *t, unsigned what,
                    float *scores, int64_t ld)
{
    const attn_sdpa_params *p = c->p;
    const attn_mask *m = &p->mask;
    if ((what & SDPA_BIAS) && m->kind == ATTN_MASK_BIAS) {
        int64_t base = t->b * m->stride[0] + t->h * m->stride[1] + t->j0 * m->stride[3];
        for (int64_t r = 0; r < t->rows; r++)
            sdpa_mask_row_bias(m, base + (t->i0 + r) * m->stride[2], scores + r * ld,
                               t->cols);
    }
    if (!(what & SDPA_HIDE))
        return;
    if (m->kind == ATTN_MASK_BOOL) {
        int64_t base = t->b * m->stride[0] + t->h * m->stride[1] + t->j0 * m->stride[3];
        for (int64_t r = 0; r < t->rows; r++)
            sdpa_mask_row_hide(m, base + (t->i0 + r) * m->stride[2], scores + r * ld,
                               t->cols);
    }
    /* Only tiles that straddle the diagonal need the causal mask; the loops
     * skip the tiles wholly above it. */
    if (p->causal && t->j0 + t->cols - 1 > t->i0 + c->offset) {
        for (int64_t r = 0; r < t->rows; r++) {
            int64_t first_hidden = t->i0 + r + c->offset + 1 - t->j0;
            if (first_hidden < 0)
                first_hidden = 0;
            float *x = scores + r * ld;
            for (int64_t j = first_hidden; j < t->cols; j++)
                x[j] = -INFINITY;
        }
    }
}

/* ---------------------------------------------------------------- forward */

static void scale_row(float *x, int64_t n, float a)
{
    for (int64_t j = 0; j < n; j++)
        x[j] *= a;
}

/*
 * Online softmax (FlashAttention): each row keeps its running maximum m and
 * the running sum l of exp(x - m); when a tile raises m, the sum and the
 * output accumulated so far are rescaled by exp(m_old - m_new). Subtracting
 * the maximum keeps every exponent <= 0, so nothing overflows, and the row's
 * largest score contributes exactly exp(0) = 1 (scores of +-1e4 give an
 * exact one-hot). Normalisation by l waits until the last tile.
 */
void sdpa_forward_tile(const sdpa_call *c, const sdpa_tile *t, sdpa_fwd_state *st)
{
    const attn_sdpa_params *p = c->p;
    const int64_t ld = st->ld, d_v = p->d_v;
    float *s = st->scores;
    if (st->stats != NULL) {
        /* Statistics see the raw scores of the visible entries. */
        sdpa_scores(c, t, 1.0f, s, ld);
        sdpa_mask_tile(c, t, SDPA_HIDE, s, ld);
        sdpa_stats_scores(st->stats, s, ld, t->rows, t->cols);
        for (int64_t r = 0; r < t->rows; r++)
            scale_row(s + r * ld, t->cols, p->scale);
        sdpa_mask_tile(c, t, SDPA_BIAS, s, ld);
    } else {
        sdpa_scores(c, t, p->scale, s, ld);
        sdpa_mask_tile(c, t, SDPA_HIDE | SDPA_BIAS, s, ld);
    }
    for (int64_t r = 0; r < t->rows; r++) {
        float *x = s + r * ld;
        float m_old = st->m[r];
        float m_tile = attn_vmax(x, t->cols);
        float m_new = m_tile > m_old ? m_tile : m_old;
        if (m_new == -INFINITY) {
            /* Nothing visible in this row yet: P is 0, the state stays 0. */
            memset(x, 0, (size_t)t->cols * sizeof *x);
            continue;
        }
        if (st->stats != NULL)
            memcpy(st->row_copy, x, (size_t)t->cols * sizeof *x);
        float sum = attn_vexp_sum(x, t->cols, m_new);
        if (m_new > m_old) {
            float shrink = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
            if (st->stats != NULL)
                /* sum p (x - m) re-centred on the new maximum */
                st->ent[r] = shrink == 0.0f ? 0.0
                                            : shrink * (st->ent[r] + ((double)m_old - m_new) *
                                                                         st->l[r]);
            st->l[r] *= (double)shrink;
            scale_row(st->out + r * d_v, d_v, shrink);
            st->m[r] = m_new;
        }
        st->l[r] += sum;
        if (st->stats != NULL) {
            double e = 0.0;
            for (int64_t j = 0; j < t->cols; j++)
                if (x[j] > 0.0f)
                    e += (double)x[j] * ((double)st->row_copy[j] - m_new);
            st->ent[r] += e;
        }
    }
    const float *v = sdpa_head_v(c, t->b, t->h) + t->j0 * d_v;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)t->rows, (int)d_v,
                (int)t->cols, 1.0f, s, (int)ld, v, (int)d_v, 1.0f, st->out, (int)d_v);
}

/* --------------------------------------------------------------- backward */

/*
 * FlashAttention-2's backward step, with P recomputed from the forward
 * pass's log-sum-exp instead of stored:
 *   P  = exp(scale * q_t k_t^T + bias - lse)      [rows, cols]
 *   dP = dO v_t^T                                 [rows, cols]
 *   dS = P * (dP - delta), delta_i = rowsum(dO_i * O_i)
 *   dV += P^T dO    dQ += scale * dS k_t    dK += scale * dS^T q_t
 * P and dS are made in one pass over the two tiles (attn_vsoftmax_grad).
 * A hidden score has P = 0 and so contributes nothing, and a fully masked
 * row (lse = -inf) is zeroed outright: its gradients stay exactly 0.
 */
void sdpa_backward_tile(const sdpa_call *c, const sdpa_tile *t, const sdpa_bwd_state *st)
{
    const attn_sdpa_params *p = c->p;
    const int64_t ld = SDPA_BWD_BK, d_k = p->d_k, d_v = p->d_v;
    const int rows = (int)t->rows, cols = (int)t->cols;
    float *P = st->p, *dP = st->dp;
    const float *q = sdpa_head_q(c, t->b, t->h) + t->i0 * d_k;
    const float *k = sdpa_head_k(c, t->b, t->h) + t->j0 * d_k;
    const float *v = sdpa_head_v(c, t->b, t->h) + t->j0 * d_v;

    sdpa_scores(c, t, p->scale, P, ld);
    sdpa_mask_tile(c, t, SDPA_HIDE | SDPA_BIAS, P, ld);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, (int)d_v, 1.0f,
                st->dout, (int)d_v, v, (int)d_v, 0.0f, dP, (int)ld);
    /* One pass turns the scores into P and dP into dS. */
    for (int64_t r = 0; r < rows; r++) {
        if (st->lse[r] == -INFINITY) {
            memset(P + r * ld, 0, (size_t)cols * sizeof *P);
            memset(dP + r * ld, 0, (size_t)cols * sizeof *dP);
        } else {
            /* lse as an unevaluated sum hi + lo of two floats: the scores
             * near hi cancel exactly in s - hi, and lo keeps the log of
             * the row sum that a single float would round away. */
            float hi = (float)st->lse[r], lo = (float)(st->lse[r] - (double)hi);
            attn_vsoftmax_grad(P + r * ld, dP + r * ld, cols, hi, lo, st->delta[r]);
        }
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, (int)d_v, rows, 1.0f, P,
                (int)ld, st->dout, (int)d_v, 1.0f, st->dv, (int)d_v);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, (int)d_k, cols, p->scale,
                dP, (int)ld, k, (int)d_k, 1.0f, st->dq, (int)d_k);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, (int)d_k, rows, p->scale,
                dP, (int)ld, q, (int)d_k, 1.0f, st->dk, (int)d_k);
}
