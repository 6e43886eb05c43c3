#!/bin/sh
# The Open Inference Protocol (/v2) against a live attnd (ATTND_BIN):
# tests/oip_client.py, a client written from the protocol's text, runs the
# chapter's examples, grouped-query multi-head attention with gradients,
# float16 and bfloat16 binary tensors and the variants, each checked
# against /v1's answer bit for bit; then every /v2 answer it saw is
# validated against the protocol's own OpenAPI description
# (tests/node/oip_validate.mjs, an OpenAPI response validator from npm).
set -u
bin=${ATTND_BIN:-build/attnd}
build=$(dirname "$bin")
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
# The protocol's OpenAPI file is test data kept beside the project, not in
# it: ATTND_OIP_DIR names its directory, else ../shared/testdata/ of the
# checkout or of the directory holding its worktree.
oip=${ATTND_OIP_DIR:-}
for d in "$root/../shared" "$root/../../shared"; do
    [ -z "$oip" ] && [ -f "$d/testdata/open-inference-protocol/open_inference_rest.yaml" ] &&
        oip="$d/testdata/open-inference-protocol"
done
tmp=$(mktemp -d)
fail=0
pass=0
ok() { echo "ok     $1"; pass=$((pass + 1)); }
bad() { echo "FAILED $1"; fail=$((fail + 1)); }

"$bin" --bind 127.0.0.1 --port 0 2>"$tmp/log" &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
port=""
for _ in $(seq 100); do
    port=$(sed -n 's/.*listening on [^ ]*:\([0-9][0-9]*\).*/\1/p' "$tmp/log" | head -1)
    [ -n "$port" ] && break
    sleep 0.05
done
[ -n "$port" ] || { cat "$tmp/log"; echo "FAILED attnd did not start"; exit 1; }

if python3 "$here/oip_client.py" "http://127.0.0.1:$port" "$tmp/exchanges.jsonl" >"$tmp/client" 2>&1; then
    ok "a client written from the protocol gets /v1's answers, bit for bit ($(grep -c '^ok' "$tmp/client") checks)"
else
    grep -v '^ok' "$tmp/client"
    bad "tests/oip_client.py"
fi

if [ ! -f "$oip/open_inference_rest.yaml" ]; then
    echo "SKIPPED the OpenAPI validation of the /v2 answers: open_inference_rest.yaml is not in ../shared/testdata/open-inference-protocol/ (set ATTND_OIP_DIR)"
else
    out=$(cd "$root" && sh tools/node-deps.sh "$build")
    case $? in
        0)  if ATTND_NODE_DIR="$build/node" node "$here/node/oip_validate.mjs" \
                "$oip/open_inference_rest.yaml" "$tmp/exchanges.jsonl" >"$tmp/validate" 2>&1; then
                ok "$(tail -1 "$tmp/validate")"
            else
                cat "$tmp/validate"
                bad "the /v2 answers against open_inference_rest.yaml"
            fi ;;
        3)  echo "SKIPPED the OpenAPI validation of the /v2 answers: $(echo "$out" | tail -1)" ;;
        *)  echo "$out"; bad "tools/node-deps.sh" ;;
    esac
fi

kill -TERM $pid
wait $pid
[ $? = 0 ] && ok "attnd drains and exits 0" || bad "attnd drains and exits 0"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
