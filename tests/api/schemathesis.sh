#!/usr/bin/env bash
# Checks the running server against its own OpenAPI document (GET /v1/openapi.json) with
# schemathesis from PyPI: no 5xx, every status, content type, header and body as documented,
# invalid input refused. Starts the server (SERVER_BIN, default target/debug) on a free
# loopback port with a fresh SQLite database and an admin token, and stops it after.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SERVER_BIN="${SERVER_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/signalling-server}"
command -v schemathesis >/dev/null 2>&1 || python3 -m pip install --quiet schemathesis

work="$(mktemp -d)"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
admin="schemathesis-admin-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
"$SERVER_BIN" --listen "127.0.0.1:$port" --admin-token "$admin" \
    --database-url "sqlite://$work/server.db" >"$work/server.log" 2>&1 &
server=$!
cleanup() {
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
    kill -0 "$server" 2>/dev/null || { cat "$work/server.log"; exit 1; }
    sleep 0.1
done

# Every check schemathesis has (the default); the config file names the one exception.
check_api() {
    local token="$1"
    shift
    schemathesis --no-color --config-file "$ROOT/tests/api/schemathesis.toml" run \
        "http://127.0.0.1:$port/v1/openapi.json" \
        --header "Authorization: Bearer $token" \
        --max-examples "${SCHEMATHESIS_EXAMPLES:-40}" \
        --workers 1 \
        --seed 1 \
        --suppress-health-check too_slow \
        "$@"
}

# schemathesis keeps a cache in the working folder: the scratch folder, not the tree.
cd "$work"
status=0
echo "admin and enrollment routes, with the admin token"
check_api "$admin" --exclude-path-regex '^/v1/(me|confirmations)' || status=$?
# The caller's routes take a client token: make one, with a grant so the list is not empty.
client="$(curl -fsS -X POST "http://127.0.0.1:$port/v1/tokens" -H "Authorization: Bearer $admin" \
    -H 'content-type: application/json' -d '{"subject":"schemathesis"}' |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')"
curl -fsS -X POST "http://127.0.0.1:$port/v1/robots" -H "Authorization: Bearer $admin" \
    -H 'content-type: application/json' -d '{"robotId":"st-robot"}' >/dev/null
curl -fsS -X PUT "http://127.0.0.1:$port/v1/robots/st-robot/grants/schemathesis" \
    -H "Authorization: Bearer $admin" -H 'content-type: application/json' -d '{"role":"viewer"}' >/dev/null
echo "caller routes, with a client token"
check_api "$client" --include-path-regex '^/v1/(me|confirmations)' || status=$?
if [ "$status" -ne 0 ]; then
    echo "--- server log (tail) ---"
    tail -n 40 "$work/server.log"
fi
exit "$status"
