use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use utoipa::ToSchema;

use super::extract::ApiJson;
use super::views::Enrolled;
use super::ApiError;
use crate::relay::Kick;
use crate::state::SharedState;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Enroll {
    robot_id: String,
    enrollment_token: String,
    public_key: Option<String>,
    csr: Option<String>,
}

/// The two shapes of an enrollment, for the API document: exactly one of `publicKey` and
/// `csr` (the handler reads both into `Enroll` and refuses other combinations with 422).
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // only its schema is used
pub enum EnrollBody {
    Key(EnrollWithKey),
    Csr(EnrollWithCsr),
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)] // only its schema is used
pub struct EnrollWithKey {
    robot_id: String,
    enrollment_token: String,
    /// Raw 32-byte Ed25519 key in base64, or a PEM SubjectPublicKeyInfo.
    public_key: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)] // only its schema is used
pub struct EnrollWithCsr {
    robot_id: String,
    enrollment_token: String,
    /// A PEM CSR whose subject or SAN names the robot.
    csr: String,
}

/// A robot enrolls its public key (Ed25519 raw base64, or PEM SPKI) or a CSR with its
/// single-use enrollment token.
#[utoipa::path(post, path = "/v1/enroll", tag = "enrollment", request_body = EnrollBody,
    responses((status = 201, body = Enrolled), super::error::CommonErrors))]
pub async fn enroll(
    State(state): State<SharedState>,
    ApiJson(body): ApiJson<Enroll>,
) -> Result<(StatusCode, Json<Enrolled>), ApiError> {
    let certificate = state
        .identity
        .enroll(
            &body.robot_id,
            &body.enrollment_token,
            body.public_key.as_deref(),
            body.csr.as_deref(),
        )
        .await?;
    // The new credential supersedes every earlier one, so a socket that proved an older
    // key must not stay online: close it at once, like revoke (the robot reconnects with
    // its new credential).
    let disconnected = state.presence.kick_robot(&body.robot_id, Kick::Revoked);
    tracing::info!(robot = %body.robot_id, csr = certificate.is_some(), disconnected, "robot enrolled");
    Ok((
        StatusCode::CREATED,
        Json(Enrolled {
            robot_id: body.robot_id,
            enrolled: true,
            certificate,
            signing_keys: state.tickets.jwks(),
        }),
    ))
}
