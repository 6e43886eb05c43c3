#!/usr/bin/env python3
"""End-to-end cross-check of a running attnd against PyTorch autograd.

Starts the server named by ATTND_BIN (default build/attnd) on a free port of
127.0.0.1, sends /v1/attention and /v1/multihead requests built from seeded
random data, and compares every number that comes back with the same
computation written in plain torch ops in float64 (the reference) and
float32 (reported, for scale).  Gradients come from torch autograd, never
from a hand-written backward pass, so the check is independent of lib/.

Where the contract (api/openapi.yaml) differs from PyTorch it wins:
- a query row that sees no key gives zeros (output, weights, gradients);
  plain torch gives NaN there, so the reference uses a "safe" softmax that
  zeroes those rows, and the masked cases also compare the remaining rows
  with a plain -inf softmax;
- /v1/multihead uses the chapter's convention Q = X W_Q + b_Q with weights
  [d_in, d_out] multiplied on the right, head i = i-th block of columns.

Each case prints one line; the run ends with "N passed, N failed" and a
non-zero exit status when anything failed.  TORCH_CHECK_ONLY=TEXT runs only
the cases whose names hold TEXT (say "ragged "), and says how many it left out.  Standard library, numpy and
torch only.
"""
import base64
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request

import numpy as np

try:
    import torch
except ImportError:  # a machine without python3-torch cannot run this check
    print("torch_check: python3-torch is not installed; skipped")
    print("0 passed, 0 failed")
    sys.exit(0)

torch.set_num_threads(1)

FWD_TOL = 1e-5   # forward output, weights, statistics: relative to magnitude
GRAD_TOL = 1e-4  # gradients: relative to magnitude

# ---------------------------------------------------------------- server


class Server:
    """One attnd child process on a free loopback port (--port 0)."""

    def __init__(self, binary):
        self.log = tempfile.NamedTemporaryFile(prefix="attnd-torch-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", "0", "--threads", "2"],
            stdout=subprocess.DEVNULL, stderr=self.log)
        self.port = None
        deadline = time.time() + 15
        while time.time() < deadline and self.port is None:
            if self.proc.poll() is not None:
                raise RuntimeError("attnd exited at start: " + self.log_text())
            for line in self.log_text().splitlines():
                if "listening on 127.0.0.1:" in line:
                    self.port = int(line.split("listening on 127.0.0.1:")[1].split()[0])
                    break
            time.sleep(0.05)
        if self.port is None:
            self.stop()
            raise RuntimeError("attnd did not report its port: " + self.log_text())

    def log_text(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def stop(self):
        """SIGTERM, and the exit status (0 is a clean drain)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def request(self, method, path, body=None):
        """Any method, a JSON body or none; returns (status, headers, parsed json or None)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=data,
                                     headers={"Content-Type": "application/json"}, method=method)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                status, headers, text = r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as e:
            status, headers, text = e.code, e.headers, e.read().decode()
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = None
        return status, headers, parsed

    def post(self, path, body):
        """POST a JSON body (dict or raw text); returns (status, text, parsed json or None)."""
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        req = urllib.request.Request(
            "http://127.0.0.1:%d%s" % (self.port, path), data=data,
            headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        return status, text, parsed


# ---------------------------------------------------------------- tensor codec


def enc(a, how="nested"):
    """A request tensor in one of the three encodings the API accepts."""
    a = np.asarray(a)
    if a.dtype == np.bool_:
        if how == "nested":
            return a.tolist()
        if how == "flat":
            return {"shape": list(a.shape), "data": a.reshape(-1).tolist()}
        return {"shape": list(a.shape), "dtype": "bool",
                "base64": base64.b64encode(a.astype(np.uint8).tobytes()).decode()}
    a = a.astype(np.float32)
    if how == "nested":
        return a.astype(np.float64).tolist()
    if how == "flat":
        return {"shape": list(a.shape), "data": a.astype(np.float64).reshape(-1).tolist()}
    return {"shape": list(a.shape), "dtype": "float32",
            "base64": base64.b64encode(a.astype("<f4").tobytes()).decode()}


def dec(t):
    """A response tensor as float32: text numbers read as Python floats then rounded."""
    if isinstance(t, dict):
        shape = tuple(t["shape"])
        if "base64" in t:
            if t.get("dtype") != "float32":
                raise AssertionError("base64 tensor with dtype %r" % t.get("dtype"))
            return np.frombuffer(base64.b64decode(t["base64"]), dtype="<f4").reshape(shape).astype(np.float32)
        data = np.array([float(x) for x in t["data"]], dtype=np.float64)
        return data.astype(np.float32).reshape(shape)
    arr = np.array(t, dtype=np.float64)
    if arr.dtype == object:
        raise AssertionError("ragged nested tensor in the response")
    return arr.astype(np.float32)


def f32(x):
    return float(np.float32(x))


# ---------------------------------------------------------------- references


def _t(a, dtype, grad=False):
    """A leaf tensor from an array (float32 request data, or float64 projections)."""
    a = np.asarray(a)
    if a.dtype not in (np.float32, np.float64):
        a = a.astype(np.float32)
    return torch.from_numpy(a.copy()).to(dtype).requires_grad_(grad)


def rope_rotate(x, positions, base):
    """Rotary position embedding from its definition: for t < d/2
    the pair (x_t, x_{t+d/2}) of the row at position p turns by the angle
    p * base^(-2t/d), computed in float64 (rotate-half, GPT-NeoX / Llama)."""
    d = x.shape[-1]
    half = d // 2
    t = torch.arange(half, dtype=torch.float64)
    angle = positions.to(torch.float64)[:, None] * (float(base) ** (-2.0 * t / d))[None, :]
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def biased_and_visible(s, pos_q, pos_k, alibi, mask, causal, window):
    """Scores s [.., n_q, n_k] with ALiBi (the slopes as float32, as attnd
    reads them) and an additive mask added; and which pairs are visible: a
    boolean mask's, within the band causal and window leave. Returns
    (s, allowed, band)."""
    dtype, n_q, n_k = s.dtype, s.shape[-2], s.shape[-1]
    i, j = pos_q[:, None], pos_k[None, :]
    if alibi is not None:
        sl = torch.from_numpy(np.asarray(alibi, np.float32).copy()).to(dtype)
        lead = tuple(s.shape[:-2])
        if sl.numel() == int(np.prod(lead)):  # a slope per (batch, head), or per head of one sequence
            sl = sl.reshape(lead + (1, 1))
        else:  # [H_q] shared by the batch
            sl = sl.reshape(-1, 1, 1)
        s = s - sl * (i - j).abs().to(dtype)
    allowed = torch.ones(s.shape, dtype=torch.bool)
    if mask is not None:
        m = torch.from_numpy(np.asarray(mask).copy())
        if m.dtype == torch.bool:
            allowed = allowed & m
        else:
            s = s + m.to(dtype)
    band = torch.ones((n_q, n_k), dtype=torch.bool)
    if causal:
        band = band & (j <= i)
    if window is not None:
        left, right = window
        if left != -1:
            band = band & (j >= i - left)
        if right != -1:
            band = band & (j <= i + right)
    return s, allowed & band, band


def attend(tq, tk, tv, scale, causal=False, mask=None, window=None, alibi=None, softcap=None,
           rope=None):
    """Attention of query rows tq [..., n_q, d_k] over tk [..., n_k, d_k], tv,
    with every variant written from its definition; heads on
    dim -3 (when present) are grouped-query: tk, tv may have fewer.

    Positions are bottom-right aligned: query i at p_i = i + n_k - n_q, key j
    at j.  The final score is softcap(scale q.k) - slope |p_i - j| + bias;
    causal, window and a boolean mask hide keys.  Fully masked rows give
    zeros (the contract), and their lse is -inf.  Returns a dict of torch tensors:
    o, o_plain (plain -inf softmax: NaN rows), w, lse, full, s_raw (q.k after
    the rotation), s_capped (scaled and capped, no ALiBi or bias), allowed,
    and band (the pairs causal and window leave, what meta.flops counts)."""
    n_q, n_k = tq.shape[-2], tk.shape[-2]
    pos_q = torch.arange(n_q) + (n_k - n_q)
    pos_k = torch.arange(n_k)
    if rope is not None:
        tq = rope_rotate(tq, pos_q, rope)
        tk = rope_rotate(tk, pos_k, rope)
    kk, vv = tk, tv
    if tq.dim() >= 3 and tq.shape[-3] != tk.shape[-3]:
        g = tq.shape[-3] // tk.shape[-3]
        kk, vv = tk.repeat_interleave(g, dim=-3), tv.repeat_interleave(g, dim=-3)
    s_raw = tq @ kk.transpose(-1, -2)
    s = s_raw * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s_capped = s
    s, allowed, band = biased_and_visible(s, pos_q, pos_k, alibi, mask, causal, window)
    full = ~allowed.any(dim=-1, keepdim=True)
    s_masked = s.masked_fill(~allowed, float("-inf"))
    w_plain = torch.softmax(s_masked, dim=-1)
    w = torch.softmax(s_masked.masked_fill(full, 0.0), dim=-1).masked_fill(full, 0.0)
    lse = torch.logsumexp(s_masked, dim=-1)
    # libattn counts the FLOPs of the band a window leaves (causal included);
    # without a window (or [-1, -1], which is none), of every pair
    windowed = window is not None and tuple(window) != (-1, -1)
    return {"o": w @ vv, "o_plain": w_plain @ vv, "w": w, "lse": lse, "full": full.squeeze(-1),
            "s_raw": s_raw, "s_capped": s_capped, "allowed": allowed,
            "band": int(band.sum()) if windowed else n_q * n_k}


def score_stats(r):
    """The statistics of return_stats from attend(): the raw scores (q.k after RoPE) and the
    scaled, capped scores over the visible entries; entropy and max weight
    over the rows that see a key."""
    sr = r["s_raw"].detach().to(torch.float64)
    sc = r["s_capped"].detach().to(torch.float64)
    sel = r["allowed"].expand(sr.shape)
    wd = r["w"].detach().to(torch.float64)
    rows = ~r["full"].expand(wd.shape[:-1])
    ent = -(torch.where(wd > 0, wd * torch.log(torch.where(wd > 0, wd, torch.ones_like(wd))),
                        torch.zeros_like(wd))).sum(-1)[rows]
    mx = wd.max(dim=-1).values[rows]

    def mv(x):
        if x.numel() == 0:
            return None, None
        return float(x.mean()), float(((x - x.mean()) ** 2).mean())
    sm, svar = mv(sr[sel])
    ssm, ssvar = mv(sc[sel])
    return {
        "scores": {"mean": sm, "var": svar},
        "scaled_scores": {"mean": ssm, "var": ssvar},
        "entropy": ({"mean": float(ent.mean()), "min": float(ent.min()), "max": float(ent.max())}
                    if ent.numel() else {"mean": None, "min": None, "max": None}),
        "max_weight": {"mean": float(mx.mean()) if mx.numel() else None},
    }


def ref_sdpa(q, k, v, dtype, causal=False, mask=None, scale=None, go=None, **variants):
    """softmax(scale q k^T + bias, masked) v in torch; fully masked rows zero.
    variants: window, alibi, softcap, rope (attend()).

    Returns a dict: o, o_plain (plain -inf softmax, NaN rows), w, lse, full
    (rows that see no key), stats, flops (meta.flops of the forward), and
    dq, dk, dv by autograd when go is given."""
    tq, tk, tv = _t(q, dtype, go is not None), _t(k, dtype, go is not None), _t(v, dtype, go is not None)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    a = attend(tq, tk, tv, scale, causal, mask, **variants)
    o = a["o"]
    lead = int(np.prod(q.shape[:-2])) if q.ndim > 2 else 1
    def npy(t):  # numpy has no bfloat16: such results come back as float32
        t = t.detach()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    r = {"o": npy(o), "o_plain": npy(a["o_plain"]), "w": npy(a["w"]), "lse": npy(a["lse"]),
         "full": a["full"].numpy(), "stats": score_stats(a),
         "flops": 2 * lead * a["band"] * (q.shape[-1] + v.shape[-1])}
    if go is not None:
        o.backward(_t(go, dtype))
        r["dq"], r["dk"], r["dv"] = npy(tq.grad), npy(tk.grad), npy(tv.grad)
    return r


MHA_PARAMS = ("x", "context", "w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")


def ref_mha(p, h, dtype, h_kv=None, causal=False, mask=None, scale=None, go=None, **variants):
    """Chapter-convention multi-head attention (Q = X W_Q + b_Q) in torch,
    the variants applied per head after the projections.

    p maps parameter names to arrays; returns o, w (per head), w_mean, lse
    [B?, h, n], stats, and the autograd gradient of every parameter given
    when go is given."""
    h_kv = h_kv or h
    t = {name: _t(p[name], dtype, go is not None) for name in MHA_PARAMS if name in p}
    x = t["x"]
    unbatched = x.dim() == 2
    ctx = t.get("context", x)
    if unbatched:
        x, ctx = x.unsqueeze(0), ctx.unsqueeze(0)
    B, n, _ = x.shape
    m = ctx.shape[1]
    d_k = t["w_q"].shape[1] // h
    d_v = t["w_v"].shape[1] // h_kv
    Q = x @ t["w_q"] + (t["b_q"] if "b_q" in t else 0)
    K = ctx @ t["w_k"] + (t["b_k"] if "b_k" in t else 0)
    V = ctx @ t["w_v"] + (t["b_v"] if "b_v" in t else 0)
    Q = Q.reshape(B, n, h, d_k).transpose(1, 2)
    K = K.reshape(B, m, h_kv, d_k).transpose(1, 2)
    V = V.reshape(B, m, h_kv, d_v).transpose(1, 2)
    if scale is None:
        scale = 1.0 / math.sqrt(d_k)
    a = attend(Q, K, V, scale, causal, mask, **variants)
    w = a["w"]
    heads = a["o"].transpose(1, 2).reshape(B, n, h * d_v)
    o = heads
    if "w_o" in t:
        o = heads @ t["w_o"] + (t["b_o"] if "b_o" in t else 0)
    wd, lse = w.detach().float(), a["lse"].detach().float()
    if dtype == torch.float64:
        wd, lse = w.detach(), a["lse"].detach()
    if unbatched:
        o, wd, lse = o.squeeze(0), wd.squeeze(0), lse.squeeze(0)

    def npy(t):  # numpy has no bfloat16: such results come back as float32
        t = t.detach()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    r = {"o": npy(o), "w": wd.numpy(), "w_mean": wd.mean(dim=-3).numpy(),
         "lse": lse.numpy(), "stats": score_stats(a) if dtype != torch.bfloat16 else None}
    if go is not None:
        o.backward(_t(go, dtype))
        r["grad"] = {name: npy(t[name].grad) for name in t}
    return r


# ---------------------------------------------------------------- cases


class Case:
    """One named check: a list of comparisons and explicit failures."""

    def __init__(self, name):
        self.name = name
        self.cmps = []    # (what, err, tol, err32)
        self.fails = []
        self.note = ""

    def fail(self, msg):
        self.fails.append(msg)

    def expect(self, cond, msg):
        if not cond:
            self.fail(msg)

    def close(self, what, got, ref64, ref32=None, rel=FWD_TOL, rows_zero=None):
        """got vs ref64 within rel * max(1, max|ref64|); err vs ref32 reported."""
        got = np.asarray(got, dtype=np.float64)
        ref = np.asarray(ref64, dtype=np.float64)
        if got.shape != ref.shape:
            self.fail("%s: shape %s, expected %s" % (what, list(got.shape), list(ref.shape)))
            return
        if not np.all(np.isfinite(got)):
            self.fail("%s: %d non-finite values" % (what, int(np.sum(~np.isfinite(got)))))
            return
        tol = rel * max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
        if ref32 is not None and ref.size:
            # Where the problem itself is ill-conditioned in float32 (scores of
            # 2^20 whose gradients cancel), PyTorch's own float32 answer is
            # off by more than rel: allow twice its error, no more.
            own32 = np.abs(np.asarray(ref32, dtype=np.float64) - ref)
            tol = max(tol, 2.0 * float(np.nanmax(own32)))
        diff = np.abs(got - ref)
        err = float(diff.max()) if diff.size else 0.0
        err32 = float("nan")
        if ref32 is not None:
            d32 = np.abs(got - np.asarray(ref32, dtype=np.float64))
            err32 = float(np.nanmax(d32)) if d32.size else 0.0
        self.cmps.append((what, err, tol, err32))
        if err > tol:
            idx = np.unravel_index(int(np.argmax(diff)), diff.shape)
            self.fail("%s: max err %.3g > tol %.3g at %s (got %r, expected %r)"
                      % (what, err, tol, list(idx), float(got[idx]), float(ref[idx])))

    def zero_rows(self, what, got, full):
        """Rows flagged in full (shape got.shape[:-1]) must be exactly 0."""
        got = np.asarray(got)
        if not full.any():
            return
        bad = got[np.broadcast_to(full, got.shape[:-1])]
        self.expect(np.all(bad == 0), "%s: fully masked rows not zero (max |x| %g)"
                    % (what, float(np.max(np.abs(bad))) if bad.size else 0.0))

    def report(self):
        ok = not self.fails
        if self.cmps:
            what, err, tol, err32 = max(self.cmps, key=lambda c: c[1] / c[2])
            line = "%-46s max_err %.2e (%s) tol %.1e  vs_f32 %s  %s" % (
                self.name, err, what, tol, "-" if math.isnan(err32) else "%.2e" % err32,
                "ok" if ok else "FAIL")
        else:
            line = "%-46s %s%s" % (self.name, self.note + "  " if self.note else "", "ok" if ok else "FAIL")
        print(line)
        for f in self.fails:
            print("    " + f)
        sys.stdout.flush()
        return ok


RESULTS = []
MAXERR = {"forward": 0.0, "grad": 0.0, "f32_forward": 0.0, "f32_grad": 0.0}


ONLY = os.environ.get("TORCH_CHECK_ONLY", "")
LEFT_OUT = []


def run_case(name, fn, *args, **kw):
    if ONLY not in name:
        LEFT_OUT.append(name)
        return
    c = Case(name)
    try:
        fn(c, *args, **kw)
    except Exception as e:  # a crash in a case is its failure, not the run's
        c.fail("exception: %s: %s" % (type(e).__name__, e))
        tb = traceback.format_exc().strip().splitlines()
        c.fail(" | ".join(tb[-3:]))
    for what, err, tol, err32 in (c.cmps if not c.fails else ()):
        # summary errors (over the cases that passed) are relative to max(1, max|ref|), like the tolerances
        key = "grad" if what.startswith("grad") else "forward"
        mag = tol / (GRAD_TOL if key == "grad" else FWD_TOL)
        MAXERR[key] = max(MAXERR[key], err / mag)
        if not math.isnan(err32):
            MAXERR["f32_" + key] = max(MAXERR["f32_" + key], err32 / mag)
    RESULTS.append(c.report())


RNG = np.random.default_rng(20261130)


def rnd(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def stats_close(c, got, ref, prefix="stats"):
    if not isinstance(got, dict):
        c.fail("%s missing" % prefix)
        return
    for group, keys in (("scores", ("mean", "var")), ("scaled_scores", ("mean", "var")),
                        ("entropy", ("mean", "min", "max")), ("max_weight", ("mean",))):
        for key in keys:
            g = got.get(group, {}).get(key, "absent")
            e = ref[group][key]
            what = "%s.%s.%s" % (prefix, group, key)
            if e is None:
                c.expect(g is None, "%s: expected null, got %r" % (what, g))
            elif not isinstance(g, (int, float)) or isinstance(g, bool):
                c.fail("%s: expected %r, got %r" % (what, e, g))
            else:
                c.close(what, g, e, rel=FWD_TOL)


# ---- /v1/attention


def variant_fields(body, variants, encoding):
    """The request fields of attend()'s variants."""
    if variants.get("window") is not None:
        body["window"] = list(variants["window"])
    if variants.get("alibi") is not None:
        body["alibi_slopes"] = enc(variants["alibi"], encoding)
    if variants.get("softcap") is not None:
        body["softcap"] = variants["softcap"]
    if variants.get("rope") is not None:
        body["rope"] = {"base": variants["rope"]}


def check_lse(c, resp, asked, r64):
    """"lse" present exactly when return_lse asked for it, and right."""
    if not asked:
        c.expect("lse" not in resp, "lse present without return_lse")
    elif "lse" not in resp:
        c.fail("lse missing")
    else:
        lse_close(c, resp["lse"], r64["lse"])


def lse_close(c, got, ref, rel=FWD_TOL):
    """lse against the reference: -inf rows must come back as null (text) or
    -inf (base64) and nothing else; the rest as numbers."""
    ref = np.asarray(ref, dtype=np.float64)
    if isinstance(got, dict) and "base64" in got:
        g = dec(got).astype(np.float64)
    else:
        flat = got["data"] if isinstance(got, dict) else got
        arr = np.array(flat, dtype=object)
        if isinstance(got, dict):
            arr = arr.reshape(tuple(got["shape"]))
        if arr.shape != ref.shape:
            c.fail("lse: shape %s, expected %s" % (list(arr.shape), list(ref.shape)))
            return
        nulls = np.vectorize(lambda x: x is None, otypes=[bool])(arr)
        c.expect(np.array_equal(nulls, np.isneginf(ref)),
                 "lse: null at %s, the reference's -inf at %s"
                 % (np.argwhere(nulls).tolist()[:4], np.argwhere(np.isneginf(ref)).tolist()[:4]))
        g = np.where(nulls, -np.inf, arr).astype(np.float64)
    if g.shape != ref.shape:
        c.fail("lse: shape %s, expected %s" % (list(g.shape), list(ref.shape)))
        return
    inf = np.isneginf(ref)
    c.expect(np.array_equal(np.isneginf(g), inf), "lse: -inf rows differ from the reference's")
    c.expect(not np.any(np.isnan(g)) and not np.any(np.isposinf(g)), "lse: NaN or +inf")
    if (~inf).any():
        c.close("lse", g[~inf], ref[~inf], rel=rel)


def attention_case(c, srv, q, k, v, causal=False, mask=None, scale=None, go=None,
                   weights=False, stats=False, mask_enc="nested", encoding="nested",
                   out_encoding=None, lse=False, **variants):
    """Send one /v1/attention request and compare everything against torch.
    variants: window, alibi, softcap, rope, as attend() takes them."""
    body = {"q": enc(q, encoding), "k": enc(k, encoding), "v": enc(v, encoding)}
    variant_fields(body, variants, encoding)
    if lse:
        body["return_lse"] = True
    if causal:
        body["causal"] = True
    if mask is not None:
        body["mask"] = enc(mask, mask_enc)
    if scale is not None:
        body["scale"] = scale
    if go is not None:
        body["grad_output"] = enc(go, encoding)
    if weights:
        body["return_weights"] = True
    if stats:
        body["return_stats"] = True
    if out_encoding:
        body["output_encoding"] = out_encoding
    status, text, resp = srv.post("/v1/attention", body)
    if status != 200:
        c.fail("status %d: %s" % (status, text[:300]))
        return None
    r64 = ref_sdpa(q, k, v, torch.float64, causal, mask, scale, go, **variants)
    r32 = ref_sdpa(q, k, v, torch.float32, causal, mask, scale, go, **variants)
    out = dec(resp["output"])
    c.close("output", out, r64["o"], r32["o"])
    full = r64["full"]
    if full.any():
        c.zero_rows("output", out, full)
        keep = ~np.broadcast_to(full, out.shape[:-1])
        c.close("output(rows vs plain torch)", out[keep], r64["o_plain"][keep])
        c.expect(np.all(np.isnan(r64["o_plain"][~keep])), "reference: plain torch rows not NaN")
    if weights:
        if "weights" not in resp:
            c.fail("weights missing")
        else:
            w = dec(resp["weights"])
            c.close("weights", w, r64["w"], r32["w"])
            c.zero_rows("weights", w, full)
    else:
        c.expect("weights" not in resp, "weights present without return_weights")
    if stats:
        stats_close(c, resp.get("stats"), r64["stats"])
    if go is not None:
        g = resp.get("grad") or {}
        for name, key in (("q", "dq"), ("k", "dk"), ("v", "dv")):
            if name not in g:
                c.fail("grad.%s missing" % name)
                continue
            c.close("grad." + name, dec(g[name]), r64[key], r32[key], rel=GRAD_TOL)
        if "q" in g and full.any():
            c.zero_rows("grad.q", dec(g["q"]), full)
    else:
        c.expect("grad" not in resp, "grad present without grad_output")
    check_lse(c, resp, lse, r64)
    flops = r64["flops"] * (3.5 if go is not None else 1)
    c.expect(resp.get("meta", {}).get("flops") == flops,
             "meta.flops %r, expected %r" % (resp.get("meta", {}).get("flops"), flops))
    meta = resp.get("meta", {}).get("shape", {})
    c.expect(meta.get("n_q") == q.shape[-2] and meta.get("n_k") == k.shape[-2]
             and meta.get("d_k") == q.shape[-1] and meta.get("d_v") == v.shape[-1],
             "meta.shape %r" % meta)
    return resp


def simple(c, srv, shape_q, shape_k, shape_v, **kw):
    q, k, v = rnd(*shape_q), rnd(*shape_k), rnd(*shape_v)
    go = rnd(*(shape_q[:-1] + (shape_v[-1],))) if kw.pop("grad", True) else None
    mask = kw.pop("mask_fn", None)
    if mask is not None:
        mask = mask(shape_q, shape_k)
    attention_case(c, srv, q, k, v, go=go, mask=mask, **kw)


def bool_mask(shape, p=0.7):
    return RNG.random(shape) < p


def encodings_case(c, srv):
    """The same problem in every input encoding and output encoding: identical
    bits, and the text numbers read back as exactly the base64 float32s."""
    q, k, v = rnd(2, 5, 7), rnd(2, 9, 7), rnd(2, 9, 3)
    go = rnd(2, 5, 3)
    bm = bool_mask((2, 1, 9))
    fm = rnd(5, 9, scale=0.5)
    outs = {}
    for ienc in ("nested", "flat", "base64"):
        for oenc in ("nested", "flat", "base64"):
            for mname, m in (("bool", bm), ("float", fm)):
                body = {"q": enc(q, ienc), "k": enc(k, ienc), "v": enc(v, ienc),
                        "mask": enc(m, ienc), "causal": True, "grad_output": enc(go, ienc),
                        "return_weights": True, "output_encoding": oenc}
                status, text, resp = srv.post("/v1/attention", body)
                if status != 200:
                    c.fail("%s/%s/%s: status %d %s" % (ienc, oenc, mname, status, text[:200]))
                    continue
                tensors = {"output": resp["output"], "weights": resp["weights"],
                           "grad.q": resp["grad"]["q"], "grad.k": resp["grad"]["k"],
                           "grad.v": resp["grad"]["v"]}
                for name, t in tensors.items():
                    if oenc == "nested":
                        c.expect(isinstance(t, list), "%s: nested output is %s" % (name, type(t)))
                    elif oenc == "flat":
                        c.expect(isinstance(t, dict) and "data" in t and "shape" in t,
                                 "%s: flat output %r" % (name, str(t)[:80]))
                    else:
                        c.expect(isinstance(t, dict) and t.get("dtype") == "float32" and "base64" in t,
                                 "%s: base64 output %r" % (name, str(t)[:80]))
                outs[(ienc, oenc, mname)] = {n: dec(t) for n, t in tensors.items()}
    for mname, m in (("bool", bm), ("float", fm)):
        base = outs.get(("base64", "base64", mname))
        if base is None:
            continue
        r64 = ref_sdpa(q, k, v, torch.float64, True, m, None, go)
        r32 = ref_sdpa(q, k, v, torch.float32, True, m, None, go)
        c.close("output[%s]" % mname, base["output"], r64["o"], r32["o"])
        c.close("weights[%s]" % mname, base["weights"], r64["w"], r32["w"])
        for n in "qkv":
            c.close("grad.%s[%s]" % (n, mname), base["grad." + n], r64["d" + n], r32["d" + n], rel=GRAD_TOL)
        for key, got in outs.items():
            if key[2] != mname:
                continue
            for n, arr in got.items():
                if arr.shape != base[n].shape or not np.array_equal(arr.view(np.uint32), base[n].view(np.uint32)):
                    c.fail("%s differs between %s in / %s out and base64/base64 (max diff %g)"
                           % (n, key[0], key[1], float(np.max(np.abs(arr.astype(np.float64) - base[n])))
                              if arr.shape == base[n].shape else float("nan")))


def roundtrip_case(c, srv):
    """Text numbers (nested and flat) parse back to the base64 float32 bits,
    over values of many magnitudes."""
    q = rnd(3, 40, 16, scale=3.0)
    k = rnd(3, 50, 16, scale=3.0)
    v = (rnd(3, 50, 8) * np.exp(RNG.uniform(-30, 30, (3, 50, 8)))).astype(np.float32)
    go = (rnd(3, 40, 8) * np.exp(RNG.uniform(-10, 10, (3, 40, 8)))).astype(np.float32)
    got = {}
    for oenc in ("nested", "flat", "base64"):
        status, text, resp = srv.post("/v1/attention", {
            "q": enc(q, "base64"), "k": enc(k, "base64"), "v": enc(v, "base64"),
            "grad_output": enc(go, "base64"), "return_weights": True, "output_encoding": oenc})
        if status != 200:
            c.fail("%s: status %d %s" % (oenc, status, text[:200]))
            return
        got[oenc] = [dec(resp["output"]), dec(resp["weights"]), dec(resp["grad"]["q"]),
                     dec(resp["grad"]["k"]), dec(resp["grad"]["v"])]
    count = 0
    for oenc in ("nested", "flat"):
        for a, b in zip(got[oenc], got["base64"]):
            count += a.size
            same = a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))
            if not same:
                bad = np.argwhere(a.view(np.uint32) != b.view(np.uint32))
                i = tuple(bad[0])
                c.fail("%s text number at %s reads as %r, base64 has %r (%d differ)"
                       % (oenc, list(i), float(a[i]), float(b[i]), len(bad)))
    r64 = ref_sdpa(q, k, v, torch.float64, go=go)
    c.close("output", got["base64"][0], r64["o"])
    c.close("grad.v", got["base64"][4], r64["dv"], rel=GRAD_TOL)
    c.expect(count > 0, "nothing compared")


def onehot_case(c, srv):
    """Scores of +-1e4 give the exact one-hot answer (and gradients of 0)."""
    q = np.array([[100, 0], [0, 100], [-100, 0], [0, -100]], dtype=np.float32)
    k = np.array([[100, 0], [0, 100], [-100, 0], [0, -100], [0, 0]], dtype=np.float32)
    v = rnd(5, 3)
    go = rnd(4, 3)
    for scale in (1.0, None):
        body = {"q": enc(q), "k": enc(k), "v": enc(v), "return_weights": True,
                "grad_output": enc(go), "return_stats": True, "output_encoding": "base64"}
        if scale is not None:
            body["scale"] = scale
        status, text, resp = srv.post("/v1/attention", body)
        if status != 200:
            c.fail("scale %r: status %d %s" % (scale, status, text[:200]))
            continue
        w = dec(resp["weights"])
        o = dec(resp["output"])
        c.expect(np.array_equal(w, np.eye(4, 5, dtype=np.float32)), "weights not exactly one-hot: %r" % w)
        c.expect(np.array_equal(o, v[:4]), "output not exactly v rows: max diff %g"
                 % float(np.max(np.abs(o - v[:4]))))
        for n in "qkv":
            c.expect(np.all(np.isfinite(dec(resp["grad"][n]))), "grad.%s not finite" % n)
        c.close("grad.q(scale=%r)" % scale, dec(resp["grad"]["q"]), np.zeros((4, 2)), rel=GRAD_TOL)
        r64 = ref_sdpa(q, k, v, torch.float64, scale=scale, go=go)
        c.expect(np.array_equal(r64["dq"], np.zeros((4, 2))), "reference grad.q not zero")
        c.close("output(scale=%r)" % scale, o, r64["o"])
        c.close("grad.k(scale=%r)" % scale, dec(resp["grad"]["k"]), r64["dk"], rel=GRAD_TOL)
        c.close("grad.v(scale=%r)" % scale, dec(resp["grad"]["v"]), r64["dv"], rel=GRAD_TOL)
        stats_close(c, resp.get("stats"), r64["stats"])


def large_bias_case(c, srv, bias, exact):
    """An additive mask with a large constant on whole rows (a padded query row,
    HuggingFace style) and on one key column.  Softmax is invariant to a row's
    constant, so the answer is that of the scores alone.
    exact: q, k are small integers and scale 1/2, so every biased score
    (a multiple of 1/2 plus the bias) is exact in float32 and float64 and the
    float64 reference is fair.  Otherwise (|bias| 1e9 absorbs the scores, so
    the rows are uniform) the reference is float32 torch."""
    if exact:
        q = RNG.integers(-1, 2, (2, 6, 4)).astype(np.float32)
        k = RNG.integers(-1, 2, (2, 9, 4)).astype(np.float32)
    else:
        q, k = rnd(2, 6, 4), rnd(2, 9, 4)
    v, go = rnd(2, 9, 4), rnd(2, 6, 4)
    m = np.zeros((6, 9), np.float32)
    m[:, 3] = -abs(bias)
    m[2, :] = bias
    m[5, :] = bias
    body = {"q": enc(q), "k": enc(k), "v": enc(v), "mask": enc(m), "return_weights": True,
            "scale": 0.5, "grad_output": enc(go), "output_encoding": "base64", "return_stats": exact}
    status, text, resp = srv.post("/v1/attention", body)
    if status != 200:
        c.fail("status %d: %s" % (status, text[:300]))
        return
    r32 = ref_sdpa(q, k, v, torch.float32, mask=m, scale=0.5, go=go)
    r = ref_sdpa(q, k, v, torch.float64, mask=m, scale=0.5, go=go) if exact else r32
    c.close("output", dec(resp["output"]), r["o"], r32["o"])
    c.close("weights", dec(resp["weights"]), r["w"], r32["w"])
    for n in "qkv":
        c.close("grad." + n, dec(resp["grad"][n]), r["d" + n], r32["d" + n], rel=GRAD_TOL)
    if exact:
        stats_close(c, resp.get("stats"), r["stats"])


def number_text_case(c, srv):
    """Request numbers are read as Python's json reads them, then rounded to
    float32 (torch.tensor(json.loads(body))), extremes and double rounding
    included; the one-hot weights copy v to the output bit for bit."""
    from decimal import Decimal, getcontext
    getcontext().prec = 60
    half = Decimal(1) + Decimal(2) ** -24          # halfway between 1 and its float32 successor
    above = format(half + Decimal(2) ** -54, "f")  # reads as the halfway double, so ties to 1.0
    texts = ["1e-45", "1.401298464324817e-45", "-7.1e-46", "1e-50", "3.4028235e38", "3.40282356e38",
             "-1.1754944e-38", "0.1", "16777217", "3.4028235677973362e38", above, "-" + above,
             "123456789", "2.5e-40"]
    n = len(texts)
    eye = (np.eye(n) * 100).tolist()
    body = '{"q": %s, "k": %s, "v": [%s], "scale": 1, "output_encoding": "%%s"}' % (
        json.dumps(eye), json.dumps(eye), ",".join("[%s]" % t for t in texts))
    got = {}
    for oenc in ("base64", "nested"):
        status, text, resp = srv.post("/v1/attention", body % oenc)
        if status != 200:
            c.fail("%s: status %d %s" % (oenc, status, text[:200]))
            return
        got[oenc] = dec(resp["output"]).reshape(-1)
    for i, t in enumerate(texts):
        want = np.float32(float(t))
        for oenc, out in got.items():
            c.expect(out[i].view(np.uint32) == want.view(np.uint32),
                     "%s read as %r (%s out), torch.tensor(json.loads) gives %r"
                     % (t, float(out[i]), oenc, float(want)))
    for t in ("3.4028236e38", "3.4028235677973366e38", "-1e39", "1e400"):
        status, text, resp = srv.post("/v1/attention", '{"q": [[1]], "k": [[1]], "v": [[%s]]}' % t)
        code = ((resp or {}).get("error") or {}).get("code") if isinstance(resp, dict) else None
        c.expect(status == 400 and code == "invalid_number",
                 "%s (not finite as float32): status %d code %r" % (t, status, code))


def concurrent_case(c, srv):
    """Requests of different shapes at once give each its own right answer."""
    import concurrent.futures
    jobs = []
    for i in range(12):
        n_q, n_k = 5 + 37 * i % 90, 3 + 53 * i % 150
        q, k, v, go = rnd(2, n_q, 16), rnd(2, n_k, 16), rnd(2, n_k, 8), rnd(2, n_q, 8)
        body = {"q": enc(q, "base64"), "k": enc(k, "base64"), "v": enc(v, "base64"),
                "grad_output": enc(go, "base64"), "causal": bool(i % 2), "output_encoding": "base64"}
        jobs.append((q, k, v, go, bool(i % 2), body))
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        answers = list(ex.map(lambda j: srv.post("/v1/attention", j[5]), jobs))
    for i, ((q, k, v, go, causal, _), (status, text, resp)) in enumerate(zip(jobs, answers)):
        if status != 200:
            c.fail("request %d: status %d %s" % (i, status, text[:200]))
            continue
        r = ref_sdpa(q, k, v, torch.float64, causal, go=go)
        c.close("output#%d" % i, dec(resp["output"]), r["o"])
        c.close("grad.k#%d" % i, dec(resp["grad"]["k"]), r["dk"], rel=GRAD_TOL)


def score_offset_case(c, srv, offset):
    """No mask: every score of a row is offset + a small integer, exactly
    representable in float32 (q = [sqrt(offset), a], k = [sqrt(offset), b],
    scale 1), so the float64 reference is fair and softmax, being invariant to
    the offset, is far from one-hot."""
    root = math.sqrt(offset)
    q = np.concatenate([np.full((2, 5, 1), root), RNG.integers(-1, 2, (2, 5, 3))], -1).astype(np.float32)
    k = np.concatenate([np.full((2, 7, 1), root), RNG.integers(-1, 2, (2, 7, 3))], -1).astype(np.float32)
    v, go = rnd(2, 7, 3), rnd(2, 5, 3)
    attention_case(c, srv, q, k, v, scale=1.0, go=go, weights=True, stats=True)


def all_masked_stats_case(c, srv):
    """Every entry masked: zeros everywhere, statistics null."""
    q, k, v, go = rnd(3, 4), rnd(5, 4), rnd(5, 2), rnd(3, 2)
    mask = np.zeros((5,), dtype=bool)
    attention_case(c, srv, q, k, v, mask=mask, go=go, weights=True, stats=True)
    r = ref_sdpa(q, k, v, torch.float64, mask=mask, go=go)
    c.expect(r["stats"]["scores"]["mean"] is None, "reference stats not null")


def random_attention_case(c, srv, seed):
    """A random configuration: rank, heads (GQA), sizes, causal, a mask of a
    random broadcast shape (bool or additive), scale, encodings."""
    g = np.random.default_rng(seed)
    rank = int(g.integers(2, 5))
    B = int(g.integers(1, 3)) if rank == 4 else None
    h_kv = int(g.integers(1, 3)) if rank >= 3 else 1
    h_q = h_kv * int(g.integers(1, 4)) if rank >= 3 else 1
    n_q, n_k = (int(x) for x in g.choice([1, 2, 3, 7, 16, 31, 64, 65, 100, 129], 2))
    d_k, d_v = (int(x) for x in g.choice([1, 2, 5, 8, 16, 33, 64], 2))
    lead_q = (() if B is None else (B,)) + ((h_q,) if rank >= 3 else ())
    lead_k = (() if B is None else (B,)) + ((h_kv,) if rank >= 3 else ())
    q = (g.standard_normal(lead_q + (n_q, d_k)) * g.choice([0.5, 1, 2])).astype(np.float32)
    k = g.standard_normal(lead_k + (n_k, d_k)).astype(np.float32)
    v = g.standard_normal(lead_k + (n_k, d_v)).astype(np.float32)
    go = g.standard_normal(lead_q + (n_q, d_v)).astype(np.float32)
    full_shape = lead_q + (n_q, n_k)
    mask = None
    kind = g.integers(0, 3)
    if kind:
        mrank = int(g.integers(1, len(full_shape) + 1))
        mshape = tuple(d if g.random() < 0.6 else 1 for d in full_shape[-mrank:])
        mask = (g.random(mshape) < 0.75) if kind == 1 else g.standard_normal(mshape).astype(np.float32)
    scale = f32(g.choice([0.05, 0.3, 1.0])) if g.random() < 0.3 else None
    encoding = str(g.choice(["nested", "flat", "base64"]))
    c.name += " r%d B%s h%d/%d n%dx%d d%d/%d%s%s%s" % (
        rank, B, h_q, h_kv, n_q, n_k, d_k, d_v, " causal" if g.random() < 0.5 and not c.name.startswith("x") else "",
        "" if mask is None else " mask%s%s" % ("b" if kind == 1 else "f", list(mask.shape)),
        "" if scale is None else " s%g" % scale)
    causal = " causal" in c.name
    attention_case(c, srv, q, k, v, causal=causal, mask=mask, scale=scale, go=go, weights=True,
                   stats=bool(g.random() < 0.5), encoding=encoding, mask_enc=encoding)


# ---- /v1/multihead


def mha_case(c, srv, *, B=None, n=6, m=None, d_model=8, d_ctx=None, h=2, h_kv=None,
             d_k=4, d_v=3, d_out=5, w_o=True, biases=(), causal=False, mask=None,
             scale=None, weights=False, grad=True, encoding="nested", stats=False,
             same_context=False, ref_f32=False, lse=False, **variants):
    lead = () if B is None else (B,)
    cross = m is not None or d_ctx is not None
    m = m if m is not None else n
    d_ctx = d_ctx if d_ctx is not None else d_model
    hk = h_kv or h
    p = {"x": rnd(*lead, n, d_model)}
    if cross:
        p["context"] = p["x"].copy() if same_context else rnd(*lead, m, d_ctx)
    p["w_q"] = rnd(d_model, h * d_k, scale=d_model ** -0.5)
    p["w_k"] = rnd(d_ctx, hk * d_k, scale=d_ctx ** -0.5)
    p["w_v"] = rnd(d_ctx, hk * d_v, scale=d_ctx ** -0.5)
    width = h * d_v
    if w_o:
        p["w_o"] = rnd(h * d_v, d_out, scale=(h * d_v) ** -0.5)
        width = d_out
    sizes = {"b_q": h * d_k, "b_k": hk * d_k, "b_v": hk * d_v, "b_o": d_out}
    for b in biases:
        p[b] = rnd(sizes[b])
    go = rnd(*lead, n, width) if grad else None
    body = {name: enc(p[name], encoding) for name in p}
    body["num_heads"] = h
    if h_kv is not None:
        body["num_kv_heads"] = h_kv
    if causal:
        body["causal"] = True
    if mask is not None:
        body["mask"] = enc(mask, encoding)
    if scale is not None:
        body["scale"] = scale
    if weights:
        body["return_weights"] = weights
    if stats:
        body["return_stats"] = True
    if go is not None:
        body["grad_output"] = enc(go, encoding)
    variant_fields(body, variants, encoding)
    if lse:
        body["return_lse"] = True
    status, text, resp = srv.post("/v1/multihead", body)
    if status != 200:
        c.fail("status %d: %s" % (status, text[:300]))
        return
    r32 = ref_mha(p, h, torch.float32, h_kv, causal, mask, scale, go, **variants)
    r64 = r32 if ref_f32 else ref_mha(p, h, torch.float64, h_kv, causal, mask, scale, go, **variants)
    c.close("output", dec(resp["output"]), r64["o"], r32["o"])
    if weights:
        key = "w_mean" if weights == "mean" else "w"
        if "weights" not in resp:
            c.fail("weights missing")
        else:
            c.close("weights", dec(resp["weights"]), r64[key], r32[key])
    if stats:
        # multihead stats over every head: the same as /v1/attention on the projections
        ref_stats = mha_stats_ref(p, h, hk, causal, mask, scale, **variants)
        stats_close(c, resp.get("stats"), ref_stats)
    check_lse(c, resp, lse, r64)
    if go is not None:
        g = resp.get("grad") or {}
        expected = set(p)
        c.expect(set(g) == expected, "grad keys %s, expected %s" % (sorted(g), sorted(expected)))
        for name in sorted(expected & set(g)):
            c.close("grad." + name, dec(g[name]), r64["grad"][name], r32["grad"][name], rel=GRAD_TOL)


def random_mha_case(c, srv, seed):
    """A random multi-head configuration through mha_case."""
    g = np.random.default_rng(seed)
    h_kv = int(g.integers(1, 3))
    h = h_kv * int(g.integers(1, 4))
    B = None if g.random() < 0.4 else int(g.integers(1, 3))
    n = int(g.choice([1, 2, 5, 17, 40]))
    cross = g.random() < 0.5
    m = int(g.choice([1, 3, 9, 33])) if cross else None
    d_model = int(g.integers(1, 12))
    d_ctx = int(g.integers(1, 12)) if cross else None
    kw = dict(B=B, n=n, m=m, d_model=d_model, d_ctx=d_ctx, h=h, h_kv=h_kv if g.random() < 0.7 else None,
              d_k=int(g.integers(1, 6)), d_v=int(g.integers(1, 6)), d_out=int(g.integers(1, 7)),
              w_o=bool(g.random() < 0.6), causal=bool(g.random() < 0.5),
              scale=f32(g.choice([0.2, 0.7])) if g.random() < 0.3 else None,
              weights=[False, True, "mean"][int(g.integers(0, 3))],
              encoding=str(g.choice(["nested", "flat", "base64"])), stats=bool(g.random() < 0.3))
    if kw["h_kv"] is None:
        h_kv = h
        kw["h"] = h
    kw["biases"] = tuple(b for b in ("b_q", "b_k", "b_v", "b_o")
                         if g.random() < 0.5 and (b != "b_o" or kw["w_o"]))
    full = (B or 1, h, n, m if cross else n)
    if g.random() < 0.5:
        mrank = int(g.integers(1, 5))
        mshape = tuple(d if g.random() < 0.6 else 1 for d in full[-mrank:])
        kw["mask"] = (g.random(mshape) < 0.75) if g.random() < 0.5 else g.standard_normal(mshape).astype(np.float32)
    c.name += " B%s h%d/%s n%d m%s dm%d dc%s%s%s%s" % (
        B, h, kw["h_kv"], n, m, d_model, d_ctx, " causal" if kw["causal"] else "",
        "" if "mask" not in kw else " mask%s" % list(kw["mask"].shape), " w_o" if kw["w_o"] else "")
    mha_case(c, srv, **kw)


def mha_stats_ref(p, h, hk, causal, mask, scale, **variants):
    """Stats of multi-head attention over every head, from the float64 reference."""
    return ref_mha(p, h, torch.float64, hk, causal, mask, scale, **variants)["stats"]


# ---- variants: window, ALiBi, softcap, RoPE, lse


def alibi_slopes(h):
    """The geometric ALiBi slopes of the paper (2^(-8i/h)), as float32."""
    return np.array([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], np.float32)


def lse_encodings_case(c, srv):
    """return_lse in every output encoding: a fully masked row (a window that
    leaves it no key, and a boolean mask row) is null in nested and flat and
    -inf in base64; the other rows are the same float32 in all three."""
    q, k, v = rnd(2, 90, 8), rnd(2, 70, 8), rnd(2, 70, 4)
    mask = bool_mask((90, 70), 0.8)
    mask[85, :] = False
    got = {}
    for oenc in ("nested", "flat", "base64"):
        body = {"q": enc(q), "k": enc(k), "v": enc(v), "mask": enc(mask), "window": [3, 3],
                "return_lse": True, "output_encoding": oenc}
        status, text, resp = srv.post("/v1/attention", body)
        if status != 200:
            c.fail("%s: status %d %s" % (oenc, status, text[:200]))
            return
        got[oenc] = resp["lse"]
    r = ref_sdpa(q, k, v, torch.float64, mask=mask, window=(3, 3))
    c.expect(np.isneginf(r["lse"]).sum() > 2 * 10, "reference: expected fully masked rows")
    for oenc, t in got.items():
        lse_close(c, t, r["lse"])
    nested = np.array(got["nested"], dtype=object)
    flat = np.array(got["flat"]["data"], dtype=object).reshape(got["flat"]["shape"])
    b64 = dec(got["base64"])
    c.expect(nested[0, 0] is None and flat[0, 0] is None and np.isneginf(b64[0, 0]),
             "row 0 (p = -20, no key in [-23, -17]) is not null / -inf")
    c.expect(nested[0, 85] is None and np.isneginf(b64[0, 85]), "mask row 85 not null / -inf")
    live = ~np.isneginf(b64)
    same = np.array([np.float32(x) for x in nested[live]]) == b64[live]
    c.expect(same.all(), "nested lse numbers differ from base64's float32")


def merge_shards(parts):
    """Exact merge of attention over disjoint key shards from (output, lse):
    lse = logsumexp_s lse_s, o = sum_s exp(lse_s - lse) o_s (0 where every
    shard's row is empty, as a fully masked row is)."""
    lses = np.stack([p[1].astype(np.float64) for p in parts])
    top = np.max(lses, axis=0)
    safe = np.where(np.isneginf(top), 0.0, top)
    with np.errstate(divide="ignore"):  # log(0) for the rows no shard sees, replaced below
        total = safe + np.log(np.sum(np.exp(lses - safe), axis=0))
    total = np.where(np.isneginf(top), -np.inf, total)
    out = np.zeros(parts[0][0].shape, np.float64)
    for o, l in parts:
        wgt = np.where(np.isneginf(total), 0.0, np.exp(l.astype(np.float64) - np.where(np.isneginf(total), 0.0, total)))
        out += wgt[..., None] * o.astype(np.float64)
    return out, total


def lse_array(t):
    """A response's lse as float64, null -> -inf."""
    if isinstance(t, dict) and "base64" in t:
        return dec(t).astype(np.float64)
    if isinstance(t, dict):
        return np.array([-np.inf if x is None else x for x in t["data"]], np.float64).reshape(t["shape"])
    return np.vectorize(lambda x: -np.inf if x is None else x, otypes=[np.float64])(np.array(t, dtype=object))


def merge_case(c, srv, n_shards, mask_kind, softcap=None, encoding="nested"):
    """Keys split into n_shards contiguous shards (uneven sizes), one request
    each with return_lse (k, v and the mask split along the keys), merged by
    merge_shards(): the same output and lse as one request over every key,
    and as torch in float64.  Non-causal: a shard's positions are its own."""
    B, hq, hkv, n_q, n_k = 2, 4, 2, 33, 150
    q, k, v = rnd(B, hq, n_q, 16), rnd(B, hkv, n_k, 16), rnd(B, hkv, n_k, 8)
    if mask_kind == "bias":
        mask = rnd(B, 1, n_q, n_k, scale=2.0)
    else:
        mask = bool_mask((B, hq, n_q, n_k), 0.3)
        mask[0, 1, 5, :] = False           # a row no shard sees: lse -inf, zeros
        mask[1, 0, 7, : n_k // 2] = False  # a row empty in the first shards only
    cuts = sorted(set([0, n_k] + [int(x) for x in RNG.choice(np.arange(10, n_k - 10), n_shards - 1,
                                                               replace=False)]))
    c.expect(len(cuts) == n_shards + 1, "cuts %s" % cuts)
    parts = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        body = {"q": enc(q, encoding), "k": enc(k[..., a:b, :], encoding),
                "v": enc(v[..., a:b, :], encoding), "mask": enc(mask[..., a:b], encoding),
                "return_lse": True, "output_encoding": encoding}
        if softcap is not None:
            body["softcap"] = softcap
        status, text, resp = srv.post("/v1/attention", body)
        if status != 200:
            c.fail("shard %d:%d: status %d %s" % (a, b, status, text[:200]))
            return
        parts.append((dec(resp["output"]), lse_array(resp["lse"])))
    merged_o, merged_lse = merge_shards(parts)
    body = {"q": enc(q), "k": enc(k), "v": enc(v), "mask": enc(mask), "return_lse": True}
    if softcap is not None:
        body["softcap"] = softcap
    status, text, whole = srv.post("/v1/attention", body)
    if status != 200:
        c.fail("whole: status %d %s" % (status, text[:200]))
        return
    r = ref_sdpa(q, k, v, torch.float64, mask=mask, softcap=softcap)
    c.close("merged output vs torch", merged_o, r["o"])
    c.close("merged output vs one request", merged_o, dec(whole["output"]))
    inf = np.isneginf(r["lse"])
    c.expect(np.array_equal(np.isneginf(merged_lse), inf), "merged lse: -inf rows differ")
    c.close("merged lse vs torch", merged_lse[~inf], r["lse"][~inf])
    c.close("merged lse vs one request", merged_lse[~inf], lse_array(whole["lse"])[~inf])
    if mask_kind == "bool":
        c.expect(np.all(merged_o[0, 1, 5] == 0), "a row no shard sees is not zero")
        c.note = "shards at %s" % cuts


def permutation_case(c, srv):
    """Exercise 8: attention alone is blind to order.  Permuting the keys and
    values (and the mask's key columns) leaves the output and lse as they
    were, and permutes the weights' columns; with RoPE the same permutation
    changes the output.  Each answer is also checked against torch."""
    q, k, v = rnd(2, 40, 16), rnd(2, 90, 16), rnd(2, 90, 8)
    mask = rnd(2, 40, 90)
    perm = RNG.permutation(90)
    got = {}
    for rope in (None, 500.0):
        variants = {} if rope is None else {"rope": rope}
        for name, kk, vv, mm in (("orig", k, v, mask), ("perm", k[:, perm], v[:, perm], mask[..., perm])):
            resp = attention_case(c, srv, q, kk, vv, mask=mm, weights=True, lse=True, softcap=7.0,
                                  **variants)
            if resp is None:
                return
            got[(rope, name)] = (dec(resp["output"]), lse_array(resp["lse"]), dec(resp["weights"]))
    o0, l0, w0 = got[(None, "orig")]
    o1, l1, w1 = got[(None, "perm")]
    c.close("no RoPE: permuted output", o1, o0)
    c.close("no RoPE: permuted lse", l1, l0)
    c.close("no RoPE: permuted weights = weights' columns permuted", w1, w0[..., perm])
    r0, r1 = got[(500.0, "orig")][0], got[(500.0, "perm")][0]
    change = float(np.max(np.abs(r0.astype(np.float64) - r1)))
    c.expect(change > 0.05, "with RoPE the permutation changed the output by only %g" % change)
    c.note = "RoPE: output moved by %.3f" % change


def openapi_text(srv):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/openapi.yaml" % srv.port, timeout=30) as r:
            return r.read().decode()
    except Exception:
        return ""


def half_roundtrip_case(c, srv, dtype):
    """float16 / bfloat16: base64 inputs of that dtype are computed
    as the float32 of their values, and output_dtype writes the answer in it.
    The reference is torch on the same half values in float64, rounded to the
    dtype: the answer must be that rounding, or one unit in the last place
    off (a float32 value a hair from a rounding boundary)."""
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    q, k, v, go = rnd(2, 70, 16), rnd(2, 90, 16), rnd(2, 90, 8), rnd(2, 70, 8)
    half = {n: torch.from_numpy(a).to(tdt) for n, a in (("q", q), ("k", k), ("v", v), ("go", go))}

    def b64(t):
        return {"shape": list(t.shape), "dtype": dtype,
                "base64": base64.b64encode(t.view(torch.int16).numpy().astype("<i2").tobytes()).decode()}

    def unb64(t):
        c.expect(t.get("dtype") == dtype, "output dtype %r, expected %r" % (t.get("dtype"), dtype))
        raw = np.frombuffer(base64.b64decode(t["base64"]), dtype="<i2").copy()
        return torch.from_numpy(raw).view(tdt).reshape(t["shape"])
    body = {"q": b64(half["q"]), "k": b64(half["k"]), "v": b64(half["v"]), "causal": True,
            "grad_output": b64(half["go"]), "output_encoding": "base64", "output_dtype": dtype,
            "return_lse": True, "window": [40, 0]}
    status, text, resp = srv.post("/v1/attention", body)
    if status != 200:
        c.fail("status %d: %s" % (status, text[:300]))
        return
    exact = {n: t.to(torch.float32).numpy() for n, t in half.items()}
    r = ref_sdpa(exact["q"], exact["k"], exact["v"], torch.float64, causal=True, go=exact["go"],
                 window=(40, 0))
    ulp = 2.0 ** -10 if dtype == "float16" else 2.0 ** -7
    tiny = 2.0 ** -24 if dtype == "float16" else 2.0 ** -133
    for name, got, ref in (("output", resp["output"], r["o"]), ("lse", resp["lse"], r["lse"]),
                           ("grad.q", resp["grad"]["q"], r["dq"]), ("grad.k", resp["grad"]["k"], r["dk"]),
                           ("grad.v", resp["grad"]["v"], r["dv"])):
        g = unb64(got).to(torch.float64).numpy()
        ref = np.asarray(ref, np.float64)
        want = torch.from_numpy(ref).to(tdt).to(torch.float64).numpy()
        # one unit in the last place of the dtype, plus float32's own error
        rel = GRAD_TOL if name.startswith("grad") else FWD_TOL
        allowed = np.maximum(np.abs(ref) * ulp, tiny) + rel * max(1.0, float(np.max(np.abs(ref))))
        off = float(np.max(np.abs(g - want) / allowed))
        c.expect(off <= 1.0, "%s: %.3g of the allowed distance (1 ulp of %s + float32 error) from "
                 "torch's rounding" % (name, off, dtype))
    # the same halves sent as float32 give the same answer in float32
    body32 = {"q": enc(exact["q"], "base64"), "k": enc(exact["k"], "base64"), "v": enc(exact["v"], "base64"),
              "causal": True, "window": [40, 0], "output_encoding": "base64"}
    status, text, r32 = srv.post("/v1/attention", body32)
    if status == 200:
        c.close("output(float32 of the same halves)", dec(r32["output"]), r["o"])
    else:
        c.fail("float32 request: status %d" % status)


def random_variant_case(c, srv, seed):
    """A random configuration with random variants on: rank, GQA, sizes across
    64-key tiles, causal, mask, window, ALiBi, softcap, RoPE, lse."""
    g = np.random.default_rng(seed)
    rank = int(g.integers(2, 5))
    B = int(g.integers(1, 3)) if rank == 4 else None
    h_kv = int(g.integers(1, 3)) if rank >= 3 else 1
    h_q = h_kv * int(g.integers(1, 3)) if rank >= 3 else 1
    n_q, n_k = (int(x) for x in g.choice([1, 5, 63, 64, 65, 70, 100, 129, 150], 2))
    d_k = int(g.choice([2, 8, 16, 34]))
    d_v = int(g.choice([1, 8, 16]))
    lead_q = (() if B is None else (B,)) + ((h_q,) if rank >= 3 else ())
    lead_k = (() if B is None else (B,)) + ((h_kv,) if rank >= 3 else ())
    q = (g.standard_normal(lead_q + (n_q, d_k)) * g.choice([0.5, 1, 3])).astype(np.float32)
    k = g.standard_normal(lead_k + (n_k, d_k)).astype(np.float32)
    v = g.standard_normal(lead_k + (n_k, d_v)).astype(np.float32)
    go = g.standard_normal(lead_q + (n_q, d_v)).astype(np.float32)
    variants = {}
    if g.random() < 0.6:
        variants["window"] = (int(g.choice([-1, 0, 3, 40, 70])), int(g.choice([-1, 0, 5, 64])))
    if g.random() < 0.5:
        hq = h_q if rank >= 3 else 1
        if B is not None and g.random() < 0.5:
            variants["alibi"] = (g.random((B, hq)) * 0.5).astype(np.float32)
        else:
            variants["alibi"] = alibi_slopes(hq)
    if g.random() < 0.5:
        variants["softcap"] = f32(g.choice([0.5, 2.0, 30.0]))
    if g.random() < 0.5:
        variants["rope"] = f32(g.choice([100.0, 10000.0]))
    causal = bool(g.random() < 0.4)
    mask = None
    full_shape = lead_q + (n_q, n_k)
    kind = int(g.integers(0, 3))
    if kind:
        mrank = int(g.integers(1, len(full_shape) + 1))
        mshape = tuple(d if g.random() < 0.6 else 1 for d in full_shape[-mrank:])
        mask = (g.random(mshape) < 0.8) if kind == 1 else g.standard_normal(mshape).astype(np.float32)
    encoding = str(g.choice(["nested", "flat", "base64"]))
    c.name += " r%d h%d/%d n%dx%d d%d/%d%s%s %s" % (
        rank, h_q, h_kv, n_q, n_k, d_k, d_v, " causal" if causal else "",
        "" if mask is None else " mask%s" % ("b" if kind == 1 else "f"),
        ",".join(sorted(variants)) or "-")
    attention_case(c, srv, q, k, v, causal=causal, mask=mask, go=go, weights=True,
                   stats=bool(g.random() < 0.5), encoding=encoding, mask_enc=encoding,
                   out_encoding=encoding, lse=True, **variants)


# ---- ragged batches (seq_lens): each sequence computed alone by torch


def _blocks(lens):
    """The [start, end) of each packed sequence."""
    out, at = [], 0
    for n in lens:
        out.append((at, at + n))
        at += n
    return out


def _stats_of(parts):
    """return_stats over several attend() results together (the pairs of
    every sequence's block), as score_stats() computes them for one."""
    sr, sc, ent, mx = [], [], [], []
    for r in parts:
        a = r["s_raw"].detach().to(torch.float64)
        b = r["s_capped"].detach().to(torch.float64)
        sel = r["allowed"].expand(a.shape)
        sr.append(a[sel])
        sc.append(b[sel])
        wd = r["w"].detach().to(torch.float64)
        rows = ~r["full"].expand(wd.shape[:-1])
        e = -(torch.where(wd > 0, wd * torch.log(torch.where(wd > 0, wd, torch.ones_like(wd))),
                          torch.zeros_like(wd))).sum(-1)[rows]
        ent.append(e)
        mx.append(wd.max(dim=-1).values[rows])

    def cat(xs):
        return torch.cat(xs) if xs else torch.zeros(0, dtype=torch.float64)
    sr, sc, ent, mx = cat(sr), cat(sc), cat(ent), cat(mx)

    def mv(x):
        if x.numel() == 0:
            return None, None
        return float(x.mean()), float(((x - x.mean()) ** 2).mean())
    sm, svar = mv(sr)
    ssm, ssvar = mv(sc)
    return {
        "scores": {"mean": sm, "var": svar},
        "scaled_scores": {"mean": ssm, "var": ssvar},
        "entropy": ({"mean": float(ent.mean()), "min": float(ent.min()), "max": float(ent.max())}
                    if ent.numel() else {"mean": None, "min": None, "max": None}),
        "max_weight": {"mean": float(mx.mean()) if mx.numel() else None},
    }


def ragged_case(c, srv, hq, hk, lens_q, lens_k=None, d_k=16, d_v=8, causal=False, mask_p=None,
                bias_mask=False, stats=True, encoding="nested", **variants):
    """A packed batch (q [H_q, n_q, d_k], k and v [H_kv, n_k, .]) with
    seq_lens (and seq_lens_k) against each sequence's slice computed alone
    by torch in float64, with autograd: output, the whole weights matrix
    (zeros outside the blocks), lse (null for rows without keys), stats over
    the blocks, dq, dk, dv, and meta.flops over the blocks. mask_p: a packed
    boolean mask [n_q, n_k] (or, bias_mask, a float one) sliced per
    sequence for the reference."""
    lk = list(lens_k) if lens_k is not None else list(lens_q)
    nq, nk = sum(lens_q), sum(lk)
    q, k, v = rnd(hq, nq, d_k), rnd(hk, nk, d_k), rnd(hk, nk, d_v)
    go = rnd(hq, nq, d_v)
    mask = None
    if mask_p is not None:
        mask = rnd(nq, nk, scale=2.0) if bias_mask else bool_mask((nq, nk), mask_p)
    body = {"q": enc(q, encoding), "k": enc(k, encoding), "v": enc(v, encoding),
            "grad_output": enc(go, encoding), "seq_lens": list(lens_q), "return_weights": True,
            "return_lse": True}
    if lens_k is not None:
        body["seq_lens_k"] = lk
    if causal:
        body["causal"] = True
    if stats:
        body["return_stats"] = True
    if mask is not None:
        body["mask"] = enc(mask, encoding)
    variant_fields(body, variants, encoding)
    status, text, resp = srv.post("/v1/attention", body)
    if status != 200:
        c.fail("status %d: %s" % (status, text[:300]))
        return
    o = np.zeros((hq, nq, d_v))
    w = np.zeros((hq, nq, nk))
    lse = np.full((hq, nq), -np.inf)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    o32 = np.zeros(o.shape, np.float32)
    flops, parts = 0, []
    for (q0, q1), (k0, k1) in zip(_blocks(lens_q), _blocks(lk)):
        if q1 == q0 or k1 == k0:
            continue  # rows without keys, keys without rows: zeros (and -inf lse)
        ms = None if mask is None else mask[q0:q1, k0:k1]
        args = (q[:, q0:q1], k[:, k0:k1], v[:, k0:k1])
        r = ref_sdpa(*args, torch.float64, causal, ms, None, go[:, q0:q1], **variants)
        o[:, q0:q1], w[:, q0:q1, k0:k1], lse[:, q0:q1] = r["o"], r["w"], r["lse"]
        dq[:, q0:q1], dk[:, k0:k1], dv[:, k0:k1] = r["dq"], r["dk"], r["dv"]
        o32[:, q0:q1] = ref_sdpa(*args, torch.float32, causal, ms, None, None, **variants)["o"]
        flops += r["flops"]
        if stats:
            t = [_t(a, torch.float64) for a in args]
            parts.append(attend(*t, 1.0 / math.sqrt(d_k), causal, ms, **variants))
    c.close("output", dec(resp["output"]), o, o32)
    c.close("weights (zeros outside the blocks)", dec(resp["weights"]), w)
    lse_close(c, resp["lse"], lse)
    g = resp.get("grad") or {}
    for name, ref in (("q", dq), ("k", dk), ("v", dv)):
        if name not in g:
            c.fail("grad.%s missing" % name)
        else:
            c.close("grad." + name, dec(g[name]), ref, rel=GRAD_TOL)
    if stats:
        stats_close(c, resp.get("stats"), _stats_of(parts))
    meta = resp.get("meta", {})
    c.expect(meta.get("flops") == flops * 3.5, "meta.flops %r, expected %r (the blocks' pairs)"
             % (meta.get("flops"), flops * 3.5))
    c.expect(meta.get("shape", {}).get("sequences") == len(lens_q),
             "meta.shape.sequences %r" % meta.get("shape", {}).get("sequences"))


def ragged_mha_case(c, srv, lens, lens_ctx=None, d_model=8, d_ctx=6, h=2, h_kv=1, d_k=4, d_v=3,
                    d_out=5, causal=False, **variants):
    """A packed /v1/multihead batch (x [n, d_model], context [m, d_ctx] when
    lens_ctx is given) against each sequence alone in torch float64: output,
    per-head weights (zeros outside the blocks), lse, and the gradients of x,
    context (per row) and of every weight and bias (the sum over the
    sequences)."""
    cross = lens_ctx is not None
    lm = list(lens_ctx) if cross else list(lens)
    n, m = sum(lens), sum(lm)
    p = {"x": rnd(n, d_model)}
    if cross:
        p["context"] = rnd(m, d_ctx)
    dc = d_ctx if cross else d_model
    p["w_q"] = rnd(d_model, h * d_k, scale=d_model ** -0.5)
    p["w_k"] = rnd(dc, h_kv * d_k, scale=dc ** -0.5)
    p["w_v"] = rnd(dc, h_kv * d_v, scale=dc ** -0.5)
    p["w_o"] = rnd(h * d_v, d_out, scale=(h * d_v) ** -0.5)
    for b, size in (("b_q", h * d_k), ("b_k", h_kv * d_k), ("b_v", h_kv * d_v), ("b_o", d_out)):
        p[b] = rnd(size)
    go = rnd(n, d_out)
    body = {name: enc(p[name]) for name in p}
    body.update({"num_heads": h, "num_kv_heads": h_kv, "grad_output": enc(go),
                 "return_weights": True, "return_lse": True, "seq_lens": list(lens)})
    if cross:
        body["seq_lens_context"] = lm
    if causal:
        body["causal"] = True
    variant_fields(body, variants, "nested")
    status, text, resp = srv.post("/v1/multihead", body)
    if status != 200:
        c.fail("status %d: %s" % (status, text[:300]))
        return
    o = np.zeros((n, d_out))
    w = np.zeros((h, n, m))
    lse = np.full((h, n), -np.inf)
    grad = {name: np.zeros(p[name].shape) for name in p}
    for (x0, x1), (c0, c1) in zip(_blocks(lens), _blocks(lm)):
        if x1 == x0:
            continue
        if c1 == c0:
            # no keys: the attention is 0, the output b_o, and only b_o has
            # a gradient (the sum of grad_output's rows)
            o[x0:x1] = p["b_o"]
            grad["b_o"] += go[x0:x1].astype(np.float64).sum(0)
            continue
        ps = dict(p, x=p["x"][x0:x1])
        if cross:
            ps["context"] = p["context"][c0:c1]
        r = ref_mha(ps, h, torch.float64, h_kv, causal, None, None, go[x0:x1], **variants)
        o[x0:x1], w[:, x0:x1, c0:c1], lse[:, x0:x1] = r["o"], r["w"], r["lse"]
        for name in p:
            if name == "x":
                grad["x"][x0:x1] = r["grad"]["x"]
            elif name == "context":
                grad["context"][c0:c1] = r["grad"]["context"]
            else:
                grad[name] += r["grad"][name]
    c.close("output", dec(resp["output"]), o)
    c.close("weights (zeros outside the blocks)", dec(resp["weights"]), w)
    lse_close(c, resp["lse"], lse)
    g = resp.get("grad") or {}
    for name in p:
        if name not in g:
            c.fail("grad.%s missing" % name)
        else:
            c.close("grad." + name, dec(g[name]), grad[name], rel=GRAD_TOL)


def random_ragged_case(c, srv, seed):
    """Random lengths (empty ones included, some across the 64-key and
    96-row tiles), heads, widths and variants."""
    g = np.random.default_rng(seed)
    seqs = int(g.integers(1, 9))
    lens_q = [int(x) for x in g.choice([0, 1, 3, 16, 33, 64, 65, 97, 130], seqs)]
    if sum(lens_q) == 0:
        lens_q[0] = 5
    cross = g.random() < 0.5
    lens_k = [int(x) for x in g.choice([0, 1, 7, 64, 70, 129], seqs)] if cross else None
    if cross and sum(lens_k) == 0:
        lens_k[-1] = 3
    hk = int(g.integers(1, 3))
    hq = hk * int(g.integers(1, 3))
    variants = {}
    if g.random() < 0.4:
        variants["window"] = (int(g.choice([-1, 0, 5, 40])), int(g.choice([-1, 0, 3])))
    if g.random() < 0.4:
        variants["alibi"] = alibi_slopes(hq)
    if g.random() < 0.4:
        variants["softcap"] = f32(g.choice([1.0, 5.0]))
    if g.random() < 0.4:
        variants["rope"] = f32(g.choice([100.0, 10000.0]))
    causal = bool(g.random() < 0.5)
    mask_p = 0.8 if g.random() < 0.3 else None
    encoding = str(g.choice(["nested", "flat", "base64"]))
    c.name += " h%d/%d q%s k%s%s%s %s" % (hq, hk, lens_q, lens_k, " causal" if causal else "",
                                         " mask" if mask_p else "", ",".join(sorted(variants)) or "-")
    ragged_case(c, srv, hq, hk, lens_q, lens_k, d_k=int(g.choice([8, 16])), d_v=int(g.choice([4, 8])),
                causal=causal, mask_p=mask_p, bias_mask=bool(g.random() < 0.5), encoding=encoding,
                **variants)


# ---- KV caches: each step against torch over the keys and values cached so far


class CacheModel:
    """A cache on the server and what it should hold: the keys as appended
    (rotated at their absolute positions when the cache has rope, in
    float64, then rounded to the cache's dtype) and the values, rounded."""

    ROUND = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

    def __init__(self, c, srv, hkv, d, dv, dtype, rope=None):
        self.c, self.srv, self.hkv, self.d, self.dv, self.dtype, self.rope = c, srv, hkv, d, dv, dtype, rope
        st, hdr, j = srv.request("POST", "/v1/caches", {"num_kv_heads": hkv, "head_dim": d,
                                                          "value_dim": dv, "dtype": dtype})
        c.expect(st == 201, "create: status %d: %s" % (st, j))
        self.id = j["id"]
        c.expect(hdr.get("Location") == "/v1/caches/" + self.id, "Location %r" % hdr.get("Location"))
        want = {"num_kv_heads": hkv, "head_dim": d, "value_dim": dv, "dtype": dtype, "length": 0}
        c.expect(all(j.get(key) == val for key, val in want.items()), "create answered %s" % j)
        self.k, self.v = np.zeros((hkv, 0, d)), np.zeros((hkv, 0, dv))

    def stored(self, a):
        return torch.from_numpy(np.asarray(a, np.float64)).to(self.ROUND[self.dtype]).double().numpy()

    def step(self, what, truncate=None, n_new=0, hq=0, n_q=0, rank2=False, rel=FWD_TOL, **opts):
        """One POST .../attention; the output and lse against torch float64."""
        c = self.c
        body = {}
        k, v = self.k, self.v
        if truncate is not None:
            body["truncate"] = truncate
            k, v = k[:, :truncate], v[:, :truncate]
        if n_new:
            nk, nv = rnd(self.hkv, n_new, self.d), rnd(self.hkv, n_new, self.dv)
            body["k"], body["v"] = enc(nk[0] if rank2 else nk), enc(nv[0] if rank2 else nv)
            tk = torch.from_numpy(nk.astype(np.float64))
            if self.rope:
                tk = rope_rotate(tk, torch.arange(k.shape[1], k.shape[1] + n_new), self.rope)
            k = np.concatenate([k, self.stored(tk.numpy())], 1)
            v = np.concatenate([v, self.stored(nv)], 1)
        length = k.shape[1]
        q = rnd(hq, n_q, self.d) if hq else None
        if q is not None:
            body["q"] = enc(q[0] if rank2 else q)
        if self.rope:
            body["rope"] = {"base": self.rope}
        variant_fields(body, opts, "nested")
        for key in ("causal", "scale", "return_lse"):
            if key in opts:
                body[key] = opts[key]
        st, _, j = self.srv.request("POST", "/v1/caches/%s/attention" % self.id, body)
        if st != 200:
            c.fail("%s: status %d: %s" % (what, st, j))
            return
        self.k, self.v = k, v
        c.expect(j["cache"]["length"] == length, "%s: length %r, expected %d" % (what, j["cache"]["length"], length))
        if q is None:
            c.expect("output" not in j, "%s: an output without q" % what)
            return
        tq = torch.from_numpy(q.astype(np.float64))
        if self.rope:  # each query at its own position, the last row at the last one
            tq = rope_rotate(tq, torch.arange(length - n_q, length), self.rope)
        scale = opts.get("scale", 1.0 / math.sqrt(self.d))
        r = attend(tq, torch.from_numpy(k), torch.from_numpy(v), scale, opts.get("causal", True), None,
                   opts.get("window"), opts.get("alibi"), opts.get("softcap"))
        o, lse = r["o"].numpy(), r["lse"].numpy()
        if rank2:
            o, lse = o[0], lse[0]
        c.close(what + " output", dec(j["output"]), o, rel=rel)
        if opts.get("return_lse"):
            lse_close(c, j["lse"], lse, rel=rel)


def cache_case(c, srv, hkv, d, dv, dtype="float32", rope=None):
    """A cache's life: appends that cross its 64-position pages, GQA decoding
    and prefill steps (causal by default, the last query row at the last
    position; more query rows than positions), truncates, every variant,
    "causal": false, then GET, DELETE, and 404 after. float16 and bfloat16
    storage round what is appended (after the rotation, with rope); the
    reference holds the same rounded keys and values, so only float32
    arithmetic (and, with rope, a rounding a float32 rotation may flip)
    separates the two."""
    # room for one flipped rounding of a rotated key (a half's ulp moves an
    # output by less than this); a key left unrounded would move it more
    rel = FWD_TOL if rope is None or dtype == "float32" else {"float16": 2e-4, "bfloat16": 2e-3}[dtype]
    m = CacheModel(c, srv, hkv, d, dv, dtype, rope)
    rank2 = hkv == 1
    m.step("append 5", n_new=5, rank2=rank2)
    m.step("decode", n_new=1, hq=hkv * 2, n_q=1, rel=rel, return_lse=True)
    m.step("prefill 66", n_new=66, hq=hkv * 2, n_q=66, rel=rel, return_lse=True)
    m.step("attend only, causal false", hq=hkv, n_q=3, rel=rel, causal=False)
    m.step("truncate+append+attend", truncate=60, n_new=9, hq=hkv * 4, n_q=4, rel=rel, return_lse=True)
    m.step("window", n_new=1, hq=hkv * 2, n_q=70, rel=rel, return_lse=True, window=(10, 0))
    m.step("alibi softcap scale", n_new=2, hq=hkv * 2, n_q=3, rel=rel, return_lse=True,
           alibi=alibi_slopes(hkv * 2), softcap=3.0, scale=f32(0.6))
    m.step("window, causal false", hq=hkv, n_q=2, rel=rel, causal=False, window=(3, 3))
    m.step("truncate to 1, more rows than positions", truncate=1, n_new=1, hq=hkv, n_q=4, rel=rel,
           return_lse=True, rank2=rank2)
    path = "/v1/caches/" + m.id
    st, _, j = srv.request("GET", path)
    c.expect(st == 200 and j["length"] == 2 and j["id"] == m.id, "GET: %d %s" % (st, j))
    st, _, j = srv.request("POST", path + "/attention", {"q": enc(rnd(hkv, 1, d)), "grad_output": [[[1.0] * dv]] * hkv})
    c.expect(st == 422, "grad_output over a cache: status %d, expected 422" % st)
    st, _, _ = srv.request("DELETE", path)
    c.expect(st == 204, "DELETE: status %d" % st)
    for method in ("GET", "DELETE"):
        st, _, j = srv.request(method, path)
        c.expect(st == 404 and (j or {}).get("error", {}).get("code") == "cache_not_found",
                 "%s after DELETE: %d %s" % (method, st, j))


def cache_bf16_case(c, srv, hkv, hq, n, n_q, d, dv, dtype):
    """precision bfloat16 over a cache (appended in two parts) gives the bits
    of /v1/attention's bfloat16 products over the same keys and values as
    the cache stores them, causal bottom-right; both near float64 torch."""
    st, _, j = srv.request("POST", "/v1/caches", {"num_kv_heads": hkv, "head_dim": d, "value_dim": dv,
                                                  "dtype": dtype})
    if st != 201:
        c.fail("create: %d %s" % (st, j))
        return
    path = "/v1/caches/%s/attention" % j["id"]
    k, v, q = rnd(hkv, n, d), rnd(hkv, n, dv), rnd(hq, n_q, d)
    half = n // 2
    srv.request("POST", path, {"k": enc(k[:, :half], "base64"), "v": enc(v[:, :half], "base64")})
    st, _, a = srv.request("POST", path, {"k": enc(k[:, half:], "base64"), "v": enc(v[:, half:], "base64"),
                                          "q": enc(q, "base64"), "precision": "bfloat16",
                                          "return_lse": True, "output_encoding": "base64"})
    tdt = CacheModel.ROUND[dtype]
    ks, vs = (torch.from_numpy(x).to(tdt).float().numpy() for x in (k, v))
    st2, _, b = srv.request("POST", "/v1/attention", {"q": enc(q, "base64"), "k": enc(ks, "base64"),
                                                      "v": enc(vs, "base64"), "causal": True,
                                                      "precision": "bfloat16", "return_lse": True,
                                                      "output_encoding": "base64"})
    if st != 200 or st2 != 200:
        c.fail("status %d / %d: %s %s" % (st, st2, a, b))
        return
    c.expect(a["output"]["base64"] == b["output"]["base64"],
             "output: not /v1/attention's bits (max difference %g)"
             % float(np.max(np.abs(dec(a["output"]) - dec(b["output"])))))
    c.expect(a["lse"]["base64"] == b["lse"]["base64"], "lse: not /v1/attention's bits")
    r64 = ref_sdpa(q, ks, vs, torch.float64, True)
    c.close("output vs float64", dec(a["output"]), r64["o"], rel=3e-2)


# ---- errors


def bf16_errs(got, ref64):
    """The root-mean-square and the largest of |got - ref64|, relative to the
    root-mean-square and to max(1, max|ref64|) of ref64."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref64, dtype=np.float64)
    d = got - ref
    rms = math.sqrt(float(np.mean(d * d))) / max(math.sqrt(float(np.mean(ref * ref))), 1e-30)
    return rms, float(np.max(np.abs(d))) / max(1.0, float(np.max(np.abs(ref))))


def bf16_compare(c, what, ours, torch_bf16, ref64, keep=None):
    """Ours (precision bfloat16) no further from float64 torch than torch's own
    bfloat16 math path is: the tensor's root-mean-square error no larger, and
    its largest error (one element, where the two are alike by chance) within
    1.5 times torch's."""
    ours = np.asarray(ours, dtype=np.float64)
    if not np.all(np.isfinite(ours)):
        c.fail("%s: non-finite values" % what)
        return
    if keep is not None:
        ours, torch_bf16, ref64 = ours[keep], np.asarray(torch_bf16)[keep], np.asarray(ref64)[keep]
    (rms_ours, max_ours), (rms_torch, max_torch) = bf16_errs(ours, ref64), bf16_errs(torch_bf16, ref64)
    c.note += "%s %.1e/%.1e " % (what, rms_ours, rms_torch)
    c.expect(rms_ours <= rms_torch, "%s: our bfloat16 rms error %.3g exceeds torch's bfloat16 math "
             "path's %.3g" % (what, rms_ours, rms_torch))
    c.expect(max_ours <= 1.5 * max_torch, "%s: our largest bfloat16 error %.3g is beyond 1.5 times "
             "torch's %.3g" % (what, max_ours, max_torch))


def bf16_documented(q, k, v, go, causal=False, mask=None, window=None, alibi=None, softcap=None,
                    rope=None):
    """precision bfloat16 as api/openapi.yaml's Precision section defines it,
    in float64 torch with bfloat16 roundings (to nearest even) where it puts
    them: bf16(q) bf16(k) summed to a float32 score; the online softmax over
    blocks of 64 keys, each block's weights bf16(exp(x - m(t))) summed into
    l as rounded; o = sum p bf16(v) / l; backward from the float32
    P = exp(x - m) / l: dP = bf16(dO) bf16(v)^T, dS = P (dP - delta) times
    the scale and softcap's derivative (0 where P is 1), dV = bf16(P)^T
    bf16(dO), dQ = bf16(dS) bf16(k), dK = bf16(dS)^T bf16(q). The float32
    sums' order is left out: it moves a result by float32 ulps, where an
    operand left unrounded moves it by bfloat16's (2^-9). Returns o, dq, dk, dv."""
    f64 = torch.float64

    def bf(t):
        return t.to(torch.float32).to(torch.bfloat16).to(f64)
    tq, tk, tv, tg = (torch.from_numpy(np.asarray(a, np.float64).copy()) for a in (q, k, v, go))
    d, n_q, n_k = tq.shape[-1], tq.shape[-2], tk.shape[-2]
    scale = 1.0 / math.sqrt(d)
    pos_q, pos_k = torch.arange(n_q) + (n_k - n_q), torch.arange(n_k)
    if rope is not None:  # rotated in float32, then rounded
        tq = rope_rotate(tq, pos_q, rope).float().double()
        tk = rope_rotate(tk, pos_k, rope).float().double()
    g = tq.shape[-3] // tk.shape[-3] if tq.dim() >= 3 else 1
    kk, vv = (tk.repeat_interleave(g, dim=-3), tv.repeat_interleave(g, dim=-3)) if g > 1 else (tk, tv)
    qb, kb, vb, gb = bf(tq), bf(kk), bf(vv), bf(tg)
    x = (qb @ kb.transpose(-1, -2)).float().double() * scale
    cap_d = torch.ones_like(x)
    if softcap is not None:
        t = torch.tanh(x / softcap)
        x, cap_d = softcap * t, 1 - t * t
    x, allowed, _ = biased_and_visible(x, pos_q, pos_k, alibi, mask, causal, window)
    x = x.masked_fill(~allowed, float("-inf"))
    m = torch.full(x.shape[:-1], float("-inf"), dtype=f64)
    l = torch.zeros(x.shape[:-1], dtype=f64)
    acc = torch.zeros(x.shape[:-1] + (vv.shape[-1],), dtype=f64)
    for t0 in range(0, n_k, 64):
        xb = x[..., t0:t0 + 64]
        m_new = torch.maximum(m, xb.max(dim=-1).values)
        base = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = bf(torch.exp(xb - base[..., None]))
        r = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp(m - base))
        l = l * r + p.sum(-1)
        acc = acc * r[..., None] + p @ vb[..., t0:t0 + 64, :]
        m = m_new
    full = l == 0
    lsafe = torch.where(full, torch.ones_like(l), l)
    o = torch.where(full[..., None], torch.zeros_like(acc), acc / lsafe[..., None])
    base = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    P = (torch.exp(x - base[..., None]) / lsafe[..., None]).masked_fill(full[..., None], 0.0)
    P = P.float().double()
    delta = (tg * o.float().double()).sum(-1)
    dS = P * (gb @ vb.transpose(-1, -2) - delta[..., None]) * scale * cap_d
    dS = torch.where(P == 1.0, torch.zeros_like(dS), dS)
    dq = bf(dS) @ kb
    dk = bf(dS).transpose(-1, -2) @ qb
    dv = bf(P).transpose(-1, -2) @ gb
    if g > 1:
        dk = dk.reshape(tk.shape[:-3] + (tk.shape[-3], g) + dk.shape[-2:]).sum(-3)
        dv = dv.reshape(tv.shape[:-3] + (tv.shape[-3], g) + dv.shape[-2:]).sum(-3)
    if rope is not None:  # turned back
        dq, dk = rope_rotate(dq, -pos_q, rope), rope_rotate(dk, -pos_k, rope)
    return {"o": o.numpy(), "dq": dq.numpy(), "dk": dk.numpy(), "dv": dv.numpy()}


def bf16_documented_close(c, what, got, ref):
    """Against bf16_documented(): a root-mean-square difference within 2e-4 of
    the reference's, and the largest within 1e-2 of max(1, |ref|) (a weight or
    dS whose rounding a float32 ulp flips moves a few elements by a
    bfloat16 ulp)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    d = got - ref
    rms = math.sqrt(float(np.mean(d * d))) / max(math.sqrt(float(np.mean(ref * ref))), 1e-30)
    big = float(np.max(np.abs(d))) / max(1.0, float(np.max(np.abs(ref))))
    c.note += "%s~doc %.1e " % (what, rms)
    c.expect(rms <= 2e-4, "%s: rms difference %.3g from the documented bfloat16 algorithm" % (what, rms))
    c.expect(big <= 1e-2, "%s: largest difference %.3g from the documented bfloat16 algorithm" % (what, big))


def bf16_attention_case(c, srv, shape_q, shape_k, shape_v, causal=False, mask=None, **variants):
    """precision bfloat16 on /v1/attention against float64 torch, and torch's own
    bfloat16 math path (q, k, v in bfloat16; its matmuls, softmax and autograd in
    bfloat16 tensors) on the same inputs: ours must be no worse, output and
    gradients. The note reads "what ours/torch's" rms errors."""
    q, k, v = rnd(*shape_q), rnd(*shape_k), rnd(*shape_v)
    go = rnd(*(shape_q[:-1] + (shape_v[-1],)))
    body = {"q": enc(q, "base64"), "k": enc(k, "base64"), "v": enc(v, "base64"),
            "grad_output": enc(go, "base64"), "precision": "bfloat16", "output_encoding": "base64"}
    variant_fields(body, variants, "base64")
    if causal:
        body["causal"] = True
    if mask is not None:
        body["mask"] = enc(mask, "base64")
    status, text, resp = srv.post("/v1/attention", body)
    if status != 200:
        c.fail("status %d: %s" % (status, text[:300]))
        return
    r64 = ref_sdpa(q, k, v, torch.float64, causal, mask, None, go, **variants)
    rbf = ref_sdpa(q, k, v, torch.bfloat16, causal, mask, None, go, **variants)
    keep = ~np.broadcast_to(r64["full"], r64["o"].shape[:-1])
    bf16_compare(c, "output", dec(resp["output"]), rbf["o"].astype(np.float64), r64["o"], keep)
    for name, key in (("q", "dq"), ("k", "dk"), ("v", "dv")):
        bf16_compare(c, "grad." + name, dec(resp["grad"][name]), rbf[key].astype(np.float64), r64[key])
    doc = bf16_documented(q, k, v, go, causal, mask, **variants)
    bf16_documented_close(c, "output", dec(resp["output"]), doc["o"])
    for name in ("q", "k", "v"):
        bf16_documented_close(c, "grad." + name, dec(resp["grad"][name]), doc["d" + name])


def bf16_mha_case(c, srv, B=2, n=48, d_model=32, h=4, causal=True):
    """precision bfloat16 on /v1/multihead (projections float32, attention
    bfloat16) against float64 torch and torch's bfloat16 math path."""
    p = {"x": rnd(B, n, d_model), "w_q": rnd(d_model, d_model, scale=0.3),
         "w_k": rnd(d_model, d_model, scale=0.3), "w_v": rnd(d_model, d_model, scale=0.3),
         "w_o": rnd(d_model, d_model, scale=0.3)}
    go = rnd(B, n, d_model)
    body = {name: enc(a, "base64") for name, a in p.items()}
    body.update(num_heads=h, causal=causal, grad_output=enc(go, "base64"), precision="bfloat16",
                output_encoding="base64")
    status, text, resp = srv.post("/v1/multihead", body)
    if status != 200:
        c.fail("status %d: %s" % (status, text[:300]))
        return
    r64 = ref_mha(p, h, torch.float64, causal=causal, go=go)
    rbf = ref_mha(p, h, torch.bfloat16, causal=causal, go=go)
    bf16_compare(c, "output", dec(resp["output"]), rbf["o"].astype(np.float64), r64["o"])
    for name in ("x", "w_q", "w_k", "w_v", "w_o"):
        bf16_compare(c, "grad." + name, dec(resp["grad"][name]),
                     rbf["grad"][name].astype(np.float64), r64["grad"][name])


def error_case(c, srv, path, body, status, code, field=None):
    st, text, resp = srv.post(path, body)
    c.expect(st == status, "status %d, expected %d: %s" % (st, status, text[:200]))
    err = (resp or {}).get("error") if isinstance(resp, dict) else None
    if not isinstance(err, dict):
        c.fail("no error object: %s" % text[:200])
        return
    c.note = "%s %s field=%s" % (st, err.get("code"), err.get("field"))
    codes = code if isinstance(code, tuple) else (code,)
    c.expect(err.get("code") in codes, "code %r, expected %s" % (err.get("code"), "/".join(codes)))
    c.expect(err.get("status") == st, "error.status %r but HTTP %d" % (err.get("status"), st))
    c.expect(isinstance(err.get("message"), str) and err["message"], "empty message")
    if field is not None:
        c.expect(err.get("field") == field, "field %r, expected %r" % (err.get("field"), field))


# ---------------------------------------------------------------- main


def main():
    binary = os.environ.get("ATTND_BIN") or "build/attnd"
    if "ATTND_BIN" not in os.environ and not os.path.exists(binary):
        binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "attnd")
    if not os.path.exists(binary):
        print("torch_check: %s not found (build it with make)" % binary)
        print("0 passed, 1 failed")
        return 1
    started = time.time()
    try:
        srv = Server(binary)
    except Exception as e:
        print("torch_check: cannot start %s: %s" % (binary, e))
        print("0 passed, 1 failed")
        return 1
    print("torch_check: attnd %s on 127.0.0.1:%d, torch %s" % (binary, srv.port, torch.__version__))
    sys.stdout.flush()
    try:
        cases(srv)
    finally:
        rc = srv.stop()
    log = srv.log_text()
    c = Case("server exits 0 on SIGTERM, log clean")
    c.expect(rc == 0, "exit status %r; log tail: %s" % (rc, log[-800:]))
    for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
        if bad in log:
            at = log.index(bad)
            c.fail("sanitizer report in the server log: " + log[max(0, at - 200):at + 600])
    ok = c.report()
    RESULTS.append(ok)
    if ok:
        os.unlink(srv.log.name)
    else:
        print("    server log kept in " + srv.log.name)
    passed = sum(1 for r in RESULTS if r)
    failed = len(RESULTS) - passed
    print("max errors of passing cases, relative to max(1, |ref|): forward %.2e, grad %.2e (vs float64 torch); "
          "vs float32 torch: forward %.2e, grad %.2e; %.1f s"
          % (MAXERR["forward"], MAXERR["grad"], MAXERR["f32_forward"], MAXERR["f32_grad"],
             time.time() - started))
    if LEFT_OUT:
        print("%d cases left out: their names do not hold TORCH_CHECK_ONLY=%r" % (len(LEFT_OUT), ONLY))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


def cases(srv):
    A = "attention "
    # ranks, shapes, scale
    run_case(A + "rank2 n_q!=n_k d_k!=d_v", simple, srv, (7, 16), (11, 16), (11, 5), weights=True)
    run_case(A + "rank3 H=3", simple, srv, (3, 9, 8), (3, 13, 8), (3, 13, 6), weights=True)
    run_case(A + "rank4 B=2 H=3", simple, srv, (2, 3, 10, 8), (2, 3, 6, 8), (2, 3, 6, 4), weights=True)
    run_case(A + "explicit scale 0.3", simple, srv, (2, 6, 5), (2, 8, 5), (2, 8, 7),
             scale=f32(0.3), weights=True)
    run_case(A + "explicit scale 2.5 causal", simple, srv, (6, 5), (6, 5), (6, 3),
             scale=2.5, causal=True, weights=True)
    # causal, bottom-right
    run_case(A + "causal n_q<n_k", simple, srv, (2, 5, 8), (2, 9, 8), (2, 9, 4), causal=True, weights=True)
    run_case(A + "causal n_q=n_k", simple, srv, (2, 7, 8), (2, 7, 8), (2, 7, 4), causal=True, weights=True)
    run_case(A + "causal n_q>n_k (zero rows)", simple, srv, (2, 9, 8), (2, 4, 8), (2, 4, 4),
             causal=True, weights=True, stats=True)
    run_case(A + "causal n_q=1 sees all", simple, srv, (1, 8), (12, 8), (12, 4), causal=True, weights=True)
    # masks, broadcasting, with causal
    run_case(A + "bool mask [n_k] + causal", simple, srv, (2, 6, 8), (2, 9, 8), (2, 9, 4),
             causal=True, weights=True, mask_fn=lambda sq, sk: bool_mask((sk[-2],)))
    run_case(A + "bool mask [n_q,n_k]", simple, srv, (2, 6, 8), (2, 9, 8), (2, 9, 4),
             weights=True, mask_fn=lambda sq, sk: bool_mask((sq[-2], sk[-2])))
    run_case(A + "bool mask [H,1,n_k] + causal", simple, srv, (2, 3, 6, 8), (2, 3, 6, 8), (2, 3, 6, 4),
             causal=True, weights=True, mask_fn=lambda sq, sk: bool_mask((3, 1, sk[-2])))
    run_case(A + "bool mask [B,1,1,n_k]", simple, srv, (2, 3, 6, 8), (2, 3, 7, 8), (2, 3, 7, 4),
             weights=True, mask_fn=lambda sq, sk: bool_mask((2, 1, 1, sk[-2])))
    run_case(A + "float mask [n_k] + causal", simple, srv, (2, 6, 8), (2, 9, 8), (2, 9, 4),
             causal=True, weights=True, mask_fn=lambda sq, sk: rnd(sk[-2]))
    run_case(A + "float mask [n_q,n_k]", simple, srv, (5, 8), (9, 8), (9, 4),
             weights=True, mask_fn=lambda sq, sk: rnd(sq[-2], sk[-2], scale=2.0))
    run_case(A + "float mask [H,1,n_k] + causal", simple, srv, (2, 3, 6, 8), (2, 3, 6, 8), (2, 3, 6, 4),
             causal=True, weights=True, mask_fn=lambda sq, sk: rnd(3, 1, sk[-2]))
    run_case(A + "float mask [B,1,1,n_k] + causal", simple, srv, (2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4),
             causal=True, weights=True, mask_fn=lambda sq, sk: rnd(2, 1, 1, sk[-2]))
    run_case(A + "bool mask base64 [B,H,n_q,n_k]", simple, srv, (2, 2, 6, 8), (2, 2, 7, 8), (2, 2, 7, 4),
             weights=True, mask_enc="base64", mask_fn=lambda sq, sk: bool_mask((2, 2, 6, 7)))

    def row_masked(sq, sk):
        mk = bool_mask((sq[-2], sk[-2]))
        mk[2, :] = False
        mk[0, :] = False
        return mk
    run_case(A + "fully masked rows via mask", simple, srv, (2, 5, 8), (2, 6, 8), (2, 6, 4),
             weights=True, stats=True, mask_fn=row_masked)
    run_case(A + "mask removes causal's keys (zero row)", simple, srv, (4, 8), (4, 8), (4, 4),
             causal=True, weights=True, stats=True,
             mask_fn=lambda sq, sk: np.array([False, True, True, True]))
    run_case(A + "everything masked (null stats)", all_masked_stats_case, srv)
    for offset in (1e2, 1e4, 2.0 ** 20):
        run_case(A + "no mask, scores %g + small ints" % offset, score_offset_case, srv, offset)
    for bias in (-1e4, 1e4, -2.0 ** 20):
        run_case(A + "row bias %g, exact scores" % bias, large_bias_case, srv, bias, True)
    for bias in (-1e9, 1e9):
        run_case(A + "row bias %g (vs f32 torch)" % bias, large_bias_case, srv, bias, False)
    # GQA / MQA
    run_case(A + "GQA rank3 H_q=4 H_kv=2", simple, srv, (4, 6, 8), (2, 9, 8), (2, 9, 5), weights=True)
    run_case(A + "MQA rank3 H_q=4 H_kv=1 causal", simple, srv, (4, 6, 8), (1, 9, 8), (1, 9, 5),
             causal=True, weights=True)
    run_case(A + "GQA rank4 B=2 H_q=4 H_kv=2 + mask", simple, srv, (2, 4, 6, 8), (2, 2, 7, 8), (2, 2, 7, 5),
             causal=True, weights=True, stats=True, mask_fn=lambda sq, sk: bool_mask((2, 1, 1, 7), 0.8))
    run_case(A + "MQA rank4 B=2 H_q=4 H_kv=1", simple, srv, (2, 4, 5, 8), (2, 1, 7, 8), (2, 1, 7, 3),
             weights=True)
    # statistics
    run_case(A + "stats plain", simple, srv, (2, 12, 16), (2, 20, 16), (2, 20, 4), stats=True, grad=False)
    run_case(A + "stats causal + bool + float mask", simple, srv, (2, 8, 16), (2, 10, 16), (2, 10, 4),
             stats=True, causal=True, grad=False,
             mask_fn=lambda sq, sk: bool_mask((8, 10), 0.8))
    run_case(A + "stats float mask (masks nothing)", simple, srv, (2, 8, 16), (2, 10, 16), (2, 10, 4),
             stats=True, grad=False, scale=f32(0.7),
             mask_fn=lambda sq, sk: rnd(8, 10, scale=3.0))
    # tile edges
    run_case(A + "n_q=1 n_k=1", simple, srv, (1, 4), (1, 4), (1, 2), weights=True, stats=True)
    run_case(A + "n=65 d=64 causal", simple, srv, (65, 64), (65, 64), (65, 64), causal=True, weights=True)
    run_case(A + "n_q=129 n_k=300 d_k=64 d_v=33", simple, srv, (2, 129, 64), (2, 300, 64), (2, 300, 33),
             causal=True, weights=True)
    run_case(A + "n=300 d=64 causal GQA", simple, srv, (4, 300, 64), (2, 300, 64), (2, 300, 64), causal=True)
    run_case(A + "n_q=300 n_k=65 causal (zero rows)", simple, srv, (300, 16), (65, 16), (65, 8),
             causal=True, weights=True)
    run_case(A + "n_q=1 n_k=1100 d=1", simple, srv, (1, 1), (1100, 1), (1100, 3), weights=True, stats=True)
    run_case(A + "n_q=40 n_k=2100 d_k=128 d_v=256 causal", simple, srv, (2, 40, 128), (2, 2100, 128),
             (2, 2100, 256), causal=True, encoding="base64", mask_fn=lambda sq, sk: bool_mask((2100,), 0.9))
    run_case(A + "n=1100 d=32 causal", simple, srv, (1100, 32), (1100, 32), (1100, 32), causal=True,
             encoding="base64")
    run_case(A + "d_k=3 d_v=1 n=257 mask", simple, srv, (257, 3), (257, 3), (257, 1), weights=True,
             mask_fn=lambda sq, sk: bool_mask((257,), 0.5))
    # encodings and text round trip
    run_case(A + "encodings 3 in x 3 out identical", encodings_case, srv)
    run_case(A + "text numbers round-trip to float32", roundtrip_case, srv)
    run_case(A + "scores +-1e4 exact one-hot", onehot_case, srv)
    run_case(A + "request numbers read as json then float32", number_text_case, srv)
    run_case(A + "12 concurrent requests", concurrent_case, srv)

    for seed in range(int(os.environ.get("TORCH_CHECK_RANDOM", "16"))):
        run_case(A + "random#%d" % seed, random_attention_case, srv, 1000 + seed)

    M = "multihead "
    run_case(M + "self, w_o, unbatched", mha_case, srv)
    run_case(M + "self, no w_o, batched", mha_case, srv, B=2, w_o=False)
    run_case(M + "self, all biases, batched", mha_case, srv, B=2, biases=("b_q", "b_k", "b_v", "b_o"))
    for b in ("b_q", "b_k", "b_v", "b_o"):
        run_case(M + "self, only " + b, mha_case, srv, biases=(b,))
    run_case(M + "self, b_v no w_o", mha_case, srv, w_o=False, biases=("b_v", "b_q"))
    run_case(M + "cross m!=n d_ctx!=d_model", mha_case, srv, B=2, n=5, m=9, d_model=8, d_ctx=6,
             biases=("b_k", "b_v"))
    run_case(M + "cross unbatched, no w_o", mha_case, srv, n=7, m=4, d_model=6, d_ctx=10, w_o=False)
    run_case(M + "GQA h=4 h_kv=2", mha_case, srv, B=2, h=4, h_kv=2, d_k=3, d_v=2, weights=True)
    run_case(M + "MQA h=4 h_kv=1 cross", mha_case, srv, n=5, m=8, d_ctx=7, h=4, h_kv=1, weights="mean")
    run_case(M + "causal self, weights true", mha_case, srv, B=2, causal=True, weights=True)
    run_case(M + "causal cross n>m (zero rows), mean", mha_case, srv, B=2, n=8, m=5, d_ctx=6,
             causal=True, weights="mean", biases=("b_q", "b_k", "b_v", "b_o"))
    run_case(M + "bool mask [n,m] + causal, unbatched", mha_case, srv, n=6, causal=True,
             mask=bool_mask((6, 6), 0.7), weights=True)
    run_case(M + "float mask [B,1,1,m]", mha_case, srv, B=2, n=5, m=7, d_ctx=8,
             mask=rnd(2, 1, 1, 7), weights="mean")
    run_case(M + "bool mask [h,1,m] GQA", mha_case, srv, B=2, h=4, h_kv=2, n=5,
             mask=bool_mask((4, 1, 5), 0.7), weights=True)
    run_case(M + "mask [1,h,n,n] unbatched", mha_case, srv, n=5, h=2,
             mask=bool_mask((1, 2, 5, 5), 0.7), weights=True)
    run_case(M + "float mask [h,n,m] batched cross", mha_case, srv, B=2, n=4, m=6, h=2,
             mask=rnd(2, 4, 6), weights=True)
    run_case(M + "context = copy of x (grads apart)", mha_case, srv, B=2, n=5, m=5, d_ctx=8,
             causal=True, same_context=True)
    run_case(M + "stats GQA h=4 h_kv=2 + mask", mha_case, srv, B=2, h=4, h_kv=2, stats=True,
             mask=bool_mask((2, 1, 6, 6), 0.7), grad=False)
    pad = np.zeros((2, 1, 6, 6), np.float32)
    pad[0, 0, 4:, :] = -1e9   # padded query rows, HuggingFace style
    pad[:, :, :, 5] = -1e9    # a padded key
    run_case(M + "float mask -1e9 padded rows (vs f32 torch)", mha_case, srv, B=2, mask=pad,
             weights=True, ref_f32=True)
    run_case(M + "explicit scale, flat encoding", mha_case, srv, B=2, scale=f32(0.45), encoding="flat",
             weights=True)
    run_case(M + "base64 encoding, bool mask, stats", mha_case, srv, B=2, encoding="base64", stats=True,
             biases=("b_q", "b_k"), causal=True, mask=bool_mask((2, 1, 6, 6), 0.8), weights=True)
    run_case(M + "larger n=70 d_model=32 h=4", mha_case, srv, B=2, n=70, d_model=32, h=4, d_k=8, d_v=8,
             d_out=16, causal=True, biases=("b_q", "b_k", "b_v", "b_o"))

    for seed in range(int(os.environ.get("TORCH_CHECK_RANDOM", "16"))):
        run_case(M + "random#%d" % seed, random_mha_case, srv, 5000 + seed)

    V = "variant "
    # each variant alone, at shapes crossing 64-key tiles, with weights, lse,
    # stats and every gradient
    run_case(V + "window [10,5] n 100x130", simple, srv, (2, 100, 16), (2, 130, 16), (2, 130, 8),
             weights=True, stats=True, lse=True, window=(10, 5))
    run_case(V + "window [0,0] n=70", simple, srv, (70, 8), (70, 8), (70, 4), weights=True,
             stats=True, lse=True, window=(0, 0))
    run_case(V + "window [-1,3] n_q<n_k", simple, srv, (3, 70, 16), (3, 150, 16), (3, 150, 8),
             weights=True, lse=True, window=(-1, 3))
    run_case(V + "window [64,-1] n=150", simple, srv, (150, 16), (150, 16), (150, 16), lse=True,
             weights=True, window=(64, -1))
    run_case(V + "window [3,3] n_q>n_k (empty rows)", simple, srv, (2, 150, 8), (2, 70, 8), (2, 70, 4),
             weights=True, stats=True, lse=True, window=(3, 3))
    run_case(V + "alibi [H] n=90", simple, srv, (3, 90, 16), (3, 90, 16), (3, 90, 8), weights=True,
             stats=True, lse=True, alibi=alibi_slopes(3))
    run_case(V + "alibi [B,H] rank4 n 70x130", simple, srv, (2, 3, 70, 8), (2, 3, 130, 8), (2, 3, 130, 8),
             weights=True, lse=True, alibi=rnd(2, 3, scale=0.3))
    run_case(V + "alibi [1] rank2 n_q>n_k", simple, srv, (100, 8), (66, 8), (66, 8), weights=True,
             lse=True, alibi=np.array([0.25], np.float32))
    run_case(V + "softcap 5 (large scores)", simple, srv, (2, 70, 16), (2, 100, 16), (2, 100, 8),
             weights=True, stats=True, lse=True, softcap=5.0, scale=f32(1.5))
    run_case(V + "softcap 0.5", simple, srv, (2, 65, 8), (2, 129, 8), (2, 129, 8), weights=True,
             lse=True, softcap=0.5)
    run_case(V + "rope 10000 n=130", simple, srv, (2, 130, 16), (2, 130, 16), (2, 130, 8),
             weights=True, stats=True, lse=True, rope=10000.0)
    run_case(V + "rope 100 n_q<n_k d=34", simple, srv, (2, 70, 34), (2, 150, 34), (2, 150, 4),
             weights=True, lse=True, rope=100.0)
    run_case(V + "rope 10 n_q>n_k (negative positions)", simple, srv, (120, 8), (70, 8), (70, 8),
             weights=True, lse=True, rope=10.0)
    run_case(V + "return_lse alone", simple, srv, (2, 3, 70, 16), (2, 3, 90, 16), (2, 3, 90, 8), lse=True)
    run_case(V + "lse null/-inf in every encoding", lse_encodings_case, srv)
    # combined with causal, masks, GQA and batch
    run_case(V + "window+causal n_q>n_k (empty rows)", simple, srv, (2, 150, 8), (2, 70, 8), (2, 70, 8),
             causal=True, weights=True, stats=True, lse=True, window=(5, 3))
    run_case(V + "window [-1,-1]+causal is no window (meta.flops too)", simple, srv, (2, 70, 8),
             (2, 90, 8), (2, 90, 4), causal=True, lse=True, window=(-1, -1))
    run_case(V + "window [20,-1]+causal GQA", simple, srv, (4, 100, 16), (2, 100, 16), (2, 100, 8),
             causal=True, weights=True, lse=True, window=(20, -1))
    run_case(V + "alibi+causal+bool mask GQA rank4", simple, srv, (2, 4, 70, 8), (2, 2, 90, 8),
             (2, 2, 90, 8), causal=True, weights=True, stats=True, lse=True, alibi=alibi_slopes(4),
             mask_fn=lambda sq, sk: bool_mask((2, 1, 70, 90), 0.7))
    run_case(V + "softcap+float mask+causal", simple, srv, (2, 70, 16), (2, 130, 16), (2, 130, 8),
             causal=True, weights=True, stats=True, lse=True, softcap=3.0,
             mask_fn=lambda sq, sk: rnd(70, 130, scale=2.0))
    run_case(V + "rope+causal MQA", simple, srv, (4, 90, 16), (1, 130, 16), (1, 130, 8), causal=True,
             weights=True, stats=True, lse=True, rope=10000.0)
    run_case(V + "all + causal + bool mask, GQA B=2", simple, srv, (2, 4, 100, 16), (2, 2, 150, 16),
             (2, 2, 150, 8), causal=True, weights=True, stats=True, lse=True, window=(40, 0),
             alibi=rnd(2, 4, scale=0.2), softcap=4.0, rope=500.0,
             mask_fn=lambda sq, sk: bool_mask((2, 1, 1, 150), 0.8))
    run_case(V + "all + float mask, GQA, base64", simple, srv, (2, 4, 70, 16), (2, 2, 140, 16),
             (2, 2, 140, 8), weights=True, stats=True, lse=True, window=(30, 30), alibi=alibi_slopes(4),
             softcap=2.0, rope=10000.0, encoding="base64", out_encoding="base64",
             mask_fn=lambda sq, sk: rnd(4, 70, 140))
    run_case(V + "all, n=300 window 64, flat", simple, srv, (2, 300, 32), (2, 300, 32), (2, 300, 32),
             causal=True, lse=True, window=(64, 0), alibi=alibi_slopes(2), softcap=10.0, rope=10000.0,
             encoding="flat", out_encoding="flat")
    for seed in range(int(os.environ.get("TORCH_CHECK_RANDOM", "16"))):
        run_case(V + "random#%d" % seed, random_variant_case, srv, 9000 + seed)
    # multi-head: per head, after the projections
    run_case(V + "multihead window+causal", mha_case, srv, B=2, n=70, d_model=16, h=2, d_k=8, d_v=4,
             causal=True, weights=True, stats=True, lse=True, window=(10, 0))
    run_case(V + "multihead alibi [h] unbatched", mha_case, srv, n=70, d_model=16, h=4, d_k=4, d_v=4,
             weights=True, lse=True, alibi=alibi_slopes(4))
    run_case(V + "multihead alibi [B,h] GQA", mha_case, srv, B=2, n=66, d_model=8, h=4, h_kv=2, d_k=4,
             d_v=3, weights="mean", lse=True, alibi=rnd(2, 4, scale=0.3))
    run_case(V + "multihead softcap, stats", mha_case, srv, B=2, n=65, d_model=16, h=2, d_k=8, d_v=4,
             stats=True, lse=True, softcap=1.0, scale=f32(2.0))
    run_case(V + "multihead rope cross n<m", mha_case, srv, B=2, n=40, m=130, d_model=8, d_ctx=6, h=2,
             d_k=6, d_v=4, weights=True, lse=True, rope=10000.0, biases=("b_q", "b_k"))
    run_case(V + "multihead all + mask, GQA, cross", mha_case, srv, B=2, n=70, m=100, d_model=12, d_ctx=10,
             h=4, h_kv=2, d_k=4, d_v=3, causal=True, weights=True, stats=True, lse=True,
             window=(30, 2), alibi=alibi_slopes(4), softcap=3.0, rope=100.0,
             mask=bool_mask((2, 1, 70, 100), 0.8), biases=("b_q", "b_k", "b_v", "b_o"))
    run_case(V + "multihead window empty rows, base64", mha_case, srv, n=100, m=66, d_model=8, d_ctx=8,
             h=2, d_k=4, d_v=4, weights=True, lse=True, window=(2, 2), encoding="base64")
    # the merge that return_lse is for, and order
    run_case(V + "merge of 2 key shards (bias mask, softcap)", merge_case, srv, 2, "bias", softcap=6.0)
    run_case(V + "merge of 5 key shards (bool mask, GQA)", merge_case, srv, 5, "bool")
    run_case(V + "merge of 5 key shards, base64", merge_case, srv, 5, "bias", encoding="base64")
    run_case(V + "permuting keys: nothing without RoPE, output with", permutation_case, srv)
    contract = openapi_text(srv)
    for dtype in ("float16", "bfloat16"):
        if '"%s"' % dtype in contract or "- %s" % dtype in contract:
            run_case(V + "%s round trip" % dtype, half_roundtrip_case, srv, dtype)
        else:
            print("SKIPPED %s round trip: this build's /openapi.yaml has no %s dtype; "
                  "not counted" % (dtype, dtype))

    R = "ragged "
    mixed_q, mixed_k = [0, 3, 70, 0, 1, 97, 16], [2, 5, 66, 4, 0, 97, 16]
    run_case(R + "lengths across the tiles", ragged_case, srv, 2, 2, mixed_q)
    run_case(R + "causal", ragged_case, srv, 2, 1, mixed_q, causal=True)
    run_case(R + "cross lengths, empty sides, causal", ragged_case, srv, 4, 2, mixed_q, mixed_k,
             causal=True)
    run_case(R + "window [5,2]", ragged_case, srv, 2, 2, mixed_q, mixed_k, window=(5, 2))
    run_case(R + "alibi + causal", ragged_case, srv, 4, 1, mixed_q, mixed_k, causal=True,
             alibi=alibi_slopes(4))
    run_case(R + "softcap", ragged_case, srv, 2, 2, mixed_q, softcap=2.0)
    run_case(R + "rope per sequence", ragged_case, srv, 2, 1, mixed_q, mixed_k, rope=10000.0)
    run_case(R + "bool mask [n_q,n_k] + causal", ragged_case, srv, 2, 2, mixed_q, mixed_k,
             causal=True, mask_p=0.7)
    run_case(R + "float mask, base64", ragged_case, srv, 2, 2, mixed_q, mask_p=1.0, bias_mask=True,
             encoding="base64")
    run_case(R + "all variants, GQA", ragged_case, srv, 4, 2, mixed_q, mixed_k, causal=True,
             window=(40, 0), alibi=alibi_slopes(4), softcap=5.0, rope=500.0, mask_p=0.9)
    run_case(R + "500 sequences of 1-8", ragged_case, srv, 2, 1,
             [int(x) for x in RNG.integers(1, 9, 500)], d_k=8, d_v=4, causal=True, stats=False)
    for seed in range(int(os.environ.get("TORCH_CHECK_RANDOM", "16")) // 2):
        run_case(R + "random#%d" % seed, random_ragged_case, srv, 12000 + seed)
    run_case(R + "multihead self", ragged_mha_case, srv, [3, 0, 70, 1], causal=True)
    run_case(R + "multihead cross, empty sides", ragged_mha_case, srv, [2, 5, 0, 66, 3],
             [4, 0, 3, 70, 1], h=4, h_kv=2, window=(3, 1), rope=100.0)
    run_case(R + "error seq_lens sum -> 422", error_case, srv, "/v1/attention",
             {"q": [[1, 2], [3, 4]], "k": [[1, 2], [3, 4]], "v": [[1, 2], [3, 4]], "seq_lens": [1, 2]},
             422, "shape_mismatch", "seq_lens")
    run_case(R + "error seq_lens_k alone -> 422", error_case, srv, "/v1/attention",
             {"q": [[1, 2], [3, 4]], "k": [[1, 2], [3, 4]], "v": [[1, 2], [3, 4]], "seq_lens_k": [2]},
             422, "invalid_value", "seq_lens_k")
    C = "cache "
    run_case(C + "float32 GQA", cache_case, srv, 2, 16, 8)
    run_case(C + "float32 one head (rank-2 k, v)", cache_case, srv, 1, 8, 4)
    run_case(C + "float16 GQA", cache_case, srv, 2, 8, 8, "float16")
    run_case(C + "bfloat16", cache_case, srv, 1, 16, 4, "bfloat16")
    run_case(C + "rope float32", cache_case, srv, 2, 16, 8, rope=10000.0)
    run_case(C + "rope float16", cache_case, srv, 2, 16, 8, "float16", rope=100.0)
    run_case(C + "rope bfloat16 one head", cache_case, srv, 1, 16, 8, "bfloat16", rope=10000.0)
    run_case(C + "bfloat16 precision: /v1's bits, float32 GQA", cache_bf16_case, srv, 2, 8, 150, 5, 64, 32,
             "float32")
    run_case(C + "bfloat16 precision: /v1's bits, float16 decode", cache_bf16_case, srv, 1, 4, 70, 1, 16, 8,
             "float16")
    run_case(C + "bfloat16 precision: /v1's bits, bfloat16 prefill", cache_bf16_case, srv, 4, 4, 130, 70, 32,
             16, "bfloat16")
    P = "bfloat16 "
    run_case(P + "plain n_q!=n_k, odd d", bf16_attention_case, srv, (2, 70, 33), (2, 150, 33), (2, 150, 17))
    run_case(P + "causal d=64", bf16_attention_case, srv, (4, 128, 64), (4, 128, 64), (4, 128, 64),
             causal=True)
    run_case(P + "GQA, bool mask", bf16_attention_case, srv, (2, 4, 40, 16), (2, 2, 90, 16),
             (2, 2, 90, 8), mask=bool_mask((2, 1, 40, 90), 0.8))
    run_case(P + "window, alibi, softcap, rope", bf16_attention_case, srv, (4, 65, 16), (4, 65, 16),
             (4, 65, 16), causal=True, window=(20, -1), alibi=alibi_slopes(4), softcap=5.0,
             rope=10000.0)
    run_case(P + "multihead causal, w_o", bf16_mha_case, srv)

    E = "error "
    qkv = {"q": [[1, 2], [3, 4]], "k": [[1, 2], [3, 4]], "v": [[1, 2], [3, 4]]}
    run_case(E + "typo casual -> 400 unknown_field", error_case, srv, "/v1/attention",
             dict(qkv, casual=True), 400, "unknown_field", "casual")
    run_case(E + "k d_k mismatch -> 422 shape_mismatch", error_case, srv, "/v1/attention",
             dict(qkv, k=[[1, 2, 3], [4, 5, 6]]), 422, "shape_mismatch", "k")
    run_case(E + "1e39 -> 400 invalid_number", error_case, srv, "/v1/attention",
             dict(qkv, q=[[1e39, 2], [3, 4]]), 400, "invalid_number")
    run_case(E + "base64 NaN -> 400 invalid_number", error_case, srv, "/v1/attention",
             dict(qkv, v=enc(np.array([[1, float("nan")], [3, 4]], np.float32), "base64")), 400,
             "invalid_number")
    run_case(E + "num_heads 3 of 4 columns -> 422", error_case, srv, "/v1/multihead",
             {"x": [[1, 2, 3, 4]], "w_q": np.eye(4).tolist(), "w_k": np.eye(4).tolist(),
              "w_v": np.eye(4).tolist(), "num_heads": 3}, 422, "shape_mismatch")
    run_case(E + "H_q % H_kv != 0 -> 422", error_case, srv, "/v1/attention",
             {"q": rnd(3, 2, 2).tolist(), "k": rnd(2, 2, 2).tolist(), "v": rnd(2, 2, 2).tolist()},
             422, "shape_mismatch")
    run_case(E + "mask not broadcastable -> 422", error_case, srv, "/v1/attention",
             dict(qkv, mask=[True, False, True]), 422, "shape_mismatch", "mask")
    run_case(E + "ragged q -> 422 ragged_array", error_case, srv, "/v1/attention",
             dict(qkv, q=[[1, 2], [3]]), 422, "ragged_array")
    run_case(E + "duplicate key -> 400", error_case, srv, "/v1/attention",
             '{"q": [[1]], "k": [[1]], "v": [[1]], "v": [[2]]}', 400, "duplicate_key")
    run_case(E + "missing v -> 400 missing_field", error_case, srv, "/v1/attention",
             {"q": qkv["q"], "k": qkv["k"]}, 400, "missing_field", "v")
    run_case(E + "causal 1 -> 400 wrong_type", error_case, srv, "/v1/attention",
             dict(qkv, causal=1), 400, "wrong_type", "causal")
    run_case(E + "grad_output shape -> 422", error_case, srv, "/v1/attention",
             dict(qkv, grad_output=[[1, 2, 3]]), 422, "shape_mismatch", "grad_output")
    mh = {"x": [[1, 2, 3, 4]], "w_q": np.eye(4).tolist(), "w_k": np.eye(4).tolist(),
          "w_v": np.eye(4).tolist(), "num_heads": 4}
    run_case(E + "num_kv_heads 3 of 4 -> 422 invalid_value", error_case, srv, "/v1/multihead",
             dict(mh, num_kv_heads=3), 422, ("invalid_value", "shape_mismatch"))
    run_case(E + "b_o without w_o -> 422 invalid_value", error_case, srv, "/v1/multihead",
             dict(mh, b_o=[1, 2, 3, 4]), 422, "invalid_value", "b_o")
    run_case(E + "multihead typo num_head -> 400", error_case, srv, "/v1/multihead",
             {"x": mh["x"], "w_q": mh["w_q"], "w_k": mh["w_k"], "w_v": mh["w_v"], "num_head": 4},
             400, ("unknown_field", "missing_field"))
    run_case(E + "scale 0 -> 422 invalid_value", error_case, srv, "/v1/attention",
             dict(qkv, scale=0), 422, "invalid_value", "scale")
    run_case(E + "precision float16 -> 422 invalid_value", error_case, srv, "/v1/attention",
             dict(qkv, precision="float16"), 422, "invalid_value", "precision")
    run_case(E + "rank 5 q -> 422 invalid_shape", error_case, srv, "/v1/attention",
             dict(qkv, q=[[[[[1, 2]]]]], k=[[[[[1, 2]]]]], v=[[[[[1, 2]]]]]), 422, "invalid_shape")
    run_case(E + "context batch != x batch -> 422", error_case, srv, "/v1/multihead",
             dict(mh, x=[[[1, 2, 3, 4]]] * 2, context=[[[1, 2, 3, 4]]] * 3), 422, "shape_mismatch", "context")


if __name__ == "__main__":
    sys.exit(main())
