#!/usr/bin/env bash
# Local stand-ins for the Dockerfile's FROM images, under their real names (no image
# registry is reachable here). Source it after docker answers; then call
#   standin_debian        debian:bookworm-slim, from mmdebstrap --variant=minbase
#   standin_rust NAME     NAME (the build stage's FROM), that rootfs + this machine's Rust
#                         toolchain (as rustup installed it) + Debian's gcc and libc6-dev
# Both are kept between runs (labelled as stand-ins); DOCKER_REFRESH_BASE=1 makes them anew.
# Nothing here names a machine or architecture: the host's own are used.

STANDIN_LABEL=io.signalling.ci-standin

# True when the image exists and is one of ours, made from the same inputs (a digest of
# the inputs is kept in a label). A real image pulled under the same name is left alone.
standin_fresh() {
    local image=$1 inputs=$2 got
    [ "${DOCKER_REFRESH_BASE:-0}" = 1 ] && return 1
    got=$(docker image inspect -f "{{ index .Config.Labels \"$STANDIN_LABEL\" }}" "$image" 2>/dev/null) || return 1
    [ "$got" = "$inputs" ] || [ "$got" = "<no value>" ]
}

standin_debian() {
    local image=debian:bookworm-slim
    local inputs
    inputs="debian-minbase-v2-$(dpkg --print-architecture)"
    if standin_fresh "$image" "$inputs"; then
        echo "stand-in $image: present"
        return
    fi
    echo "stand-in $image: mmdebstrap --variant=minbase bookworm | docker import"
    # The mirrors this machine uses (its own sources file, when it has one), merged /usr
    # without the usrmerge package, and the official slim image's path excludes (no man
    # pages, docs but copyright files, locales): close to what `debian:bookworm-slim` holds.
    # The official image's apt settings too (debuerreotype's): no package caches kept (80 MB
    # of pkgcache.bin/srcpkgcache.bin in every layer that runs apt-get otherwise), gzipped
    # indexes, no translations.
    local mirror=() config
    [ -f /etc/apt/sources.list.d/debian.sources ] && mirror=(/etc/apt/sources.list.d/debian.sources)
    config=$(mktemp -d)
    cat >"$config/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$config/docker-autoremove-suggests"
    echo 'Acquire::GzipIndexes "true";' >"$config/docker-gzip-indexes"
    echo 'Acquire::Languages "none";' >"$config/docker-no-languages"
    mmdebstrap --variant=minbase --quiet \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --customize-hook="copy-in $config/docker-clean $config/docker-autoremove-suggests $config/docker-gzip-indexes $config/docker-no-languages /etc/apt/apt.conf.d" \
        --customize-hook='rm -f "$1"/var/cache/apt/*.bin' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-include=/usr/share/locale/locale.alias' \
        --dpkgopt='path-exclude=/usr/share/lintian/*' \
        bookworm - "${mirror[@]}" 2>"${STANDIN_LOG:-/dev/null}" |
        docker import \
            --change 'CMD ["bash"]' \
            --change "LABEL $STANDIN_LABEL=$inputs" \
            - "$image" >/dev/null
    rm -rf "$config"
}

# $1: the image name the Dockerfile's build stage uses, e.g. rust:1.95-slim-bookworm.
standin_rust() {
    local image=$1 want host_version host_triple toolchain inputs
    want=$(sed -n 's/^rust:\([0-9][0-9.]*\).*/\1/p' <<<"$image")
    host_version=$(rustc --version | awk '{print $2}')
    host_triple=$(rustc -vV | sed -n 's/^host: //p')
    case "$host_version" in
        "$want" | "$want".*) ;;
        *)
            echo "the Dockerfile builds with $image, this machine has Rust $host_version: no honest stand-in" >&2
            return 1
            ;;
    esac
    toolchain="$(rustc --print sysroot)"
    inputs="rust-$host_version-$host_triple-$(docker image inspect -f '{{.Id}}' debian:bookworm-slim | cut -c8-19)-$(sha256sum /etc/ssl/certs/ca-certificates.crt | cut -c1-12)"
    if standin_fresh "$image" "$inputs"; then
        echo "stand-in $image: present"
        return
    fi
    echo "stand-in $image: debian:bookworm-slim + Rust $host_version ($host_triple) + gcc"
    local context
    context=$(mktemp -d)
    # The official image's layout: RUSTUP_HOME=/usr/local/rustup, CARGO_HOME=/usr/local/cargo,
    # rustup's proxies on PATH, a default toolchain named by its version.
    ln -s "$toolchain" "$context/toolchain"
    cp "$(command -v rustup)" "$context/rustup"
    # The machine's CA bundle, in the build stand-in only: cargo's downloads inside the
    # build see the same TLS chain as the host's.
    cp /etc/ssl/certs/ca-certificates.crt "$context/ca-certificates.crt"
    cat >"$context/Dockerfile" <<EOF
FROM debian:bookworm-slim
RUN apt-get update \\
    && apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev \\
    && rm -rf /var/lib/apt/lists/*
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV RUSTUP_HOME=/usr/local/rustup \\
    CARGO_HOME=/usr/local/cargo \\
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    RUST_VERSION=$host_version
COPY toolchain /usr/local/rustup/toolchains/$host_version-$host_triple
COPY rustup /usr/local/cargo/bin/rustup
RUN printf 'version = "12"\\ndefault_toolchain = "%s"\\nprofile = "minimal"\\nauto_self_update = "disable"\\n' \\
        "$host_version-$host_triple" >/usr/local/rustup/settings.toml \\
    && for tool in cargo rustc rustdoc rust-gdb rust-lldb rustfmt cargo-fmt cargo-clippy clippy-driver; do \\
        ln -s rustup "/usr/local/cargo/bin/\$tool"; done \\
    && chmod -R a+w /usr/local/rustup /usr/local/cargo \\
    && rustc --version && cargo --version && cc --version | head -n1
LABEL $STANDIN_LABEL=$inputs
EOF
    # -h: the toolchain goes in as files; its documentation (most of its size) stays out.
    # Host network: CI may make the stand-ins early with a daemon that has no bridge.
    tar -C "$context" -ch --exclude=toolchain/share/doc . |
        DOCKER_BUILDKIT=0 docker build -q --network host -t "$image" - >/dev/null
    rm -rf "$context"
}
