#!/bin/sh
# The documents against the server they describe (ATTND_BIN): every command
# of a console block in README.md and docs/*.md replayed against a live attnd
# must print what the document shows, timings and the like aside
# (tools/docs-outputs.py --check says what is masked); and every flag that
# `attnd --help` lists must be described in docs/configuration.md.
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

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
