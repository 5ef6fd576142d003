//! `robot-agent`: command line of the robot side. See docs/robot-agent.md.

use std::path::PathBuf;

use anyhow::Context;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use robot_agent::config::{self, RunConfig, RunFlags};
use robot_agent::enroll::{self, EnrollRequest};
use robot_agent::identity::KeyType;
use robot_agent::server_keys::{self, PinnedKey};

#[derive(Parser)]
#[command(
    name = "robot-agent",
    version,
    about = "Robot-side agent of the robot signalling system"
)]
struct Cli {
    /// Folder of the key, certificate and agent.toml [default: /etc/robot-agent as root, else ~/.config/robot-agent]
    #[arg(long, global = true, env = "ROBOT_AGENT_CONFIG_DIR")]
    config_dir: Option<PathBuf>,
    /// Log output format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "ROBOT_AGENT_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Create the robot's key (if none) and enroll it with the server.
    Enroll {
        /// Server base URL (https://host[:port]; a ws(s):// URL works too).
        #[arg(long)]
        server: String,
        #[arg(long)]
        robot_id: String,
        /// Single-use enrollment token from `POST /v1/robots`.
        #[arg(long, env = "ROBOT_AGENT_ENROLLMENT_TOKEN", hide_env_values = true)]
        token: String,
        /// Type of a newly created key (an existing key is kept).
        #[arg(long, value_enum, default_value_t = KeyType::Ed25519)]
        key_type: KeyType,
        /// Send a CSR and store the certificate the server's CA issues.
        #[arg(long)]
        csr: bool,
        /// Extra CA certificates (PEM) to trust for https.
        #[arg(long)]
        ca_file: Option<PathBuf>,
    },
    /// Pin one more server signing key (a JWK from GET /v1/signing-keys, or its `x`):
    /// session tickets signed with it are accepted, e.g. ahead of a key rotation.
    TrustKey {
        /// The key: a JWK as JSON, or the raw Ed25519 key in base64url (the JWK's `x`).
        key: String,
    },
    /// Connect to the server and serve WebRTC sessions.
    Run {
        /// Config file [default: CONFIG_DIR/agent.toml if present].
        #[arg(long, env = "ROBOT_AGENT_CONFIG")]
        config: Option<PathBuf>,
        /// Signalling WebSocket URL (wss://host/ws); several, comma
        /// separated, are tried in turn.
        #[arg(long, env = "ROBOT_AGENT_SERVER")]
        server: Option<String>,
        #[arg(long, env = "ROBOT_AGENT_ROBOT_ID")]
        robot_id: Option<String>,
        /// sim | exec:COMMAND | rosbridge:WS_URL | serial:DEVICE[@BAUD]
        #[arg(long, env = "ROBOT_AGENT_DRIVER")]
        driver: Option<String>,
        /// A camera, NAME=exec:COMMAND (H.264 Annex-B on stdout) or
        /// NAME=rtp:HOST:PORT (H.264 RTP); repeatable.
        #[arg(long = "video", value_name = "NAME=SOURCE")]
        video: Vec<robot_agent::video::VideoSpec>,
        /// Serve ARP (Autonomous Robot Protocol) on a local WebSocket at
        /// this address, e.g. 127.0.0.1:7700 [default: off].
        #[arg(long, env = "ROBOT_AGENT_ARP_LISTEN", value_name = "ADDR")]
        arp_listen: Option<String>,
        /// A credential of the ARP WebSocket, ROLE:SECRET (viewer,
        /// operator, owner); repeatable; the variable takes a comma list.
        /// On the command line it is visible to every user (ps): prefer
        /// --arp-token-file or the variable.
        #[arg(
            long = "arp-token",
            env = "ROBOT_AGENT_ARP_TOKENS",
            value_name = "ROLE:SECRET",
            value_delimiter = ',',
            hide_env_values = true
        )]
        arp_token: Vec<String>,
        /// A file of ARP credentials, one ROLE:SECRET a line; repeatable
        /// [default: CONFIG_DIR/arp-token, written by enroll].
        #[arg(
            long = "arp-token-file",
            env = "ROBOT_AGENT_ARP_TOKEN_FILE",
            value_name = "PATH"
        )]
        arp_token_file: Vec<PathBuf>,
        /// Serve the ARP WebSocket without a token, every local program an
        /// operator: loopback addresses only.
        #[arg(long, env = "ROBOT_AGENT_ARP_NO_TOKEN")]
        arp_no_token: bool,
        /// A browser origin (scheme://host[:port]) allowed to open the ARP
        /// WebSocket; repeatable; every other page gets 403.
        #[arg(
            long = "arp-allow-origin",
            env = "ROBOT_AGENT_ARP_ALLOW_ORIGINS",
            value_name = "ORIGIN",
            value_delimiter = ','
        )]
        arp_allow_origin: Vec<String>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    init_logging(cli.log_format);
    // A command line is readable by every user of the machine (/proc/PID/cmdline).
    if let Some(("run", run)) = matches.subcommand() {
        if run.value_source("arp_token") == Some(ValueSource::CommandLine) {
            tracing::warn!(
                "--arp-token on the command line is visible to every user of this machine \
                 (ps, /proc/PID/cmdline); use --arp-token-file or ROBOT_AGENT_ARP_TOKENS"
            );
        }
    }
    match cli.command {
        Command::Enroll {
            server,
            robot_id,
            token,
            key_type,
            csr,
            ca_file,
        } => {
            let config_dir = cli.config_dir.unwrap_or_else(config::default_config_dir);
            let outcome = enroll::enroll(&EnrollRequest {
                server,
                robot_id: robot_id.clone(),
                token,
                key_type,
                csr,
                config_dir,
                ca_file,
            })
            .await
            .context("enrollment failed")?;
            report_enrollment(&robot_id, outcome);
            Ok(())
        }
        Command::TrustKey { key } => trust_key(
            cli.config_dir.unwrap_or_else(config::default_config_dir),
            &key,
        ),
        Command::Run {
            config,
            server,
            robot_id,
            driver,
            video,
            arp_listen,
            arp_token,
            arp_token_file,
            arp_no_token,
            arp_allow_origin,
        } => {
            let config = RunConfig::resolve(RunFlags {
                config,
                config_dir: cli.config_dir,
                server,
                robot_id,
                driver,
                video,
                arp_listen,
                arp_tokens: arp_token,
                arp_token_files: arp_token_file,
                arp_no_token,
                arp_allow_origins: arp_allow_origin,
            })
            .context("configuration")?;
            robot_agent::agent::run(config)
                .await
                .context("robot agent")?;
            Ok(())
        }
    }
}

/// `trust-key`: pins one more server signing key.
fn trust_key(config_dir: PathBuf, key: &str) -> anyhow::Result<()> {
    let key = PinnedKey::parse(key).context("the key")?;
    let path = config_dir.join(server_keys::SERVER_KEYS_FILE);
    let kid = key.kid.clone();
    if server_keys::add(&path, key)? {
        println!("Server signing key trusted: {kid} ({})", path.display());
    } else {
        println!("Server signing key already trusted: {kid}");
    }
    Ok(())
}

/// What `enroll` did, for the person who ran it.
fn report_enrollment(robot_id: &str, outcome: enroll::EnrollOutcome) {
    println!(
        "Enrolled {robot_id}. Key: {}{}",
        outcome.key_file.display(),
        if outcome.key_created {
            " (new)"
        } else {
            " (existing)"
        }
    );
    if let Some(cert) = outcome.certificate_file {
        println!("Certificate: {}", cert.display());
    }
    if let Some(file) = outcome.config_file {
        println!("Config written: {}", file.display());
    }
    if let Some(file) = outcome.arp_token_file {
        println!("ARP token written (for --arp-listen): {}", file.display());
    }
    if outcome.server_keys.is_empty() {
        println!("The server signs no session tickets: none will be checked.");
    }
    for kid in outcome.server_keys {
        println!("Server signing key pinned: {kid}");
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // webrtc-rs is chatty at info; its warnings still show.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,webrtc=warn,webrtc_ice=warn,webrtc_sctp=warn,webrtc_dtls=warn,webrtc_mdns=warn"));
    // Colours only on a terminal: the journal and log files get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
