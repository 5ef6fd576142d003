//! The ARP side of MCP mode: requests to the robot, and the routing of its
//! answers and notifications (tool progress, context updates, confirmation
//! requests) to whoever waits for them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use signalling_protocol::arp::{method, reason};
use tokio::sync::{mpsc, oneshot, watch};

use super::limits::{CONFIRMED_BY, MAX_PENDING, PROGRESS_QUEUE, REQUEST_TIMEOUT, SUBSCRIBE_RATE};
use crate::jsonrpc::{self, Message, RpcError, INTERNAL_ERROR, METHOD_NOT_FOUND};

mod reads;

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
    pub(super) fn to_rpc(&self) -> RpcError {
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
pub(super) struct Router {
    pending: HashMap<String, oneshot::Sender<Reply>>,
    calls: Vec<CallRoute>,
    reads: HashMap<String, Reads>,
    /// MCP request id key → its cancel signal.
    pub(super) cancels: HashMap<String, watch::Sender<bool>>,
    /// Tool name → whether it reports progress (from the last listing).
    reports_progress: HashMap<String, bool>,
    /// Where the robot's requests for confirmation go to be put to the client's user
    /// (elicitation); none: refused at once.
    confirmer: Option<mpsc::Sender<(Value, Value)>>,
    /// Context sources the client subscribed to (`resources/subscribe`), and where their
    /// updates are told.
    subscriptions: HashSet<String>,
    updates: Option<mpsc::Sender<String>>,
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
pub(super) struct StartedCall {
    pub(super) arp_id: String,
    pub(super) reply: oneshot::Receiver<Reply>,
    pub(super) known: watch::Receiver<Option<String>>,
    pub(super) progress: Option<mpsc::Receiver<Progress>>,
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

    pub(super) fn router(&self) -> MutexGuard<'_, Router> {
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

    pub(super) async fn start_call(
        &self,
        name: &str,
        arguments: Value,
        idempotency_key: Option<&str>,
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
        let mut params = json!({ "name": name, "arguments": arguments });
        if let Some(key) = idempotency_key {
            params["idempotencyKey"] = json!(key);
        }
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

    pub(super) fn end_call(&self, arp_id: &str) {
        self.router().calls.retain(|c| c.arp_id != arp_id);
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
                        let mut router = self.router();
                        if let Some(reads) = router.reads.get_mut(name) {
                            for waiter in reads.waiters.drain(..) {
                                let _ = waiter.send(Ok(params.clone()));
                            }
                        }
                        if router.subscriptions.contains(name) {
                            if let Some(updates) = &router.updates {
                                // A lagging client misses an update, never the next.
                                let _ = updates.try_send(name.to_owned());
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
                if method != method::REQUEST_CONFIRMATION {
                    return Some(jsonrpc::error(
                        &id,
                        METHOD_NOT_FOUND,
                        &format!("{method} is not supported by arp-bridge"),
                        None,
                    ));
                }
                // Put to the client's user where it can be (elicitation); else, or with too
                // many waiting, refused: fail closed.
                let confirmer = self.router().confirmer.clone();
                let Some(confirmer) = confirmer else {
                    return Some(refuse_confirmation(&id, &params));
                };
                match confirmer.try_send((id, params)) {
                    Ok(()) => None,
                    Err(e) => {
                        let (id, params) = e.into_inner();
                        Some(refuse_confirmation(&id, &params))
                    }
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

    /// Updates of the sources subscribed to are told on `updates` (their names).
    pub fn tell_updates(&self, updates: mpsc::Sender<String>) {
        self.router().updates = Some(updates);
    }

    /// Subscribes to context source `name` for as long as the client wants it, at most
    /// [`SUBSCRIBE_RATE`] updates a second.
    pub(super) async fn subscribe(&self, name: &str) -> Result<(), RobotError> {
        {
            let mut router = self.router();
            if router.closed {
                return Err(RobotError::Closed);
            }
            if !router.subscriptions.insert(name.to_owned()) {
                return Ok(());
            }
        }
        let params = json!({ "name": name, "maxRate": SUBSCRIBE_RATE });
        match self.request(method::SUBSCRIBE_CONTEXT, params).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.router().subscriptions.remove(name);
                Err(e)
            }
        }
    }

    /// The context sources the client subscribed to.
    pub(super) fn subscribed(&self) -> Vec<String> {
        self.router().subscriptions.iter().cloned().collect()
    }

    /// Ends the client's subscription to `name` (the robot's too, unless a read needs it).
    pub(super) fn unsubscribe(&self, name: &str) {
        let mut router = self.router();
        if !router.subscriptions.remove(name) || router.closed {
            return;
        }
        if router.reads.get(name).is_some_and(|r| r.readers > 0) {
            return;
        }
        let id = self.next_id();
        let frame = jsonrpc::request(
            &json!(id),
            method::UNSUBSCRIBE_CONTEXT,
            json!({ "name": name }),
        );
        let _ = self.inner.to_robot.try_send(frame.to_string());
    }

    /// The robot's requests for confirmation go to `confirmer` from now on.
    pub fn confirm_through(&self, confirmer: mpsc::Sender<(Value, Value)>) {
        self.router().confirmer = Some(confirmer);
    }

    /// Answers a request of the robot.
    pub async fn answer(&self, id: &Value, result: Value) -> Result<(), RobotError> {
        let frame = jsonrpc::result(id, result).to_string();
        self.inner
            .to_robot
            .send(frame)
            .await
            .map_err(|_| RobotError::Closed)
    }

    /// The connection is gone: every waiter learns it now.
    pub fn close(&self) {
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

    pub(super) fn remember_tools(&self, tools: &[Value]) {
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

/// A request for confirmation nobody here can put to a person: refused at once (a model
/// must not approve for a human).
pub(super) fn refuse_confirmation(id: &Value, params: &Value) -> Value {
    jsonrpc::result(id, refusal(params))
}

/// The answer that refuses a request for confirmation.
pub(super) fn refusal(params: &Value) -> Value {
    eprintln!(
        "arp-bridge: refused the robot's confirmation request for {}",
        params.pointer("/details/tool").unwrap_or(&Value::Null)
    );
    json!({
        "confirmed": false,
        "confirmedBy": CONFIRMED_BY,
        "timestamp": crate::time::now_rfc3339(),
    })
}
