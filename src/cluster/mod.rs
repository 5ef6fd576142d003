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
//! Commands from synchronous code (the hub) go through a bounded queue to one writer task,
//! which sends whatever has piled up as one pipeline: one round trip for many frames.

mod link;
pub mod message;
pub mod resp;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::IntCounter;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, ConnectionInfo, IntoConnectionInfo, Script, Value};
use tokio::sync::{mpsc, oneshot};

use link::Publisher;
pub use link::Subscription;
pub use message::{decode, Control, FrameOut, MirrorSession, PeerMessage, RelayedFrame};
use resp::{Outgoing, RespError};

use crate::metrics::Metrics;
use crate::relay::{ConnId, Kick};
use crate::shutdown::StopSignal;

/// Frames and commands waiting for the writer; past this, messages to peers are dropped
/// (counted) rather than growing memory while Redis is slow or away.
const OUTBOX: usize = 65_536;
/// Largest pipeline the writer sends at once.
const BATCH: usize = 512;
/// Largest PUBLISH payload of frames batched for one node (a bigger frame goes alone): well
/// under Redis's pub/sub output limits, and under glibc's default mmap threshold (128 KiB)
/// for the buffers both nodes' redis clients make of it. 256 KiB measured 2-4 % slower
/// cross-node with 6 KB frames (docs/benchmarks.md, "Several nodes").
const BATCH_BYTES: usize = 64 * 1024;
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

enum Op {
    Publish {
        channel: String,
        payload: Vec<u8>,
    },
    /// A relayed frame for a socket on `node`.
    Frame {
        node: Arc<str>,
        frame: FrameOut,
    },
    PresenceUp {
        robot_id: String,
        conn: ConnId,
        /// Told once the pipeline holding the write has been answered (dropped if it failed).
        written: Option<oneshot::Sender<()>>,
    },
    PresenceDown {
        robot_id: String,
        conn: ConnId,
    },
}

/// Deletes a key only while it still holds the given value (a newer owner keeps it).
const DELETE_IF: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0";

/// Writes a robot's presence unless another node has written a newer one.
const SET_UNLESS_ELSEWHERE: &str = r"
local current = redis.call('GET', KEYS[1])
if (not current) or string.sub(current, 1, #ARGV[2]) == ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 0";

/// Takes the lock if free: SET NX PX with the next fencing token in the value.
const LOCK: &str = r"
local fence = redis.call('INCR', KEYS[2])
local value = ARGV[1] .. '|' .. fence
if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then return {1, value} end
return {0, redis.call('GET', KEYS[1]) or ''}";

/// Extends the lock while it is ours. When it is gone and ARGV[3] is 1 (Redis lost its
/// data: restarted empty), takes it back unless someone else took it first. 0 when
/// someone else holds it now, 3 when it is gone (the session ended meanwhile).
const RENEW: &str = r"
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not current then
  if ARGV[3] == '1' and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 2 end
  return 3
end
return 0";

/// Reads a robot's presence if its node's heartbeat lease is alive.
const LOCATE: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return false end
local node = string.match(v, '^[^\n]+')
if node and redis.call('EXISTS', ARGV[1] .. node) == 1 then return v end
return false";

pub struct Cluster {
    config: ClusterConfig,
    node: Arc<str>,
    /// Where the bus's own connections go (publishing and the subscription).
    bus: ConnectionInfo,
    conn: ConnectionManager,
    outbox: mpsc::Sender<Op>,
    outbox_rx: Mutex<Option<mpsc::Receiver<Op>>>,
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
        let (outbox, rx) = mpsc::channel(OUTBOX);
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
                .cluster_messages
                .with_label_values(&["sent", "frame"]),
            frames_received: metrics
                .cluster_messages
                .with_label_values(&["received", "frame"]),
            metrics,
            scripts: Scripts {
                delete_if: Script::new(DELETE_IF),
                lock: Script::new(LOCK),
                renew: Script::new(RENEW),
                locate: Script::new(LOCATE),
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
        self.metrics.cluster_up.set(i64::from(self.is_healthy()));
    }

    fn enqueue(&self, op: Op, kind: &'static str) {
        if self.try_enqueue(op) {
            self.metrics
                .cluster_messages
                .with_label_values(&["sent", kind])
                .inc();
        }
    }

    /// Queues `op` for the writer, or counts it dropped when the queue is full.
    fn try_enqueue(&self, op: Op) -> bool {
        let queued = self.outbox.try_send(op).is_ok();
        if !queued {
            self.metrics.cluster_dropped.inc();
        }
        queued
    }

    /// Queues a relayed frame for a socket on `node`: the received bytes, shared.
    pub fn send_frame(&self, node: Arc<str>, frame: FrameOut) {
        if self.try_enqueue(Op::Frame { node, frame }) {
            self.frames_sent.inc();
        }
    }

    /// Counts a relayed frame received from another node.
    pub fn count_received_frame(&self) {
        self.frames_received.inc();
    }

    /// Queues a control message for one node.
    pub fn send(&self, node: &str, control: &Control) {
        let payload = message::encode_control(&self.node, control);
        self.enqueue(
            Op::Publish {
                channel: self.node_channel(node),
                payload,
            },
            control.kind(),
        );
    }

    /// Queues a control message for every other node.
    pub fn broadcast(&self, control: &Control) {
        let payload = message::encode_control(&self.node, control);
        self.enqueue(
            Op::Publish {
                channel: self.broadcast_channel(),
                payload,
            },
            control.kind(),
        );
    }

    pub fn kick(&self, node: &str, conn: &ConnId, reason: Kick) {
        self.send(
            node,
            &Control::Kick {
                conn: conn.to_string(),
                reason,
            },
        );
    }

    /// The robot is now verified on this node: other nodes' sockets of it are replaced.
    /// The answer resolves once Redis holds the presence (or the write failed); None when
    /// Redis is known to be away, so there is nothing worth waiting for.
    pub fn presence_up(&self, robot_id: &str, conn: &ConnId) -> Option<oneshot::Receiver<()>> {
        let (written, answer) = oneshot::channel();
        self.enqueue(
            Op::PresenceUp {
                robot_id: robot_id.to_string(),
                conn: conn.clone(),
                written: Some(written),
            },
            "presence",
        );
        self.is_healthy().then_some(answer)
    }

    pub fn presence_down(&self, robot_id: &str, conn: &ConnId) {
        self.enqueue(
            Op::PresenceDown {
                robot_id: robot_id.to_string(),
                conn: conn.clone(),
            },
            "presence",
        );
    }

    fn presence_value(&self, conn: &str) -> String {
        format!("{}\n{}", self.node, conn)
    }

    /// Sends queued operations until stopped; what is queued at the stop is still sent
    /// (the last notices of a draining node).
    ///
    /// One write at a time: what comes while one awaits its answer goes out together
    /// next. Sending without waiting (up to 16 pipelines in flight) was measured and not
    /// kept: at light load it did not lower the cross-node p50 beyond the noise, and under
    /// load the smaller pipelines cost throughput (6 KB frames, 50 sessions: 0.63–0.69× same
    /// node against 1.2× with this batching; docs/benchmarks.md, "Several nodes").
    pub async fn run_writer(self: Arc<Self>, mut stop: StopSignal) {
        let Some(mut rx) = self.outbox_rx.lock().ok().and_then(|mut rx| rx.take()) else {
            return;
        };
        let mut publisher = Publisher::new(self.bus.clone());
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            tokio::select! {
                n = rx.recv_many(&mut batch, BATCH) => {
                    if n == 0 {
                        return;
                    }
                }
                _ = stop.stopped() => {
                    while let Ok(op) = rx.try_recv() {
                        batch.push(op);
                        if batch.len() >= BATCH {
                            self.flush(&mut publisher, &mut batch).await;
                        }
                    }
                    self.flush(&mut publisher, &mut batch).await;
                    return;
                }
            }
            self.flush(&mut publisher, &mut batch).await;
        }
    }

    /// Publishes go out on the bus's own connection, written from the frames where they
    /// lie; presence writes, which answer, as one pipeline of the redis crate beside it.
    async fn flush(&self, publisher: &mut Publisher, batch: &mut Vec<Op>) {
        if batch.is_empty() {
            return;
        }
        let mut out = publisher.outgoing();
        let mut pipe = redis::pipe();
        let mut presence_ops = 0;
        // Frames queued one after another go out one PUBLISH per node; any other publish
        // ends the run first, so whatever a node receives keeps the order it was queued in.
        let mut run: Vec<(&str, Vec<&FrameOut>, usize)> = Vec::new();
        for op in batch.iter() {
            if let Op::Frame { node, frame } = op {
                let at = match run.iter().position(|(to, ..)| *to == &**node) {
                    Some(at) => at,
                    None => {
                        run.push((&**node, Vec::new(), 1));
                        run.len() - 1
                    }
                };
                let (_, frames, bytes) = &mut run[at];
                if *bytes + 4 + frame.encoded_len() > BATCH_BYTES && !frames.is_empty() {
                    self.publish_frames(&mut out, node, frames);
                    frames.clear();
                    *bytes = 1;
                }
                frames.push(frame);
                *bytes += 4 + frame.encoded_len();
                continue;
            }
            match op {
                Op::Publish { channel, payload } => {
                    for (node, frames, _) in run.drain(..) {
                        self.publish_frames(&mut out, node, &frames);
                    }
                    out.command(&[b"PUBLISH", channel.as_bytes(), payload]);
                }
                Op::Frame { .. } => {}
                Op::PresenceUp { robot_id, conn, .. } => {
                    presence_ops += 1;
                    pipe.cmd("SET")
                        .arg(self.key(&["robot:", robot_id]))
                        .arg(self.presence_value(conn))
                        .arg("GET");
                }
                Op::PresenceDown { robot_id, conn } => {
                    presence_ops += 1;
                    pipe.cmd("EVAL")
                        .arg(DELETE_IF)
                        .arg(1)
                        .arg(self.key(&["robot:", robot_id]))
                        .arg(self.presence_value(conn))
                        .ignore();
                }
            }
        }
        for (node, frames, _) in run.drain(..) {
            self.publish_frames(&mut out, node, &frames);
        }
        drop(run);
        let publishes = out.commands();
        let mut conn = self.conn.clone();
        let (published, answered) = tokio::join!(
            async {
                match publishes {
                    0 => Ok(0),
                    _ => publisher.send(&out).await,
                }
            },
            async {
                match presence_ops {
                    0 => Ok(Vec::new()),
                    // Only the presence writes answer (the deletes are ignored), in order.
                    _ => pipe.query_async::<Vec<Value>>(&mut conn).await,
                }
            }
        );
        publisher.give_back(out);
        let mut ok = true;
        match published {
            Ok(0) => {}
            Ok(refused) => self.metrics.cluster_dropped.inc_by(refused as u64),
            Err(e) => {
                tracing::debug!(error = %e, lost = publishes, "redis publish failed");
                self.metrics.cluster_dropped.inc_by(publishes as u64);
                ok = false;
            }
        }
        match answered {
            Ok(values) => {
                let presence_writes = batch.iter_mut().filter_map(|op| match op {
                    Op::PresenceUp { conn, written, .. } => Some((conn, written)),
                    _ => None,
                });
                for ((conn, written), value) in presence_writes.zip(values) {
                    if let Value::BulkString(old) = value {
                        self.replace_elsewhere(conn, &old);
                    }
                    if let Some(written) = written.take() {
                        let _ = written.send(());
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, lost = presence_ops, "redis pipeline failed");
                self.metrics.cluster_dropped.inc_by(presence_ops as u64);
                ok = false;
            }
        }
        self.record(ok);
        batch.clear();
    }

    /// One PUBLISH to `node`'s channel carrying `frames`, in order.
    fn publish_frames<'a>(&self, out: &mut Outgoing<'a>, node: &str, frames: &[&'a FrameOut]) {
        out.publish_frames(
            &[self.config.prefix.as_bytes(), b"node:", node.as_bytes()],
            frames,
        );
    }

    /// A robot verified here was connected elsewhere: that socket is replaced (4001).
    fn replace_elsewhere(&self, conn: &ConnId, old: &[u8]) {
        let Some((node, old_conn)) = std::str::from_utf8(old)
            .ok()
            .and_then(|v| v.split_once('\n'))
        else {
            return;
        };
        if node != &*self.node && old_conn != &**conn {
            self.kick(node, &ConnId::from(old_conn), Kick::Replaced);
        }
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

    /// The node and socket of a robot online on another node whose lease is alive.
    pub async fn locate(&self, robot_id: &str) -> Result<Option<RemoteRobot>, ClusterError> {
        let mut conn = self.conn.clone();
        let key = self.key(&["robot:", robot_id]);
        let alive = self.alive_prefix();
        let value: Option<String> = self
            .timed(async move {
                self.scripts
                    .locate
                    .key(key)
                    .arg(alive)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(value
            .as_deref()
            .and_then(parse_presence)
            .map(|(node, conn)| RemoteRobot {
                node: Arc::from(node),
                conn: ConnId::from(conn),
            }))
    }

    /// The nodes (alive) where these robots are online, for the API.
    pub async fn nodes_of(
        &self,
        robot_ids: &[&str],
    ) -> Result<HashMap<String, String>, ClusterError> {
        if robot_ids.is_empty() {
            return Ok(HashMap::new());
        }
        let keys: Vec<String> = robot_ids
            .iter()
            .map(|id| self.key(&["robot:", id]))
            .collect();
        let mut conn = self.conn.clone();
        let values: Vec<Option<String>> = self.timed(async { conn.mget(&keys).await }).await?;
        let mut found: Vec<(String, String)> = Vec::new();
        for (id, value) in robot_ids.iter().zip(values) {
            if let Some((node, _)) = value.as_deref().and_then(parse_presence) {
                found.push((id.to_string(), node.to_string()));
            }
        }
        let mut nodes: Vec<String> = found.iter().map(|(_, n)| n.clone()).collect();
        nodes.sort();
        nodes.dedup();
        let alive = self.alive(&nodes).await?;
        Ok(found
            .into_iter()
            .filter(|(_, node)| alive.contains(node))
            .collect())
    }

    /// Which of `nodes` have a live heartbeat lease.
    pub async fn alive(&self, nodes: &[String]) -> Result<Vec<String>, ClusterError> {
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for node in nodes {
            pipe.exists(self.key(&["alive:", node]));
        }
        let mut conn = self.conn.clone();
        let exists: Vec<bool> = self.timed(pipe.query_async(&mut conn)).await?;
        Ok(nodes
            .iter()
            .zip(exists)
            .filter(|(_, alive)| *alive)
            .map(|(n, _)| n.clone())
            .collect())
    }

    /// Renews this node's lease and registration. True when the lease had lapsed or Redis
    /// lost it (first beat, Redis restarted empty, a long stall): then everything this node
    /// keeps in Redis must be written again.
    pub async fn heartbeat(&self) -> Result<bool, ClusterError> {
        let ttl = self.config.node_ttl.as_millis() as u64;
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(self.key(&["alive:", &self.node]))
            .arg(crate::clock::now_unix())
            .arg("PX")
            .arg(ttl)
            .arg("GET");
        pipe.sadd(self.key(&["nodes"]), &*self.node).ignore();
        let mut conn = self.conn.clone();
        let (previous,): (Option<String>,) = self.timed(pipe.query_async(&mut conn)).await?;
        let dirty = self.dirty.swap(false, Ordering::Relaxed);
        let lapsed = previous.is_none() || dirty;
        Ok(lapsed)
    }

    /// Writes the presence of every robot connected here (after a lapse).
    pub async fn assert_presence(&self, robots: &[(String, ConnId)]) -> Result<(), ClusterError> {
        for chunk in robots.chunks(BATCH) {
            let mut pipe = redis::pipe();
            for (robot_id, conn) in chunk {
                // A robot that moved to another node meanwhile keeps its newer entry.
                pipe.cmd("EVAL")
                    .arg(SET_UNLESS_ELSEWHERE)
                    .arg(1)
                    .arg(self.key(&["robot:", robot_id]))
                    .arg(self.presence_value(conn))
                    .arg(format!("{}\n", self.node))
                    .ignore();
            }
            let mut conn = self.conn.clone();
            self.timed(pipe.query_async::<()>(&mut conn)).await?;
        }
        Ok(())
    }

    /// Registered nodes whose lease expired, other than this one.
    ///
    /// `peers` are the nodes this node has sessions with: one that died is dead for this
    /// node too even once another survivor took it off the register (the first to notice
    /// does), which a `dead:` mark says. A node that left by draining is off the register
    /// without a mark: it ends its sessions itself and tells its peers.
    pub async fn dead_nodes(&self, peers: &[String]) -> Result<Vec<String>, ClusterError> {
        let mut conn = self.conn.clone();
        let registered: Vec<String> = self
            .timed(async { conn.smembers(self.key(&["nodes"])).await })
            .await?;
        let mut others: Vec<String> = registered
            .iter()
            .chain(peers)
            .filter(|n| **n != *self.node)
            .cloned()
            .collect();
        others.sort();
        others.dedup();
        let alive = self.alive(&others).await?;
        let silent: Vec<String> = others.into_iter().filter(|n| !alive.contains(n)).collect();
        let unregistered: Vec<&String> =
            silent.iter().filter(|n| !registered.contains(n)).collect();
        let marked: Vec<bool> = if unregistered.is_empty() {
            Vec::new()
        } else {
            let mut pipe = redis::pipe();
            for node in &unregistered {
                pipe.exists(self.key(&["dead:", node]));
            }
            self.timed(pipe.query_async(&mut conn)).await?
        };
        let dead_elsewhere: Vec<&String> = unregistered
            .into_iter()
            .zip(marked)
            .filter(|(_, marked)| *marked)
            .map(|(node, _)| node)
            .collect();
        Ok(silent
            .iter()
            .filter(|n| registered.contains(n) || dead_elsewhere.contains(n))
            .cloned()
            .collect())
    }

    /// Marks a dead node as dead (for the survivors that have sessions with it, see
    /// [`Cluster::dead_nodes`]) and takes it off the register; true for exactly one
    /// caller (that one ends the dead node's session records).
    pub async fn claim_dead(&self, node: &str) -> Result<bool, ClusterError> {
        // The mark outlives any survivor's next beats; a node that comes back under the
        // same id has a live lease again, which `dead_nodes` checks first.
        let mark_secs = (self.config.node_ttl.as_secs() * 6).max(60);
        let mut pipe = redis::pipe();
        pipe.set_ex(self.key(&["dead:", node]), 1, mark_secs)
            .ignore();
        pipe.srem(self.key(&["nodes"]), node);
        let mut conn = self.conn.clone();
        let (removed,): (i64,) = self.timed(pipe.query_async(&mut conn)).await?;
        Ok(removed == 1)
    }

    /// Draining: this node stops counting as alive, so no new session is routed here.
    pub async fn leave(&self) -> Result<(), ClusterError> {
        let mut pipe = redis::pipe();
        pipe.del(self.key(&["alive:", &self.node])).ignore();
        pipe.srem(self.key(&["nodes"]), &*self.node).ignore();
        let mut conn = self.conn.clone();
        self.timed(pipe.query_async::<()>(&mut conn)).await?;
        self.broadcast(&Control::NodeLeaving);
        Ok(())
    }

    /// Tries to take the robot's control lock for a session.
    pub async fn lock(
        &self,
        robot_id: &str,
        session_id: &str,
        subject: &str,
    ) -> Result<LockOutcome, ClusterError> {
        // The subject goes last: it may contain '|', the holder's fields before it do not.
        let holder = format!("{}|{}|{}", self.node, session_id, subject);
        let mut conn = self.conn.clone();
        let ttl = self.config.lock_ttl.as_millis() as u64;
        let (taken, value): (i64, String) = self
            .timed(async {
                self.scripts
                    .lock
                    .key(self.key(&["lock:", robot_id]))
                    .key(self.key(&["fence:", robot_id]))
                    .arg(holder)
                    .arg(ttl)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        if taken == 1 {
            return Ok(LockOutcome::Acquired(value));
        }
        Ok(LockOutcome::Held {
            subject: lock_subject(&value).to_string(),
        })
    }

    /// Releases a lock this node holds (no-op if it expired and another took it).
    pub async fn unlock(&self, robot_id: &str, value: &str) -> Result<(), ClusterError> {
        let mut conn = self.conn.clone();
        self.timed(async {
            self.scripts
                .delete_if
                .key(self.key(&["lock:", robot_id]))
                .arg(value)
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await?;
        Ok(())
    }

    /// Renews held locks; returns the robots whose lock another holder has now. `retake`
    /// after Redis lost its data: locks that vanished are taken again. (Never otherwise:
    /// a lock released by a session that ended after `held` was read must stay free.)
    pub async fn renew_locks(
        &self,
        held: &[(String, String)],
        retake: bool,
    ) -> Result<Vec<String>, ClusterError> {
        let ttl = self.config.lock_ttl.as_millis() as u64;
        let mut lost = Vec::new();
        for (robot_id, value) in held {
            let mut conn = self.conn.clone();
            let renewed: i64 = self
                .timed(async {
                    self.scripts
                        .renew
                        .key(self.key(&["lock:", robot_id]))
                        .arg(value)
                        .arg(ttl)
                        .arg(if retake { "1" } else { "0" })
                        .invoke_async(&mut conn)
                        .await
                })
                .await?;
            if renewed == 0 {
                lost.push(robot_id.clone());
            }
        }
        Ok(lost)
    }

    /// Publishes a probe to this node's own channel; its arrival measures the bus lag.
    pub fn probe(&self) {
        self.send(
            &self.node.clone(),
            &Control::Probe {
                sent_unix_ms: crate::store::now_ms(),
            },
        );
    }

    pub fn observe_probe(&self, sent_unix_ms: i64) {
        let lag = (crate::store::now_ms() - sent_unix_ms).max(0) as f64 / 1000.0;
        self.metrics.cluster_bus_lag.observe(lag);
    }

    pub fn count_received(&self, kind: &'static str) {
        self.metrics
            .cluster_messages
            .with_label_values(&["received", kind])
            .inc();
    }

    pub fn node_lost(&self) {
        self.metrics.cluster_nodes_lost.inc();
    }

    /// One subscription for the whole node: its own channel and the broadcast channel.
    pub async fn subscribe(&self) -> Result<Subscription, ClusterError> {
        let own = self.node_channel(&self.node);
        let all = self.broadcast_channel();
        let work = async { Subscription::open(&self.bus, &[own.as_bytes(), all.as_bytes()]).await };
        let subscription = tokio::time::timeout(PRESENCE_WAIT, work)
            .await
            .unwrap_or(Err(ClusterError::Timeout(PRESENCE_WAIT)))?;
        self.set_subscribed(true);
        Ok(subscription)
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
