/* attn_bf16_round: bfloat16 rounding as ATTN_PRECISION_BFLOAT16 applies
 * it to the operands of its products (bf16.h states it). */
#include "attn.h"
#include "bf16.h"

float attn_bf16_round(float x)
{
    return bf16_round(x);
}
