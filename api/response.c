/*
 * Writing the parts of an answer: tensors through the codec (straight from
 * float32 to text), and the small objects (stats, meta) composed on the
 * stack and appended once, since a tree of JSON nodes (an allocation per
 * key and value, then a dump to size the text and one to write it) would
 * cost more than all the rest of a small request. The text: keys in a
 * fixed order, compact, integers in decimal and reals as put_real() below.
 *
 * The put_* helpers write at p and return the end; given NULL (an earlier
 * step failed) they return NULL, so that a sequence of them needs one check.
 */
#include "request.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static char *put_text(char *p, const char *s)
{
    if (!p)
        return NULL;
    size_t n = strlen(s);
    memcpy(p, s, n);
    return p + n;
}

/* `"name":`, with a leading comma unless first. */
static char *put_key(char *p, const char *name, bool first)
{
    if (!p)
        return NULL;
    if (!first)
        *p++ = ',';
    *p++ = '"';
    p = put_text(p, name);
    *p++ = '"';
    *p++ = ':';
    return p;
}

/* An integer in decimal, without printf (at most 20 bytes). */
static char *put_int(char *p, int64_t x)
{
    if (!p)
        return NULL;
    char digits[20], *d = digits + sizeof digits;
    uint64_t u = x < 0 ? 0 - (uint64_t)x : (uint64_t)x;
    do {
        *--d = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (x < 0)
        *p++ = '-';
    size_t n = (size_t)(digits + sizeof digits - d);
    memcpy(p, d, n);
    return p + n;
}

/* The longest text put_real() writes: "-1.2345678901234567e-308" is 24. */
#define REAL_TEXT_MAX 32

/*
 * The text of a real with `precision` (<= 17) significant digits: printf's
 * %.*g, then ".0" when there is neither '.' nor 'e' (so that it reads back
 * as a real), and the exponent without '+' or leading zeros. NULL for a
 * non-finite value, which has no JSON text (callers check finiteness first:
 * the statistics are a 422 numerical_overflow before anything is written).
 */
static char *put_real(char *p, double x, int precision)
{
    char text[REAL_TEXT_MAX + 8];
    int n = p && isfinite(x) ? snprintf(text, sizeof text, "%.*g", precision, x) : -1;
    if (n < 0 || n > REAL_TEXT_MAX - 2)
        return NULL;
    char *e = strchr(text, 'e');
    if (e) {
        char *to = e + 1, *from = e + 2; /* past the sign */
        if (*to == '-')
            to++;
        while (*from == '0')
            from++;
        memmove(to, from, strlen(from) + 1);
    } else if (!strchr(text, '.')) {
        memcpy(text + n, ".0", 3);
    }
    return put_text(p, text);
}

/* Powers of ten 1e-4 .. 1e9: P10(e) is 10^e. */
static const double POW10[] = {1e-4, 1e-3, 1e-2, 1e-1, 1e0, 1e1, 1e2,
                               1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9};
#define P10(e) POW10[(e) + 4]

/*
 * put_real(p, x, 6) without printf, for the four timings of every answer,
 * when %.6g writes x without an exponent (1e-4 <= x < 1e6). The six digits
 * are x * 10^(5 - exponent) rounded; that product is within a rounding
 * error of the exact one, so its rounding is printf's (exact decimal) one
 * except near a tie, which printf is left to decide.
 */
static char *put_real6(char *p, double x)
{
    if (!p || !(x >= 1e-4 && x < 1e6))
        return put_real(p, x, 6);
    int e = -4; /* 10^e <= x < 10^(e+1) */
    while (e < 5 && x >= P10(e + 1))
        e++;
    double y = x * P10(5 - e); /* in [1e5, 1e6), within 1e-10 of exact */
    if (fabs(y - floor(y) - 0.5) < 1e-7) /* nearly a tie: let printf decide */
        return put_real(p, x, 6);
    int64_t m = (int64_t)(y + 0.5);
    if (m >= 1000000) { /* rounded up to the next power of ten */
        m /= 10;
        e++;
    }
    if (e >= 6)
        return put_real(p, x, 6);
    char digits[6];
    for (int i = 5; i >= 0; i--, m /= 10)
        digits[i] = (char)('0' + m % 10);
    int last = 5; /* the last digit kept: trailing zeros go */
    while (last > 0 && digits[last] == '0')
        last--;
    if (e >= 0) { /* "123.45", "100000.0" */
        memcpy(p, digits, (size_t)e + 1);
        p += e + 1;
        *p++ = '.';
        if (last <= e) {
            *p++ = '0';
        } else {
            memcpy(p, digits + e + 1, (size_t)(last - e));
            p += last - e;
        }
    } else { /* "0.0012345" */
        *p++ = '0';
        *p++ = '.';
        for (int i = -1; i > e; i--)
            *p++ = '0';
        memcpy(p, digits, (size_t)last + 1);
        p += last + 1;
    }
    return p;
}

/* Appends text[0..end), or marks b failed when a step gave NULL. */
static void append_composed(codec_buf *b, const char *text, const char *end)
{
    if (end)
        codec_buf_append(b, text, (size_t)(end - text));
    else
        b->failed = true;
}

/* A statistic as a real of 17 significant digits (which read back as the
 * same double), or null when it was taken over no entries. */
static char *put_stat(char *p, const char *name, double value, int64_t count,
                      bool first)
{
    p = put_key(p, name, first);
    return count > 0 ? put_real(p, value, 17) : put_text(p, "null");
}

void api_write_stats(codec_buf *b, const attn_stats *s)
{
    int64_t ns = s->scores_count, nr = s->rows_count;
    char text[512], *p = text; /* 7 numbers, under 150 bytes of keys */
    p = put_text(p, ",\"stats\":{\"scores\":{");
    p = put_stat(p, "mean", s->scores_mean, ns, true);
    p = put_stat(p, "var", s->scores_var, ns, false);
    p = put_text(p, "},\"scaled_scores\":{");
    p = put_stat(p, "mean", s->scaled_mean, ns, true);
    p = put_stat(p, "var", s->scaled_var, ns, false);
    p = put_text(p, "},\"entropy\":{");
    p = put_stat(p, "mean", s->entropy_mean, nr, true);
    p = put_stat(p, "min", s->entropy_min, nr, false);
    p = put_stat(p, "max", s->entropy_max, nr, false);
    p = put_text(p, "},\"max_weight\":{");
    p = put_stat(p, "mean", s->max_weight_mean, nr, true);
    p = put_text(p, "}}");
    append_composed(b, text, p);
}

/* The most dimensions api_write_meta takes, and their longest name: each
 * takes at most META_NAME_MAX + 4 + 20 bytes. */
#define META_DIMS_MAX 16
#define META_NAME_MAX 16

void api_write_meta(codec_buf *b, const api_dim *shape, size_t n_dims,
                    const api_cost *cost, api_timing *t)
{
    api_lap(t, &t->encode_ms);
    double total = api_total_ms(t);
    /* the dimensions, then under 300 bytes of keys and six numbers */
    char text[META_DIMS_MAX * (META_NAME_MAX + 24) + 480], *p = text;
    if (n_dims > META_DIMS_MAX)
        p = NULL;
    p = put_text(p, ",\"meta\":{\"shape\":{");
    for (size_t i = 0; p && i < n_dims; i++) {
        if (strlen(shape[i].name) > META_NAME_MAX)
            p = NULL;
        p = put_key(p, shape[i].name, i == 0);
        p = put_int(p, shape[i].value);
    }
    /* FLOPs are a whole number (exact as an integer below 2^53), and so is
     * the work, rounded up; timings need microseconds, not 17 digits. */
    double flops = cost->flops, work = ceil(cost->work);
    p = put_text(p, "},\"flops\":");
    p = flops < 9e15 ? put_int(p, (int64_t)flops) : put_real(p, flops, 17);
    p = put_text(p, ",\"work\":");
    p = work < 9e15 ? put_int(p, (int64_t)work) : put_real(p, work, 17);
    p = put_text(p, ",\"algorithm\":\"tiled\",\"timing_ms\":{\"decode\":");
    p = put_real6(p, t->decode_ms);
    p = put_text(p, ",\"compute\":");
    p = put_real6(p, t->compute_ms);
    p = put_text(p, ",\"encode\":");
    p = put_real6(p, t->encode_ms);
    p = put_text(p, ",\"total\":");
    p = put_real6(p, total);
    p = put_text(p, "}}");
    append_composed(b, text, p);
}
