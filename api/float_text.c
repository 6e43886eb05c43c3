/*
 * The shortest decimal text that reads back as the same float32.
 *
 * A float32 v = m * 2^e owns the interval of reals that round to it, bounded
 * by the midpoints to its neighbours. Every decimal inside reads back as v;
 * the task is to find one with the fewest significant digits.
 *
 * 1. Scale: with j chosen so that v * 10^-j has 10 digits, compute exactly
 *    (integer arithmetic) floor(x * 10^-j) and whether the floor dropped
 *    anything, for x = v and for both interval ends. Call these V, L, H.
 *    One unit of that scale is at most 1e-9 of v, so a 9-digit decimal
 *    (a multiple of 10 units) always fits: the interval spans >= 88 units.
 * 2. For p = 9, 8, ... digits, the candidates are the multiples of
 *    q = 10^(10-p) units. A candidate at least one unit inside both ends is
 *    certainly read back as v; the smallest p that has one wins, and among
 *    its candidates the one nearest v is written.
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
static scaled scale_wide(uint64_t mant, int t, int shift)
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

static scaled scale(uint64_t mant, int e2, int t)
{
    scaled r = {0, false};
    if (t >= 0) {
        if (e2 >= 0) {
            /* v >= 1 has at most 10 integer digits here, so t <= 9 */
            r.floor = (uint64_t)(((u128)mant * pow10_u64[t]) << e2);
            return r;
        }
        int shift = -e2;
        if (t <= 19 && shift < 128) {
            u128 x = (u128)mant * pow10_u64[t];
            r.floor = (uint64_t)(x >> shift);
            r.inexact = (x & (((u128)1 << shift) - 1)) != 0;
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

/* floor(n * log10(2)) for |n| < 1000 (78913 / 2^18 is log10(2) to 7 digits;
 * an estimate one off is corrected by the caller anyway). */
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

static char *put_digits(char *w, uint64_t x, int n)
{
    for (int i = n - 1; i >= 0; i--) {
        w[i] = (char)('0' + x % 10);
        x /= 10;
    }
    return w + n;
}

static int count_digits(uint64_t x)
{
    int n = 1;
    while (n < 20 && x >= pow10_u64[n])
        n++;
    return n;
}

/* Writes digits * 10^exp10 the way Python's repr() writes a float: plain
 * for decimal exponents -4..15 (always with a point: "3.0", so that a
 * Python client reads a float, not an int), otherwise "1.5e-07". */
static char *put_decimal(char *w, uint64_t digits, int exp10)
{
    int n = count_digits(digits);
    int sci = exp10 + n - 1; /* exponent in d.ddd x 10^sci */
    char d[20];
    put_digits(d, digits, n);
    if (sci >= -4 && sci < 16) {
        if (sci < 0) {
            *w++ = '0';
            *w++ = '.';
            for (int i = 0; i < -sci - 1; i++)
                *w++ = '0';
            memcpy(w, d, (size_t)n);
            return w + n;
        }
        int whole = sci + 1;
        if (n <= whole) {
            memcpy(w, d, (size_t)n);
            w += n;
            for (int i = n; i < whole; i++)
                *w++ = '0';
            *w++ = '.';
            *w++ = '0';
            return w;
        }
        memcpy(w, d, (size_t)whole);
        w += whole;
        *w++ = '.';
        memcpy(w, d + whole, (size_t)(n - whole));
        return w + (n - whole);
    }
    *w++ = d[0];
    if (n > 1) {
        *w++ = '.';
        memcpy(w, d + 1, (size_t)(n - 1));
        w += n - 1;
    }
    *w++ = 'e';
    *w++ = sci < 0 ? '-' : '+';
    int a = sci < 0 ? -sci : sci;
    if (a >= 10) {
        *w++ = (char)('0' + a / 10);
        *w++ = (char)('0' + a % 10);
    } else {
        *w++ = '0';
        *w++ = (char)('0' + a);
    }
    return w;
}

/* ------------------------------------------------------------- the search */

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
    if (bits >> 31)
        *w++ = '-';
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

    int top = 63 - __builtin_clzll(m);
    int j = floor_log10_pow2(top + e) - 9; /* v * 10^-j has ~10 digits */
    scaled V = scale(mv, e2, -j);
    while (V.floor >= 10000000000ULL) {
        j++;
        V = scale(mv, e2, -j);
    }
    while (V.floor < 1000000000ULL) {
        j--;
        V = scale(mv, e2, -j);
    }
    scaled L = scale(mlo, e2, -j), H = scale(mhi, e2, -j);

    /* Safe candidates C: C >= L+2 (over a unit above the lower end) and
     * C <= H-1 (at least a unit below the upper end). Any run of 10^a
     * consecutive integers holds a multiple of 10^a, so the widest such
     * step that fits the safe range surely has a candidate; a coarser step
     * has one only by luck, which is tested. p = 10 - a digits. */
    uint64_t safe_lo = L.floor + 2, safe_hi = H.floor - 1;
    uint64_t width = safe_hi - safe_lo + 1;
    int a = 0;
    while (pow10_u64[a + 1] <= width)
        a++;
    while (a < 10 && safe_hi / pow10_u64[a + 1] * pow10_u64[a + 1] >= safe_lo)
        a++;
    int p = 10 - a;
    uint64_t q = pow10_u64[a];
    /* the candidate nearest v (half to even), moved inside if needed: the
     * multiples next to it are then safe, since one exists at all */
    uint64_t c = V.floor / q, r = V.floor % q;
    if (2 * r > q || (2 * r == q && (V.inexact || (c & 1))))
        c++;
    if (c * q < safe_lo)
        c++;
    else if (c * q > safe_hi)
        c--;
    uint64_t digits = c;
    int exp10 = j + (10 - p);
    while (digits % 10 == 0) { /* c = 10^p when H passed 10^10 */
        digits /= 10;
        exp10++;
    }
    int nd = count_digits(digits);

    /* Doubtful candidates sit within a unit of an end: L (on the lower end
     * when it is exact, else just below it), L+1, H and, when the upper end
     * is not exact, H+1. One of them may be shorter than the safe choice;
     * reading it back decides (reads_back applies the tie rule itself). */
    uint64_t doubt[4] = {L.floor, L.floor + 1, H.floor, H.floor + 1};
    int n_doubt = H.inexact ? 4 : 3;
    for (int i = 0; i < n_doubt; i++) {
        uint64_t x = doubt[i];
        if (x % 10)
            continue; /* >= 9 digits (L > 10^9 / 2): never shorter */
        int tz = 0;
        while (x % 10 == 0) {
            x /= 10;
            tz++;
        }
        int nx = count_digits(x);
        if (nx < nd && reads_back(x, j + tz, mag)) {
            digits = x;
            exp10 = j + tz;
            nd = nx;
        }
    }
    return put_decimal(w, digits, exp10);
}
