/*
 * The shortest decimal text that reads back as the same float32.
 *
 * A float32 v owns the interval of reals that read back as v; every decimal
 * inside does, and the task is to find one with the fewest significant
 * digits (and among those, the one nearest v). The interval is that of our
 * own reader (number.c), which rounds like a Python client: decimal ->
 * double -> float32. Rounding twice moves each end of the interval by half
 * a double's unit from the midpoint between v and its neighbour (outwards
 * when v's last bit is 0, since ties then go to v twice; inwards when it
 * is 1). Counted in units of that half unit, 2^E, the ends and v are
 * integers below 2^57, so every decision below is exact.
 *
 * The search is Schubfach's (R. Giulietti, "The Schubfach way to render
 * doubles"): scaled by 10^-k so that the interval is 1 to 10 units wide, it
 * holds at most one multiple of 10 (one digit shorter: take it), else the
 * integer s or s+1 next to v (take the one inside, or the nearer, ties to
 * even). No loop over digit counts, no reading back.
 *
 * The scaling is exact integer arithmetic: v * 10^-k is x * 5^n >> r for
 * the usual magnitudes (one 64x64-bit product), a 192-bit product below
 * 1e-13, and a 128-bit division above 1.3e8.
 */
#include "codec_internal.h"

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

/* 5^n for n in 0..27, the powers of five that fit in 64 bits. */
static const uint64_t pow5_u64[28] = {
    1ULL,
    5ULL,
    25ULL,
    125ULL,
    625ULL,
    3125ULL,
    15625ULL,
    78125ULL,
    390625ULL,
    1953125ULL,
    9765625ULL,
    48828125ULL,
    244140625ULL,
    1220703125ULL,
    6103515625ULL,
    30517578125ULL,
    152587890625ULL,
    762939453125ULL,
    3814697265625ULL,
    19073486328125ULL,
    95367431640625ULL,
    476837158203125ULL,
    2384185791015625ULL,
    11920928955078125ULL,
    59604644775390625ULL,
    298023223876953125ULL,
    1490116119384765625ULL,
    7450580596923828125ULL,
};

/* ---------------------------------------------------------------- scaling */

/* floor(x * 2^e2 * 10^-k) and whether that is exact. */
typedef struct {
    uint64_t floor;
    bool exact;
} scaled;

/* floor(p / 2^r) of the 192-bit p = p2:p1:p0, 64 <= r < 192, when it fits
 * in 64 bits. */
static scaled shift192(uint64_t p2, uint64_t p1, uint64_t p0, int r)
{
    u128 hi = (u128)p2 << 64 | p1;
    int s = r - 64; /* 0 <= s < 128 */
    scaled out = {(uint64_t)(hi >> s), p0 == 0};
    if (s)
        out.exact &= (u128)(hi << (128 - s)) == 0;
    return out;
}

/* floor(p / 2^r) and whether it is exact, 0 < r < 128, in 64-bit halves
 * (a 128-bit shift by a variable count costs several branches). */
static inline scaled shift_right(u128 p, int r)
{
    uint64_t lo = (uint64_t)p, hi = (uint64_t)(p >> 64);
    scaled out;
    if (r < 64) { /* |v| above about 6e-8 */
        out.floor = lo >> r | hi << 1 << (63 - r);
        out.exact = lo << 1 << (63 - r) == 0;
    } else {
        out.floor = hi >> (r - 64);
        out.exact = lo == 0 && hi << 1 << (127 - r) == 0;
    }
    return out;
}

/* x * 5^n >> r for n > 27 (|v| < 2^-89): x * 5^27 * 5^(n-27), a 192-bit
 * product. */
__attribute__((noinline)) static scaled scale_tiny(uint64_t x, int n, int r)
{
    u128 a = (u128)x * pow5_u64[27];
    uint64_t m = pow5_u64[n - 27];
    u128 lo = (u128)(uint64_t)a * m, hi = (u128)(uint64_t)(a >> 64) * m;
    hi += lo >> 64;
    return shift192((uint64_t)(hi >> 64), (uint64_t)hi, (uint64_t)lo, r);
}

/* x * 2^(e2-k) / 5^k for k > 0 (|v| >= 2^27): one 128-bit division. */
__attribute__((noinline)) static scaled scale_large(uint64_t x, int e2, int k)
{
    u128 num = x, den = k <= 27 ? pow5_u64[k] : (u128)pow5_u64[27] * pow5_u64[k - 27];
    if (e2 >= k)
        num <<= e2 - k;
    else
        den <<= k - e2;
    scaled out = {(uint64_t)(num / den), num % den == 0};
    return out;
}

/*
 * floor(x * 2^e2 * 10^-k) for x < 2^57, where the result has at most 10
 * digits (k was chosen so), exactly.
 *   k <= 0: x * 5^n * 2^(e2+n) with n = -k; e2 + n < 0 for every float32.
 *   k > 0:  x * 2^(e2-k) / 5^k, as one 128-bit division (v >= 2^27).
 */
static inline scaled scale(uint64_t x, int e2, int k)
{
    if (k <= 0) {
        int n = -k, r = -(e2 + n);
        if (n <= 27) /* r < 128 here: |v| >= 2^-89 */
            return shift_right((u128)x * pow5_u64[n], r);
        return scale_tiny(x, n, r);
    }
    return scale_large(x, e2, k);
}

/* floor(n * log10(2)) and floor(n * log10(2) + log10(3/4)), exactly for
 * |n| <= 200 (78913 / 2^18 is log10(2) to 7 digits, 32752 / 2^18 is
 * -log10(3/4) to 5), which covers every float32 exponent. */
static inline int floor_log10_pow2(int n)
{
    return (n * 78913) >> 18; /* >> of a negative int: arithmetic (gcc, clang) */
}

static inline int floor_log10_three_quarters_pow2(int n)
{
    return (n * 78913 - 32752) >> 18;
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
 * bytes whatever n is: callers have CODEC_FLOAT_TEXT_MAX bytes of room and
 * overwrite what lies past the digits. */
__attribute__((always_inline)) static inline void put_digits(char *w, uint32_t x, int n)
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

/* The first 8 bytes of z zeros (z <= 4) followed by the n digits of x, as
 * memcpy(w, "0000", 4) and put_digits(w + z, x, n) leave them at w, the
 * first in the lowest byte. */
static inline uint64_t zeros_digits8(uint32_t x, int n, int z)
{
    uint64_t text = n == 9 ? (uint64_t)('0' + x / 100000000) | ascii8(x % 100000000) << 8
                           : ascii8(x) >> (8 * (8 - n));
    uint64_t zeros = UINT64_C(0x30303030) & ((UINT64_C(1) << (8 * z)) - 1);
    return zeros | text << (8 * z);
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
    if (sci >= -4 && sci < 16 && n > sci + 1) {
        /* 0.000ddd and dd.ddd in one way, since values on either side of
         * 1 alternate at random: z zeros and the digits at w + 1, then the
         * first p of them one place left and the point after them */
        int neg = sci >> 31; /* -1 below 1, else 0: no branch */
        int z = -sci & neg, p = (1 & neg) | ((sci + 1) & ~neg);
        memcpy(w + 1, "0000", 4);
        put_digits(w + 1 + z, digits, n);
        if (p < 8) {
            /* in one word: the first p bytes from one place right, the
             * point, the rest where they are (the bytes at w + 1 from
             * registers: read back, they would wait for the two stores
             * above, which a load across both cannot take its bytes from) */
            uint64_t right = zeros_digits8(digits, n, z);
            uint64_t keep = (UINT64_C(1) << (8 * p)) - 1;
            uint64_t word = (right & keep) | (uint64_t)'.' << (8 * p) | (right & ~keep) << 8;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            word = __builtin_bswap64(word);
#endif
            memcpy(w, &word, 8);
        } else {
            memmove(w, w + 1, 8);
            w[8] = '.';
        }
        return w + z + n + 1;
    }
    if (sci >= 0 && sci < 16) { /* ddd000.0 */
        put_digits(w, digits, n);
        w += n;
        for (int i = n; i <= sci; i++)
            *w++ = '0';
        memcpy(w, ".0", 2);
        return w + 2;
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

/* ------------------------------------------------------------- the search */

/* The ends of what reads back as v, in units of 2^e2, and whether each
 * end itself does. */
typedef struct {
    uint64_t lo, v2, hi; /* v2: twice v, so that "nearer" is exact too */
    int e2;
    bool inclusive;      /* both ends read back as v (its last bit is 0) */
    bool irregular;      /* v is a power of two: the gap below is half */
} interval;

static interval interval_of(uint32_t c, int q, bool irregular)
{
    interval iv;
    iv.inclusive = (c & 1) == 0;
    iv.irregular = irregular;
    if (c >= 0x800000u && !irregular) {
        /* a normal float not a power of two, nearly every one: both
         * midpoints have 25 bits, so half a double's unit is 2^(q-30) */
        iv.e2 = q - 30;
        /* +-1 as arithmetic: the last bit is a coin toss for a branch */
        iv.lo = (((uint64_t)c * 2 - 1) << 29) + 1 - 2 * (uint64_t)iv.inclusive;
        iv.hi = (((uint64_t)c * 2 + 1) << 29) - 1 + 2 * (uint64_t)iv.inclusive;
        iv.v2 = (uint64_t)c << 31;
        return iv;
    }
    /* the midpoints to the neighbours: m_lo * 2^e_lo and (2c+1) * 2^(q-1) */
    uint64_t m_lo = irregular ? 4 * (uint64_t)c - 1 : 2 * (uint64_t)c - 1;
    int e_lo = irregular ? q - 2 : q - 1;
    uint64_t m_hi = 2 * (uint64_t)c + 1;
    int b_lo = 64 - __builtin_clzll(m_lo), b_hi = 64 - __builtin_clzll(m_hi);
    /* half a double's unit at the lower midpoint (the finer of the two) */
    int e2 = b_lo - 1 + e_lo - 53;
    uint64_t mid_lo = m_lo << (e_lo - e2), mid_hi = m_hi << (q - 1 - e2);
    uint64_t half_hi = UINT64_C(1) << (b_hi - 1 + q - 1 - 53 - e2);
    iv.lo = iv.inclusive ? mid_lo - 1 : mid_lo + 1;
    iv.hi = iv.inclusive ? mid_hi + half_hi : mid_hi - half_hi;
    iv.v2 = (uint64_t)c << (q - e2 + 1);
    iv.e2 = e2;
    return iv;
}

/* The integers inside the scaled interval [L, H] (or (L, H)): first..last. */
typedef struct {
    uint64_t first, last;
} integers;

static inline integers integers_inside(scaled L, scaled H, bool inclusive)
{
    integers in = {L.floor + !(L.exact && inclusive), H.floor - (H.exact && !inclusive)};
    return in;
}

static inline bool inside(uint64_t x, integers in)
{
    return x - in.first <= in.last - in.first; /* in.first <= x <= in.last */
}

/* The shortest decimal digits * 10^*exp10 inside iv, nearest v among
 * those; digits has at most 9 digits and no trailing zero. */
static uint32_t shortest(const interval *iv, int q, int *exp10)
{
    int k = iv->irregular ? floor_log10_three_quarters_pow2(q) : floor_log10_pow2(q);
    scaled L, H, V2;
    int n = -k, r = -(iv->e2 + n);
    if (k <= 0 && n <= 27 && r < 64) {
        /* |v| from about 6e-8 to 1.3e8, nearly every float a client sees:
         * one power of five, one shift for the three */
        uint64_t m = pow5_u64[n];
        u128 pl = (u128)iv->lo * m, ph = (u128)iv->hi * m, pv = (u128)iv->v2 * m;
        L = (scaled){(uint64_t)(pl >> r), (uint64_t)pl << 1 << (63 - r) == 0};
        H = (scaled){(uint64_t)(ph >> r), (uint64_t)ph << 1 << (63 - r) == 0};
        V2 = (scaled){(uint64_t)(pv >> r), (uint64_t)pv << 1 << (63 - r) == 0};
    } else {
        L = scale(iv->lo, iv->e2, k);
        H = scale(iv->hi, iv->e2, k);
        V2 = scale(iv->v2, iv->e2, k);
    }
    integers in = integers_inside(L, H, iv->inclusive);
    /* the interval is 1 to 10 units wide: at most one multiple of 10 */
    uint64_t s = V2.floor >> 1, s10 = s / 10, sp10 = s10 * 10, tp10 = sp10 + 10, d;
    bool sp_in = inside(sp10, in), tp_in = inside(tp10, in);
    bool s_in = inside(s, in), t_in = inside(s + 1, in);
    /* both s and s+1 inside: the nearer, by the bit of 2v below s (ties to
     * even); s+1 then ends in no 0, or it would be tp10 */
    uint64_t up = t_in & ((uint64_t)!s_in | ((V2.floor & 1) & ((uint64_t)!V2.exact | (s & 1))));
    /* which of the two cases is a coin toss: selected, not branched */
    bool shorter = sp_in | tp_in;
    uint64_t short_d = s10 + !sp_in, full_d = s + up;
    uint64_t pick = -(uint64_t)shorter; /* all ones or zero */
    d = (short_d & pick) | (full_d & ~pick);
    k += shorter;
    while (d % 10 == 0) { /* v is a short decimal itself, 0.5 or 3.0 */
        d /= 10;
        k++;
    }
    *exp10 = k;
    return (uint32_t)d;
}

char *codec_float_text(float f, char *out)
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
    uint32_t c = biased ? frac | 0x800000u : frac;
    int q = biased ? (int)biased - 150 : -149;
    interval iv = interval_of(c, q, frac == 0 && biased > 1);
    int exp10;
    uint32_t digits = shortest(&iv, q, &exp10);
    return put_decimal(w, digits, count_digits(digits), exp10);
}
