//! The relay's errors, and how each reads on the wire (code and details), mapped here once:
//! a refusal made on another node reaches its socket the same way as one made here.

use serde_json::{json, Map, Value};
use signalling_protocol::ErrorCode;

use crate::messages::ViewerCap;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RelayError {
    #[error("connectionId {0} belongs to another connection")]
    ConnectionIdInUse(String),
    #[error("session {0} is bound to another robot")]
    SessionRobotMismatch(String),
    #[error("robot {0} is offline")]
    RobotOffline(String),
    #[error("robot {robot_id} is controlled by another session")]
    RobotBusy {
        robot_id: String,
        /// Who holds the control; shown only to the robot's owners.
        locked_by: Option<String>,
    },
    #[error("not a member of session {0}")]
    NotInSession(String),
    /// No live session has this id (it never existed, or ended and its grace is over).
    #[error("no session {0}")]
    UnknownSession(String),
    /// The session ended a moment ago and the sender was one of its ends: a late message,
    /// not an error (both ends send `disconnected` when the link drops).
    #[error("session {0} has ended")]
    Ended(String),
    #[error("at most {limit} sessions per connection")]
    TooManySessions { limit: usize },
    /// Viewing sessions are capped per subject and per robot, so viewers cannot take every
    /// place a robot has (its agent serves a bounded number of sessions).
    #[error("too many viewing sessions with robot {robot_id} ({})", per.as_str())]
    TooManyViewers { robot_id: String, per: ViewerCap },
    /// An ARP session with a robot that did not declare ARP when it registered: no ARP
    /// frame ever reaches it.
    #[error("robot {0} does not serve ARP")]
    ArpUnsupported(String),
    /// A message of one kind of session naming a session of the other kind.
    #[error("session {0} is not of this kind")]
    WrongSessionKind(String),
    /// The sender has its share of the receiver's queue filled: it must slow down (the
    /// receiver is left alone).
    #[error("too much relayed to that peer at once; slow down")]
    Throttled,
}

impl RelayError {
    pub fn code(&self) -> ErrorCode {
        match self {
            RelayError::RobotOffline(_) => ErrorCode::ConnectionFailed,
            _ => ErrorCode::Forbidden,
        }
    }

    pub fn details(&self) -> Map<String, Value> {
        let value = match self {
            RelayError::RobotOffline(robot) => {
                json!({ "reason": "robot_offline", "robotId": robot })
            }
            RelayError::RobotBusy {
                robot_id,
                locked_by,
            } => match locked_by {
                Some(holder) => {
                    json!({ "reason": "robot_busy", "robotId": robot_id, "lockedBy": holder })
                }
                None => json!({ "reason": "robot_busy", "robotId": robot_id }),
            },
            RelayError::ConnectionIdInUse(id) => {
                json!({ "reason": "connection_id_in_use", "connectionId": id })
            }
            RelayError::SessionRobotMismatch(id) => {
                json!({ "reason": "session_robot_mismatch", "connectionId": id })
            }
            RelayError::NotInSession(id)
            | RelayError::UnknownSession(id)
            | RelayError::Ended(id) => {
                json!({ "reason": "not_in_session", "connectionId": id })
            }
            RelayError::TooManySessions { limit } => {
                json!({ "reason": "too_many_sessions", "limit": limit })
            }
            RelayError::TooManyViewers { robot_id, per } => {
                json!({ "reason": "too_many_viewers", "robotId": robot_id, "per": per.as_str() })
            }
            RelayError::Throttled => json!({ "reason": "relay_throttled" }),
            RelayError::ArpUnsupported(robot) => {
                json!({ "reason": "arp_unsupported", "robotId": robot })
            }
            RelayError::WrongSessionKind(id) => {
                json!({ "reason": "wrong_session_kind", "connectionId": id })
            }
        };
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Relay(#[from] RelayError),
    #[error("no grant for robot {0}")]
    NoGrant(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}
