//! Session messages on a socket: offers open sessions, everything else is routed between
//! the two ends of one, with the checks each kind of message needs.

use std::time::Instant;

use axum::extract::ws::Utf8Bytes;
use signalling_protocol::{DisconnectReason, ProtocolError, Relayed, RelayedKind};

use super::{Forward, Peer, Protocol, Relay};
use crate::relay::{
    ConnId, DeliveryError, EndReason, GrantScope, OpenSession, Outbound, RelayError, Route, Sender,
};
use crate::ws::error::WsError;

impl Protocol {
    /// A session message read by the one-pass view: the same rules as any other.
    pub(super) async fn relay_received(
        &mut self,
        text: &Utf8Bytes,
        view: &Relayed<'_>,
        received: Instant,
    ) -> Result<(), WsError> {
        let forward = Forward::Received { text, view };
        let session = &view.session;
        match &view.kind {
            // Once per session, and it waits on the database: on the heap (see `dispatch`).
            RelayedKind::Offer { robot_id } => {
                Box::pin(self.offer(forward, robot_id, session, received)).await
            }
            RelayedKind::Answer => self.relay_now(forward, session, received, Relay::FromRobot),
            RelayedKind::IceCandidate => self.relay_now(forward, session, received, Relay::Plain),
            // These write the session's record first: rarer, on the heap (see `dispatch`).
            RelayedKind::Connected => {
                Box::pin(self.relay(forward, session, received, Relay::Connected)).await
            }
            RelayedKind::Disconnected(reason) => {
                Box::pin(self.relay(forward, session, received, Relay::Ends(*reason))).await
            }
        }
    }

    pub(super) async fn offer(
        &mut self,
        forward: Forward<'_>,
        robot_id: &str,
        session_id: &str,
        received: Instant,
    ) -> Result<(), WsError> {
        let identity = match &self.peer {
            Peer::Client(identity) => identity.clone(),
            Peer::Robot { .. } => {
                return Err(WsError::Forbidden {
                    reason: "robots_cannot_offer",
                    message: "robots answer offers; they do not send them",
                })
            }
            Peer::Unverified { .. } => {
                return Err(WsError::Unauthorized {
                    reason: "login_required",
                    message: "connect with a client token to open sessions",
                })
            }
        };
        // No control characters: a session id is a line of the bus's frame header.
        if session_id.is_empty()
            || session_id.len() > 128
            || session_id.chars().any(char::is_control)
        {
            return Err(ProtocolError::InvalidPayload(
                "connectionId must be 1-128 characters, none of them control characters".into(),
            )
            .into());
        }
        // Read before the grant: see `Presence::access_cuts`.
        let cuts_seen = self.state.presence.access_cuts();
        let role = self
            .state
            .store
            .grant(robot_id, &identity.subject)
            .await?
            .ok_or_else(|| WsError::NoGrant(robot_id.to_string()))?;
        let robot_conn = self
            .state
            .sessions
            .open(
                &self.conn,
                OpenSession {
                    session_id,
                    robot_id,
                    subject: &identity.subject,
                    role,
                    offer_id: forward.id(),
                },
            )
            .await?;
        // A grant withdrawn or lowered after the read above, before the session was in the
        // hub, found no session to end: read it again and end the session as that change
        // would have. Counts only grow, so comparing after the session is in suffices.
        if self.state.presence.access_cuts() != cuts_seen {
            let granted = self.state.store.grant(robot_id, &identity.subject).await?;
            let stands = granted.is_some_and(|granted| granted >= role);
            self.state.metrics.access_rechecked("offer", stands);
            if !stands {
                let reason = match granted {
                    Some(_) => EndReason::GrantChanged,
                    None => EndReason::GrantRevoked,
                };
                self.state
                    .sessions
                    .end_for_subject_here(
                        robot_id,
                        &identity.subject,
                        granted,
                        reason,
                        GrantScope::Owned,
                    )
                    .await?;
                return Ok(());
            }
        }
        let metrics = self.state.metrics.relay(forward.kind());
        let text = forward.into_robot(&identity.subject, role);
        let share = Sender {
            share: &identity.subject,
            viewer: !role.may_drive(),
        };
        self.deliver(&robot_conn, share, session_id, metrics, text, received)
    }

    /// Relays a session message to the other end, after recording what it means for the
    /// session (so the record is current by the time the other end hears of it).
    pub(super) async fn relay(
        &mut self,
        forward: Forward<'_>,
        session_id: &str,
        received: Instant,
        kind: Relay,
    ) -> Result<(), WsError> {
        let Some(route) = self.route(&forward, session_id, &kind)? else {
            return Ok(());
        };
        match kind {
            // Records are written once per session: their futures go on the heap.
            Relay::Connected => Box::pin(self.state.sessions.connected(&route)).await?,
            Relay::Ends(reason) => {
                let reason = match reason {
                    DisconnectReason::Closed => EndReason::Closed,
                    DisconnectReason::Failed => EndReason::Failed,
                    DisconnectReason::Timeout => EndReason::Timeout,
                };
                Box::pin(self.state.sessions.end_by_peer(session_id, reason)).await?;
            }
            Relay::FromRobot | Relay::Plain => {}
        }
        self.send_routed(&route, session_id, forward, received)
    }

    /// A relayed message that changes nothing in the session's record (answers and
    /// candidates, nearly all the traffic): routed and queued without awaiting anything.
    pub(super) fn relay_now(
        &mut self,
        forward: Forward<'_>,
        session_id: &str,
        received: Instant,
        kind: Relay,
    ) -> Result<(), WsError> {
        match self.route(&forward, session_id, &kind)? {
            Some(route) => self.send_routed(&route, session_id, forward, received),
            None => Ok(()),
        }
    }

    /// Where a session message goes, if anywhere: only between the two ends of a live
    /// session, answers from the robot only. None: a late message for a session that just
    /// ended, dropped quietly.
    pub(super) fn route(
        &self,
        forward: &Forward<'_>,
        session_id: &str,
        kind: &Relay,
    ) -> Result<Option<Route>, WsError> {
        if matches!(self.peer, Peer::Unverified { .. }) {
            return Err(WsError::Unauthorized {
                reason: "not_verified",
                message: "register and answer the PKI challenge first",
            });
        }
        let route = match self.state.sessions.route(&self.conn, session_id) {
            Ok(route) => route,
            // One end of a session that just ended: a late `disconnected` is an idempotent
            // end, a late candidate or report is moot. Answering either with an error is
            // how the Modulr agent's endless disconnect loop started.
            //
            // A `connected` or `disconnected` is never answered with an error, however late
            // (past the grace period too): Modulr's agent reports a session's end long after
            // it, answers every error with another `disconnected`, and would loop until cut
            // off for strikes, with no reconnect. Nothing is relayed; it is counted.
            Err(RelayError::Ended(_)) => return Ok(self.late(forward.kind())),
            Err(RelayError::UnknownSession(_))
                if matches!(kind, Relay::Connected | Relay::Ends(_)) =>
            {
                return Ok(self.late(forward.kind()))
            }
            Err(e) => return Err(e.into()),
        };
        if matches!(kind, Relay::FromRobot) && !route.from_robot {
            return Err(WsError::Forbidden {
                reason: "wrong_direction",
                message: "only the robot of a session sends its answer",
            });
        }
        Ok(Some(route))
    }

    /// Counts a late message about a session that is over; nothing to relay.
    pub(super) fn late(&self, kind: &str) -> Option<Route> {
        self.state
            .metrics
            .late_messages
            .with_label_values(&[kind])
            .inc();
        None
    }

    pub(super) fn send_routed(
        &self,
        route: &Route,
        session_id: &str,
        forward: Forward<'_>,
        received: Instant,
    ) -> Result<(), WsError> {
        // Never pass on a peer's own meta: the robot learns who it talks to from us alone.
        let metrics = self.state.metrics.relay(forward.kind());
        let text = if route.from_robot {
            forward.into_client()
        } else {
            forward.into_robot(&route.subject, route.role)
        };
        let share = if route.from_robot {
            Sender {
                share: &self.conn,
                viewer: false,
            }
        } else {
            Sender {
                share: &route.subject,
                viewer: !route.role.may_drive(),
            }
        };
        self.deliver(&route.target, share, session_id, metrics, text, received)
    }

    /// Queues the message for the other end. A sender over its share at the receiver is
    /// told to slow down; a receiver that is gone or too slow is not the sender's error.
    pub(super) fn deliver(
        &self,
        to: &ConnId,
        share: Sender<'_>,
        session_id: &str,
        metrics: Option<&crate::metrics::RelayMetrics>,
        text: Utf8Bytes,
        received: Instant,
    ) -> Result<(), WsError> {
        let delivered =
            self.state
                .sessions
                .deliver(&self.conn, share, session_id, to, Outbound::Text(text));
        match delivered {
            Ok(()) => {
                if let Some(metrics) = metrics {
                    metrics.relayed.inc();
                    metrics.latency.observe(received.elapsed().as_secs_f64());
                }
                Ok(())
            }
            Err(DeliveryError::SenderThrottled) => Err(WsError::Throttled),
            Err(DeliveryError::Full | DeliveryError::Gone) => Ok(()),
        }
    }
}
