/*
 * The memory of decoded tensors' elements: malloc's, or the allocator a
 * server sets (codec_set_allocator), which keeps a large request's pages
 * for the next instead of mapping them anew.
 */
#include "codec.h"

#include <stdlib.h>

/* Set once, before the first tensor is decoded (codec.h); alloc NULL: the
 * C library's. */
static codec_allocator elements;

void codec_set_allocator(const codec_allocator *a)
{
    elements = a && a->alloc && a->realloc && a->free ? *a : (codec_allocator){0};
}

void *codec_tensor_alloc(size_t bytes)
{
    return elements.alloc ? elements.alloc(elements.ctx, bytes) : malloc(bytes);
}

void *codec_tensor_realloc(void *p, size_t bytes)
{
    return elements.realloc ? elements.realloc(elements.ctx, p, bytes) : realloc(p, bytes);
}

void codec_tensor_release(void *p)
{
    if (elements.free)
        elements.free(elements.ctx, p);
    else
        free(p);
}
