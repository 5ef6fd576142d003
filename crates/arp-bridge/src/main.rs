//! `arp-bridge`: spawned by an agent runtime, it speaks line-delimited
//! JSON-RPC on stdin/stdout and ARP over a WebSocket. The library
//! (`arp_bridge`) does the work; this file reads the command line and the
//! token, and turns the outcome into an exit status.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use arp_bridge::token::{self, TokenSource};
use arp_bridge::{ws::Target, Config, Mode};
use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ModeArg {
    /// Relay ARP JSON-RPC as is.
    Arp,
    /// Serve the robot as a Model Context Protocol server.
    Mcp,
}

/// Bridge stdin/stdout (line-delimited JSON-RPC 2.0) to an ARP WebSocket.
///
/// The token is best given in a file (--token-file) or the ARP_TOKEN
/// environment variable: a command line is visible to every user of the
/// machine (ps). Exit status: 0 at the end of stdin, 1 when the bridge
/// could not start, 2 when the ARP connection was lost.
#[derive(Debug, Parser)]
#[command(name = "arp-bridge", version)]
struct Args {
    /// ARP endpoint: ws://host:port/ (robot-agent --arp-listen) or
    /// wss://server/v1/robots/{id}/arp (the server's gateway).
    #[arg(long)]
    url: String,
    #[arg(long, value_enum, default_value = "arp")]
    mode: ModeArg,
    /// File holding the bearer token (surrounding whitespace ignored; a
    /// robot-agent token file, ROLE:SECRET, works as is).
    #[arg(long, value_name = "PATH", conflicts_with = "token")]
    token_file: Option<PathBuf>,
    /// The bearer token itself; visible to every user (ps), so prefer
    /// --token-file or ARP_TOKEN (a warning says so).
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// PEM file of the CA that signed a wss:// endpoint's certificate;
    /// replaces the system's roots.
    #[arg(long, value_name = "PATH")]
    ca_file: Option<PathBuf>,
    /// Seconds to wait for the WebSocket to open.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    connect_timeout: f64,
}

/// The token: --token-file (read now, so a bad file stops the start, and
/// again at every connection), then --token, then ARP_TOKEN; none is fine
/// (robot-agent's socket with --arp-no-token takes loopback clients).
fn token(args: &Args) -> anyhow::Result<TokenSource> {
    if let Some(path) = &args.token_file {
        token::read_file(path)?;
        return Ok(TokenSource::File(path.clone()));
    }
    let token = if let Some(token) = &args.token {
        // Never the token itself: stderr may reach a log.
        eprintln!(
            "arp-bridge: warning: --token is visible to every user of this machine (ps, \
             /proc/PID/cmdline); use --token-file or ARP_TOKEN"
        );
        token.clone()
    } else if let Ok(token) = std::env::var("ARP_TOKEN") {
        token
    } else {
        return Ok(TokenSource::None);
    };
    let fixed = TokenSource::Fixed(token);
    fixed.current()?;
    Ok(fixed)
}

fn config(args: &Args) -> anyhow::Result<Config> {
    if !(args.connect_timeout.is_finite() && args.connect_timeout > 0.0) {
        bail!("--connect-timeout must be a positive number of seconds");
    }
    if !(args.url.starts_with("ws://") || args.url.starts_with("wss://")) {
        bail!("--url must be a ws:// or wss:// URL");
    }
    Ok(Config {
        target: Target {
            url: args.url.clone(),
            token: token(args)?,
            ca_file: args.ca_file.clone(),
            connect_timeout: Duration::from_secs_f64(args.connect_timeout.min(3600.0)),
        },
        mode: match args.mode {
            ModeArg::Arp => Mode::Arp,
            ModeArg::Mcp => Mode::Mcp,
        },
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match config(&args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("arp-bridge: {e:#}");
            return ExitCode::from(1);
        }
    };
    // Two threads are plenty for one socket and one pipe.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("arp-bridge: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let exit = runtime.block_on(arp_bridge::run(
        config,
        tokio::io::BufReader::new(tokio::io::stdin()),
        tokio::io::stdout(),
    ));
    // stdin's reader thread may be blocked in a read: do not wait for it.
    runtime.shutdown_background();
    ExitCode::from(exit.code())
}
