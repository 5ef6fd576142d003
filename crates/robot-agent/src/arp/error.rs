//! Errors of the ARP layer, each mapped once to the spec's code and the
//! `data` a client sees (arp-0.1.0.md §6, arp-contract.md).

use serde_json::{json, Map, Value};
use signalling_protocol::arp::{reason, ArpCode};

use crate::controller::NavRefusal;
use crate::safety::Refusal;

/// Why a request failed. `Display` is the message a client reads; the
/// variant decides the code and `data`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArpError {
    #[error("parse error: {0}")]
    Parse(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("method not found: {0}")]
    MethodNotFound(String),
    #[error("invalid params: {message}")]
    InvalidParams {
        /// Path of the offending field (`arguments.durationSecs`).
        field: Option<String>,
        message: String,
    },
    #[error("internal error")]
    Internal,
    #[error("not initialized: call arp.initialize first")]
    NotInitialized,
    #[error("a {0} may not do this")]
    Forbidden(&'static str),
    #[error("another operator controls the robot")]
    RobotBusy,
    #[error("safety violation: {message}")]
    Violation {
        constraint: String,
        message: String,
        requested: Value,
        limit: Value,
    },
    #[error("too many requests; the limit is {0} per second")]
    RateLimited(u32),
    #[error("precondition failed: {0}")]
    Precondition(String),
    #[error("tool not found: {0}")]
    ToolNotFound(String),
    #[error("tool busy: call {active} is running")]
    ToolBusy { active: String },
    #[error("emergency stopped: {0}")]
    EmergencyStopped(String),
    #[error("confirmation timed out after {0} s")]
    ConfirmationTimeout(f64),
    #[error("confirmation denied by {0}")]
    ConfirmationDenied(String),
    #[error("context source not found: {0}")]
    ContextNotFound(String),
    /// The tool ran and failed (e.g. navigation aborted by the driver).
    #[error("tool failed: {0}")]
    ToolFailed(String),
}

impl ArpError {
    pub fn code(&self) -> ArpCode {
        match self {
            ArpError::Parse(_) => ArpCode::ParseError,
            ArpError::InvalidRequest(_) => ArpCode::InvalidRequest,
            ArpError::MethodNotFound(_) => ArpCode::MethodNotFound,
            ArpError::InvalidParams { .. } => ArpCode::InvalidParams,
            ArpError::Internal | ArpError::ToolFailed(_) => ArpCode::InternalError,
            ArpError::NotInitialized => ArpCode::NotInitialized,
            ArpError::Forbidden(_) | ArpError::Violation { .. } | ArpError::RateLimited(_) => {
                ArpCode::SafetyViolation
            }
            ArpError::RobotBusy | ArpError::ToolBusy { .. } => ArpCode::ToolBusy,
            ArpError::Precondition(_) => ArpCode::PreconditionFailed,
            ArpError::ToolNotFound(_) => ArpCode::ToolNotFound,
            ArpError::EmergencyStopped(_) => ArpCode::EmergencyStopped,
            ArpError::ConfirmationTimeout(_) => ArpCode::ConfirmationTimeout,
            ArpError::ConfirmationDenied(_) => ArpCode::ConfirmationDenied,
            ArpError::ContextNotFound(_) => ArpCode::ContextNotFound,
        }
    }

    /// The error's `data` (before a call's `callId`/`state` are added).
    pub fn data(&self) -> Map<String, Value> {
        let value = match self {
            ArpError::InvalidParams {
                field: Some(field), ..
            } => json!({ "field": field }),
            ArpError::Forbidden(role) => json!({ "reason": reason::FORBIDDEN, "role": role }),
            ArpError::RobotBusy => json!({ "reason": reason::ROBOT_BUSY }),
            ArpError::Violation {
                constraint,
                requested,
                limit,
                ..
            } => json!({ "constraint": constraint, "requested": requested, "limit": limit }),
            ArpError::RateLimited(limit) => json!({
                "reason": reason::RATE_LIMITED,
                "constraint": "rate_limit",
                "limit": limit,
            }),
            ArpError::ToolBusy { active } => json!({ "activeCallId": active }),
            ArpError::EmergencyStopped(why) => json!({ "reason": "emergency_stop", "detail": why }),
            ArpError::ConfirmationDenied(by) => json!({ "confirmedBy": by }),
            _ => json!({}),
        };
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    /// The JSON-RPC `error` object; `extra` is merged into `data`.
    pub fn to_json(&self, extra: Option<Map<String, Value>>) -> Value {
        let mut data = self.data();
        if let Some(extra) = extra {
            data.extend(extra);
        }
        let mut error = json!({ "code": self.code().code(), "message": self.to_string() });
        if !data.is_empty() {
            error["data"] = Value::Object(data);
        }
        error
    }

    /// A params error from a serde path error: names the field.
    pub fn params<E: std::fmt::Display>(
        prefix: &str,
        error: serde_path_to_error::Error<E>,
    ) -> ArpError {
        let path = error.path().to_string();
        let inner = error.inner().to_string();
        // serde names a missing or unknown field in the message, not the path.
        let named = inner
            .split('`')
            .nth(1)
            .filter(|_| inner.starts_with("missing field") || inner.starts_with("unknown field"));
        let field = match (path.as_str(), named) {
            (".", Some(name)) => name.to_owned(),
            (".", None) => String::new(),
            // An unknown field is already the last step of the path.
            (p, Some(name)) if p != name && !p.ends_with(&format!(".{name}")) => {
                format!("{p}.{name}")
            }
            (p, _) => p.to_owned(),
        };
        let field = match (prefix.is_empty(), field.is_empty()) {
            (true, _) => field,
            (false, true) => prefix.to_owned(),
            (false, false) => format!("{prefix}.{field}"),
        };
        ArpError::InvalidParams {
            message: if field.is_empty() {
                inner
            } else {
                format!("{field}: {inner}")
            },
            field: (!field.is_empty()).then_some(field),
        }
    }
}

impl From<Refusal> for ArpError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Forbidden(role) => ArpError::Forbidden(role),
            Refusal::EmergencyStop(why) => ArpError::EmergencyStopped(why),
            Refusal::RateLimited(limit) => ArpError::RateLimited(limit),
            Refusal::DriverUnavailable => {
                ArpError::Precondition("the driver is not available".into())
            }
            Refusal::DriverBusy => {
                ArpError::Precondition("the driver cannot keep up with commands".into())
            }
            Refusal::RobotBusy => ArpError::RobotBusy,
        }
    }
}

impl From<NavRefusal> for ArpError {
    fn from(refusal: NavRefusal) -> Self {
        match refusal {
            NavRefusal::Refused(r) => r.into(),
            NavRefusal::AlreadyActive(name) => {
                ArpError::Precondition(format!("already navigating to {name:?}"))
            }
            NavRefusal::NotActive => ArpError::Precondition("no navigation in progress".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Drive {
        linear: f64,
        inner: Option<Inner>,
    }
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        x: f64,
    }

    fn parse(v: Value) -> ArpError {
        match serde_path_to_error::deserialize::<_, Drive>(v) {
            Ok(_) => panic!("parsed"),
            Err(e) => ArpError::params("arguments", e),
        }
    }

    #[test]
    fn params_errors_name_the_field() {
        let field = |e: ArpError| match e {
            ArpError::InvalidParams { field, .. } => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(parse(json!({}))).as_deref(), Some("arguments.linear"));
        assert_eq!(
            field(parse(json!({"linear": "fast"}))).as_deref(),
            Some("arguments.linear")
        );
        assert_eq!(
            field(parse(json!({"linear": 1, "inner": {"x": true}}))).as_deref(),
            Some("arguments.inner.x")
        );
        assert_eq!(
            field(parse(json!({"linear": 1, "speed": 2}))).as_deref(),
            Some("arguments.speed")
        );
    }

    #[test]
    fn codes_and_data() {
        let e = ArpError::Forbidden("viewer").to_json(None);
        assert_eq!(e["code"], -40001);
        assert_eq!(e["data"]["reason"], "forbidden");
        assert_eq!(ArpError::RobotBusy.to_json(None)["code"], -40004);
        assert_eq!(
            ArpError::RobotBusy.to_json(None)["data"]["reason"],
            "robot_busy"
        );
        assert!(ArpError::Internal.to_json(None).get("data").is_none());
    }
}
