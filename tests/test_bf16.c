/*
 * bfloat16 precision (ATTN_PRECISION_BFLOAT16), against a double-precision
 * reference of the computation attn.h documents, written here from that
 * text: q, k, v (and dO, P, dS in the backward) rounded to bfloat16, exact
 * products, the online softmax's weights rounded per block of 64 keys.
 * Every comparison is element by element against a bound derived below
 * from float32's unit roundoff and the lengths of the sums, so that a
 * kernel that skips a rounding (or rounds the wrong value) fails it; one
 * test shows that float32 products do fail it.
 *
 * Then the products themselves: every kernel's bfloat16 product against
 * the vdpbf16ps instruction (on a CPU that has it) and against a model of
 * the instruction's pseudocode written here, bit for bit, over random
 * words with subnormals, infinities, huge and tiny exponents and
 * cancellations; and the vdpbf16ps kernel against the emulated one, bit for
 * bit, on whole forward and backward calls of every variant.
 *
 * The cases tagged "kernel" run once per kernel (tests/run-suites.sh sets
 * ATTN_KERNEL): attn_sdpa_forward uses that kernel's bfloat16 path
 * (attn_bf16()); the others walk every kernel themselves.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "attn.h"
#include "kern.h" /* lib-private: the kernels, side by side */
#include "support/ref.h"
#include "support/sdpa_case.h"

/* ------------------------------------------------------------ bfloat16 */

/* float32's unit roundoff: a rounded float32 operation is exact * (1 + e),
 * |e| <= U32. */
#define U32 0x1p-24
/* attn.h: the online softmax rounds the weights of blocks of 64 keys. */
#define KEY_BLOCK 64
/* The bounds below drop second-order terms ((1 + u)^n - 1 taken as n u, the
 * products of two errors) and round their constants down to simple ones:
 * twice the bound covers what is dropped. */
#define SAFETY 2.0

/* bfloat16 rounding from its definition (attn.h), in double: 8 significant
 * bits, to nearest, ties to even (nearbyint in the default rounding mode);
 * float32 subnormals to zero; saturation at 0x1.fep127. x is a float32
 * value or, in the bounds, any double (rounding a real number is monotone,
 * which is all the bounds ask of it). */
static double bf16(double x)
{
    if (isnan(x) || isinf(x))
        return x;
    double a = fabs(x);
    if (a < 0x1p-126)
        return copysign(0.0, x);
    int e;
    double m = frexp(a, &e); /* a = m 2^e, m in [1/2, 1) */
    double r = ldexp(nearbyint(ldexp(m, 8)), e - 8);
    return copysign(r > 0x1.fep127 ? 0x1.fep127 : r, x);
}

/* How far the rounding of a value known to lie within +-e of v can fall
 * from bf16(v): 0 unless the interval crosses a rounding boundary. */
static double round_slack(double v, double e)
{
    if (e <= 0.0)
        return 0.0;
    double r = bf16(v);
    return fmax(fabs(bf16(v - e) - r), fabs(bf16(v + e) - r));
}

/* gamma_n: the relative error bound of a float32 sum of n terms. */
static double gamma32(double n)
{
    return n * U32 / (1.0 - n * U32);
}

/* ---------------------------------------------------------- reference */

/* A value of the reference and the bound on the library's distance from it. */
typedef struct {
    double *val, *tol;
} ref_t;

static ref_t ref_alloc(size_t n)
{
    return (ref_t){xcalloc(n, sizeof(double)), xcalloc(n, sizeof(double))};
}

static void ref_free(ref_t *r)
{
    free(r->val);
    free(r->tol);
}

static int64_t q_position(const attn_sdpa_params *p, int64_t i) { return i + p->n_k - p->n_q; }

/* The operands as the kernels see them: q, k rotated (RoPE, in double and
 * rounded once to float32 by libattn: within U32 of the exact rotation, and
 * cos/sin within a few 1e-16) and rounded to bfloat16, each with its slack
 * (round_slack of that error); v rounded. [B, H, n, d] as the case's. */
typedef struct {
    double *q, *k, *v, *sq, *sk;
    double *sv; /* v's slack, where v itself is computed (NULL: v is exact) */
} operands;

static void rotate_row(const attn_sdpa_params *p, const double *x, int64_t pos, double *y,
                       double *err)
{
    const int64_t d = p->d_k, half = d / 2;
    for (int64_t t = 0; t < d; t++) {
        y[t] = x[t];
        err[t] = 0.0;
    }
    if (!(p->variants.rope_base > 0.0f))
        return;
    for (int64_t t = 0; t < half; t++) {
        double angle = (double)pos * pow((double)p->variants.rope_base, -2.0 * t / (double)d);
        double c = cos(angle), s = sin(angle);
        y[t] = x[t] * c - x[t + half] * s;
        y[t + half] = x[t + half] * c + x[t] * s;
        double e = 1e-15 * (fabs(x[t]) + fabs(x[t + half]));
        err[t] = U32 * fabs(y[t]) + e;
        err[t + half] = U32 * fabs(y[t + half]) + e;
    }
}

static operands operands_of(const sdpa_case *c)
{
    const attn_sdpa_params *p = &c->ref;
    operands o = {xcalloc(c->n_qel, sizeof(double)), xcalloc(c->n_kel, sizeof(double)),
                  xcalloc(c->n_vel, sizeof(double)), xcalloc(c->n_qel, sizeof(double)),
                  xcalloc(c->n_kel, sizeof(double)), NULL};
    double *y = xcalloc((size_t)p->d_k, sizeof *y), *e = xcalloc((size_t)p->d_k, sizeof *e);
    for (size_t r = 0; r < c->n_qel / (size_t)p->d_k; r++) {
        rotate_row(p, c->qd + r * (size_t)p->d_k, q_position(p, (int64_t)r % p->n_q), y, e);
        for (int64_t t = 0; t < p->d_k; t++) {
            o.q[r * (size_t)p->d_k + (size_t)t] = bf16(y[t]);
            o.sq[r * (size_t)p->d_k + (size_t)t] = round_slack(y[t], e[t]);
        }
    }
    for (size_t r = 0; r < c->n_kel / (size_t)p->d_k; r++) {
        rotate_row(p, c->kd + r * (size_t)p->d_k, (int64_t)r % p->n_k, y, e);
        for (int64_t t = 0; t < p->d_k; t++) {
            o.k[r * (size_t)p->d_k + (size_t)t] = bf16(y[t]);
            o.sk[r * (size_t)p->d_k + (size_t)t] = round_slack(y[t], e[t]);
        }
    }
    for (size_t i = 0; i < c->n_vel; i++)
        o.v[i] = bf16(c->vd[i]);
    free(y);
    free(e);
    return o;
}

static void operands_free(operands *o)
{
    free(o->q);
    free(o->k);
    free(o->v);
    free(o->sq);
    free(o->sk);
    free(o->sv);
}

/*
 * One score x_ij, its bound dx (how far the library's float32 x can be),
 * and, with a soft cap, th = tanh(scaled / cap). False when hidden.
 *
 * The library's score is a chain of d_k fused multiply-adds on the rounded
 * operands (vdpbf16ps's steps): within gamma_dk * sum |q k| of the exact
 * sum, plus what the operands' slack moves it. Then float32 operations,
 * each one rounding (U32 of its result): the scale, the soft cap (its tanh
 * within 8 U32, the division and product around it), ALiBi's fused
 * multiply-add, the mask's addition. The soft cap's derivative is at most
 * 1, so it passes the score's error on unchanged.
 */
typedef struct {
    double x, dx, th;
} score;

static bool score_of(const attn_sdpa_params *p, const operands *o, int64_t b, int64_t h,
                     int64_t i, int64_t j, score *sc)
{
    double bias;
    if (!ref_visible(p, b, h, i, j, &bias))
        return false;
    const int64_t g = h / (p->heads_q / p->heads_kv), d = p->d_k;
    const size_t qa = (size_t)(((b * p->heads_q + h) * p->n_q + i) * d);
    const size_t ka = (size_t)(((b * p->heads_kv + g) * p->n_k + j) * d);
    double s = 0.0, mag = 0.0, moved = 0.0;
    for (int64_t t = 0; t < d; t++) {
        double qt = o->q[qa + (size_t)t], kt = o->k[ka + (size_t)t];
        double sq = o->sq[qa + (size_t)t], sk = o->sk[ka + (size_t)t];
        s += qt * kt;
        mag += fabs(qt * kt);
        moved += sq * fabs(kt) + fabs(qt) * sk + sq * sk;
    }
    const double scale = p->scale, cap = p->variants.softcap;
    double ds = gamma32((double)d) * (mag + moved) + moved;
    double scaled = scale * s, x = scaled, dx = scale * ds + U32 * fabs(scaled);
    sc->th = 0.0;
    if (cap > 0.0) {
        sc->th = tanh(scaled / cap);
        x = cap * sc->th;
        dx += 8 * U32 * cap + 2 * U32 * fabs(scaled);
    }
    double alibi = 0.0, mask = bias;
    if (p->variants.alibi_slopes != NULL) {
        const int64_t pos = q_position(p, i);
        alibi = -(double)p->variants.alibi_slopes[b * p->variants.alibi_batch_stride + h] *
                (double)(pos > j ? pos - j : j - pos);
        mask = bias - alibi;
    }
    sc->x = x + alibi + mask;
    sc->dx = dx + U32 * (fabs(x + alibi) + fabs(sc->x));
    return true;
}

/* The forward of one row, as attn.h states it, with its bounds. */
typedef struct {
    double m, l;   /* the final maximum; the sum of the rounded weights */
    double dm, dl; /* bounds on the library's m and l */
} row_ref;

/*
 * out_i = sum_j w_j v~_j / l,  w_j = bf16(exp(x_j - m(t))) exp(m(t) - m),
 * with m(t) the running maximum after block t of j.
 *
 * The library's weight before rounding is exp of x^_j - m^(t), its float
 * scores and maxima: |x^ - x| <= dx_j, |m^(t) - m(t)| <= the largest dx so
 * far, one rounding in the subtraction, exp within 3 ulp (2^-21 relative).
 * So it lies within e (1.01 d + 2^-21) of e = exp(x_j - m(t)), d the
 * argument's error, and its rounding within round_slack of bf16(e).
 *
 * Rescaling: each block that raises the maximum multiplies the sums so far
 * by expf(m_old - m_new), a float within 2^-22 + 2 dm + U32 |m_old - m_new|
 * of exact; over the blocks, rho = blocks (2^-22 + 2 dm) + U32 (m - m(0)).
 * Where v carries slack sv (computed, then rounded), each term moves by
 * up to (w + slack) sv more.
 * Sums: a block's weights summed in float32 (gamma_64, each weight <= 1);
 * the products with v a chain of fused multiply-adds through every key and
 * rescaling (gamma_{n_k + blocks}). Then out / l^ (1/l^ in float, a
 * product: 2 U32).
 *   dl  = (gamma_64 + rho) l + sum_j slack_j w'_j         (w' = exp(m(t) - m))
 *   dout_c = ((gamma + rho) sum_j |w_j v_jc| + sum_j slack_j w'_j |v_jc|
 *             + |out_c| dl) / (l - dl) + 2 U32 |out_c|
 * A fully masked row is exactly 0 (bound 0).
 */
static row_ref forward_row(const attn_sdpa_params *p, const operands *o, int64_t b, int64_t h,
                           int64_t i, double *out, double *tol, double *w, double *w_tol)
{
    const int64_t n_k = p->n_k, d_v = p->d_v, g = h / (p->heads_q / p->heads_kv);
    const int64_t blocks = (n_k + KEY_BLOCK - 1) / KEY_BLOCK;
    double *x = xcalloc((size_t)n_k, sizeof *x), *dx = xcalloc((size_t)n_k, sizeof *dx);
    double *mt = xcalloc((size_t)blocks, sizeof *mt), *dmt = xcalloc((size_t)blocks, sizeof *dmt);
    double *pr = xcalloc((size_t)n_k, sizeof *pr), *sl = xcalloc((size_t)n_k, sizeof *sl);
    double m = -INFINITY, dm = 0.0, m0 = NAN;
    for (int64_t j = 0; j < n_k; j++) {
        score sc;
        x[j] = -INFINITY;
        if (score_of(p, o, b, h, i, j, &sc)) {
            x[j] = sc.x;
            dx[j] = sc.dx;
            m = fmax(m, sc.x);
            dm = fmax(dm, sc.dx);
        }
        if ((j + 1) % KEY_BLOCK == 0 || j == n_k - 1) {
            mt[j / KEY_BLOCK] = m;
            dmt[j / KEY_BLOCK] = dm;
            if (isnan(m0) && m > -INFINITY)
                m0 = m;
        }
    }
    row_ref r = {.m = m, .dm = dm};
    for (int64_t c = 0; c < d_v; c++)
        out[c] = tol[c] = 0.0;
    if (m == -INFINITY) {
        if (w != NULL)
            for (int64_t j = 0; j < n_k; j++)
                w[j] = w_tol[j] = 0.0;
        free(x), free(dx), free(mt), free(dmt), free(pr), free(sl);
        return r;
    }
    const double rho = (double)blocks * (0x1p-22 + 2 * dm) + U32 * (m - m0);
    double l = 0.0, spread = 0.0;
    for (int64_t j = 0; j < n_k; j++) {
        if (x[j] == -INFINITY)
            continue;
        const int64_t t = j / KEY_BLOCK;
        double arg = x[j] - mt[t], e = exp(arg);
        double darg = dx[j] + dmt[t] + U32 * fabs(arg);
        double wp = exp(mt[t] - m);
        pr[j] = bf16(e) * wp;
        sl[j] = round_slack(e, e * (1.01 * darg + 0x1p-21)) * wp;
        if (arg < -87.0) { /* the library's exp flushes below about -87.34 */
            sl[j] = fmax(sl[j], e * wp);
        }
        l += pr[j];
        spread += sl[j];
    }
    const double dl = (gamma32(KEY_BLOCK) + rho) * l + spread;
    const double g_sum = gamma32((double)(n_k + blocks));
    for (int64_t c = 0; c < d_v; c++) {
        double acc = 0.0, mag = 0.0, moved = 0.0;
        for (int64_t j = 0; j < n_k; j++) {
            if (x[j] == -INFINITY)
                continue;
            const size_t at = (size_t)(((b * p->heads_kv + g) * n_k + j) * d_v + c);
            double vj = o->v[at];
            acc += pr[j] * vj;
            mag += fabs(pr[j] * vj);
            moved += sl[j] * fabs(vj);
            if (o->sv != NULL) /* the weight times how far v's rounding may fall */
                moved += (pr[j] + sl[j]) * o->sv[at];
        }
        out[c] = acc / l;
        tol[c] = ((g_sum + rho) * mag + moved + fabs(out[c]) * dl) / (l - dl) +
                 2 * U32 * fabs(out[c]);
    }
    if (w != NULL)
        for (int64_t j = 0; j < n_k; j++) {
            w[j] = x[j] == -INFINITY ? 0.0 : pr[j] / l;
            /* The kept weight rescaled by a float of exp(m(t) - m) / l. */
            w_tol[j] = x[j] == -INFINITY ? 0.0
                                         : (sl[j] + w[j] * dl) / (l - dl) +
                                               w[j] * (4 * U32 + 2 * dm);
        }
    r.l = l;
    r.dl = dl;
    free(x), free(dx), free(mt), free(dmt), free(pr), free(sl);
    return r;
}

typedef struct {
    ref_t out, lse, w; /* w only when asked */
} fwd_ref;

static fwd_ref reference_forward_bf16(const sdpa_case *c, const operands *o, bool weights)
{
    const attn_sdpa_params *p = &c->ref;
    fwd_ref f = {ref_alloc(c->n_out), ref_alloc(c->n_rows), {NULL, NULL}};
    if (weights)
        f.w = ref_alloc(c->n_w);
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < p->n_q; i++) {
                const size_t row = (size_t)((b * p->heads_q + h) * p->n_q + i);
                row_ref r = forward_row(p, o, b, h, i, f.out.val + row * (size_t)p->d_v,
                                        f.out.tol + row * (size_t)p->d_v,
                                        weights ? f.w.val + row * (size_t)p->n_k : NULL,
                                        weights ? f.w.tol + row * (size_t)p->n_k : NULL);
                f.lse.val[row] = r.m == -INFINITY ? -INFINITY : r.m + log(r.l);
                /* The row's max and the float of its sum. */
                f.lse.tol[row] = r.m == -INFINITY ? 0.0 : r.dm + r.dl / (r.l - r.dl) + U32;
            }
    return f;
}

static void fwd_ref_free(fwd_ref *f)
{
    ref_free(&f->out);
    ref_free(&f->lse);
    if (f->w.val != NULL)
        ref_free(&f->w);
}

/*
 * The backward as attn.h states it, from the library's own forward rows
 * (m^, l^) and output (as attn_sdpa_backward takes them):
 *   P = exp(x - m^) / l^, dP = dO~ v~^T, delta = rowsum(dO out),
 *   dS = P (dP - delta) scale (1 - th^2),
 *   dV = P~^T dO~, dQ = dS~ k~, dK = dS~^T q~   (~: rounded to bfloat16).
 * Bounds: the library's P within P (1.01 (dx + U32 |x - m^|) + 2^-21 +
 * 3 U32) (exp, 1/l^, the product); its dP within gamma_dv sum |dO~ v~|;
 * delta within U32 |delta| (a double sum rounded to float); so its dS
 * within |P| (ddP + ddelta) s + |dP - delta| s dP + 4 U32 |dS| (+ the soft
 * cap's tanh: 2 |th| (8 U32 + dx / cap) of the factor). Where the library's
 * P may be exactly 1 it sets dS to 0 (a one-hot row): then 0 is allowed too.
 * The rounded P~ and dS~ carry their round_slack into the sums, which are
 * chains of float32 fused multiply-adds: gamma over the terms (the query
 * rows of every head sharing the key, or the keys and dq's split copies).
 * With RoPE, dq and dk are turned back in double and rounded: a component
 * mixes two, so the bound of both plus a rounding.
 */
typedef struct {
    ref_t dq, dk, dv;
} bwd_ref;

static bwd_ref reference_backward_bf16(const sdpa_case *c, const operands *o,
                                       const float *out, const attn_softmax_row *rows)
{
    const attn_sdpa_params *p = &c->ref;
    const int64_t d_k = p->d_k, d_v = p->d_v, n_k = p->n_k, group = p->heads_q / p->heads_kv;
    bwd_ref g = {ref_alloc(c->n_qel), ref_alloc(c->n_kel), ref_alloc(c->n_vel)};
    /* Sums of |terms| and of slack for the bounds, beside the values. */
    double *dq_mag = xcalloc(c->n_qel, sizeof(double)), *dk_mag = xcalloc(c->n_kel, sizeof(double));
    double *dv_mag = xcalloc(c->n_vel, sizeof(double));
    double *dq_mov = xcalloc(c->n_qel, sizeof(double)), *dk_mov = xcalloc(c->n_kel, sizeof(double));
    double *dv_mov = xcalloc(c->n_vel, sizeof(double));
    const double scale = p->scale, cap = p->variants.softcap;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++) {
            const int64_t kvh = h / group;
            for (int64_t i = 0; i < p->n_q; i++) {
                const size_t row = (size_t)((b * p->heads_q + h) * p->n_q + i);
                const attn_softmax_row sm = rows[row];
                if (!(sm.sum > 0.0f))
                    continue;
                const double *dO = c->doutd + row * (size_t)d_v;
                const float *O = out + row * (size_t)d_v;
                double delta = 0.0, ddelta;
                for (int64_t cc = 0; cc < d_v; cc++)
                    delta += dO[cc] * (double)O[cc];
                ddelta = U32 * fabs(delta) + 1e-15 * (double)d_v;
                for (int64_t j = 0; j < n_k; j++) {
                    score sc;
                    if (!score_of(p, o, b, h, i, j, &sc))
                        continue;
                    const size_t kr = (size_t)((b * p->heads_kv + kvh) * n_k + j);
                    double P = exp(sc.x - (double)sm.max) / (double)sm.sum;
                    double dP_ = 0.0, dP_mag = 0.0;
                    for (int64_t cc = 0; cc < d_v; cc++) {
                        double t = bf16(dO[cc]) * o->v[kr * (size_t)d_v + (size_t)cc];
                        dP_ += t;
                        dP_mag += fabs(t);
                    }
                    double eP = P * (1.01 * (sc.dx + U32 * fabs(sc.x - sm.max)) + 0x1p-21 +
                                     3 * U32);
                    double factor = cap > 0.0 ? 1.0 - sc.th * sc.th : 1.0;
                    double dfactor = cap > 0.0 ? 2 * fabs(sc.th) * (8 * U32 + sc.dx / cap) : 0.0;
                    double dS = P * (dP_ - delta) * scale * factor;
                    double edS = fabs(P) * (gamma32((double)d_v) * dP_mag + ddelta) * scale *
                                     factor +
                                 fabs(dP_ - delta) * scale * (eP * factor + P * dfactor) +
                                 4 * U32 * fabs(dS);
                    if (P + eP >= 1.0 - U32)
                        edS += fabs(dS);
                    double Pr = bf16(P), sP = round_slack(P, eP);
                    double dSr = bf16(dS), sdS = round_slack(dS, edS);
                    for (int64_t cc = 0; cc < d_v; cc++) {
                        double dOr = bf16(dO[cc]);
                        size_t at = kr * (size_t)d_v + (size_t)cc;
                        g.dv.val[at] += Pr * dOr;
                        dv_mag[at] += fabs(Pr * dOr);
                        dv_mov[at] += sP * fabs(dOr);
                    }
                    for (int64_t t = 0; t < d_k; t++) {
                        size_t qa = row * (size_t)d_k + (size_t)t, ka = kr * (size_t)d_k + (size_t)t;
                        g.dq.val[qa] += dSr * o->k[ka];
                        dq_mag[qa] += fabs(dSr * o->k[ka]);
                        dq_mov[qa] += sdS * fabs(o->k[ka]) + fabs(dSr) * o->sk[ka] +
                                      sdS * o->sk[ka];
                        g.dk.val[ka] += dSr * o->q[qa];
                        dk_mag[ka] += fabs(dSr * o->q[qa]);
                        dk_mov[ka] += sdS * fabs(o->q[qa]) + fabs(dSr) * o->sq[qa] +
                                      sdS * o->sq[qa];
                    }
                }
            }
        }
    const double g_q = gamma32((double)(n_k + 64)), g_kv = gamma32((double)(p->n_q * group + 2));
    for (size_t a = 0; a < c->n_qel; a++)
        g.dq.tol[a] = g_q * dq_mag[a] + dq_mov[a];
    for (size_t a = 0; a < c->n_kel; a++)
        g.dk.tol[a] = g_kv * dk_mag[a] + dk_mov[a];
    for (size_t a = 0; a < c->n_vel; a++)
        g.dv.tol[a] = g_kv * dv_mag[a] + dv_mov[a];
    if (p->variants.rope_base > 0.0f) {
        /* Gradients with respect to the q and k given: the inverse turn. */
        double *y = xcalloc((size_t)d_k, sizeof *y), *e = xcalloc((size_t)d_k, sizeof *e);
        const int64_t half = d_k / 2;
        for (int pass = 0; pass < 2; pass++) {
            ref_t *r = pass == 0 ? &g.dq : &g.dk;
            size_t n = pass == 0 ? c->n_qel : c->n_kel;
            int64_t nrows = pass == 0 ? p->n_q : n_k;
            for (size_t row = 0; row < n / (size_t)d_k; row++) {
                double *x = r->val + row * (size_t)d_k, *tl = r->tol + row * (size_t)d_k;
                int64_t pos = pass == 0 ? q_position(p, (int64_t)row % nrows)
                                        : (int64_t)row % nrows;
                for (int64_t t = 0; t < half; t++) {
                    double angle =
                        (double)pos * pow((double)p->variants.rope_base, -2.0 * t / (double)d_k);
                    double cs = cos(angle), sn = -sin(angle);
                    y[t] = x[t] * cs - x[t + half] * sn;
                    y[t + half] = x[t + half] * cs + x[t] * sn;
                    e[t] = e[t + half] = tl[t] + tl[t + half];
                }
                for (int64_t t = 0; t < d_k; t++) {
                    x[t] = y[t];
                    tl[t] = e[t] + U32 * fabs(y[t]);
                }
            }
        }
        free(y);
        free(e);
    }
    free(dq_mag), free(dk_mag), free(dv_mag), free(dq_mov), free(dk_mov), free(dv_mov);
    return g;
}

static void bwd_ref_free(bwd_ref *g)
{
    ref_free(&g->dq);
    ref_free(&g->dk);
    ref_free(&g->dv);
}

/* ----------------------------------------------------------- comparing */

/* The largest |got - want| / (SAFETY tol) over the tensor (a non-finite
 * result is infinitely far), with the element that gave it in `where`. */
static double worst_ratio(const float *got, const ref_t *want, size_t n, size_t *where)
{
    double worst = 0.0;
    *where = 0;
    for (size_t i = 0; i < n; i++) {
        double d = isfinite(got[i]) ? fabs((double)got[i] - want->val[i]) : INFINITY;
        double r = d == 0.0 ? 0.0 : d / (SAFETY * want->tol[i]);
        if (r > worst) {
            worst = r;
            *where = i;
        }
    }
    return worst;
}

static void assert_within(const char *what, const float *got, const ref_t *want, size_t n)
{
    size_t at;
    double r = worst_ratio(got, want, n, &at);
    note(what, r);
    ck_assert_msg(r <= 1.0,
                  "%s: element %zu is %.9g, the bf16 reference %.9g +- %.3g (%.3g of the bound)",
                  what, at, (double)got[at], want->val[at], SAFETY * want->tol[at], r);
}

/* [B, H, n, d] -> [B, n, H, d] and back. */
static float *to_bnhd(const float *x, int64_t B, int64_t H, int64_t n, int64_t d, bool back)
{
    float *y = xcalloc((size_t)(B * H * n * d), sizeof *y);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < n; i++) {
                size_t bhnd = (size_t)(((b * H + h) * n + i) * d);
                size_t bnhd = (size_t)(((b * n + i) * H + h) * d);
                memcpy(y + (back ? bhnd : bnhd), x + (back ? bnhd : bhnd),
                       (size_t)d * sizeof *y);
            }
    return y;
}

/* What one library forward + backward returned, [B, H, n, d] whatever the
 * layout it was called with. */
typedef struct {
    float *out, *weights, *dq, *dk, *dv;
    attn_softmax_row *rows;
    double *lse;
    attn_stats stats;
} lib_run;

static void lib_run_free(lib_run *r)
{
    free(r->out), free(r->weights), free(r->dq), free(r->dk), free(r->dv), free(r->rows),
        free(r->lse);
}

/* Which inputs run_lib_as passes as bfloat16 words (attn_sdpa_params.dtype). */
enum { WORDS_Q = 1, WORDS_K = 2, WORDS_V = 4, WORDS_DOUT = 8, WORDS_ALL = 15 };

/* The bfloat16 words of x [n], which must hold bfloat16 values. */
static uint16_t *words_of(const float *x, size_t n)
{
    uint16_t *w = xcalloc(n, sizeof *w);
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &x[i], sizeof b);
        if ((b & 0xFFFFu) != 0)
            ck_abort_msg("element %zu (%a) is not a bfloat16", i, (double)x[i]);
        w[i] = (uint16_t)(b >> 16);
    }
    return w;
}

/* x, or its words when `as_words` (the copy to free in *own). */
static const void *input_as(const float *x, size_t n, bool as_words, attn_dtype *dtype,
                            void **own)
{
    *dtype = as_words ? ATTN_DTYPE_BFLOAT16 : ATTN_DTYPE_FLOAT32;
    *own = as_words ? words_of(x, n) : NULL;
    return as_words ? *own : (const void *)x;
}

/* Forward (with weights and stats when asked) and backward of the case in
 * `layout`, with the given kernels (NULL: the process's), the inputs named
 * by `words` passed as bfloat16 words (attn_sdpa_forward_in). */
static lib_run run_lib_as(const sdpa_case *c, attn_layout layout, bool weights, bool stats,
                          const sdpa_kernels *kernels, unsigned words)
{
    attn_sdpa_params p = c->lib;
    p.layout = layout;
    const bool bnhd = layout == ATTN_LAYOUT_BNHD;
    const float *fq = c->q, *fk = c->k, *fv = c->v, *fdout = c->dout;
    float *tq = NULL, *tk = NULL, *tv = NULL, *td = NULL;
    if (bnhd) {
        fq = tq = to_bnhd(c->q, p.batch, p.heads_q, p.n_q, p.d_k, false);
        fk = tk = to_bnhd(c->k, p.batch, p.heads_kv, p.n_k, p.d_k, false);
        fv = tv = to_bnhd(c->v, p.batch, p.heads_kv, p.n_k, p.d_v, false);
        fdout = td = to_bnhd(c->dout, p.batch, p.heads_q, p.n_q, p.d_v, false);
    }
    void *wq, *wk, *wv, *wd;
    const void *q = input_as(fq, c->n_qel, words & WORDS_Q, &p.dtype.q, &wq);
    const void *k = input_as(fk, c->n_kel, words & WORDS_K, &p.dtype.k, &wk);
    const void *v = input_as(fv, c->n_vel, words & WORDS_V, &p.dtype.v, &wv);
    const void *dout = input_as(fdout, c->n_out, words & WORDS_DOUT, &p.dtype.dout, &wd);
    lib_run r = {.out = nan_floats(c->n_out), .dq = nan_floats(c->n_qel),
                 .dk = nan_floats(c->n_kel), .dv = nan_floats(c->n_vel),
                 .rows = xcalloc(c->n_rows, sizeof *r.rows),
                 .lse = xcalloc(c->n_rows, sizeof *r.lse)};
    if (weights)
        r.weights = nan_floats(c->n_w);
    attn_error err = {0};
    attn_stats *st_out = stats ? &r.stats : NULL;
    attn_status st =
        kernels != NULL
            ? attn_sdpa_forward_with(kernels, &p, q, k, v, r.out, r.rows, r.weights, st_out, &err)
        : words != 0 ? attn_sdpa_forward_in(&p, q, k, v, r.out, r.rows, r.weights, st_out, &err)
                     : attn_sdpa_forward(&p, fq, fk, fv, r.out, r.rows, r.weights, st_out, &err);
    ASSERT_OK(st, err);
    st = kernels != NULL ? attn_sdpa_backward_with(kernels, &p, q, k, v, r.out, r.rows, dout,
                                                   r.dq, r.dk, r.dv, &err)
         : words != 0 ? attn_sdpa_backward_in(&p, q, k, v, r.out, r.rows, dout, r.dq, r.dk, r.dv,
                                              &err)
                      : attn_sdpa_backward(&p, fq, fk, fv, r.out, r.rows, fdout, r.dq, r.dk,
                                           r.dv, &err);
    ASSERT_OK(st, err);
    if (bnhd) {
        float *t;
        t = to_bnhd(r.out, p.batch, p.heads_q, p.n_q, p.d_v, true), free(r.out), r.out = t;
        t = to_bnhd(r.dq, p.batch, p.heads_q, p.n_q, p.d_k, true), free(r.dq), r.dq = t;
        t = to_bnhd(r.dk, p.batch, p.heads_kv, p.n_k, p.d_k, true), free(r.dk), r.dk = t;
        t = to_bnhd(r.dv, p.batch, p.heads_kv, p.n_k, p.d_v, true), free(r.dv), r.dv = t;
    }
    for (size_t i = 0; i < c->n_rows; i++)
        r.lse[i] = attn_softmax_lse(r.rows[i]);
    free(tq), free(tk), free(tv), free(td);
    free(wq), free(wk), free(wv), free(wd);
    return r;
}

static lib_run run_lib(const sdpa_case *c, attn_layout layout, bool weights, bool stats,
                       const sdpa_kernels *kernels)
{
    return run_lib_as(c, layout, weights, stats, kernels, 0);
}

/* The case in bfloat16 against the reference, in both layouts: output,
 * lse, weights (small cases), dq, dk, dv. */
static void check_case(sdpa_case *c, const char *name)
{
    c->lib.precision = ATTN_PRECISION_BFLOAT16;
    c->ref.precision = ATTN_PRECISION_BFLOAT16;
    const bool weights = c->n_w <= 200000;
    operands o = operands_of(c);
    fwd_ref f = reference_forward_bf16(c, &o, weights);
    char what[160];
    for (int layout = 0; layout < 2; layout++) {
        lib_run r = run_lib(c, (attn_layout)layout, weights, false, NULL);
        const char *lay = layout ? "BNHD" : "BHND";
        snprintf(what, sizeof what, "%s %s out", name, lay);
        assert_within(what, r.out, &f.out, c->n_out);
        /* lse in double: -inf for the same rows, the others within bounds. */
        snprintf(what, sizeof what, "%s %s lse", name, lay);
        double worst = 0.0;
        size_t at = 0;
        for (size_t i = 0; i < c->n_rows; i++) {
            if ((f.lse.val[i] == -INFINITY) != (r.lse[i] == -INFINITY))
                ck_abort_msg("%s: row %zu fully masked in one only", what, i);
            if (f.lse.val[i] == -INFINITY)
                continue;
            double d = fabs(r.lse[i] - f.lse.val[i]);
            double rr = d == 0.0 ? 0.0 : d / (SAFETY * f.lse.tol[i]);
            if (rr > worst)
                worst = rr, at = i;
        }
        note(what, worst);
        ck_assert_msg(worst <= 1.0, "%s: row %zu lse %.9g, reference %.9g +- %.3g", what, at,
                      r.lse[at], f.lse.val[at], SAFETY * f.lse.tol[at]);
        if (weights) {
            snprintf(what, sizeof what, "%s %s weights", name, lay);
            assert_within(what, r.weights, &f.w, c->n_w);
        }
        bwd_ref g = reference_backward_bf16(c, &o, r.out, r.rows);
        snprintf(what, sizeof what, "%s %s dq", name, lay);
        assert_within(what, r.dq, &g.dq, c->n_qel);
        snprintf(what, sizeof what, "%s %s dk", name, lay);
        assert_within(what, r.dk, &g.dk, c->n_kel);
        snprintf(what, sizeof what, "%s %s dv", name, lay);
        assert_within(what, r.dv, &g.dv, c->n_vel);
        bwd_ref_free(&g);
        lib_run_free(&r);
    }
    fwd_ref_free(&f);
    operands_free(&o);
}

/* Shapes that cross the tiles (64 keys, 96 and 64 query rows) and the
 * vectors, n_q != n_k both ways, odd widths (a pair half empty). */
static const struct {
    int64_t nq, nk, dk, dv;
} SHAPES[] = {{5, 7, 4, 3}, {70, 150, 9, 7}, {131, 67, 16, 33}};

static void check_shapes(const char *name, attn_variants v, bool causal, int64_t heads_kv,
                         attn_mask_kind mask)
{
    char label[128];
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++) {
        /* RoPE turns pairs of features: an even d_k. */
        const int64_t dk = SHAPES[s].dk + (v.rope_base > 0.0f ? SHAPES[s].dk % 2 : 0);
        attn_sdpa_params p = sdpa_shape(2, 4, heads_kv, SHAPES[s].nq, SHAPES[s].nk, dk,
                                        SHAPES[s].dv);
        p.causal = causal;
        p.threads = 2;
        p.variants = v;
        sdpa_case c;
        case_init(&c, &p, 40 + s, 2.0);
        if (mask != ATTN_MASK_NONE) {
            const int64_t shape[3] = {4, SHAPES[s].nq, SHAPES[s].nk};
            case_mask(&c, mask, 3, shape, 7 + s);
        }
        snprintf(label, sizeof label, "%s%s %lldx%lld d%lld/%lld", name, causal ? " causal" : "",
                 (long long)SHAPES[s].nq, (long long)SHAPES[s].nk, (long long)dk,
                 (long long)SHAPES[s].dv);
        check_case(&c, label);
        case_free(&c);
    }
}

/* ---------------------------------------------------- forward, backward */

START_TEST(plain_attention_matches_the_bf16_reference)
{
    check_shapes("plain", (attn_variants){0}, false, 4, ATTN_MASK_NONE);
}
END_TEST

START_TEST(causal_attention_matches_the_bf16_reference)
{
    check_shapes("causal", (attn_variants){0}, true, 4, ATTN_MASK_NONE);
}
END_TEST

START_TEST(grouped_query_attention_matches_the_bf16_reference)
{
    check_shapes("gqa", (attn_variants){0}, true, 2, ATTN_MASK_NONE);
    check_shapes("mqa", (attn_variants){0}, false, 1, ATTN_MASK_NONE);
}
END_TEST

START_TEST(masks_bool_and_bias_match_the_bf16_reference)
{
    check_shapes("bool mask", (attn_variants){0}, true, 4, ATTN_MASK_BOOL);
    check_shapes("bias mask", (attn_variants){0}, false, 2, ATTN_MASK_BIAS);
}
END_TEST

static float g_slopes[8];

START_TEST(variants_match_the_bf16_reference)
{
    for (int h = 0; h < 8; h++)
        g_slopes[h] = (float)pow(2.0, -(h + 1));
    check_shapes("window", (attn_variants){.window = true, .window_left = 20, .window_right = 3},
                 false, 4, ATTN_MASK_NONE);
    check_shapes("window causal", (attn_variants){.window = true, .window_left = 9, .window_right = -1},
                 true, 2, ATTN_MASK_NONE);
    check_shapes("alibi", (attn_variants){.alibi_slopes = g_slopes}, true, 4, ATTN_MASK_NONE);
    check_shapes("softcap", (attn_variants){.softcap = 1.5f}, false, 4, ATTN_MASK_NONE);
    check_shapes("rope", (attn_variants){.rope_base = 10000.0f}, true, 2, ATTN_MASK_NONE);
    check_shapes("all", (attn_variants){.window = true, .window_left = 30, .window_right = 30,
                                        .alibi_slopes = g_slopes, .softcap = 3.0f,
                                        .rope_base = 500.0f},
                 false, 2, ATTN_MASK_BIAS);
}
END_TEST

/* Rows with no visible key: a boolean mask hiding whole rows, and more
 * queries than keys under the causal mask. Their outputs and gradients are
 * exactly 0 and their lse -inf, as in float32. */
/*
 * A ragged batch in bfloat16: each sequence's rows of the packed results
 * against the bf16 reference of that sequence alone (a dense case of its
 * own). Sequences start at odd rows, have odd lengths (a backward tile's
 * pairs of rows then end on a zero row), cross the tiles, and include an
 * empty one and one whose keys are empty (zero rows, lse -inf, no
 * gradient); causal and not, grouped query heads, both layouts.
 */
static void check_ragged_bf16(bool causal, attn_layout layout, const char *name)
{
    static const int64_t len_q[] = {5, 0, 70, 1, 33, 4, 131};
    static const int64_t len_k[] = {7, 3, 150, 1, 33, 0, 67};
    enum { SEQS = 7 };
    const int64_t Hq = 4, Hk = 2, dk = 9, dv = 7;
    int64_t cu_q[SEQS + 1] = {0}, cu_k[SEQS + 1] = {0};
    for (int s = 0; s < SEQS; s++) {
        cu_q[s + 1] = cu_q[s] + len_q[s];
        cu_k[s + 1] = cu_k[s] + len_k[s];
    }
    const int64_t n_q = cu_q[SEQS], n_k = cu_k[SEQS];
    const size_t n_qel = (size_t)(Hq * n_q * dk), n_kel = (size_t)(Hk * n_k * dk),
                 n_vel = (size_t)(Hk * n_k * dv), n_out = (size_t)(Hq * n_q * dv),
                 n_rows = (size_t)(Hq * n_q);
    float *q = xcalloc(n_qel, sizeof *q), *k = xcalloc(n_kel, sizeof *k),
          *v = xcalloc(n_vel, sizeof *v), *dout = xcalloc(n_out, sizeof *dout);
    uint64_t seed = 91;
    fill(q, n_qel, &seed, 2.0);
    fill(dout, n_out, &seed, 1.0);
    /* Each sequence a dense case; its tensors copied into the packed ones. */
    sdpa_case cs[SEQS];
    for (int s = 0; s < SEQS; s++) {
        if (len_q[s] == 0 || len_k[s] == 0)
            continue;
        attn_sdpa_params p = sdpa_shape(1, Hq, Hk, len_q[s], len_k[s], dk, dv);
        p.causal = causal;
        case_init(&cs[s], &p, 60 + (uint64_t)s, 2.0);
        cs[s].lib.precision = cs[s].ref.precision = ATTN_PRECISION_BFLOAT16;
        for (int64_t h = 0; h < Hq; h++) {
            memcpy(q + (h * n_q + cu_q[s]) * dk, cs[s].q + h * len_q[s] * dk,
                   (size_t)(len_q[s] * dk) * sizeof *q);
            memcpy(dout + (h * n_q + cu_q[s]) * dv, cs[s].dout + h * len_q[s] * dv,
                   (size_t)(len_q[s] * dv) * sizeof *q);
        }
        for (int64_t h = 0; h < Hk; h++) {
            memcpy(k + (h * n_k + cu_k[s]) * dk, cs[s].k + h * len_k[s] * dk,
                   (size_t)(len_k[s] * dk) * sizeof *k);
            memcpy(v + (h * n_k + cu_k[s]) * dv, cs[s].v + h * len_k[s] * dv,
                   (size_t)(len_k[s] * dv) * sizeof *v);
        }
    }
    attn_sdpa_params p = sdpa_shape(1, Hq, Hk, n_q, n_k, dk, dv);
    p.causal = causal;
    p.threads = 2;
    p.layout = layout;
    p.precision = ATTN_PRECISION_BFLOAT16;
    p.ragged = (attn_ragged){.seqs = SEQS, .cu_seqlens_q = cu_q, .cu_seqlens_k = cu_k};
    const bool bnhd = layout == ATTN_LAYOUT_BNHD;
    float *lq = bnhd ? to_bnhd(q, 1, Hq, n_q, dk, false) : q;
    float *lk = bnhd ? to_bnhd(k, 1, Hk, n_k, dk, false) : k;
    float *lv = bnhd ? to_bnhd(v, 1, Hk, n_k, dv, false) : v;
    float *ld = bnhd ? to_bnhd(dout, 1, Hq, n_q, dv, false) : dout;
    float *out = nan_floats(n_out), *dq = nan_floats(n_qel), *dkk = nan_floats(n_kel),
          *dvv = nan_floats(n_vel);
    attn_softmax_row *rows = xcalloc(n_rows, sizeof *rows);
    attn_error err = {0};
    ASSERT_OK(attn_sdpa_forward(&p, lq, lk, lv, out, rows, NULL, NULL, &err), err);
    ASSERT_OK(attn_sdpa_backward(&p, lq, lk, lv, out, rows, ld, dq, dkk, dvv, &err), err);
    if (bnhd) {
        float *t;
        t = to_bnhd(out, 1, Hq, n_q, dv, true), free(out), out = t;
        t = to_bnhd(dq, 1, Hq, n_q, dk, true), free(dq), dq = t;
        t = to_bnhd(dkk, 1, Hk, n_k, dk, true), free(dkk), dkk = t;
        t = to_bnhd(dvv, 1, Hk, n_k, dv, true), free(dvv), dvv = t;
        free(lq), free(lk), free(lv), free(ld);
    }
    char what[160];
    for (int s = 0; s < SEQS; s++) {
        const int64_t nq = len_q[s], nk = len_k[s];
        if (nq > 0 && nk == 0) {
            /* Queries that see nothing: zero rows, lse -inf, dq 0. */
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t i = 0; i < nq; i++) {
                    const int64_t r = h * n_q + cu_q[s] + i;
                    ck_assert(attn_softmax_lse(rows[r]) == -INFINITY);
                    for (int64_t t = 0; t < dv; t++)
                        ck_assert(out[r * dv + t] == 0.0f);
                    for (int64_t t = 0; t < dk; t++)
                        ck_assert(dq[r * dk + t] == 0.0f);
                }
        }
        if (nq == 0 || nk == 0) {
            /* Keys no query sees: no gradient. */
            for (int64_t h = 0; h < Hk; h++)
                for (int64_t j = 0; j < nk; j++) {
                    for (int64_t t = 0; t < dk; t++)
                        ck_assert(dkk[(h * n_k + cu_k[s] + j) * dk + t] == 0.0f);
                    for (int64_t t = 0; t < dv; t++)
                        ck_assert(dvv[(h * n_k + cu_k[s] + j) * dv + t] == 0.0f);
                }
            continue;
        }
        sdpa_case *c = &cs[s];
        /* The sequence's rows of the packed results, as a dense case's. */
        float *o_s = xcalloc(c->n_out, sizeof *o_s), *dq_s = xcalloc(c->n_qel, sizeof *dq_s);
        float *dk_s = xcalloc(c->n_kel, sizeof *dk_s), *dv_s = xcalloc(c->n_vel, sizeof *dv_s);
        attn_softmax_row *rows_s = xcalloc(c->n_rows, sizeof *rows_s);
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t r0 = h * n_q + cu_q[s];
            memcpy(o_s + h * nq * dv, out + r0 * dv, (size_t)(nq * dv) * sizeof *o_s);
            memcpy(dq_s + h * nq * dk, dq + r0 * dk, (size_t)(nq * dk) * sizeof *dq_s);
            memcpy(rows_s + h * nq, rows + r0, (size_t)nq * sizeof *rows_s);
        }
        for (int64_t h = 0; h < Hk; h++) {
            const int64_t j0 = h * n_k + cu_k[s];
            memcpy(dk_s + h * nk * dk, dkk + j0 * dk, (size_t)(nk * dk) * sizeof *dk_s);
            memcpy(dv_s + h * nk * dv, dvv + j0 * dv, (size_t)(nk * dv) * sizeof *dv_s);
        }
        operands o = operands_of(c);
        fwd_ref f = reference_forward_bf16(c, &o, false);
        snprintf(what, sizeof what, "%s, sequence %d (%lldx%lld) out", name, s, (long long)nq,
                 (long long)nk);
        assert_within(what, o_s, &f.out, c->n_out);
        for (size_t i = 0; i < c->n_rows; i++) {
            const double lse = attn_softmax_lse(rows_s[i]);
            ck_assert_msg(lse == f.lse.val[i] || fabs(lse - f.lse.val[i]) <= SAFETY * f.lse.tol[i],
                          "%s: row %zu lse %.9g, reference %.9g +- %.3g", what, i, lse,
                          f.lse.val[i], SAFETY * f.lse.tol[i]);
        }
        bwd_ref g = reference_backward_bf16(c, &o, o_s, rows_s);
        snprintf(what, sizeof what, "%s, sequence %d dq", name, s);
        assert_within(what, dq_s, &g.dq, c->n_qel);
        snprintf(what, sizeof what, "%s, sequence %d dk", name, s);
        assert_within(what, dk_s, &g.dk, c->n_kel);
        snprintf(what, sizeof what, "%s, sequence %d dv", name, s);
        assert_within(what, dv_s, &g.dv, c->n_vel);
        bwd_ref_free(&g);
        fwd_ref_free(&f);
        operands_free(&o);
        free(o_s), free(dq_s), free(dk_s), free(dv_s), free(rows_s);
        case_free(c);
    }
    free(q), free(k), free(v), free(dout), free(out), free(dq), free(dkk), free(dvv);
    free(rows);
}

START_TEST(ragged_batches_match_the_bf16_reference_per_sequence)
{
    check_ragged_bf16(false, ATTN_LAYOUT_BHND, "ragged");
    check_ragged_bf16(true, ATTN_LAYOUT_BHND, "ragged causal");
    check_ragged_bf16(true, ATTN_LAYOUT_BNHD, "ragged causal BNHD");
}
END_TEST

START_TEST(fully_masked_rows_are_zero_in_bf16)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 2, 40, 70, 8, 8);
    p.threads = 2;
    sdpa_case c;
    case_init(&c, &p, 5, 1.0);
    const int64_t shape[2] = {40, 70};
    case_mask(&c, ATTN_MASK_BOOL, 2, shape, 3);
    uint8_t *m = c.mask_src, *full = c.mask_full;
    for (int64_t i = 0; i < 40; i += 3)
        for (int64_t j = 0; j < 70; j++)
            m[i * 70 + j] = 0;
    for (int64_t h = 0; h < 2; h++)
        for (int64_t i = 0; i < 40; i++)
            memcpy(full + (h * 40 + i) * 70, m + i * 70, 70);
    check_case(&c, "rows masked");
    case_free(&c);

    p = sdpa_shape(1, 2, 1, 90, 20, 8, 6); /* causal: rows 0 .. 69 see nothing */
    p.causal = true;
    p.threads = 2;
    case_init(&c, &p, 6, 1.0);
    check_case(&c, "causal n_q > n_k");
    lib_run r = run_lib(&c, ATTN_LAYOUT_BHND, false, false, NULL);
    bool zero = true;
    for (int64_t h = 0; h < 2; h++)
        for (int64_t i = 0; i < 70; i++) {
            size_t row = (size_t)(h * 90 + i);
            zero &= r.lse[row] == -INFINITY;
            for (int64_t t = 0; t < 6; t++)
                zero &= r.out[row * 6 + (size_t)t] == 0.0f;
            for (int64_t t = 0; t < 8; t++)
                zero &= r.dq[row * 8 + (size_t)t] == 0.0f;
        }
    ck_assert_msg(zero, "a row that sees no key has an output, lse or dq other than 0, -inf");
    lib_run_free(&r);
    case_free(&c);
}
END_TEST

/* Long rows (several key blocks, the maximum growing along them) and a
 * larger head: the reference's bound grows with the sums, not faster. */
START_TEST(long_rows_match_the_bf16_reference)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 1, 33, 700, 64, 64);
    p.causal = true;
    p.threads = 2;
    sdpa_case c;
    case_init(&c, &p, 8, 3.0);
    /* Scores growing along the keys: the running maximum moves. */
    for (int64_t j = 0; j < 700; j++)
        for (int64_t t = 0; t < 64; t++)
            c.k[j * 64 + t] *= (float)(1.0 + (double)j / 350.0);
    case_sync(&c);
    check_case(&c, "long rows");
    case_free(&c);
}
END_TEST

/* The bound is tight enough to see a missing rounding: float32 products
 * (q, k, v, P not rounded) fall outside it. */
START_TEST(float32_products_fail_the_bf16_bound)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 2, 70, 150, 16, 16);
    p.threads = 2;
    sdpa_case c;
    case_init(&c, &p, 11, 2.0);
    c.ref.precision = ATTN_PRECISION_BFLOAT16;
    operands o = operands_of(&c);
    fwd_ref f = reference_forward_bf16(&c, &o, false);
    lib_run r = run_lib(&c, ATTN_LAYOUT_BHND, false, false, NULL); /* float32 */
    size_t at;
    double ratio = worst_ratio(r.out, &f.out, c.n_out, &at);
    note("float32 against the bf16 bound (must exceed 1)", ratio);
    ck_assert_msg(ratio > 5.0, "float32 output within %.3g of the bf16 bound", ratio);
    bwd_ref g = reference_backward_bf16(&c, &o, r.out, r.rows);
    ratio = worst_ratio(r.dv, &g.dv, c.n_vel, &at);
    note("float32 dv against the bf16 bound (must exceed 1)", ratio);
    ck_assert_msg(ratio > 5.0, "float32 dv within %.3g of the bf16 bound", ratio);
    bwd_ref_free(&g);
    lib_run_free(&r);
    fwd_ref_free(&f);
    operands_free(&o);
    case_free(&c);
}
END_TEST

/* ------------------------------------------------------ the operands */

/* attn_bf16_round against the definition over every class of float32:
 * ties both ways, subnormals, the saturation edge, infinities, NaN. */
START_TEST(bf16_round_matches_its_definition)
{
    uint64_t s = 77;
    long checked = 0, wrong = 0;
    char first[160] = "";
    for (long n = 0; n < 2000000; n++) {
        uint32_t bits = (uint32_t)rng_next(&s);
        switch (n % 8) {
        case 0: bits = (bits & 0xFFFF0000u) | 0x8000u; break;  /* exact ties */
        case 1: bits &= 0x807FFFFFu; break;                     /* subnormals */
        case 2: bits = (bits & 0x8000FFFFu) | 0x7F7F0000u; break; /* the top */
        default: break;
        }
        float x;
        memcpy(&x, &bits, sizeof x);
        float got = attn_bf16_round(x);
        double want = bf16((double)x);
        uint32_t gb;
        memcpy(&gb, &got, sizeof gb);
        bool ok = isnan(x) ? isnan(got)
                           : (double)got == want && !!signbit(got) == !!signbit(want) &&
                                 (gb & 0xFFFFu) == 0;
        if (!ok && wrong++ == 0)
            snprintf(first, sizeof first, "bf16(%a) is %a, want %a", (double)x, (double)got,
                     want);
        checked++;
    }
    ck_assert_msg(wrong == 0, "%ld of %ld wrong, the first: %s", wrong, checked, first);
    ck_assert(attn_bf16_round(INFINITY) == INFINITY);
    ck_assert(attn_bf16_round(FLT_MAX) == 0x1.fep127f);
    ck_assert(attn_bf16_round(-0x1.ffp127f) == -0x1.fep127f);
    ck_assert(attn_bf16_round(0x1.fefffep127f) == 0x1.fep127f);
    ck_assert(attn_bf16_round(1.0f + 0x1p-8f) == 1.0f);             /* tie to even */
    ck_assert(attn_bf16_round(1.0f + 0x1p-7f + 0x1p-8f) == 1.0f + 0x1p-6f);
    ck_assert(attn_bf16_round(0x1p-127f) == 0.0f && signbit(attn_bf16_round(-0x1p-127f)));
}
END_TEST

/* One of vdpbf16ps's steps as its pseudocode and the x86 flush-to-zero
 * rule say: a fused multiply-add rounded to nearest even; subnormal
 * inputs read as zero; a result flushed to zero of its sign when, rounded
 * to 24 bits with an unbounded exponent, it is below 2^-126. The exact
 * value is computed in long double (64 bits: a product of two bfloat16s is
 * 16, acc 24, and where it matters, near 2^-126, the terms are close). */
static float model_step(float acc, float a, float b)
{
    if (fabsf(acc) < FLT_MIN)
        acc = copysignf(0.0f, acc);
    if (fabsf(a) < FLT_MIN)
        a = copysignf(0.0f, a);
    if (fabsf(b) < FLT_MIN)
        b = copysignf(0.0f, b);
    float r = fmaf(a, b, acc);
    long double exact = (long double)acc + (long double)a * (long double)b;
    if (isfinite(r) && fabsl(exact) < (long double)FLT_MIN) {
        /* Round to 24 bits unbounded: scale into float's range and back. */
        long double scaled = exact * 0x1p64L;
        float rs = (float)scaled;
        if (fabsf(rs) < 0x1p-62f)
            return copysignf(0.0f, r == 0.0f ? (float)exact : r);
        return (float)((long double)rs * 0x1p-64L);
    }
    return r;
}

static float word_half(uint32_t w, bool high)
{
    uint32_t b = high ? w & 0xFFFF0000u : w << 16;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static float model_dot2(float acc, uint32_t a, uint32_t b)
{
    acc = model_step(acc, word_half(a, true), word_half(b, true));
    return model_step(acc, word_half(a, false), word_half(b, false));
}

/* One of AMX-BF16's tdpbf16ps steps, as the tiles compute it: each of the
 * word's two products (exact in float32 unless it leaves float32's range)
 * flushed to zero when subnormal, the two added together and rounded once
 * (a subnormal sum flushed), then that sum added to the accumulator
 * (rounded, flushed): the association differs from vdpbf16ps's two steps,
 * and so does the flushing of a subnormal product. Subnormal inputs read
 * as zero. */
static float model_tdp(float acc, uint32_t a, uint32_t b)
{
    float p[2];
    for (int half = 0; half < 2; half++) {
        float x = word_half(a, half == 0), y = word_half(b, half == 0);
        x = fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x;
        y = fabsf(y) < FLT_MIN ? copysignf(0.0f, y) : y;
        p[half] = x * y;
        p[half] = fabsf(p[half]) < FLT_MIN ? copysignf(0.0f, p[half]) : p[half];
    }
    return model_step(acc, model_step(p[0], p[1], 1.0f), 1.0f);
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bf16"))) static void instr_dot2(float *acc,
                                                                       const uint32_t *a,
                                                                       const uint32_t *b)
{
    __m512 c = _mm512_loadu_ps(acc);
    __m512i x = _mm512_loadu_si512(a), y = _mm512_loadu_si512(b);
    _mm512_storeu_ps(acc, _mm512_dpbf16_ps(c, (__m512bh)x, (__m512bh)y));
}
#endif

static bool cpu_has_bf16(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

/* A bfloat16 of every class: zeros, subnormals, the smallest and largest
 * exponents, infinities, ordinary values. */
static uint16_t random_bf16(uint64_t *s)
{
    uint64_t r = rng_next(s);
    uint16_t sign = (uint16_t)((r & 1) << 15), man = (uint16_t)((r >> 1) & 0x7F);
    int e;
    switch ((r >> 8) % 12) {
    case 0: return sign;
    case 1: e = 0; man |= 1; break;
    case 2: e = 1 + (int)((r >> 16) % 30); break;
    case 3: e = 255; man = 0; break;
    case 4: e = 254 - (int)((r >> 16) % 30); break;
    default: e = 120 + (int)((r >> 16) % 16); break;
    }
    return (uint16_t)(sign | (e << 7) | man);
}

static float random_acc(uint64_t *s, uint32_t a, uint32_t b)
{
    uint64_t r = rng_next(s);
    uint32_t bits = (uint32_t)(r >> 32);
    switch (r % 8) {
    case 0: bits &= 0x807FFFFFu; break;                       /* subnormal */
    case 1: bits = (bits & 0x807FFFFFu) | 0x00800000u; break; /* 2^-126 .. */
    case 2: { /* cancels the first product (to a few ulps) */
        float p = word_half(a, true) * word_half(b, true);
        float f = -p * (1.0f + (float)((int)((r >> 8) % 7) - 3) * 0x1p-23f);
        if (isfinite(f))
            return f;
        break;
    }
    case 3: bits = (bits & 0x80FFFFFFu) | 0x3C000000u; break; /* ordinary */
    default: bits = (bits & 0x807FFFFFu) | ((uint32_t)(100 + (r >> 8) % 60) << 23); break;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint32_t random_pair(uint64_t *s)
{
    return random_bf16(s) | (uint32_t)random_bf16(s) << 16;
}

static bool same_bits(float x, float y)
{
    if (isnan(x) && isnan(y))
        return true;
    return memcmp(&x, &y, sizeof x) == 0;
}

/* The tile kernel's step against model_tdp: the same bits for finite
 * operands, except that a zero's sign is the tiles' own (no input of the
 * attention is infinite or NaN, and a score that overflows sends its row
 * to the double path). False only for a real difference. */
static bool same_tdp(float got, float want, float acc, uint32_t a, uint32_t b)
{
    const float parts[5] = {acc, word_half(a, true), word_half(a, false), word_half(b, true),
                            word_half(b, false)};
    for (int i = 0; i < 5; i++)
        if (!isfinite(parts[i]))
            return true; /* not compared */
    if (got == 0.0f && want == 0.0f)
        return true;
    return same_bits(got, want);
}

/* A chain of tdpbf16ps steps: C = acc + sum_p dot(a_p, b_p). How a tile
 * associates the sums of several words is its own (no chain of float32
 * roundings reproduces it), so the chain is held to what any association
 * of float32 sums allows: within (2n + 1) U32 of the sum of the terms'
 * magnitudes of the exact value (n words), plus one FLT_MIN per flushed
 * product. Compared where the exact value is finite. */
static bool within_tdp_chain(float got, float acc, const uint32_t *a, int64_t a_cs,
                             const uint32_t *b, int64_t ldb, int64_t n)
{
    long double exact = acc, mag = fabsf(acc);
    for (int64_t p = 0; p < n; p++)
        for (int half = 0; half < 2; half++) {
            float x = word_half(a[p * a_cs], half == 0), y = word_half(b[p * ldb], half == 0);
            x = fabsf(x) < FLT_MIN ? 0.0f : x;
            y = fabsf(y) < FLT_MIN ? 0.0f : y;
            exact += (long double)x * (long double)y;
            mag += fabsl((long double)x * (long double)y);
        }
    if (!isfinite((double)exact) || !(fabsl(exact) < (long double)FLT_MAX) || !isfinite((double)mag))
        return true;
    const long double bound = (2 * n + 1) * (0x1p-24L * mag + (long double)FLT_MIN);
    return fabsl((long double)got - exact) <= bound;
}

/* Every kernel's bfloat16 product (one step of its register block: C += A
 * B with kpairs = 1, a 16-column row) against the pseudocode's model and,
 * where the CPU has it, against vdpbf16ps itself. Then the region where
 * rounding and flushing meet: results within a few ulps of 2^-126. */
START_TEST(products_match_vdpbf16ps_bit_for_bit)
{
    enum { COLS = 16, ROUNDS = 60000 };
    const attn_kernel_kind kinds[] = {ATTN_KERNEL_GENERIC, ATTN_KERNEL_AVX2, ATTN_KERNEL_AVX512};
    const attn_bf16_kind paths[] = {ATTN_BF16_EMULATED, ATTN_BF16_AVX512_BF16, ATTN_BF16_AMX};
    const bool instr = cpu_has_bf16();
    uint64_t s = 2024;
    uint32_t a[COLS], b[COLS];
    float acc[COLS], want[COLS], want_tdp[COLS], got[COLS], hw[COLS];
    long compared = 0, wrong = 0;
    char first[200] = "";
    for (int round = 0; round < ROUNDS + 1500; round++) {
        for (int c = 0; c < COLS; c++) {
            a[c] = random_bf16(&s) | (uint32_t)random_bf16(&s) << 16;
            b[c] = random_bf16(&s) | (uint32_t)random_bf16(&s) << 16;
            acc[c] = random_acc(&s, a[c], b[c]);
            if (round >= ROUNDS) {
                /* acc near +-2^-126, the product a tiny multiple of it. */
                int k = 140 + (int)(rng_next(&s) % 20);
                float x = ldexpf(1.0f + (float)(rng_next(&s) % 128) / 128.0f, -(k / 2));
                float y = ldexpf(rng_next(&s) & 1 ? 1.0f : -1.0f, -(k - k / 2));
                uint32_t xb, yb;
                memcpy(&xb, &x, 4);
                memcpy(&yb, &y, 4);
                a[c] = (xb & 0xFFFF0000u) | 0x8000u; /* low half -0: keeps a zero's sign */
                b[c] = (yb & 0xFFFF0000u) | 0x3F80u;
                uint32_t ab = 0x00800000u + (uint32_t)(rng_next(&s) % 4);
                memcpy(&acc[c], &ab, 4);
                if (rng_next(&s) & 1)
                    acc[c] = -acc[c];
            }
            want[c] = model_dot2(acc[c], a[c], b[c]);
        }
#if defined(__x86_64__)
        if (instr) {
            memcpy(hw, acc, sizeof hw);
            instr_dot2(hw, a, b);
            for (int c = 0; c < COLS; c++)
                if (!same_bits(hw[c], want[c]) && wrong++ == 0)
                    snprintf(first, sizeof first, "vdpbf16ps(%a, %08x, %08x) = %a, the model %a",
                             (double)acc[c], a[c], b[c], (double)hw[c], (double)want[c]);
        }
#endif
        for (size_t kd = 0; kd < 3; kd++)
            for (size_t pa = 0; pa < sizeof paths / sizeof *paths; pa++) {
                const attn_kern_bf16 *kb = attn_kern_bf16_of(kinds[kd], paths[pa]);
                if (kb == NULL)
                    continue;
                memcpy(got, acc, sizeof got);
                /* One row, one pair: C[0][c] += dot2(a[c], b[c]) needs A
                 * broadcast, so each column is its own call. */
                for (int c = 0; c < COLS; c++) {
                    if (paths[pa] == ATTN_BF16_AMX) {
                        /* Two rows, the same A (stride 0): the tiles (one
                         * row runs on vdpbf16ps, checked below). */
                        float two[2] = {acc[c], acc[c]};
                        kb->gemm(2, 1, 1, &a[c], 0, 1, &b[c], 1, two, 1, true);
                        got[c] = two[1];
                        want_tdp[c] = model_tdp(acc[c], a[c], b[c]);
                    } else {
                        kb->gemm(1, 1, 1, &a[c], 1, 1, &b[c], 1, &got[c], 1, true);
                    }
                }
                const float *w = paths[pa] == ATTN_BF16_AMX ? want_tdp : want;
                for (int c = 0; c < COLS; c++)
                    if (!(paths[pa] == ATTN_BF16_AMX ? same_tdp(got[c], w[c], acc[c], a[c], b[c])
                                                     : same_bits(got[c], w[c])) &&
                        wrong++ == 0)
                        snprintf(first, sizeof first, "%s %s: dot2(%a, %08x, %08x) = %a, the "
                                 "model %a", attn_kernel_kind_name(kinds[kd]),
                                 attn_bf16_kind_name(paths[pa]), (double)acc[c], a[c], b[c],
                                 (double)got[c], (double)w[c]);
                compared += COLS;
            }
    }
    if (attn_kern_bf16_of(ATTN_KERNEL_AVX512, ATTN_BF16_AMX) == NULL)
        fprintf(stderr, "  (skipped the AMX tiles' products: no AMX-BF16 on this CPU, or no "
                        "permission for its tiles)\n");
    ck_assert_msg(wrong == 0, "%ld of %ld lanes differ, the first: %s", wrong, compared, first);
    ck_assert(compared > ROUNDS * COLS);
}
END_TEST

/* A whole register block: C [rows, cols] += A B over many pairs, A
 * broadcast by rows or transposed, every kernel's product against the
 * model of chained steps (the order the instruction fixes); the AMX tiles'
 * (whose association over words is their own) within float32's bound for
 * any order. */
START_TEST(block_products_chain_steps_in_order)
{
    const attn_kernel_kind kinds[] = {ATTN_KERNEL_GENERIC, ATTN_KERNEL_AVX2, ATTN_KERNEL_AVX512};
    const attn_bf16_kind paths[] = {ATTN_BF16_EMULATED, ATTN_BF16_AVX512_BF16, ATTN_BF16_AMX};
    const int64_t widths[] = {1, 7, 16, 17, 33, 64, 70};
    const int64_t depths[] = {0, 1, 5, 32};
    enum { LD = 80, ROWS = 6 };
    uint64_t s = 99;
    uint32_t *a = xcalloc(80 * 80, sizeof *a), *b = xcalloc(40 * LD, sizeof *b);
    float *c0 = xcalloc(ROWS * LD, sizeof *c0), *c = xcalloc(ROWS * LD, sizeof *c);
    for (int i = 0; i < 80 * 80; i++)
        a[i] = random_pair(&s);
    for (int i = 0; i < 40 * LD; i++)
        b[i] = random_pair(&s);
    for (int i = 0; i < ROWS * LD; i++)
        c0[i] = (float)rng_uniform(&s);
    for (size_t kd = 0; kd < 3; kd++)
        for (size_t pa = 0; pa < sizeof paths / sizeof *paths; pa++) {
            const attn_kern_bf16 *kb = attn_kern_bf16_of(kinds[kd], paths[pa]);
            if (kb == NULL)
                continue;
            for (int rows = 1; rows <= kb->mr && rows <= ROWS; rows++)
                for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++)
                    for (size_t di = 0; di < sizeof depths / sizeof *depths; di++)
                        for (int layout = 0; layout < 2; layout++)
                            for (int accumulate = 0; accumulate < 2; accumulate++) {
                                int64_t cols = widths[wi], kd2 = depths[di];
                                int64_t a_rs = layout ? 1 : 80, a_cs = layout ? 9 : 1;
                                memcpy(c, c0, ROWS * LD * sizeof *c);
                                kb->gemm(rows, cols, kd2, a, a_rs, a_cs, b, LD, c, LD,
                                         accumulate);
                                int bad_r = -1;
                                int64_t bad_j = 0;
                                float bad_w = 0.0f;
                                for (int r = 0; r < ROWS; r++)
                                    for (int64_t j = 0; j < LD; j++) {
                                        float w = c0[r * LD + j];
                                        if (r < rows && j < cols) {
                                            w = accumulate ? w : 0.0f;
                                            for (int64_t p = 0; p < kd2; p++)
                                                w = paths[pa] == ATTN_BF16_AMX && rows > 1
                                                        ? model_tdp(w, a[r * a_rs + p * a_cs],
                                                                    b[p * LD + j])
                                                        : model_dot2(w, a[r * a_rs + p * a_cs],
                                                                     b[p * LD + j]);
                                        }
                                        const bool same =
                                            paths[pa] == ATTN_BF16_AMX && rows > 1 && r < rows &&
                                                    j < cols
                                                ? within_tdp_chain(
                                                      c[r * LD + j],
                                                      accumulate ? c0[r * LD + j] : 0.0f,
                                                      a + r * a_rs, a_cs, b + j, LD, kd2)
                                                : same_bits(c[r * LD + j], w);
                                        if (bad_r < 0 && !same)
                                            bad_r = r, bad_j = j, bad_w = w;
                                    }
                                ck_assert_msg(bad_r < 0,
                                              "%s %s rows %d cols %lld pairs %lld: C[%d][%lld] "
                                              "= %a, want %a",
                                              attn_kernel_kind_name(kinds[kd]),
                                              attn_bf16_kind_name(paths[pa]), rows,
                                              (long long)cols, (long long)kd2, bad_r,
                                              (long long)bad_j,
                                              bad_r < 0 ? 0.0 : (double)c[bad_r * LD + bad_j],
                                              (double)bad_w);
                            }
        }
    free(a), free(b), free(c0), free(c);
}
END_TEST

/* ------------------------------------------- vdpbf16ps and emulation */

static void assert_same_floats(const char *what, const float *x, const float *y, size_t n)
{
    size_t i = 0;
    while (i < n && same_bits(x[i], y[i]))
        i++;
    ck_assert_msg(i == n, "%s: element %zu is %a with the instruction, %a emulated", what, i,
                  (double)x[i < n ? i : 0], (double)y[i < n ? i : 0]);
}

/* On a CPU with AVX512_BF16, the vdpbf16ps kernel and the AVX-512
 * emulation give the same bits for whole calls: outputs, rows, weights,
 * statistics and gradients, every variant, both layouts; on a CPU with
 * AMX-BF16 (and the permission for its tiles), the tile kernel too. Each
 * that the CPU lacks is skipped with a line saying so. */
static void agree_with_emulation(const attn_kern_bf16 *hw, const attn_kern_bf16 *em);

START_TEST(avx512_bf16_and_emulation_agree_bit_for_bit)
{
    const attn_kern_bf16 *em = attn_kern_bf16_of(ATTN_KERNEL_AVX512, ATTN_BF16_EMULATED);
    const attn_bf16_kind hw_paths[] = {ATTN_BF16_AVX512_BF16, ATTN_BF16_AMX};
    for (size_t path = 0; path < sizeof hw_paths / sizeof *hw_paths; path++) {
        const attn_kern_bf16 *hw = attn_kern_bf16_of(ATTN_KERNEL_AVX512, hw_paths[path]);
        if (hw == NULL) {
            fprintf(stderr, "  (skipped: no %s on this CPU, or no permission for it: the "
                            "emulations were compared with the model of the instruction "
                            "instead)\n",
                    hw_paths[path] == ATTN_BF16_AMX ? "AMX-BF16 tiles" : "AVX512_BF16");
            continue;
        }
        if (hw_paths[path] == ATTN_BF16_AMX) {
            /* Its steps round each word's pair once (model_tdp): not the
             * emulation's bits; whole calls are checked against the double
             * reference instead (the cases tagged "kernel", on the path
             * attn_bf16() picks, which is AMX where it runs). */
            ck_assert_int_eq(attn_bf16(), getenv("ATTN_BF16") != NULL &&
                                              *getenv("ATTN_BF16") != '\0'
                                          ? attn_bf16()
                                          : ATTN_BF16_AMX);
            continue;
        }
        agree_with_emulation(hw, em);
    }
}
END_TEST

/* Whole calls with the hardware products hw and with the emulation em:
 * the same bits. */
static void agree_with_emulation(const attn_kern_bf16 *hw, const attn_kern_bf16 *em)
{
    const sdpa_kernels with_hw = {attn_kern_of(ATTN_KERNEL_AVX512), hw};
    const sdpa_kernels with_em = {attn_kern_of(ATTN_KERNEL_AVX512), em};
    for (int h = 0; h < 8; h++)
        g_slopes[h] = (float)pow(2.0, -(h + 1));
    const attn_variants vars[] = {
        {0},
        {.window = true, .window_left = 17, .window_right = 4},
        {.alibi_slopes = g_slopes, .softcap = 2.0f},
        {.rope_base = 1000.0f},
    };
    for (size_t vi = 0; vi < sizeof vars / sizeof *vars; vi++)
        for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++)
            for (int causal = 0; causal < 2; causal++) {
                attn_sdpa_params p = sdpa_shape(2, 4, 2, SHAPES[s].nq, SHAPES[s].nk,
                                                SHAPES[s].dk + (SHAPES[s].dk % 2),
                                                SHAPES[s].dv);
                p.causal = causal;
                p.threads = 2;
                p.variants = vars[vi];
                sdpa_case c;
                case_init(&c, &p, 300 + s, 2.0);
                if (vi == 0 && causal) {
                    const int64_t shape[2] = {SHAPES[s].nq, SHAPES[s].nk};
                    case_mask(&c, ATTN_MASK_BIAS, 2, shape, 4);
                }
                c.lib.precision = ATTN_PRECISION_BFLOAT16;
                for (int layout = 0; layout < 2; layout++) {
                    lib_run x = run_lib(&c, (attn_layout)layout, true, true, &with_hw);
                    lib_run y = run_lib(&c, (attn_layout)layout, true, true, &with_em);
                    char what[96];
                    snprintf(what, sizeof what, "variant %zu shape %zu causal %d layout %d", vi,
                             s, causal, layout);
                    assert_same_floats(what, x.out, y.out, c.n_out);
                    assert_same_floats(what, x.weights, y.weights, c.n_w);
                    assert_same_floats(what, x.dq, y.dq, c.n_qel);
                    assert_same_floats(what, x.dk, y.dk, c.n_kel);
                    assert_same_floats(what, x.dv, y.dv, c.n_vel);
                    ck_assert(memcmp(x.rows, y.rows, c.n_rows * sizeof *x.rows) == 0);
                    ck_assert(memcmp(&x.stats, &y.stats, sizeof x.stats) == 0);
                    lib_run_free(&x);
                    lib_run_free(&y);
                }
                case_free(&c);
            }
}


/* ------------------------------------------------------------- edges */

/* The precision is honoured (bfloat16 is not float32) and checked. */
START_TEST(precision_is_honoured_and_checked)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 9, 9, 8, 8);
    sdpa_case c;
    case_init(&c, &p, 3, 1.0);
    lib_run f32 = run_lib(&c, ATTN_LAYOUT_BHND, false, false, NULL);
    c.lib.precision = ATTN_PRECISION_BFLOAT16;
    lib_run b16 = run_lib(&c, ATTN_LAYOUT_BHND, false, false, NULL);
    ck_assert(memcmp(f32.out, b16.out, c.n_out * sizeof(float)) != 0);
    lib_run_free(&f32);
    lib_run_free(&b16);
    c.lib.precision = (attn_precision)7;
    float out[72];
    attn_error err = {0};
    ck_assert_int_eq(attn_sdpa_forward(&c.lib, c.q, c.k, c.v, out, NULL, NULL, NULL, &err),
                     ATTN_ERR_INVALID);
    ck_assert(strstr(err.message, "precision") != NULL);
    case_free(&c);
}
END_TEST

/* Scores past float32 (q and k near 1e20): the row is redone in double
 * from the rounded operands, as in float32, and stays finite; and inputs
 * past bfloat16's largest finite value saturate instead of overflowing. */
START_TEST(overflowing_scores_are_redone_from_rounded_operands)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 4, 5, 4, 3);
    p.precision = ATTN_PRECISION_BFLOAT16;
    float q[16], k[20], v[15], out[12];
    for (int i = 0; i < 16; i++)
        q[i] = (i % 4 == 0) ? 3e20f : 0.1f * (float)i;
    for (int i = 0; i < 20; i++)
        k[i] = (i % 4 == 0) ? 2e20f * (float)(1 + i / 4) : 0.0f;
    for (int i = 0; i < 15; i++)
        v[i] = (float)i + 0.3f;
    v[14] = 3.3999e38f; /* rounds past bfloat16's largest: saturates */
    attn_softmax_row rows[4];
    attn_error err = {0};
    ck_assert_int_eq(attn_sdpa_forward(&p, q, k, v, out, rows, NULL, NULL, &err), ATTN_OK);
    /* Every score is huge and the last key's the largest by far: out = v~
     * of the last key. */
    bool last = true;
    for (int i = 0; i < 4; i++)
        for (int c = 0; c < 3; c++)
            last &= out[i * 3 + c] == attn_bf16_round(v[4 * 3 + c]);
    ck_assert_msg(last, "out[0] = %g %g %g, want bf16 of %g %g %g", (double)out[0],
                  (double)out[1], (double)out[2], (double)v[12], (double)v[13], (double)v[14]);
    ck_assert(out[2] == 0x1.fep127f);
}
END_TEST

/* The same in a strip the kernels take at once (every row sees all of a
 * full tile's keys): one score of one row overflows; that row is redone in
 * double (a one-hot row: exactly v~ of its key), the others are as the
 * reference has them. */
START_TEST(overflow_in_a_plain_strip_is_redone_from_rounded_operands)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 12, 128, 8, 5);
    p.threads = 1;
    sdpa_case c;
    case_init(&c, &p, 17, 1.0);
    for (int64_t i = 0; i < 12; i++)
        c.q[i * 8] = i == 3 ? 3e20f : 0.0f; /* feature 0: only row 3 reads it */
    for (int64_t j = 0; j < 128; j++)
        c.k[j * 8] = j == 70 ? 2e20f : 1.0f;
    case_sync(&c);
    c.lib.precision = c.ref.precision = ATTN_PRECISION_BFLOAT16;
    lib_run r = run_lib(&c, ATTN_LAYOUT_BHND, false, false, NULL);
    bool one_hot = true;
    for (int64_t t = 0; t < 5; t++)
        one_hot &= r.out[3 * 5 + t] == attn_bf16_round(c.v[70 * 5 + t]);
    ck_assert_msg(one_hot, "row 3: %g %g ..., want bf16 of v[70] = %g %g ...", (double)r.out[15],
                  (double)r.out[16], (double)attn_bf16_round(c.v[350]),
                  (double)attn_bf16_round(c.v[351]));
    operands o = operands_of(&c);
    fwd_ref f = reference_forward_bf16(&c, &o, false);
    assert_within("plain strip with an overflowed score: out", r.out, &f.out, c.n_out);
    fwd_ref_free(&f);
    operands_free(&o);
    lib_run_free(&r);
    case_free(&c);
}
END_TEST

/* Multi-head attention in bfloat16: projections in float32 (OpenBLAS),
 * the attention between them in bfloat16. The same as projecting by hand
 * and calling attn_sdpa_forward in bfloat16 on [B, n, h, d]. */
START_TEST(multihead_projects_in_float32_and_attends_in_bf16)
{
    const int64_t B = 2, n = 37, dm = 24, h = 4, hkv = 2, dk = 6;
    uint64_t s = 5;
    float *x = xcalloc((size_t)(B * n * dm), sizeof(float));
    float *wq = xcalloc((size_t)(dm * h * dk), sizeof(float));
    float *wk = xcalloc((size_t)(dm * hkv * dk), sizeof(float));
    float *wv = xcalloc((size_t)(dm * hkv * dk), sizeof(float));
    fill(x, (size_t)(B * n * dm), &s, 1.0);
    fill(wq, (size_t)(dm * h * dk), &s, 0.3);
    fill(wk, (size_t)(dm * hkv * dk), &s, 0.3);
    fill(wv, (size_t)(dm * hkv * dk), &s, 0.3);
    attn_mha_params mp = {.batch = B, .n = n, .m = n, .d_model = dm, .d_ctx = dm, .heads = h,
                          .kv_heads = hkv, .d_k = dk, .d_v = dk, .d_out = h * dk,
                          .scale = attn_default_scale(dk), .causal = true, .threads = 2,
                          .precision = ATTN_PRECISION_BFLOAT16};
    attn_mha_inputs in = {.x = x, .w_q = wq, .w_k = wk, .w_v = wv};
    float *out = nan_floats((size_t)(B * n * h * dk));
    attn_error err = {0};
    ck_assert_int_eq(attn_mha_forward(&mp, &in, out, NULL, NULL, NULL, &err), ATTN_OK);
    /* By hand: the projections in double, then rounded to float (OpenBLAS
     * sums in another order: within its own rounding, far below the
     * bfloat16 rounding that follows), attention in bfloat16. */
    float *q = xcalloc((size_t)(B * n * h * dk), sizeof(float));
    float *k = xcalloc((size_t)(B * n * hkv * dk), sizeof(float));
    float *v = xcalloc((size_t)(B * n * hkv * dk), sizeof(float));
    for (int64_t r = 0; r < B * n; r++) {
        for (int64_t col = 0; col < h * dk; col++) {
            double a = 0.0;
            for (int64_t t = 0; t < dm; t++)
                a += (double)x[r * dm + t] * wq[t * h * dk + col];
            q[r * h * dk + col] = (float)a;
        }
        for (int64_t col = 0; col < hkv * dk; col++) {
            double a = 0.0, bb = 0.0;
            for (int64_t t = 0; t < dm; t++) {
                a += (double)x[r * dm + t] * wk[t * hkv * dk + col];
                bb += (double)x[r * dm + t] * wv[t * hkv * dk + col];
            }
            k[r * hkv * dk + col] = (float)a;
            v[r * hkv * dk + col] = (float)bb;
        }
    }
    attn_sdpa_params p = {.batch = B, .heads_q = h, .heads_kv = hkv, .n_q = n, .n_k = n,
                          .d_k = dk, .d_v = dk, .scale = mp.scale, .causal = true, .threads = 2,
                          .layout = ATTN_LAYOUT_BNHD, .precision = ATTN_PRECISION_BFLOAT16};
    float *want = nan_floats((size_t)(B * n * h * dk));
    ck_assert_int_eq(attn_sdpa_forward(&p, q, k, v, want, NULL, NULL, NULL, &err), ATTN_OK);
    /* A projection one float ulp away can round to the next bfloat16
     * (2^-8 relative) in a rare element: the outputs agree to that. */
    double worst = 0.0;
    for (int64_t i = 0; i < B * n * h * dk; i++)
        worst = fmax(worst, fabs((double)out[i] - want[i]));
    note("multihead bf16 against projections by hand", worst);
    ck_assert_msg(worst < 1e-2, "multi-head bf16 differs by %g", worst);
    p.precision = ATTN_PRECISION_FLOAT32;
    float *f32 = nan_floats((size_t)(B * n * h * dk));
    ck_assert_int_eq(attn_sdpa_forward(&p, q, k, v, f32, NULL, NULL, NULL, &err), ATTN_OK);
    ck_assert(memcmp(f32, out, (size_t)(B * n * h * dk) * sizeof(float)) != 0);
    free(x), free(wq), free(wk), free(wv), free(out), free(q), free(k), free(v), free(want),
        free(f32);
}
END_TEST

/* x [rows, kdim] w [kdim, cols] + bias in double (y), and how far a
 * float32 product of them (any order of its sums, the bias among them,
 * then rounded) may be from it (e): gamma_{kdim+1} of the sum of
 * magnitudes, and the last rounding. */
static void project(const float *x, int64_t rows, int64_t kdim, const float *w, int64_t cols,
                    const float *bias, double *y, double *e)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            double acc = bias != NULL ? bias[c] : 0.0;
            double mag = fabs(acc);
            for (int64_t t = 0; t < kdim; t++) {
                acc += (double)x[r * kdim + t] * w[t * cols + c];
                mag += fabs((double)x[r * kdim + t] * w[t * cols + c]);
            }
            y[r * cols + c] = acc;
            e[r * cols + c] = gamma32((double)(kdim + 1)) * mag + U32 * fabs(acc);
        }
}

/* Heads of a projection y [B, n, H, d] as operands [B, H, n, d]: bf16 of
 * each, and its slack (round_slack within the projection's error e). */
static void heads_of(const double *y, const double *e, int64_t B, int64_t n, int64_t H,
                     int64_t d, double *val, double *slack)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t t = 0; t < d; t++) {
                    size_t from = (size_t)(((b * n + i) * H + h) * d + t);
                    size_t to = (size_t)(((b * H + h) * n + i) * d + t);
                    val[to] = bf16(y[from]);
                    slack[to] = round_slack(y[from], e[from]);
                }
}

/* Multi-head attention in bfloat16 against the double reference: the
 * projections x W + b in double, of which the library's float32 ones
 * (OpenBLAS) lie within project()'s bound, so that each rounded operand
 * (q, k and v) lies within its round_slack of the reference's; the
 * attention between them as attn.h states it (forward_row, with v's slack
 * too); then the output projection in double, the attention's bound
 * carried through it (sum_c tol_c |W_O|) beside its own float32 sums.
 * Cross-attention (m != n), grouped-query heads, causal, odd widths,
 * biases. The projections are float32 whatever the precision: what the
 * bound allows them is float32's rounding, not bfloat16's. */
START_TEST(multihead_matches_the_bf16_reference)
{
    const int64_t B = 2, n = 37, m = 75, dm = 24, dc = 16, h = 4, hkv = 2, dk = 7, dv = 5,
                  d_out = 6;
    uint64_t s = 17;
    float *x = xcalloc((size_t)(B * n * dm), sizeof(float));
    float *ctx = xcalloc((size_t)(B * m * dc), sizeof(float));
    float *wq = xcalloc((size_t)(dm * h * dk), sizeof(float));
    float *wk = xcalloc((size_t)(dc * hkv * dk), sizeof(float));
    float *wv = xcalloc((size_t)(dc * hkv * dv), sizeof(float));
    float *wo = xcalloc((size_t)(h * dv * d_out), sizeof(float));
    float *bq = xcalloc((size_t)(h * dk), sizeof(float)), *bk = xcalloc((size_t)(hkv * dk), sizeof(float));
    float *bv = xcalloc((size_t)(hkv * dv), sizeof(float)), *bo = xcalloc((size_t)d_out, sizeof(float));
    fill(x, (size_t)(B * n * dm), &s, 1.0);
    fill(ctx, (size_t)(B * m * dc), &s, 1.0);
    fill(wq, (size_t)(dm * h * dk), &s, 0.5);
    fill(wk, (size_t)(dc * hkv * dk), &s, 0.5);
    fill(wv, (size_t)(dc * hkv * dv), &s, 0.5);
    fill(wo, (size_t)(h * dv * d_out), &s, 0.5);
    fill(bq, (size_t)(h * dk), &s, 0.2);
    fill(bk, (size_t)(hkv * dk), &s, 0.2);
    fill(bv, (size_t)(hkv * dv), &s, 0.2);
    fill(bo, (size_t)d_out, &s, 0.2);
    attn_mha_params mp = {.batch = B, .n = n, .m = m, .d_model = dm, .d_ctx = dc, .heads = h,
                          .kv_heads = hkv, .d_k = dk, .d_v = dv, .d_out = d_out,
                          .scale = attn_default_scale(dk), .causal = true, .threads = 2,
                          .precision = ATTN_PRECISION_BFLOAT16};
    attn_mha_inputs in = {.x = x, .context = ctx, .w_q = wq, .w_k = wk, .w_v = wv, .w_o = wo,
                          .b_q = bq, .b_k = bk, .b_v = bv, .b_o = bo};
    const size_t n_out = (size_t)(B * n * d_out);
    float *out = nan_floats(n_out);
    attn_error err = {0};
    ck_assert_int_eq(attn_mha_forward(&mp, &in, out, NULL, NULL, NULL, &err), ATTN_OK);

    const size_t nq = (size_t)(B * n * h * dk), nk = (size_t)(B * m * hkv * dk),
                 nv = (size_t)(B * m * hkv * dv);
    double *y = xcalloc(nq + nk + nv, sizeof *y), *e = xcalloc(nq + nk + nv, sizeof *e);
    project(x, B * n, dm, wq, h * dk, bq, y, e);
    project(ctx, B * m, dc, wk, hkv * dk, bk, y + nq, e + nq);
    project(ctx, B * m, dc, wv, hkv * dv, bv, y + nq + nk, e + nq + nk);
    operands o = {xcalloc(nq, sizeof(double)), xcalloc(nk, sizeof(double)),
                  xcalloc(nv, sizeof(double)), xcalloc(nq, sizeof(double)),
                  xcalloc(nk, sizeof(double)), xcalloc(nv, sizeof(double))};
    heads_of(y, e, B, n, h, dk, o.q, o.sq);
    heads_of(y + nq, e + nq, B, m, hkv, dk, o.k, o.sk);
    heads_of(y + nq + nk, e + nq + nk, B, m, hkv, dv, o.v, o.sv);
    attn_sdpa_params ref = sdpa_shape(B, h, hkv, n, m, dk, dv);
    ref.scale = mp.scale;
    ref.causal = true;
    ref.precision = ATTN_PRECISION_BFLOAT16;
    const size_t n_o = (size_t)(B * h * n * dv);
    double *O = xcalloc(n_o, sizeof *O), *Ot = xcalloc(n_o, sizeof *Ot);
    for (int64_t b = 0; b < B; b++)
        for (int64_t hh = 0; hh < h; hh++)
            for (int64_t i = 0; i < n; i++) {
                const size_t row = (size_t)((b * h + hh) * n + i);
                forward_row(&ref, &o, b, hh, i, O + row * (size_t)dv, Ot + row * (size_t)dv,
                            NULL, NULL);
            }
    ref_t want = ref_alloc(n_out);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t col = 0; col < d_out; col++) {
                double acc = bo[col], mag = fabs((double)bo[col]), moved = 0.0;
                for (int64_t hh = 0; hh < h; hh++)
                    for (int64_t c = 0; c < dv; c++) {
                        const size_t at = (size_t)(((b * h + hh) * n + i) * dv + c);
                        const double w = wo[(hh * dv + c) * d_out + col];
                        acc += O[at] * w;
                        mag += fabs(O[at] * w);
                        moved += Ot[at] * fabs(w);
                    }
                const size_t at = (size_t)((b * n + i) * d_out + col);
                want.val[at] = acc;
                want.tol[at] = moved + gamma32((double)(h * dv + 1)) * (mag + moved) +
                               U32 * fabs(acc);
            }
    assert_within("multihead bf16 out", out, &want, n_out);
    /* Not float32's answer: the same call in float32 falls outside. */
    mp.precision = ATTN_PRECISION_FLOAT32;
    float *f32 = nan_floats(n_out);
    ck_assert_int_eq(attn_mha_forward(&mp, &in, f32, NULL, NULL, NULL, &err), ATTN_OK);
    size_t at;
    ck_assert_msg(worst_ratio(f32, &want, n_out, &at) > 1.0,
                  "float32 multi-head attention passes the bfloat16 bound");
    ref_free(&want);
    operands_free(&o);
    free(y), free(e), free(O), free(Ot), free(out), free(f32);
    free(x), free(ctx), free(wq), free(wk), free(wv), free(wo), free(bq), free(bk), free(bv),
        free(bo);
}
END_TEST

/* Statistics in bfloat16 are those of its scores and weights: near the
 * float32 ones (the rounding moves them by about 2^-8), finite, counted
 * alike. */
START_TEST(statistics_follow_the_bf16_scores)
{
    attn_sdpa_params p = sdpa_shape(1, 2, 2, 50, 90, 16, 8);
    p.causal = true;
    p.threads = 2;
    sdpa_case c;
    case_init(&c, &p, 21, 1.0);
    lib_run f32 = run_lib(&c, ATTN_LAYOUT_BHND, false, true, NULL);
    c.lib.precision = ATTN_PRECISION_BFLOAT16;
    lib_run b16 = run_lib(&c, ATTN_LAYOUT_BHND, false, true, NULL);
    ck_assert_int_eq(f32.stats.scores_count, b16.stats.scores_count);
    ck_assert_int_eq(f32.stats.rows_count, b16.stats.rows_count);
    const double pairs[][2] = {
        {f32.stats.scores_mean, b16.stats.scores_mean}, {f32.stats.scores_var, b16.stats.scores_var},
        {f32.stats.entropy_mean, b16.stats.entropy_mean},
        {f32.stats.max_weight_mean, b16.stats.max_weight_mean},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
        ck_assert_msg(fabs(pairs[i][0] - pairs[i][1]) <= 2e-2 * (1.0 + fabs(pairs[i][0])),
                      "statistic %zu: float32 %g, bfloat16 %g", i, pairs[i][0], pairs[i][1]);
    ck_assert(b16.stats.scores_mean != f32.stats.scores_mean);
    lib_run_free(&f32);
    lib_run_free(&b16);
    case_free(&c);
}
END_TEST

/* ------------------------------------------- bfloat16 words as inputs */

/* The case's inputs rounded to bfloat16, so that bfloat16 words hold
 * exactly the floats a float32 call reads; among them subnormal bfloat16
 * values (the products read them as zero) and a negative zero. */
static void round_to_words(sdpa_case *c)
{
    float *xs[] = {c->q, c->k, c->v, c->dout};
    const size_t ns[] = {c->n_qel, c->n_kel, c->n_vel, c->n_out};
    const uint32_t odd[] = {0x00010000u, 0x807F0000u, 0x80000000u, 0x00400000u};
    for (int t = 0; t < 4; t++) {
        for (size_t i = 0; i < ns[t]; i++)
            xs[t][i] = attn_bf16_round(xs[t][i]);
        for (size_t j = 0; j < 4; j++)
            memcpy(&xs[t][(j * 7 + (size_t)t) % ns[t]], &odd[j], sizeof(float));
    }
}

/* Every bfloat16 kernel this CPU runs: each instruction set's emulation,
 * and vdpbf16ps. */
static int bf16_kernels(sdpa_kernels out[4], const char *names[4])
{
    int n = 0;
    for (int kind = ATTN_KERNEL_GENERIC; kind <= ATTN_KERNEL_AVX512; kind++)
        for (int path = ATTN_BF16_EMULATED; path <= ATTN_BF16_AVX512_BF16; path++) {
            const attn_kern_bf16 *kb = attn_kern_bf16_of((attn_kernel_kind)kind,
                                                         (attn_bf16_kind)path);
            if (kb == NULL)
                continue;
            names[n] = path == ATTN_BF16_AVX512_BF16 ? "avx512 vdpbf16ps"
                       : kind == ATTN_KERNEL_AVX512  ? "avx512 emulated"
                       : kind == ATTN_KERNEL_AVX2    ? "avx2 emulated"
                                                     : "generic emulated";
            out[n++] = (sdpa_kernels){attn_kern_of((attn_kernel_kind)kind), kb};
        }
    return n;
}

static void assert_same_bits(const char *what, const char *part, const float *x,
                             const float *y, size_t n)
{
    size_t i = 0;
    while (i < n && same_bits(x[i], y[i]))
        i++;
    ck_assert_msg(i == n, "%s %s: element %zu is %a from words, %a from floats", what, part, i,
                  (double)x[i < n ? i : 0], (double)y[i < n ? i : 0]);
}

/* Everything a call returns, from words (x) and from floats (y). */
static void assert_same_run(const char *what, const sdpa_case *c, const lib_run *x,
                            const lib_run *y)
{
    assert_same_bits(what, "out", x->out, y->out, c->n_out);
    if (x->weights != NULL)
        assert_same_bits(what, "weights", x->weights, y->weights, c->n_w);
    assert_same_bits(what, "dq", x->dq, y->dq, c->n_qel);
    assert_same_bits(what, "dk", x->dk, y->dk, c->n_kel);
    assert_same_bits(what, "dv", x->dv, y->dv, c->n_vel);
    ck_assert_msg(memcmp(x->rows, y->rows, c->n_rows * sizeof *x->rows) == 0,
                  "%s: softmax rows differ", what);
    ck_assert_msg(memcmp(&x->stats, &y->stats, sizeof x->stats) == 0,
                  "%s: statistics differ", what);
}

/* q, k, v and dO given as bfloat16 words give the bits of the same call
 * on their float32 values, with every bfloat16 kernel: outputs, weights,
 * softmax rows, statistics and gradients; plain, windowed, ALiBi with a
 * soft cap, RoPE (the words widened for the float32 rotation); causal or
 * not; boolean and additive masks; grouped-query heads; odd widths (a
 * pair half empty); panels packed per unit and shared; both layouts. */
START_TEST(bf16_words_give_the_bits_of_their_floats_on_every_kernel)
{
    sdpa_kernels kernels[4];
    const char *names[4];
    const int n_kernels = bf16_kernels(kernels, names);
    for (int h = 0; h < 8; h++)
        g_slopes[h] = (float)pow(2.0, -(h + 1));
    const attn_variants vars[] = {
        {0},
        {.window = true, .window_left = 17, .window_right = 4},
        {.alibi_slopes = g_slopes, .softcap = 2.0f},
        {.rope_base = 1000.0f},
    };
    for (size_t vi = 0; vi < sizeof vars / sizeof *vars; vi++)
        for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++)
            for (int causal = 0; causal < 2; causal++) {
                const int64_t dk = SHAPES[s].dk + (vars[vi].rope_base > 0.0f ? SHAPES[s].dk % 2 : 0);
                attn_sdpa_params p = sdpa_shape(2, 4, s == 0 ? 4 : 2, SHAPES[s].nq,
                                                SHAPES[s].nk, dk, SHAPES[s].dv);
                p.causal = causal;
                p.threads = 2;
                p.variants = vars[vi];
                p.precision = ATTN_PRECISION_BFLOAT16;
                sdpa_case c;
                case_init(&c, &p, 500 + s, 2.0);
                if (vi == 0) {
                    const int64_t shape[2] = {SHAPES[s].nq, SHAPES[s].nk};
                    case_mask(&c, causal ? ATTN_MASK_BIAS : ATTN_MASK_BOOL, 2, shape, 5);
                }
                round_to_words(&c);
                for (int layout = 0; layout < (vi == 0 ? 2 : 1); layout++)
                    for (int kn = 0; kn < n_kernels; kn++) {
                        lib_run x = run_lib_as(&c, (attn_layout)layout, true, true,
                                               &kernels[kn], WORDS_ALL);
                        lib_run y = run_lib(&c, (attn_layout)layout, true, true, &kernels[kn]);
                        char what[128];
                        snprintf(what, sizeof what, "%s, variant %zu shape %zu causal %d layout %d",
                                 names[kn], vi, s, causal, layout);
                        assert_same_run(what, &c, &x, &y);
                        lib_run_free(&x);
                        lib_run_free(&y);
                    }
                case_free(&c);
            }
}
END_TEST

/* A plain strip's row steps taken at once (kern_body_bf16.h's strip_bf16,
 * its rows' exponentials side by side) give the bits of the row-by-row
 * path, which a call asking for the weights takes: outputs and softmax
 * rows, on every bfloat16 kernel, over whole tiles of 64 keys and a tile
 * cut short, with scores spread wide enough for exponentials that flush to
 * zero. */
START_TEST(plain_strips_give_the_bits_of_the_row_path_on_every_kernel)
{
    sdpa_kernels kernels[4];
    const char *names[4];
    const int n_kernels = bf16_kernels(kernels, names);
    const struct {
        int64_t nq, nk, d;
        double spread;
    } shapes[] = {{70, 150, 9, 2.0}, {48, 192, 64, 2.0}, {30, 128, 128, 2.0}, {36, 256, 64, 40.0}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        attn_sdpa_params p = sdpa_shape(1, 2, 2, shapes[s].nq, shapes[s].nk, shapes[s].d,
                                        shapes[s].d);
        p.threads = 2;
        p.precision = ATTN_PRECISION_BFLOAT16;
        sdpa_case c;
        case_init(&c, &p, 700 + s, shapes[s].spread);
        for (int kn = 0; kn < n_kernels; kn++) {
            lib_run x = run_lib(&c, ATTN_LAYOUT_BHND, false, false, &kernels[kn]);
            lib_run y = run_lib(&c, ATTN_LAYOUT_BHND, true, false, &kernels[kn]);
            char what[96];
            snprintf(what, sizeof what, "%s, shape %zu", names[kn], s);
            size_t i = 0;
            while (i < c.n_out && same_bits(x.out[i], y.out[i]))
                i++;
            ck_assert_msg(i == c.n_out, "%s: output %zu is %a in strips, %a row by row", what,
                          i, (double)x.out[i < c.n_out ? i : 0],
                          (double)y.out[i < c.n_out ? i : 0]);
            ck_assert_msg(memcmp(x.rows, y.rows, c.n_rows * sizeof *x.rows) == 0,
                          "%s: softmax rows differ", what);
            lib_run_free(&x);
            lib_run_free(&y);
        }
        case_free(&c);
    }
}
END_TEST

/* Each input's dtype is its own: every mix of words and floats among q,
 * k, v and dO gives the same bits (the process's kernel, through
 * attn_sdpa_forward_in and attn_sdpa_backward_in). */
START_TEST(each_input_may_be_words_or_floats)
{
    attn_sdpa_params p = sdpa_shape(2, 4, 2, 70, 150, 9, 7);
    p.causal = true;
    p.threads = 2;
    p.precision = ATTN_PRECISION_BFLOAT16;
    sdpa_case c;
    case_init(&c, &p, 77, 2.0);
    round_to_words(&c);
    lib_run y = run_lib(&c, ATTN_LAYOUT_BHND, true, true, NULL);
    for (unsigned words = 1; words <= WORDS_ALL; words++) {
        lib_run x = run_lib_as(&c, ATTN_LAYOUT_BHND, true, true, NULL, words);
        char what[64];
        snprintf(what, sizeof what, "%s, words %#x", attn_bf16_name(), words);
        assert_same_run(what, &c, &x, &y);
        lib_run_free(&x);
    }
    lib_run_free(&y);
    case_free(&c);
}
END_TEST

/* A row whose scores overflow float32 is redone in double from the
 * words' values, as from the floats': the same bits. */
START_TEST(overflowing_rows_from_words_are_redone_as_from_floats)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 12, 128, 8, 5);
    p.threads = 1;
    p.precision = ATTN_PRECISION_BFLOAT16;
    sdpa_case c;
    case_init(&c, &p, 17, 1.0);
    for (int64_t i = 0; i < 12; i++)
        c.q[i * 8] = i == 3 ? 3e20f : 0.0f;
    for (int64_t j = 0; j < 128; j++)
        c.k[j * 8] = j == 40 ? 2e20f : 1.0f;
    round_to_words(&c);
    c.q[3 * 8] = attn_bf16_round(3e20f); /* round_to_words may have put a subnormal there */
    lib_run x = run_lib_as(&c, ATTN_LAYOUT_BHND, true, false, NULL, WORDS_ALL);
    lib_run y = run_lib(&c, ATTN_LAYOUT_BHND, true, false, NULL);
    ck_assert(x.out[3 * 5] == attn_bf16_round(c.v[40 * 5])); /* the row redone: one-hot */
    assert_same_run("overflowing row", &c, &x, &y);
    lib_run_free(&x);
    lib_run_free(&y);
    case_free(&c);
}
END_TEST

/* Words go only where they are read as they are: through the _in entry
 * points, in bfloat16 precision, with a dtype that is one. */
START_TEST(words_need_bfloat16_precision_and_the_in_entry)
{
    attn_sdpa_params p = sdpa_shape(1, 1, 1, 3, 3, 2, 2);
    float q[6] = {1, 2, 3, 4, 5, 6}, out[6];
    uint16_t w[6] = {0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0};
    attn_error err = {0};
    p.dtype.k = ATTN_DTYPE_BFLOAT16;
    ck_assert_int_eq(attn_sdpa_forward_in(&p, q, w, q, out, NULL, NULL, NULL, &err),
                     ATTN_ERR_INVALID);
    ck_assert_msg(strstr(err.message, "precision bfloat16") != NULL, "%s", err.message);
    p.precision = ATTN_PRECISION_BFLOAT16;
    ck_assert_int_eq(attn_sdpa_forward(&p, q, q, q, out, NULL, NULL, NULL, &err),
                     ATTN_ERR_INVALID);
    ck_assert_msg(strstr(err.message, "attn_sdpa_forward_in") != NULL, "%s", err.message);
    ck_assert_int_eq(attn_sdpa_forward_in(&p, q, w, q, out, NULL, NULL, NULL, &err), ATTN_OK);
    p.dtype.v = (attn_dtype)5;
    ck_assert_int_eq(attn_sdpa_forward_in(&p, q, w, q, out, NULL, NULL, NULL, &err),
                     ATTN_ERR_INVALID);
    ck_assert_msg(strstr(err.message, "dtype 5") != NULL, "%s", err.message);
}
END_TEST

static Suite *bf16_suite(void)
{
    Suite *s = suite_create("bf16");
    TCase *t = tcase_create("operands");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, bf16_round_matches_its_definition);
    tcase_add_test(t, products_match_vdpbf16ps_bit_for_bit);
    tcase_add_test(t, block_products_chain_steps_in_order);
    suite_add_tcase(s, t);
    /* The cases whose results depend on the kernel (its bfloat16 path):
     * make test runs them once per kernel (the tag "kernel",
     * tests/run-suites.sh), and once more with the emulation where the
     * avx512 kernel has vdpbf16ps. */
    t = tcase_create("reference");
    tcase_set_tags(t, "kernel");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, plain_attention_matches_the_bf16_reference);
    tcase_add_test(t, causal_attention_matches_the_bf16_reference);
    tcase_add_test(t, grouped_query_attention_matches_the_bf16_reference);
    tcase_add_test(t, masks_bool_and_bias_match_the_bf16_reference);
    tcase_add_test(t, variants_match_the_bf16_reference);
    tcase_add_test(t, fully_masked_rows_are_zero_in_bf16);
    tcase_add_test(t, ragged_batches_match_the_bf16_reference_per_sequence);
    tcase_add_test(t, long_rows_match_the_bf16_reference);
    tcase_add_test(t, float32_products_fail_the_bf16_bound);
    suite_add_tcase(s, t);
    t = tcase_create("paths");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, avx512_bf16_and_emulation_agree_bit_for_bit);
    tcase_add_test(t, bf16_words_give_the_bits_of_their_floats_on_every_kernel);
    tcase_add_test(t, plain_strips_give_the_bits_of_the_row_path_on_every_kernel);
    suite_add_tcase(s, t);
    t = tcase_create("edges");
    tcase_set_tags(t, "kernel");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, precision_is_honoured_and_checked);
    tcase_add_test(t, overflowing_scores_are_redone_from_rounded_operands);
    tcase_add_test(t, overflow_in_a_plain_strip_is_redone_from_rounded_operands);
    tcase_add_test(t, multihead_projects_in_float32_and_attends_in_bf16);
    tcase_add_test(t, multihead_matches_the_bf16_reference);
    tcase_add_test(t, statistics_follow_the_bf16_scores);
    tcase_add_test(t, each_input_may_be_words_or_floats);
    tcase_add_test(t, overflowing_rows_from_words_are_redone_as_from_floats);
    tcase_add_test(t, words_need_bfloat16_precision_and_the_in_entry);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(bf16_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
