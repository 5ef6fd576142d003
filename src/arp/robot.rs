//! What comes back from the robot's side of a gateway session: the robot's ARP frames
//! (answers completed on record, requests for confirmation routed to the program or to
//! people), and the server's word that the session ended; and how frames reach the robot.

use serde_json::{json, Value};
use signalling_protocol::arp::{method, ConfirmationPolicy, Message, CONFIRMATION_POLICY_META_KEY};
use signalling_protocol::ticket::KEY_EXCHANGE_META_KEY;

use super::confirm::{Answered, Outcome};
use super::gateway::{Ending, Gateway, Pending};
use super::rules;
use crate::messages::ARP_FRAME;
use crate::relay::{DeliveryError, Outbound, Sender};
use crate::tickets::TicketFor;

/// What the gateway reads of a frame from the robot's side (an `arp.frame`, or the server's
/// word that the session ended or was refused): its type, payload and `meta`; the header's
/// other members are skipped, not built.
#[derive(serde::Deserialize)]
struct RobotSide<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    payload: Option<Value>,
    #[serde(default)]
    meta: Option<Value>,
}

/// Requests for confirmation the robot may have waiting on the program at once; past it,
/// people are asked.
const ASKED_AT_ONCE: usize = 16;

impl Gateway {
    /// Sends one ARP frame to the robot in an `arp.frame` of this session, with who calls
    /// (`meta.session`, from the server's records only).
    pub(super) fn forward(&mut self, frame: Message) -> Option<Ending> {
        let robot = self.robot.clone()?;
        let text = self.frame_for_robot(&frame);
        let id = frame.id;
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
    pub(super) fn frame_for_robot(&mut self, frame: &Message) -> String {
        let session = TicketFor {
            robot: &self.robot_id,
            connection_id: &self.conn,
            subject: &self.subject,
            role: self.role,
        };
        let ticket = self
            .state
            .tickets
            .arp_message(session, frame, &mut self.ticket_key);
        let caller = crate::messages::ArpCaller {
            subject: &self.subject,
            role: self.role,
            signature_nonce: self.signature_nonce.as_deref(),
        };
        crate::messages::arp_frame(&self.conn, frame, caller, ticket.as_deref())
    }

    /// A frame for the program from the robot's side: an `arp.frame` of the robot, or the
    /// server's word that the session ended or was refused.
    pub(super) fn robot_side(&mut self, text: &str) -> Option<Ending> {
        // Read once, and only what the gateway acts on: not the envelope's header.
        let Ok(RobotSide {
            kind,
            mut payload,
            meta,
        }) = serde_json::from_str::<RobotSide<'_>>(text)
        else {
            return None;
        };
        let in_payload = |pointer: &str| payload.as_ref().and_then(|p| p.pointer(pointer));
        match kind.as_deref() {
            Some(ARP_FRAME) => {
                let frame = payload
                    .as_mut()
                    .and_then(|p| p.get_mut("frame"))
                    .map(Value::take)?;
                let Ok(mut frame) = Message::from_value(frame) else {
                    tracing::warn!("a robot's arp.frame holds no ARP message; dropped");
                    return None;
                };
                let meta = meta.as_ref();
                let member = |key: &str| meta.and_then(|meta| meta.get(key));
                // Only a program that asked gets the robot's signature, as the frame's own
                // `signature` (one that did not gets ARP frames exactly as the spec has them).
                if let Some(half) = member(KEY_EXCHANGE_META_KEY).and_then(Value::as_str) {
                    if self.ticket_key.agree(half, &self.conn) {
                        self.state.metrics.tickets.session_keys.inc();
                    }
                }
                let signature = member("signature").filter(|s| s.is_string());
                if let (Some(_), Some(signature)) = (&self.signature_nonce, signature) {
                    frame.signature = Some(signature.clone());
                }
                let policy = ConfirmationPolicy::from_meta(member(CONFIRMATION_POLICY_META_KEY));
                self.robot_arp_frame(frame, policy);
                None
            }
            Some("signalling.disconnected") => {
                let cause = in_payload("/details/reason")
                    .and_then(Value::as_str)
                    .unwrap_or("closed")
                    .to_string();
                self.robot = None;
                Some(Ending::SessionEnded(cause))
            }
            Some("signalling.error") => {
                // Another node refused the session (its id, the viewer caps, no ARP).
                let why = in_payload("/details/reason")
                    .and_then(Value::as_str)
                    .unwrap_or("refused")
                    .to_string();
                if let Some(id) = self.initializing.take() {
                    self.pending.remove(&id.to_string());
                    self.robot = None;
                    let message = in_payload("/message")
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

    fn robot_arp_frame(&mut self, frame: Message, policy: ConfirmationPolicy) {
        if frame.is_request() {
            if frame.method() == Some(method::REQUEST_CONFIRMATION) {
                let to_program = policy == ConfirmationPolicy::Client
                    && self.confirms_itself
                    && self.asked.len() < ASKED_AT_ONCE;
                match frame.id.as_ref().filter(|_| to_program) {
                    Some(id) => {
                        let tool = frame
                            .params()
                            .and_then(|params| params.pointer("/details/tool"))
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
            self.out.push(frame.to_text());
            return;
        }
        if frame
            .error_value()
            .and_then(|error| error.pointer("/data/reason"))
            .and_then(Value::as_str)
            == Some(signalling_protocol::arp::reason::BAD_TICKET)
        {
            let refusals = &self.state.metrics.tickets.robot_refusals;
            refusals.with_label_values(&["arp"]).inc();
        }
        if let Some(id) = &frame.id {
            if let Some(pending) = self.pending.remove(&id.to_string()) {
                if self.initializing.as_ref() == Some(id) {
                    self.initializing = None;
                }
                self.complete(pending, &frame);
            }
        }
        self.out.push(frame.to_text());
    }

    /// A tool call's answer: its record completed and written.
    fn complete(&mut self, pending: Pending, frame: &Message) {
        let Some(mut record) = pending.record else {
            return;
        };
        record.duration_ms = Some(pending.started.elapsed().as_millis() as i64);
        match frame.error_value() {
            Some(error) => {
                record.outcome = "failed".into();
                record.error_code = error.get("code").and_then(Value::as_i64);
            }
            None => {
                record.outcome = frame
                    .result_value()
                    .and_then(|result| result.get("state"))
                    .and_then(Value::as_str)
                    .unwrap_or("completed")
                    .to_string();
            }
        }
        self.state.audit.record_outcome(record);
    }

    /// The robot asks for a person's approval and the program did not say it answers them
    /// itself: the request goes before people (the console); too many at once are denied.
    pub(super) fn confirmation_unanswerable(&mut self, request: &Message) {
        let asked = self.people.ask(
            &self.state,
            &self.robot_id,
            &self.conn,
            &self.subject,
            request,
        );
        if !asked {
            if let Some(id) = &request.id {
                self.answer_confirmation(id.clone(), false, None);
            }
        }
    }

    /// A person answered (or nobody could be asked): the robot hears it, and the call it
    /// was about keeps who approved it on record.
    pub(super) fn people_answered(&mut self, answered: Answered) -> Option<Ending> {
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
    pub(super) fn answer_confirmation(&mut self, id: Value, confirmed: bool, by: Option<&str>) {
        let result = json!({
            "confirmed": confirmed,
            "confirmedBy": by.unwrap_or("gateway"),
            "timestamp": crate::messages::timestamp(),
        });
        self.forward(Message::result(id, result));
    }
}
