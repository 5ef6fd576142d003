#!/usr/bin/env bash
# Modulr's older web app, unmodified, against our server (issue 11): a headless
# Chromium page written the way that app is written (flat frames, recvonly
# video, data channel `control`, MovementCommand at 10 Hz) drives the real
# robot-agent through the real signalling-server run with --legacy-clients; see
# legacy.mjs. Installs what it needs (Debian chromium, npm packages), builds the
# two binaries, and runs inside a loopback-only network namespace. Exits
# non-zero on any failure.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

. "$HERE/prereqs.sh"

# Only loopback exists in the namespace: no traffic can leave the machine,
# and WebRTC must work over 127.0.0.1 alone.
exec unshare -n sh -c 'ip link set lo up && exec node "$0/legacy.mjs"' "$HERE"
