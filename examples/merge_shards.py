"""Attention over a long context split across attnd processes, merged exactly.

    python3 examples/merge_shards.py URL [URL ...]

The keys (and values) of one long context are cut into one contiguous shard
per URL (two shards on one server when a single URL is given); each server
attends the same queries over its shard and returns, with "return_lse":
true, each query row's log-sum-exp over the keys it saw. Softmax over all
the keys is then a weighted sum of the shards' answers, with no
approximation:

    lse = log(sum_s exp(lse_s))          o = sum_s exp(lse_s - lse) * o_s

A row that sees no key of a shard has lse_s = -inf there (null in JSON,
-inf in base64) and weight 0. The script checks the merge against one
request over every key and against a NumPy float64 reference, and exits 1
if either differs by more than float32 rounding. Standard library + NumPy.
"""
import concurrent.futures
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attnd_client import Client  # noqa: E402


def merge(parts):
    """Exact merge of [(output [..., n_q, d_v], lse [..., n_q]), ...] over
    disjoint key shards; rows that no shard saw stay zero with lse -inf."""
    lses = np.stack([lse.astype(np.float64) for _, lse in parts])
    top = lses.max(axis=0)
    seen = np.isfinite(top)
    shift = np.where(seen, top, 0.0)
    total = np.full(top.shape, -np.inf)
    total[seen] = (shift + np.log(np.exp(lses - shift).sum(axis=0)))[seen]
    out = np.zeros(parts[0][0].shape, np.float64)
    for o, lse in parts:
        weight = np.where(seen, np.exp(lse.astype(np.float64) - np.where(seen, total, 0.0)), 0.0)
        out += weight[..., None] * o
    return out.astype(np.float32), total


def reference(q, k, v, mask):
    """softmax(q k^T / sqrt(d_k), masked) v and its lse in float64 (GQA by repeating k, v)."""
    g = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, g, axis=0).astype(np.float64), np.repeat(v, g, axis=0).astype(np.float64)
    s = q.astype(np.float64) @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    s = np.where(mask, s, -np.inf)
    top = s.max(-1, keepdims=True)
    e = np.exp(s - top)
    return (e @ v) / e.sum(-1, keepdims=True), (top + np.log(e.sum(-1, keepdims=True)))[..., 0]


def main(urls):
    rng = np.random.default_rng(7)
    heads_q, heads_kv, n_q, n_k, d = 8, 2, 16, 8192, 64
    q = rng.standard_normal((heads_q, n_q, d), dtype=np.float32)
    k = rng.standard_normal((heads_kv, n_k, d), dtype=np.float32)
    v = rng.standard_normal((heads_kv, n_k, d), dtype=np.float32)
    # padding: the last 100 keys are hidden from every query
    mask = np.ones((n_k,), bool)
    mask[-100:] = False

    servers = [Client(u, timeout=300) for u in urls]
    shards = max(2, len(servers))
    cuts = np.linspace(0, n_k, shards + 1).astype(int)
    print(f"q [{heads_q}, {n_q}, {d}], k and v [{heads_kv}, {n_k}, {d}]: "
          f"{shards} key shards {[f'{a}:{b}' for a, b in zip(cuts[:-1], cuts[1:])]} "
          f"on {len(servers)} server(s)")

    def shard(i):
        a, b = cuts[i], cuts[i + 1]
        api = servers[i % len(servers)]
        started = time.perf_counter()
        r = api.attention(q=q, k=k[:, a:b], v=v[:, a:b], mask=mask[a:b], return_lse=True)
        return r["output"], r["lse"], time.perf_counter() - started, api.base

    with concurrent.futures.ThreadPoolExecutor(shards) as pool:
        answers = list(pool.map(shard, range(shards)))
    for i, (_, lse, seconds, base) in enumerate(answers):
        print(f"  shard {i} on {base}: {seconds * 1e3:.1f} ms, lse[0, 0] = {lse[0, 0]:.6f}")
    merged, merged_lse = merge([(o, lse) for o, lse, _, _ in answers])

    whole = servers[0].attention(q=q, k=k, v=v, mask=mask, return_lse=True)
    ref_o, ref_lse = reference(q, k, v, mask)
    errors = {
        "merged vs one request, output": np.abs(merged - whole["output"]).max(),
        "merged vs one request, lse": np.abs(merged_lse - whole["lse"]).max(),
        "merged vs float64, output": np.abs(merged - ref_o).max(),
        "merged vs float64, lse": np.abs(merged_lse - ref_lse).max(),
    }
    for what, err in errors.items():
        print(f"max |{what} difference| = {err:.3g}")
    # float32 rounding of outputs of magnitude ~0.1 and of lse ~ 9.5
    ok = all(err < 1e-5 for err in errors.values())
    print("merge exact to float32 rounding" if ok else "MERGE DIFFERS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["http://127.0.0.1:8080"]))
