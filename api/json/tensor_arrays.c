/*
 * Nested JSON arrays into a tensor: [[1, 2], [3, 4]] (or the flat "data"
 * array of the object form), checked to be rectangular as they are read.
 *
 * One pass over the (validated) text, reading numbers straight into a
 * growing float32 buffer: no node per number, no recursion (the open
 * arrays are a small array of counters), and a tight loop for the innermost
 * rows, where nearly all of the bytes are. Every read is still bounded by
 * `end`, so text that did not pass the validator gives an error or a wrong
 * answer, never a crash.
 */
#include "codec_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ names */

const char *codec_kind_name(char c)
{
    switch (c) {
    case '"': return "a string";
    case 'n': return "null";
    case 't': case 'f': return "a boolean";
    case '{': return "an object";
    case '[': return "an array";
    default: return codec_starts_number(c) ? "a number" : "something that is not JSON";
    }
}

void codec_element_name(char *dst, size_t cap, const char *field, const int64_t *idx, int n)
{
    int w = snprintf(dst, cap, "%s", field);
    for (int i = 0; i < n && w >= 0 && (size_t)w < cap; i++)
        w += snprintf(dst + w, cap - (size_t)w, "[%lld]", (long long)idx[i]);
}

/* ------------------------------------------------------ the element store */

static bool store_grow(codec_store *s, codec_error *err, const char *field)
{
    /* The first block is the hint: a small tensor's stays within malloc's
     * per-thread cache (a fixed 4 KB first block did not, and cost more to
     * allocate than a 4x4 tensor takes to read). */
    size_t cap = s->cap ? s->cap * 2 : s->hint > 16 ? s->hint : 16;
    size_t size = s->dtype == CODEC_F32 ? sizeof(float) : 1;
    if (cap > SIZE_MAX / size / 2)
        return codec_fail(err, CODEC_ERR_NO_MEMORY, field, NULL, NULL, "%s is too large to hold",
                          field);
    void *p = codec_tensor_realloc(s->dtype == CODEC_F32 ? (void *)s->f32 : (void *)s->b8, cap * size);
    if (!p)
        return codec_fail(err, CODEC_ERR_NO_MEMORY, field, NULL, NULL,
                          "out of memory while reading %s", field);
    if (s->dtype == CODEC_F32)
        s->f32 = p;
    else
        s->b8 = p;
    s->cap = cap;
    codec_advise_huge(p, cap * size);
    return true;
}

void codec_store_free(codec_store *s)
{
    codec_tensor_release(s->f32);
    codec_tensor_release(s->b8);
    s->f32 = NULL;
    s->b8 = NULL;
}

void codec_store_to_tensor(codec_store *s, int rank, const int64_t *shape, codec_tensor *t)
{
    t->dtype = s->dtype;
    t->rank = rank;
    for (int i = 0; i < rank; i++)
        t->shape[i] = shape[i];
    t->count = (int64_t)s->n;
    if (s->n == 0) {
        codec_store_free(s);
        return;
    }
    size_t size = s->dtype == CODEC_F32 ? sizeof(float) : 1;
    if (s->cap - s->n > 4096) { /* give an oversized guess back */
        void *p = codec_tensor_realloc(s->dtype == CODEC_F32 ? (void *)s->f32 : (void *)s->b8, s->n * size);
        if (p) {
            if (s->dtype == CODEC_F32)
                s->f32 = p;
            else
                s->b8 = p;
        }
    }
    t->f32 = s->f32;
    t->b8 = s->b8;
    s->f32 = NULL;
    s->b8 = NULL;
}

/* ------------------------------------------------------- the array walk */

typedef struct {
    cursor p, end;
    cursor text;         /* where error offsets count from */
    const char *field;
    bool accept_bool;
    int max_depth;       /* CODEC_MAX_RANK for a tensor, 1 for "data" */
    bool types_only;     /* the second walk after a shape error, see below */
    codec_notes *notes;  /* the validator's notes on the rows, or NULL */
    codec_store *s;
    int64_t idx[CODEC_MAX_DEPTH + 1]; /* elements so far in each open array */
    int64_t *shape;      /* -1 until an array of that depth closes */
    int depth, rank;     /* rank: -1 until the first element or empty array */
    codec_error *err;
    char where[96];      /* "q[1][3]", for messages */
} array_walk;

typedef enum { OPEN, ELEMENT, AFTER_ELEMENT, CLOSE, DONE, FAILED } array_state;

static const char *here(array_walk *a, int depth)
{
    codec_element_name(a->where, sizeof a->where, a->field, a->idx, depth);
    return a->where;
}

static array_state not_json(array_walk *a)
{
    codec_fail(a->err, CODEC_ERR_SYNTAX, a->field, a->text, a->p, "%s is not valid JSON", a->field);
    return FAILED;
}

/* At '[': one level deeper, unless that is too deep or ragged. */
static array_state open_array(array_walk *a)
{
    if (a->types_only) {
        if (a->depth == CODEC_MAX_DEPTH) /* only in text the validator refused */
            return DONE;
        a->idx[a->depth++] = 0;
        a->p = codec_skip_ws(a->p + 1, a->end);
        return a->p < a->end && *a->p == ']' ? CLOSE : ELEMENT;
    }
    if (a->depth == a->max_depth) {
        if (a->max_depth == 1)
            codec_fail(a->err, CODEC_ERR_WRONG_TYPE, a->field, a->text, a->p,
                       "%s must be a flat array of numbers; %s is an array", a->field,
                       here(a, a->depth));
        else
            codec_fail(a->err, CODEC_ERR_SHAPE, a->field, a->text, a->p,
                       "%s has more than %d dimensions", a->field, CODEC_MAX_RANK);
        return FAILED;
    }
    if (a->rank >= 0 && a->depth >= a->rank) {
        codec_fail(a->err, CODEC_ERR_RAGGED, a->field, a->text, a->p,
                   "%s is ragged: %s is an array where a number belongs", a->field,
                   here(a, a->depth));
        return FAILED;
    }
    a->idx[a->depth++] = 0;
    a->p = codec_skip_ws(a->p + 1, a->end);
    return a->p < a->end && *a->p == ']' ? CLOSE : ELEMENT;
}

/* The element's type fixes the tensor's dtype, or must match it. */
static bool settle_dtype(array_walk *a, codec_dtype dtype)
{
    codec_store *s = a->s;
    if (!s->typed) {
        s->dtype = dtype;
        s->typed = true;
        return true;
    }
    if (s->dtype == dtype)
        return true;
    if (s->declared)
        return codec_fail(a->err, CODEC_ERR_WRONG_TYPE, a->field, a->text, a->p,
                          "%s is %s but dtype is \"%s\"", here(a, a->depth),
                          s->dtype == CODEC_BOOL ? "a number" : "a boolean",
                          s->dtype == CODEC_BOOL ? "bool" : "float32");
    return codec_fail(a->err, CODEC_ERR_WRONG_TYPE, a->field, a->text, a->p,
                      "%s mixes numbers and booleans (at %s)", a->field, here(a, a->depth));
}

/* At a number: the innermost row, numbers separated by commas and nearly
 * all of the text, read in one call while the buffer has room. */
static array_state read_numbers(array_walk *a)
{
    codec_store *s = a->s;
    if (!settle_dtype(a, CODEC_F32))
        return FAILED;
    cursor stop, bad;
    size_t got;
    if (a->types_only) { /* read for their finiteness only */
        float scratch[64];
        got = codec_parse_float_row(a->p, a->end, scratch, 64, &stop, &bad, NULL);
    } else {
        if (s->n == s->cap && !store_grow(s, a->err, a->field))
            return FAILED;
        got = codec_parse_float_row(a->p, a->end, s->f32 + s->n, s->cap - s->n, &stop, &bad,
                                    a->notes);
        s->n += got;
    }
    a->idx[a->depth - 1] += (int64_t)got;
    if (bad) {
        int len = (int)(stop - bad) > 40 ? 40 : (int)(stop - bad);
        codec_fail(a->err, CODEC_ERR_NOT_FINITE, a->field, a->text, bad,
                   "%s is %.*s, which is not finite as a float32 (|x| < 3.4e38)",
                   here(a, a->depth), len, bad);
        return FAILED;
    }
    a->p = stop;
    return AFTER_ELEMENT;
}

/* At 't' or 'f'. */
static array_state read_boolean(array_walk *a)
{
    if (!a->accept_bool) {
        codec_fail(a->err, CODEC_ERR_WRONG_TYPE, a->field, a->text, a->p,
                   "%s must hold numbers; %s is a boolean", a->field, here(a, a->depth));
        return FAILED;
    }
    if (!settle_dtype(a, CODEC_BOOL))
        return FAILED;
    bool v = *a->p == 't';
    size_t n = v ? 4 : 5;
    if ((size_t)(a->end - a->p) < n || memcmp(a->p, v ? "true" : "false", n) != 0)
        return not_json(a);
    if (!a->types_only) {
        if (a->s->n == a->s->cap && !store_grow(a->s, a->err, a->field))
            return FAILED;
        a->s->b8[a->s->n++] = v;
    }
    a->idx[a->depth - 1]++;
    a->p += n;
    return AFTER_ELEMENT;
}

/* At the first byte of an element. */
static array_state read_element(array_walk *a)
{
    if (a->p == a->end)
        return not_json(a);
    char c = *a->p;
    if (c == '[')
        return OPEN;
    if (a->types_only)
        ; /* shapes were judged in the first walk */
    else if (a->rank < 0)
        a->rank = a->depth;
    else if (a->depth != a->rank) {
        codec_fail(a->err, CODEC_ERR_RAGGED, a->field, a->text, a->p,
                   "%s is ragged: %s is %s where an array belongs", a->field, here(a, a->depth),
                   codec_kind_name(c));
        return FAILED;
    }
    if (codec_starts_number(c))
        return read_numbers(a);
    if (c == 't' || c == 'f')
        return read_boolean(a);
    codec_fail(a->err, CODEC_ERR_WRONG_TYPE, a->field, a->text, a->p,
               "%s must hold %s; %s is %s", a->field,
               a->accept_bool ? "numbers or booleans" : "numbers", here(a, a->depth),
               codec_kind_name(c));
    return FAILED;
}

static array_state after_element(array_walk *a)
{
    a->p = codec_skip_ws(a->p, a->end);
    if (a->p == a->end)
        return not_json(a);
    if (*a->p == ',') {
        a->p = codec_skip_ws(a->p + 1, a->end);
        return ELEMENT;
    }
    return *a->p == ']' ? CLOSE : not_json(a);
}

/* One level up: the array just closed was an element of the one around. */
static array_state close_level(array_walk *a)
{
    if (--a->depth == 0)
        return DONE;
    a->idx[a->depth - 1]++;
    return AFTER_ELEMENT;
}

/* At ']': the array's length must be the one its siblings had. */
static array_state close_array(array_walk *a)
{
    a->p++;
    int d = a->depth - 1;
    if (a->types_only)
        return close_level(a);
    if (a->rank < 0) /* an empty innermost array decides the rank */
        a->rank = a->depth;
    if (a->shape[d] < 0)
        a->shape[d] = a->idx[d];
    else if (a->shape[d] != a->idx[d]) {
        /* at the ']' of the array of the wrong length */
        if (d == 1)
            codec_fail(a->err, CODEC_ERR_RAGGED, a->field, a->text, a->p - 1,
                       "%s is ragged: row %lld has %lld elements, expected %lld", a->field,
                       (long long)a->idx[0], (long long)a->idx[d], (long long)a->shape[d]);
        else
            codec_fail(a->err, CODEC_ERR_RAGGED, a->field, a->text, a->p - 1,
                       "%s is ragged: %s has %lld elements, expected %lld", a->field,
                       here(a, d), (long long)a->idx[d], (long long)a->shape[d]);
        return FAILED;
    }
    return close_level(a);
}

/* Everything but idx and where, which are written before they are read:
 * zeroing their 600 bytes took longer than walking a small tensor. */
static void walk_start(array_walk *a, codec_reading *r, const char *field, cursor p,
                       cursor end, int max_depth, bool types_only, codec_store *s,
                       int64_t *shape, codec_error *err)
{
    a->p = p;
    a->end = end;
    a->text = r->text;
    a->field = field;
    a->accept_bool = r->accept_bool;
    a->max_depth = max_depth;
    a->types_only = types_only;
    a->notes = types_only || !r->notes.text ? NULL : &r->notes;
    a->s = s;
    a->shape = shape;
    a->depth = 0;
    a->rank = -1;
    a->err = err;
}

static array_state walk(array_walk *a)
{
    array_state st = OPEN;
    while (st != DONE && st != FAILED) {
        switch (st) {
        case OPEN: st = open_array(a); break;
        case ELEMENT: st = read_element(a); break;
        case AFTER_ELEMENT: st = after_element(a); break;
        case CLOSE: st = close_array(a); break;
        default: break;
        }
    }
    return st;
}

bool codec_read_arrays(codec_reading *r, const char *field, cursor p, cursor end,
                       int max_depth, codec_store *s, int *rank, int64_t *shape,
                       cursor *after)
{
    array_walk a;
    walk_start(&a, r, field, p, end, max_depth, false, s, shape, r->err);
    for (int i = 0; i < CODEC_MAX_RANK; i++)
        shape[i] = -1;
    if (walk(&a) == DONE) {
        *rank = a.rank;
        *after = a.p;
        return true;
    }
    if (!codec_error_is_late(r->err))
        return false;
    /* A shape error stands only when no element has the wrong type: the
     * classes are checked in that order, as they are for every field, so
     * [[1], null] is a null where a number belongs, not a ragged array. The
     * text after the shape error is walked again for types. */
    codec_store types = {.dtype = s->declared ? s->dtype : CODEC_F32, .typed = s->declared,
                         .declared = s->declared};
    codec_error type_err;
    array_walk b;
    walk_start(&b, r, field, p, end, max_depth, true, &types, shape, &type_err);
    if (walk(&b) == FAILED)
        *r->err = type_err;
    return false;
}
