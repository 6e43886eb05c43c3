/*
 * Tensors out, in their three forms (nested arrays, the flat
 * {"shape", "data"} object, the {"shape", "dtype", "base64"} object),
 * written straight into the growing text of the answer.
 */
#include "codec_internal.h"

#include <string.h>

static void put_shape(codec_buf *b, int rank, const int64_t *shape)
{
    codec_buf_append(b, "[", 1);
    for (int i = 0; i < rank; i++)
        codec_buf_printf(b, i ? ",%lld" : "%lld", (long long)shape[i]);
    codec_buf_append(b, "]", 1);
}

/* n floats as "a,b,c" (no brackets), straight into the buffer. */
static void put_row(codec_buf *b, const float *x, int64_t n)
{
    /* in chunks, so that the reservation stays small for huge rows */
    while (n > 0) {
        int64_t k = n > 4096 ? 4096 : n;
        char *w = codec_buf_reserve(b, (size_t)k * (CODEC_FLOAT_TEXT_MAX + 1));
        if (!w)
            return;
        char *start = w;
        for (int64_t i = 0; i < k; i++) {
            w = codec_float_text(x[i], w);
            *w++ = ',';
        }
        x += k;
        n -= k;
        if (n == 0)
            w--; /* no comma after the last */
        b->len += (size_t)(w - start);
    }
    if (b->data && !b->failed)
        b->data[b->len] = '\0';
}

/* One bracket or comma: there is nearly always room already, and then
 * codec_buf_append's call and checks cost more than the byte. */
static inline void put_byte(codec_buf *b, char c)
{
    if (!b->failed && b->len + 1 < b->cap) {
        b->data[b->len++] = c;
        b->data[b->len] = '\0';
    } else {
        codec_buf_append(b, &c, 1);
    }
}

/* The nested arrays of dims shape[0..rank), row-major from x. */
static void put_nested(codec_buf *b, const float *x, int rank, const int64_t *shape)
{
    if (rank == 1) {
        put_byte(b, '[');
        put_row(b, x, shape[0]);
        put_byte(b, ']');
        return;
    }
    int64_t inner = 1;
    for (int i = 1; i < rank; i++)
        inner *= shape[i];
    put_byte(b, '[');
    for (int64_t i = 0; i < shape[0] && !b->failed; i++) {
        if (i)
            put_byte(b, ',');
        put_nested(b, inner ? x + i * inner : x, rank - 1, shape + 1);
    }
    put_byte(b, ']');
}

const char *codec_dtype_name(codec_dtype dtype)
{
    switch (dtype) {
    case CODEC_F16: return "float16";
    case CODEC_BF16: return "bfloat16";
    case CODEC_BOOL: return "bool";
    default: return "float32";
    }
}

/* The base64 of n floats as little-endian `dtype` elements, in chunks of
 * 3 * 1024 elements (a multiple of 3 bytes, so that only the last chunk has
 * padding) through a buffer on the stack. */
static void put_base64(codec_buf *b, const float *data, size_t n, codec_dtype dtype)
{
    enum { CHUNK = 3 * 1024 };
    uint8_t le[CHUNK * 4];
    size_t elem = dtype == CODEC_F32 ? 4 : 2;
    codec_half_path path = codec_half_path_in_use();
    for (size_t done = 0; done < n && !b->failed;) {
        size_t k = n - done < CHUNK ? n - done : CHUNK;
        const uint8_t *src = le;
        if (dtype != CODEC_F32)
            codec_f32_to_half(dtype, data + done, le, k, path);
        else {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            for (size_t i = 0; i < k; i++) {
                uint32_t u;
                memcpy(&u, data + done + i, 4);
                u = __builtin_bswap32(u);
                memcpy(le + 4 * i, &u, 4);
            }
#else
            src = (const uint8_t *)(data + done);
#endif
        }
        char *w = codec_buf_reserve(b, codec_base64_encoded_len(k * elem));
        if (!w)
            return;
        char *e = codec_base64_encode(src, k * elem, w);
        b->len += (size_t)(e - w);
        done += k;
    }
}

codec_dtype codec_encoding_dtype(codec_encoding enc)
{
    return enc == CODEC_ENC_BASE64_F16    ? CODEC_F16
           : enc == CODEC_ENC_BASE64_BF16 ? CODEC_BF16
                                          : CODEC_F32;
}

void codec_tensor_encode(codec_buf *b, const float *data, int rank, const int64_t *shape,
                         codec_encoding enc)
{
    int64_t count = 1;
    for (int i = 0; i < rank; i++)
        count *= shape[i];
    /* One reservation for the typical text ("-0.12345678," and brackets)
     * instead of doubling through the sizes on the way. */
    if (count > 0 && (uint64_t)count < SIZE_MAX / 16)
        codec_buf_hint(b, (size_t)count * (enc == CODEC_ENC_BASE64 ? 6 : 14) + 64);
    if (enc == CODEC_ENC_NESTED) {
        if (rank <= 0)
            codec_buf_float(b, data[0]);
        else
            put_nested(b, data, rank, shape);
        return;
    }
    codec_buf_append(b, "{\"shape\":", 9);
    put_shape(b, rank, shape);
    if (enc == CODEC_ENC_FLAT) {
        codec_buf_append(b, ",\"data\":[", 9);
        put_row(b, data, count);
        codec_buf_append(b, "]}", 2);
        return;
    }
    codec_dtype dtype = codec_encoding_dtype(enc);
    codec_buf_printf(b, ",\"dtype\":\"%s\",\"base64\":\"", codec_dtype_name(dtype));
    put_base64(b, data, (size_t)count, dtype);
    codec_buf_append(b, "\"}", 2);
}
