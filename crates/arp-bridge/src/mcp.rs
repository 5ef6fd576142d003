//! `--mode mcp`: the robot as a Model Context Protocol server (MCP
//! 2025-06-18, also answering 2025-03-26 and 2024-11-05 clients). The
//! bridge is the ARP client: it initializes the ARP connection itself,
//! maps ARP tools to MCP tools, context sources to MCP resources, and adds
//! an `emergency_stop` tool. [`Robot`] is the ARP side (requests, routing
//! of answers and notifications); [`Server`] the MCP side.
//!
//! Confirmation fails closed: the bridge declares `confirmation: false`,
//! and an `arp.requestConfirmation` that arrives anyway is answered
//! `confirmed: false` (no human is reachable through this pipe), so the
//! tool call fails with -40006 and the model is told why.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{json, Map, Value};
use signalling_protocol::arp::{method, reason, ArpCode, ARP_VERSION, MAX_FRAME_BYTES};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::JoinSet;

use crate::jsonrpc::{
    self, FrameError, Message, RpcError, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST,
    METHOD_NOT_FOUND,
};
use crate::stdio::Line;
use crate::ws::{FromRobot, Link};
use crate::{emit, not_ready, ready_params, Config, Exit, CLOSED, DESCRIBE, READY};

/// MCP versions answered, newest first (the first is offered to clients
/// asking for one we do not know).
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-06-18", "2025-03-26", "2024-11-05"];
/// The MCP tool that maps to `arp.emergencyStop`.
pub const ESTOP_TOOL: &str = "emergency_stop";
/// MCP resource URIs of ARP context sources: this prefix and the name.
pub const RESOURCE_PREFIX: &str = "arp://context/";
/// `confirmedBy` of the bridge's refusals.
pub const CONFIRMED_BY: &str = "arp-bridge (no human reachable; refused)";
/// MCP's "resource not found".
pub const RESOURCE_NOT_FOUND: i64 = -32002;

/// Longest wait for the robot's answer to a quick request (listings,
/// initialize, e-stop). Tool calls have no bound here: the robot bounds
/// them (30 s drives, 300 s driver tools, its confirmation timeout).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for a context update when reading a resource.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a cancelled call may take to end before it is forgotten.
const CANCEL_WAIT: Duration = Duration::from_secs(30);
/// MCP requests served at once; more are refused, not queued.
pub const MAX_IN_FLIGHT: usize = 32;
/// Requests to the robot awaiting an answer, at most.
const MAX_PENDING: usize = 256;
/// Progress updates queued per call (older ones are dropped when full).
const PROGRESS_QUEUE: usize = 16;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RobotError {
    #[error("the ARP connection is closed")]
    Closed,
    #[error("no answer from the robot within {0:?}")]
    Timeout(Duration),
    #[error("too many requests awaiting the robot")]
    Busy,
    #[error("ARP error {}: {}", .0.code, .0.message)]
    Arp(RpcError),
}

impl RobotError {
    /// As a JSON-RPC error to the MCP client (a protocol error).
    fn to_rpc(&self) -> RpcError {
        match self {
            RobotError::Arp(e) => e.clone(),
            RobotError::Closed => RpcError::new(INTERNAL_ERROR, self.to_string())
                .with_data(json!({ "reason": reason::ROBOT_OFFLINE })),
            _ => RpcError::new(INTERNAL_ERROR, self.to_string()),
        }
    }
}

type Reply = Result<Value, RobotError>;
type Progress = (f64, Option<String>);

/// A running `arp.callTool`, for routing its progress.
struct CallRoute {
    arp_id: String,
    /// Learnt from the first progress notification (or never, for a call
    /// that answers at once).
    call_id: Option<String>,
    expects_progress: bool,
    progress: Option<mpsc::Sender<Progress>>,
    known: watch::Sender<Option<String>>,
}

#[derive(Default)]
struct Reads {
    readers: usize,
    waiters: Vec<oneshot::Sender<Reply>>,
}

#[derive(Default)]
struct Router {
    pending: HashMap<String, oneshot::Sender<Reply>>,
    calls: Vec<CallRoute>,
    reads: HashMap<String, Reads>,
    /// MCP request id key → its cancel signal.
    cancels: HashMap<String, watch::Sender<bool>>,
    /// Tool name → whether it reports progress (from the last listing).
    reports_progress: HashMap<String, bool>,
    closed: bool,
}

/// The ARP side: requests to the robot and the routing of what comes
/// back. Cheap to clone; shared by every request task.
#[derive(Clone)]
pub struct Robot {
    inner: Arc<RobotInner>,
}

struct RobotInner {
    to_robot: mpsc::Sender<String>,
    router: Mutex<Router>,
    next: AtomicU64,
}

/// A started tool call.
struct StartedCall {
    arp_id: String,
    reply: oneshot::Receiver<Reply>,
    known: watch::Receiver<Option<String>>,
    progress: Option<mpsc::Receiver<Progress>>,
}

impl Robot {
    pub fn new(to_robot: mpsc::Sender<String>) -> Robot {
        Robot {
            inner: Arc::new(RobotInner {
                to_robot,
                router: Mutex::new(Router::default()),
                next: AtomicU64::new(1),
            }),
        }
    }

    fn router(&self) -> MutexGuard<'_, Router> {
        // Each update is a single insert or remove: nothing half done to
        // protect from a panicking holder.
        self.inner
            .router
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn next_id(&self) -> String {
        format!("bridge-{}", self.inner.next.fetch_add(1, Ordering::Relaxed))
    }

    /// Registers a waiter for `id`'s answer.
    fn expect(&self, id: &str) -> Result<oneshot::Receiver<Reply>, RobotError> {
        let mut router = self.router();
        if router.closed {
            return Err(RobotError::Closed);
        }
        if router.pending.len() >= MAX_PENDING {
            return Err(RobotError::Busy);
        }
        let (tx, rx) = oneshot::channel();
        router.pending.insert(jsonrpc::id_key(&json!(id)), tx);
        Ok(rx)
    }

    fn forget(&self, id: &str) {
        self.router().pending.remove(&jsonrpc::id_key(&json!(id)));
    }

    async fn send(&self, id: &str, method: &str, params: Value) -> Result<(), RobotError> {
        let frame = jsonrpc::request(&json!(id), method, params).to_string();
        if self.inner.to_robot.send(frame).await.is_err() {
            self.forget(id);
            return Err(RobotError::Closed);
        }
        Ok(())
    }

    /// A request with a bounded wait for its answer.
    pub async fn request(&self, method: &str, params: Value) -> Reply {
        let id = self.next_id();
        let reply = self.expect(&id)?;
        self.send(&id, method, params).await?;
        match tokio::time::timeout(REQUEST_TIMEOUT, reply).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(RobotError::Closed),
            Err(_) => {
                self.forget(&id);
                Err(RobotError::Timeout(REQUEST_TIMEOUT))
            }
        }
    }

    async fn start_call(
        &self,
        name: &str,
        arguments: Value,
        with_progress: bool,
    ) -> Result<StartedCall, RobotError> {
        let arp_id = self.next_id();
        let reply = self.expect(&arp_id)?;
        let (known_tx, known) = watch::channel(None);
        let (progress_tx, progress) = if with_progress {
            let (tx, rx) = mpsc::channel(PROGRESS_QUEUE);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        {
            // Registered before the request leaves: its first progress may
            // arrive before `send` returns.
            let mut router = self.router();
            let expects_progress = router.reports_progress.get(name).copied().unwrap_or(true);
            router.calls.push(CallRoute {
                arp_id: arp_id.clone(),
                call_id: None,
                expects_progress,
                progress: progress_tx,
                known: known_tx,
            });
        }
        let params = json!({ "name": name, "arguments": arguments });
        if let Err(e) = self.send(&arp_id, method::CALL_TOOL, params).await {
            self.end_call(&arp_id);
            return Err(e);
        }
        Ok(StartedCall {
            arp_id,
            reply,
            known,
            progress,
        })
    }

    fn end_call(&self, arp_id: &str) {
        self.router().calls.retain(|c| c.arp_id != arp_id);
    }

    /// The next update of context source `name`: subscribes (if no other
    /// read of it is under way), waits for one update, unsubscribes when
    /// the last reader is done. Subscribe and unsubscribe frames are
    /// queued under the router's lock, so they reach the robot in the
    /// order the readers come and go.
    async fn read_context(&self, name: &str) -> Reply {
        let (update, subscribed) = {
            let mut router = self.router();
            if router.closed {
                return Err(RobotError::Closed);
            }
            let first = router.reads.get(name).is_none_or(|r| r.readers == 0);
            let subscribed = if first {
                if router.pending.len() >= MAX_PENDING {
                    return Err(RobotError::Busy);
                }
                let id = self.next_id();
                let frame = jsonrpc::request(
                    &json!(id),
                    method::SUBSCRIBE_CONTEXT,
                    json!({ "name": name }),
                )
                .to_string();
                if self.inner.to_robot.try_send(frame).is_err() {
                    return Err(RobotError::Busy);
                }
                let (tx, rx) = oneshot::channel();
                router.pending.insert(jsonrpc::id_key(&json!(id)), tx);
                Some(rx)
            } else {
                None
            };
            let reads = router.reads.entry(name.to_owned()).or_default();
            reads.readers += 1;
            let (tx, rx) = oneshot::channel();
            reads.waiters.push(tx);
            (rx, subscribed)
        };
        let _reader = ReadGuard {
            robot: self.clone(),
            name: name.to_owned(),
        };
        let wait = async {
            let mut update = update;
            if let Some(subscribed) = subscribed {
                tokio::select! {
                    reply = &mut update => return reply.unwrap_or(Err(RobotError::Closed)),
                    answer = subscribed => match answer {
                        Ok(Err(e)) => {
                            // No such source (or a refusal): every reader
                            // waiting on it learns so now.
                            self.fail_reads(name, &e);
                        }
                        Ok(Ok(_)) => {}
                        Err(_) => return Err(RobotError::Closed),
                    },
                }
            }
            update.await.unwrap_or(Err(RobotError::Closed))
        };
        tokio::time::timeout(READ_TIMEOUT, wait)
            .await
            .unwrap_or(Err(RobotError::Timeout(READ_TIMEOUT)))
    }

    fn fail_reads(&self, name: &str, e: &RobotError) {
        if let Some(reads) = self.router().reads.get_mut(name) {
            for waiter in reads.waiters.drain(..) {
                let _ = waiter.send(Err(e.clone()));
            }
        }
    }

    fn end_read(&self, name: &str) {
        let mut router = self.router();
        let Some(reads) = router.reads.get_mut(name) else {
            return;
        };
        reads.readers = reads.readers.saturating_sub(1);
        if reads.readers > 0 {
            return;
        }
        router.reads.remove(name);
        if !router.closed {
            // Its answer is not awaited (an unknown id is ignored); if the
            // queue is full the updates go on and are ignored too.
            let id = self.next_id();
            let frame = jsonrpc::request(
                &json!(id),
                method::UNSUBSCRIBE_CONTEXT,
                json!({ "name": name }),
            );
            let _ = self.inner.to_robot.try_send(frame.to_string());
        }
    }

    /// One frame from the robot; `Some`: the answer to send back (to a
    /// request the robot made).
    pub fn dispatch(&self, text: &str) -> Option<Value> {
        let object = match jsonrpc::parse_object(text) {
            Ok(object) => object,
            Err(e) => {
                eprintln!("arp-bridge: dropped a frame from the robot: {e}");
                return None;
            }
        };
        match Message::from_object(object) {
            Message::Response { id, outcome } => {
                let waiter = self.router().pending.remove(&jsonrpc::id_key(&id));
                if let Some(waiter) = waiter {
                    let _ = waiter.send(outcome.map_err(RobotError::Arp));
                }
                None
            }
            Message::Notification { method, params } => {
                match method.as_str() {
                    method::TOOL_PROGRESS => self.route_progress(&params),
                    method::CONTEXT_UPDATE => {
                        let name = params.get("name").and_then(Value::as_str).unwrap_or("");
                        if let Some(reads) = self.router().reads.get_mut(name) {
                            for waiter in reads.waiters.drain(..) {
                                let _ = waiter.send(Ok(params.clone()));
                            }
                        }
                    }
                    method::EMERGENCY_STOP => {
                        eprintln!("arp-bridge: the robot reports an emergency stop: {params}");
                    }
                    _ => {}
                }
                None
            }
            Message::Request { id, method, params } => {
                if method == method::REQUEST_CONFIRMATION {
                    // Fail closed: nobody behind an MCP pipe can be asked
                    // reliably, and a model must not approve for a human.
                    eprintln!(
                        "arp-bridge: refused the robot's confirmation request for {}",
                        params.pointer("/details/tool").unwrap_or(&Value::Null)
                    );
                    Some(jsonrpc::result(
                        &id,
                        json!({
                            "confirmed": false,
                            "confirmedBy": CONFIRMED_BY,
                            "timestamp": crate::time::now_rfc3339(),
                        }),
                    ))
                } else {
                    Some(jsonrpc::error(
                        &id,
                        METHOD_NOT_FOUND,
                        &format!("{method} is not supported by arp-bridge"),
                        None,
                    ))
                }
            }
            Message::Invalid { why, .. } => {
                eprintln!("arp-bridge: dropped an invalid frame from the robot: {why}");
                None
            }
        }
    }

    /// Routes an `arp.toolProgress` to its MCP call. The robot names only
    /// the `callId`, which the bridge learns from the first progress: a
    /// new callId belongs to the oldest call not yet known that reports
    /// progress (robot-agent runs one motion call at a time, and calls
    /// that answer at once send none).
    fn route_progress(&self, params: &Value) {
        let Some(call_id) = params.get("callId").and_then(Value::as_str) else {
            return;
        };
        let progress = params
            .get("progress")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        let message = params
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let mut router = self.router();
        let calls = &mut router.calls;
        let index = calls
            .iter()
            .position(|c| c.call_id.as_deref() == Some(call_id))
            .or_else(|| {
                calls
                    .iter()
                    .position(|c| c.call_id.is_none() && c.expects_progress)
            })
            .or_else(|| calls.iter().position(|c| c.call_id.is_none()));
        let Some(call) = index.and_then(|i| calls.get_mut(i)) else {
            return;
        };
        if call.call_id.is_none() {
            call.call_id = Some(call_id.to_owned());
            call.known.send_replace(Some(call_id.to_owned()));
        }
        if let Some(tx) = &call.progress {
            // A lagging client loses progress, never the answer.
            let _ = tx.try_send((progress, message));
        }
    }

    /// The connection is gone: every waiter learns it now.
    fn close(&self) {
        let mut router = self.router();
        router.closed = true;
        for (_, waiter) in router.pending.drain() {
            let _ = waiter.send(Err(RobotError::Closed));
        }
        for (_, mut reads) in router.reads.drain() {
            for waiter in reads.waiters.drain(..) {
                let _ = waiter.send(Err(RobotError::Closed));
            }
        }
        router.calls.clear();
    }

    fn remember_tools(&self, tools: &[Value]) {
        let mut router = self.router();
        router.reports_progress = tools
            .iter()
            .filter_map(|t| {
                let name = t.get("name")?.as_str()?.to_owned();
                // A tool that says it takes no time answers at once.
                let instant = t.get("estimatedDuration").and_then(Value::as_f64) == Some(0.0);
                Some((name, !instant))
            })
            .collect();
    }
}

struct ReadGuard {
    robot: Robot,
    name: String,
}

impl Drop for ReadGuard {
    fn drop(&mut self) {
        self.robot.end_read(&self.name);
    }
}

// ---------------------------------------------------------------------
// Mapping ARP → MCP (pure functions).

/// An ARP Tool as an MCP tool; `None` for one without a name.
pub fn mcp_tool(tool: &Value) -> Option<Value> {
    let name = tool.get("name")?.as_str()?;
    let description = tool
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut schema = match tool.get("parameters") {
        Some(Value::Object(s)) => Value::Object(s.clone()),
        _ => json!({ "type": "object", "properties": {} }),
    };
    if schema.get("type").is_none() {
        schema["type"] = json!("object");
    }
    let safety = tool.get("safety").cloned().unwrap_or_else(|| json!({}));
    let level = safety
        .get("level")
        .and_then(Value::as_str)
        .unwrap_or("normal");
    let reversible = safety
        .get("reversible")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let confirm = safety
        .get("requiresConfirmation")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut text = format!("{description}\n\nSafety: {level}");
    if let Some(note) = safety.get("description").and_then(Value::as_str) {
        text.push_str(&format!(" ({note})"));
    }
    text.push_str(if reversible {
        "; reversible."
    } else {
        "; not reversible."
    });
    if confirm {
        text.push_str(
            " The robot asks a human to confirm this tool; through this MCP bridge no human \
             can answer, so the call is refused (-40006) unless the robot's configuration \
             changes.",
        );
    }
    let mut meta = json!({ "arp/safety": safety });
    if let Some(d) = tool.get("estimatedDuration") {
        meta["arp/estimatedDuration"] = d.clone();
    }
    Some(json!({
        "name": name,
        "title": name,
        "description": text,
        "inputSchema": schema,
        "annotations": {
            "title": name,
            // ARP has no read-only marker: every tool may act on the robot.
            "readOnlyHint": false,
            "destructiveHint": !reversible || level == "critical",
            "idempotentHint": false,
            // It acts on the physical world.
            "openWorldHint": true,
        },
        "_meta": meta,
    }))
}

/// The bridge's own tool: `arp.emergencyStop`.
pub fn estop_tool() -> Value {
    json!({
        "name": ESTOP_TOOL,
        "title": "Emergency stop",
        "description": "Emergency stop: halt all motion now and latch the robot's e-stop \
                        (ARP arp.emergencyStop). Anyone may call it, any time; running tool \
                        calls fail with -40007 and motion stays refused until an operator \
                        calls reset_emergency_stop.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "reason": { "type": "string", "maxLength": 256, "description": "why, for the robot's log" },
            },
            "additionalProperties": false,
        },
        "annotations": {
            "title": "Emergency stop",
            "readOnlyHint": false,
            "destructiveHint": false,
            "idempotentHint": true,
            "openWorldHint": true,
        },
    })
}

/// An ARP ContextSource as an MCP resource.
pub fn mcp_resource(source: &Value) -> Option<Value> {
    let name = source.get("name")?.as_str()?;
    let mut description = source
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let mut facts = Vec::new();
    if let Some(t) = source.get("dataType").and_then(Value::as_str) {
        facts.push(format!("dataType {t}"));
    }
    if let Some(f) = source.get("coordinateFrame").and_then(Value::as_str) {
        facts.push(format!("frame {f}"));
    }
    if let Some(r) = source.get("updateRate").and_then(Value::as_f64) {
        facts.push(format!("{r} updates/s"));
    }
    if !facts.is_empty() {
        description.push_str(&format!(" (ARP context: {})", facts.join(", ")));
    }
    Some(json!({
        "uri": format!("{RESOURCE_PREFIX}{name}"),
        "name": name,
        "title": name,
        "description": description,
        "mimeType": "application/json",
    }))
}

fn text_result(text: String, structured: Value, is_error: bool) -> Value {
    json!({
        "content": [{ "type": "text", "text": text }],
        "structuredContent": structured,
        "isError": is_error,
    })
}

/// The answer to `tools/call` from the ARP outcome: a tool result (with
/// `isError` for ARP errors of the call), or a JSON-RPC error for what is
/// a protocol matter (unknown tool, a request the robot could not read).
pub fn call_result(name: &str, outcome: Result<Value, RpcError>) -> Result<Value, RpcError> {
    match outcome {
        Ok(result) => {
            let state = result
                .get("state")
                .and_then(Value::as_str)
                .unwrap_or("completed");
            let text = format!("{name}: {state}. {result}");
            let structured = if result.is_object() {
                result
            } else {
                json!({ "result": result })
            };
            Ok(text_result(text, structured, false))
        }
        Err(e) => match e.code {
            c if c == ArpCode::ToolNotFound.code() => Err(RpcError::new(
                INVALID_PARAMS,
                format!("Unknown tool: {name}"),
            )),
            -32700 | -32600 | -32601 => Err(RpcError::new(
                INTERNAL_ERROR,
                format!(
                    "the robot could not read the bridge's request: {}",
                    e.message
                ),
            )),
            c if c == ArpCode::NotInitialized.code() => {
                Err(RpcError::new(INTERNAL_ERROR, e.message.clone()))
            }
            _ => Ok(error_result(&e)),
        },
    }
}

/// An ARP error as a tool result with `isError: true`: the code, its name
/// and the reason in the text, everything in `structuredContent.error`.
pub fn error_result(e: &RpcError) -> Value {
    let name = ArpCode::from_code(e.code).map_or("Error", |c| c.name());
    let mut text = format!("ARP error {} ({name}): {}", e.code, e.message);
    let data = e.data.clone().unwrap_or_else(|| json!({}));
    if let Some(why) = data.get("reason").and_then(Value::as_str) {
        text.push_str(&format!(" [reason: {why}]"));
    }
    if let Some(c) = data.get("constraint").and_then(Value::as_str) {
        text.push_str(&format!(" [constraint: {c}]"));
    }
    if e.code == ArpCode::ConfirmationDenied.code()
        && data.get("confirmedBy").and_then(Value::as_str) == Some(CONFIRMED_BY)
    {
        text.push_str(
            " The robot wanted a human's confirmation; arp-bridge refuses such requests \
             because no human can answer through MCP.",
        );
    }
    let mut error = json!({ "code": e.code, "name": name, "message": e.message });
    if e.data.is_some() {
        error["data"] = data;
    }
    text_result(text, json!({ "error": error }), true)
}

// ---------------------------------------------------------------------
// The MCP server.

pub fn describe(config: &Config) -> Value {
    json!({
        "name": "arp-bridge",
        "version": crate::VERSION,
        "mode": "mcp",
        "url": crate::ws::redact(&config.target.url),
        "methods": [
            "initialize", "ping", "tools/list", "tools/call", "resources/list",
            "resources/read", "resources/templates/list", DESCRIBE,
        ],
        "notifications": [READY, CLOSED, "notifications/progress"],
        "accepts": ["notifications/initialized", "notifications/cancelled"],
        "protocolVersions": PROTOCOL_VERSIONS,
        "maxFrameBytes": MAX_FRAME_BYTES,
    })
}

struct Server<'a> {
    config: &'a Config,
    robot: Robot,
    out: &'a mpsc::Sender<String>,
    /// The robot's `serverInfo`, for `initialize`.
    robot_info: Value,
    tasks: JoinSet<()>,
    slots: Arc<Semaphore>,
}

pub async fn run(
    config: &Config,
    mut link: Link,
    mut lines: mpsc::Receiver<std::io::Result<Line>>,
    out: &mpsc::Sender<String>,
) -> Exit {
    let robot = Robot::new(link.to_robot.clone());
    // The bridge is the ARP client: it initializes before saying ready,
    // dispatching frames meanwhile so the answer can arrive.
    let init = robot.request(
        method::INITIALIZE,
        json!({
            "protocolVersion": ARP_VERSION,
            "clientInfo": { "name": "arp-bridge", "version": crate::VERSION },
            // No planning, and no confirmation: see the module's comment.
            "capabilities": { "planning": false, "confirmation": false },
        }),
    );
    tokio::pin!(init);
    let initialized = loop {
        tokio::select! {
            reply = &mut init => break reply,
            frame = link.from_robot.recv() => match frame {
                Some(FromRobot::Frame(text)) => {
                    if let Some(answer) = robot.dispatch(&text) {
                        let _ = link.to_robot.send(answer.to_string()).await;
                    }
                }
                Some(FromRobot::Closed { .. }) | None => {
                    robot.close();
                }
            },
        }
    };
    let robot_info = match initialized {
        Ok(result) => result.get("serverInfo").cloned().unwrap_or(Value::Null),
        Err(e) => {
            let kind = match &e {
                RobotError::Arp(_) => "initialize",
                _ => "connect",
            };
            eprintln!("arp-bridge: arp.initialize failed: {e}");
            let mut ready = not_ready(config, kind, &e.to_string());
            if let RobotError::Arp(arp) = &e {
                ready["params"]["error"]["arp"] = json!({
                    "code": arp.code, "message": arp.message, "data": arp.data,
                });
            }
            emit(out, ready).await;
            link.close().await;
            return Exit::StartFailed;
        }
    };
    emit(
        out,
        jsonrpc::notification(READY, ready_params(config, json!({ "robot": robot_info }))),
    )
    .await;
    let mut server = Server {
        config,
        robot: robot.clone(),
        out,
        robot_info,
        tasks: JoinSet::new(),
        slots: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
    };
    loop {
        tokio::select! {
            line = lines.recv() => match line {
                Some(Ok(line)) => server.client_line(line).await,
                Some(Err(e)) => {
                    eprintln!("arp-bridge: reading stdin failed: {e}");
                    server.tasks.abort_all();
                    link.close().await;
                    return Exit::Input;
                }
                None => {
                    // The parent is gone: end the ARP session politely,
                    // briefly, then close.
                    server.tasks.abort_all();
                    let shutdown = robot.request(method::SHUTDOWN, json!({}));
                    let _ = tokio::time::timeout(Duration::from_secs(1), async {
                        tokio::pin!(shutdown);
                        loop {
                            tokio::select! {
                                _ = &mut shutdown => break,
                                frame = link.from_robot.recv() => match frame {
                                    Some(FromRobot::Frame(text)) => { robot.dispatch(&text); }
                                    _ => break,
                                },
                            }
                        }
                    })
                    .await;
                    link.close().await;
                    return Exit::Eof;
                }
            },
            frame = link.from_robot.recv() => match frame {
                Some(FromRobot::Frame(text)) => {
                    if let Some(answer) = robot.dispatch(&text) {
                        let _ = link.to_robot.send(answer.to_string()).await;
                    }
                }
                Some(FromRobot::Closed { code, reason }) => {
                    server.closed(code, &reason).await;
                    return Exit::ConnectionLost;
                }
                None => {
                    server.closed(None, "the connection ended").await;
                    return Exit::ConnectionLost;
                }
            },
            Some(_) = server.tasks.join_next(), if !server.tasks.is_empty() => {}
        }
    }
}

impl Server<'_> {
    async fn client_line(&mut self, line: Line) {
        let text = match line {
            Line::Text(text) => text,
            Line::TooLong => {
                emit(
                    self.out,
                    FrameError::TooLarge(MAX_FRAME_BYTES).to_response(),
                )
                .await;
                return;
            }
            Line::NotUtf8 => {
                let e = FrameError::Parse("the line is not UTF-8".into());
                emit(self.out, e.to_response()).await;
                return;
            }
        };
        if text.trim().is_empty() {
            return;
        }
        let object = match jsonrpc::parse_object(&text) {
            Ok(object) => object,
            Err(e) => {
                emit(self.out, e.to_response()).await;
                return;
            }
        };
        match Message::from_object(object) {
            Message::Request { id, method, params } => self.request(id, &method, params).await,
            Message::Notification { method, params } => {
                if method == "notifications/cancelled" {
                    if let Some(id) = params.get("requestId") {
                        let cancel = self.robot.router().cancels.remove(&jsonrpc::id_key(id));
                        if let Some(cancel) = cancel {
                            cancel.send_replace(true);
                        }
                    }
                }
                // notifications/initialized and the rest need nothing.
            }
            // The bridge sends no requests to the client.
            Message::Response { .. } => {}
            Message::Invalid { id, why } => {
                emit(self.out, jsonrpc::error(&id, INVALID_REQUEST, &why, None)).await;
            }
        }
    }

    async fn request(&mut self, id: Value, method: &str, params: Value) {
        let params = match params {
            Value::Object(p) => p,
            _ => {
                let e = jsonrpc::error(&id, INVALID_PARAMS, "params must be an object", None);
                emit(self.out, e).await;
                return;
            }
        };
        let answer = match method {
            "initialize" => jsonrpc::result(&id, self.initialize(&params)),
            "ping" => jsonrpc::result(&id, json!({})),
            DESCRIBE => jsonrpc::result(&id, describe(self.config)),
            "resources/templates/list" => jsonrpc::result(&id, json!({ "resourceTemplates": [] })),
            "tools/list" | "tools/call" | "resources/list" | "resources/read" => {
                return self.spawn(id, method.to_owned(), params).await;
            }
            _ => jsonrpc::error(
                &id,
                METHOD_NOT_FOUND,
                &format!("method not found: {method}"),
                None,
            ),
        };
        emit(self.out, answer).await;
    }

    fn initialize(&self, params: &Map<String, Value>) -> Value {
        let asked = params.get("protocolVersion").and_then(Value::as_str);
        let version = asked
            .filter(|v| PROTOCOL_VERSIONS.contains(v))
            .unwrap_or(PROTOCOL_VERSIONS[0]);
        let robot = self
            .robot_info
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("robot");
        let kind = self
            .robot_info
            .get("robotType")
            .and_then(Value::as_str)
            .unwrap_or("robot");
        json!({
            "protocolVersion": version,
            "capabilities": {
                "tools": { "listChanged": false },
                "resources": { "subscribe": false, "listChanged": false },
            },
            "serverInfo": {
                "name": "arp-bridge",
                "title": format!("ARP bridge to {robot}"),
                "version": crate::VERSION,
            },
            "instructions": format!(
                "The tools act on a physical robot ({kind}) through the Autonomous Robot \
                 Protocol {ARP_VERSION}. Call {ESTOP_TOOL} at once if anything looks unsafe. \
                 The robot's state (pose, status) is readable as resources \
                 {RESOURCE_PREFIX}{{name}}."
            ),
        })
    }

    /// Requests that wait on the robot run in tasks of their own, at most
    /// [`MAX_IN_FLIGHT`]: the loop keeps reading both sides meanwhile.
    async fn spawn(&mut self, id: Value, method: String, params: Map<String, Value>) {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            let e = jsonrpc::error(
                &id,
                INTERNAL_ERROR,
                "too many requests in flight",
                Some(json!({ "limit": MAX_IN_FLIGHT })),
            );
            emit(self.out, e).await;
            return;
        };
        let robot = self.robot.clone();
        let out = self.out.clone();
        let cancel = if method == "tools/call" {
            let (tx, rx) = watch::channel(false);
            robot.router().cancels.insert(jsonrpc::id_key(&id), tx);
            Some(rx)
        } else {
            None
        };
        self.tasks.spawn(async move {
            let _permit = permit;
            let answer = match method.as_str() {
                "tools/list" => tools_list(&robot).await,
                "resources/list" => resources_list(&robot).await,
                "resources/read" => resources_read(&robot, &params).await,
                _ => tools_call(&robot, &out, &id, &params, cancel).await,
            };
            robot.router().cancels.remove(&jsonrpc::id_key(&id));
            // `None`: cancelled, and MCP wants no answer then.
            if let Some(answer) = answer {
                let message = match answer {
                    Ok(result) => jsonrpc::result(&id, result),
                    Err(e) => e.to_response(&id),
                };
                emit(&out, message).await;
            }
        });
    }

    async fn closed(&mut self, code: Option<u16>, why: &str) {
        eprintln!("arp-bridge: the ARP connection closed: {why}");
        // Every waiting request task answers its MCP request with an
        // error now; give them a moment to print it.
        self.robot.close();
        let unanswered = self.tasks.len();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        self.tasks.abort_all();
        let params = json!({ "reason": why, "code": code, "unanswered": unanswered });
        emit(self.out, jsonrpc::notification(CLOSED, params)).await;
    }
}

type Answer = Option<Result<Value, RpcError>>;

async fn tools_list(robot: &Robot) -> Answer {
    let listed = match robot.request(method::LIST_TOOLS, json!({})).await {
        Ok(listed) => listed,
        Err(e) => return Some(Err(e.to_rpc())),
    };
    let arp_tools = listed
        .get("tools")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    robot.remember_tools(&arp_tools);
    let mut tools: Vec<Value> = arp_tools
        .iter()
        // The bridge's own emergency_stop wins over a same-named tool.
        .filter(|t| t.get("name").and_then(Value::as_str) != Some(ESTOP_TOOL))
        .filter_map(mcp_tool)
        .collect();
    tools.push(estop_tool());
    Some(Ok(json!({ "tools": tools })))
}

async fn resources_list(robot: &Robot) -> Answer {
    let listed = match robot.request(method::LIST_CONTEXT, json!({})).await {
        Ok(listed) => listed,
        Err(e) => return Some(Err(e.to_rpc())),
    };
    let resources: Vec<Value> = listed
        .get("sources")
        .and_then(Value::as_array)
        .map(|s| s.iter().filter_map(mcp_resource).collect())
        .unwrap_or_default();
    Some(Ok(json!({ "resources": resources })))
}

async fn resources_read(robot: &Robot, params: &Map<String, Value>) -> Answer {
    let Some(uri) = params.get("uri").and_then(Value::as_str) else {
        return Some(Err(RpcError::new(
            INVALID_PARAMS,
            "uri: a string is required",
        )));
    };
    let not_found = || {
        RpcError::new(RESOURCE_NOT_FOUND, format!("Resource not found: {uri}"))
            .with_data(json!({ "uri": uri }))
    };
    let name = match uri.strip_prefix(RESOURCE_PREFIX) {
        Some(name) if !name.is_empty() && !name.contains('/') => name,
        _ => return Some(Err(not_found())),
    };
    match robot.read_context(name).await {
        Ok(update) => Some(Ok(json!({
            "contents": [{
                "uri": uri,
                "mimeType": "application/json",
                "text": update.to_string(),
            }],
        }))),
        Err(RobotError::Arp(e)) if e.code == ArpCode::ContextNotFound.code() => {
            Some(Err(not_found()))
        }
        Err(e) => Some(Err(e.to_rpc())),
    }
}

async fn tools_call(
    robot: &Robot,
    out: &mpsc::Sender<String>,
    id: &Value,
    params: &Map<String, Value>,
    cancel: Option<watch::Receiver<bool>>,
) -> Answer {
    let Some(name) = params.get("name").and_then(Value::as_str) else {
        return Some(Err(RpcError::new(
            INVALID_PARAMS,
            "name: a string is required",
        )));
    };
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(a)) => Value::Object(a.clone()),
        Some(_) => {
            return Some(Err(RpcError::new(
                INVALID_PARAMS,
                "arguments: must be an object",
            )))
        }
    };
    if name == ESTOP_TOOL {
        let reason = arguments
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("emergency_stop (MCP)");
        let stop = robot
            .request(method::EMERGENCY_STOP, json!({ "reason": reason }))
            .await;
        return Some(match stop {
            Ok(result) => Ok(text_result(
                "Emergency stop sent: the robot halted and its e-stop is latched.".into(),
                result,
                false,
            )),
            Err(RobotError::Arp(e)) => Ok(error_result(&e)),
            Err(e) => Err(e.to_rpc()),
        });
    }
    let token = params
        .get("_meta")
        .and_then(|m| m.get("progressToken"))
        .filter(|t| t.is_string() || t.is_i64() || t.is_u64())
        .cloned();
    let mut call = match robot.start_call(name, arguments, token.is_some()).await {
        Ok(call) => call,
        Err(e) => return Some(Err(e.to_rpc())),
    };
    let mut cancel = cancel;
    let mut last = f64::NEG_INFINITY;
    let outcome = loop {
        let progress = async {
            match call.progress.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        let cancelled = async {
            match cancel.as_mut() {
                Some(rx) => rx.wait_for(|c| *c).await.is_ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            reply = &mut call.reply => break Some(reply.unwrap_or(Err(RobotError::Closed))),
            update = progress => match update {
                Some((p, message)) => {
                    // MCP wants progress to increase with each notification.
                    if p > last {
                        last = p;
                        if let Some(token) = &token {
                            let mut params = json!({ "progressToken": token, "progress": p, "total": 1.0 });
                            if let Some(m) = message {
                                params["message"] = json!(m);
                            }
                            emit(out, jsonrpc::notification("notifications/progress", params)).await;
                        }
                    }
                }
                None => call.progress = None,
            },
            still = cancelled => {
                if still {
                    break None;
                }
                cancel = None;
            }
        }
    };
    let answer = match outcome {
        Some(Ok(result)) => Some(call_result(name, Ok(result))),
        Some(Err(RobotError::Arp(e))) => Some(call_result(name, Err(e))),
        Some(Err(e)) => Some(Err(e.to_rpc())),
        None => {
            cancel_call(robot, &mut call, id).await;
            None
        }
    };
    robot.end_call(&call.arp_id);
    answer
}

/// `notifications/cancelled` for a running call: `arp.cancelTool` once the
/// callId is known, then the call's end is awaited (and not reported).
async fn cancel_call(robot: &Robot, call: &mut StartedCall, id: &Value) {
    let ended = async {
        let call_id = tokio::select! {
            _ = &mut call.reply => return,
            known = call.known.wait_for(Option::is_some) => known.ok().and_then(|k| (*k).clone()),
        };
        if let Some(call_id) = call_id {
            let _ = robot
                .request(method::CANCEL_TOOL, json!({ "callId": call_id }))
                .await;
        }
        let _ = (&mut call.reply).await;
    };
    if tokio::time::timeout(CANCEL_WAIT, ended).await.is_err() {
        eprintln!("arp-bridge: the cancelled call of request {id} did not end in time");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_keep_their_schema_and_say_their_safety() {
        let arp = json!({
            "name": "drive",
            "description": "Drive.",
            "parameters": { "type": "object", "properties": { "linear": { "type": "number" } } },
            "safety": { "level": "elevated", "requiresConfirmation": true, "reversible": true, "description": "Moves" },
        });
        let t = mcp_tool(&arp).unwrap();
        assert_eq!(t["name"], "drive");
        assert_eq!(t["inputSchema"], arp["parameters"]);
        assert_eq!(t["annotations"]["destructiveHint"], false);
        assert_eq!(t["annotations"]["openWorldHint"], true);
        assert_eq!(t["_meta"]["arp/safety"]["level"], "elevated");
        let text = t["description"].as_str().unwrap();
        assert!(
            text.contains("elevated") && text.contains("-40006"),
            "{text}"
        );
        let reset = json!({ "name": "r", "description": "", "parameters": {}, "safety": { "level": "elevated", "reversible": false } });
        let t = mcp_tool(&reset).unwrap();
        assert_eq!(t["annotations"]["destructiveHint"], true);
        assert_eq!(t["inputSchema"]["type"], "object");
        assert!(mcp_tool(&json!({ "description": "no name" })).is_none());
    }

    #[test]
    fn arp_errors_are_tool_errors_and_protocol_errors_are_not() {
        let forbidden = RpcError::new(-40001, "a viewer may not do this")
            .with_data(json!({ "reason": "forbidden", "role": "viewer" }));
        let r = call_result("drive", Err(forbidden)).unwrap();
        assert_eq!(r["isError"], true);
        assert_eq!(r["structuredContent"]["error"]["code"], -40001);
        assert_eq!(
            r["structuredContent"]["error"]["data"]["reason"],
            "forbidden"
        );
        let text = r["content"][0]["text"].as_str().unwrap();
        assert!(
            text.contains("-40001") && text.contains("forbidden"),
            "{text}"
        );
        let unknown = call_result("nope", Err(RpcError::new(-40003, "tool not found")));
        assert_eq!(unknown.unwrap_err().code, INVALID_PARAMS);
        let ok = call_result("stop", Ok(json!({ "callId": "c1", "state": "completed" }))).unwrap();
        assert_eq!(ok["isError"], false);
        assert_eq!(ok["structuredContent"]["callId"], "c1");
        let denied = RpcError::new(-40006, "confirmation denied")
            .with_data(json!({ "confirmedBy": CONFIRMED_BY }));
        let text = error_result(&denied)["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(text.contains("no human"), "{text}");
    }

    #[test]
    fn context_sources_are_resources() {
        let r = mcp_resource(&json!({
            "name": "odometry", "description": "Pose", "dataType": "pose",
            "coordinateFrame": "odom", "updateRate": 20.0,
        }))
        .unwrap();
        assert_eq!(r["uri"], "arp://context/odometry");
        assert_eq!(r["mimeType"], "application/json");
        assert!(r["description"].as_str().unwrap().contains("frame odom"));
    }

    #[tokio::test]
    async fn progress_finds_its_call_and_confirmation_is_refused() {
        let (tx, mut rx) = mpsc::channel(8);
        let robot = Robot::new(tx);
        robot.remember_tools(&[
            json!({ "name": "stop", "estimatedDuration": 0.0 }),
            json!({ "name": "drive" }),
        ]);
        let mut stop = robot.start_call("stop", json!({}), true).await.unwrap();
        let mut drive = robot.start_call("drive", json!({}), true).await.unwrap();
        assert!(rx.recv().await.unwrap().contains("arp.callTool"));
        let progress = json!({ "jsonrpc": "2.0", "method": "arp.toolProgress",
            "params": { "callId": "call-9", "progress": 0.0, "message": "accepted", "state": "running" } });
        assert!(robot.dispatch(&progress.to_string()).is_none());
        // The instant `stop` is passed over: `drive` reports progress.
        assert_eq!(drive.known.borrow().as_deref(), Some("call-9"));
        assert!(stop.known.borrow().is_none());
        let got = drive.progress.as_mut().unwrap().try_recv().unwrap();
        assert_eq!(got, (0.0, Some("accepted".into())));
        assert!(stop.progress.as_mut().unwrap().try_recv().is_err());

        let ask = json!({ "jsonrpc": "2.0", "id": "confirm-1", "method": "arp.requestConfirmation",
            "params": { "action": "x", "safetyLevel": "critical", "details": { "tool": "x", "arguments": {} }, "timeout": 30 } });
        let answer = robot.dispatch(&ask.to_string()).unwrap();
        assert_eq!(answer["id"], "confirm-1");
        assert_eq!(answer["result"]["confirmed"], false);

        robot.close();
        assert_eq!((&mut stop.reply).await.unwrap(), Err(RobotError::Closed));
        assert!(robot.request("arp.listTools", json!({})).await.is_err());
        assert!(robot.dispatch("not json").is_none());
    }
}
