#!/usr/bin/env bash
# Chromium and ICE candidates with `sdpMid: ""` (as the ModulrCloud agent sends
# them), relayed by the real signalling-server: see sdpmid.mjs. Installs what it
# needs (Debian chromium, npm packages), builds the server, and runs inside a
# loopback-only network namespace. Exits non-zero on any failure.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

. "$HERE/prereqs.sh"

# Only loopback exists in the namespace: no traffic can leave the machine,
# and WebRTC must work over 127.0.0.1 alone.
exec unshare -n sh -c 'ip link set lo up && exec node "$0/sdpmid.mjs"' "$HERE"
