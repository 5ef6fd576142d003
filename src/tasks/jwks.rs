//! Refreshes the JWKS from its URL on a timer, so rotated signing keys are picked up before
//! the first token signed with one arrives (an unknown `kid` also triggers a fetch).

use std::sync::Arc;

use super::StopSignal;
use crate::auth::jwt::JWKS_REFRESH;
use crate::auth::JwtVerifier;

pub async fn refresh(verifier: Arc<JwtVerifier>, mut stop: StopSignal) {
    let mut every = tokio::time::interval(JWKS_REFRESH);
    // The first tick is immediate and the keys were fetched at start.
    every.tick().await;
    loop {
        tokio::select! {
            _ = stop.stopped() => return,
            _ = every.tick() => {}
        }
        if let Err(e) = verifier.fetch_jwks().await {
            tracing::warn!(error = %e, "JWKS refresh failed; keeping the previous keys");
        }
    }
}
