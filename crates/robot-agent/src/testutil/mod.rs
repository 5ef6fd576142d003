//! Helpers shared by the unit tests: one place for the robot side's test
//! scaffolding. [`arp`] is the ARP server over the sim driver and an ARP
//! client; [`scripted`] is a scripted signalling server (robot login,
//! offers, tickets) with the real agent behind it; [`browser`] is a browser's
//! WebRTC peer and the agent's peer manager it talks to.

pub mod arp;
pub mod browser;
pub mod scripted;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use signalling_protocol::schema::SchemaValidator;
use signalling_protocol::Envelope;

use crate::controller::ControllerHandle;
use crate::locations::LocationStore;
use crate::reply_signing::ReplySigner;
use crate::safety::SafetyLimits;
use crate::session::{Metrics, Shared};
use crate::settings::Settings;

/// Upper bound of any wait in a test; never used as synchronisation.
pub const WAIT: Duration = Duration::from_secs(10);

/// A WebSocket opened by [`ws_upgrade`].
pub type WsClient =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a WebSocket to `ws://{addr}/` with these extra headers: the socket, or the HTTP
/// status the upgrade was refused with.
pub async fn ws_upgrade(addr: &str, headers: &[(&str, &str)]) -> Result<WsClient, u16> {
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, http, Error};
    let mut request = format!("ws://{addr}/")
        .into_client_request()
        .expect("request");
    for (name, value) in headers {
        request.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).expect("header name"),
            value.parse().expect("header value"),
        );
    }
    match tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
        .await
        .expect("an answer in time")
    {
        Ok((ws, _)) => Ok(ws),
        Err(Error::Http(response)) => Err(response.status().as_u16()),
        Err(e) => panic!("neither upgraded nor refused with a status: {e}"),
    }
}

/// A fresh, empty directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "robot-agent-test-{tag}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// Serialises an outgoing message and checks it against the spec's schema.
pub fn validated(envelope: &Envelope) -> Value {
    let value: Value = serde_json::from_str(&envelope.to_json()).expect("agent sent JSON");
    if let Err(e) = SchemaValidator::shared().validate(&value) {
        panic!("agent sent a message that breaks the spec: {e}\n{value}");
    }
    value
}

/// A client's wall clock that runs with tokio's clock (paused or not), so a
/// test's messages keep a constant lag unless the test shifts them; reads
/// an arbitrary 2026 date at the first call.
pub fn client_now_ms() -> i64 {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(|| tokio::time::Instant::now().into_std());
    let elapsed = tokio::time::Instant::now()
        .into_std()
        .saturating_duration_since(origin);
    1_767_000_000_000 + i64::try_from(elapsed.as_millis()).expect("test runs for less than ages")
}

/// RFC 3339 text of a client time in Unix milliseconds.
pub fn rfc3339_ms(ms: i64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .expect("in range");
    at.format(&time::format_description::well_known::Rfc3339)
        .expect("formats")
}

/// What sessions share, around `controller`: default limits and settings, an
/// in-memory location store, replies signed by `reply_signer` when given.
pub fn shared(controller: ControllerHandle, reply_signer: Option<Arc<ReplySigner>>) -> Shared {
    let limits = SafetyLimits::default();
    Shared {
        controller,
        locations: Arc::new(Mutex::new(LocationStore::in_memory(10))),
        settings: Arc::new(Mutex::new(Settings::defaults(&limits))),
        base_limits: limits,
        metrics: Arc::new(Metrics::default()),
        reply_signer,
    }
}
