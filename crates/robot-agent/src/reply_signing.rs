//! Signed replies (opt-in, `sign_replies = true`): the robot signs every `agent.*`
//! message it sends on a data channel with its enrolled key, so a client can check,
//! against the key the server published at enrollment (`GET /v1/robots/{id}/key`), that
//! the message came from the robot and nothing between changed it.
//!
//! The signature is a detached compact JWS (RFC 7515, Appendix F) in `meta.signature`:
//! `BASE64URL(header) ".." BASE64URL(signature)`, header `{"alg":"EdDSA"|"ES256",
//! "kid":<robot id>}`. The JWS payload, left out, is the message itself without
//! `meta.signature` (and without `meta` if nothing else is in it), serialised canonically
//! ([`canonical_json`]: keys sorted at every depth, no whitespace). ES256 signatures are
//! the fixed 64-byte r||s form (RFC 7518, section 3.4).
//!
//! ARP frames of the server's gateway are signed the same way when the program asked for
//! it with a nonce (`/v1/robots/{id}/arp?signed=<nonce>`): the header also holds the
//! `nonce`, which binds each frame to that program's connection (an answer signed for
//! another connection does not verify), and the payload is the JSON-RPC frame without its
//! `signature` member ([`ArpFrameSigner`], [`verify_arp_frame`]). ARP frames carry no
//! `meta`: the signature travels in the `arp.frame` envelope's `meta.signature` and the
//! server hands it to the program as the frame's top-level `signature`.

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::signature::{UnparsedPublicKey, VerificationAlgorithm, ECDSA_P256_SHA256_FIXED, ED25519};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use signalling_protocol::arp::FRAME_SIGNATURE_KEY;
use signalling_protocol::ticket::canonical_json;
use signalling_protocol::Envelope;

use crate::identity::{IdentityError, JwsSigner, RobotKey};

/// Key of the signature in the envelope's `meta`.
pub const SIGNATURE_META_KEY: &str = "signature";

#[derive(Debug, thiserror::Error)]
pub enum ReplySigningError {
    #[error("cannot sign with the robot's key: {0}")]
    Key(#[from] IdentityError),
    #[error("the message carries no signature")]
    Missing,
    #[error("meta.signature is not a detached compact JWS: {0}")]
    Malformed(String),
    #[error("the JWS algorithm {0:?} does not fit the robot's key")]
    Algorithm(String),
    #[error("the key is not an Ed25519 or P-256 JWK: {0}")]
    Jwk(String),
    #[error("the signature does not verify")]
    BadSignature,
    #[error("the signature was made for another nonce (another connection)")]
    Nonce,
}

/// The protected header of a reply's JWS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyHeader {
    pub alg: String,
    /// The robot id.
    pub kid: String,
    /// ARP frames only: the program's nonce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
}

/// Signs the replies of one robot.
pub struct ReplySigner {
    key: JwsSigner,
    /// `BASE64URL(header)`, the same for every message.
    header: String,
    robot_id: String,
}

impl std::fmt::Debug for ReplySigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplySigner")
            .field("alg", &self.key.alg())
            .finish()
    }
}

impl ReplySigner {
    /// The signer `run` shares with every session: `None` unless `sign_replies` (the
    /// config's `sign_replies = true`).
    pub fn configured(
        sign_replies: bool,
        robot_id: &str,
        key: &RobotKey,
    ) -> Result<Option<Arc<ReplySigner>>, IdentityError> {
        if !sign_replies {
            return Ok(None);
        }
        let signer = ReplySigner::new(key, robot_id)?;
        tracing::info!(
            alg = signer.alg(),
            "data-channel replies are signed (sign_replies)"
        );
        Ok(Some(Arc::new(signer)))
    }

    pub fn new(key: &RobotKey, robot_id: &str) -> Result<ReplySigner, IdentityError> {
        let key = key.jws_signer()?;
        let header = ReplyHeader {
            alg: key.alg().to_owned(),
            kid: robot_id.to_owned(),
            nonce: None,
        };
        Ok(ReplySigner {
            header: encoded_header(&header),
            key,
            robot_id: robot_id.to_owned(),
        })
    }

    /// The signer of one gateway ARP session's frames, for the program's `nonce`.
    pub fn for_arp(self: &Arc<Self>, nonce: &str) -> ArpFrameSigner {
        let header = ReplyHeader {
            alg: self.key.alg().to_owned(),
            kid: self.robot_id.clone(),
            nonce: Some(nonce.to_owned()),
        };
        ArpFrameSigner {
            signer: self.clone(),
            header: encoded_header(&header),
        }
    }

    /// `EdDSA` or `ES256`.
    pub fn alg(&self) -> &'static str {
        self.key.alg()
    }

    /// The public key as a JWK (`OKP`/`Ed25519` or `EC`/`P-256`), as the server serves it.
    pub fn jwk(&self) -> Value {
        public_jwk(self.key.public_key())
    }

    /// Sets `meta.signature` of `envelope` (replacing any there).
    pub fn sign(&self, envelope: &mut Envelope) -> Result<(), ReplySigningError> {
        let input = signing_input(&self.header, envelope);
        let signature = self.key.sign(input.as_bytes())?;
        let jws = format!("{}..{}", self.header, URL_SAFE_NO_PAD.encode(signature));
        envelope
            .meta
            .get_or_insert_with(Default::default)
            .insert(SIGNATURE_META_KEY.into(), Value::String(jws));
        Ok(())
    }
}

/// Signs the frames one gateway ARP session sends, binding the program's nonce.
#[derive(Debug, Clone)]
pub struct ArpFrameSigner {
    signer: Arc<ReplySigner>,
    /// `BASE64URL(header)` with the nonce.
    header: String,
}

impl ArpFrameSigner {
    /// The detached JWS over `frame` (which must not hold a `signature` member).
    pub fn sign(&self, frame: &Value) -> Result<String, ReplySigningError> {
        let input = format!(
            "{}.{}",
            self.header,
            URL_SAFE_NO_PAD.encode(canonical_json(frame))
        );
        let signature = self.signer.key.sign(input.as_bytes())?;
        Ok(format!(
            "{}..{}",
            self.header,
            URL_SAFE_NO_PAD.encode(signature)
        ))
    }
}

fn encoded_header(header: &ReplyHeader) -> String {
    URL_SAFE_NO_PAD.encode(canonical_json(&json!(header)))
}

/// The JWK of a raw public key: 32 bytes Ed25519, or a 65-byte uncompressed P-256 point.
pub fn public_jwk(public: &[u8]) -> Value {
    match public {
        [0x04, point @ ..] if point.len() == 64 => json!({
            "kty": "EC",
            "crv": "P-256",
            "x": URL_SAFE_NO_PAD.encode(&point[..32]),
            "y": URL_SAFE_NO_PAD.encode(&point[32..]),
        }),
        _ => json!({ "kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(public) }),
    }
}

/// What a reply's signature covers: the message without `meta.signature` (and without an
/// empty `meta` left behind), in canonical JSON.
pub fn signed_content(envelope: &Envelope) -> String {
    // An Envelope is strings and JSON values: it always serialises.
    let mut value = serde_json::to_value(envelope).unwrap_or(Value::Null);
    if let Some(message) = value.as_object_mut() {
        let empty = match message.get_mut("meta") {
            Some(Value::Object(meta)) => {
                meta.remove(SIGNATURE_META_KEY);
                meta.is_empty()
            }
            _ => false,
        };
        if empty {
            message.remove("meta");
        }
    }
    canonical_json(&value)
}

fn signing_input(header_b64: &str, envelope: &Envelope) -> String {
    format!(
        "{header_b64}.{}",
        URL_SAFE_NO_PAD.encode(signed_content(envelope))
    )
}

/// Checks `meta.signature` of `envelope` against the robot's public key `jwk`; returns
/// the JWS header (the caller checks `kid` names the robot it expects).
pub fn verify(envelope: &Envelope, jwk: &Value) -> Result<ReplyHeader, ReplySigningError> {
    let jws = envelope
        .meta
        .as_ref()
        .and_then(|m| m.get(SIGNATURE_META_KEY))
        .ok_or(ReplySigningError::Missing)?;
    verify_detached(jws, &signed_content(envelope), jwk)
}

/// Checks the top-level `signature` of an ARP frame as the gateway hands it to a program
/// that asked with `nonce`, against the robot's public key `jwk`; returns the JWS header
/// (the caller checks `kid` names the robot it expects).
pub fn verify_arp_frame(
    frame: &Value,
    jwk: &Value,
    nonce: &str,
) -> Result<ReplyHeader, ReplySigningError> {
    let mut unsigned = frame.clone();
    let jws = unsigned
        .as_object_mut()
        .and_then(|f| f.remove(FRAME_SIGNATURE_KEY))
        .ok_or(ReplySigningError::Missing)?;
    let header = verify_detached(&jws, &canonical_json(&unsigned), jwk)?;
    if header.nonce.as_deref() != Some(nonce) {
        return Err(ReplySigningError::Nonce);
    }
    Ok(header)
}

/// Checks the detached compact JWS `jws` over `content`.
fn verify_detached(
    jws: &Value,
    content: &str,
    jwk: &Value,
) -> Result<ReplyHeader, ReplySigningError> {
    let jws = jws
        .as_str()
        .ok_or_else(|| ReplySigningError::Malformed("not a string".into()))?;
    let (header_b64, signature_b64) = jws
        .split_once("..")
        .ok_or_else(|| ReplySigningError::Malformed("expected HEADER..SIGNATURE".into()))?;
    let bad = |what: &str| ReplySigningError::Malformed(what.to_owned());
    let header: ReplyHeader = URL_SAFE_NO_PAD
        .decode(header_b64)
        .ok()
        .and_then(|h| serde_json::from_slice(&h).ok())
        .ok_or_else(|| bad("the header is not base64url JSON"))?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature_b64)
        .map_err(|_| bad("the signature is not base64url"))?;
    let (algorithm, public, alg): (&dyn VerificationAlgorithm, Vec<u8>, &str) =
        match (jwk_str(jwk, "kty")?, jwk_str(jwk, "crv")?) {
            ("OKP", "Ed25519") => (&ED25519, jwk_bytes(jwk, "x", 32)?, "EdDSA"),
            ("EC", "P-256") => {
                let mut point = vec![0x04];
                point.extend(jwk_bytes(jwk, "x", 32)?);
                point.extend(jwk_bytes(jwk, "y", 32)?);
                (&ECDSA_P256_SHA256_FIXED, point, "ES256")
            }
            (kty, crv) => return Err(ReplySigningError::Jwk(format!("{kty}/{crv}"))),
        };
    // The algorithm is the key's, never the message's choice.
    if header.alg != alg {
        return Err(ReplySigningError::Algorithm(header.alg));
    }
    let input = format!("{header_b64}.{}", URL_SAFE_NO_PAD.encode(content));
    UnparsedPublicKey::new(algorithm, public)
        .verify(input.as_bytes(), &signature)
        .map_err(|_| ReplySigningError::BadSignature)?;
    Ok(header)
}

fn jwk_str<'a>(jwk: &'a Value, field: &str) -> Result<&'a str, ReplySigningError> {
    jwk.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| ReplySigningError::Jwk(format!("no {field}")))
}

fn jwk_bytes(jwk: &Value, field: &str, len: usize) -> Result<Vec<u8>, ReplySigningError> {
    URL_SAFE_NO_PAD
        .decode(jwk_str(jwk, field)?)
        .ok()
        .filter(|b| b.len() == len)
        .ok_or_else(|| ReplySigningError::Jwk(format!("{field} is not {len} bytes of base64url")))
}

#[cfg(test)]
#[path = "reply_signing_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "reply_signing_peer_tests.rs"]
mod peer_tests;
