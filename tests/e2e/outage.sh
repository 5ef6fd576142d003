#!/usr/bin/env bash
# Issue 16 end to end: no stale command moves the robot after an outage.
# Two network namespaces made here (browser | server + robot-agent) joined by
# a veth pair with private addresses; Chromium holds "forward" at 10 Hz, the
# browser's link goes down for 5 s and comes back. outage.mjs asserts from
# the recording driver's log. Everything made here is removed on exit.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
e2e_prepare ip

ID="$$"
BR="e2e-browser-$ID"
RB="e2e-robot-$ID"
# Interface names are limited to 15 characters.
VB="e2eb$ID"
VR="e2er$ID"
cleanup() {
    # Processes this test started inside its namespaces, by id.
    for ns in "$RB" "$BR"; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    done
}
trap cleanup EXIT

ip netns add "$BR"
ip netns add "$RB"
ip link add "$VB" netns "$BR" type veth peer name "$VR" netns "$RB"
ip -n "$BR" addr add 10.203.0.1/30 dev "$VB"
ip -n "$RB" addr add 10.203.0.2/30 dev "$VR"
for ns in "$BR" "$RB"; do ip -n "$ns" link set lo up; done
ip -n "$BR" link set "$VB" up
ip -n "$RB" link set "$VR" up

export E2E_ROBOT_NS="$RB" E2E_BROWSER_IF="$VB" E2E_SERVER_ADDR=10.203.0.2
# The orchestrator (and so Chromium) runs in the browser's namespace.
ip netns exec "$BR" node "$HERE/outage.mjs"
