#!/bin/sh
# The documents against the server they describe (ATTND_BIN): every command
# of a console block in README.md and docs/*.md replayed against a live attnd
# must print what the document shows, timings and the like aside
# (tools/docs-outputs.py --check says what is masked); every flag that
# `attnd --help` lists must be described in docs/configuration.md; and every
# relative link of the documents must name a file.
# After a change that changes an output: python3 tools/docs-outputs.py --update
set -u
bin=${ATTND_BIN:-build/attnd}
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
fail=0
pass=0
ok() { echo "ok     $1"; pass=$((pass + 1)); }
bad() { echo "FAILED $1"; fail=$((fail + 1)); }

for tool in curl jq python3; do
    command -v $tool >/dev/null || { echo "FAILED $tool is missing (tools/deps.sh test installs it)"; exit 1; }
done

if python3 "$root/tools/docs-outputs.py" --check --bin "$bin"; then
    ok "every command of README.md and docs/*.md prints what the document shows"
else
    bad "a document shows an output that attnd no longer prints (python3 tools/docs-outputs.py --update rewrites them)"
fi

flags=$("$bin" --help | grep -oE -- '--[a-z][a-z-]+' | sort -u)
missing=""
for f in $flags; do
    grep -q -- "\`$f" "$root/docs/configuration.md" || missing="$missing $f"
done
if [ -n "$flags" ] && [ -z "$missing" ]; then
    ok "docs/configuration.md describes every flag of attnd --help ($(echo $flags | wc -w))"
else
    bad "docs/configuration.md does not describe:${missing:- (attnd --help listed no flag)}"
fi

# Every relative link of the documents names a file of the repository.
broken=$(python3 - "$root" <<'PY'
import glob, os, re, sys
root = sys.argv[1]
for doc in [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md"))):
    text = re.sub(r"```.*?```", "", open(doc, encoding="utf-8").read(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        path = target.split("#")[0]
        if not path or re.match(r"[a-z]+:", path):
            continue
        if not os.path.exists(os.path.join(os.path.dirname(doc), path)):
            print(f"{os.path.relpath(doc, root)}: {target}")
PY
)
if [ -z "$broken" ]; then
    ok "every relative link of README.md and docs/*.md names a file"
else
    echo "$broken"
    bad "links to files that do not exist"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
