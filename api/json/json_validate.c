/*
 * Strict JSON text (RFC 8259): the validator every body goes through once.
 *
 * The validator is a loop over an explicit stack, not a recursive descent:
 * nesting is bounded by CODEC_MAX_DEPTH, and a body of 100000 '[' is refused
 * at depth 65 without touching the C stack. The container kinds of the open
 * levels fit in one 64-bit word (bit d set: level d is an object).
 *
 * Bodies are not NUL-terminated: every read is guarded by `end`.
 */
#include "codec_internal.h"

#include <stdio.h>
#include <string.h>

_Static_assert(CODEC_MAX_DEPTH <= 64, "the open containers must fit in a uint64_t");

static inline bool is_digit(char c)
{
    return (unsigned char)(c - '0') < 10;
}

/* The walk over the text: where it is, the open containers, and what went
 * wrong where when it fails. */
typedef struct {
    cursor p, end;
    uint64_t is_object; /* bit d: the container at depth d+1 is an object */
    int depth;
    const char *what; /* the failure, for the message */
    cursor at;
    codec_doc *doc;   /* where to note members and rows, when asked for */
} walk;

/* The states between values: each step function returns the next one. */
typedef enum { VALUE, AFTER_VALUE, KEY, DONE, FAILED } state;

static state fail_at(walk *w, const char *what, cursor at)
{
    w->what = what;
    w->at = at;
    return FAILED;
}

static inline bool in_object(const walk *w)
{
    return w->depth > 0 && (w->is_object >> (w->depth - 1) & 1);
}

/* ------------------------------------------------------------- strings */

/* Bytes that end a run of plain string characters: '"', '\\', control
 * characters and the start of a multi-byte UTF-8 sequence. */
static const bool string_special[256] = {
    [0x00 ... 0x1f] = true, ['"'] = true, ['\\'] = true, [0x80 ... 0xff] = true,
};

/* Could one of these 8 bytes be special in a string? Exact when the answer
 * is no: a control character (< 0x20), '"', '\\' or a byte >= 0x80. */
static inline bool string_special8(uint64_t x)
{
    const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
    uint64_t quote = x ^ 0x2222222222222222u, slash = x ^ 0x5c5c5c5c5c5c5c5cu;
    /* per byte: b - 0x20, quote - 1 and slash - 1 set the high bit for a
     * control character, '"' and '\\' (and only for bytes >= 0x80
     * besides, which x flags anyway); a borrow only starts at such a byte,
     * so the lowest special byte is always seen */
    return ((x - 0x2020202020202020u) | (quote - ones) | (slash - ones) | x) & highs;
}

/* Checks the escape at p (at '\\'); returns the byte after it, or NULL with
 * the failure in w. */
static cursor check_escape(walk *w, cursor p, cursor end)
{
    if (end - p < 2)
        return fail_at(w, "unterminated string", end), NULL;
    switch (p[1]) {
    case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
        return p + 2;
    case 'u':
        break;
    default:
        return fail_at(w, "invalid escape", p), NULL;
    }
    long u = codec_hex4(p + 2, end);
    if (u < 0)
        return fail_at(w, "\\u needs 4 hex digits", p), NULL;
    if (u >= 0xdc00 && u <= 0xdfff)
        return fail_at(w, "lone low surrogate escape", p), NULL;
    if (u < 0xd800 || u > 0xdbff)
        return p + 6;
    long lo = -1;
    if (end - p >= 12 && p[6] == '\\' && p[7] == 'u')
        lo = codec_hex4(p + 8, end);
    if (lo < 0xdc00 || lo > 0xdfff)
        return fail_at(w, "high surrogate escape without a low one", p), NULL;
    return p + 12;
}

/* Checks the string whose opening quote is at p; returns the byte after the
 * closing quote, or NULL with the failure in w. */
static cursor check_string(walk *w, cursor p, cursor end)
{
    p++;
    for (;;) {
        /* long strings (base64 tensors) go 8 bytes at a time */
        while (end - p >= 8 && !string_special8(codec_load8(p)))
            p += 8;
        while (p < end && !string_special[(unsigned char)*p])
            p++;
        if (p == end)
            return fail_at(w, "unterminated string", p), NULL;
        unsigned char c = (unsigned char)*p;
        if (c == '"')
            return p + 1;
        if (c < 0x20)
            return fail_at(w, "control character in a string (escape it)", p), NULL;
        if (c >= 0x80) {
            size_t n = codec_utf8_sequence((const unsigned char *)p, (size_t)(end - p));
            if (!n)
                return fail_at(w, "invalid UTF-8", p), NULL;
            p += n;
            continue;
        }
        p = check_escape(w, p, end);
        if (!p)
            return NULL;
    }
}

/* ------------------------------------------------------- numbers, literals */

/* The byte after the run of digits at p: 16 at a time (a tensor's
 * numbers carry 8 to 17), so that the end of the run costs no mispredicted
 * loop exit. */
static inline cursor skip_digits(cursor p, cursor end)
{
    while (end - p >= 16) {
        int run = codec_digit_run16(p);
        p += run;
        if (run < 16)
            return p;
    }
    while (p < end && is_digit(*p))
        p++;
    return p;
}

/* Checks the number at p (at '-' or a digit); NULL with the failure in w. */
__attribute__((always_inline)) static inline cursor check_number(walk *w, cursor p, cursor end)
{
    cursor start = p;
    if (*p == '-')
        p++;
    if (p == end || !is_digit(*p))
        return fail_at(w, "invalid number", start), NULL;
    if (*p == '0') {
        p++;
        /* a leading zero is followed by no digit: the caller then sees the
         * digit where a ',' or the end belongs */
    } else
        p = skip_digits(p, end);
    if (p < end && *p == '.') {
        p++;
        if (p == end || !is_digit(*p))
            return fail_at(w, "invalid number (digits must follow '.')", start), NULL;
        p = skip_digits(p, end);
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p == end || !is_digit(*p))
            return fail_at(w, "invalid number (digits must follow the exponent)", start), NULL;
        while (p < end && is_digit(*p))
            p++;
    }
    return p;
}

/* The usual number of a tensor row, where 64 bytes can be read:
 * -?D+(.D+)? with no leading zero, up to 15 digits before the point and
 * 32 after it, and no exponent part. Returns the byte after it, or NULL
 * for anything else (check_number then decides). */
static inline cursor check_usual_number(cursor p)
{
    cursor s = p + (*p == '-');
    int n = codec_digit_run16(s);
    if (n == 0 || n == 16 || (n > 1 && *s == '0'))
        return NULL;
    s += n;
    if (*s == '.') {
        int f = codec_digit_run16(s + 1);
        if (f == 16) /* a float32 written as a double: 17 digits */
            f += codec_digit_run16(s + 17);
        if (f == 0 || f == 32)
            return NULL;
        s += 1 + f;
    }
    return (*s | 0x20) == 'e' ? NULL : s;
}

/* Inside an array, numbers tend to follow numbers (a tensor row): checks
 * ", <number>" in a tight loop after the number at w->p, before the general
 * path takes over at whatever else comes. */
static state check_number_row(walk *w)
{
    cursor p = w->p, end = w->end;
    /* where a block (row_scan.c) did not apply, the one-number code goes
     * past it before the next block is tried */
    cursor blocks_from = p;
    bool first_block = true;
    for (;;) {
        if (p >= blocks_from && end - p >= 64) {
            codec_row_block b;
            codec_row_scan(p, &b);
            if (b.len && codec_row_grammar(&b)) {
                if (w->doc && b.len >= CODEC_NOTE_MIN_LEN)
                    codec_doc_note(w->doc, p, codec_row_numbers(&b));
                /* From the last comma to the byte that ended the block
                 * (the row's ']', an exponent) there is no comma: a block
                 * tried there would be empty (the last number of every
                 * row), so the one-number code goes past that byte first. */
                if (b.stop < 64)
                    blocks_from = p + b.stop;
                /* whole numbers and their commas: what follows the last
                 * comma is the next element */
                p = codec_skip_ws(p + b.len, end);
                if (p < end && codec_starts_number(*p)) {
                    /* After the first block of a row, the next number is
                     * often the row's last (a row of a few long numbers,
                     * longer than a block): when no comma follows it, it
                     * is checked alone rather than classified (once a
                     * row, so a long one pays nothing to speak of). */
                    if (first_block && end - p >= 64) {
                        cursor after = check_usual_number(p);
                        cursor next = after ? codec_skip_ws(after, end) : NULL;
                        if (next && (next == end || *next != ','))
                            blocks_from = next;
                    }
                    first_block = false;
                    continue;
                }
                w->p = p;
                return VALUE;
            }
            blocks_from = p + 64;
        }
        cursor usual = end - p >= 64 ? check_usual_number(p) : NULL;
        p = usual ? usual : check_number(w, p, end);
        if (!p)
            return FAILED;
        /* Python's separator ", " (or a bare ','), then a number: the usual */
        if (end - p >= 3 && p[0] == ',') {
            cursor next = p + 1 + (p[1] == ' ');
            if (codec_starts_number(*next)) {
                p = next;
                continue;
            }
        }
        p = codec_skip_ws(p, end);
        if (p == end || *p != ',')
            break;
        cursor next = codec_skip_ws(p + 1, end);
        if (next == end || !codec_starts_number(*next)) {
            w->p = next;
            return VALUE;
        }
        p = next;
    }
    w->p = p;
    return AFTER_VALUE;
}

static cursor check_literal(walk *w, cursor p, cursor end, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(end - p) < n || memcmp(p, word, n) != 0)
        return fail_at(w, "invalid literal (expected a value)", p), NULL;
    return p + n;
}

/* ------------------------------------------------------------ the states */

/* At '{' or '[': opens a level (or closes it at once when empty). */
static state open_container(walk *w)
{
    if (w->depth == CODEC_MAX_DEPTH)
        return fail_at(w, "nesting deeper than 64 levels", w->p);
    bool object = *w->p == '{';
    if (object)
        w->is_object |= UINT64_C(1) << w->depth;
    else
        w->is_object &= ~(UINT64_C(1) << w->depth);
    w->depth++;
    w->p = codec_skip_ws(w->p + 1, w->end);
    if (w->p < w->end && *w->p == (object ? '}' : ']')) {
        w->p++;
        w->depth--;
        return AFTER_VALUE;
    }
    return object ? KEY : VALUE;
}

/* At the first byte of a value. */
static state check_value(walk *w)
{
    cursor p = w->p, end = w->end;
    if (p == end)
        return fail_at(w, "unexpected end (expected a value)", p);
    switch (*p) {
    case '{':
    case '[':
        return open_container(w);
    case '"':
        p = check_string(w, p, end);
        break;
    case '-': case '0': case '1': case '2': case '3': case '4':
    case '5': case '6': case '7': case '8': case '9':
        if (w->depth > 0 && !in_object(w))
            return check_number_row(w);
        p = check_number(w, p, end);
        break;
    case 't':
        p = check_literal(w, p, end, "true");
        break;
    case 'f':
        p = check_literal(w, p, end, "false");
        break;
    case 'n':
        p = check_literal(w, p, end, "null");
        break;
    default:
        return fail_at(w, "unexpected character (expected a value)", p);
    }
    if (!p)
        return FAILED;
    w->p = p;
    return AFTER_VALUE;
}

/* After a value: a ',' and the next member or element, or the end of the
 * container (or of the text). */
static state after_value(walk *w)
{
    codec_doc *doc = w->doc;
    if (doc && w->depth == 1 && doc->members && doc->members <= doc->cap && in_object(w))
        doc->spans[doc->members - 1].value_end = w->p; /* a top-level member's value ends */
    cursor p = codec_skip_ws(w->p, w->end);
    if (w->depth == 0)
        return p == w->end ? DONE : fail_at(w, "unexpected data after the JSON value", p);
    if (p == w->end)
        return fail_at(w, "unexpected end (unclosed array or object)", p);
    bool object = in_object(w);
    if (*p == ',') {
        w->p = codec_skip_ws(p + 1, w->end);
        return object ? KEY : VALUE;
    }
    if (*p == (object ? '}' : ']')) {
        w->p = p + 1;
        w->depth--;
        return AFTER_VALUE;
    }
    return fail_at(w, object ? "expected ',' or '}'" : "expected ',' or ']'", p);
}

/* At a member's key: the key, the ':', then its value. */
static state check_key(walk *w)
{
    cursor p = w->p, end = w->end;
    if (p == end || *p != '"')
        return fail_at(w, "expected a string key", p);
    p = check_string(w, p, end);
    if (!p)
        return FAILED;
    p = codec_skip_ws(p, end);
    if (p == end || *p != ':')
        return fail_at(w, "expected ':' after the key", p);
    cursor key = w->p;
    w->p = codec_skip_ws(p + 1, end);
    codec_doc *doc = w->doc;
    if (w->depth == 1 && doc) {
        if (doc->members < doc->cap)
            doc->spans[doc->members] = (codec_span){.key_text = key, .value = w->p};
        doc->members++;
    }
    return VALUE;
}

static bool validate(const char *text, size_t len, codec_doc *doc, codec_error *err)
{
    walk w = {.p = codec_skip_ws(text, text + len), .end = text + len, .doc = doc};
    state s = VALUE;
    if (len == 0)
        s = fail_at(&w, "empty body (expected a JSON value)", text);
    while (s != DONE && s != FAILED) {
        switch (s) {
        case VALUE: s = check_value(&w); break;
        case AFTER_VALUE: s = after_value(&w); break;
        case KEY: s = check_key(&w); break;
        default: break;
        }
    }
    if (s == DONE)
        return true;
    codec_fail(err, CODEC_ERR_SYNTAX, "", text, w.at, "invalid JSON: %s", w.what);
    snprintf(err->message, sizeof err->message,
             "invalid JSON: %s at byte %zu (line %ld, column %ld)", w.what, err->offset,
             err->line, err->column);
    return false;
}

bool codec_validate(const char *text, size_t len, codec_error *err)
{
    return validate(text, len, NULL, err);
}

bool codec_doc_validate(codec_doc *doc, const char *text, size_t len, codec_span *spans,
                        size_t cap, codec_error *err)
{
    *doc = (codec_doc){.text = text, .end = text + len, .spans = spans, .cap = cap};
    if (validate(text, len, doc, err))
        return true;
    codec_doc_free(doc);
    return false;
}
