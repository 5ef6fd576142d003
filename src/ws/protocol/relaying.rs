//! Session messages on a socket: offers open sessions, everything else is routed between
//! the two ends of one, with the checks each kind of message needs.

use std::time::Instant;

use axum::extract::ws::Utf8Bytes;
use signalling_protocol::{DisconnectReason, ProtocolError, Relayed, RelayedKind, Role};

use super::{Forward, Peer, Protocol, Relay};
use crate::messages::{SessionKind, ARP_FRAME};
use crate::relay::{
    ConnId, DeliveryError, EndReason, OpenSession, Outbound, RelayError, Route, Sender,
};
use crate::tickets::TicketFor;
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
        let opened = self
            .state
            .sessions
            .open_with_grant(
                &self.conn,
                OpenSession {
                    session_id,
                    robot_id,
                    subject: &identity.subject,
                    // The grant's, read by `open_with_grant`.
                    role: Role::Viewer,
                    offer_id: forward.id(),
                    kind: SessionKind::Teleop,
                },
                forward.takeover(),
            )
            .await?;
        // Ended at once: a grant withdrawn or lowered meanwhile; both ends were told.
        let Some((robot_conn, role)) = opened else {
            return Ok(());
        };
        let metrics = self.state.metrics.relay(forward.kind());
        // The robot's proof that this offer and its role come from us.
        let ticket = self.state.tickets.offer(TicketFor {
            robot: robot_id,
            connection_id: session_id,
            subject: &identity.subject,
            role,
        });
        let text = forward.into_robot(&identity.subject, role, ticket.as_deref());
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
                if self.is_robot() {
                    if let Some(kind) = forward.ticket_refusal() {
                        let refusals = &self.state.metrics.tickets.robot_refusals;
                        refusals.with_label_values(&[kind]).inc();
                    }
                }
                let reason = match reason {
                    DisconnectReason::Closed => EndReason::Closed,
                    DisconnectReason::Failed => EndReason::Failed,
                    DisconnectReason::Timeout => EndReason::Timeout,
                };
                if route.from_robot {
                    Box::pin(self.state.sessions.end_by_peer(session_id, reason)).await?;
                } else {
                    return self
                        .end_by_client(&route, session_id, forward, received, reason)
                        .await;
                }
            }
            Relay::FromRobot | Relay::Plain => {}
        }
        self.send_routed(&route, session_id, forward, received)
    }

    /// A client's `disconnected`: the session ends and the robot hears it before the robot
    /// is free for anyone else ([`crate::relay::Sessions::end_by_client`]); a robot on
    /// another node hears it relayed, after its node has ended its copy.
    async fn end_by_client(
        &mut self,
        route: &Route,
        session_id: &str,
        forward: Forward<'_>,
        received: Instant,
        reason: EndReason,
    ) -> Result<(), WsError> {
        let metrics = self.state.metrics.relay(forward.kind());
        let text = forward.into_robot(&route.subject, route.role, None);
        let told = self
            .state
            .sessions
            .end_by_client(session_id, reason, Outbound::Text(text.clone()))
            .await?;
        if !told {
            let share = Sender {
                share: &route.subject,
                viewer: !route.role.may_drive(),
            };
            return self.deliver(&route.target, share, session_id, metrics, text, received);
        }
        if let Some(metrics) = metrics {
            metrics.relayed.inc();
            metrics.latency.observe(received.elapsed().as_secs_f64());
        }
        Ok(())
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
        // An ARP session carries `arp.frame`s; only its end is said the usual way.
        if route.kind == SessionKind::Arp && !matches!(kind, Relay::Ends(_)) {
            return Err(RelayError::WrongSessionKind(session_id.to_string()).into());
        }
        if matches!(kind, Relay::FromRobot) && !route.from_robot {
            return Err(WsError::Forbidden {
                reason: "wrong_direction",
                message: "only the robot of a session sends its answer",
            });
        }
        Ok(Some(route))
    }

    /// An `arp.frame` from a robot: one ARP frame of one of its gateway sessions, passed on
    /// unchanged to the gateway connection at the other end (docs/protocol.md, "ARP
    /// sessions"). Late frames of an ended session are dropped quietly.
    /// `session_id`: the frame's `payload.connectionId`, if it has one (a string).
    pub(super) fn arp_frame(
        &self,
        text: Utf8Bytes,
        session_id: Option<&str>,
    ) -> Result<(), WsError> {
        if !matches!(self.peer, Peer::Robot { .. }) {
            return Err(WsError::Forbidden {
                reason: "robots_only",
                message: "arp.frame is sent by robots; programs use /v1/robots/{robotId}/arp",
            });
        }
        let session_id = session_id.ok_or_else(|| {
            ProtocolError::InvalidPayload("arp.frame needs payload.connectionId".into())
        })?;
        let route = match self.state.sessions.route(&self.conn, session_id) {
            Ok(route) => route,
            Err(RelayError::Ended(_) | RelayError::UnknownSession(_)) => {
                self.late(ARP_FRAME);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        if route.kind != SessionKind::Arp {
            return Err(RelayError::WrongSessionKind(session_id.to_string()).into());
        }
        let share = Sender {
            share: &self.conn,
            viewer: false,
        };
        self.deliver(&route.target, share, session_id, None, text, Instant::now())
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
            forward.into_robot(&route.subject, route.role, None)
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
