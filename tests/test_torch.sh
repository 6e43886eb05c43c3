#!/bin/sh
# Cross-checks a running attnd against PyTorch autograd (tests/torch_check.py).
# ATTND_BIN names the server (default build/attnd). Prefers Debian's python3,
# which is where python3-torch installs; without torch the check is skipped.
set -u
here=$(dirname "$0")
py=python3
for p in /usr/bin/python3 python3; do
    if "$p" -c 'import torch, numpy' >/dev/null 2>&1; then py=$p; break; fi
done
exec "$py" "$here/torch_check.py" "$@"
