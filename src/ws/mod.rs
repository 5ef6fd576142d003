//! The `/ws` endpoint: authentication at upgrade, the per-socket loop, and the signalling
//! protocol spoken on it.

pub(crate) mod connection;
mod error;
pub mod heartbeat;
pub(crate) mod in_process;
mod legacy;
mod protocol;
mod signalling;
mod writer;

use axum::extract::ws::WebSocketUpgrade;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;

use crate::auth::AuthError;
use crate::state::SharedState;

use crate::admission::{AdmissionError, Permit};
use crate::auth::ClientIdentity;
use crate::relay::ConnId;
use connection::Opening;
pub use error::WsError;

/// Bytes of frames a socket gathers before writing, within one batch of the writer.
const WRITE_GATHER: usize = 16 * 1024;

/// The WebSocket layer's read size while no frame is under way (the rest of a frame's bytes
/// are asked for in one read); the bytes come from the lean stream's chunk, so a small size
/// costs copies, not syscalls, and an idle socket holds no buffer at all.
const READ_BUFFER: usize = 512;

/// Most sockets are idle robots: their WebSocket buffers are freed between bursts instead of
/// staying at the size of the largest message read or written (vendor/tungstenite,
/// PATCHES.md). A process-wide switch of the patched codec, set once as the server starts.
pub fn release_idle_buffers() {
    tungstenite::protocol::frame::release_idle_buffers(true);
}

/// The `/ws` route, merged into the app at the top.
pub fn router() -> Router<SharedState> {
    Router::new().route("/ws", get(upgrade))
}

/// Why an upgrade is refused, answered as plain HTTP before any socket exists.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("server is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    Auth(#[from] AuthError),
    #[error("{0}")]
    Admission(#[from] AdmissionError),
}

impl IntoResponse for UpgradeError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            UpgradeError::ShuttingDown | UpgradeError::Admission(AdmissionError::ServerFull) => {
                (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE")
            }
            UpgradeError::Admission(AdmissionError::AddressFull) => {
                (StatusCode::TOO_MANY_REQUESTS, "TOO_MANY_REQUESTS")
            }
            UpgradeError::Auth(AuthError::Store(e)) => {
                tracing::error!(error = %e, "client login failed");
                return crate::http_error::response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "INTERNAL_ERROR",
                    "internal error",
                );
            }
            UpgradeError::Auth(_) => (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"),
        };
        crate::http_error::response(status, code, &self.to_string())
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct WsQuery {
    token: Option<String>,
}

/// Prefix of the subprotocol that carries a bearer token (browsers cannot set headers).
const BEARER_PROTOCOL: &str = "bearer.";

/// Where the client put its token, if anywhere.
fn find_token(query: &WsQuery, headers: &HeaderMap) -> (Option<String>, Option<String>) {
    if let Some(token) = query.token.as_deref().filter(|t| !t.is_empty()) {
        return (Some(token.to_string()), None);
    }
    if let Some(token) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return (Some(token.trim().to_string()), None);
    }
    let protocol = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find(|p| p.starts_with(BEARER_PROTOCOL));
    match protocol {
        Some(p) => (
            Some(p[BEARER_PROTOCOL.len()..].to_string()),
            Some(p.to_string()),
        ),
        None => (None, None),
    }
}

/// What every socket's upgrade has passed before the socket exists: the server is not
/// shutting down, there is room for the socket (its permit), and the client's token, if it
/// gave one, is valid.
pub(crate) struct Admitted {
    pub permit: Permit,
    pub client: Option<ClientIdentity>,
    /// The hub's count of access cuts, read before the token check.
    pub cuts_seen: u64,
    /// The bearer subprotocol the client offered, to be echoed.
    protocol: Option<String>,
}

/// The checks every socket's upgrade makes, `/ws` and the ARP gateway alike; with
/// `token_required`, a socket without a token is refused (401).
pub(crate) async fn admit(
    state: &SharedState,
    peer: SocketAddr,
    query: &WsQuery,
    headers: &HeaderMap,
    token_required: bool,
) -> Result<Admitted, Response> {
    if state.is_shutting_down() {
        return Err(UpgradeError::ShuttingDown.into_response());
    }
    let permit = state.admission.admit(peer.ip()).map_err(|e| {
        tracing::debug!(%peer, error = %e, "connection refused");
        UpgradeError::from(e).into_response()
    })?;
    let (token, protocol) = find_token(query, headers);
    if token.is_none() && token_required {
        return Err(crate::http_error::response(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "a client token is required (Authorization: Bearer or ?token=)",
        ));
    }
    // Read before the token check: see `Presence::set_client`.
    let cuts_seen = state.presence.access_cuts();
    let client = match token {
        Some(token) => match state
            .clients
            .authenticate(&token, crate::store::now_ms())
            .await
        {
            Ok(identity) => Some(identity),
            Err(e) => {
                tracing::info!(error = %e, "client login refused");
                return Err(UpgradeError::from(e).into_response());
            }
        },
        None => None,
    };
    Ok(Admitted {
        permit,
        client,
        cuts_seen,
        protocol,
    })
}

impl Admitted {
    /// The upgrade with the socket's limits: past `hard_limit` a frame is not even read.
    /// Small buffers: most sockets sit idle, and tungstenite's 128 KiB defaults would cost
    /// that much per connection. Its reads are small, served from a chunk the socket holds
    /// only while busy (`lean_io`), so one system call still reads a burst. Writes gather
    /// up to WRITE_GATHER bytes and the writer flushes once per batch, so a busy socket
    /// makes one send for many frames.
    pub(crate) fn upgrade(&mut self, ws: WebSocketUpgrade, hard_limit: usize) -> WebSocketUpgrade {
        let ws = ws
            .max_message_size(hard_limit)
            .max_frame_size(hard_limit)
            .read_buffer_size(READ_BUFFER)
            .write_buffer_size(WRITE_GATHER);
        match self.protocol.take() {
            Some(protocol) => ws.protocols([protocol]),
            None => ws,
        }
    }

    /// The socket, for the connection runtime.
    pub(crate) fn opening(self, conn: ConnId) -> Opening {
        Opening {
            conn,
            client: self.client,
            cuts_seen: self.cuts_seen,
            permit: self.permit,
        }
    }
}

async fn upgrade(
    State(state): State<SharedState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Query(query): Query<WsQuery>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let mut admitted = match admit(&state, peer, &query, &headers, false).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    // The protocol limit is checked on whole messages in the socket loop, so an oversized
    // message is read completely and refused with a clean close. The transport limit above
    // it only stops abuse: past it the frame is not even read.
    let hard_limit = state.config.max_frame_bytes.saturating_mul(4);
    let ws = admitted.upgrade(ws, hard_limit);
    ws.on_upgrade(move |socket| {
        let conn: ConnId = Arc::from(uuid::Uuid::new_v4().to_string());
        // Every line logged for this socket, here and below, carries its id.
        let span = tracing::info_span!("ws", conn = %conn);
        let opening = admitted.opening(conn);
        connection::start(state, socket, opening, span, signalling::Signalling::new);
        std::future::ready(())
    })
}
