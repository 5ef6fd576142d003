//! Session tickets, the server's side: what goes into `meta.session.ticket` of an offer
//! or an `arp.frame` for a robot (claims in `signalling_protocol::ticket`, signed with the
//! deployment's key, [`crate::pki::SigningKeys`]). The robot checks them before it acts
//! (docs/security.md, "Session tickets").

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use signalling_protocol::ticket::{is_tool_call, params_hash, TicketClaims};
use signalling_protocol::Role;

use crate::pki::{Jwks, SigningKeys};

/// How long a ticket is good for: long enough for a queue and a robot clock a little
/// off, short enough that a captured one is soon useless (at most the protocol's 5 min).
pub const TICKET_LIFETIME_SECS: u64 = 120;

/// How often the robot's node renews the tickets of live teleop sessions: a third of
/// a ticket's life, so two renewals may be lost before a robot ends the session.
pub const RENEW_INTERVAL: std::time::Duration =
    std::time::Duration::from_secs(TICKET_LIFETIME_SECS / 3);

/// A random id of one ticket (128 bits, base64url): what robots' replay caches key on.
fn ticket_id() -> String {
    use base64::Engine as _;
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 16];
    // The OS generator does not fail on a running system; a zero id would only make
    // the robot refuse a second ticket with it (fail closed).
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Who a ticket is about: one session of one subject with one robot.
#[derive(Debug, Clone, Copy)]
pub struct TicketFor<'a> {
    pub robot: &'a str,
    pub connection_id: &'a str,
    pub subject: &'a str,
    pub role: Role,
}

/// Mints tickets with this node's copy of the deployment key.
#[derive(Debug)]
pub struct Tickets {
    keys: SigningKeys,
    node: String,
    /// `--session-tickets`: mint any at all.
    minting: bool,
}

impl Tickets {
    pub fn new(keys: SigningKeys, node: String) -> Tickets {
        Tickets {
            keys,
            node,
            minting: true,
        }
    }

    /// Mints none (`--session-tickets false`); the keys are still published.
    pub fn unsigned(self) -> Tickets {
        Tickets {
            minting: false,
            ..self
        }
    }

    /// During a rotation: the `session.signing_keys` message that hands robots the new key
    /// endorsed by the previous one (`None` without the previous private key).
    pub fn endorsement_message(&self) -> Option<String> {
        let endorsement = self.keys.endorsement()?;
        Some(crate::messages::key_endorsement(endorsement))
    }

    /// The public keys robots pin (`GET /v1/signing-keys`, enrollment's answer).
    pub fn jwks(&self) -> Jwks {
        self.keys.jwks()
    }

    /// The ticket of an offer, or of a live teleop session's renewal ([`RENEW_INTERVAL`]).
    pub fn offer(&self, session: TicketFor<'_>) -> Option<String> {
        if !self.minting {
            return None;
        }
        self.mint(self.claims(session, None, None))
    }

    /// The ticket of one ARP frame: a request's id, and for a tool call the hash of its
    /// params, so that the ticket cannot be moved to another call.
    pub fn arp_frame(&self, session: TicketFor<'_>, frame: &Value) -> Option<String> {
        if !self.minting {
            return None;
        }
        let call_id = frame.get("id").filter(|_| frame.get("method").is_some());
        let hash = is_tool_call(frame).then(|| params_hash(frame.get("params")));
        self.mint(self.claims(session, call_id.cloned(), hash))
    }

    fn claims(
        &self,
        session: TicketFor<'_>,
        call_id: Option<Value>,
        params_hash: Option<String>,
    ) -> TicketClaims {
        // A clock before 1970 is not worth a failure: the robot refuses the ticket.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        TicketClaims {
            robot: session.robot.to_owned(),
            connection_id: session.connection_id.to_owned(),
            subject: session.subject.to_owned(),
            role: session.role,
            node: self.node.clone(),
            iat: now,
            exp: now + TICKET_LIFETIME_SECS,
            jti: Some(ticket_id()),
            call_id,
            params_hash,
        }
    }

    /// Signing does not fail with a key that loaded; if it ever did, the message goes
    /// without a ticket and a robot that requires one refuses it (fail closed there).
    fn mint(&self, claims: TicketClaims) -> Option<String> {
        match self.keys.sign(&claims) {
            Ok(ticket) => Some(ticket),
            Err(e) => {
                tracing::error!(error = %e, robot = %claims.robot, "cannot sign a session ticket");
                None
            }
        }
    }
}
