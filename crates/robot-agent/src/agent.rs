//! `robot-agent run`: wires the layers together and runs until SIGINT or
//! SIGTERM, stopping the robot on the way out.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::config::{RunConfig, LOCATIONS_FILE, SETTINGS_FILE};
use crate::controller;
use crate::driver::{self, DriverOptions};
use crate::identity::{self, IdentityError, RobotKey};
use crate::locations::{LocationError, LocationStore};
use crate::peer::{PeerError, PeerManager, PeerOptions};
use crate::reply_signing::ReplySigner;
use crate::safety::StopReason;
use crate::server_keys;
use crate::session::{Metrics, Shared};
use crate::settings::{Settings, SettingsError};
use crate::signalling::{self, SignallingOptions, INBOUND_CAPACITY};
use crate::tickets::TicketCheck;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("robot key: {0} (run `robot-agent enroll` first)")]
    Key(#[source] IdentityError),
    #[error("certificate: {0}")]
    Certificate(#[source] IdentityError),
    #[error(transparent)]
    Locations(#[from] LocationError),
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error(transparent)]
    Peer(#[from] PeerError),
    #[error("cannot create {path}: {source}")]
    DataDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("signal handler: {0}")]
    Signal(#[source] std::io::Error),
    #[error(transparent)]
    ArpConfig(#[from] crate::arp::config::ArpConfigError),
    #[error(transparent)]
    ServerKeys(#[from] crate::server_keys::ServerKeyError),
    #[error("require_tickets is on but no server key is pinned: run `robot-agent enroll` again or `robot-agent trust-key`")]
    NoPinnedKey,
    #[error(transparent)]
    ArpListen(#[from] crate::arp::ws::ArpListenError),
}

/// What checks the server's session tickets: the pinned keys, unless `require_tickets =
/// false`; none for a robot that never pinned one (it keeps the behaviour of before).
fn ticket_check(config: &RunConfig) -> Result<Option<Arc<TicketCheck>>, AgentError> {
    let pinned = server_keys::load(&config.server_keys_file)?;
    let require = config.require_tickets.unwrap_or(!pinned.is_empty());
    if !require {
        if !pinned.is_empty() {
            tracing::warn!("require_tickets = false: the server's session tickets are not checked");
        }
        return Ok(None);
    }
    let check = TicketCheck::new(&config.robot_id, &pinned)
        .ok_or(AgentError::NoPinnedKey)?
        .with_keys_file(config.server_keys_file.clone());
    let kids: Vec<&str> = pinned.iter().map(|k| k.kid.as_str()).collect();
    tracing::info!(keys = %kids.join(","), "session tickets required");
    Ok(Some(Arc::new(check)))
}

pub async fn run(config: RunConfig) -> Result<(), AgentError> {
    let key = RobotKey::load(&config.key_file).map_err(AgentError::Key)?;
    let certificate = certificate(&config)?;
    std::fs::create_dir_all(&config.data_dir).map_err(|source| AgentError::DataDir {
        path: config.data_dir.display().to_string(),
        source,
    })?;
    let settings = Settings::load(&config.data_dir.join(SETTINGS_FILE), &config.safety)?;
    let limits = settings.safety_limits(&config.safety);
    let locations =
        LocationStore::open(&config.data_dir.join(LOCATIONS_FILE), config.max_locations)?;
    let driver_options = driver_options(&settings, &config);
    tracing::info!(
        robot = %config.robot_id,
        servers = %config.servers.join(","),
        driver = ?config.driver,
        key = ?key.key_type(),
        certificate = certificate.is_some(),
        data_dir = %config.data_dir.display(),
        "starting robot agent"
    );
    let driver = driver::start(&config.driver, driver_options);
    let pose = driver.pose.clone();
    let driver_tools = driver.tools.clone();
    let controller = controller::spawn(limits, driver);
    let reply_signer = ReplySigner::configured(config.sign_replies, &config.robot_id, &key)
        .map_err(AgentError::Key)?;
    let shared = Shared {
        controller: controller.clone(),
        locations: Arc::new(Mutex::new(locations)),
        settings: Arc::new(Mutex::new(settings)),
        base_limits: config.safety.clone(),
        metrics: Arc::new(Metrics::default()),
        reply_signer,
    };
    let metrics = shared.metrics.clone();
    // Only drivers that report a pose offer the `odometry` context.
    let odometry = matches!(
        config.driver,
        driver::DriverSpec::Sim | driver::DriverSpec::Rosbridge(_)
    );
    let cameras = cameras(&config);
    let arp = crate::arp::ArpServer::new(
        shared.clone(),
        pose,
        crate::arp::ArpOptions {
            driver_tools: Some(driver_tools),
            cameras: cameras.clone(),
            ..crate::arp::ArpOptions::from_file(&config.arp, odometry)?
        },
    );
    let _arp_listener = arp_listener(&config, &arp).await?;
    let (inbound_tx, inbound_rx) = mpsc::channel(INBOUND_CAPACITY);
    let outbound = signalling::spawn_checked(
        signalling_options(&config, key, certificate),
        ticket_check(&config)?,
        inbound_tx,
    );
    let manager = PeerManager::new(
        &PeerOptions {
            include_loopback_candidates: config.include_loopback_candidates,
            loopback_only: false,
        },
        outbound,
        shared,
    )?
    .with_cameras(cameras)
    .with_arp(arp);
    let peers = tokio::spawn(manager.run(inbound_rx));
    until_stopped(peers).await?;
    controller.stop_all(StopReason::Shutdown).await;
    tracing::info!(
        stale_commands_total = metrics.stale_commands(),
        "robot agent stopped"
    );
    // Give the stop a moment to reach the driver (bounded; a stalled
    // driver must not keep the process alive).
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), controller.status()).await;
    Ok(())
}

/// The robot's certificate chain, when enrollment left one.
fn certificate(config: &RunConfig) -> Result<Option<String>, AgentError> {
    if !config.certificate_file.exists() {
        return Ok(None);
    }
    identity::load_certificate_chain(&config.certificate_file)
        .map(Some)
        .map_err(AgentError::Certificate)
}

/// The ROS topics (the settings' `ros.*`, the config's odometry topic).
fn driver_options(settings: &Settings, config: &RunConfig) -> DriverOptions {
    let topic = |key: &str, default: &str| settings.get_str(key).unwrap_or(default).to_owned();
    DriverOptions {
        cmd_vel_topic: topic("ros.cmd_vel_topic", "/cmd_vel"),
        nav_goal_topic: topic("ros.nav_goal_topic", "/modulr/nav/goal"),
        nav_cancel_topic: topic("ros.nav_cancel_topic", "/modulr/nav/cancel"),
        nav_status_topic: topic("ros.nav_status_topic", "/modulr/nav/status"),
        odom_topic: config
            .arp
            .odometry_topic
            .clone()
            .unwrap_or_else(|| "/odom".into()),
        ..DriverOptions::default()
    }
}

/// The local ARP WebSocket (`--arp-listen`), serving `arp` until it is dropped.
async fn arp_listener(
    config: &RunConfig,
    arp: &crate::arp::ArpServer,
) -> Result<Option<AbortOnDrop>, AgentError> {
    let Some(listen) = &config.arp_listen else {
        return Ok(None);
    };
    let listener = crate::arp::ws::ArpListener::bind(listen)
        .await?
        .allow_origins(&config.arp_allow_origins);
    let addr = listener.local_addr().unwrap_or(listen.addr);
    tracing::info!(
        %addr,
        tokens = listen.tokens.len(),
        allowed_origins = config.arp_allow_origins.len(),
        "ARP WebSocket listening"
    );
    Ok(Some(AbortOnDrop(tokio::spawn(listener.run(arp.clone())))))
}

/// The configured cameras, started.
fn cameras(config: &RunConfig) -> Vec<Arc<crate::video::Camera>> {
    config
        .video
        .iter()
        .map(|spec| {
            tracing::info!(camera = %spec.name, source = spec.source.kind(), "camera configured");
            crate::video::Camera::start(spec.clone(), config.video_grace)
        })
        .collect()
}

fn signalling_options(
    config: &RunConfig,
    key: RobotKey,
    certificate: Option<String>,
) -> SignallingOptions {
    SignallingOptions {
        urls: config.servers.clone(),
        robot_id: config.robot_id.clone(),
        key: Arc::new(key),
        certificate,
        reconnect: config.reconnect.clone(),
        ca_file: config.ca_file.clone(),
        // The ARP server is always on; the peer manager serves the
        // gateway's sessions with it (`with_arp`).
        arp: true,
    }
}

/// Waits for SIGINT, SIGTERM or the peer manager's end.
async fn until_stopped(peers: tokio::task::JoinHandle<()>) -> Result<(), AgentError> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(AgentError::Signal)?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; shutting down"),
        _ = terminate.recv() => tracing::info!("terminated; shutting down"),
        _ = peers => tracing::error!("peer manager ended unexpectedly"),
    }
    Ok(())
}

/// Stops a background task when the agent's `run` returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RunFlags;
    use crate::server_keys::{PinnedKey, SERVER_KEYS_FILE};

    /// A run config in a fresh folder with `agent.toml` = `toml`, and a pinned key or not.
    fn config(toml: &str, pinned: bool) -> RunConfig {
        let dir = crate::testutil::temp_dir("tickets-policy");
        std::fs::write(
            dir.join(crate::config::CONFIG_FILE),
            format!(
                "server = \"ws://127.0.0.1:1/ws\"\nrobot_id = \"r1\"\ndriver = \"sim\"\n{toml}"
            ),
        )
        .expect("write");
        if pinned {
            let key =
                PinnedKey::from_x("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo").expect("key");
            server_keys::save(&dir.join(SERVER_KEYS_FILE), &[key]).expect("save");
        }
        RunConfig::resolve(RunFlags {
            config_dir: Some(dir),
            ..RunFlags::default()
        })
        .expect("config")
    }

    #[test]
    fn tickets_are_required_exactly_when_a_key_is_pinned_unless_configured() {
        assert!(ticket_check(&config("", false)).expect("ok").is_none());
        assert!(ticket_check(&config("", true)).expect("ok").is_some());
        let off = config("require_tickets = false\n", true);
        assert!(ticket_check(&off).expect("ok").is_none());
        let on_without_key = config("require_tickets = true\n", false);
        assert!(matches!(
            ticket_check(&on_without_key),
            Err(AgentError::NoPinnedKey)
        ));
    }
}
