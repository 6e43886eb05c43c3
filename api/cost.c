/*
 * What a request costs, from its shapes alone: the work that --max-work
 * bounds and the bytes that --max-response bounds, both known before a byte
 * of the answer is computed.
 *
 * Work is counted in FLOP-equivalents: a term's price is the number of
 * FLOPs libattn's attention kernel does (on its matrix products, ~10
 * GFLOP/s a core on the development machine) in the time that term takes.
 * The nominal FLOPs alone said nothing of requests whose cost is elsewhere:
 * 800000 heads of width 1 are 1.6e7 FLOPs but 800000 separate softmaxes,
 * products and joins; q [8191, 1] with return_weights is 2.7e8 FLOPs but a
 * 939 MB answer to write; d = 1 makes every score an exponential and a mask
 * lookup with one multiply-add beside it.
 *
 * The prices were measured one term at a time, with everything else small,
 * on one thread (min of 3 runs; 2-core Xeon, OpenBLAS Prescott kernels):
 *
 *   term                    measured                         price (FLOP-eq)
 *   (batch, head) pair      B*H = 200000, n = d = 1: 1.0 us   12000
 *   query row               n_q = 200000, n_k = 1: 165 ns       2000
 *   score                   n = 4096, d = 1: 4.6-5.8 ns           60
 *   explicit mask, a score  bias [2048, 2048]: +2.8 ns            40
 *   statistics, a score     n = 4096, d = 1: +4.7 ns              60
 *   weight materialised     n = 2048, d = 1: +1.8 ns              24
 *   weight head-averaged    one double add per head               10
 *   projection product call 40000 heads of width 1: ~0.4 us     5000
 *   head passed over in the  x [2, 1], 800000 heads of width 1,
 *     concatenating join     no w_o: 5e9 passes, 39 s: 7.8 ns     80
 *   backward pass           products 2.5x, the rest 1-2x        x3.5 in all
 *   number as text          nested or flat: 140 ns              1700
 *   number in base64        5.3 bytes at ~0.5 ns                  48
 *   body byte decoded       ~4 ns                                 48
 *
 * The prices are upper ends of what was measured (the machine is shared)
 * rounded up, so that the work bounds time from above: a request of W units
 * takes about W / 1e10 seconds of one core, or less. They depend on the CPU
 * and on libattn's kernels; tests/test_api.c checks, on the machine it runs
 * on, that time per unit of work stays within one band across requests
 * whose costs lie in entirely different terms.
 */
#include "request.h"

#include <math.h>

#define PRICE_PAIR 12000.0
#define PRICE_ROW 2000.0
#define PRICE_SCORE 60.0
#define PRICE_MASK 40.0
#define PRICE_STATS 60.0
#define PRICE_WEIGHT 24.0
#define PRICE_AVERAGE 10.0
#define PRICE_PRODUCT 5000.0
#define PRICE_VISIT 80.0
#define BACKWARD_FACTOR 3.5
#define PRICE_TEXT_NUMBER 1700.0
#define PRICE_BASE64_NUMBER 48.0
#define PRICE_BODY_BYTE 48.0

double api_compute_work(const api_cost_terms *t, bool stats, bool backward)
{
    double per_score = PRICE_SCORE + (t->masked ? PRICE_MASK : 0);
    double work = t->flops + t->pairs * PRICE_PAIR + t->rows * PRICE_ROW +
                  t->scores * per_score + t->products * PRICE_PRODUCT +
                  t->visits * PRICE_VISIT;
    /* The backward pass redoes the forward's scores and adds its own
     * products; the statistics and the weights come from the forward only. */
    if (backward)
        work *= BACKWARD_FACTOR;
    return work + (stats ? t->scores * PRICE_STATS : 0) + t->weights * PRICE_WEIGHT +
           t->averaged * PRICE_AVERAGE;
}

double api_encode_work(double numbers, api_encoding enc)
{
    bool text = enc == API_ENC_NESTED || enc == API_ENC_FLAT;
    return numbers * (text ? PRICE_TEXT_NUMBER : PRICE_BASE64_NUMBER);
}

double api_decode_work(size_t len)
{
    return (double)len * PRICE_BODY_BYTE;
}

/* The longest text of a float32 (api_float_text: "-1000206000000000.0")
 * and its comma. */
#define TEXT_NUMBER_MAX 20.0

double api_encoded_bytes(int rank, const int64_t *shape, api_encoding enc)
{
    double count = 1, shape_text = 2;
    for (int i = 0; i < rank; i++) {
        count *= (double)shape[i];
        shape_text += 21; /* an int64 and its comma */
    }
    switch (enc) {
    case API_ENC_BASE64:
    case API_ENC_BASE64_F16:
    case API_ENC_BASE64_BF16: {
        /* {"shape":[...],"dtype":"bfloat16","base64":"..."} */
        double bytes = count * (enc == API_ENC_BASE64 ? 4 : 2);
        return 48 + shape_text + 4 * ceil(bytes / 3);
    }
    case API_ENC_FLAT:
        /* {"shape":[...],"data":[...]} */
        return 24 + shape_text + count * TEXT_NUMBER_MAX;
    case API_ENC_NESTED:
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
