/*
 * libFuzzer target for the whole request path below the socket: body ->
 * strict JSON check -> field table -> tensor decode -> shape checks -> cost
 * check -> libattn on tiny shapes -> response encode, for both compute
 * operations. Beyond what ASan and UBSan catch, every answer must keep the
 * invariants of tests/support/api_invariants.c; a violation aborts, so
 * libFuzzer saves the input. `make fuzz` builds and runs it; inputs it finds
 * go into tests/fuzz/regressions/, which `make test` replays.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../support/api_invariants.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char why[400];
    if (!api_invariants_check((const char *)data, size, why, sizeof why)) {
        fprintf(stderr, "api invariant broken: %s\n", why);
        abort();
    }
    return 0;
}
