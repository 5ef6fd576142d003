//! Configuration: the TOML file (same keys as the `run` flags, plus a few
//! that only make sense in a file) and where things live on disk.
//!
//! Precedence: command-line flag > config file > built-in default. Relative
//! paths in the file are relative to the config folder.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::arp::config::{ArpConfigError, ArpFileConfig, ListenConfig, Token};
use crate::driver::DriverSpec;
use crate::safety::SafetyLimits;
use crate::video::{VideoConfig, VideoError, VideoSpec};

/// Name of the config file inside the config folder.
pub const CONFIG_FILE: &str = "agent.toml";
pub const KEY_FILE: &str = "agent.key";
pub const CERT_FILE: &str = "agent.crt";
pub const LOCATIONS_FILE: &str = "locations.json";
pub const SETTINGS_FILE: &str = "settings.json";
/// The local ARP socket's token, `operator:SECRET`, written by `enroll`.
pub const ARP_TOKEN_FILE: &str = "arp-token";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("missing {0}: give it as a flag or in the config file")]
    Missing(&'static str),
    #[error("invalid server URL {0:?}: expected ws://… or wss://…")]
    ServerUrl(String),
    #[error(transparent)]
    Driver(#[from] crate::driver::DriverError),
    #[error(transparent)]
    Video(#[from] VideoError),
    #[error(transparent)]
    Arp(#[from] ArpConfigError),
    #[error(
        "the local ARP socket (--arp-listen {0}) needs a token: `robot-agent enroll` writes one to \
         {1}; or give --arp-token-file PATH; only a loopback address may go without one, and \
         only with --arp-no-token"
    )]
    ArpTokenMissing(std::net::SocketAddr, PathBuf),
    #[error("--arp-no-token serves the ARP socket to every local program: it is refused on the non-loopback address {0}")]
    ArpNoTokenOnNetwork(std::net::SocketAddr),
    #[error("--arp-no-token and ARP tokens ({0} given) contradict each other")]
    ArpNoTokenWithTokens(usize),
    #[error(
        "invalid --arp-allow-origin {0:?}: expected scheme://host[:port] as a browser sends it"
    )]
    ArpOrigin(String),
    #[error("cannot read the ARP token file {path}: {source}")]
    ArpTokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("ARP token file {path}, line {line}: {source}")]
    ArpTokenLine {
        path: PathBuf,
        line: usize,
        #[source]
        source: ArpConfigError,
    },
}

/// Reconnect backoff of the signalling client.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReconnectConfig {
    pub initial_delay_ms: u64,
    pub max_delay_ms: u64,
}

impl Default for ReconnectConfig {
    fn default() -> Self {
        ReconnectConfig {
            initial_delay_ms: 500,
            max_delay_ms: 30_000,
        }
    }
}

impl ReconnectConfig {
    pub fn initial(&self) -> Duration {
        Duration::from_millis(self.initial_delay_ms.max(1))
    }

    pub fn max(&self) -> Duration {
        Duration::from_millis(self.max_delay_ms.max(self.initial_delay_ms.max(1)))
    }
}

/// `server` in the file: one URL, or a list tried in turn.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum ServerSetting {
    One(String),
    Many(Vec<String>),
}

impl ServerSetting {
    fn urls(self) -> Vec<String> {
        match self {
            ServerSetting::One(s) => split_servers(&s),
            ServerSetting::Many(list) => list.iter().flat_map(|s| split_servers(s)).collect(),
        }
    }
}

/// A comma-separated list of server URLs (`--server a,b`).
pub fn split_servers(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The config file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub server: Option<ServerSetting>,
    pub robot_id: Option<String>,
    pub driver: Option<String>,
    pub key_file: Option<PathBuf>,
    pub certificate_file: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    /// Extra CA certificates (PEM) trusted for `wss://` besides the system's.
    pub ca_file: Option<PathBuf>,
    /// Offer loopback ICE candidates (same-host peers, tests).
    pub include_loopback_candidates: Option<bool>,
    pub max_locations: Option<usize>,
    pub safety: Option<SafetyLimits>,
    pub reconnect: Option<ReconnectConfig>,
    /// `[[video]]` tables: the robot's cameras.
    #[serde(default)]
    pub video: Vec<VideoConfig>,
    /// Seconds an `exec:` video source keeps running after its last viewer.
    pub video_grace_s: Option<f64>,
    /// `[arp]`: the ARP server's settings.
    pub arp: Option<ArpSection>,
    /// Refuse offers and gateway ARP frames without a valid session ticket of the
    /// server [default: on once a server key is pinned, see docs/robot-agent.md].
    pub require_tickets: Option<bool>,
    /// Sign every `agent.*` message sent on the data channel with the robot's key
    /// (`meta.signature`, a detached JWS) [default: false, see docs/robot-agent.md].
    pub sign_replies: Option<bool>,
    /// The pinned server signing keys [default: CONFIG_DIR/server-keys.json].
    pub server_keys_file: Option<PathBuf>,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })
    }
}

/// `[arp]` in the file: the ARP server's settings ([`ArpFileConfig`]) and
/// the local socket's gate, read here because it is the command line's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ArpSection {
    pub server: ArpFileConfig,
    /// `allow_origins`: browser origins let through (`--arp-allow-origin`).
    pub allow_origins: Vec<String>,
    /// `token_file`: a file of `ROLE:SECRET` lines (`--arp-token-file`).
    pub token_file: Option<PathBuf>,
    /// `no_token`: serve a loopback socket without a token (`--arp-no-token`).
    pub no_token: bool,
}

impl<'de> Deserialize<'de> for ArpSection {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Gate {
            #[serde(default)]
            allow_origins: Vec<String>,
            token_file: Option<PathBuf>,
            #[serde(default)]
            no_token: bool,
        }
        use serde::de::Error;
        let mut table = toml::Table::deserialize(deserializer)?;
        let mut gate = toml::Table::new();
        for key in ["allow_origins", "token_file", "no_token"] {
            if let Some(value) = table.remove(key) {
                gate.insert(key.to_owned(), value);
            }
        }
        // The rest keeps ArpFileConfig's own checks (unknown keys refused).
        let server: ArpFileConfig = toml::Value::Table(table)
            .try_into()
            .map_err(D::Error::custom)?;
        let gate: Gate = toml::Value::Table(gate)
            .try_into()
            .map_err(D::Error::custom)?;
        Ok(ArpSection {
            server,
            allow_origins: gate.allow_origins,
            token_file: gate.token_file,
            no_token: gate.no_token,
        })
    }
}

/// Flags of `robot-agent run` that override the file.
#[derive(Debug, Default, Clone)]
pub struct RunFlags {
    pub config: Option<PathBuf>,
    pub config_dir: Option<PathBuf>,
    pub server: Option<String>,
    pub robot_id: Option<String>,
    pub driver: Option<String>,
    /// `--video NAME=SOURCE`, in order.
    pub video: Vec<VideoSpec>,
    /// `--arp-listen ADDR`.
    pub arp_listen: Option<String>,
    /// `--arp-token ROLE:SECRET` (and the environment variable), added to
    /// the file's tokens.
    pub arp_tokens: Vec<String>,
    /// `--arp-token-file PATH`: files of `ROLE:SECRET` lines.
    pub arp_token_files: Vec<PathBuf>,
    /// `--arp-no-token`: a loopback socket without a token.
    pub arp_no_token: bool,
    /// `--arp-allow-origin ORIGIN`, added to the file's.
    pub arp_allow_origins: Vec<String>,
}

/// Everything `run` needs, resolved.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Signalling servers, tried in turn.
    pub servers: Vec<String>,
    pub robot_id: String,
    pub driver: DriverSpec,
    pub config_dir: PathBuf,
    pub key_file: PathBuf,
    pub certificate_file: PathBuf,
    pub data_dir: PathBuf,
    pub ca_file: Option<PathBuf>,
    pub include_loopback_candidates: bool,
    pub max_locations: usize,
    pub safety: SafetyLimits,
    pub reconnect: ReconnectConfig,
    pub video: Vec<VideoSpec>,
    pub video_grace: Duration,
    /// `[arp]` of the file (tokens merged with the flags').
    pub arp: ArpFileConfig,
    /// The local ARP WebSocket, if enabled.
    pub arp_listen: Option<ListenConfig>,
    /// Browser origins the local ARP WebSocket lets through (normalised).
    pub arp_allow_origins: Vec<String>,
    /// `require_tickets` as configured (`None`: on once a key is pinned).
    pub require_tickets: Option<bool>,
    /// `sign_replies`: sign the data channel's `agent.*` messages ([`crate::reply_signing`]).
    pub sign_replies: bool,
    /// The pinned server signing keys ([`crate::server_keys`]).
    pub server_keys_file: PathBuf,
}

impl RunConfig {
    pub fn resolve(flags: RunFlags) -> Result<RunConfig, ConfigError> {
        let (config_dir, file) = load(&flags)?;
        let within = |p: PathBuf| {
            if p.is_absolute() {
                p
            } else {
                config_dir.join(p)
            }
        };
        let servers = servers(flags.server.as_deref(), file.server.clone())?;
        let robot_id = flags
            .robot_id
            .or(file.robot_id)
            .ok_or(ConfigError::Missing("robot id (--robot-id)"))?;
        let driver = driver_spec(flags.driver.or(file.driver)).parse()?;
        let video = VideoSpec::merge(&file.video, &flags.video)?;
        let video_grace = file
            .video_grace_s
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map_or(crate::video::DEFAULT_GRACE, Duration::from_secs_f64);
        let data_dir = file
            .data_dir
            .map(&within)
            .or_else(|| std::env::var_os("ROBOT_AGENT_DATA_DIR").map(PathBuf::from))
            .unwrap_or_else(|| config_dir.clone());
        let section = file.arp.unwrap_or_default();
        let mut arp = section.server;
        arp.tokens.extend(flags.arp_tokens);
        let tokens = arp
            .tokens
            .iter()
            .map(|t| t.parse::<Token>())
            .collect::<Result<Vec<_>, _>>()?;
        let arp_allow_origins = section
            .allow_origins
            .iter()
            .chain(&flags.arp_allow_origins)
            .map(|o| check_origin(o))
            .collect::<Result<Vec<_>, _>>()?;
        let no_token = flags.arp_no_token || section.no_token;
        let arp_listen = match flags.arp_listen.or_else(|| arp.listen.clone()) {
            None => None,
            Some(addr) => {
                let mut files: Vec<PathBuf> = flags.arp_token_files.clone();
                files.extend(section.token_file.clone().map(&within));
                Some(listen_config(&addr, &config_dir, files, tokens, no_token)?)
            }
        };
        // Checked now, so a mistake stops the start rather than the first call.
        crate::arp::ArpOptions::from_file(&arp, true)?;
        Ok(RunConfig {
            arp,
            arp_listen,
            arp_allow_origins,
            servers,
            robot_id,
            driver,
            key_file: within(file.key_file.unwrap_or_else(|| KEY_FILE.into())),
            certificate_file: within(file.certificate_file.unwrap_or_else(|| CERT_FILE.into())),
            server_keys_file: within(
                file.server_keys_file
                    .unwrap_or_else(|| crate::server_keys::SERVER_KEYS_FILE.into()),
            ),
            require_tickets: file.require_tickets,
            sign_replies: file.sign_replies.unwrap_or(false),
            ca_file: file.ca_file.map(&within),
            data_dir,
            include_loopback_candidates: file.include_loopback_candidates.unwrap_or(false),
            max_locations: file
                .max_locations
                .unwrap_or(crate::locations::DEFAULT_MAX_LOCATIONS),
            safety: file.safety.unwrap_or_default(),
            reconnect: file.reconnect.unwrap_or_default(),
            video,
            video_grace,
            config_dir,
        })
    }
}

/// The driver named by `--driver` or the file; none: the simulated base, said so.
fn driver_spec(named: Option<String>) -> String {
    named.unwrap_or_else(|| {
        tracing::warn!("no driver configured; using the simulated base (--driver sim)");
        "sim".to_owned()
    })
}

/// The config folder and the file in it (or the one `--config` names; none: defaults).
fn load(flags: &RunFlags) -> Result<(PathBuf, FileConfig), ConfigError> {
    Ok(match &flags.config {
        Some(path) => {
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
                _ => PathBuf::from("."),
            };
            (
                flags.config_dir.clone().unwrap_or(dir),
                FileConfig::load(path)?,
            )
        }
        None => {
            let dir = flags.config_dir.clone().unwrap_or_else(default_config_dir);
            let path = dir.join(CONFIG_FILE);
            let file = if path.exists() {
                FileConfig::load(&path)?
            } else {
                FileConfig::default()
            };
            (dir, file)
        }
    })
}

/// The signalling servers: `--server` over the file's; at least one, each a WebSocket URL.
fn servers(flag: Option<&str>, file: Option<ServerSetting>) -> Result<Vec<String>, ConfigError> {
    let servers = match flag {
        Some(flag) => split_servers(flag),
        None => file.map(ServerSetting::urls).unwrap_or_default(),
    };
    if servers.is_empty() {
        return Err(ConfigError::Missing("server (--server)"));
    }
    if let Some(bad) = servers
        .iter()
        .find(|s| !(s.starts_with("ws://") || s.starts_with("wss://")))
    {
        return Err(ConfigError::ServerUrl(bad.clone()));
    }
    Ok(servers)
}

/// The local ARP socket on `addr`: `tokens` and those of the token `files` (the enrolled
/// token file when none is named), or none at all with `no_token` (loopback only).
fn listen_config(
    addr: &str,
    config_dir: &std::path::Path,
    mut files: Vec<PathBuf>,
    mut tokens: Vec<Token>,
    no_token: bool,
) -> Result<ListenConfig, ConfigError> {
    let default_file = config_dir.join(ARP_TOKEN_FILE);
    if files.is_empty() && !no_token && default_file.exists() {
        files.push(default_file.clone());
    }
    for path in &files {
        tokens.extend(read_token_file(path)?);
    }
    let at: std::net::SocketAddr = addr
        .parse()
        .map_err(|_| ArpConfigError::Listen(addr.to_owned()))?;
    if no_token {
        if !tokens.is_empty() {
            return Err(ConfigError::ArpNoTokenWithTokens(tokens.len()));
        }
        if !at.ip().is_loopback() {
            return Err(ConfigError::ArpNoTokenOnNetwork(at));
        }
    } else if tokens.is_empty() {
        return Err(ConfigError::ArpTokenMissing(at, default_file));
    }
    Ok(ListenConfig::new(addr, tokens)?)
}

/// A browser origin as `--arp-allow-origin` takes it: `scheme://host[:port]`
/// (no path), compared case-insensitively.
fn check_origin(origin: &str) -> Result<String, ConfigError> {
    let normal = crate::arp::ws::normalise_origin(origin);
    let valid = normal.split_once("://").is_some_and(|(scheme, host)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            && !host.is_empty()
            && !host.contains(['/', '?', '#', '@', ' ', '*'])
    });
    if valid {
        Ok(normal)
    } else {
        Err(ConfigError::ArpOrigin(origin.to_owned()))
    }
}

/// The tokens of a token file: `ROLE:SECRET` lines; blank lines and `#`
/// comments are skipped. A file others may read is used, with a warning.
pub fn read_token_file(path: &Path) -> Result<Vec<Token>, ConfigError> {
    let err = |source| ConfigError::ArpTokenFile {
        path: path.to_owned(),
        source,
    };
    let text = std::fs::read_to_string(path).map_err(err)?;
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.mode() & 0o077 != 0 {
            tracing::warn!(path = %path.display(), mode = format!("{:o}", meta.mode() & 0o777), "the ARP token file is readable by other users; chmod 600 it");
        }
    }
    text.lines()
        .enumerate()
        .map(|(i, line)| (i + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
        .map(|(line, text)| {
            text.parse::<Token>()
                .map_err(|source| ConfigError::ArpTokenLine {
                    path: path.to_owned(),
                    line,
                    source,
                })
        })
        .collect()
}

/// `$ROBOT_AGENT_CONFIG_DIR`, else `/etc/robot-agent` for root, else
/// `$XDG_CONFIG_HOME/robot-agent` (or `~/.config/robot-agent`).
pub fn default_config_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ROBOT_AGENT_CONFIG_DIR") {
        return PathBuf::from(dir);
    }
    let is_root = std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false);
    if is_root {
        return PathBuf::from("/etc/robot-agent");
    }
    if let Some(xdg) = std::env::var_os("XDG_CONFIG_HOME") {
        return PathBuf::from(xdg).join("robot-agent");
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".config").join("robot-agent"),
        None => PathBuf::from("/etc/robot-agent"),
    }
}

/// The signalling WebSocket URL for an HTTP base URL: `https://h` →
/// `wss://h/ws`. A `ws(s)://` URL is returned unchanged.
pub fn websocket_url(server: &str) -> String {
    let trimmed = server.trim_end_matches('/');
    if trimmed.starts_with("ws://") || trimmed.starts_with("wss://") {
        return trimmed.to_owned();
    }
    let base = if let Some(rest) = trimmed.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = trimmed.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        format!("wss://{trimmed}")
    };
    format!("{base}/ws")
}

/// The HTTP base URL for a server given either way: `wss://h/ws` →
/// `https://h`.
pub fn http_base_url(server: &str) -> String {
    let trimmed = server.trim_end_matches('/');
    let trimmed = trimmed.strip_suffix("/ws").unwrap_or(trimmed);
    if let Some(rest) = trimmed.strip_prefix("wss://") {
        format!("https://{rest}")
    } else if let Some(rest) = trimmed.strip_prefix("ws://") {
        format!("http://{rest}")
    } else if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
        trimmed.to_owned()
    } else {
        format!("https://{trimmed}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_convert_both_ways() {
        assert_eq!(
            websocket_url("https://sig.example.com/"),
            "wss://sig.example.com/ws"
        );
        assert_eq!(
            websocket_url("http://127.0.0.1:8080"),
            "ws://127.0.0.1:8080/ws"
        );
        assert_eq!(
            websocket_url("ws://127.0.0.1:8080/ws"),
            "ws://127.0.0.1:8080/ws"
        );
        assert_eq!(
            http_base_url("wss://sig.example.com/ws"),
            "https://sig.example.com"
        );
        assert_eq!(
            http_base_url("http://127.0.0.1:8080/"),
            "http://127.0.0.1:8080"
        );
        assert_eq!(http_base_url("sig.example.com"), "https://sig.example.com");
    }

    #[test]
    fn flags_override_the_file_and_paths_are_relative_to_it() {
        let dir = crate::testutil::temp_dir("config");
        let path = dir.join("agent.toml");
        std::fs::write(
            &path,
            r#"
server = "ws://127.0.0.1:1/ws"
robot_id = "from-file"
driver = "exec:./drive.py"
data_dir = "state"
include_loopback_candidates = true

[safety]
max_linear_speed = 0.8
watchdog_ms = 250
future_tolerance_ms = 200

[reconnect]
max_delay_ms = 2000

[[video]]
name = "front"
source = "exec:ffmpeg -f v4l2 -i /dev/video0 -f h264 -"

[[video]]
name = "rear"
source = "rtp:127.0.0.1:5004"
"#,
        )
        .expect("write");
        let config = RunConfig::resolve(RunFlags {
            config: Some(path.clone()),
            robot_id: Some("from-flag".into()),
            video: vec!["rear=rtp:127.0.0.1:5006".parse().expect("video flag")],
            ..RunFlags::default()
        })
        .expect("resolves");
        assert_eq!(config.robot_id, "from-flag");
        assert_eq!(config.servers, vec!["ws://127.0.0.1:1/ws".to_owned()]);
        assert_eq!(config.driver, DriverSpec::Exec("./drive.py".into()));
        assert_eq!(config.data_dir, dir.join("state"));
        assert_eq!(config.key_file, dir.join(KEY_FILE));
        assert_eq!(config.safety.max_linear, 0.8);
        assert_eq!(config.safety.max_angular, 1.0);
        assert_eq!(config.safety.watchdog, Duration::from_millis(250));
        // The freshness window is the watchdog's; unset keys keep defaults.
        let freshness = config.safety.freshness();
        assert_eq!(freshness.window, Duration::from_millis(250));
        assert_eq!(freshness.future_tolerance, Duration::from_millis(200));
        assert_eq!(freshness.clock_window, Duration::from_secs(10));
        assert_eq!(config.reconnect.max(), Duration::from_millis(2000));
        assert!(config.include_loopback_candidates);
        let cameras: Vec<_> = config
            .video
            .iter()
            .map(|v| (v.name.as_str(), v.source.clone()))
            .collect();
        assert_eq!(
            cameras,
            vec![
                (
                    "front",
                    crate::video::SourceSpec::Exec(
                        "ffmpeg -f v4l2 -i /dev/video0 -f h264 -".into()
                    )
                ),
                (
                    "rear",
                    crate::video::SourceSpec::Rtp("127.0.0.1:5006".parse().expect("addr"))
                ),
            ],
            "the flag replaced the file's camera of the same name"
        );
        assert_eq!(config.video_grace, crate::video::DEFAULT_GRACE);
    }

    #[test]
    fn several_servers_from_a_flag_or_a_file_list() {
        let dir = crate::testutil::temp_dir("config-servers");
        let path = dir.join("agent.toml");
        std::fs::write(
            &path,
            "server = [\"wss://a.example/ws\", \"wss://b.example/ws\"]\nrobot_id = \"r\"\n",
        )
        .expect("write");
        let config = RunConfig::resolve(RunFlags {
            config: Some(path.clone()),
            ..RunFlags::default()
        })
        .expect("resolves");
        assert_eq!(
            config.servers,
            vec!["wss://a.example/ws", "wss://b.example/ws"]
        );
        let config = RunConfig::resolve(RunFlags {
            config: Some(path.clone()),
            server: Some("ws://x/ws, ws://y/ws".into()),
            ..RunFlags::default()
        })
        .expect("resolves");
        assert_eq!(config.servers, vec!["ws://x/ws", "ws://y/ws"]);
        let bad = RunConfig::resolve(RunFlags {
            config: Some(path),
            server: Some("ws://x/ws,http://y".into()),
            ..RunFlags::default()
        });
        assert!(matches!(bad, Err(ConfigError::ServerUrl(u)) if u == "http://y"));
    }

    #[test]
    fn arp_settings_merge_file_and_flags_and_guard_the_network() {
        let dir = crate::testutil::temp_dir("config-arp");
        let path = dir.join("agent.toml");
        std::fs::write(
            &path,
            r#"
server = "ws://127.0.0.1:1/ws"
robot_id = "r"

[arp]
listen = "127.0.0.1:7700"
tokens = ["viewer:v-secret"]
velocity_violation = "clamp"

[arp.confirm]
navigate_to = true

[arp.workspace]
min = [-1.0, -1.0]
max = [1.0, 1.0]
"#,
        )
        .expect("write");
        let flags = |listen: Option<&str>, tokens: &[&str]| RunFlags {
            config: Some(path.clone()),
            arp_listen: listen.map(str::to_owned),
            arp_tokens: tokens.iter().map(|t| (*t).to_owned()).collect(),
            ..RunFlags::default()
        };
        let config = RunConfig::resolve(flags(None, &["operator:o-secret"])).expect("resolves");
        let listen = config.arp_listen.expect("listening");
        assert_eq!(listen.addr.to_string(), "127.0.0.1:7700");
        let roles: Vec<_> = listen.tokens.iter().map(|t| t.role).collect();
        assert_eq!(
            roles,
            [crate::safety::Role::Viewer, crate::safety::Role::Operator]
        );
        let options = crate::arp::ArpOptions::from_file(&config.arp, true).expect("options");
        assert_eq!(
            options.velocity_violation,
            crate::arp::ViolationAction::Clamp
        );
        assert_eq!(options.confirm.get("navigate_to"), Some(&true));
        assert!(options.workspace.is_some());
        // A flag overrides the address; the network needs a token.
        let config = RunConfig::resolve(flags(Some("0.0.0.0:7701"), &[])).expect("resolves");
        assert_eq!(config.arp_listen.expect("listen").addr.port(), 7701);
        std::fs::write(&path, "server = \"ws://x/ws\"\nrobot_id = \"r\"\n").expect("write");
        assert!(matches!(
            RunConfig::resolve(flags(Some("0.0.0.0:7701"), &[])),
            Err(ConfigError::ArpTokenMissing(..))
        ));
        assert!(matches!(
            RunConfig::resolve(flags(Some("127.0.0.1:7701"), &["root:x"])),
            Err(ConfigError::Arp(ArpConfigError::Token(_)))
        ));
        assert!(RunConfig::resolve(flags(None, &[]))
            .expect("resolves")
            .arp_listen
            .is_none());
    }

    #[test]
    fn the_arp_gate_is_set_in_the_file_and_unknown_keys_are_still_refused() {
        let dir = crate::testutil::temp_dir("config-arp-gate");
        let path = dir.join("agent.toml");
        std::fs::write(dir.join("planner.tokens"), "# planner\nviewer:p-secret\n").expect("write");
        std::fs::write(
            &path,
            r#"
server = "ws://127.0.0.1:1/ws"
robot_id = "r"

[arp]
listen = "127.0.0.1:7700"
token_file = "planner.tokens"
allow_origins = ["HTTPS://Console.Example:8443/"]
velocity_violation = "clamp"
"#,
        )
        .expect("write");
        let config = RunConfig::resolve(RunFlags {
            config: Some(path.clone()),
            arp_allow_origins: vec!["http://localhost:3000".into()],
            ..RunFlags::default()
        })
        .expect("resolves");
        let listen = config.arp_listen.expect("listening");
        assert_eq!(listen.tokens.len(), 1);
        assert_eq!(listen.tokens[0].secret, "p-secret");
        assert_eq!(
            config.arp_allow_origins,
            ["https://console.example:8443", "http://localhost:3000"]
        );
        assert_eq!(
            config.arp.velocity_violation,
            Some(crate::arp::ViolationAction::Clamp)
        );
        std::fs::write(
            &path,
            "server = \"ws://x/ws\"\nrobot_id = \"r\"\n[arp]\nlisten = \"127.0.0.1:7700\"\nno_token = true\n",
        )
        .expect("write");
        let config = RunConfig::resolve(RunFlags {
            config: Some(path.clone()),
            ..RunFlags::default()
        })
        .expect("no_token on loopback");
        assert!(config.arp_listen.expect("listening").tokens.is_empty());
        std::fs::write(
            &path,
            "server = \"ws://x/ws\"\nrobot_id = \"r\"\n[arp]\nlisen = \"127.0.0.1:7700\"\n",
        )
        .expect("write");
        assert!(matches!(
            RunConfig::resolve(RunFlags {
                config: Some(path.clone()),
                ..RunFlags::default()
            }),
            Err(ConfigError::Parse { .. })
        ));
        std::fs::write(dir.join("bad.tokens"), "operator:ok\nroot:nope\n").expect("write");
        assert!(matches!(
            read_token_file(&dir.join("bad.tokens")),
            Err(ConfigError::ArpTokenLine { line: 2, .. })
        ));
        for bad in ["*", "https://a.example/path", "console.example", "https://"] {
            assert!(check_origin(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mistakes_are_reported() {
        let dir = crate::testutil::temp_dir("config-bad");
        let path = dir.join("agent.toml");
        std::fs::write(&path, "servr = \"x\"\n").expect("write");
        assert!(matches!(
            RunConfig::resolve(RunFlags {
                config: Some(path.clone()),
                ..RunFlags::default()
            }),
            Err(ConfigError::Parse { .. })
        ));
        let flags = RunFlags {
            config_dir: Some(dir.join("empty")),
            server: Some("http://x".into()),
            robot_id: Some("r".into()),
            ..RunFlags::default()
        };
        assert!(matches!(
            RunConfig::resolve(flags),
            Err(ConfigError::ServerUrl(_))
        ));
        let flags = RunFlags {
            config_dir: Some(dir.join("empty")),
            server: Some("ws://x/ws".into()),
            ..RunFlags::default()
        };
        assert!(matches!(
            RunConfig::resolve(flags),
            Err(ConfigError::Missing(_))
        ));
    }
}
