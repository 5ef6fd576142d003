//! Keeps the imported CRL current: loaded at start, reloaded when the file changes or on
//! SIGHUP, until the server stops. The rules (who may sign, rollback, persisting entries,
//! staleness) live in `identity::crl`; this task reads the file, closes live robots whose
//! certificate is listed, and reports stale CRLs (log once per issuer, metric).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::StopSignal;
use crate::relay::Kick;
use crate::state::SharedState;

/// How often the CRL file's modification time (and the CRLs' freshness) is checked.
const POLL: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum CrlError {
    #[error("{path}: {message}")]
    Load { path: String, message: String },
}

/// Loads the CRL now (a bad file at start is an error: fail closed); returns the file's
/// modification time for [`watch`].
pub async fn load_at_start(
    state: &SharedState,
    path: &Path,
) -> Result<Option<SystemTime>, CrlError> {
    let modified = load(state, path).await.map_err(|message| CrlError::Load {
        path: path.display().to_string(),
        message,
    })?;
    report_staleness(state, &mut Vec::new());
    Ok(modified)
}

/// Parses, persists and applies the CRL file; returns its modification time.
async fn load(state: &SharedState, path: &Path) -> Result<Option<SystemTime>, String> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let applied = state
        .identity
        .apply_crl_file(&bytes)
        .await
        .map_err(|e| e.to_string())?;
    let kicked = state
        .presence
        .kick_robots_with_credentials(&applied.entries, Kick::Revoked);
    tracing::info!(
        lists = applied.lists,
        new_entries = applied.entries.len(),
        disconnected = kicked,
        "CRL loaded"
    );
    Ok(modified)
}

/// Sets the stale-CRL gauge and warns once per issuer when its CRL goes past nextUpdate.
fn report_staleness(state: &SharedState, reported: &mut Vec<String>) {
    let status = state.identity.crl_status(crate::clock::now_unix());
    let stale: Vec<_> = status.iter().filter(|s| s.stale).collect();
    state
        .metrics
        .crl_stale
        .set(i64::try_from(stale.len()).unwrap_or(i64::MAX));
    for s in &stale {
        if !reported.contains(&s.issuer) {
            tracing::warn!(
                issuer = %s.issuer,
                next_update = s.next_update_unix,
                "CRL is stale (past nextUpdate): still enforced; the CA should publish a newer one"
            );
            reported.push(s.issuer.clone());
        }
    }
    reported.retain(|issuer| stale.iter().any(|s| &s.issuer == issuer));
}

/// Reloads the CRL when its file changes or on SIGHUP, until the server stops.
pub async fn watch(
    state: SharedState,
    path: PathBuf,
    mut modified: Option<SystemTime>,
    mut stop: StopSignal,
) {
    let mut poll = tokio::time::interval(POLL);
    let mut reported = Vec::new();
    #[cfg(unix)]
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let forced = async {
            match hangup.as_mut() {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let forced = std::future::pending::<()>();
        let force = tokio::select! {
            _ = stop.stopped() => return,
            _ = poll.tick() => false,
            _ = forced => true,
        };
        report_staleness(&state, &mut reported);
        let now = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        if !force && now == modified {
            continue;
        }
        match load(&state, &path).await {
            Ok(at) => modified = at,
            // Keep the previous list: a half-written or bad file must not un-revoke anything.
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "CRL reload failed; keeping the previous list")
            }
        }
    }
}
