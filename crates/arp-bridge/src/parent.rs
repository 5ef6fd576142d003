//! What the bridge itself tells its parent on stdout, in both modes: that
//! it is ready (or why not), that the connection closed, what it is.

use serde_json::{json, Value};
use signalling_protocol::arp::ARP_VERSION;
use tokio::sync::mpsc;

use crate::config::Config;
use crate::{jsonrpc, ws};

/// Printed once the bridge is usable (or, with `ok: false`, why not).
pub const READY: &str = "arp-bridge.ready";
/// Printed when the ARP connection ends under the bridge.
pub const CLOSED: &str = "arp-bridge.closed";
/// Answered by the bridge itself in both modes.
pub const DESCRIBE: &str = "arp-bridge.describe";
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Queues one line for stdout; a parent that went away is not an error
/// worth more than ending quietly (the loops notice stdin's end too).
pub async fn emit(out: &mpsc::Sender<String>, message: Value) {
    let _ = out.send(message.to_string()).await;
}

pub fn ready_params(config: &Config, extra: Value) -> Value {
    let mut params = json!({
        "ok": true,
        "name": "arp-bridge",
        "version": VERSION,
        "mode": config.mode.as_str(),
        "protocolVersion": ARP_VERSION,
        "url": ws::redact(&config.target.url),
    });
    if let (Some(params), Value::Object(extra)) = (params.as_object_mut(), extra) {
        params.extend(extra);
    }
    params
}

pub fn not_ready(config: &Config, kind: &str, message: &str) -> Value {
    jsonrpc::notification(
        READY,
        json!({
            "ok": false,
            "name": "arp-bridge",
            "version": VERSION,
            "mode": config.mode.as_str(),
            "url": ws::redact(&config.target.url),
            "error": { "kind": kind, "message": message },
        }),
    )
}
