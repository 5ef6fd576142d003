//! The WebSocket to the ARP endpoint (robot-agent's `--arp-listen` socket
//! or the server's gateway): connecting with the bearer token, then two
//! tasks that move text frames between the socket and bounded channels.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use signalling_protocol::arp::MAX_FRAME_BYTES;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use crate::token::{TokenError, TokenSource};

type Socket = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// Capacity of the frame channels, each way.
pub const FRAME_QUEUE: usize = 64;
/// How long a clean close waits for the endpoint's close frame.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum WsError {
    #[error("invalid URL: {0}")]
    Url(String),
    #[error("the token is not a valid HTTP header value")]
    BadToken,
    #[error("{0}")]
    Token(#[from] TokenError),
    #[error("the ARP endpoint refused the credentials (HTTP {0})")]
    Unauthorized(u16),
    #[error("the ARP endpoint answered HTTP {0} instead of upgrading")]
    Http(u16),
    #[error("cannot use the CA file {path}: {why}")]
    CaFile { path: PathBuf, why: String },
    #[error("connecting to the ARP endpoint timed out after {0:?}")]
    Timeout(Duration),
    #[error("cannot connect to the ARP endpoint: {0}")]
    Connect(String),
}

impl WsError {
    /// A short machine-readable kind, for the ready notification.
    pub fn kind(&self) -> &'static str {
        match self {
            WsError::Unauthorized(_) => "unauthorized",
            WsError::Url(_) | WsError::BadToken | WsError::Token(_) | WsError::CaFile { .. } => {
                "config"
            }
            WsError::Http(_) | WsError::Timeout(_) | WsError::Connect(_) => "connect",
        }
    }
}

/// Where to connect and as whom.
#[derive(Clone)]
pub struct Target {
    pub url: String,
    /// Read again at every connection (a token file may have changed).
    pub token: TokenSource,
    pub ca_file: Option<PathBuf>,
    pub connect_timeout: Duration,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("Target")
            .field("url", &redact(&self.url))
            .field("token", &self.token)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// The URL without credentials a log must not show (userinfo, query).
pub fn redact(url: &str) -> String {
    let without_query = url.split(['?', '#']).next().unwrap_or("");
    match without_query.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit('@').next().unwrap_or(authority);
            format!("{scheme}://{host}{path}")
        }
        None => without_query.to_owned(),
    }
}

/// What the endpoint sends.
#[derive(Debug, Clone, PartialEq)]
pub enum FromRobot {
    Frame(String),
    /// The socket is gone (close frame, error or end of stream).
    Closed {
        code: Option<u16>,
        reason: String,
    },
}

/// A live connection: frames in, frames out.
pub struct Link {
    pub to_robot: mpsc::Sender<String>,
    pub from_robot: mpsc::Receiver<FromRobot>,
    /// The token this connection presented.
    token: Option<String>,
    shutdown: Option<oneshot::Sender<()>>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Link {
    /// The token this connection presented (a later one differs if the file changed).
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// A clean end: the close frame is sent (by the writer, once every
    /// sender is gone) and the endpoint's answer awaited, briefly.
    pub async fn close(mut self) {
        // Other clones of `to_robot` may live on in tasks: the writer is
        // told directly.
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let from_robot = &mut self.from_robot;
        let drain = async {
            while let Some(m) = from_robot.recv().await {
                if matches!(m, FromRobot::Closed { .. }) {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(CLOSE_WAIT, drain).await;
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

fn tls_connector(path: &Path) -> Result<Connector, WsError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let bad = |why: String| WsError::CaFile {
        path: path.to_owned(),
        why,
    };
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path).map_err(|e| bad(e.to_string()))?;
    for cert in certs {
        let cert = cert.map_err(|e| bad(e.to_string()))?;
        roots.add(cert).map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("no certificate in it".into()));
    }
    // The provider is named: the tree may hold more than one, and rustls
    // refuses to guess.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Connector::Rustls(Arc::new(config)))
}

/// Connects (with the token as of now) and starts the frame pumps.
pub async fn connect(target: &Target) -> Result<Link, WsError> {
    let token = target.token.current()?;
    let mut request = target
        .url
        .as_str()
        .into_client_request()
        .map_err(|e| WsError::Url(format!("{}: {e}", redact(&target.url))))?;
    if let Some(token) = &token {
        let value =
            HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| WsError::BadToken)?;
        request.headers_mut().insert("authorization", value);
    }
    // --ca-file replaces the system's roots (as curl's --cacert does): a
    // private CA's endpoint is trusted for what that CA signed, nothing else.
    let connector = target.ca_file.as_deref().map(tls_connector).transpose()?;
    // The same bound as robot-agent's socket: a larger frame is refused
    // there with a JSON-RPC error, beyond this the socket closes.
    let config = WebSocketConfig::default()
        .max_message_size(Some(2 * MAX_FRAME_BYTES))
        .max_frame_size(Some(2 * MAX_FRAME_BYTES));
    let connecting =
        tokio_tungstenite::connect_async_tls_with_config(request, Some(config), true, connector);
    let (ws, _) = tokio::time::timeout(target.connect_timeout, connecting)
        .await
        .map_err(|_| WsError::Timeout(target.connect_timeout))?
        .map_err(|e| match e {
            tungstenite::Error::Http(response) => {
                let status = response.status().as_u16();
                if status == 401 || status == 403 {
                    WsError::Unauthorized(status)
                } else {
                    WsError::Http(status)
                }
            }
            other => WsError::Connect(other.to_string()),
        })?;
    let (sink, stream) = ws.split();
    let (to_robot, outgoing) = mpsc::channel::<String>(FRAME_QUEUE);
    let (incoming, from_robot) = mpsc::channel::<FromRobot>(FRAME_QUEUE);
    let (shutdown, shutdown_rx) = oneshot::channel::<()>();
    let writer = tokio::spawn(write_frames(sink, outgoing, shutdown_rx));
    let reader = tokio::spawn(read_frames(stream, incoming));
    Ok(Link {
        to_robot,
        from_robot,
        token,
        shutdown: Some(shutdown),
        reader,
        writer,
    })
}

/// Sends the bridge's frames until told to stop, then closes the socket.
async fn write_frames(
    mut sink: SplitSink<Socket, Message>,
    mut outgoing: mpsc::Receiver<String>,
    mut shutdown: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            next = outgoing.recv() => match next {
                Some(text) => {
                    if sink.send(Message::text(text)).await.is_err() {
                        // The reader reports why the socket ended.
                        return;
                    }
                }
                None => break,
            },
            _ = &mut shutdown => break,
        }
    }
    let _ = sink.close().await;
}

/// Hands the robot's text frames on, then why the socket closed.
async fn read_frames(mut stream: SplitStream<Socket>, incoming: mpsc::Sender<FromRobot>) {
    let closed = loop {
        match stream.next().await {
            Some(Ok(Message::Text(text))) => {
                if incoming
                    .send(FromRobot::Frame(text.to_string()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Some(Ok(Message::Close(frame))) => {
                break FromRobot::Closed {
                    code: frame.as_ref().map(|f| u16::from(f.code)),
                    reason: frame
                        .map(|f| f.reason.to_string())
                        .filter(|r| !r.is_empty())
                        .unwrap_or_else(|| "closed by the ARP endpoint".into()),
                };
            }
            // Binary frames are not ARP; pings are answered by tungstenite.
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                break FromRobot::Closed {
                    code: None,
                    reason: e.to_string(),
                }
            }
            None => {
                break FromRobot::Closed {
                    code: None,
                    reason: "the connection ended".into(),
                }
            }
        }
    };
    let _ = incoming.send(closed).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_credentials_when_shown() {
        assert_eq!(
            redact("wss://u:p@host:443/v1/robots/r1/arp?token=s#x"),
            "wss://host:443/v1/robots/r1/arp"
        );
        assert_eq!(redact("ws://127.0.0.1:7700"), "ws://127.0.0.1:7700");
        let t = Target {
            url: "ws://h/?token=secret".into(),
            token: TokenSource::Fixed("secret".into()),
            ca_file: None,
            connect_timeout: Duration::from_secs(1),
        };
        assert!(!format!("{t:?}").contains("secret"));
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = std::env::temp_dir().join(format!("arp-bridge-ca-{}", std::process::id()));
        std::fs::write(&dir, "not a certificate\n").unwrap();
        let e = tls_connector(&dir).err().expect("refused");
        let _ = std::fs::remove_file(&dir);
        assert!(matches!(e, WsError::CaFile { .. }), "{e}");
        assert!(matches!(
            tls_connector(Path::new("/nonexistent/ca.pem")),
            Err(WsError::CaFile { .. })
        ));
    }
}
