#!/bin/sh
# GET /openapi.json serves the build's conversion of api/openapi.yaml
# (tools/yaml2json.c): tests/openapi_check.py checks that it means exactly
# what PyYAML reads in the YAML, and that the converter refuses what it
# cannot convert faithfully. (tests/test_server.c checks that the server
# serves those very bytes.)
set -u
bin=${ATTND_BIN:-build/attnd}
build=$(dirname "$bin")
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
if ! python3 -c 'import yaml' 2>/dev/null; then
    echo "FAILED python3 with PyYAML is needed (tools/deps.sh test installs python3-yaml)"
    exit 1
fi
exec python3 "$here/openapi_check.py" "$root/api/openapi.yaml" "$build/openapi.json" \
    "$build/yaml2json"
