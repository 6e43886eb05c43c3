/* Shared plumbing of libattn's own files; not part of the public API. */
#ifndef ATTN_INTERNAL_H
#define ATTN_INTERNAL_H

#include "attn.h"

/* Whether the caller asked the call to stop (attn.h, "Cancellation"): read
 * before every unit of work starts (attn_parallel_for_until, and the units
 * that walk many key tiles before each tile), and relaxed, since the flag only
 * ever goes from 0 to non-zero and a unit more or less does not matter. */
static inline bool attn_cancelled(const atomic_int *cancel)
{
    return cancel != NULL && atomic_load_explicit(cancel, memory_order_relaxed) != 0;
}

/* Calls fn(ctx, i, worker) for every i in [0, count) on up to `threads`
 * threads: the calling thread, always worker 0, and helper threads kept
 * between calls (lib/parallel.c); worker is in [0, threads). Runs inline
 * when threads <= 1 or count <= 1, and when called from inside fn; when no
 * helper can be had, the calling thread does the work alone. Every i has
 * run when it returns. */
void attn_parallel_for(int threads, int64_t count,
                       void (*fn)(void *ctx, int64_t i, int worker), void *ctx);

/* attn_parallel_for that starts no unit once *cancel (a call's cancellation
 * flag, attn.h; NULL: none) is non-zero: every worker reads it before it
 * takes its next unit, so a cancelled call ends when the units running
 * then end. The caller then finds attn_cancelled(cancel) true and must not
 * read what the skipped units would have written. */
void attn_parallel_for_until(int threads, int64_t count,
                             void (*fn)(void *ctx, int64_t i, int worker), void *ctx,
                             const atomic_int *cancel);

/* Keeps OpenBLAS single-threaded (once per process); every public entry
 * point calls it before its first BLAS call. */
void attn_blas_init(void);

/* Fills err (when not NULL) and returns `status`. */
attn_status attn_fail(attn_error *err, attn_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* ATTN_INTERNAL_H */
