//! What the relay says to its router, in its own terms: the cuts every node applies, a copy
//! of a session for the robot's node, a robot's socket elsewhere, a presence being written.

use std::time::Duration;

use tokio::sync::oneshot;

pub use crate::cluster::{MirrorSession, RemoteRobot};
use crate::delivery::Kick;
use crate::store::Role;

/// A cut of access that every node applies to its own sockets and sessions.
#[derive(Debug, Clone)]
pub enum Cut {
    /// Close the robot's sockets.
    Robot { robot_id: String, reason: Kick },
    /// Close the sockets logged in with any of these credentials.
    Credentials {
        credentials: Vec<String>,
        reason: Kick,
    },
    /// Close the sockets of a client token.
    Token { token_id: String },
    /// Stop the robot now.
    EmergencyStop { robot_id: String, subject: String },
    /// End the driving sessions with the robot (`preempted`).
    Preempt { robot_id: String },
    /// End the subject's sessions with the robot above the role `allowed` (all if none).
    SessionsOf {
        robot_id: String,
        subject: String,
        allowed: Option<Role>,
    },
}

/// Longest a robot's login waits for its presence to reach the other nodes.
const PRESENCE_WAIT: Duration = crate::cluster::PRESENCE_WAIT;

/// Resolves once every node can find a robot that came online here (bounded: a slow bus
/// delays the login, it does not block it).
#[derive(Debug)]
pub struct PresenceWritten(pub(super) oneshot::Receiver<()>);

impl PresenceWritten {
    pub async fn wait(self) {
        let _ = tokio::time::timeout(PRESENCE_WAIT, self.0).await;
    }
}
