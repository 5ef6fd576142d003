#!/usr/bin/env bash
# The chaos suite (issue 42): three nodes on PostgreSQL and Redis behind HAProxy, each node in
# a network namespace of its own, under steady mixed load from `signalling-bench chaos`
# (300 robots with reconnect backoff, one real robot-agent with the sim driver, operators at
# 15 Hz with viewers, ARP programs at 200 calls/s with idempotency keys, some confirmed),
# while the faults below happen one after another. The generator keeps the books (every
# action in, every effect out, reconciled); any breach, a panic in a log, a node that exits
# when it should not, or a check below that fails, fails the suite.
#
#   1 kill -9 a node               5 30 % loss + 200 ms delay node <-> Redis, 20 s
#   2 PostgreSQL stopped 10 s      6 rolling SIGTERM restart of the three nodes
#   3 Redis stopped 10 s           7 a SQLite node whose disk fills (separate, smaller load)
#   4 a node cut off from Redis and PostgreSQL (iptables DROP in its namespace)
#
# CHAOS_ONLY=1,2,... runs only those faults; CHAOS_RUST_LOG sets the nodes' log filter (warn).
# Figures: docs/reliability.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
. tests/chaos/lib.sh

chaos_prereqs
echo "--- build (debug, as CI's test step)"
cargo build --workspace --bins --quiet
BIN=$ROOT/target/debug
WORK=$(mktemp -d /tmp/chaos.XXXXXX)
chmod 755 "$WORK"
FAILED=()
trap 'chaos_teardown; echo "logs: $WORK"' EXIT
only=",${CHAOS_ONLY:-1,2,3,4,5,6,7},"
wants() { [[ "$only" == *",$1,"* ]]; }

fail() { echo "FAIL: $*"; FAILED+=("$*"); }
ok() { echo "ok: $*"; }
note() { echo "   $*"; }

# --- the cluster -------------------------------------------------------------------------
chaos_net 3
chaos_pg
chaos_redis
chaos_redis_proxy
for i in 0 1 2; do node_start "$i"; done
for i in 0 1 2; do node_ready "$i" 120 || { tail -20 "$WORK/node$i.log"; exit 1; }; done
chaos_haproxy
BASE="http://127.0.0.1:$LBPORT"
echo "--- three nodes ready behind HAProxy at $BASE (PostgreSQL :$PGPORT, Redis :$REDISPORT)"
sample_procs "$WORK/procs.txt" 5 &
SAMPLERPID=$!

# --- the load ------------------------------------------------------------------------------
mkfifo "$WORK/gen.in"
"$BIN/signalling-bench" chaos --url "$BASE" --admin-token "$CHAOS_ADMIN" \
    --robots "${CHAOS_ROBOTS:-300}" --operators 30 --viewers 30 --programs 20 --arp-rate 200 \
    --out "$WORK/books.json" --samples "$WORK/samples.jsonl" --sample-secs 5 \
    <"$WORK/gen.in" >"$WORK/gen.out" 2>"$WORK/gen.err" &
GENPID=$!
exec 7>"$WORK/gen.in"
mark() { echo "mark $1" >&7; echo "=== $1 ($(date -u +%T))"; }
for _ in $(seq 1 600); do grep -q '"ready"' "$WORK/gen.out" 2>/dev/null && break; sleep 0.2; done
grep -q '"ready"' "$WORK/gen.out" || { cat "$WORK/gen.err"; exit 1; }

# The real robot-agent (sim driver), through the load balancer like the rest.
# (Retried: on this shared machine a node's /readyz can miss HAProxy's check for a moment.)
enrolled=
for _ in $(seq 1 20); do
    agent_token=$(curl -sf -X POST -H "Authorization: Bearer $CHAOS_ADMIN" -H 'content-type: application/json' \
        -d '{"robotId":"chaos-agent"}' "$BASE/v1/robots" | python3 -c 'import json,sys; print(json.load(sys.stdin)["enrollmentToken"])' 2>/dev/null) &&
        "$BIN/robot-agent" --config-dir "$WORK/agent" enroll --server "$BASE" --robot-id chaos-agent \
            --token "$agent_token" >/dev/null 2>>"$WORK/agent-enroll.log" && { enrolled=1; break; }
    curl -sf -o /dev/null -X DELETE -H "Authorization: Bearer $CHAOS_ADMIN" "$BASE/v1/robots/chaos-agent" || true
    sleep 1
done
[ -n "$enrolled" ] || { tail -5 "$WORK/agent-enroll.log"; exit 1; }
"$BIN/robot-agent" --config-dir "$WORK/agent" run --driver sim --server "ws://127.0.0.1:$LBPORT/ws" >"$WORK/agent.log" 2>&1 &
AGENTPID=$!
agent_online() {
    curl -sf -m 2 -H "Authorization: Bearer $CHAOS_ADMIN" "$BASE/v1/robots/chaos-agent" |
        python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["online"] else 1)' 2>/dev/null
}
wait_for() { # wait_for SECS WHAT COMMAND...: true once COMMAND succeeds within SECS
    local secs=$1 what=$2 deadline
    shift 2
    deadline=$((SECONDS + secs))
    while [ $SECONDS -lt $deadline ]; do "$@" && return 0; sleep 0.25; done
    fail "$what (not within ${secs} s)"
    return 1
}
readyz() { curl -s -o /dev/null -w '%{http_code}' -m 5 "http://10.213.$1.2:8080/readyz" || true; }
all_ready() { for i in ${@:-0 1 2}; do [ "$(readyz "$i")" = 200 ] || return 1; done; }
all_alive() { for i in 0 1 2; do node_alive "$i" || { fail "node $i exited: $(tail -3 "$WORK/node$i.log")"; return 1; }; done; }
robots_on() { curl -s -m 5 "http://10.213.$1.2:8080/metrics" | awk '$1=="signalling_robots_online"{print $2}' || true; }
wait_for 30 "the robot-agent online" agent_online && ok "robot-agent (sim driver) online through HAProxy"
mark warm-up
sleep 15

# --- 1: kill -9 a node ----------------------------------------------------------------------
if wants 1; then
    mark "1-kill9"
    note "node 1 had $(robots_on 1) robots"
    t0=$SECONDS
    kill -9 "${NODEPID[1]}"
    wait "${NODEPID[1]}" 2>/dev/null || true
    sleep 20
    all_ready 0 2 || fail "survivors not ready after the kill"
    wait_for 10 "the robot-agent back online after the kill" agent_online
    node_start 1
    node_ready 1 60 || fail "node 1 did not come back"
    note "node 1 restarted after $((SECONDS - t0)) s"
    sleep 5
fi

# --- 2: PostgreSQL stopped 10 s -------------------------------------------------------------
if wants 2; then
    mark "2-postgres"
    pg_stop
    sleep 4
    for i in 0 1 2; do
        code=$(readyz "$i")
        [ "$code" = 503 ] && note "node $i /readyz $code while PostgreSQL is down" || fail "node $i /readyz $code while PostgreSQL is down (want 503)"
    done
    sleep 6
    all_alive || true
    pg_start
    t0=$SECONDS
    wait_for 5 "every node ready within 5 s of PostgreSQL's return" all_ready && note "ready $((SECONDS - t0)) s after PostgreSQL came back"
    sleep 15
fi

# --- 3: Redis stopped 10 s ------------------------------------------------------------------
if wants 3; then
    mark "3-redis"
    redis_stop
    sleep 4
    for i in 0 1 2; do
        code=$(readyz "$i")
        [ "$code" = 503 ] && note "node $i /readyz $code while Redis is down" || fail "node $i /readyz $code while Redis is down (want 503)"
    done
    sleep 6
    all_alive || true
    redis_start
    t0=$SECONDS
    wait_for 10 "every node ready within 10 s of Redis's return" all_ready && note "ready $((SECONDS - t0)) s after Redis came back"
    sleep 15
fi

# --- 4: one node cut off from Redis and PostgreSQL -------------------------------------------
if wants 4; then
    mark "4-partition"
    # The node of 1 and 2 with the most robots (node 0 has fault 5).
    cut=1
    [ "$(robots_on 2)" -gt "$(robots_on 1)" ] 2>/dev/null && cut=2
    note "node $cut had $(robots_on $cut) robots"
    for port in "$REDISPORT" "$PGPORT"; do
        ip netns exec "chaos-n$cut" iptables -A OUTPUT -p tcp -d "10.213.$cut.1" --dport "$port" -j DROP
    done
    # The lease (10 s) lapses; the node must drop its robots and control (fence) by then.
    fenced() { [ "$(robots_on $cut)" = 0 ]; }
    t0=$SECONDS
    wait_for 25 "the cut node fenced itself (its robots dropped)" fenced && note "node $cut holds no robot $((SECONDS - t0)) s after the cut"
    sleep 3
    all_alive || true
    ip netns exec "chaos-n$cut" iptables -F OUTPUT
    wait_for 15 "node $cut ready again after the cut healed" node_ready "$cut" 1
    sleep 12
fi

# --- 5: 30 % packet loss and 200 ms delay between node 0 and Redis, 20 s -----------------------
if wants 5; then
    mark "5-lossy-link"
    # Loss: iptables drops 30 % of node 0's packets to and from Redis (through the proxy);
    # delay: the proxy holds every chunk 200 ms each way.
    ip netns exec chaos-n0 iptables -A OUTPUT -p tcp -d 10.213.0.1 --dport "$PROXYPORT" -m statistic --mode random --probability 0.3 -j DROP
    ip netns exec chaos-n0 iptables -A INPUT -p tcp -s 10.213.0.1 --sport "$PROXYPORT" -m statistic --mode random --probability 0.3 -j DROP
    echo 200 >"$WORK/redis-delay"
    sleep 20
    echo 0 >"$WORK/redis-delay"
    ip netns exec chaos-n0 iptables -F OUTPUT
    ip netns exec chaos-n0 iptables -F INPUT
    all_alive || true
    wait_for 15 "every node ready after the lossy link healed" all_ready
    sleep 10
fi

# --- 6: rolling SIGTERM restart of the three nodes ------------------------------------------
if wants 6; then
    mark "6-rolling"
    for i in 0 1 2; do
        t0=$SECONDS
        kill -TERM "${NODEPID[$i]}"
        for _ in $(seq 1 100); do node_alive "$i" || break; sleep 0.2; done
        node_alive "$i" && fail "node $i still running 20 s after SIGTERM"
        wait "${NODEPID[$i]}" 2>/dev/null && note "node $i drained and exited 0 in $((SECONDS - t0)) s" || fail "node $i exited non-zero on SIGTERM"
        node_start "$i"
        node_ready "$i" 60 || fail "node $i did not come back"
        sleep 4
    done
    sleep 10
fi

mark "end"
wait_for 20 "the robot-agent online at the end" agent_online && ok "robot-agent online at the end"
echo stop >&7
exec 7>&-
wait "$GENPID" || fail "the generator failed: $(tail -5 "$WORK/gen.err")"
GENPID=

# --- 7: a SQLite node whose disk fills -------------------------------------------------------
if wants 7; then
    echo "=== 7-disk-full ($(date -u +%T))"
    mkdir -p "$WORK/disk"
    mount -t tmpfs -o size=24m tmpfs "$WORK/disk"
    port=$(free_port)
    RUST_LOG=warn "$BIN/signalling-server" --listen "127.0.0.1:$port" --admin-token "$CHAOS_ADMIN" \
        --database-url "sqlite://$WORK/disk/chaos.db" --audit-spill-dir "$WORK/disk" \
        "${CHAOS_NODE_FLAGS[@]}" >>"$WORK/sqlite-node.log" 2>&1 &
    SQLITEPID=$!
    NODEPID[3]=$SQLITEPID
    wait_for 30 "the SQLite node listening" curl -sf -o /dev/null "http://127.0.0.1:$port/healthz"
    mkfifo "$WORK/gen7.in"
    "$BIN/signalling-bench" chaos --url "http://127.0.0.1:$port" --admin-token "$CHAOS_ADMIN" \
        --robots 60 --operators 6 --viewers 6 --programs 6 --arp-rate 60 \
        --out "$WORK/books7.json" --samples "$WORK/samples7.jsonl" --sample-secs 5 \
        <"$WORK/gen7.in" >"$WORK/gen7.out" 2>"$WORK/gen7.err" &
    GENPID=$!
    exec 7>"$WORK/gen7.in"
    for _ in $(seq 1 300); do grep -q '"ready"' "$WORK/gen7.out" 2>/dev/null && break; sleep 0.2; done
    sleep 8
    echo "mark 7-disk-full" >&7
    # Fill what is left of the disk.
    dd if=/dev/zero of="$WORK/disk/filler" bs=1M 2>/dev/null || true
    note "disk full: $(df -h "$WORK/disk" | tail -1 | awk '{print $4}') left"
    sleep 10
    node_alive 3 || fail "the SQLite node exited when its disk filled: $(tail -3 "$WORK/sqlite-node.log")"
    note "readyz while full: $(curl -s -m 5 "http://127.0.0.1:$port/readyz" || true)"
    rm -f "$WORK/disk/filler"
    echo "mark 7-space-back" >&7
    t0=$SECONDS
    sqlite_ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$port/readyz")" = 200 ] &&
        ! curl -s -m 2 "http://127.0.0.1:$port/readyz" | grep -q degraded; }
    wait_for 20 "the SQLite node fully ready (not degraded) once space returned" sqlite_ready && note "full service $((SECONDS - t0)) s after space returned"
    sleep 8
    echo stop >&7
    exec 7>&-
    wait "$GENPID" || fail "the SQLite generator failed: $(tail -5 "$WORK/gen7.err")"
    GENPID=
    kill -TERM "$SQLITEPID"
    wait "$SQLITEPID" 2>/dev/null || fail "the SQLite node exited non-zero on SIGTERM"
    integrity=$(sqlite3 "$WORK/disk/chaos.db" 'PRAGMA integrity_check;')
    [ "$integrity" = ok ] && ok "SQLite integrity_check: ok" || fail "SQLite integrity_check: $integrity"
fi

# --- the books and the logs -------------------------------------------------------------------
kill "$SAMPLERPID" 2>/dev/null || true
SAMPLERPID=
echo
echo "=== the books"
python3 tests/chaos/books.py "$WORK" || FAILED+=("books")
if grep -l "panicked" "$WORK"/node*.log "$WORK"/sqlite-node.log "$WORK/agent.log" "$WORK"/gen*.err 2>/dev/null; then
    fail "a panic in a log"
    grep -h -A3 "panicked" "$WORK"/node*.log "$WORK"/sqlite-node.log "$WORK"/gen*.err 2>/dev/null | head -20
else
    ok "no panic in any log"
fi
if [ ${#FAILED[@]} -gt 0 ]; then
    echo
    echo "chaos: ${#FAILED[@]} failure(s):"
    printf '  - %s\n' "${FAILED[@]}"
    exit 1
fi
echo "chaos: passed"
