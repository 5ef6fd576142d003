//! The HTTP API (contract section 2): admin resources, enrollment, health and metrics.

mod audit;
mod confirmations;
mod emergency;
mod enroll;
mod error;
mod extract;
mod health;
mod me;
mod openapi;
mod robots;
mod sessions;
mod signing_keys;
mod tokens;
mod views;

use axum::routing::{get, post, put};
use axum::Router;

pub use error::ApiError;

use crate::state::SharedState;

/// Request bodies are small JSON documents; CSRs included.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The HTTP API's routes, merged into the app at the top.
pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/v1/enroll", post(enroll::enroll))
        .route("/v1/signing-keys", get(signing_keys::list))
        .route("/v1/robots", post(robots::create).get(robots::list))
        .route("/v1/robots/{id}", get(robots::show).delete(robots::delete))
        .route(
            "/v1/robots/{id}/enrollment-token",
            post(robots::new_enrollment_token),
        )
        .route("/v1/robots/{id}/revoke", post(robots::revoke))
        .route("/v1/robots/{id}/key", get(robots::key))
        .route("/v1/robots/{id}/audit", get(audit::list))
        .route("/v1/robots/{id}/emergency-stop", post(emergency::stop))
        .route("/v1/robots/{id}/grants", get(robots::grants))
        .route(
            "/v1/robots/{id}/grants/{subject}",
            put(robots::put_grant).delete(robots::delete_grant),
        )
        .route("/v1/tokens", post(tokens::create).get(tokens::list))
        .route(
            "/v1/tokens/{token_id}",
            axum::routing::delete(tokens::revoke),
        )
        .route("/v1/sessions", get(sessions::list))
        .route("/v1/me", get(me::me))
        .route("/v1/confirmations", get(confirmations::list))
        .route("/v1/confirmations/{id}", post(confirmations::answer))
        .route("/v1/me/robots", get(me::robots))
        .route("/v1/openapi.json", get(openapi::serve))
}

/// RFC 3339 rendering of stored unix milliseconds.
pub(crate) fn rfc3339(ms: i64) -> Option<String> {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()?;
    at.format(&time::format_description::well_known::Rfc3339)
        .ok()
}
