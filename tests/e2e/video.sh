#!/usr/bin/env bash
# Issue 12 end to end: robot video through TURN across separate networks.
#
# Three network namespaces made here, joined by veth pairs:
#   robot   10.205.1.2/30 --- 10.205.1.1  public  10.205.2.1 --- 10.205.2.2/30  browser
# The public namespace holds the signalling server and coturn on its
# "public" address 198.18.0.1 (on its loopback); robot and browser route
# everything through it, and it does not forward, so the robot and the
# browser have no route to each other: ICE must relay through coturn.
# video.mjs (in the browser's namespace) drives Chromium and asserts.
# Everything made here is removed on exit.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

for tool in ffmpeg turnserver; do
    if ! command -v "$tool" >/dev/null; then
        echo "installing ffmpeg and coturn (apt)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ffmpeg coturn >/dev/null
        break
    fi
done
e2e_prepare ip ffmpeg turnserver

ID="$$"
PB="e2e-vpub-$ID"
RB="e2e-vrobot-$ID"
BR="e2e-vbrowser-$ID"
# Interface names are limited to 15 characters.
VRP="v1p$ID"
VRR="v1r$ID"
VBP="v2p$ID"
VBB="v2b$ID"
cleanup() {
    # Processes this test started inside its namespaces, by id.
    for ns in "$RB" "$BR" "$PB"; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
    done
    for ns in "$RB" "$BR" "$PB"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT

for ns in "$PB" "$RB" "$BR"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
done
ip netns exec "$PB" sysctl -qw net.ipv4.ip_forward=0
ip -n "$PB" addr add 198.18.0.1/32 dev lo
ip link add "$VRP" netns "$PB" type veth peer name "$VRR" netns "$RB"
ip link add "$VBP" netns "$PB" type veth peer name "$VBB" netns "$BR"
ip -n "$PB" addr add 10.205.1.1/30 dev "$VRP"
ip -n "$RB" addr add 10.205.1.2/30 dev "$VRR"
ip -n "$PB" addr add 10.205.2.1/30 dev "$VBP"
ip -n "$BR" addr add 10.205.2.2/30 dev "$VBB"
for pair in "$PB:$VRP" "$PB:$VBP" "$RB:$VRR" "$BR:$VBB"; do
    ip -n "${pair%%:*}" link set "${pair#*:}" up
done
ip -n "$RB" route add default via 10.205.1.1
ip -n "$BR" route add default via 10.205.2.1

# No direct path: the robot cannot reach the browser's address.
if ip netns exec "$RB" ping -c 1 -W 1 10.205.2.2 >/dev/null 2>&1; then
    echo "FAIL: the robot reaches the browser directly" >&2
    exit 1
fi

export E2E_PUB_NS="$PB" E2E_ROBOT_NS="$RB" E2E_BROWSER_IF="$VBB" E2E_BROWSER_GW=10.205.2.1 E2E_PUBLIC_ADDR=198.18.0.1
ip netns exec "$BR" node "$HERE/video.mjs"
