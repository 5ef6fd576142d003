//! The application, wired in one place: every module's routes merged, the layers every
//! request goes through, and the answers for unknown routes.

use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::http::Request;
use axum::Router;
use tower_http::trace::TraceLayer;

use crate::api::{self, ApiError};
use crate::state::SharedState;

/// The request's span: method and path only. The query is left out because browsers
/// carry their token in it (`/ws?token=…`), and a token must never reach a log.
fn request_span(request: &Request<Body>) -> tracing::Span {
    tracing::debug_span!("http", method = %request.method(), path = %request.uri().path())
}

pub fn router(state: SharedState) -> Router {
    Router::new()
        .merge(api::router())
        .merge(crate::ws::router())
        .merge(crate::arp::router())
        .merge(crate::mcp::router(&state))
        .merge(crate::console::router())
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async {
            ApiError::MethodNotAllowed("method not allowed on this route".into())
        })
        .layer(DefaultBodyLimit::max(api::MAX_BODY_BYTES))
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
        .with_state(state)
}
