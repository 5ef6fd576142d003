//! Applying CRLs: what the CRL watcher calls. The watcher only reads the file and kicks
//! sockets; the rules live here.
//!
//! * Each CRL is checked when loaded (`pki::load_crls`: signer is a trust anchor, our CA or
//!   an intermediate shipped in the file; thisUpdate not in the future).
//! * A CRL older than the one in force for the same issuer is refused (rollback).
//! * Every listed certificate is persisted as revoked (issuer + serial) before the new set
//!   takes effect, so a later file that drops an entry never un-revokes anything.
//! * A CRL past its nextUpdate is stale: still enforced, and reported (log, metric,
//!   `/readyz`), because the issuer should have published a newer one.

use std::sync::Arc;

use super::{cert_revocation_entry, unix_now, Identity};
use crate::pki::{load_crls, CrlError, RevocationList};
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum CrlApplyError {
    #[error(transparent)]
    Crl(#[from] CrlError),
    #[error("CRL from {issuer} is older than the one in force (thisUpdate {new} < {current})")]
    Rollback {
        issuer: String,
        new: i64,
        current: i64,
    },
    #[error("cannot persist CRL entries: {0}")]
    Store(#[from] StoreError),
}

/// What a successful load did.
#[derive(Debug, Default)]
pub struct CrlApplied {
    pub lists: usize,
    /// Revocation entries of every listed certificate (to close live sockets using one).
    pub entries: Vec<String>,
    /// Issuers whose CRL is already past nextUpdate.
    pub stale: Vec<String>,
}

/// One loaded CRL's freshness, for `/readyz` and the metric.
#[derive(Debug, Clone)]
pub struct CrlStatus {
    pub issuer: String,
    pub this_update_unix: i64,
    pub next_update_unix: i64,
    pub stale: bool,
}

impl Identity {
    /// Loads a CRL file's bytes, persists its entries, and puts it in force.
    pub async fn apply_crl_file(&self, bytes: &[u8]) -> Result<CrlApplied, CrlApplyError> {
        let now = unix_now();
        let empty = crate::pki::TrustStore::new();
        let lists = load_crls(bytes, self.trust().unwrap_or(&empty), self.ca(), now)?;
        let current = self.crl_snapshot();
        for list in &lists {
            if let Some(old) = current.iter().find(|c| c.issuer_id == list.issuer_id) {
                if list.this_update_unix < old.this_update_unix {
                    return Err(CrlApplyError::Rollback {
                        issuer: list.issuer.clone(),
                        new: list.this_update_unix,
                        current: old.this_update_unix,
                    });
                }
            }
        }
        let entries: Vec<String> = lists
            .iter()
            .flat_map(RevocationList::ids)
            .map(|id| cert_revocation_entry(&id))
            .collect();
        // Persist first: if this fails, the previous set stays in force and nothing is lost.
        self.store.revoke_many(&entries, "serial", "crl").await?;
        let stale = lists
            .iter()
            .filter(|l| l.is_stale(now))
            .map(|l| l.issuer.clone())
            .collect();
        let applied = CrlApplied {
            lists: lists.len(),
            entries,
            stale,
        };
        match self.crls.write() {
            Ok(mut slot) => *slot = Arc::new(lists),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(lists),
        }
        Ok(applied)
    }

    /// Freshness of the CRLs in force (empty when none is configured).
    pub fn crl_status(&self, now_unix: i64) -> Vec<CrlStatus> {
        self.crl_snapshot()
            .iter()
            .map(|l| CrlStatus {
                issuer: l.issuer.clone(),
                this_update_unix: l.this_update_unix,
                next_update_unix: l.next_update_unix,
                stale: l.is_stale(now_unix),
            })
            .collect()
    }
}
