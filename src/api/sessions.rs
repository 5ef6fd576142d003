use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::extract::{Admin, ApiQuery};
use super::{rfc3339, ApiError};
use crate::state::SharedState;
use crate::store::SessionFilter;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionQuery {
    robot_id: Option<String>,
    subject: Option<String>,
    active: Option<bool>,
    limit: Option<i64>,
}

pub async fn list(
    _: Admin,
    State(state): State<SharedState>,
    ApiQuery(query): ApiQuery<SessionQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = query.limit.unwrap_or(500);
    if !(1..=10_000).contains(&limit) {
        return Err(ApiError::BadRequest(
            "limit must be between 1 and 10000".into(),
        ));
    }
    let records = state
        .store
        .sessions(&SessionFilter {
            robot_id: query.robot_id,
            subject: query.subject,
            active: query.active,
            limit,
        })
        .await?;
    Ok(Json(Value::Array(
        records
            .iter()
            .map(|s| {
                json!({
                    "connectionId": s.connection_id,
                    "robotId": s.robot_id,
                    "subject": s.subject,
                    "role": s.role,
                    "node": s.node,
                    "startedAt": rfc3339(s.started_at),
                    "connectedAt": s.connected_at.and_then(rfc3339),
                    "endedAt": s.ended_at.and_then(rfc3339),
                    "endReason": s.end_reason,
                })
            })
            .collect(),
    )))
}
