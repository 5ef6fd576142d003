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

use std::collections::HashSet;
use std::sync::Arc;

use super::{cert_revocation_entry, Identity};
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
    /// Revocation entries newly listed by this load (persisted now; live sockets that
    /// proved one of them must close).
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
        let now = crate::clock::now_unix();
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
        // Entries of the lists in force were persisted when those were loaded: only what
        // is new needs writing (a large CRL reloads cheaply) and kicking.
        let known: HashSet<String> = current
            .iter()
            .flat_map(RevocationList::ids)
            .map(|id| cert_revocation_entry(&id))
            .collect();
        let entries: Vec<String> = lists
            .iter()
            .flat_map(RevocationList::ids)
            .map(|id| cert_revocation_entry(&id))
            .filter(|entry| !known.contains(entry))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::IdentityConfig;
    use crate::pki::{CertId, TrustStore};
    use crate::store::Store;
    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
        DnType, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams,
        SerialNumber,
    };
    use std::time::Duration;

    fn root() -> (CertificateParams, KeyPair, String) {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "Fleet Root");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("key");
        let pem = params.self_signed(&key).expect("root").pem();
        (params, key, pem)
    }

    fn crl(issuer: &Issuer<'_, &KeyPair>, serials: &[u64], age_secs: i64) -> String {
        let this_update = time::OffsetDateTime::now_utc() - time::Duration::seconds(age_secs);
        CertificateRevocationListParams {
            this_update,
            next_update: this_update + time::Duration::days(1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|s| RevokedCertParams {
                    serial_number: SerialNumber::from(*s),
                    revocation_time: this_update,
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(issuer)
        .expect("crl")
        .pem()
        .expect("pem")
    }

    #[tokio::test]
    async fn entries_are_persisted_and_older_crls_refused() {
        let (store, path) = Store::scratch("crl").await;
        let (params, key, pem) = root();
        let identity = Identity::new(
            store.clone(),
            IdentityConfig {
                challenge_ttl: Duration::from_secs(30),
                trust: Some(TrustStore::from_pem(pem.as_bytes()).expect("anchor")),
                ca: None,
                auto_register: false,
                cert_lifetime: Duration::from_secs(3600),
            },
        )
        .expect("identity");
        let issuer = Issuer::from_params(&params, &key);

        let first = identity
            .apply_crl_file(crl(&issuer, &[1], 60).as_bytes())
            .await
            .expect("first CRL");
        assert_eq!(first.lists, 1);
        assert!(first.stale.is_empty());
        let listed = first.entries[0].clone();
        assert!(
            listed.starts_with("cert:") && listed.ends_with(":1"),
            "{listed}"
        );
        assert!(store
            .is_revoked(std::slice::from_ref(&listed))
            .await
            .unwrap());

        // An older list from the same issuer is a rollback.
        let err = identity
            .apply_crl_file(crl(&issuer, &[], 3600).as_bytes())
            .await
            .unwrap_err();
        assert!(matches!(err, CrlApplyError::Rollback { .. }), "{err}");

        // A newer list without serial 1: serial 1 stays revoked.
        let second = identity
            .apply_crl_file(crl(&issuer, &[2], 30).as_bytes())
            .await
            .expect("newer CRL");
        assert_eq!(second.entries.len(), 1);
        assert!(store.is_revoked(&[listed]).await.unwrap());
        let status = identity.crl_status(crate::clock::now_unix());
        assert_eq!(status.len(), 1);
        assert!(!status[0].stale);
        let id = CertId {
            issuer: status_issuer_id(&identity),
            serial: "2".into(),
        };
        assert!(store
            .is_revoked(&[crate::identity::cert_revocation_entry(&id)])
            .await
            .unwrap());
        store.close().await;
        std::fs::remove_file(path).ok();
    }

    fn status_issuer_id(identity: &Identity) -> String {
        identity.crl_snapshot()[0].issuer_id.clone()
    }
}
