//! `agent.*` messages (spec `schemas/agent/v0/`): robot control sent over
//! the WebRTC data channel, plus the shared location definition
//! (`schemas/common/v0/location.json`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::common::{
    check_finite, check_unit_range, decode, encode, CapabilitiesPayload, EmptyPayload, ErrorPayload,
};
use crate::error::ProtocolError;

/// Payload of `agent.movement`: normalised velocities in `[-1, 1]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MovementPayload {
    pub forward: f64,
    pub turn: f64,
}

impl MovementPayload {
    /// Range and finiteness checks, which serde cannot express; a robot must
    /// never act on an out-of-range command.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        check_unit_range("forward", self.forward)?;
        check_unit_range("turn", self.turn)
    }
}

/// A named saved position (`common/v0/location.json`); also the payload of
/// `agent.location.create` and `agent.location.update`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Location {
    pub name: String,
    pub position: Position,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orientation: Option<Orientation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

impl Location {
    /// Rejects non-finite coordinates, which JSON cannot carry.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        let p = &self.position;
        check_finite("position.x", p.x)?;
        check_finite("position.y", p.y)?;
        if let Some(z) = p.z {
            check_finite("position.z", z)?;
        }
        if let Some(o) = &self.orientation {
            for (field, angle) in [
                ("orientation.yaw", o.yaw),
                ("orientation.pitch", o.pitch),
                ("orientation.roll", o.roll),
            ] {
                if let Some(angle) = angle {
                    check_finite(field, angle)?;
                }
            }
        }
        Ok(())
    }
}

/// Coordinates of a location; `z` is optional for 2D maps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Position {
    pub x: f64,
    pub y: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub z: Option<f64>,
}

/// Orientation of a location, angles in radians, each optional.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Orientation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yaw: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pitch: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roll: Option<f64>,
}

/// Payload of `agent.location.delete`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocationDeletePayload {
    pub name: String,
}

/// Which location command an `agent.location.response` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LocationOperation {
    Create,
    List,
    Update,
    Delete,
}

/// Payload of `agent.location.response`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocationResponsePayload {
    pub operation: LocationOperation,
    /// Required when `operation` is `list` (the schema's if/then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locations: Option<Vec<Location>>,
}

impl LocationResponsePayload {
    /// Enforces the schema's "list requires locations" rule.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        if self.operation == LocationOperation::List && self.locations.is_none() {
            return Err(ProtocolError::InvalidPayload(
                "locations: required when operation is \"list\"".into(),
            ));
        }
        self.locations
            .iter()
            .flatten()
            .try_for_each(Location::validate)
    }
}

/// Payload of `agent.navigation.start`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NavigationStartPayload {
    /// Name of the saved location to drive to.
    pub name: String,
}

/// Progress of a navigation, per `agent.navigation.response`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NavigationStatus {
    Started,
    Completed,
    Cancelled,
    Failed,
}

/// Payload of `agent.navigation.response`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NavigationResponsePayload {
    pub status: NavigationStatus,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Payload of `agent.config.update`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigUpdatePayload {
    pub key: String,
    /// Any JSON (including `null`); the agent validates it per key.
    /// `deserialize_with` makes a missing `value` an error instead of `null`.
    #[serde(deserialize_with = "Value::deserialize")]
    pub value: Value,
}

impl ConfigUpdatePayload {
    /// The schema's `minLength: 1` on `key`.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        if self.key.is_empty() {
            return Err(ProtocolError::InvalidPayload(
                "key: must not be empty".into(),
            ));
        }
        Ok(())
    }
}

/// Payload of `agent.config.response`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigResponsePayload {
    pub key: String,
    pub applied: bool,
    pub restart_required: bool,
}

/// Payload of `agent.config.get.response`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigGetResponsePayload {
    /// Flat map of every user-settable key to its current value.
    pub config: Map<String, Value>,
}

/// One variant per `agent.*` message type.
#[derive(Debug, Clone, PartialEq)]
pub enum Agent {
    Movement(MovementPayload),
    Capabilities(CapabilitiesPayload),
    Error(ErrorPayload),
    Ping,
    Pong,
    LocationCreate(Location),
    /// Sent with an empty object payload, which the schema requires.
    LocationList,
    LocationUpdate(Location),
    LocationDelete(LocationDeletePayload),
    LocationResponse(LocationResponsePayload),
    NavigationStart(NavigationStartPayload),
    /// Sent with an empty object payload, which the schema requires.
    NavigationCancel,
    NavigationResponse(NavigationResponsePayload),
    ConfigUpdate(ConfigUpdatePayload),
    ConfigResponse(ConfigResponsePayload),
    ConfigGet,
    ConfigGetResponse(ConfigGetResponsePayload),
}

impl Agent {
    /// The `type` string on the wire, e.g. `"agent.movement"`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Agent::Movement(_) => "agent.movement",
            Agent::Capabilities(_) => "agent.capabilities",
            Agent::Error(_) => "agent.error",
            Agent::Ping => "agent.ping",
            Agent::Pong => "agent.pong",
            Agent::LocationCreate(_) => "agent.location.create",
            Agent::LocationList => "agent.location.list",
            Agent::LocationUpdate(_) => "agent.location.update",
            Agent::LocationDelete(_) => "agent.location.delete",
            Agent::LocationResponse(_) => "agent.location.response",
            Agent::NavigationStart(_) => "agent.navigation.start",
            Agent::NavigationCancel => "agent.navigation.cancel",
            Agent::NavigationResponse(_) => "agent.navigation.response",
            Agent::ConfigUpdate(_) => "agent.config.update",
            Agent::ConfigResponse(_) => "agent.config.response",
            Agent::ConfigGet => "agent.config.get",
            Agent::ConfigGetResponse(_) => "agent.config.get.response",
        }
    }

    /// Decodes the payload of an `agent.*` type; `None` if the type is not
    /// one of them. Payloads of ping/pong/config.get are ignored (the schema
    /// allows any object and gives it no meaning).
    pub(crate) fn decode(
        kind: &str,
        payload: Option<&Value>,
    ) -> Option<Result<Self, ProtocolError>> {
        let decoded = match kind {
            "agent.movement" => decode(kind, payload).map(Agent::Movement),
            "agent.capabilities" => decode(kind, payload).map(Agent::Capabilities),
            "agent.error" => decode(kind, payload).map(Agent::Error),
            "agent.ping" => Ok(Agent::Ping),
            "agent.pong" => Ok(Agent::Pong),
            "agent.location.create" => decode(kind, payload).map(Agent::LocationCreate),
            "agent.location.list" => {
                decode::<EmptyPayload>(kind, payload).map(|_| Agent::LocationList)
            }
            "agent.location.update" => decode(kind, payload).map(Agent::LocationUpdate),
            "agent.location.delete" => decode(kind, payload).map(Agent::LocationDelete),
            "agent.location.response" => decode(kind, payload).map(Agent::LocationResponse),
            "agent.navigation.start" => decode(kind, payload).map(Agent::NavigationStart),
            "agent.navigation.cancel" => {
                decode::<EmptyPayload>(kind, payload).map(|_| Agent::NavigationCancel)
            }
            "agent.navigation.response" => decode(kind, payload).map(Agent::NavigationResponse),
            "agent.config.update" => decode(kind, payload).map(Agent::ConfigUpdate),
            "agent.config.response" => decode(kind, payload).map(Agent::ConfigResponse),
            "agent.config.get" => Ok(Agent::ConfigGet),
            "agent.config.get.response" => decode(kind, payload).map(Agent::ConfigGetResponse),
            _ => return None,
        };
        Some(decoded)
    }

    /// The payload as JSON: `None` for ping/pong/config.get, `{}` for
    /// location.list and navigation.cancel (their schemas require it).
    pub fn payload(&self) -> Option<Value> {
        Some(match self {
            Agent::Movement(p) => encode(p),
            Agent::Capabilities(p) => encode(p),
            Agent::Error(p) => encode(p),
            Agent::Ping | Agent::Pong | Agent::ConfigGet => return None,
            Agent::LocationCreate(p) | Agent::LocationUpdate(p) => encode(p),
            Agent::LocationList | Agent::NavigationCancel => Value::Object(Map::new()),
            Agent::LocationDelete(p) => encode(p),
            Agent::LocationResponse(p) => encode(p),
            Agent::NavigationStart(p) => encode(p),
            Agent::NavigationResponse(p) => encode(p),
            Agent::ConfigUpdate(p) => encode(p),
            Agent::ConfigResponse(p) => encode(p),
            Agent::ConfigGetResponse(p) => encode(p),
        })
    }

    /// Schema rules serde cannot express (ranges, patterns, conditional
    /// requirements, the agent subset of error codes).
    pub fn validate(&self) -> Result<(), ProtocolError> {
        match self {
            Agent::Movement(p) => p.validate(),
            Agent::Capabilities(p) => p.validate(),
            Agent::Error(p) if !p.code.is_agent() => Err(ProtocolError::InvalidPayload(format!(
                "code: {} is not an agent error code",
                p.code
            ))),
            Agent::LocationCreate(p) | Agent::LocationUpdate(p) => p.validate(),
            Agent::LocationResponse(p) => p.validate(),
            Agent::ConfigUpdate(p) => p.validate(),
            _ => Ok(()),
        }
    }
}
