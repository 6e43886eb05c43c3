#!/bin/sh
# Makes sure the Debian packages that a make target needs are installed.
#   tools/deps.sh build|test|bench|fuzz|reliability
# As root it installs what is missing with apt-get; otherwise it prints the
# one command that would, and fails. It waits for another apt-get holding
# the lock (a second make target installing at the same time) for 5 min.
set -u
need="libmicrohttpd-dev libopenblas-dev pkg-config"
# jansson: the tests' (and the codec benchmark's) reference JSON parser;
# attnd itself does not use it.
case "${1:-build}" in
    build) ;;
    test)  need="$need libjansson-dev check libcurl4-openssl-dev nginx curl openssl python3-torch python3-numpy python3-yaml jq nodejs systemd wrk" ;;
    bench) need="$need libjansson-dev wrk nginx curl python3-fastapi python3-uvicorn python3-numpy" ;;
    fuzz)  need="$need libjansson-dev check libcurl4-openssl-dev clang libfuzzer-14-dev libclang-rt-14-dev" ;;
    reliability) need="$need libjansson-dev check libcurl4-openssl-dev clang libfuzzer-14-dev libclang-rt-14-dev wrk nginx curl valgrind python3" ;;
    *) echo "usage: tools/deps.sh build|test|bench|fuzz|reliability" >&2; exit 2 ;;
esac
missing=""
for p in $need; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    echo "installing Debian packages:$missing"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq -o DPkg::Lock::Timeout=300 && apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends $missing; } >/tmp/attnd-apt.log 2>&1 \
        || { tail -20 /tmp/attnd-apt.log; echo "apt-get failed (log: /tmp/attnd-apt.log)" >&2; exit 1; }
else
    echo "missing Debian packages:$missing" >&2
    echo "install them with:  sudo apt-get install -y$missing" >&2
    exit 1
fi
