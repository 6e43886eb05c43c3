#!/bin/sh
# The chapter, by curl: its worked examples, exercises and theorems, each one
# request to a running attnd, printed as "$ command" and the answer (the
# same requests are in docs/chapter.md, with their answers).
#   sh examples/chapter.sh [URL]   (default $ATTND_URL, then http://127.0.0.1:8080)
# Each command is printed with the URL it uses. Needs curl and jq; Theorem 1
# uses python3 (standard library) for its inputs.
set -eu
URL=${1:-${ATTND_URL:-http://127.0.0.1:8080}}
here=$(dirname "$0")
if ! curl -s -o /dev/null --max-time 10 "$URL/healthz"; then
    echo "cannot reach $URL: is attnd running?" >&2
    exit 1
fi
# The URL as sed's replacement text: \, & and the delimiter | escaped.
url_text=$(printf '%s' "$URL" | sed 's/[\\&|]/\\&/g')
run() {
    printf '$ %s\n' "$(printf '%s' "$1" | sed "s|\$URL|$url_text|g; s|\$here|examples|g")"
    eval "$1"
}

echo "# Worked Example 1: Q = K = I, V = [[1, 2], [3, 4]]: weights 0.67 / 0.33"
run 'curl -s $URL/v1/attention -d '"'"'{"q": [[1,0],[0,1]], "k": [[1,0],[0,1]], "v": [[1,2],[3,4]], "return_weights": true}'"'"' | jq -c "{weights, output}"'

echo "# Worked Example 2: three tokens, Q = K = V = X, d_k = 4 (scale 1/2)"
run 'curl -s $URL/v1/attention -d '"'"'{"q": [[1,0,1,0],[0,2,0,2],[1,1,1,1]], "k": [[1,0,1,0],[0,2,0,2],[1,1,1,1]], "v": [[1,0,1,0],[0,2,0,2],[1,1,1,1]], "return_weights": true}'"'"' | jq -c "{weights, output}"'

echo "# Exercise 2: each output lies inside the convex hull of the values (here v = 1, 5, 9: outputs between 1 and 9)"
run 'curl -s $URL/v1/attention -d '"'"'{"q": [[3,1],[-2,4],[0,0]], "k": [[1,0],[0,1],[1,1]], "v": [[1],[5],[9]]}'"'"' | jq -c .output'

echo "# Exercise 5: the causal mask of Example 2: token i sees tokens j <= i, the upper triangle is 0"
run 'curl -s $URL/v1/attention -d '"'"'{"q": [[1,0,1,0],[0,2,0,2],[1,1,1,1]], "k": [[1,0,1,0],[0,2,0,2],[1,1,1,1]], "v": [[1,0,1,0],[0,2,0,2],[1,1,1,1]], "causal": true, "return_weights": true}'"'"' | jq -c .weights'

echo "# Exercise 6: q.k1 = 10, q.k2 = 0, d_k = 64: unscaled (scale 1) the softmax saturates; scaled by 1/8 it does not"
run 'jq -nc "{q: [[1] + [range(63) | 0]], k: [[10] + [range(63) | 0], [range(64) | 0]], v: [[1], [0]], scale: 1, return_weights: true}" | curl -s $URL/v1/attention -d @- | jq -c .weights'
run 'jq -nc "{q: [[1] + [range(63) | 0]], k: [[10] + [range(63) | 0], [range(64) | 0]], v: [[1], [0]], return_weights: true}" | curl -s $URL/v1/attention -d @- | jq -c .weights'

echo "# Theorem 1: with N(0,1) entries Var(q.k) = d_k and Var(q.k/sqrt(d_k)) = 1 (256 queries x 256 keys)"
for dk in 4 64 1024; do
    run 'python3 $here/normal_qk.py 256 '$dk' | curl -s $URL/v1/attention -d @- | jq -c "{d_k: .meta.shape.d_k, var_scores: .stats.scores.var, var_scaled: .stats.scaled_scores.var}"'
done

echo "# Corollary 1: with scale 1 the largest weight goes to 1 and the entropy to 0 as d_k grows"
for dk in 4 64 1024; do
    run 'python3 $here/normal_qk.py 256 '$dk' 0 '"'"'{"scale": 1}'"'"' | curl -s $URL/v1/attention -d @- | jq -c "{d_k: .meta.shape.d_k, max_weight: .stats.max_weight.mean, entropy: .stats.entropy.mean}"'
done
