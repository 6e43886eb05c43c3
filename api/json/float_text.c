/*
 * The shortest decimal text that reads back as the same float32.
 *
 * A float32 v = m * 2^e owns the interval of reals that round to it, bounded
 * by the midpoints to its neighbours. Every decimal inside reads back as v;
 * the task is to find one with the fewest significant digits.
 *
 * 1. Scale: with j chosen so that v * 10^-j has 10 or 11 digits, compute
 *    exactly (integer arithmetic) floor(x * 10^-j) and whether the floor
 *    dropped anything, for x = v and for both interval ends. Call these V,
 *    L, H. One unit of that scale is at most 1e-9 of v, so a 9-digit
 *    decimal always fits: the interval spans >= 88 units.
 * 2. Candidates are multiples of 10^a units (10 - a significant digits at
 *    most). A candidate at least one unit inside both ends is certainly
 *    read back as v; the largest a that has one wins, and among its
 *    candidates the one nearest v is written.
 * 3. Readers round twice (decimal -> double -> float32, see number.c), which
 *    can move the interval ends by about 2^-53 of v: far less than a unit.
 *    So only candidates within a unit of an end are in doubt; those (rare)
 *    are settled by actually reading them back.
 */
#include "codec_internal.h"

#include <stdlib.h>
#include <string.h>

__extension__ typedef unsigned __int128 u128;

static const uint64_t pow10_u64[20] = {
    1ULL,
    10ULL,
    100ULL,
    1000ULL,
    10000ULL,
    100000ULL,
    1000000ULL,
    10000000ULL,
    100000000ULL,
    1000000000ULL,
    10000000000ULL,
    100000000000ULL,
    1000000000000ULL,
    10000000000000ULL,
    100000000000000ULL,
    1000000000000000ULL,
    10000000000000000ULL,
    100000000000000000ULL,
    1000000000000000000ULL,
    10000000000000000000ULL,
};

static const double exact_pow10[23] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

/* ---------------------------------------------------------------- scaling */

/* floor(mant * 2^e2 * 10^t) and whether it was inexact, for mant < 2^27 and
 * exponents for which the result has about 10 digits. */
typedef struct {
    uint64_t floor;
    bool inexact;
} scaled;

/* mant * 10^t >> shift with t large: a little 256-bit integer in 32-bit
 * limbs (mant < 2^27, 10^t < 2^180 for float32, so < 2^207). */
__attribute__((noinline, cold)) static scaled scale_wide(uint64_t mant, int t, int shift)
{
    uint32_t limb[8] = {(uint32_t)mant, (uint32_t)(mant >> 32)};
    while (t > 0) {
        int step = t > 9 ? 9 : t;
        uint64_t f = pow10_u64[step], carry = 0;
        for (int i = 0; i < 8; i++) {
            uint64_t x = (uint64_t)limb[i] * f + carry;
            limb[i] = (uint32_t)x;
            carry = x >> 32;
        }
        t -= step;
    }
    scaled r = {0, false};
    int whole = shift / 32, bits = shift % 32;
    for (int i = 0; i < whole && i < 8; i++)
        r.inexact |= limb[i] != 0;
    if (bits && whole < 8)
        r.inexact |= (limb[whole] & ((1u << bits) - 1)) != 0;
    /* the result is below 2^40, so three limbs from `whole` on hold it */
    u128 x = 0;
    for (int i = 2; i >= 0; i--)
        x = (x << 32) | (whole + i < 8 ? limb[whole + i] : 0);
    r.floor = (uint64_t)(x >> bits);
    return r;
}

static inline scaled scale(uint64_t mant, int e2, int t)
{
    scaled r = {0, false};
    if (t >= 0) {
        if (e2 >= 0) {
            /* v >= 2^25 here, so floor(log10 v) >= 7 and t <= 2 */
            r.floor = (uint64_t)(((u128)mant * pow10_u64[t]) << e2);
            return r;
        }
        int shift = -e2;
        if (t <= 19 && shift < 128) {
            u128 x = (u128)mant * pow10_u64[t];
            r.floor = (uint64_t)(x >> shift);
            r.inexact = (u128)r.floor << shift != x;
            return r;
        }
        return scale_wide(mant, t, shift);
    }
    /* t < 0 means v >= 10^10, hence e2 > 0 and mant << e2 < 2^128 */
    u128 x = (u128)mant << e2;
    int j = -t;
    u128 d = j <= 19 ? (u128)pow10_u64[j] : (u128)pow10_u64[19] * pow10_u64[j - 19];
    r.floor = (uint64_t)(x / d);
    r.inexact = x % d != 0;
    return r;
}

/* floor(x / 2^shift) and whether that dropped anything (0 < shift < 128). */
static inline scaled floor_shift(u128 x, int shift)
{
    scaled r;
    uint64_t lo = (uint64_t)x, hi = (uint64_t)(x >> 64);
    if (shift < 64) { /* |v| above ~1e-11: two 64-bit halves, no u128 shifts */
        r.floor = lo >> shift | hi << 1 << (63 - shift);
        r.inexact = lo << 1 << (63 - shift) != 0;
    } else {
        r.floor = hi >> (shift - 64);
        r.inexact = lo != 0 || hi << 1 << (127 - shift) != 0;
    }
    return r;
}

/* x / 10^a with a constant divisor per case, so that the compiler turns
 * each into a multiplication instead of a (slow) hardware division. */
static inline uint64_t div_pow10(uint64_t x, int a)
{
    switch (a) {
    case 0: return x;
    case 1: return x / 10;
    case 2: return x / 100;
    case 3: return x / 1000;
    case 4: return x / 10000;
    case 5: return x / 100000;
    case 6: return x / 1000000;
    case 7: return x / 10000000;
    case 8: return x / 100000000;
    case 9: return x / 1000000000;
    case 10: return x / 10000000000ULL;
    default: return x / 100000000000ULL;
    }
}

/* floor(n * log10(2)), exactly for |n| <= 200 (78913 / 2^18 is log10(2)
 * to 7 digits), which covers every float32 exponent. */
static int floor_log10_pow2(int n)
{
    return n >= 0 ? (n * 78913) >> 18 : -((-n * 78913 + (1 << 18) - 1) >> 18);
}

/* ---------------------------------------------------------- reading back */

/* Does digits * 10^exp10 read back (decimal -> double -> float32) as f? */
static bool reads_back(uint64_t digits, int exp10, float f)
{
    double d;
    if (digits <= (UINT64_C(1) << 53) && exp10 >= -22 && exp10 <= 22) {
        d = (double)digits;
        d = exp10 < 0 ? d / exact_pow10[-exp10] : d * exact_pow10[exp10];
    } else {
        char buf[48];
        char *w = buf + sizeof buf;
        *--w = '\0';
        unsigned ue = exp10 < 0 ? (unsigned)-exp10 : (unsigned)exp10;
        do
            *--w = (char)('0' + ue % 10);
        while (ue /= 10);
        if (exp10 < 0)
            *--w = '-';
        *--w = 'e';
        do
            *--w = (char)('0' + digits % 10);
        while (digits /= 10);
        d = strtod(w, NULL);
    }
    if (d >= 0x1.ffffffp127)
        return false;
    return (float)d == f;
}

/* ------------------------------------------------------------ formatting */

static const char two_digits[200] = {
    '0','0','0','1','0','2','0','3','0','4','0','5','0','6','0','7','0','8','0','9',
    '1','0','1','1','1','2','1','3','1','4','1','5','1','6','1','7','1','8','1','9',
    '2','0','2','1','2','2','2','3','2','4','2','5','2','6','2','7','2','8','2','9',
    '3','0','3','1','3','2','3','3','3','4','3','5','3','6','3','7','3','8','3','9',
    '4','0','4','1','4','2','4','3','4','4','4','5','4','6','4','7','4','8','4','9',
    '5','0','5','1','5','2','5','3','5','4','5','5','5','6','5','7','5','8','5','9',
    '6','0','6','1','6','2','6','3','6','4','6','5','6','6','6','7','6','8','6','9',
    '7','0','7','1','7','2','7','3','7','4','7','5','7','6','7','7','7','8','7','9',
    '8','0','8','1','8','2','8','3','8','4','8','5','8','6','8','7','8','8','8','9',
    '9','0','9','1','9','2','9','3','9','4','9','5','9','6','9','7','9','8','9','9',
};

/* The 8 decimal digits of x < 10^8 as ASCII, the first in the lowest byte:
 * split into halves, quarters and digits within the lanes of one word
 * (x / 100 as x * 5243 >> 19 for x < 10^4, x / 10 as x * 103 >> 10 for
 * x < 100), no loop and no division. */
static inline uint64_t ascii8(uint32_t x)
{
    uint64_t v = (uint64_t)(x / 10000) | (uint64_t)(x % 10000) << 32;
    uint64_t hundreds = ((v * 5243) >> 19) & 0x0000007f0000007fu;
    uint64_t pairs = hundreds | (v - hundreds * 100) << 16;
    uint64_t tens = ((pairs * 103) >> 10) & 0x000f000f000f000fu;
    uint64_t digits = tens | (pairs - tens * 10) << 8;
    return digits + 0x3030303030303030u;
}

/* The n decimal digits of x (x < 10^n <= 10^9) at w[0..n). Writes up to 9
 * bytes whatever n is: callers have API_FLOAT_TEXT_MAX bytes of room and
 * overwrite what lies past the digits. */
static void put_digits(char *w, uint32_t x, int n)
{
    if (n == 9) {
        *w++ = (char)('0' + x / 100000000);
        x %= 100000000;
        n = 8;
    }
    uint64_t d = ascii8(x) >> (8 * (8 - n)); /* leading zeros out */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    d = __builtin_bswap64(d);
#endif
    memcpy(w, &d, 8);
}

/* Number of decimal digits of x: bits * log10(2) (1233 / 4096) gives it
 * or one less, and one comparison decides. */
static int count_digits(uint32_t x)
{
    int t = ((32 - __builtin_clz(x | 1)) * 1233) >> 12;
    return t + (x >= pow10_u64[t]);
}

/* Writes digits * 10^exp10 (digits has n < 10 digits, no trailing zero)
 * the way Python's repr() writes a float: plain for decimal exponents
 * -4..15, always with a point ("3.0", so that a Python client reads a
 * float, not an int), otherwise "1.5e-07". */
static char *put_decimal(char *w, uint32_t digits, int n, int exp10)
{
    int sci = exp10 + n - 1; /* exponent in d.ddd x 10^sci */
    if (sci >= -4 && sci < 16) {
        if (sci < 0) { /* 0.000ddd */
            memcpy(w, "0.000000", 8); /* then keep 2 + (-sci - 1) bytes */
            w += 1 - sci;
            put_digits(w, digits, n);
            return w + n;
        }
        int whole = sci + 1;
        if (n <= whole) { /* ddd000.0 */
            put_digits(w, digits, n);
            w += n;
            for (int i = n; i < whole; i++)
                *w++ = '0';
            memcpy(w, ".0", 2);
            return w + 2;
        }
        /* dd.ddd: the digits one place right, then the point moves in */
        put_digits(w + 1, digits, n);
        if (whole < 8) {
            /* in one word: the first `whole` digits from one place right,
             * the point, the rest from where they are */
            uint64_t right = api_load8(w + 1), here = api_load8(w);
            uint64_t keep = (UINT64_C(1) << (8 * whole)) - 1;
            uint64_t word = (right & keep) | (uint64_t)'.' << (8 * whole) | (here & ~keep << 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            word = __builtin_bswap64(word);
#endif
            memcpy(w, &word, 8);
        } else {
            for (int i = 0; i < whole; i++)
                w[i] = w[i + 1];
            w[whole] = '.';
        }
        return w + n + 1;
    }
    put_digits(w + 1, digits, n); /* d.ddde+XX */
    w[0] = w[1];
    if (n > 1) {
        w[1] = '.';
        w += n + 1;
    } else
        w += 1;
    *w++ = 'e';
    *w++ = sci < 0 ? '-' : '+';
    int a = sci < 0 ? -sci : sci;
    memcpy(w, two_digits + 2 * a, 2); /* |sci| <= 45 */
    return w + 2;
}

/* ------------------------------------------------------------- the search */

/* Doubtful candidates sit within a unit of an end: L (on the lower end
 * when it is exact, else just below it), L+1, H and, when the upper end
 * is not exact, H+1. Only one ending in 0 can be shorter than the safe
 * choice (*digits * 10^*exp10, *nd digits); reading it back decides
 * (reads_back applies the tie rule). */
static void shorter_by_reading_back(scaled L, scaled H, int j, float mag, uint64_t *digits,
                                    int *exp10, int *nd)
{
    uint64_t doubt[2];
    int n_doubt = 0;
    uint64_t lr = L.floor % 10, hr = H.floor % 10;
    if (lr == 0 || lr == 9)
        doubt[n_doubt++] = L.floor + (lr == 9);
    if (hr == 0 || (hr == 9 && H.inexact))
        doubt[n_doubt++] = H.floor + (hr == 9);
    for (int i = 0; i < n_doubt; i++) {
        uint64_t x = doubt[i];
        int tz = 0;
        while (x % 10 == 0) {
            x /= 10;
            tz++;
        }
        if (x >= 1000000000)
            continue; /* 10 digits or more: never shorter */
        int nx = count_digits((uint32_t)x);
        if (nx < *nd && reads_back(x, j + tz, mag)) {
            *digits = x;
            *exp10 = j + tz;
            *nd = nx;
        }
    }
}

char *api_float_text(float f, char *out)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    char *w = out;
    unsigned biased = (bits >> 23) & 0xff;
    uint32_t frac = bits & 0x7fffff;
    if (biased == 0xff) {
        memcpy(w, "null", 4);
        return w + 4;
    }
    *w = '-'; /* kept only for negative numbers: no branch to mispredict */
    w += bits >> 31;
    if (biased == 0 && frac == 0) {
        memcpy(w, "0.0", 3);
        return w + 3;
    }
    float mag = f < 0 ? -f : f;
    uint64_t m = biased ? frac | 0x800000u : frac;
    int e = biased ? (int)biased - 150 : -149;

    /* In units of 2^(e-2): v = 4m, the ends 4m +- 2, except that just above
     * a power of two the gap below is half as wide. */
    int e2 = e - 2;
    uint64_t mv = 4 * m, mhi = mv + 2, mlo = mv - (frac == 0 && biased > 1 ? 1 : 2);

    /* v is in [2^n, 2^(n+1)) with n = top + e, so floor(log10 v) is
     * floor(n log10 2) or one more: with j from the former, V has 10 or 11
     * digits. Either is fine: a unit stays between 1e-11 and 1e-9 of v. */
    int top = 63 - __builtin_clzll(m);
    int j = floor_log10_pow2(top + e) - 9, t = -j;
    scaled V, L, H;
    if (e2 < 0 && t >= 0 && t <= 19 && -e2 < 128) {
        /* the usual case, |v| from about 1e-19 to 1e7: one product, the
         * ends are v's product -+ a multiple of 10^t */
        u128 p10 = pow10_u64[t], x = (u128)mv * p10;
        V = floor_shift(x, -e2);
        L = floor_shift(x - (mv - mlo) * p10, -e2);
        H = floor_shift(x + 2 * p10, -e2);
    } else {
        V = scale(mv, e2, t);
        L = scale(mlo, e2, t);
        H = scale(mhi, e2, t);
    }

    /* Safe candidates C: C >= L+2 (over a unit above the lower end) and
     * C <= H-1 (at least a unit below the upper end). Any run of 10^a
     * consecutive integers holds a multiple of 10^a, so the widest such
     * step that fits the safe range surely has a candidate; a coarser step
     * has one only by luck, which is tested. */
    uint64_t safe_lo = L.floor + 2, safe_hi = H.floor - 1;
    uint64_t width = safe_hi - safe_lo + 1; /* < 2^32: about 2^-23 of V */
    int a = count_digits((uint32_t)width) - 1;
    while (a < 11 && div_pow10(safe_hi, a + 1) * pow10_u64[a + 1] >= safe_lo)
        a++;
    uint64_t q = pow10_u64[a];
    /* the candidate nearest v (half to even), moved inside if needed: the
     * multiples next to it are then safe, since one exists at all */
    uint64_t c = div_pow10(V.floor, a), r = V.floor - c * q;
    c += 2 * r > q || (2 * r == q && (V.inexact || (c & 1)));
    if (c * q < safe_lo)
        c++;
    else if (c * q > safe_hi)
        c--;
    /* at most 9 digits: the safe range spans >= 85 units below 10^10 and
     * >= 850 above, so a >= 1, or a >= 2 when C has 11 digits */
    uint64_t digits = c;
    int exp10 = j + a;
    while (digits % 10 == 0) { /* C was a power of ten */
        digits /= 10;
        exp10++;
    }
    int nd = count_digits((uint32_t)digits);

    shorter_by_reading_back(L, H, j, mag, &digits, &exp10, &nd);
    return put_decimal(w, (uint32_t)digits, nd, exp10);
}
