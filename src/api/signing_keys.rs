//! `GET /v1/signing-keys`: the public keys robots check session tickets against.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;

use crate::pki::Jwks;
use crate::state::SharedState;

/// The deployment's public signing keys (JWKS-like, `OKP`/`Ed25519`), the current one
/// first; during a rotation the previous one follows. Robots pin them at enrollment and
/// check every session ticket against them. Public: no credential needed.
#[utoipa::path(get, path = "/v1/signing-keys", tag = "enrollment",
    responses((status = 200, body = Jwks)))]
pub async fn list(State(state): State<SharedState>) -> impl IntoResponse {
    // Public keys change only with a restart; a short cache spares repeated fetches.
    (
        [(header::CACHE_CONTROL, "max-age=300")],
        Json(state.tickets.jwks()),
    )
}
