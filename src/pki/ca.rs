//! Our own issuing CA (rcgen): signs robot CSRs and, for development,
//! issues key + certificate pairs.

use std::fmt;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use ring::rand::SecureRandom;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::ParsedExtension;
use x509_parser::prelude::FromDer;

use super::keys::PublicKey;
use super::x509::{self, Anchor, X509Error};

/// CSRs are small; the cap bounds work on hostile input.
const MAX_CSR_PEM_BYTES: usize = 64 * 1024;
/// Issued certificates start slightly in the past so a robot whose clock
/// lags a little can use them at once.
const BACKDATE_SECS: i64 = 60;
/// X.520 upper bound for commonName.
const MAX_CN_LEN: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaError {
    #[error("malformed input: {0}")]
    Malformed(String),
    #[error("CA certificate is not a usable CA: {0}")]
    NotCa(String),
    #[error("CA private key does not match the CA certificate")]
    KeyMismatch,
    #[error("CSR signature is invalid")]
    BadCsrSignature,
    #[error("CSR does not name this robot")]
    NameMismatch,
    #[error("crypto failure: {0}")]
    Crypto(String),
}

impl CaError {
    /// Stable machine-readable code.
    pub fn reason(&self) -> &'static str {
        match self {
            CaError::Malformed(_) => "malformed",
            CaError::NotCa(_) => "not_ca",
            CaError::KeyMismatch => "key_mismatch",
            CaError::BadCsrSignature => "bad_signature",
            CaError::NameMismatch => "name_mismatch",
            CaError::Crypto(_) => "crypto",
        }
    }
}

/// A certificate we issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedCertificate {
    /// Leaf then CA certificate, PEM.
    pub chain_pem: String,
    /// Same format as [`super::VerifiedChain::serial_hex`].
    pub serial_hex: String,
    pub not_after_unix: i64,
    /// The certified key (the CSR's), so callers can check it against revocations.
    pub public_key: PublicKey,
}

/// Our CA: certificate plus matching private key.
pub struct CertificateAuthority {
    cert_pem: String,
    anchor: Anchor,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for CertificateAuthority {
    // Never print key material.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("subject", &self.anchor.subject)
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// Load from a single PEM certificate (must be a CA) and its PKCS#8 key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CaError> {
        let blocks = pem::parse_many(cert_pem)
            .map_err(|e| CaError::Malformed(format!("CA certificate PEM: {e}")))?;
        let [block] = blocks.as_slice() else {
            return Err(CaError::Malformed(
                "CA certificate PEM must hold exactly one certificate".into(),
            ));
        };
        if block.tag() != "CERTIFICATE" {
            return Err(CaError::Malformed(format!(
                "expected CERTIFICATE, got {:?}",
                block.tag()
            )));
        }
        let der = block.contents();
        let anchor = Anchor::from_der(der).map_err(|e| match e {
            X509Error::NotCa(m) | X509Error::KeyUsage(m) => CaError::NotCa(m),
            other => CaError::Malformed(other.to_string()),
        })?;
        let key = KeyPair::from_pem(key_pem)
            .map_err(|_| CaError::Malformed("CA private key is not a usable PKCS#8 key".into()))?;
        let key_public = PublicKey::from_spki_der(&key.subject_public_key_info())
            .map_err(|e| CaError::Malformed(format!("CA key: {e}")))?;
        if key_public != anchor.key {
            return Err(CaError::KeyMismatch);
        }
        let issuer = Issuer::from_ca_cert_der(&der.into(), key)
            .map_err(|e| CaError::Malformed(format!("CA certificate: {e}")))?;
        Ok(CertificateAuthority {
            cert_pem: pem::encode(block),
            anchor,
            issuer,
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A trust store holding only this CA, for verifying what it issued.
    pub fn trust_store(&self) -> super::TrustStore {
        let mut store = super::TrustStore::new();
        store.push_anchor(self.anchor.clone());
        store
    }

    pub(super) fn anchor(&self) -> &Anchor {
        &self.anchor
    }

    /// Sign a robot's CSR (PEM). The CSR must carry a valid self-signature
    /// and name `robot_id` (subject CN or SAN dNSName/URI). Only the CSR's
    /// public key is used: the certificate's names, usages and lifetime are
    /// ours, whatever else the CSR requests.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        robot_id: &str,
        lifetime: Duration,
        now_unix: i64,
    ) -> Result<IssuedCertificate, CaError> {
        if csr_pem.len() > MAX_CSR_PEM_BYTES {
            return Err(CaError::Malformed("CSR too large".into()));
        }
        let blocks =
            pem::parse_many(csr_pem).map_err(|e| CaError::Malformed(format!("CSR PEM: {e}")))?;
        let [block] = blocks.as_slice() else {
            return Err(CaError::Malformed(
                "expected exactly one CSR PEM block".into(),
            ));
        };
        if !matches!(
            block.tag(),
            "CERTIFICATE REQUEST" | "NEW CERTIFICATE REQUEST"
        ) {
            return Err(CaError::Malformed(format!(
                "expected CERTIFICATE REQUEST, got {:?}",
                block.tag()
            )));
        }
        let (rest, csr) = X509CertificationRequest::from_der(block.contents())
            .map_err(|e| CaError::Malformed(format!("CSR: {e}")))?;
        if !rest.is_empty() {
            return Err(CaError::Malformed("trailing data after CSR".into()));
        }
        let info = &csr.certification_request_info;
        if info.version.0 != 0 {
            return Err(CaError::Malformed("unsupported CSR version".into()));
        }
        let key = PublicKey::from_spki(&info.subject_pki)
            .map_err(|e| CaError::Malformed(format!("CSR public key: {e}")))?;
        // The key was parsed above (supported type, RSA ≥ 2048); the signature check uses
        // webpki's algorithm table.
        let _ = key;
        x509::verify_signed_data(
            &info.subject_pki,
            &csr.signature_algorithm,
            info.raw,
            &csr.signature_value,
        )
        .map_err(|e| match e {
            X509Error::BadSignature => CaError::BadCsrSignature,
            other => CaError::Malformed(format!("CSR signature: {other}")),
        })?;

        let mut named = x509::single_common_name(&info.subject) == Some(robot_id);
        if let Some(exts) = csr.requested_extensions() {
            for ext in exts {
                match ext {
                    ParsedExtension::ParseError { .. } => {
                        return Err(CaError::Malformed("invalid CSR extension".into()))
                    }
                    ParsedExtension::SubjectAlternativeName(san) => {
                        named |= x509::general_names_match(&san.general_names, robot_id);
                    }
                    _ => {}
                }
            }
        }
        if !named || robot_id.is_empty() {
            return Err(CaError::NameMismatch);
        }

        let spki = rcgen::SubjectPublicKeyInfo::from_der(info.subject_pki.raw)
            .map_err(|e| CaError::Malformed(format!("CSR public key: {e}")))?;
        self.issue_leaf(robot_id, &spki, lifetime, now_unix)
    }

    /// Development helper (`pki issue ROBOT`): a fresh P-256 key and a
    /// certificate for it. Returns the certificate and the PKCS#8 key PEM.
    pub fn issue_key_and_cert(
        &self,
        robot_id: &str,
        lifetime: Duration,
        now_unix: i64,
    ) -> Result<(IssuedCertificate, String), CaError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| CaError::Crypto(e.to_string()))?;
        let issued = self.issue_leaf(robot_id, &key, lifetime, now_unix)?;
        Ok((issued, key.serialize_pem()))
    }

    fn issue_leaf(
        &self,
        robot_id: &str,
        subject_key: &impl PublicKeyData,
        lifetime: Duration,
        now_unix: i64,
    ) -> Result<IssuedCertificate, CaError> {
        validate_common_name(robot_id)?;
        let lifetime_secs = i64::try_from(lifetime.as_secs())
            .map_err(|_| CaError::Malformed("lifetime too long".into()))?;
        if lifetime_secs == 0 {
            return Err(CaError::Malformed(
                "lifetime must be at least one second".into(),
            ));
        }
        let not_before = now_unix
            .checked_sub(BACKDATE_SECS)
            .ok_or_else(|| CaError::Malformed("time out of range".into()))?;
        let not_after = now_unix
            .checked_add(lifetime_secs)
            .ok_or_else(|| CaError::Malformed("lifetime too long".into()))?;

        let mut params = CertificateParams::default();
        params.not_before = timestamp(not_before)?;
        params.not_after = timestamp(not_after)?;
        params.serial_number = Some(SerialNumber::from_slice(&random_serial()?));
        params.distinguished_name = common_name(robot_id);
        params.subject_alt_names = robot_san(robot_id).into_iter().collect();
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;

        let cert = params
            .signed_by(subject_key, &self.issuer)
            .map_err(|e| CaError::Crypto(e.to_string()))?;
        // Report serial and expiry as verify_chain will read them back.
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.der())
            .map_err(|e| CaError::Crypto(format!("issued certificate unreadable: {e}")))?;
        let mut chain_pem = cert.pem();
        if !chain_pem.ends_with('\n') {
            chain_pem.push('\n');
        }
        chain_pem.push_str(&self.cert_pem);
        Ok(IssuedCertificate {
            public_key: PublicKey::from_spki(parsed.public_key())
                .map_err(|e| CaError::Malformed(format!("issued key: {e}")))?,
            chain_pem,
            serial_hex: x509::serial_hex(parsed.raw_serial()),
            not_after_unix: parsed.validity().not_after.timestamp(),
        })
    }
}

/// Generate a self-signed ECDSA P-256 CA (CA:TRUE, pathLen 0,
/// keyCertSign + cRLSign) valid from one minute ago for `lifetime_days`.
/// Returns (certificate PEM, PKCS#8 key PEM).
pub fn generate_ca(
    common_name_text: &str,
    lifetime_days: u32,
) -> Result<(String, String), CaError> {
    validate_common_name(common_name_text)?;
    if lifetime_days == 0 {
        return Err(CaError::Malformed(
            "CA lifetime must be at least one day".into(),
        ));
    }
    let now = time::OffsetDateTime::now_utc();
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| CaError::Crypto(e.to_string()))?;
    let mut params = CertificateParams::default();
    // checked_*: a huge lifetime must be an error, not an overflow panic.
    params.not_before = now
        .checked_sub(time::Duration::seconds(BACKDATE_SECS))
        .ok_or_else(|| CaError::Malformed("time out of range".into()))?;
    params.not_after = now
        .checked_add(time::Duration::days(i64::from(lifetime_days)))
        .ok_or_else(|| CaError::Malformed("CA lifetime too long".into()))?;
    params.serial_number = Some(SerialNumber::from_slice(&random_serial()?));
    params.distinguished_name = common_name(common_name_text);
    // pathLen 0: this CA signs robot certificates only, never sub-CAs.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params
        .self_signed(&key)
        .map_err(|e| CaError::Crypto(e.to_string()))?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn common_name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

fn validate_common_name(cn: &str) -> Result<(), CaError> {
    if cn.is_empty() || cn.len() > MAX_CN_LEN || cn.chars().any(char::is_control) {
        return Err(CaError::Malformed(format!(
            "name must be 1..={MAX_CN_LEN} bytes without control characters"
        )));
    }
    Ok(())
}

/// SAN for the robot id: a URI if it looks like one, else a dNSName if it is
/// a valid host name, else none (the CN still names the robot).
fn robot_san(robot_id: &str) -> Option<SanType> {
    if robot_id.contains(':') {
        let valid_scheme = robot_id.split_once(':').is_some_and(|(scheme, rest)| {
            !rest.is_empty()
                && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        });
        let printable = robot_id.chars().all(|c| c.is_ascii_graphic());
        if valid_scheme && printable {
            return robot_id.try_into().ok().map(SanType::URI);
        }
        return None;
    }
    if is_dns_name(robot_id) {
        return robot_id.try_into().ok().map(SanType::DnsName);
    }
    None
}

fn is_dns_name(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

fn timestamp(unix: i64) -> Result<time::OffsetDateTime, CaError> {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .map_err(|_| CaError::Malformed("time out of range".into()))
}

/// 16 random bytes, top bit cleared so the INTEGER is positive, first byte
/// non-zero so the encoded serial keeps its full length.
fn random_serial() -> Result<[u8; 16], CaError> {
    let mut serial = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut serial)
        .map_err(|_| CaError::Crypto("system RNG failed".into()))?;
    serial[0] &= 0x7f;
    if serial[0] == 0 {
        serial[0] = 1;
    }
    Ok(serial)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{verify_chain, TrustStore};
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    const ROBOT: &str = "robot-7";
    const DAY: Duration = Duration::from_secs(86_400);

    fn our_ca() -> CertificateAuthority {
        let (cert, key) = generate_ca("Signalling CA", 30).expect("generate");
        CertificateAuthority::from_pem(&cert, &key).expect("load")
    }

    fn now() -> i64 {
        time::OffsetDateTime::now_utc().unix_timestamp()
    }

    /// CSR parameters: a subject name, optionally SANs; rcgen refuses
    /// certificate-only fields in a CSR.
    fn csr_params(cn: &str) -> CertificateParams {
        let mut p = CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p
    }

    fn csr_for(params: &CertificateParams, key: &KeyPair) -> String {
        params
            .serialize_request(key)
            .expect("csr")
            .pem()
            .expect("pem")
    }

    #[test]
    fn generated_ca_is_a_ca() {
        let ca = our_ca();
        let store = TrustStore::from_pem(ca.cert_pem().as_bytes()).expect("anchor");
        assert_eq!(store.len(), 1);
        assert!(format!("{ca:?}").contains("Signalling CA"));
        assert_eq!(ca.trust_store().len(), 1);
    }

    #[test]
    fn csr_round_trip_for_each_key_type() {
        let ca = our_ca();
        let store = TrustStore::from_pem(ca.cert_pem().as_bytes()).expect("anchor");
        let t = now();
        let keys = [
            KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap(),
            p256(),
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap(),
            rsa_key(),
        ];
        for key in keys {
            let csr = csr_for(&csr_params(ROBOT), &key);
            let issued = ca.sign_csr(&csr, ROBOT, DAY, t).expect("sign");
            assert_eq!(issued.not_after_unix, t + 86_400);
            // 16 bytes, first byte 0x01..=0x7f: 31 or 32 hex digits.
            assert!((31..=32).contains(&issued.serial_hex.len()));
            assert!(!issued.serial_hex.starts_with('0'));
            let vc = verify_chain(&issued.chain_pem, &store, ROBOT, t).expect("verify");
            assert_eq!(vc.serial_hex, issued.serial_hex);
            assert_eq!(vc.not_after_unix, issued.not_after_unix);
            let sig = sign_with(&key, b"nonce");
            vc.leaf_key
                .verify(b"nonce", &sig)
                .expect("leaf key is the CSR key");
            // Backdated by 60 s, and not valid after the lifetime.
            verify_chain(&issued.chain_pem, &store, ROBOT, t - 60).expect("backdated");
            let err = verify_chain(&issued.chain_pem, &store, ROBOT, t - 61).unwrap_err();
            assert_eq!(err.reason(), "not_yet_valid");
            let err = verify_chain(&issued.chain_pem, &store, ROBOT, t + 86_401).unwrap_err();
            assert_eq!(err.reason(), "expired");
        }
    }

    #[test]
    fn csr_named_by_san_and_uri_ids() {
        let ca = our_ca();
        let store = ca.trust_store();
        let t = now();
        // CN is something else, SAN DNS names the robot.
        let mut p = csr_params("some device");
        p.subject_alt_names = vec![SanType::DnsName(ROBOT.try_into().unwrap())];
        let issued = ca
            .sign_csr(&csr_for(&p, &p256()), ROBOT, DAY, t)
            .expect("sign");
        let vc = verify_chain(&issued.chain_pem, &store, ROBOT, t).expect("verify");
        // The issued certificate carries our CN, not the CSR's.
        assert_eq!(vc.subject_cn.as_deref(), Some(ROBOT));

        // A URI-shaped robot id ends up as a SAN URI and CN.
        let uri = "urn:fleet:robot:7";
        let issued = ca
            .sign_csr(&csr_for(&csr_params(uri), &p256()), uri, DAY, t)
            .expect("sign");
        verify_chain(&issued.chain_pem, &store, uri, t).expect("verify");
    }

    #[test]
    fn csr_for_another_robot_refused() {
        let ca = our_ca();
        let csr = csr_for(&csr_params("robot-8"), &p256());
        let err = ca.sign_csr(&csr, ROBOT, DAY, now()).unwrap_err();
        assert_eq!(err, CaError::NameMismatch);
        assert_eq!(err.reason(), "name_mismatch");
        let mut p = csr_params("robot-8");
        p.subject_alt_names = vec![SanType::DnsName("robot-9".try_into().unwrap())];
        let err = ca
            .sign_csr(&csr_for(&p, &p256()), ROBOT, DAY, now())
            .unwrap_err();
        assert_eq!(err, CaError::NameMismatch);
        let err = ca.sign_csr(&csr, "", DAY, now()).unwrap_err();
        assert_eq!(err.reason(), "name_mismatch");
    }

    #[test]
    fn csr_with_broken_signature_refused() {
        let ca = our_ca();
        let csr = csr_for(&csr_params(ROBOT), &p256());
        let mut der = pem::parse(&csr).unwrap().into_contents();
        // Flip a bit in the last byte (inside the signature value).
        let last = der.len() - 1;
        der[last] ^= 0x01;
        let broken = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", der.clone()));
        let err = ca.sign_csr(&broken, ROBOT, DAY, now()).unwrap_err();
        assert_eq!(err, CaError::BadCsrSignature);
        assert_eq!(err.reason(), "bad_signature");

        // Change the subject instead: signature no longer covers it.
        let mut der = pem::parse(&csr).unwrap().into_contents();
        let pos = der.windows(7).position(|w| w == ROBOT.as_bytes()).unwrap();
        der[pos + 6] = b'8';
        let forged = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", der));
        let err = ca.sign_csr(&forged, "robot-8", DAY, now()).unwrap_err();
        assert_eq!(err, CaError::BadCsrSignature);
    }

    #[test]
    fn garbage_csr_and_bad_parameters_refused() {
        let ca = our_ca();
        for bad in [
            "",
            "garbage",
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
            ca.cert_pem(),
        ] {
            let err = ca.sign_csr(bad, ROBOT, DAY, now()).unwrap_err();
            assert_eq!(err.reason(), "malformed", "{bad:.40}");
        }
        let csr = csr_for(&csr_params(ROBOT), &p256());
        let err = ca.sign_csr(&csr, ROBOT, Duration::ZERO, now()).unwrap_err();
        assert_eq!(err.reason(), "malformed");
        let err = ca
            .sign_csr(&csr, ROBOT, Duration::from_secs(u64::MAX), now())
            .unwrap_err();
        assert_eq!(err.reason(), "malformed");
        // Names the CN rules refuse.
        let long = "r".repeat(65);
        let csr = csr_for(&csr_params(&long), &p256());
        assert_eq!(
            ca.sign_csr(&csr, &long, DAY, now()).unwrap_err().reason(),
            "malformed"
        );
    }

    #[test]
    fn issue_key_and_cert_works() {
        let ca = our_ca();
        let store = ca.trust_store();
        let t = now();
        let (issued, key_pem) = ca.issue_key_and_cert(ROBOT, DAY, t).expect("issue");
        assert!(key_pem.contains("BEGIN PRIVATE KEY"));
        let vc = verify_chain(&issued.chain_pem, &store, ROBOT, t).expect("verify");
        let key = KeyPair::from_pem(&key_pem).expect("key");
        vc.leaf_key
            .verify(b"m", &sign_with(&key, b"m"))
            .expect("key matches");
        // Two issues never share a serial.
        let (again, _) = ca.issue_key_and_cert(ROBOT, DAY, t).expect("issue");
        assert_ne!(again.serial_hex, issued.serial_hex);
        // Robot ids that are neither host names nor URIs still get a CN.
        let (odd, _) = ca
            .issue_key_and_cert("robot 7 (lab)", DAY, t)
            .expect("issue");
        verify_chain(&odd.chain_pem, &store, "robot 7 (lab)", t).expect("CN only");
    }

    #[test]
    fn from_pem_checks_ca_and_key() {
        let (cert, key) = generate_ca("CA One", 1).expect("gen");
        let (_, other_key) = generate_ca("CA Two", 1).expect("gen");
        let err = CertificateAuthority::from_pem(&cert, &other_key).unwrap_err();
        assert_eq!(err, CaError::KeyMismatch);

        // A leaf certificate is not a CA.
        let root = TestCa::root("Fleet Root", p256());
        let leaf_key = p256();
        let leaf = root.issue(&leaf_params(ROBOT), &leaf_key);
        let err = CertificateAuthority::from_pem(&leaf, &leaf_key.serialize_pem()).unwrap_err();
        assert_eq!(err.reason(), "not_ca");

        assert_eq!(
            CertificateAuthority::from_pem("junk", &key)
                .unwrap_err()
                .reason(),
            "malformed"
        );
        assert_eq!(
            CertificateAuthority::from_pem(&cert, "junk")
                .unwrap_err()
                .reason(),
            "malformed"
        );
        let two = format!("{cert}{cert}");
        assert_eq!(
            CertificateAuthority::from_pem(&two, &key)
                .unwrap_err()
                .reason(),
            "malformed"
        );
        assert_eq!(generate_ca("", 1).unwrap_err().reason(), "malformed");
        assert_eq!(generate_ca("x", 0).unwrap_err().reason(), "malformed");
        assert_eq!(
            generate_ca("x", u32::MAX).unwrap_err().reason(),
            "malformed"
        );

        // A fleet CA made elsewhere can be loaded as ours.
        let fleet = TestCa::root("Fleet Root", rsa_key());
        let ca = CertificateAuthority::from_pem(&fleet.pem, RSA_2048_PKCS8_PEM).expect("rsa CA");
        let issued = ca
            .sign_csr(&csr_for(&csr_params(ROBOT), &p256()), ROBOT, DAY, NOW)
            .expect("sign");
        let store = TrustStore::from_pem(fleet.pem.as_bytes()).unwrap();
        verify_chain(&issued.chain_pem, &store, ROBOT, NOW).expect("verify");
    }
}
