//! The ARP stdio bridge: a child process of an agent runtime that relays
//! line-delimited JSON-RPC 2.0 on stdin/stdout to an ARP WebSocket
//! (robot-agent's `--arp-listen` socket or the server's gateway), either
//! as is (`arp` mode, [`relay`]) or as a Model Context Protocol server
//! (`mcp` mode, [`mcp`]). docs/arp.md, "The stdio bridge and MCP".
//!
//! Layers: [`stdio`] (lines, bounded) and [`ws`] (the socket, bounded
//! channels) frame; [`jsonrpc`] sorts messages; the two modes give them
//! meaning. Every line the bridge prints is one JSON object.

use serde_json::{json, Value};
use signalling_protocol::arp::{ARP_VERSION, MAX_FRAME_BYTES};
use tokio::io::{AsyncBufRead, AsyncWrite};
use tokio::sync::mpsc;

pub mod jsonrpc;
pub mod mcp;
pub mod relay;
pub mod stdio;
mod time;
pub mod ws;

/// Printed once the bridge is usable (or, with `ok: false`, why not).
pub const READY: &str = "arp-bridge.ready";
/// Printed when the ARP connection ends under the bridge.
pub const CLOSED: &str = "arp-bridge.closed";
/// Answered by the bridge itself in both modes.
pub const DESCRIBE: &str = "arp-bridge.describe";
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Arp,
    Mcp,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Arp => "arp",
            Mode::Mcp => "mcp",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub target: ws::Target,
    pub mode: Mode,
}

/// How the bridge ended; [`Exit::code`] is the process's exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// stdin ended: the socket was closed cleanly.
    Eof,
    /// Could not connect or initialize; the ready notification said why.
    StartFailed,
    /// Reading stdin failed.
    Input,
    /// The ARP connection ended while the parent was still there.
    ConnectionLost,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Eof => 0,
            Exit::StartFailed | Exit::Input => 1,
            Exit::ConnectionLost => 2,
        }
    }
}

/// Queues one line for stdout; a parent that went away is not an error
/// worth more than ending quietly (the loops notice stdin's end too).
pub(crate) async fn emit(out: &mpsc::Sender<String>, message: Value) {
    let _ = out.send(message.to_string()).await;
}

pub(crate) fn ready_params(config: &Config, extra: Value) -> Value {
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

pub(crate) fn not_ready(config: &Config, kind: &str, message: &str) -> Value {
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

/// Runs the bridge on the given stdin/stdout until stdin ends or the ARP
/// connection does.
pub async fn run<R, W>(config: Config, input: R, output: W) -> Exit
where
    R: AsyncBufRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, writer) = stdio::spawn_writer(output);
    let lines = stdio::spawn_reader(input, MAX_FRAME_BYTES);
    let exit = match ws::connect(&config.target).await {
        Err(e) => {
            eprintln!("arp-bridge: {e}");
            emit(&out, not_ready(&config, e.kind(), &e.to_string())).await;
            Exit::StartFailed
        }
        Ok(link) => match config.mode {
            Mode::Arp => relay::run(&config, link, lines, &out).await,
            Mode::Mcp => mcp::run(&config, link, lines, &out).await,
        },
    };
    // Everything queued reaches the parent before the process ends.
    drop(out);
    if let Ok(Err(e)) = writer.await {
        eprintln!("arp-bridge: writing stdout failed: {e}");
    }
    exit
}
