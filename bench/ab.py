#!/usr/bin/env python3
"""Two or more builds of bench/kernel.c taking turns on one task.

    python3 bench/ab.py ROUNDS REPS "TASK" KERNEL_A KERNEL_B ...

Each KERNEL is a `kernel` binary (bench/kernel.c compiled against one
libattn.a) started as `KERNEL child` (OPENBLAS_NUM_THREADS=1), its buffers
made once. After one warm-up run each, every round runs the task REPS times
on each build, in turn (the order reversed every other round), and prints
each build's best, first quartile and median time of a call (the mean of
its REPS). On a machine whose load moves, builds that take turns are slowed
alike; compare their best or first-quartile times, not single runs.
"""
import os
import statistics
import subprocess
import sys


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    rounds, reps, task, kernels = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    children = [subprocess.Popen([k, "child"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env=env) for k in kernels]

    def run(child, n):
        child.stdin.write("%d %s\n" % (n, task))
        child.stdin.flush()
        answer = child.stdout.readline().split()
        if len(answer) != 2 or answer[0] != "ok":
            sys.exit("%s: %s" % (task, " ".join(answer) or "no answer"))
        return float(answer[1]) * 1e3

    for child in children:
        child.stdout.readline()  # ready ...
        run(child, reps)
    times = [[] for _ in kernels]
    for r in range(rounds):
        order = range(len(kernels)) if r % 2 == 0 else reversed(range(len(kernels)))
        for i in order:
            times[i].append(run(children[i], reps))
    for kernel, t in zip(kernels, times):
        t.sort()
        print("%-30s best %.4f  q1 %.4f  median %.4f ms" %
              (kernel, t[0], t[len(t) // 4], statistics.median(t)))
    for child in children:
        child.stdin.close()
        child.wait()


if __name__ == "__main__":
    main()
