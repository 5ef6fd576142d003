//! `--arp-listen`: the ARP WebSocket for programs on the robot's own
//! computer. Every upgrade is checked before it completes, in this order:
//! a browser's `Origin` must be listed (`--arp-allow-origin`), else HTTP
//! 403, so a web page cannot drive the robot through the local socket;
//! the credential (`--arp-token ROLE:SECRET`, `Authorization: Bearer
//! SECRET` or `?token=SECRET`) must match, else HTTP 401; and a
//! connection slot must be free, else HTTP 503. With no token configured
//! (only with `--arp-no-token` on loopback, see [`crate::config`]) every
//! local program is an operator.
//!
//! A connection must finish its upgrade within [`HANDSHAKE_TIMEOUT`] of
//! being accepted, one address may hold [`MAX_PER_ADDRESS`] connections,
//! and the [`MAX_CONNECTIONS`] slots are taken only by authenticated
//! connections: silent sockets cannot lock the port.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use signalling_protocol::arp::MAX_FRAME_BYTES;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::{ArpServer, Peer, Token, FRAME_CHANNEL};
use crate::safety::Role;

#[derive(Debug, thiserror::Error)]
pub enum ArpListenError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Most concurrent authenticated connections; more are refused with 503
/// (the socket is for a few programs on the robot, not a server).
pub const MAX_CONNECTIONS: usize = 64;
/// Most connections still in their handshake; more are closed at once.
/// Together with the deadline this bounds the descriptors strangers hold.
pub const MAX_PENDING: usize = 128;
/// Most concurrent connections (in handshake or open) from one IP address.
pub const MAX_PER_ADDRESS: usize = 16;
/// From the TCP accept to the completed, authenticated upgrade.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A bound listener; [`ArpListener::run`] serves it.
pub struct ArpListener {
    listener: TcpListener,
    access: Arc<Access>,
    handshake_timeout: Duration,
}

/// Who may upgrade: the tokens and the browser origins allowed.
struct Access {
    tokens: Vec<Token>,
    /// Lower-case `scheme://host[:port]`, as browsers send them.
    origins: Vec<String>,
}

impl ArpListener {
    pub async fn bind(config: &super::ListenConfig) -> Result<ArpListener, ArpListenError> {
        let listener =
            TcpListener::bind(config.addr)
                .await
                .map_err(|source| ArpListenError::Bind {
                    addr: config.addr,
                    source,
                })?;
        Ok(ArpListener {
            listener,
            access: Arc::new(Access {
                tokens: config.tokens.clone(),
                origins: Vec::new(),
            }),
            handshake_timeout: HANDSHAKE_TIMEOUT,
        })
    }

    /// Browser origins allowed to connect (`--arp-allow-origin`); every
    /// other request carrying an `Origin` header gets 403.
    pub fn allow_origins(mut self, origins: &[String]) -> ArpListener {
        self.access = Arc::new(Access {
            tokens: self.access.tokens.clone(),
            origins: origins.iter().map(|o| normalise_origin(o)).collect(),
        });
        self
    }

    /// Replaces [`HANDSHAKE_TIMEOUT`] (tests use a short one).
    pub fn handshake_timeout(mut self, timeout: Duration) -> ArpListener {
        self.handshake_timeout = timeout;
        self
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts connections until the task is dropped.
    pub async fn run(self, server: ArpServer) {
        let counter = Arc::new(AtomicU64::new(1));
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let pending = Arc::new(Semaphore::new(MAX_PENDING));
        let per_address = Arc::new(Mutex::new(HashMap::new()));
        loop {
            let (stream, from) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors and the like: keep serving.
                    tracing::warn!(error = %e, "ARP accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Some(address) = AddressCount::take(&per_address, from.ip()) else {
                tracing::warn!(%from, "too many ARP connections from one address ({MAX_PER_ADDRESS}); closed");
                continue;
            };
            let Ok(handshake) = pending.clone().try_acquire_owned() else {
                tracing::warn!(%from, "too many ARP handshakes in progress ({MAX_PENDING}); closed");
                continue;
            };
            let n = counter.fetch_add(1, Ordering::Relaxed);
            let server = server.clone();
            let access = self.access.clone();
            let slots = slots.clone();
            let deadline = self.handshake_timeout;
            tokio::spawn(async move {
                let _address = address;
                let upgrade = upgrade(stream, from, &access, &slots);
                let accepted = match tokio::time::timeout(deadline, upgrade).await {
                    Ok(Ok(Some(accepted))) => accepted,
                    Ok(Ok(None)) => return,
                    Ok(Err(e)) => {
                        tracing::debug!(%from, error = %e, "ARP handshake failed");
                        return;
                    }
                    Err(_) => {
                        // Dropping the stream closes it.
                        tracing::debug!(%from, "ARP handshake not completed in time; closed");
                        return;
                    }
                };
                drop(handshake);
                if let Err(e) = serve(accepted, n, server).await {
                    tracing::debug!(%from, error = %e, "ARP connection ended");
                }
            });
        }
    }
}

/// One address's share of the connections, released on drop.
struct AddressCount {
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl AddressCount {
    fn take(counts: &Arc<Mutex<HashMap<IpAddr, usize>>>, ip: IpAddr) -> Option<AddressCount> {
        let mut map = counts.lock().unwrap_or_else(PoisonError::into_inner);
        let count = map.entry(ip).or_insert(0);
        if *count >= MAX_PER_ADDRESS {
            return None;
        }
        *count += 1;
        Some(AddressCount {
            counts: counts.clone(),
            ip,
        })
    }
}

impl Drop for AddressCount {
    fn drop(&mut self) {
        let mut map = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = map.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// Constant-time comparison: a secret must not leak through timing.
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An origin as compared: lower case, no trailing slash.
pub fn normalise_origin(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// Whether a request may come from where it says. Browsers send `Origin`
/// on every WebSocket; programs on the robot send none. A page's origin
/// (or `null`, or several, or garbage) is refused unless listed.
fn origin_allowed(request: &Request, origins: &[String]) -> bool {
    let mut values = request.headers().get_all("origin").iter();
    let Some(value) = values.next() else {
        return true;
    };
    if values.next().is_some() {
        return false;
    }
    match value.to_str() {
        Ok(origin) => origins.contains(&normalise_origin(origin)),
        Err(_) => false,
    }
}

/// The secret a request presents, from the header or the query.
fn presented(request: &Request) -> Option<String> {
    if let Some(value) = request.headers().get("authorization") {
        let value = value.to_str().ok()?;
        let (scheme, secret) = value.split_once(' ')?;
        return scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| secret.trim().to_owned());
    }
    request.uri().query().and_then(|q| {
        q.split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| *k == "token")
            .map(|(_, v)| v.to_owned())
    })
}

/// The role of a request; `None`: 401. Tokens are distinguished by their
/// index so two programs with different secrets are different subjects.
fn authorise(request: &Request, tokens: &[Token]) -> Option<(Role, String)> {
    if tokens.is_empty() {
        return Some((Role::Operator, "local".into()));
    }
    let secret = presented(request)?;
    tokens
        .iter()
        .enumerate()
        .find(|(_, t)| same(&t.secret, &secret))
        .map(|(i, t)| (t.role, format!("local-token-{}-{}", t.role, i + 1)))
}

fn refusal(status: StatusCode, text: &str) -> ErrorResponse {
    let mut response = ErrorResponse::new(Some(format!("{text}\n")));
    *response.status_mut() = status;
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert("www-authenticate", "Bearer".parse().expect("static header"));
    }
    response
}

/// An upgraded, authenticated connection holding its slot.
struct Accepted {
    ws: WebSocketStream<TcpStream>,
    role: Role,
    subject: String,
    slot: OwnedSemaphorePermit,
}

/// The WebSocket upgrade with its checks (origin, token, slot); `None`
/// when the request was refused (the refusal has been sent).
// The handshake callback's error type is tungstenite's (an HTTP response).
#[allow(clippy::result_large_err)]
async fn upgrade(
    stream: TcpStream,
    from: SocketAddr,
    access: &Access,
    slots: &Arc<Semaphore>,
) -> Result<Option<Accepted>, tokio_tungstenite::tungstenite::Error> {
    let _ = stream.set_nodelay(true);
    let mut admitted = None;
    let callback = |request: &Request, response: Response| {
        if !origin_allowed(request, &access.origins) {
            let origin = request
                .headers()
                .get("origin")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("?");
            tracing::warn!(%from, origin, "ARP connection from a browser origin not in --arp-allow-origin refused");
            return Err(refusal(
                StatusCode::FORBIDDEN,
                "this origin may not use the robot's ARP socket (see --arp-allow-origin)",
            ));
        }
        let Some((role, subject)) = authorise(request, &access.tokens) else {
            tracing::warn!(%from, "ARP connection without a valid token refused");
            return Err(refusal(
                StatusCode::UNAUTHORIZED,
                "a valid ARP token is required",
            ));
        };
        // The slot is taken only now: strangers never hold one.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%from, "too many ARP connections ({MAX_CONNECTIONS}); refused");
            return Err(refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many ARP connections; try again later",
            ));
        };
        admitted = Some((role, subject, slot));
        Ok(response)
    };
    // Twice the frame cap: a larger frame is refused by the handler with a
    // JSON-RPC error; beyond this the socket closes (memory stays bounded).
    let config = WebSocketConfig::default()
        .max_message_size(Some(2 * MAX_FRAME_BYTES))
        .max_frame_size(Some(2 * MAX_FRAME_BYTES));
    let ws =
        tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(config)).await?;
    Ok(admitted.map(|(role, subject, slot)| Accepted {
        ws,
        role,
        subject,
        slot,
    }))
}

async fn serve(
    accepted: Accepted,
    n: u64,
    server: ArpServer,
) -> Result<(), tokio_tungstenite::tungstenite::Error> {
    let Accepted {
        ws,
        role,
        subject,
        slot,
    } = accepted;
    let _slot = slot;
    let (mut sink, mut source) = ws.split();
    let (in_tx, in_rx) = mpsc::channel(FRAME_CHANNEL);
    let (out_tx, mut out_rx) = mpsc::channel::<String>(FRAME_CHANNEL);
    let peer = Peer {
        key: format!("arp-local-{n}"),
        session: None,
        role,
        subject,
    };
    let handler = server.connect(peer, in_rx, out_tx);
    // Aborts the handler however this function ends (its Drop cleans up).
    let _guard = AbortOnDrop(handler);
    let writer = async {
        while let Some(text) = out_rx.recv().await {
            sink.send(Message::text(text)).await?;
        }
        sink.close().await
    };
    let reader = async {
        while let Some(message) = source.next().await {
            let text = match message? {
                Message::Text(text) => text.to_string(),
                Message::Binary(_) => "binary frame".to_owned(),
                Message::Close(_) => break,
                _ => continue,
            };
            if in_tx.send(text).await.is_err() {
                break;
            }
        }
        Ok::<(), tokio_tungstenite::tungstenite::Error>(())
    };
    tokio::select! {
        r = writer => r,
        r = reader => r,
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
#[path = "ws_tests.rs"]
mod tests;
