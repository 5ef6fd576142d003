use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;

use super::views::Health;
use super::ApiError;
use crate::state::SharedState;

pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok",
        database: None,
    })
}

pub async fn readyz(State(state): State<SharedState>) -> Result<Json<Health>, ApiError> {
    if state.is_shutting_down() {
        return Err(ApiError::Unavailable("shutting down".into()));
    }
    match tokio::time::timeout(Duration::from_secs(2), state.store.ping()).await {
        Ok(Ok(())) => Ok(Json(Health {
            status: "ready",
            database: Some(state.store.backend()),
        })),
        Ok(Err(e)) => Err(ApiError::Unavailable(format!("database: {e}"))),
        Err(_) => Err(ApiError::Unavailable(
            "database: no answer within 2 s".into(),
        )),
    }
}

pub async fn metrics(State(state): State<SharedState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}
