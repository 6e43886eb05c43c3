/*
 * codec_buf: the growing text that every response body, the metrics and
 * /v1/info are written into.
 * Allocation failure is sticky (`failed`) so that an encoder can append a
 * whole tensor and check once at the end, instead of after every number.
 * The bytes are kept NUL-terminated, which makes the buffer printable.
 */
#include "codec_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void codec_advise_huge(void *p, size_t len)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20;
    if (len < 2 * huge)
        return;
    uintptr_t from = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    uintptr_t to = ((uintptr_t)p + len) & ~(huge - 1);
    /* advice only: where the kernel has no huge pages, nothing changes */
    (void)madvise((void *)from, to - from, MADV_HUGEPAGE);
#else
    (void)p;
    (void)len;
#endif
}

char *codec_buf_reserve(codec_buf *b, size_t n)
{
    if (b->failed)
        return NULL;
    /* + 1 for the terminating NUL */
    if (n >= SIZE_MAX / 2 - b->len) {
        b->failed = true;
        return NULL;
    }
    size_t need = b->len + n + 1;
    if (need > b->cap) {
        /* Doubling keeps appends amortised O(1); large blocks are mmap'd by
         * malloc, so realloc moves them with mremap rather than copying. */
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need)
            cap *= 2;
        char *data = b->elements ? codec_tensor_realloc(b->data, cap) : realloc(b->data, cap);
        if (!data) {
            b->failed = true;
            return NULL;
        }
        b->data = data;
        b->cap = cap;
        codec_advise_huge(data, cap);
    }
    return b->data + b->len;
}

void codec_buf_hint(codec_buf *b, size_t n)
{
    if (b->failed || n >= SIZE_MAX / 2 - b->len || b->len + n + 1 <= b->cap)
        return;
    char *data = b->elements ? codec_tensor_realloc(b->data, b->len + n + 1)
                             : realloc(b->data, b->len + n + 1);
    if (!data)
        return; /* only a hint: appends will still grow as they need */
    b->data = data;
    b->cap = b->len + n + 1;
    codec_advise_huge(data, b->cap);
}

void codec_buf_append(codec_buf *b, const char *s, size_t n)
{
    char *w = codec_buf_reserve(b, n);
    if (!w)
        return;
    memcpy(w, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void codec_buf_puts(codec_buf *b, const char *s)
{
    codec_buf_append(b, s, strlen(s));
}

void codec_buf_printf(codec_buf *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        codec_buf_append(b, small, (size_t)n);
        return;
    }
    /* Too long for the stack buffer: format again straight into b. */
    char *w = codec_buf_reserve(b, (size_t)n);
    if (!w)
        return;
    va_start(ap, fmt);
    vsnprintf(w, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void codec_buf_string(codec_buf *b, const char *s)
{
    size_t n = strlen(s);
    /* sized for the longest escaping, then cut back to what it took */
    char *w = codec_buf_reserve(b, CODEC_ESCAPED_MAX(n) + 2);
    if (!w)
        return;
    w[0] = '"';
    size_t k = codec_escape_text(w + 1, CODEC_ESCAPED_MAX(n) + 1, s, n, 0);
    w[1 + k] = '"';
    b->len += k + 2;
    b->data[b->len] = '\0';
}

void codec_buf_float(codec_buf *b, float f)
{
    char *w = codec_buf_reserve(b, CODEC_FLOAT_TEXT_MAX);
    if (!w)
        return;
    char *e = codec_float_text(f, w);
    b->len += (size_t)(e - w);
    b->data[b->len] = '\0';
}

void codec_buf_free(codec_buf *b)
{
    if (b->elements)
        codec_tensor_release(b->data);
    else
        free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = false;
}
