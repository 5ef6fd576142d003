//! What every request handler and socket shares.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::admission::Admission;
use crate::auth::ClientAuthenticator;
use crate::config::Config;
use crate::ice::IceConfig;
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::relay::{self, HubLimits, LoggedInWith, LoginCheck, Presence, Router, Sessions};
use crate::store::{AuditLog, Store, StoreError};
use crate::tickets::Tickets;

pub struct AppState {
    pub config: Config,
    pub node_id: String,
    pub store: Store,
    /// Sockets and robots online here, and closing them (the relay's first door).
    pub presence: Presence,
    /// A session's life and its messages (the relay's second door).
    pub sessions: Sessions,
    pub metrics: Metrics,
    /// What programs did to robots, on record (the ARP gateway, e-stops).
    pub audit: AuditLog,
    pub clients: ClientAuthenticator,
    pub identity: Identity,
    pub ice: IceConfig,
    /// The deployment's signing key: session tickets for robots.
    pub tickets: Tickets,
    /// SHA-256 (hex) of the admin bearer token.
    pub admin_token_hash: String,
    /// Limits on open sockets, in all and per source address.
    pub admission: Admission,
    shutting_down: AtomicBool,
    open_sockets: AtomicUsize,
    sockets_closed: Notify,
}

pub type SharedState = Arc<AppState>;

/// The parts an [`AppState`] is made of, prepared by the server at start.
pub struct Components {
    pub config: Config,
    pub node_id: String,
    pub store: Store,
    pub metrics: Metrics,
    pub audit: AuditLog,
    pub clients: ClientAuthenticator,
    pub identity: Identity,
    pub ice: IceConfig,
    pub tickets: Tickets,
    pub admin_token_hash: String,
    /// How the relay reaches sockets: this node's alone, or the other nodes' too (with
    /// `--redis-url`).
    pub router: Router,
}

impl AppState {
    /// Builds the shared state; the relay's two doors are made here, over one hub.
    pub fn new(parts: Components) -> AppState {
        let limits = HubLimits {
            sessions_per_conn: parts.config.max_sessions_per_connection,
            grace: Duration::from_secs(parts.config.session_grace_secs),
            resume: Duration::from_secs(parts.config.session_resume_secs),
            viewers_per_subject: parts.config.max_viewer_sessions_per_subject,
            viewers_per_robot: parts.config.max_viewer_sessions_per_robot,
        };
        let (presence, sessions) = relay::build(
            limits,
            parts.metrics.clone(),
            parts.router,
            parts.store.clone(),
            parts.node_id.clone(),
        );
        let admission = Admission::new(
            parts.config.max_connections,
            parts.config.max_connections_per_ip,
        );
        AppState {
            admission,
            config: parts.config,
            node_id: parts.node_id,
            store: parts.store,
            presence,
            sessions,
            metrics: parts.metrics,
            audit: parts.audit,
            clients: parts.clients,
            identity: parts.identity,
            ice: parts.ice,
            tickets: parts.tickets,
            admin_token_hash: parts.admin_token_hash,
            shutting_down: AtomicBool::new(false),
            open_sockets: AtomicUsize::new(0),
            sockets_closed: Notify::new(),
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Counts a socket task until the guard drops, so shutdown can wait for all of them.
    pub fn socket_guard(self: &Arc<Self>) -> SocketGuard {
        self.open_sockets.fetch_add(1, Ordering::SeqCst);
        SocketGuard {
            state: Arc::clone(self),
        }
    }

    /// Waits until every socket task has finished its cleanup.
    pub async fn sockets_drained(&self) {
        loop {
            let notified = self.sockets_closed.notified();
            if self.open_sockets.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// After a lapse of the cluster bus, the relay checks its sockets' logins again here: robot
/// credentials through identity, client tokens in the store.
impl LoginCheck for AppState {
    fn still_stands<'a>(
        &'a self,
        login: &'a LoggedInWith,
    ) -> Pin<Box<dyn Future<Output = Result<bool, StoreError>> + Send + 'a>> {
        Box::pin(async move {
            match login {
                LoggedInWith::Robot {
                    robot_id,
                    credentials,
                } => {
                    self.identity
                        .login_still_stands(robot_id, credentials)
                        .await
                }
                LoggedInWith::Token(token_id) => {
                    Ok(!self.store.client_token_withdrawn(token_id).await?)
                }
            }
        })
    }
}

pub struct SocketGuard {
    state: SharedState,
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        if self.state.open_sockets.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.state.sockets_closed.notify_waiters();
        }
    }
}
