/*
 * Writing the parts of an answer: tensors through the codec (straight from
 * float32 to text), and the small objects (stats, meta) with jansson.
 */
#include "request.h"

#include <stdlib.h>
#include <string.h>

void api_write_tensor(api_buf *b, const api_out_tensor *t, api_encoding enc,
                      bool first)
{
    api_buf_printf(b, "%s\"%s\":", first ? "" : ",", t->name);
    api_tensor_encode(b, t->data, t->rank, t->shape, enc);
}

/* Appends jansson's compact text of j and releases j. json_dumpb into a
 * block sized first, not json_dumps: jansson's growing dump buffer ignores a
 * failed append of an object key, so under memory pressure json_dumps can
 * return text with a key missing. */
static void append_json(api_buf *b, json_t *j, size_t flags)
{
    flags |= JSON_COMPACT;
    char small[1024];
    size_t need = j ? json_dumpb(j, NULL, 0, flags) : 0;
    char *text = need <= sizeof small ? small : malloc(need);
    if (need && text && json_dumpb(j, text, need, flags) == need)
        api_buf_append(b, text, need);
    else
        b->failed = true;
    if (text != small)
        free(text);
    json_decref(j);
}

/* A statistic, or null when it was taken over no entries. */
static json_t *stat(double value, int64_t count)
{
    return count > 0 ? json_real(value) : json_null();
}

void api_write_stats(api_buf *b, const attn_stats *s)
{
    int64_t ns = s->scores_count, nr = s->rows_count;
    json_t *j = json_pack(
        "{s:{s:o,s:o},s:{s:o,s:o},s:{s:o,s:o,s:o},s:{s:o}}",
        "scores", "mean", stat(s->scores_mean, ns), "var", stat(s->scores_var, ns),
        "scaled_scores", "mean", stat(s->scaled_mean, ns), "var", stat(s->scaled_var, ns),
        "entropy", "mean", stat(s->entropy_mean, nr), "min", stat(s->entropy_min, nr),
        "max", stat(s->entropy_max, nr),
        "max_weight", "mean", stat(s->max_weight_mean, nr));
    api_buf_puts(b, ",\"stats\":");
    append_json(b, j, 0);
}

void api_write_meta(api_buf *b, json_t *shape, double flops, api_timing *t)
{
    api_lap(t, &t->encode_ms);
    double total = t->decode_ms + t->compute_ms + t->encode_ms;
    /* FLOPs are a whole number (exact as an integer below 2^53); timings
     * need microseconds, not 17 digits. */
    json_t *fl = flops < 9e15 ? json_integer((json_int_t)flops) : json_real(flops);
    json_t *j = json_pack("{s:o,s:o,s:s,s:{s:f,s:f,s:f,s:f}}",
                          "shape", shape ? shape : json_object(),
                          "flops", fl, "algorithm", "tiled",
                          "timing_ms", "decode", t->decode_ms,
                          "compute", t->compute_ms, "encode", t->encode_ms,
                          "total", total);
    api_buf_puts(b, ",\"meta\":");
    append_json(b, j, JSON_REAL_PRECISION(6));
}
