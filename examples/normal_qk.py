"""Prints an /v1/attention request whose q and k have independent N(0, 1)
entries (Theorem 1's assumption), as base64 float32, standard library only:
    python3 examples/normal_qk.py N D_K [SEED] [EXTRA_JSON]
e.g.  python3 examples/normal_qk.py 256 64 0 '{"scale": 1}' | curl -s -d @- URL/v1/attention
"""
import base64
import json
import random
import struct
import sys

n, d_k = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 0)


def normal(rows, cols):
    data = struct.pack(f"<{rows * cols}f", *(rng.gauss(0, 1) for _ in range(rows * cols)))
    return {"shape": [rows, cols], "dtype": "float32", "base64": base64.b64encode(data).decode()}


request = {"q": normal(n, d_k), "k": normal(n, d_k), "v": {"shape": [n, 1], "data": [0] * n},
           "return_stats": True}
request.update(json.loads(sys.argv[4]) if len(sys.argv) > 4 else {})
print(json.dumps(request))
