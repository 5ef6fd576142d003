//! A robot's audit log (owners and the admin): what programs did through the ARP gateway,
//! every emergency stop and takeover, oldest first, in pages; `?format=jsonl` for export.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{ApiPath, ApiQuery, OwnerOrAdmin};
use super::ApiError;
use crate::state::SharedState;
use crate::store::{AuditQuery, AuditRecord};

#[derive(Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct AuditParams {
    /// Records at or after this time (Unix milliseconds).
    from: Option<i64>,
    /// Records before this time (Unix milliseconds).
    to: Option<i64>,
    /// The `next` cursor of the previous page.
    #[param(pattern = r"^-?[0-9]{1,18}:[^:]{1,128}$")]
    after: Option<String>,
    /// Records per page, default 100.
    #[param(minimum = 1, maximum = 10_000)]
    limit: Option<i64>,
    /// `json` (default) or `jsonl` (one record per line; the cursor in `X-Next-Cursor`).
    #[param(inline)]
    format: Option<AuditFormat>,
}

#[derive(Deserialize, ToSchema, Clone, Copy, Default)]
#[serde(rename_all = "lowercase")]
pub enum AuditFormat {
    #[default]
    Json,
    Jsonl,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditPage {
    pub records: Vec<AuditRecord>,
    /// Pass as `after` for the next page; absent on the last one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// A robot's audit log, oldest first.
#[utoipa::path(get, path = "/v1/robots/{id}/audit", tag = "robots",
    security(("admin" = []), ("client" = [])),
    params(("id" = String, Path, description = "robot id"), AuditParams),
    responses(
        (status = 200, description = "a page of records",
            content((AuditPage = "application/json"), (String = "application/x-ndjson")),
            headers(("x-next-cursor" = String, description = "jsonl only: `after` for the next page"))),
        super::error::CommonErrors))]
pub async fn list(
    State(state): State<SharedState>,
    ApiPath(robot_id): ApiPath<String>,
    ApiQuery(params): ApiQuery<AuditParams>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    OwnerOrAdmin::check(&state, &headers, &robot_id).await?;
    let limit = params.limit.unwrap_or(100);
    if !(1..=10_000).contains(&limit) {
        return Err(ApiError::BadRequest(
            "limit must be between 1 and 10000".into(),
        ));
    }
    let after = match params.after.as_deref() {
        Some(cursor) => Some(parse_cursor(cursor)?),
        None => None,
    };
    let records = state
        .store
        .audit(&AuditQuery {
            robot_id,
            from: params.from,
            to: params.to,
            after,
            limit,
        })
        .await?;
    let next = (records.len() as i64 == limit)
        .then(|| records.last().map(|r| format!("{}:{}", r.at, r.id)))
        .flatten();
    match params.format.unwrap_or_default() {
        AuditFormat::Json => Ok(Json(AuditPage { records, next }).into_response()),
        AuditFormat::Jsonl => {
            let mut body = String::new();
            for record in &records {
                // A record always serialises: plain strings and numbers.
                body.push_str(&serde_json::to_string(record).unwrap_or_default());
                body.push('\n');
            }
            let mut response = body.into_response();
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            );
            if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
                headers.insert("x-next-cursor", next);
            }
            Ok(response)
        }
    }
}

/// `at:id`, as `next` gives it (the OpenAPI pattern says the same).
fn parse_cursor(cursor: &str) -> Result<(i64, String), ApiError> {
    let bad = || ApiError::BadRequest("after must be a cursor from a previous page".into());
    let (at, id) = cursor.split_once(':').ok_or_else(bad)?;
    if id.is_empty() || id.len() > 128 || id.contains(':') {
        return Err(bad());
    }
    let at = at.parse().map_err(|_| bad())?;
    Ok((at, id.to_string()))
}
