//! One ARP connection, whatever its transport: JSON-RPC framing and
//! checks, the lifecycle, and the methods that answer at once. Tool calls
//! run in tasks of their own ([`super::calls`]) so that a running call
//! never blocks `cancelTool`, `emergencyStop` or a confirmation answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use signalling_protocol::arp::{method, ARP_VERSION, MAX_FRAME_BYTES};
use signalling_protocol::{Agent, Body, Envelope, NavigationStatus};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{lock, timestamp, ArpError, ArpServer, Peer, Workspace};
use crate::budget::MessageBudget;
use crate::safety::StopReason;

/// Per-connection message budget (ARP §9): sustained rate and burst.
const MESSAGE_RATE: f64 = 100.0;
const MESSAGE_BURST: f64 = 200.0;

/// A navigation update for a running `navigate_to` call.
pub(super) type NavUpdate = (NavigationStatus, Option<String>);

/// What a connection shares with its running calls: the way out, answers
/// to the robot's own requests, and navigation updates.
#[derive(Clone)]
pub(super) struct Link {
    out: mpsc::Sender<String>,
    pending: Arc<Mutex<HashMap<String, oneshot::Sender<Value>>>>,
    pub(super) nav: Arc<Mutex<HashMap<String, mpsc::Sender<NavUpdate>>>>,
}

impl Link {
    /// Sends a frame, waiting for room (responses must not be lost).
    pub(super) async fn send(&self, message: Value) {
        let _ = self.out.send(message.to_string()).await;
    }

    /// Sends a frame unless the client lags (progress, context updates:
    /// the next one supersedes it).
    pub(super) fn offer(&self, message: Value) {
        if self.out.try_send(message.to_string()).is_err() {
            tracing::debug!("ARP client lags; notification dropped");
        }
    }

    /// Sends a request to the client; the answer (the whole response)
    /// arrives on the receiver, which is dropped unanswered on timeout.
    pub(super) async fn request(
        &self,
        id: String,
        method: &str,
        params: Value,
    ) -> oneshot::Receiver<Value> {
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id.clone(), tx);
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await;
        rx
    }

    pub(super) fn forget(&self, id: &str) {
        lock(&self.pending).remove(id);
    }
}

pub(super) fn notification(method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "method": method, "params": params })
}

pub(super) fn response(id: &Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

pub(super) fn error_response(
    id: &Value,
    error: &ArpError,
    extra: Option<Map<String, Value>>,
) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": error.to_json(extra) })
}

/// Parses params into `T`, naming the offending field.
pub(super) fn parse<T: DeserializeOwned>(params: &Value) -> Result<T, ArpError> {
    serde_path_to_error::deserialize(params).map_err(|e| ArpError::params("", e))
}

pub(super) struct Conn {
    pub(super) server: ArpServer,
    pub(super) peer: Peer,
    pub(super) link: Link,
    initialized: bool,
    /// The client declared `capabilities.confirmation: true`: it is sent the robot's
    /// `arp.requestConfirmation` and may answer it. A client that did not is never asked,
    /// so it has nothing to answer (its calls that need a person are denied).
    pub(super) client_confirms: bool,
    subscriptions: HashMap<String, JoinHandle<()>>,
    budget: MessageBudget,
    last_limit_error: Option<Instant>,
}

impl Drop for Conn {
    /// Whatever ends the connection (close, error, abort): its calls are
    /// cancelled, control is released and the robot stops if it followed
    /// this connection, as when a teleop session ends.
    fn drop(&mut self) {
        for task in self.subscriptions.values() {
            task.abort();
        }
        self.server.cancel_calls_of(&self.peer.key);
        self.server.release_control(&self.peer.key);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let controller = self.server.shared().controller.clone();
            let key = self.peer.key.clone();
            runtime.spawn(async move { controller.detach(&key, StopReason::SessionEnded).await });
        }
    }
}

pub(super) async fn run(
    server: ArpServer,
    peer: Peer,
    mut inbound: mpsc::Receiver<String>,
    outbound: mpsc::Sender<String>,
) {
    tracing::info!(key = %peer.key, role = peer.role.as_str(), subject = %peer.subject, "ARP connection");
    // The controller reports this connection's navigation through it.
    let (controller_tx, mut controller_rx) = mpsc::channel::<Envelope>(16);
    server
        .shared()
        .controller
        .attach(&peer.key, controller_tx)
        .await;
    let mut estop = server.shared().controller.estop_watch();
    estop.borrow_and_update();
    let mut estop_alive = true;
    let mut conn = Conn {
        server,
        peer,
        link: Link {
            out: outbound,
            pending: Arc::default(),
            nav: Arc::default(),
        },
        initialized: false,
        client_confirms: false,
        subscriptions: HashMap::new(),
        budget: MessageBudget::new(MESSAGE_RATE, MESSAGE_BURST),
        last_limit_error: None,
    };
    loop {
        tokio::select! {
            frame = inbound.recv() => match frame {
                Some(text) => conn.frame(&text).await,
                None => break,
            },
            changed = estop.changed(), if estop_alive => {
                if changed.is_err() {
                    estop_alive = false;
                    continue;
                }
                let latched = estop.borrow_and_update().clone();
                if let (Some(reason), true) = (latched, conn.initialized) {
                    // Every party hears of an e-stop, whoever caused it.
                    conn.link
                        .send(notification(method::EMERGENCY_STOP, json!({ "reason": reason })))
                        .await;
                }
            }
            Some(envelope) = controller_rx.recv() => conn.controller_message(&envelope),
        }
    }
    tracing::info!(key = %conn.peer.key, "ARP connection closed");
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitializeParams {
    protocol_version: String,
    client_info: ClientInfo,
    #[serde(default)]
    capabilities: Option<Map<String, Value>>,
}

#[derive(Deserialize)]
struct ClientInfo {
    name: String,
    version: String,
}

#[derive(Deserialize)]
struct EmergencyStopParams {
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CancelParams {
    call_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SubscribeParams {
    name: String,
    max_rate: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NameParams {
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkspaceParams {
    name: String,
    bounds: Bounds,
    #[serde(default)]
    #[allow(dead_code)]
    objects: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Bounds {
    #[serde(rename = "type")]
    kind: String,
    min: Vec<f64>,
    max: Vec<f64>,
    #[serde(default)]
    frame: Option<String>,
}

/// A frame's text as a JSON object (no batches).
fn json_object(text: &str) -> Result<Map<String, Value>, ArpError> {
    match serde_json::from_str(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(Value::Array(_)) => Err(ArpError::InvalidRequest("batches are not supported".into())),
        Ok(_) => Err(ArpError::InvalidRequest(
            "a message is a JSON object".into(),
        )),
        Err(e) => Err(ArpError::Parse(e.to_string())),
    }
}

/// A JSON-RPC message, sorted.
enum Frame {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// The answer to one of our requests (a confirmation).
    Answer {
        id: Value,
        message: Map<String, Value>,
    },
    /// A notification with bad params: no answer (JSON-RPC).
    Ignored,
}

impl Frame {
    /// Sorts a message; what breaks JSON-RPC is the error to answer, with
    /// the id to answer it under.
    fn sort(mut message: Map<String, Value>) -> Result<Frame, Box<(Value, ArpError)>> {
        let id = message.remove("id");
        let id_ok = matches!(&id, None | Some(Value::String(_)))
            || id.as_ref().is_some_and(|v| v.is_i64() || v.is_u64());
        let reply_id = if id_ok {
            id.clone().unwrap_or(Value::Null)
        } else {
            Value::Null
        };
        let invalid = |why: &str| {
            Err(Box::new((
                reply_id.clone(),
                ArpError::InvalidRequest(why.to_owned()),
            )))
        };
        if !id_ok {
            return invalid("id must be a string or an integer");
        }
        if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return invalid("jsonrpc must be \"2.0\"");
        }
        let method = match message.remove("method") {
            Some(Value::String(m)) => m,
            Some(_) => return invalid("method must be a string"),
            None => {
                let answer = message.contains_key("result") || message.contains_key("error");
                return match (id, answer) {
                    (Some(id), true) => Ok(Frame::Answer { id, message }),
                    _ => invalid("a request needs a method"),
                };
            }
        };
        let params = match message.remove("params") {
            None => Value::Object(Map::new()),
            Some(Value::Object(p)) => Value::Object(p),
            Some(_) if id.is_none() => return Ok(Frame::Ignored),
            Some(_) => {
                let e = ArpError::InvalidParams {
                    field: Some("params".into()),
                    message: "params must be an object".into(),
                };
                return Err(Box::new((reply_id, e)));
            }
        };
        Ok(match id {
            Some(id) => Frame::Request { id, method, params },
            None => Frame::Notification { method, params },
        })
    }
}

impl Conn {
    /// One incoming frame: framing checks, then a request, a notification
    /// or the answer to one of our requests.
    async fn frame(&mut self, text: &str) {
        if text.len() > MAX_FRAME_BYTES {
            let e = ArpError::InvalidRequest(format!("frame larger than {MAX_FRAME_BYTES} bytes"));
            self.link.send(error_response(&Value::Null, &e, None)).await;
            return;
        }
        if !self.budget.take() {
            if self.should_report_limit() {
                let e = ArpError::RateLimited(MESSAGE_RATE as u32);
                self.link.send(error_response(&Value::Null, &e, None)).await;
            }
            return;
        }
        let sorted = json_object(text)
            .map_err(|e| Box::new((Value::Null, e)))
            .and_then(Frame::sort);
        match sorted {
            Err(refused) => {
                let (reply_id, e) = *refused;
                self.link.send(error_response(&reply_id, &e, None)).await
            }
            Ok(Frame::Request { id, method, params }) => {
                match self.request(&id, &method, &params).await {
                    Ok(Some(result)) => self.link.send(response(&id, result)).await,
                    // Answered later by the call's task.
                    Ok(None) => {}
                    Err(e) => {
                        tracing::debug!(key = %self.peer.key, %method, error = %e, "ARP request refused");
                        self.link.send(error_response(&id, &e, None)).await;
                    }
                }
            }
            Ok(Frame::Notification { method, params }) => self.notification(&method, &params).await,
            Ok(Frame::Answer { id, message }) => self.answer(&id, message),
            Ok(Frame::Ignored) => {}
        }
    }

    /// Notifications get no answer, even when wrong (JSON-RPC).
    async fn notification(&mut self, name: &str, params: &Value) {
        if name == method::EMERGENCY_STOP {
            let reason = parse::<EmergencyStopParams>(params)
                .ok()
                .and_then(|p| p.reason);
            self.emergency_stop(reason).await;
        } else {
            tracing::debug!(key = %self.peer.key, method = name, "ARP notification ignored");
        }
    }

    async fn request(
        &mut self,
        id: &Value,
        name: &str,
        params: &Value,
    ) -> Result<Option<Value>, ArpError> {
        let known = method::ALL.contains(&name);
        if !known {
            return Err(ArpError::MethodNotFound(name.to_owned()));
        }
        // An e-stop is never refused, initialized or not, whatever its
        // params look like.
        if name == method::EMERGENCY_STOP {
            let reason = parse::<EmergencyStopParams>(params)
                .ok()
                .and_then(|p| p.reason);
            self.emergency_stop(reason).await;
            return Ok(Some(json!({ "stopped": true })));
        }
        if name == method::INITIALIZE {
            return self.initialize(params).map(Some);
        }
        if [
            method::TOOL_PROGRESS,
            method::CONTEXT_UPDATE,
            method::REQUEST_CONFIRMATION,
            method::REQUEST_PLAN,
        ]
        .contains(&name)
        {
            return Err(ArpError::MethodNotFound(format!(
                "{name} is sent by the robot, not to it"
            )));
        }
        if !self.initialized {
            return Err(ArpError::NotInitialized);
        }
        match name {
            method::SHUTDOWN => {
                self.shutdown();
                Ok(Some(json!({})))
            }
            method::LIST_TOOLS => {
                let tools: Vec<Value> = self.server.tools().iter().map(|t| t.to_json()).collect();
                Ok(Some(json!({ "tools": tools })))
            }
            method::CALL_TOOL => self.call_tool(id, params),
            method::CANCEL_TOOL => self.cancel(params).map(Some),
            method::LIST_CONTEXT => Ok(Some(json!({ "sources": self.server.context_sources() }))),
            method::SUBSCRIBE_CONTEXT => self.subscribe(params).map(Some),
            method::UNSUBSCRIBE_CONTEXT => {
                let p: NameParams = parse(params)?;
                if self.server.source_rate(&p.name).is_none() {
                    return Err(ArpError::ContextNotFound(p.name));
                }
                if let Some(task) = self.subscriptions.remove(&p.name) {
                    task.abort();
                }
                Ok(Some(json!({ "name": p.name, "subscribed": false })))
            }
            method::LIST_CONSTRAINTS => {
                Ok(Some(json!({ "constraints": self.server.constraints() })))
            }
            method::GET_CONSTRAINT => {
                let p: NameParams = parse(params)?;
                self.server
                    .constraints()
                    .into_iter()
                    .find(|c| c["name"] == p.name.as_str())
                    .map(Some)
                    .ok_or_else(|| ArpError::InvalidParams {
                        field: Some("name".into()),
                        message: format!("name: no constraint {:?}", p.name),
                    })
            }
            method::SET_WORKSPACE => self.set_workspace(params).map(Some),
            _ => Err(ArpError::MethodNotFound(name.to_owned())),
        }
    }

    fn initialize(&mut self, params: &Value) -> Result<Value, ArpError> {
        if self.initialized {
            return Err(ArpError::InvalidRequest("already initialized".into()));
        }
        let p: InitializeParams = parse(params)?;
        // 0.1.x only: the one version there is.
        if !p.protocol_version.starts_with("0.1.") {
            return Err(ArpError::InvalidParams {
                field: Some("protocolVersion".into()),
                message: format!(
                    "protocolVersion: {:?} is not supported (this robot speaks {ARP_VERSION})",
                    p.protocol_version
                ),
            });
        }
        if self.peer.role.may_drive() {
            self.server.take_control(&self.peer)?;
        }
        self.initialized = true;
        self.client_confirms = p
            .capabilities
            .as_ref()
            .and_then(|c| c.get("confirmation"))
            .and_then(Value::as_bool)
            == Some(true);
        tracing::info!(
            key = %self.peer.key,
            client = %p.client_info.name,
            client_version = %p.client_info.version,
            role = self.peer.role.as_str(),
            confirms = self.client_confirms,
            "ARP client initialized"
        );
        let options = &self.server.inner.options;
        let mut server_info =
            json!({ "name": "robot-agent", "version": env!("CARGO_PKG_VERSION") });
        if let Some(model) = &options.robot_model {
            server_info["robotModel"] = json!(model);
        }
        server_info["robotType"] = json!(options.robot_type.as_deref().unwrap_or("mobile_base"));
        Ok(json!({
            "protocolVersion": ARP_VERSION,
            "serverInfo": server_info,
            "capabilities": {
                "tools": true,
                "context": true,
                "constraints": true,
                // arp.requestPlan is not implemented: the robot never asks.
                "planning": false,
                "confirmation": true,
            },
        }))
    }

    /// Graceful end: calls cancelled, subscriptions and control released;
    /// the client closes the transport next.
    fn shutdown(&mut self) {
        for (_, task) in self.subscriptions.drain() {
            task.abort();
        }
        self.server.cancel_calls_of(&self.peer.key);
        self.server.release_control(&self.peer.key);
        self.initialized = false;
        self.client_confirms = false;
    }

    async fn emergency_stop(&self, reason: Option<String>) {
        let reason = reason
            .filter(|r| !r.trim().is_empty())
            .unwrap_or_else(|| "arp.emergencyStop".into());
        // Bounded: a reason is for a log line, not a payload.
        let reason: String = reason.chars().take(256).collect();
        tracing::error!(key = %self.peer.key, subject = %self.peer.subject, role = self.peer.role.as_str(), %reason, "ARP emergency stop");
        self.server
            .shared()
            .controller
            .emergency_stop(&reason)
            .await;
    }

    fn cancel(&mut self, params: &Value) -> Result<Value, ArpError> {
        let p: CancelParams = parse(params)?;
        let state = self.server.state();
        let Some(call) = state.calls.get(&p.call_id) else {
            return Err(ArpError::InvalidParams {
                field: Some("callId".into()),
                message: format!("callId: no running call {:?}", p.call_id),
            });
        };
        if call.owner != self.peer.key && !self.peer.role.may_drive() {
            return Err(ArpError::Forbidden(self.peer.role.as_str()));
        }
        call.cancel.send_replace(true);
        Ok(json!({ "callId": p.call_id, "cancelled": true }))
    }

    fn subscribe(&mut self, params: &Value) -> Result<Value, ArpError> {
        let p: SubscribeParams = parse(params)?;
        let Some(source_rate) = self.server.source_rate(&p.name) else {
            return Err(ArpError::ContextNotFound(p.name));
        };
        let rate = match p.max_rate {
            None => source_rate,
            Some(r) if r.is_finite() && r > 0.0 => r.min(source_rate),
            Some(_) => {
                return Err(ArpError::InvalidParams {
                    field: Some("maxRate".into()),
                    message: "maxRate: must be a positive number".into(),
                })
            }
        };
        let period = Duration::from_secs_f64(1.0 / rate);
        let server = self.server.clone();
        let link = self.link.clone();
        let name = p.name.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            // A fixed schedule: a late update does not push back the next
            // (no drift below maxRate) and a missed one is not made up (no
            // burst above it).
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                if let Some(data) = server.context_value(&name).await {
                    link.offer(notification(
                        method::CONTEXT_UPDATE,
                        json!({ "name": name, "timestamp": timestamp(), "data": data }),
                    ));
                }
            }
        });
        if let Some(old) = self.subscriptions.insert(p.name.clone(), task) {
            old.abort();
        }
        Ok(json!({ "name": p.name, "subscribed": true }))
    }

    fn set_workspace(&mut self, params: &Value) -> Result<Value, ArpError> {
        if !self.peer.role.may_drive() {
            return Err(ArpError::Forbidden(self.peer.role.as_str()));
        }
        let p: WorkspaceParams = parse(params)?;
        let field_error = |field: &str, message: String| ArpError::InvalidParams {
            field: Some(field.into()),
            message: format!("{field}: {message}"),
        };
        if p.bounds.kind != "box" {
            return Err(field_error(
                "bounds.type",
                "only \"box\" is supported".into(),
            ));
        }
        if let Some(frame) = p.bounds.frame.as_deref() {
            if !["odom", "world", "map"].contains(&frame) {
                return Err(field_error(
                    "bounds.frame",
                    format!("unknown frame {frame:?}"),
                ));
            }
        }
        let workspace = Workspace::new(p.name.clone(), p.bounds.min, p.bounds.max)
            .map_err(|e| field_error("bounds", e.to_string()))?;
        // A configured box is the outer limit: ARP may narrow it, never
        // widen or remove it.
        if let Some(configured) = &self.server.inner.options.workspace {
            if !configured.encloses(&workspace) {
                return Err(ArpError::Violation {
                    constraint: "workspace_bound".into(),
                    message: "the new workspace exceeds the configured one".into(),
                    requested: workspace.parameters(),
                    limit: configured.parameters(),
                });
            }
        }
        tracing::warn!(key = %self.peer.key, name = %workspace.name, min = ?workspace.min, max = ?workspace.max, "workspace set over ARP");
        self.server.state().workspace = Some(workspace);
        Ok(json!({ "name": p.name, "applied": true }))
    }

    /// A response to one of our requests.
    fn answer(&self, id: &Value, mut message: Map<String, Value>) {
        let key = match id {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let waiter = lock(&self.link.pending).remove(&key);
        match waiter {
            Some(tx) => {
                message.insert("id".into(), id.clone());
                let _ = tx.send(Value::Object(message));
            }
            None => tracing::debug!(key = %self.peer.key, %key, "answer to no pending request"),
        }
    }

    /// Messages the controller addresses to this connection: navigation
    /// progress for a running `navigate_to`.
    fn controller_message(&self, envelope: &Envelope) {
        let Ok(Body::Agent(Agent::NavigationResponse(p))) = envelope.body() else {
            return;
        };
        let Some(call) = envelope.correlation_id.as_deref() else {
            return;
        };
        let nav = lock(&self.link.nav);
        if let Some(tx) = nav.get(call) {
            let _ = tx.try_send((p.status, p.message));
        }
    }

    /// One rate-limit error per second: a flood is not answered by a flood.
    fn should_report_limit(&mut self) -> bool {
        let now = Instant::now();
        if self
            .last_limit_error
            .is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(1))
        {
            return false;
        }
        self.last_limit_error = Some(now);
        true
    }
}

impl ArpServer {
    /// Cancels every call a connection started (it is going away).
    pub(super) fn cancel_calls_of(&self, key: &str) {
        for call in self.state().calls.values().filter(|c| c.owner == key) {
            call.cancel.send_replace(true);
        }
    }

    /// The id of a request the robot sends: 128 random bits, so that no client can answer
    /// a request it was not sent by guessing its id.
    pub(super) fn request_id(&self, prefix: &str) -> Result<String, ArpError> {
        let mut bits = [0u8; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bits)
            .map_err(|_| ArpError::Internal)?;
        let hex: String = bits.iter().map(|b| format!("{b:02x}")).collect();
        Ok(format!("{prefix}-{hex}"))
    }
}
