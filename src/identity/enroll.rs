//! Enrollment and revocation of a robot's credential: a single-use token buys one key or
//! one certificate (our CA signs the CSR), which supersedes every earlier credential.

use super::{
    cert_revocation_entry, key_revocation_entry, serial_revocation_entry, Identity, IdentityError,
};
use crate::pki::{leaf_key_of_chain, CaError, KeyError, PublicKey};
use crate::store::{Credential, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    #[error("enrollment token is wrong, used or expired")]
    BadToken,
    #[error("exactly one of publicKey or csr is required")]
    Shape,
    #[error("malformed public key: {0}")]
    Key(#[from] KeyError),
    #[error("this key or certificate has been revoked")]
    Revoked,
    #[error("CSR enrollment needs --ca-cert and --ca-key on the server")]
    NoCa,
    #[error("CSR rejected: {0}")]
    Csr(#[from] CaError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Identity {
    /// `POST /v1/enroll`: checks the single-use token, then stores a key or signs a CSR.
    /// Returns the issued certificate chain for CSR enrollment. The new credential
    /// supersedes every earlier one: only it logs in from now on.
    pub async fn enroll(
        &self,
        robot_id: &str,
        token: &str,
        public_key: Option<&str>,
        csr: Option<&str>,
    ) -> Result<Option<String>, EnrollError> {
        let record = self.store.robot(robot_id).await?;
        let token_hash = crate::auth::sha256_hex(token.as_bytes());
        let valid = record.as_ref().is_some_and(|r| {
            let stored = r.enrollment_token_hash.as_deref().unwrap_or("");
            let fresh = r
                .enrollment_token_expires_at
                .is_some_and(|t| t > crate::store::now_ms());
            crate::auth::constant_time_eq(stored.as_bytes(), token_hash.as_bytes()) && fresh
        });
        if !valid {
            return Err(EnrollError::BadToken);
        }
        let (credential, issued) = match (public_key, csr) {
            (Some(key), None) => {
                let key = PublicKey::parse_enrollment(key)?;
                if self.store.is_revoked(&[key_revocation_entry(&key)]).await? {
                    return Err(EnrollError::Revoked);
                }
                let credential = Credential::PublicKey {
                    kind: key.kind().to_string(),
                    stored: key.to_stored(),
                };
                (credential, None)
            }
            (None, Some(csr)) => {
                let ca = self.ca.as_ref().ok_or(EnrollError::NoCa)?;
                let issued =
                    ca.sign_csr(csr, robot_id, self.cert_lifetime, crate::clock::now_unix())?;
                // A key revoked as a bare key stays revoked inside a certificate.
                if self
                    .store
                    .is_revoked(&[key_revocation_entry(&issued.public_key)])
                    .await?
                {
                    return Err(EnrollError::Revoked);
                }
                let credential = Credential::Certificate {
                    chain_pem: issued.chain_pem.clone(),
                    serial: issued.serial_hex.clone(),
                };
                (credential, Some(issued.chain_pem))
            }
            _ => return Err(EnrollError::Shape),
        };
        if !self
            .store
            .enroll(robot_id, &token_hash, &credential)
            .await?
        {
            // Another request consumed the token between our check and the update.
            return Err(EnrollError::BadToken);
        }
        Ok(issued)
    }

    /// Revokes the robot's current credential — its key, or its certificate by issuer and
    /// serial and the certificate's key — and marks the robot revoked until it enrolls
    /// again. Returns the revoked entries (to close every live socket that proved one of
    /// them), or `None` if the robot does not exist.
    pub async fn revoke(
        &self,
        robot_id: &str,
        source: &str,
    ) -> Result<Option<Vec<String>>, IdentityError> {
        let Some(record) = self.store.robot(robot_id).await? else {
            return Ok(None);
        };
        let mut entries: Vec<(String, &str)> = Vec::new();
        match &record.credential {
            Some(Credential::PublicKey { stored, .. }) => {
                if let Ok(key) = PublicKey::from_stored(stored) {
                    entries.push((key_revocation_entry(&key), "key"));
                }
            }
            Some(Credential::Certificate { chain_pem, serial }) => {
                if let Ok((key, id)) = leaf_key_of_chain(chain_pem) {
                    entries.push((cert_revocation_entry(&id), "serial"));
                    entries.push((key_revocation_entry(&key), "key"));
                } else if !serial.is_empty() {
                    entries.push((serial_revocation_entry(serial), "serial"));
                }
            }
            None => {}
        }
        for (entry, kind) in &entries {
            self.store
                .revoke_credential(entry, kind, Some(robot_id), source)
                .await?;
        }
        self.store.mark_credential_revoked(robot_id).await?;
        Ok(Some(entries.into_iter().map(|(entry, _)| entry).collect()))
    }
}
