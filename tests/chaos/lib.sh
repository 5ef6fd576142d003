# Shared by tests/chaos/run.sh and bench/soak.sh: a PostgreSQL and a Redis of our own, N
# server nodes each in a network namespace of its own (so one node's links to Redis and
# PostgreSQL can be cut or degraded with iptables and tc netem without touching the
# others), HAProxy in front on 127.0.0.1, process samples (RSS, open files), teardown.
#
# Addresses: node i lives in namespace ${NS}$i at ${NET}.$i.2 (listening on :8080); the
# host end of its veth is ${NET}.$i.1, where it reaches Redis and PostgreSQL. Everything
# stays on this machine.

CHAOS_ADMIN=chaos-admin-token
# Namespace, veth and address prefixes: the soak sets its own so it can run beside the suite.
NS=${CHAOS_NS:-chaos-n}
VETH=${CHAOS_VETH:-chv}
NET=${CHAOS_NET:-10.213}
# Each node's abuse limits off: every robot, person and program comes from 127.0.0.1 via
# HAProxy (as crates/bench's UNLIMITED, minus the relay's byte budget which stays on).
CHAOS_NODE_FLAGS=(--rate-limit 100000000 --rate-burst 100000000 --max-connections-per-ip 0
    --max-tcp-connections-per-ip 0 --max-viewer-sessions-per-subject 0
    --max-viewer-sessions-per-robot 0 --max-sessions-per-connection 100000000)

need_apt() {
    if ! command -v "$1" >/dev/null 2>&1; then
        if [ -z "${APT_UPDATED:-}" ]; then apt-get update -qq; APT_UPDATED=1; fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
    fi
}

chaos_prereqs() {
    need_apt haproxy haproxy
    need_apt redis-server redis-server
    need_apt ip iproute2
    need_apt tc iproute2
    need_apt iptables iptables
    need_apt sqlite3 sqlite3
    need_apt curl curl
    need_apt python3 python3
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt initdb postgresql
    PGBIN=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# chaos_net N: namespaces chaos-n0..N-1 with their veths.
chaos_net() {
    local i
    for ((i = 0; i < $1; i++)); do
        ip netns del "${NS}$i" 2>/dev/null || true
        ip link del "${VETH}${i}h" 2>/dev/null || true
        ip netns add "${NS}$i"
        ip link add "${VETH}${i}h" type veth peer name "${VETH}${i}n" netns "${NS}$i"
        ip addr add "${NET}.$i.1/24" dev "${VETH}${i}h"
        ip link set "${VETH}${i}h" up
        ip -n "${NS}$i" addr add "${NET}.$i.2/24" dev "${VETH}${i}n"
        ip -n "${NS}$i" link set "${VETH}${i}n" up
        ip -n "${NS}$i" link set lo up
        ip -n "${NS}$i" route add default via "${NET}.$i.1"
    done
    CHAOS_NODES=$1
}

# chaos_pg: our own PostgreSQL (fault 2 stops it; the machine's shared one is left alone).
chaos_pg() {
    PGPORT=$(free_port)
    PGDATA="$WORK/pg"
    mkdir -p "$PGDATA" && chown postgres "$WORK" "$PGDATA"
    runuser -u postgres -- "$PGBIN/initdb" -D "$PGDATA" -A trust -U postgres >/dev/null
    echo "host all all ${NET}.0.0/16 trust" >>"$PGDATA/pg_hba.conf"
    local listen="127.0.0.1"
    for ((i = 0; i < CHAOS_NODES; i++)); do listen="$listen,${NET}.$i.1"; done
    cat >>"$PGDATA/postgresql.conf" <<CONF
listen_addresses = '$listen'
port = $PGPORT
unix_socket_directories = '$WORK'
max_connections = 300
fsync = on
CONF
    pg_start
}

pg_start() {
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDATA" -l "$WORK/pg.log" -w -t 30 start >/dev/null
}

pg_stop() {
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w -t 30 stop >/dev/null
}

# chaos_redis: our own Redis on a free port, reachable from every namespace.
chaos_redis() {
    REDISPORT=$(free_port)
    redis_start
}

redis_start() {
    local bind="127.0.0.1"
    for ((i = 0; i < CHAOS_NODES; i++)); do bind="$bind ${NET}.$i.1"; done
    redis-server --port "$REDISPORT" --bind "$bind" --protected-mode no --save "" \
        --appendonly no --client-output-buffer-limit "pubsub 512mb 256mb 60" \
        --daemonize no >>"$WORK/redis.log" 2>&1 &
    REDISPID=$!
    for _ in $(seq 1 100); do
        redis-cli -p "$REDISPORT" ping >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "redis did not start" >&2
    return 1
}

redis_stop() {
    kill "$REDISPID" 2>/dev/null || true
    wait "$REDISPID" 2>/dev/null || true
}

# chaos_redis_proxy: node 0 reaches Redis through tests/chaos/delay_proxy.py, which fault 5
# slows down (the kernel here has no netem); echo MS >"$WORK/redis-delay" sets its delay.
chaos_redis_proxy() {
    PROXYPORT=$(free_port)
    echo 0 >"$WORK/redis-delay"
    python3 tests/chaos/delay_proxy.py ${NET}.0.1 "$PROXYPORT" "$REDISPORT" "$WORK/redis-delay" \
        >>"$WORK/proxy.log" 2>&1 &
    PROXYPID=$!
}

# node_start I: node I in its namespace, on the shared database and Redis.
node_start() {
    local i=$1 redis_port=$REDISPORT
    [ "$i" = 0 ] && [ -n "${PROXYPORT:-}" ] && redis_port=$PROXYPORT
    ip netns exec "${NS}$i" env RUST_LOG="${CHAOS_RUST_LOG:-warn}" "$BIN/signalling-server" \
        --listen 0.0.0.0:8080 --admin-token "$CHAOS_ADMIN" \
        --database-url "postgres://postgres@${NET}.$i.1:$PGPORT/postgres" \
        --redis-url "redis://${NET}.$i.1:$redis_port" --node-id "chaos-node-$i" \
        "${CHAOS_NODE_FLAGS[@]}" ${CHAOS_EXTRA_FLAGS:-} >>"$WORK/node$i.log" 2>&1 &
    NODEPID[$i]=$!
}

# node_ready I [SECS]: /readyz 200 within SECS (default 60).
node_ready() {
    local i=$1 deadline=$((SECONDS + ${2:-60}))
    while [ $SECONDS -lt $deadline ]; do
        [ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://${NET}.$i.2:8080/readyz")" = 200 ] && return 0
        sleep 0.2
    done
    return 1
}

node_alive() { kill -0 "${NODEPID[$1]}" 2>/dev/null; }

# chaos_haproxy: the load balancer on 127.0.0.1:$LBPORT (as deploy/haproxy/haproxy.cfg).
chaos_haproxy() {
    LBPORT=$(free_port)
    {
        cat <<CFG
global
    maxconn 9000
defaults
    mode http
    option redispatch
    retries 3
    timeout connect 2s
    timeout client 75s
    timeout server 75s
    timeout tunnel 1h
    timeout http-request 10s
frontend signalling
    bind 127.0.0.1:$LBPORT
    default_backend nodes
backend nodes
    balance leastconn
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter 1s fall 2 rise 2
CFG
        for ((i = 0; i < CHAOS_NODES; i++)); do echo "    server node$i ${NET}.$i.2:8080 check"; done
    } >"$WORK/haproxy.cfg"
    haproxy -f "$WORK/haproxy.cfg" -db >>"$WORK/haproxy.log" 2>&1 &
    HAPROXYPID=$!
    for _ in $(seq 1 100); do
        curl -s -o /dev/null -m 1 "http://127.0.0.1:$LBPORT/healthz" && return 0
        sleep 0.1
    done
    echo "haproxy did not start" >&2
    return 1
}

# sample_procs FILE SECS: every SECS, one line per node: time, node, RSS (kB), open files,
# threads, the node's robots online, sessions and tokio tasks alive (its /metrics).
sample_procs() {
    local out=$1 every=$2 t0=$SECONDS
    while true; do
        for ((i = 0; i < CHAOS_NODES; i++)); do
            # By namespace, not $NODEPID: this loop runs in a subshell, nodes restart.
            local pid
            pid=$(ip netns pids "${NS}$i" 2>/dev/null | head -1)
            [ -n "$pid" ] && [ -d "/proc/$pid" ] || continue
            local rss fds threads metrics robots sessions tasks
            rss=$(awk '/VmRSS/{print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
            fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
            threads=$(awk '/Threads/{print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
            metrics=$(curl -s -m 2 "http://${NET}.$i.2:8080/metrics" || true)
            robots=$(echo "$metrics" | awk '$1=="signalling_robots_online"{print $2}')
            sessions=$(echo "$metrics" | awk '$1=="signalling_sessions_active"{print $2}')
            tasks=$(echo "$metrics" | awk '$1=="signalling_tokio_alive_tasks"{print $2}')
            echo "$((SECONDS - t0)) $i ${rss:-0} $fds ${threads:-0} ${robots:-0} ${sessions:-0} ${tasks:-0}"
        done >>"$out"
        sleep "$every"
    done
}

chaos_teardown() {
    set +e
    [ -n "${SAMPLERPID:-}" ] && kill "$SAMPLERPID" 2>/dev/null
    [ -n "${GENPID:-}" ] && kill "$GENPID" 2>/dev/null
    [ -n "${AGENTPID:-}" ] && kill "$AGENTPID" 2>/dev/null
    for pid in "${NODEPID[@]:-}"; do [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; done
    [ -n "${HAPROXYPID:-}" ] && kill "$HAPROXYPID" 2>/dev/null
    [ -n "${PROXYPID:-}" ] && kill "$PROXYPID" 2>/dev/null
    [ -n "${REDISPID:-}" ] && kill "$REDISPID" 2>/dev/null
    [ -n "${PGDATA:-}" ] && [ -d "$PGDATA" ] && pg_stop 2>/dev/null
    for ((i = 0; i < ${CHAOS_NODES:-0}; i++)); do
        ip netns del "${NS}$i" 2>/dev/null
        ip link del "${VETH}${i}h" 2>/dev/null
    done
    mountpoint -q "$WORK/disk" 2>/dev/null && umount "$WORK/disk"
    wait 2>/dev/null
}
