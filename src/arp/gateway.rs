//! One program's gateway connection, a handler on the connection runtime
//! (`ws::connection`): the runtime reads and writes the program's socket, keeps its idle
//! deadline and pings and closes it; this keeps ARP's rules. `program.rs` reads what the
//! program sends, `robot.rs` what the robot sends back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use signalling_protocol::arp::ArpCode;
use signalling_protocol::Role;

use super::confirm::{Answered, People};
use super::rules;
use crate::auth::ClientIdentity;
use crate::rate_limit::RateLimiter;
use crate::relay::{ConnId, Kick, Outbound, QueueReceiver};
use crate::state::SharedState;
use crate::store::{bounded, AuditRecord, MAX_PARAMS_BYTES};
use crate::tickets::SessionKey;
use crate::ws::connection::{kick_close, Handler, Inbound, Outbox};

/// E-stops of one connection are put on record once per this long (with their count).
pub(super) const STOP_RECORD_EVERY: Duration = Duration::from_secs(1);

/// A request of the program the robot has not answered yet.
pub(super) struct Pending {
    pub(super) method: String,
    pub(super) started: Instant,
    /// For a tool call: its record, completed when the answer comes.
    pub(super) record: Option<AuditRecord>,
}

/// Why the connection ends, and what to tell the program.
pub(super) enum Ending {
    /// The program is gone: nothing more can reach it.
    Program,
    /// Kicked (token revoked, shutdown, ...).
    Kicked(Kick),
    /// The session ended on the server's side (grant withdrawn, robot gone, ...).
    SessionEnded(String),
}

/// E-stops on record: the first at once, the others of the second that follows as one
/// record with their count (a flood must not flood the audit log; each stop still acts).
#[derive(Default)]
pub(super) struct StopRecords {
    /// The end of the second whose stops are counted, not yet recorded.
    pub(super) window_end: Option<Instant>,
    pub(super) unrecorded: u64,
}

/// What the gateway waits for besides the program's frames.
pub enum Event {
    /// A frame of the session from the robot's side (None: the socket left presence).
    Robot(Option<Outbound>),
    /// People answered a request for confirmation.
    People(Answered),
}

pub struct Gateway {
    pub(super) state: SharedState,
    pub(super) conn: ConnId,
    pub(super) subject: String,
    pub(super) robot_id: String,
    /// The role the session opened with (the grant's); before that, viewer.
    pub(super) role: Role,
    /// When the program's token expires: the connection ends then.
    expires_at: Option<Instant>,
    /// The robot's socket, once `arp.initialize` opened the session.
    pub(super) robot: Option<ConnId>,
    /// The id of the `arp.initialize` waiting for the robot.
    pub(super) initializing: Option<Value>,
    /// The program said it answers confirmations itself.
    pub(super) confirms_itself: bool,
    /// The robot's requests for confirmation sent to this program (the robot's policy is
    /// `client` and the program declared it), by id, with the tool each is about: the only
    /// answers the program may send.
    pub(super) asked: HashMap<String, Option<String>>,
    pub(super) stops: StopRecords,
    pub(super) pending: HashMap<String, Pending>,
    pub(super) calls: RateLimiter,
    /// Frames for the program, queued to its socket after each frame or event.
    pub(super) out: Vec<String>,
    /// The robot's requests for approval that wait for people.
    pub(super) people: People,
    /// The program asked for frames signed by the robot (`?signed=`), with this nonce.
    pub(super) signature_nonce: Option<String>,
    /// How this session's tickets are made: signed, then MAC'd once the key is agreed.
    pub(super) ticket_key: SessionKey,
    /// What the session's frames from the robot arrive on (the socket's presence mailbox).
    inbox: Option<QueueReceiver>,
    /// Why the server ends the connection, told to the requests still waiting.
    cause: Option<String>,
}

impl Gateway {
    pub fn new(
        state: &SharedState,
        conn: &ConnId,
        identity: ClientIdentity,
        robot_id: String,
        signature_nonce: Option<String>,
    ) -> Self {
        tracing::info!(subject = %identity.subject, "program connected to the ARP gateway");
        let expires_at = identity.expires_at.map(|at| {
            let left = (at - crate::store::now_ms()).max(0) as u64;
            Instant::now() + Duration::from_millis(left)
        });
        Gateway {
            state: state.clone(),
            conn: conn.clone(),
            subject: identity.subject,
            robot_id,
            role: Role::Viewer,
            expires_at,
            robot: None,
            initializing: None,
            confirms_itself: false,
            asked: HashMap::new(),
            stops: StopRecords::default(),
            pending: HashMap::new(),
            calls: RateLimiter::new(rules::CALLS_PER_SECOND, rules::CALL_BURST, Instant::now()),
            out: Vec::new(),
            people: People::new(),
            signature_nonce,
            ticket_key: state.tickets.session_key(),
            inbox: None,
            cause: None,
        }
    }

    /// Queues what waits for the program, then ends the connection if it must end.
    fn flush(&mut self, ending: Option<Ending>, out: &mut Outbox<'_>) {
        for frame in self.out.drain(..) {
            out.reply(frame);
        }
        match ending {
            None => {}
            Some(Ending::Program) => out.end(),
            Some(Ending::Kicked(kick)) => {
                self.cause = Some(kick.close_frame().1.to_string());
                out.close_now(kick_close(kick));
            }
            Some(Ending::SessionEnded(cause)) => {
                let reason = bounded(&format!("session ended: {cause}"), 120);
                self.cause = Some(cause);
                out.close_now((1000, reason.into()));
            }
        }
    }

    /// The requests still waiting learn that the session ended, and why.
    fn answer_pending(&mut self, cause: &str) {
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
    }

    /// Calls that never got an answer are on record too.
    fn finish(&mut self) {
        let unrecorded = std::mem::take(&mut self.stops.unrecorded);
        self.record_stops(unrecorded);
        for (_, pending) in self.pending.drain() {
            if let Some(mut record) = pending.record {
                record.outcome = "unanswered".into();
                record.duration_ms = Some(pending.started.elapsed().as_millis() as i64);
                self.state.audit.record_outcome(record);
            }
        }
    }

    pub(super) fn record(
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
}

impl Handler for Gateway {
    type Event = Event;
    const READS_INBOX: bool = true;

    fn take_inbox(&mut self, inbox: QueueReceiver) {
        self.inbox = Some(inbox);
    }

    fn open(&mut self, _out: &mut Outbox<'_>) {}

    async fn frame(&mut self, frame: Inbound, _now: Instant, out: &mut Outbox<'_>) {
        let ending = match frame {
            Inbound::Text(text) => self.program_frame(text.as_str()).await,
            Inbound::Binary(_) => {
                let error = rules::error(
                    &Value::Null,
                    ArpCode::InvalidRequest,
                    "binary frames are not JSON-RPC; send text",
                    None,
                );
                self.out.push(error.to_string());
                None
            }
            Inbound::Control => None,
            // Past twice the cap: closed unread.
            Inbound::TooLarge => Some(Ending::Program),
        };
        self.flush(ending, out);
    }

    async fn event(&mut self) -> Event {
        let Some(inbox) = self.inbox.as_mut() else {
            return std::future::pending().await;
        };
        tokio::select! {
            biased;
            answered = self.people.next() => Event::People(answered),
            frame = inbox.recv() => Event::Robot(frame),
        }
    }

    async fn on_event(&mut self, event: Event, out: &mut Outbox<'_>) {
        let ending = match event {
            Event::People(answered) => self.people_answered(answered),
            Event::Robot(Some(Outbound::Text(text))) => self.robot_side(text.as_str()),
            Event::Robot(Some(Outbound::Ping)) => None,
            Event::Robot(None) => Some(Ending::Program),
        };
        self.flush(ending, out);
    }

    fn wake_at(&self) -> Option<Instant> {
        [self.expires_at, self.stops.window_end]
            .into_iter()
            .flatten()
            .min()
    }

    fn wake(&mut self, now: Instant, out: &mut Outbox<'_>) {
        if self.expires_at.is_some_and(|at| at <= now) {
            self.flush(Some(Ending::Kicked(Kick::TokenRevoked)), out);
            return;
        }
        if self.stops.window_end.is_some_and(|at| at <= now) {
            self.stop_window_ended();
        }
    }

    fn kicked(&mut self, kick: Kick, out: &mut Outbox<'_>) {
        self.flush(Some(Ending::Kicked(kick)), out);
    }

    fn idle(&mut self, out: &mut Outbox<'_>) {
        tracing::info!(subject = %self.subject, "gateway program silent past the idle timeout; dropped");
        self.cause = Some("idle_timeout".into());
        out.close_now((1008, "idle timeout".into()));
    }

    async fn leave(&mut self, out: &mut Outbox<'_>) {
        if let Some(cause) = self.cause.take() {
            self.answer_pending(&cause);
            self.flush(None, out);
        }
        self.finish();
        self.state.sessions.detach(&self.conn, false).await;
    }
}
