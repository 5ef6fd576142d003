# Shared setup of the end-to-end scripts (run.sh, outage.sh): installs what
# they need (Debian chromium, npm packages) and builds the two binaries.
# Source it; it defines HERE, ROOT and E2E_BIN_DIR.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

e2e_prepare() {
    if [ ! -x /usr/bin/chromium ]; then
        echo "installing chromium (apt)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
    for tool in node npm python3 "$@"; do
        command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
    done
    if [ ! -d "$HERE/node_modules/playwright-core" ] || [ ! -d "$HERE/node_modules/ajv-formats" ]; then
        echo "installing npm packages"
        (cd "$HERE" && if [ -f package-lock.json ]; then npm ci --no-audit --no-fund --loglevel=error; else npm install --no-audit --no-fund --loglevel=error; fi)
    fi
    if [ "${E2E_SKIP_BUILD:-0}" != 1 ]; then
        # The build `cargo test --workspace` makes (its binaries included): `cargo build`
        # alone leaves out the dev-dependencies' features and would compile most of the
        # dependencies a second time.
        echo "building signalling-server and robot-agent (cargo test --workspace --no-run)"
        (cd "$ROOT" && cargo test --workspace --no-run)
    fi
    export E2E_BIN_DIR="${E2E_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/debug}"
}
