//! Session tickets, the robot's side: the server's signed word on who may do what.
//!
//! Once the robot has pinned the server's signing keys ([`crate::server_keys`]), every
//! offer and every gateway `arp.frame` must carry a ticket in `meta.session.ticket`: a
//! JWS (EdDSA) by a pinned key, for this robot, not expired, for the very session (and
//! for an ARP request, the very call and params) it comes with. The role the robot then
//! enforces is the ticket's, never the plain `meta.session.role`, which anything between
//! the server and the robot could rewrite. Whatever fails is refused before the peer
//! manager or the ARP server sees it (fail closed), logged and counted.
//!
//! An ARP session's first signed ticket may offer a key exchange (`kx`): the robot then
//! derives the session's key ([`SessionKeys`]), sends its half back on its next frame of
//! that session, and from then on also takes tickets MAC'd with that key (HS256), which
//! cost both ends far less than a signature per call. The claims checked are the same.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{json, Value};
use signalling_protocol::arp::{method, reason, ArpCode, ArpFramePayload};
use signalling_protocol::ticket::{
    is_tool_call, params_hash, session_mac_key, KeyEndorsement, TicketClaims,
    MAX_TICKET_LIFETIME_SECS, SESSION_KEY_ID,
};
use signalling_protocol::{
    DisconnectReason, DisconnectedPayload, Envelope, SessionMeta, Signalling, PROTOCOL_VERSION,
};

use crate::messages;
use crate::server_keys::{self, PinnedKey};

/// Clock difference between server and robot a ticket survives, in seconds.
pub const LEEWAY_SECS: u64 = 30;

/// ARP sessions whose MAC key is held at once: beyond the gateway's own cap on sessions
/// ([`crate::arp::gateway::MAX_CONNECTIONS`]), so only leaked entries could fill it; when
/// full, no new key is agreed and that session's tickets stay signed.
const MAX_SESSION_KEYS: usize = 64;

/// Tickets remembered against replay at once. Each is remembered until it could no
/// longer pass anyway (`exp` + leeway); the gateway's limits keep far fewer alive. When
/// full, new tickets are refused (fail closed) rather than old ones forgotten.
const MAX_REMEMBERED: usize = 100_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    #[error("no session ticket")]
    Missing,
    #[error("the ticket is not a JWS: {0}")]
    Malformed(String),
    #[error("the ticket's key {0:?} is not one this robot trusts")]
    UnknownKey(Option<String>),
    #[error("the ticket's signature or claims do not check: {0}")]
    Invalid(String),
    #[error("the ticket has expired")]
    Expired,
    #[error("the ticket claims to live longer than {MAX_TICKET_LIFETIME_SECS} s")]
    TooLong,
    #[error("the ticket is for robot {0:?}")]
    OtherRobot(String),
    #[error("the ticket is for session {0:?}")]
    OtherSession(String),
    #[error("the ticket is for another call")]
    OtherCall,
    #[error("the ticket is for other params")]
    OtherParams,
    #[error("the ticket has no id (jti)")]
    NoId,
    #[error("the ticket was used before")]
    Replayed,
    #[error("too many live tickets to remember ({MAX_REMEMBERED})")]
    TooManyLive,
    #[error("the endorsed key is not one: {0}")]
    BadEndorsedKey(String),
    #[error("cannot pin the endorsed key: {0}")]
    Pin(String),
}

/// What a good ticket vouches for: who, in what role, until when (Unix seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct Vouched {
    pub session: SessionMeta,
    pub expires: u64,
}

/// Ids of the tickets taken, each until it expires: a ticket is good once.
#[derive(Debug, Default)]
struct Seen {
    ids: HashMap<String, u64>,
    /// Earliest time an entry may be dropped: no sweep before it.
    next_sweep: u64,
}

impl Seen {
    fn take(&mut self, id: &str, exp: u64, now: u64) -> Result<(), TicketError> {
        if self.ids.contains_key(id) {
            return Err(TicketError::Replayed);
        }
        if now >= self.next_sweep || self.ids.len() >= MAX_REMEMBERED {
            self.ids.retain(|_, exp| *exp + LEEWAY_SECS >= now);
            self.next_sweep = self
                .ids
                .values()
                .min()
                .map_or(u64::MAX, |e| e + LEEWAY_SECS + 1);
        }
        if self.ids.len() >= MAX_REMEMBERED {
            return Err(TicketError::TooManyLive);
        }
        self.ids.insert(id.to_owned(), exp);
        self.next_sweep = self.next_sweep.min(exp + LEEWAY_SECS + 1);
        Ok(())
    }
}

/// Now, in Unix seconds (0 before 1970: every ticket then looks unexpired to this
/// clock, but the JWT check, with the same clock, is what refuses expired ones).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Checks tickets against the pinned keys, for one robot.
pub struct TicketCheck {
    robot: String,
    /// Pinned keys by id; a rotation's endorsement adds one while the agent runs.
    keys: RwLock<HashMap<String, DecodingKey>>,
    /// Where endorsed keys are pinned for good (`server-keys.json`), if anywhere.
    keys_file: Option<PathBuf>,
    validation: Validation,
    refused: AtomicU64,
    seen: Mutex<Seen>,
    mac_validation: Validation,
    sessions: Mutex<SessionKeys>,
}

/// The MAC keys of ARP sessions, by `connectionId`.
#[derive(Default)]
struct SessionKeys {
    keys: HashMap<String, SessionKey>,
}

struct SessionKey {
    key: DecodingKey,
    /// Our half of the exchange, until it is sent on the session's next frame.
    unsent: Option<String>,
}

impl std::fmt::Debug for TicketCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketCheck")
            .field("robot", &self.robot)
            .field("keys", &self.kids())
            .finish()
    }
}

impl TicketCheck {
    /// `None` with no key: nothing to check against.
    pub fn new(robot: &str, keys: &[PinnedKey]) -> Option<TicketCheck> {
        let keys: HashMap<String, DecodingKey> = keys
            .iter()
            .filter_map(|k| Some((k.kid.clone(), DecodingKey::from_ed_components(&k.x).ok()?)))
            .collect();
        if keys.is_empty() {
            return None;
        }
        let validation = |alg| {
            let mut validation = Validation::new(alg);
            validation.leeway = LEEWAY_SECS;
            validation.validate_aud = false;
            validation.set_required_spec_claims(&["exp"]);
            validation
        };
        Some(TicketCheck {
            robot: robot.to_owned(),
            keys: RwLock::new(keys),
            keys_file: None,
            validation: validation(Algorithm::EdDSA),
            refused: AtomicU64::new(0),
            seen: Mutex::new(Seen::default()),
            mac_validation: validation(Algorithm::HS256),
            sessions: Mutex::new(SessionKeys::default()),
        })
    }

    /// Pins endorsed keys in `path` too (the agent's `server-keys.json`), not only in
    /// memory.
    pub fn with_keys_file(mut self, path: PathBuf) -> TicketCheck {
        self.keys_file = Some(path);
        self
    }

    /// The ids of the keys trusted now.
    pub fn kids(&self) -> Vec<String> {
        let keys = self
            .keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut kids: Vec<String> = keys.keys().cloned().collect();
        kids.sort();
        kids
    }

    /// A rotation's `session.signing_keys`: keys endorsed by a key we trust are pinned
    /// (in memory and in the keys file); returns the ids of those that were new. An
    /// endorsement by any other key, or of anything but an Ed25519 JWK whose id is its
    /// thumbprint, is refused and pins nothing.
    pub fn endorse(&self, endorsement: &str) -> Result<Vec<String>, TicketError> {
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.validate_exp = false;
        validation.validate_aud = false;
        validation.set_required_spec_claims::<&str>(&[]);
        let claims: KeyEndorsement = self.decode(endorsement, &validation)?;
        let endorsed = claims
            .endorses
            .iter()
            .map(PinnedKey::from_jwk)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TicketError::BadEndorsedKey(e.to_string()))?;
        let mut added = Vec::new();
        for key in endorsed {
            if let Some(path) = &self.keys_file {
                server_keys::add(path, key.clone()).map_err(|e| TicketError::Pin(e.to_string()))?;
            }
            let decoding = DecodingKey::from_ed_components(&key.x)
                .map_err(|e| TicketError::BadEndorsedKey(e.to_string()))?;
            let mut keys = self
                .keys
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if keys.insert(key.kid.clone(), decoding).is_none() {
                added.push(key.kid);
            }
        }
        Ok(added)
    }

    /// The claims of a JWS signed by a key we trust (the one its header's `kid` names).
    fn decode<T: serde::de::DeserializeOwned>(
        &self,
        jws: &str,
        validation: &Validation,
    ) -> Result<T, TicketError> {
        let header =
            jsonwebtoken::decode_header(jws).map_err(|e| TicketError::Malformed(e.to_string()))?;
        let keys = self
            .keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = header
            .kid
            .as_ref()
            .and_then(|kid| keys.get(kid))
            .ok_or_else(|| TicketError::UnknownKey(header.kid.clone()))?;
        let decoded =
            jsonwebtoken::decode::<T>(jws, key, validation).map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => TicketError::Expired,
                _ => TicketError::Invalid(e.to_string()),
            })?;
        Ok(decoded.claims)
    }

    /// Tickets refused since the start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// A ticket's claims, if it is signed by a pinned key, for this robot, current, with
    /// an id, and not claiming a longer life than tickets have. Whether it was taken
    /// before is [`TicketCheck::take`]'s, once everything else about the message holds.
    pub fn verify(&self, ticket: Option<&str>) -> Result<TicketClaims, TicketError> {
        let ticket = ticket.ok_or(TicketError::Missing)?;
        let claims: TicketClaims = self.decode(ticket, &self.validation)?;
        self.check_claims(claims)
    }

    /// A ticket of ARP session `connection_id`: signed as [`TicketCheck::verify`] takes
    /// them, or MAC'd with the session's key once it has one.
    fn verify_arp(
        &self,
        ticket: Option<&str>,
        connection_id: &str,
    ) -> Result<TicketClaims, TicketError> {
        let ticket = ticket.ok_or(TicketError::Missing)?;
        let header = jsonwebtoken::decode_header(ticket)
            .map_err(|e| TicketError::Malformed(e.to_string()))?;
        if header.alg != Algorithm::HS256 {
            return self.verify(Some(ticket));
        }
        let sessions = self.sessions();
        let key = sessions
            .keys
            .get(connection_id)
            .filter(|_| header.kid.as_deref() == Some(SESSION_KEY_ID))
            .ok_or_else(|| TicketError::UnknownKey(header.kid.clone()))?;
        let claims = jsonwebtoken::decode::<TicketClaims>(ticket, &key.key, &self.mac_validation)
            .map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => TicketError::Expired,
                _ => TicketError::Invalid(e.to_string()),
            })?
            .claims;
        drop(sessions);
        self.check_claims(claims)
    }

    fn check_claims(&self, claims: TicketClaims) -> Result<TicketClaims, TicketError> {
        if claims.exp.saturating_sub(claims.iat) > MAX_TICKET_LIFETIME_SECS {
            return Err(TicketError::TooLong);
        }
        if claims.robot != self.robot {
            return Err(TicketError::OtherRobot(claims.robot));
        }
        if claims.jti.as_deref().is_none_or(str::is_empty) {
            return Err(TicketError::NoId);
        }
        Ok(claims)
    }

    /// Takes a checked ticket: each is good once, so a copy replayed within its life
    /// (by anything that saw it on the way) is refused.
    fn take(&self, claims: &TicketClaims) -> Result<(), TicketError> {
        let id = claims.jti.as_deref().ok_or(TicketError::NoId)?;
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take(id, claims.exp, unix_now())
    }

    /// The session an offer may open (or a renewal may extend): the ticket's subject
    /// and role, and when the ticket runs out.
    pub fn offer(
        &self,
        session: Option<&SessionMeta>,
        connection_id: &str,
    ) -> Result<Vouched, TicketError> {
        let claims = self.verify(session.and_then(|s| s.ticket.as_deref()))?;
        same_session(&claims, connection_id)?;
        self.take(&claims)?;
        Ok(Vouched {
            expires: claims.exp,
            session: SessionMeta::new(claims.subject, claims.role),
        })
    }

    /// Who sends an ARP frame: the ticket's subject and role, for this session, and for
    /// a request this call id (and a tool call's params).
    pub fn arp_frame(
        &self,
        session: Option<&SessionMeta>,
        connection_id: &str,
        frame: &Value,
    ) -> Result<SessionMeta, TicketError> {
        let claims = self.verify_arp(session.and_then(|s| s.ticket.as_deref()), connection_id)?;
        same_session(&claims, connection_id)?;
        let call_id = frame.get("id").filter(|_| frame.get("method").is_some());
        if claims.call_id.as_ref() != call_id {
            return Err(TicketError::OtherCall);
        }
        if is_tool_call(frame)
            && claims.params_hash.as_deref() != Some(params_hash(frame.get("params")).as_str())
        {
            return Err(TicketError::OtherParams);
        }
        self.take(&claims)?;
        if let (Some(kx), Some(jti)) = (&claims.kx, &claims.jti) {
            self.agree(kx, jti, connection_id);
        }
        Ok(SessionMeta::new(claims.subject, claims.role))
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, SessionKeys> {
        // Plain data: a panic elsewhere cannot leave it half-written.
        self.sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The server's half of session `connection_id`'s key exchange, from a good signed
    /// ticket (`jti`): our half is made and the key derived. Only the first offer of a
    /// session counts; without room, or with a half that is not an X25519 key, none is
    /// agreed and the session's tickets stay signed.
    fn agree(&self, server_half: &str, jti: &str, connection_id: &str) {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine as _;
        use ring::agreement::{agree_ephemeral, EphemeralPrivateKey, UnparsedPublicKey, X25519};
        let mut sessions = self.sessions();
        if sessions.keys.contains_key(connection_id) {
            return;
        }
        if sessions.keys.len() >= MAX_SESSION_KEYS {
            tracing::warn!(%connection_id, max = MAX_SESSION_KEYS, "too many ARP session keys; this session's tickets stay signed");
            return;
        }
        let Ok(peer) = URL_SAFE_NO_PAD.decode(server_half) else {
            tracing::warn!(%connection_id, "a ticket's kx is not base64url; tickets stay signed");
            return;
        };
        let rng = ring::rand::SystemRandom::new();
        let Some((ours, public)) = EphemeralPrivateKey::generate(&X25519, &rng)
            .ok()
            .and_then(|k| Some((k.compute_public_key().ok()?, k)))
            .map(|(public, k)| (k, URL_SAFE_NO_PAD.encode(public.as_ref())))
        else {
            return;
        };
        let derived = agree_ephemeral(ours, &UnparsedPublicKey::new(&X25519, peer), |shared| {
            session_mac_key(shared, jti, connection_id)
        });
        match derived {
            Ok(secret) => {
                let key = SessionKey {
                    key: DecodingKey::from_secret(&secret),
                    unsent: Some(public),
                };
                sessions.keys.insert(connection_id.to_owned(), key);
            }
            Err(_) => {
                tracing::warn!(%connection_id, "a ticket's kx is not an X25519 key; tickets stay signed");
            }
        }
    }

    /// Our half of session `connection_id`'s key exchange, once: it goes in `meta` of
    /// the next frame the robot sends for that session.
    pub fn unsent_key_half(&self, connection_id: &str) -> Option<String> {
        self.sessions().keys.get_mut(connection_id)?.unsent.take()
    }

    /// Session `connection_id` ended: its key is dropped.
    pub fn forget_session(&self, connection_id: &str) {
        self.sessions().keys.remove(connection_id);
    }

    /// Counts and logs a refusal.
    pub fn refuse(&self, what: &str, connection_id: &str, error: &TicketError) {
        let refused = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(%connection_id, %error, refused, "{what} with a bad session ticket refused");
    }
}

fn same_session(claims: &TicketClaims, connection_id: &str) -> Result<(), TicketError> {
    if claims.connection_id == connection_id {
        Ok(())
    } else {
        Err(TicketError::OtherSession(claims.connection_id.clone()))
    }
}

/// The `disconnected` that refuses an offer (as other refusals: `details.reason`).
pub fn offer_refusal(connection_id: &str, error: &TicketError) -> Envelope {
    Envelope::from_body(
        Signalling::Disconnected(DisconnectedPayload {
            connection_id: connection_id.to_owned(),
            reason: DisconnectReason::Failed,
            ice_connection_state: None,
            details: Some(messages::details(
                reason::BAD_TICKET,
                &[("error", Value::String(error.to_string()))],
            )),
        }),
        PROTOCOL_VERSION,
    )
}

/// The answer to a refused ARP request: `-32603` with `data.reason: "bad_ticket"`. A
/// refused notification or answer gets none (JSON-RPC answers neither).
pub fn arp_refusal(connection_id: &str, frame: &Value, error: &TicketError) -> Option<Envelope> {
    frame.get("method")?;
    let id = frame
        .get("id")
        .filter(|id| id.is_string() || id.is_i64() || id.is_u64())?;
    let answer = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": ArpCode::InternalError.code(),
            "message": format!("refused: {error}"),
            "data": { "reason": reason::BAD_TICKET },
        },
    });
    Some(ArpFramePayload::new(connection_id, answer).to_envelope(None))
}

/// An e-stop is taken without a ticket: stopping is always safe, and a stop must not be
/// lost to a clock or key problem. It then counts as a viewer's (the gateway takes an
/// e-stop from anyone).
pub fn is_emergency_stop(frame: &Value) -> bool {
    frame.get("method").and_then(Value::as_str) == Some(method::EMERGENCY_STOP)
}

#[cfg(test)]
#[path = "tickets_tests.rs"]
mod tests;

#[cfg(test)]
mod seen_tests {
    use super::*;

    #[test]
    fn an_id_is_remembered_until_its_ticket_could_no_longer_pass() {
        let mut seen = Seen::default();
        seen.take("a", 100, 50).expect("first");
        assert_eq!(seen.take("a", 100, 60), Err(TicketError::Replayed));
        // Still inside exp + leeway: still a replay.
        assert_eq!(
            seen.take("a", 100, 100 + LEEWAY_SECS),
            Err(TicketError::Replayed)
        );
        // Past it, the entry is swept with the next ticket (the JWT check refuses the
        // old ticket by then anyway).
        seen.take("b", 300, 100 + LEEWAY_SECS + 1).expect("b");
        assert_eq!(seen.ids.len(), 1);
    }

    #[test]
    fn when_full_of_live_tickets_new_ones_are_refused_not_old_ones_forgotten() {
        let mut seen = Seen::default();
        for i in 0..MAX_REMEMBERED {
            seen.take(&i.to_string(), 1_000, 10).expect("room");
        }
        assert_eq!(
            seen.take("one more", 1_000, 10),
            Err(TicketError::TooManyLive)
        );
        assert_eq!(seen.take("0", 1_000, 10), Err(TicketError::Replayed));
        // Once those expire, there is room again.
        seen.take("later", 2_000, 1_000 + LEEWAY_SECS + 1)
            .expect("room");
    }
}
