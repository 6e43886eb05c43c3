"""Request bodies for the HTTP and server-memory rows of `make bench`.

    python3 bench/bodies.py OUTDIR

writes, as a PyTorch/NumPy client would send them (json.dumps of .tolist()):
  small.json   q, k, v [4, 4], nested arrays
  medium.json  q, k, v [128, 64], nested arrays, "causal": true
  big.json     q, k, v, grad_output [32768, 64] as base64 float32,
               "output_encoding": "base64" (forward + backward)
  b64_h8_n512.json   q, k, v [8, 512, 64] as base64 float32, base64 answers
  oip_h8_n512.bin    the same numbers as an Open Inference Protocol request,
                     binary tensors both ways (its JSON text's length in
                     oip_h8_n512.len, for Inference-Header-Content-Length)
  oip_h8_n4096.bin   the same for [8, 4096, 64] (and oip_h8_n4096.len)
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


def oip(rng, h, n, d):
    """An infer request with q, k, v [h, n, d] as binary FP32 and binary
    outputs: (JSON text + bytes, the JSON text's length), and the tensors."""
    tensors = {name: rng.standard_normal((h, n, d)).astype("<f4") for name in "qkv"}
    head = {"inputs": [{"name": name, "shape": [h, n, d], "datatype": "FP32",
                        "parameters": {"binary_data_size": x.nbytes}}
                       for name, x in tensors.items()],
            "parameters": {"binary_data_output": True}}
    text = json.dumps(head).encode()
    return text + b"".join(x.tobytes() for x in tensors.values()), len(text), tensors


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
    # /v1 with base64 and /v2 with binary tensors: the very same numbers.
    for n in (512, 4096):
        body, json_len, tensors = oip(rng, 8, n, 64)
        with open(os.path.join(out, f"oip_h8_n{n}.bin"), "wb") as f:
            f.write(body)
        with open(os.path.join(out, f"oip_h8_n{n}.len"), "w") as f:
            f.write(str(json_len))
        if n == 512:
            v1 = {name: {"shape": list(x.shape), "dtype": "float32",
                         "base64": base64.b64encode(x.tobytes()).decode("ascii")}
                  for name, x in tensors.items()}
            v1["output_encoding"] = "base64"
            with open(os.path.join(out, "b64_h8_n512.json"), "w") as f:
                json.dump(v1, f)


if __name__ == "__main__":
    main()
