//! One owner for a session's life: opening, the events that change its record, and its end.
//!
//! Every path that starts or ends a session (an offer, a peer's `disconnected`, a socket
//! closing, a grant withdrawn, shutdown) goes through [`Sessions`], which keeps one order:
//! change the hub, then write the record, then tell the remaining ends. Whoever hears of an
//! end therefore finds the record already ended. A multi-node bus plugs in below the hub.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::bus::{ConnId, Kick, Outbound};
use super::hub::{EndedSession, GrantScope, Hub, OpenSession, RelayError, Route, SessionOpened};
use crate::cluster::message::Refusal;
use crate::cluster::{Cluster, ClusterError, Control, LockOutcome, MirrorSession};
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
    /// The node holding the other end died (its heartbeat lease expired).
    NodeDown,
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
            EndReason::NodeDown => "node_down",
        }
    }
}

/// A control lock this node holds in Redis for one of its sessions.
struct HeldLock {
    robot_id: String,
    value: String,
}

pub struct Sessions {
    hub: Arc<Hub>,
    store: Store,
    node_id: String,
    /// Control locks held for sessions owned here, by session id (multi-node).
    locks: Mutex<HashMap<String, HeldLock>>,
}

/// The control lock cannot be checked: refuse the session (fail closed).
fn lock_unavailable(e: ClusterError) -> SessionError {
    tracing::error!(error = %e, "control lock unavailable");
    SessionError::Store(StoreError::Background(format!("control lock: {e}")))
}

impl Sessions {
    pub fn new(hub: Arc<Hub>, store: Store, node_id: String) -> Sessions {
        Sessions {
            hub,
            store,
            node_id,
            locks: Mutex::new(HashMap::new()),
        }
    }

    fn locks(&self) -> std::sync::MutexGuard<'_, HashMap<String, HeldLock>> {
        self.locks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.hub.cluster()
    }

    /// Checks the session rules, reserves the session and writes its record (a record that
    /// cannot be written undoes the reservation); returns the robot's socket, where the
    /// offer goes. A renegotiation offer within an existing session writes nothing.
    pub async fn open(
        &self,
        client_conn: &ConnId,
        request: OpenSession<'_>,
    ) -> Result<ConnId, SessionError> {
        // A robot not connected here may be on another node.
        let elsewhere = match self.cluster() {
            Some(cluster) if !self.hub.is_online(request.robot_id) => {
                cluster.locate(request.robot_id).await.map_err(|e| {
                    tracing::warn!(error = %e, "cannot locate robot on other nodes");
                    RelayError::RobotOffline(request.robot_id.to_string())
                })?
            }
            _ => None,
        };
        match self
            .hub
            .open_session_at(client_conn, request, elsewhere.as_ref())?
        {
            SessionOpened::Existing { robot_conn } => Ok(robot_conn),
            SessionOpened::New {
                record_id,
                robot_conn,
            } => {
                if let Err(e) = self.take_lock(request).await {
                    self.hub.end_session(request.session_id);
                    return Err(e);
                }
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
                    if let Some(ended) = self.hub.end_session(request.session_id) {
                        self.release_locks(std::slice::from_ref(&ended)).await;
                    }
                    return Err(e.into());
                }
                if let (Some(cluster), Some(robot)) = (self.cluster(), &elsewhere) {
                    // Before the offer, on the same channel: the robot's node knows the
                    // session by the time the offer reaches the robot.
                    cluster.send(
                        &robot.node,
                        &Control::Open(MirrorSession {
                            session_id: request.session_id.to_string(),
                            record_id,
                            robot_id: request.robot_id.to_string(),
                            robot_conn: robot_conn.to_string(),
                            client_conn: client_conn.to_string(),
                            client_node: self.node_id.clone(),
                            subject: request.subject.to_string(),
                            role: request.role,
                            offer_id: Some(request.offer_id.to_string()),
                        }),
                    );
                }
                Ok(robot_conn)
            }
        }
    }

    /// Multi-node: a driving session takes the robot's cluster-wide control lock (the hub
    /// already checked this node's sessions).
    async fn take_lock(&self, request: OpenSession<'_>) -> Result<(), SessionError> {
        let Some(cluster) = self.cluster() else {
            return Ok(());
        };
        if !request.role.may_drive() {
            return Ok(());
        }
        match cluster
            .lock(request.robot_id, request.session_id, request.subject)
            .await
            .map_err(lock_unavailable)?
        {
            LockOutcome::Acquired(value) => {
                self.locks().insert(
                    request.session_id.to_string(),
                    HeldLock {
                        robot_id: request.robot_id.to_string(),
                        value,
                    },
                );
                Ok(())
            }
            LockOutcome::Held { subject } => Err(RelayError::RobotBusy {
                robot_id: request.robot_id.to_string(),
                locked_by: (request.role == Role::Owner).then_some(subject),
            }
            .into()),
        }
    }

    /// Releases the control locks of ended sessions.
    async fn release_locks(&self, ended: &[EndedSession]) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        let released: Vec<HeldLock> = {
            let mut locks = self.locks();
            ended
                .iter()
                .filter_map(|e| locks.remove(&e.session_id))
                .collect()
        };
        for lock in released {
            if let Err(e) = cluster.unlock(&lock.robot_id, &lock.value).await {
                // It expires by itself within the lock's lifetime.
                tracing::warn!(robot = %lock.robot_id, error = %e, "cannot release control lock");
            }
        }
    }

    /// The locks to renew: (robot id, value). Every path that ends a session releases its
    /// lock (and takes it out of this map) before anyone hears of the end.
    pub fn held_locks(&self) -> Vec<(String, String)> {
        self.locks()
            .values()
            .map(|l| (l.robot_id.clone(), l.value.clone()))
            .collect()
    }

    /// The robot's node learns from `origin` of a session opened there. When it cannot
    /// take it, `origin` is told to end it: the robot left (a `disconnected` for the
    /// client), or the id belongs to another session here (refused: FORBIDDEN for the
    /// client, and the offer that follows is never delivered, see [`Hub::admits_frame`]).
    pub fn open_mirror(&self, origin: &str, mirror: MirrorSession) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        // A node speaks for its own clients only.
        if mirror.client_node != origin {
            tracing::warn!(session = %mirror.session_id, node = %origin, claimed = %mirror.client_node, "session for another node's client refused");
            return;
        }
        let refusal = match self.hub.open_mirror(&mirror) {
            Ok(()) => return,
            Err(RelayError::ConnectionIdInUse(_)) => {
                tracing::warn!(session = %mirror.session_id, subject = %mirror.subject, node = %origin, "offer naming another's session refused");
                Some(Refusal::ConnectionIdInUse)
            }
            Err(RelayError::TooManyViewers { per, .. }) => Some(Refusal::TooManyViewers(per)),
            Err(e) => {
                tracing::debug!(session = %mirror.session_id, error = %e, "session from another node refused");
                None
            }
        };
        match refusal {
            Some(reason) => cluster.send(
                origin,
                &Control::Refused {
                    session_id: mirror.session_id,
                    robot_id: mirror.robot_id,
                    offer_id: mirror.offer_id,
                    reason,
                },
            ),
            None => cluster.send(
                origin,
                &Control::End {
                    session_id: mirror.session_id.clone(),
                    notice: Some(crate::messages::disconnected(&mirror.session_id, None)),
                },
            ),
        }
    }

    /// The robot's node refused a session opened here (its id is another's there): it
    /// ends without a notice; returns the client's socket, to be told why.
    pub async fn refused_by_peer(&self, origin: &str, session_id: &str) -> Option<ConnId> {
        self.end_from_peer_with(origin, session_id, None).await
    }

    /// The node `origin` ended its side: end ours (record, lock), then tell the local end.
    pub async fn end_from_peer(&self, origin: &str, session_id: &str, notice: Option<String>) {
        self.end_from_peer_with(origin, session_id, notice).await;
    }

    async fn end_from_peer_with(
        &self,
        origin: &str,
        session_id: &str,
        notice: Option<String>,
    ) -> Option<ConnId> {
        let ended = self.hub.end_session_from_peer(session_id, origin)?;
        if let Err(e) = self
            .store
            .end_session(&ended.record_id, EndReason::Closed.as_str())
            .await
        {
            tracing::error!(session = %session_id, error = %e, "cannot end session record");
        }
        self.release_locks(std::slice::from_ref(&ended)).await;
        if let Some(text) = notice {
            if let Some(to) = ended.local_end() {
                let _ = self.hub.deliver_local(None, to, Outbound::text(text));
            }
        }
        ended.local_end().cloned()
    }

    /// A node died: the sessions with an end there end (records first, then the local ends
    /// are told).
    pub async fn node_gone(&self, node: &str) -> usize {
        let ended = self
            .hub
            .end_sessions_with_node(node, EndReason::NodeDown.as_str());
        self.finish(&ended, EndReason::NodeDown).await;
        ended.len()
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
            let written = self
                .store
                .end_session(&ended.record_id, reason.as_str())
                .await;
            let ended = [ended];
            self.release_locks(&ended).await;
            // No notices are queued, but another node holding the other end ends its copy
            // before the relayed message reaches it.
            self.hub.notify(&ended);
            written?;
        }
        Ok(())
    }

    /// A socket is gone: its sessions end, their records are closed, the other ends told
    /// (see [`Hub::detach`] for `resumable`).
    pub async fn detach(&self, conn: &ConnId, resumable: bool) {
        let ended = self.hub.detach(conn, resumable);
        self.finish(&ended, EndReason::Closed).await;
    }

    /// Ends the sessions whose client did not come back within the resume window.
    pub async fn expire_orphans(&self) {
        let ended = self.hub.expire_orphans(std::time::Instant::now());
        if !ended.is_empty() {
            tracing::info!(sessions = ended.len(), "sessions not resumed in time ended");
            self.finish(&ended, EndReason::Closed).await;
        }
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
        if let Some(cluster) = self.cluster() {
            cluster.broadcast(&Control::EndSessionsOf {
                robot_id: robot_id.to_string(),
                subject: subject.to_string(),
                allowed,
            });
        }
        self.end_for_subject_here(robot_id, subject, allowed, reason, GrantScope::Owned)
            .await
    }

    /// [`Sessions::end_for_subject`] for the sessions of this node in `scope`.
    pub async fn end_for_subject_here(
        &self,
        robot_id: &str,
        subject: &str,
        allowed: Option<Role>,
        reason: EndReason,
        scope: GrantScope,
    ) -> Result<usize, StoreError> {
        let ended = self
            .hub
            .end_sessions_of(robot_id, subject, allowed, reason.as_str(), scope);
        let mut written = Ok(());
        for session in &ended {
            if let Err(e) = self
                .store
                .end_session(&session.record_id, reason.as_str())
                .await
            {
                written = Err(e);
            }
        }
        self.release_locks(&ended).await;
        self.hub.notify(&ended);
        written.map(|()| ended.len())
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
        self.release_locks(ended).await;
        self.hub.notify(ended);
    }
}
