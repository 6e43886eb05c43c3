"""A client of the Open Inference Protocol (KServe v2, REST), written from the
protocol's text and the binary tensor data extension alone (Python's
standard library), run against attnd and checked against /v1's answers to
the same requests, bit for bit:

    python3 tests/oip_client.py URL EXCHANGES.jsonl

  - the chapter's worked examples and exercises (docs/chapter.md), JSON in
    and out, and Theorem 1's statistics (the "stats" output);
  - grouped-query multi-head attention with every gradient, binary in and
    out, and mixed (some tensors JSON, some binary, per-output binary_data);
  - float16 and bfloat16 tensors, binary both ways, with a BOOL mask;
  - the variants as parameters (window, alibi_slopes, softcap, rope, lse),
    and bfloat16 precision;
  - the health, server and model metadata routes; a few refusals.

Every /v2 exchange (path, status, the JSON of the answer) is written to
EXCHANGES.jsonl, for tests/oip_validate.mjs to validate against the
protocol's OpenAPI description.
"""
import base64
import http.client
import json
import random
import struct
import sys
import urllib.parse

URL = urllib.parse.urlsplit(sys.argv[1])
EXCHANGES = open(sys.argv[2], "w", encoding="utf-8")
failures = 0


def check(name, ok, detail=""):
    global failures
    print(("ok     " if ok else "FAILED ") + name + (f": {detail}" if detail and not ok else ""))
    failures += not ok


# ------------------------------------------------------------- transport

def request(method, path, body=b"", headers=None):
    conn = http.client.HTTPConnection(URL.hostname, URL.port, timeout=60)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, data)
    conn.close()
    return out


def record(method, path, status, header_json):
    EXCHANGES.write(json.dumps({"method": method, "path": path, "status": status,
                                "body": header_json}) + "\n")


def get(path):
    status, headers, data = request("GET", path)
    body = json.loads(data)
    record("GET", path, status, body)
    return status, body


# --------------------------------------------------------------- tensors
# Elements as the protocol lists them: little-endian, row-major, FP32 4
# bytes, FP16 and BF16 2, BOOL 1.

def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def to_bf16(x):
    """The bfloat16 nearest x (ties to even), as a float."""
    u = f32_bits(x)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", u))[0]


def pack(datatype, values):
    if datatype == "FP32":
        return struct.pack(f"<{len(values)}f", *values)
    if datatype == "FP16":
        return struct.pack(f"<{len(values)}e", *values)
    if datatype == "BF16":
        return b"".join(struct.pack("<I", f32_bits(to_bf16(v)))[2:] for v in values)
    if datatype == "BOOL":
        return bytes(1 if v else 0 for v in values)
    raise ValueError(datatype)


def unpack(datatype, data):
    if datatype == "FP32":
        return list(struct.unpack(f"<{len(data) // 4}f", data))
    if datatype == "FP16":
        return list(struct.unpack(f"<{len(data) // 2}e", data))
    if datatype == "BF16":
        return [struct.unpack("<f", b"\0\0" + data[i:i + 2])[0] for i in range(0, len(data), 2)]
    raise ValueError(datatype)


def flat(x):
    return [y for row in x for y in flat(row)] if isinstance(x, list) else [x]


def shape_of(x):
    return [len(x)] + shape_of(x[0]) if isinstance(x, list) else []


class Tensor:
    """An input: shape, datatype, values (flat), sent as JSON data or bytes."""

    def __init__(self, values, datatype="FP32", binary=False, shape=None, nested=False):
        self.shape = shape if shape is not None else shape_of(values)
        self.nested = values if nested else None
        self.values = flat(values)
        self.datatype, self.binary = datatype, binary


def infer(model, inputs, outputs=None, parameters=None, binary_output=None, id=None,
          json_content_type=True):
    """POST /v2/models/{model}/infer: (status, JSON answer, {name: (datatype,
    shape, values)}) with the binary outputs decoded."""
    req, blobs = {"inputs": []}, []
    if id is not None:
        req["id"] = id
    params = dict(parameters or {})
    if binary_output is not None:
        params["binary_data_output"] = binary_output
    if params:
        req["parameters"] = params
    for name, t in inputs.items():
        entry = {"name": name, "shape": t.shape, "datatype": t.datatype}
        if t.binary:
            blob = pack(t.datatype, t.values)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = t.nested if t.nested is not None else t.values
        req["inputs"].append(entry)
    if outputs is not None:
        req["outputs"] = [{"name": o} if isinstance(o, str)
                          else {"name": o[0], "parameters": {"binary_data": o[1]}}
                          for o in outputs]
    text = json.dumps(req).encode()
    headers = {"Content-Type": "application/json" if json_content_type
               else "application/octet-stream"}
    if blobs:
        headers["Inference-Header-Content-Length"] = str(len(text))
    path = f"/v2/models/{model}/infer"
    status, h, data = request("POST", path, text + b"".join(blobs), headers)
    n = int(h.get("inference-header-content-length", len(data)))
    answer = json.loads(data[:n])
    record("POST", path, status, answer)
    got, at = {}, n
    for o in answer.get("outputs", []):
        size = o.get("parameters", {}).get("binary_data_size")
        if size is None:
            got[o["name"]] = (o["datatype"], o["shape"], flat(o["data"]))
            continue
        blob = data[at:at + size]
        at += size
        if o["datatype"] == "BYTES":
            length = struct.unpack("<I", blob[:4])[0]
            got[o["name"]] = ("BYTES", o["shape"], [blob[4:4 + length].decode()])
        else:
            got[o["name"]] = (o["datatype"], o["shape"], unpack(o["datatype"], blob))
    if status == 200:
        check(f"{path}: the binary outputs fill the body exactly ({at} of {len(data)} bytes)",
              at == len(data))
    return status, answer, got


# --------------------------------------------------------- /v1, for reference

def v1_tensor(t):
    dtype = {"FP32": "float32", "FP16": "float16", "BF16": "bfloat16", "BOOL": "bool"}
    return {"shape": t.shape, "dtype": dtype[t.datatype],
            "base64": base64.b64encode(pack(t.datatype, t.values)).decode()}


def v1(route, inputs, fields, output_dtype="float32"):
    body = {name: v1_tensor(t) for name, t in inputs.items()}
    body.update(fields)
    body["output_encoding"] = "base64"
    if output_dtype != "float32":
        body["output_dtype"] = output_dtype
    status, _, data = request("POST", f"/v1/{route}", json.dumps(body).encode(),
                              {"Content-Type": "application/json"})
    answer = json.loads(data)
    if status != 200:
        raise RuntimeError(f"/v1/{route}: {status} {answer}")
    datatype = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}[output_dtype]
    out = {}
    for key, value in answer.items():
        if key in ("meta",):
            continue
        if key == "stats":
            out["stats"] = ("BYTES", [1], [json.dumps(value, separators=(",", ":"))])
        elif key == "grad":
            for g, t in value.items():
                out["grad_" + g] = (datatype, t["shape"],
                                    unpack(datatype, base64.b64decode(t["base64"])))
        else:
            out[key] = (datatype, value["shape"], unpack(datatype, base64.b64decode(value["base64"])))
    return out


def bits(values, datatype):
    """The values' bit patterns in the datatype (NaN and -inf compare by bits)."""
    if datatype == "BYTES":
        return values
    return [None if v is None else pack(datatype, [v]) for v in values]


def same_as_v1(name, got, want, names=None):
    names = names or sorted(want)
    for key in names:
        if key not in got or key not in want:
            check(f"{name}: {key} in both answers", False,
                  f"v2 has {sorted(got)}, v1 has {sorted(want)}")
            continue
        (gt, gs, gv), (wt, ws, wv) = got[key], want[key]
        if key == "stats":
            gv = [json.dumps(json.loads(gv[0]), separators=(",", ":"))]
        worst = next((i for i, (a, b) in enumerate(zip(bits(gv, gt), bits(wv, wt))) if a != b),
                     None)
        ok = gt == wt and gs == ws and len(gv) == len(wv) and worst is None
        detail = f"{gt}{gs} against {wt}{ws}" + (
            f", element {worst}: {gv[worst]!r} against {wv[worst]!r}" if worst is not None else "")
        check(f"{name}: {key} is /v1's, bit for bit", ok, detail)


# ------------------------------------------------------------------ cases

def rand(rng, *shape, scale=1.0):
    n = 1
    for d in shape:
        n *= d
    values = [struct.unpack("<f", struct.pack("<f", rng.gauss(0, scale)))[0] for _ in range(n)]
    return Tensor(values, shape=list(shape))


def with_binary(tensors, binary=True, datatype=None):
    out = {}
    for name, t in tensors.items():
        copy = Tensor(t.values, t.datatype if datatype is None or t.datatype == "BOOL" else datatype,
                      binary, list(t.shape))
        out[name] = copy
    return out


def chapter():
    """The chapter's examples (docs/chapter.md), JSON both ways."""
    i2 = [[1, 0], [0, 1]]
    m3 = [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]]
    cases = [
        ("Worked Example 1", {"q": i2, "k": i2, "v": [[1, 2], [3, 4]]}, {"return_weights": True}),
        ("Worked Example 2", {"q": m3, "k": m3, "v": m3}, {"return_weights": True}),
        ("Exercise 2", {"q": [[3, 1], [-2, 4], [0, 0]], "k": [[1, 0], [0, 1], [1, 1]],
                        "v": [[1], [5], [9]]}, {}),
        ("Exercise 5 (causal)", {"q": m3, "k": m3, "v": m3},
         {"causal": True, "return_weights": True}),
        ("Exercise 6 (unscaled)", {"q": [[1] + [0] * 63], "k": [[10] + [0] * 63, [0] * 64],
                                   "v": [[1], [0]]}, {"scale": 1, "return_weights": True}),
        ("Exercise 6 (scaled)", {"q": [[1] + [0] * 63], "k": [[10] + [0] * 63, [0] * 64],
                                 "v": [[1], [0]]}, {"return_weights": True}),
    ]
    for name, tensors, fields in cases:
        inputs = {k: Tensor(v, nested=(k == "q")) for k, v in tensors.items()}
        outputs = ["output"] + (["weights"] if fields.get("return_weights") else [])
        params = {k: v for k, v in fields.items() if k != "return_weights"}
        status, answer, got = infer("attention", inputs, outputs, params, id=name)
        check(f"chapter {name}: 200, the id echoed", status == 200 and answer.get("id") == name,
              f"{status} {answer}")
        same_as_v1(f"chapter {name}", got, v1("attention", inputs, fields))
    if True:
        # Worked Example 1's weights, as the chapter prints them.
        _, _, got = infer("attention", {"q": Tensor(i2), "k": Tensor(i2), "v": Tensor([[1, 2], [3, 4]])},
                          ["weights"])
        w = got["weights"][2]
        check("chapter Worked Example 1: weights 0.67/0.33",
              abs(w[0] - 0.66976154) < 1e-7 and abs(w[1] - 0.33023846) < 1e-7, str(w))
    # Theorem 1: the statistics of N(0, 1) scores, as the "stats" output.
    rng = random.Random(0)
    for d_k in (16, 64):
        q, k = rand(rng, 64, d_k), rand(rng, 64, d_k)
        v = Tensor([[0.0]] * 64)
        inputs = {"q": q, "k": k, "v": v}
        for binary in (False, True):
            _, _, got = infer("attention", with_binary(inputs, binary), ["output", "stats"],
                              binary_output=binary)
            same_as_v1(f"Theorem 1 d_k={d_k} ({'binary' if binary else 'JSON'})", got,
                       v1("attention", inputs, {"return_stats": True}))
        stats = json.loads(got["stats"][2][0])
        check(f"Theorem 1 d_k={d_k}: Var(S~) near 1", 0.7 < stats["scaled_scores"]["var"] < 1.3,
              str(stats))


def multihead_gqa():
    """Grouped-query multi-head attention with every gradient."""
    rng = random.Random(1)
    b, n, m, d_model, heads, kv_heads, d_k = 2, 5, 7, 12, 4, 2, 3
    inputs = {
        "x": rand(rng, b, n, d_model), "context": rand(rng, b, m, d_model),
        "w_q": rand(rng, d_model, heads * d_k, scale=0.3),
        "w_k": rand(rng, d_model, kv_heads * d_k, scale=0.3),
        "w_v": rand(rng, d_model, kv_heads * d_k, scale=0.3),
        "w_o": rand(rng, heads * d_k, d_model, scale=0.3),
        "b_q": rand(rng, heads * d_k), "b_k": rand(rng, kv_heads * d_k),
        "b_v": rand(rng, kv_heads * d_k), "b_o": rand(rng, d_model),
        "grad_output": rand(rng, b, n, d_model),
    }
    params = {"num_heads": heads, "num_kv_heads": kv_heads, "causal": True}
    want = v1("multihead", inputs, dict(params, return_weights=True, return_lse=True))
    grads = [g for g in want if g.startswith("grad_")]
    check("GQA multi-head: /v1 gives a gradient for every differentiable input",
          sorted(grads) == sorted("grad_" + k for k in inputs if k != "grad_output"), str(grads))
    # Everything binary, default outputs (output and the gradients).
    status, answer, got = infer("multihead", with_binary(inputs), None, params, binary_output=True)
    check("GQA multi-head binary: 200", status == 200, str(answer))
    check("GQA multi-head: default outputs are the output and the gradients",
          [o["name"] for o in answer["outputs"]] == ["output"] + grads,
          str([o["name"] for o in answer["outputs"]]))
    same_as_v1("GQA multi-head binary", got, want, ["output"] + grads)
    # JSON in, JSON out, with lse and per-head weights asked for by name.
    names = ["output", "weights", "lse", "grad_x", "grad_w_k", "grad_b_o"]
    status, answer, got = infer("multihead", inputs, names, params)
    same_as_v1("GQA multi-head JSON", got, want, names)
    check("GQA multi-head: outputs in the order asked",
          [o["name"] for o in answer["outputs"]] == names)
    # Mixed: half the inputs binary, some outputs binary.
    mixed = {k: Tensor(t.values, "FP32", i % 2 == 0, t.shape)
             for i, (k, t) in enumerate(inputs.items())}
    status, answer, got = infer("multihead", mixed,
                                [("output", True), ("grad_context", False), ("grad_w_q", True)],
                                params)
    binary = {o["name"]: "binary_data_size" in o.get("parameters", {}) for o in answer["outputs"]}
    check("GQA multi-head mixed: binary_data per output",
          binary == {"output": True, "grad_context": False, "grad_w_q": True}, str(binary))
    same_as_v1("GQA multi-head mixed", got, want, ["output", "grad_context", "grad_w_q"])


def half_precision():
    """float16 and bfloat16 tensors, binary both ways, and a BOOL mask."""
    rng = random.Random(2)
    for datatype, dtype in (("FP16", "float16"), ("BF16", "bfloat16")):
        h, n_q, n_k, d = 2, 5, 9, 6
        inputs = {"q": rand(rng, h, n_q, d), "k": rand(rng, h, n_k, d), "v": rand(rng, h, n_k, d),
                  "grad_output": rand(rng, h, n_q, d)}
        inputs = with_binary(inputs, True, datatype)
        for t in inputs.values():
            t.values = unpack(datatype, pack(datatype, t.values))
        mask = [rng.random() < 0.7 for _ in range(n_q * n_k)]
        mask[0:n_k] = [False] * n_k  # a row that sees no key
        inputs["mask"] = Tensor(mask, "BOOL", True, [n_q, n_k])
        want = v1("attention", inputs, {"return_lse": True}, dtype)
        names = ["output", "lse", "grad_q", "grad_k", "grad_v"]
        status, answer, got = infer("attention", inputs, names,
                                    {"output_dtype": dtype}, binary_output=True)
        check(f"{datatype}: 200, every output {datatype}",
              status == 200 and all(o["datatype"] == datatype for o in answer["outputs"]),
              str(answer))
        same_as_v1(f"{datatype} binary in and out", got, want, names)
        row = got["lse"][2][:1]
        check(f"{datatype}: the row that sees no key has lse -inf and a zero output",
              row == [float("-inf")] and got["output"][2][:d] == [0.0] * d, str(row))
        # The same inputs as JSON numbers (each a value of the datatype).
        json_inputs = {k: Tensor(t.values, t.datatype, False, t.shape) for k, t in inputs.items()}
        status, answer, got = infer("attention", json_inputs, [(n, True) for n in names],
                                    {"output_dtype": dtype})
        same_as_v1(f"{datatype} JSON in, binary out", got, want, names)


def variants():
    """The other /v1 fields as parameters."""
    rng = random.Random(3)
    h, n, d = 2, 11, 8
    inputs = {"q": rand(rng, 1, h, n, d), "k": rand(rng, 1, h, n, d), "v": rand(rng, 1, h, n, d),
              "alibi_slopes": Tensor([0.5, 0.25])}
    params = {"causal": True, "window": [3, 0], "softcap": 5.0, "rope": {"base": 100},
              "scale": 0.3, "return_lse": True}
    want = v1("attention", inputs, params)
    status, _, got = infer("attention", inputs, None, params)
    check("variants as parameters: 200", status == 200)
    same_as_v1("variants as parameters", got, want, ["output", "lse"])
    status, _, got = infer("attention", with_binary(inputs), None, params, binary_output=True)
    same_as_v1("variants as parameters, binary", got, want, ["output", "lse"])
    # bfloat16 products (the precision parameter), with gradients
    inputs["grad_output"] = rand(rng, 1, h, n, d)
    params = {"causal": True, "precision": "bfloat16"}
    want = v1("attention", inputs, params)
    status, _, got = infer("attention", with_binary(inputs), None, params, binary_output=True)
    same_as_v1("precision bfloat16 as a parameter", got, want,
               ["output", "grad_q", "grad_k", "grad_v"])


def routes():
    status, body = get("/v2")
    check("GET /v2: name, version, binary_tensor_data",
          status == 200 and body["name"] == "attnd" and "binary_tensor_data" in body["extensions"],
          str(body))
    status, body = get("/v2/health/live")
    check("GET /v2/health/live: live", status == 200 and body == {"live": True}, str(body))
    status, body = get("/v2/health/ready")
    check("GET /v2/health/ready: ready", status == 200 and body == {"ready": True}, str(body))
    for model, inputs in (("attention", ["q", "k", "v"]), ("multihead", ["x", "w_q", "w_k", "w_v"])):
        status, body = get(f"/v2/models/{model}")
        names = [t["name"] for t in body["inputs"]]
        check(f"GET /v2/models/{model}: its inputs and outputs, -1 dimensions",
              status == 200 and body["name"] == model and all(i in names for i in inputs) and
              "output" in [t["name"] for t in body["outputs"]] and
              all(set(t["shape"]) <= {-1, 1} for t in body["inputs"] + body["outputs"]), str(body))
        status, body = get(f"/v2/models/{model}/ready")
        check(f"GET /v2/models/{model}/ready", status == 200 and body == {"name": model, "ready": True})
    status, body = get("/v2/models/nope")
    check("GET /v2/models/nope: 404 naming the models",
          status == 404 and "attention" in body.get("error", ""), str(body))


def refusals():
    """Errors in the protocol's form, with /v1's status for the same fault."""
    q = Tensor([[1, 0], [0, 1]])
    cases = [
        ("a shape that does not fit", {"q": q, "k": Tensor([[1, 0, 0]]), "v": Tensor([[1]])}, {},
         422, "k"),
        ("an unknown parameter", {"q": q, "k": q, "v": q}, {"casual": True}, 400, "causal"),
        ("a missing input", {"q": q, "k": q}, {}, 400, "v"),
    ]
    for name, inputs, params, want, mention in cases:
        status, answer, _ = infer("attention", inputs, None, params)
        check(f"refused, {name}: {want}, naming {mention}",
              status == want and set(answer) == {"error"} and mention in answer["error"],
              f"{status} {answer}")
    status, _, data = request("POST", "/v2/models/attention/infer", b"{\"inputs\": [",
                              {"Content-Type": "application/json"})
    answer = json.loads(data)
    record("POST", "/v2/models/attention/infer", status, answer)
    check("refused, not JSON: 400 {\"error\": ...}", status == 400 and set(answer) == {"error"})
    text = json.dumps({"inputs": [{"name": n, "shape": [1, 1], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 4}} for n in "qkv"]}).encode()
    status, _, data = request("POST", "/v2/models/attention/infer", text + b"\0" * 11,
                              {"Inference-Header-Content-Length": str(len(text))})
    answer = json.loads(data)
    record("POST", "/v2/models/attention/infer", status, answer)
    check("refused, binary data cut short: 400", status == 400 and "cut short" in answer["error"],
          f"{status} {answer}")


chapter()
multihead_gqa()
half_precision()
variants()
routes()
refusals()
EXCHANGES.close()
print(f"oip_client.py: {failures} failure(s)")
sys.exit(1 if failures else 0)
