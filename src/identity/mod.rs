//! Robot identity: which credential a robot must prove, the PKI challenge, and enrollment.
//!
//! A robot proves possession of a private key by signing a fresh challenge. The public half
//! is either enrolled as a bare key, or carried by an X.509 certificate that chains to a
//! configured trust anchor (presented at register time, or issued by our CA at enrollment).
//!
//! The rule that ties the two together: a robot with an enrolled credential logs in only
//! with that credential — its key, or a certificate whose leaf key is that key (or the
//! stored certificate's leaf key). A chain presented by a robot we have no credential for
//! is accepted (with `--auto-register`, or for a record without one) and then recorded, so
//! the next enrollment or revoke supersedes it. Every check fails closed: an error anywhere
//! means no login.

mod certificates;
pub mod crl;
mod enroll;

pub use enroll::EnrollError;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::{Map, Value};

use crate::auth::sha256_hex;
use crate::pki::{
    decode_signature, leaf_key_of_chain, verify_chain_with_crls, CertId, CertificateAuthority,
    KeyError, PublicKey, RevocationList, TrustStore, VerifiedChain, X509Error,
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
    /// The presented certificate is not the robot's enrolled credential (an older
    /// certificate, or one for another key): superseded credentials never log in.
    #[error("this certificate is not the robot's enrolled credential")]
    CredentialMismatch,
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
    #[error("certificate verification did not finish: {0}")]
    Verifier(String),
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
            IdentityError::CredentialMismatch => "credential_mismatch",
            IdentityError::NoChallenge => "no_challenge",
            IdentityError::ChallengeExpired => "challenge_expired",
            IdentityError::CorrelationMismatch => "correlation_mismatch",
            IdentityError::BadSignature => "bad_signature",
            IdentityError::Certificate(e) => e.reason(),
            IdentityError::StoredKey(_) | IdentityError::Verifier(_) => "internal",
            IdentityError::Store(_) => "internal",
        }
    }

    /// Failures that are the server's fault, not the robot's.
    pub fn is_internal(&self) -> bool {
        matches!(
            self,
            IdentityError::StoredKey(_) | IdentityError::Store(_) | IdentityError::Verifier(_)
        )
    }
}

/// The proof a robot owes: kept by its connection, used once.
#[derive(Debug)]
pub struct Challenge {
    pub robot_id: String,
    pub message_id: String,
    pub encoded: String,
    bytes: [u8; CHALLENGE_BYTES],
    /// The key whose signature proves the robot (for a decoy: the key whose signature
    /// entitles the prover to the real refusal, if any).
    key: Option<PublicKey>,
    /// Set for a robot that cannot log in, so an anonymous prover learns nothing before
    /// its proof is checked (see [`Identity::challenge`]).
    decoy: Option<IdentityError>,
    credential_kind: &'static str,
    /// Revocation-list entries to re-check when the proof arrives.
    revocation_keys: Vec<String>,
    /// The robot's credential as stored when the challenge was made (or as it will be
    /// recorded): the login stands only if the robot still holds exactly this.
    credential: Credential,
    expires_at: Instant,
    /// The node's count of access cuts when the challenge was made (see
    /// `Presence::access_cuts`): any time before the login's database check will do.
    pub access_cuts_seen: u64,
    /// The presented chain (`credential`) is to be recorded as the robot's credential once
    /// the proof succeeds (auto-registration, or a record that had no credential yet).
    record_chain: Option<RecordChain>,
}

#[derive(Debug)]
struct RecordChain {
    /// No record existed: create one (only with `--auto-register`).
    create: bool,
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
    /// `trust` and our CA together, built once; shared with the verification threads.
    roots: Option<Arc<TrustStore>>,
    auto_register: bool,
    cert_lifetime: Duration,
    /// CRLs in force, replaced wholesale on reload; their entries are also persisted.
    crls: RwLock<Arc<Vec<RevocationList>>>,
    /// Chain verification runs on blocking threads, at most this many at once, so a burst
    /// of registrations cannot starve the async workers or spawn unbounded threads.
    verify_slots: Arc<tokio::sync::Semaphore>,
    rng: SystemRandom,
    /// Stored chains verified lately: a certificate robot's registrations (or anyone's
    /// asking challenges for it), with its enrolled chain presented or not, cost a lookup,
    /// not a path validation each.
    stored_chains: Mutex<HashMap<String, StoredChain>>,
}

/// A stored chain's verification, valid while the CRLs it was checked against are the ones
/// in force, until the first certificate on it expires, and for [`STORED_CHAIN_TTL`].
struct StoredChain {
    leaf_key: PublicKey,
    entries: Vec<String>,
    crls: Arc<Vec<RevocationList>>,
    /// Unix seconds: the earliest notAfter on the chain and its anchor.
    valid_until: i64,
    at: Instant,
}

/// How long a stored chain's verification is reused at most.
const STORED_CHAIN_TTL: Duration = Duration::from_secs(60);

/// Stored chains remembered at most; past it the memory is emptied.
const STORED_CHAINS_KEPT: usize = 4096;

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

/// Serial without issuer: the form revocations were recorded in before issuer+serial
/// matching. Still checked so rows written by older versions keep refusing.
pub fn serial_revocation_entry(serial_hex: &str) -> String {
    format!("serial:{serial_hex}")
}

/// A certificate named by issuer and serial (admin revoke, CRL entries).
pub fn cert_revocation_entry(id: &CertId) -> String {
    format!("cert:{}:{}", id.issuer, id.serial)
}

/// Every entry that, when revoked, must refuse this verified chain: each certificate on
/// the path by issuer+serial (and the legacy serial form), and the leaf's key.
fn chain_entries(chain: &VerifiedChain) -> Vec<String> {
    let mut entries: Vec<String> = chain.chain_ids.iter().map(cert_revocation_entry).collect();
    entries.extend(
        chain
            .chain_serials
            .iter()
            .map(|s| serial_revocation_entry(s)),
    );
    entries.push(key_revocation_entry(&chain.leaf_key));
    entries
}

/// What a robot must prove at login: the key, its kind, the revocation entries it must not
/// match, the credential, and whether its certificate is to be recorded.
type Proof = (
    PublicKey,
    &'static str,
    Vec<String>,
    Credential,
    Option<RecordChain>,
);

impl Identity {
    pub fn new(store: Store, config: IdentityConfig) -> Result<Identity, X509Error> {
        let mut roots = config.trust.clone().unwrap_or_default();
        if let Some(ca) = &config.ca {
            let certificate = pem::parse(ca.cert_pem()).map_err(|_| X509Error::Untrusted)?;
            roots.add_der(certificate.contents())?;
        }
        let slots = std::thread::available_parallelism().map_or(2, |n| n.get());
        Ok(Identity {
            roots: (!roots.is_empty()).then(|| Arc::new(roots)),
            store,
            challenge_ttl: config.challenge_ttl,
            trust: config.trust,
            ca: config.ca,
            auto_register: config.auto_register,
            cert_lifetime: config.cert_lifetime,
            crls: RwLock::new(Arc::new(Vec::new())),
            verify_slots: Arc::new(tokio::sync::Semaphore::new(slots)),
            rng: SystemRandom::new(),
            stored_chains: Mutex::new(HashMap::new()),
        })
    }

    pub fn ca(&self) -> Option<&CertificateAuthority> {
        self.ca.as_ref()
    }

    pub fn trust(&self) -> Option<&TrustStore> {
        self.trust.as_ref()
    }

    /// Works out which key the robot must prove and makes its challenge.
    ///
    /// Whether a robot id exists, is enrolled or is revoked is not told before a proof is
    /// checked (as `/v1/enroll` tells nothing before its token is): such a robot gets a
    /// decoy challenge like any other, and its refusal comes after the response, as
    /// `bad_signature` unless the signature verifies with the key the refusal concerns
    /// (a revoked robot's own key, or a presented certificate's).
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
        if let Some(record) = record.as_ref().filter(|r| r.credential_revoked) {
            let enrolled = record
                .credential
                .as_ref()
                .and_then(|c| self.enrolled_key(c).ok());
            return self.decoy(robot_id, IdentityError::Revoked, enrolled);
        }

        let (key, kind, revocation_keys, credential, record_chain) = match (presented, record) {
            (None, None) => return self.decoy(robot_id, IdentityError::UnknownRobot, None),
            (None, Some(record)) if record.credential.is_none() => {
                return self.decoy(robot_id, IdentityError::NotEnrolled, None)
            }
            (None, Some(record)) => {
                let (key, kind, entries) = self.stored_credential(&record).await?;
                let credential = record.credential.ok_or(IdentityError::NotEnrolled)?;
                (key, kind, entries, credential, None)
            }
            (Some(chain_pem), record) => match self.presented(robot_id, chain_pem, record).await? {
                Ok(proof) => proof,
                Err(decoy) => return Ok(decoy),
            },
        };
        // A certificate's entries are refused before the robot signs (its chain was just
        // verified, so one more read is a small share). A bare key's entry is checked once,
        // with the login's record after the signature (`verify`): a revoked key costs the
        // robot a signature, and a login one read less.
        if kind == "x509" && self.store.is_revoked(&revocation_keys).await? {
            return Err(IdentityError::Revoked);
        }

        let bytes = self.challenge_bytes()?;
        Ok(Challenge {
            robot_id: robot_id.to_string(),
            message_id: String::new(),
            encoded: STANDARD.encode(bytes),
            bytes,
            key: Some(key),
            decoy: None,
            credential_kind: kind,
            revocation_keys,
            credential,
            access_cuts_seen: 0,
            expires_at: Instant::now() + self.challenge_ttl,
            record_chain,
        })
    }

    fn challenge_bytes(&self) -> Result<[u8; CHALLENGE_BYTES], IdentityError> {
        let mut bytes = [0u8; CHALLENGE_BYTES];
        self.rng
            .fill(&mut bytes)
            .map_err(|_| IdentityError::Store(StoreError::Corrupt("no randomness")))?;
        Ok(bytes)
    }

    /// A challenge like any other for a robot that cannot log in: `refusal` is told after
    /// the response, only to a prover whose signature verifies with `entitled`.
    fn decoy(
        &self,
        robot_id: &str,
        refusal: IdentityError,
        entitled: Option<PublicKey>,
    ) -> Result<Challenge, IdentityError> {
        let bytes = self.challenge_bytes()?;
        Ok(Challenge {
            robot_id: robot_id.to_string(),
            message_id: String::new(),
            encoded: STANDARD.encode(bytes),
            bytes,
            key: entitled,
            decoy: Some(refusal),
            credential_kind: "none",
            revocation_keys: Vec::new(),
            credential: Credential::PublicKey {
                kind: String::new(),
                stored: String::new(),
            },
            access_cuts_seen: 0,
            expires_at: Instant::now() + self.challenge_ttl,
            record_chain: None,
        })
    }

    /// The key a stored credential stands for: the enrolled key, or the stored
    /// certificate's leaf key. Parsing only.
    fn enrolled_key(&self, credential: &Credential) -> Result<PublicKey, IdentityError> {
        match credential {
            Credential::PublicKey { stored, .. } => {
                PublicKey::from_stored(stored).map_err(IdentityError::StoredKey)
            }
            Credential::Certificate { chain_pem, .. } => Ok(leaf_key_of_chain(chain_pem)?.0),
        }
    }

    /// Checks the signed challenge, then records the login (on `node`) if what it proved
    /// still stands. The challenge is consumed whatever the outcome.
    pub async fn verify(
        &self,
        challenge: Challenge,
        correlation_id: Option<&str>,
        signature_b64: &str,
        node: &str,
    ) -> Result<VerifiedRobot, IdentityError> {
        if Instant::now() >= challenge.expires_at {
            return Err(IdentityError::ChallengeExpired);
        }
        if correlation_id != Some(challenge.message_id.as_str()) {
            return Err(IdentityError::CorrelationMismatch);
        }
        let signature = decode_signature(signature_b64).map_err(|_| IdentityError::BadSignature)?;
        let proven = challenge
            .key
            .as_ref()
            .is_some_and(|key| key.verify(&challenge.bytes, &signature).is_ok());
        if let Some(refusal) = challenge.decoy {
            tracing::debug!(robot = %challenge.robot_id, reason = refusal.reason(), proven, "login refused after a decoy challenge");
            return Err(if proven {
                refusal
            } else {
                IdentityError::BadSignature
            });
        }
        if !proven {
            return Err(IdentityError::BadSignature);
        }
        if let Some(record) = &challenge.record_chain {
            // Record the chain so a later enrollment or revoke supersedes it. If another
            // login or an enrollment got there first, the check below refuses this one.
            self.store
                .record_presented_certificate(
                    &challenge.robot_id,
                    &challenge.credential,
                    record.create,
                )
                .await?;
        }
        // A revocation, re-enrollment or deletion may have happened while the robot was
        // signing: the login is recorded only if none did, in one statement.
        let recorded = self
            .store
            .record_login(
                &challenge.robot_id,
                node,
                &challenge.credential,
                &challenge.revocation_keys,
            )
            .await?;
        if !recorded {
            return Err(self.why_refused(&challenge).await?);
        }
        Ok(VerifiedRobot {
            robot_id: challenge.robot_id,
            credential_kind: challenge.credential_kind,
            credentials: challenge.revocation_keys,
        })
    }

    /// Whether an earlier robot login still stands: the robot exists, its credential is not
    /// revoked, nothing it proved (`proved`: the revocation entries of its login) is on the
    /// revocation list, and it was not re-enrolled since (a new credential supersedes the
    /// key it proved). For checking sockets again when the broadcast of a cut may have been
    /// lost. A stored credential that no longer parses fails closed.
    pub async fn login_still_stands(
        &self,
        robot_id: &str,
        proved: &[String],
    ) -> Result<bool, StoreError> {
        let Some(record) = self.store.robot(robot_id).await? else {
            return Ok(false);
        };
        let Some(credential) = record
            .credential
            .as_ref()
            .filter(|_| !record.credential_revoked)
        else {
            return Ok(false);
        };
        let Ok(enrolled) = self.enrolled_key(credential) else {
            return Ok(false);
        };
        if !proved.contains(&key_revocation_entry(&enrolled)) {
            return Ok(false);
        }
        Ok(!self.store.is_revoked(proved).await?)
    }

    /// Why a login whose proof was good no longer stands (a read, on refusals only).
    async fn why_refused(&self, challenge: &Challenge) -> Result<IdentityError, StoreError> {
        let Some(record) = self.store.robot(&challenge.robot_id).await? else {
            return Ok(IdentityError::UnknownRobot);
        };
        if record.credential_revoked || self.store.is_revoked(&challenge.revocation_keys).await? {
            return Ok(IdentityError::Revoked);
        }
        Ok(IdentityError::CredentialMismatch)
    }
}

impl Challenge {
    /// Binds the challenge to the id of the message that carries it.
    pub fn set_message_id(&mut self, id: &str) {
        self.message_id = id.to_string();
    }
}
