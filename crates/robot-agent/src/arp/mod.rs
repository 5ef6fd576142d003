//! The robot agent as an ARP 0.1.0 server (Autonomous Robot Protocol:
//! JSON-RPC 2.0 tools, context and constraints; `arp-contract.md`).
//!
//! The handler is transport-free: [`ArpServer::connect`] takes a channel of
//! incoming frames and one for outgoing frames, and whoever owns the
//! socket moves text between those and the wire. Three transports exist: a
//! WebRTC data channel labelled `arp` ([`crate::peer`]), the local
//! WebSocket ([`ws`]) and the server's gateway, whose frames arrive on the
//! signalling socket ([`gateway`]).
//!
//! Nothing here moves the robot except through the controller, so the
//! safety layer (role, limits, watchdog, rate, e-stop latch) applies to
//! every call; this layer adds the ARP constraints on top (velocity
//! reject/clamp, workspace box).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

mod calls;
pub mod camera;
pub mod config;
mod connection;
pub mod error;
pub mod gateway;
pub mod tools;
pub mod ws;

use crate::controller::control::Claimant;
use crate::driver::Pose;
use crate::safety::{Role, SafetyLimits, StopReason};
use crate::session::Shared;
pub use config::{ArpOptions, ConfirmationPolicy, ListenConfig, Token, ViolationAction, Workspace};
pub use error::ArpError;
use tools::Tool;

/// Capacity of a connection's frame channels (each way).
pub const FRAME_CHANNEL: usize = 64;
/// Keys remembered for `idempotencyKey` retries, and for how long.
pub const IDEMPOTENCY_KEYS: usize = 1024;
pub const IDEMPOTENCY_TTL: Duration = Duration::from_secs(600);
/// Rate of the `status` and `odometry` context sources (updates/s).
pub const STATUS_RATE: f64 = 5.0;
pub const ODOMETRY_RATE: f64 = 20.0;

/// Who is on the other end of a connection.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Unique per connection; the controller knows the connection by it.
    pub key: String,
    /// The WebRTC session an `arp` data channel belongs to (`None` for
    /// the local WebSocket): it shares that session's control.
    pub session: Option<String>,
    pub role: Role,
    /// Whose idempotency keys these are (a token's or a session's subject).
    pub subject: String,
}

/// How a call ended: the result object (`{callId, state, result?}`) or the
/// error (its data gets `{callId, state: "failed"}`).
pub type Outcome = Result<Value, (String, ArpError)>;

/// A call in progress.
struct Running {
    tool: String,
    owner: String,
    cancel: watch::Sender<bool>,
}

struct Remembered {
    outcome: watch::Receiver<Option<Outcome>>,
    at: Instant,
}

/// Idempotency keys: bounded, oldest first out, forgotten after the TTL.
#[derive(Default)]
struct Idempotency {
    entries: HashMap<(String, String), Remembered>,
    order: VecDeque<(String, String)>,
}

impl Idempotency {
    fn get(
        &mut self,
        key: &(String, String),
        now: Instant,
    ) -> Option<watch::Receiver<Option<Outcome>>> {
        self.expire(now);
        self.entries.get(key).map(|r| r.outcome.clone())
    }

    fn insert(
        &mut self,
        key: (String, String),
        outcome: watch::Receiver<Option<Outcome>>,
        now: Instant,
    ) {
        self.expire(now);
        while self.entries.len() >= IDEMPOTENCY_KEYS {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.entries.remove(&oldest);
        }
        self.order.push_back(key.clone());
        self.entries.insert(key, Remembered { outcome, at: now });
    }

    fn expire(&mut self, now: Instant) {
        while let Some(front) = self.order.front() {
            let old = self
                .entries
                .get(front)
                .is_none_or(|r| now.saturating_duration_since(r.at) >= IDEMPOTENCY_TTL);
            if !old {
                break;
            }
            if let Some(key) = self.order.pop_front() {
                self.entries.remove(&key);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[derive(Default)]
struct State {
    calls: HashMap<String, Running>,
    /// The motion call running now (drive, navigate_to): one at a time.
    motion: Option<String>,
    idempotency: Idempotency,
    workspace: Option<Workspace>,
    /// `capture_image`'s rate bound.
    shutter: camera::Shutter,
}

struct Inner {
    shared: Shared,
    pose: watch::Receiver<Option<Pose>>,
    options: ArpOptions,
    tools: Vec<Tool>,
    state: Mutex<State>,
    next_id: AtomicU64,
    monitor: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The workspace monitor lives as long as the server.
        if let Some(task) = lock(&self.monitor).take() {
            task.abort();
        }
    }
}

/// The ARP server: shared by every connection of every transport.
#[derive(Clone)]
pub struct ArpServer {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update below is a single insert/remove: nothing half-done to
    // protect from a panicking holder.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ArpServer {
    /// Must run inside a tokio runtime (it starts the workspace monitor).
    pub fn new(
        shared: Shared,
        pose: watch::Receiver<Option<Pose>>,
        options: ArpOptions,
    ) -> ArpServer {
        let tools = tools::catalogue(&options.confirm);
        let state = State {
            workspace: options.workspace.clone(),
            ..State::default()
        };
        let server = ArpServer {
            inner: Arc::new(Inner {
                shared,
                pose,
                options,
                tools,
                state: Mutex::new(state),
                next_id: AtomicU64::new(1),
                monitor: Mutex::new(None),
            }),
        };
        let monitor = tokio::spawn(workspace_monitor(Arc::downgrade(&server.inner)));
        *lock(&server.inner.monitor) = Some(monitor);
        server
    }

    /// Serves one connection until `inbound` closes (or the task is
    /// aborted); every frame it sends goes to `outbound`.
    pub fn connect(
        &self,
        peer: Peer,
        inbound: mpsc::Receiver<String>,
        outbound: mpsc::Sender<String>,
    ) -> JoinHandle<()> {
        tokio::spawn(connection::run(self.clone(), peer, inbound, outbound))
    }

    /// A fresh id (connections, calls, server requests).
    fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    fn limits(&self) -> SafetyLimits {
        let settings = self
            .inner
            .shared
            .settings
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        settings.safety_limits(&self.inner.shared.base_limits)
    }

    fn pose(&self) -> Option<Pose> {
        *self.inner.pose.borrow()
    }

    /// `capture_image`, rate-bounded: the first camera's picture now (its latest keyframe,
    /// decoded), or without a camera a synthetic frame.
    async fn capture_image(&self) -> Result<(&'static str, Option<Value>), ArpError> {
        if !self.state().shutter.allow(std::time::Instant::now()) {
            return Err(ArpError::RateLimited(camera::CAPTURES_PER_SECOND));
        }
        let (jpeg, width, height, source) = match self.inner.options.cameras.first() {
            Some(cam) => {
                let still = cam.still(camera::FFMPEG).await.map_err(|e| {
                    tracing::warn!(camera = cam.name(), error = %e, "capture_image failed");
                    ArpError::Precondition(format!("camera {}: {e}", cam.name()))
                })?;
                (still.jpeg, still.width, still.height, cam.name().to_owned())
            }
            None => (
                camera::jpeg(self.pose()),
                camera::WIDTH as u32,
                camera::HEIGHT as u32,
                "synthetic".to_owned(),
            ),
        };
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD.encode(jpeg);
        Ok((
            "completed",
            Some(json!({ "image": {
                "mimeType": "image/jpeg",
                "width": width,
                "height": height,
                "camera": source,
                "data": data,
            } })),
        ))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.inner.state)
    }

    /// Every tool now: the built-ins, then the driver's (a driver tool
    /// cannot shadow a built-in).
    fn tools(&self) -> Vec<Tool> {
        let mut tools = self.inner.tools.clone();
        if let Some(declared) = &self.inner.options.driver_tools {
            for d in declared.borrow().iter() {
                if tools.iter().any(|t| t.name == d.name) {
                    continue;
                }
                tools.push(Tool::declared(d, &self.inner.options.confirm));
            }
        }
        tools
    }

    fn tool(&self, name: &str) -> Option<Tool> {
        self.tools().into_iter().find(|t| t.name == name)
    }

    /// Takes the robot's control for this connection, unless another
    /// controller (an ARP connection or a teleop session) holds it. The
    /// lock is the controller's, shared with teleop.
    fn take_control(&self, peer: &Peer) -> Result<(), ArpError> {
        let who = Claimant::Arp {
            key: peer.key.clone(),
            session: peer.session.clone(),
        };
        self.inner
            .shared
            .controller
            .take_control(&who)
            .map_err(|_| ArpError::RobotBusy)
    }

    fn release_control(&self, key: &str) {
        self.inner.shared.controller.release_control(key);
    }

    /// The listed constraints, in the spec's shape.
    fn constraints(&self) -> Vec<Value> {
        let limits = self.limits();
        let mut list = vec![
            json!({
                "name": "velocity_limit",
                "type": "velocity_limit",
                "enabled": true,
                "priority": 100,
                "parameters": { "max_linear": limits.max_linear, "max_angular": limits.max_angular },
                "violation_action": self.inner.options.velocity_violation.as_str(),
            }),
            json!({
                "name": "rate_limit",
                "type": "rate_limit",
                "enabled": true,
                "priority": 90,
                "parameters": { "max_calls_per_second": limits.max_command_rate },
                "violation_action": "reject",
            }),
            json!({
                "name": "emergency_stop",
                "type": "emergency_stop",
                "enabled": true,
                "priority": 1000,
                "parameters": {
                    "trigger": "arp.emergencyStop or the driver",
                    "latched": self.inner.shared.controller.estop_watch().borrow().is_some(),
                    "reset": "tool reset_emergency_stop (operator)",
                },
                "violation_action": "emergency_stop",
            }),
        ];
        if let Some(w) = &self.state().workspace {
            let mut parameters = w.parameters();
            parameters["name"] = json!(w.name);
            list.push(json!({
                "name": "workspace_bound",
                "type": "workspace_bound",
                "enabled": true,
                "priority": 100,
                "parameters": parameters,
                "violation_action": "reject",
            }));
        }
        list
    }

    fn context_sources(&self) -> Vec<Value> {
        let mut sources = vec![json!({
            "name": "status",
            "description": "Driver state, e-stop latch, active navigation and tool calls",
            "dataType": "custom",
            "updateRate": STATUS_RATE,
            "schema": {
                "type": "object",
                "required": ["driverReady", "moving", "emergencyStop", "navigating", "activeCalls"],
            },
        })];
        if self.inner.options.odometry {
            sources.push(json!({
                "name": "odometry",
                "description": "Pose of the base from its odometry",
                "dataType": "pose",
                "coordinateFrame": "odom",
                "updateRate": ODOMETRY_RATE,
            }));
        }
        sources
    }

    /// Rate of a context source, if it exists.
    fn source_rate(&self, name: &str) -> Option<f64> {
        match name {
            "status" => Some(STATUS_RATE),
            "odometry" if self.inner.options.odometry => Some(ODOMETRY_RATE),
            _ => None,
        }
    }

    /// The current value of a context source (`None`: nothing to say yet).
    async fn context_value(&self, name: &str) -> Option<Value> {
        match name {
            "odometry" => self.pose().map(|p| pose_json(&p)),
            "status" => {
                let status = self.inner.shared.controller.status().await?;
                let calls: Vec<Value> = self
                    .state()
                    .calls
                    .iter()
                    .map(|(id, c)| json!({ "callId": id, "tool": c.tool }))
                    .collect();
                Some(json!({
                    "driverReady": status.driver_ready,
                    "moving": status.moving,
                    "emergencyStop": { "latched": status.estop.is_some(), "reason": status.estop },
                    "navigating": status.navigating,
                    "activeCalls": calls,
                }))
            }
            _ => None,
        }
    }
}

/// Pose data of the `odometry` source (arp-contract.md).
pub fn pose_json(p: &Pose) -> Value {
    let half = p.theta / 2.0;
    json!({
        "position": { "x": p.x, "y": p.y, "z": 0.0 },
        "orientation": { "x": 0.0, "y": 0.0, "z": half.sin(), "w": half.cos() },
        "frame": "odom",
    })
}

/// Stops the robot the moment it leaves the workspace box, whoever drives
/// it (a pose that was inside and is now outside).
async fn workspace_monitor(inner: std::sync::Weak<Inner>) {
    let (mut pose, controller) = match inner.upgrade() {
        Some(i) => (i.pose.clone(), i.shared.controller.clone()),
        None => return,
    };
    let mut was_inside = true;
    while pose.changed().await.is_ok() {
        let Some(p) = *pose.borrow_and_update() else {
            continue;
        };
        let Some(inner) = inner.upgrade() else { return };
        let inside = match &lock(&inner.state).workspace {
            Some(w) => w.contains(p.x, p.y),
            None => true,
        };
        drop(inner);
        if was_inside && !inside {
            tracing::warn!(x = p.x, y = p.y, "robot left the workspace box; stopping");
            controller.stop_all(StopReason::WorkspaceBound).await;
        }
        was_inside = inside;
    }
}

/// RFC 3339 UTC time with milliseconds, for `timestamp` fields.
pub fn timestamp() -> String {
    let now = time::OffsetDateTime::now_utc();
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    now.format(&format)
        .unwrap_or_else(|_| "1970-01-01T00:00:00.000Z".into())
}

#[cfg(test)]
mod idempotency_tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn keys_are_bounded_and_expire() {
        let mut idem = Idempotency::default();
        let (_tx, rx) = watch::channel(None);
        let now = Instant::now();
        for i in 0..IDEMPOTENCY_KEYS + 10 {
            idem.insert(("s".into(), i.to_string()), rx.clone(), now);
        }
        assert_eq!(idem.len(), IDEMPOTENCY_KEYS);
        assert!(
            idem.get(&("s".into(), "0".into()), now).is_none(),
            "oldest evicted"
        );
        assert!(idem.get(&("s".into(), "1033".into()), now).is_some());
        assert!(
            idem.get(&("t".into(), "1033".into()), now).is_none(),
            "per subject"
        );
        let later = now + IDEMPOTENCY_TTL;
        assert!(
            idem.get(&("s".into(), "1033".into()), later).is_none(),
            "expired"
        );
        assert_eq!(idem.len(), 0);
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
