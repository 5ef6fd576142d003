use serde_json::{json, Map, Value};
use signalling_protocol::{ErrorCode, ProtocolError};

use super::legacy::LegacyError;
use crate::identity::IdentityError;
use crate::relay::{RelayError, SessionError};
use crate::store::StoreError;

/// Everything that can go wrong with one message on a socket; mapped to the wire once, in
/// `code`, `details` and `close`.
#[derive(Debug, thiserror::Error)]
pub enum WsError {
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error("{0}")]
    Identity(#[from] IdentityError),
    #[error("{0}")]
    Relay(#[from] RelayError),
    #[error("no grant for robot {0}")]
    NoGrant(String),
    #[error("{message}")]
    Forbidden {
        reason: &'static str,
        message: &'static str,
    },
    #[error("{message}")]
    Unauthorized {
        reason: &'static str,
        message: &'static str,
    },
    #[error("too many messages; slow down")]
    RateLimited,
    #[error("too many errors or messages over the rate limit")]
    Flooding,
    #[error("too much relayed to that peer at once; slow down")]
    Throttled,
    #[error("frame larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("binary frames are not part of the protocol; send JSON text")]
    Binary,
    #[error("login not completed in time")]
    LoginTimeout,
    #[error("token expired")]
    TokenExpired,
    #[error("internal error")]
    Store(#[from] StoreError),
}

impl From<LegacyError> for WsError {
    fn from(e: LegacyError) -> Self {
        match e {
            LegacyError::ForeignFrom => WsError::Forbidden {
                reason: "foreign_from",
                message: "`from` names another connection",
            },
            LegacyError::Malformed(m) => ProtocolError::InvalidPayload(m).into(),
        }
    }
}

impl From<SessionError> for WsError {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::Relay(e) => e.into(),
            SessionError::NoGrant(robot) => WsError::NoGrant(robot),
            SessionError::Store(e) => e.into(),
        }
    }
}

impl WsError {
    pub fn code(&self) -> ErrorCode {
        match self {
            WsError::Protocol(e) => e.code(),
            WsError::Identity(e) if e.is_internal() => ErrorCode::InternalError,
            WsError::Identity(_) | WsError::Unauthorized { .. } | WsError::TokenExpired => {
                ErrorCode::Unauthorized
            }
            WsError::Relay(e) => e.code(),
            WsError::NoGrant(_)
            | WsError::Forbidden { .. }
            | WsError::RateLimited
            | WsError::Flooding
            | WsError::Throttled => ErrorCode::Forbidden,
            WsError::TooLarge { .. } | WsError::Binary => ErrorCode::InvalidMessage,
            WsError::LoginTimeout => ErrorCode::Timeout,
            WsError::Store(_) => ErrorCode::InternalError,
        }
    }

    pub fn details(&self) -> Option<Map<String, Value>> {
        let value = match self {
            WsError::Identity(e) => json!({ "reason": e.reason() }),
            WsError::Relay(e) => return Some(e.details()),
            WsError::NoGrant(robot) => json!({ "reason": "no_grant", "robotId": robot }),
            WsError::Forbidden { reason, .. } | WsError::Unauthorized { reason, .. } => {
                json!({ "reason": reason })
            }
            WsError::RateLimited | WsError::Flooding => json!({ "reason": "rate_limited" }),
            WsError::Throttled => return Some(RelayError::Throttled.details()),
            WsError::TooLarge { limit } => json!({ "reason": "frame_too_large", "limit": limit }),
            WsError::TokenExpired => json!({ "reason": "token_expired" }),
            _ => return None,
        };
        match value {
            Value::Object(map) => Some(map),
            _ => None,
        }
    }

    /// The close frame to send after the error, for errors that end the connection.
    pub fn close(&self) -> Option<(u16, &'static str)> {
        match self {
            WsError::Identity(e) if e.is_internal() => Some((1011, "internal error")),
            WsError::Identity(_) => Some((1008, "identity not proven")),
            WsError::LoginTimeout => Some((1008, "login timeout")),
            WsError::TokenExpired => Some((1008, "token expired")),
            WsError::Flooding => Some((1008, "rate limit exceeded")),
            WsError::TooLarge { .. } => Some((1009, "frame too large")),
            _ => None,
        }
    }
}
