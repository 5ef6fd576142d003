//! One owner for a session's life: opening, the events that change its record, and its end.
//!
//! Every path that starts or ends a session (an offer, a peer's `disconnected`, a socket
//! closing, a grant withdrawn, shutdown) goes through [`Sessions`], which keeps one order:
//! change the hub, then write the record, then tell the remaining ends. Whoever hears of an
//! end therefore finds the record already ended. Other nodes are reached through the router.

mod nodes;

use std::sync::Arc;

use super::hub::Hub;
use super::routing::{Cut, MirrorSession};
use super::table::{EndedSession, GrantScope, OpenSession, Route, SessionOpened, TicketRenewal};
use super::{RelayError, SessionError};
use crate::delivery::{ConnId, DeliveryError, Outbound, Sender};
use crate::messages;
use crate::store::{Role, Store, StoreError};

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
    /// An owner took the robot over (`takeover`): the controller's session ends.
    Preempted,
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
            EndReason::Preempted => "preempted",
        }
    }
}

/// How long a takeover waits for the control lock another node releases, and how often it
/// looks.
const TAKEOVER_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
const TAKEOVER_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

#[derive(Clone)]
pub struct Sessions {
    hub: Arc<Hub>,
    store: Store,
    node_id: String,
}

impl Sessions {
    pub(super) fn new(hub: Arc<Hub>, store: Store, node_id: String) -> Sessions {
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
        // A robot not connected here may be on another node.
        let elsewhere = if self.hub.is_here(request.robot_id) {
            None
        } else {
            self.hub.router.locate(request.robot_id).await?
        };
        match self
            .hub
            .open_session_at(client_conn, request, elsewhere.as_ref())?
        {
            SessionOpened::Existing { robot_conn } => Ok(robot_conn),
            SessionOpened::New {
                record_id,
                robot_conn,
                ..
            } => {
                let locked = self.hub.router.take_lock(
                    request.robot_id,
                    request.session_id,
                    request.subject,
                    request.role,
                );
                if let Err(e) = locked.await {
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
                    match self.hub.end_session(request.session_id) {
                        Some(ended) => self.release_locks(std::slice::from_ref(&ended)).await,
                        // Ended while its lock was being taken: whoever ended it found no
                        // lock to release, and it would be renewed for nobody.
                        None => self.hub.router.release_lock_of(request.session_id).await,
                    }
                    return Err(e.into());
                }
                // Before the offer, on the same channel, and only while the session is still
                // open (under the table's lock, so an end that comes later is told after
                // it): the robot's node knows the session by the time the offer reaches the
                // robot, and never learns of one that already ended.
                let still_open = self.hub.if_open(request.session_id, &record_id, || {
                    if let Some(robot) = &elsewhere {
                        self.hub.router.open_remote(
                            &robot.node,
                            MirrorSession {
                                session_id: request.session_id.to_string(),
                                record_id: record_id.clone(),
                                robot_id: request.robot_id.to_string(),
                                robot_conn: robot_conn.to_string(),
                                client_conn: client_conn.to_string(),
                                client_node: self.node_id.clone(),
                                subject: request.subject.to_string(),
                                role: request.role,
                                offer_id: Some(request.offer_id.to_string()),
                                kind: request.kind,
                            },
                        );
                    }
                });
                if !still_open {
                    self.ended_while_opening(request.session_id, &record_id)
                        .await;
                    return Err(RelayError::Ended(request.session_id.to_string()).into());
                }
                Ok(robot_conn)
            }
        }
    }

    /// The session ended while its lock and record were being taken (its robot left, a
    /// grant was withdrawn, its id was preempted): whoever ended it found neither to end
    /// yet. The lock is released and the record ended here; both ends were told by the
    /// ender. (An end that lands after the record was written keeps its own reason: a
    /// record is ended once.)
    async fn ended_while_opening(&self, session_id: &str, record_id: &str) {
        tracing::info!(session = %session_id, "session ended while it was being opened");
        self.hub.router.release_lock_of(session_id).await;
        if let Err(e) = self
            .store
            .end_session(record_id, EndReason::Closed.as_str())
            .await
        {
            tracing::error!(session = %session_id, error = %e, "cannot end session record now: kept, written once the database takes it");
        }
    }

    pub(super) fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// [`Sessions::open`] with the role `request.subject`'s grant gives (`request.role` is
    /// ignored). A grant withdrawn or lowered after the grant was read but before the
    /// session was registered found no session to end: the grant is read again then, and
    /// the session ended as that change would have (`Ok(None)`: both ends were told).
    /// With `takeover`, an owner who finds the robot busy ends the controller's session
    /// (`preempted`, on whichever node) and takes its place. Returns the robot's socket
    /// and the role.
    pub async fn open_with_grant(
        &self,
        client_conn: &ConnId,
        request: OpenSession<'_>,
        takeover: bool,
    ) -> Result<Option<(ConnId, Role)>, SessionError> {
        // Read before the grant: see `Presence::access_cuts`.
        let cuts_seen = self.hub.access_cuts();
        let role = self
            .store
            .grant(request.robot_id, request.subject)
            .await?
            .ok_or_else(|| SessionError::NoGrant(request.robot_id.to_string()))?;
        let request = OpenSession { role, ..request };
        let opened = match self.open(client_conn, request).await {
            Err(SessionError::Relay(RelayError::RobotBusy { .. }))
                if takeover && role == Role::Owner =>
            {
                self.take_over(client_conn, request).await
            }
            opened => opened,
        };
        let robot_conn = match opened {
            // Ended while it was being opened; both ends were told.
            Err(SessionError::Relay(RelayError::Ended(_))) => return Ok(None),
            opened => opened?,
        };
        // Counts only grow, so comparing after the session is in suffices.
        if self.hub.access_cuts() != cuts_seen {
            let granted = self.store.grant(request.robot_id, request.subject).await?;
            let stands = granted.is_some_and(|granted| granted >= role);
            self.hub.metrics.access_rechecked("offer", stands);
            if !stands {
                let reason = match granted {
                    Some(_) => EndReason::GrantChanged,
                    None => EndReason::GrantRevoked,
                };
                self.end_for_subject_here(
                    request.robot_id,
                    request.subject,
                    granted,
                    reason,
                    GrantScope::Owned,
                )
                .await?;
                return Ok(None);
            }
        }
        Ok(Some((robot_conn, role)))
    }

    /// Ends the robot's driving sessions everywhere, then opens `request` in their place.
    /// Another node releases the control lock of a session it ends a moment later: the
    /// open is tried again for a bounded time.
    async fn take_over(
        &self,
        client_conn: &ConnId,
        request: OpenSession<'_>,
    ) -> Result<ConnId, SessionError> {
        tracing::warn!(robot = %request.robot_id, by = %request.subject, "an owner takes the robot over");
        self.preempt(request.robot_id).await;
        let deadline = tokio::time::Instant::now() + TAKEOVER_WAIT;
        loop {
            match self.open(client_conn, request).await {
                Err(SessionError::Relay(RelayError::RobotBusy { .. }))
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(TAKEOVER_RETRY).await;
                }
                opened => return opened,
            }
        }
    }

    /// Sends each live teleop session whose robot is here and takes renewals a fresh
    /// ticket (`mint`); returns how many were sent.
    pub fn renew_tickets(&self, mint: impl Fn(&TicketRenewal) -> Option<String>) -> usize {
        let due = self.hub.state().tickets_to_renew();
        let mut sent = 0;
        for session in &due {
            // Without a ticket the robot ends the session when the last one runs out.
            let Some(ticket) = mint(session) else {
                continue;
            };
            let text = messages::ticket_renewal(
                &session.session_id,
                &session.subject,
                session.role,
                &ticket,
            );
            // Past the queue limits, like a stop: a lost renewal can end a session.
            if self
                .hub
                .router
                .deliver_here(None, &session.robot_conn, Outbound::text(text))
                .is_ok()
            {
                sent += 1;
            }
        }
        sent
    }

    /// Whether a driving session with `robot_id` has an end on this node.
    pub fn is_driven(&self, robot_id: &str) -> bool {
        self.hub.is_driven(robot_id)
    }

    /// Ends the driving sessions with `robot_id` on every node (both ends told,
    /// `preempted`; the robot stops when its session ends). Returns how many were here.
    pub async fn preempt(&self, robot_id: &str) -> usize {
        self.hub.router.announce(Cut::Preempt {
            robot_id: robot_id.to_string(),
        });
        self.preempt_here(robot_id).await
    }

    /// [`Sessions::preempt`] on this node only.
    pub async fn preempt_here(&self, robot_id: &str) -> usize {
        let ended = self
            .hub
            .end_driving(robot_id, EndReason::Preempted.as_str());
        self.finish(&ended, EndReason::Preempted).await;
        ended.len()
    }

    /// Releases the control locks of ended sessions.
    async fn release_locks(&self, ended: &[EndedSession]) {
        self.hub.router.release_locks(ended).await;
    }

    /// Where a message about `session_id` from `sender` goes; only the two ends may talk.
    pub fn route(&self, sender: &ConnId, session_id: &str) -> Result<Route, RelayError> {
        self.hub.route(sender, session_id)
    }

    /// Whether `id` names a live session (or a socket's own id) that is not `conn`'s.
    pub fn names_another_session(&self, id: &str, conn: &ConnId) -> bool {
        self.hub.names_another_session(id, conn)
    }

    /// Queues a frame from `from` about `session_id` for `to`, on this node or another
    /// (see [`super::routing::Router::deliver`]).
    pub fn deliver(
        &self,
        from: &ConnId,
        share: Sender<'_>,
        session_id: &str,
        to: &ConnId,
        message: Outbound,
    ) -> Result<(), DeliveryError> {
        self.hub
            .router
            .deliver(from, share, session_id, to, message)
    }

    /// An emergency stop of `from` for `to` in `session_id`: past every sender's share.
    pub fn deliver_stop(
        &self,
        from: &ConnId,
        session_id: &str,
        to: &ConnId,
        message: Outbound,
    ) -> Result<(), DeliveryError> {
        self.hub.router.deliver_stop(from, session_id, to, message)
    }

    /// Each (robot, subject) with sessions in `scope`, and the highest role among them:
    /// what a grant check must allow.
    pub fn session_roles(&self, scope: GrantScope) -> Vec<(String, Arc<str>, Role)> {
        self.hub.session_roles(scope)
    }

    /// The robot said the WebRTC link is up.
    pub async fn connected(&self, route: &Route) -> Result<(), StoreError> {
        self.store.session_connected(&route.record_id).await
    }

    /// One end said `disconnected`: the session ends and its record is closed. The message
    /// itself is relayed by the caller, so no notice is queued here.
    pub async fn end_by_peer(&self, session_id: &str, reason: EndReason) -> Result<(), StoreError> {
        let ended = self.hub.end_session(session_id);
        self.close_peer_ended(ended, reason).await
    }

    /// A client said `disconnected`: as [`Sessions::end_by_peer`], but a robot on this node
    /// hears `to_robot` as the session leaves the table, before anything of a session that
    /// takes its place (robots do not read records). Returns whether the robot was told
    /// here; if not, the caller relays the message as usual.
    pub async fn end_by_client(
        &self,
        session_id: &str,
        reason: EndReason,
        to_robot: Outbound,
    ) -> Result<bool, StoreError> {
        let (ended, told) = match self.hub.end_session_telling_robot(session_id, to_robot) {
            Some((ended, told)) => (Some(ended), told),
            None => (None, false),
        };
        self.close_peer_ended(ended, reason).await?;
        Ok(told)
    }

    async fn close_peer_ended(
        &self,
        ended: Option<EndedSession>,
        reason: EndReason,
    ) -> Result<(), StoreError> {
        if let Some(ended) = ended {
            let written = self
                .store
                .end_session(&ended.record_id, reason.as_str())
                .await;
            let ended = [ended];
            self.release_locks(&ended).await;
            // No notices are queued, but another node holding the other end ends its copy
            // before the relayed message reaches it.
            self.hub.router.notify(&ended);
            written?;
        }
        Ok(())
    }

    /// A socket is gone: its sessions end, their records are closed, the other ends told
    /// (`resumable`: see the hub's `detach`).
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
        self.hub.router.announce(Cut::SessionsOf {
            robot_id: robot_id.to_string(),
            subject: subject.to_string(),
            allowed,
        });
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
        self.hub.router.notify(&ended);
        written.map(|()| ended.len())
    }

    /// Shutdown: every session ends (records first, then both ends are told). The sockets
    /// are closed next ([`super::Presence::close_all`]).
    pub async fn end_all(&self) {
        let ended = self.hub.end_all(EndReason::ServerShutdown.as_str());
        self.finish(&ended, EndReason::ServerShutdown).await;
    }

    /// Closes the records of ended sessions, then delivers their notices.
    async fn finish(&self, ended: &[EndedSession], reason: EndReason) {
        for session in ended {
            if let Err(e) = self
                .store
                .end_session(&session.record_id, reason.as_str())
                .await
            {
                tracing::error!(session = %session.session_id, error = %e, "cannot end session record now: kept, written once the database takes it");
            }
        }
        self.release_locks(ended).await;
        self.hub.router.notify(ended);
    }
}
