#!/usr/bin/env bash
# Every vendored crate equals its crates.io release but for the files its PATCHES.md lists
# under "Files that differ from the release". Fetches the release through cargo (the
# registry cache), compares file by file, and fails on any unlisted difference.
set -euo pipefail
cd "$(dirname "$0")"

check() {
    local name=$1 version=$2 dir=$3
    local scratch
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' RETURN
    mkdir -p "$scratch/src"
    touch "$scratch/src/lib.rs"
    cat >"$scratch/Cargo.toml" <<TOML
[package]
name = "vendor-check"
version = "0.0.0"
edition = "2021"
[dependencies]
$name = "=$version"
TOML
    (cd "$scratch" && cargo fetch --quiet)
    local release
    release=$(cd "$scratch" && cargo metadata --format-version 1 --quiet |
        python3 -c "import json, sys, os; m = json.load(sys.stdin); print(next(os.path.dirname(p['manifest_path']) for p in m['packages'] if p['name'] == '$name' and p['version'] == '$version'))")
    local allowed
    allowed=$(sed -n '/^## Files that differ from the release/,$p' "$dir/PATCHES.md" |
        sed -n 's/^- `\(.*\)`$/\1/p')
    local bad=0 file
    while IFS= read -r file; do
        if grep -qxF "$file" <<<"$allowed"; then
            continue
        fi
        if ! cmp -s "$dir/$file" "$release/$file"; then
            echo "vendor/$dir/$file differs from $name $version and is not listed in PATCHES.md"
            bad=1
        fi
    done < <(cd "$dir" && find . -type f | sed 's#^\./##' | sort)
    # A listed file must still differ: a stale list hides nothing, but says what is true.
    while IFS= read -r file; do
        [ -n "$file" ] || continue
        if [ -f "$release/$file" ] && cmp -s "$dir/$file" "$release/$file"; then
            echo "vendor/$dir/$file is listed as patched but equals the release"
            bad=1
        fi
    done <<<"$allowed"
    [ "$bad" = 0 ] && echo "vendor/$dir: equal to $name $version but for: $(echo $allowed)"
    return "$bad"
}

check tungstenite 0.29.0 tungstenite
