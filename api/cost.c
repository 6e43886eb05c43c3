/*
 * What a request costs, from its shapes alone: the work that --max-work
 * bounds and the bytes that --max-response bounds, both known before a byte
 * of the answer is computed.
 *
 * Work is counted in FLOP-equivalents: a term's price is the number of
 * FLOPs libattn's attention kernel does (on its products, ~2e10 a second on
 * one core of the development machine with the AVX2 or AVX-512 kernels) in
 * the time that term takes. The nominal FLOPs alone said nothing of
 * requests whose cost is elsewhere: 800000 heads of width 1 are 1.6e7 FLOPs
 * but 800000 separate softmaxes; q [8191, 1] with return_weights is 2.7e8
 * FLOPs but a 939 MB answer to write; d = 1 makes every score an
 * exponential and a mask lookup with one multiply-add beside it.
 *
 * The prices were measured one term at a time, with everything else small,
 * on one thread (min of 3 runs; 2-core Xeon with AVX-512, OpenBLAS Prescott
 * kernels; ns at the AVX-512 / AVX2 / generic kernels):
 *
 *   term                    measured                          price (FLOP-eq)
 *   (batch, head) pair      B*H = 200000, n = d = 1: 950/620/420 ns  22000
 *   query row               n_q = 200000, n_k = 1: 190/130/50 ns      3600
 *   score                   n = 4096, d = 1: 4.6/4.8/30 ns              64
 *   explicit mask, a score  bias [1024, 1024]                           80
 *   statistics, a score     n = 4096, d = 1: +7.6/+12/+3 ns            330
 *   weight materialised     n = 4096, d = 1: +3.4/+2.2/+5 ns            48
 *   weight head-averaged    one double add per head                     10
 *   soft-capped score       n = 4096, d_k = 2: +2.1-3.8 ns (backward
 *                             +3.4-8.8 ns more)                         80
 *   ALiBi score, forward    n = 4096, d_k = 2: +0.5-0.7 ns              20
 *   ALiBi score, forward    +10-22 ns (almost all in libattn's
 *     and backward            backward pass; not times 3.5)            480
 *   RoPE angle (position,   n_q = 1, n_k = 200000, d_k = 64 against
 *     pair): cos and sin      32 heads of n_k = 20000: 165-225 ns      5000
 *   RoPE element turned     (the same two runs): 9-21 ns              400
 *   bfloat16 product FLOP   n = 1024, d = 64, one head, against the
 *     (precision bfloat16)    float32 forward and backward of the same
 *                             run: vdpbf16ps 0.55-0.8x; emulated
 *                             AVX-512 1.2-1.35x, AVX2 1.5x, generic
 *                             11-17x (C steps)          0.8 / 1.5 / 2 / 18
 *   element rounded to      the rounding and packing of q, k, v: about
 *     bfloat16                1 ns an element at n = 2048, d = 64          40
 *   window                  scores: the band and the 64-key tiles its
 *                             edges cut (api/variants.c); [0, 0] over
 *                             n = 65536: 500-650 ns a row
 *   backward pass           products 2.5x, the rest 1-3x       x3.5 in all
 *   number as text          nested or flat: ~140 ns                   3000
 *   number in base64        5.3 bytes at ~0.5 ns                        96
 *   body byte decoded       ~4 ns                                       96
 *
 * (The variants' rows were measured with the AVX-512 kernel while the
 * machine ran 8 to 17 other jobs.) The prices are the upper ends of what
 * was measured (the machine is shared) rounded up, so that the work bounds
 * time from above: a request of W units takes about W / 2e10 seconds of one core, or less (the generic
 * kernel does its products three times slower, and everything else at about
 * the same speed, so its scores cost more and the rest less than priced).
 * The prices depend on the CPU and on libattn's kernels: tests/test_api.c
 * checks, on the machine it runs on and with each kernel, that time per unit
 * of work stays within one band across requests whose costs lie in
 * entirely different terms.
 */
#include "request.h"

#include <math.h>

#define PRICE_PAIR 22000.0
#define PRICE_ROW 3600.0
#define PRICE_SCORE 64.0
#define PRICE_MASK 80.0
#define PRICE_STATS 330.0
#define PRICE_WEIGHT 48.0
#define PRICE_AVERAGE 10.0
#define PRICE_SOFTCAP 80.0
#define PRICE_ALIBI 20.0
#define PRICE_ALIBI_BACKWARD 480.0
#define PRICE_ANGLE 5000.0
#define PRICE_ROTATED 400.0
#define BACKWARD_FACTOR 3.5
#define PRICE_TEXT_NUMBER 3000.0
#define PRICE_BASE64_NUMBER 96.0
#define PRICE_BODY_BYTE 96.0
#define PRICE_ROUNDED 40.0

/* A bfloat16 product FLOP, in float32 product FLOPs of the same kernel:
 * what the way libattn runs them costs (see the table above). */
static double bf16_flop_price(void)
{
    if (attn_bf16() == ATTN_BF16_AVX512_BF16 || attn_bf16() == ATTN_BF16_AMX)
        return 0.8;
    switch (attn_kernel()) {
    case ATTN_KERNEL_AVX512:
        return 1.5;
    case ATTN_KERNEL_AVX2:
        return 2.0;
    default:
        return 18.0;
    }
}

double api_compute_work(const api_cost_terms *t, bool stats, bool backward)
{
    double per_score = PRICE_SCORE + (t->masked ? PRICE_MASK : 0);
    double flops = t->flops - t->bf16_flops + t->bf16_flops * bf16_flop_price();
    double work = flops + t->pairs * PRICE_PAIR + t->rows * PRICE_ROW +
                  t->scores * per_score + t->softcapped * PRICE_SOFTCAP +
                  t->angles * PRICE_ANGLE + t->rotated * PRICE_ROTATED +
                  t->rounded * PRICE_ROUNDED;
    /* The backward pass redoes the forward's scores and adds its own
     * products; the statistics and the weights come from the forward only. */
    if (backward)
        work *= BACKWARD_FACTOR;
    /* ALiBi is nearly free forward and not backward (measured below): its
     * own price for each. */
    work += t->biased * (backward ? PRICE_ALIBI_BACKWARD : PRICE_ALIBI);
    return work + (stats ? t->scores * PRICE_STATS : 0) + t->weights * PRICE_WEIGHT +
           t->averaged * PRICE_AVERAGE;
}

double api_encode_work(double numbers, codec_encoding enc)
{
    bool text = enc == CODEC_ENC_NESTED || enc == CODEC_ENC_FLAT;
    return numbers * (text ? PRICE_TEXT_NUMBER : PRICE_BASE64_NUMBER);
}

double api_decode_work(size_t len)
{
    return (double)len * PRICE_BODY_BYTE;
}

/* The longest text of a float32 (codec_float_text: "-1000206000000000.0")
 * and its comma. */
#define TEXT_NUMBER_MAX 20.0

double api_encoded_bytes(int rank, const int64_t *shape, codec_encoding enc)
{
    double count = 1, shape_text = 2;
    for (int i = 0; i < rank; i++) {
        count *= (double)shape[i];
        shape_text += 21; /* an int64 and its comma */
    }
    switch (enc) {
    case CODEC_ENC_BASE64:
    case CODEC_ENC_BASE64_F16:
    case CODEC_ENC_BASE64_BF16: {
        /* {"shape":[...],"dtype":"bfloat16","base64":"..."} */
        double bytes = count * (enc == CODEC_ENC_BASE64 ? 4 : 2);
        return 48 + shape_text + 4 * ceil(bytes / 3);
    }
    case CODEC_ENC_FLAT:
        /* {"shape":[...],"data":[...]} */
        return 24 + shape_text + count * TEXT_NUMBER_MAX;
    case CODEC_ENC_NESTED:
        break;
    }
    /* Each array at depth i (there are shape[0] * ... * shape[i-1] of
     * them) has two brackets and at most shape[i] commas (the innermost's
     * are counted with the numbers). */
    double bytes = count * TEXT_NUMBER_MAX, arrays = 1;
    for (int i = 0; i < rank; i++) {
        bytes += arrays * (2 + (i + 1 < rank ? (double)shape[i] : 0));
        arrays *= (double)shape[i];
    }
    return bytes;
}
