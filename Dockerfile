# Multi-stage build of signalling-server: a full Rust toolchain to build; the image itself
# holds only the binary, the C libraries it links (from the build stage's Debian) and a
# non-root user: no shell, no package manager. Data (the default SQLite database) lives in
# /var/lib/signalling: mount a volume there.
# CI builds this file unchanged and runs the image (tests/docker/run.sh, docs/deployment.md).

FROM rust:1.95-slim-bookworm AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# 1. Dependencies, in layers of their own: the manifests, the lockfile and the patched crates,
#    with empty sources in place of ours. Only a change to those builds them again.
COPY Cargo.toml Cargo.lock ./
COPY crates/protocol/Cargo.toml crates/protocol/
COPY crates/robot-agent/Cargo.toml crates/robot-agent/
COPY crates/bench/Cargo.toml crates/bench/
COPY crates/arp-bridge/Cargo.toml crates/arp-bridge/
COPY crates/agent-server-tests/Cargo.toml crates/agent-server-tests/
# Patched dependencies ([patch.crates-io] in Cargo.toml).
COPY vendor ./vendor
# Every member needs a source to load the workspace; only the server's are compiled. The
# stubs' own artifacts go again, so the real sources below are always compiled afresh.
RUN for member in . crates/protocol crates/robot-agent crates/bench crates/arp-bridge \
        crates/agent-server-tests; do \
        mkdir -p "$member/src" && touch "$member/src/lib.rs"; \
    done \
    && for member in . crates/robot-agent crates/bench crates/arp-bridge; do \
        echo 'fn main() {}' >"$member/src/main.rs"; \
    done \
    && cargo build --profile dist --locked -p signalling-server --bin signalling-server \
    && cargo clean --profile dist -p signalling-server -p signalling-protocol -p arp-bridge
# 2. The server: its crate, the protocol crate and arp-bridge (whose MCP mapping the remote
#    MCP endpoint runs), the migrations and the browser SDK it embeds (built and committed
#    in clients/js/dist). The other members keep their stubs.
COPY crates/protocol ./crates/protocol
COPY crates/arp-bridge ./crates/arp-bridge
COPY src ./src
COPY migrations ./migrations
COPY clients/js/dist ./clients/js/dist
# 3. The image's file tree: the binary, the shared libraries it names (ldd: libc, libm,
#    libgcc_s and the loader, whatever the architecture), the user and its data folder.
#    The server's HTTPS client carries its own root certificates (webpki-roots).
RUN cargo build --profile dist --locked -p signalling-server --bin signalling-server \
    && mkdir -p /rootfs/usr/local/bin /rootfs/etc /rootfs/var/lib/signalling /rootfs/tmp \
    && cp target/dist/signalling-server /rootfs/usr/local/bin/ \
    && ldd target/dist/signalling-server \
        | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' \
        | xargs -I{} cp --parents -L {} /rootfs/ \
    && printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nsignalling:x:10001:10001::/var/lib/signalling:/usr/sbin/nologin\n' >/rootfs/etc/passwd \
    && printf 'root:x:0:\nsignalling:x:10001:\n' >/rootfs/etc/group \
    && printf 'passwd: files\ngroup: files\nhosts: files dns\n' >/rootfs/etc/nsswitch.conf \
    && chown 10001:10001 /rootfs/var/lib/signalling \
    && chmod 1777 /rootfs/tmp

FROM scratch
COPY --from=build /rootfs/ /
USER 10001:10001
WORKDIR /var/lib/signalling
ENV SIGNALLING_LISTEN=0.0.0.0:8080 \
    SIGNALLING_LOG_FORMAT=json
EXPOSE 8080
# The binary asks itself (GET /readyz on SIGNALLING_LISTEN's port): no curl in the image.
# Set the port with SIGNALLING_LISTEN, not --listen, so that the check finds it.
HEALTHCHECK --interval=10s --timeout=5s --start-period=15s --retries=3 \
    CMD ["/usr/local/bin/signalling-server", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/signalling-server"]
