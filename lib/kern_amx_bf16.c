/*
 * libattn's bfloat16 kernel with Intel's AMX tiles (AMX-TILE, AMX-BF16:
 * Sapphire Rapids and later), run only where the avx512 kernel runs, the
 * CPU has AVX512_BF16, AVX512BW and the tiles, and Linux granted this
 * process the tile state (cpu_amx_request; attn_kern_bf16_of checks all
 * of it). Its vectors, row steps and conversions are the vdpbf16ps
 * kernel's (kern_avx512_ops.h, kern_body_bf16.h); only the products,
 * gemm2, are tiles:
 *
 *   C [rows, cols] (+)= A [rows, kdim words] B [kdim words, cols]
 *   rows <= KMR <= 16; tiles 0 .. 3 C [rows, 16 floats] (four blocks of
 *   columns at once), 4 A [rows, 16 words], 5 and 6 B [16 words, 16
 *   columns]; one tdpbf16ps per block and 16 words of the sum.
 *
 * The numbers are not the other kernels' bits: tdpbf16ps flushes a
 * subnormal product, adds a word's two products together and rounds that
 * once before it meets the accumulator,
 *   acc = fl(acc + fl(ftz(a_lo b_lo) + ftz(a_hi b_hi)))   (one word)
 * where vdpbf16ps adds them to the accumulator one after the other, and
 * over the 16 words of one instruction the tile associates its sums its
 * own way. Those are differences of summation order within float32
 * rounding. (A product of one row, a decode's query, runs on vdpbf16ps
 * instead, with its bits: a tile would do a sixteenth of its work.) tests/test_bf16.c checks one word's step bit for bit against
 * that model, a chain within float32's bound for any order, and whole
 * calls against the double reference (which allows any order); where the
 * CPU has no AMX, it says it skipped them.
 *
 * Compiled with -mamx-tile -mamx-bf16 besides the vdpbf16ps kernel's
 * flags (see Makefile); nothing here runs unless the checks above pass.
 *
 * Defines (names pasted by KF): attn_kern_bf16_amx, and its gemm2_amx,
 * bf16_rows_amx, bf16_row_pairs_amx, bf16_pack_t_amx,
 * forward_tile_bf16_amx, backward_tile_bf16_amx.
 */
#if defined(__x86_64__)

#define KF(name) name##_amx
#define KERN_KIND ATTN_KERNEL_AVX512
#define KMR 6
#define VW 16

#include "kern_avx512_ops.h"

#define KERN_BF16_PATH ATTN_BF16_AMX
#define KMR2 6
#define KNV2 4
/* Tiles neither read nor set the MXCSR. */
#define KERN_BF16_BEGIN ((void)0)
#define KERN_BF16_END ((void)0)

#include "kern_bf16_weights_avx512.h"

/* The tile configuration's memory form (palette 1). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

_Static_assert(sizeof(amx_config) == 64, "the tile configuration is 64 bytes");
_Static_assert(KMR <= 16, "a tile holds at most 16 rows");

/* dst [rows, 16] (row stride 16) = words t0 .. t0 + 15 of each row of src
 * (element (r, t) at src[r * rs + t * cs]), zero past n of them: a tile's
 * rows where they cannot be read in place. */
static inline void KF(tile_words)(const uint32_t *src, int64_t rs, int64_t cs, int rows,
                                  int64_t t0, int n, uint32_t *dst)
{
    const __mmask16 m = (__mmask16)((1u << n) - 1u);
    const __m512i step = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7,
                                                             6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)cs));
    for (int r = 0; r < rows; r++) {
        const uint32_t *row = src + r * rs + t0 * cs;
        __m512i x = cs == 1 ? _mm512_maskz_loadu_epi32(m, row)
                            : _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, step, row, 4);
        _mm512_store_si512(dst + r * 16, x);
    }
}

/* The rows the calling thread's tile configuration has (0: none yet).
 * Loading a configuration stalls the tiles, so a thread keeps its own
 * across calls and loads another only when a call has other rows; nothing
 * else in libattn configures tiles, and Linux keeps a thread's across
 * switches. */
static _Thread_local int KF(configured_rows);

static void KF(configure)(int rows)
{
    if (KF(configured_rows) == rows)
        return;
    _Alignas(64) amx_config cfg = {.palette = 1};
    for (int t = 0; t < 5; t++) { /* C blocks 0 .. 3, A */
        cfg.rows[t] = (uint8_t)rows;
        cfg.colsb[t] = 64;
    }
    for (int t = 5; t < 7; t++) { /* B, two to alternate */
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    KF(configured_rows) = rows;
}

/*
 * C [rows, cols] (+)= A B on words, as kern_body_bf16.h's gemm2: A's
 * element (r, p) at a[r * a_rs + p * a_cs], B [kdim, cols] (row stride
 * ldb), C row stride ldc. Up to four blocks of 16 columns at a time, each
 * its own C tile (tiles 0 .. 3: four independent sums, so that one
 * tdpbf16ps need not wait for the last); per 16 words of the sum, one tile
 * of A (4) for all of them and one of B per block (5 and 6 in turn). Whole
 * tiles are read and written in place; a tile cut short (the sum's last
 * words, C's last columns, A transposed) goes through a copy padded with
 * zero words (a zero pair adds 0 to the sum).
 */
/* One row (a decode's query): a tile would do 1/16 of its work, so the row
 * runs on vdpbf16ps, as the vdpbf16ps kernel's one-row block does, with
 * its bits. */
static void KF(gemm2_row)(int64_t cols, int64_t kdim, const uint32_t *a, int64_t a_cs,
                          const uint32_t *b, int64_t ldb, float *c, bool accumulate)
{
    for (int64_t c0 = 0; c0 < cols; c0 += 64) {
        __m512 acc[4];
        __mmask16 m[4];
        for (int v = 0; v < 4; v++) {
            const int64_t left = cols - c0 - 16 * v;
            m[v] = left <= 0 ? 0 : left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1u);
            acc[v] = accumulate ? _mm512_maskz_loadu_ps(m[v], c + c0 + 16 * v)
                                : _mm512_setzero_ps();
        }
        for (int64_t p = 0; p < kdim; p++) {
            const __m512i x = _mm512_set1_epi32((int)a[p * a_cs]);
            for (int v = 0; v < 4; v++)
                if (m[v] != 0)
                    acc[v] = _mm512_dpbf16_ps(
                        acc[v], (__m512bh)x,
                        (__m512bh)_mm512_maskz_loadu_epi32(m[v], b + p * ldb + c0 + 16 * v));
        }
        for (int v = 0; v < 4; v++)
            if (m[v] != 0)
                _mm512_mask_storeu_ps(c + c0 + 16 * v, m[v], acc[v]);
    }
}

static void KF(gemm2)(int rows, int64_t cols, int64_t kdim, const uint32_t *a, int64_t a_rs,
                      int64_t a_cs, const uint32_t *b, int64_t ldb, float *c, int64_t ldc,
                      bool accumulate)
{
    if (rows == 1) {
        KF(gemm2_row)(cols, kdim, a, a_cs, b, ldb, c, accumulate);
        return;
    }
    _Alignas(64) uint32_t at[KMR * 16], bt[2][16 * 16];
    _Alignas(64) float ct[4][KMR * 16];
    KF(configure)(rows);
    for (int64_t g0 = 0; g0 < cols; g0 += 64) {
        int w[4] = {0, 0, 0, 0};
        for (int j = 0; j < 4; j++) {
            const int64_t left = cols - g0 - 16 * j;
            w[j] = left <= 0 ? 0 : left < 16 ? (int)left : 16;
        }
#define AMX_C_LOAD(j)                                                                      \
    if (w[j] > 0) {                                                                        \
        float *cj = c + g0 + 16 * (j);                                                     \
        if (!accumulate) {                                                                 \
            _tile_zero(j);                                                                 \
        } else if (w[j] == 16) {                                                           \
            _tile_loadd(j, cj, ldc * 4);                                                   \
        } else {                                                                           \
            const __mmask16 cm = (__mmask16)((1u << w[j]) - 1u);                           \
            for (int r = 0; r < rows; r++)                                                 \
                _mm512_store_ps(ct[j] + r * 16, _mm512_maskz_loadu_ps(cm, cj + r * ldc));  \
            _tile_loadd(j, ct[j], 64);                                                     \
        }                                                                                  \
    }
        AMX_C_LOAD(0)
        AMX_C_LOAD(1)
        AMX_C_LOAD(2)
        AMX_C_LOAD(3)
#undef AMX_C_LOAD
        for (int64_t p0 = 0; p0 < kdim; p0 += 16) {
            const int n = kdim - p0 < 16 ? (int)(kdim - p0) : 16;
            if (n == 16 && a_cs == 1) {
                _tile_loadd(4, a + p0, a_rs * 4);
            } else {
                KF(tile_words)(a, a_rs, a_cs, rows, p0, n, at);
                _tile_loadd(4, at, 64);
            }
#define AMX_STEP(j, tb)                                                                    \
    if (w[j] > 0) {                                                                        \
        const uint32_t *bj = b + p0 * ldb + g0 + 16 * (j);                                 \
        if (n == 16 && w[j] == 16) {                                                       \
            _tile_loadd(tb, bj, ldb * 4);                                                  \
        } else {                                                                           \
            uint32_t *buf = bt[(j) & 1];                                                   \
            KF(tile_words)(bj, ldb, 1, n, 0, w[j], buf);                                   \
            for (int t = n; t < 16; t++) /* B's rows past the sum's end are zero too */    \
                _mm512_store_si512(buf + t * 16, _mm512_setzero_si512());                  \
            _tile_loadd(tb, buf, 64);                                                      \
        }                                                                                  \
        _tile_dpbf16ps(j, 4, tb);                                                          \
    }
            AMX_STEP(0, 5)
            AMX_STEP(1, 6)
            AMX_STEP(2, 5)
            AMX_STEP(3, 6)
#undef AMX_STEP
        }
#define AMX_C_STORE(j)                                                                     \
    if (w[j] > 0) {                                                                        \
        float *cj = c + g0 + 16 * (j);                                                     \
        if (w[j] == 16) {                                                                  \
            _tile_stored(j, cj, ldc * 4);                                                  \
        } else {                                                                           \
            const __mmask16 cm = (__mmask16)((1u << w[j]) - 1u);                           \
            _tile_stored(j, ct[j], 64);                                                    \
            for (int r = 0; r < rows; r++)                                                 \
                _mm512_mask_storeu_ps(cj + r * ldc, cm, _mm512_load_ps(ct[j] + r * 16));   \
        }                                                                                  \
    }
        AMX_C_STORE(0)
        AMX_C_STORE(1)
        AMX_C_STORE(2)
        AMX_C_STORE(3)
#undef AMX_C_STORE
    }
}

#define KERN_BF16_OWN_GEMM2
#include "kern_body_bf16.h"

#endif /* __x86_64__ */
