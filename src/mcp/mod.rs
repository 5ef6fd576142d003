//! The remote MCP endpoint: a robot as a Model Context Protocol server at
//! `/v1/robots/{robotId}/mcp` (Streamable HTTP, MCP 2025-06-18), for hosts that should not
//! run a bridge per robot. A session is a program's gateway session run in this process
//! (`arp::open_in_process`: the same grant, role, control lock, takeover, confirmations,
//! audit, tickets, limits and metrics as on `/v1/robots/{id}/arp`), with arp-bridge's MCP
//! session on top of it (the same tools, resources and results as `arp-bridge --mode mcp`).
//! It ends when the client deletes it, when it idles, and when its gateway session ends
//! (token revoked or expired, grant withdrawn, robot gone). docs/arp.md, "The remote MCP
//! endpoint".
//!
//! `http` is the transport, [`crate::origin`] the check of a browser's `Origin` every request
//! passes first (the layer below), `registry` the sessions of this node, `session` one session's task, `replay` the
//! SSE events it keeps for a client that resumes a lost stream.

mod http;
mod registry;
mod replay;
mod session;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use axum::{Extension, Router};

use crate::origin;
use crate::state::SharedState;

/// The endpoint's route, merged into the app at the top (with its own session registry).
/// The `Origin` check wraps every method of it, so it runs before anything else does.
pub fn router(state: &SharedState) -> Router<SharedState> {
    Router::new()
        .route(
            "/v1/robots/{id}/mcp",
            post(http::post).get(http::get).delete(http::delete),
        )
        .layer(Extension(Arc::new(registry::Registry::default())))
        .route_layer(middleware::from_fn_with_state(state.clone(), check_origin))
}

/// The layer: refuses a request whose `Origin` is not allowed, else runs it.
async fn check_origin(State(state): State<SharedState>, request: Request, next: Next) -> Response {
    if origin::allowed(request.headers(), &state.config.allow_origins) {
        return next.run(request).await;
    }
    tracing::debug!(path = %request.uri().path(), "MCP request from a web origin not allowed");
    origin::refused()
}
