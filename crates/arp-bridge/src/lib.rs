//! The ARP stdio bridge: a child process of an agent runtime that relays
//! line-delimited JSON-RPC 2.0 on stdin/stdout to an ARP WebSocket
//! (robot-agent's `--arp-listen` socket or the server's gateway), either
//! as is (`arp` mode, [`relay`]) or as a Model Context Protocol server
//! (`mcp` mode, [`mcp`]). docs/arp.md, "The stdio bridge and MCP".
//!
//! Layers: [`stdio`] (lines, bounded) and [`ws`] (the socket, bounded
//! channels) frame; [`intake`] reads stdin once, for either mode, into
//! JSON objects; [`jsonrpc`] sorts messages; the two modes give them
//! meaning. Every line the bridge prints is one JSON object.

use tokio::io::{AsyncBufRead, AsyncWrite};

mod config;
pub mod intake;
pub mod jsonrpc;
pub mod mcp;
mod parent;
pub mod relay;
pub mod stdio;
mod time;
pub mod token;
pub mod ws;

pub use config::{Config, Exit, Mode};
use parent::{emit, not_ready};
pub use parent::{CLOSED, DESCRIBE, READY, VERSION};

/// Runs the bridge on the given stdin/stdout until stdin ends or the ARP
/// connection does.
pub async fn run<R, W>(config: Config, input: R, output: W) -> Exit
where
    R: AsyncBufRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, writer) = stdio::spawn_writer(output);
    // stdin is read here, once, for either mode.
    let intake = intake::Intake::spawn(input);
    let exit = match ws::connect(&config.target).await {
        Err(e) => {
            eprintln!("arp-bridge: {e}");
            emit(&out, not_ready(&config, e.kind(), &e.to_string())).await;
            if config.mode == Mode::Mcp {
                let mut intake = intake;
                mcp::refuse_start(&mut intake, &out, e.kind(), &e.to_string()).await;
            }
            Exit::StartFailed
        }
        Ok(link) => match config.mode {
            Mode::Arp => relay::run(&config, link, intake, &out).await,
            Mode::Mcp => mcp::run(&config, link, intake, &out).await,
        },
    };
    // Everything queued reaches the parent before the process ends.
    drop(out);
    if let Ok(Err(e)) = writer.await {
        eprintln!("arp-bridge: writing stdout failed: {e}");
    }
    exit
}
