/*
 * The independent check of a float32's shortest text, shared by
 * tests/test_codec.c (a sample) and tests/float_exhaustive.c (every float):
 * glibc's strtod and its correctly rounded printf are the references.
 */
#ifndef ATTN_TEST_FLOAT_CHECK_H
#define ATTN_TEST_FLOAT_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The significant digits of a decimal text as an integer, and the power
 * of ten of the last one ("0.0125" -> 125, -4; "1e+16" -> 1, 16); returns
 * how many digits. */
int float_check_digits(const char *s, uint64_t *digits, int *exp10);

/* Does the decimal text read back as f, the way the API's reader and a
 * Python client read it (strtod, then float32)? */
bool float_check_reads_back(const char *s, float f);

/*
 * Is `text` (written for f > 0) the shortest decimal that reads back as f
 * and, among those, the nearest? With n its digits: no text of n - 1
 * digits reads back (the two nearest f are within one unit of glibc's
 * correctly rounded "%.*e" at n - 1 digits), and the digits are printf's
 * n-digit rounding of f whenever that reads back (nearest, ties to even),
 * else next to it. Returns NULL, or what is wrong (in why[0..cap)).
 */
const char *float_check_shortest_nearest(float f, const char *text, char *why, size_t cap);

#endif
