use std::collections::HashMap;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::extract::{require_grant_or_admin, Admin, ApiJson, ApiPath};
use super::views::{
    EnrollmentToken, GrantView, Revoked, RobotCreated, RobotJwk, RobotKeyView, RobotView,
};
use super::{rfc3339, ApiError};
use crate::auth::{random_token, sha256_hex};
use crate::identity::{valid_robot_id, ROBOT_ID_RULE};
use crate::pki::{leaf_key_of_chain, PublicKey};
use crate::relay::{EndReason, Kick};
use crate::state::SharedState;
use crate::store::{now_ms, Credential, NewRobot, RobotRecord, Role};

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateRobot {
    /// 1-128 characters of letters, digits and `. _ : -`.
    #[schema(
        pattern = r"^[A-Za-z0-9._:\-]{1,128}$",
        min_length = 1,
        max_length = 128
    )]
    robot_id: String,
    name: Option<String>,
    #[schema(value_type = Option<Object>)]
    metadata: Option<serde_json::Map<String, Value>>,
}

const ENROLLMENT_TOKEN_PREFIX: &str = "set_";

fn fresh_enrollment_token(state: &SharedState) -> (String, String, i64) {
    let token = random_token(ENROLLMENT_TOKEN_PREFIX);
    let hash = sha256_hex(token.as_bytes());
    let ttl_ms = state.config.enrollment_token_ttl_secs.saturating_mul(1000) as i64;
    (token, hash, now_ms() + ttl_ms)
}

/// Creates a robot and its single-use enrollment token.
#[utoipa::path(post, path = "/v1/robots", tag = "robots", security(("admin" = [])),
    request_body = CreateRobot,
    responses((status = 201, body = RobotCreated), super::error::CommonErrors))]
pub async fn create(
    _: Admin,
    State(state): State<SharedState>,
    ApiJson(body): ApiJson<CreateRobot>,
) -> Result<(StatusCode, Json<RobotCreated>), ApiError> {
    if !valid_robot_id(&body.robot_id) {
        return Err(ApiError::Unprocessable(format!("robotId: {ROBOT_ID_RULE}")));
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
        Json(RobotCreated {
            robot_id: body.robot_id,
            enrollment_token: token,
            enrollment_token_expires_at: rfc3339(expires_at),
        }),
    ))
}

/// Every robot, with its live online state.
#[utoipa::path(get, path = "/v1/robots", tag = "robots", security(("admin" = [])),
    responses((status = 200, body = Vec<RobotView>), super::error::CommonErrors))]
pub async fn list(_: Admin, State(state): State<SharedState>) -> Result<Response, ApiError> {
    let robots = state.store.robots().await?;
    let ids: Vec<&str> = robots.iter().map(|r| r.robot_id.as_str()).collect();
    let nodes = presence(&state, &ids).await;
    let views: Vec<RobotView> = robots
        .iter()
        .map(|r| view(r, nodes.get(&r.robot_id).map(String::as_str)))
        .collect();
    Ok(Json(views).into_response())
}

/// The node each online robot is connected to: this one, or (multi-node) another whose
/// heartbeat lease is alive. Without Redis, only this node's robots are known.
pub(super) async fn presence(state: &SharedState, ids: &[&str]) -> HashMap<String, String> {
    state.presence.where_online(ids, &state.node_id).await
}

/// A robot's view; `node` is where it is connected when online (else where it was last).
fn view<'a>(robot: &'a RobotRecord, node: Option<&'a str>) -> RobotView<'a> {
    let mut view = RobotView::new(robot, node.is_some());
    if node.is_some() {
        view.node = node;
    }
    view
}

async fn existing(state: &SharedState, id: &str) -> Result<RobotRecord, ApiError> {
    state
        .store
        .robot(id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no robot {id}")))
}

/// One robot.
#[utoipa::path(get, path = "/v1/robots/{id}", tag = "robots", security(("admin" = [])),
    params(("id" = String, Path, description = "robotId")),
    responses((status = 200, body = RobotView), super::error::CommonErrors))]
pub async fn show(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let robot = existing(&state, &id).await?;
    let nodes = presence(&state, &[robot.robot_id.as_str()]).await;
    let node = nodes.get(&robot.robot_id).map(String::as_str);
    Ok(Json(view(&robot, node)).into_response())
}

/// The robot's public key as a JWK (Ed25519 or P-256; for a certificate, its leaf's key):
/// what a client checks the robot's signed replies against (robot-agent's `sign_replies`).
/// For the admin and any holder of a grant on the robot.
#[utoipa::path(get, path = "/v1/robots/{id}/key", tag = "robots",
    security(("admin" = []), ("client" = [])),
    params(("id" = String, Path, description = "robotId")),
    responses((status = 200, body = RobotKeyView), super::error::CommonErrors))]
pub async fn key(
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
) -> Result<Json<RobotKeyView>, ApiError> {
    require_grant_or_admin(&state, &headers, &id).await?;
    let robot = existing(&state, &id).await?;
    if robot.credential_revoked {
        return Err(ApiError::NotFound(format!(
            "robot {id}'s credential is revoked"
        )));
    }
    let (credential, public) = match &robot.credential {
        None => return Err(ApiError::NotFound(format!("robot {id} is not enrolled"))),
        Some(Credential::PublicKey { kind, stored }) => (
            kind.clone(),
            PublicKey::from_stored(stored)
                .map_err(|e| ApiError::Internal(format!("stored key of {id}: {e}")))?,
        ),
        Some(Credential::Certificate { chain_pem, .. }) => (
            "x509".to_owned(),
            leaf_key_of_chain(chain_pem)
                .map_err(|e| ApiError::Internal(format!("stored certificate of {id}: {e}")))?
                .0,
        ),
    };
    let jwk = RobotJwk::of(&public).ok_or_else(|| {
        ApiError::NotFound(format!(
            "robot {id}'s key is {}: only Ed25519 and P-256 keys have a JWK here",
            public.kind()
        ))
    })?;
    Ok(Json(RobotKeyView {
        robot_id: id,
        credential,
        jwk,
    }))
}

/// Deletes a robot with its grants; its connection is closed.
#[utoipa::path(delete, path = "/v1/robots/{id}", tag = "robots", security(("admin" = [])),
    params(("id" = String, Path, description = "robotId")),
    responses((status = 204, description = "deleted"), super::error::CommonErrors))]
pub async fn delete(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    if !state.store.delete_robot(&id).await? {
        return Err(ApiError::NotFound(format!("no robot {id}")));
    }
    state.presence.kick_robot(&id, Kick::Revoked);
    Ok(StatusCode::NO_CONTENT)
}

/// A fresh enrollment token; the previous one stops working.
#[utoipa::path(post, path = "/v1/robots/{id}/enrollment-token", tag = "robots",
    security(("admin" = [])), params(("id" = String, Path, description = "robotId")),
    responses((status = 200, body = EnrollmentToken), super::error::CommonErrors))]
pub async fn new_enrollment_token(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<EnrollmentToken>, ApiError> {
    let (token, hash, expires_at) = fresh_enrollment_token(&state);
    if !state
        .store
        .set_enrollment_token(&id, &hash, expires_at)
        .await?
    {
        return Err(ApiError::NotFound(format!("no robot {id}")));
    }
    Ok(Json(EnrollmentToken {
        enrollment_token: token,
        expires_at: rfc3339(expires_at),
    }))
}

/// Revokes the robot's key or certificate for good; its connection and sessions end.
#[utoipa::path(post, path = "/v1/robots/{id}/revoke", tag = "robots", security(("admin" = [])),
    params(("id" = String, Path, description = "robotId")),
    responses((status = 200, body = Revoked), super::error::CommonErrors))]
pub async fn revoke(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Revoked>, ApiError> {
    // Online on another node counts too: that node closes the socket.
    let online = presence(&state, &[id.as_str()]).await.contains_key(&id);
    let Some(revoked) = state.identity.revoke(&id, "admin").await? else {
        return Err(ApiError::NotFound(format!("no robot {id}")));
    };
    let disconnected = state.presence.kick_robot(&id, Kick::Revoked) || online;
    // The same key may have proved another robot id (a fleet certificate for it): that
    // socket goes too.
    state
        .presence
        .kick_robots_with_credentials(&revoked, Kick::Revoked);
    tracing::warn!(robot = %id, disconnected, "robot credential revoked");
    Ok(Json(Revoked {
        robot_id: id,
        revoked: true,
        disconnected,
    }))
}

/// The robot's grants.
#[utoipa::path(get, path = "/v1/robots/{id}/grants", tag = "robots", security(("admin" = [])),
    params(("id" = String, Path, description = "robotId")),
    responses((status = 200, body = Vec<GrantView>), super::error::CommonErrors))]
pub async fn grants(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    existing(&state, &id).await?;
    let grants = state.store.grants(&id).await?;
    let views: Vec<GrantView> = grants.iter().map(GrantView::new).collect();
    Ok(Json(views).into_response())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutGrant {
    #[schema(value_type = super::views::RoleName)]
    role: Role,
}

/// Grants a role (or changes it); a lowered role ends the sessions it no longer allows.
#[utoipa::path(put, path = "/v1/robots/{id}/grants/{subject}", tag = "robots",
    security(("admin" = [])), params(("id" = String, Path, description = "robotId"), ("subject" = String, Path, min_length = 1, max_length = 256, description = "the grant holder, URL-encoded")),
    request_body = PutGrant,
    responses((status = 200, body = GrantView), super::error::CommonErrors))]
pub async fn put_grant(
    _: Admin,
    State(state): State<SharedState>,
    ApiPath((id, subject)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<PutGrant>,
) -> Result<Response, ApiError> {
    if subject.is_empty() || subject.chars().count() > 256 {
        return Err(ApiError::Unprocessable(
            "subject must be 1-256 characters".into(),
        ));
    }
    existing(&state, &id).await?;
    state.store.put_grant(&id, &subject, body.role).await?;
    // A lowered grant ends the live sessions that hold more than it now allows, freeing
    // the control lock; the client is told why and may open a session with its new role.
    state
        .sessions
        .end_for_subject(&id, &subject, Some(body.role), EndReason::GrantChanged)
        .await?;
    Ok(Json(GrantView {
        robot_id: &id,
        subject: &subject,
        role: body.role,
        created_at: None,
    })
    .into_response())
}

/// Withdraws a grant; that subject's live sessions on the robot end.
#[utoipa::path(delete, path = "/v1/robots/{id}/grants/{subject}", tag = "robots",
    security(("admin" = [])), params(("id" = String, Path, description = "robotId"), ("subject" = String, Path, min_length = 1, max_length = 256, description = "the grant holder, URL-encoded")),
    responses((status = 204, description = "withdrawn"), super::error::CommonErrors))]
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
    state
        .sessions
        .end_for_subject(&id, &subject, None, EndReason::GrantRevoked)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
