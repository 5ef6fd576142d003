use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;

use super::views::{AuditHealth, CrlHealth, CrlList, Health};
use super::ApiError;
use crate::state::SharedState;

pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok",
        database: None,
        crl: None,
        audit: None,
    })
}

pub async fn readyz(State(state): State<SharedState>) -> Result<Json<Health>, ApiError> {
    if state.is_shutting_down() {
        return Err(ApiError::Unavailable("shutting down".into()));
    }
    // Without Redis this node cannot see the others: take it out of rotation until it
    // answers again (it keeps serving the sockets it has).
    if let Err(e) = state.sessions.routing_ready().await {
        return Err(ApiError::Unavailable(e));
    }
    // Audit records outside the database: reported, not fatal. The node still refuses
    // every call it cannot put on record, and its emergency stops must stay reachable.
    let spilled = state.audit.waiting();
    let audit = (spilled > 0).then_some(AuditHealth {
        status: "degraded",
        spilled_records: spilled,
    });
    match tokio::time::timeout(Duration::from_secs(2), state.store.ping()).await {
        Ok(Ok(())) => Ok(Json(Health {
            status: if audit.is_some() { "degraded" } else { "ready" },
            database: Some(state.store.backend()),
            crl: state.config.crl.is_some().then(|| crl_detail(&state)),
            audit,
        })),
        Ok(Err(e)) => Err(ApiError::Unavailable(format!("database: {e}"))),
        Err(_) => Err(ApiError::Unavailable(
            "database: no answer within 2 s".into(),
        )),
    }
}

/// CRL freshness: a stale CRL is reported, not fatal (it still revokes what it lists, and
/// failing readiness on every node at once would take the whole fleet offline).
fn crl_detail(state: &SharedState) -> CrlHealth {
    let status = state.identity.crl_status(crate::clock::now_unix());
    let lists: Vec<CrlList> = status
        .iter()
        .map(|s| CrlList {
            issuer: s.issuer.to_string(),
            this_update: super::rfc3339(s.this_update_unix.saturating_mul(1000)),
            next_update: super::rfc3339(s.next_update_unix.saturating_mul(1000)),
            stale: s.stale,
        })
        .collect();
    let stale = lists.iter().any(|l| l.stale);
    CrlHealth {
        status: if stale { "stale" } else { "fresh" },
        lists,
    }
}

pub async fn metrics(State(state): State<SharedState>) -> impl IntoResponse {
    let mut text = state.metrics.render();
    // Tasks alive in the runtime, read at scrape time: the soak (bench/soak.sh) watches it
    // for leaks beside RSS and open files.
    let tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    text.push_str(&format!(
        "# HELP signalling_tokio_alive_tasks Tasks alive in the server's runtime\n\
         # TYPE signalling_tokio_alive_tasks gauge\n\
         signalling_tokio_alive_tasks {tasks}\n"
    ));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}
