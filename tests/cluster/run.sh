#!/usr/bin/env bash
# Several nodes (issue 14): deploy/ validated as far as this machine allows (no container
# engine), then three server processes on one PostgreSQL and one Redis behind HAProxy
# (tests/api/cluster.rs: presence, relay, lock race, cuts, SIGKILL, Redis restart, drain).
set -euo pipefail
cd "$(dirname "$0")/../.."

need_apt() {
    if ! command -v "$1" >/dev/null 2>&1; then
        if [ -z "${APT_UPDATED:-}" ]; then apt-get update -qq; APT_UPDATED=1; fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
    fi
}
need_apt haproxy haproxy
need_apt redis-server redis-server
need_apt promtool prometheus
python3 -c "import yaml" 2>/dev/null || python3 -m pip install --quiet pyyaml
python3 -c "import kubernetes_validate" 2>/dev/null || python3 -m pip install --quiet kubernetes-validate

echo "--- deploy/: HAProxy, Prometheus, Kubernetes, compose, dashboard"
haproxy -c -q -f deploy/haproxy/haproxy.cfg
promtool check rules deploy/prometheus/alerts.yml
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# The scrape config names the rules file by its path inside the container.
cp deploy/prometheus/alerts.yml "$scratch/alerts.yml"
sed "s#/etc/prometheus/alerts.yml#$scratch/alerts.yml#" deploy/prometheus/prometheus.yml >"$scratch/prometheus.yml"
promtool check config "$scratch/prometheus.yml"
python3 tests/cluster/validate_deploy.py

echo "--- three nodes behind HAProxy"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
# The test starts its own Redis on a free port (it restarts it) with its own key prefix.
# --workspace with a target filter, not -p: the build `cargo test --workspace` made (one -p
# would leave out other members' dev-dependency features and compile most crates again).
SIGNALLING_CLUSTER_TEST=1 cargo test --workspace --test api cluster:: -- --ignored --nocapture

echo "--- a forged offer on the cluster bus never moves the robot (session tickets)"
REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}" SIGNALLING_CLUSTER_TEST=1 \
    cargo test --workspace --test tickets_bus -- --ignored --nocapture
