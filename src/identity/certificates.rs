//! Robot certificates at login: a presented chain held against the enrolled one, a chain verified against the roots and the CRLs in force
//! (on a blocking thread, a bounded number at once), and stored chains' verifications
//! kept for a while.

use super::*;

impl Identity {
    /// A presented certificate chain, verified, and held against what the robot enrolled
    /// (`record`, if it exists): what the robot must prove, or the decoy it gets instead.
    pub(super) async fn presented(
        &self,
        robot_id: &str,
        chain_pem: &str,
        record: Option<RobotRecord>,
    ) -> Result<Result<Proof, Challenge>, IdentityError> {
        let Some(record) = record else {
            // The chain is checked first either way: what is wrong with it is the
            // presenter's to know, whether the robot exists is not.
            let verified = self.verify_certificate(chain_pem, robot_id).await?;
            if !self.auto_register {
                let leaf = Some(verified.leaf_key);
                return self
                    .decoy(robot_id, IdentityError::UnknownRobot, leaf)
                    .map(Err);
            }
            let credential = Credential::Certificate {
                chain_pem: chain_pem.to_string(),
                serial: verified.serial_hex.clone(),
            };
            let entries = chain_entries(&verified);
            let record = RecordChain { create: true };
            return Ok(Ok((
                verified.leaf_key,
                "x509",
                entries,
                credential,
                Some(record),
            )));
        };
        // Compared before any signature work: a superseded certificate costs us
        // one parse.
        let (leaf_key, _) = leaf_key_of_chain(chain_pem)?;
        let verified = self.verify_certificate(chain_pem, robot_id).await?;
        if let Some(credential) = &record.credential {
            if self.enrolled_key(credential)? != leaf_key {
                let leaf = Some(leaf_key);
                return self
                    .decoy(robot_id, IdentityError::CredentialMismatch, leaf)
                    .map(Err);
            }
        }
        let entries = chain_entries(&verified);
        let (credential, record) = match record.credential {
            Some(stored) => (stored, None),
            None => (
                Credential::Certificate {
                    chain_pem: chain_pem.to_string(),
                    serial: verified.serial_hex.clone(),
                },
                Some(RecordChain { create: false }),
            ),
        };
        Ok(Ok((verified.leaf_key, "x509", entries, credential, record)))
    }

    pub(super) async fn stored_credential(
        &self,
        record: &RobotRecord,
    ) -> Result<(PublicKey, &'static str, Vec<String>), IdentityError> {
        match &record.credential {
            None => Err(IdentityError::NotEnrolled),
            Some(Credential::PublicKey { stored, .. }) => {
                let key = PublicKey::from_stored(stored).map_err(IdentityError::StoredKey)?;
                let entry = key_revocation_entry(&key);
                Ok((key.clone(), key.kind(), vec![entry]))
            }
            Some(Credential::Certificate { chain_pem, .. }) => {
                let cache_key =
                    format!("{}\n{}", record.robot_id, sha256_hex(chain_pem.as_bytes()));
                let crls = self.crl_snapshot();
                if let Some(cached) = self.cached_chain(&cache_key, &crls) {
                    return Ok(cached);
                }
                let verified = self.verify_certificate(chain_pem, &record.robot_id).await?;
                let entries = chain_entries(&verified);
                let mut cache = self.stored_chains.lock().unwrap_or_else(|p| p.into_inner());
                if cache.len() >= STORED_CHAINS_KEPT {
                    cache.clear();
                }
                cache.insert(
                    cache_key,
                    StoredChain {
                        leaf_key: verified.leaf_key.clone(),
                        entries: entries.clone(),
                        crls,
                        at: Instant::now(),
                    },
                );
                Ok((verified.leaf_key, "x509", entries))
            }
        }
    }

    /// Verifies a chain against the roots and the CRLs in force, on a blocking thread.
    pub(super) async fn verify_certificate(
        &self,
        chain_pem: &str,
        robot_id: &str,
    ) -> Result<VerifiedChain, IdentityError> {
        let roots = self
            .roots
            .clone()
            .ok_or(IdentityError::Certificate(X509Error::Untrusted))?;
        let crls = self.crl_snapshot();
        let permit = Arc::clone(&self.verify_slots)
            .acquire_owned()
            .await
            .map_err(|e| IdentityError::Verifier(e.to_string()))?;
        let chain_pem = chain_pem.to_string();
        let robot_id = robot_id.to_string();
        let verified = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let lists: Vec<_> = crls.iter().map(RevocationList::webpki).collect();
            verify_chain_with_crls(
                &chain_pem,
                &roots,
                &robot_id,
                crate::clock::now_unix(),
                &lists,
            )
        })
        .await
        .map_err(|e| IdentityError::Verifier(e.to_string()))??;
        Ok(verified)
    }

    /// A stored chain's recent verification against the CRLs in force, if any.
    fn cached_chain(
        &self,
        key: &str,
        crls: &Arc<Vec<RevocationList>>,
    ) -> Option<(PublicKey, &'static str, Vec<String>)> {
        let cache = self.stored_chains.lock().unwrap_or_else(|p| p.into_inner());
        let cached = cache.get(key)?;
        (Arc::ptr_eq(&cached.crls, crls) && cached.at.elapsed() < STORED_CHAIN_TTL)
            .then(|| (cached.leaf_key.clone(), "x509", cached.entries.clone()))
    }

    pub(super) fn crl_snapshot(&self) -> Arc<Vec<RevocationList>> {
        match self.crls.read() {
            Ok(guard) => Arc::clone(&guard),
            // A poisoned lock: the writer panicked mid-swap, but the Arc it held is whole.
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }
}
