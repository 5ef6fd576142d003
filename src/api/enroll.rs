use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

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
    let disconnected = state.hub.kick_robot(&body.robot_id, Kick::Revoked);
    tracing::info!(robot = %body.robot_id, csr = certificate.is_some(), disconnected, "robot enrolled");
    Ok((
        StatusCode::CREATED,
        Json(Enrolled {
            robot_id: body.robot_id,
            enrolled: true,
            certificate,
        }),
    ))
}
