/* Errors are values: attn_fail fills the caller's attn_error and hands the
 * status back, so that every failing path is one `return attn_fail(...)`. */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

attn_status attn_fail(attn_error *err, attn_status status, const char *fmt, ...)
{
    if (err != NULL) {
        va_list ap;
        va_start(ap, fmt);
        err->status = status;
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return status;
}
