/*
 * Ragged batches, judged the same way on both compute routes: "seq_lens"
 * (and "seq_lens_k" on /v1/attention, "seq_lens_context" on /v1/multihead)
 * become libattn's attn_ragged offsets. The lengths' form (integers >= 0)
 * was checked when they were read (api_read_fields); what is judged here
 * needs the shapes: the lengths must add up to their axis, one key length
 * per query length, and the sequences are packed along that axis, so a
 * batch dimension cannot come with them.
 */
#include "request.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Offsets [count + 1] of the lengths; their sum in *total (in double: a
 * body may hold lengths whose sum passes int64, and then the offsets stop
 * at INT64_MAX, which no axis has). */
static int64_t *offsets(const api_value *lens, double *total)
{
    int64_t *cu = malloc((size_t)(lens->count + 1) * sizeof *cu);
    if (!cu)
        return NULL;
    cu[0] = 0;
    *total = 0;
    for (int64_t s = 0; s < lens->count; s++) {
        int64_t len = lens->lengths[s];
        cu[s + 1] = len > INT64_MAX - cu[s] ? INT64_MAX : cu[s] + len;
        *total += (double)len;
    }
    return cu;
}

bool api_ragged_setup(const api_value *lens_q, const api_value *lens_k, int64_t batch,
                      int64_t n_q, int64_t n_k, const api_ragged_names *nm, api_ragged *r,
                      api_error *err)
{
    *r = (api_ragged){0};
    const bool has_k = lens_k != NULL && lens_k->present;
    if (!lens_q->present) {
        if (has_k)
            return api_fail(err, 422, "invalid_value", nm->lens_k,
                            "%s needs %s: the keys' lengths go with the queries' lengths "
                            "(give both, or %s alone when they are the same)",
                            nm->lens_k, nm->lens_q, nm->lens_q);
        return true;
    }
    if (batch > 1)
        return api_fail(err, 422, "invalid_value", nm->lens_q,
                        "%s packs the sequences along the rows of %s, but %s has a batch "
                        "dimension of %lld: pack the sequences of every batch entry into "
                        "one set of rows (no batch dimension, or 1) with their lengths in "
                        "%s, or leave %s out",
                        nm->lens_q, nm->rows_q, nm->rows_q, (long long)batch, nm->lens_q,
                        nm->lens_q);
    if (has_k && lens_k->count != lens_q->count)
        return api_fail(err, 422, "shape_mismatch", nm->lens_k,
                        "%s has %lld lengths but %s has %lld: one key length per sequence",
                        nm->lens_k, (long long)lens_k->count, nm->lens_q,
                        (long long)lens_q->count);
    double sum_q, sum_k;
    r->cu_q = offsets(lens_q, &sum_q);
    r->cu_k = offsets(has_k ? lens_k : lens_q, &sum_k);
    r->seqs = lens_q->count;
    if (!r->cu_q || !r->cu_k) {
        api_ragged_free(r);
        return api_fail(err, 500, "out_of_memory", nm->lens_q,
                        "out of memory for %s", nm->lens_q);
    }
    bool ok = true;
    if (sum_q != (double)n_q)
        ok = api_fail(err, 422, "shape_mismatch", nm->lens_q,
                      "%s sums to %.0f but %s has %s = %lld rows: the %lld lengths must add "
                      "up to the rows the sequences are packed into",
                      nm->lens_q, sum_q, nm->rows_q, nm->axis_q, (long long)n_q,
                      (long long)lens_q->count);
    else if (has_k && sum_k != (double)n_k)
        ok = api_fail(err, 422, "shape_mismatch", nm->lens_k,
                      "%s sums to %.0f but %s has %s = %lld rows: the %lld lengths must add "
                      "up to the rows the keys are packed into",
                      nm->lens_k, sum_k, nm->rows_k, nm->axis_k, (long long)n_k,
                      (long long)lens_k->count);
    else if (!has_k && n_k != n_q)
        ok = api_fail(err, 422, "shape_mismatch", lens_k != NULL ? nm->lens_k : nm->lens_q,
                      "%s has %s = %lld rows but %s sums to %.0f: the keys are split by %s "
                      "unless %s gives their own lengths",
                      nm->rows_k, nm->axis_k, (long long)n_k, nm->lens_q, sum_q,
                      nm->lens_q, nm->lens_k);
    if (!ok) {
        api_ragged_free(r);
        return false;
    }
    for (int64_t s = 0; s < r->seqs; s++)
        r->pairs += (double)(r->cu_q[s + 1] - r->cu_q[s]) * (double)(r->cu_k[s + 1] - r->cu_k[s]);
    return true;
}

bool api_ragged_mask_hint(const api_ragged *r, api_error *err)
{
    if (r->seqs > 0) {
        size_t used = strlen(err->message);
        snprintf(err->message + used, sizeof err->message - used,
                 "; with %lld packed sequences the mask is over the packed rows and keys "
                 "(no padding to the longest)",
                 (long long)r->seqs);
    }
    return false;
}

attn_ragged api_ragged_lib(const api_ragged *r)
{
    return (attn_ragged){.seqs = r->seqs, .cu_seqlens_q = r->cu_q, .cu_seqlens_k = r->cu_k};
}

void api_ragged_free(api_ragged *r)
{
    free(r->cu_q);
    free(r->cu_k);
    *r = (api_ragged){0};
}
