//! One MCP session: a gateway session run in process (`arp::open_in_process`, the same
//! handler a program's `/arp` socket runs) with arp-bridge's MCP session on top of it (the
//! same mapping as the stdio bridge). Its task owns both: the client's messages come in
//! from the HTTP requests, answers go back to the request that asked, and what the server
//! sends unasked (progress, requests of its own) goes to the session's `GET` stream.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use arp_bridge::jsonrpc;
use arp_bridge::mcp::{self, Host, Robot, RobotError};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep_until, Instant};

use super::registry::{Handle, Input, Registry, QUEUED};
use crate::auth::ClientIdentity;
use crate::relay::{Outbound, QueueReceiver};
use crate::state::SharedState;
use crate::ws::connection::{CloseRequest, Opening};

/// A session nobody used for this long (no request, no open `GET` stream) ends.
pub const IDLE: Duration = Duration::from_secs(600);
/// Lines for the client the MCP session may have queued for this task.
const OUT_QUEUE: usize = 256;
/// What the server sends unasked, kept while no `GET` stream is open (oldest dropped).
const UNSENT: usize = 64;

/// How the server names itself to MCP clients.
fn host() -> Host {
    Host {
        name: "signalling-server".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        title_prefix: "MCP endpoint of".into(),
        describe: None,
    }
}

/// Opens the gateway session for `identity` on `robot_id` and initializes ARP through it
/// (the lock for a driver, the robot online), then starts the session's task and makes it
/// known under a fresh id. The JSON-RPC error of the refusal otherwise (the robot offline,
/// busy, ...), as the gateway or the robot gave it.
pub async fn open(
    state: &SharedState,
    registry: &Arc<Registry>,
    opening: Opening,
    identity: ClientIdentity,
    robot_id: String,
    elicits: bool,
) -> Result<(String, Arc<Handle>), jsonrpc::RpcError> {
    let subject = identity.subject.clone();
    let mut gateway = crate::arp::open_in_process(state, opening, identity, robot_id.clone());
    let robot = Robot::new(gateway.to_handler.clone());
    // A client that can ask its user answers the robot's requests for confirmation where
    // the robot's policy lets the client answer (the gateway decides); else people do.
    let params =
        mcp::arp_initialize_params("signalling-server MCP endpoint", &host().version, elicits);
    let initialized = {
        let init = mcp::initialize_robot(&robot, params);
        tokio::pin!(init);
        loop {
            tokio::select! {
                biased;
                reply = &mut init => break reply,
                frame = gateway.from_handler.recv() => match frame {
                    Some(Outbound::Text(text)) => {
                        if let Some(answer) = robot.dispatch(text.as_str()) {
                            let _ = gateway.to_handler.send(answer.to_string()).await;
                        }
                    }
                    Some(Outbound::Ping) => {}
                    None => robot.close(),
                },
            }
        }
    };
    let robot_info = match initialized {
        Ok(info) => info,
        Err(RobotError::Arp(e)) => return Err(e),
        Err(e) => {
            return Err(
                jsonrpc::RpcError::new(jsonrpc::INTERNAL_ERROR, e.to_string())
                    .with_data(json!({ "reason": "robot_offline", "robotId": robot_id })),
            )
        }
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (inputs_tx, inputs) = mpsc::channel(QUEUED);
    let handle = Arc::new(Handle {
        subject,
        robot_id,
        inputs: inputs_tx,
    });
    let (out, lines) = mpsc::channel(OUT_QUEUE);
    let task = Task {
        id: id.clone(),
        registry: registry.clone(),
        session: mcp::Session::new(host(), robot, out, robot_info),
        to_robot: gateway.to_handler,
        from_robot: gateway.from_handler,
        gateway_closed: gateway.closed,
        lines,
        inputs,
        waiting: HashMap::new(),
        stream: None,
        unsent: VecDeque::new(),
    };
    registry.insert(id.clone(), handle.clone());
    tokio::spawn(task.run());
    Ok((id, handle))
}

struct Task {
    id: String,
    registry: Arc<Registry>,
    session: mcp::Session,
    to_robot: mpsc::Sender<String>,
    from_robot: QueueReceiver,
    /// How the gateway session ended, once it has.
    gateway_closed: oneshot::Receiver<Option<CloseRequest>>,
    /// What the MCP session sends the client.
    lines: mpsc::Receiver<String>,
    inputs: mpsc::Receiver<Input>,
    /// Requests of the client waiting for their answer, by id.
    waiting: HashMap<String, oneshot::Sender<String>>,
    stream: Option<mpsc::Sender<String>>,
    unsent: VecDeque<String>,
}

impl Task {
    async fn run(mut self) {
        let mut active = Instant::now();
        let idle = sleep_until(active + IDLE);
        tokio::pin!(idle);
        let why = loop {
            tokio::select! {
                input = self.inputs.recv() => match input {
                    Some(input) => {
                        active = Instant::now();
                        idle.as_mut().reset(active + IDLE);
                        self.input(input).await;
                    }
                    // Removed from the registry (DELETE): ended.
                    None => break "ended by the client",
                },
                frame = self.from_robot.recv() => match frame {
                    Some(Outbound::Text(text)) => {
                        if let Some(answer) = self.session.robot().dispatch(text.as_str()) {
                            let _ = self.to_robot.send(answer.to_string()).await;
                        }
                    }
                    Some(Outbound::Ping) => {}
                    None => break "the gateway session ended",
                },
                Some(line) = self.lines.recv() => self.route(line),
                () = self.session.reap() => {}
                _ = &mut idle => {
                    if self.stream.as_ref().is_some_and(|s| !s.is_closed()) {
                        idle.as_mut().reset(Instant::now() + IDLE);
                    } else {
                        break "idle";
                    }
                }
            }
        };
        let close = self.gateway_closed.try_recv().ok().flatten();
        let reason = close
            .as_ref()
            .map(|(_, reason)| reason.as_ref())
            .unwrap_or("");
        tracing::info!(session = %self.id, why, reason, "MCP session ended");
        self.registry.remove(&self.id);
        self.session.closed().await;
        while let Ok(line) = self.lines.try_recv() {
            self.route(line);
        }
        // Requests still waiting learn why; the gateway session ends once every sender of
        // its frames is gone (with this task).
        let cause = if reason.is_empty() { why } else { reason };
        for (key, waiter) in self.waiting.drain() {
            let id: Value = serde_json::from_str(&key).unwrap_or(Value::Null);
            let message = format!("the MCP session ended: {cause}");
            let data = json!({ "reason": "session_ended", "cause": cause });
            let error = jsonrpc::error(&id, jsonrpc::INTERNAL_ERROR, &message, Some(data));
            let _ = waiter.send(error.to_string());
        }
    }

    async fn input(&mut self, input: Input) {
        // Room in the session's queue before it answers (it is drained only here).
        while let Ok(line) = self.lines.try_recv() {
            self.route(line);
        }
        match input {
            Input::Request { id, object, answer } => {
                self.waiting.retain(|_, w| !w.is_closed());
                self.waiting.insert(jsonrpc::id_key(&id), answer);
                self.session.client_object(object).await;
            }
            Input::Message(object) => self.session.client_object(object).await,
            Input::Stream(stream) => {
                for line in self.unsent.drain(..) {
                    if stream.try_send(line).is_err() {
                        break;
                    }
                }
                self.stream = Some(stream);
            }
        }
    }

    /// A line for the client: an answer to the request that asked, anything else to the
    /// `GET` stream (kept for it while none is open).
    fn route(&mut self, line: String) {
        let Ok(value) = serde_json::from_str::<Map<String, Value>>(&line) else {
            return;
        };
        if !value.contains_key("method") {
            if let Some(waiter) = value
                .get("id")
                .and_then(|id| self.waiting.remove(&jsonrpc::id_key(id)))
            {
                let _ = waiter.send(line);
            }
            return;
        }
        let Some(stream) = &self.stream else {
            return self.keep(line);
        };
        match stream.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(line)) => self.keep(line),
            Err(TrySendError::Closed(line)) => {
                self.stream = None;
                self.keep(line);
            }
        }
    }

    fn keep(&mut self, line: String) {
        if self.unsent.len() >= UNSENT {
            self.unsent.pop_front();
        }
        self.unsent.push_back(line);
    }
}
