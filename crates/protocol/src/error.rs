//! Error codes from the spec and the errors this crate reports.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Error codes of `signalling.error` and `agent.error`.
///
/// One enum holds the union of both schemas' lists so that the five generic
/// codes exist only once; [`ErrorCode::is_signalling`] and
/// [`ErrorCode::is_agent`] tell which message may carry a code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    // Shared by both categories.
    InvalidMessage,
    UnsupportedVersion,
    ValidationFailed,
    InvalidPayload,
    UnsupportedMessageType,
    CapabilityMismatch,
    InternalError,
    // Signalling only.
    ConnectionFailed,
    Unauthorized,
    Forbidden,
    Timeout,
    IceFailed,
    SdpInvalid,
    // Agent only.
    MovementFailed,
    LocationNotFound,
    LocationAlreadyExists,
    LocationStorageFull,
    LocationNameInvalid,
    NavigationAlreadyActive,
    NavigationNotActive,
    AgentUnavailable,
}

impl ErrorCode {
    /// All codes, in declaration order.
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::InvalidMessage,
        ErrorCode::UnsupportedVersion,
        ErrorCode::ValidationFailed,
        ErrorCode::InvalidPayload,
        ErrorCode::UnsupportedMessageType,
        ErrorCode::CapabilityMismatch,
        ErrorCode::InternalError,
        ErrorCode::ConnectionFailed,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::Timeout,
        ErrorCode::IceFailed,
        ErrorCode::SdpInvalid,
        ErrorCode::MovementFailed,
        ErrorCode::LocationNotFound,
        ErrorCode::LocationAlreadyExists,
        ErrorCode::LocationStorageFull,
        ErrorCode::LocationNameInvalid,
        ErrorCode::NavigationAlreadyActive,
        ErrorCode::NavigationNotActive,
        ErrorCode::AgentUnavailable,
    ];

    /// The wire spelling, e.g. `"INVALID_MESSAGE"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorCode::InvalidMessage => "INVALID_MESSAGE",
            ErrorCode::UnsupportedVersion => "UNSUPPORTED_VERSION",
            ErrorCode::ValidationFailed => "VALIDATION_FAILED",
            ErrorCode::InvalidPayload => "INVALID_PAYLOAD",
            ErrorCode::UnsupportedMessageType => "UNSUPPORTED_MESSAGE_TYPE",
            ErrorCode::CapabilityMismatch => "CAPABILITY_MISMATCH",
            ErrorCode::InternalError => "INTERNAL_ERROR",
            ErrorCode::ConnectionFailed => "CONNECTION_FAILED",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::Forbidden => "FORBIDDEN",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::IceFailed => "ICE_FAILED",
            ErrorCode::SdpInvalid => "SDP_INVALID",
            ErrorCode::MovementFailed => "MOVEMENT_FAILED",
            ErrorCode::LocationNotFound => "LOCATION_NOT_FOUND",
            ErrorCode::LocationAlreadyExists => "LOCATION_ALREADY_EXISTS",
            ErrorCode::LocationStorageFull => "LOCATION_STORAGE_FULL",
            ErrorCode::LocationNameInvalid => "LOCATION_NAME_INVALID",
            ErrorCode::NavigationAlreadyActive => "NAVIGATION_ALREADY_ACTIVE",
            ErrorCode::NavigationNotActive => "NAVIGATION_NOT_ACTIVE",
            ErrorCode::AgentUnavailable => "AGENT_UNAVAILABLE",
        }
    }

    /// Whether `signalling.error` may carry this code (its schema's enum).
    pub fn is_signalling(&self) -> bool {
        matches!(
            self,
            ErrorCode::InvalidMessage
                | ErrorCode::UnsupportedVersion
                | ErrorCode::ValidationFailed
                | ErrorCode::InvalidPayload
                | ErrorCode::UnsupportedMessageType
                | ErrorCode::CapabilityMismatch
                | ErrorCode::InternalError
                | ErrorCode::ConnectionFailed
                | ErrorCode::Unauthorized
                | ErrorCode::Forbidden
                | ErrorCode::Timeout
                | ErrorCode::IceFailed
                | ErrorCode::SdpInvalid
        )
    }

    /// Whether `agent.error` may carry this code (its schema's enum).
    pub fn is_agent(&self) -> bool {
        matches!(
            self,
            ErrorCode::InvalidMessage
                | ErrorCode::UnsupportedVersion
                | ErrorCode::ValidationFailed
                | ErrorCode::InvalidPayload
                | ErrorCode::UnsupportedMessageType
                | ErrorCode::CapabilityMismatch
                | ErrorCode::InternalError
                | ErrorCode::MovementFailed
                | ErrorCode::LocationNotFound
                | ErrorCode::LocationAlreadyExists
                | ErrorCode::LocationStorageFull
                | ErrorCode::LocationNameInvalid
                | ErrorCode::NavigationAlreadyActive
                | ErrorCode::NavigationNotActive
                | ErrorCode::AgentUnavailable
        )
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an incoming message was rejected.
///
/// Each variant corresponds to one generic spec code (see
/// [`ProtocolError::code`]) so a receiver can answer with a
/// `signalling.error` / `agent.error` without its own mapping table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// Not JSON, not an object, or no string `type`.
    #[error("invalid message: {0}")]
    InvalidMessage(String),
    /// The envelope breaks the common envelope schema.
    #[error("validation failed: {0}")]
    ValidationFailed(String),
    /// The payload does not match the schema of its message type.
    #[error("invalid payload: {0}")]
    InvalidPayload(String),
    /// The message type is not defined by the spec.
    #[error("unsupported message type: {0}")]
    UnsupportedType(String),
    /// The version's major number is not one this crate speaks.
    #[error("unsupported version: {0}")]
    UnsupportedVersion(String),
}

impl ProtocolError {
    /// The spec error code to report this error with.
    pub fn code(&self) -> ErrorCode {
        match self {
            ProtocolError::InvalidMessage(_) => ErrorCode::InvalidMessage,
            ProtocolError::ValidationFailed(_) => ErrorCode::ValidationFailed,
            ProtocolError::InvalidPayload(_) => ErrorCode::InvalidPayload,
            ProtocolError::UnsupportedType(_) => ErrorCode::UnsupportedMessageType,
            ProtocolError::UnsupportedVersion(_) => ErrorCode::UnsupportedVersion,
        }
    }
}
