#!/bin/sh
# The page's files and the clients of examples/ against a live attnd
# (ATTND_BIN): GET / and its files as embedded, the chapter by curl
# (examples/chapter.sh) with its numbers checked, the Python client
# (tests/clients_check.py) and the JavaScript one (tests/node/client.test.mjs);
# each example takes the server's URL from its argument or ATTND_URL, and
# says in one line (exit status 1) when the server is not there or answers
# an error.
set -u
bin=${ATTND_BIN:-build/attnd}
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
tmp=$(mktemp -d)
fail=0
pass=0
ok() { echo "ok     $1"; pass=$((pass + 1)); }
bad() { echo "FAILED $1"; fail=$((fail + 1)); }
expect() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }

"$bin" --bind 127.0.0.1 --port 0 2>"$tmp/log" &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do
    port=$(sed -n 's/.*listening on [^ ]*:\([0-9][0-9]*\).*/\1/p' "$tmp/log" | head -1)
    [ -n "$port" ] && break
    sleep 0.05
done
[ -n "$port" ] || { cat "$tmp/log"; echo "FAILED attnd did not start"; exit 1; }
url=http://127.0.0.1:$port

# A port where nothing listens: bound by the system, then let go.
closed=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
    node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })')
nowhere=http://127.0.0.1:$closed
# The API's own words for a wrong path under the server's URL.
notfound=$(curl -s "$url/nope/v1/info" | sed -n 's/.*"message":"\([^"]*\)".*/\1/p')

# An example ($2...) run against a server that is not there, then against a
# path that answers 404: one line each, naming the URL (and the API's
# message), and a non-zero exit.
one_line_failures() {
    name=$1
    shift
    "$@" "$nowhere" >"$tmp/down" 2>&1
    rc=$?
    expect "$name: a server that is not there is one line, exit $rc" \
        '[ $rc != 0 ] && [ $(wc -l <"$tmp/down") = 1 ] && grep -q "^cannot reach $nowhere: is attnd running? (" "$tmp/down"'
    [ $rc != 0 ] && [ "$(wc -l <"$tmp/down")" = 1 ] || cat "$tmp/down"
    "$@" "$url/nope" >"$tmp/http" 2>&1
    rc=$?
    expect "$name: an HTTP error is the server's message in one line, exit $rc" \
        '[ $rc != 0 ] && [ -n "$notfound" ] && [ "$(cat "$tmp/http")" = "$url/nope answered 404 not_found: $notfound" ]'
    [ $rc != 0 ] && [ "$(wc -l <"$tmp/http")" = 1 ] || cat "$tmp/http"
}

# The page.
curl -s -D "$tmp/h" -o "$tmp/index.html" "$url/"
expect "GET / is the page, text/html" 'grep -qi "^content-type: text/html" "$tmp/h" && cmp -s "$tmp/index.html" "$root/server/web/index.html"'
expect "GET / has a Content-Security-Policy" 'grep -qi "^content-security-policy: default-src .none.; script-src .self.;" "$tmp/h"'
for f in app.js attnd.js style.css; do
    expect "GET /$f is server/web/$f" 'curl -sf "$url/$f" -o "$tmp/$f" && cmp -s "$tmp/$f" "$root/server/web/$f"'
done
expect "HEAD / answers without a body" '[ "$(curl -sI "$url/" | head -1 | tr -d "\r")" = "HTTP/1.1 200 OK" ] && [ -z "$(curl -s -X HEAD --max-time 2 "$url/" 2>/dev/null)" ]'
expect "POST / is a 405 naming GET" 'curl -s -X POST "$url/" -d x | grep -q "accepts only GET, HEAD, OPTIONS"'

# The chapter, by curl.
if command -v jq >/dev/null && command -v python3 >/dev/null; then
    sh "$root/examples/chapter.sh" "$url" >"$tmp/chapter" 2>&1
    out() { grep -A1 "^\\$ .*$1" "$tmp/chapter" | sed -n 2p; } # the answer to a command
    exercise2='
import json, math, sys
q, k, v = [[3, 1], [-2, 4], [0, 0]], [[1, 0], [0, 1], [1, 1]], [1, 5, 9]
got = [row[0] for row in json.load(sys.stdin)]
for qi, o in zip(q, got):
    s = [sum(a * b for a, b in zip(qi, kj)) / math.sqrt(2) for kj in k]
    w = [math.exp(x - max(s)) for x in s]
    want = sum(wj * vj for wj, vj in zip(w, v)) / sum(w)
    assert 1 < o < 9 and abs(o - want) < 1e-5 * want, (o, want)
assert len(got) == 3'
    expect "chapter: Worked Example 1 weights 0.67/0.33" 'grep -qx "{\"weights\":\[\[0.66976154,0.33023846\],\[0.33023846,0.66976154\]\],\"output\":\[\[1.6604769,2.660477\],\[2.339523,3.339523\]\]}" "$tmp/chapter"'
    expect "chapter: Exercise 5 causal upper triangle 0" 'grep -qx "\[\[1,0,0\],\[0.01798621,0.98201376,0\],\[0.15536241,0.42231882,0.42231882\]\]" "$tmp/chapter"'
    expect "chapter: Exercise 6 saturates unscaled, 0.7773 scaled" 'grep -qx "\[\[0.9999546,4.539787e-05\]\]" "$tmp/chapter" && grep -qx "\[\[0.7772999,0.22270015\]\]" "$tmp/chapter"'
    # Each output a convex combination of v = 1, 5, 9, and the one computed
    # here in double precision.
    expect "chapter: Exercise 2 outputs inside [1, 9], as computed here" 'out "\"q\": \[\[3,1\]" | python3 -c "$exercise2"'
    expect "chapter: Theorem 1 Var(S)/d_k and Var(S~) near 1" 'grep "^{.*var_scaled" "$tmp/chapter" | jq -e "(.var_scores / .d_k) > 0.85 and (.var_scores / .d_k) < 1.15 and .var_scaled > 0.85 and .var_scaled < 1.15" | grep -c true | grep -qx 3'
    expect "chapter: Corollary 1 max weight up, entropy down" 'grep "^{.*max_weight" "$tmp/chapter" | jq -s -e ".[0].max_weight < .[1].max_weight and .[1].max_weight < .[2].max_weight and .[2].max_weight > 0.9 and .[2].entropy < 0.3" >/dev/null'
    expect "chapter: every command shown names the URL it used" \
        '[ $(grep -c "^\\$ " "$tmp/chapter") -ge 10 ] && ! grep "^\\$ " "$tmp/chapter" | grep -v -q -F "$url/v1/attention" && ! grep -q localhost "$tmp/chapter"'
    ATTND_URL=$url sh "$root/examples/chapter.sh" >"$tmp/chapter-env" 2>&1
    expect "chapter: the URL from ATTND_URL" '[ "$(grep -c "^\\$ .*$url/v1/attention" "$tmp/chapter-env")" = "$(grep -c "^\\$ " "$tmp/chapter")" ]'
    sh "$root/examples/chapter.sh" "$nowhere" >"$tmp/chapter-down" 2>&1
    rc=$?
    expect "chapter: a server that is not there is one line, exit $rc" '[ $rc != 0 ] && [ "$(cat "$tmp/chapter-down")" = "cannot reach $nowhere: is attnd running?" ]'
else
    echo "SKIPPED examples/chapter.sh: needs jq and python3 (tools/deps.sh test installs them)"
fi

# The Python client (standard library + NumPy; Debian's python3 has numpy).
py=""
for p in /usr/bin/python3 python3; do
    "$p" -c 'import numpy' 2>/dev/null && { py=$p; break; }
done
if [ -n "$py" ]; then
    if "$py" "$here/clients_check.py" "$url" >"$tmp/py" 2>&1; then ok "Python client (tests/clients_check.py)"; else cat "$tmp/py"; bad "Python client"; fi
    expect "examples/attnd_client.py runs" '"$py" "$root/examples/attnd_client.py" "$url" >"$tmp/pyex" 2>&1 && grep -q "^error: 422 shape_mismatch" "$tmp/pyex"'
    expect "examples/attnd_client.py: the URL from ATTND_URL" 'ATTND_URL=$url "$py" "$root/examples/attnd_client.py" >"$tmp/pyenv" 2>&1 && grep -q "^server: " "$tmp/pyenv" && grep -q "^error: 422 shape_mismatch" "$tmp/pyenv"'
    expect "examples/attnd_client.py: the argument before ATTND_URL" 'ATTND_URL=$nowhere "$py" "$root/examples/attnd_client.py" "$url" 2>&1 | grep -q "^error: 422 shape_mismatch"'
    one_line_failures examples/attnd_client.py "$py" "$root/examples/attnd_client.py"
    # The keys of one context split across two attnd processes,
    # merged exactly with return_lse (the script checks the merge itself
    # against one request and a float64 reference, and exits 1 otherwise).
    "$bin" --bind 127.0.0.1 --port 0 2>"$tmp/log2" &
    pid2=$!
    port2=""
    for _ in $(seq 100); do
        port2=$(sed -n 's/.*listening on [^ ]*:\([0-9][0-9]*\).*/\1/p' "$tmp/log2" | head -1)
        [ -n "$port2" ] && break
        sleep 0.05
    done
    if [ -n "$port2" ] && "$py" "$root/examples/merge_shards.py" "$url" "http://127.0.0.1:$port2" >"$tmp/merge" 2>&1 &&
        grep -q "on 2 server(s)" "$tmp/merge" && grep -q "^merge exact to float32 rounding" "$tmp/merge"; then
        ok "examples/merge_shards.py: two attnd, merged exactly"
    else
        cat "$tmp/merge" "$tmp/log2" 2>/dev/null
        bad "examples/merge_shards.py across two attnd"
    fi
    kill -TERM $pid2
    wait $pid2
    expect "second attnd drains and exits 0" '[ $? = 0 ]'
else
    echo "SKIPPED Python client: no python3 with numpy (tools/deps.sh test installs python3-numpy)"
fi

# The JavaScript client, the page's own module, from Node.js.
if command -v node >/dev/null; then
    if ATTND_BIN="$bin" node --test "$here/node/client.test.mjs" >"$tmp/js" 2>&1; then ok "JavaScript client (tests/node/client.test.mjs)"; else cat "$tmp/js"; bad "JavaScript client"; fi
    expect "examples/client.mjs runs" 'node "$root/examples/client.mjs" "$url" >"$tmp/jsex" 2>&1 && grep -q "^error: 422 shape_mismatch" "$tmp/jsex"'
    expect "examples/client.mjs: the URL from ATTND_URL" 'ATTND_URL=$url node "$root/examples/client.mjs" >"$tmp/jsenv" 2>&1 && grep -q "^server: " "$tmp/jsenv" && grep -q "^error: 422 shape_mismatch" "$tmp/jsenv"'
    expect "examples/client.mjs: the argument before ATTND_URL" 'ATTND_URL=$nowhere node "$root/examples/client.mjs" "$url" 2>&1 | grep -q "^error: 422 shape_mismatch"'
    one_line_failures examples/client.mjs node "$root/examples/client.mjs"
else
    echo "SKIPPED JavaScript client: no node (tools/deps.sh test installs nodejs)"
fi

kill -TERM $pid
wait $pid
expect "attnd drains and exits 0" '[ $? = 0 ]'
echo "$pass passed, $fail failed"
[ $fail = 0 ]
