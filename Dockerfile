# Multi-stage build of signalling-server: a full Rust toolchain to build, a slim Debian
# runtime with only the binary, CA certificates (for JWKS over HTTPS) and a non-root user.
# Data (the default SQLite database) lives in /var/lib/signalling: mount a volume there.
# CI builds this file unchanged and runs the image (tests/docker/run.sh, docs/deployment.md).

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
# Patched dependencies ([patch.crates-io] in Cargo.toml).
COPY vendor ./vendor
COPY src ./src
COPY migrations ./migrations
# The browser SDK the server embeds (built and committed in clients/js/dist).
COPY clients/js/dist ./clients/js/dist
RUN cargo build --release --locked -p signalling-server --bin signalling-server \
    && strip target/release/signalling-server

FROM debian:bookworm-slim
# ca-certificates follows Debian's security updates; pinning it would only delay them.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 signalling \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /var/lib/signalling signalling
COPY --from=build /src/target/release/signalling-server /usr/local/bin/signalling-server
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
