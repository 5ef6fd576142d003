//! One owner for a session's life: opening, the events that change its record, and its end.
//!
//! Every path that starts or ends a session (an offer, a peer's `disconnected`, a socket
//! closing, a grant withdrawn, shutdown) goes through [`Sessions`], which keeps one order:
//! change the hub, then write the record, then tell the remaining ends. Whoever hears of an
//! end therefore finds the record already ended. A multi-node bus plugs in below the hub.

use std::sync::Arc;

use super::bus::{ConnId, Kick};
use super::hub::{EndedSession, Hub, OpenSession, RelayError, Route, SessionOpened};
use crate::store::{Role, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Relay(#[from] RelayError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a session ended, as written in its record (`end_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// An end said `disconnected` with reason `closed`, or its socket closed.
    Closed,
    Failed,
    Timeout,
    /// The subject's grant was withdrawn or lowered below the session's role.
    GrantRevoked,
    GrantChanged,
    ServerShutdown,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Closed => "closed",
            EndReason::Failed => "failed",
            EndReason::Timeout => "timeout",
            EndReason::GrantRevoked => "grant_revoked",
            EndReason::GrantChanged => "grant_changed",
            EndReason::ServerShutdown => "server_shutdown",
        }
    }
}

pub struct Sessions {
    hub: Arc<Hub>,
    store: Store,
    node_id: String,
}

impl Sessions {
    pub fn new(hub: Arc<Hub>, store: Store, node_id: String) -> Sessions {
        Sessions {
            hub,
            store,
            node_id,
        }
    }

    /// Checks the session rules, reserves the session and writes its record (a record that
    /// cannot be written undoes the reservation); returns the robot's socket, where the
    /// offer goes. A renegotiation offer within an existing session writes nothing.
    pub async fn open(
        &self,
        client_conn: &ConnId,
        request: OpenSession<'_>,
    ) -> Result<ConnId, SessionError> {
        match self.hub.open_session(client_conn, request)? {
            SessionOpened::Existing { robot_conn } => Ok(robot_conn),
            SessionOpened::New {
                record_id,
                robot_conn,
            } => {
                let written = self
                    .store
                    .start_session(
                        &record_id,
                        request.session_id,
                        request.robot_id,
                        request.subject,
                        request.role.as_str(),
                        &self.node_id,
                    )
                    .await;
                if let Err(e) = written {
                    self.hub.end_session(request.session_id);
                    return Err(e.into());
                }
                Ok(robot_conn)
            }
        }
    }

    /// Where a message about `session_id` from `sender` goes; only the two ends may talk.
    pub fn route(&self, sender: &ConnId, session_id: &str) -> Result<Route, RelayError> {
        self.hub.route(sender, session_id)
    }

    /// The robot said the WebRTC link is up.
    pub async fn connected(&self, route: &Route) -> Result<(), StoreError> {
        self.store.session_connected(&route.record_id).await
    }

    /// One end said `disconnected`: the session ends and its record is closed. The message
    /// itself is relayed by the caller, so no notice is queued here.
    pub async fn end_by_peer(&self, session_id: &str, reason: EndReason) -> Result<(), StoreError> {
        if let Some(ended) = self.hub.end_session(session_id) {
            self.store
                .end_session(&ended.record_id, reason.as_str())
                .await?;
        }
        Ok(())
    }

    /// A socket is gone: its sessions end, their records are closed, the other ends told.
    pub async fn detach(&self, conn: &ConnId) {
        let ended = self.hub.detach(conn);
        self.finish(&ended, EndReason::Closed).await;
    }

    /// `subject` may no longer hold what its sessions with `robot_id` gave it: those above
    /// the `allowed` role (all, when its grant is gone) end, both ends told why. Returns
    /// how many ended.
    pub async fn end_for_subject(
        &self,
        robot_id: &str,
        subject: &str,
        allowed: Option<Role>,
        reason: EndReason,
    ) -> Result<usize, StoreError> {
        let ended = self
            .hub
            .end_sessions_of(robot_id, subject, allowed, reason.as_str());
        for session in &ended {
            self.store
                .end_session(&session.record_id, reason.as_str())
                .await?;
        }
        self.hub.notify(&ended);
        Ok(ended.len())
    }

    /// Shutdown: every session ends (records first, then both ends are told), then every
    /// socket is closed. Returns the number of sockets asked to close.
    pub async fn shutdown(&self) -> usize {
        let ended = self.hub.end_all(EndReason::ServerShutdown.as_str());
        self.finish(&ended, EndReason::ServerShutdown).await;
        self.hub.close_all(Kick::Shutdown)
    }

    /// Closes the records of ended sessions, then delivers their notices.
    async fn finish(&self, ended: &[EndedSession], reason: EndReason) {
        for session in ended {
            if let Err(e) = self
                .store
                .end_session(&session.record_id, reason.as_str())
                .await
            {
                tracing::error!(session = %session.session_id, error = %e, "cannot end session record");
            }
        }
        self.hub.notify(ended);
    }
}
