//! Payload shapes shared by the `signalling.*` and `agent.*` families, and
//! small helpers used by both.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{ErrorCode, ProtocolError};

/// Payload of `signalling.error` and `agent.error` (same shape, different
/// allowed codes: see [`ErrorCode::is_signalling`] / [`ErrorCode::is_agent`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorPayload {
    pub code: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Map<String, Value>>,
}

impl ErrorPayload {
    /// An error without details.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: None,
        }
    }
}

impl From<&ProtocolError> for ErrorPayload {
    /// Lets a receiver answer a rejected message with the matching code.
    fn from(err: &ProtocolError) -> Self {
        Self::new(err.code(), err.to_string())
    }
}

/// Payload of `signalling.capabilities` and `agent.capabilities`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapabilitiesPayload {
    /// Supported protocol versions, each `MAJOR.MINOR`.
    pub versions: Vec<String>,
}

impl CapabilitiesPayload {
    /// Checks the `MAJOR.MINOR` pattern of every entry, which serde cannot.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        match self.versions.iter().find(|v| !is_major_minor(v)) {
            Some(bad) => Err(ProtocolError::InvalidPayload(format!(
                "versions: {bad:?} is not MAJOR.MINOR"
            ))),
            None => Ok(()),
        }
    }
}

/// The empty object required by `agent.location.list` and
/// `agent.navigation.cancel` (`additionalProperties: false`, no properties).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EmptyPayload {}

/// `^[0-9]+\.[0-9]+$`, the spec's version pattern.
pub(crate) fn is_major_minor(s: &str) -> bool {
    match s.split_once('.') {
        Some((major, minor)) => is_digits(major) && is_digits(minor),
        None => false,
    }
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Deserialises a required payload, naming the message type in errors.
pub(crate) fn decode<T: DeserializeOwned>(
    kind: &str,
    payload: Option<&Value>,
) -> Result<T, ProtocolError> {
    let value = payload
        .ok_or_else(|| ProtocolError::InvalidPayload(format!("{kind}: payload is required")))?;
    T::deserialize(value).map_err(|e| ProtocolError::InvalidPayload(format!("{kind}: {e}")))
}

/// Serialises a payload struct; only plain data is involved, so this cannot
/// fail (non-finite floats become `null` and are caught by `validate`).
pub(crate) fn encode<T: Serialize>(payload: &T) -> Value {
    serde_json::to_value(payload).unwrap_or(Value::Null)
}

/// Checks that a number is finite and within `[-1, 1]`.
pub(crate) fn check_unit_range(field: &str, value: f64) -> Result<(), ProtocolError> {
    if value.is_finite() && (-1.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(ProtocolError::InvalidPayload(format!(
            "{field}: {value} is outside [-1, 1]"
        )))
    }
}

/// Checks that a number can be written as JSON.
pub(crate) fn check_finite(field: &str, value: f64) -> Result<(), ProtocolError> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(ProtocolError::InvalidPayload(format!(
            "{field}: {value} is not a finite number"
        )))
    }
}
