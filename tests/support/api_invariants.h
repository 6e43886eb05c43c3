/*
 * What every answer of api_handle() must be, whatever the body: the
 * properties the fuzz target (tests/fuzz/fuzz_api.c) checks on each input,
 * and the regression suite (tests/test_fuzz.c) checks on the saved corpus.
 * A failure is a bug even when nothing crashed.
 */
#ifndef ATTN_TEST_API_INVARIANTS_H
#define ATTN_TEST_API_INVARIANTS_H

#include <stdbool.h>
#include <stddef.h>

#include "api.h"

/* The limits the fuzz target runs under: tiny, so that an input explores
 * the request path rather than computes (a body asking for more work is a
 * 422 work_limit before any compute starts). */
extern const api_limits api_invariants_limits;

/* Runs `body` through both compute operations and checks every answer:
 * status 200, 400 or 422 (never a 500 for a few kilobytes of input); a body
 * that is one JSON object (jansson, strict, no duplicate keys) with no NUL
 * inside; an error is exactly {"error": {"status" = the status, "code",
 * "message", "field"?}} with non-empty strings, an answer has "output" and
 * "meta"; and 200 only for a body that is itself one JSON object. Then runs
 * it as an Open Inference Protocol infer request of both models ("N\n"
 * first: a binary body whose JSON text is N bytes long) and checks that
 * answer: 200, 400 or 422; an error exactly {"error": "message"}; outputs
 * whose data or binary sizes match their shapes and fill the body. Returns
 * false with the reason in why. */
bool api_invariants_check(const char *body, size_t len, char *why, size_t cap);

#endif /* ATTN_TEST_API_INVARIANTS_H */
