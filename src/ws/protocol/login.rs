//! A robot's login on its socket: `register`, the PKI challenge and its response.

use std::time::Instant;

use signalling_protocol::{Envelope, PkiResponsePayload, RegisterPayload};

use super::{Peer, Protocol, WANTS_WELCOME};
use crate::identity::{Challenge, IdentityError, VerifiedRobot};
use crate::messages;
use crate::relay::{ConnId, PresenceWritten, RobotDeclared};
use crate::state::SharedState;
use crate::ws::error::WsError;

impl Protocol {
    pub(super) async fn register(&mut self, payload: RegisterPayload) -> Result<(), WsError> {
        match &self.peer {
            Peer::Client(_) => {
                return Err(WsError::Forbidden {
                    reason: "client_connection",
                    message:
                        "connections that logged in with a client token cannot register as robots",
                })
            }
            Peer::Robot { .. } => {
                return Err(WsError::Forbidden {
                    reason: "already_registered",
                    message: "this connection is already a verified robot",
                })
            }
            // One challenge at a time: each costs the server a lookup and randomness (a
            // chain validation for a certificate robot), so asking again before answering
            // is refused and earns a strike.
            Peer::Unverified {
                challenge: Some(pending),
            } if Instant::now() < pending.expires_at() => {
                return Err(WsError::Forbidden {
                    reason: "challenge_pending",
                    message: "answer the pending challenge before registering again",
                })
            }
            Peer::Unverified { .. } => {}
        }
        if payload
            .metadata
            .as_ref()
            .and_then(|m| m.get(WANTS_WELCOME))
            .and_then(serde_json::Value::as_bool)
            == Some(true)
        {
            self.wants_welcome = true;
        }
        let metadata = payload.metadata.as_ref();
        self.declared = RobotDeclared {
            arp: metadata
                .and_then(|m| m.get(messages::ARP_METADATA))
                .and_then(serde_json::Value::as_str)
                == Some(signalling_protocol::arp::ARP_VERSION),
            session_tickets: metadata
                .and_then(|m| m.get(signalling_protocol::ticket::REGISTER_METADATA_KEY))
                .and_then(serde_json::Value::as_bool)
                == Some(true),
        };
        let mut challenge = match self
            .state
            .identity
            .challenge(&payload.agent_id, payload.metadata.as_ref())
            .await
        {
            Ok(challenge) => challenge,
            Err(e) => {
                self.state
                    .metrics
                    .pki_results
                    .with_label_values(&[e.reason()])
                    .inc();
                return Err(e.into());
            }
        };
        let message = messages::pki_challenge(challenge.encoded.clone());
        challenge.set_message_id(&message.id);
        // Read before the login's database check (in `pki_response`), early enough that a
        // cut while the robot signs counts too: see `Presence::robot_verified`.
        challenge.access_cuts_seen = self.state.presence.access_cuts();
        self.replies.push(message.to_json());
        self.peer = Peer::Unverified {
            challenge: Some(Box::new(challenge)),
        };
        Ok(())
    }

    pub(super) async fn pki_response(
        &mut self,
        envelope: &Envelope,
        payload: PkiResponsePayload,
    ) -> Result<(), WsError> {
        let challenge = match &mut self.peer {
            // Taking the challenge out makes it single-use whatever happens next.
            Peer::Unverified { challenge } => challenge.take().map(|c| *c),
            _ => None,
        };
        let result = verify_login(
            &self.state,
            &self.conn,
            self.declared,
            challenge,
            envelope.correlation_id.as_deref(),
            &payload.signature,
        )
        .await;
        let (verified, presence) = match result {
            Ok(verified) => verified,
            Err(e) => {
                self.state
                    .metrics
                    .pki_results
                    .with_label_values(&[e.reason()])
                    .inc();
                return Err(e.into());
            }
        };
        self.state
            .metrics
            .pki_results
            .with_label_values(&["verified"])
            .inc();
        // A robot told it is verified can be offered a session from any node at once: its
        // presence is in Redis before the answer goes out (bounded: a slow Redis delays
        // the login, it does not block it).
        if let Some(written) = presence {
            written.wait().await;
        }
        tracing::info!(robot = %verified.robot_id, credential = verified.credential_kind, "robot verified");
        self.replies
            .push(messages::pki_verified(&verified.robot_id, &envelope.id));
        self.peer = Peer::Robot {
            robot_id: verified.robot_id,
        };
        // A robot that checks tickets learns of a rotation's new key from the old one.
        if self.declared.session_tickets {
            if let Some(endorsement) = self.state.tickets.endorsement_message() {
                self.replies.push(endorsement);
            }
        }
        // Now that it is proven, the robot may have TURN credentials, if it wants them.
        if self.wants_welcome {
            let welcome = self.welcome();
            self.replies.push(welcome);
        }
        Ok(())
    }
}

/// The robot's answer to its challenge checked, and the robot registered here; with the
/// check again that a cut between the two calls for.
async fn verify_login(
    state: &SharedState,
    conn: &ConnId,
    declared: RobotDeclared,
    challenge: Option<Challenge>,
    correlation_id: Option<&str>,
    signature: &str,
) -> Result<(VerifiedRobot, Option<PresenceWritten>), IdentityError> {
    let challenge = challenge.ok_or(IdentityError::NoChallenge)?;
    let cuts_seen = challenge.access_cuts_seen;
    let verified = state
        .identity
        .verify(challenge, correlation_id, signature, &state.node_id)
        .await?;
    let registered = state.presence.robot_verified(
        conn,
        &verified.robot_id,
        verified.credentials.clone(),
        declared,
        cuts_seen,
    );
    // A cut came between the check and the registration, and may have missed
    // this socket: check again (rare; a read). Refused, the socket closes and
    // leaves the hub like any other.
    if registered.cut_since {
        let stands = state
            .identity
            .login_still_stands(&verified.robot_id, &verified.credentials)
            .await?;
        state.metrics.access_rechecked("robot", stands);
        if !stands {
            return Err(IdentityError::Revoked);
        }
    }
    Ok((verified, registered.presence))
}
