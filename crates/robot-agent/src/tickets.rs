//! Session tickets, the robot's side: the server's signed word on who may do what.
//!
//! Once the robot has pinned the server's signing keys ([`crate::server_keys`]), every
//! offer and every gateway `arp.frame` must carry a ticket in `meta.session.ticket`: a
//! JWS (EdDSA) by a pinned key, for this robot, not expired, for the very session (and
//! for an ARP request, the very call and params) it comes with. The role the robot then
//! enforces is the ticket's, never the plain `meta.session.role`, which anything between
//! the server and the robot could rewrite. Whatever fails is refused before the peer
//! manager or the ARP server sees it (fail closed), logged and counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{json, Value};
use signalling_protocol::arp::{method, reason, ArpCode, ArpFramePayload};
use signalling_protocol::ticket::{
    is_tool_call, params_hash, TicketClaims, MAX_TICKET_LIFETIME_SECS,
};
use signalling_protocol::{
    DisconnectReason, DisconnectedPayload, Envelope, SessionMeta, Signalling, PROTOCOL_VERSION,
};

use crate::messages;
use crate::server_keys::PinnedKey;

/// Clock difference between server and robot a ticket survives, in seconds.
const LEEWAY_SECS: u64 = 30;

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
}

/// Checks tickets against the pinned keys, for one robot.
pub struct TicketCheck {
    robot: String,
    keys: HashMap<String, DecodingKey>,
    validation: Validation,
    refused: AtomicU64,
}

impl std::fmt::Debug for TicketCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketCheck")
            .field("robot", &self.robot)
            .field("keys", &self.keys.keys().collect::<Vec<_>>())
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
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.leeway = LEEWAY_SECS;
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["exp"]);
        Some(TicketCheck {
            robot: robot.to_owned(),
            keys,
            validation,
            refused: AtomicU64::new(0),
        })
    }

    /// Tickets refused since the start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// A ticket's claims, if it is signed by a pinned key, for this robot, current and
    /// not claiming a longer life than tickets have.
    pub fn verify(&self, ticket: Option<&str>) -> Result<TicketClaims, TicketError> {
        let ticket = ticket.ok_or(TicketError::Missing)?;
        let header = jsonwebtoken::decode_header(ticket)
            .map_err(|e| TicketError::Malformed(e.to_string()))?;
        let key = header
            .kid
            .as_ref()
            .and_then(|kid| self.keys.get(kid))
            .ok_or_else(|| TicketError::UnknownKey(header.kid.clone()))?;
        let claims = jsonwebtoken::decode::<TicketClaims>(ticket, key, &self.validation)
            .map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => TicketError::Expired,
                _ => TicketError::Invalid(e.to_string()),
            })?
            .claims;
        if claims.exp.saturating_sub(claims.iat) > MAX_TICKET_LIFETIME_SECS {
            return Err(TicketError::TooLong);
        }
        if claims.robot != self.robot {
            return Err(TicketError::OtherRobot(claims.robot));
        }
        Ok(claims)
    }

    /// The session an offer may open: the ticket's subject and role.
    pub fn offer(
        &self,
        session: Option<&SessionMeta>,
        connection_id: &str,
    ) -> Result<SessionMeta, TicketError> {
        let claims = self.verify(session.and_then(|s| s.ticket.as_deref()))?;
        same_session(&claims, connection_id)?;
        Ok(SessionMeta::new(claims.subject, claims.role))
    }

    /// Who sends an ARP frame: the ticket's subject and role, for this session, and for
    /// a request this call id (and a tool call's params).
    pub fn arp_frame(
        &self,
        session: Option<&SessionMeta>,
        connection_id: &str,
        frame: &Value,
    ) -> Result<SessionMeta, TicketError> {
        let claims = self.verify(session.and_then(|s| s.ticket.as_deref()))?;
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
        Ok(SessionMeta::new(claims.subject, claims.role))
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
