use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::extract::{Admin, ApiJson, ApiPath};
use super::{rfc3339, ApiError};
use crate::auth::{random_token, sha256_hex};
use crate::identity::valid_robot_id;
use crate::relay::Kick;
use crate::state::SharedState;
use crate::store::{now_ms, NewRobot, RobotRecord, Role};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateRobot {
    robot_id: String,
    name: Option<String>,
    metadata: Option<serde_json::Map<String, Value>>,
}

const ENROLLMENT_TOKEN_PREFIX: &str = "set_";

fn robot_json(state: &SharedState, robot: &RobotRecord) -> Value {
    json!({
        "robotId": robot.robot_id,
        "name": robot.name,
        "metadata": robot.metadata,
        "online": state.hub.is_online(&robot.robot_id),
        "credential": robot.credential_kind(),
        "credentialRevoked": robot.credential_revoked,
        "createdAt": rfc3339(robot.created_at),
        "lastSeenAt": robot.last_seen_at.and_then(rfc3339),
        "node": robot.node,
    })
}

fn fresh_enrollment_token(state: &SharedState) -> (String, String, i64) {
    let token = random_token(ENROLLMENT_TOKEN_PREFIX);
    let hash = sha256_hex(token.as_bytes());
    let ttl_ms = state.config.enrollment_token_ttl_secs.saturating_mul(1000) as i64;
    (token, hash, now_ms() + ttl_ms)
}

pub async fn create(
    _: Admin,
    State(state): State<SharedState>,
    ApiJson(body): ApiJson<CreateRobot>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    if !valid_robot_id(&body.robot_id) {
        return Err(ApiError::Unprocessable(
            "robotId must be 1-128 characters of letters, digits and . _ : -".into(),
        ));
    }
    let (token, hash, expires_at) = fresh_enrollment_token(&state);
    let metadata = body.metadata.map(Value::Object);
    let created = state
        .store
        .create_robot(NewRobot {
            robot_id: &body.robot_id,
            name: body.name.as_deref(),
            metadata: metadata.as_ref(),
            enrollment_token_hash: Some(&hash),
            enrollment_token_expires_at: Some(expires_at),
        })
        .await?;
    if !created {
        return Err(ApiError::Conflict(format!(
            "robot {} already exists",
            body.robot_id
        )));
    }
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "robotId": body.robot_id,
            "enrollmentToken": token,
            "enrollmentTokenExpiresAt": rfc3339(expires_at),
        })),
    ))
}

pub async fn list(_: Admin, State(state): State<SharedState>) -> Result<Json<Value>, ApiError> {
    let robots = state.store.robots().await?;
    Ok(Json(Value::Array(
        robots.iter().map(|r| robot_json(&state, r)).collect(),
    )))
}

async fn existing(state: &SharedState, id: &str) -> Result<RobotRecord, ApiError> {
    state
        .store
        .robot(id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no robot {id}")))
}

pub async fn show(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let robot = existing(&state, &id).await?;
    Ok(Json(robot_json(&state, &robot)))
}

pub async fn delete(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    if !state.store.delete_robot(&id).await? {
        return Err(ApiError::NotFound(format!("no robot {id}")));
    }
    state.hub.kick_robot(&id, Kick::Revoked);
    Ok(StatusCode::NO_CONTENT)
}

pub async fn new_enrollment_token(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let (token, hash, expires_at) = fresh_enrollment_token(&state);
    if !state
        .store
        .set_enrollment_token(&id, &hash, expires_at)
        .await?
    {
        return Err(ApiError::NotFound(format!("no robot {id}")));
    }
    Ok(Json(
        json!({ "enrollmentToken": token, "expiresAt": rfc3339(expires_at) }),
    ))
}

pub async fn revoke(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.identity.revoke(&id, "admin").await? {
        return Err(ApiError::NotFound(format!("no robot {id}")));
    }
    let disconnected = state.hub.kick_robot(&id, Kick::Revoked);
    tracing::warn!(robot = %id, disconnected, "robot credential revoked");
    Ok(Json(
        json!({ "robotId": id, "revoked": true, "disconnected": disconnected }),
    ))
}

pub async fn grants(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    existing(&state, &id).await?;
    let grants = state.store.grants(&id).await?;
    Ok(Json(Value::Array(
        grants
            .iter()
            .map(|g| json!({ "robotId": g.robot_id, "subject": g.subject, "role": g.role, "createdAt": rfc3339(g.created_at) }))
            .collect(),
    )))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutGrant {
    role: Role,
}

pub async fn put_grant(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath((id, subject)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<PutGrant>,
) -> Result<Json<Value>, ApiError> {
    if subject.is_empty() || subject.len() > 256 {
        return Err(ApiError::Unprocessable(
            "subject must be 1-256 characters".into(),
        ));
    }
    existing(&state, &id).await?;
    state.store.put_grant(&id, &subject, body.role).await?;
    Ok(Json(
        json!({ "robotId": id, "subject": subject, "role": body.role }),
    ))
}

pub async fn delete_grant(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath((id, subject)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    if !state.store.delete_grant(&id, &subject).await? {
        return Err(ApiError::NotFound(format!(
            "no grant for {subject} on {id}"
        )));
    }
    // A withdrawn grant also ends what it allowed.
    let ended = state.hub.end_sessions_of(&id, &subject);
    for session in &ended {
        state
            .store
            .end_session(&session.record_id, "grant_revoked")
            .await?;
    }
    state.hub.notify(&ended);
    Ok(StatusCode::NO_CONTENT)
}
