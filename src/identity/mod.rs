//! Robot identity: which credential a robot must prove, the PKI challenge, and enrollment.
//!
//! A robot proves possession of a private key by signing a fresh challenge. The public half
//! is either enrolled as a bare key, or carried by an X.509 certificate that chains to a
//! configured trust anchor (presented at register time, or issued by our CA at enrollment).
//! Every check fails closed: an error anywhere means no login.

use std::sync::RwLock;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::{Map, Value};

use crate::pki::{
    decode_signature, verify_chain, CaError, CertificateAuthority, KeyError, PublicKey, TrustStore,
    X509Error,
};
use crate::store::{Credential, RobotRecord, Store, StoreError};

/// Bytes of randomness in a challenge (the spec asks for at least 32).
pub const CHALLENGE_BYTES: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{}", ROBOT_ID_RULE)]
    InvalidRobotId,
    #[error("unknown robot")]
    UnknownRobot,
    #[error("robot has no enrolled key or certificate")]
    NotEnrolled,
    #[error("credential revoked")]
    Revoked,
    #[error("no challenge is pending on this connection")]
    NoChallenge,
    #[error("challenge expired")]
    ChallengeExpired,
    #[error("correlationId does not match the challenge")]
    CorrelationMismatch,
    #[error("signature does not verify")]
    BadSignature,
    #[error("certificate rejected: {0}")]
    Certificate(#[from] X509Error),
    #[error("stored credential is unusable: {0}")]
    StoredKey(KeyError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl IdentityError {
    /// Short machine-readable reason, sent in `details.reason` and used as a metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            IdentityError::InvalidRobotId => "invalid_robot_id",
            IdentityError::UnknownRobot => "unknown_robot",
            IdentityError::NotEnrolled => "not_enrolled",
            IdentityError::Revoked => "revoked",
            IdentityError::NoChallenge => "no_challenge",
            IdentityError::ChallengeExpired => "challenge_expired",
            IdentityError::CorrelationMismatch => "correlation_mismatch",
            IdentityError::BadSignature => "bad_signature",
            IdentityError::Certificate(e) => e.reason(),
            IdentityError::StoredKey(_) => "internal",
            IdentityError::Store(_) => "internal",
        }
    }

    /// Failures that are the server's fault, not the robot's.
    pub fn is_internal(&self) -> bool {
        matches!(self, IdentityError::StoredKey(_) | IdentityError::Store(_))
    }
}

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

/// The proof a robot owes: kept by its connection, used once.
#[derive(Debug)]
pub struct Challenge {
    pub robot_id: String,
    pub message_id: String,
    pub encoded: String,
    bytes: [u8; CHALLENGE_BYTES],
    key: PublicKey,
    credential_kind: &'static str,
    /// Revocation-list entries to re-check when the proof arrives.
    revocation_keys: Vec<String>,
    expires_at: Instant,
    /// Set when the chain came from `register` of a robot we have no record of yet.
    auto_register: Option<Credential>,
}

impl Challenge {
    pub fn expires_at(&self) -> Instant {
        self.expires_at
    }
}

#[derive(Debug, Clone)]
pub struct VerifiedRobot {
    pub robot_id: String,
    pub credential_kind: &'static str,
    /// Revocation entries of the proven credential, so a later revocation finds the socket.
    pub credentials: Vec<String>,
}

pub struct Identity {
    store: Store,
    challenge_ttl: Duration,
    trust: Option<TrustStore>,
    ca: Option<CertificateAuthority>,
    /// `trust` and our CA together, built once.
    roots: Option<TrustStore>,
    auto_register: bool,
    cert_lifetime: Duration,
    /// Serials revoked by the imported CRL (replaced wholesale on reload).
    crl_serials: RwLock<Vec<String>>,
    rng: SystemRandom,
}

pub struct IdentityConfig {
    pub challenge_ttl: Duration,
    pub trust: Option<TrustStore>,
    pub ca: Option<CertificateAuthority>,
    pub auto_register: bool,
    pub cert_lifetime: Duration,
}

/// The robot id rule, as every error that enforces it states it.
pub const ROBOT_ID_RULE: &str = "robot id must be 1-128 characters of letters, digits and . _ : -";

pub fn valid_robot_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

pub fn key_revocation_entry(key: &PublicKey) -> String {
    format!("key:{}", key.fingerprint())
}

pub fn serial_revocation_entry(serial_hex: &str) -> String {
    format!("serial:{serial_hex}")
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Identity {
    pub fn new(store: Store, config: IdentityConfig) -> Result<Identity, X509Error> {
        let mut roots = config.trust.clone().unwrap_or_default();
        if let Some(ca) = &config.ca {
            let certificate = pem::parse(ca.cert_pem()).map_err(|_| X509Error::Untrusted)?;
            roots.add_der(certificate.contents())?;
        }
        Ok(Identity {
            roots: (!roots.is_empty()).then_some(roots),
            store,
            challenge_ttl: config.challenge_ttl,
            trust: config.trust,
            ca: config.ca,
            auto_register: config.auto_register,
            cert_lifetime: config.cert_lifetime,
            crl_serials: RwLock::new(Vec::new()),
            rng: SystemRandom::new(),
        })
    }

    pub fn ca(&self) -> Option<&CertificateAuthority> {
        self.ca.as_ref()
    }

    pub fn trust(&self) -> Option<&TrustStore> {
        self.trust.as_ref()
    }

    pub fn set_crl_serials(&self, serials: Vec<String>) {
        if let Ok(mut slot) = self.crl_serials.write() {
            *slot = serials;
        }
    }

    fn crl_lists(&self, serials: &[String]) -> bool {
        self.crl_serials
            .read()
            .map(|listed| serials.iter().any(|s| listed.contains(s)))
            // A poisoned lock means we cannot tell: refuse.
            .unwrap_or(true)
    }

    /// Trust anchors plus our own CA: the roots a robot certificate may chain to.
    fn roots(&self) -> Option<&TrustStore> {
        self.roots.as_ref()
    }

    /// Works out which key the robot must prove and makes its challenge.
    pub async fn challenge(
        &self,
        robot_id: &str,
        metadata: Option<&Map<String, Value>>,
    ) -> Result<Challenge, IdentityError> {
        if !valid_robot_id(robot_id) {
            return Err(IdentityError::InvalidRobotId);
        }
        let record = self.store.robot(robot_id).await?;
        let presented = metadata
            .and_then(|m| m.get("certificate"))
            .and_then(Value::as_str);

        let (key, kind, revocation_keys, auto_register) = match (presented, &record) {
            // A presented chain is checked against the roots every time.
            (Some(chain_pem), _) => {
                if record.is_none() && !self.auto_register {
                    return Err(IdentityError::UnknownRobot);
                }
                if record.as_ref().is_some_and(|r| r.credential_revoked) {
                    return Err(IdentityError::Revoked);
                }
                let (key, serials) = self.verify_certificate(chain_pem, robot_id)?;
                let auto = record.is_none().then(|| Credential::Certificate {
                    chain_pem: chain_pem.to_string(),
                    serial: serials.first().cloned().unwrap_or_default(),
                });
                let entries = serials.iter().map(|s| serial_revocation_entry(s)).collect();
                (key, "x509", entries, auto)
            }
            (None, None) => return Err(IdentityError::UnknownRobot),
            (None, Some(record)) => {
                let (key, kind, entries) = self.stored_credential(record)?;
                (key, kind, entries, None)
            }
        };
        if self.store.is_revoked(&revocation_keys).await? {
            return Err(IdentityError::Revoked);
        }

        let mut bytes = [0u8; CHALLENGE_BYTES];
        self.rng
            .fill(&mut bytes)
            .map_err(|_| IdentityError::Store(StoreError::Corrupt("no randomness")))?;
        Ok(Challenge {
            robot_id: robot_id.to_string(),
            message_id: String::new(),
            encoded: STANDARD.encode(bytes),
            bytes,
            key,
            credential_kind: kind,
            revocation_keys,
            expires_at: Instant::now() + self.challenge_ttl,
            auto_register,
        })
    }

    fn stored_credential(
        &self,
        record: &RobotRecord,
    ) -> Result<(PublicKey, &'static str, Vec<String>), IdentityError> {
        if record.credential_revoked {
            return Err(IdentityError::Revoked);
        }
        match &record.credential {
            None => Err(IdentityError::NotEnrolled),
            Some(Credential::PublicKey { stored, .. }) => {
                let key = PublicKey::from_stored(stored).map_err(IdentityError::StoredKey)?;
                let entry = key_revocation_entry(&key);
                Ok((key.clone(), key.kind(), vec![entry]))
            }
            Some(Credential::Certificate { chain_pem, .. }) => {
                let (key, serials) = self.verify_certificate(chain_pem, &record.robot_id)?;
                let entries = serials.iter().map(|s| serial_revocation_entry(s)).collect();
                Ok((key, "x509", entries))
            }
        }
    }

    /// Verifies a chain against the roots; returns the leaf key and the chain's serials.
    fn verify_certificate(
        &self,
        chain_pem: &str,
        robot_id: &str,
    ) -> Result<(PublicKey, Vec<String>), IdentityError> {
        let roots = self
            .roots()
            .ok_or(IdentityError::Certificate(X509Error::Untrusted))?;
        let verified = verify_chain(chain_pem, roots, robot_id, unix_now())?;
        let mut serials = vec![verified.serial_hex.clone()];
        serials.extend(verified.chain_serials.iter().cloned());
        if self.crl_lists(&serials) {
            return Err(IdentityError::Revoked);
        }
        Ok((verified.leaf_key, serials))
    }

    /// Checks the signed challenge. The challenge is consumed whatever the outcome.
    pub async fn verify(
        &self,
        challenge: Challenge,
        correlation_id: Option<&str>,
        signature_b64: &str,
    ) -> Result<VerifiedRobot, IdentityError> {
        if Instant::now() >= challenge.expires_at {
            return Err(IdentityError::ChallengeExpired);
        }
        if correlation_id != Some(challenge.message_id.as_str()) {
            return Err(IdentityError::CorrelationMismatch);
        }
        let signature = decode_signature(signature_b64).map_err(|_| IdentityError::BadSignature)?;
        challenge
            .key
            .verify(&challenge.bytes, &signature)
            .map_err(|_| IdentityError::BadSignature)?;
        // Revocation may have happened while the robot was signing.
        match &challenge.auto_register {
            Some(credential) => {
                if self.store.is_revoked(&challenge.revocation_keys).await? {
                    return Err(IdentityError::Revoked);
                }
                self.store
                    .auto_register_robot(&challenge.robot_id, credential)
                    .await?
            }
            None => match self
                .store
                .credential_still_valid(&challenge.robot_id, &challenge.revocation_keys)
                .await?
            {
                None => return Err(IdentityError::UnknownRobot),
                Some(false) => return Err(IdentityError::Revoked),
                Some(true) => {}
            },
        }
        Ok(VerifiedRobot {
            robot_id: challenge.robot_id,
            credential_kind: challenge.credential_kind,
            credentials: challenge.revocation_keys,
        })
    }

    /// `POST /v1/enroll`: checks the single-use token, then stores a key or signs a CSR.
    /// Returns the issued certificate chain for CSR enrollment.
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
                let issued = ca.sign_csr(csr, robot_id, self.cert_lifetime, unix_now())?;
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

    /// Revokes the robot's current credential; returns false if the robot does not exist.
    pub async fn revoke(&self, robot_id: &str, source: &str) -> Result<bool, IdentityError> {
        let Some(record) = self.store.robot(robot_id).await? else {
            return Ok(false);
        };
        match &record.credential {
            Some(Credential::PublicKey { stored, .. }) => {
                if let Ok(key) = PublicKey::from_stored(stored) {
                    self.store
                        .revoke_credential(
                            &key_revocation_entry(&key),
                            "key",
                            Some(robot_id),
                            source,
                        )
                        .await?;
                }
            }
            Some(Credential::Certificate { serial, .. }) if !serial.is_empty() => {
                self.store
                    .revoke_credential(
                        &serial_revocation_entry(serial),
                        "serial",
                        Some(robot_id),
                        source,
                    )
                    .await?;
            }
            _ => {}
        }
        self.store.mark_credential_revoked(robot_id).await?;
        Ok(true)
    }
}

impl Challenge {
    /// Binds the challenge to the id of the message that carries it.
    pub fn set_message_id(&mut self, id: &str) {
        self.message_id = id.to_string();
    }
}
