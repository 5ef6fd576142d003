use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::extract::{Admin, ApiQuery};
use super::views::SessionView;
use super::ApiError;
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
) -> Result<Response, ApiError> {
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
    let views: Vec<SessionView> = records.iter().map(SessionView::new).collect();
    Ok(Json(views).into_response())
}
