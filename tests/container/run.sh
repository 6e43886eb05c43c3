#!/bin/sh
# make container-test: docker/Dockerfile and docker/compose.yaml, run for real
# with Debian's podman and runc (no Docker engine needed):
#   1. the image builds (--format docker, so HEALTHCHECK is kept), runs with a
#      read-only root filesystem, answers, runs as a non-root user, its
#      healthcheck says healthy, and `podman stop` lets a request in flight
#      finish and exits 0;
#   2. `podman kube play` runs the pod of docker/k8s/deployment.yaml (renamed,
#      its image this test's, its port published): its probes pass, it
#      answers through the published port, runs as the manifest's user with
#      the threads of its CPU limit; stopped as the kubelet stops it (SIGTERM
#      with the grace period, the pod's network still up), a request in
#      flight gets its answer while attnd drains, and `podman kube down`
#      takes the pod away;
#   3. podman-compose runs 3 replicas behind nginx (an nginx image built from
#      the same Debian base where nginx:stable cannot be pulled): requests
#      reach all three, and stopping one under load fails no request; KV
#      caches created through nginx are decoded on the replica that holds
#      them, and when one replica stops mid-decode its caches answer 404
#      cache_not_found within a second while the others go on decoding.
# Base images come from a debootstrap of bookworm when no registry can give
# them. Where podman cannot run, prints one SKIPPED line and exits 0.
set -u
cd "$(dirname "$0")/../.."
root=$(pwd)
RUN="--runtime runc --ulimit nofile=1024:1024 --ulimit nproc=1024:1024"
tag=localhost/attnd:container-test
tmp=$(mktemp -d)
pass=0
fail=0
ok() { echo "ok     $1"; pass=$((pass + 1)); }
bad() { echo "FAILED $1"; fail=$((fail + 1)); }
skip() { echo "SKIPPED make container-test: $1"; exit 0; }
step() { echo "-- $1"; }

# ------------------------------------------------------------ tools
# catatonit: the pause process of a pod (podman kube play), only recommended
# by podman, so --no-install-recommends leaves it out.
need="podman runc catatonit podman-compose debootstrap golang-github-containernetworking-plugin-dnsname curl jq python3-yaml"
missing=""
for p in $need; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    [ "$(id -u)" = 0 ] || skip "needs root to install$missing (sudo apt-get install -y$missing)"
    echo "installing Debian packages:$missing"
    apt-get update -qq -o DPkg::Lock::Timeout=300 >"$tmp/apt.log" 2>&1 || skip "apt-get update failed: Debian's archive is out of reach"
    # The archive answers: a package it cannot install is a failure, not a skip.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends $missing \
        >>"$tmp/apt.log" 2>&1 || { tail -5 "$tmp/apt.log"; echo "FAILED apt-get install$missing"; exit 1; }
fi
[ "$(id -u)" = 0 ] || skip "rootless podman is not set up here; run as root"
podman run $RUN --rm --network none docker.io/library/debian:bookworm true >/dev/null 2>&1 || {
    if ! podman image exists docker.io/library/debian:bookworm; then
        step "importing debian:bookworm from debootstrap --variant=minbase (no registry is reachable)"
        mkdir -p "$tmp/rootfs"
        debootstrap --variant=minbase bookworm "$tmp/rootfs" http://deb.debian.org/debian >"$tmp/debootstrap.log" 2>&1 \
            || { tail -5 "$tmp/debootstrap.log"; skip "debootstrap failed"; }
        tar -C "$tmp/rootfs" -c . | podman import - docker.io/library/debian:bookworm >/dev/null || skip "podman import failed"
        rm -rf "$tmp/rootfs"
    fi
    podman tag docker.io/library/debian:bookworm docker.io/library/debian:bookworm-slim
    podman run $RUN --rm --network none docker.io/library/debian:bookworm true >"$tmp/run.log" 2>&1 \
        || skip "podman cannot run a container here: $(tail -1 "$tmp/run.log")"
}
podman image exists docker.io/library/debian:bookworm-slim || podman tag docker.io/library/debian:bookworm docker.io/library/debian:bookworm-slim

# What podman kube play has no flags for: the runtime and the limits.
cat >"$tmp/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
EOF

cleanup() {
    podman rm -f -t 0 attnd-ct >/dev/null 2>&1
    [ -f "$tmp/deployment.yaml" ] && CONTAINERS_CONF="$tmp/containers.conf" podman kube down "$tmp/deployment.yaml" >/dev/null 2>&1
    [ -f "$tmp/compose.yaml" ] && (cd "$tmp" && podman-compose -p attnd-ct -f compose.yaml down -t 1 >/dev/null 2>&1)
    rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
body='{"q": [[1,0],[0,1]], "k": [[1,0],[0,1]], "v": [[1,2],[3,4]], "return_weights": true}'
want='[[0.66976154,0.33023846],[0.33023846,0.66976154]]'

# ------------------------------------------------------------ the image
step "podman build --format docker -f docker/Dockerfile"
if podman build $RUN --network host --format docker -f docker/Dockerfile -t $tag . >"$tmp/build.log" 2>&1; then
    ok "the image builds"
else
    tail -20 "$tmp/build.log"; bad "the image builds"; echo "$pass passed, $fail failed"; exit 1
fi

port=$(free_port)
podman run $RUN -d --name attnd-ct --read-only -p 127.0.0.1:$port:8080 $tag >/dev/null 2>"$tmp/run.err" \
    || { cat "$tmp/run.err"; bad "the container starts"; }
for _ in $(seq 50); do curl -sf "127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.2; done
got=$(curl -s "127.0.0.1:$port/v1/attention" -d "$body" | jq -c .weights)
[ "$got" = "$want" ] && ok "it answers Worked Example 1 through the published port (read-only root)" || bad "answer: $got"
[ "$(podman exec attnd-ct id -u)" = 10001 ] && ok "attnd runs as uid 10001, not root" || bad "non-root: $(podman exec attnd-ct id)"
[ "$(podman top attnd-ct user | tail -1 | tr -d ' ')" = attnd ] && ok "podman top: user attnd" || bad "podman top user"
hc=$(podman healthcheck run attnd-ct 2>&1)
[ $? = 0 ] && ok "podman healthcheck run: healthy ${hc}" || bad "healthcheck: $hc"
[ "$(podman inspect -f '{{.Config.Healthcheck.Test}}' attnd-ct | grep -c healthz)" = 1 ] && ok "the HEALTHCHECK of the Dockerfile is kept (docker format)" || bad "HEALTHCHECK kept"

# A request of about a second in flight when podman stop sends SIGTERM.
big=$(python3 - <<'PY'
import json
n, d = 2048, 64
print(json.dumps({"q": {"shape": [8, n, d], "data": [0.01] * (8 * n * d)},
                  "k": {"shape": [8, n, d], "data": [0.01] * (8 * n * d)},
                  "v": {"shape": [8, n, d], "data": [1.0] * (8 * n * d)},
                  "grad_output": {"shape": [8, n, d], "data": [1.0] * (8 * n * d)},
                  "output_encoding": "base64"}))
PY
)
echo "$big" >"$tmp/big.json"
curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$port/v1/attention" -d @"$tmp/big.json" >"$tmp/inflight" &
cpid=$!
sleep 0.7
podman stop -t 60 attnd-ct >/dev/null 2>>"$tmp/podman.err"
wait $cpid
code=$(podman inspect -f '{{.State.ExitCode}}' attnd-ct)
[ "$(cat "$tmp/inflight")" = 200 ] && ok "the request in flight during podman stop got 200" || bad "in flight: $(cat "$tmp/inflight")"
[ "$code" = 0 ] && ok "podman stop: attnd drained and exited 0" || bad "exit code $code"
podman logs attnd-ct 2>&1 | tail -3 | sed 's/^/       log: /'
podman rm -f attnd-ct >/dev/null 2>>"$tmp/podman.err"

# ------------------------------------------------------------ podman kube play
step "podman kube play docker/k8s/deployment.yaml"
kport=$(free_port)
# The manifest as it is, but for the pod's name (not to meet another one),
# the image of this test, a host port for the container port and one
# replica (podman kube play starts every replica, and a host port can be
# published by one pod only).
python3 - "$tag" "$kport" docker/k8s/deployment.yaml >"$tmp/deployment.yaml" <<'PY' || bad "docker/k8s/deployment.yaml: one Deployment with an http port"
import sys, yaml
tag, port = sys.argv[1], int(sys.argv[2])
docs = [d for d in yaml.safe_load_all(open(sys.argv[3])) if d]
assert [d["kind"] for d in docs] == ["Deployment"], docs
d = docs[0]
d["metadata"]["name"] = "attnd-ct"
d["spec"]["replicas"] = 1
c = d["spec"]["template"]["spec"]["containers"][0]
c["image"] = tag
http = next(p for p in c["ports"] if p["name"] == "http")
http.update(hostIP="127.0.0.1", hostPort=port)
yaml.safe_dump(d, sys.stdout, sort_keys=False)
PY
kpod=attnd-ct-pod-0
kctr=$kpod-attnd
if CONTAINERS_CONF="$tmp/containers.conf" podman kube play "$tmp/deployment.yaml" >"$tmp/play.log" 2>&1; then
    ok "podman kube play starts the Deployment's pod"
else
    tail -10 "$tmp/play.log"; bad "podman kube play"
fi
probe() { # the path of one of the manifest's probes
    python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["spec"]["template"]["spec"]["containers"][0][sys.argv[2]]["httpGet"]["path"])' "$tmp/deployment.yaml" "$1"
}
ready=$(probe readinessProbe)
live=$(probe livenessProbe)
for _ in $(seq 50); do curl -sf "127.0.0.1:$kport$ready" >/dev/null && break; sleep 0.2; done
code=$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$kport$ready")
[ "$code" = 200 ] && ok "the readiness probe ($ready) answers 200 through the published port" || bad "readiness probe $ready: $code"
# podman runs the liveness probe as the container's health check.
hctest=$(podman inspect -f '{{.Config.Healthcheck.Test}}' "$kctr" 2>&1)
case "$hctest" in
    *"$live"*) ok "the liveness probe ($live) is the pod's health check" ;;
    *) bad "liveness probe as health check: $hctest" ;;
esac
hc=$(podman healthcheck run "$kctr" 2>&1)
[ $? = 0 ] && ok "podman healthcheck run: the liveness probe passes" || bad "liveness probe: $hc"
got=$(curl -s "127.0.0.1:$kport/v1/attention" -d "$body" | jq -c .weights)
[ "$got" = "$want" ] && ok "the pod answers Worked Example 1 through the published port" || bad "pod answer: $got"
[ "$(podman exec "$kctr" id -u)" = 10001 ] && ok "the pod runs attnd as uid 10001 (runAsUser)" || bad "pod user: $(podman exec "$kctr" id)"
[ "$(podman inspect -f '{{.HostConfig.ReadonlyRootfs}}' "$kctr")" = true ] && ok "the pod's root filesystem is read-only" || bad "the pod's root filesystem is writable"
threads=$(podman exec "$kctr" printenv ATTND_THREADS)
[ "$threads" = 2 ] && ok "ATTND_THREADS follows the CPU limit (2)" || bad "ATTND_THREADS: $threads"
# A pod goes as the kubelet takes it down: SIGTERM to attnd with the
# manifest's grace period while the pod's network stays up (podman's infra
# container, the kubelet's sandbox), then the pod is removed. podman kube
# down alone does neither here (podman 4.3 stops the infra container at once
# and gives attnd no grace period: the request in flight is cut).
grace=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])' "$tmp/deployment.yaml")
python3 - "$kport" "$tmp/big.json" "$tmp/sent" >"$tmp/kinflight" 2>&1 <<'PY' &
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=300)
c.request("POST", "/v1/attention", open(sys.argv[2], "rb").read(), {"Content-Type": "application/json"})
open(sys.argv[3], "w").close()  # the whole body is sent: the request is in flight
r = c.getresponse()
r.read()
print(r.status)
PY
cpid=$!
for _ in $(seq 600); do [ -f "$tmp/sent" ] && break; sleep 0.1; done
podman stop -t "$grace" "$kctr" >/dev/null 2>>"$tmp/podman.err"
wait $cpid
[ "$(tail -1 "$tmp/kinflight")" = 200 ] && ok "the request in flight when the pod was stopped got 200" || bad "in flight at the pod's stop: $(tail -1 "$tmp/kinflight")"
code=$(podman inspect -f '{{.State.ExitCode}}' "$kctr")
podman logs "$kctr" >"$tmp/kube.log" 2>&1
if [ "$code" = 0 ] && grep -q 'draining 1 in-flight' "$tmp/kube.log" && grep -q 'stopped' "$tmp/kube.log"; then
    ok "SIGTERM with the grace period ($grace s): attnd drained its request and exited 0"
else
    tail -3 "$tmp/kube.log" | sed 's/^/       log: /'; bad "drain of the pod: exit code $code"
fi
CONTAINERS_CONF="$tmp/containers.conf" podman kube down "$tmp/deployment.yaml" >"$tmp/down.log" 2>&1 \
    && ok "podman kube down takes the pod down" || { grep -v 'level=' "$tmp/down.log" | tail -5; bad "podman kube down"; }
if podman pod exists "$kpod" 2>/dev/null; then bad "the pod is left after podman kube down"; else ok "no pod is left"; fi
rm -f "$tmp/deployment.yaml"

# ------------------------------------------------------------ compose
step "podman-compose: 3 replicas behind nginx"
if ! podman image exists docker.io/library/nginx:stable || [ "$(podman inspect -f '{{index .Config.Labels "attnd.nginx"}}' docker.io/library/nginx:stable 2>/dev/null)" = yes ]; then
    podman build $RUN --network host --label attnd.nginx=yes -f docker/nginx.Dockerfile -t docker.io/library/nginx:stable docker >"$tmp/nginx.log" 2>&1 \
        && ok "nginx image built from debian:bookworm-slim (tagged nginx:stable)" || { tail -5 "$tmp/nginx.log"; bad "nginx image"; }
fi
lbport=$(free_port)
# The compose file as it is, with the build context made absolute, the image
# of this test, the host port free, and podman's runtime limits.
sed -e "s|context: \.\.|context: $root|" -e "s|dockerfile: docker/Dockerfile|dockerfile: $root/docker/Dockerfile|" \
    -e "s|image: attnd:latest|image: $tag|" -e "s|\"8080:8080\"|\"127.0.0.1:$lbport:8080\"|" \
    -e "s|\./nginx.conf|$root/docker/nginx.conf|" docker/compose.yaml >"$tmp/compose.yaml"
grep -q "127.0.0.1:$lbport:8080" "$tmp/compose.yaml" || bad "compose.yaml publishes the balancer as \"8080:8080\""
(cd "$tmp" && podman-compose -p attnd-ct --podman-run-args="$RUN" -f compose.yaml up -d --no-build >"$tmp/up.log" 2>&1) \
    || { tail -20 "$tmp/up.log"; bad "podman-compose up"; }
n=$(podman ps --filter label=com.docker.compose.project=attnd-ct --filter label=attnd.replica=yes -q | wc -l)
[ "$n" = 3 ] && ok "3 attnd replicas running" || bad "$n attnd replicas running"
for _ in $(seq 100); do curl -sf "127.0.0.1:$lbport/healthz" >/dev/null && break; sleep 0.2; done

# Which replica answered: each one's access log counts its requests.
count() { podman logs "$1" 2>&1 | grep -c '/v1/attention'; }
replicas=$(podman ps --filter label=com.docker.compose.project=attnd-ct --filter label=attnd.replica=yes --format '{{.Names}}' | sort)
before=""; for r in $replicas; do before="$before $(count "$r")"; done
okc=0
for _ in $(seq 60); do
    got=$(curl -s "127.0.0.1:$lbport/v1/attention" -d "$body" | jq -c .weights)
    [ "$got" = "$want" ] && okc=$((okc + 1))
done
[ $okc = 60 ] && ok "60 requests through nginx, all right" || bad "$okc of 60 requests right"
sleep 1
spread=0
i=1
for r in $replicas; do
    b=$(echo $before | cut -d' ' -f$i)
    a=$(count "$r")
    echo "       $r answered $((a - b))"
    [ $((a - b)) -gt 0 ] && spread=$((spread + 1))
    i=$((i + 1))
done
[ $spread = 3 ] && ok "requests spread over all 3 replicas" || bad "only $spread replicas answered"

# KV caches through nginx: 24 caches, two decoding steps each (one position
# appended, one query over the cache), every step on the replica that holds
# the cache (else 404), the cache's length as many as the steps.
step_body='{"k": [[1, 0]], "v": [[1, 2]], "q": [[0, 1]]}'
: >"$tmp/caches"
for _ in $(seq 24); do
    curl -s -D - -o /dev/null "127.0.0.1:$lbport/v1/caches" -d '{"num_kv_heads": 1, "head_dim": 2}' \
        | tr -d '\r' | sed -n 's|^[Ll]ocation: ||p' >>"$tmp/caches"
done
[ "$(grep -c '^/v1/caches/[0-9a-f]\{32\}$' "$tmp/caches")" = 24 ] \
    && ok "24 caches created through nginx, each named by its balancer key" || bad "cache creation: $(head -3 "$tmp/caches")"
decoded=0
for s in 1 2; do
    while read -r loc; do
        len=$(curl -s "127.0.0.1:$lbport$loc/attention" -d "$step_body" | jq -r '.cache.length')
        [ "$len" = "$s" ] && decoded=$((decoded + 1))
    done <"$tmp/caches"
done
[ $decoded = 48 ] && ok "48 decoding steps through nginx, each on its cache's replica" || bad "$decoded of 48 decoding steps"

# Under load (4 clients, one request after another each), stop one
# replica: no request may fail. The clients go on until the stop has
# returned and then send 20 requests more each, so that the load outlasts
# the stop however long the stop takes (a bound of 3000 requests each
# keeps a stop that never returns from looping for ever).
victim=$(echo "$replicas" | head -1)
held=$(podman logs "$victim" 2>&1 | grep -c '"path":"/v1/caches","status":201')
# Decoding goes on during the stop: every answer is the step (200), the
# victim draining (503 shutting_down) or its caches gone (404), never a
# balancer's error.
(
    for _ in 1 2 3; do
        while read -r loc; do
            curl -s -o /dev/null -w '%{http_code}\n' "127.0.0.1:$lbport$loc/attention" -d '{"q": [[0, 1]]}'
        done <"$tmp/caches"
    done
) >"$tmp/decode-load" &
dpid=$!
: >"$tmp/load"
lpids=""
for c in 1 2 3 4; do
    (
        i=0
        more=20
        while [ $more -gt 0 ] && [ $i -lt 3000 ]; do
            curl -s -o /dev/null -w '%{http_code}\n' "127.0.0.1:$lbport/v1/attention" -d "$body"
            i=$((i + 1))
            [ -f "$tmp/stopped" ] && more=$((more - 1))
        done
    ) >>"$tmp/load" &
    lpids="$lpids $!"
done
sleep 1
podman stop -t 30 "$victim" >/dev/null 2>>"$tmp/podman.err"
running=0
for p in $lpids; do kill -0 "$p" 2>/dev/null && running=$((running + 1)); done
after=$(wc -l <"$tmp/load")
touch "$tmp/stopped"
wait $lpids $dpid
total=$(wc -l <"$tmp/load")
good=$(grep -c '^200$' "$tmp/load")
echo "       during the stop of $victim: $good of $total requests 200 ($(sort "$tmp/load" | uniq -c | tr '\n' ' ')), $((total - after)) of them after it returned"
[ "$running" = 4 ] && [ "$((total - after))" -ge 80 ] && ok "the load ran on through the stop (4 clients)" || bad "the load ended before the stop ($running clients running)"
[ "$total" -gt 80 ] && [ "$good" = "$total" ] && ok "one replica stopped under load: no failed request" || bad "failed requests during the stop"
[ "$(podman inspect -f '{{.State.ExitCode}}' "$victim")" = 0 ] && ok "the stopped replica exited 0" || bad "the stopped replica's exit code"

others=$(grep -vc '^\(200\|404\|503\)$' "$tmp/decode-load")
echo "       decoding during the stop: $(sort "$tmp/decode-load" | uniq -c | tr '\n' ' ')"
[ "$others" = 0 ] && ok "decoding during the stop: only 200, 503 shutting_down or 404" || bad "decoding during the stop: $others answers other than 200, 503, 404"
# With the victim gone: its caches are 404 cache_not_found within a second,
# every other cache takes its next step (length 3).
lost=0; kept=0; slow=0
while read -r loc; do
    out=$(curl -s -w '\n%{http_code} %{time_total}' "127.0.0.1:$lbport$loc/attention" -d "$step_body")
    code=$(echo "$out" | tail -1 | cut -d' ' -f1)
    secs=$(echo "$out" | tail -1 | cut -d' ' -f2)
    python3 -c "import sys; sys.exit(0 if float('$secs') < 1 else 1)" || { slow=$((slow + 1)); echo "       slow: $loc $code in $secs s"; }
    if [ "$code" = 404 ] && [ "$(echo "$out" | head -1 | jq -r .error.code)" = cache_not_found ]; then
        lost=$((lost + 1))
    elif [ "$code" = 200 ] && [ "$(echo "$out" | head -1 | jq -r .cache.length)" = 3 ]; then
        kept=$((kept + 1))
    fi
done <"$tmp/caches"
echo "       $victim held $held caches: $lost answered 404, $kept decoded on"
[ "$held" -gt 0 ] && [ "$lost" = "$held" ] && [ $((lost + kept)) = 24 ] && [ $slow = 0 ] \
    && ok "the stopped replica's caches answer 404 cache_not_found within 1 s, the others decode on" \
    || bad "after the stop: $lost of $held caches 404, $kept of $((24 - held)) decoded, $slow slower than 1 s"

echo "$pass passed, $fail failed"
[ $fail = 0 ]
