use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use utoipa::IntoParams;

use super::extract::{Admin, ApiQuery};
use super::views::SessionView;
use super::ApiError;
use crate::state::SharedState;
use crate::store::SessionFilter;

#[derive(Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct SessionQuery {
    robot_id: Option<String>,
    subject: Option<String>,
    /// true: live sessions only; false: ended ones only.
    active: Option<bool>,
    /// Newest first, default 500.
    #[param(minimum = 1, maximum = 10_000)]
    limit: Option<i64>,
}

/// Session records, newest first.
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", security(("admin" = [])),
    params(SessionQuery),
    responses((status = 200, body = Vec<SessionView>), super::error::CommonErrors))]
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
