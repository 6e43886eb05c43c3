/*
 * Rows of numbers 64 bytes at a time: which bytes of a block are digits,
 * points, minus signs, commas and whitespace, as one bit mask each (bit i:
 * byte i), and the grammar of a row checked on those masks with a few dozen
 * word operations.
 *
 * Why: read one number after another, the end of each is where the next
 * begins, so every number waits for the one before (a chain of dependent
 * loads and digit counts, ~50 cycles a number). From the masks the bounds of
 * all the numbers of a block are known at once, and the validator and the
 * reader (number.c) go through them without waiting.
 *
 * A block ends just after its last comma before any byte that is none of
 * those (a ']', an exponent's 'e', the end of the 64), so that it holds
 * whole numbers only. The callers check the text with the usual one-number
 * code wherever a block does not apply.
 *
 * The classification has one body per instruction set, at the width in
 * use (simd.c); the grammar is plain C on the masks.
 */
#include "codec_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ROW_SCAN_X86 1
#include <immintrin.h>
#endif

/* ---------------------------------------------------------- classifiers */

/* Portable, 8 bytes a word (SWAR). The high bit of each byte of `marks`
 * gathered into 8 bits, byte i to bit i: the multiplication moves the
 * high bit of byte i to bit 56 + i without carries between them. */
static inline uint64_t high_bits8(uint64_t marks)
{
    return ((marks & 0x8080808080808080u) >> 7) * 0x0102040810204080u >> 56;
}

/* High bit set in each byte of x that equals the byte c, and only there
 * (no borrow between bytes: the low 7 bits are added apart from the top). */
static inline uint64_t bytes_equal8(uint64_t x, unsigned char c)
{
    const uint64_t low7 = 0x7f7f7f7f7f7f7f7fu;
    uint64_t y = x ^ (0x0101010101010101u * c); /* 0 where equal */
    return ~(((y & low7) + low7) | y | low7);
}

static void classify_portable(const char *p, codec_row_block *b)
{
    *b = (codec_row_block){0};
    for (int i = 0; i < 8; i++) {
        uint64_t x = codec_load8(p + 8 * i);
        /* a digit: high nibble 3, and the low nibble plus 6 stays below 16 */
        uint64_t digit = bytes_equal8(x & 0xf0f0f0f0f0f0f0f0u, 0x30) &
                         ~(((x & 0x0f0f0f0f0f0f0f0fu) + 0x0606060606060606u) << 3);
        uint64_t space = bytes_equal8(x, ' ') | bytes_equal8(x, '\n') | bytes_equal8(x, '\r') |
                         bytes_equal8(x, '\t');
        int s = 8 * i;
        b->digit |= high_bits8(digit) << s;
        b->zero |= high_bits8(bytes_equal8(x, '0')) << s;
        b->point |= high_bits8(bytes_equal8(x, '.')) << s;
        b->minus |= high_bits8(bytes_equal8(x, '-')) << s;
        b->comma |= high_bits8(bytes_equal8(x, ',')) << s;
        b->space |= high_bits8(space) << s;
    }
}

#ifdef ROW_SCAN_X86
/* 16 bytes per step: baseline x86-64, no dispatch needed. */
static void classify_sse2(const char *p, codec_row_block *b)
{
    *b = (codec_row_block){0};
    for (int i = 0; i < 4; i++) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i));
        /* bytes - ('0' + 128): the digits become -128..-119, the rest above */
        __m128i t = _mm_sub_epi8(x, _mm_set1_epi8((char)('0' + 128)));
        __m128i digit = _mm_cmplt_epi8(t, _mm_set1_epi8(-128 + 10));
        __m128i space = _mm_or_si128(
            _mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8(' ')),
                         _mm_cmpeq_epi8(x, _mm_set1_epi8('\n'))),
            _mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8('\r')),
                         _mm_cmpeq_epi8(x, _mm_set1_epi8('\t'))));
        int s = 16 * i;
#define MASK16(v) ((uint64_t)(unsigned)_mm_movemask_epi8(v) << s)
        b->digit |= MASK16(digit);
        b->zero |= MASK16(_mm_cmpeq_epi8(x, _mm_set1_epi8('0')));
        b->point |= MASK16(_mm_cmpeq_epi8(x, _mm_set1_epi8('.')));
        b->minus |= MASK16(_mm_cmpeq_epi8(x, _mm_set1_epi8('-')));
        b->comma |= MASK16(_mm_cmpeq_epi8(x, _mm_set1_epi8(',')));
        b->space |= MASK16(space);
#undef MASK16
    }
}

__attribute__((target("avx2"))) static void classify_avx2(const char *p, codec_row_block *b)
{
    *b = (codec_row_block){0};
    for (int i = 0; i < 2; i++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * i));
        __m256i t = _mm256_sub_epi8(x, _mm256_set1_epi8((char)('0' + 128)));
        __m256i digit = _mm256_cmpgt_epi8(_mm256_set1_epi8(-128 + 10), t);
        __m256i space = _mm256_or_si256(
            _mm256_or_si256(_mm256_cmpeq_epi8(x, _mm256_set1_epi8(' ')),
                            _mm256_cmpeq_epi8(x, _mm256_set1_epi8('\n'))),
            _mm256_or_si256(_mm256_cmpeq_epi8(x, _mm256_set1_epi8('\r')),
                            _mm256_cmpeq_epi8(x, _mm256_set1_epi8('\t'))));
        int s = 32 * i;
#define MASK32(v) ((uint64_t)(uint32_t)_mm256_movemask_epi8(v) << s)
        b->digit |= MASK32(digit);
        b->zero |= MASK32(_mm256_cmpeq_epi8(x, _mm256_set1_epi8('0')));
        b->point |= MASK32(_mm256_cmpeq_epi8(x, _mm256_set1_epi8('.')));
        b->minus |= MASK32(_mm256_cmpeq_epi8(x, _mm256_set1_epi8('-')));
        b->comma |= MASK32(_mm256_cmpeq_epi8(x, _mm256_set1_epi8(',')));
        b->space |= MASK32(space);
#undef MASK32
    }
}

__attribute__((target("avx512f,avx512bw"))) static void classify_avx512(const char *p,
                                                                      codec_row_block *b)
{
    __m512i x = _mm512_loadu_si512((const void *)p);
    b->digit = _mm512_cmplt_epu8_mask(_mm512_sub_epi8(x, _mm512_set1_epi8('0')),
                                      _mm512_set1_epi8(10));
    b->zero = _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8('0'));
    b->point = _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8('.'));
    b->minus = _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8('-'));
    b->comma = _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8(','));
    b->space = _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8(' ')) |
               _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8('\n')) |
               _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8('\r')) |
               _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8('\t'));
}
#endif

/* ------------------------------------------------ points and minus signs */

/* What the reader of a noted block needs besides its numbers' bounds (which
 * the validator noted): which bytes are points and minus signs. Two byte
 * compares per vector, a fraction of a classification and no grammar. */
static void signs_portable(const char *p, uint64_t *point, uint64_t *minus)
{
    *point = *minus = 0;
    for (int i = 0; i < 8; i++) {
        uint64_t x = codec_load8(p + 8 * i);
        *point |= high_bits8(bytes_equal8(x, '.')) << 8 * i;
        *minus |= high_bits8(bytes_equal8(x, '-')) << 8 * i;
    }
}

#ifdef ROW_SCAN_X86
static void signs_sse2(const char *p, uint64_t *point, uint64_t *minus)
{
    *point = *minus = 0;
    for (int i = 0; i < 4; i++) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i));
        *point |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8('.')))
                  << 16 * i;
        *minus |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8('-')))
                  << 16 * i;
    }
}

__attribute__((target("avx2"))) static void signs_avx2(const char *p, uint64_t *point,
                                                        uint64_t *minus)
{
    *point = *minus = 0;
    for (int i = 0; i < 2; i++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * i));
        *point |= (uint64_t)(uint32_t)_mm256_movemask_epi8(
                      _mm256_cmpeq_epi8(x, _mm256_set1_epi8('.'))) << 32 * i;
        *minus |= (uint64_t)(uint32_t)_mm256_movemask_epi8(
                      _mm256_cmpeq_epi8(x, _mm256_set1_epi8('-'))) << 32 * i;
    }
}

__attribute__((target("avx512f,avx512bw"))) static void signs_avx512(const char *p,
                                                                   uint64_t *point,
                                                                   uint64_t *minus)
{
    __m512i x = _mm512_loadu_si512((const void *)p);
    *point = _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8('.'));
    *minus = _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8('-'));
}
#endif

void codec_row_signs_with(const char *p, uint64_t *point, uint64_t *minus, codec_simd simd)
{
    switch (simd) {
#ifdef ROW_SCAN_X86
    case CODEC_SIMD_SSE2: signs_sse2(p, point, minus); break;
    case CODEC_SIMD_AVX2: signs_avx2(p, point, minus); break;
    case CODEC_SIMD_AVX512: signs_avx512(p, point, minus); break;
#endif
    default: signs_portable(p, point, minus); break;
    }
}

void codec_row_signs(const char *p, uint64_t *point, uint64_t *minus)
{
    codec_row_signs_with(p, point, minus, codec_simd_in_use());
}

/* -------------------------------------------------------------- a block */

void codec_row_scan_with(const char *p, codec_row_block *b, codec_simd simd)
{
    switch (simd) {
#ifdef ROW_SCAN_X86
    case CODEC_SIMD_SSE2: classify_sse2(p, b); break;
    case CODEC_SIMD_AVX2: classify_avx2(p, b); break;
    case CODEC_SIMD_AVX512: classify_avx512(p, b); break;
#endif
    default: classify_portable(p, b); break;
    }
    /* The block: up to the last comma before the first byte of no class. */
    uint64_t other = ~(b->digit | b->point | b->minus | b->comma | b->space);
    uint64_t before = other ? (other & -other) - 1 : ~UINT64_C(0);
    uint64_t commas = b->comma & before;
    b->len = commas ? 64 - (unsigned)__builtin_clzll(commas) : 0;
    b->stop = other ? (unsigned)__builtin_ctzll(other) : 64;
    uint64_t keep = b->len == 64 ? ~UINT64_C(0) : (UINT64_C(1) << b->len) - 1;
    b->digit &= keep;
    b->zero &= keep;
    b->point &= keep;
    b->minus &= keep;
    b->comma &= keep;
    b->space &= keep;
}

void codec_row_scan(const char *p, codec_row_block *b)
{
    codec_row_scan_with(p, b, codec_simd_in_use());
}

/* The first byte that is not whitespace, from each bit of `from` on: a bit
 * at the start of a run of whitespace moves (by the carry of an addition)
 * just past the run; the others stay. The run must end inside the word. */
static inline uint64_t past_space(uint64_t from, uint64_t space)
{
    return (from & ~space) | (((from & space) + space) & ~space);
}

/*
 * True when the block (len > 0) is, after optional whitespace, numbers
 * -?(0|[1-9][0-9]*)(\.[0-9]+)? each followed by optional whitespace and a
 * comma: exactly what the one-number code accepts there. Every rule is a
 * mask that must come out empty.
 */
bool codec_row_grammar(const codec_row_block *b)
{
    uint64_t number = b->digit | b->point | b->minus;
    uint64_t starts = number & ~(number << 1), ends = number & ~(number >> 1);
    uint64_t text = number | b->comma; /* what is not whitespace */
    uint64_t bad = (text & -text) & ~number; /* the first thing is a number */
    bad |= b->minus & ~starts;               /* a sign only in front */
    bad |= (b->minus << 1) & ~b->digit;      /* and a digit after it */
    /* a digit before a point: not a start, and not after a sign (above) or
     * a point (below) */
    bad |= b->point & starts;
    uint64_t fraction = b->point << 1;       /* and one after it */
    bad |= fraction & ~b->digit;
    /* one point a number: the fraction's digits end on something else */
    bad |= ((b->digit + fraction) & ~b->digit) & b->point;
    /* no leading zero: a whole part that starts with 0 is just 0 */
    uint64_t whole = b->digit & ~(b->digit << 1) & ~fraction;
    bad |= ((whole & b->zero) << 1) & b->digit;
    /* after a number a comma; after a comma (but the last) a number */
    bad |= past_space(ends << 1, b->space) & ~b->comma;
    uint64_t last_comma = UINT64_C(1) << (b->len - 1);
    bad |= past_space((b->comma & ~last_comma) << 1, b->space) & ~number;
    return bad == 0;
}
