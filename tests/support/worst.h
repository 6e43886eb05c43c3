/*
 * One assertion per compared block, not one per element: a loop over the
 * elements notes each element's error with worst_note(), and the test then
 * asserts once that the worst error is within the tolerance, naming that
 * element and its two values. A failing element still fails the test (the
 * worst is at least as bad as any), and a passing block costs one check
 * instead of thousands (each libcheck assertion is a write to the runner).
 *
 * An error that is NaN (a NaN where a number was wanted, or infinities of
 * opposite signs) counts as infinite, so that it can never hide behind a
 * finite one.
 */
#ifndef ATTN_TEST_WORST_H
#define ATTN_TEST_WORST_H

#include <math.h>

/* Start each block with worst_elem w = {0}. */
typedef struct {
    double err;       /* the largest error noted, 0 before any */
    long long at;     /* the index of the element it came from */
    double got, want; /* that element's value and the one wanted */
} worst_elem;

static inline void worst_note(worst_elem *w, long long at, double got, double want, double err)
{
    if (isnan(err))
        err = INFINITY;
    if (err > w->err)
        *w = (worst_elem){.err = err, .at = at, .got = got, .want = want};
}

/* Exact comparison: 0 when got == want, otherwise |got - want| (infinite
 * when that is NaN or 0, as for a NaN against a NaN). */
static inline double exact_err(double got, double want)
{
    if (got == want)
        return 0.0;
    double d = fabs(got - want);
    return d > 0.0 ? d : INFINITY;
}

/* |got - want| / (1 + |want|): absolute near zero, relative for large
 * values. Equal infinities are no error. */
static inline double rel1_err(double got, double want)
{
    return got == want ? 0.0 : fabs(got - want) / (1.0 + fabs(want));
}

#endif /* ATTN_TEST_WORST_H */
