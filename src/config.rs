//! Command line and environment configuration (contract section 1).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "signalling-server",
    version,
    about = "Signalling and identity service for remotely operated robots"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub config: Config,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (the default).
    Serve,
    /// Development PKI: make a CA and robot certificates.
    #[command(subcommand)]
    Pki(PkiCommand),
    /// Ask the server running with this configuration (its --listen port, on loopback)
    /// whether it is ready: exit 0 on HTTP 200, else 1 (the image's HEALTHCHECK; no curl
    /// needed).
    Healthcheck {
        /// Path to ask: /readyz (ready to serve) or /healthz (alive).
        #[arg(long, default_value = "/readyz")]
        path: String,
        /// Seconds to wait for the answer.
        #[arg(long, default_value_t = 3)]
        timeout: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum PkiCommand {
    /// Create a development CA (certificate and key) in a folder.
    InitCa {
        #[arg(long, default_value = "certs")]
        out: PathBuf,
        #[arg(long, default_value = "Robot Fleet Development CA")]
        common_name: String,
        #[arg(long, default_value_t = 3650)]
        days: u32,
    },
    /// Issue a key and certificate for a robot, signed by the CA in the folder.
    Issue {
        robot_id: String,
        #[arg(long, default_value = "certs")]
        out: PathBuf,
        #[arg(long, default_value_t = 365)]
        days: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "SIGNALLING_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// sqlite://PATH or postgres://… (default: a SQLite file under ./data, created).
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Bearer token of the admin API; unset: one is generated at first start and logged once.
    #[arg(long, env = "SIGNALLING_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// HS256 secret for client JWTs.
    #[arg(long, env = "SIGNALLING_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// JWKS URL with RS256/ES256 keys for client JWTs.
    #[arg(long, env = "SIGNALLING_JWKS_URL")]
    pub jwks_url: Option<String>,
    /// JWKS file with RS256/ES256 keys for client JWTs.
    #[arg(long, env = "SIGNALLING_JWKS_FILE")]
    pub jwks_file: Option<PathBuf>,
    #[arg(long, env = "SIGNALLING_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    #[arg(long, env = "SIGNALLING_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,

    /// PEM bundle of fleet CA certificates robots may chain to.
    #[arg(long, env = "SIGNALLING_TRUST_ANCHORS")]
    pub trust_anchors: Option<PathBuf>,
    /// CA certificate (PEM) that signs enrollment CSRs.
    #[arg(long, env = "SIGNALLING_CA_CERT", requires = "ca_key")]
    pub ca_cert: Option<PathBuf>,
    /// Private key (PEM) of --ca-cert.
    #[arg(long, env = "SIGNALLING_CA_KEY", requires = "ca_cert")]
    pub ca_key: Option<PathBuf>,
    /// Ed25519 private key (PKCS#8 PEM) that signs session tickets; the same file on every
    /// node [default: signing-key.pem beside a SQLite database, or under ./data; generated
    /// at first start].
    #[arg(long, env = "SIGNALLING_SIGNING_KEY_FILE")]
    pub signing_key_file: Option<PathBuf>,
    /// The signing key before a rotation (private or public PEM): still published, so
    /// robots that enroll during the rotation pin both.
    #[arg(long, env = "SIGNALLING_SIGNING_KEY_PREVIOUS_FILE")]
    pub signing_key_previous_file: Option<PathBuf>,
    /// Sign session tickets into offers and ARP frames for robots (`false`: none are
    /// minted, and robots that require them refuse every offer and ARP call; for fleets
    /// whose robots check none, and for measuring what tickets cost).
    #[arg(long, env = "SIGNALLING_SESSION_TICKETS", default_value_t = true, action = clap::ArgAction::Set)]
    pub session_tickets: bool,
    /// How often the tickets of live teleop sessions are renewed for robots that take
    /// renewals (they end a session whose ticket runs out) [default: a third of a
    /// ticket's 120 s life].
    #[arg(long, env = "SIGNALLING_TICKET_RENEW_SECS", default_value_t = crate::tickets::RENEW_INTERVAL.as_secs(), value_parser = clap::value_parser!(u64).range(1..=100))]
    pub ticket_renew_secs: u64,
    /// Robots whose certificate chains to a trust anchor need no prior record.
    #[arg(long, env = "SIGNALLING_AUTO_REGISTER")]
    pub auto_register: bool,
    /// CRL (PEM or DER) whose serials are revoked; reloaded on change and on SIGHUP.
    #[arg(long, env = "SIGNALLING_CRL")]
    pub crl: Option<PathBuf>,
    /// Lifetime of certificates issued at enrollment.
    #[arg(long, env = "SIGNALLING_CERT_LIFETIME_DAYS", default_value_t = 365)]
    pub cert_lifetime_days: u32,

    /// Redis URL for sharing presence and relay between nodes.
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// This node's name (default: random per start).
    #[arg(long, env = "SIGNALLING_NODE_ID")]
    pub node_id: Option<String>,
    /// Prefix of every Redis key and channel (several clusters may share one Redis).
    #[arg(long, env = "SIGNALLING_REDIS_PREFIX", default_value = "signalling:")]
    pub redis_prefix: String,
    /// Seconds a node's heartbeat lease lasts in Redis: a node silent this long is dead,
    /// its robots read offline and its sessions are ended by the others.
    #[arg(long = "node-ttl", env = "SIGNALLING_NODE_TTL", default_value_t = 10)]
    pub node_ttl_secs: u64,
    /// Seconds a control lock lasts in Redis unless its node renews it.
    #[arg(long = "lock-ttl", env = "SIGNALLING_LOCK_TTL", default_value_t = 10)]
    pub lock_ttl_secs: u64,

    /// STUN URLs for `iceServers`, comma separated.
    #[arg(long, env = "SIGNALLING_STUN_URLS", value_delimiter = ',')]
    pub stun_urls: Vec<String>,
    /// TURN URLs for `iceServers`, comma separated.
    #[arg(long, env = "SIGNALLING_TURN_URLS", value_delimiter = ',')]
    pub turn_urls: Vec<String>,
    /// Shared secret of the TURN server (coturn `use-auth-secret`).
    #[arg(long, env = "SIGNALLING_TURN_SECRET", hide_env_values = true)]
    pub turn_secret: Option<String>,
    /// Lifetime of TURN credentials in seconds; connections get fresh ones before expiry.
    #[arg(long, env = "SIGNALLING_TURN_TTL", default_value_t = 600)]
    pub turn_ttl: u64,

    /// A browser origin (`http(s)://host[:port]`) allowed to call the remote MCP endpoint
    /// and open the ARP gateway besides the server's own; repeatable or comma separated. Any
    /// other page's `Origin` is refused with 403 (DNS rebinding); programs send none and pass.
    #[arg(long = "allow-origin", env = "SIGNALLING_ALLOW_ORIGINS", value_name = "ORIGIN",
          value_delimiter = ',', value_parser = crate::origin::parse_allowed)]
    pub allow_origins: Vec<String>,

    #[arg(long, env = "SIGNALLING_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, env = "SIGNALLING_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    #[arg(
        long,
        env = "SIGNALLING_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,

    /// Largest WebSocket frame accepted, in bytes.
    #[arg(long, env = "SIGNALLING_MAX_FRAME_BYTES", default_value_t = 64 * 1024)]
    pub max_frame_bytes: usize,
    /// Sustained messages per second one connection may send.
    #[arg(long, env = "SIGNALLING_RATE_LIMIT", default_value_t = 50)]
    pub rate_limit: u32,
    /// Burst allowance above the sustained rate.
    #[arg(long, env = "SIGNALLING_RATE_BURST", default_value_t = 200)]
    pub rate_burst: u32,
    /// Seconds between WebSocket pings to each connection.
    #[arg(long, env = "SIGNALLING_PING_INTERVAL", default_value_t = 20)]
    pub ping_interval_secs: u64,
    /// A connection silent for this many seconds is dropped (keep it above the ping interval).
    #[arg(long, env = "SIGNALLING_IDLE_TIMEOUT", default_value_t = 60)]
    pub idle_timeout_secs: u64,
    /// Seconds a robot has to answer its PKI challenge.
    #[arg(long, env = "SIGNALLING_CHALLENGE_TTL", default_value_t = 30)]
    pub challenge_ttl_secs: u64,
    /// Seconds an unauthenticated connection has to register and prove itself.
    #[arg(long, env = "SIGNALLING_LOGIN_TIMEOUT", default_value_t = 60)]
    pub login_timeout_secs: u64,
    /// Lifetime of enrollment tokens in seconds.
    #[arg(
        long,
        env = "SIGNALLING_ENROLLMENT_TOKEN_TTL",
        default_value_t = 86_400
    )]
    pub enrollment_token_ttl_secs: u64,
    /// Messages queued per connection before it counts as too slow and is closed.
    #[arg(long, env = "SIGNALLING_SEND_QUEUE", default_value_t = 512)]
    pub send_queue: usize,
    /// Bytes a socket's send queue may hold; one sender may hold a quarter of it.
    #[arg(long, env = "SIGNALLING_SEND_QUEUE_BYTES", default_value_t = 1024 * 1024)]
    pub send_queue_bytes: usize,
    /// Bytes per second one socket may relay to another (0: no limit). Signalling needs
    /// a few KB per session; this stops one session's flood from starving the others.
    #[arg(long, env = "SIGNALLING_RELAY_BYTES_PER_SEC", default_value_t = 256 * 1024)]
    pub relay_bytes_per_sec: u64,
    /// A socket whose writes make no progress for this long is closed.
    #[arg(long, env = "SIGNALLING_WRITE_TIMEOUT", default_value_t = 10)]
    pub write_timeout_secs: u64,
    /// Errors earned plus messages over the rate limit, within 10 s, that close a socket.
    #[arg(long, env = "SIGNALLING_MAX_STRIKES", default_value_t = 100)]
    pub max_strikes: usize,
    /// Live sessions, and session ids claimed (live or ended within the grace period), per
    /// connection.
    #[arg(
        long,
        env = "SIGNALLING_MAX_SESSIONS_PER_CONNECTION",
        default_value_t = 16
    )]
    pub max_sessions_per_connection: usize,
    /// Viewing (non-driving) sessions one subject may hold with one robot, over all its
    /// sockets and nodes (0: no limit).
    #[arg(
        long,
        env = "SIGNALLING_MAX_VIEWER_SESSIONS_PER_SUBJECT",
        default_value_t = 4
    )]
    pub max_viewer_sessions_per_subject: usize,
    /// Viewing sessions one robot may have in all (0: no limit). Below robot-agent's 16
    /// sessions, so a controller always finds a place.
    #[arg(
        long,
        env = "SIGNALLING_MAX_VIEWER_SESSIONS_PER_ROBOT",
        default_value_t = 12
    )]
    pub max_viewer_sessions_per_robot: usize,
    /// Seconds after a session ends during which its two ends may still mention it (late
    /// `disconnected`, ICE candidates) without an error.
    #[arg(long, env = "SIGNALLING_SESSION_GRACE", default_value_t = 60)]
    pub session_grace_secs: u64,
    /// Seconds a session outlives its client's socket, so the same subject can take it back
    /// from a new socket (the browser SDK re-offers on the same connectionId after a
    /// signalling reconnect; the peer connection never depended on the socket). 0: the
    /// session ends with the socket and the robot is told at once.
    #[arg(long, env = "SIGNALLING_SESSION_RESUME", default_value_t = 0)]
    pub session_resume_secs: u64,
    /// Also greet every client socket with the flat `{"type":"welcome"}` that Modulr's
    /// older web app waits for before it sends anything. Off by default: it is not a spec
    /// message. (Flat frames from clients are translated whatever this says.)
    #[arg(long, env = "SIGNALLING_LEGACY_CLIENTS")]
    pub legacy_clients: bool,
    /// WebSocket connections open at once (0: no limit); over it, upgrades get 503.
    #[arg(long, env = "SIGNALLING_MAX_CONNECTIONS", default_value_t = 50_000)]
    pub max_connections: usize,
    /// WebSocket connections from one source address (0: no limit); over it, 429. Behind
    /// a load balancer every client shares its address: set 0 there and limit at the proxy.
    #[arg(
        long,
        env = "SIGNALLING_MAX_CONNECTIONS_PER_IP",
        default_value_t = 1_000
    )]
    pub max_connections_per_ip: usize,
    /// TCP connections from one source (an IPv4 address or an IPv6 /64; 0: no limit),
    /// WebSockets and plain HTTP together; over it, a connection is closed as it is
    /// accepted. Behind a load balancer set 0 and limit at the proxy.
    #[arg(
        long,
        env = "SIGNALLING_MAX_TCP_CONNECTIONS_PER_IP",
        default_value_t = 1_100
    )]
    pub max_tcp_connections_per_ip: usize,
    /// TCP connections open at once. 0: the process's open-file limit less 64 kept for
    /// the database, Redis and files, so a flood of connections cannot take them.
    #[arg(long, env = "SIGNALLING_MAX_TCP_CONNECTIONS", default_value_t = 0)]
    pub max_tcp_connections: usize,
    /// Seconds a client has to send a request's headers (slow-header attacks); also the
    /// longest a connection may stay silent before its first request, between two
    /// requests, or in its TLS handshake.
    #[arg(long, env = "SIGNALLING_HEADER_READ_TIMEOUT", default_value_t = 10)]
    pub header_read_timeout_secs: u64,
    /// Seconds a request's body has to arrive whole, counted from the end of its headers
    /// (slow-body attacks: the API's bodies are small JSON); late, 408 and the connection
    /// is closed.
    #[arg(long, env = "SIGNALLING_BODY_READ_TIMEOUT", default_value_t = 10)]
    pub body_read_timeout_secs: u64,
    /// Folder for audit records the database would not take (`audit-spill.jsonl`,
    /// fsync'd JSON lines, loaded back when the database takes writes again). Default: next
    /// to a SQLite database (`<file>.audit-spill.jsonl`), else `./data`. One per node.
    #[arg(long, env = "SIGNALLING_AUDIT_SPILL_DIR")]
    pub audit_spill_dir: Option<std::path::PathBuf>,
    /// Seconds graceful shutdown waits for connections to close.
    #[arg(long, env = "SIGNALLING_SHUTDOWN_GRACE", default_value_t = 5)]
    pub shutdown_grace_secs: u64,
    /// `socket_limits()`, once made.
    #[arg(skip)]
    socket_limits: OnceLock<SocketLimits>,
}

impl Config {
    /// Defaults as if started with no flags (environment variables still apply).
    pub fn from_args<I, T>(args: I) -> Result<Config, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            config: Config,
        }
        Only::try_parse_from(args).map(|o| o.config)
    }

    /// What each socket's send queue may hold.
    pub fn queue_limits(&self) -> crate::delivery::QueueLimits {
        crate::delivery::QueueLimits::new(
            self.send_queue,
            self.send_queue_bytes,
            self.relay_bytes_per_sec,
        )
    }

    /// What each socket may do and how long it may take, made at the first call and kept:
    /// every socket reads the one copy (a copy in each socket's task would be about 200
    /// bytes of every socket). Fields changed after the first call are not seen here.
    pub fn socket_limits(&self) -> &SocketLimits {
        self.socket_limits.get_or_init(|| SocketLimits {
            queue: self.queue_limits(),
            close_drain: self.send_queue,
            max_frame_bytes: self.max_frame_bytes,
            rate: u64::from(self.rate_limit),
            burst: u64::from(self.rate_burst),
            max_strikes: self.max_strikes,
            login_timeout: Duration::from_secs(self.login_timeout_secs),
            ping_every: Duration::from_secs(self.ping_interval_secs.max(1)),
            idle_timeout: Duration::from_secs(self.idle_timeout_secs.max(1)),
            write_timeout: Duration::from_secs(self.write_timeout_secs.max(1)),
        })
    }

    pub fn database_url(&self) -> &str {
        self.database_url
            .as_deref()
            .unwrap_or(crate::store::DEFAULT_DATABASE_URL)
    }

    /// The cap on TCP connections open at once (see `max_tcp_connections`; 0: none known).
    pub fn tcp_connection_cap(&self) -> usize {
        if self.max_tcp_connections > 0 {
            return self.max_tcp_connections;
        }
        open_file_limit().map_or(0, |limit| limit.saturating_sub(64).max(1))
    }

    /// The TCP caps in force: (in all, per source). One source may hold at most a quarter
    /// of the total, so a single address cannot fill the server when the file limit makes
    /// the total small. A per-source 0 (behind a load balancer) stays 0.
    pub fn tcp_connection_limits(&self) -> (usize, usize) {
        let total = self.tcp_connection_cap();
        let per_source = self.max_tcp_connections_per_ip;
        if total == 0 || per_source == 0 {
            return (total, per_source);
        }
        (total, per_source.min((total / 4).max(1)))
    }

    /// Where audit records the database would not take are spilled.
    pub fn audit_spill_file(&self) -> std::path::PathBuf {
        if let Some(dir) = &self.audit_spill_dir {
            return dir.join("audit-spill.jsonl");
        }
        let url = self.database_url();
        if let Some(rest) = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
        {
            let path = rest.split('?').next().unwrap_or_default();
            if !path.is_empty() && path != ":memory:" && !rest.contains("mode=memory") {
                return format!("{path}.audit-spill.jsonl").into();
            }
        }
        std::path::PathBuf::from("data/audit-spill.jsonl")
    }

    pub fn challenge_ttl(&self) -> Duration {
        Duration::from_secs(self.challenge_ttl_secs)
    }
}

/// The soft limit on open files, as the kernel reports it (Linux); None elsewhere or when
/// unlimited.
fn open_file_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// What a socket may do and how long it may take, from the server's configuration: made
/// once (`Config::socket_limits`) and read by every socket through the state it holds.
#[derive(Debug, Clone, Copy)]
pub struct SocketLimits {
    /// What the socket's send queue may hold.
    pub queue: crate::delivery::QueueLimits,
    /// Most frames the writer still sends between a close request and the close frame.
    pub close_drain: usize,
    /// Largest frame read, in bytes.
    pub max_frame_bytes: usize,
    /// Frames per second (sustained and burst) before frames are refused.
    pub rate: u64,
    pub burst: u64,
    /// Strikes within `STRIKE_WINDOW` that close the socket.
    pub max_strikes: usize,
    /// Time an unverified socket has to log in.
    pub login_timeout: Duration,
    pub ping_every: Duration,
    /// Silence after which a socket is taken for dead (checked at each ping).
    pub idle_timeout: Duration,
    /// Longest a batch of writes may make no progress.
    pub write_timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::Config;

    #[test]
    fn one_source_gets_at_most_a_quarter_of_the_tcp_connections() {
        let limits = |args: &[&str]| {
            let mut all = vec!["signalling-server"];
            all.extend_from_slice(args);
            Config::from_args(all)
                .expect("config")
                .tcp_connection_limits()
        };
        // 256 open files: 192 in all, 1,100 asked per source.
        assert_eq!(limits(&["--max-tcp-connections", "192"]), (192, 48));
        assert_eq!(
            limits(&[
                "--max-tcp-connections",
                "10000",
                "--max-tcp-connections-per-ip",
                "100"
            ]),
            (10_000, 100)
        );
        // Behind a load balancer: no per-source limit stays none.
        assert_eq!(
            limits(&[
                "--max-tcp-connections",
                "192",
                "--max-tcp-connections-per-ip",
                "0"
            ]),
            (192, 0)
        );
        assert_eq!(limits(&["--max-tcp-connections", "2"]), (2, 1));
    }
}
