/* The SDPA test harness; see sdpa_case.h. */
#include "sdpa_case.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"

/* ------------------------------------------------------------- helpers */

uint64_t rng_next(uint64_t *s)
{
    /* splitmix64: reproducible inputs without depending on rand(). */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
double rng_uniform(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-52 - 1.0;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (p == NULL) /* not ck_assert: a passing one costs a write to the runner */
        ck_abort_msg("out of memory in the test itself");
    return p;
}

float *nan_floats(size_t n)
{
    float *x = xcalloc(n, sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = NAN; /* anything the library forgets to write shows up */
    return x;
}

double *to_double(const float *x, size_t n)
{
    double *d = xcalloc(n, sizeof *d);
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

void note(const char *what, double err)
{
    if (getenv("ATTN_TEST_VERBOSE"))
        fprintf(stderr, "  %-52s max err %.3g\n", what, err);
}

/* Largest |got - want| over the largest |want| (over 1 when want is all
 * zeros), so one tolerance serves tensors of any magnitude. A non-finite
 * value where a finite one is wanted is an infinite error. */
double rel_err(const float *got, const double *want, size_t n)
{
    double worst = 0.0, big = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            return INFINITY;
        double d = fabs((double)got[i] - want[i]);
        worst = d > worst ? d : worst;
        big = fabs(want[i]) > big ? fabs(want[i]) : big;
    }
    return worst / (big > 0.0 ? big : 1.0);
}

/* Log-sum-exp: -inf must match -inf exactly, the rest relative to 1+|x|. */
double lse_err(const double *got, const double *want, size_t n)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (want[i] == -INFINITY) {
            if (got[i] != -INFINITY)
                return INFINITY;
            continue;
        }
        if (!isfinite(got[i]))
            return INFINITY;
        double d = fabs(got[i] - want[i]) / (1.0 + fabs(want[i]));
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* Largest |a - b| over the largest |a|, both from the library. */
double float_diff(const float *a, const float *b, size_t n)
{
    double worst = 0.0, big = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i]))
            return INFINITY;
        if (isnan(a[i]) || a[i] == b[i])
            continue;
        double d = fabs((double)a[i] - (double)b[i]);
        worst = d > worst ? d : worst;
        big = fabs(a[i]) > big ? fabs(a[i]) : big;
    }
    return worst / (big > 0.0 ? big : 1.0);
}

int count_nonfinite(const float *x, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += !isfinite(x[i]);
    return bad;
}

/* Shapes and the chapter's default scale 1/sqrt(d_k), computed here. */
attn_sdpa_params sdpa_shape(int64_t batch, int64_t heads_q,
                            int64_t heads_kv, int64_t n_q, int64_t n_k,
                            int64_t d_k, int64_t d_v)
{
    attn_sdpa_params p;
    memset(&p, 0, sizeof p);
    p.batch = batch;
    p.heads_q = heads_q;
    p.heads_kv = heads_kv;
    p.n_q = n_q;
    p.n_k = n_k;
    p.d_k = d_k;
    p.d_v = d_v;
    p.scale = (float)(1.0 / sqrt((double)d_k));
    p.mask.kind = ATTN_MASK_NONE;
    p.threads = 1;
    return p;
}

void fill(float *x, size_t n, uint64_t *seed, double amp)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(amp * rng_uniform(seed));
}

void case_init(sdpa_case *c, const attn_sdpa_params *p, uint64_t seed,
               double q_amp)
{
    memset(c, 0, sizeof *c);
    c->lib = *p;
    c->ref = *p;
    c->n_qel = (size_t)(p->batch * p->heads_q * p->n_q * p->d_k);
    c->n_kel = (size_t)(p->batch * p->heads_kv * p->n_k * p->d_k);
    c->n_vel = (size_t)(p->batch * p->heads_kv * p->n_k * p->d_v);
    c->n_out = (size_t)(p->batch * p->heads_q * p->n_q * p->d_v);
    c->n_rows = (size_t)(p->batch * p->heads_q * p->n_q);
    c->n_w = c->n_rows * (size_t)p->n_k;
    c->q = xcalloc(c->n_qel, sizeof *c->q);
    c->k = xcalloc(c->n_kel, sizeof *c->k);
    c->v = xcalloc(c->n_vel, sizeof *c->v);
    c->dout = xcalloc(c->n_out, sizeof *c->dout);
    uint64_t s = seed * 7919u + 17u;
    fill(c->q, c->n_qel, &s, q_amp);
    fill(c->k, c->n_kel, &s, 1.0);
    fill(c->v, c->n_vel, &s, 1.0);
    fill(c->dout, c->n_out, &s, 1.0);
    c->qd = to_double(c->q, c->n_qel);
    c->kd = to_double(c->k, c->n_kel);
    c->vd = to_double(c->v, c->n_vel);
    c->doutd = to_double(c->dout, c->n_out);
}

/* After editing c->q/k/v/dout by hand. */
void case_sync(sdpa_case *c)
{
    for (size_t i = 0; i < c->n_qel; i++)
        c->qd[i] = c->q[i];
    for (size_t i = 0; i < c->n_kel; i++)
        c->kd[i] = c->k[i];
    for (size_t i = 0; i < c->n_vel; i++)
        c->vd[i] = c->v[i];
    for (size_t i = 0; i < c->n_out; i++)
        c->doutd[i] = c->dout[i];
}

void case_free(sdpa_case *c)
{
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->dout);
    free(c->qd);
    free(c->kd);
    free(c->vd);
    free(c->doutd);
    free(c->mask_src);
    free(c->mask_full);
}

/* Index of full-shape element (b,h,i,j) in a contiguous mask of `rank`
 * dims `shape`, by NumPy's rules: align on the right, size 1 repeats. */
size_t numpy_index(int rank, const int64_t *shape, const int64_t *at4)
{
    size_t idx = 0;
    for (int t = 0; t < rank; t++) {
        int64_t coord = shape[t] == 1 ? 0 : at4[4 - rank + t];
        idx = idx * (size_t)shape[t] + (size_t)coord;
    }
    return idx;
}

/*
 * Gives the case a random mask of `kind` and shape `shape`: the library
 * reads it through attn_mask_broadcast, the reference through a full
 * expansion made here. Boolean masks allow a key with probability 3/4.
 */
void case_mask(sdpa_case *c, attn_mask_kind kind, int rank,
               const int64_t *shape, uint64_t seed)
{
    size_t n_src = 1;
    for (int t = 0; t < rank; t++)
        n_src *= (size_t)shape[t];
    size_t el = kind == ATTN_MASK_BOOL ? sizeof(uint8_t) : sizeof(float);
    c->mask_src = xcalloc(n_src, el);
    c->mask_full = xcalloc(c->n_w, el);
    uint64_t s = seed * 104729u + 5u;
    for (size_t i = 0; i < n_src; i++) {
        if (kind == ATTN_MASK_BOOL)
            ((uint8_t *)c->mask_src)[i] = rng_uniform(&s) > -0.5;
        else
            ((float *)c->mask_src)[i] = (float)(2.0 * rng_uniform(&s));
    }
    const attn_sdpa_params *p = &c->lib;
    size_t f = 0;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < p->n_q; i++)
                for (int64_t j = 0; j < p->n_k; j++, f++) {
                    int64_t at[4] = {b, h, i, j};
                    size_t src = numpy_index(rank, shape, at);
                    memcpy((char *)c->mask_full + f * el,
                           (char *)c->mask_src + src * el, el);
                }

    attn_error err = {0};
    c->lib.mask.kind = kind;
    c->lib.mask.allowed = kind == ATTN_MASK_BOOL ? c->mask_src : NULL;
    c->lib.mask.bias = kind == ATTN_MASK_BIAS ? c->mask_src : NULL;
    attn_status st = attn_mask_broadcast(&c->lib.mask, rank, shape, p->batch,
                                         p->heads_q, p->n_q, p->n_k, &err);
    ASSERT_OK(st, err);

    c->ref.mask.kind = kind;
    c->ref.mask.allowed = kind == ATTN_MASK_BOOL ? c->mask_full : NULL;
    c->ref.mask.bias = kind == ATTN_MASK_BIAS ? c->mask_full : NULL;
    c->ref.mask.stride[0] = p->heads_q * p->n_q * p->n_k;
    c->ref.mask.stride[1] = p->n_q * p->n_k;
    c->ref.mask.stride[2] = p->n_k;
    c->ref.mask.stride[3] = 1;
}

void lib_forward(const sdpa_case *c, const attn_sdpa_params *p,
                 lib_fwd *r, bool want_weights, bool want_stats)
{
    r->out = nan_floats(c->n_out);
    r->rows = xcalloc(c->n_rows, sizeof *r->rows);
    r->lse = xcalloc(c->n_rows, sizeof *r->lse);
    for (size_t i = 0; i < c->n_rows; i++)
        r->rows[i] = (attn_softmax_row){NAN, NAN};
    r->weights = want_weights ? nan_floats(c->n_w) : NULL;
    memset(&r->stats, 0, sizeof r->stats);
    attn_error err = {0};
    attn_status st =
        attn_sdpa_forward(p, c->q, c->k, c->v, r->out, r->rows, r->weights,
                          want_stats ? &r->stats : NULL, &err);
    ASSERT_OK(st, err);
    for (size_t i = 0; i < c->n_rows; i++)
        r->lse[i] = attn_softmax_lse(r->rows[i]);
}

void lib_fwd_free(lib_fwd *r)
{
    free(r->out);
    free(r->rows);
    free(r->lse);
    free(r->weights);
}

void reference_forward(const sdpa_case *c, ref_fwd *r, bool weights)
{
    r->out = xcalloc(c->n_out, sizeof *r->out);
    r->lse = xcalloc(c->n_rows, sizeof *r->lse);
    r->weights = weights ? xcalloc(c->n_w, sizeof *r->weights) : NULL;
    ref_sdpa_forward(&c->ref, c->qd, c->kd, c->vd, r->out, r->lse,
                     r->weights);
}

void ref_fwd_free(ref_fwd *r)
{
    free(r->out);
    free(r->lse);
    free(r->weights);
}

/* Output, log-sum-exp and (when small enough) weights against the
 * reference; returns the largest of the three errors. */
double check_forward(const sdpa_case *c, double tol, const char *what)
{
    bool weights = c->n_w <= (size_t)1 << 20;
    lib_fwd got;
    ref_fwd want;
    lib_forward(c, &c->lib, &got, weights, false);
    reference_forward(c, &want, weights);
    char label[160];
    double e_out = rel_err(got.out, want.out, c->n_out);
    snprintf(label, sizeof label, "%s: out", what);
    ASSERT_ERR(e_out, tol, label);
    double e_lse = lse_err(got.lse, want.lse, c->n_rows);
    snprintf(label, sizeof label, "%s: lse", what);
    ASSERT_ERR(e_lse, tol, label);
    double e_w = 0.0;
    if (weights) {
        e_w = rel_err(got.weights, want.weights, c->n_w);
        snprintf(label, sizeof label, "%s: weights", what);
        ASSERT_ERR(e_w, tol, label);
    }
    lib_fwd_free(&got);
    ref_fwd_free(&want);
    double worst = e_out > e_lse ? e_out : e_lse;
    return worst > e_w ? worst : e_w;
}

void lib_backward(const sdpa_case *c, const attn_sdpa_params *p,
                  lib_grads *g)
{
    lib_fwd f;
    lib_forward(c, p, &f, false, false);
    g->dq = nan_floats(c->n_qel);
    g->dk = nan_floats(c->n_kel);
    g->dv = nan_floats(c->n_vel);
    attn_error err = {0};
    attn_status st = attn_sdpa_backward(p, c->q, c->k, c->v, f.out, f.rows,
                                        c->dout, g->dq, g->dk, g->dv, &err);
    ASSERT_OK(st, err);
    lib_fwd_free(&f);
}

void lib_grads_free(lib_grads *g)
{
    free(g->dq);
    free(g->dk);
    free(g->dv);
}

/* dq, dk, dv of the library against central finite differences of the
 * double reference (and against its analytic gradients). Small sizes only:
 * every input element costs two reference forward passes. */
void check_grad_fd(sdpa_case *c, const char *what)
{
    lib_grads g;
    lib_backward(c, &c->lib, &g);
    double *fq = xcalloc(c->n_qel, sizeof *fq);
    double *fk = xcalloc(c->n_kel, sizeof *fk);
    double *fv = xcalloc(c->n_vel, sizeof *fv);
    ref_sdpa_grad_fd(&c->ref, c->qd, c->kd, c->vd, c->doutd, 1e-5, fq, fk,
                     fv);
    char label[160];
    snprintf(label, sizeof label, "%s: dq vs finite differences", what);
    ASSERT_ERR(rel_err(g.dq, fq, c->n_qel), TOL_GRAD, label);
    snprintf(label, sizeof label, "%s: dk vs finite differences", what);
    ASSERT_ERR(rel_err(g.dk, fk, c->n_kel), TOL_GRAD, label);
    snprintf(label, sizeof label, "%s: dv vs finite differences", what);
    ASSERT_ERR(rel_err(g.dv, fv, c->n_vel), TOL_GRAD, label);

    ref_sdpa_backward(&c->ref, c->qd, c->kd, c->vd, c->doutd, fq, fk, fv);
    snprintf(label, sizeof label, "%s: dq vs analytic", what);
    ASSERT_ERR(rel_err(g.dq, fq, c->n_qel), TOL_GRAD_ANALYTIC, label);
    snprintf(label, sizeof label, "%s: dk vs analytic", what);
    ASSERT_ERR(rel_err(g.dk, fk, c->n_kel), TOL_GRAD_ANALYTIC, label);
    snprintf(label, sizeof label, "%s: dv vs analytic", what);
    ASSERT_ERR(rel_err(g.dv, fv, c->n_vel), TOL_GRAD_ANALYTIC, label);
    free(fq);
    free(fk);
    free(fv);
    lib_grads_free(&g);
}

/* The same against the analytic double reference, for larger sizes. */
void check_grad_analytic(sdpa_case *c, const char *what)
{
    lib_grads g;
    lib_backward(c, &c->lib, &g);
    double *rq = xcalloc(c->n_qel, sizeof *rq);
    double *rk = xcalloc(c->n_kel, sizeof *rk);
    double *rv = xcalloc(c->n_vel, sizeof *rv);
    ref_sdpa_backward(&c->ref, c->qd, c->kd, c->vd, c->doutd, rq, rk, rv);
    char label[160];
    snprintf(label, sizeof label, "%s: dq", what);
    ASSERT_ERR(rel_err(g.dq, rq, c->n_qel), TOL_GRAD_ANALYTIC, label);
    snprintf(label, sizeof label, "%s: dk", what);
    ASSERT_ERR(rel_err(g.dk, rk, c->n_kel), TOL_GRAD_ANALYTIC, label);
    snprintf(label, sizeof label, "%s: dv", what);
    ASSERT_ERR(rel_err(g.dv, rv, c->n_vel), TOL_GRAD_ANALYTIC, label);
    free(rq);
    free(rk);
    free(rv);
    lib_grads_free(&g);
}
