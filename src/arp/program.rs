//! What the program sends through the gateway: each frame read once, checked against
//! ARP's schema and the caller's role and limits, then passed to the robot, answered here,
//! or refused.

use std::time::Instant;

use serde_json::{json, Value};
use signalling_protocol::arp::{method, ArpCode, Message, MessageError, MAX_FRAME_BYTES};
use signalling_protocol::Role;

use super::gateway::{Ending, Gateway, Pending, STOP_RECORD_EVERY};
use super::rules;
use crate::messages::SessionKind;
use crate::relay::{DeliveryError, OpenSession, Outbound, SessionError};
use crate::store::bounded;

/// The action on record of a call that retries an earlier one (the same idempotency key,
/// the same subject and robot, within the robot's memory of keys): the robot answers it with
/// the first run's outcome and runs nothing.
const REPLAY_ACTION: &str = "tool_call_replay";
/// How long robot-agent remembers an idempotency key.
const KEYS_REMEMBERED_MS: i64 = 600_000;

/// `signalling_arp_frames_dropped_total{reason}`: an answer to no request of the robot
/// that this program was sent.
const DROPPED_UNSOLICITED_ANSWER: &str = "unsolicited_answer";

impl Gateway {
    /// One frame from the program. Returns an ending when the connection must close.
    pub(super) async fn program_frame(&mut self, text: &str) -> Option<Ending> {
        let value = self.parse(text)?;
        let Some(method) = value.get("method").and_then(Value::as_str) else {
            // The program's answer to a request of the robot (a confirmation).
            return self.program_answer(Message::from_value(value));
        };
        let method = method.to_string();
        let id_or_null = value.get("id").cloned().unwrap_or(Value::Null);
        // Only ARP 0.1.0 reaches a robot: an unknown method or a malformed request is
        // answered here, so the robot never reads what it does not understand.
        if let Some(refusal) = rules::check_request(&id_or_null, &method, &value) {
            if value.get("id").is_some() {
                self.out.push(refusal.to_string());
            }
            return None;
        }
        // The checked frame, typed: its members are moved, nothing is parsed again.
        let message = match Message::from_value(value) {
            Ok(message) => message,
            Err(e) => {
                let error =
                    rules::error(&id_or_null, ArpCode::InvalidRequest, &e.to_string(), None);
                self.out.push(error.to_string());
                return None;
            }
        };
        match method.as_str() {
            method::INITIALIZE => self.initialize(&id_or_null, message).await,
            method::EMERGENCY_STOP => self.emergency_stop(message).await,
            _ => self.request(&method, message).await,
        }
    }

    /// The frame as JSON, or its refusal answered: too large, not JSON, not one object.
    fn parse(&mut self, text: &str) -> Option<Value> {
        let refusal = if text.len() > MAX_FRAME_BYTES {
            let message = format!("frame larger than {MAX_FRAME_BYTES} bytes");
            rules::error(&Value::Null, ArpCode::InvalidRequest, &message, None)
        } else {
            match serde_json::from_str::<Value>(text) {
                Ok(value @ Value::Object(_)) => return Some(value),
                Ok(value) => {
                    let message = if value.is_array() {
                        "batches are not supported: send one request per frame"
                    } else {
                        "a JSON-RPC message is an object"
                    };
                    rules::error(&Value::Null, ArpCode::InvalidRequest, message, None)
                }
                Err(e) => rules::error(
                    &Value::Null,
                    ArpCode::ParseError,
                    &format!("not JSON: {e}"),
                    None,
                ),
            }
        };
        self.out.push(refusal.to_string());
        None
    }

    /// A request of an initialized session (neither `arp.initialize` nor an e-stop): the
    /// role's methods, the limits, the call on record before the robot sees it.
    async fn request(&mut self, method: &str, message: Message) -> Option<Ending> {
        let id = message.id.clone();
        let id_or_null = id.clone().unwrap_or(Value::Null);
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
        if !rules::allowed(self.role, method) {
            if id.is_some() {
                self.out
                    .push(rules::forbidden(&id_or_null, method, self.role).to_string());
            }
            return None;
        }
        if let Some(refusal) = self.admit(method, &id, message.params()) {
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
        if let Some(mut record) = self.pending.get(&key).and_then(|p| p.record.clone()) {
            if self.is_replay(&record).await {
                record.action = REPLAY_ACTION.into();
                if let Some(pending) = self.pending.get_mut(&key).and_then(|p| p.record.as_mut()) {
                    pending.action = REPLAY_ACTION.into();
                }
            }
            if !self.state.audit.record_committed(record).await {
                self.pending.remove(&key);
                self.state.metrics.audit.refused_calls.inc();
                let refusal = rules::internal(
                    &id_or_null,
                    "audit_unavailable",
                    "the call cannot be put on record now; try again",
                );
                self.out.push(refusal.to_string());
                return None;
            }
        }
        self.forward(message)
    }

    /// Whether a keyed call retries one already on record. A store that cannot tell leaves
    /// it a plain call (the record is still made; only the mark is missing).
    async fn is_replay(&self, record: &crate::store::AuditRecord) -> bool {
        let Some(key) = record.idempotency_key.as_deref() else {
            return false;
        };
        let since = record.at - KEYS_REMEMBERED_MS;
        let seen = self
            .state
            .store
            .audit_key_seen(&self.robot_id, &self.subject, key, since)
            .await;
        seen.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot look up an idempotency key");
            false
        })
    }

    /// The limits a request must pass; the refusal, if any. An admitted request with an
    /// id is remembered until the robot answers.
    fn admit(&mut self, method: &str, id: &Option<Value>, params: Option<&Value>) -> Option<Value> {
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

    /// `arp.initialize`: opens the session (the grant's role, the control lock for a
    /// driver), then passes the request on.
    async fn initialize(&mut self, id: &Value, mut frame: Message) -> Option<Ending> {
        if self.robot.is_some() || self.initializing.is_some() {
            let error = rules::error(id, ArpCode::InvalidRequest, "already initialized", None);
            self.out.push(error.to_string());
            return None;
        }
        // `takeover` is the gateway's: the robot never reads it.
        let takeover = frame
            .params_mut()
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
            .params()
            .and_then(|params| params.pointer("/capabilities/confirmation"))
            .and_then(Value::as_bool)
            == Some(true);
        // The robot's requests for confirmation come to the gateway, which answers every one
        // (people, or the program where the robot lets it): the robot is told it may ask.
        if let Some(params) = frame.params_mut() {
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

    /// `arp.emergencyStop`, from anyone with a grant, at any time: it acts first (it reaches
    /// the robot, past every queue share), then it is answered (by the robot, in a session;
    /// by the gateway before one). On record once a second per connection, with a count.
    async fn emergency_stop(&mut self, frame: Message) -> Option<Ending> {
        let id = frame.id.clone();
        self.note_stop();
        if let Some(robot) = self.robot.clone() {
            let text = self.frame_for_robot(&frame);
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
        self.stops.window_end = Some(Instant::now() + STOP_RECORD_EVERY);
    }

    /// The second of counted stops is over: one record for them, and the next second
    /// counts too (at most one record a second while a flood lasts).
    pub(super) fn stop_window_ended(&mut self) {
        let count = std::mem::take(&mut self.stops.unrecorded);
        self.record_stops(count);
        self.stops.window_end = (count > 0).then(|| Instant::now() + STOP_RECORD_EVERY);
    }

    pub(super) fn record_stops(&mut self, count: u64) {
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
    fn program_answer(&mut self, frame: Result<Message, MessageError>) -> Option<Ending> {
        // Not a response at all (no result, no error): not an answer to anything either.
        let frame = frame.ok();
        let asked = frame
            .as_ref()
            .and_then(|frame| frame.id.as_ref())
            .and_then(|id| self.asked.remove(&id.to_string()));
        let (Some(mut frame), Some(tool)) = (frame, asked) else {
            self.state
                .metrics
                .arp_frames_dropped
                .with_label_values(&[DROPPED_UNSOLICITED_ANSWER])
                .inc();
            tracing::warn!(subject = %self.subject, "an answer to no request this program was sent; dropped");
            return None;
        };
        let confirmer = format!("{} via client", self.subject);
        let confirmed = frame
            .result_value()
            .and_then(|result| result.get("confirmed"))
            .and_then(Value::as_bool)
            == Some(true);
        if let Some(result) = frame.result_mut() {
            result.insert("confirmedBy".into(), Value::String(confirmer.clone()));
        }
        if confirmed {
            self.note_confirmer(tool.as_deref(), &confirmer);
        }
        self.forward(frame)
    }

    /// The call a confirmation was about keeps who approved it on record.
    pub(super) fn note_confirmer(&mut self, tool: Option<&str>, confirmer: &str) {
        let call = self.pending.values_mut().find(|p| {
            p.record
                .as_ref()
                .is_some_and(|r| r.tool.as_deref() == tool && r.confirmed_by.is_none())
        });
        if let Some(record) = call.and_then(|p| p.record.as_mut()) {
            record.confirmed_by = Some(confirmer.to_string());
        }
    }
}
