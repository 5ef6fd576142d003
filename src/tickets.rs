//! Session tickets, the server's side: what goes into `meta.session.ticket` of an offer
//! or an `arp.frame` for a robot (claims in `signalling_protocol::ticket`, signed with the
//! deployment's key, [`crate::pki::SigningKeys`]). The robot checks them before it acts
//! (docs/security.md, "Session tickets").

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use signalling_protocol::arp::Message;
use signalling_protocol::ticket::{params_hash, session_mac_key, TicketClaims, SESSION_KEY_ID};
use signalling_protocol::Role;

use crate::pki::{Jwks, SigningKeys};

/// Our half of an ARP session's key exchange (X25519, used once).
pub struct KeyExchange {
    private: ring::agreement::EphemeralPrivateKey,
    /// The public half, base64url: the ticket's `kx`.
    public: String,
}

impl std::fmt::Debug for KeyExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyExchange")
            .field("public", &self.public)
            .finish()
    }
}

impl KeyExchange {
    fn new() -> Option<KeyExchange> {
        use base64::Engine as _;
        let rng = ring::rand::SystemRandom::new();
        let private =
            ring::agreement::EphemeralPrivateKey::generate(&ring::agreement::X25519, &rng).ok()?;
        let public = private.compute_public_key().ok()?;
        Some(KeyExchange {
            private,
            public: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(public.as_ref()),
        })
    }
}

/// The HS256 key of an agreed ARP session, with its header.
///
/// A ticket per frame: the key's HMAC state and the header's JSON (base64url) are made once
/// per session, not for every ticket as `jsonwebtoken::encode` makes them (issue 44: a third
/// of the ticket's cost). The token is the same JWS: `header.claims.mac`, base64url.
pub struct SessionMac {
    key: ring::hmac::Key,
    /// `{"typ":"JWT","alg":"HS256","kid":"arp-session"}`, base64url, then `.`.
    header: String,
}

impl SessionMac {
    fn new(secret: &[u8]) -> Option<SessionMac> {
        use base64::Engine as _;
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some(SESSION_KEY_ID.to_owned());
        let json = serde_json::to_vec(&header).ok()?;
        let mut header = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json);
        header.push('.');
        Some(SessionMac {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret),
            header,
        })
    }

    /// The HS256 JWS of `claims`.
    fn encode(&self, claims: &TicketClaims) -> Result<String, serde_json::Error> {
        use base64::Engine as _;
        let engine = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let json = serde_json::to_vec(claims)?;
        let mut token = String::with_capacity(self.header.len() + json.len() * 4 / 3 + 48);
        token.push_str(&self.header);
        engine.encode_string(json, &mut token);
        let tag = ring::hmac::sign(&self.key, token.as_bytes());
        token.push('.');
        engine.encode_string(tag.as_ref(), &mut token);
        Ok(token)
    }
}

impl std::fmt::Debug for SessionMac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionMac")
    }
}

/// How the tickets of one ARP session are made (docs/security.md, "Session tickets").
#[derive(Debug)]
pub enum SessionKey {
    /// Signed tickets only: tickets are off, or the session's key is past saving.
    Signed,
    /// The next ticket (the session's first) offers our half.
    Offer(KeyExchange),
    /// Offered in the ticket `offered` (its `jti`); signed tickets until the robot's half
    /// comes back. A robot that does not take part never answers: signed all along.
    Offered {
        exchange: KeyExchange,
        offered: String,
    },
    /// Agreed: tickets are MAC'd with the session's key.
    Agreed(Box<SessionMac>),
}

impl SessionKey {
    /// The robot's half came back (`meta.ticketKey` of its frame): the session's key is
    /// derived and later tickets are MAC'd with it. Anything else (no offer pending, a
    /// half that is not an X25519 key) leaves signed tickets. Whether a key was agreed.
    pub fn agree(&mut self, robot_half: &str, connection_id: &str) -> bool {
        use base64::Engine as _;
        let SessionKey::Offered { exchange, offered } = std::mem::replace(self, SessionKey::Signed)
        else {
            return false;
        };
        let Ok(peer) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(robot_half) else {
            tracing::warn!(%connection_id, "the robot's ticket key is not base64url; tickets stay signed");
            return false;
        };
        let peer = ring::agreement::UnparsedPublicKey::new(&ring::agreement::X25519, peer);
        let derived = ring::agreement::agree_ephemeral(exchange.private, &peer, |shared| {
            session_mac_key(shared, &offered, connection_id)
        });
        match derived {
            Ok(secret) => match SessionMac::new(&secret) {
                Some(mac) => {
                    *self = SessionKey::Agreed(Box::new(mac));
                    true
                }
                None => false,
            },
            Err(_) => {
                tracing::warn!(%connection_id, "the robot's ticket key is not an X25519 key; tickets stay signed");
                false
            }
        }
    }
}

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

    /// The ticket key of a new ARP session: the first ticket offers the exchange.
    pub fn session_key(&self) -> SessionKey {
        if !self.minting {
            return SessionKey::Signed;
        }
        match KeyExchange::new() {
            Some(exchange) => SessionKey::Offer(exchange),
            None => SessionKey::Signed,
        }
    }

    /// [`Tickets::arp_message`] for a frame as JSON (what is not one ARP message gets the
    /// ticket of a frame with no call in it).
    pub fn arp_frame(
        &self,
        session: TicketFor<'_>,
        frame: &Value,
        key: &mut SessionKey,
    ) -> Option<String> {
        let message = Message::from_value(frame.clone())
            .unwrap_or_else(|_| Message::result(Value::Null, Value::Null));
        self.arp_message(session, &message, key)
    }

    /// The ticket of one ARP frame: a request's id, and for a tool call the hash of its
    /// params, so that the ticket cannot be moved to another call. Signed until the
    /// session's key is agreed (the first one offers our half of the exchange), then
    /// MAC'd with that key.
    pub fn arp_message(
        &self,
        session: TicketFor<'_>,
        frame: &Message,
        key: &mut SessionKey,
    ) -> Option<String> {
        if !self.minting {
            return None;
        }
        let hash = frame.is_tool_call().then(|| params_hash(frame.params()));
        let mut claims = self.claims(session, frame.request_id().cloned(), hash);
        match std::mem::replace(key, SessionKey::Signed) {
            SessionKey::Agreed(mac) => {
                let ticket = mac.encode(&claims);
                *key = SessionKey::Agreed(mac);
                match ticket {
                    Ok(ticket) => Some(ticket),
                    Err(e) => {
                        tracing::error!(error = %e, robot = %claims.robot, "cannot MAC a session ticket");
                        None
                    }
                }
            }
            SessionKey::Offer(exchange) => {
                claims.kx = Some(exchange.public.clone());
                let offered = claims.jti.clone().unwrap_or_default();
                *key = SessionKey::Offered { exchange, offered };
                self.mint(claims)
            }
            other => {
                *key = other;
                self.mint(claims)
            }
        }
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
            kx: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The session's MAC'd ticket is an HS256 JWT as `jsonwebtoken` makes and checks it.
    #[test]
    fn a_macd_ticket_is_the_jwt_jsonwebtoken_would_make() {
        let secret = [7u8; 32];
        let claims = TicketClaims {
            robot: "r-1".into(),
            connection_id: "arp-1".into(),
            subject: "al\"ice".into(),
            role: Role::Operator,
            node: "n".into(),
            iat: 1_000,
            exp: 4_000_000_000,
            jti: Some("j".into()),
            call_id: Some(serde_json::json!(3)),
            params_hash: Some("h".into()),
            kx: None,
        };
        let ours = SessionMac::new(&secret).unwrap().encode(&claims).unwrap();
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some(SESSION_KEY_ID.to_owned());
        let theirs = jsonwebtoken::encode(
            &header,
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(&secret),
        )
        .unwrap();
        assert_eq!(ours, theirs);
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
        validation.required_spec_claims.clear();
        validation.validate_aud = false;
        let decoded = jsonwebtoken::decode::<TicketClaims>(
            &ours,
            &jsonwebtoken::DecodingKey::from_secret(&secret),
            &validation,
        )
        .unwrap();
        assert_eq!(decoded.claims, claims);
        assert_eq!(decoded.header.kid.as_deref(), Some(SESSION_KEY_ID));
    }
}
