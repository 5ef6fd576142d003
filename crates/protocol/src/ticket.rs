//! Session tickets: the server's signed word on who may do what with a robot.
//!
//! The server puts a compact JWS (EdDSA, Ed25519) in `meta.session.ticket` of every
//! offer and every `arp.frame` it forwards to a robot; a robot that pinned the
//! deployment's signing keys at enrollment checks it before it acts, and enforces the
//! ticket's role rather than the plain `meta.session.role` (which anything in the
//! path could rewrite). This module holds what both ends must agree on: the claims,
//! and how a call's params are hashed. Signing and verifying are each end's own
//! (the server's `tickets`, robot-agent's `tickets`).
//!
//! An ARP session carries a ticket on every frame, bound to the call: one signature per
//! call would cost both ends more than the rest of the call. So the session's first ticket
//! (signed) also carries the server's half of an X25519 exchange ([`TicketClaims::kx`]);
//! the robot answers with its half ([`KEY_EXCHANGE_META_KEY`]) and both derive one key for
//! the session ([`session_mac_key`]). Later tickets of that session are the same claims
//! with an HMAC (HS256, `kid` [`SESSION_KEY_ID`]) instead of a signature. The server's half
//! is signed, so only it and the robot can know the key: anything between that swaps the
//! robot's half only makes the robot refuse the server's tickets (a denial, never a forgery).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::session::Role;
// Defined beside `meta.session`, which holds it: `session` imports nothing of `ticket`.
pub use crate::session::TICKET_META_KEY;

/// Longest life of a ticket, in seconds (the server mints shorter ones).
pub const MAX_TICKET_LIFETIME_SECS: u64 = 300;

/// `type` of the envelope in which the server renews the ticket of a live teleop
/// session: payload `{"connectionId"}`, the new ticket in `meta.session` as on an offer.
/// Ours, not the Modulr spec's: sent only to robots that declared
/// [`REGISTER_METADATA_KEY`], so the Modulr agent never sees one.
pub const RENEW_TYPE: &str = "session.ticket";

/// `type` of the envelope in which the server, during a key rotation, hands a robot that
/// declared [`REGISTER_METADATA_KEY`] the new signing key endorsed by the previous one:
/// payload `{"endorsement": JWS}`, a JWS by the previous key over [`KeyEndorsement`]. A
/// robot that pinned the previous key pins the new one (no `trust-key` by hand).
pub const KEYS_TYPE: &str = "session.signing_keys";

/// The claims of a key endorsement: public keys (JWKs, `OKP`/`Ed25519`) that the signer
/// vouches for as its successors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyEndorsement {
    pub endorses: Vec<Value>,
    /// Issued at, seconds since the Unix epoch (for the record).
    pub iat: u64,
}

/// `details.reason` of the `signalling.disconnected` by which a robot ends a session
/// whose ticket ran out unrenewed.
pub const EXPIRED_REASON: &str = "ticket_expired";

/// Key of `signalling.register`'s `payload.metadata` under which a robot says it
/// takes [`RENEW_TYPE`] (value `true`). A session whose ticket the robot checks lasts
/// only as long as the server keeps renewing it.
pub const REGISTER_METADATA_KEY: &str = "sessionTickets";

/// The claims of a session ticket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TicketClaims {
    /// The robot the ticket is for.
    pub robot: String,
    /// The session (teleop) or ARP session the message belongs to.
    pub connection_id: String,
    /// Who is on the other end.
    pub subject: String,
    /// What they may do: the role the robot enforces.
    pub role: Role,
    /// The node that minted the ticket (for the record).
    pub node: String,
    /// Issued at, seconds since the Unix epoch.
    pub iat: u64,
    /// Expires at, seconds since the Unix epoch.
    pub exp: u64,
    /// A random id of this one ticket: a robot takes each ticket once (replays are
    /// refused within its life).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
    /// For an ARP request: its JSON-RPC id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<Value>,
    /// For an `arp.callTool`: [`params_hash`] of its params.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params_hash: Option<String>,
    /// On the first signed ticket of an ARP session: the server's X25519 public key
    /// (base64url) for the session's MAC key ([`session_mac_key`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kx: Option<String>,
}

/// Key of an `arp.frame`'s `meta` (robot to server) holding the robot's X25519 public key
/// (base64url), its answer to a ticket's [`TicketClaims::kx`].
pub const KEY_EXCHANGE_META_KEY: &str = "ticketKey";

/// `kid` in the header of a ticket MAC'd with its ARP session's key.
pub const SESSION_KEY_ID: &str = "arp-session";

/// The MAC key of one ARP session: HKDF-SHA256 of the X25519 shared secret, salted with
/// the `jti` of the ticket that carried the server's half, bound to the session's id.
pub fn session_mac_key(shared_secret: &[u8], kx_ticket_id: &str, connection_id: &str) -> [u8; 32] {
    use ring::hkdf;
    struct Len32;
    impl hkdf::KeyType for Len32 {
        fn len(&self) -> usize {
            32
        }
    }
    let info = [
        b"arp-session-ticket-mac/1 ".as_slice(),
        connection_id.as_bytes(),
    ];
    let mut key = [0u8; 32];
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, kx_ticket_id.as_bytes()).extract(shared_secret);
    // 32 bytes is far below HKDF-SHA256's limit (255 * 32), so neither step can fail.
    if let Ok(okm) = prk.expand(&info, Len32) {
        let _ = okm.fill(&mut key);
    }
    key
}

/// The JSON text of `value` in canonical form: object keys sorted (recursively), no
/// whitespace. Both ends hash this, so neither's map order nor its formatting matters.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// SHA-256 (base64url, no padding) of the canonical JSON of a call's `params`
/// (`null` when it has none): binds a ticket to the exact arguments of one call.
pub fn params_hash(params: Option<&Value>) -> String {
    use base64::Engine;
    let text = canonical_json(params.unwrap_or(&Value::Null));
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest.as_ref())
}

/// Whether an ARP frame is a tool call, whose ticket must carry [`params_hash`].
pub fn is_tool_call(frame: &Value) -> bool {
    frame.get("method").and_then(Value::as_str) == Some(crate::arp::method::CALL_TOOL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth_and_drops_whitespace() {
        let a: Value =
            serde_json::from_str(r#"{ "b": 1, "a": { "y": [1, {"d":2,"c":3}], "x": "é" } }"#)
                .unwrap();
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"x":"é","y":[1,{"c":3,"d":2}]},"b":1}"#
        );
    }

    #[test]
    fn params_hash_ignores_key_order_and_sees_any_change() {
        let one = json!({ "name": "move", "arguments": { "linear": 0.2, "angular": 0 } });
        let two: Value =
            serde_json::from_str(r#"{"arguments":{"angular":0,"linear":0.2},"name":"move"}"#)
                .unwrap();
        assert_eq!(params_hash(Some(&one)), params_hash(Some(&two)));
        let faster = json!({ "name": "move", "arguments": { "linear": 0.9, "angular": 0 } });
        assert_ne!(params_hash(Some(&one)), params_hash(Some(&faster)));
        assert_eq!(params_hash(None), params_hash(Some(&Value::Null)));
        assert_eq!(params_hash(None).len(), 43);
    }

    #[test]
    fn the_session_key_depends_on_the_secret_the_ticket_and_the_session() {
        let key = session_mac_key(&[7; 32], "jti-1", "arp-1");
        assert_eq!(key, session_mac_key(&[7; 32], "jti-1", "arp-1"));
        assert_ne!(key, session_mac_key(&[8; 32], "jti-1", "arp-1"));
        assert_ne!(key, session_mac_key(&[7; 32], "jti-2", "arp-1"));
        assert_ne!(key, session_mac_key(&[7; 32], "jti-1", "arp-2"));
        assert_ne!(key, [0; 32]);
    }

    #[test]
    fn claims_use_camel_case_and_leave_out_what_is_absent() {
        let claims = TicketClaims {
            robot: "r1".into(),
            connection_id: "c1".into(),
            subject: "alice".into(),
            role: Role::Operator,
            node: "n1".into(),
            iat: 1,
            exp: 2,
            jti: None,
            call_id: None,
            params_hash: None,
            kx: None,
        };
        let value = serde_json::to_value(&claims).unwrap();
        assert_eq!(
            value,
            json!({"robot":"r1","connectionId":"c1","subject":"alice","role":"operator","node":"n1","iat":1,"exp":2})
        );
    }
}
