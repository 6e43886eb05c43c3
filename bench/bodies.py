"""Request bodies for the HTTP and server-memory rows of `make bench`.

    python3 bench/bodies.py OUTDIR

writes, as a PyTorch/NumPy client would send them (json.dumps of .tolist()):
  small.json   q, k, v [4, 4], nested arrays
  medium.json  q, k, v [128, 64], nested arrays, "causal": true
  big.json     q, k, v, grad_output [32768, 64] as base64 float32,
               "output_encoding": "base64" (forward + backward)
The small and medium bodies use only fields the FastAPI peer reads too, so
every server gets the very same bytes.
"""
import base64
import json
import os
import sys

import numpy as np


def nested(rng, n, d):
    return rng.standard_normal((n, d)).astype(np.float32).tolist()


def b64(rng, n, d):
    x = rng.standard_normal((n, d)).astype("<f4")
    return {"shape": [n, d], "dtype": "float32",
            "base64": base64.b64encode(x.tobytes()).decode("ascii")}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(5)
    small = {"q": nested(rng, 4, 4), "k": nested(rng, 4, 4), "v": nested(rng, 4, 4)}
    medium = {"q": nested(rng, 128, 64), "k": nested(rng, 128, 64),
              "v": nested(rng, 128, 64), "causal": True}
    n, d = 32768, 64
    big = {"q": b64(rng, n, d), "k": b64(rng, n, d), "v": b64(rng, n, d),
           "grad_output": b64(rng, n, d), "output_encoding": "base64"}
    for name, body in (("small", small), ("medium", medium), ("big", big)):
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump(body, f)


if __name__ == "__main__":
    main()
