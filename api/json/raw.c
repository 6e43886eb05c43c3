/*
 * Tensors as raw bytes: little-endian, row-major, no padding, each element
 * in its native size (float32 four bytes, float16 and bfloat16 two, bool
 * one). The form binary protocols carry tensors in, beside the JSON text.
 */
#include "codec_internal.h"

#include <stdint.h>
#include <string.h>

size_t codec_dtype_size(codec_dtype dtype)
{
    return dtype == CODEC_F32 ? 4 : dtype == CODEC_BOOL ? 1 : 2;
}

/* The machine's byte order decides whether float32 bytes are copied or
 * turned around. */
static bool little_endian(void)
{
    const uint32_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}

void codec_tensor_from_bytes(codec_dtype dtype, const uint8_t *in, float *out, size_t count)
{
    if (dtype == CODEC_F16 || dtype == CODEC_BF16) {
        codec_half_to_f32(dtype, in, out, count, codec_half_path_in_use());
        return;
    }
    if (little_endian()) {
        memcpy(out, in, count * 4);
        return;
    }
    for (size_t i = 0; i < count; i++) {
        uint32_t u = (uint32_t)in[4 * i] | (uint32_t)in[4 * i + 1] << 8 |
                     (uint32_t)in[4 * i + 2] << 16 | (uint32_t)in[4 * i + 3] << 24;
        memcpy(&out[i], &u, 4);
    }
}

void codec_tensor_to_bytes(codec_dtype dtype, const float *in, uint8_t *out, size_t count)
{
    if (dtype == CODEC_F16 || dtype == CODEC_BF16) {
        codec_f32_to_half(dtype, in, out, count, codec_half_path_in_use());
        return;
    }
    if (little_endian()) {
        memcpy(out, in, count * 4);
        return;
    }
    for (size_t i = 0; i < count; i++) {
        uint32_t u;
        memcpy(&u, &in[i], 4);
        for (int b = 0; b < 4; b++)
            out[4 * i + b] = (uint8_t)(u >> (8 * b));
    }
}

void codec_tensor_round(codec_dtype dtype, float *x, size_t count)
{
    if (dtype != CODEC_F16 && dtype != CODEC_BF16)
        return;
    uint8_t chunk[2 * 256];
    for (size_t i = 0; i < count; i += 256) {
        size_t n = count - i < 256 ? count - i : 256;
        codec_tensor_to_bytes(dtype, x + i, chunk, n);
        codec_tensor_from_bytes(dtype, chunk, x + i, n);
    }
}

void codec_buf_raw(codec_buf *b, codec_dtype dtype, const float *x, size_t count)
{
    size_t n = count * codec_dtype_size(dtype);
    /* the exact room at once: a large tensor is written in one pass into
     * memory that grew once, not through a series of doublings */
    codec_buf_hint(b, n);
    char *w = codec_buf_reserve(b, n);
    if (!w)
        return;
    codec_tensor_to_bytes(dtype, x, (uint8_t *)w, count);
    b->len += n;
    b->data[b->len] = '\0';
}
