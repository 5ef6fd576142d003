# Sourced by the browser test runners (run.sh, sdpmid.sh) with HERE set to
# this directory: installs Debian chromium and the npm packages when they are
# missing, and checks the tools the runners use.
if [ ! -x /usr/bin/chromium ]; then
    echo "installing chromium (apt)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
for tool in node npm python3 unshare ip; do
    command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
done
if [ ! -d "$HERE/node_modules/playwright-core" ] || [ ! -d "$HERE/node_modules/ajv-formats" ]; then
    echo "installing npm packages"
    (cd "$HERE" && if [ -f package-lock.json ]; then npm ci --no-audit --no-fund --loglevel=error; else npm install --no-audit --no-fund --loglevel=error; fi)
fi
