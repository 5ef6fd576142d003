//! Builders of the `agent.*` messages the robot sends, so every reply is a
//! typed protocol value (and therefore schema-shaped) rather than ad-hoc JSON.

use serde_json::{Map, Value};
use signalling_protocol::{
    Agent, CapabilitiesPayload, ConfigGetResponsePayload, ConfigResponsePayload, Envelope,
    ErrorCode, ErrorPayload, Location, LocationOperation, LocationResponsePayload,
    NavigationResponsePayload, NavigationStatus, PROTOCOL_VERSION, SUPPORTED_VERSIONS,
};

use crate::video::CameraStatus;

fn message(body: Agent, correlation: Option<&str>) -> Envelope {
    let envelope = Envelope::from_body(body, PROTOCOL_VERSION);
    match correlation {
        Some(id) => envelope.with_correlation(id),
        None => envelope,
    }
}

/// Sent when the data channel opens: the versions this agent speaks, and
/// its cameras in `meta.cameras` (the payload schema is closed; the
/// envelope's `meta` is where extra facts go) with whether each is
/// available now.
pub fn capabilities(cameras: &[CameraStatus]) -> Envelope {
    let envelope = message(
        Agent::Capabilities(CapabilitiesPayload {
            versions: SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
        }),
        None,
    );
    let mut meta = Map::new();
    meta.insert(
        CAMERAS_META_KEY.into(),
        serde_json::to_value(cameras).unwrap_or(Value::Array(Vec::new())),
    );
    envelope.with_meta(meta)
}

/// Key of `agent.capabilities` `meta` listing the robot's cameras.
pub const CAMERAS_META_KEY: &str = "cameras";

/// `agent.error` `AGENT_UNAVAILABLE` for a camera that cannot stream (the
/// session goes on without its video).
pub fn camera_unavailable(camera: &CameraStatus) -> Envelope {
    let reason = camera.error.clone().unwrap_or_default();
    error(
        ErrorCode::AgentUnavailable,
        format!("camera {:?} is unavailable: {reason}", camera.name),
        Some(details(
            "camera_unavailable",
            &[
                ("camera", Value::String(camera.name.clone())),
                ("error", Value::String(reason)),
            ],
        )),
        None,
    )
}

pub fn pong(correlation: &str) -> Envelope {
    message(Agent::Pong, Some(correlation))
}

/// `agent.error`; `code` must be one of the agent codes.
pub fn error(
    code: ErrorCode,
    text: impl Into<String>,
    details: Option<Map<String, Value>>,
    correlation: Option<&str>,
) -> Envelope {
    debug_assert!(code.is_agent(), "{code} is not an agent error code");
    let code = if code.is_agent() {
        code
    } else {
        ErrorCode::InternalError
    };
    message(
        Agent::Error(ErrorPayload {
            code,
            message: text.into(),
            details,
        }),
        correlation,
    )
}

pub fn location_response(
    operation: LocationOperation,
    locations: Option<Vec<Location>>,
    correlation: &str,
) -> Envelope {
    message(
        Agent::LocationResponse(LocationResponsePayload {
            operation,
            locations,
        }),
        Some(correlation),
    )
}

pub fn navigation_response(
    status: NavigationStatus,
    name: &str,
    text: Option<String>,
    correlation: &str,
) -> Envelope {
    message(
        Agent::NavigationResponse(NavigationResponsePayload {
            status,
            name: name.to_owned(),
            message: text,
        }),
        Some(correlation),
    )
}

pub fn config_response(key: &str, restart_required: bool, correlation: &str) -> Envelope {
    message(
        Agent::ConfigResponse(ConfigResponsePayload {
            key: key.to_owned(),
            applied: true,
            restart_required,
        }),
        Some(correlation),
    )
}

pub fn config_get_response(config: Map<String, Value>, correlation: &str) -> Envelope {
    message(
        Agent::ConfigGetResponse(ConfigGetResponsePayload { config }),
        Some(correlation),
    )
}

/// `{"reason": reason, ...extra}` for `details`.
pub fn details(reason: &str, extra: &[(&str, Value)]) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("reason".into(), Value::String(reason.to_owned()));
    for (k, v) in extra {
        map.insert((*k).to_owned(), v.clone());
    }
    map
}
