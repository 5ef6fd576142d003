//! The typed content of a message: which family it belongs to, and the
//! per-type rules (correlation, payload) that sit above the envelope.

use serde_json::Value;

use crate::agent::Agent;
use crate::error::ProtocolError;
use crate::signalling::Signalling;

/// Every message type of the spec's `schemas/index.json`.
pub const MESSAGE_TYPES: &[&str] = &[
    "signalling.answer",
    "signalling.capabilities",
    "signalling.connected",
    "signalling.disconnected",
    "signalling.error",
    "signalling.ice_candidate",
    "signalling.offer",
    "signalling.ping",
    "signalling.pong",
    "signalling.pki_challenge",
    "signalling.pki_response",
    "signalling.pki_verified",
    "signalling.register",
    "signalling.welcome",
    "agent.capabilities",
    "agent.config.get",
    "agent.config.get.response",
    "agent.config.response",
    "agent.config.update",
    "agent.error",
    "agent.location.create",
    "agent.location.delete",
    "agent.location.list",
    "agent.location.response",
    "agent.location.update",
    "agent.movement",
    "agent.navigation.cancel",
    "agent.navigation.response",
    "agent.navigation.start",
    "agent.ping",
    "agent.pong",
];

/// Whether the schema of `kind` lists `correlationId` as required: replies,
/// and the config commands, which the spec ties to a request id.
pub fn requires_correlation_id(kind: &str) -> bool {
    matches!(
        kind,
        "signalling.pki_response"
            | "signalling.pki_verified"
            | "signalling.pong"
            | "agent.pong"
            | "agent.location.response"
            | "agent.navigation.response"
            | "agent.config.update"
            | "agent.config.response"
            | "agent.config.get"
            | "agent.config.get.response"
    )
}

/// A decoded message of either family.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Signalling(Signalling),
    Agent(Agent),
}

impl Body {
    /// The `type` string on the wire, e.g. `"signalling.offer"`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Body::Signalling(s) => s.type_name(),
            Body::Agent(a) => a.type_name(),
        }
    }

    /// The payload as JSON, `None` for types sent without one.
    pub fn payload(&self) -> Option<Value> {
        match self {
            Body::Signalling(s) => s.payload(),
            Body::Agent(a) => a.payload(),
        }
    }

    /// Schema rules beyond the payload's shape (ranges, patterns, ...).
    pub fn validate(&self) -> Result<(), ProtocolError> {
        match self {
            Body::Signalling(s) => s.validate(),
            Body::Agent(a) => a.validate(),
        }
    }

    /// Decodes and validates the payload of message type `kind`.
    pub(crate) fn decode(kind: &str, payload: Option<&Value>) -> Result<Body, ProtocolError> {
        let body = if let Some(decoded) = Signalling::decode(kind, payload) {
            Body::Signalling(decoded?)
        } else if let Some(decoded) = Agent::decode(kind, payload) {
            Body::Agent(decoded?)
        } else {
            return Err(ProtocolError::UnsupportedType(kind.to_owned()));
        };
        body.validate()?;
        Ok(body)
    }
}

impl From<Signalling> for Body {
    fn from(s: Signalling) -> Self {
        Body::Signalling(s)
    }
}

impl From<Agent> for Body {
    fn from(a: Agent) -> Self {
        Body::Agent(a)
    }
}
