/*
 * The SDPA test harness shared by the lib-level suites (test_lib.c,
 * test_variants.c): reproducible random problems in float for libattn and
 * in double for the reference (tests/support/ref.c), and the comparisons
 * (forward, finite differences, analytic gradients) with their tolerances.
 * ATTN_TEST_VERBOSE=1 prints the largest error each comparison saw.
 */
#ifndef ATTN_TEST_SDPA_CASE_H
#define ATTN_TEST_SDPA_CASE_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attn.h"

/* Forward outputs relative to the largest reference value: float32 with
 * sums over up to 513 keys stays near 1e-6; a wrong scale or a shifted
 * mask is off by 1e-2 or more. */
#define TOL_FORWARD 2e-5
/* Gradients of float32 code against double finite differences. */
#define TOL_GRAD 1e-3
/* Gradients at sizes too large for finite differences, against the
 * analytic double reference (itself checked against finite differences). */
#define TOL_GRAD_ANALYTIC 1e-4
/* Statistics, relative to 1 + |value|. */
#define TOL_STATS 1e-5

#define ASSERT_ERR(err, tol, what)                                         \
    do {                                                                   \
        double e_ = (err);                                                 \
        note(what, e_);                                                    \
        ck_assert_msg(e_ <= (tol), "%s: error %.3g exceeds %.3g", what, e_, \
                      (double)(tol));                                      \
    } while (0)
#define ASSERT_OK(st, err)                                                 \
    ck_assert_msg((st) == ATTN_OK, "libattn failed (%d): %s", (int)(st),   \
                  (err).message)

/*
 * One problem: inputs in float for the library, the same values in double
 * for the reference. `lib` is what the library is called with; `ref` is the
 * same problem as the reference reads it (its mask, when there is one, is
 * expanded to the full [B, H_q, n_q, n_k] here, independently of
 * attn_mask_broadcast).
 */
typedef struct {
    attn_sdpa_params lib, ref;
    size_t n_qel, n_kel, n_vel, n_out, n_rows, n_w;
    float *q, *k, *v, *dout;
    double *qd, *kd, *vd, *doutd;
    void *mask_src, *mask_full; /* owned mask buffers, if any */
} sdpa_case;

/* What the library returned for one forward call. */
typedef struct {
    float *out, *weights;
    attn_softmax_row *rows;
    double *lse; /* from rows */
    attn_stats stats;
} lib_fwd;

/* Reference forward of the case: out, lse and (if asked) weights. */
typedef struct {
    double *out, *lse, *weights;
} ref_fwd;

/* What the library's backward returned (after its own forward). */
typedef struct {
    float *dq, *dk, *dv;
} lib_grads;

uint64_t rng_next(uint64_t *s);

/* Uniform in [-1, 1). */
double rng_uniform(uint64_t *s);

void *xcalloc(size_t n, size_t size);

float *nan_floats(size_t n);

double *to_double(const float *x, size_t n);

void note(const char *what, double err);

/* Largest |got - want| over the largest |want| (over 1 when want is all
 * zeros), so one tolerance serves tensors of any magnitude. A non-finite
 * value where a finite one is wanted is an infinite error. */
double rel_err(const float *got, const double *want, size_t n);

/* Log-sum-exp: -inf must match -inf exactly, the rest relative to 1+|x|. */
double lse_err(const double *got, const double *want, size_t n);

/* Largest |a - b| over the largest |a|, both from the library. */
double float_diff(const float *a, const float *b, size_t n);

int count_nonfinite(const float *x, size_t n);

/* Shapes and the chapter's default scale 1/sqrt(d_k), computed here. */
attn_sdpa_params sdpa_shape(int64_t batch, int64_t heads_q,
                            int64_t heads_kv, int64_t n_q, int64_t n_k,
                            int64_t d_k, int64_t d_v);

void fill(float *x, size_t n, uint64_t *seed, double amp);

void case_init(sdpa_case *c, const attn_sdpa_params *p, uint64_t seed,
               double q_amp);

/* After editing c->q/k/v/dout by hand. */
void case_sync(sdpa_case *c);

void case_free(sdpa_case *c);

/* Index of full-shape element (b,h,i,j) in a contiguous mask of `rank`
 * dims `shape`, by NumPy's rules: align on the right, size 1 repeats. */
size_t numpy_index(int rank, const int64_t *shape, const int64_t *at4);

/*
 * Gives the case a random mask of `kind` and shape `shape`: the library
 * reads it through attn_mask_broadcast, the reference through a full
 * expansion made here. Boolean masks allow a key with probability 3/4.
 */
void case_mask(sdpa_case *c, attn_mask_kind kind, int rank,
               const int64_t *shape, uint64_t seed);

void lib_forward(const sdpa_case *c, const attn_sdpa_params *p,
                 lib_fwd *r, bool want_weights, bool want_stats);

void lib_fwd_free(lib_fwd *r);

void reference_forward(const sdpa_case *c, ref_fwd *r, bool weights);

void ref_fwd_free(ref_fwd *r);

/* Output, log-sum-exp and (when small enough) weights against the
 * reference; returns the largest of the three errors. */
double check_forward(const sdpa_case *c, double tol, const char *what);

void lib_backward(const sdpa_case *c, const attn_sdpa_params *p,
                  lib_grads *g);

void lib_grads_free(lib_grads *g);

/* dq, dk, dv of the library against central finite differences of the
 * double reference (and against its analytic gradients). Small sizes only:
 * every input element costs two reference forward passes. */
void check_grad_fd(sdpa_case *c, const char *what);

/* The same against the analytic double reference, for larger sizes. */
void check_grad_analytic(sdpa_case *c, const char *what);

#endif /* ATTN_TEST_SDPA_CASE_H */
