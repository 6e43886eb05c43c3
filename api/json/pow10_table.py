"""Writes api/json/pow10_table.h: 10^q for q in [-65, 38] as M * 2^e, with
M a 128-bit integer in [2^127, 2^128), rounded down (exact for q >= 0).
That range is every power of ten a float32 read from at most 19 significant
digits can need (number.c). tests/test_codec.c checks each entry with its
own big-integer arithmetic.

    python3 api/json/pow10_table.py > api/json/pow10_table.h
"""
Q_MIN, Q_MAX = -65, 38


def entry(q):
    if q >= 0:
        n = 10 ** q
        b = n.bit_length()
        return n << (128 - b), b - 128  # exact: 10^38 < 2^128
    d = 10 ** -q
    k = 127 + d.bit_length()  # 2^k / d is then in (2^127, 2^128)
    return (1 << k) // d, -k


print("/* Made by api/json/pow10_table.py; do not edit. 10^q ~ (hi * 2^64 + lo) * 2^e,")
print(" * rounded down, exact for q >= 0. */")
print(f"#define POW10_Q_MIN ({Q_MIN})")
print(f"#define POW10_Q_MAX {Q_MAX}")
print("static const struct {")
print("    uint64_t hi, lo;")
print("    int e;")
print("} pow10_table[POW10_Q_MAX - POW10_Q_MIN + 1] = {")
for q in range(Q_MIN, Q_MAX + 1):
    m, e = entry(q)
    assert 1 << 127 <= m < 1 << 128
    print(f"    {{0x{m >> 64:016x}u, 0x{m & (2**64 - 1):016x}u, {e}}}, /* 1e{q} */")
print("};")
