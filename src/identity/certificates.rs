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
        if let Some(Credential::Certificate {
            chain_pem: enrolled,
            ..
        }) = &record.credential
        {
            if enrolled == chain_pem {
                // The enrolled chain again, as a robot with a fleet certificate presents it
                // at every login: verified as the stored chain it is, and kept as one.
                let (key, kind, entries) = self.stored_credential(&record).await?;
                let credential = record.credential.ok_or(IdentityError::NotEnrolled)?;
                return Ok(Ok((key, kind, entries, credential, None)));
            }
        }
        let verified = self.verify_certificate(chain_pem, robot_id).await?;
        if let Some(credential) = &record.credential {
            if self.enrolled_key(credential)? != verified.leaf_key {
                let leaf = Some(verified.leaf_key);
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
                        valid_until: verified.valid_until_unix,
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
        (Arc::ptr_eq(&cached.crls, crls)
            && cached.at.elapsed() < STORED_CHAIN_TTL
            && crate::clock::now_unix() <= cached.valid_until)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
        IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };

    fn params(cn: &str, ca: bool) -> CertificateParams {
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        p.distinguished_name = dn;
        if ca {
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        } else {
            p.is_ca = IsCa::ExplicitNoCa;
            p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
        p.use_authority_key_identifier_extension = !ca || cn != "Fleet Root";
        p
    }

    /// A fleet root (the trust anchor's PEM) and two chains for `robot`: leaf and
    /// intermediate, leaves with keys of their own.
    fn fleet(robot: &str) -> (String, String, String) {
        let root_key = KeyPair::generate().expect("key");
        let root_params = params("Fleet Root", true);
        let root_pem = root_params.self_signed(&root_key).expect("root").pem();
        let root = Issuer::from_params(&root_params, &root_key);
        let inter_key = KeyPair::generate().expect("key");
        let inter_params = params("Fleet Issuing", true);
        let inter_pem = inter_params
            .signed_by(&inter_key, &root)
            .expect("intermediate")
            .pem();
        let inter = Issuer::from_params(&inter_params, &inter_key);
        let chain = |key: &KeyPair| {
            let leaf = params(robot, false).signed_by(key, &inter).expect("leaf");
            format!("{}{inter_pem}", leaf.pem())
        };
        let (first, second) = (
            KeyPair::generate().expect("key"),
            KeyPair::generate().expect("key"),
        );
        (root_pem, chain(&first), chain(&second))
    }

    async fn identity(root_pem: &str) -> Identity {
        let (store, _file) = Store::scratch("chains").await;
        Identity::new(
            store,
            IdentityConfig {
                challenge_ttl: Duration::from_secs(30),
                trust: Some(TrustStore::from_pem(root_pem.as_bytes()).expect("anchor")),
                ca: None,
                auto_register: false,
                cert_lifetime: Duration::from_secs(3600),
            },
        )
        .expect("identity")
    }

    fn enrolled(robot: &str, chain_pem: &str) -> RobotRecord {
        RobotRecord {
            robot_id: robot.into(),
            name: None,
            metadata: None,
            credential: Some(Credential::Certificate {
                chain_pem: chain_pem.into(),
                serial: "1".into(),
            }),
            credential_revoked: false,
            enrollment_token_hash: None,
            enrollment_token_expires_at: None,
            created_at: 0,
            last_seen_at: None,
            node: None,
        }
    }

    /// What `presented` proved: the key and the revocation entries.
    async fn proof(
        identity: &Identity,
        chain: &str,
        record: RobotRecord,
    ) -> (PublicKey, Vec<String>) {
        match identity.presented("robot-7", chain, Some(record)).await {
            Ok(Ok((key, kind, entries, _, _))) => {
                assert_eq!(kind, "x509");
                (key, entries)
            }
            Ok(Err(_)) => panic!("a decoy for the enrolled chain"),
            Err(e) => panic!("refused: {e}"),
        }
    }

    /// A robot presenting its enrolled chain at every login has it verified once: later
    /// logins take the kept verification, until the first certificate on the chain
    /// expires. Another chain is verified in full and held against the enrolled key.
    #[tokio::test]
    async fn an_enrolled_chain_presented_again_is_verified_once_and_not_past_its_expiry() {
        let (root_pem, chain, other) = fleet("robot-7");
        let identity = identity(&root_pem).await;
        let record = enrolled("robot-7", &chain);

        let (key, entries) = proof(&identity, &chain, record.clone()).await;
        assert_eq!(key, leaf_key_of_chain(&chain).expect("leaf").0);
        assert!(entries.len() >= 3, "{entries:?}");
        let kept_key = {
            let mut kept = identity.stored_chains.lock().expect("lock");
            assert_eq!(kept.len(), 1);
            let (key, kept) = kept.iter_mut().next().expect("kept");
            // Marked, to tell the kept verification from a new one.
            kept.entries = vec!["kept".into()];
            key.clone()
        };
        let (_, entries) = proof(&identity, &chain, record.clone()).await;
        assert_eq!(
            entries,
            ["kept"],
            "the second login verified the chain again"
        );

        // Past the chain's first notAfter, the kept verification is not used.
        identity
            .stored_chains
            .lock()
            .expect("lock")
            .get_mut(&kept_key)
            .expect("kept")
            .valid_until = crate::clock::now_unix() - 1;
        let (_, entries) = proof(&identity, &chain, record.clone()).await;
        assert_ne!(
            entries,
            ["kept"],
            "a verification was used past the chain's expiry"
        );

        // A chain that is not the enrolled one: verified, and its key is not the robot's.
        match identity.presented("robot-7", &other, Some(record)).await {
            Ok(Err(decoy)) => assert!(decoy.decoy.is_some()),
            Ok(Ok(_)) => panic!("another key's chain was taken for the enrolled one"),
            Err(e) => panic!("refused before the decoy: {e}"),
        }
    }
}
