//! What the gateway decides itself, before the robot sees a frame: which methods a role may
//! call, how many calls a connection may make, and the JSON-RPC errors it answers with.

use serde_json::{json, Value};
use signalling_protocol::arp::{method, reason, ArpCode};
use signalling_protocol::arp_schema::ArpValidator;
use signalling_protocol::Role;

use crate::relay::{RelayError, SessionError};

/// Tool calls per second a connection may start (ARP §9), sustained and at once.
pub const CALLS_PER_SECOND: u64 = 50;
pub const CALL_BURST: u64 = 100;
/// Tool calls a connection may have running at once.
pub const CONCURRENT_CALLS: usize = 16;
/// Requests of any kind a connection may have unanswered at once.
pub const PENDING_REQUESTS: usize = 256;

/// What a viewer may ask: read, watch, and stop the robot (anyone may e-stop).
const VIEWER_METHODS: &[&str] = &[
    method::INITIALIZE,
    method::SHUTDOWN,
    method::LIST_TOOLS,
    method::LIST_CONTEXT,
    method::SUBSCRIBE_CONTEXT,
    method::UNSUBSCRIBE_CONTEXT,
    method::LIST_CONSTRAINTS,
    method::GET_CONSTRAINT,
    method::EMERGENCY_STOP,
];

/// A request or notification that is not ARP 0.1.0: its JSON-RPC error.
pub fn check_request(id: &Value, method: &str, frame: &Value) -> Option<Value> {
    let validator = ArpValidator::shared();
    if !validator.knows(method) {
        return Some(error(
            id,
            ArpCode::MethodNotFound,
            &format!("{method} is not a method of ARP 0.1.0"),
            None,
        ));
    }
    let envelope = if frame.get("id").is_some() {
        "request"
    } else {
        "notification"
    };
    if let Err(e) = validator.check(envelope, frame) {
        return Some(error(id, ArpCode::InvalidRequest, &e, None));
    }
    let empty = json!({});
    let params = frame.get("params").unwrap_or(&empty);
    validator
        .check(&format!("{method}.params"), params)
        .err()
        .map(|e| error(id, ArpCode::InvalidParams, &e, None))
}

/// Whether `role` may call `method` (operators and owners may call everything).
pub fn allowed(role: Role, method: &str) -> bool {
    role.may_drive() || VIEWER_METHODS.contains(&method)
}

/// A JSON-RPC error response, with `data.reason` when given.
pub fn error(id: &Value, code: ArpCode, message: &str, data: Option<Value>) -> Value {
    let mut error = json!({ "code": code.code(), "message": message });
    if let Some(data) = data {
        error["data"] = data;
    }
    json!({ "jsonrpc": "2.0", "id": id, "error": error })
}

pub fn forbidden(id: &Value, method: &str, role: Role) -> Value {
    error(
        id,
        ArpCode::SafetyViolation,
        &format!("a {} may not call {method}", role.as_str()),
        Some(json!({ "reason": reason::FORBIDDEN, "role": role.as_str() })),
    )
}

pub fn rate_limited(id: &Value, what: &str) -> Value {
    error(
        id,
        ArpCode::SafetyViolation,
        &format!("too many {what}; slow down"),
        Some(json!({ "reason": reason::RATE_LIMITED })),
    )
}

/// An internal error the caller can act on, named by `data.reason`.
pub fn internal(id: &Value, why: &str, message: &str) -> Value {
    error(
        id,
        ArpCode::InternalError,
        message,
        Some(json!({ "reason": why })),
    )
}

/// The JSON-RPC error for a session the relay would not open.
pub fn refusal(id: &Value, refused: &SessionError) -> Value {
    match refused {
        SessionError::Relay(RelayError::RobotOffline(robot)) => error(
            id,
            ArpCode::InternalError,
            &format!("robot {robot} is offline"),
            Some(json!({ "reason": reason::ROBOT_OFFLINE, "robotId": robot })),
        ),
        SessionError::Relay(RelayError::RobotBusy {
            robot_id,
            locked_by,
        }) => {
            let mut data = json!({ "reason": reason::ROBOT_BUSY, "robotId": robot_id });
            if let Some(holder) = locked_by {
                data["lockedBy"] = json!(holder);
            }
            error(id, ArpCode::ToolBusy, &refused.to_string(), Some(data))
        }
        SessionError::Relay(e) => {
            let details = e.details();
            let why = details
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or("refused");
            internal(id, why, &e.to_string())
        }
        SessionError::NoGrant(_) => forbidden(id, method::INITIALIZE, Role::Viewer),
        SessionError::Store(e) => {
            tracing::error!(error = %e, "cannot open an ARP session");
            internal(id, "internal", "internal error")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn viewers_read_and_stop_only() {
        for m in [
            method::LIST_TOOLS,
            method::SUBSCRIBE_CONTEXT,
            method::EMERGENCY_STOP,
        ] {
            assert!(allowed(Role::Viewer, m));
        }
        for m in [
            method::CALL_TOOL,
            method::CANCEL_TOOL,
            method::SET_WORKSPACE,
        ] {
            assert!(!allowed(Role::Viewer, m));
            assert!(allowed(Role::Operator, m));
            assert!(allowed(Role::Owner, m));
        }
    }
}
