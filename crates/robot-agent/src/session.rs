//! One client session's `agent.*` protocol: parses what arrives on the data
//! channel, checks it, and answers. Motion goes through the controller
//! (safety layer); locations and settings are shared stores.
//!
//! Replies carry `correlationId` = the request's `id`. Anything invalid gets
//! an `agent.error` with the spec's code. Messages that only a robot sends
//! are refused as `UNSUPPORTED_MESSAGE_TYPE` when a client sends them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use signalling_protocol::{
    parse_legacy_movement, Agent, Body, ConfigUpdatePayload, Envelope, ErrorCode, Location,
    LocationOperation, NavigationStatus, ProtocolError,
};

use crate::budget::MessageBudget;
use crate::controller::{ControllerHandle, NavRefusal};
use crate::locations::{LocationError, LocationStore};
use crate::messages::{self, details};
use crate::reply_signing::ReplySigner;
use crate::safety::freshness::{Decision, FreshnessConfig, MotionGate, Stale, Verdict};
use crate::safety::{Refusal, Role};
use crate::settings::{Settings, SettingsError, ESTOP_RESET_KEY};

/// Largest accepted data-channel message.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Per-session message budget (all types): sustained rate and burst. It
/// protects the agent; motion has its own, tighter limit in the safety layer.
const MESSAGE_RATE: f64 = 200.0;
const MESSAGE_BURST: f64 = 400.0;

/// Counters of the agent, for its log and for tests (the agent serves no
/// HTTP, so these are its metrics).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Motion commands refused as stale (`agent.error` reason `stale`).
    pub stale_commands: AtomicU64,
}

impl Metrics {
    pub fn stale_commands(&self) -> u64 {
        self.stale_commands.load(Ordering::Relaxed)
    }
}

/// State shared by all sessions.
#[derive(Clone)]
pub struct Shared {
    pub controller: ControllerHandle,
    pub locations: Arc<Mutex<LocationStore>>,
    pub settings: Arc<Mutex<Settings>>,
    /// Safety values of the config file, the base `safety.*` applies to.
    pub base_limits: crate::safety::SafetyLimits,
    pub metrics: Arc<Metrics>,
    /// Signs what goes out on the data channels (`sign_replies = true`).
    pub reply_signer: Option<Arc<ReplySigner>>,
}

/// A movement command on its way through the freshness gate.
#[derive(Debug, Clone)]
struct Move {
    forward: f64,
    turn: f64,
    /// The request's id; the legacy form has none.
    id: Option<String>,
}

/// One data-channel session (all of its data channels).
pub struct Session {
    id: String,
    role: Role,
    shared: Shared,
    budget: MessageBudget,
    last_limit_error: Option<tokio::time::Instant>,
    /// Freshness of this session's commands (per session: each client has
    /// its own clock and its own path).
    gate: MotionGate<Move>,
    /// Stale commands since the last executed one: logs once per burst.
    stale_run: u64,
}

impl Session {
    pub fn new(id: impl Into<String>, role: Role, shared: Shared) -> Session {
        Session {
            id: id.into(),
            role,
            shared,
            budget: MessageBudget::new(MESSAGE_RATE, MESSAGE_BURST),
            last_limit_error: None,
            gate: MotionGate::new(now()),
            stale_run: 0,
        }
    }

    /// When [`Session::on_deadline`] must run (a held command's burst
    /// settles).
    pub fn deadline(&self) -> Option<tokio::time::Instant> {
        self.gate.deadline().map(tokio::time::Instant::from_std)
    }

    /// Ends a settled burst: its newest command runs if still fresh.
    pub async fn on_deadline(&mut self) -> Vec<Envelope> {
        let cfg = self.freshness();
        match self.gate.poll(&cfg, now()) {
            Some(decision) => self.decide(decision).await.into_iter().collect(),
            None => Vec::new(),
        }
    }

    /// Stale commands refused since this session's last executed one.
    pub fn stale_run(&self) -> u64 {
        self.stale_run
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// Signs a message about to go out on the data channel when `sign_replies` is on
    /// ([`crate::reply_signing`]); leaves it as it is otherwise.
    pub fn sign(&self, envelope: &mut Envelope) {
        let Some(signer) = &self.shared.reply_signer else {
            return;
        };
        if let Err(e) = signer.sign(envelope) {
            // The client refuses it unsigned: said here, where the cause is known.
            tracing::error!(session = %self.id, kind = %envelope.kind, error = %e, "cannot sign a reply");
        }
    }

    /// Handles one text message; returns the immediate replies (async
    /// navigation progress arrives through the controller instead).
    pub async fn handle_text(&mut self, text: &str) -> Vec<Envelope> {
        if !self.budget.take() {
            return self.rate_limited();
        }
        if text.len() > MAX_MESSAGE_BYTES {
            return vec![messages::error(
                ErrorCode::InvalidMessage,
                format!("message larger than {MAX_MESSAGE_BYTES} bytes"),
                None,
                raw_id(text).as_deref(),
            )];
        }
        let now = now();
        // The Modulr web app's legacy form: no envelope, no timestamp.
        if let Some(legacy) = parse_legacy_movement(text) {
            return match legacy {
                Ok(m) => {
                    let command = Move {
                        forward: m.forward,
                        turn: m.turn,
                        id: None,
                    };
                    self.movement(now, None, command).await
                }
                Err(e) => vec![protocol_error(&e, None)],
            };
        }
        let envelope = match Envelope::parse(text) {
            Ok(e) => e,
            Err(e) => return vec![protocol_error(&e, raw_id(text).as_deref())],
        };
        let id = envelope.id.clone();
        let sent = envelope.sent_at_unix_ms();
        let body = match envelope.body() {
            Ok(body) => body,
            Err(e) => return vec![protocol_error(&e, Some(&id))],
        };
        let agent = match body {
            Body::Agent(agent) => agent,
            Body::Signalling(_) => {
                return vec![messages::error(
                    ErrorCode::UnsupportedMessageType,
                    format!(
                        "{} belongs on the signalling socket, not the data channel",
                        envelope.kind
                    ),
                    None,
                    Some(&id),
                )]
            }
        };
        if let Agent::Movement(m) = agent {
            let command = Move {
                forward: m.forward,
                turn: m.turn,
                id: Some(id),
            };
            return self.movement(now, sent, command).await;
        }
        // Every other message teaches the clock estimator too.
        let verdict = self.gate.observe(&self.freshness(), now, sent);
        self.dispatch(agent, &id, verdict)
            .await
            .into_iter()
            .collect()
    }

    async fn dispatch(&mut self, message: Agent, id: &str, verdict: Verdict) -> Option<Envelope> {
        match message {
            Agent::Ping => Some(messages::pong(id)),
            Agent::Capabilities(caps) => {
                // The client's versions: we speak any 0.x.
                let compatible = caps
                    .versions
                    .iter()
                    .any(|v| v.split('.').next() == Some("0"));
                (!compatible).then(|| {
                    messages::error(
                        ErrorCode::CapabilityMismatch,
                        "no common protocol version (this agent speaks 0.x)",
                        None,
                        Some(id),
                    )
                })
            }
            // A client's pong or error needs no answer (answering errors
            // could start an endless exchange).
            Agent::Pong => None,
            Agent::Error(e) => {
                tracing::debug!(session = %self.id, code = %e.code, message = %e.message, "client reported an error");
                None
            }
            // Handled before dispatch (it goes through the freshness gate).
            Agent::Movement(_) => None,
            Agent::LocationCreate(l) => {
                Some(self.location_change(LocationOperation::Create, l, id))
            }
            Agent::LocationUpdate(l) => {
                Some(self.location_change(LocationOperation::Update, l, id))
            }
            Agent::LocationDelete(d) => Some(self.location_delete(&d.name, id)),
            Agent::LocationList => {
                let list = lock(&self.shared.locations).list();
                Some(messages::location_response(
                    LocationOperation::List,
                    Some(list),
                    id,
                ))
            }
            Agent::NavigationStart(start) => {
                if let (true, Verdict::Stale(why)) = (self.role.may_drive(), verdict) {
                    return Some(self.stale(id_of(id), why));
                }
                self.navigation_start(&start.name, id).await
            }
            Agent::NavigationCancel => Some(self.navigation_cancel(id).await),
            Agent::ConfigGet => {
                let config = lock(&self.shared.settings).snapshot();
                Some(messages::config_get_response(config, id))
            }
            Agent::ConfigUpdate(update) => {
                // Releasing a latched e-stop starts motion again: only on a
                // fresh request, like a movement.
                if let (true, true, Verdict::Stale(why)) = (
                    self.role.may_drive(),
                    update.key == ESTOP_RESET_KEY,
                    verdict,
                ) {
                    return Some(self.stale(id_of(id), why));
                }
                Some(self.config_update(update, id).await)
            }
            Agent::LocationResponse(_)
            | Agent::NavigationResponse(_)
            | Agent::ConfigResponse(_)
            | Agent::ConfigGetResponse(_) => Some(messages::error(
                ErrorCode::UnsupportedMessageType,
                "this message type is sent by robots, not to them",
                None,
                Some(id),
            )),
        }
    }

    /// The current freshness parameters (`safety.watchdog_ms` may change
    /// at run time).
    fn freshness(&self) -> FreshnessConfig {
        lock(&self.shared.settings)
            .safety_limits(&self.shared.base_limits)
            .freshness()
    }

    async fn movement(&mut self, now: Instant, sent: Option<i64>, command: Move) -> Vec<Envelope> {
        if !self.role.may_drive() {
            // Said plainly, rather than judging the age of a command that
            // may not run anyway.
            let refusal = Refusal::Forbidden(self.role.as_str());
            return vec![refusal_error(&refusal, command.id.as_deref())];
        }
        let cfg = self.freshness();
        let outcome = self.gate.movement(&cfg, now, sent, command);
        let mut replies = Vec::new();
        if let Some(old) = outcome.superseded {
            replies.push(self.stale(old.id, Stale::Superseded));
        }
        replies.extend(self.decide(outcome.decision).await);
        replies
    }

    async fn decide(&mut self, decision: Decision<Move>) -> Option<Envelope> {
        match decision {
            Decision::Execute(command) => {
                if self.stale_run > 0 {
                    tracing::info!(session = %self.id, dropped = self.stale_run, "fresh command: motion allowed again");
                    self.stale_run = 0;
                }
                let result = self
                    .shared
                    .controller
                    .movement(&self.id, self.role, command.forward, command.turn)
                    .await;
                result
                    .err()
                    .map(|refusal| refusal_error(&refusal, command.id.as_deref()))
            }
            Decision::Hold => None,
            Decision::Drop(command, why) => Some(self.stale(command.id, why)),
        }
    }

    /// Refuses a stale command: counted, logged once per burst, answered.
    fn stale(&mut self, id: Option<String>, why: Stale) -> Envelope {
        self.shared
            .metrics
            .stale_commands
            .fetch_add(1, Ordering::Relaxed);
        if self.stale_run == 0 {
            tracing::warn!(
                session = %self.id,
                cause = why.cause(),
                detail = ?why,
                "stale command refused (logged once per burst; all are counted)"
            );
        }
        self.stale_run += 1;
        messages::error(
            ErrorCode::MovementFailed,
            format!(
                "stale command refused ({}): it would act on an old intent",
                why.cause()
            ),
            Some(details(
                "stale",
                &[("cause", Value::String(why.cause().into()))],
            )),
            id.as_deref(),
        )
    }

    /// The refusal for a viewer trying to change robot state, if it is one.
    fn refuse_viewer(&self, what: &str, id: &str) -> Option<Envelope> {
        if self.role.may_drive() {
            return None;
        }
        Some(messages::error(
            ErrorCode::ValidationFailed,
            format!("a {} session may not {what}", self.role.as_str()),
            Some(details(
                "forbidden",
                &[("role", Value::String(self.role.as_str().into()))],
            )),
            Some(id),
        ))
    }

    fn location_change(
        &self,
        operation: LocationOperation,
        location: Location,
        id: &str,
    ) -> Envelope {
        if let Some(e) = self.refuse_viewer("change locations", id) {
            return e;
        }
        let name = location.name.clone();
        let result = {
            let mut store = lock(&self.shared.locations);
            match operation {
                LocationOperation::Create => store.create(location),
                _ => store.update(location),
            }
        };
        match result {
            Ok(()) => messages::location_response(operation, None, id),
            Err(e) => location_error(&e, operation, &name, id),
        }
    }

    fn location_delete(&self, name: &str, id: &str) -> Envelope {
        if let Some(e) = self.refuse_viewer("change locations", id) {
            return e;
        }
        let result = lock(&self.shared.locations).delete(name);
        match result {
            Ok(()) => messages::location_response(LocationOperation::Delete, None, id),
            Err(e) => location_error(&e, LocationOperation::Delete, name, id),
        }
    }

    async fn navigation_start(&self, name: &str, id: &str) -> Option<Envelope> {
        let location = lock(&self.shared.locations).get(name).cloned();
        let Some(location) = location else {
            return Some(messages::error(
                ErrorCode::LocationNotFound,
                format!("location {name:?} does not exist"),
                Some(details(
                    "not_found",
                    &[("requestedName", Value::String(name.into()))],
                )),
                Some(id),
            ));
        };
        match self
            .shared
            .controller
            .navigate(&self.id, self.role, id, location)
            .await
        {
            // `started` follows once the driver has accepted the goal.
            Ok(()) => None,
            Err(refusal) => Some(nav_error(&refusal, id)),
        }
    }

    async fn navigation_cancel(&self, id: &str) -> Envelope {
        match self.shared.controller.cancel_navigation(self.role).await {
            Ok(name) => messages::navigation_response(NavigationStatus::Cancelled, &name, None, id),
            Err(refusal) => nav_error(&refusal, id),
        }
    }

    async fn config_update(&self, update: ConfigUpdatePayload, id: &str) -> Envelope {
        if let Some(e) = self.refuse_viewer("change the configuration", id) {
            return e;
        }
        if update.key == ESTOP_RESET_KEY {
            if update.value != Value::Bool(true) {
                return messages::error(
                    ErrorCode::ValidationFailed,
                    format!("{ESTOP_RESET_KEY} takes the value true"),
                    None,
                    Some(id),
                );
            }
            return match self.shared.controller.reset_estop(self.role).await {
                Ok(_) => messages::config_response(ESTOP_RESET_KEY, false, id),
                Err(refusal) => refusal_error(&refusal, Some(id)),
            };
        }
        let result = lock(&self.shared.settings).update(&update.key, update.value);
        match result {
            Ok(applied) => {
                if update.key.starts_with("safety.") {
                    let limits =
                        lock(&self.shared.settings).safety_limits(&self.shared.base_limits);
                    self.shared.controller.set_limits(limits).await;
                }
                messages::config_response(&update.key, applied.restart_required, id)
            }
            Err(e @ (SettingsError::UnknownKey(_) | SettingsError::InvalidValue { .. })) => {
                messages::error(
                    ErrorCode::ValidationFailed,
                    e.to_string(),
                    Some(details(
                        "invalid",
                        &[("key", Value::String(update.key.clone()))],
                    )),
                    Some(id),
                )
            }
            Err(e @ SettingsError::Storage { .. }) => {
                tracing::error!(error = %e, "cannot persist settings");
                messages::error(
                    ErrorCode::InternalError,
                    "cannot store the setting",
                    None,
                    Some(id),
                )
            }
        }
    }

    /// At most one rate-limit error per second, so a flood is not answered
    /// with a flood.
    fn rate_limited(&mut self) -> Vec<Envelope> {
        let now = tokio::time::Instant::now();
        if self
            .last_limit_error
            .is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(1))
        {
            return Vec::new();
        }
        self.last_limit_error = Some(now);
        vec![messages::error(
            ErrorCode::AgentUnavailable,
            "too many messages; slow down",
            Some(details("rate_limited", &[])),
            None,
        )]
    }
}

/// The session's clock: tokio's, so tests with paused time drive it too.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

fn id_of(id: &str) -> Option<String> {
    Some(id.to_owned())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave these stores half-updated
    // (every change is applied after it is persisted), so poison is ignored.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn protocol_error(e: &ProtocolError, correlation: Option<&str>) -> Envelope {
    messages::error(e.code(), e.to_string(), None, correlation)
}

fn refusal_error(refusal: &Refusal, id: Option<&str>) -> Envelope {
    let mut extra = Vec::new();
    if let Refusal::EmergencyStop(_) = refusal {
        extra.push(("latched", Value::Bool(true)));
    }
    messages::error(
        ErrorCode::MovementFailed,
        refusal.to_string(),
        Some(details(refusal.reason(), &extra)),
        id,
    )
}

fn nav_error(refusal: &NavRefusal, id: &str) -> Envelope {
    match refusal {
        NavRefusal::Refused(r) => refusal_error(r, Some(id)),
        NavRefusal::AlreadyActive(name) => messages::error(
            ErrorCode::NavigationAlreadyActive,
            refusal.to_string(),
            Some(details(
                "already_active",
                &[("activeName", Value::String(name.clone()))],
            )),
            Some(id),
        ),
        NavRefusal::NotActive => messages::error(
            ErrorCode::NavigationNotActive,
            refusal.to_string(),
            None,
            Some(id),
        ),
    }
}

fn location_error(
    e: &LocationError,
    operation: LocationOperation,
    name: &str,
    id: &str,
) -> Envelope {
    let code = match e {
        LocationError::NotFound(_) => ErrorCode::LocationNotFound,
        LocationError::AlreadyExists(_) => ErrorCode::LocationAlreadyExists,
        LocationError::NameInvalid(_) => ErrorCode::LocationNameInvalid,
        LocationError::StorageFull(_) => ErrorCode::LocationStorageFull,
        LocationError::Storage { .. } => {
            tracing::error!(error = %e, "cannot persist locations");
            ErrorCode::InternalError
        }
    };
    let operation = serde_json::to_value(operation).unwrap_or(Value::Null);
    let message = match e {
        LocationError::Storage { .. } => "cannot store the location".to_owned(),
        other => other.to_string(),
    };
    messages::error(
        code,
        message,
        Some(details(
            "location",
            &[
                ("operation", operation),
                ("requestedName", Value::String(name.to_owned())),
            ],
        )),
        Some(id),
    )
}

/// The `id` of a message that failed to parse, so the error can still be
/// correlated.
fn raw_id(text: &str) -> Option<String> {
    if text.len() > MAX_MESSAGE_BYTES {
        return None;
    }
    serde_json::from_str::<Value>(text)
        .ok()?
        .get("id")?
        .as_str()
        .map(str::to_owned)
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
