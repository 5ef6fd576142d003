//! Several nodes on one Redis: presence, the bus between nodes, heartbeats and the
//! cluster-wide control lock.
//!
//! What lives in Redis (all under one key prefix, so several clusters or test runs can share
//! a Redis): each node's heartbeat lease (`alive:{node}`, a key with a TTL), the set of nodes
//! that registered (`nodes`), each online robot's node and socket (`robot:{id}`), the control
//! lock of each driven robot (`lock:{id}`, SET NX PX with a fencing counter `fence:{id}`),
//! and one pub/sub channel per node plus one for broadcasts. Everything in Redis can be lost
//! (a restart without persistence) and is rebuilt by its owners within one heartbeat.
//!
//! One file per part: `outbox` (this node's messages and writes, one writer task),
//! `inbound` (what other nodes send here), `presence` (the robot directory), `locks` (the
//! control lock), `lease` (heartbeats, dead nodes, leaving); `link`, `resp` and `message`
//! are the wire. The relay reaches all of it through its router (`relay::routing`).

pub mod inbound;
mod lease;
mod link;
mod locks;
pub mod message;
mod outbox;
mod presence;
pub mod resp;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::IntCounter;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionInfo, IntoConnectionInfo, Script};
use tokio::sync::mpsc;

pub use link::Subscription;
pub use message::{decode, Control, FrameOut, MirrorSession, PeerMessage, RelayedFrame};
use resp::RespError;

use crate::delivery::ConnId;
use crate::metrics::Metrics;

/// How long a login waits for its robot's presence to reach Redis before it is answered
/// anyway (Redis slow or away: the robot is then reachable on its own node only, as in an
/// outage). The commands' own time limit.
pub const PRESENCE_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis connection: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Resp(#[from] RespError),
    #[error("redis refused: {0}")]
    Refused(String),
    #[error("redis closed the connection")]
    Closed,
    #[error("redis address not supported: {0}")]
    Unsupported(&'static str),
}

#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub url: String,
    pub prefix: String,
    pub node_id: String,
    /// A node whose heartbeat is older than this is dead: its robots read offline and the
    /// survivors end its sessions.
    pub node_ttl: Duration,
    /// Lifetime of a control lock unless its node renews it.
    pub lock_ttl: Duration,
}

/// Where a robot is connected, when on another node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRobot {
    pub node: Arc<str>,
    pub conn: ConnId,
}

/// The answer to a lock attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockOutcome {
    /// Taken; the value (node, session, subject, fencing token) identifies this holder.
    Acquired(String),
    /// Someone holds it: the holder's subject.
    Held { subject: String },
}

pub struct Cluster {
    config: ClusterConfig,
    node: Arc<str>,
    /// Where the bus's own connections go (publishing and the subscription).
    bus: ConnectionInfo,
    conn: ConnectionManager,
    outbox: mpsc::Sender<outbox::Op>,
    outbox_rx: Mutex<Option<mpsc::Receiver<outbox::Op>>>,
    /// The last command or pipeline succeeded.
    commands_ok: AtomicBool,
    /// The node's subscription is up.
    subscribed: AtomicBool,
    /// Something may have been lost while Redis was away: presence is written again.
    dirty: AtomicBool,
    metrics: Metrics,
    /// The frame counters, looked up once: a frame is counted on each node it crosses.
    frames_sent: IntCounter,
    frames_received: IntCounter,
    scripts: Scripts,
}

struct Scripts {
    delete_if: Script,
    lock: Script,
    renew: Script,
    locate: Script,
}

impl Cluster {
    /// Prepares the link; nothing is sent yet, so a node can start while Redis is away
    /// (it serves what is local and reports not ready until Redis answers).
    pub fn new(config: ClusterConfig, metrics: Metrics) -> Result<Arc<Cluster>, ClusterError> {
        // Nagle off: a relayed frame is one small PUBLISH, and the redis crate leaves
        // TCP_NODELAY unset unless asked (its TcpSettings default).
        let info = config.url.as_str().into_connection_info()?;
        let tcp = info.tcp_settings().clone().set_nodelay(true);
        let bus = info.clone();
        let client = redis::Client::open(info.set_tcp_settings(tcp))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client, manager_config)?;
        let (outbox, rx) = mpsc::channel(outbox::OUTBOX);
        Ok(Arc::new(Cluster {
            node: Arc::from(config.node_id.as_str()),
            config,
            bus,
            conn,
            outbox,
            outbox_rx: Mutex::new(Some(rx)),
            commands_ok: AtomicBool::new(false),
            subscribed: AtomicBool::new(false),
            dirty: AtomicBool::new(true),
            frames_sent: metrics
                .cluster
                .messages
                .with_label_values(&["sent", "frame"]),
            frames_received: metrics
                .cluster
                .messages
                .with_label_values(&["received", "frame"]),
            metrics,
            scripts: Scripts {
                delete_if: Script::new(outbox::DELETE_IF),
                lock: Script::new(locks::LOCK),
                renew: Script::new(locks::RENEW),
                locate: Script::new(presence::LOCATE),
            },
        }))
    }

    pub fn node_id(&self) -> &str {
        &self.node
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    fn key(&self, parts: &[&str]) -> String {
        let mut key = self.config.prefix.clone();
        key.push_str(&parts.concat());
        key
    }

    fn presence_value(&self, conn: &str) -> String {
        format!("{}\n{}", self.node, conn)
    }

    fn alive_prefix(&self) -> String {
        self.key(&["alive:"])
    }

    fn node_channel(&self, node: &str) -> String {
        self.key(&["node:", node])
    }

    fn broadcast_channel(&self) -> String {
        self.key(&["all"])
    }

    /// Commands work and the subscription is up.
    pub fn is_healthy(&self) -> bool {
        self.commands_ok.load(Ordering::Relaxed) && self.subscribed.load(Ordering::Relaxed)
    }

    fn record(&self, ok: bool) {
        let was = self.commands_ok.swap(ok, Ordering::Relaxed);
        if !ok {
            self.dirty.store(true, Ordering::Relaxed);
        }
        if was != ok {
            if ok {
                tracing::info!("redis answers again");
            } else {
                tracing::error!("redis does not answer: serving local sockets only");
            }
        }
        self.update_gauge();
    }

    fn update_gauge(&self) {
        self.metrics.cluster.up.set(i64::from(self.is_healthy()));
    }

    async fn timed<T>(
        &self,
        work: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, ClusterError> {
        let limit = Duration::from_secs(2);
        let result = match tokio::time::timeout(limit, work).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(ClusterError::Redis(e)),
            Err(_) => Err(ClusterError::Timeout(limit)),
        };
        self.record(result.is_ok());
        result
    }

    pub async fn ping(&self) -> Result<(), ClusterError> {
        let mut conn = self.conn.clone();
        self.timed(async move { redis::cmd("PING").query_async::<()>(&mut conn).await })
            .await
    }

    /// Something this node should have heard may be lost: at its next heartbeat it writes
    /// its state again and checks its sockets against the database.
    pub fn mark_lapsed(&self) {
        self.dirty.store(true, Ordering::Relaxed);
    }

    pub fn set_subscribed(&self, up: bool) {
        if !up {
            self.dirty.store(true, Ordering::Relaxed);
        }
        self.subscribed.store(up, Ordering::Relaxed);
        self.update_gauge();
    }
}

/// `node\nconn` as stored for a robot's presence.
fn parse_presence(value: &str) -> Option<(&str, &str)> {
    value
        .split_once('\n')
        .filter(|(node, conn)| !node.is_empty() && !conn.is_empty())
}

/// The subject in a lock value `node|session|subject|fence`.
fn lock_subject(value: &str) -> &str {
    let without_fence = value.rsplit_once('|').map(|(v, _)| v).unwrap_or(value);
    without_fence.splitn(3, '|').nth(2).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_values_parse() {
        assert_eq!(parse_presence("n1\nc1"), Some(("n1", "c1")));
        assert_eq!(parse_presence("n1"), None);
        assert_eq!(parse_presence("\nc"), None);
        assert_eq!(lock_subject("n1|s1|alice|42"), "alice");
        assert_eq!(lock_subject("n1|s1|a|b|7"), "a|b");
        assert_eq!(lock_subject("garbage"), "");
    }
}
