//! Keeps the imported CRL current: loaded at start, reloaded when the file changes or on
//! SIGHUP. The rules (signers, rollback, persistence, staleness) are in `identity::crl`;
//! this task reads the file, closes live robots whose certificate is newly listed, and
//! reports staleness.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::relay::Kick;
use crate::server::StartError;
use crate::state::SharedState;

/// How often the CRL file's modification time (and the CRLs' freshness) is checked.
const POLL: Duration = Duration::from_secs(2);

/// Loads the CRL (a bad file at start is a start error: fail closed) and watches it.
pub async fn start(state: &SharedState) -> Result<(), StartError> {
    let Some(path) = state.config.crl.clone() else {
        return Ok(());
    };
    let modified = load(state, &path)
        .await
        .map_err(|message| StartError::File {
            path: path.display().to_string(),
            message,
        })?;
    tokio::spawn(watch(state.clone(), path, modified));
    Ok(())
}

/// Parses and applies the CRL; returns the file's modification time.
async fn load(state: &SharedState, path: &PathBuf) -> Result<Option<SystemTime>, String> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let applied = state
        .identity
        .apply_crl_file(&bytes)
        .await
        .map_err(|e| e.to_string())?;
    let kicked = state
        .hub
        .kick_robots_with_credentials(&applied.entries, Kick::Revoked);
    tracing::info!(
        lists = applied.lists,
        entries = applied.entries.len(),
        disconnected = kicked,
        "CRL loaded"
    );
    report_staleness(state, &mut Vec::new());
    Ok(modified)
}

/// Sets the stale-CRL gauge and logs each issuer once when its CRL goes stale.
fn report_staleness(state: &SharedState, reported: &mut Vec<String>) {
    let status = state.identity.crl_status(crate::identity::unix_now());
    let stale: Vec<_> = status.iter().filter(|s| s.stale).collect();
    state.metrics.crl_stale.set(stale.len() as i64);
    for s in &stale {
        if !reported.contains(&s.issuer) {
            tracing::warn!(
                issuer = %s.issuer,
                next_update = s.next_update_unix,
                "CRL is stale: past its nextUpdate; still enforced, publish a newer one"
            );
            reported.push(s.issuer.clone());
        }
    }
    reported.retain(|issuer| stale.iter().any(|s| &s.issuer == issuer));
}

async fn watch(state: SharedState, path: PathBuf, mut modified: Option<SystemTime>) {
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
