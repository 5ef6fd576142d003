#!/usr/bin/env bash
# Builds and runs every benchmark; writes results.json, results.md and results.svg.
#   bench/run.sh [OUT_DIR]           full run (~15 minutes on 2 cores)
#   bench/run.sh --smoke [OUT_DIR]   seconds, small sizes (what CI runs)
# Peers are installed into target/bench-tools and bench/peers/node_modules on first use.
# Set BENCH_POSTGRES_URL to add the registration storm on PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=()
if [ "${1:-}" = "--smoke" ]; then
    smoke=(--smoke)
    shift
fi
out="${1:-bench-results/$(date -u +%Y%m%dT%H%M%SZ)}"
peers="${BENCH_PEERS:-bare,node,python,matchbox}"
tools="target/bench-tools"
mkdir -p "$tools"

cargo build --release -p signalling-server -p signalling-bench

if [[ ",$peers," == *",node,"* ]] && [ ! -d bench/peers/node_modules/ws ]; then
    (cd bench/peers && npm install --no-audit --no-fund --silent)
fi
if [[ ",$peers," == *",python,"* ]] && [ ! -x "$tools/venv/bin/python" ]; then
    python3 -m venv "$tools/venv"
    "$tools/venv/bin/python" -m pip install --quiet "websockets==17.*"
fi
if [[ ",$peers," == *",matchbox,"* ]] && [ ! -x "$tools/bin/matchbox_server" ]; then
    cargo install --quiet --locked --root "$tools" matchbox_server
fi

bin_dir="${CARGO_TARGET_DIR:-target}/release"
exec "$bin_dir/signalling-bench" run "${smoke[@]}" --peers "$peers" --out "$out" --bin-dir "$bin_dir"
