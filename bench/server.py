"""The server section of `make bench`: attention through a running attnd
against the same attention in-process, and the page faults a request costs.

    python3 bench/server.py URL PID KERNEL THREADS

URL is attnd's /v1/attention, PID its process, KERNEL bench/kernel.c's
binary (its `child` mode runs one libattn task on request and answers with
the mean seconds of a run: the in-process figure, with its buffers warm; it
runs in the scheduling class of attnd's compute workers).

Two shapes, each the q, k, v of one forward as base64 float32 with base64
answers:
  n4096   [1, 8, 4096, 64]   (B=1, H=8, n=4096, d=64)
  batch   [64, 8, 64, 64]    (B=64, H=8, n=64, d=64: short sequences)
Each round sends every shape to attnd and runs it in-process, one run each
in turn (the short batch three times), so that whatever else runs on the
machine disturbs both alike; a figure is the best single run of the rounds
on either side (the server's compute time is its own
meta.timing_ms.compute, which includes allocating the results). The minor page faults of attnd (field 10 of
/proc/PID/stat, its threads' faults summed) are read before and after
FAULT_REQUESTS more n4096 requests, after the rounds have warmed it up.

Prints "key value" lines for bench/run.sh.
"""
import base64
import http.client
import json
import os
import subprocess
import sys
import urllib.parse

import numpy as np

ROUNDS = 3
FAULT_REQUESTS = 4
SHAPES = {"n4096": (1, 8, 4096, 64), "batch": (64, 8, 64, 64)}
# Turns of each shape in a round: the short batch's run is a few
# milliseconds, which a neighbour's time slice can double.
TURNS = {"n4096": 1, "batch": 3}


def body(shape, rng):
    def tensor():
        x = rng.standard_normal(shape).astype("<f4")
        return {"shape": list(shape), "dtype": "float32",
                "base64": base64.b64encode(x.tobytes()).decode("ascii")}
    return json.dumps({"q": tensor(), "k": tensor(), "v": tensor(),
                       "output_encoding": "base64"}).encode()


def minflt(pid):
    with open(f"/proc/{pid}/stat") as f:
        # the command may hold spaces: the fields follow its closing ')'
        return int(f.read().rsplit(")", 1)[1].split()[7])


class Server:
    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        self.host, self.port, self.path = u.hostname, u.port, u.path
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=300)

    def compute_ms(self, data):
        self.conn.request("POST", self.path, data, {"Content-Type": "application/json"})
        r = self.conn.getresponse()
        text = r.read()
        if r.status != 200:
            raise RuntimeError(f"attnd answered {r.status}: {text[:200]!r}")
        return json.loads(text)["meta"]["timing_ms"]["compute"]


# attnd computes on workers that yield to its I/O threads: SCHED_BATCH at
# nice +10 (server/compute.c). The in-process side runs in the same class,
# so that what else runs on the machine slows both alike: on a quiet machine
# the class changes nothing, on a busy one a nice +10 thread gets a fraction
# of a core that a nice 0 one would not share.
WORKER_NICE = 10


def worker_class():
    os.nice(WORKER_NICE)
    if hasattr(os, "sched_setscheduler"):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


class InProcess:
    def __init__(self, kernel):
        self.p = subprocess.Popen([kernel, "child"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True,
                                  preexec_fn=worker_class)
        if not self.p.stdout.readline().startswith("ready"):
            raise RuntimeError("the kernel child did not start")

    def ms(self, threads, shape, reps):
        b, h, n, d = shape
        self.p.stdin.write(f"{reps} sdpa full {threads} {b} {h} {n} {d}\n")
        self.p.stdin.flush()
        reply = self.p.stdout.readline().split()
        if len(reply) != 2 or reply[0] != "ok":
            raise RuntimeError(f"the kernel child answered {reply}")
        return float(reply[1]) * 1e3

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def main():
    url, pid, kernel, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    rng = np.random.default_rng(21)
    bodies = {k: body(s, rng) for k, s in SHAPES.items()}
    server, local = Server(url), InProcess(kernel)
    best = {}

    def keep(key, ms):
        best[key] = min(best.get(key, ms), ms)

    # A warm-up of each: the first request maps the server's buffers, the
    # first run the child's.
    for k, s in SHAPES.items():
        server.compute_ms(bodies[k])
        local.ms(threads, s, 1)
    for _ in range(ROUNDS):
        for k, s in SHAPES.items():
            for _ in range(TURNS[k]):
                keep(f"{k}_inproc_ms", local.ms(threads, s, 1))
                keep(f"{k}_server_ms", server.compute_ms(bodies[k]))
    local.close()
    before = minflt(pid)
    for _ in range(FAULT_REQUESTS):
        server.compute_ms(bodies["n4096"])
    after = minflt(pid)
    for k, s in SHAPES.items():
        b, h, n, d = s
        flop = 4.0 * b * h * n * n * d
        i, v = best[f"{k}_inproc_ms"], best[f"{k}_server_ms"]
        print(f"{k}_inproc_gflops {flop / i / 1e6:.1f}")
        print(f"{k}_server_gflops {flop / v / 1e6:.1f}")
        print(f"{k}_inproc_ms {i:.3f}")
        print(f"{k}_server_ms {v:.3f}")
        print(f"{k}_ratio {i / v:.3f}")
    print(f"faults_per_request {(after - before) / FAULT_REQUESTS:.0f}")
    print(f"faults_requests {FAULT_REQUESTS}")


if __name__ == "__main__":
    main()
