"""examples/attnd_client.py against a running attnd (URL in argv[1]):
answers compared with a NumPy float64 reference computed here, base64 both
ways bit for bit against the flat encoding, errors raised with the API's
field."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from attnd_client import AttndError, Client  # noqa: E402

api = Client(sys.argv[1])
failures = 0


def check(name, ok, detail=""):
    global failures
    print(("ok     " if ok else "FAILED ") + name + (f": {detail}" if detail and not ok else ""))
    failures += not ok


def reference(q, k, v, mask=None, causal=False, scale=None):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    n_q, n_k = s.shape[-2:]
    allowed = np.ones(s.shape, bool)
    if causal:
        allowed &= np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q)
    if mask is not None:
        allowed &= mask
    s = np.where(allowed, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w @ v, w


rng = np.random.default_rng(1)
q = rng.standard_normal((3, 7, 16), dtype=np.float32)
k = rng.standard_normal((3, 9, 16), dtype=np.float32)
v = rng.standard_normal((3, 9, 5), dtype=np.float32)
mask = rng.random((7, 9)) < 0.8
mask[:, -1] = True  # every row sees at least one key

r = api.attention(q=q, k=k, v=v, mask=mask, causal=True, return_weights=True)
out, w = reference(q, k, v, mask=mask, causal=True)
check("output is float32 [3, 7, 5]", r["output"].dtype == np.float32 and r["output"].shape == (3, 7, 5))
check("weights with a bool mask and causal", np.abs(r["weights"] - w).max() < 1e-6, np.abs(r["weights"] - w).max())
check("output with a bool mask and causal", np.abs(r["output"] - out).max() < 1e-5, np.abs(r["output"] - out).max())

flat = api.attention(q=q, k=k, v=v, mask=mask, causal=True, return_weights=True, output_encoding="flat")
check("base64 answer equals the flat one bit for bit",
      np.array_equal(r["output"], flat["output"]) and np.array_equal(r["weights"], flat["weights"]))
nested = api.attention(q=q.tolist(), k=k.tolist(), v=v.tolist(), mask=mask.tolist(), causal=True)
check("base64 request equals the nested one bit for bit", np.array_equal(r["output"], nested["output"]))

# Gradients: dV = A^T dO, against the reference weights.
d_o = rng.standard_normal((3, 7, 5), dtype=np.float32)
g = api.attention(q=q, k=k, v=v, grad_output=d_o, scale=0.3)
_, w3 = reference(q, k, v, scale=0.3)
dv = np.swapaxes(w3, -1, -2) @ d_o.astype(np.float64)
check("grad v = A^T dO", np.abs(g["grad"]["v"] - dv).max() < 1e-5, np.abs(g["grad"]["v"] - dv).max())
check("grad q and k shapes", g["grad"]["q"].shape == q.shape and g["grad"]["k"].shape == k.shape)

# Multi-head self-attention against the chapter's convention Q = X W_Q.
x = rng.standard_normal((6, 8), dtype=np.float32)
wq, wk, wv = (rng.standard_normal((8, 8), dtype=np.float32) / 3 for _ in range(3))
m = api.multihead(x=x, w_q=wq, w_k=wk, w_v=wv, num_heads=2, return_weights=True)
heads = []
for h in range(2):
    cols = slice(4 * h, 4 * h + 4)
    o, _ = reference(x @ wq[:, cols], x @ wk[:, cols], x @ wv[:, cols])
    heads.append(o)
want = np.concatenate(heads, axis=-1)
check("multihead output (2 heads, concatenated)", np.abs(m["output"] - want).max() < 1e-5, np.abs(m["output"] - want).max())
check("multihead weights per head [2, 6, 6]", m["weights"].shape == (2, 6, 6))

try:
    api.attention(q=q, k=k[..., :8], v=v)
    check("a shape error raises AttndError", False)
except AttndError as e:
    check("a shape error raises AttndError naming k", e.status == 422 and e.code == "shape_mismatch" and e.field == "k", e)

print(f"{'FAILED' if failures else 'ok'}: Python client, {failures} failures")
sys.exit(1 if failures else 0)
