"""The JSON form of the contract against PyYAML's reading of the YAML.

    openapi_check.py api/openapi.yaml build/openapi.json build/yaml2json

1. build/openapi.json holds exactly what yaml.safe_load reads in
   api/openapi.yaml: the same keys in the same order, the same types (an
   integer stays an integer, 1.0 stays a float, True is not 1), the same
   strings and numbers; and every "$ref" in it points at something.
2. The converter, given YAML that uses each construct it takes (block
   scalars with every chomping, folded text with blank and more-indented
   lines, flow collections, quoting, multi-line plain text, comments), writes
   what PyYAML reads; given what it must refuse (text that YAML 1.1 and 1.2
   read differently, anchors, tabs, duplicate keys, ...), it fails, naming
   the file and line.
"""
import json
import os
import subprocess
import sys
import tempfile

import yaml

failures = 0


def report(ok, what):
    global failures
    print(("ok     " if ok else "FAILED ") + what)
    if not ok:
        failures += 1


def difference(a, b, path="$"):
    """Where a and b differ (types strictly), or None."""
    if type(a) is not type(b):
        return "%s: %s %r against %s %r" % (path, type(a).__name__, a, type(b).__name__, b)
    if isinstance(a, dict):
        if list(a) != list(b):
            return "%s: keys %s against %s" % (path, list(a), list(b))
        for k in a:
            d = difference(a[k], b[k], path + "/" + k)
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return "%s: %d items against %d" % (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            d = difference(x, y, "%s/%d" % (path, i))
            if d:
                return d
        return None
    if a == b:
        return None
    if isinstance(a, str):
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return "%s: from character %d, %r against %r" % (path, i, a[i:i + 60], b[i:i + 60])
    return "%s: %r against %r" % (path, a, b)


def refs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v
            else:
                yield from refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from refs(v)


def resolve(doc, ref):
    if not ref.startswith("#/"):
        return False
    node = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def check_contract(yaml_path, json_path):
    with open(yaml_path, encoding="utf-8") as f:
        want = yaml.safe_load(f)
    with open(json_path, encoding="utf-8") as f:
        got = json.load(f)
    d = difference(want, got)
    report(d is None, "openapi.json is what PyYAML reads in openapi.yaml" + (": " + d if d else ""))
    broken = [r for r in refs(got) if not resolve(got, r)]
    report(not broken, "every $ref of the contract resolves" + (": " + ", ".join(broken) if broken else ""))


ACCEPTED = {
    "block scalars, every chomping": (
        "a: |\n  one\n  two\n\n\nb: |-\n  one\n\n  two\n\n"
        "c: |+\n  kept\n\n\nd: >\n  folded\n  text\n\n  after blank\n    more indented\n  back\n"
        "e: >-\n  x\n  y\nf: >+\n  z\n\n"
        "g: |\n\n  starts blank\n"
    ),
    "flow collections and quoting": (
        "s: [1, -2, 0.5, 1.0e-3, -0.0, \"q\\\"x\", 'it''s', null, true, false, ~]\n"
        "m: {a: 1, 'b c': [x, y z], \"d\": {}}\n"
        "e: []\nu: \"\\u00e9\\t\\n\\\\\"\n"
    ),
    "plain text over lines, comments, odd keys": (
        "# a comment\n"
        "key: some text # a comment\n"
        "long: first line\n  second line\n\n  after a blank\n"
        "$ref: '#/x'\n'200': ok\n/v1/path: {get: x}\n"
        "url: http://127.0.0.1:8080/x?a=b#frag\n"
        "version: 1.0.0\nnumber: 62416\nn_q: 3\n"
    ),
    "sequences of mappings, nested": (
        "list:\n  - name: a\n    value: 1\n  - name: b\n    more:\n      - x\n      - - u\n        - w\n"
        "same_indent:\n- 1\n- {k: v}\n- [1, 2]\n- |\n  text\n-\n  nested: true\n"
    ),
}

REFUSED = {
    "yes as a bare word": "a: yes\n",
    "bare n as a key": "n: 1\n",
    "an exponent without a point": "a: 1e3\n",
    "an exponent without a sign": "a: 1.0e3\n",
    "a leading zero": "a: 012\n",
    "hexadecimal": "a: 0x1F\n",
    "underscores in a number": "a: 1_000\n",
    "sexagesimal": "a: 1:30\n",
    "a date": "a: 2024-01-02\n",
    "infinity": "a: .inf\n",
    "a plus sign": "a: +1\n",
    "an anchor": "a: &x 1\nb: *x\n",
    "a tag": "a: !!str 1\n",
    "a tab in the indentation": "a:\n\tb: 1\n",
    "a duplicate key": "a: 1\na: 2\n",
    "a number as a key": "200: ok\n",
    "two documents": "a: 1\n---\nb: 2\n",
    "a colon in plain text": "a: b: c\n",
    "a quoted string over lines": "a: 'one\n  two'\n",
}


def run(tool, text):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
        name = f.name
    try:
        r = subprocess.run([tool, name], capture_output=True, text=True)
        return r, name
    finally:
        os.unlink(name)


def check_converter(tool):
    for what, text in ACCEPTED.items():
        r, name = run(tool, text)
        if r.returncode != 0:
            report(False, "yaml2json takes %s: %s" % (what, r.stderr.strip()))
            continue
        d = difference(yaml.safe_load(text), json.loads(r.stdout))
        report(d is None, "yaml2json takes %s as PyYAML reads them" % what + (": " + d if d else ""))
    for what, text in REFUSED.items():
        r, name = run(tool, text)
        named = r.stderr.startswith(name + ":")
        report(r.returncode == 1 and named and r.stdout == "",
               "yaml2json refuses %s, naming the place (%s)" % (what, r.stderr.strip() or "no message"))


def main():
    yaml_path, json_path, tool = sys.argv[1:4]
    check_contract(yaml_path, json_path)
    check_converter(tool)
    print("%s: %d failure(s)" % (os.path.basename(__file__), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
