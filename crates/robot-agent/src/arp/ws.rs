//! `--arp-listen`: the ARP WebSocket for programs on the robot's own
//! computer. Credentials (`--arp-token ROLE:SECRET`) are checked before
//! the upgrade: `Authorization: Bearer SECRET` or `?token=SECRET`, else
//! HTTP 401. With no token configured (loopback only, see
//! [`super::ListenConfig`]) every local program is an operator.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use signalling_protocol::arp::MAX_FRAME_BYTES;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

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

/// Most concurrent local connections; more are closed at once (the socket
/// is for a few programs on the robot, not a server).
pub const MAX_CONNECTIONS: usize = 64;

/// A bound listener; [`ArpListener::run`] serves it.
pub struct ArpListener {
    listener: TcpListener,
    tokens: Arc<Vec<Token>>,
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
            tokens: Arc::new(config.tokens.clone()),
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts connections until the task is dropped.
    pub async fn run(self, server: ArpServer) {
        let counter = Arc::new(AtomicU64::new(1));
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
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
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::warn!(%from, "too many ARP connections ({MAX_CONNECTIONS}); closed");
                continue;
            };
            let n = counter.fetch_add(1, Ordering::Relaxed);
            let server = server.clone();
            let tokens = self.tokens.clone();
            tokio::spawn(async move {
                let _slot = slot;
                if let Err(e) = serve(stream, from, n, &tokens, server).await {
                    tracing::debug!(%from, error = %e, "ARP connection ended");
                }
            });
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

fn unauthorized() -> ErrorResponse {
    let mut response = ErrorResponse::new(Some("a valid ARP token is required\n".into()));
    *response.status_mut() = StatusCode::UNAUTHORIZED;
    response
        .headers_mut()
        .insert("www-authenticate", "Bearer".parse().expect("static header"));
    response
}

// The handshake callback's error type is tungstenite's (an HTTP response).
#[allow(clippy::result_large_err)]
async fn serve(
    stream: TcpStream,
    from: SocketAddr,
    n: u64,
    tokens: &[Token],
    server: ArpServer,
) -> Result<(), tokio_tungstenite::tungstenite::Error> {
    let _ = stream.set_nodelay(true);
    let mut who = None;
    let callback = |request: &Request, response: Response| match authorise(request, tokens) {
        Some(found) => {
            who = Some(found);
            Ok(response)
        }
        None => {
            tracing::warn!(%from, "ARP connection without a valid token refused");
            Err(unauthorized())
        }
    };
    // Twice the frame cap: a larger frame is refused by the handler with a
    // JSON-RPC error; beyond this the socket closes (memory stays bounded).
    let config = WebSocketConfig::default()
        .max_message_size(Some(2 * MAX_FRAME_BYTES))
        .max_frame_size(Some(2 * MAX_FRAME_BYTES));
    let ws =
        tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(config)).await?;
    let Some((role, subject)) = who else {
        return Ok(());
    };
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
