#!/usr/bin/env bash
# Issue 34: every deployment artifact we ship is built and run here.
#  1. Docker (Debian's docker.io, dockerd started if none answers) and local stand-ins for
#     the Dockerfile's FROM images under their real names (tests/docker/standins.sh).
#  2. `docker build` of the unchanged Dockerfile; figures (image size, cold start, RSS).
#  3. The image read-only, non-root, with a data volume: SQLite and PostgreSQL migrations,
#     the admin token shown once, a robot-agent on this host enrolls and logs in through the
#     published port, a client opens a session, `docker stop` drains and exits 0.
#  4. robot-agent's .deb (cargo-deb) in a Debian container: install, enroll against the
#     server container, the unit's ExecStart run as the unit runs it, upgrade keeps the
#     conffile, remove, purge (keeping the key when asked); systemd-analyze verify.
#  5. Three containers on one PostgreSQL and Redis behind HAProxy: `docker kill` one
#     mid-session, its robots come back on the others; HEALTHCHECK turns healthy.
#  6. `docker compose config` on deploy/docker-compose.yml (Debian's docker-compose).
#  7. Faults: no volume, read-only data dir, wrong DATABASE_URL, port in use: exit non-zero
#     with one clear log line.
# Idempotent and self-cleaning: everything it makes carries this run's label and goes at
# exit; images (stand-ins, build cache) are kept for the next run. Waits are bounded polls.
# Environment: SIGNALLING_IMAGE (default signalling-server:latest), DEB_PROFILE (dev: the
# debug binary CI already built; release for a shippable package), DOCKER_REFRESH_BASE=1.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
HERE=$ROOT/tests/docker
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
IMAGE=${SIGNALLING_IMAGE:-signalling-server:latest}
DEB_PROFILE=${DEB_PROFILE:-dev}
RUN=sigdock$$
LABEL=io.signalling.test=$RUN
OUT=$TARGET/docker
mkdir -p "$OUT"
WORK=$(mktemp -d)
STARTED=$(date +%s)
PASSED=0
DOCKERD_PID=
FORWARD_POLICY=
IP_FORWARD=
HAPROXY_PID=
AGENT_PIDS=()
DATABASES=()

log() { printf '[docker %4ss] %s\n' "$(($(date +%s) - STARTED))" "$*"; }
ok() {
    PASSED=$((PASSED + 1))
    log "ok: $*"
}
fail() {
    log "FAIL: $*" >&2
    exit 1
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 0.1 s until it succeeds.
wait_for() {
    local limit=$1 what=$2 deadline
    shift 2
    deadline=$(($(now_ms) + limit * 1000))
    until "$@" >/dev/null 2>&1; do
        [ "$(now_ms)" -lt "$deadline" ] || fail "$what: not within ${limit}s"
        sleep 0.1
    done
}

cleanup() {
    local status=$?
    set +eu
    if [ "$status" != 0 ]; then
        for c in $(docker ps -aq --filter "label=$LABEL" 2>/dev/null); do
            echo "--- log of container $(docker inspect -f '{{.Name}}' "$c") (last 30 lines)"
            docker logs --tail 30 "$c" 2>&1
        done
        for f in "$WORK"/*.log; do
            [ -f "$f" ] && { echo "--- $f (last 20 lines)"; tail -n 20 "$f"; }
        done
    fi
    for pid in "${AGENT_PIDS[@]}" $HAPROXY_PID; do kill "$pid" 2>/dev/null; done
    for pid in "${AGENT_PIDS[@]}" $HAPROXY_PID; do wait "$pid" 2>/dev/null; done
    docker ps -aq --filter "label=$LABEL" | xargs -r docker rm -f >/dev/null 2>&1
    docker volume ls -q --filter "label=$LABEL" | xargs -r docker volume rm >/dev/null 2>&1
    for db in "${DATABASES[@]}"; do
        psql -q -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    done
    redis-cli -h 127.0.0.1 -p 6379 --scan --pattern "$RUN:*" 2>/dev/null |
        xargs -r redis-cli -h 127.0.0.1 -p 6379 del >/dev/null 2>&1
    if [ -n "$DOCKERD_PID" ]; then
        kill "$DOCKERD_PID" 2>/dev/null
        wait "$DOCKERD_PID" 2>/dev/null
        [ -n "$FORWARD_POLICY" ] && iptables -P FORWARD "$FORWARD_POLICY" 2>/dev/null
        [ -n "$IP_FORWARD" ] && echo "$IP_FORWARD" >/proc/sys/net/ipv4/ip_forward 2>/dev/null
    fi
    rm -rf "$WORK"
    if [ "$status" = 0 ]; then
        echo "docker: $PASSED passed, 0 failed"
    else
        echo "docker: $PASSED passed, 1 failed"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 1. tools, daemon, services, base images ---------------------------------------------
need_apt() {
    if ! command -v "$1" >/dev/null 2>&1; then
        if [ -z "${APT_UPDATED:-}" ]; then
            apt-get update -qq
            APT_UPDATED=1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
    fi
}
need_apt dockerd docker.io
need_apt docker docker.io
need_apt mmdebstrap mmdebstrap
need_apt docker-compose docker-compose
need_apt haproxy haproxy
need_apt redis-cli redis-tools
need_apt psql postgresql-client
need_apt curl curl
python3 -c "import websockets.asyncio.client" 2>/dev/null || python3 -m pip install --quiet "websockets>=13"
python3 -c "import yaml" 2>/dev/null || python3 -m pip install --quiet pyyaml
command -v cargo-deb >/dev/null 2>&1 || cargo install --locked cargo-deb

if ! docker info >/dev/null 2>&1; then
    log "starting dockerd"
    # dockerd turns on IP forwarding and sets the FORWARD policy to DROP: put both back when
    # it stops, so that later tests on this machine see the network as it was.
    IP_FORWARD=$(cat /proc/sys/net/ipv4/ip_forward)
    FORWARD_POLICY=$(iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" { print $3 }' || true)
    dockerd >"$WORK/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    wait_for 60 "dockerd answers" docker info
fi
# The legacy builder: Debian's docker.io has no buildx, and the Dockerfile needs nothing more.
export DOCKER_BUILDKIT=0

if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
    wait_for 30 "PostgreSQL answers" pg_isready -q -h 127.0.0.1 -p 5432
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
    wait_for 30 "Redis answers" redis-cli -h 127.0.0.1 -p 6379 ping
fi

# shellcheck source=tests/docker/standins.sh
. "$HERE/standins.sh"
dockerfile_sum=$(sha256sum Dockerfile)
for from in $(awk 'toupper($1) == "FROM" { print $2 }' Dockerfile); do
    case "$from" in
        debian:bookworm-slim) STANDIN_LOG=$WORK/mmdebstrap.log standin_debian ;;
        rust:*) standin_debian && standin_rust "$from" ;;
        scratch) ;; # no image: the empty file tree every build starts from
        *) fail "no local stand-in for FROM $from" ;;
    esac
done
ok "stand-ins for every FROM of the Dockerfile"

# --- 2. the image ----------------------------------------------------------------------
t0=$(date +%s)
docker build -t "$IMAGE" -f Dockerfile . >"$OUT/build.log" 2>&1 || {
    tail -n 40 "$OUT/build.log"
    fail "docker build"
}
[ "$(sha256sum Dockerfile)" = "$dockerfile_sum" ] || fail "the Dockerfile changed during the test"
build_seconds=$(($(date +%s) - t0))
# Keep this build's stage (the next run's cache) by a tag, and drop what older builds left
# (each one's build stage holds a whole target folder, over a GB).
docker build -q --target build -t signalling-ci/server-build:cache -f Dockerfile . >/dev/null
docker image prune -f >/dev/null
ok "docker build of the unchanged Dockerfile ($build_seconds s)"
image_bytes=$(docker image inspect -f '{{.Size}}' "$IMAGE")
image_gz=$(docker save "$IMAGE" | gzip -6 | wc -c)
probe=$(docker create --label "$LABEL" "$IMAGE")
docker cp "$probe:/usr/local/bin/signalling-server" "$WORK/image-binary"
docker rm "$probe" >/dev/null
binary_bytes=$(stat -c %s "$WORK/image-binary")
# The goal for what a node pulls (docs/deployment.md, "Figures").
[ "$image_gz" -le 36000000 ] || fail "the image is $((image_gz / 1000000)) MB compressed, over 36 MB"
[ "$(docker image inspect -f '{{.Config.Healthcheck.Test}}' "$IMAGE")" != "<no value>" ] ||
    fail "the image has no HEALTHCHECK"
[ "$(docker image inspect -f '{{.Config.User}}' "$IMAGE")" = "10001:10001" ] || fail "image user"

# Helpers on a server's HTTP API.
api() { # api BASE METHOD PATH [JSON] -> body; fails on a non-2xx answer
    local base=$1 method=$2 path=$3 body=${4:-}
    curl -sf --max-time 10 -X "$method" -H "Authorization: Bearer $ADMIN" \
        ${body:+-H 'content-type: application/json' -d "$body"} "$base$path"
}
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1/readyz")" = 200 ]; }
online() { api "$1" GET "/v1/robots/$2" | json 'd["online"]' | grep -qx True; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
health() { docker inspect -f '{{.State.Health.Status}}' "$1"; }
healthy() { [ "$(health "$1")" = healthy ]; }
exited() { [ "$(docker inspect -f '{{.State.Status}}' "$1")" = exited ]; }
# The admin token a first start logged (JSON logs: fields.admin_token).
logged_token() {
    docker logs "$1" 2>&1 | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        fields = json.loads(line).get("fields", {})
    except ValueError:
        continue
    if "admin_token" in fields:
        print(fields["admin_token"])'
}
agent() { # agent NAME ARGS...: the host robot-agent, config folder $WORK/agents/NAME
    local name=$1
    shift
    "$TARGET/debug/robot-agent" --config-dir "$WORK/agents/$name" "$@"
}
start_agent() { # start_agent NAME: runs it (sim driver) in the background
    # The binary itself in the background (not the agent function, whose subshell would be
    # what $! names and kill ends, leaving the agent behind).
    "$TARGET/debug/robot-agent" --config-dir "$WORK/agents/$1" run --driver sim >"$WORK/agent-$1.log" 2>&1 &
    AGENT_PIDS+=($!)
}
enroll() { # enroll BASE ROBOT [CONFIG_NAME]: creates the robot, enrolls a host agent
    local token
    token=$(api "$1" POST /v1/robots "{\"robotId\":\"$2\"}" | json 'd["enrollmentToken"]')
    agent "${3:-$2}" enroll --server "$1" --robot-id "$2" --token "$token" >/dev/null
}
client_token() { # client_token BASE SUBJECT ROBOT...: a client token granted operator
    local base=$1 subject=$2 robot
    shift 2
    for robot in "$@"; do
        api "$base" PUT "/v1/robots/$robot/grants/$subject" '{"role":"operator"}' >/dev/null
    done
    api "$base" POST /v1/tokens "{\"subject\":\"$subject\"}" | json 'd["token"]'
}
no_zombies() { # the container runs its one process (and healthchecks), none defunct
    local procs
    procs=$(docker top "$1" -eo pid,stat,args | tail -n +2 | grep -v ' healthcheck$' || true)
    [ "$(wc -l <<<"$procs")" = 1 ] || fail "$1: more than one process: $procs"
    ! grep -q ' Z' <<<"$procs" || fail "$1: zombie process: $procs"
}
migrations=$(find migrations -name '*.sql' | wc -l)

[ -x "$TARGET/debug/robot-agent" ] || cargo test --workspace --no-run

# --- 3. one container: SQLite in a volume, read-only root, user 10001 -------------------
docker volume create --label "$LABEL" "$RUN-data" >/dev/null
docker create --name "$RUN-sqlite" --label "$LABEL" --read-only --tmpfs /tmp --user 10001 \
    -v "$RUN-data:/var/lib/signalling" -p 127.0.0.1::8080 "$IMAGE" >/dev/null
t0=$(now_ms)
docker start "$RUN-sqlite" >/dev/null
port=$(docker port "$RUN-sqlite" 8080/tcp | head -n1 | sed 's/.*://')
BASE=http://127.0.0.1:$port
deadline=$((t0 + 30000))
until ready "$BASE"; do
    [ "$(now_ms)" -lt "$deadline" ] || fail "/readyz not 200 within 30 s"
    sleep 0.01
done
ready_ms=$(now_ms)
cold_docker_ms=$((ready_ms - t0))
started_ms=$(docker inspect -f '{{.State.StartedAt}}' "$RUN-sqlite" | python3 -c '
import calendar, sys, time
stamp = sys.stdin.read().strip().rstrip("Z")
whole, _, fraction = stamp.partition(".")
seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
print(int((seconds + float("0." + (fraction or "0"))) * 1000))')
cold_process_ms=$((ready_ms - started_ms))
ok "read-only, user 10001, SQLite volume: /readyz 200 (${cold_docker_ms} ms from docker start, ${cold_process_ms} ms from the process start)"
rss_kib=$(awk '/^VmRSS/ { print $2 }' "/proc/$(docker inspect -f '{{.State.Pid}}' "$RUN-sqlite")/status")

[ "$(docker logs "$RUN-sqlite" 2>&1 | grep -c 'generated the admin token')" = 1 ] ||
    fail "the admin token is not shown exactly once"
ADMIN=$(logged_token "$RUN-sqlite")
[ -n "$ADMIN" ] || fail "no admin token in the log"
api "$BASE" GET /v1/robots >/dev/null || fail "the logged admin token is refused"
db_file=$(docker volume inspect -f '{{.Mountpoint}}' "$RUN-data")/data/signalling.db
applied=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select count(*) from _sqlx_migrations where success').fetchone()[0])" "$db_file")
[ "$applied" = "$migrations" ] || fail "SQLite: $applied of $migrations migrations applied"
ok "SQLite: $applied/$migrations migrations applied in the volume; admin token shown once, accepted"

mkdir -p "$WORK/agents"
enroll "$BASE" robot-1
grep -q "127.0.0.1:$port" "$WORK/agents/robot-1/agent.toml" || fail "agent.toml names another server"
start_agent robot-1
wait_for 30 "robot-1 online through the published port" online "$BASE" robot-1
[ "$(api "$BASE" GET /v1/robots/robot-1 | json 'd["credential"]')" = ed25519 ] || fail "credential"
ok "robot-agent on the host enrolled and logged in through 127.0.0.1:$port (registered, verified)"
alice=$(client_token "$BASE" alice robot-1)
python3 "$HERE/session.py" "ws://127.0.0.1:$port/ws" "$alice" robot-1 >"$WORK/session-1.out" ||
    fail "session: $(cat "$WORK/session-1.out")"
session_id=$(json 'd["connectionId"]' <"$WORK/session-1.out")
api "$BASE" GET "/v1/sessions?robotId=robot-1" | grep -q "$session_id" || fail "no session record"
ok "a client opened a session (offer answered by robot-agent, session $session_id recorded)"
wait_for 40 "HEALTHCHECK healthy" healthy "$RUN-sqlite"
ok "HEALTHCHECK: healthy"

# --- 4. the .deb in a Debian container, enrolled against this server container ----------
deb_dir=$WORK/deb
mkdir -p "$deb_dir"
if [ "$DEB_PROFILE" = release ]; then
    cargo deb -p robot-agent -o "$deb_dir/" >"$WORK/cargo-deb.log" 2>&1
else
    # The debug binary CI built for the tests before (cargo-deb warns about the profile).
    cargo deb -p robot-agent --no-build --profile "$DEB_PROFILE" --fast -o "$deb_dir/" >"$WORK/cargo-deb.log" 2>&1
fi
cargo deb -p robot-agent --no-build --profile "$DEB_PROFILE" --fast --deb-revision 2 -o "$deb_dir/" \
    >>"$WORK/cargo-deb.log" 2>&1
deb1=$(cd "$deb_dir" && ls robot-agent_*-1_*.deb)
deb2=$(cd "$deb_dir" && ls robot-agent_*-2_*.deb)
ok "cargo deb: $deb1 (and $deb2 for the upgrade)"

# A Debian machine with systemd as PID 1 (the stand-in plus systemd; kept as an image), so
# that the package meets a running systemd: enable, start, boot, stop on remove. systemd in
# a container needs CAP_SYS_ADMIN, no seccomp filter and the host's cgroups (read-only).
printf 'FROM debian:bookworm-slim\nRUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends systemd systemd-sysv && rm -rf /var/lib/apt/lists/*\nLABEL %s=test-machine\n' \
    "$STANDIN_LABEL" | docker build -q -t signalling-ci/debian-systemd:bookworm - >/dev/null
docker run -d --name "$RUN-deb" --label "$LABEL" --network host -v "$deb_dir:/pkgs:ro" \
    --cap-add SYS_ADMIN --security-opt seccomp=unconfined --tmpfs /run --tmpfs /run/lock \
    --stop-signal SIGRTMIN+3 \
    -v /sys/fs/cgroup:/sys/fs/cgroup:ro signalling-ci/debian-systemd:bookworm /lib/systemd/systemd >/dev/null
inside() { docker exec "$RUN-deb" "$@"; }
booted() { inside systemctl is-system-running | grep -qE '^(running|degraded)$'; }
wait_for 60 "systemd boots in the Debian container" booted
active() { [ "$(inside systemctl is-active robot-agent 2>/dev/null)" = active ]; }
inside sh -c 'apt-get update -qq' || fail "apt-get update in the Debian container"
inside sh -c "cd /pkgs && DEBIAN_FRONTEND=noninteractive apt-get install -y ./$deb1" >"$WORK/deb-install.log" 2>&1 ||
    fail "apt install ./$deb1"
grep -q "not started: enroll this robot first" "$WORK/deb-install.log" || fail "postinst gave no enrollment hint"
inside sh -c 'for p in /proc/[0-9]*; do cat "$p/comm" 2>/dev/null; done' | grep -q robot-agent &&
    fail "postinst started an unenrolled agent"
inside systemctl is-enabled robot-agent >/dev/null || fail "unit not enabled"
# Asked to start, and at boot, an unenrolled agent is skipped (condition), not failed.
inside systemctl start robot-agent || fail "systemctl start of the unenrolled agent failed"
docker restart -t 10 "$RUN-deb" >/dev/null
wait_for 60 "systemd boots again" booted
active && fail "an unenrolled agent started"
inside systemctl show -p ConditionResult robot-agent | grep -qx ConditionResult=no || fail "unit condition"
inside systemctl is-failed robot-agent >/dev/null && fail "the unenrolled agent's unit failed"
inside test -x /usr/bin/robot-agent
inside getent passwd robot-agent | awk -F: '$3 < 1000 && $6 == "/var/lib/robot-agent" && $7 ~ /nologin/ { f = 1 } END { exit !f }' ||
    fail "robot-agent system user: $(inside getent passwd robot-agent)"
[ "$(inside stat -c '%U:%G %a' /etc/robot-agent /var/lib/robot-agent | sort -u)" = "robot-agent:robot-agent 700" ] ||
    fail "folders: $(inside stat -c '%n %U:%G %a' /etc/robot-agent /var/lib/robot-agent)"
inside dpkg-query -W -f='${Conffiles}\n' robot-agent | grep -q /etc/default/robot-agent || fail "conffile"
inside test -L /etc/systemd/system/multi-user.target.wants/robot-agent.service || fail "unit not enabled"
unit=/usr/lib/systemd/system/robot-agent.service
inside test -f "$unit" || unit=/lib/systemd/system/robot-agent.service
inside systemd-analyze verify "$unit" >"$WORK/verify.log" 2>&1 || fail "systemd-analyze verify: $(cat "$WORK/verify.log")"
ok "apt install ./$deb1 (systemd running): binary, system user, 0700 folders, conffile, unit enabled; not started by the package, by systemctl start or at boot until enrolled (skipped, not failed); systemd-analyze verify passes"

token=$(api "$BASE" POST /v1/robots '{"robotId":"deb-robot"}' | json 'd["enrollmentToken"]')
inside runuser -u robot-agent -- robot-agent --config-dir /etc/robot-agent enroll \
    --server "$BASE" --robot-id deb-robot --token "$token" >/dev/null || fail "enroll in the container"
[ "$(inside stat -c '%U %a' /etc/robot-agent/agent.key)" = "robot-agent 600" ] || fail "key file"
# A local setting, as an operator would make it: the upgrade below must keep it.
inside sh -c 'echo ROBOT_AGENT_DRIVER=sim >>/etc/default/robot-agent'
# The unit's ExecStart as systemd runs it: user, groups, environment (Environment= then
# EnvironmentFile=), working directory, umask; all read from the installed unit.
inside cat "$unit" >"$WORK/unit"
python3 - "$WORK/unit" "$RUN-deb" >"$WORK/execstart.sh" <<'EOF'
import shlex, subprocess, sys
unit = {}
for raw in open(sys.argv[1]):
    line = raw.strip()
    if not line or line[0] in "#;[" or "=" not in line:
        continue
    key, value = line.split("=", 1)
    unit.setdefault(key, []).append(value)
def last(key, default=None):
    return unit.get(key, [default])[-1]
def inside(*args, check=True):
    return subprocess.run(["docker", "exec", sys.argv[2], *args],
                          capture_output=True, text=True, check=check).stdout
user = last("User")
group = last("Group", user)
groups = ",".join(" ".join(unit.get("SupplementaryGroups", [])).split()) or group
home = inside("getent", "passwd", user).split(":")[5]
# What systemd gives a User= service, then Environment=, then EnvironmentFile= lines.
env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "USER": user,
       "LOGNAME": user, "HOME": home, "SHELL": "/usr/sbin/nologin"}
for value in unit.get("Environment", []):
    for item in shlex.split(value):
        k, v = item.split("=", 1)
        env[k] = v
for name in unit.get("EnvironmentFile", []):
    for line in inside("cat", name.lstrip("-"), check=not name.startswith("-")).splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")) and "=" in line:
            k, v = line.split("=", 1)
            env[k.strip()] = v.strip().strip('"')
setpriv = ["setpriv", f"--reuid={user}", f"--regid={group}", f"--groups={groups}"]
if last("CapabilityBoundingSet", None) == "":
    setpriv.append("--bounding-set=-all")
if last("NoNewPrivileges", "no") in ("yes", "true", "1"):
    setpriv.append("--no-new-privs")
command = shlex.split(last("ExecStart").lstrip("-@+!:"))
print("set -e")
print("cd " + shlex.quote(last("WorkingDirectory", "/")))
print("umask " + last("UMask", "0022"))
print("exec " + shlex.join(setpriv + ["env", "-i"] + [f"{k}={v}" for k, v in env.items()] + command))
EOF
docker exec -i "$RUN-deb" sh -c 'cat >/run/execstart.sh' <"$WORK/execstart.sh"
docker exec -d "$RUN-deb" sh -c 'echo $$ >/run/agent.pid; exec sh /run/execstart.sh >/run/agent.log 2>&1'
wait_for 30 "the packaged agent online" online "$BASE" deb-robot
inside sh -c 'grep -q "^Uid:.*\b$(id -u robot-agent)\b" /proc/$(cat /run/agent.pid)/status' ||
    fail "the agent does not run as robot-agent"
ok "the unit's ExecStart as the unit runs it (robot-agent user, unit environment, /): deb-robot registered and verified"
inside sh -c 'kill $(cat /run/agent.pid)'
wait_for 15 "the packaged agent stops on SIGTERM" inside sh -c '! test -e /proc/$(cat /run/agent.pid)'
offline() { ! online "$@"; }
wait_for 15 "deb-robot offline" offline "$BASE" deb-robot
# A reboot: systemd starts the enrolled agent, which registers.
t0=$(now_ms)
docker restart -t 10 "$RUN-deb" >/dev/null
wait_for 60 "the agent registered after a reboot" online "$BASE" deb-robot
boot_ms=$(($(now_ms) - t0))
active || fail "the unit is not active after the reboot"
inside systemctl show -p User -p MainPID robot-agent | grep -q User=robot-agent || fail "unit user"
ok "after a reboot systemd starts the enrolled agent (the unit as packaged, hardening and all): registered in $boot_ms ms from docker restart"

key_sum=$(inside sha256sum /etc/robot-agent/agent.key)
started_before=$(inside systemctl show -p ExecMainStartTimestampMonotonic --value robot-agent)
inside sh -c "cd /pkgs && DEBIAN_FRONTEND=noninteractive apt-get install -y ./$deb2" >"$WORK/deb-upgrade.log" 2>&1 ||
    fail "upgrade to $deb2"
inside grep -qx ROBOT_AGENT_DRIVER=sim /etc/default/robot-agent || fail "the upgrade lost the conffile's change"
[ "$(inside sha256sum /etc/robot-agent/agent.key)" = "$key_sum" ] || fail "the upgrade changed the key"
inside dpkg-query -W -f='${Version}' robot-agent | grep -q -- '-2$' || fail "not upgraded"
active || fail "the enrolled agent is not running after the upgrade"
[ "$(inside systemctl show -p ExecMainStartTimestampMonotonic --value robot-agent)" != "$started_before" ] ||
    fail "the agent was not restarted on the new binary"
wait_for 30 "deb-robot online after the upgrade" online "$BASE" deb-robot
ok "upgrade to $deb2 keeps the edited conffile and the key, restarts the enrolled agent"
inside sh -c 'DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq robot-agent' >/dev/null
active && fail "remove left the agent running"
inside test ! -e /usr/bin/robot-agent || fail "remove left the binary"
inside test -s /etc/robot-agent/agent.key || fail "remove took the key"
inside sh -c 'DEBIAN_FRONTEND=noninteractive ROBOT_AGENT_KEEP_KEY=1 apt-get purge -y -qq robot-agent' >/dev/null
inside test -s /etc/robot-agent/agent.key || fail "purge with ROBOT_AGENT_KEEP_KEY=1 took the key"
inside test ! -e /etc/robot-agent/agent.toml || fail "purge kept agent.toml"
inside test ! -e /var/lib/robot-agent || fail "purge kept /var/lib/robot-agent"
inside test ! -e /etc/default/robot-agent || fail "purge kept the conffile"
inside test ! -e /etc/systemd/system/multi-user.target.wants/robot-agent.service || fail "purge kept the unit enabled"
inside sh -c "cd /pkgs && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ./$deb2" >/dev/null
inside sh -c 'DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq robot-agent' >/dev/null
inside test ! -e /etc/robot-agent || fail "purge kept /etc/robot-agent"
ok "remove stops the agent and keeps the key; purge removes config, data and conffile, keeps the key when asked (ROBOT_AGENT_KEEP_KEY=1)"
docker rm -f "$RUN-deb" >/dev/null

# docker stop with a robot and a client session connected: SIGTERM to PID 1, drain, exit 0.
python3 "$HERE/session.py" "ws://127.0.0.1:$port/ws" "$alice" robot-1 --hold 60 >"$WORK/session-2.out" &
held=$!
wait_for 20 "a held session" grep -q answered "$WORK/session-2.out"
no_zombies "$RUN-sqlite"
t0=$(now_ms)
docker stop -t 20 "$RUN-sqlite" >/dev/null
stop_ms=$(($(now_ms) - t0))
[ "$(docker inspect -f '{{.State.ExitCode}} {{.State.OOMKilled}}' "$RUN-sqlite")" = "0 false" ] ||
    fail "docker stop: exit $(docker inspect -f '{{.State.ExitCode}}' "$RUN-sqlite")"
[ "$stop_ms" -lt 20000 ] || fail "docker stop took the whole grace period"
wait "$held" || fail "the held session did not end with the server"
! docker logs "$RUN-sqlite" 2>&1 | grep -q panicked || fail "panic in the log"
ok "docker stop: drained in $stop_ms ms, exit 0, no zombie (one process), client told ($(tail -n1 "$WORK/session-2.out"))"
# A second start on the same volume: the same token, not shown again, the robot kept.
docker run -d --name "$RUN-sqlite2" --label "$LABEL" --read-only --tmpfs /tmp --user 10001 \
    -v "$RUN-data:/var/lib/signalling" -p 127.0.0.1::8080 "$IMAGE" >/dev/null
BASE=http://127.0.0.1:$(docker port "$RUN-sqlite2" 8080/tcp | head -n1 | sed 's/.*://')
wait_for 30 "second start ready" ready "$BASE"
docker logs "$RUN-sqlite2" 2>&1 | grep -q 'generated the admin token' && fail "token shown again"
api "$BASE" GET /v1/robots/robot-1 >/dev/null || fail "the volume lost the robot or the token"
docker stop "$RUN-sqlite2" >/dev/null
ok "restart on the volume: data kept, admin token not shown again"
for pid in "${AGENT_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done

# --- PostgreSQL (the host's, through the host network) ----------------------------------
pg_db=${RUN}_pg
psql -q -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE $pg_db" >/dev/null
DATABASES+=("$pg_db")
pg_port=$(free_port)
docker run -d --name "$RUN-pg" --label "$LABEL" --read-only --tmpfs /tmp --user 10001 --network host \
    -e SIGNALLING_LISTEN="127.0.0.1:$pg_port" -e DATABASE_URL="postgres://postgres@127.0.0.1:5432/$pg_db" \
    "$IMAGE" >/dev/null
wait_for 30 "PostgreSQL container ready" ready "http://127.0.0.1:$pg_port"
applied=$(psql -h 127.0.0.1 -U postgres -d "$pg_db" -Atc 'select count(*) from _sqlx_migrations where success')
[ "$applied" = "$migrations" ] || fail "PostgreSQL: $applied of $migrations migrations"
[ "$(docker logs "$RUN-pg" 2>&1 | grep -c 'generated the admin token')" = 1 ] || fail "PostgreSQL: token"
docker stop "$RUN-pg" >/dev/null
[ "$(docker inspect -f '{{.State.ExitCode}}' "$RUN-pg")" = 0 ] || fail "PostgreSQL container: exit code"
ok "PostgreSQL: $applied/$migrations migrations applied, admin token shown once, stop exits 0"

# --- 5. three containers on one PostgreSQL and Redis behind HAProxy ---------------------
cluster_db=${RUN}_cluster
psql -q -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE $cluster_db" >/dev/null
DATABASES+=("$cluster_db")
ADMIN=adm-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
node_ports=()
for i in 1 2 3; do
    node_ports+=("$(free_port)")
    docker run -d --name "$RUN-node$i" --label "$LABEL" --read-only --tmpfs /tmp --user 10001 \
        --network host \
        -e SIGNALLING_LISTEN="127.0.0.1:${node_ports[$((i - 1))]}" \
        -e DATABASE_URL="postgres://postgres@127.0.0.1:5432/$cluster_db" \
        -e REDIS_URL=redis://127.0.0.1:6379 -e SIGNALLING_REDIS_PREFIX="$RUN:" \
        -e SIGNALLING_NODE_ID="$RUN-node$i" -e SIGNALLING_NODE_TTL=3 -e SIGNALLING_LOCK_TTL=3 \
        -e SIGNALLING_MAX_CONNECTIONS_PER_IP=0 -e SIGNALLING_SHUTDOWN_GRACE=2 \
        -e SIGNALLING_ADMIN_TOKEN="$ADMIN" "$IMAGE" >/dev/null
    # One at a time: the first applies the migrations.
    wait_for 30 "node $i ready" ready "http://127.0.0.1:${node_ports[$((i - 1))]}"
done
lb_port=$(free_port)
# deploy/haproxy/haproxy.cfg with this run's port and nodes (as tests/api/cluster.rs does).
awk -v port="$lb_port" -v servers="$(for i in 1 2 3; do printf '    server node%s 127.0.0.1:%s check\\n' "$i" "${node_ports[$((i - 1))]}"; done)" '
    /^[ \t]*bind / { print "    bind 127.0.0.1:" port; next }
    /^[ \t]*server / { if (!done) { printf "%s", servers; done = 1 } next }
    /^[ \t]*log stdout/ { next }
    /^[ \t]*maxconn / { print "    maxconn 4000"; next }
    { print }' deploy/haproxy/haproxy.cfg >"$WORK/haproxy.cfg"
haproxy -q -db -f "$WORK/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
HAPROXY_PID=$!
LB=http://127.0.0.1:$lb_port
wait_for 20 "HAProxy forwards" ready "$LB"
for i in 1 2 3; do wait_for 60 "node $i HEALTHCHECK healthy" healthy "$RUN-node$i"; done
ok "three containers on one PostgreSQL and Redis behind HAProxy, all healthy"

robots=(fleet-1 fleet-2 fleet-3 fleet-4 fleet-5 fleet-6)
for robot in "${robots[@]}"; do
    enroll "$LB" "$robot"
    start_agent "$robot"
done
for robot in "${robots[@]}"; do wait_for 30 "$robot online through HAProxy" online "$LB" "$robot"; done
node_of() { api "$LB" GET "/v1/robots/$1" | json 'd["node"] or ""'; }
victim=$(node_of fleet-1)
on_victim=()
for robot in "${robots[@]}"; do [ "$(node_of "$robot")" = "$victim" ] && on_victim+=("$robot"); done
bob=$(client_token "$LB" bob "${robots[@]}")
python3 "$HERE/session.py" "ws://127.0.0.1:$lb_port/ws" "$bob" fleet-1 --hold 90 >"$WORK/session-3.out" &
held=$!
wait_for 20 "a session with fleet-1" grep -q answered "$WORK/session-3.out"
t0=$(now_ms)
docker kill "$victim" >/dev/null
back_elsewhere() { # back_elsewhere ROBOT NODE: online, on another node than NODE
    local node
    node=$(api "$LB" GET "/v1/robots/$1" | json 'd["node"] if d["online"] else ""')
    [ -n "$node" ] && [ "$node" != "$2" ]
}
for robot in "${on_victim[@]}"; do
    wait_for 30 "$robot back on another node" back_elsewhere "$robot" "$victim"
done
back_ms=$(($(now_ms) - t0))
# The client's session with the killed node's robot ends (signalling.disconnected,
# node_down) from the client's node, whichever survivor noticed the death first (every
# survivor with sessions on the dead node ends them; tests/api/cluster.rs
# every_survivor_ends_its_sessions_with_a_dead_node); its control lock goes with it.
deadline=$(($(now_ms) + 15000))
while kill -0 "$held" 2>/dev/null && [ "$(now_ms)" -lt "$deadline" ]; do sleep 0.1; done
if kill -0 "$held" 2>/dev/null; then
    kill "$held" 2>/dev/null || true
    wait "$held" 2>/dev/null || true
    fail "the client in a session with the killed node's robot was not told within 15 s"
fi
wait "$held" || fail "the session client failed: $(tail -n1 "$WORK/session-3.out")"
told="told: $(tail -n1 "$WORK/session-3.out")"
new_session() { python3 "$HERE/session.py" "ws://127.0.0.1:$lb_port/ws" "$bob" fleet-1 >"$WORK/session-4.out"; }
wait_for 20 "a new session with fleet-1 after the kill ($(cat "$WORK/session-4.out" 2>/dev/null))" new_session
ok "docker kill $victim mid-session: client $told; its ${#on_victim[@]} robots (${on_victim[*]}) back on the others in $back_ms ms, a new session opens"
for i in 1 2 3; do
    [ "$RUN-node$i" = "$victim" ] && continue
    docker stop "$RUN-node$i" >/dev/null
    [ "$(docker inspect -f '{{.State.ExitCode}}' "$RUN-node$i")" = 0 ] || fail "node $i: stop exit code"
done
ok "the surviving nodes stop with exit 0 (robots connected)"
for pid in "${AGENT_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
kill "$HAPROXY_PID" 2>/dev/null || true

# --- 6. compose ------------------------------------------------------------------------
SIGNALLING_ADMIN_TOKEN=x TURN_SECRET=y SIGNALLING_IMAGE="$IMAGE" \
    docker-compose -f deploy/docker-compose.yml config >"$WORK/compose.yml" 2>"$WORK/compose.log" ||
    fail "docker-compose config: $(cat "$WORK/compose.log")"
python3 - "$WORK/compose.yml" "$IMAGE" <<'EOF' || fail "compose: the nodes do not run the image built here"
import sys, yaml
services = yaml.safe_load(open(sys.argv[1]))["services"]
nodes = [s for s in services.values() if "build" in s]
assert len(nodes) >= 2, nodes
for node in nodes:
    assert node["image"] == sys.argv[2], node["image"]
    assert node["healthcheck"]["test"][-1] == "healthcheck", node["healthcheck"]
EOF
ok "docker-compose config validates deploy/docker-compose.yml; its nodes run $IMAGE"

# --- 7. bad input and faults: exit non-zero, one clear log line -------------------------
fault() { # fault NAME PATTERN DOCKER_RUN_ARGS...: the container must exit 1 with one error line
    local name=$1 pattern=$2 code lines
    shift 2
    docker run -d --name "$RUN-$name" --label "$LABEL" --read-only --tmpfs /tmp --user 10001 "$@" "$IMAGE" >/dev/null
    wait_for 40 "$name: the container exits" exited "$RUN-$name"
    code=$(docker inspect -f '{{.State.ExitCode}}' "$RUN-$name")
    lines=$(docker logs "$RUN-$name" 2>&1 | grep -c '"level":"ERROR"' || true)
    [ "$code" != 0 ] || fail "$name: exit 0"
    [ "$lines" = 1 ] || fail "$name: $lines error lines: $(docker logs "$RUN-$name" 2>&1)"
    docker logs "$RUN-$name" 2>&1 | grep '"level":"ERROR"' | grep -qiE "$pattern" ||
        fail "$name: unclear: $(docker logs "$RUN-$name" 2>&1)"
    ok "$name: exit $code, $(docker logs "$RUN-$name" 2>&1 | grep '"level":"ERROR"' | json 'd["fields"]["message"]')"
}
fault no-volume 'cannot create database directory|read-only|Permission denied'
fault read-only-data 'not writable|read-only|readonly' -v "$RUN-data:/var/lib/signalling:ro"
fault wrong-database-url 'database' -e DATABASE_URL=postgres://signalling@127.0.0.1:1/signalling
docker volume create --label "$LABEL" "$RUN-data2" >/dev/null
fault port-in-use 'cannot listen on 127.0.0.1:5432' --network host -e SIGNALLING_LISTEN=127.0.0.1:5432 \
    -v "$RUN-data2:/var/lib/signalling"

# --- figures ---------------------------------------------------------------------------
{
    echo "image: $IMAGE"
    echo "docker build: $build_seconds s"
    echo "image size: $((image_bytes / 1000000)) MB unpacked, $((image_gz / 1000000)).$(((image_gz % 1000000) / 100000)) MB compressed (docker save | gzip -6; no base image: the binary is $((binary_bytes / 1000000)).$(((binary_bytes % 1000000) / 100000)) MB, the rest its C libraries)"
    echo "cold start to /readyz 200 (SQLite, new volume): $cold_process_ms ms from the process start, $cold_docker_ms ms from docker start"
    echo "RSS at idle (just ready, SQLite): $((rss_kib / 1024)) MiB ($rss_kib KiB)"
    echo "docker stop with a robot and a session connected: $stop_ms ms"
    echo "robots of a killed node back on the others: $back_ms ms"
} | tee "$OUT/figures.txt"
log "done in $(($(date +%s) - STARTED)) s"
