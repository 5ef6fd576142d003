#!/usr/bin/env bash
# The soak (issue 42, not in CI): the chaos suite's load with churn (robots reconnect,
# sessions and programs end and start again every few minutes) for N minutes on one node or
# three (PostgreSQL, Redis, HAProxy, as tests/chaos/run.sh), sampled every 10 s: each node's
# RSS, open files and tokio tasks, relay and ARP p99, errors by code. Writes into --out the
# samples, the books, figures.md (the goals checked) and soak.svg (the plot).
#
#   bench/soak.sh --minutes 60 [--nodes 3] [--out bench/soak] [--churn-secs 180] [--debug]
#
# Release binaries by default (what a fleet runs; a debug build's memory and latency are
# not the server's); --debug for the debug build. Both are built into $CARGO_TARGET_DIR
# (default target/).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CHAOS_NS=soak-n CHAOS_VETH=skv CHAOS_NET=10.214
. tests/chaos/lib.sh

minutes=60 nodes=3 out=bench/soak churn=180 robots=300 profile=release
while [ $# -gt 0 ]; do
    case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --churn-secs) churn=$2; shift 2 ;;
    --robots) robots=$2; shift 2 ;;
    --debug) profile=debug; shift ;;
    *) echo "usage: bench/soak.sh --minutes N [--nodes 1|3] [--out DIR] [--churn-secs S] [--robots N] [--debug]" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

chaos_prereqs
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
if [ "$profile" = release ]; then
    cargo build --release -p signalling-server -p signalling-bench --bins --quiet
else
    cargo build -p signalling-server -p signalling-bench --bins --quiet
fi
WORK=$(mktemp -d /tmp/soak.XXXXXX)
chmod 755 "$WORK"
# Copies: a rebuild during an hour-long run must not swap the binaries under it.
BIN=$WORK/bin
mkdir -p "$BIN"
cp "$TARGET/$profile/signalling-server" "$TARGET/$profile/signalling-bench" "$BIN/"
# Its own namespaces and addresses, so the chaos suite can run beside it.
export CHAOS_NS=soak-n CHAOS_VETH=skv CHAOS_NET=10.214
trap '[ -n "${LOADPID:-}" ] && kill "$LOADPID"; chaos_teardown; echo "logs: $WORK"' EXIT

chaos_net "$nodes"
chaos_pg
chaos_redis
for ((i = 0; i < nodes; i++)); do node_start "$i"; done
for ((i = 0; i < nodes; i++)); do node_ready "$i" 120; done
chaos_haproxy
rm -f "$out/procs.txt" "$out/samples.jsonl" "$out/loadavg.txt" "$out"/snapshot-*.txt
sample_procs "$out/procs.txt" 10 &
SAMPLERPID=$!
# The machine is shared: its load average beside the samples, so a latency figure can be
# read against what else ran.
(t0=$SECONDS; while true; do echo "$((SECONDS - t0)) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 30; done) \
    >"$out/loadavg.txt" &
LOADPID=$!
# snapshot NAME: each node's memory split (smaps_rollup) and its /metrics, to tell what grew
# between the end of the warm-up and the end of the load.
snapshot() {
    local i pid
    for ((i = 0; i < nodes; i++)); do
        pid=$(ip netns pids "${NS}$i" 2>/dev/null | head -1)
        [ -n "$pid" ] || continue
        {
            echo "# node $i at $1: /proc/$pid/smaps_rollup"
            cat "/proc/$pid/smaps_rollup" 2>/dev/null
            echo "# /metrics (histogram buckets left out)"
            curl -s -m 5 "http://${NET}.$i.2:8080/metrics" | grep -v '_bucket{' || true
        } >"$out/snapshot-node$i-$1.txt"
    done
}
mkfifo "$WORK/gen.in"
"$BIN/signalling-bench" chaos --url "http://127.0.0.1:$LBPORT" --admin-token "$CHAOS_ADMIN" \
    --robots "$robots" --operators 30 --viewers 30 --programs 20 --arp-rate 200 \
    --churn-secs "$churn" --sample-secs 10 --samples "$out/samples.jsonl" --out "$out/books.json" \
    <"$WORK/gen.in" >"$WORK/gen.out" 2>"$WORK/gen.err" &
GENPID=$!
exec 7>"$WORK/gen.in"
echo "soak: $minutes min on $nodes node(s), $robots robots, churn every ~$churn s; started $(date -u +%T)"
echo "mark soak" >&7
STARTED=$(date -u +%FT%TZ)
if [ "$minutes" -gt 5 ]; then
    sleep 300
    snapshot 5min
    sleep $(((minutes - 5) * 60))
else
    sleep $((minutes * 60))
fi
snapshot end
echo stop >&7
exec 7>&-
wait "$GENPID"
GENPID=
kill "$SAMPLERPID" "$LOADPID"
SAMPLERPID= LOADPID=
panics=$( (grep -l panicked "$WORK"/node*.log "$WORK/gen.err" 2>/dev/null || true) | wc -l)
cat >"$out/conditions.json" <<JSON
{"minutes": $minutes, "nodes": $nodes, "robots": $robots, "churn_secs": $churn,
 "cores": $(nproc), "started": "$STARTED",
 "binaries": "$profile build", "commit": "$(git rev-parse --short HEAD)", "logs_with_a_panic": $panics,
 "load_average_at_end": "$(cut -d' ' -f1-3 /proc/loadavg)"}
JSON
python3 bench/soak_report.py "$out"
