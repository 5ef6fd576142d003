//! Startup (database, admin token, identity), serving plain or TLS, and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};

use crate::admission::Admission;
use crate::http_serve;
use crate::lean_io::LeanAcceptor;

use crate::auth::{random_token, sha256_hex, ClientAuthenticator, JwtConfig, JwtVerifier};
use crate::cluster::ClusterConfig;
use crate::config::Config;
use crate::delivery::Kick;
use crate::ice::IceConfig;
use crate::identity::{Identity, IdentityConfig};
use crate::metrics::Metrics;
use crate::pki::{CertificateAuthority, SigningKeys, TrustStore};
use crate::relay::{self, LoginCheck, Router};
use crate::state::{AppState, Components, SharedState};
use crate::store::{AuditLog, Store, StoreError};
use crate::tasks::{self, Tasks};
use crate::tickets::Tickets;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("database: {0}")]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("JWT configuration: {0}")]
    Jwt(#[from] crate::auth::JwtError),
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("--redis-url needs a database all nodes share: a postgres:// --database-url")]
    ClusterNeedsSharedDatabase,
    #[error("--redis-url: {0}")]
    Cluster(#[from] crate::cluster::ClusterError),
    #[error("--admin-token (SIGNALLING_ADMIN_TOKEN) must be at least {MIN_ADMIN_TOKEN_LEN} characters; leave it unset to have one generated")]
    WeakAdminToken,
    #[error("CRL: {0}")]
    Crl(#[from] crate::tasks::crl::CrlError),
    #[error("signing key: {0}")]
    SigningKey(#[from] crate::pki::SigningKeyError),
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
}

const ADMIN_TOKEN_SETTING: &str = "admin_token_sha256";

pub struct Server {
    state: SharedState,
    listener: TcpListener,
    tasks: Tasks,
}

fn read_file(path: &Path) -> Result<Vec<u8>, StartError> {
    std::fs::read(path).map_err(|e| StartError::File {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// Where the generated signing key is kept when no --signing-key-file is given.
const SIGNING_KEY_SETTING: &str = "signing_key_pkcs8_pem";

/// The deployment's signing key: --signing-key-file, else one generated at first start and
/// kept in the database, which every node of a cluster shares (and which already decides
/// every grant, so it is trusted with no more than before; docs/security.md).
async fn signing_keys(config: &Config, store: &Store) -> Result<SigningKeys, StartError> {
    let keys = match &config.signing_key_file {
        Some(path) => SigningKeys::load(path)?,
        None => {
            let stored = match store.setting(SIGNING_KEY_SETTING).await? {
                Some(pem) => pem,
                None => {
                    let fresh = SigningKeys::generate_pem()?;
                    // Nodes starting together agree on the first one stored.
                    let stored = store
                        .setting_insert_once(SIGNING_KEY_SETTING, &fresh)
                        .await?;
                    if stored == fresh {
                        tracing::warn!("generated the signing key of session tickets; it is kept in the database (set --signing-key-file to keep it elsewhere)");
                    }
                    stored
                }
            };
            SigningKeys::from_pkcs8_pem(stored.as_bytes(), Path::new("(database)"))?
        }
    };
    let keys = match &config.signing_key_previous_file {
        Some(path) => keys.with_previous(path)?,
        None => keys,
    };
    tracing::info!(kid = %keys.kid(), "session tickets signed");
    Ok(keys)
}

/// Robot login: the trust anchors and our own CA, if configured.
fn build_identity(config: &Config, store: &Store) -> Result<Identity, StartError> {
    let trust = match &config.trust_anchors {
        Some(path) => {
            Some(TrustStore::from_pem(&read_file(path)?).map_err(|e| file_error(path, e))?)
        }
        None => None,
    };
    let ca = match (&config.ca_cert, &config.ca_key) {
        (Some(cert), Some(key)) => {
            let cert_pem = String::from_utf8(read_file(cert)?).map_err(|e| file_error(cert, e))?;
            let key_pem = String::from_utf8(read_file(key)?).map_err(|e| file_error(key, e))?;
            Some(
                CertificateAuthority::from_pem(&cert_pem, &key_pem)
                    .map_err(|e| file_error(cert, e))?,
            )
        }
        _ => None,
    };
    Identity::new(
        store.clone(),
        IdentityConfig {
            challenge_ttl: config.challenge_ttl(),
            trust,
            ca,
            auto_register: config.auto_register,
            cert_lifetime: Duration::from_secs(u64::from(config.cert_lifetime_days) * 86_400),
        },
    )
    .map_err(|e| StartError::File {
        path: "--ca-cert".into(),
        message: e.to_string(),
    })
}

/// How the relay reaches sockets: this node's alone, or the other nodes' too through Redis
/// (`--redis-url`).
fn router(config: &Config, node_id: &str, metrics: &Metrics) -> Result<Router, StartError> {
    let Some(url) = &config.redis_url else {
        return Ok(Router::local());
    };
    Ok(Router::clustered(
        ClusterConfig {
            url: url.clone(),
            prefix: config.redis_prefix.clone(),
            node_id: node_id.to_string(),
            node_ttl: Duration::from_secs(config.node_ttl_secs.max(1)),
            lock_ttl: Duration::from_secs(config.lock_ttl_secs.max(1)),
        },
        metrics,
    )?)
}

/// The background work of a node: the cluster's writer, listener and heartbeat, the end of
/// sessions not resumed in time, and the CRL watcher.
async fn spawn_background(state: &SharedState, tasks: &mut Tasks) -> Result<(), StartError> {
    let logins: Arc<dyn LoginCheck> = state.clone();
    for worker in relay::workers(&state.presence, &state.sessions, logins) {
        tasks.spawn(worker.name, worker.run);
    }
    let renewing = state.clone();
    let every = std::time::Duration::from_secs(state.config.ticket_renew_secs);
    tasks.spawn("ticket-renew", move |stop| {
        tasks::tickets::renew(renewing, every, stop)
    });
    if state.config.session_resume_secs > 0 {
        let window = std::time::Duration::from_secs(state.config.session_resume_secs);
        let expiring = state.clone();
        tasks.spawn("session-resume", move |stop| {
            tasks::resume::expire(expiring, window, stop)
        });
    }
    if let Some(path) = state.config.crl.clone() {
        let modified = tasks::crl::load_at_start(state, &path).await?;
        let watched = state.clone();
        tasks.spawn("crl-watch", move |stop| {
            tasks::crl::watch(watched, path, modified, stop)
        });
    }
    Ok(())
}

fn file_error(path: &Path, e: impl std::fmt::Display) -> StartError {
    StartError::File {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// The JWT verifier, when a secret or a JWKS is configured.
async fn jwt_verifier(config: &Config) -> Result<Option<Arc<JwtVerifier>>, StartError> {
    let jwt_config = JwtConfig {
        secret: config.jwt_secret.clone(),
        jwks_url: config.jwks_url.clone(),
        jwks_file: config.jwks_file.clone(),
        issuer: config.jwt_issuer.clone(),
        audience: config.jwt_audience.clone(),
    };
    if !jwt_config.enabled() {
        return Ok(None);
    }
    Ok(Some(Arc::new(JwtVerifier::new(jwt_config).await?)))
}

fn ice_config(config: &Config) -> IceConfig {
    IceConfig {
        stun_urls: config.stun_urls.clone(),
        turn_urls: config.turn_urls.clone(),
        turn_secret: config.turn_secret.clone(),
        turn_ttl_secs: config.turn_ttl,
    }
}

impl Server {
    /// Connects to the database, prepares every component and binds the listener.
    pub async fn bind(config: Config) -> Result<Server, StartError> {
        crate::ws::release_idle_buffers();
        if config.redis_url.is_some() && !config.database_url().starts_with("postgres") {
            return Err(StartError::ClusterNeedsSharedDatabase);
        }
        let store = Store::connect(config.database_url()).await?;
        let node_id = config
            .node_id
            .clone()
            .unwrap_or_else(|| format!("node-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]));
        let admin_token_hash = admin_token_hash(&config, &store).await?;

        let jwt = jwt_verifier(&config).await?;
        let mut tasks = Tasks::default();
        if let Some(verifier) = jwt.clone().filter(|v| v.has_jwks_url()) {
            tasks.spawn("jwks-refresh", |stop| tasks::jwks::refresh(verifier, stop));
        }

        let identity = build_identity(&config, &store)?;
        let mut tickets = Tickets::new(signing_keys(&config, &store).await?, node_id.clone());
        if !config.session_tickets {
            tracing::warn!(
                "--session-tickets false: robots that require tickets refuse everything"
            );
            tickets = tickets.unsigned();
        }

        let metrics = Metrics::new();
        let router = router(&config, &node_id, &metrics)?;
        let ice = ice_config(&config);
        let clients = ClientAuthenticator::new(store.clone(), jwt);

        let ended = store.end_open_sessions(&node_id, "server_restart").await?;
        if ended > 0 {
            tracing::warn!(
                ended,
                "ended session records left open by an earlier run of this node"
            );
        }

        let listener = listen(config.listen).map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
        let (audit, audit_writer) =
            AuditLog::new(store.clone(), config.audit_spill_file(), metrics.clone());
        tasks.spawn("audit-writer", move |stop| audit_writer.run(stop));
        let late = store.clone();
        tasks.spawn("late-session-ends", move |stop| late.retry_late_ends(stop));
        let state = Arc::new(AppState::new(Components {
            config,
            node_id,
            store,
            metrics,
            audit,
            clients,
            identity,
            ice,
            tickets,
            admin_token_hash,
            router,
        }));
        spawn_background(&state, &mut tasks).await?;
        Ok(Server {
            state,
            listener,
            tasks,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn state(&self) -> SharedState {
        self.state.clone()
    }

    /// Serves until `shutdown` completes, then closes every socket (telling session peers),
    /// ends open session records and returns.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartError> {
        let state = self.state.clone();
        let addr = self.local_addr()?;
        let tasks = self.tasks;
        let app = crate::app::router(state.clone());
        let drain_state = state.clone();
        let drain = async move {
            shutdown.await;
            drain(&drain_state).await;
        };

        let header_timeout = Duration::from_secs(state.config.header_read_timeout_secs.max(1));
        let deadlines = http_serve::Deadlines {
            header: header_timeout,
            body: Duration::from_secs(state.config.body_read_timeout_secs.max(1)),
        };
        let (max_tcp, max_tcp_per_source) = state.config.tcp_connection_limits();
        tracing::info!(
            max_tcp_connections = max_tcp,
            max_tcp_connections_per_ip = max_tcp_per_source,
            asked_per_ip = state.config.max_tcp_connections_per_ip,
            "TCP connection limits (0: none)"
        );
        let tcp = LeanAcceptor::new(Admission::new(max_tcp, max_tcp_per_source));
        match (&state.config.tls_cert, &state.config.tls_key) {
            (Some(cert), Some(key)) => {
                let tls = axum_server::tls_rustls::RustlsConfig::from_pem_file(cert, key)
                    .await
                    .map_err(|e| StartError::Tls(e.to_string()))?;
                tracing::info!(%addr, node = %state.node_id, "listening (TLS)");
                let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(tls)
                    .handshake_timeout(header_timeout)
                    .acceptor(tcp);
                http_serve::serve(self.listener, acceptor, app, deadlines, drain).await;
            }
            _ => {
                tracing::info!(%addr, node = %state.node_id, "listening");
                http_serve::serve(self.listener, tcp, app, deadlines, drain).await;
            }
        }
        tasks.stop().await;
        state.store.close().await;
        Ok(())
    }
}

async fn drain(state: &SharedState) {
    state.begin_shutdown();
    // Peers stop routing new sessions here; what is open ends below, each end told.
    state.sessions.leave_peers().await;
    state.sessions.end_all().await;
    let sockets = state.presence.close_all(Kick::Shutdown);
    tracing::info!(sockets, "shutting down: closing sockets");
    let grace = Duration::from_secs(state.config.shutdown_grace_secs);
    if tokio::time::timeout(grace, state.sockets_drained())
        .await
        .is_err()
    {
        tracing::warn!("some sockets did not close within the grace period");
    }
    // Ends the database refused earlier keep their own reason if it takes them now.
    let late = state.store.write_late_ends().await;
    if late > 0 {
        tracing::error!(late, "session ends the database still refuses: swept below");
    }
    match state
        .store
        .end_open_sessions(&state.node_id, "server_shutdown")
        .await
    {
        Ok(n) if n > 0 => tracing::info!(ended = n, "ended session records"),
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "cannot end session records"),
    }
}

/// Shortest admin token accepted: guessing it must be out of reach.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

async fn admin_token_hash(config: &Config, store: &Store) -> Result<String, StartError> {
    if let Some(token) = &config.admin_token {
        // An empty or short token is a mistake (an unset variable, a placeholder), never
        // a choice: refuse to start rather than serve an unusable or guessable admin API.
        if token.trim().len() < MIN_ADMIN_TOKEN_LEN {
            return Err(StartError::WeakAdminToken);
        }
        return Ok(sha256_hex(token.as_bytes()));
    }
    if let Some(hash) = store.setting(ADMIN_TOKEN_SETTING).await? {
        tracing::info!(
            "admin token: using the one generated at first start (set --admin-token to choose one)"
        );
        return Ok(hash);
    }
    let token = random_token("sat_");
    let stored = store
        .setting_insert_once(ADMIN_TOKEN_SETTING, &sha256_hex(token.as_bytes()))
        .await?;
    if stored == sha256_hex(token.as_bytes()) {
        tracing::warn!(admin_token = %token, "generated the admin token; it is shown only this once");
    }
    Ok(stored)
}

/// Connections the kernel completes for us before we accept them. A fleet reconnecting
/// after an outage arrives at once; when this queue is full the kernel drops the
/// handshake's last step and the robot waits a second for its retransmission (tokio's
/// default of 1024 overflowed in the registration storm). The kernel caps it at
/// `net.core.somaxconn`.
const LISTEN_BACKLOG: u32 = 4096;

fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restarted node binds while old connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}
