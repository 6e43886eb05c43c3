"""Greedy decoding of a small transformer with attnd holding its KV caches.

    python3 examples/decode.py [URL]

A decoder-only transformer with random weights (from a fixed seed): 3
layers, 4 query heads sharing 2 key/value heads (grouped-query attention)
of width 16, rotary position embeddings, RMSNorm, a ReLU MLP. It generates
200 tokens greedily after an 8-token prompt, keeping one attnd KV cache per
layer: the prompt goes in as one request per layer (a prefill: its keys and
values appended, its queries attending causally), then every step sends
only the newest token's key, value and query, and attnd attends over
everything the cache holds. RoPE is attnd's: keys are rotated at their
positions when appended, queries at theirs.

Each step's logits are checked against this script's own recomputation of
the whole sequence in float64 (no cache, plain NumPy attention), and the
largest relative error is printed and bounded. Halfway, the last 5 tokens
are rolled back with "truncate" (as speculative decoding does with rejected
tokens) and generated again: they must come out identical, logits and all.

URL defaults to $ATTND_URL, then http://127.0.0.1:8080. Exit status 1 when a
check fails, or (one line) when the server is not there or answers an error.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attnd_client import AttndError, Client, one_line, server_url  # noqa: E402

VOCAB, D_MODEL, LAYERS, HEADS, KV_HEADS, HEAD_DIM, D_FF = 64, 64, 3, 4, 2, 16, 128
ROPE_BASE = 10000.0
PROMPT, STEPS, ROLLBACK, ROLLBACK_AT = 8, 200, 5, 100
# float32 keys, values and outputs on the server against float64 here
BOUND = 1e-4


def weights(seed=7):
    rng = np.random.default_rng(seed)
    w = lambda *shape: rng.standard_normal(shape) / np.sqrt(shape[0])  # noqa: E731
    return {
        "embed": rng.standard_normal((VOCAB, D_MODEL)),
        "out": w(D_MODEL, VOCAB) * 4,
        "layers": [{"wq": w(D_MODEL, HEADS * HEAD_DIM), "wk": w(D_MODEL, KV_HEADS * HEAD_DIM),
                    "wv": w(D_MODEL, KV_HEADS * HEAD_DIM), "wo": w(HEADS * HEAD_DIM, D_MODEL),
                    "w1": w(D_MODEL, D_FF), "w2": w(D_FF, D_MODEL)} for _ in range(LAYERS)],
    }


def rms_norm(x):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def heads(x, n):
    """[n_pos, n * HEAD_DIM] -> [n, n_pos, HEAD_DIM]"""
    return x.reshape(x.shape[0], n, HEAD_DIM).transpose(1, 0, 2)


def rope(x, positions):
    """Rotate-half RoPE: the pair (t, t + d/2) at position p turns by
    p * base^(-2t/d) (attnd's convention). x [heads, n, d]."""
    half = HEAD_DIM // 2
    angle = positions[:, None] * ROPE_BASE ** (-2.0 * np.arange(half) / HEAD_DIM)
    cos, sin = np.cos(angle), np.sin(angle)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def block_rest(layer, h, attended):
    """The rest of a block after attention: output projection, residual, MLP.
    attended [HEADS, n, HEAD_DIM]."""
    h = h + attended.transpose(1, 0, 2).reshape(h.shape[0], -1) @ layer["wo"]
    return h + np.maximum(rms_norm(h) @ layer["w1"], 0) @ layer["w2"]


def reference_logits(w, tokens):
    """The last position's logits, the whole sequence recomputed in float64."""
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    h = w["embed"][tokens]
    mask = np.tril(np.ones((n, n), bool))
    for layer in w["layers"]:
        x = rms_norm(h)
        q = rope(heads(x @ layer["wq"], HEADS), pos)
        k = rope(heads(x @ layer["wk"], KV_HEADS), pos)
        v = heads(x @ layer["wv"], KV_HEADS)
        group = HEADS // KV_HEADS
        k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
        s = np.where(mask, q @ k.transpose(0, 2, 1) / np.sqrt(HEAD_DIM), -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        h = block_rest(layer, h, (p / p.sum(axis=-1, keepdims=True)) @ v)
    return rms_norm(h[-1]) @ w["out"]


class Decoder:
    """The model with one attnd cache per layer."""

    def __init__(self, api, w):
        self.api, self.w = api, w
        self.caches = [api.create_cache(num_kv_heads=KV_HEADS, head_dim=HEAD_DIM)["id"]
                       for _ in range(LAYERS)]
        self.length = 0  # positions every cache holds

    def feed(self, tokens, truncate=None):
        """Appends `tokens` (after truncating the caches to `truncate`
        positions) and returns the logits after the last one."""
        if truncate is not None:
            self.length = truncate
        h = self.w["embed"][tokens]
        for layer, cache in zip(self.w["layers"], self.caches):
            x = rms_norm(h)
            f32 = lambda a: a.astype(np.float32)  # noqa: E731
            request = {"k": f32(heads(x @ layer["wk"], KV_HEADS)),
                       "v": f32(heads(x @ layer["wv"], KV_HEADS)),
                       "q": f32(heads(x @ layer["wq"], HEADS)),
                       "rope": {"base": ROPE_BASE}}
            if truncate is not None:
                request["truncate"] = truncate
            answer = self.api.cache_attention(cache, **request)
            h = block_rest(layer, h, answer["output"].astype(np.float64))
        self.length += len(tokens)
        assert answer["cache"]["length"] == self.length, (answer["cache"], self.length)
        return rms_norm(h[-1]) @ self.w["out"]

    def close(self):
        for cache in self.caches:
            self.api.delete_cache(cache)


def main(base):
    api = Client(base)
    w = weights()
    prompt = list(np.random.default_rng(11).integers(0, VOCAB, PROMPT))
    decoder = Decoder(api, w)
    failures = []
    worst = 0.0

    def check(tokens, logits):
        nonlocal worst
        want = reference_logits(w, tokens)
        worst = max(worst, float(np.max(np.abs(logits - want)) / np.max(np.abs(want))))

    start = time.perf_counter()
    tokens = list(prompt)
    logits = decoder.feed(tokens)  # the prefill
    check(tokens, logits)
    history = {}  # length of `tokens` -> (the token chosen, its logits)
    rolled_back = False
    while len(tokens) < PROMPT + STEPS:
        history.setdefault(len(tokens), (int(np.argmax(logits)), logits))
        token, first_logits = history[len(tokens)]
        if rolled_back and len(tokens) < ROLLBACK_AT + PROMPT:
            # regenerating: the same token, from the same numbers
            if token != int(np.argmax(logits)) or not np.array_equal(first_logits, logits):
                failures.append(f"position {len(tokens)}: regenerated differently after the "
                                f"rollback (max logit difference "
                                f"{np.max(np.abs(first_logits - logits)):.3g})")
            token = int(np.argmax(logits))
        tokens.append(token)
        if len(tokens) == PROMPT + ROLLBACK_AT and not rolled_back:
            # reject the last ROLLBACK tokens: keep the caches' positions
            # before them, and feed the last kept token again
            rolled_back = True
            del tokens[-ROLLBACK:]
            logits = decoder.feed(tokens[-1:], truncate=len(tokens) - 1)
        else:
            logits = decoder.feed(tokens[-1:])
        check(tokens, logits)
    took = time.perf_counter() - start
    bytes_held = sum(api.cache(c)["bytes"] for c in decoder.caches)
    decoder.close()

    print(f"decoded {STEPS} tokens after a {PROMPT}-token prompt with {LAYERS} attnd KV caches "
          f"(GQA {HEADS}/{KV_HEADS} heads of {HEAD_DIM}, RoPE), {bytes_held} bytes held, "
          f"{took:.2f} s")
    print("tokens:", " ".join(str(t) for t in tokens[PROMPT:PROMPT + 24]), "...")
    print(f"max relative error of the logits against float64: {worst:.2e} (bound {BOUND:.0e})")
    if worst > BOUND:
        failures.append(f"logits off by {worst:.3g} relative, beyond {BOUND:g}")
    if not failures:
        print(f"rollback of {ROLLBACK} tokens at step {ROLLBACK_AT} (truncate): regenerated "
              f"identically")
    for f in failures:
        print("FAILED", f)
    return 1 if failures else 0


if __name__ == "__main__":
    url = server_url(sys.argv)
    try:
        sys.exit(main(url))
    except AttndError as e:
        sys.exit(one_line(url, e))
