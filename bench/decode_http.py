"""Decoding over HTTP against attnd: what a request costs beyond the kernel,
and what a server-side KV cache saves over re-sending K and V every step.

    python3 bench/decode_http.py URL [ROUNDS [DECODE_FLOOR]]

Prints "name value" lines for bench/run.sh:
  http_dec_rtt_us       median round trip of a decode step on a kept-alive
                        connection: POST /v1/caches/{id}/attention appending
                        one position (after truncating back to 32768) and
                        attending one query row per head, H_q=32, H_kv=8,
                        d=128, bfloat16 pages, q, k, v and the output base64;
                        from the request's first byte sent to the answer's
                        last byte received (see exchange())
  http_dec_compute_us   the median of the same steps' meta.timing_ms.compute
                        (the append and the kernel, as the server timed them)
  http_dec_overhead_us  the median over steps of round trip - compute
  http_dec_server_us    the median of the same steps' meta.timing_ms.total -
                        compute: attnd's own part that its clock sees (the
                        body read after its headers, decoding, queueing for
                        a worker, encoding); the rest of the overhead is the
                        request's way in, the answer's hand-back to the I/O
                        thread and its way out
  http_dec_floor_us     with DECODE_FLOOR (bench/decode_floor.c, built): the
                        same requests sent to that blunt C responder, which
                        streams as many bytes as the step's K and V with two
                        threads and answers as many bytes as attnd, taking
                        turns with attnd's steps in blocks of 10 (attnd's
                        rows above are then from those turns): its round
                        trip - stream time, the least a server pays for the
                        step's exchange after such a stream on the machine
                        the bench runs on
  http_dec_floor_stream_us  the median of its stream times
  http_dec_floor_codec_us  the same responder in its "codec" mode, taking
                        turns with both: it also decodes each body's q, k
                        and v and encodes its answer (q's shape, base64)
                        with attnd's JSON codec, so this is the floor plus
                        what the step's wire format costs with that codec
  http_dec_floor_codec_work_us  of which its decoding and encoding (its
                        total - stream)
  http_dec_overhead_2k_us  the same over a cache of 2048 positions
  http_dec_overhead_64_us  the same over a cache of 64 positions (a kernel
                        of microseconds: nothing streamed through the CPU's
                        caches, the client's next step sent at once)
  http_dec_overhead_64_pause_us  the same 64-position steps, each sent after
                        a pause as long as the 32768-position step's median
                        compute: what the step's own way costs when the
                        client, attnd's threads and the cores have been
                        doing something else (or nothing) for that long,
                        without any large cache read
  http_dec_pause_get_us  median round trip of GET /v2/health/live (answered
                        by the I/O thread, nothing computed) on the same kind
                        of connection, each sent after a pause as long as a
                        step's median round trip at 32768 positions: what
                        any request costs that comes after the client and
                        the server have been waiting that long (on a
                        virtual machine whose idle cores halt, their
                        wake-ups), next to which to read the overhead
  http_dec_small_rtt_us  median round trip of a small model's step
                        (examples/decode.py's layer: H_q=4, H_kv=2, d=16,
                        200 positions), back to back: small enough to be
                        computed on the I/O thread that reads it
  http_dec_small_pause_rtt_us  the same, each step sent 300 us after the
                        answer before it (a client with work of its own
                        between steps)
  http_cache_step_ms    a step through a cache at 4096 positions (float32)
  http_resend_step_ms   the same step through POST /v1/attention, q, k and v
                        of all 4096 positions sent each time (base64)
  http_resend_ratio     resend / cache, measured taking turns
"""
import base64
import http.client
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse

import numpy as np

H_Q, H_KV, D = 32, 8, 128
# examples/decode.py's layers: 4 query heads, 2 key/value heads of width 16
SMALL = (4, 2, 16)


def b64(a):
    a = np.ascontiguousarray(a, dtype="<f4")
    return {"shape": list(a.shape), "dtype": "float32", "base64": base64.b64encode(a.tobytes()).decode()}


class RawConn:
    """HTTP/1.1 on a plain socket, for the timed decode steps: the request's
    bytes are made before the clock starts, the clock stops as the answer's
    last byte is received, and the answer is parsed after, so the round trip
    is the network's and attnd's, not http.client's (whose header parsing
    alone takes longer than attnd's whole transport of a step, and more
    after a step has streamed a large cache through the caches). The socket
    blocks in recv itself (no timeout: Python would poll(2) before each
    recv)."""

    def __init__(self, url, name="attnd"):
        u = urllib.parse.urlsplit(url)
        self.name = name
        self.s = socket.create_connection((u.hostname, u.port), timeout=600)
        self.s.settimeout(None)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(1 << 20)
        self.view = memoryview(self.buf)

    @staticmethod
    def request(path, body):
        return (b"POST %s HTTP/1.1\r\nHost: attnd\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % (path.encode(), len(body))) + body

    def exchange(self, request):
        """Sends request, reads one answer (attnd always sends its length):
        (status, body, seconds from the first byte sent to the last byte
        received)."""
        t = time.perf_counter()
        self.s.sendall(request)
        got, total = 0, -1
        while got != total:
            n = self.s.recv_into(self.view[got:])
            if n == 0:
                sys.exit(f"{self.name} closed the connection")
            got += n
            if total < 0:
                end = self.buf.find(b"\r\n\r\n", 0, got)
                if end >= 0:
                    at = self.buf.find(b"\r\nContent-Length:", 0, end) + 17
                    if at < 17:
                        sys.exit("an answer without Content-Length")
                    total = end + 4 + int(self.buf[at:self.buf.find(b"\r\n", at, end + 2)])
                    if total > len(self.buf):
                        self.buf.extend(bytearray(total - len(self.buf)))
                        self.view = memoryview(self.buf)
        seconds = time.perf_counter() - t
        if got > total:
            sys.exit("attnd sent more than one answer")
        return int(self.buf[9:12]), bytes(self.buf[end + 4:total]), seconds

    def close(self):
        self.s.close()


class Conn:
    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        self.c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        self.c.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = self.c.getresponse()
        text = r.read()
        if r.status >= 300:
            sys.exit(f"{method} {path}: {r.status} {text[:200]!r}")
        return json.loads(text) if text else {}


def filled_cache(conn, rng, n, dtype, dims=(H_Q, H_KV, D)):
    _, h_kv, d = dims
    cache = conn.call("POST", "/v1/caches", {"num_kv_heads": h_kv, "head_dim": d, "dtype": dtype})["id"]
    for start in range(0, n, 2048):
        m = min(2048, n - start)
        conn.call("POST", f"/v1/caches/{cache}/attention",
                  {"k": b64(rng.standard_normal((h_kv, m, d))), "v": b64(rng.standard_normal((h_kv, m, d)))})
    return cache


def step_body(rng, truncate, dims=(H_Q, H_KV, D)):
    h_q, h_kv, d = dims
    return {"truncate": truncate, "k": b64(rng.standard_normal((h_kv, 1, d))),
            "v": b64(rng.standard_normal((h_kv, 1, d))), "q": b64(rng.standard_normal((h_q, 1, d))),
            "output_encoding": "base64"}


class Steps:
    """Timed steps on one connection: per step kept (after a warm-up of 3),
    the round trip, meta.timing_ms.compute and total (us)."""

    def __init__(self, url, requests, name="attnd"):
        self.raw = RawConn(url, name)
        self.requests = requests
        self.sent = 0
        self.rtt, self.compute, self.total = [], [], []

    def step(self, pause):
        if pause:
            time.sleep(pause)
        status, body, seconds = self.raw.exchange(self.requests[self.sent % len(self.requests)])
        if status != 200:
            sys.exit(f"decode step ({self.raw.name}): {status} {body[:200]!r}")
        timing = json.loads(body)["meta"]["timing_ms"]
        self.sent += 1
        if self.sent > 3:
            self.rtt.append(seconds * 1e6)
            self.compute.append(timing["compute"] * 1e3)
            self.total.append(timing["total"] * 1e3)
        return body

    def keep(self, n):
        """Keeps the first n steps kept."""
        del self.rtt[n:], self.compute[n:], self.total[n:]

    def overhead(self):
        return [r - c for r, c in zip(self.rtt, self.compute)]


def decode_steps(url, conn, rng, n, rounds, pause=0.0, dims=(H_Q, H_KV, D)):
    """attnd's Steps: `rounds` decode steps over a bfloat16 cache of n
    positions with `dims` (query heads, key/value heads, width), the first 3
    a warm-up; each step sent `pause` seconds after the answer before it."""
    cache = filled_cache(conn, rng, n, "bfloat16", dims)
    steps = Steps(url, [RawConn.request(f"/v1/caches/{cache}/attention",
                                        json.dumps(step_body(rng, n, dims)).encode())
                        for _ in range(8)])
    while steps.sent < rounds:
        steps.step(pause)
    steps.raw.close()
    conn.call("DELETE", f"/v1/caches/{cache}")
    return steps


def decode_steps_with_floor(url, conn, rng, n, rounds, floor_binary):
    """attnd's Steps over n positions (as decode_steps) and decode_floor's,
    plain and in its "codec" mode, for the same requests, taking turns in
    blocks of 10 steps (the order rotating by one each round) until each
    has sent `rounds` (attnd's first, whose answer gives the plain floor its
    length, is one of its warm-up), the same number kept of each; the floors
    stream the bytes of the cache's K and V."""
    cache = filled_cache(conn, rng, n, "bfloat16")
    requests = [RawConn.request(f"/v1/caches/{cache}/attention", json.dumps(step_body(rng, n)).encode())
                for _ in range(8)]
    ours = Steps(url, requests)
    answer = ours.step(0)
    kv_bytes = n * H_KV * 2 * D * 2  # bfloat16 keys and values
    floors, servers = [], [ours]
    try:
        for mode in ([], ["codec"]):
            floors.append(subprocess.Popen([floor_binary, str(kv_bytes), str(len(answer))] + mode,
                                           stdout=subprocess.PIPE))
            port = int(floors[-1].stdout.readline())
            name = " ".join(["decode_floor"] + mode)
            servers.append(Steps(f"http://127.0.0.1:{port}", requests, name))
        block = 0
        while any(s.sent < rounds for s in servers):
            # each server's block follows each other's in turn
            turn = block % len(servers)
            for s in servers[turn:] + servers[:turn]:
                for _ in range(10):
                    s.step(0)
            block += 1
        for s in servers:
            s.keep(rounds - 3)
            if s is not ours:
                s.raw.close()
    finally:
        for f in floors:
            f.kill()
            f.wait()
    ours.raw.close()
    conn.call("DELETE", f"/v1/caches/{cache}")
    return servers


def pause_get(url, pause, rounds):
    """Round trips (us) of GET /v2/health/live, each after `pause` seconds
    of silence on a kept-alive connection, after a warm-up."""
    raw = RawConn(url)
    request = b"GET /v2/health/live HTTP/1.1\r\nHost: attnd\r\n\r\n"
    times = []
    for i in range(rounds):
        time.sleep(pause)
        status, body, seconds = raw.exchange(request)
        if status != 200:
            sys.exit(f"GET /v2/health/live: {status} {body[:200]!r}")
        if i >= 3:
            times.append(seconds * 1e6)
    raw.close()
    return times


def main(url, rounds, floor_binary=None):
    if rounds < 4:
        sys.exit("ROUNDS: at least 4 (the first 3 steps of each kind are a warm-up)")
    rng = np.random.default_rng(0)
    conn = Conn(url)
    # 1. a decode step's round trip against its compute time, 32768 positions,
    # and the same at 2048 (a cache that streams 8 MB, not 134 MB, through
    # the CPU's caches before the answer is written and read)
    if floor_binary:
        ours, floor, floor_codec = decode_steps_with_floor(url, conn, rng, 32768, rounds, floor_binary)
    else:
        ours, floor, floor_codec = decode_steps(url, conn, rng, 32768, rounds), None, None
    median = statistics.median
    print("http_dec_rtt_us %.1f" % median(ours.rtt))
    print("http_dec_compute_us %.1f" % median(ours.compute))
    print("http_dec_overhead_us %.1f" % median(ours.overhead()))
    print("http_dec_server_us %.1f" % median(t - c for t, c in zip(ours.total, ours.compute)))
    if floor:
        print("http_dec_floor_us %.1f" % median(floor.overhead()))
        print("http_dec_floor_stream_us %.1f" % median(floor.compute))
        print("http_dec_floor_codec_us %.1f" % median(floor_codec.overhead()))
        work = [t - c for t, c in zip(floor_codec.total, floor_codec.compute)]
        print("http_dec_floor_codec_work_us %.1f" % median(work))
    print("http_dec_pause_get_us %.1f" % median(pause_get(url, median(ours.rtt) * 1e-6, rounds)))
    print("http_dec_overhead_2k_us %.1f" % median(decode_steps(url, conn, rng, 2048, rounds).overhead()))
    # 1b. the same step's way with no large cache read: 64 positions, back
    # to back, then each after a pause as long as the long step's compute
    print("http_dec_overhead_64_us %.1f" % median(decode_steps(url, conn, rng, 64, rounds).overhead()))
    steps = decode_steps(url, conn, rng, 64, rounds, median(ours.compute) * 1e-6)
    print("http_dec_overhead_64_pause_us %.1f" % median(steps.overhead()))
    # 1c. a small model's step (examples/decode.py's shapes, 200 positions):
    # its body is decoded and, its cache's turn being free, computed on the
    # I/O thread; back to back, and after a pause of 300 us
    print("http_dec_small_rtt_us %.1f" % median(decode_steps(url, conn, rng, 200, rounds, dims=SMALL).rtt))
    steps = decode_steps(url, conn, rng, 200, rounds, 300e-6, dims=SMALL)
    print("http_dec_small_pause_rtt_us %.1f" % median(steps.rtt))

    # 2. the same step at 4096 positions: through a cache, or re-sending K, V
    n = 4096
    cache = filled_cache(conn, rng, n, "float32")
    k = rng.standard_normal((H_KV, n, D))
    v = rng.standard_normal((H_KV, n, D))
    resend = json.dumps({"q": b64(rng.standard_normal((H_Q, 1, D))), "k": b64(k), "v": b64(v),
                         "causal": True, "output_encoding": "base64"}).encode()
    kept = [json.dumps(step_body(rng, n)).encode() for _ in range(8)]
    t_cache, t_resend = [], []
    for i in range(max(4, rounds // 10)):  # taking turns: 10 cache steps, one re-send
        t = time.perf_counter()
        for j in range(10):
            conn.c.request("POST", f"/v1/caches/{cache}/attention", body=kept[j % 8],
                           headers={"Content-Type": "application/json"})
            conn.c.getresponse().read()
        t_cache.append((time.perf_counter() - t) / 10)
        t = time.perf_counter()
        conn.c.request("POST", "/v1/attention", body=resend, headers={"Content-Type": "application/json"})
        conn.c.getresponse().read()
        t_resend.append(time.perf_counter() - t)
    conn.call("DELETE", f"/v1/caches/{cache}")
    c, s = statistics.median(t_cache), statistics.median(t_resend)
    print("http_cache_step_ms %.3f" % (c * 1e3))
    print("http_resend_step_ms %.3f" % (s * 1e3))
    print("http_resend_ratio %.1f" % (s / c))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 100, sys.argv[3] if len(sys.argv) > 3 else None)
