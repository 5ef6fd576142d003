#!/usr/bin/env bash
# People in the loop in real Chromium against the real server and robot-agent
# (arp_console.mjs): approvals, the audit page and the emergency stops of the console.
# Installs what it needs (Debian chromium, npm packages), builds the binaries unless
# E2E_SKIP_BUILD=1, and runs inside a loopback-only network namespace. Exits non-zero on
# any failure.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
e2e_prepare unshare ip

# Only loopback exists in the namespace: no traffic can leave the machine.
exec unshare -n sh -c 'ip link set lo up && exec node "$0/arp_console.mjs"' "$HERE"
