use std::fs::OpenOptions;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use signalling_server::config::{Cli, Command, LogFormat};
use signalling_server::{Server, StartError};
use tracing_subscriber::EnvFilter;

/// mimalloc, not glibc's malloc: relaying across nodes keeps many frame buffers alive for a
/// Redis round trip and frees them together, which glibc answered by trimming its heaps and
/// faulting the pages back in on the next burst (a sixth of a node's time in profiles).
/// Measured: cross-node 6 KB relay +10–25 %, and less memory per idle socket (4.04 KiB
/// against 4.59; docs/benchmarks.md, "Several nodes").
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    disable_transparent_huge_pages();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run()),
        Err(error) => {
            eprintln!("cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Transparent huge pages off for this process, before the runtime's threads allocate.
/// mimalloc marks its arenas `MADV_HUGEPAGE`, and khugepaged then folds sparsely used 2 MiB
/// ranges into whole huge pages, making the untouched rest resident: in the one-node soak the
/// server's RSS rose 6 MB over 20 minutes, every byte of it huge pages (`AnonHugePages`
/// 26.6 → 38.9 MB while the small-page part shrank 10.5 → 4.5 MB; docs/reliability.md). A
/// signalling node's heap is small and sparse, so 4 KiB pages keep its RSS what it uses.
/// Where the call is not available (an old or non-Linux kernel) nothing changes.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no memory of ours.
    unsafe {
        // The kernel reads four unsigned longs and refuses non-zero unused ones.
        let (on, unused): (libc::c_ulong, libc::c_ulong) = (1, 0);
        libc::prctl(libc::PR_SET_THP_DISABLE, on, unused, unused, unused);
    }
}

async fn run() -> ExitCode {
    let cli = Cli::parse();
    // rustls needs one process-wide crypto provider; ring is the one every other crate here uses.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Some(Command::Healthcheck { path, timeout }) = &cli.command {
        // No logging set up: a container runtime keeps what this prints as the check's output.
        return healthcheck(&cli.config, path, Duration::from_secs(*timeout)).await;
    }
    let started = init_logging(cli.config.log_format);

    let outcome = match cli.command {
        Some(Command::Pki(command)) => signalling_server::dev_pki::run(command),
        Some(Command::Serve) | None => serve(cli.config, started).await,
        Some(Command::Healthcheck { .. }) => unreachable!("answered above"),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line with the whole chain of causes (a container's log shows why it
            // stopped, not a multi-line dump), then a non-zero exit status.
            tracing::error!("{}", one_line(&error));
            ExitCode::FAILURE
        }
    }
}

async fn serve(
    config: signalling_server::config::Config,
    started: Box<dyn FnOnce()>,
) -> anyhow::Result<()> {
    // A database that cannot be opened is named (without its password), since its
    // driver's message often is not.
    let database = redact_password(config.database_url());
    sqlite_writable(config.database_url()).with_context(|| format!("cannot start: {database}"))?;
    let server = match Server::bind(config).await {
        Ok(server) => server,
        Err(error @ StartError::Store(_)) => {
            return Err(anyhow::Error::new(error).context(format!("cannot start: {database}")))
        }
        Err(error) => return Err(anyhow::Error::new(error).context("cannot start")),
    };
    started();
    server
        .run(shutdown_signal())
        .await
        .context("server failed")?;
    Ok(())
}

/// `signalling-server healthcheck`: a plain GET of /readyz (or --path) on the configured
/// listening port, on loopback when the server listens on every address; https (any
/// certificate: it is this machine's own server) when --tls-cert is set. 0 on 200, else 1.
async fn healthcheck(
    config: &signalling_server::config::Config,
    path: &str,
    timeout: Duration,
) -> ExitCode {
    let mut addr = config.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => Ipv6Addr::LOCALHOST.into(),
        });
    }
    let scheme = if config.tls_cert.is_some() {
        "https"
    } else {
        "http"
    };
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    let url = format!("{scheme}://{addr}{path}");
    let client = match reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .danger_accept_invalid_certs(true)
        .build()
    {
        Ok(client) => client,
        Err(error) => {
            eprintln!("healthcheck: {error}");
            return ExitCode::FAILURE;
        }
    };
    match client.get(&url).send().await {
        Ok(answer) if answer.status() == reqwest::StatusCode::OK => {
            println!("{url}: {}", answer.status());
            ExitCode::SUCCESS
        }
        Ok(answer) => {
            eprintln!("{url}: {}", answer.status());
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("{url}: {}", one_line(&error.into()));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line. Many of our errors already print their source
/// (`"database: {0}"`): a cause whose text was said already is not repeated.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// SQLite writes in its database's folder (the file, its journal): a read-only folder or
/// file is said at once, not after the connection pool's 10 s of retries that end in "pool
/// timed out". A folder that does not exist yet is the store's to create (and report).
fn sqlite_writable(url: &str) -> anyhow::Result<()> {
    let Some(path) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    else {
        return Ok(());
    };
    let path = path.split('?').next().unwrap_or_default();
    if path.is_empty() || path.starts_with(':') {
        return Ok(());
    }
    let file = Path::new(path);
    let folder = match file.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    if !folder.is_dir() {
        return Ok(());
    }
    let probe = folder.join(format!(".write-test-{}", std::process::id()));
    match OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
        }
        Err(e) => anyhow::bail!(
            "the database folder {} is not writable: {e}",
            folder.display()
        ),
    }
    if file.exists() {
        if let Err(e) = OpenOptions::new().read(true).write(true).open(file) {
            anyhow::bail!("the database file {} is not writable: {e}", file.display());
        }
    }
    Ok(())
}

/// `scheme://user:secret@host/db` without the secret.
fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// The default log filter (RUST_LOG replaces it).
const DEFAULT_LOG_FILTER: &str = "info,sqlx=warn,tower_http=warn";

/// Sets up logging. Returns what ends the start phase's filter, which keeps sqlx's
/// connection pool quiet while the first connection is made: it logs each retry of a
/// database that cannot open (a read-only folder, …) as an error of its own for 10 s, which
/// would bury the one line that says why the start failed. RUST_LOG, when set, is used as
/// it is throughout.
fn init_logging(format: LogFormat) -> Box<dyn FnOnce()> {
    let steady = std::env::var("RUST_LOG")
        .ok()
        .filter(|f| EnvFilter::try_new(f).is_ok())
        .unwrap_or_else(|| DEFAULT_LOG_FILTER.to_string());
    let starting = if std::env::var_os("RUST_LOG").is_some() {
        steady.clone()
    } else {
        format!("{steady},sqlx_core::pool=off")
    };
    // Colours only for a person at a terminal, not for log files and collectors.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(&starting))
        .with_ansi(ansi);
    let reload: Box<dyn FnOnce(EnvFilter) -> Result<(), tracing_subscriber::reload::Error>> =
        match format {
            LogFormat::Json => {
                let builder = builder.json().with_filter_reloading();
                let handle = builder.reload_handle();
                builder.init();
                Box::new(move |filter| handle.reload(filter))
            }
            LogFormat::Text => {
                // Peer-controlled text cannot start a line of its own (src/logging.rs).
                let builder = builder
                    .with_writer(signalling_server::logging::OneLineStdout { ansi })
                    .with_filter_reloading();
                let handle = builder.reload_handle();
                builder.init();
                Box::new(move |filter| handle.reload(filter))
            }
        };
    Box::new(move || {
        if let Err(e) = reload(EnvFilter::new(&steady)) {
            tracing::warn!("log filter: {e}");
        }
    })
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
