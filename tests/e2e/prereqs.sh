# Sourced by the stand-alone browser test runners (sdpmid.sh, legacy.sh): installs Debian
# chromium and the npm packages when missing, checks the tools, and builds the binaries
# unless E2E_SKIP_BUILD=1 (see lib.sh).
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_prepare unshare ip
