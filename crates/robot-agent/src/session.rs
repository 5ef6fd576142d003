//! One client session's `agent.*` protocol: parses what arrives on the data
//! channel, checks it, and answers. Motion goes through the controller
//! (safety layer); locations and settings are shared stores.
//!
//! Replies carry `correlationId` = the request's `id`. Anything invalid gets
//! an `agent.error` with the spec's code. Messages that only a robot sends
//! are refused as `UNSUPPORTED_MESSAGE_TYPE` when a client sends them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use signalling_protocol::{
    Agent, Body, ConfigUpdatePayload, Envelope, ErrorCode, Location, LocationOperation,
    NavigationStatus, ProtocolError,
};

use crate::controller::{ControllerHandle, NavRefusal};
use crate::locations::{LocationError, LocationStore};
use crate::messages::{self, details};
use crate::safety::{Refusal, Role};
use crate::settings::{Settings, SettingsError, ESTOP_RESET_KEY};

/// Largest accepted data-channel message.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Per-session message budget (all types): sustained rate and burst. It
/// protects the agent; motion has its own, tighter limit in the safety layer.
const MESSAGE_RATE: f64 = 200.0;
const MESSAGE_BURST: f64 = 400.0;

/// State shared by all sessions.
#[derive(Clone)]
pub struct Shared {
    pub controller: ControllerHandle,
    pub locations: Arc<Mutex<LocationStore>>,
    pub settings: Arc<Mutex<Settings>>,
    /// Safety values of the config file, the base `safety.*` applies to.
    pub base_limits: crate::safety::SafetyLimits,
}

/// One data-channel session.
pub struct Session {
    id: String,
    role: Role,
    shared: Shared,
    budget: f64,
    budget_at: Option<tokio::time::Instant>,
    last_limit_error: Option<tokio::time::Instant>,
}

impl Session {
    pub fn new(id: impl Into<String>, role: Role, shared: Shared) -> Session {
        Session {
            id: id.into(),
            role,
            shared,
            budget: MESSAGE_BURST,
            budget_at: None,
            last_limit_error: None,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// Handles one text message; returns the immediate replies (async
    /// navigation progress arrives through the controller instead).
    pub async fn handle_text(&mut self, text: &str) -> Vec<Envelope> {
        if !self.within_budget() {
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
        let envelope = match Envelope::parse(text) {
            Ok(e) => e,
            Err(e) => return vec![protocol_error(&e, raw_id(text).as_deref())],
        };
        let id = envelope.id.clone();
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
        self.dispatch(agent, &id).await.into_iter().collect()
    }

    async fn dispatch(&mut self, message: Agent, id: &str) -> Option<Envelope> {
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
            Agent::Movement(m) => self.movement(m.forward, m.turn, id).await,
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
            Agent::NavigationStart(start) => self.navigation_start(&start.name, id).await,
            Agent::NavigationCancel => Some(self.navigation_cancel(id).await),
            Agent::ConfigGet => {
                let config = lock(&self.shared.settings).snapshot();
                Some(messages::config_get_response(config, id))
            }
            Agent::ConfigUpdate(update) => Some(self.config_update(update, id).await),
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

    async fn movement(&mut self, forward: f64, turn: f64, id: &str) -> Option<Envelope> {
        let result = self
            .shared
            .controller
            .movement(&self.id, self.role, forward, turn)
            .await;
        result.err().map(|refusal| refusal_error(&refusal, id))
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
                Err(refusal) => refusal_error(&refusal, id),
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

    /// Token bucket over all messages of this session.
    fn within_budget(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if let Some(at) = self.budget_at {
            let refill = now.saturating_duration_since(at).as_secs_f64() * MESSAGE_RATE;
            self.budget = (self.budget + refill).min(MESSAGE_BURST);
        }
        self.budget_at = Some(now);
        if self.budget >= 1.0 {
            self.budget -= 1.0;
            true
        } else {
            false
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave these stores half-updated
    // (every change is applied after it is persisted), so poison is ignored.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn protocol_error(e: &ProtocolError, correlation: Option<&str>) -> Envelope {
    messages::error(e.code(), e.to_string(), None, correlation)
}

fn refusal_error(refusal: &Refusal, id: &str) -> Envelope {
    let mut extra = Vec::new();
    if let Refusal::EmergencyStop(_) = refusal {
        extra.push(("latched", Value::Bool(true)));
    }
    messages::error(
        ErrorCode::MovementFailed,
        refusal.to_string(),
        Some(details(refusal.reason(), &extra)),
        Some(id),
    )
}

fn nav_error(refusal: &NavRefusal, id: &str) -> Envelope {
    match refusal {
        NavRefusal::Refused(r) => refusal_error(r, id),
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
