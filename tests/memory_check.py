#!/usr/bin/env python3
"""Memory as a budget, against a live attnd (tests/test_memory_budget.sh and
the "memory" row of make reliability).

    memory_check.py checks URL PID         the classes one by one
    memory_check.py stream URL PROBE SECONDS CLIENTS
                                           the worst requests the cost model
                                           admits, for SECONDS, beside small
                                           requests that must be answered

PROBE is a second attnd with the same --max-request-memory and --max-work 1:
it judges a request's memory before its work, so "422 memory_limit" there
means too large and "422 work_limit" means admitted, without computing
anything; the stream's worst sizes are found by bisection against it.

Python's standard library only. Prints one line per check ("ok ..." or
"FAILED ..."); exits 1 when one fails.
"""
import base64
import http.client
import json
import socket
import struct
import sys
import threading
import time
import urllib.parse

failures = 0


def say(ok, what):
    global failures
    print(("ok     " if ok else "FAILED ") + what, flush=True)
    if not ok:
        failures += 1


def post(url, path, body, timeout=120):
    """(status, headers dict, parsed body or text)."""
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    c.request("POST", path, data, {"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read()
    c.close()
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = raw.decode(errors="replace")
    return r.status, {k.lower(): v for k, v in r.getheaders()}, parsed


def get(url, path):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    raw = r.read()
    c.close()
    return r.status, raw.decode(errors="replace")


def metric(url, name):
    _, text = get(url, "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def hwm_mib(pid):
    """The server's peak resident memory so far (VmHWM), MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0


def b64(values):
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def tensor(shape, fill=0.01):
    n = 1
    for s in shape:
        n *= s
    return {"shape": list(shape), "dtype": "float32", "base64": b64([fill] * n)}


def error_code(body):
    return body.get("error", {}).get("code") if isinstance(body, dict) else None


# ------------------------------------------------------------ the classes

def projection(n, d):
    """Multi-head with d_model = 1: x [n, 1], w_q = w_k [1, d], w_v [1, 1],
    context [1, 1]: q is [n, d], n*d*4 bytes from a body of n + 2d numbers."""
    return "/v1/multihead", {
        "x": tensor([n, 1], 1.0), "context": tensor([1, 1], 1.0),
        "w_q": tensor([1, d]), "w_k": tensor([1, d]), "w_v": tensor([1, 1], 1.0),
        "num_heads": 1, "output_encoding": "base64"}


def narrow(d, n_k=1, n_q=1, grad=False):
    """Few keys with a huge d_k: q [n_q, d], k [n_k, d], v [n_k, 1]."""
    body = {"q": tensor([n_q, d], 1e-3), "k": tensor([n_k, d], 1e-3),
            "v": tensor([n_k, 1], 1.0), "output_encoding": "base64"}
    if grad:
        body["grad_output"] = tensor([n_q, 1], 1.0)
    return "/v1/attention", body


def head_mean(n, h):
    """return_weights "mean" over h heads of d_model = 1."""
    return "/v1/multihead", {
        "x": tensor([n, 1], 0.5), "w_q": tensor([1, h], 0.3), "w_k": tensor([1, h], 0.2),
        "w_v": tensor([1, h], 1.0), "num_heads": h, "return_weights": "mean",
        "output_encoding": "base64"}


def weights(n):
    """Every weight of one head, as base64."""
    return "/v1/attention", {"q": tensor([n, 2], 0.1), "k": tensor([n, 2], 0.2),
                             "v": tensor([n, 2], 1.0), "return_weights": True,
                             "output_encoding": "base64"}


def small():
    return "/v1/attention", {"q": [[1, 0], [0, 1]], "k": [[1, 0], [0, 1]], "v": [[1], [2]]}


# -------------------------------------------------------------- checks

def checks(url, pid):
    # 1. Projection workspaces: refused before they are allocated.
    for n, d in ((16384, 16384), (65536, 65536), (8192, 12000)):
        path, body = projection(n, d)
        t0 = time.monotonic()
        status, _, b = post(url, path, body)
        took = time.monotonic() - t0
        msg = b.get("error", {}).get("message", "") if isinstance(b, dict) else ""
        say(status == 422 and error_code(b) == "memory_limit" and "projections" in msg
            and "--max-request-memory" in msg and took < 5,
            f"d_model = 1, n = {n}, d_k = {d}: 422 memory_limit naming the projections "
            f"in {took:.2f} s ({status} {msg[:100]})")
    path, body = projection(2048, 1024)
    status, _, b = post(url, path, body)
    say(status == 200, f"d_model = 1, n = 2048, d_k = 1024 (8 MiB of projections) is served ({status})")
    # 2. Narrow key tails with a huge d_k: served, without 64 keys' worth.
    for d, n_k, grad in ((4000000, 1, False), (1000000, 3, True)):
        path, body = narrow(d, n_k=n_k, n_q=2, grad=grad)
        status, _, b = post(url, path, body)
        say(status == 200, f"q [2, {d}], k [{n_k}, {d}]{' with gradients' if grad else ''}: "
            f"served ({status} {error_code(b)})")
    say(hwm_mib(pid) < 600, f"the server's peak after the narrow tails: {hwm_mib(pid):.0f} MiB "
        "(padded to 64 keys: several GiB)")
    # 3. The head mean: no per-head tensor.
    path, body = head_mean(512, 1024)
    status, _, b = post(url, path, body)
    ok = status == 200
    if ok:
        w = struct.unpack(f"<{512 * 512}f", base64.b64decode(b["weights"]["base64"]))
        ok = all(abs(sum(w[i * 512:(i + 1) * 512]) - 1) < 1e-3 for i in range(512))
    say(ok, f"return_weights \"mean\", n = 512, h = 1024: served, rows sum to 1 ({status})")
    say(hwm_mib(pid) < 600, f"the server's peak after the head mean: {hwm_mib(pid):.0f} MiB "
        "(per head: 1 GiB)")
    # The answer names what it would hold.
    path, body = head_mean(4096, 4096)
    status, _, b = post(url, path, body)
    say(status == 422 and error_code(b) in ("memory_limit", "work_limit", "response_too_large"),
        f"return_weights \"mean\", n = 4096, h = 4096: refused before computing ({status} "
        f"{error_code(b)})")


def budget_checks(url):
    """--max-memory: a request that does not fit beside the one computing
    gets 503 with Retry-After."""
    # About 14 MiB priced: alone it is let in, beside itself it does not fit
    # in --max-memory 16MiB. Long and narrow (n = 12288, d = 16: about 0.2 s
    # on 2 cores, the memory of n = 3072, d = 64 for four times its work),
    # so that it still computes when the second one's body has been read.
    n, d = 12288, 16
    path, heavy = "/v1/attention", {
        "q": tensor([n, d], 0.01), "k": tensor([n, d], 0.02), "v": tensor([n, d], 1.0),
        "grad_output": tensor([n, d], 1.0), "output_encoding": "base64"}
    done = {}

    def run():
        done["heavy"] = post(url, path, heavy)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (metric(url, "attnd_memory_bytes_pending") or 0):
        time.sleep(0.01)
    pending = metric(url, "attnd_memory_bytes_pending") or 0
    status, headers, b = post(url, path, heavy)
    t.join()
    say(pending > 0 and status == 503 and "retry-after" in headers and
        "--max-memory" in b.get("error", {}).get("message", ""),
        f"a second heavy request beside the first ({pending / 2**20:.0f} MiB pending): "
        f"503 with Retry-After naming --max-memory ({status})")
    say(done.get("heavy", (0,))[0] == 200, f"the first is served ({done.get('heavy', (0,))[0]})")
    status, _, _ = post(url, path, heavy)
    say(status == 200, f"once it is done the second fits ({status})")
    say((metric(url, "attnd_memory_bytes_pending") or 0) == 0, "nothing stays reserved")


def raw_upload(url, length, first, path="/v1/attention"):
    """A connection that announces `length` bytes and sends `first`."""
    u = urllib.parse.urlparse(url)
    s = socket.create_connection((u.hostname, u.port))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {length}\r\n\r\n".encode() + first)
    return s


def read_status(s, timeout=30):
    s.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    line = data.split(b"\r\n", 1)[0].decode(errors="replace")
    return int(line.split()[1]) if line.startswith("HTTP/") else 0, data.decode(errors="replace")


def body_checks(url):
    """--max-body-memory 1MiB: buffers grow as bytes arrive; a body that
    does not fit beside the others gets 503."""
    # Announced 60 MB, 10 bytes sent: holds one small buffer, not 60 MB.
    stalled = [raw_upload(url, 60_000_000, b'{"q": [[1]]') for _ in range(5)]
    time.sleep(0.3)
    held = metric(url, "attnd_body_bytes") or 0
    say(held <= 5 * 65536, f"5 uploads announcing 60 MB, 10 bytes sent: {held / 1024:.0f} KiB "
        "of body buffers")
    for s in stalled:
        s.close()
    # One body of 900 KB stalled at 700 KB holds its buffer; a second of
    # 300 KB does not fit beside it in 1 MiB.
    pad = b" " * 700_000
    big = raw_upload(url, 900_000, b"{" + pad)
    time.sleep(0.3)
    q = json.dumps(small()[1]).encode()
    second = q[:-1] + b" " * (300_000 - len(q)) + b"}"
    status, text = read_status(raw_upload(url, len(second), second))
    say(status == 503 and "retry-after" in text.lower() and "--max-body-memory" in text,
        f"a 300 KB body beside a stalled 900 KB one in --max-body-memory 1MiB: 503 ({status})")
    big.close()
    time.sleep(0.3)
    status, _, _ = post(url, "/v1/attention", second)
    say(status == 200, f"once the stalled one is gone the same body is served ({status})")
    say((metric(url, "attnd_body_bytes") or 0) <= 1 << 20, "the buffers kept are within the budget")


# -------------------------------------------------------------- stream

def admitted(probe, make, lo, hi):
    """The largest size in [lo, hi] whose request the probe admits (422
    work_limit there), by bisection; None when lo is refused."""
    def ok(x):
        path, body = make(x)
        try:
            status, _, b = post(probe, path, body)
        except OSError:  # a body past --max-body: 413 and the connection closed
            return False
        return status == 422 and error_code(b) == "work_limit"
    if not ok(lo):
        return None
    while hi - lo > max(1, lo // 50):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def stream(url, probe, seconds, clients):
    families = [
        ("projections, d_model = 1", lambda x: projection(x, x), 256, 65536),
        ("narrow keys, huge d_k", lambda x: narrow(x, n_k=1, n_q=2), 1000, 16_000_000),
        ("narrow keys, backward", lambda x: narrow(x, n_k=5, n_q=2, grad=True), 1000, 16_000_000),
        ("head mean, many heads", lambda x: head_mean(256, x), 8, 65536),
        ("every weight", weights, 64, 16384),
    ]
    worst = []
    for name, make, lo, hi in families:
        x = admitted(probe, make, lo, hi)
        print(f"       worst admitted: {name}: {x}", flush=True)
        if x is not None:
            worst.append((name, make(x)))
    say(len(worst) == len(families), f"the probe admitted a size of every family ({len(worst)})")
    counts, lock, stop = {}, threading.Lock(), time.monotonic() + seconds

    def count(key):
        with lock:
            counts[key] = counts.get(key, 0) + 1

    def heavy(i):
        j = i
        while time.monotonic() < stop:
            name, (path, body) = worst[j % len(worst)]
            j += 1
            try:
                status, headers, b = post(url, path, body, timeout=300)
                ok = status == 200 or (status == 503 and "retry-after" in headers)
                count("heavy ok" if ok else f"heavy {status} {error_code(b)}")
            except OSError as e:
                count(f"heavy error {type(e).__name__}")

    def light():
        while time.monotonic() < stop:
            path, body = small()
            try:
                status, headers, _ = post(url, path, body, timeout=60)
                count("small 200" if status == 200 else f"small {status}")
            except OSError as e:
                count(f"small error {type(e).__name__}")
            time.sleep(0.05)

    # Stalled uploads beside them: 10 bodies of 50 MB announced, trickled.
    stalled = []
    for _ in range(10):
        try:
            stalled.append(raw_upload(url, 50_000_000, b'{"q": [' + b"1," * 1000))
        except OSError:
            count("stalled upload refused")
    threads = [threading.Thread(target=heavy, args=(i,)) for i in range(clients)]
    threads.append(threading.Thread(target=light))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stalled:
        s.close()
    print("       answers: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
          flush=True)
    bad = {k: v for k, v in counts.items()
           if not (k in ("heavy ok", "small 200", "small 503", "stalled upload refused"))}
    small_ok = counts.get("small 200", 0)
    small_all = sum(v for k, v in counts.items() if k.startswith("small"))
    say(not bad, f"every heavy answer is 200 or 503 + Retry-After, every small one 200 or 503 "
        f"({bad or 'none other'})")
    say(small_all > 0 and small_ok >= 0.9 * small_all,
        f"small requests answered: {small_ok} of {small_all}")
    status, _ = get(url, "/healthz")
    say(status == 200, "attnd is alive at the end")
    return counts


def main():
    mode = sys.argv[1]
    if mode == "checks":
        url, pid = sys.argv[2], int(sys.argv[3])
        checks(url, pid)
    elif mode == "budget":
        budget_checks(sys.argv[2])
    elif mode == "bodies":
        body_checks(sys.argv[2])
    elif mode == "stream":
        stream(sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
