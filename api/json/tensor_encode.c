/*
 * Tensors out, in the three forms of SPEC §3 (nested arrays, the flat
 * {"shape", "data"} object, the {"shape", "dtype", "base64"} object),
 * written straight into the response buffer.
 */
#include "codec_internal.h"

#include <string.h>

static void put_shape(api_buf *b, int rank, const int64_t *shape)
{
    api_buf_append(b, "[", 1);
    for (int i = 0; i < rank; i++)
        api_buf_printf(b, i ? ",%lld" : "%lld", (long long)shape[i]);
    api_buf_append(b, "]", 1);
}

/* n floats as "a,b,c" (no brackets), straight into the buffer. */
static void put_row(api_buf *b, const float *x, int64_t n)
{
    /* in chunks, so that the reservation stays small for huge rows */
    while (n > 0) {
        int64_t k = n > 4096 ? 4096 : n;
        char *w = api_buf_reserve(b, (size_t)k * (API_FLOAT_TEXT_MAX + 1));
        if (!w)
            return;
        char *start = w;
        for (int64_t i = 0; i < k; i++) {
            w = api_float_text(x[i], w);
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

/* The nested arrays of dims shape[0..rank), row-major from x. */
static void put_nested(api_buf *b, const float *x, int rank, const int64_t *shape)
{
    if (rank == 1) {
        api_buf_append(b, "[", 1);
        put_row(b, x, shape[0]);
        api_buf_append(b, "]", 1);
        return;
    }
    int64_t inner = 1;
    for (int i = 1; i < rank; i++)
        inner *= shape[i];
    api_buf_append(b, "[", 1);
    for (int64_t i = 0; i < shape[0] && !b->failed; i++) {
        if (i)
            api_buf_append(b, ",", 1);
        put_nested(b, inner ? x + i * inner : x, rank - 1, shape + 1);
    }
    api_buf_append(b, "]", 1);
}

void api_tensor_encode(api_buf *b, const float *data, int rank, const int64_t *shape,
                       api_encoding enc)
{
    int64_t count = 1;
    for (int i = 0; i < rank; i++)
        count *= shape[i];
    /* One reservation for the typical text ("-0.12345678," and brackets)
     * instead of doubling through the sizes on the way. */
    if (count > 0 && (uint64_t)count < SIZE_MAX / 16)
        api_buf_hint(b, (size_t)count * (enc == API_ENC_BASE64 ? 6 : 14) + 64);
    if (enc == API_ENC_NESTED) {
        if (rank <= 0)
            api_buf_float(b, data[0]);
        else
            put_nested(b, data, rank, shape);
        return;
    }
    api_buf_append(b, "{\"shape\":", 9);
    put_shape(b, rank, shape);
    if (enc == API_ENC_FLAT) {
        api_buf_append(b, ",\"data\":[", 9);
        put_row(b, data, count);
        api_buf_append(b, "]}", 2);
        return;
    }
    api_buf_puts(b, ",\"dtype\":\"float32\",\"base64\":\"");
    /* little-endian float32, in chunks of 3 * 4096 floats (a multiple of 3
     * bytes, so that only the last chunk has padding) */
    const size_t chunk = 3 * 4096;
    size_t total = (size_t)count * 4, done = 0;
    while (done < total && !b->failed) {
        size_t nbytes = total - done < chunk * 4 ? total - done : chunk * 4;
        const uint8_t *src = (const uint8_t *)data + done;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        static _Thread_local uint8_t le[3 * 4096 * 4];
        for (size_t i = 0; i < nbytes; i += 4) {
            uint32_t u;
            memcpy(&u, src + i, 4);
            u = __builtin_bswap32(u);
            memcpy(le + i, &u, 4);
        }
        src = le;
#endif
        char *w = api_buf_reserve(b, api_base64_encoded_len(nbytes));
        if (!w)
            return;
        char *e = api_base64_encode(src, nbytes, w);
        b->len += (size_t)(e - w);
        done += nbytes;
    }
    api_buf_append(b, "\"}", 2);
}
