/*
 * Reading JSON numbers: into float32 the way a Python client means it, and
 * as integers (exactly), both from one decomposition of the text into
 * digits and a power of ten (read_decimal).
 *
 * A float32 is read as Python reads it:
 * float(text) (correctly rounded to double), then converted to float32.
 * Rounding twice is not the same as rounding once to float32, so the double
 * step is kept on purpose: the result is exactly (float)strtod(text), which
 * is also what the writer (float_text.c) counts on.
 *
 * 1. The digits: up to 19 significant ones make an exact 64-bit integer w,
 *    read 8 at a time, and the number is w * 10^q.
 * 2. The float32: w * 10^q in double arithmetic, with an error bound; when
 *    both ends of the bound round (to double, then to float32) alike, that
 *    is the answer. Otherwise (within ~2^-49 of a float32 rounding
 *    boundary) the exact double, by Eisel and Lemire's method (D. Lemire,
 *    "Number Parsing at a Gigabyte per Second", 2021): w times a 128-bit
 *    truncation of 10^q from a table; the top 54 bits of the product and
 *    what lies below them decide the correctly rounded double, except when
 *    the truncation leaves that undecided, about once in 2^60 inputs.
 *    (float)double is then the second rounding.
 * 3. What the fast paths leave: more than 19 significant digits (the value
 *    lies between w * 10^q and (w + 1) * 10^q, and when both read as the
 *    same float32 so does it), and the undecided cases: strtod on a
 *    NUL-terminated copy. strtod follows LC_NUMERIC: a program that uses
 *    the codec must leave it at "C" (decimal point '.'); attnd never calls
 *    setlocale.
 *
 * An integer is w * 10^q with no fractional part: decided on the digits,
 * never on a rounded double.
 */
#include "codec_internal.h"

#include <stdlib.h>
#include <string.h>

#include "pow10_table.h"

__extension__ typedef unsigned __int128 u128;

/* Doubles at or above this round to infinity as float32: FLT_MAX plus half
 * its unit in the last place (the tie goes to the even neighbour, 2^128). */
#define F32_OVERFLOW 0x1.ffffffp127

/* Exponents beyond this are clamped while reading: they are far outside
 * float32 either way, and clamping keeps the arithmetic from overflowing. */
#define EXP_CLAMP 100000

static inline bool is_digit(char c)
{
    return (unsigned char)(c - '0') < 10;
}

/* Reads an optional exponent part ("e-7", "E+12") at *s and returns its
 * value, clamped so that a thousand-digit exponent cannot overflow. */
static inline long read_exponent(const char **s, const char *end)
{
    const char *p = *s;
    if (p >= end || (*p != 'e' && *p != 'E'))
        return 0;
    p++;
    bool neg = false;
    if (p < end && (*p == '+' || *p == '-'))
        neg = *p++ == '-';
    long e = 0;
    for (; p < end && is_digit(*p); p++)
        if (e < EXP_CLAMP)
            e = e * 10 + (*p - '0');
    *s = p;
    return neg ? -e : e;
}

/* ---------------------------------------------------------------- slow path */

/*
 * strtod on a canonical copy "DIGITSeEXP" of the number at p: the
 * significant digits without the point, the exponent adjusted. Correct
 * rounding to double needs at most ~770 significant digits (the longest
 * exact midpoint between doubles); beyond SLOW_DIGITS the rest only matters
 * as "something non-zero follows", which a trailing 1 says.
 */
#define SLOW_DIGITS 800
__attribute__((noinline, cold)) static double strtod_of(const char *p, const char *end)
{
    char buf[SLOW_DIGITS + 40];
    size_t n = 0;
    long exp10 = 0;
    bool sticky = false;
    const char *s = p;
    buf[n++] = '+';
    for (; s < end && is_digit(*s); s++) {
        if (n == 1 && *s == '0')
            continue; /* leading zero */
        if (n < SLOW_DIGITS)
            buf[n++] = *s;
        else {
            exp10++;
            sticky |= *s != '0';
        }
    }
    if (s < end && *s == '.') {
        for (s++; s < end && is_digit(*s); s++) {
            if (n == 1 && *s == '0') {
                exp10--;
                continue;
            }
            if (n < SLOW_DIGITS) {
                buf[n++] = *s;
                exp10--;
            } else
                sticky |= *s != '0';
        }
    }
    exp10 += read_exponent(&s, end);
    if (n == 1) /* all digits were zero */
        return 0.0;
    if (sticky)
        buf[n++] = '1', exp10--;
    buf[n++] = 'e';
    char tmp[24];
    int t = 0;
    unsigned long ue = exp10 < 0 ? (unsigned long)(-exp10) : (unsigned long)exp10;
    if (exp10 < 0)
        buf[n++] = '-';
    do {
        tmp[t++] = (char)('0' + ue % 10);
        ue /= 10;
    } while (ue);
    while (t)
        buf[n++] = tmp[--t];
    buf[n] = '\0';
    return strtod(buf, NULL);
}

/* --------------------------------------------------------------- the double */

/*
 * The double nearest w * 10^q (w > 0, POW10_Q_MIN <= q <= POW10_Q_MAX), or
 * false when the table's truncation leaves the rounding undecided.
 *
 * With w shifted to have its top bit set (wn) and 10^q ~ M * 2^e, the
 * product wn * M is 192 bits; its top 64 (hi) hold the double's 53 bits,
 * the bit that rounds them, and 9 or 10 bits below. The truncation of M
 * (q < 0) makes the product too small by less than one unit of its low
 * 64 bits, so only a run of ones just below the rounding bit, or an exact
 * tie, need a closer look.
 */
static inline bool eisel_lemire(uint64_t w, int q, double *out)
{
    int lz = __builtin_clzll(w);
    uint64_t wn = w << lz;
    const uint64_t m_hi = pow10_table[q - POW10_Q_MIN].hi, m_lo = pow10_table[q - POW10_Q_MIN].lo;
    u128 top = (u128)wn * m_hi, low = (u128)wn * m_lo;
    top += (uint64_t)(low >> 64);
    uint64_t hi = (uint64_t)(top >> 64), mid = (uint64_t)top, bottom = (uint64_t)low;
    bool exact = q >= 0; /* M is 10^q itself then */
    int upper = (int)(hi >> 63); /* hi is in [2^62, 2^64) */
    int r = 9 + upper;           /* the rounding bit */
    uint64_t below = hi & ((UINT64_C(1) << r) - 1), round = hi >> r & 1;
    uint64_t mant = hi >> (r + 1); /* 53 bits */
    /* (bitwise, not &&: the rounding bit is a coin toss for the branch
     * predictor) */
    if (__builtin_expect((round == 0) & (below == (UINT64_C(1) << r) - 1) & (mid == UINT64_MAX) &
                             (exact == 0), 0))
        return false; /* just below a tie: the lost bits may reach it */
    /* above a tie, or on one and odd */
    mant += round & (uint64_t)(((below | mid | bottom) != 0) | (exact == 0) | (mant & 1));
    int e2 = r + 1 + 128 + pow10_table[q - POW10_Q_MIN].e - lz;
    if (mant >> 53) { /* rounding carried into a new bit */
        mant >>= 1;
        e2++;
    }
    uint64_t bits = (uint64_t)(e2 + 1075) << 52 | (mant & ((UINT64_C(1) << 52) - 1));
    memcpy(out, &bits, sizeof bits);
    return true;
}

/* 10^q as the nearest double, for q in the table's range (the compiler
 * rounds decimal literals correctly). */
static const double pow10_double[POW10_Q_MAX - POW10_Q_MIN + 1] = {
    1e-65, 1e-64, 1e-63, 1e-62, 1e-61, 1e-60, 1e-59, 1e-58, 1e-57, 1e-56, 1e-55, 1e-54, 1e-53,
    1e-52, 1e-51, 1e-50, 1e-49, 1e-48, 1e-47, 1e-46, 1e-45, 1e-44, 1e-43, 1e-42, 1e-41, 1e-40,
    1e-39, 1e-38, 1e-37, 1e-36, 1e-35, 1e-34, 1e-33, 1e-32, 1e-31, 1e-30, 1e-29, 1e-28, 1e-27,
    1e-26, 1e-25, 1e-24, 1e-23, 1e-22, 1e-21, 1e-20, 1e-19, 1e-18, 1e-17, 1e-16, 1e-15, 1e-14,
    1e-13, 1e-12, 1e-11, 1e-10, 1e-9,  1e-8,  1e-7,  1e-6,  1e-5,  1e-4,  1e-3,  1e-2,  1e-1,
    1e0,   1e1,   1e2,   1e3,   1e4,   1e5,   1e6,   1e7,   1e8,   1e9,   1e10,  1e11,  1e12,
    1e13,  1e14,  1e15,  1e16,  1e17,  1e18,  1e19,  1e20,  1e21,  1e22,  1e23,  1e24,  1e25,
    1e26,  1e27,  1e28,  1e29,  1e30,  1e31,  1e32,  1e33,  1e34,  1e35,  1e36,  1e37,  1e38,
};

/* The double nearest w * 10^q, by Eisel-Lemire or, when that cannot
 * decide, strtod on the text. */
__attribute__((noinline)) static double exact_double(uint64_t w, int q, const char *p,
                                                     const char *end)
{
    double d;
    if (!eisel_lemire(w, q, &d))
        d = strtod_of(p, end);
    return d;
}

/* The float32 of w * 10^q (w > 0), rounded via double; false when it is not
 * finite. */
static inline bool to_float(uint64_t w, long q, bool neg, const char *p, const char *end,
                            float *out)
{
    /* below 10^-46 even 19 digits are under half the smallest subnormal
     * (7e-46): zero; from 10^39 on, infinite */
    if (q < POW10_Q_MIN) {
        *out = neg ? -0.0f : 0.0f;
        return true;
    }
    if (q > POW10_Q_MAX)
        return false;
    /* First a bracket: w and 10^q as doubles and their product are each
     * within half a unit (2^-53) of the truth, so the true value lies
     * within 2^-49 of x. Rounding (to double, then to float32) is monotone:
     * when both ends of the bracket give the same float32, so does the
     * true value, whatever its double is. Only values within ~2^-49 of a
     * float32 rounding boundary go on to the exact double. */
    /* (w below 2^63, nearly always: the signed conversion is one
     * instruction, the unsigned one a sequence) */
    double dw = w >> 63 ? (double)w : (double)(int64_t)w;
    double x = dw * pow10_double[q - POW10_Q_MIN], margin = x * 0x1p-49;
    double lo = x - margin, hi = x + margin;
    float f;
    if (__builtin_expect(hi < F32_OVERFLOW && (float)lo == (float)hi, 1))
        f = (float)lo;
    else {
        double d = exact_double(w, (int)q, p, end);
        if (d >= F32_OVERFLOW)
            return false;
        f = (float)d;
    }
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits |= (uint32_t)neg << 31; /* the sign without a branch */
    memcpy(out, &bits, 4);
    return true;
}

/* ----------------------------------------------------------------- digits */

/*
 * More than 19 digits: the first 19 significant ones (w) and whether a
 * non-zero digit was dropped after them; *q gets the power of ten of w's
 * last digit before the exponent part.
 */
__attribute__((noinline, cold)) static uint64_t first_19_digits(const char *s, const char *end,
                                                                 long *q, bool *dropped)
{
    uint64_t w = 0;
    int nd = 0;
    long k = 0;
    *dropped = false;
    for (; s < end && is_digit(*s); s++) {
        if (nd < 19) {
            w = w * 10 + (unsigned)(*s - '0');
            nd += w != 0;
        } else {
            k++;
            *dropped |= *s != '0';
        }
    }
    if (s < end && *s == '.')
        for (s++; s < end && is_digit(*s); s++) {
            if (nd < 19) {
                w = w * 10 + (unsigned)(*s - '0');
                nd += w != 0;
                k--;
            } else
                *dropped |= *s != '0';
        }
    *q = k;
    return w;
}

/* Leading zeros of the digits at s (the point skipped): they do not count
 * as significant. */
__attribute__((noinline, cold)) static int leading_zeros(const char *s, const char *end)
{
    int n = 0;
    for (; s < end && (*s == '0' || *s == '.'); s++)
        n += *s == '0';
    return n;
}

static const uint32_t pow10_run[9] = {1,      10,      100,      1000,     10000,
                                      100000, 1000000, 10000000, 100000000};

/* The digits at s into w (w * 10 + d per digit, modulo 2^64: exact while
 * there are at most 19 significant ones); returns the byte after them. A
 * run of up to 8 per step where 8 bytes can be read, so that the number of
 * digits costs no mispredicted loop exit. */
__attribute__((always_inline)) static inline const char *read_digits(const char *s,
                                                                      const char *end,
                                                                      uint64_t *w)
{
    uint64_t v = *w;
    for (;;) {
        if (end - s < 8) {
            for (; s < end && is_digit(*s); s++)
                v = v * 10 + (unsigned)(*s - '0');
            break;
        }
        uint64_t x = codec_load8(s);
        int run = codec_leading_digits8(x);
        v = v * pow10_run[run] + codec_digits8_value(codec_digit_values(x, run));
        s += run;
        if (run < 8)
            break;
    }
    *w = v;
    return s;
}

/* A JSON number as digits and a power of ten: its value is
 * (-1)^neg * (w + r) * 10^q for some 0 <= r < 1, where w holds the first 19
 * significant digits and r > 0 exactly when `dropped` (a non-zero digit
 * after those 19). */
typedef struct {
    uint64_t w;
    long q;
    bool neg, dropped;
} decimal;

/* Reads the number at p (validated text) into d; returns the byte after
 * it. The digits go into w (w * 10 + d per digit, modulo 2^64: exact while
 * there are at most 19 significant ones); more than 19 are read again. */
__attribute__((always_inline)) static inline const char *read_decimal(const char *p,
                                                                       const char *end,
                                                                       decimal *d)
{
    d->neg = p < end && *p == '-';
    const char *digits = p + d->neg, *s = digits;
    uint64_t w = 0;
    /* the whole part: one digit, mostly */
    for (; s < end && is_digit(*s); s++)
        w = w * 10 + (unsigned)(*s - '0');
    long n_digits = s - digits, n_frac = 0;
    if (s < end && *s == '.') {
        const char *frac = s + 1;
        s = read_digits(frac, end, &w);
        n_frac = s - frac;
        n_digits += n_frac;
    }
    const char *digits_end = s;
    long e = read_exponent(&s, end);
    d->w = w;
    d->q = e - n_frac;
    d->dropped = false;
    if (__builtin_expect(n_digits > 19, 0) && n_digits - leading_zeros(digits, digits_end) > 19) {
        long k;
        d->w = first_19_digits(digits, digits_end, &k, &d->dropped);
        d->q = k + e;
    }
    return s;
}

/* A number with digits dropped (text [digits, text_end), after the sign):
 * x lies in [w, w + 1) * 10^q, and float32(double(.)) is monotone, so when
 * both ends give the same float32 so does x. */
__attribute__((noinline, cold)) static bool parse_long(const decimal *d, const char *digits,
                                                       const char *text_end, float *out)
{
    float lo, hi;
    bool lo_ok = to_float(d->w, d->q, d->neg, digits, text_end, &lo);
    bool hi_ok = to_float(d->w + 1, d->q, d->neg, digits, text_end, &hi);
    if (lo_ok && hi_ok && lo == hi) {
        *out = lo;
        return true;
    }
    double x = strtod_of(digits, text_end);
    if (x >= F32_OVERFLOW)
        return false;
    *out = d->neg ? -(float)x : (float)x;
    return true;
}

/* The value of the n (0..16) digits at s, 16 bytes at s readable: two
 * words whatever n is, so that the digit count costs no branch. */
static inline uint64_t value16(const char *s, int n)
{
    int a = n < 8 ? n : 8, b = n - a;
    uint64_t hi = codec_digits8_value(codec_digit_values(codec_load8(s), a));
    uint64_t lo = codec_digits8_value(codec_digit_values(codec_load8(s + 8), b));
    return hi * pow10_run[b] + lo;
}

static const uint64_t pow10_u64[20] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL, 100000000ULL,
    1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL, 10000000000000ULL,
    100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL,
    1000000000000000000ULL, 10000000000000000000ULL,
};

/* Bytes the fast path may read from the start of a number: sign, up to 8
 * whole digits, the point, 16 fraction digits and 3 more, a little slack. */
#define FAST_READ 40

/*
 * The usual number, read where FAST_READ bytes are readable: 1 to 8 digits
 * before the point, at most 19 in all and no exponent part, the run of
 * fraction digits found 16 bytes at a time (SSE2). False when the number is
 * not of that kind (nothing is written then); *ok says whether it is finite
 * as a float32.
 */
__attribute__((always_inline)) static inline bool parse_fast(const char *p, const char **stop,
                                                             float *out, bool *ok)
{
    bool neg = *p == '-';
    const char *digits = p + neg, *s = digits;
    int n_whole = codec_digit_run16(s);
    uint64_t w;
    if (n_whole == 1) /* the usual: |x| < 10 */
        w = (unsigned)(*s - '0');
    else if (n_whole >= 2 && n_whole <= 8)
        w = codec_digits8_value(codec_digit_values(codec_load8(s), n_whole));
    else
        return false;
    s += n_whole;
    int n_frac = 0;
    if (*s == '.') {
        const char *frac = s + 1;
        n_frac = codec_digit_run16(frac);
        uint64_t f = value16(frac, n_frac);
        s = frac + n_frac;
        if (n_frac == 16) /* a float32 printed as a double: 17 digits */
            for (; is_digit(*s) && n_frac < 19; s++, n_frac++)
                f = f * 10 + (unsigned)(*s - '0');
        if (n_whole + n_frac > 19 || is_digit(*s))
            return false;
        w = w * pow10_u64[n_frac] + f;
    }
    if (*s == 'e' || *s == 'E')
        return false;
    *stop = s;
    if (w == 0) {
        *out = neg ? -0.0f : 0.0f;
        *ok = true;
        return true;
    }
    *ok = to_float(w, -n_frac, neg, digits, s, out);
    return true;
}

__attribute__((always_inline)) static inline bool parse_one(const char *p, const char *end,
                                                            const char **stop, float *out)
{
    bool ok;
    if (end - p >= FAST_READ && parse_fast(p, stop, out, &ok))
        return ok;
    decimal d;
    const char *digits = p + (p < end && *p == '-');
    *stop = read_decimal(p, end, &d);
    if (__builtin_expect(d.dropped, 0))
        return parse_long(&d, digits, *stop, out);
    if (d.w == 0) {
        *out = d.neg ? -0.0f : 0.0f;
        return true;
    }
    return to_float(d.w, d.q, d.neg, digits, *stop, out);
}

bool codec_parse_float(const char *p, const char *end, const char **stop,
                       float *out)
{
    return parse_one(p, end, stop, out);
}

codec_int_result codec_parse_integer(const char *p, const char *end, int64_t limit,
                                     const char **stop, int64_t *out)
{
    decimal d;
    *stop = read_decimal(p, end, &d);
    *out = 0;
    if (d.w == 0) /* every digit 0 (-0 too) */
        return CODEC_INT_OK;
    int n_digits = 1;
    while (n_digits < 20 && d.w >= pow10_u64[n_digits])
        n_digits++;
    /* 20 digits before the point or more: past 10^19, and any limit */
    if (n_digits + d.q > 19)
        return CODEC_INT_RANGE;
    uint64_t whole, rest;
    if (d.q >= 0) { /* q <= 18 here, and w * 10^q < 10^19 */
        whole = d.w * pow10_u64[d.q];
        rest = 0;
    } else if (d.q < -19) { /* w < 10^19 <= 10^-q */
        whole = 0;
        rest = d.w;
    } else {
        whole = d.w / pow10_u64[-d.q];
        rest = d.w % pow10_u64[-d.q];
    }
    bool fraction = rest != 0 || d.dropped;
    if (whole > (uint64_t)limit || (whole == (uint64_t)limit && fraction))
        return CODEC_INT_RANGE;
    if (fraction)
        return CODEC_INT_FRACTION;
    *out = d.neg ? -(int64_t)whole : (int64_t)whole;
    return CODEC_INT_OK;
}

/* Bytes from a block's start that reading its numbers may touch: a number
 * starts in its first 64, and its digits are read 8 or 16 at a time. */
#define BLOCK_READ 96

/*
 * The numbers of a block (row_scan.c) whose grammar holds, given by the
 * bytes that belong to them (digits, points, minus signs) and, among those,
 * the points and the minus signs; at most room of them, into out; returns
 * how many were read. When one is not finite as a float32, the count stops
 * before it, *bad is its first byte and *stop the byte after it. The bounds
 * come from the masks, so no number waits for the one before it.
 */
static size_t parse_block(const char *p, uint64_t numbers, uint64_t points, uint64_t minus,
                          float *out, size_t room, const char **stop, const char **bad)
{
    uint64_t starts = numbers & ~(numbers << 1), ends = numbers & ~(numbers >> 1);
    size_t n = 0;
    for (; starts && n < room; starts &= starts - 1, ends &= ends - 1, n++) {
        int s = __builtin_ctzll(starts), e = __builtin_ctzll(ends) + 1;
        uint64_t span = (ends & -ends) * 2 - (starts & -starts); /* bits s..e-1 */
        uint64_t point = points & span;
        bool neg = minus >> s & 1;
        const char *digits = p + s + neg, *after = p + e;
        int n_whole = (int)((point ? p + __builtin_ctzll(point) : after) - digits);
        int n_frac = point ? (int)(after - digits) - n_whole - 1 : 0;
        bool ok;
        if (n_whole <= 8 && n_frac <= 19 && n_whole + n_frac <= 19) {
            uint64_t w = codec_digits8_value(codec_digit_values(codec_load8(digits), n_whole));
            if (n_frac) {
                const char *frac = digits + n_whole + 1;
                int head = n_frac < 16 ? n_frac : 16;
                uint64_t f = value16(frac, head);
                if (n_frac > 16) { /* a float32 printed as a double: 17 digits */
                    uint64_t tail = codec_load8(frac + 16);
                    f = f * pow10_run[n_frac - 16] +
                        codec_digits8_value(codec_digit_values(tail, n_frac - 16));
                }
                w = w * pow10_u64[n_frac] + f;
            }
            if (w == 0) {
                out[n] = neg ? -0.0f : 0.0f;
                ok = true;
            } else
                ok = to_float(w, -n_frac, neg, digits, after, &out[n]);
        } else {
            const char *unused;
            ok = parse_one(p + s, p + e, &unused, &out[n]);
        }
        if (!ok) {
            *bad = p + s;
            *stop = after;
            return n;
        }
    }
    return n;
}

/* The first noted block at or after p, or NULL (no notes, or none left). */
static inline const char *next_note(codec_notes *notes, const char *p)
{
    if (!notes)
        return NULL;
    while (notes->i < notes->n && notes->text + notes->at[notes->i] < p)
        notes->i++;
    return notes->i < notes->n ? notes->text + notes->at[notes->i] : NULL;
}

size_t codec_parse_float_row(const char *p, const char *end, float *out, size_t room,
                             const char **stop, const char **bad, codec_notes *notes)
{
    size_t n = 0;
    *bad = NULL;
    /* where a block did not apply, numbers are read one by one past it */
    const char *blocks_from = p;
    while (n < room) {
        if (end - p >= BLOCK_READ) {
            /* A block: with notes, one the validator noted here (where it
             * noted none, the row's numbers here are few or unusual, and
             * are read one by one up to the next note); without, one
             * classified now. */
            uint64_t numbers = 0, points = 0, minus = 0;
            const char *comma = NULL, *block_stop = NULL;
            if (notes) {
                if (next_note(notes, p) == p) {
                    numbers = notes->numbers[notes->i++];
                    codec_row_signs(p, &points, &minus);
                    points &= numbers; /* the block ends at its last comma */
                    minus &= numbers;
                    /* its last comma follows its last number (and spaces) */
                    comma = codec_skip_ws(p + 64 - __builtin_clzll(numbers), end);
                }
            } else if (p >= blocks_from) {
                codec_row_block b;
                codec_row_scan(p, &b);
                if (b.len && codec_row_grammar(&b)) {
                    numbers = codec_row_numbers(&b);
                    points = b.point;
                    minus = b.minus;
                    comma = p + b.len - 1;
                    /* no comma from there to the byte that ended the
                     * block: no block to try before it (json_validate.c) */
                    if (b.stop < 64)
                        block_stop = p + b.stop;
                } else
                    blocks_from = p + 64;
            }
            if (numbers) {
                /* a block holds at most 32 numbers ("1,1,..."): counted
                 * only when the room is short of that */
                size_t count = room - n >= 32
                                   ? 32
                                   : (size_t)__builtin_popcountll(numbers & ~(numbers << 1));
                if (count <= room - n) {
                    n += parse_block(p, numbers, points, minus, out + n, count, stop, bad);
                    if (*bad)
                        return n;
                    if (block_stop)
                        blocks_from = block_stop;
                    /* on the comma, as after ", <number>" below */
                    *stop = comma;
                    p = codec_skip_ws(comma + 1, end);
                    if (p == end || !codec_starts_number(*p))
                        return n;
                    continue;
                }
                blocks_from = p + 64;
            }
        }
        const char *after;
        if (!parse_one(p, end, &after, &out[n])) {
            *bad = p;
            *stop = after;
            return n;
        }
        n++;
        /* Python's separator ", " (or a bare ','), then a number: the usual */
        if (end - after >= 3 && after[0] == ',') {
            const char *next = after + 1 + (after[1] == ' ');
            if (codec_starts_number(*next)) {
                *stop = after;
                p = next;
                continue;
            }
        }
        p = codec_skip_ws(after, end);
        *stop = p;
        if (p == end || *p != ',')
            return n;
        const char *next = codec_skip_ws(p + 1, end);
        if (next == end || !codec_starts_number(*next))
            return n; /* *stop stays at the ',' */
        p = next;
    }
    return n;
}
