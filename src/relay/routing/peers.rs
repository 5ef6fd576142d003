//! What other nodes tell this one, applied to the relay: sessions opened, refused and ended
//! there, kicks and grant changes they broadcast, and frames for sockets here. Each is
//! checked against this node's own table first: a node speaks only for its own clients.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::ws::Utf8Bytes;

use crate::cluster::inbound::PeerHandler;
use crate::cluster::message::{frame_id, Refusal};
use crate::cluster::{Cluster, Control, MirrorSession, RelayedFrame};
use crate::delivery::{ConnId, DeliveryError, Outbound};
use crate::messages;
use crate::relay::hub::Hub;
use crate::relay::{EndReason, GrantScope, Presence, RelayError, Sessions};

/// The relay's side of the cluster bus.
pub struct Peers {
    hub: Arc<Hub>,
    presence: Presence,
    sessions: Sessions,
    cluster: Arc<Cluster>,
}

impl Peers {
    pub(super) fn new(presence: &Presence, sessions: &Sessions, cluster: Arc<Cluster>) -> Peers {
        Peers {
            hub: sessions.hub().clone(),
            presence: presence.clone(),
            sessions: sessions.clone(),
            cluster,
        }
    }

    async fn apply(&self, origin: String, control: Control) {
        match control {
            Control::Open(mirror) => {
                // The control lock is the cluster's one word on who drives: a driving session
                // opened elsewhere holds it now, so one still driving this robot here lost it
                // (its node died or was cut off, and its end has not arrived yet). End that
                // one first, or the robot would hear two controllers at once (issue 42).
                if mirror.role.may_drive()
                    && mirror.client_node == origin
                    && self.sessions.is_driven(&mirror.robot_id)
                {
                    let ended = self.sessions.preempt_here(&mirror.robot_id).await;
                    tracing::warn!(robot = %mirror.robot_id, node = %origin, ended, "a driving session whose control lock lapsed ended: another node holds the lock now");
                }
                self.open_mirror(&origin, mirror)
            }
            Control::End { session_id, notice } => {
                self.sessions
                    .end_from_peer(&origin, &session_id, notice)
                    .await
            }
            Control::Refused {
                session_id,
                robot_id,
                offer_id,
                reason,
            } => {
                let client = self.sessions.refused_by_peer(&origin, &session_id).await;
                if let Some(client) = client {
                    let error = match reason {
                        Refusal::ConnectionIdInUse => RelayError::ConnectionIdInUse(session_id),
                        Refusal::TooManyViewers(per) => {
                            RelayError::TooManyViewers { robot_id, per }
                        }
                        Refusal::ArpUnsupported => RelayError::ArpUnsupported(robot_id),
                    };
                    self.tell(&client, &error, offer_id.as_deref());
                }
            }
            Control::Kick { conn, reason } => self.presence.kick(&conn.into(), reason),
            Control::KickRobot { robot_id, reason } => {
                self.presence.kick_robot_here(&robot_id, reason);
            }
            Control::KickToken { token_id } => {
                self.presence.kick_token_here(&token_id);
            }
            Control::Preempt { robot_id } => {
                self.sessions.preempt_here(&robot_id).await;
            }
            Control::EmergencyStop { robot_id, subject } => {
                self.presence.emergency_stop_here(&robot_id, &subject);
            }
            Control::KickCredentials {
                credentials,
                reason,
            } => {
                self.presence.kick_credentials_here(&credentials, reason);
            }
            Control::EndSessionsOf {
                robot_id,
                subject,
                allowed,
            } => self.end_sessions_of(&robot_id, &subject, allowed).await,
            Control::Throttled { conn, id } => {
                let conn = ConnId::from(conn);
                self.tell(&conn, &RelayError::Throttled, id.as_deref());
                // As here (ws::connection): a robot is not struck for a client that stalls.
                if !self.presence.is_robot(&conn) {
                    self.presence.strike(&conn);
                }
            }
            // Handled by the cluster itself.
            Control::NodeLeaving | Control::Probe { .. } => {}
        }
    }

    async fn end_sessions_of(
        &self,
        robot_id: &str,
        subject: &str,
        allowed: Option<crate::store::Role>,
    ) {
        let reason = if allowed.is_some() {
            EndReason::GrantChanged
        } else {
            EndReason::GrantRevoked
        };
        if let Err(e) = self
            .sessions
            .end_for_subject_here(robot_id, subject, allowed, reason, GrantScope::Owned)
            .await
        {
            tracing::error!(error = %e, "cannot end sessions after a grant change");
        }
    }

    /// The robot's node learns from `origin` of a session opened there. When it cannot
    /// take it, `origin` is told to end it: the robot left (a `disconnected` for the
    /// client), or the id belongs to another session here (refused: FORBIDDEN for the
    /// client, and the offer that follows is never delivered, see [`Peers::frames`]).
    fn open_mirror(&self, origin: &str, mirror: MirrorSession) {
        // A node speaks for its own clients only.
        if mirror.client_node != origin {
            tracing::warn!(session = %mirror.session_id, node = %origin, claimed = %mirror.client_node, "session for another node's client refused");
            return;
        }
        let refusal = match self.sessions.open_mirror(&mirror) {
            Ok(()) => return,
            Err(RelayError::ConnectionIdInUse(_)) => {
                tracing::warn!(session = %mirror.session_id, subject = %mirror.subject, node = %origin, "offer naming another's session refused");
                Some(Refusal::ConnectionIdInUse)
            }
            Err(RelayError::TooManyViewers { per, .. }) => Some(Refusal::TooManyViewers(per)),
            Err(RelayError::ArpUnsupported(_)) => Some(Refusal::ArpUnsupported),
            Err(e) => {
                tracing::debug!(session = %mirror.session_id, error = %e, "session from another node refused");
                None
            }
        };
        let answer = match refusal {
            Some(reason) => Control::Refused {
                session_id: mirror.session_id,
                robot_id: mirror.robot_id,
                offer_id: mirror.offer_id,
                reason,
            },
            None => Control::End {
                notice: Some(messages::disconnected(&mirror.session_id, None)),
                session_id: mirror.session_id,
            },
        };
        self.cluster.send(origin, &answer);
    }

    /// Tells a socket here of an error another node found with its message `id`: the same
    /// error a refusal here earns.
    fn tell(&self, conn: &ConnId, error: &RelayError, id: Option<&str>) {
        let code = error.code();
        self.hub
            .metrics
            .errors
            .with_label_values(&[code.as_str()])
            .inc();
        let text = messages::error(code, &error.to_string(), Some(error.details()), id);
        let _ = self
            .hub
            .router
            .deliver_here(None, conn, Outbound::text(text));
    }

    /// Delivers a frame relayed from another node to its socket here, with every rule of a
    /// local delivery; a sender over its share is told by its own node.
    fn deliver_frame(&self, frame: RelayedFrame) {
        let RelayedFrame {
            from,
            to,
            session,
            text,
        } = frame;
        // The sending node routed it by its own table; this node checks it against its own,
        // so a session id taken over elsewhere reaches nobody here.
        let admitted = from
            .as_ref()
            .and_then(|from| self.hub.admits_frame(from, &session, &to));
        let Some(share) = admitted else {
            self.hub.metrics.cluster.frames_refused.inc();
            tracing::debug!(session = %session, "frame from another node outside any session of its ends dropped");
            return;
        };
        // A session that ended here takes only its last `disconnected` from the other node
        // (it travels after the end). Anything else is late, as it is on one node: above all
        // an offer, which would open at the robot a session that no longer exists.
        if share.ended && message_type(&text).as_deref() != Some(SIGNALLING_DISCONNECTED) {
            tracing::debug!(session = %session, "late frame of an ended session from another node dropped");
            return;
        }
        // Shared bytes: the copy kept for a refusal is a reference count.
        let text = Utf8Bytes::from(text);
        let delivered =
            self.hub
                .router
                .deliver_here(Some(share.sender()), &to, Outbound::Text(text.clone()));
        if let (Err(DeliveryError::SenderThrottled), Some(from)) = (delivered, from) {
            if let Some(node) = self.hub.router.remote_node(&from) {
                let throttled = Control::Throttled {
                    conn: from.to_string(),
                    id: frame_id(text.as_str()),
                };
                self.cluster.send(&node, &throttled);
            }
        }
    }
}

/// The `type` of a relayed frame (read only for the rare frames of ended sessions).
fn message_type(text: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Typed {
        #[serde(rename = "type")]
        kind: String,
    }
    serde_json::from_str::<Typed>(text).ok().map(|t| t.kind)
}

const SIGNALLING_DISCONNECTED: &str = "signalling.disconnected";

impl PeerHandler for Peers {
    fn frames(&self, frames: Vec<RelayedFrame>) {
        for frame in frames {
            self.deliver_frame(frame);
        }
    }

    fn control(
        &self,
        origin: String,
        control: Control,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.apply(origin, control))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_type_is_read_from_its_envelope() {
        let offer = r#"{"type":"signalling.offer","id":"m1","payload":{"connectionId":"s1"}}"#;
        assert_eq!(message_type(offer).as_deref(), Some("signalling.offer"));
        let bye = r#"{"id":"m2","type":"signalling.disconnected","payload":{}}"#;
        assert_eq!(message_type(bye).as_deref(), Some(SIGNALLING_DISCONNECTED));
        assert_eq!(message_type("not json"), None);
        assert_eq!(message_type(r#"{"payload":{}}"#), None);
    }
}
