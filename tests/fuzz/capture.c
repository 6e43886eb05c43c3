/*
 * Seeds for the fuzzer from the tests themselves: linked into a copy of the
 * API suite with -Wl,--wrap=api_handle, this shim writes every request body
 * that suite sends (up to SEED_MAX bytes) into $ATTND_CAPTURE_DIR, one file
 * per distinct body, before handing it to the real api_handle. The fuzzer
 * thus starts from the bodies the tests already know to matter, and follows
 * them as the tests change.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "api.h"

/* Longer bodies are left out: the fuzzer reads at most 4 KiB (run.sh). */
#define SEED_MAX 4096

void __real_api_handle(api_op op, const char *body, size_t len, const api_limits *lim,
                       api_response *res);
void __wrap_api_handle(api_op op, const char *body, size_t len, const api_limits *lim,
                       api_response *res);

void __wrap_api_handle(api_op op, const char *body, size_t len, const api_limits *lim,
                       api_response *res)
{
    const char *dir = getenv("ATTND_CAPTURE_DIR");
    if (dir && body && len <= SEED_MAX) {
        uint64_t h = 1469598103934665603ull; /* FNV-1a: one name per body */
        for (size_t i = 0; i < len; i++)
            h = (h ^ (unsigned char)body[i]) * 1099511628211ull;
        char path[512];
        snprintf(path, sizeof path, "%s/test-%016llx", dir, (unsigned long long)h);
        FILE *f = fopen(path, "wb");
        if (f) {
            fwrite(body, 1, len, f);
            fclose(f);
        }
    }
    __real_api_handle(op, body, len, lim, res);
}
