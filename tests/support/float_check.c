/* See float_check.h. */
#include "float_check.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int float_check_digits(const char *s, uint64_t *digits, int *exp10)
{
    uint64_t d = 0;
    int n = 0, after_point = 0;
    bool point = false, started = false;
    for (; *s && *s != 'e' && *s != 'E'; s++) {
        if (*s == '.') {
            point = true;
            continue;
        }
        if (*s < '0' || *s > '9')
            continue;
        after_point += point;
        started |= *s != '0';
        if (started) {
            d = d * 10 + (uint64_t)(*s - '0');
            n++;
        }
    }
    int e = (*s == 'e' || *s == 'E') ? atoi(s + 1) : 0;
    e -= after_point;
    while (n > 1 && d % 10 == 0) {
        d /= 10;
        n--;
        e++;
    }
    *digits = d;
    *exp10 = e;
    return n;
}

bool float_check_reads_back(const char *s, float f)
{
    double d = strtod(s, NULL);
    if (!(d < 0x1.ffffffp127 && d > -0x1.ffffffp127)) /* rounds to an infinity */
        return false;
    float g = (float)d;
    return memcmp(&g, &f, sizeof f) == 0;
}

static bool digits_read_back(uint64_t d, int exp10, float f)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%" PRIu64 "e%d", d, exp10);
    return float_check_reads_back(buf, f);
}

const char *float_check_shortest_nearest(float f, const char *text, char *why, size_t cap)
{
    char g[64];
    uint64_t d, r;
    int ex, rex;
    int n = float_check_digits(text, &d, &ex);
    if (n > 1) {
        snprintf(g, sizeof g, "%.*e", n - 2, (double)f);
        float_check_digits(g, &r, &rex);
        for (int delta = -1; delta <= 1; delta++)
            if (r + (uint64_t)delta > 0 && digits_read_back(r + (uint64_t)delta, rex, f)) {
                snprintf(why, cap, "%" PRIu64 "e%d is shorter and reads back",
                         r + (uint64_t)delta, rex);
                return why;
            }
    }
    snprintf(g, sizeof g, "%.*e", n - 1, (double)f);
    float_check_digits(g, &r, &rex);
    while (rex > ex) { /* the same scale (a carry can make r 10^n) */
        r *= 10;
        rex--;
    }
    while (ex > rex) {
        d *= 10;
        ex--;
    }
    if (float_check_reads_back(g, f)) {
        if (d != r) {
            snprintf(why, cap, "%s is nearer", g);
            return why;
        }
    } else if (d != r + 1 && r != d + 1) {
        snprintf(why, cap, "not next to %s", g);
        return why;
    }
    return NULL;
}
