"""A Python client of attnd with only the standard library and NumPy.

    from attnd_client import Client
    api = Client("http://127.0.0.1:8080")
    r = api.attention(q=q, k=k, v=v, causal=True, return_weights=True)
    r["output"], r["weights"]            # numpy float32 arrays
    api.attention(q=q, k=k, v=v, return_lse=True)["lse"]   # -inf: a row that sees no key

NumPy arrays in a request travel as base64 float32 ({"shape", "dtype",
"base64"}; bool arrays as "dtype": "bool" masks), and the client asks for
base64 answers, so every tensor comes back bit for bit as the server computed
it. Anything that is not an array is sent as JSON as it is. An answer that
is not 2xx raises AttndError with the API's status, code, message and field;
a server that does not answer raises AttndError with status 0 and code
"network".

Run as a script it prints a few answers of a server:
    python3 examples/attnd_client.py [URL]
URL defaults to $ATTND_URL, then http://127.0.0.1:8080. A server that is not
there, or an answer that is an error, ends the script with one line saying
so (and exit status 1).
"""
import base64
import json
import os
import sys
import urllib.error
import urllib.request

try:
    import numpy as np
except ImportError:
    if __name__ == "__main__":
        sys.exit("attnd_client.py needs NumPy: apt-get install python3-numpy, or pip install numpy")
    raise


class AttndError(Exception):
    def __init__(self, status, code, message, field=None):
        super().__init__(f"{status} {code}: {message}" + (f" (field {field})" if field else ""))
        self.status, self.code, self.message, self.field = status, code, message, field
        self.reason = None  # status 0: why there was no answer ("Connection refused")


def encode(a):
    """A NumPy array as the API's base64 tensor (little-endian, row-major)."""
    a = np.asarray(a)
    if a.dtype == np.bool_:
        return {"shape": list(a.shape), "dtype": "bool",
                "base64": base64.b64encode(np.ascontiguousarray(a, dtype=np.uint8).tobytes()).decode()}
    data = np.ascontiguousarray(a, dtype="<f4")
    return {"shape": list(a.shape), "dtype": "float32", "base64": base64.b64encode(data.tobytes()).decode()}


def decode(t):
    """A tensor of an answer (nested, flat or base64) as a float32 array."""
    if isinstance(t, list):
        return np.array(t, dtype=np.float32)
    if "base64" in t:
        return np.frombuffer(base64.b64decode(t["base64"]), dtype="<f4").reshape(t["shape"])
    return np.array(t["data"], dtype=np.float32).reshape(t["shape"])


class Client:
    def __init__(self, base="http://127.0.0.1:8080", timeout=60):
        self.base = base.rstrip("/")
        self.timeout = timeout

    def attention(self, **request):
        """POST /v1/attention: q, k, v and the optional fields of the API."""
        return self._compute("/v1/attention", request)

    def multihead(self, **request):
        """POST /v1/multihead: x, w_q, w_k, w_v, num_heads, ..."""
        return self._compute("/v1/multihead", request)

    def info(self):
        return self._call("GET", "/v1/info")

    def _compute(self, path, request):
        body = {"output_encoding": "base64"}
        for key, value in request.items():
            body[key] = encode(value) if isinstance(value, np.ndarray) else value
        answer = self._call("POST", path, json.dumps(body).encode())
        for key in ("output", "weights", "lse"):
            if answer.get(key) is not None:
                answer[key] = decode(answer[key])
        if "grad" in answer:
            answer["grad"] = {k: decode(v) for k, v in answer["grad"].items()}
        return answer

    def _call(self, method, path, data=None):
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as res:
                return json.load(res)
        except urllib.error.HTTPError as e:
            try:
                err = json.load(e)["error"]
            except (ValueError, KeyError, TypeError):
                raise AttndError(e.code, "not_json", f"{method} {path} answered {e.code}") from None
            raise AttndError(err.get("status", e.code), err.get("code"), err.get("message"),
                             err.get("field")) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            # No answer at all: refused, unresolvable, timed out, or not a URL.
            reason = getattr(e, "reason", e)
            reason = getattr(reason, "strerror", None) or str(reason)
            err = AttndError(0, "network", f"no answer from {self.base}{path}: {reason}")
            err.reason = reason
            raise err from None


DEFAULT_URL = "http://127.0.0.1:8080"


def server_url(argv):
    """The server's URL: the first argument, else $ATTND_URL, else the
    default; "host:port" alone is taken as http://host:port, as curl does."""
    url = argv[1] if len(argv) > 1 else os.environ.get("ATTND_URL") or DEFAULT_URL
    return url if "://" in url else "http://" + url


def one_line(url, e):
    """What a failed request means for whoever ran the script, in one line."""
    if e.status == 0:
        return f"cannot reach {url}: is attnd running? ({e.reason})"
    return f"{url} answered {e.status} {e.code}: {e.message}"


def main(base):
    api = Client(base)
    print("server:", api.info()["version"])
    # Worked Example 1: Q = K = I, V = [[1, 2], [3, 4]].
    eye = np.eye(2, dtype=np.float32)
    r = api.attention(q=eye, k=eye, v=np.array([[1, 2], [3, 4]], np.float32), return_weights=True)
    print("example 1 weights:", r["weights"].tolist())
    print("example 1 output:", r["output"].tolist())
    # Random causal attention with gradients, 2 heads.
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 5, 8), dtype=np.float32) for _ in range(3))
    r = api.attention(q=q, k=k, v=v, causal=True, grad_output=np.ones((2, 5, 8), np.float32))
    print("causal output shape:", list(r["output"].shape), "dq shape:", list(r["grad"]["q"].shape))
    print("timing (ms):", r["meta"]["timing_ms"])
    try:
        api.attention(q=eye, k=np.ones((2, 3), np.float32), v=eye)
    except AttndError as e:
        print("error:", e)


if __name__ == "__main__":
    url = server_url(sys.argv)
    try:
        main(url)
    except AttndError as e:
        sys.exit(one_line(url, e))
