//! The HTTP API (contract section 2): admin resources, enrollment, health and metrics.

mod enroll;
mod error;
mod extract;
mod health;
mod robots;
mod sessions;
mod tokens;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, put};
use axum::Router;
use tower_http::trace::TraceLayer;

pub use error::ApiError;

use crate::state::SharedState;

/// Request bodies are small JSON documents; CSRs included.
const MAX_BODY_BYTES: usize = 64 * 1024;

pub fn router(state: SharedState) -> Router {
    Router::new()
        .route("/ws", get(crate::ws::upgrade))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/v1/enroll", post(enroll::enroll))
        .route("/v1/robots", post(robots::create).get(robots::list))
        .route("/v1/robots/{id}", get(robots::show).delete(robots::delete))
        .route(
            "/v1/robots/{id}/enrollment-token",
            post(robots::new_enrollment_token),
        )
        .route("/v1/robots/{id}/revoke", post(robots::revoke))
        .route("/v1/robots/{id}/grants", get(robots::grants))
        .route(
            "/v1/robots/{id}/grants/{subject}",
            put(robots::put_grant).delete(robots::delete_grant),
        )
        .route("/v1/tokens", post(tokens::create))
        .route(
            "/v1/tokens/{token_id}",
            axum::routing::delete(tokens::revoke),
        )
        .route("/v1/sessions", get(sessions::list))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async {
            ApiError::MethodNotAllowed("method not allowed on this route".into())
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// RFC 3339 rendering of stored unix milliseconds.
pub(crate) fn rfc3339(ms: i64) -> Option<String> {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()?;
    at.format(&time::format_description::well_known::Rfc3339)
        .ok()
}
