//! Keeps the imported CRL current: loaded at start, reloaded when the file changes or on
//! SIGHUP. Newly listed serials are recorded as revoked and live robots using them are
//! disconnected at once.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::StopSignal;
use crate::pki::{parse_crl, TrustStore};
use crate::relay::Kick;
use crate::state::SharedState;

/// How often the CRL file's modification time is checked.
const POLL: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum CrlError {
    #[error("{path}: {message}")]
    Load { path: String, message: String },
}

/// Loads the CRL now (a bad file at start is an error: fail closed); returns the file's
/// modification time for [`watch`].
pub fn load_at_start(state: &SharedState, path: &Path) -> Result<Option<SystemTime>, CrlError> {
    load(state, path).map_err(|message| CrlError::Load {
        path: path.display().to_string(),
        message,
    })
}

/// Parses and applies the CRL; returns the file's modification time.
fn load(state: &SharedState, path: &Path) -> Result<Option<SystemTime>, String> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let roots = state
        .identity
        .trust()
        .cloned()
        .unwrap_or_else(TrustStore::new);
    let list = parse_crl(&bytes, &roots, state.identity.ca()).map_err(|e| e.to_string())?;
    let entries: Vec<String> = list
        .serials
        .iter()
        .map(|s| crate::identity::serial_revocation_entry(s))
        .collect();
    state.identity.set_crl_serials(list.serials.clone());
    let kicked = state
        .hub
        .kick_robots_with_credentials(&entries, Kick::Revoked);
    tracing::info!(issuer = %list.issuer, serials = list.serials.len(), disconnected = kicked, "CRL loaded");
    Ok(modified)
}

/// Reloads the CRL when its file changes or on SIGHUP, until the server stops.
pub async fn watch(
    state: SharedState,
    path: PathBuf,
    mut modified: Option<SystemTime>,
    mut stop: StopSignal,
) {
    let mut poll = tokio::time::interval(POLL);
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
        let now = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        if !force && now == modified {
            continue;
        }
        match load(&state, &path) {
            Ok(at) => modified = at,
            // Keep the previous list: a half-written or bad file must not un-revoke anything.
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "CRL reload failed; keeping the previous list")
            }
        }
    }
}
