#!/usr/bin/env python3
"""Replays the commands that README.md and docs/*.md show, against a live attnd.

    python3 tools/docs-outputs.py --check  [--bin build/attnd] [FILE.md ...]
    python3 tools/docs-outputs.py --update [--bin build/attnd] [FILE.md ...]
    python3 tools/docs-outputs.py --update --screenshots     (also docs/page*.png)

What it replays: every fenced block whose info string is `console`. In such a
block a line starting with "$ " is a command (a line ending in a backslash
continues it on the next line), and the lines after it, up to the next "$ "
line or the end of the block, are what it prints (stdout and stderr, as a
terminal shows them). Blocks of any other kind (```sh, ```json) are shown,
never run: use them for commands that change the machine or take minutes.

How: for each file, a fresh attnd is started on a free port (--port 0), and a
second one when the file's commands name port 8081, so that what a file
prints depends on that file alone. The commands are written as a reader types
them, against localhost:8080 (and :8081); they run in bash from the
repository's root with the port numbers replaced by the live ones and the
directory of --bin first in PATH (so `attnd --help` is the binary under test).
In what they print the live ports are replaced by 8080 and 8081 again.

--check compares each printed output with the live one after masking what
legitimately differs between runs and machines (MASKS below: timings,
versions, the CPU's kernels and core counts, timestamps, request ids) and
prints a diff for each command whose output differs; exit status 1 then.
--update writes the live outputs into the files, keeping the printed text of
any output that equals the live one after masking (so a rerun changes only
what changed). --screenshots also runs the page test in Chromium (make
web-test), which takes the page's screenshots, and copies into docs/ those
that the documents show (docs/page*.png).

attnd and the commands run without the caller's ATTND_* variables, so that
what they print is what the defaults give.
"""
import argparse
import difflib
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT, PORT2 = "8080", "8081"
COMMAND_SECONDS = 120

# What may differ between two honest runs, each replaced by a placeholder
# before outputs are compared. Numbers computed from the request are never
# masked: they are what the documents promise.
MASKS = [
    # How long a step took: the answer's meta.timing_ms (JSON, or a Python
    # dict as the client prints it) and Server-Timing.
    (r"""(["']?(?:decode|queue|compute|encode|total)["']?\s*:\s*)-?[0-9][0-9.eE+-]*""", r"\1<ms>"),
    (r"(;dur=)[0-9.]+", r"\1<ms>"),
    # Durations printed by clients and tools ("258.5 ms", "in 1.2 s").
    (r"(?<![\w.])[0-9]+(?:\.[0-9]+)? ?(ms|s)\b", r"<t> \1"),
    # Versions (attnd's, libattn's, OpenBLAS's).
    (r"(?<![\w.])[0-9]+\.[0-9]+\.[0-9]+(?![\w.])", "<version>"),
    # The kernels this CPU runs: libattn's and OpenBLAS's, by name.
    (r'("kernel":\s*")[^"]*', r"\1<kernel>"),
    (r"(kernel )(?:generic|avx2|avx512)\b", r"\1<kernel>"),
    # How it runs bfloat16 products (with vdpbf16ps, or emulated).
    (r'("bf16":\s*")[^"]*', r"\1<bf16>"),
    (r"(bf16 )(?:avx512_bf16|emulated)\b", r"\1<bf16>"),
    (r'("(?:config|corename)":\s*")[^"]*', r"\1<blas>"),
    (r"(OpenBLAS <version>) [A-Z0-9_ =]+", r"\1 <blas>"),
    # What follows from the number of cores.
    (r'("(?:threads|io_threads)":\s*)[0-9]+', r"\1<cores>"),
    (r"(default )[0-9]+( here\])", r"\1<cores>\2"),
    (r"((?:threads|io-threads) )[0-9]+", r"\1<cores>"),
    # Rounding errors that a client measures itself (examples/merge_shards.py
    # prints them and fails on its own when one exceeds 1e-5): their size
    # depends on the order in which each kernel adds.
    (r"(difference\| = )[0-9.e+-]+", r"\1<rounding>"),
    # examples/decode.py's error of the logits against float64 (it fails on
    # its own past its printed bound).
    (r"(of the logits against float64: )[0-9.e+-]+", r"\1<rounding>"),
    # Moments and per-request identifiers.
    (r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z", "<time>"),
    (r"(?i)(x-request-id:\s*)\S+", r"\1<id>"),
    (r'("request_id":\s*")[^"]*', r"\1<id>"),
    (r"(?im)^(date:\s*).*$", r"\1<date>"),
]

# libattn's generic kernel (plain C, for CPUs without AVX2) takes libm's expf
# where the SIMD kernels take their own exponential (within 2 ulp of it), so
# under it the last digits of a result may differ from what the documents
# print: there numbers are compared to a relative 1e-5 instead of exactly.
NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")


def mask(text):
    for pattern, replacement in MASKS:
        text = re.sub(pattern, replacement, text)
    return text


def same(printed, live, approximate):
    """Whether two outputs agree once masked (numbers to 1e-5 when approximate)."""
    a, b = mask(printed), mask(live)
    if a == b or not approximate:
        return a == b
    if NUMBER.split(a) != NUMBER.split(b):
        return False
    x, y = NUMBER.findall(a), NUMBER.findall(b)
    return len(x) == len(y) and all(
        abs(float(u) - float(v)) <= 1e-5 * max(abs(float(u)), abs(float(v))) + 1e-6 for u, v in zip(x, y))


def clean_env():
    """The environment without ATTND_* (flags, the clients' ATTND_URL)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ATTND_")}


def python_with_numpy(tmp):
    """A directory to put first in PATH so that `python3` has NumPy (the
    examples need it), or None when the first python3 has it already."""
    first = shutil.which("python3")
    for candidate in [first, "/usr/bin/python3", sys.executable]:
        if candidate and subprocess.call([candidate, "-c", "import numpy"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0:
            if candidate == first:
                return None
            d = os.path.join(tmp, "python")
            os.makedirs(d, exist_ok=True)
            os.symlink(candidate, os.path.join(d, "python3"))
            return d
    return None


class Command:
    """One "$ " command of a console block: where it is and what it printed."""

    def __init__(self, path, first, last, text, printed):
        self.path = path
        self.first, self.last = first, last  # line indexes of the output (last exclusive)
        self.text = text                     # the command as shown, continuations joined
        self.printed = printed               # list of lines

    def where(self):
        return f"{os.path.relpath(self.path, ROOT)}:{self.first}"


def commands_of(path):
    """The commands of every console block of a markdown file, in order."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```console":
            i += 1
            continue
        i += 1
        current = None
        while i < len(lines) and lines[i].strip() != "```":
            line = lines[i]
            if line.startswith("$ "):
                text = line[2:]
                while text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text + "\n" + lines[i]
                if current:
                    found.append(current)
                current = Command(path, i + 1, i + 1, text, [])
            elif current is None:
                raise SystemExit(f"{path}:{i + 1}: a console block must start with a \"$ \" command")
            else:
                current.printed.append(line)
                current.last = i + 1
            i += 1
        if i >= len(lines):
            raise SystemExit(f"{path}: a console block is not closed")
        if current:
            found.append(current)
        i += 1
    return found


class Attnd:
    """attnd on a free port, its log in a temporary file."""

    def __init__(self, binary, log_dir, name):
        self.log = os.path.join(log_dir, name + ".log")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", "0"],
                                         stdout=log, stderr=subprocess.STDOUT, env=clean_env())
        self.port = None
        deadline = time.monotonic() + 30
        while self.port is None:
            m = re.search(r"listening on [^ ]*:([0-9]+)", open(self.log).read())
            if m:
                self.port = m.group(1)
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit("attnd did not start:\n" + open(self.log).read())
            else:
                time.sleep(0.02)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def live_ports(text, ports):
    for shown, live in ports.items():
        text = re.sub(r"(localhost|127\.0\.0\.1):" + shown + r"\b", r"\g<1>:" + live, text)
    return text


def shown_ports(text, ports):
    for shown, live in ports.items():
        text = re.sub(r"(localhost|127\.0\.0\.1|\[::1\]):" + live + r"\b", r"\g<1>:" + shown, text)
    return text


def run_file(path, binary, tmp, path_dirs):
    """Runs the commands of one file; returns (command, live output lines) pairs."""
    commands = commands_of(path)
    if not commands:
        return []
    servers = [Attnd(binary, tmp, "attnd")]
    try:
        if any(re.search(r":" + PORT2 + r"\b", c.text) for c in commands):
            servers.append(Attnd(binary, tmp, "attnd2"))
        ports = {PORT: servers[0].port}
        if len(servers) > 1:
            ports[PORT2] = servers[1].port
        env = clean_env()
        env["PATH"] = os.pathsep.join(path_dirs + [env.get("PATH", "")])
        results = []
        for c in commands:
            # A session of its own, so that a command that hangs is ended
            # with everything it started.
            p = subprocess.Popen(["bash", "-o", "pipefail", "-c", live_ports(c.text, ports)],
                                 cwd=ROOT, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            try:
                out = p.communicate(timeout=COMMAND_SECONDS)[0].decode("utf-8", "replace")
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
                out = f"(no answer within {COMMAND_SECONDS} seconds)\n"
            lines = shown_ports(out, ports).split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            results.append((c, lines))
        return results
    finally:
        for s in servers:
            s.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="fail when a printed output differs")
    mode.add_argument("--update", action="store_true", help="write the live outputs into the files")
    ap.add_argument("--bin", default=os.environ.get("ATTND_BIN", os.path.join(ROOT, "build/attnd")))
    ap.add_argument("--screenshots", action="store_true",
                    help="also regenerate docs/page*.png (ATTND_SHOT_DIR=docs make web-test)")
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    files = args.files or [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    binary = os.path.abspath(args.bin)
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"no attnd at {binary} (make build/attnd, or --bin PATH)")

    version = subprocess.run([binary, "--version"], stdout=subprocess.PIPE).stdout.decode()
    approximate = "kernel generic," in version
    tmp = tempfile.mkdtemp(prefix="attnd-docs-")
    path_dirs = [os.path.dirname(binary)]
    if any("python3" in c.text for path in files for c in commands_of(path)):
        python_dir = python_with_numpy(tmp)
        if python_dir:
            path_dirs.append(python_dir)
    differ = replayed = 0
    try:
        for path in files:
            path = os.path.abspath(path)
            results = run_file(path, binary, tmp, path_dirs)
            replayed += len(results)
            changed = []
            for c, live in results:
                if same("\n".join(c.printed), "\n".join(live), approximate and not args.update):
                    continue
                differ += 1
                if args.update:
                    changed.append((c, live))
                    print(f"updated {c.where()}: $ {c.text.splitlines()[0][:100]}")
                else:
                    print(f"DIFFERS {c.where()}: $ {c.text.splitlines()[0][:100]}")
                    sys.stdout.writelines(difflib.unified_diff(
                        [mask(x) + "\n" for x in c.printed], [mask(x) + "\n" for x in live],
                        "printed (masked)", "live (masked)", n=1))
            if changed:
                lines = open(path, encoding="utf-8").read().split("\n")
                for c, live in sorted(changed, key=lambda x: -x[0].first):
                    lines[c.first:c.last] = live
                with open(path, "w", encoding="utf-8") as f:
                    f.write("\n".join(lines))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    verb = "updated" if args.update else "differ"
    print(f"{replayed} commands replayed from {len(files)} file(s); {differ} output(s) {verb}")
    if args.screenshots:
        rc = screenshots(binary, [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))))
        if rc:
            return rc
    return 1 if differ and args.check else 0


def screenshots(binary, files):
    """Runs the page test in Chromium (make web-test), which takes the
    screenshots, and copies into docs/ those that the documents show."""
    shots = tempfile.mkdtemp(prefix="attnd-shots-")
    try:
        env = dict(os.environ, ATTND_SHOT_DIR=shots)
        build = os.path.relpath(os.path.dirname(binary), ROOT)
        rc = subprocess.call(["make", "--no-print-directory", "web-test", "BUILD=" + build],
                             cwd=ROOT, env=env)
        if rc:
            print("make web-test failed: no screenshot copied")
            return rc
        shown = "".join(open(f, encoding="utf-8").read() for f in files)
        copied = 0
        for name in sorted(os.listdir(shots)):
            if name.endswith(".png") and re.search(r"\(((?:docs/)?)" + re.escape(name) + r"\)", shown):
                shutil.copyfile(os.path.join(shots, name), os.path.join(ROOT, "docs", name))
                print(f"screenshot docs/{name}")
                copied += 1
        if not copied:
            print(f"make web-test wrote no screenshot that the documents show (in {shots})")
            return 1
        return 0
    finally:
        shutil.rmtree(shots, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
