//! One MCP session: a gateway session run in process (`arp::open_in_process`, the same
//! handler a program's `/arp` socket runs) with arp-bridge's MCP session on top of it (the
//! same mapping as the stdio bridge). Its task owns both: the client's messages come in
//! from the HTTP requests, answers go back to the request that asked; what relates to a
//! request answered by SSE (its progress, the `elicitation/create` for its confirmation)
//! goes on that request's stream before its answer, and anything else the server sends
//! unasked on the session's `GET` stream. Every SSE event is kept for a while
//! (`super::replay`) for a client that resumes a lost stream with `Last-Event-ID`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use arp_bridge::jsonrpc;
use arp_bridge::mcp::{self, Host, Robot, RobotError};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep_until, Instant};

use super::registry::{Answer, Event, Handle, Input, Registry, QUEUED};
use super::replay::{Cursor, Replay};
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
/// The session's `GET` stream, in event ids; requests' streams count from 1.
const GET_STREAM: u64 = 0;

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
        replay: Replay::default(),
        streams: GET_STREAM,
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
    waiting: HashMap<String, Waiting>,
    /// The `GET` stream.
    stream: Option<mpsc::Sender<Event>>,
    unsent: VecDeque<Event>,
    replay: Replay,
    /// Streams numbered so far (the last request's).
    streams: u64,
}

/// A request waiting for its answer.
enum Waiting {
    Json(oneshot::Sender<String>),
    Events {
        stream: u64,
        /// Where its events go now; none while the client has lost the stream (its events
        /// are kept for a `GET` that resumes it).
        to: Option<mpsc::Sender<Event>>,
        /// `_meta.progressToken`: progress with it belongs on this stream.
        progress_token: Option<Value>,
    },
}

impl Waiting {
    /// Gone for good: a JSON request whose HTTP request ended (a lost SSE stream is kept:
    /// the client may resume it).
    fn is_gone(&self) -> bool {
        matches!(self, Waiting::Json(answer) if answer.is_closed())
    }
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
        for (key, waiter) in std::mem::take(&mut self.waiting) {
            let id: Value = serde_json::from_str(&key).unwrap_or(Value::Null);
            let message = format!("the MCP session ended: {cause}");
            let data = json!({ "reason": "session_ended", "cause": cause });
            let error = jsonrpc::error(&id, jsonrpc::INTERNAL_ERROR, &message, Some(data));
            self.answer(waiter, error.to_string());
        }
    }

    async fn input(&mut self, input: Input) {
        // Room in the session's queue before it answers (it is drained only here).
        while let Ok(line) = self.lines.try_recv() {
            self.route(line);
        }
        match input {
            Input::Request { id, object, answer } => {
                self.waiting.retain(|_, w| !w.is_gone());
                let waiting = match answer {
                    Answer::Json(answer) => Waiting::Json(answer),
                    Answer::Events(to) => {
                        self.streams += 1;
                        let progress_token = object
                            .get("params")
                            .and_then(|p| p.get("_meta"))
                            .and_then(|m| m.get("progressToken"))
                            .cloned();
                        Waiting::Events {
                            stream: self.streams,
                            to: Some(to),
                            progress_token,
                        }
                    }
                };
                self.waiting.insert(jsonrpc::id_key(&id), waiting);
                self.session.client_object(object).await;
            }
            Input::Message(object) => self.session.client_object(object).await,
            Input::Stream {
                events,
                last_event_id,
            } => self.stream_opened(events, last_event_id.as_deref().and_then(Cursor::parse)),
        }
    }

    /// A `GET` stream: the session's stream of what it sends unasked, or, resuming a
    /// request's stream, that request's (ending with its answer).
    fn stream_opened(&mut self, events: mpsc::Sender<Event>, resume: Option<Cursor>) {
        let replayed: Vec<Event> = match resume {
            Some(cursor) => self.replay.after(cursor).cloned().collect(),
            None => Vec::new(),
        };
        for event in replayed {
            if events.try_send(event).is_err() {
                // Too much to replay at once: the client resumes again from where it got.
                return;
            }
        }
        let stream = resume.map_or(GET_STREAM, |c| c.stream);
        if stream == GET_STREAM {
            if resume.is_some() {
                // Replayed already, with everything else of stream 0 still kept.
                self.unsent.clear();
            }
            while let Some(event) = self.unsent.pop_front() {
                if let Err(e) = events.try_send(event) {
                    self.unsent.push_front(e.into_inner());
                    return;
                }
            }
            self.stream = Some(events);
            return;
        }
        // A request's stream: its events go here from now on. Answered already: the
        // replay ended with the answer, and the stream ends here (`events` dropped).
        for waiting in self.waiting.values_mut() {
            if let Waiting::Events { stream: s, to, .. } = waiting {
                if *s == stream {
                    *to = Some(events);
                    return;
                }
            }
        }
    }

    /// A line for the client: an answer to the request that asked; what relates to a
    /// request answered by SSE on that request's stream; anything else on the `GET`
    /// stream (kept for it while none is open).
    fn route(&mut self, line: String) {
        let Ok(value) = serde_json::from_str::<Map<String, Value>>(&line) else {
            return;
        };
        if !value.contains_key("method") {
            if let Some(waiter) = value
                .get("id")
                .and_then(|id| self.waiting.remove(&jsonrpc::id_key(id)))
            {
                self.answer(waiter, line);
            }
            return;
        }
        if let Some(key) = self.related(&value) {
            if let Some(Waiting::Events { stream, to, .. }) = self.waiting.get_mut(&key) {
                let event = self.replay.record(*stream, line);
                send_or_drop(to, event);
                return;
            }
        }
        let event = self.replay.record(GET_STREAM, line);
        let Some(stream) = &self.stream else {
            return self.keep(event);
        };
        if let Err(e) = stream.try_send(event) {
            // Full or gone: the client resumes (`Last-Event-ID`) or opens another.
            self.stream = None;
            self.keep(e.into_inner());
        }
    }

    /// The waiting request (by id key) a message relates to, if it is answered by SSE:
    /// progress by its token, an `elicitation/create` by the call it asks about.
    fn related(&self, message: &Map<String, Value>) -> Option<String> {
        if message.get("method").and_then(Value::as_str) == Some("notifications/progress") {
            let token = message.get("params").and_then(|p| p.get("progressToken"))?;
            return self.waiting.iter().find_map(|(key, w)| match w {
                Waiting::Events {
                    progress_token: Some(t),
                    ..
                } if t == token => Some(key.clone()),
                _ => None,
            });
        }
        let id = self.session.related_request(message)?;
        Some(jsonrpc::id_key(&id))
    }

    /// A request's answer: in JSON, or as the last event of its stream (which then ends).
    fn answer(&mut self, waiter: Waiting, line: String) {
        match waiter {
            Waiting::Json(answer) => {
                let _ = answer.send(line);
            }
            Waiting::Events { stream, mut to, .. } => {
                let event = self.replay.record(stream, line);
                send_or_drop(&mut to, event);
            }
        }
    }

    fn keep(&mut self, event: Event) {
        if self.unsent.len() >= UNSENT {
            self.unsent.pop_front();
        }
        self.unsent.push_back(event);
    }
}

/// An event for a request's stream; a full or lost stream is let go (its events are kept
/// for the client to resume it).
fn send_or_drop(to: &mut Option<mpsc::Sender<Event>>, event: Event) {
    if let Some(stream) = to {
        if stream.try_send(event).is_err() {
            *to = None;
        }
    }
}
