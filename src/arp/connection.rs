//! One program's gateway connection: one task that reads the program's frames, applies the
//! rules, forwards them to the robot as `arp.frame`s of its session, and writes back what
//! the robot (or the server, for the session's end) sends. Writes to the program have a
//! deadline, so a program that stops reading cannot hold the task.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use signalling_protocol::arp::{
    method, ArpCode, ConfirmationPolicy, CONFIRMATION_POLICY_META_KEY, FRAME_SIGNATURE_KEY,
    MAX_FRAME_BYTES,
};
use signalling_protocol::ticket::KEY_EXCHANGE_META_KEY;
use signalling_protocol::Role;
use tracing::Instrument;

use super::confirm::{Answered, Outcome, People};
use super::rules;
use crate::admission::Permit;
use crate::auth::ClientIdentity;
use crate::messages::{SessionKind, ARP_FRAME};
use crate::rate_limit::RateLimiter;
use crate::relay::{
    ConnId, DeliveryError, Kick, Mailbox, OpenSession, Outbound, Sender, SessionError,
};
use crate::state::SharedState;
use crate::store::{bounded, AuditRecord, MAX_PARAMS_BYTES};
use crate::tickets::{SessionKey, TicketFor};
use crate::ws::heartbeat::{Beat, Heartbeat};

/// How long a write to the program may take before the connection is given up.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// E-stops of one connection are put on record once per this long (with their count).
const STOP_RECORD_EVERY: Duration = Duration::from_secs(1);
/// Requests for confirmation the robot may have waiting on the program at once; past it,
/// people are asked.
const ASKED_AT_ONCE: usize = 16;
/// `signalling_arp_frames_dropped_total{reason}`: an answer to no request of the robot
/// that this program was sent.
const DROPPED_UNSOLICITED_ANSWER: &str = "unsolicited_answer";

/// Starts the connection's task (from axum's upgrade task, which ends right after).
pub fn start(
    state: SharedState,
    socket: WebSocket,
    identity: ClientIdentity,
    robot_id: String,
    cuts_seen: u64,
    permit: Permit,
    signature_nonce: Option<String>,
) {
    let conn: ConnId = Arc::from(format!("arp-{}", uuid::Uuid::new_v4()));
    let span = tracing::info_span!("arp", conn = %conn, robot = %robot_id);
    let task = async move {
        let _permit = permit;
        let _guard = state.socket_guard();
        let (mailbox, mut inbox) = Mailbox::new(state.config.queue_limits());
        state.presence.attach(conn.clone(), mailbox);
        if state
            .presence
            .set_client(&conn, identity.token_id.clone(), cuts_seen)
        {
            // A revocation overlapped the login: check the token again, failing closed.
            if let Some(token_id) = &identity.token_id {
                let withdrawn = state
                    .store
                    .client_token_withdrawn(token_id)
                    .await
                    .unwrap_or(true);
                if withdrawn {
                    state.presence.kick(&conn, Kick::TokenRevoked);
                }
            }
        }
        tracing::info!(subject = %identity.subject, "program connected to the ARP gateway");
        let mut gateway = Gateway::new(state.clone(), conn.clone(), identity, robot_id);
        gateway.signature_nonce = signature_nonce;
        gateway.run(socket, &mut inbox).await;
        gateway.finish();
        state.sessions.detach(&conn, false).await;
    };
    tokio::spawn(task.instrument(span));
}

/// A request of the program the robot has not answered yet.
struct Pending {
    method: String,
    started: Instant,
    /// For a tool call: its record, completed when the answer comes.
    record: Option<AuditRecord>,
}

/// Why the loop ended, and what to tell the program.
enum Ending {
    /// The program closed, or its socket failed.
    Program,
    /// Kicked (token revoked, shutdown, ...).
    Kicked(Kick),
    /// The session ended on the server's side (grant withdrawn, robot gone, ...).
    SessionEnded(String),
    /// A write to the program failed or took too long.
    WriteFailed,
    /// Nothing heard from the program for the idle timeout (not even a pong).
    Idle,
}

/// E-stops on record: the first at once, the others of the second that follows as one
/// record with their count (a flood must not flood the audit log; each stop still acts).
#[derive(Default)]
struct StopRecords {
    /// The end of the second whose stops are counted, not yet recorded.
    window_end: Option<tokio::time::Instant>,
    unrecorded: u64,
}

struct Gateway {
    state: SharedState,
    conn: ConnId,
    subject: String,
    robot_id: String,
    /// The role the session opened with (the grant's); before that, viewer.
    role: Role,
    token_expires_at: Option<i64>,
    /// The robot's socket, once `arp.initialize` opened the session.
    robot: Option<ConnId>,
    /// The id of the `arp.initialize` waiting for the robot.
    initializing: Option<Value>,
    /// The program said it answers confirmations itself.
    confirms_itself: bool,
    /// The robot's requests for confirmation sent to this program (the robot's policy is
    /// `client` and the program declared it), by id, with the tool each is about: the only
    /// answers the program may send.
    asked: HashMap<String, Option<String>>,
    /// When the program was last heard (any frame, a pong included).
    last_heard: Instant,
    stops: StopRecords,
    pending: HashMap<String, Pending>,
    calls: RateLimiter,
    /// Frames for the program, written by the loop in order.
    out: Vec<String>,
    /// The robot's requests for approval that wait for people.
    people: People,
    /// The program asked for frames signed by the robot (`?signed=`), with this nonce.
    signature_nonce: Option<String>,
    /// How this session's tickets are made: signed, then MAC'd once the key is agreed.
    ticket_key: SessionKey,
}

impl Gateway {
    fn new(state: SharedState, conn: ConnId, identity: ClientIdentity, robot_id: String) -> Self {
        let ticket_key = state.tickets.session_key();
        Gateway {
            state,
            conn,
            subject: identity.subject,
            robot_id,
            role: Role::Viewer,
            token_expires_at: identity.expires_at,
            robot: None,
            initializing: None,
            confirms_itself: false,
            asked: HashMap::new(),
            last_heard: Instant::now(),
            stops: StopRecords::default(),
            pending: HashMap::new(),
            calls: RateLimiter::new(rules::CALLS_PER_SECOND, rules::CALL_BURST, Instant::now()),
            out: Vec::new(),
            people: People::new(),
            signature_nonce: None,
            ticket_key,
        }
    }

    async fn run(&mut self, socket: WebSocket, inbox: &mut crate::relay::MailboxReceiver) {
        let (mut sink, mut stream) = socket.split();
        let expiry = self.token_expires_at.map(|at| {
            let left = (at - crate::store::now_ms()).max(0) as u64;
            tokio::time::Instant::now() + Duration::from_millis(left)
        });
        // The same ping and idle deadline as a /ws socket: a dead program must not keep its
        // session, and the robot's control lock with it.
        let state = self.state.clone();
        let limits = state.config.socket_limits();
        let mut heartbeat = Heartbeat::new(Instant::now(), limits);
        let ending = loop {
            let next_ping = tokio::time::Instant::from_std(heartbeat.next_ping());
            let event = tokio::select! {
                biased;
                kick = inbox.kick.kicked() => Err(Ending::Kicked(kick)),
                answered = self.people.next() => Ok(self.people_answered(answered)),
                _ = sleep_until_opt(expiry) => Err(Ending::Kicked(Kick::TokenRevoked)),
                _ = tokio::time::sleep_until(next_ping) => {
                    match heartbeat.due(Instant::now(), self.last_heard, limits) {
                        Some(Beat::Idle) => Err(Ending::Idle),
                        Some(Beat::Ping) => {
                            let ping = sink.send(Message::Ping(Default::default()));
                            match tokio::time::timeout(WRITE_TIMEOUT, ping).await {
                                Ok(Ok(())) => Ok(None),
                                _ => Err(Ending::WriteFailed),
                            }
                        }
                        None => Ok(None),
                    }
                }
                _ = sleep_until_opt(self.stops.window_end) => {
                    self.stop_window_ended();
                    Ok(None)
                }
                frame = inbox.queue.recv() => match frame {
                    Some(Outbound::Text(text)) => Ok(self.robot_side(&text)),
                    Some(Outbound::Ping) => Ok(None),
                    None => Err(Ending::Program),
                },
                message = stream.next() => match message {
                    Some(Ok(Message::Text(text))) => {
                        self.last_heard = Instant::now();
                        Ok(self.program_frame(text.as_str()).await)
                    }
                    Some(Ok(Message::Binary(_))) => {
                        self.last_heard = Instant::now();
                        let error = rules::error(&Value::Null, ArpCode::InvalidRequest, "binary frames are not JSON-RPC; send text", None);
                        self.out.push(error.to_string());
                        Ok(None)
                    }
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => {
                        self.last_heard = Instant::now();
                        Ok(None)
                    }
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => Err(Ending::Program),
                },
            };
            let ended = match event {
                Ok(ended) => ended,
                Err(ending) => break ending,
            };
            if !self.flush(&mut sink).await {
                break Ending::WriteFailed;
            }
            if let Some(ending) = ended {
                break ending;
            }
        };
        self.close(&mut sink, ending).await;
    }

    /// Writes what is waiting for the program, within the write deadline.
    async fn flush(
        &mut self,
        sink: &mut futures_util::stream::SplitSink<WebSocket, Message>,
    ) -> bool {
        if self.out.is_empty() {
            return true;
        }
        let frames = std::mem::take(&mut self.out);
        let write = async {
            for frame in frames {
                sink.feed(Message::Text(Utf8Bytes::from(frame))).await?;
            }
            sink.flush().await
        };
        matches!(tokio::time::timeout(WRITE_TIMEOUT, write).await, Ok(Ok(())))
    }

    /// Answers what is still pending, then closes the program's socket.
    async fn close(
        &mut self,
        sink: &mut futures_util::stream::SplitSink<WebSocket, Message>,
        ending: Ending,
    ) {
        let (code, text, cause) = match &ending {
            Ending::Program | Ending::WriteFailed => return,
            Ending::Kicked(kick) => {
                let (code, text) = kick.close_frame();
                (code, text.to_string(), text.to_string())
            }
            Ending::SessionEnded(cause) => (1000, format!("session ended: {cause}"), cause.clone()),
            Ending::Idle => {
                tracing::info!(subject = %self.subject, "gateway program silent past the idle timeout; dropped");
                (1008, "idle timeout".to_string(), "idle_timeout".to_string())
            }
        };
        for (id, _) in std::mem::take(&mut self.pending) {
            let id: Value = serde_json::from_str(&id).unwrap_or(Value::Null);
            let error = rules::error(
                &id,
                ArpCode::InternalError,
                "the session ended before the robot answered",
                Some(json!({ "reason": "session_ended", "cause": cause })),
            );
            self.out.push(error.to_string());
        }
        if self.flush(sink).await {
            let frame = CloseFrame {
                code,
                reason: Utf8Bytes::from(bounded(&text, 120)),
            };
            let _ =
                tokio::time::timeout(WRITE_TIMEOUT, sink.send(Message::Close(Some(frame)))).await;
        }
    }

    /// Calls that never got an answer are on record too.
    fn finish(&mut self) {
        let unrecorded = std::mem::take(&mut self.stops.unrecorded);
        self.record_stops(unrecorded);
        for (_, pending) in self.pending.drain() {
            if let Some(mut record) = pending.record {
                record.outcome = "unanswered".into();
                record.duration_ms = Some(pending.started.elapsed().as_millis() as i64);
                self.state.audit.record(record);
            }
        }
    }

    /// One frame from the program. Returns an ending when the connection must close.
    async fn program_frame(&mut self, text: &str) -> Option<Ending> {
        if text.len() > MAX_FRAME_BYTES {
            let message = format!("frame larger than {MAX_FRAME_BYTES} bytes");
            let error = rules::error(&Value::Null, ArpCode::InvalidRequest, &message, None);
            self.out.push(error.to_string());
            return None;
        }
        let value: Value = match serde_json::from_str(text) {
            Ok(value) => value,
            Err(e) => {
                let error = rules::error(
                    &Value::Null,
                    ArpCode::ParseError,
                    &format!("not JSON: {e}"),
                    None,
                );
                self.out.push(error.to_string());
                return None;
            }
        };
        let Value::Object(frame) = &value else {
            let message = if value.is_array() {
                "batches are not supported: send one request per frame"
            } else {
                "a JSON-RPC message is an object"
            };
            let error = rules::error(&Value::Null, ArpCode::InvalidRequest, message, None);
            self.out.push(error.to_string());
            return None;
        };
        let id = frame.get("id").cloned();
        let Some(method) = frame.get("method").and_then(Value::as_str) else {
            // The program's answer to a request of the robot (a confirmation).
            return self.program_answer(value.clone());
        };
        let method = method.to_string();
        let id_or_null = id.clone().unwrap_or(Value::Null);
        // Only ARP 0.1.0 reaches a robot: an unknown method or a malformed request is
        // answered here, so the robot never reads what it does not understand.
        if let Some(refusal) = rules::check_request(&id_or_null, &method, &value) {
            if id.is_some() {
                self.out.push(refusal.to_string());
            }
            return None;
        }
        if method == method::INITIALIZE {
            return self.initialize(&id_or_null, value.clone()).await;
        }
        if method == method::EMERGENCY_STOP {
            return self.emergency_stop(id, value).await;
        }
        if self.robot.is_none() {
            if id.is_some() {
                let error = rules::error(
                    &id_or_null,
                    ArpCode::NotInitialized,
                    "call arp.initialize first",
                    None,
                );
                self.out.push(error.to_string());
            }
            return None;
        }
        if !rules::allowed(self.role, &method) {
            if id.is_some() {
                self.out
                    .push(rules::forbidden(&id_or_null, &method, self.role).to_string());
            }
            return None;
        }
        if let Some(refusal) = self.admit(&method, &id, frame) {
            self.out.push(refusal.to_string());
            return None;
        }
        // A tool call runs only once its request is committed to the audit log. One sent as
        // a notification (no id) could have no outcome on record: never forwarded.
        if method == method::CALL_TOOL && id.is_none() {
            let error = rules::error(
                &Value::Null,
                ArpCode::InvalidRequest,
                "arp.callTool needs an id: a call is put on record with its outcome",
                None,
            );
            self.out.push(error.to_string());
            return None;
        }
        let key = id_or_null.to_string();
        if let Some(record) = self.pending.get(&key).and_then(|p| p.record.clone()) {
            if !self.state.audit.record_committed(record).await {
                self.pending.remove(&key);
                self.state.metrics.audit_refused_calls.inc();
                let refusal = rules::internal(
                    &id_or_null,
                    "audit_unavailable",
                    "the call cannot be put on record now; try again",
                );
                self.out.push(refusal.to_string());
                return None;
            }
        }
        self.forward(value)
    }

    /// The limits a request must pass; the refusal, if any. An admitted request with an
    /// id is remembered until the robot answers.
    fn admit(
        &mut self,
        method: &str,
        id: &Option<Value>,
        frame: &serde_json::Map<String, Value>,
    ) -> Option<Value> {
        let id_or_null = id.clone().unwrap_or(Value::Null);
        let is_call = method == method::CALL_TOOL;
        if is_call {
            if !self.calls.allow(Instant::now()) {
                return Some(rules::rate_limited(&id_or_null, "tool calls"));
            }
            let running = self
                .pending
                .values()
                .filter(|p| p.method == method::CALL_TOOL)
                .count();
            if running >= rules::CONCURRENT_CALLS {
                return Some(rules::rate_limited(&id_or_null, "tool calls at once"));
            }
            if !self.state.audit.has_room() {
                return Some(rules::internal(
                    &id_or_null,
                    "audit_unavailable",
                    "the call cannot be put on record now; try again",
                ));
            }
        }
        let Some(id) = id else {
            return None;
        };
        if self.pending.len() >= rules::PENDING_REQUESTS {
            return Some(rules::rate_limited(
                &id_or_null,
                "requests waiting for an answer",
            ));
        }
        let key = id.to_string();
        if self.pending.contains_key(&key) {
            return Some(rules::error(
                id,
                ArpCode::InvalidRequest,
                "this id is already waiting for an answer",
                None,
            ));
        }
        let record = is_call.then(|| {
            let params = frame.get("params");
            let tool = params
                .and_then(|p| p.get("name"))
                .and_then(Value::as_str)
                .map(str::to_string);
            let arguments = params
                .and_then(|p| p.get("arguments"))
                .map(Value::to_string);
            let action = if tool.as_deref() == Some("reset_emergency_stop") {
                "reset_emergency_stop"
            } else {
                "tool_call"
            };
            let mut record = self.record(action, tool, arguments, "pending");
            record.idempotency_key = params
                .and_then(|p| p.get("idempotencyKey"))
                .and_then(Value::as_str)
                .map(|k| bounded(k, 256));
            record
        });
        self.pending.insert(
            key,
            Pending {
                method: method.to_string(),
                started: Instant::now(),
                record,
            },
        );
        None
    }

    fn record(
        &self,
        action: &str,
        tool: Option<String>,
        params: Option<String>,
        outcome: &str,
    ) -> AuditRecord {
        AuditRecord {
            id: uuid::Uuid::new_v4().to_string(),
            at: crate::store::now_ms(),
            robot_id: self.robot_id.clone(),
            subject: self.subject.clone(),
            role: self.role.as_str().to_string(),
            node: self.state.node_id.clone(),
            action: action.to_string(),
            tool,
            params: params.map(|p| bounded(&p, MAX_PARAMS_BYTES)),
            outcome: outcome.to_string(),
            error_code: None,
            duration_ms: None,
            idempotency_key: None,
            confirmed_by: None,
            session_id: Some(self.conn.to_string()),
        }
    }

    /// `arp.initialize`: opens the session (the grant's role, the control lock for a
    /// driver), then passes the request on.
    async fn initialize(&mut self, id: &Value, mut frame: Value) -> Option<Ending> {
        if self.robot.is_some() || self.initializing.is_some() {
            let error = rules::error(id, ArpCode::InvalidRequest, "already initialized", None);
            self.out.push(error.to_string());
            return None;
        }
        // `takeover` is the gateway's: the robot never reads it.
        let takeover = frame
            .get_mut("params")
            .and_then(Value::as_object_mut)
            .and_then(|params| params.remove("takeover"))
            .and_then(|t| t.as_bool())
            == Some(true);
        let busy_before = takeover && self.state.sessions.is_driven(&self.robot_id);
        let opened = self
            .state
            .sessions
            .open_with_grant(
                &self.conn,
                OpenSession {
                    session_id: &self.conn,
                    robot_id: &self.robot_id,
                    subject: &self.subject,
                    role: Role::Viewer,
                    offer_id: "arp.initialize",
                    kind: SessionKind::Arp,
                },
                takeover,
            )
            .await;
        if busy_before && matches!(opened, Ok(Some((_, Role::Owner)))) {
            self.state
                .audit
                .record(self.record("takeover", None, None, "completed"));
        }
        match opened {
            Ok(Some((robot, role))) => {
                self.robot = Some(robot);
                self.role = role;
            }
            Ok(None) | Err(SessionError::NoGrant(_)) => {
                self.out
                    .push(rules::forbidden(id, method::INITIALIZE, self.role).to_string());
                return Some(Ending::SessionEnded("grant_revoked".into()));
            }
            Err(e) => {
                self.out.push(rules::refusal(id, &e).to_string());
                return None;
            }
        }
        self.confirms_itself = frame
            .pointer("/params/capabilities/confirmation")
            .and_then(Value::as_bool)
            == Some(true);
        // The robot's requests for confirmation come to the gateway, which answers every one
        // (people, or the program where the robot lets it): the robot is told it may ask.
        if let Some(params) = frame.get_mut("params").and_then(Value::as_object_mut) {
            let capabilities = params.entry("capabilities").or_insert_with(|| json!({}));
            if let Some(capabilities) = capabilities.as_object_mut() {
                capabilities.insert("confirmation".into(), Value::Bool(true));
            }
        }
        self.initializing = Some(id.clone());
        self.pending.insert(
            id.to_string(),
            Pending {
                method: method::INITIALIZE.to_string(),
                started: Instant::now(),
                record: None,
            },
        );
        self.forward(frame)
    }

    /// Sends one ARP frame to the robot in an `arp.frame` of this session, with who calls
    /// (`meta.session`, from the server's records only).
    fn forward(&mut self, frame: Value) -> Option<Ending> {
        let robot = self.robot.clone()?;
        let id = frame_id(&frame);
        let text = self.frame_for_robot(frame);
        let share = Sender {
            share: &self.subject,
            viewer: !self.role.may_drive(),
        };
        let delivered = self.state.sessions.deliver(
            &self.conn,
            share,
            &self.conn,
            &robot,
            Outbound::text(text),
        );
        match delivered {
            Ok(()) => None,
            Err(DeliveryError::SenderThrottled) => {
                if let Some(id) = id {
                    self.pending.remove(&id.to_string());
                    self.out
                        .push(rules::rate_limited(&id, "frames queued for the robot").to_string());
                }
                None
            }
            Err(DeliveryError::Full | DeliveryError::Gone) => {
                Some(Ending::SessionEnded("robot_offline".into()))
            }
        }
    }

    /// The `arp.frame` of `frame` for the robot, with who calls and the frame's ticket.
    fn frame_for_robot(&mut self, frame: Value) -> String {
        let session = TicketFor {
            robot: &self.robot_id,
            connection_id: &self.conn,
            subject: &self.subject,
            role: self.role,
        };
        let ticket = self
            .state
            .tickets
            .arp_frame(session, &frame, &mut self.ticket_key);
        let caller = crate::messages::ArpCaller {
            subject: &self.subject,
            role: self.role,
            signature_nonce: self.signature_nonce.as_deref(),
        };
        crate::messages::arp_frame(&self.conn, frame, caller, ticket.as_deref())
    }

    /// `arp.emergencyStop`, from anyone with a grant, at any time: it acts first (it reaches
    /// the robot, past every queue share), then it is answered (by the robot, in a session;
    /// by the gateway before one). On record once a second per connection, with a count.
    async fn emergency_stop(&mut self, id: Option<Value>, frame: Value) -> Option<Ending> {
        self.note_stop();
        if let Some(robot) = self.robot.clone() {
            let text = self.frame_for_robot(frame);
            let delivered = self.state.sessions.deliver_stop(
                &self.conn,
                &self.conn,
                &robot,
                Outbound::text(text),
            );
            return match delivered {
                Ok(()) => None,
                Err(DeliveryError::Gone) => Some(Ending::SessionEnded("robot_offline".into())),
                Err(DeliveryError::Full | DeliveryError::SenderThrottled) => {
                    // The robot's queue is full (of this flood's stops, most likely).
                    if let Some(id) = id {
                        self.out.push(
                            rules::rate_limited(&id, "frames queued for the robot").to_string(),
                        );
                    }
                    None
                }
            };
        }
        // No session yet: the stop goes the way the API's does, to the robot on any node.
        let here = self
            .state
            .presence
            .emergency_stop(&self.robot_id, &self.subject);
        let reached = here || {
            let robot = [self.robot_id.as_str()];
            let online = self
                .state
                .presence
                .where_online(&robot, &self.state.node_id)
                .await;
            online.contains_key(&self.robot_id)
        };
        if let Some(id) = id {
            let answer = if reached {
                json!({ "jsonrpc": "2.0", "id": id, "result": { "stopped": true } })
            } else {
                rules::error(
                    &id,
                    ArpCode::InternalError,
                    &format!("robot {} is offline", self.robot_id),
                    Some(json!({
                        "reason": signalling_protocol::arp::reason::ROBOT_OFFLINE,
                        "robotId": self.robot_id,
                    })),
                )
            };
            self.out.push(answer.to_string());
        }
        None
    }

    /// One e-stop to put on record: at once if none was this second, else counted.
    fn note_stop(&mut self) {
        if self.stops.window_end.is_some() {
            self.stops.unrecorded += 1;
            return;
        }
        self.record_stops(1);
        self.stops.window_end = Some(tokio::time::Instant::now() + STOP_RECORD_EVERY);
    }

    /// The second of counted stops is over: one record for them, and the next second
    /// counts too (at most one record a second while a flood lasts).
    fn stop_window_ended(&mut self) {
        let count = std::mem::take(&mut self.stops.unrecorded);
        self.record_stops(count);
        self.stops.window_end =
            (count > 0).then(|| tokio::time::Instant::now() + STOP_RECORD_EVERY);
    }

    fn record_stops(&mut self, count: u64) {
        if count == 0 {
            return;
        }
        let params = json!({ "count": count }).to_string();
        let record = self.record("emergency_stop", None, Some(params), "sent");
        self.state.audit.record(record);
    }

    /// The program's answer to a request of the robot: passed on only for a request the
    /// robot sent this very program (its policy allowed it, the program declared it), with
    /// the confirmer set by the server; anything else is dropped and counted.
    fn program_answer(&mut self, mut frame: Value) -> Option<Ending> {
        let asked = frame
            .get("id")
            .and_then(|id| self.asked.remove(&id.to_string()));
        let Some(tool) = asked else {
            self.state
                .metrics
                .arp_frames_dropped
                .with_label_values(&[DROPPED_UNSOLICITED_ANSWER])
                .inc();
            tracing::warn!(subject = %self.subject, "an answer to no request this program was sent; dropped");
            return None;
        };
        let confirmer = format!("{} via client", self.subject);
        let confirmed = frame.pointer("/result/confirmed").and_then(Value::as_bool) == Some(true);
        if let Some(result) = frame.get_mut("result").and_then(Value::as_object_mut) {
            result.insert("confirmedBy".into(), Value::String(confirmer.clone()));
        }
        if confirmed {
            self.note_confirmer(tool.as_deref(), &confirmer);
        }
        self.forward(frame)
    }

    /// The call a confirmation was about keeps who approved it on record.
    fn note_confirmer(&mut self, tool: Option<&str>, confirmer: &str) {
        let call = self.pending.values_mut().find(|p| {
            p.record
                .as_ref()
                .is_some_and(|r| r.tool.as_deref() == tool && r.confirmed_by.is_none())
        });
        if let Some(record) = call.and_then(|p| p.record.as_mut()) {
            record.confirmed_by = Some(confirmer.to_string());
        }
    }

    /// A frame for the program from the robot's side: an `arp.frame` of the robot, or the
    /// server's word that the session ended or was refused.
    fn robot_side(&mut self, text: &str) -> Option<Ending> {
        let Ok(envelope) = serde_json::from_str::<Value>(text) else {
            return None;
        };
        match envelope.get("type").and_then(Value::as_str) {
            Some(ARP_FRAME) => {
                let mut frame = envelope.pointer("/payload/frame")?.clone();
                // Only a program that asked gets the robot's signature, as the frame's own
                // `signature` (one that did not gets ARP frames exactly as the spec has them).
                if let Some(half) = envelope
                    .pointer(&format!("/meta/{KEY_EXCHANGE_META_KEY}"))
                    .and_then(Value::as_str)
                {
                    if self.ticket_key.agree(half, &self.conn) {
                        self.state.metrics.ticket_session_keys.inc();
                    }
                }
                let signature = envelope
                    .pointer("/meta/signature")
                    .filter(|s| s.is_string());
                if let (Some(_), Some(signature), Some(frame)) =
                    (&self.signature_nonce, signature, frame.as_object_mut())
                {
                    frame.insert(FRAME_SIGNATURE_KEY.into(), signature.clone());
                }
                let policy = ConfirmationPolicy::from_meta(
                    envelope.pointer(&format!("/meta/{CONFIRMATION_POLICY_META_KEY}")),
                );
                self.robot_arp_frame(frame, policy);
                None
            }
            Some("signalling.disconnected") => {
                let cause = envelope
                    .pointer("/payload/details/reason")
                    .and_then(Value::as_str)
                    .unwrap_or("closed")
                    .to_string();
                self.robot = None;
                Some(Ending::SessionEnded(cause))
            }
            Some("signalling.error") => {
                // Another node refused the session (its id, the viewer caps, no ARP).
                let why = envelope
                    .pointer("/payload/details/reason")
                    .and_then(Value::as_str)
                    .unwrap_or("refused")
                    .to_string();
                if let Some(id) = self.initializing.take() {
                    self.pending.remove(&id.to_string());
                    self.robot = None;
                    let message = envelope
                        .pointer("/payload/message")
                        .and_then(Value::as_str)
                        .unwrap_or("refused");
                    self.out
                        .push(rules::internal(&id, &why, message).to_string());
                }
                None
            }
            _ => None,
        }
    }

    fn robot_arp_frame(&mut self, frame: Value, policy: ConfirmationPolicy) {
        let is_request = frame.get("method").is_some();
        if is_request {
            if frame.get("method").and_then(Value::as_str) == Some(method::REQUEST_CONFIRMATION) {
                let to_program = policy == ConfirmationPolicy::Client
                    && self.confirms_itself
                    && self.asked.len() < ASKED_AT_ONCE;
                match frame.get("id").filter(|_| to_program) {
                    Some(id) => {
                        let tool = frame
                            .pointer("/params/details/tool")
                            .and_then(Value::as_str)
                            .map(str::to_string);
                        self.asked.insert(id.to_string(), tool);
                    }
                    None => {
                        self.confirmation_unanswerable(&frame);
                        return;
                    }
                }
            }
            self.out.push(frame.to_string());
            return;
        }
        if frame.pointer("/error/data/reason").and_then(Value::as_str)
            == Some(signalling_protocol::arp::reason::BAD_TICKET)
        {
            let refusals = &self.state.metrics.robot_ticket_refusals;
            refusals.with_label_values(&["arp"]).inc();
        }
        if let Some(id) = frame.get("id") {
            if let Some(pending) = self.pending.remove(&id.to_string()) {
                if self.initializing.as_ref() == Some(id) {
                    self.initializing = None;
                }
                self.complete(pending, &frame);
            }
        }
        self.out.push(frame.to_string());
    }

    /// A tool call's answer: its record completed and written.
    fn complete(&mut self, pending: Pending, frame: &Value) {
        let Some(mut record) = pending.record else {
            return;
        };
        record.duration_ms = Some(pending.started.elapsed().as_millis() as i64);
        match frame.get("error") {
            Some(error) => {
                record.outcome = "failed".into();
                record.error_code = error.get("code").and_then(Value::as_i64);
            }
            None => {
                record.outcome = frame
                    .pointer("/result/state")
                    .and_then(Value::as_str)
                    .unwrap_or("completed")
                    .to_string();
            }
        }
        self.state.audit.record(record);
    }

    /// The robot asks for a person's approval and the program did not say it answers them
    /// itself: the request goes before people (the console); too many at once are denied.
    fn confirmation_unanswerable(&mut self, request: &Value) {
        let asked = self.people.ask(
            &self.state,
            &self.robot_id,
            &self.conn,
            &self.subject,
            request,
        );
        if !asked {
            if let Some(id) = request.get("id") {
                self.answer_confirmation(id.clone(), false, None);
            }
        }
    }

    /// A person answered (or nobody could be asked): the robot hears it, and the call it
    /// was about keeps who approved it on record.
    fn people_answered(&mut self, answered: Answered) -> Option<Ending> {
        match answered.outcome {
            Outcome::Decided(decision) => {
                if decision.confirmed {
                    self.note_confirmer(answered.tool.as_deref(), &decision.decided_by);
                }
                self.answer_confirmation(
                    answered.request_id,
                    decision.confirmed,
                    Some(&decision.decided_by),
                );
            }
            Outcome::Failed => self.answer_confirmation(answered.request_id, false, None),
            Outcome::Expired => {}
        }
        None
    }

    /// Answers the robot's request; a denial nobody gave (too many waiting, the database
    /// away) is signed `gateway`, never with the program's subject.
    fn answer_confirmation(&mut self, id: Value, confirmed: bool, by: Option<&str>) {
        let answer = json!({
            "jsonrpc": "2.0",
            "id": id,
            "result": {
                "confirmed": confirmed,
                "confirmedBy": by.unwrap_or("gateway"),
                "timestamp": crate::messages::timestamp(),
            },
        });
        self.forward(answer);
    }
}

/// The id of a JSON-RPC request frame, if it has one.
fn frame_id(frame: &Value) -> Option<Value> {
    frame.get("id").cloned()
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
