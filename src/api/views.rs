//! What the API answers: one typed struct per response shape (contract section 2), so a
//! field cannot be misspelt in one handler and right in another.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::rfc3339;
use crate::pki::PublicKey;
use crate::store::{ClientToken, Grant, RobotRecord, Role, SessionRecord};

/// A role's spelling on the wire and in the API (the protocol crate's `Role`).
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)] // only its schema is used
pub enum RoleName {
    Viewer,
    Operator,
    Owner,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RobotView<'a> {
    pub robot_id: &'a str,
    pub name: Option<&'a str>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<&'a Value>,
    pub online: bool,
    /// `ed25519`, `ecdsa-p256`, `ecdsa-p384`, `rsa`, `x509`, or null before enrollment.
    pub credential: Option<&'a str>,
    pub credential_revoked: bool,
    pub created_at: Option<String>,
    pub last_seen_at: Option<String>,
    pub node: Option<&'a str>,
}

impl<'a> RobotView<'a> {
    pub fn new(robot: &'a RobotRecord, online: bool) -> Self {
        RobotView {
            robot_id: &robot.robot_id,
            name: robot.name.as_deref(),
            metadata: robot.metadata.as_ref(),
            online,
            credential: robot.credential_kind(),
            credential_revoked: robot.credential_revoked,
            created_at: rfc3339(robot.created_at),
            last_seen_at: robot.last_seen_at.and_then(rfc3339),
            node: robot.node.as_deref(),
        }
    }
}

/// A robot's public key (`GET /v1/robots/{id}/key`): what its signed replies are checked
/// against.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RobotKeyView {
    pub robot_id: String,
    /// `ed25519`, `ecdsa-p256`, or `x509` (then `jwk` is the leaf certificate's key).
    pub credential: String,
    pub jwk: RobotJwk,
}

/// A public key as a JWK (RFC 7517/8037): Ed25519 or P-256.
#[derive(Serialize, ToSchema)]
pub struct RobotJwk {
    /// `OKP` (Ed25519) or `EC` (P-256).
    #[schema(example = "OKP")]
    pub kty: &'static str,
    /// `Ed25519` or `P-256`.
    #[schema(example = "Ed25519")]
    pub crv: &'static str,
    /// The raw key (Ed25519) or the point's x coordinate, base64url without padding.
    pub x: String,
    /// P-256 only: the point's y coordinate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub y: Option<String>,
    /// The JWS algorithm the robot signs with: `EdDSA` or `ES256`.
    #[schema(example = "EdDSA")]
    pub alg: &'static str,
}

impl RobotJwk {
    /// `None` for the key types robot-agent does not sign replies with.
    pub fn of(key: &PublicKey) -> Option<RobotJwk> {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine as _;
        match key {
            PublicKey::Ed25519(raw) => Some(RobotJwk {
                kty: "OKP",
                crv: "Ed25519",
                x: URL_SAFE_NO_PAD.encode(raw),
                y: None,
                alg: "EdDSA",
            }),
            // An uncompressed point: 0x04, x, y (checked when it was stored).
            PublicKey::EcdsaP256(point) if point.len() == 65 => Some(RobotJwk {
                kty: "EC",
                crv: "P-256",
                x: URL_SAFE_NO_PAD.encode(&point[1..33]),
                y: Some(URL_SAFE_NO_PAD.encode(&point[33..])),
                alg: "ES256",
            }),
            _ => None,
        }
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RobotCreated {
    pub robot_id: String,
    pub enrollment_token: String,
    pub enrollment_token_expires_at: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnrollmentToken {
    pub enrollment_token: String,
    pub expires_at: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Revoked {
    pub robot_id: String,
    pub revoked: bool,
    pub disconnected: bool,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantView<'a> {
    pub robot_id: &'a str,
    pub subject: &'a str,
    #[schema(value_type = RoleName)]
    pub role: Role,
    /// Absent in the answer to PUT, which sets a grant without reading it back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
}

impl<'a> GrantView<'a> {
    pub fn new(grant: &'a Grant) -> Self {
        GrantView {
            robot_id: &grant.robot_id,
            subject: &grant.subject,
            role: grant.role,
            created_at: rfc3339(grant.created_at),
        }
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenCreated {
    pub token_id: String,
    pub token: String,
    pub subject: String,
    pub expires_at: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenView<'a> {
    pub token_id: &'a str,
    pub subject: &'a str,
    pub expires_at: Option<String>,
    /// When it was revoked; null while it is valid (or merely expired).
    pub revoked_at: Option<String>,
}

impl<'a> TokenView<'a> {
    pub fn new(t: &'a ClientToken) -> Self {
        TokenView {
            token_id: &t.token_id,
            subject: &t.subject,
            expires_at: rfc3339(t.expires_at),
            revoked_at: t.revoked_at.and_then(rfc3339),
        }
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionView<'a> {
    pub connection_id: &'a str,
    pub robot_id: &'a str,
    pub subject: &'a str,
    #[schema(value_type = RoleName)]
    pub role: &'a str,
    pub node: &'a str,
    pub started_at: Option<String>,
    pub connected_at: Option<String>,
    pub ended_at: Option<String>,
    /// `closed`, `failed`, `timeout`, `grant_revoked`, `grant_changed`, `server_shutdown`,
    /// `server_restart`…; null while the session is live.
    pub end_reason: Option<&'a str>,
}

impl<'a> SessionView<'a> {
    pub fn new(s: &'a SessionRecord) -> Self {
        SessionView {
            connection_id: &s.connection_id,
            robot_id: &s.robot_id,
            subject: &s.subject,
            role: &s.role,
            node: &s.node,
            started_at: rfc3339(s.started_at),
            connected_at: s.connected_at.and_then(rfc3339),
            ended_at: s.ended_at.and_then(rfc3339),
            end_reason: s.end_reason.as_deref(),
        }
    }
}

#[derive(Serialize)]
pub struct Health {
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database: Option<&'static str>,
    /// Freshness of the loaded CRLs, when `--crl` is set (a stale CRL shows here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crl: Option<CrlHealth>,
    /// Audit records the database would not take, when there are any (`degraded`: they
    /// wait in the spill file or memory to be loaded back).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditHealth>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditHealth {
    pub status: &'static str,
    pub spilled_records: usize,
}

#[derive(Serialize)]
pub struct CrlHealth {
    /// "fresh", or "stale" when any list is past its nextUpdate.
    pub status: &'static str,
    pub lists: Vec<CrlList>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CrlList {
    pub issuer: String,
    pub this_update: Option<String>,
    pub next_update: Option<String>,
    pub stale: bool,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Enrolled {
    pub robot_id: String,
    pub enrolled: bool,
    /// The chain our CA issued, for a CSR enrollment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
    /// The server's public signing keys (as `GET /v1/signing-keys`): the robot pins them
    /// and checks the session tickets of what the server forwards to it.
    pub signing_keys: crate::pki::Jwks,
}
