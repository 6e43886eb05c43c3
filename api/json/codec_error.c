/*
 * codec_error: what went wrong, where (byte, line, column) and in words.
 */
#include "codec_internal.h"

#include <stdarg.h>
#include <stdio.h>

bool codec_fail(codec_error *e, codec_error_kind kind, const char *field, cursor text,
                cursor at, const char *fmt, ...)
{
    e->kind = kind;
    e->offset = 0;
    e->line = e->column = 0;
    if (at && text && at >= text) {
        /* errors are rare and their texts are read once: a plain count */
        long line = 1;
        cursor line_start = text;
        for (cursor p = text; p < at; p++)
            if (*p == '\n') {
                line++;
                line_start = p + 1;
            }
        e->offset = (size_t)(at - text);
        e->line = line;
        e->column = (long)(at - line_start) + 1;
    }
    snprintf(e->field, sizeof e->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}
