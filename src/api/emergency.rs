//! `POST /v1/robots/{id}/emergency-stop`: an owner or the admin stops a robot from the API,
//! through its ARP server, on whichever node it is connected to; on record.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::extract::{ApiPath, OwnerOrAdmin};
use super::ApiError;
use crate::state::SharedState;
use crate::store::AuditRecord;

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Stopped {
    pub robot_id: String,
    /// The stop was sent to the robot's node (it reaches the robot over its socket).
    pub sent: bool,
}

/// E-stops the robot (owners and the admin).
#[utoipa::path(post, path = "/v1/robots/{id}/emergency-stop", tag = "robots",
    security(("admin" = []), ("client" = [])),
    params(("id" = String, Path, description = "robot id")),
    responses((status = 202, body = Stopped),
        (status = 409, description = "the robot is offline or does not serve ARP"),
        super::error::CommonErrors))]
pub async fn stop(
    State(state): State<SharedState>,
    ApiPath(robot_id): ApiPath<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let caller = OwnerOrAdmin::check(&state, &headers, &robot_id).await?;
    let online = state
        .presence
        .where_online(&[robot_id.as_str()], &state.node_id)
        .await;
    if !online.contains_key(&robot_id) {
        return Err(ApiError::Conflict(format!("robot {robot_id} is offline")));
    }
    let here = state.presence.emergency_stop(&robot_id, caller.subject());
    let role = match caller {
        OwnerOrAdmin::Admin => "admin",
        OwnerOrAdmin::Owner(_) => "owner",
    };
    let on_this_node = online.get(&robot_id) == Some(&state.node_id);
    if on_this_node && !here {
        return Err(ApiError::Conflict(format!(
            "robot {robot_id} does not serve ARP: stop it from its own console"
        )));
    }
    state.audit.record(AuditRecord {
        id: uuid::Uuid::new_v4().to_string(),
        at: crate::store::now_ms(),
        robot_id: robot_id.clone(),
        subject: caller.subject().to_string(),
        role: role.to_string(),
        node: state.node_id.clone(),
        action: "emergency_stop".into(),
        tool: None,
        params: None,
        outcome: "sent".into(),
        error_code: None,
        duration_ms: None,
        idempotency_key: None,
        confirmed_by: None,
        session_id: None,
    });
    Ok((
        StatusCode::ACCEPTED,
        Json(Stopped {
            robot_id,
            sent: true,
        }),
    )
        .into_response())
}
