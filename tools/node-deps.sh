#!/bin/sh
# The tools of the Node.js tests (make web-test, make ops-test):
#   tools/node-deps.sh BUILD [debian-package ...]
# Debian's nodejs and npm (any Node.js >= 18 already installed will do) and
# the Debian packages named, installed with apt-get as root; then the npm
# packages of tests/node/package.json at the exact versions of its lock file,
# into BUILD/node (npm ci; nothing is installed globally or committed).
# Exits 3 with one line saying why when this machine cannot have them (not
# root, or Debian's archive or the npm registry out of reach), so that the
# make target can print that it skipped; exits 1 when it could have them and
# the install failed (a package renamed, a lock file out of date): that is a
# failure, not a skip.
set -u
build=${1:?usage: tools/node-deps.sh BUILD [debian-package ...]}
shift
need="$*"
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || need="$need nodejs npm"
missing=""
for p in $need; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "missing Debian packages:$missing (install them with: sudo apt-get install -y$missing)"
        exit 3
    fi
    echo "installing Debian packages:$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq -o DPkg::Lock::Timeout=300 >/tmp/attnd-apt-node.log 2>&1 || {
        tail -5 /tmp/attnd-apt-node.log
        echo "apt-get update failed: Debian's archive is out of reach (log: /tmp/attnd-apt-node.log)"
        exit 3
    }
    apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends $missing >>/tmp/attnd-apt-node.log 2>&1 || {
        tail -5 /tmp/attnd-apt-node.log
        echo "apt-get could not install$missing (log: /tmp/attnd-apt-node.log)"
        exit 1
    }
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 18 ]; then
    echo "Node.js $(node --version) is older than 18"
    exit 3
fi
dir="$build/node"
mkdir -p "$dir"
if ! cmp -s tests/node/package-lock.json "$dir/package-lock.json" || [ ! -d "$dir/node_modules" ]; then
    cp tests/node/package.json tests/node/package-lock.json "$dir/"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >npm.log 2>&1) || {
        tail -5 "$dir/npm.log"
        rm -f "$dir/package-lock.json"
        if ! npm ping >/dev/null 2>&1; then
            echo "the npm registry is out of reach (npm ping failed; log: $dir/npm.log)"
            exit 3
        fi
        echo "npm ci could not install tests/node/package.json (log: $dir/npm.log)"
        exit 1
    }
fi
exit 0
