use anyhow::Context;
use clap::Parser;
use signalling_server::config::{Cli, Command, LogFormat};
use signalling_server::Server;
use tracing_subscriber::EnvFilter;

/// mimalloc, not glibc's malloc: relaying across nodes keeps many frame buffers alive for a
/// Redis round trip and frees them together, which glibc answered by trimming its heaps and
/// faulting the pages back in on the next burst (a sixth of a node's time in profiles).
/// Measured: cross-node 6 KB relay +10–25 %, and less memory per idle socket (4.04 KiB
/// against 4.59; docs/benchmarks.md, "Several nodes").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.config.log_format);
    // rustls needs one process-wide crypto provider; ring is the one every other crate here uses.
    let _ = rustls::crypto::ring::default_provider().install_default();

    match cli.command {
        Some(Command::Pki(command)) => signalling_server::dev_pki::run(command),
        Some(Command::Serve) | None => {
            let server = Server::bind(cli.config).await.context("cannot start")?;
            server
                .run(shutdown_signal())
                .await
                .context("server failed")?;
            Ok(())
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,tower_http=warn"));
    // Colours only for a person at a terminal, not for log files and collectors.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().init(),
        // Peer-controlled text cannot start a line of its own (src/logging.rs).
        LogFormat::Text => builder
            .with_writer(signalling_server::logging::OneLineStdout { ansi })
            .init(),
    }
}

/// SIGTERM (what orchestrators send) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    tracing::info!("shutdown signal received");
}
