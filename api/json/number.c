/*
 * Reading one JSON number into float32 the way a Python client means it:
 * float(text) (correctly rounded to double), then converted to float32.
 * Rounding twice is not the same as rounding once to float32, so the double
 * step is kept on purpose: the result is exactly (float)strtod(text).
 *
 * Three paths, fastest first:
 *  1. Clinger's exact case: at most 2^53 for the digits and |exponent| <= 22,
 *     so the digits and the power of ten are exact doubles and one IEEE
 *     multiply or divide is the correctly rounded double.
 *  2. An approximation with an error bound: the first 19 significant digits
 *     times a power of ten is within a few units in the last place of the
 *     double. Rounding to float32 is monotone, so when both ends of that
 *     error interval round to the same float32, so does the true double.
 *     This misses only values within ~2^-49 of a float32 rounding boundary.
 *  3. strtod on a NUL-terminated copy. strtod follows LC_NUMERIC; attnd never
 *     calls setlocale, so the "C" locale (decimal point '.') holds.
 */
#include "codec_internal.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>

/* Exact powers of ten as doubles (10^22 is the last exact one). */
static const double exact_pow10[23] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

/* 10^k for k in [POW10_MIN, POW10_MAX], each the correctly rounded double
 * (the compiler rounds decimal literals correctly). Outside this range a
 * number of at most 19 digits is 0 or infinite as a float32. */
#define POW10_MIN (-66)
#define POW10_MAX 40
static const double approx_pow10[POW10_MAX - POW10_MIN + 1] = {
    1e-66, 1e-65, 1e-64, 1e-63, 1e-62, 1e-61, 1e-60, 1e-59, 1e-58, 1e-57,
    1e-56, 1e-55, 1e-54, 1e-53, 1e-52, 1e-51, 1e-50, 1e-49, 1e-48, 1e-47,
    1e-46, 1e-45, 1e-44, 1e-43, 1e-42, 1e-41, 1e-40, 1e-39, 1e-38, 1e-37,
    1e-36, 1e-35, 1e-34, 1e-33, 1e-32, 1e-31, 1e-30, 1e-29, 1e-28, 1e-27,
    1e-26, 1e-25, 1e-24, 1e-23, 1e-22, 1e-21, 1e-20, 1e-19, 1e-18, 1e-17,
    1e-16, 1e-15, 1e-14, 1e-13, 1e-12, 1e-11, 1e-10, 1e-9,  1e-8,  1e-7,
    1e-6,  1e-5,  1e-4,  1e-3,  1e-2,  1e-1,  1e0,   1e1,   1e2,   1e3,
    1e4,   1e5,   1e6,   1e7,   1e8,   1e9,   1e10,  1e11,  1e12,  1e13,
    1e14,  1e15,  1e16,  1e17,  1e18,  1e19,  1e20,  1e21,  1e22,  1e23,
    1e24,  1e25,  1e26,  1e27,  1e28,  1e29,  1e30,  1e31,  1e32,  1e33,
    1e34,  1e35,  1e36,  1e37,  1e38,  1e39,  1e40,
};

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

static bool double_to_f32(double d, float *out)
{
    if (d >= F32_OVERFLOW || d <= -F32_OVERFLOW)
        return false;
    *out = (float)d;
    return true;
}

/*
 * Path 3. Copies the number into a canonical "DIGITSeEXP" form for strtod:
 * the significant digits without the point, the exponent adjusted. Correct
 * rounding to double needs at most ~770 significant digits (the longest
 * exact midpoint between doubles); beyond SLOW_DIGITS the rest only matters
 * as "something non-zero follows", which a trailing 1 says.
 */
#define SLOW_DIGITS 800
__attribute__((noinline)) static bool parse_slow(const char *p, const char *end, bool neg,
                                                 float *out)
{
    char buf[SLOW_DIGITS + 40];
    size_t n = 0;
    long exp10 = 0;
    bool sticky = false;
    buf[n++] = neg ? '-' : '+';
    const char *s = p;
    if (s < end && *s == '-')
        s++;
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
    if (n == 1) { /* all digits were zero */
        *out = neg ? -0.0f : 0.0f;
        return true;
    }
    if (sticky)
        buf[n++] = '1', exp10--;
    buf[n++] = 'e';
    /* exp10 is bounded by EXP_CLAMP + SLOW_DIGITS-ish and the length of
     * the text; a long is plenty, and 30 bytes hold it. */
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
    return double_to_f32(strtod(buf, NULL), out);
}

/* The digits after the point at s into the significand w (nd significant
 * digits so far, at most 19 kept; k the power of ten), as in parse_one;
 * returns the byte after them. */
static inline const char *read_fraction(const char *s, const char *end, uint64_t *w_, int *nd_,
                                        long *k_, bool *truncated)
{
    uint64_t w = *w_;
    int nd = *nd_;
    long k = *k_;
    /* Fractions are where client numbers keep their digits ("0.123456789"):
     * a whole run of up to 8 per step while w has room (19 digits), so that
     * no loop exit depends on the digit count. */
    static const uint32_t pow10_run[9] = {1,      10,      100,      1000,     10000,
                                          100000, 1000000, 10000000, 100000000};
    while (nd <= 11 && end - s >= 8) {
        uint64_t x = api_load8(s);
        int run = api_leading_digits8(x);
        if (run == 0)
            break;
        uint64_t d = api_digit_values(x, run);
        if (w)
            nd += run;
        else /* leading zeros are not significant: the zero bytes below
              * the first non-zero digit */
            nd = d ? 8 - __builtin_ctzll(d) / 8 : 0;
        w = w * pow10_run[run] + api_digits8_value(d);
        k -= run;
        s += run;
        if (run < 8)
            break;
    }
    for (; s < end && is_digit(*s); s++) {
        unsigned d = (unsigned)(*s - '0');
        if (nd < 19) {
            w = w * 10 + d;
            nd += w != 0;
            k--;
        } else
            *truncated |= d != 0;
    }
    *w_ = w;
    *nd_ = nd;
    *k_ = k;
    return s;
}

__attribute__((always_inline)) static inline bool parse_one(const char *p, const char *end,
                                                         const char **stop, float *out)
{
    const char *s = p;
    bool neg = false;
    if (s < end && *s == '-') {
        neg = true;
        s++;
    }
    /* w: the first 19 significant digits; k: the power of ten that goes
     * with them; truncated: non-zero digits were dropped after the 19th. */
    uint64_t w = 0;
    int nd = 0;
    long k = 0;
    bool truncated = false;
    for (; s < end && is_digit(*s); s++) {
        unsigned d = (unsigned)(*s - '0');
        if (nd < 19) {
            w = w * 10 + d;
            nd += w != 0;
        } else {
            k++;
            truncated |= d != 0;
        }
    }
    if (s < end && *s == '.')
        s = read_fraction(s + 1, end, &w, &nd, &k, &truncated);
    k += read_exponent(&s, end);
    *stop = s;

    if (w == 0) {
        *out = neg ? -0.0f : 0.0f;
        return true;
    }
    /* Path 1 */
    if (!truncated && w <= (UINT64_C(1) << 53) && k >= -22 && k <= 22) {
        double d = (double)w;
        d = k < 0 ? d / exact_pow10[-k] : d * exact_pow10[k];
        *out = neg ? -(float)d : (float)d;
        return true;
    }
    /* The value lies in [10^(k+nd-1), 10^(k+nd)). Below 10^-46 it is less
     * than half the smallest float32 subnormal (1.4e-45) even after the
     * double rounding: zero. From 10^39 on it is infinite. */
    if (k + nd <= -46) {
        *out = neg ? -0.0f : 0.0f;
        return true;
    }
    if (k + nd - 1 >= 39)
        return false;
    /* Path 2. k is now within the table: k + nd > -46 with nd <= 19 gives
     * k >= -64, and k <= 38. */
    double x = (double)w * approx_pow10[k - POW10_MIN];
    /* The error of x against the exact value, counting the rounding of w,
     * of the table entry, of the product and the dropped digits, is below
     * 4 units in the last place of x; the margin is 16. */
    double margin = x * 0x1p-49;
    double lo = x - margin, hi = x + margin;
    if (lo >= F32_OVERFLOW)
        return false;
    if (hi < F32_OVERFLOW) {
        float flo = (float)lo, fhi = (float)hi;
        if (flo == fhi) {
            *out = neg ? -flo : flo;
            return true;
        }
    }
    return parse_slow(p, s, neg, out);
}

bool api_parse_number(const char *p, const char *end, const char **stop,
                      float *out)
{
    return parse_one(p, end, stop, out);
}

size_t api_parse_number_row(const char *p, const char *end, float *out, size_t room,
                            const char **stop, const char **bad)
{
    size_t n = 0;
    *bad = NULL;
    while (n < room) {
        const char *after;
        if (!parse_one(p, end, &after, &out[n])) {
            *bad = p;
            *stop = after;
            return n;
        }
        n++;
        p = json_skip_ws(after, end);
        *stop = p;
        if (p == end || *p != ',')
            return n;
        const char *next = json_skip_ws(p + 1, end);
        if (next == end || !(*next == '-' || is_digit(*next)))
            return n; /* *stop stays at the ',' */
        p = next;
    }
    return n;
}
