#!/usr/bin/env python3
"""Clients for the reliability rows that wrk cannot play (tests/reliability/run.sh).

  clients.py overload PORT [--bursts N] [--clients N]
      Bursts of simultaneous compute requests against a server started with a
      small --threads and --queue. Every 503 must be overloaded with
      Retry-After, every other answer a 200 whose output is right for its own
      request (each request has its own v, so an answer sent to the wrong
      client is caught). Prints the 503 latency percentiles.

  clients.py slow PORT [--conns N] [--seconds S] [--limit N]
      N connections that trickle header bytes or hold idle, spread over
      several loopback addresses (each under --max-conns-per-ip); meanwhile
      normal requests from another address, timed. Then one address opens
      LIMIT connections and one more, which must get the JSON 503.

  clients.py slots PORT [--addresses N] [--per-address N] [--header-timeout S]
      N addresses each open connections whose headers never end (a byte a
      second, each of which would restart an idle timeout), more in all than
      the server's --max-connections; meanwhile new connections from another
      address ask for /healthz, timed. None of the trickling connections may
      live past --header-timeout (seen within 2 s), and every other request
      must be answered 200, at p99 within the bar.

  clients.py drain PORT --pid PID [--drain-timeout S]
      A body trickled a byte every 5 s (by Content-Length and chunked),
      headers trickled, and a computation in flight; then SIGTERM to PID. The
      bodies must be dropped within 1 s, the computation answered, and attnd
      must exit well within --drain-timeout.

  clients.py abandon PORT [--requests N] [--ms MS]
      Against --threads 1: N requests lasting MS each, whose clients close
      at once (one computing, the others queued); then a small request from
      another client, timed. It must not wait for them, and each of the N
      must be counted as 499.

Each prints lines "key: value" and a final "result: PASS|FAIL reason".
Only the standard library: the figures are simple enough to check by hand.
"""
import argparse
import base64
import json
import random
import selectors
import socket
import struct
import time


def percentile(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


def parse_complete(buf):
    """(status, headers, body) once buf holds a whole response, else None."""
    head, sep, body = buf.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    if len(body) < length:
        return None
    return int(lines[0].split()[1]), headers, body[:length]


def read_response(sock, deadline):
    """One HTTP/1.1 response (Content-Length framed): (status, headers, body)."""
    buf = b""
    while not (done := parse_complete(buf)):
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the whole response")
        buf += chunk
    return done


def connect(port, source=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if source:
        s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def post(path, body):
    return (f"POST {path} HTTP/1.1\r\nHost: attnd\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def error_code(body):
    try:
        return json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


# ------------------------------------------------------------------ overload

def b64(values):
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


# Linux's value (asm-generic: x86, arm64); Python's socket module lacks it.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
TIMESTAMP_SPACE = socket.CMSG_SPACE(16)  # struct timespec


def kernel_time(ancillary):
    """When the kernel received the data of a recvmsg() (SO_TIMESTAMPNS),
    in time.time()'s clock; now where it gave none (the peer closed)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack("qq", data[:16])
            return sec + nsec * 1e-9
    return time.time()


def overload(args):
    # Small bodies that cost a lot: multi-head attention with num_heads
    # heads of d_k = 1 over n rows (tens of milliseconds each), 6 KB of
    # base64, above the 4 KiB that is computed inline, so every request
    # goes through the queue. w_q = 0 makes every score 0 and the weights
    # uniform, so each output is mean(x) * w_v + b_v; request c sends
    # b_v = c, so its answer differs from every other request's.
    n, heads = args.n, args.heads
    rng = random.Random(7)
    x = [rng.randint(-16, 16) / 8 for _ in range(n)]  # exact in float32
    mean = sum(x) / n
    bodies = []
    for c in range(args.clients):
        body = {"x": {"shape": [n, 1], "dtype": "float32", "base64": b64(x)},
                "w_q": [[0.0] * heads], "w_k": [[1.0] * heads], "w_v": [[1.0] * heads],
                "b_v": [float(c)] * heads, "num_heads": heads, "output_encoding": "base64"}
        bodies.append(post("/v1/multihead", json.dumps(body).encode()))
    want = [mean + c for c in range(args.clients)]

    lat503, lat200, problems = [], [], []
    counts = {"200": 0, "503": 0, "other": 0}

    def check(c, status, headers, body, ms):
        if status == 503:
            counts["503"] += 1
            lat503.append(ms)
            if "retry-after" not in headers or error_code(body) != "overloaded":
                problems.append(f"client {c}: 503 without Retry-After or code overloaded")
        elif status == 200:
            counts["200"] += 1
            lat200.append(ms)
            out = json.loads(body)["output"]
            got = struct.unpack(f"<{n * heads}f", base64.b64decode(out["base64"]))
            bad = max(abs(g - want[c]) for g in got)
            if bad > 1e-4:
                problems.append(f"client {c}: output off by {bad:g} (another request's answer?)")
        else:
            counts["other"] += 1
            problems.append(f"client {c}: status {status} {body[:120]!r}")

    # One thread, non-blocking sockets: each request is sent whole (a few KB
    # fit the socket buffer) one after the other, then the answers are
    # collected. A request's time runs from its own send to the moment the
    # kernel received the last byte of its answer (SO_TIMESTAMPNS), so the
    # answers that arrive while later requests are still being sent, or
    # while this client waits for a core, are not charged the wait.
    for burst in range(args.bursts):
        socks = [connect(args.port) for _ in range(args.clients)]
        for s in socks:
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sel = selectors.DefaultSelector()
        start, bufs, arrived = {}, {}, {}
        for c, s in enumerate(socks):
            start[c] = time.time()  # the clock of the kernel's timestamps
            s.sendall(bodies[c])
            s.setblocking(False)
            bufs[c] = b""
            sel.register(s, selectors.EVENT_READ, c)
        deadline = time.monotonic() + 120
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=1):
                c = key.data
                try:
                    chunk, anc, _, _ = key.fileobj.recvmsg(1 << 20, TIMESTAMP_SPACE)
                except BlockingIOError:
                    continue
                except OSError as e:
                    chunk, anc = b"", []
                    problems.append(f"client {c}: {e!r}")
                bufs[c] += chunk
                arrived[c] = kernel_time(anc)
                done = parse_complete(bufs[c])
                if done or not chunk:
                    ms = (arrived[c] - start[c]) * 1e3
                    sel.unregister(key.fileobj)
                    if done:
                        check(c, *done, ms)
                    else:
                        counts["other"] += 1
                        problems.append(f"client {c}: connection closed without an answer")
        for key in list(sel.get_map().values()):
            counts["other"] += 1
            problems.append(f"client {key.data}: no answer within 120 s")
        for s in socks:
            s.close()
        time.sleep(0.2)

    print(f"requests: {args.bursts * args.clients} in {args.bursts} bursts of {args.clients}")
    print(f"answered_200: {counts['200']}")
    print(f"answered_503: {counts['503']}")
    print(f"other: {counts['other']}")
    print(f"p50_503_ms: {percentile(lat503, 50):.2f}")
    print(f"p99_503_ms: {percentile(lat503, 99):.2f}")
    print(f"max_503_ms: {max(lat503) if lat503 else float('nan'):.2f}")
    print(f"p50_200_ms: {percentile(lat200, 50):.1f}")
    for p in problems[:5]:
        print(f"problem: {p}")
    ok = (not problems and counts["503"] > 0 and counts["200"] > 0
          and percentile(lat503, 99) < args.bar_ms)
    reason = ("" if ok else problems[0] if problems else
              "no 503 (burst not beyond --queue?)" if not counts["503"] else
              "nothing accepted" if not counts["200"] else
              f"p99 {percentile(lat503, 99):.2f} ms >= {args.bar_ms} ms")
    print(f"result: {'PASS' if ok else 'FAIL'} {reason}")
    return 0 if ok else 1


# ------------------------------------------------------------- slow clients

TINY = b'{"q":[[1,0],[0,1]],"k":[[1,0],[0,1]],"v":[[1,2],[3,4]]}'
TINY_OUT = [1.6604769, 2.660477, 2.339523, 3.339523]


def slow(args):
    per_source = max(1, args.limit - 4)
    sources = [f"127.0.0.{2 + i // per_source}" for i in range(args.conns)]
    held = []
    for i, src in enumerate(sources):
        held.append((connect(args.port, src), i % 2 == 0))  # even: trickle
    trickle = b"GET /healthz HTTP/1.1\r\nHost: attnd\r\nX-Slow: "
    sent = [0] * len(held)
    stop = time.monotonic() + args.seconds
    lat, problems = [], []
    next_tick = 0.0
    while time.monotonic() < stop:
        now = time.monotonic()
        if now >= next_tick:  # a byte a second on every trickling connection
            for i, (s, trickling) in enumerate(held):
                if trickling:
                    byte = trickle[sent[i]:sent[i] + 1] if sent[i] < len(trickle) else b"a"
                    try:
                        s.send(byte, socket.MSG_DONTWAIT)
                    except OSError:
                        pass
                    sent[i] += 1
            next_tick = now + 1.0
        t0 = time.monotonic()
        try:
            s = connect(args.port, "127.0.0.1")
            s.sendall(post("/v1/attention", TINY))
            status, _, body = read_response(s, t0 + 5)
            s.close()
            dt = (time.monotonic() - t0) * 1e3
            lat.append(dt)
            out = [x for row in json.loads(body)["output"] for x in row] if status == 200 else None
            if status != 200 or any(abs(a - b) > 1e-6 for a, b in zip(out, TINY_OUT)):
                problems.append(f"normal request: status {status} {body[:100]!r}")
        except (OSError, ValueError) as e:
            problems.append(f"normal request: {e!r}")
        time.sleep(0.05)

    still_open = 0
    for s, _ in held:
        try:
            still_open += s.recv(1, socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            still_open += 1
        except OSError:
            pass

    # One address with LIMIT connections open: the next one gets the JSON 503.
    src = "127.0.0.250"
    mine = [connect(args.port, src) for _ in range(args.limit)]
    time.sleep(0.2)
    extra = connect(args.port, src)
    t0 = time.monotonic()
    limit_answer = "no answer"
    try:
        extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: attnd\r\n\r\n")
        status, headers, body = read_response(extra, t0 + 5)
        closed = extra.recv(1) == b""
        limit_answer = f"{status} {error_code(body)}"
        if status != 503 or error_code(body) != "too_many_connections" \
                or "retry-after" not in headers or not closed:
            problems.append(f"connection {args.limit + 1} from one address: {status} "
                            f"{body[:100]!r} closed={closed}")
    except (OSError, ValueError) as e:
        problems.append(f"connection {args.limit + 1} from one address: {e!r}")
    for s in mine + [extra] + [h for h, _ in held]:
        s.close()

    print(f"held: {args.conns} ({(args.conns + 1) // 2} trickling, {args.conns // 2} idle) "
          f"for {args.seconds} s, {still_open} still open at the end")
    print(f"normal_requests: {len(lat)}")
    print(f"p99_ms: {percentile(lat, 99):.2f}")
    print(f"max_ms: {max(lat) if lat else float('nan'):.2f}")
    print(f"limit_answer: {limit_answer}")
    for p in problems[:5]:
        print(f"problem: {p}")
    ok = not problems and lat and max(lat) < args.bar_ms
    reason = ("" if ok else problems[0] if problems else
              f"max {max(lat):.1f} ms >= {args.bar_ms} ms" if lat else "no normal request")
    print(f"result: {'PASS' if ok else 'FAIL'} {reason}")
    return 0 if ok else 1


# ---------------------------------------------------------------- slots

def closed_now(sock):
    """Whether the server closed (or reset) sock; never blocks."""
    try:
        return sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def slots(args):
    drip = b"GET /healthz HTTP/1.1\r\nHost: attnd\r\nX-Drip: " + b"a" * 4096
    held, opened_at, closed_at, problems = [], [], [], []
    t_start = time.monotonic()
    for i in range(args.addresses * args.per_address):
        src = f"127.0.0.{2 + i % args.addresses}"
        try:
            s = connect(args.port, src)
        except OSError as e:
            problems.append(f"connect from {src}: {e!r}")
            continue
        s.send(drip[:1], socket.MSG_DONTWAIT)
        held.append(s)
        opened_at.append(time.monotonic())
        closed_at.append(None)
    sent = [1] * len(held)
    lat, statuses = [], {}
    stop = max(opened_at or [time.monotonic()]) + args.header_timeout + 2
    next_tick = time.monotonic() + 1
    while time.monotonic() < stop:
        now = time.monotonic()
        for i, s in enumerate(held):
            if closed_at[i] is None and closed_now(s):
                closed_at[i] = now
        if now >= next_tick:  # a byte a second on each open one
            for i, s in enumerate(held):
                if closed_at[i] is None:
                    try:
                        s.send(drip[sent[i]:sent[i] + 1], socket.MSG_DONTWAIT)
                        sent[i] += 1
                    except OSError:
                        pass
            next_tick = now + 1.0
        t0 = time.monotonic()
        try:
            c = connect(args.port, "127.0.0.200")
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: attnd\r\nConnection: close\r\n\r\n")
            status, _, _ = read_response(c, t0 + 5)
            c.close()
        except (OSError, ValueError) as e:
            status = repr(e)[:40]
        lat.append((time.monotonic() - t0) * 1e3)
        statuses[status] = statuses.get(status, 0) + 1
        time.sleep(0.05)
    lived = [(c or stop) - o for o, c in zip(opened_at, closed_at)]
    early = sum(1 for x in lived if x < args.header_timeout - 0.5)
    still = sum(1 for c in closed_at if c is None)
    for s in held:
        s.close()
    # A closure is seen between two requests of the other address, so up to
    # one request late.
    bar_life = args.header_timeout + 2.0
    if still:
        problems.append(f"{still} trickling connections outlived --header-timeout")
    if any(x > bar_life for x in lived):
        problems.append(f"a trickling connection lived {max(lived):.1f} s")
    if set(statuses) != {200}:
        problems.append(f"another address got {statuses}")
    print(f"trickling: {len(held)} from {args.addresses} addresses "
          f"({args.per_address} each), set up in {time.monotonic() - t_start:.1f} s")
    print(f"closed_early: {early}")
    print(f"longest_life_s: {max(lived) if lived else float('nan'):.2f}")
    print(f"still_open: {still}")
    print(f"other_requests: {len(lat)} {statuses}")
    print(f"max_ms: {max(lat) if lat else float('nan'):.1f}")
    print(f"p99_ms: {percentile(lat, 99):.1f}")
    ok = not problems and lat and percentile(lat, 99) < args.bar_ms
    reason = ("" if ok else problems[0] if problems else
              f"p99 {percentile(lat, 99):.1f} ms >= {args.bar_ms} ms" if lat
              else "no other request")
    print(f"result: {'PASS' if ok else 'FAIL'} {reason}")
    return 0 if ok else 1


# ---------------------------------------------------------------- drain

def attention_body(n, d=64, heads=2):
    values = [random.uniform(-1, 1) for _ in range(heads * n * d)]
    t = {"shape": [heads, n, d], "dtype": "float32", "base64": b64(values)}
    return json.dumps({"q": t, "k": t, "v": t, "grad_output": t,
                       "output_encoding": "base64"}).encode()


def lasting(port, ms):
    """A request body whose computation lasts about ms on this server."""
    n = 256
    s = connect(port)
    s.sendall(post("/v1/attention", attention_body(n)))
    status, _, body = read_response(s, time.monotonic() + 30)
    s.close()
    took = json.loads(body)["meta"]["timing_ms"]["compute"] if status == 200 else 1.0
    scale = min(32.0, max(1.0, (ms / max(took, 0.01)) ** 0.5))
    return attention_body(int(n * scale))


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def drain(args):
    import os
    import signal
    work = lasting(args.port, 2000)
    heads = [
        b"POST /v1/attention HTTP/1.1\r\nHost: attnd\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{\"q\": [[1",
        b"POST /v1/attention HTTP/1.1\r\nHost: attnd\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"q\":\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: attnd\r\nX-Drip: a",
    ]
    trick = [connect(args.port) for _ in heads]
    for s, h in zip(trick, heads):
        s.sendall(h)
    comp = connect(args.port)
    comp.sendall(post("/v1/attention", work))
    time.sleep(1.0)  # a byte since, and the computation under way
    for s, b in zip(trick, [b"0", b"1\r\n \r\n", b"a"]):
        s.send(b)
    t0 = time.monotonic()
    os.kill(args.pid, signal.SIGTERM)
    dropped = [None, None]
    answer = None
    exited = None
    comp.setblocking(False)
    buf = b""
    while time.monotonic() - t0 < args.drain_timeout + 5 and exited is None:
        now = time.monotonic()
        for i in range(2):
            if dropped[i] is None and closed_now(trick[i]):
                dropped[i] = now - t0
        if answer is None:
            try:
                chunk = comp.recv(1 << 20)
                buf += chunk
                done = parse_complete(buf)
                if done or not chunk:
                    answer = (done[0] if done else "closed", now - t0)
            except BlockingIOError:
                pass
            except OSError as e:
                answer = (repr(e)[:40], now - t0)
        if not alive(args.pid):
            exited = now - t0
        time.sleep(0.01)
    for s in trick + [comp]:
        s.close()
    problems = []
    if any(x is None or x > 1.0 for x in dropped):
        problems.append(f"bodies still arriving dropped after {dropped} s")
    if not answer or answer[0] != 200:
        problems.append(f"the computation in flight: {answer}")
    if exited is None or exited > args.drain_timeout:
        problems.append(f"attnd exited after {exited} s")
    fmt = lambda x: "never" if x is None else f"{x * 1e3:.0f} ms"
    print(f"bodies_dropped: Content-Length {fmt(dropped[0])}, chunked {fmt(dropped[1])}")
    print(f"in_flight: {answer[0] if answer else 'no answer'} after "
          f"{fmt(answer[1] if answer else None)}")
    print(f"exit_after: {fmt(exited)}")
    ok = not problems
    print(f"result: {'PASS' if ok else 'FAIL'} {problems[0] if problems else ''}")
    return 0 if ok else 1


# ---------------------------------------------------------------- abandon

def metric(port, series):
    s = connect(port)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: attnd\r\nConnection: close\r\n\r\n")
    _, _, body = read_response(s, time.monotonic() + 5)
    s.close()
    for line in body.decode().splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def heavy_multihead(port, ms, n=2048):
    """A small body whose computation lasts about ms: heads of d_k = 1 over
    n rows; its answer, [n, heads], stays small beside --max-response."""
    def body(heads):
        x = [((i * 7) % 33 - 16) / 8 for i in range(n)]
        return json.dumps({"x": {"shape": [n, 1], "dtype": "float32", "base64": b64(x)},
                           "w_q": [[0.01] * heads], "w_k": [[1.0] * heads],
                           "w_v": [[1.0] * heads], "num_heads": heads,
                           "output_encoding": "base64"}).encode()
    s = connect(port)
    s.sendall(post("/v1/multihead", body(8)))
    status, _, answer = read_response(s, time.monotonic() + 30)
    s.close()
    took = json.loads(answer)["meta"]["timing_ms"]["compute"] if status == 200 else 1.0
    return post("/v1/multihead", body(int(min(1024, max(8, 8 * ms / max(took, 0.01))))))


def abandon(args):
    work = heavy_multihead(args.port, args.ms)
    series = 'attnd_requests_total{route="/v1/multihead",status="499"}'
    gone0 = metric(args.port, series)
    socks = []
    for i in range(args.requests):
        s = connect(args.port)
        s.sendall(work)
        socks.append(s)
        if i == 0:
            time.sleep(0.3)  # the first one computing
    time.sleep(0.3)
    for s in socks:
        s.close()
    t0 = time.monotonic()
    c = connect(args.port, "127.0.0.3")
    c.sendall(post("/v1/attention", TINY))
    status, _, _ = read_response(c, t0 + 60)
    c.close()
    small_ms = (time.monotonic() - t0) * 1e3
    gone = 0.0
    for _ in range(50):
        gone = metric(args.port, series)
        if gone - gone0 >= args.requests:
            break
        time.sleep(0.1)
    print(f"abandoned: {args.requests} of about {args.ms:.0f} ms each")
    print(f"small_request: {status} after {small_ms:.0f} ms")
    print(f"logged_499: {gone - gone0:.0f}")
    s = connect(args.port)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: attnd\r\nConnection: close\r\n\r\n")
    _, _, text = read_response(s, time.monotonic() + 5)
    s.close()
    print("multihead_statuses: " + ", ".join(
        line.split('status="')[1].replace('"} ', ": ") for line in text.decode().splitlines()
        if line.startswith('attnd_requests_total{route="/v1/multihead"')))
    ok = status == 200 and small_ms < args.bar_ms and gone - gone0 == args.requests
    print(f"result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("overload")
    o.add_argument("port", type=int)
    o.add_argument("--bursts", type=int, default=5)
    o.add_argument("--clients", type=int, default=40)
    o.add_argument("--n", type=int, default=1024)
    o.add_argument("--heads", type=int, default=8)
    # Under one accepted request's time (each computes for 35 ms or more):
    # a refusal does not wait behind a computation. On two cores
    # the client, the I/O thread and the computation share the cores, and
    # the scheduler alone moves a refusal by 5 to 11 ms.
    o.add_argument("--bar-ms", type=float, default=20.0)
    s = sub.add_parser("slow")
    s.add_argument("port", type=int)
    s.add_argument("--conns", type=int, default=500)
    s.add_argument("--seconds", type=float, default=10)
    s.add_argument("--limit", type=int, default=64)
    s.add_argument("--bar-ms", type=float, default=100.0)
    t = sub.add_parser("slots")
    t.add_argument("port", type=int)
    t.add_argument("--addresses", type=int, default=4)
    t.add_argument("--per-address", type=int, default=255)
    t.add_argument("--header-timeout", type=float, default=10)
    t.add_argument("--bar-ms", type=float, default=200.0)
    d = sub.add_parser("drain")
    d.add_argument("port", type=int)
    d.add_argument("--pid", type=int, required=True)
    d.add_argument("--drain-timeout", type=float, default=20)
    a = sub.add_parser("abandon")
    a.add_argument("port", type=int)
    a.add_argument("--requests", type=int, default=6)
    a.add_argument("--ms", type=float, default=1500)
    a.add_argument("--bar-ms", type=float, default=500.0)
    args = ap.parse_args()
    return {"overload": overload, "slow": slow, "slots": slots, "drain": drain,
            "abandon": abandon}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
