#!/usr/bin/env bash
# End-to-end test of robot-agent with the real signalling-server and headless
# Chromium. Installs what it needs (Debian chromium, npm packages), builds the
# two binaries, and runs the scenario inside a loopback-only network
# namespace. Exits non-zero on any failure.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
e2e_prepare unshare ip

# Only loopback exists in the namespace: no traffic can leave the machine,
# and WebRTC must work over 127.0.0.1 alone.
exec unshare -n sh -c 'ip link set lo up && exec node "$0/e2e.mjs"' "$HERE"
