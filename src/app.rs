//! The application, wired in one place: every module's routes merged, the layers every
//! request goes through, and the answers for unknown routes.

use axum::extract::DefaultBodyLimit;
use axum::Router;
use tower_http::trace::TraceLayer;

use crate::api::{self, ApiError};
use crate::state::SharedState;

pub fn router(state: SharedState) -> Router {
    Router::new()
        .merge(api::router())
        .merge(crate::ws::router())
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async {
            ApiError::MethodNotAllowed("method not allowed on this route".into())
        })
        .layer(DefaultBodyLimit::max(api::MAX_BODY_BYTES))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
