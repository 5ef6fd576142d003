//! Fleet CA trust: robot certificate chains checked with rustls-webpki.
//!
//! webpki does the path work: building a path through the presented intermediates to an
//! anchor, every signature (Ed25519, ECDSA P-256/P-384, RSA ≥ 2048 PKCS#1 v1.5 and PSS),
//! validity, basicConstraints and pathLen of intermediates, the clientAuth EKU, unknown
//! critical extensions, and CRLs (matched by issuer and serial, signed by the issuing CA of
//! each certificate on the path). We keep only what it does not do:
//!
//! * the robot-name binding (subject CN, SAN dNSName or URI equal to the robot id);
//! * anchor bookkeeping: webpki treats anchors as bare (name, key) pairs, so the anchor's
//!   validity, pathLenConstraint and keyUsage are checked here;
//! * keyCertSign on issuers and digitalSignature on the leaf (webpki ignores keyUsage);
//! * refusing name constraints: our name binding uses the CN, which name constraints do
//!   not cover, so a name-constrained CA could still certify any robot name.
//!
//! Cheap checks (parsing, name, a plausible anchor) run before any signature work, so a
//! hostile chain that cannot succeed costs no public-key operations.

use std::cell::RefCell;

use rustls_pki_types::{CertificateDer, SignatureVerificationAlgorithm, TrustAnchor, UnixTime};
use webpki::{CertRevocationList, EndEntityCert, KeyUsage, RevocationOptionsBuilder};
use x509_parser::certificate::X509Certificate;

mod fields;
mod verify;

pub(super) use fields::*;
pub use verify::{leaf_key_of_chain, verify_chain, verify_chain_with_crls};

use super::keys::{hex_lower, KeyError, PublicKey};

/// Most certificates accepted in one presented chain (leaf included).
pub const MAX_CHAIN_LEN: usize = 8;
/// A chain of 8 RSA-4096 certificates is ~20 KiB of PEM; this leaves room
/// while bounding parsing work on hostile input.
const MAX_CHAIN_PEM_BYTES: usize = 128 * 1024;
const MAX_TRUST_PEM_BYTES: usize = 4 * 1024 * 1024;

/// The signature algorithms we accept anywhere in a chain, a CRL or a CSR: webpki's own
/// table, so algorithm identifiers are matched byte for byte by well-reviewed code.
/// No SHA-1, no RSA below 2048 bits.
pub(super) static SIGNATURE_ALGS: &[&dyn SignatureVerificationAlgorithm] = &[
    webpki::ring::ED25519,
    webpki::ring::ECDSA_P256_SHA256,
    webpki::ring::ECDSA_P384_SHA384,
    webpki::ring::ECDSA_P256_SHA384,
    webpki::ring::ECDSA_P384_SHA256,
    webpki::ring::RSA_PKCS1_2048_8192_SHA256,
    webpki::ring::RSA_PKCS1_2048_8192_SHA384,
    webpki::ring::RSA_PKCS1_2048_8192_SHA512,
    webpki::ring::RSA_PKCS1_2048_8192_SHA256_ABSENT_PARAMS,
    webpki::ring::RSA_PKCS1_2048_8192_SHA384_ABSENT_PARAMS,
    webpki::ring::RSA_PKCS1_2048_8192_SHA512_ABSENT_PARAMS,
    webpki::ring::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
    webpki::ring::RSA_PSS_2048_8192_SHA384_LEGACY_KEY,
    webpki::ring::RSA_PSS_2048_8192_SHA512_LEGACY_KEY,
];

/// Why a certificate or chain was refused. [`X509Error::reason`] gives the
/// stable code reported to clients and logs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum X509Error {
    #[error("malformed certificate: {0}")]
    Malformed(String),
    #[error("{0} certificate has expired")]
    Expired(&'static str),
    #[error("{0} certificate is not yet valid")]
    NotYetValid(&'static str),
    #[error("certificate chain does not lead to a trusted CA")]
    Untrusted,
    /// An extension we do not enforce (e.g. name constraints, or any unknown
    /// critical extension) — trust cannot be established through it.
    #[error("unsupported certificate extension: {0}")]
    UnsupportedExtension(String),
    #[error("issuer is not a CA: {0}")]
    NotCa(String),
    #[error("key usage does not permit this use: {0}")]
    KeyUsage(String),
    #[error("certificate does not name this robot")]
    NameMismatch,
    #[error("certificate signature is invalid")]
    BadSignature,
    #[error("certificate has been revoked")]
    Revoked,
    #[error("certificate chain too long: {0}")]
    ChainTooLong(String),
    #[error("unsupported algorithm: {0}")]
    UnsupportedAlgorithm(String),
}

impl X509Error {
    /// Stable machine-readable code.
    pub fn reason(&self) -> &'static str {
        match self {
            X509Error::Malformed(_) => "malformed",
            X509Error::Expired(_) => "expired",
            X509Error::NotYetValid(_) => "not_yet_valid",
            X509Error::Untrusted | X509Error::UnsupportedExtension(_) => "untrusted",
            X509Error::NotCa(_) => "not_ca",
            X509Error::KeyUsage(_) => "key_usage",
            X509Error::NameMismatch => "name_mismatch",
            X509Error::BadSignature => "bad_signature",
            X509Error::Revoked => "revoked",
            X509Error::ChainTooLong(_) => "chain_too_long",
            X509Error::UnsupportedAlgorithm(_) => "unsupported_algorithm",
        }
    }
}

impl From<KeyError> for X509Error {
    fn from(e: KeyError) -> Self {
        match e {
            KeyError::Malformed(m) => X509Error::Malformed(m),
            KeyError::UnsupportedAlgorithm(m) => X509Error::UnsupportedAlgorithm(m),
            KeyError::WeakKey => X509Error::UnsupportedAlgorithm("RSA key below 2048 bits".into()),
            KeyError::BadSignature => X509Error::BadSignature,
        }
    }
}

/// One certificate as revocation sees it: who issued it and its serial. RFC 5280 makes a
/// serial unique per issuer only, so a serial alone never identifies a certificate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CertId {
    /// Lowercase hex SHA-256 of the issuer Name (DER contents, as webpki compares them).
    pub issuer: String,
    /// Same format as [`serial_hex`].
    pub serial: String,
}

/// Issuer fingerprint used by [`CertId`] and CRL entries.
pub fn issuer_id(issuer_name_der: &[u8]) -> String {
    hex_lower(ring::digest::digest(&ring::digest::SHA256, issuer_name_der).as_ref())
}

/// The issuer and serial of a DER certificate (parsed by webpki, without verification).
pub fn cert_id(der: &[u8]) -> Result<CertId, X509Error> {
    let der = CertificateDer::from(der);
    let cert = EndEntityCert::try_from(&der).map_err(|e| malformed(&e))?;
    Ok(CertId {
        issuer: issuer_id(cert.issuer()),
        serial: serial_hex(cert.serial()),
    })
}

/// Result of a successful [`verify_chain`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedChain {
    /// The leaf's key; challenges must be signed with it.
    pub leaf_key: PublicKey,
    /// Leaf serial, lowercase hex without leading zeros (see [`serial_hex`]).
    pub serial_hex: String,
    /// Serials of the leaf and of every intermediate on the verified path,
    /// leaf first. The trust anchor is not included: it is trusted by
    /// configuration, not by a CRL.
    pub chain_serials: Vec<String>,
    /// Issuer and serial of the leaf and every intermediate on the path, leaf first.
    pub chain_ids: Vec<CertId>,
    /// DER of the intermediates on the verified path (CAs that may sign CRLs).
    pub intermediates: Vec<Vec<u8>>,
    pub not_after_unix: i64,
    /// The earliest notAfter of the presented certificates and of the path's anchor: past
    /// it, this verification no longer holds (a kept verification is dropped then).
    pub valid_until_unix: i64,
    pub subject_cn: Option<String>,
}

/// Canonical serial text: lowercase hex of the DER INTEGER content with
/// leading zeros removed ("0" for zero). Used for certificates and CRLs alike
/// so the two can be compared as strings.
pub fn serial_hex(raw: &[u8]) -> String {
    let hex = hex_lower(raw);
    let trimmed = hex.trim_start_matches('0');
    if trimmed.is_empty() {
        "0".to_string()
    } else {
        trimmed.to_string()
    }
}

/// A configured CA certificate, reduced to what our bookkeeping needs.
#[derive(Debug, Clone)]
pub(super) struct Anchor {
    pub(super) der: Vec<u8>,
    pub(super) subject_raw: Vec<u8>,
    pub(super) subject: String,
    pub(super) ski: Option<Vec<u8>>,
    pub(super) key: PublicKey,
    pub(super) not_before: i64,
    pub(super) not_after: i64,
    pub(super) path_len: Option<u32>,
    /// keyUsage absent or includes cRLSign.
    pub(super) crl_sign: bool,
    /// The same certificate as webpki's anchor.
    webpki: TrustAnchor<'static>,
}

impl Anchor {
    /// Parse a CA certificate: must be CA:TRUE, keyCertSign if keyUsage is
    /// present, with a supported key.
    pub(super) fn from_der(der: &[u8]) -> Result<Anchor, X509Error> {
        let cert = parse_cert(der)?;
        let (ca, path_len) = basic_constraints(&cert)?;
        if !ca {
            return Err(X509Error::NotCa(format!(
                "{} lacks basicConstraints CA:TRUE",
                cert.subject()
            )));
        }
        let ku = key_usage(&cert)?;
        if ku.is_some_and(|k| !k.key_cert_sign()) {
            return Err(X509Error::KeyUsage(format!(
                "{} lacks keyCertSign",
                cert.subject()
            )));
        }
        let webpki = webpki::anchor_from_trusted_cert(&CertificateDer::from(der))
            .map(|a| a.to_owned())
            .map_err(|e| malformed(&e))?;
        Ok(Anchor {
            webpki,
            der: der.to_vec(),
            subject_raw: cert.subject().as_raw().to_vec(),
            subject: cert.subject().to_string(),
            ski: subject_key_id(&cert).map(<[u8]>::to_vec),
            key: PublicKey::from_spki(cert.public_key())?,
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
            path_len,
            crl_sign: ku.is_none_or(|k| k.crl_sign()),
        })
    }

    /// Whether this CA could have issued an object with this issuer name and
    /// (optional) authority key identifier. Names and key ids only: no signature work.
    pub(super) fn may_have_issued(&self, issuer_raw: &[u8], aki: Option<&[u8]>) -> bool {
        self.subject_raw == issuer_raw && key_ids_match(aki, self.ski.as_deref())
    }
}

/// The fleet CAs whose robot certificates we accept.
#[derive(Debug, Clone, Default)]
pub struct TrustStore {
    anchors: Vec<Anchor>,
    /// The same anchors in webpki's form, index for index.
    webpki: Vec<TrustAnchor<'static>>,
}

impl TrustStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Load one or more PEM "CERTIFICATE" blocks; every one must be a CA.
    pub fn from_pem(bytes: &[u8]) -> Result<TrustStore, X509Error> {
        if bytes.len() > MAX_TRUST_PEM_BYTES {
            return Err(X509Error::Malformed("trust store file too large".into()));
        }
        let blocks = pem::parse_many(bytes)
            .map_err(|e| X509Error::Malformed(format!("invalid PEM: {e}")))?;
        if blocks.is_empty() {
            return Err(X509Error::Malformed(
                "no certificate in trust store PEM".into(),
            ));
        }
        let mut store = TrustStore::new();
        for block in &blocks {
            if block.tag() != "CERTIFICATE" {
                return Err(X509Error::Malformed(format!(
                    "unexpected PEM block {:?} in trust store",
                    block.tag()
                )));
            }
            store.add_der(block.contents())?;
        }
        Ok(store)
    }

    /// Add one DER CA certificate.
    pub fn add_der(&mut self, der: &[u8]) -> Result<(), X509Error> {
        self.push_anchor(Anchor::from_der(der)?);
        Ok(())
    }

    pub(super) fn push_anchor(&mut self, anchor: Anchor) {
        self.webpki.push(anchor.webpki.clone());
        self.anchors.push(anchor);
    }

    pub fn len(&self) -> usize {
        self.anchors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.anchors.is_empty()
    }

    /// Subject names of the anchors, for logs.
    pub fn subjects(&self) -> impl Iterator<Item = &str> {
        self.anchors.iter().map(|a| a.subject.as_str())
    }

    /// DER of every anchor (CAs that may sign CRLs).
    pub fn anchor_ders(&self) -> impl Iterator<Item = &[u8]> {
        self.anchors.iter().map(|a| a.der.as_slice())
    }

    pub(super) fn anchors(&self) -> &[Anchor] {
        &self.anchors
    }

    fn any_may_have_issued(&self, issuer_raw: &[u8], aki: Option<&[u8]>) -> bool {
        self.anchors
            .iter()
            .any(|a| a.may_have_issued(issuer_raw, aki))
    }
}

fn malformed(e: &webpki::Error) -> X509Error {
    X509Error::Malformed(format!("{e:?}"))
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use rcgen::{
        BasicConstraints, CustomExtension, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
        SanType, SerialNumber,
    };

    const ROBOT: &str = "robot-7";

    fn store_of(pems: &[&str]) -> TrustStore {
        TrustStore::from_pem(pems.concat().as_bytes()).expect("trust store")
    }

    fn reason(r: Result<VerifiedChain, X509Error>) -> &'static str {
        r.expect_err("chain must be refused").reason()
    }

    #[test]
    fn each_leaf_key_type_verifies_and_signs_challenges() {
        let root = TestCa::root("Fleet Root", p256());
        let store = store_of(&[&root.pem]);
        let leaf_keys = [
            (
                KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap(),
                "ed25519",
            ),
            (p256(), "ecdsa-p256"),
            (
                KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap(),
                "ecdsa-p384",
            ),
            (rsa_key(), "rsa"),
        ];
        for (key, kind) in leaf_keys {
            let chain = root.issue(&leaf_params(ROBOT), &key);
            let vc = verify_chain(&chain, &store, ROBOT, NOW).expect(kind);
            assert_eq!(vc.leaf_key.kind(), kind);
            assert_eq!(vc.subject_cn.as_deref(), Some(ROBOT));
            assert_eq!(vc.chain_serials, vec![vc.serial_hex.clone()]);
            assert_eq!(vc.not_after_unix, NOW + 86_400);
            // The verified key checks a challenge signed by the robot's key.
            let sig = sign_with(&key, b"challenge");
            vc.leaf_key.verify(b"challenge", &sig).expect("challenge");
            assert_eq!(
                vc.leaf_key.verify(b"other", &sig).unwrap_err().reason(),
                "bad_signature"
            );
        }
    }

    #[test]
    fn each_ca_signature_algorithm_verifies() {
        let cas = [
            KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap(),
            p256(),
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap(),
            rsa_key(),
            KeyPair::from_pkcs8_pem_and_sign_algo(RSA_2048_PKCS8_PEM, &rcgen::PKCS_RSA_SHA384)
                .unwrap(),
            KeyPair::from_pkcs8_pem_and_sign_algo(RSA_2048_PKCS8_PEM, &rcgen::PKCS_RSA_SHA512)
                .unwrap(),
        ];
        for key in cas {
            let alg = format!("{:?}", key.algorithm());
            let root = TestCa::root("Fleet Root", key);
            let store = store_of(&[&root.pem]);
            let chain = root.issue(&leaf_params(ROBOT), &p256());
            verify_chain(&chain, &store, ROBOT, NOW).expect(&alg);
        }
    }

    #[test]
    fn rsa_pss_signed_chain_verifies() {
        let store = store_of(&[PSS_CA_CERT_PEM]);
        let vc = verify_chain(PSS_LEAF_CERT_PEM, &store, "robot-pss", PSS_NOW).expect("pss");
        assert_eq!(vc.serial_hex, "2002");
        assert_eq!(vc.leaf_key.kind(), "ecdsa-p256");
        // Tampered leaf body: the PSS signature no longer verifies.
        let mut der = pem::parse(PSS_LEAF_CERT_PEM).unwrap().into_contents();
        let pos = der.windows(9).position(|w| w == b"robot-pss").unwrap();
        der[pos + 8] = b't';
        let tampered = pem::encode(&pem::Pem::new("CERTIFICATE", der));
        assert_eq!(
            reason(verify_chain(&tampered, &store, "robot-pst", PSS_NOW)),
            "bad_signature"
        );
        // Another CA of the same name: its key identifier does not match.
        let other = TestCa::root("PSS Test CA", p256());
        assert_eq!(
            reason(verify_chain(
                PSS_LEAF_CERT_PEM,
                &store_of(&[&other.pem]),
                "robot-pss",
                PSS_NOW
            )),
            "untrusted"
        );
    }

    #[test]
    fn leaf_and_intermediate_chain() {
        let root = TestCa::root("Fleet Root", p256());
        let inter = root.intermediate("Fleet Issuing", p256());
        let leaf_key = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let leaf = inter.issue(&leaf_params(ROBOT), &leaf_key);
        let store = store_of(&[&root.pem]);

        let chain = format!("{leaf}{}", inter.pem);
        let vc = verify_chain(&chain, &store, ROBOT, NOW).expect("chain");
        assert_eq!(vc.chain_serials.len(), 2);
        assert_eq!(vc.chain_serials[0], vc.serial_hex);

        // Root included at the end is tolerated (anchor found first).
        let with_root = format!("{chain}{}", root.pem);
        verify_chain(&with_root, &store, ROBOT, NOW).expect("chain with root");

        // The intermediate itself as anchor: leaf alone suffices.
        let inter_store = store_of(&[&inter.pem]);
        let vc = verify_chain(&leaf, &inter_store, ROBOT, NOW).expect("inter anchor");
        assert_eq!(vc.chain_serials.len(), 1);

        // Missing intermediate → untrusted.
        assert_eq!(reason(verify_chain(&leaf, &store, ROBOT, NOW)), "untrusted");
        // webpki builds the path from the presented intermediates in any order (as TLS
        // stacks do); the order used to matter with the hand-written verifier.
        let inter2 = inter.intermediate("Fleet Sub", p256());
        let leaf2 = inter2.issue(&leaf_params(ROBOT), &p256());
        let good = format!("{leaf2}{}{}", inter2.pem, inter.pem);
        let vc = verify_chain(&good, &store, ROBOT, NOW).expect("two intermediates");
        assert_eq!(vc.chain_ids.len(), 3);
        assert_eq!(vc.intermediates.len(), 2);
        let swapped = format!("{leaf2}{}{}", inter.pem, inter2.pem);
        verify_chain(&swapped, &store, ROBOT, NOW).expect("any order");
        // Without the middle CA there is no path.
        let gap = format!("{leaf2}{}", inter.pem);
        assert_eq!(reason(verify_chain(&gap, &store, ROBOT, NOW)), "untrusted");
    }

    /// A verification is kept no longer than the chain it verified: its end is the first
    /// notAfter among the presented certificates and the anchor that ended the path.
    #[test]
    fn a_verification_holds_until_the_first_certificate_on_its_path_expires() {
        let leaf_key = p256();
        let verified = |root: &TestCa, inter: &TestCa| {
            let leaf = inter.issue(&leaf_params(ROBOT), &leaf_key);
            let chain = format!("{leaf}{}", inter.pem);
            verify_chain(&chain, &store_of(&[&root.pem]), ROBOT, NOW).expect("chain")
        };

        let mut short = ca_params("Fleet Issuing");
        short.not_after = at(NOW + 500);
        let root = TestCa::root("Fleet Root", p256());
        let vc = verified(&root, &root.intermediate_with(short, p256()));
        assert_eq!(vc.not_after_unix, NOW + 86_400);
        assert_eq!(vc.valid_until_unix, NOW + 500);

        let mut brief = ca_params("Brief Root");
        brief.not_after = at(NOW + 300);
        let root = TestCa::root_with(brief, p256());
        let vc = verified(&root, &root.intermediate("Fleet Issuing", p256()));
        assert_eq!(vc.valid_until_unix, NOW + 300);
    }

    #[test]
    fn validity_is_exact_for_every_certificate() {
        let root = TestCa::root("Fleet Root", p256());
        let store = store_of(&[&root.pem]);
        let mut p = leaf_params(ROBOT);
        p.not_before = at(NOW - 100);
        p.not_after = at(NOW + 100);
        let chain = root.issue(&p, &p256());
        verify_chain(&chain, &store, ROBOT, NOW - 100).expect("at not_before");
        verify_chain(&chain, &store, ROBOT, NOW + 100).expect("at not_after");
        assert_eq!(
            reason(verify_chain(&chain, &store, ROBOT, NOW + 101)),
            "expired"
        );
        assert_eq!(
            reason(verify_chain(&chain, &store, ROBOT, NOW - 101)),
            "not_yet_valid"
        );

        // Expired intermediate.
        let mut ip = ca_params("Fleet Issuing");
        ip.not_after = at(NOW - 1);
        let inter = root.intermediate_with(ip, p256());
        let chain = format!("{}{}", inter.issue(&leaf_params(ROBOT), &p256()), inter.pem);
        let err = verify_chain(&chain, &store, ROBOT, NOW).unwrap_err();
        assert_eq!(err, X509Error::Expired("intermediate"));

        // Expired and not-yet-valid anchors.
        let mut rp = ca_params("Old Root");
        rp.not_after = at(NOW - 1);
        let old = TestCa::root_with(rp, p256());
        let chain = old.issue(&leaf_params(ROBOT), &p256());
        let err = verify_chain(&chain, &store_of(&[&old.pem]), ROBOT, NOW).unwrap_err();
        assert_eq!(err, X509Error::Expired("trust anchor"));
        let mut rp = ca_params("Future Root");
        rp.not_before = at(NOW + 1);
        let future = TestCa::root_with(rp, p256());
        let chain = future.issue(&leaf_params(ROBOT), &p256());
        let err = verify_chain(&chain, &store_of(&[&future.pem]), ROBOT, NOW).unwrap_err();
        assert_eq!(err.reason(), "not_yet_valid");
    }

    #[test]
    fn untrusted_issuer_and_self_signed_leaf() {
        let root = TestCa::root("Fleet Root", p256());
        let other = TestCa::root("Other Root", p256());
        let store = store_of(&[&root.pem]);
        let chain = other.issue(&leaf_params(ROBOT), &p256());
        assert_eq!(
            reason(verify_chain(&chain, &store, ROBOT, NOW)),
            "untrusted"
        );
        // Presenting the foreign root too does not help.
        let chain2 = format!("{chain}{}", other.pem);
        assert_eq!(
            reason(verify_chain(&chain2, &store, ROBOT, NOW)),
            "untrusted"
        );

        let key = p256();
        let self_signed = leaf_params(ROBOT).self_signed(&key).unwrap().pem();
        assert_eq!(
            reason(verify_chain(&self_signed, &store, ROBOT, NOW)),
            "untrusted"
        );
    }

    #[test]
    fn issuer_without_ca_flag_refused() {
        let root = TestCa::root("Fleet Root", p256());
        let store = store_of(&[&root.pem]);
        for is_ca in [IsCa::NoCa, IsCa::ExplicitNoCa] {
            let mut ip = ca_params("Not A CA");
            ip.is_ca = is_ca;
            let inter = root.intermediate_with(ip, p256());
            let chain = format!("{}{}", inter.issue(&leaf_params(ROBOT), &p256()), inter.pem);
            assert_eq!(reason(verify_chain(&chain, &store, ROBOT, NOW)), "not_ca");
        }
        // Nor can such a certificate be an anchor.
        let mut rp = ca_params("Not A CA Root");
        rp.is_ca = IsCa::ExplicitNoCa;
        let not_ca = TestCa::root_with(rp, p256());
        let err = TrustStore::from_pem(not_ca.pem.as_bytes()).unwrap_err();
        assert_eq!(err.reason(), "not_ca");
    }

    #[test]
    fn issuer_key_usage_and_path_len() {
        let root = TestCa::root("Fleet Root", p256());
        let store = store_of(&[&root.pem]);
        let mut ip = ca_params("No CertSign");
        ip.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let inter = root.intermediate_with(ip, p256());
        let chain = format!("{}{}", inter.issue(&leaf_params(ROBOT), &p256()), inter.pem);
        assert_eq!(
            reason(verify_chain(&chain, &store, ROBOT, NOW)),
            "key_usage"
        );

        // Anchor limited to pathLen 0 may not have intermediates.
        let mut rp = ca_params("Tight Root");
        rp.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        let tight = TestCa::root_with(rp, p256());
        let inter = tight.intermediate("Fleet Issuing", p256());
        let chain = format!("{}{}", inter.issue(&leaf_params(ROBOT), &p256()), inter.pem);
        let tight_store = store_of(&[&tight.pem]);
        assert_eq!(
            reason(verify_chain(&chain, &tight_store, ROBOT, NOW)),
            "chain_too_long"
        );
        // ... but can issue leaves directly.
        let direct = tight.issue(&leaf_params(ROBOT), &p256());
        verify_chain(&direct, &tight_store, ROBOT, NOW).expect("direct leaf");

        // Intermediate with pathLen 0 below which another CA sits.
        let mut ip = ca_params("Inter0");
        ip.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        let inter0 = root.intermediate_with(ip, p256());
        let sub = inter0.intermediate("Sub", p256());
        let chain = format!(
            "{}{}{}",
            sub.issue(&leaf_params(ROBOT), &p256()),
            sub.pem,
            inter0.pem
        );
        assert_eq!(
            reason(verify_chain(&chain, &store, ROBOT, NOW)),
            "chain_too_long"
        );
    }

    #[test]
    fn leaf_constraints() {
        let root = TestCa::root("Fleet Root", p256());
        let store = store_of(&[&root.pem]);

        let mut p = leaf_params(ROBOT);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let chain = root.issue(&p, &p256());
        assert_eq!(
            reason(verify_chain(&chain, &store, ROBOT, NOW)),
            "key_usage"
        );

        let mut p = leaf_params(ROBOT);
        p.key_usages = vec![KeyUsagePurpose::KeyEncipherment];
        let chain = root.issue(&p, &p256());
        assert_eq!(
            reason(verify_chain(&chain, &store, ROBOT, NOW)),
            "key_usage"
        );

        let mut p = leaf_params(ROBOT);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let chain = root.issue(&p, &p256());
        assert_eq!(
            reason(verify_chain(&chain, &store, ROBOT, NOW)),
            "key_usage"
        );

        // No keyUsage / EKU at all is acceptable.
        let mut p = leaf_params(ROBOT);
        p.key_usages.clear();
        p.extended_key_usages.clear();
        p.is_ca = IsCa::NoCa;
        let chain = root.issue(&p, &p256());
        verify_chain(&chain, &store, ROBOT, NOW).expect("bare leaf");

        // Unknown critical extension.
        let mut p = leaf_params(ROBOT);
        let mut ext = CustomExtension::from_oid_content(&[1, 3, 6, 1, 4, 1, 99999, 1], vec![5, 0]);
        ext.set_criticality(true);
        p.custom_extensions.push(ext);
        let chain = root.issue(&p, &p256());
        assert_eq!(
            reason(verify_chain(&chain, &store, ROBOT, NOW)),
            "untrusted"
        );
    }

    #[test]
    fn name_must_match_cn_or_san() {
        let root = TestCa::root("Fleet Root", p256());
        let store = store_of(&[&root.pem]);

        let chain = root.issue(&leaf_params("robot-8"), &p256());
        assert_eq!(
            reason(verify_chain(&chain, &store, ROBOT, NOW)),
            "name_mismatch"
        );
        assert_eq!(
            reason(verify_chain(&chain, &store, "", NOW)),
            "name_mismatch"
        );
        // Case and prefix differences are mismatches.
        assert_eq!(
            reason(verify_chain(&chain, &store, "Robot-8", NOW)),
            "name_mismatch"
        );
        assert_eq!(
            reason(verify_chain(&chain, &store, "robot-", NOW)),
            "name_mismatch"
        );

        // SAN dNSName naming the robot, CN something else.
        let mut p = leaf_params("device 1234");
        p.subject_alt_names = vec![SanType::DnsName(ROBOT.try_into().unwrap())];
        let chain = root.issue(&p, &p256());
        let vc = verify_chain(&chain, &store, ROBOT, NOW).expect("SAN DNS");
        assert_eq!(vc.subject_cn.as_deref(), Some("device 1234"));

        // SAN URI naming the robot.
        let uri = "urn:robot:7";
        let mut p = leaf_params("device 1234");
        p.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
        let chain = root.issue(&p, &p256());
        verify_chain(&chain, &store, uri, NOW).expect("SAN URI");

        // SAN naming someone else.
        let mut p = leaf_params("device 1234");
        p.subject_alt_names = vec![
            SanType::DnsName("robot-8".try_into().unwrap()),
            SanType::URI("urn:robot:8".try_into().unwrap()),
            SanType::Rfc822Name("robot-7@example.com".try_into().unwrap()),
        ];
        let chain = root.issue(&p, &p256());
        assert_eq!(
            reason(verify_chain(&chain, &store, ROBOT, NOW)),
            "name_mismatch"
        );
    }

    #[test]
    fn leaf_signed_by_another_key() {
        let root = TestCa::root("Fleet Root", p256());
        let store = store_of(&[&root.pem]);
        // Same issuer name, different key, no AKI to tell them apart.
        let mut impostor = ca_params("Fleet Root");
        impostor.use_authority_key_identifier_extension = false;
        let impostor = TestCa::root_with(impostor, p256());
        let mut p = leaf_params(ROBOT);
        p.use_authority_key_identifier_extension = false;
        let chain = impostor.issue(&p, &p256());
        assert_eq!(
            reason(verify_chain(&chain, &store, ROBOT, NOW)),
            "bad_signature"
        );

        // Tampered certificate body (change a byte of the leaf's TBS).
        let good = root.issue(&leaf_params(ROBOT), &p256());
        let mut der = pem::parse(&good).unwrap().into_contents();
        let pos = der
            .windows(ROBOT.len())
            .position(|w| w == ROBOT.as_bytes())
            .unwrap();
        der[pos + ROBOT.len() - 1] = b'8';
        let tampered = pem::encode(&pem::Pem::new("CERTIFICATE", der));
        assert_eq!(
            reason(verify_chain(&tampered, &store, "robot-8", NOW)),
            "bad_signature"
        );
    }

    #[test]
    fn cheap_checks_come_before_signature_work() {
        let root = TestCa::root("Fleet Root", p256());
        let store = store_of(&[&root.pem]);
        // A leaf whose signature is broken (one byte of its body changed)...
        let good = root.issue(&leaf_params(ROBOT), &p256());
        let mut der = pem::parse(&good).unwrap().into_contents();
        let pos = der
            .windows(ROBOT.len())
            .position(|w| w == ROBOT.as_bytes())
            .unwrap();
        der[pos + ROBOT.len() - 1] = b'8';
        let broken = pem::encode(&pem::Pem::new("CERTIFICATE", der));
        // ...presented for another robot is refused on the name, before any signature.
        assert_eq!(
            reason(verify_chain(&broken, &store, ROBOT, NOW)),
            "name_mismatch"
        );
        // ...and from an issuer no anchor is named like: untrusted, before any signature.
        let other = store_of(&[&TestCa::root("Other Root", p256()).pem]);
        assert_eq!(
            reason(verify_chain(&broken, &other, "robot-8", NOW)),
            "untrusted"
        );
        // Only a plausible chain reaches the signature check.
        assert_eq!(
            reason(verify_chain(&broken, &store, "robot-8", NOW)),
            "bad_signature"
        );
    }

    #[test]
    fn garbage_input_is_malformed() {
        let root = TestCa::root("Fleet Root", p256());
        let store = store_of(&[&root.pem]);
        let cases = [
            String::new(),
            "hello".to_string(),
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_string(),
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n".to_string(),
            p256().serialize_pem(),
            "x".repeat(MAX_CHAIN_PEM_BYTES + 1),
        ];
        for c in &cases {
            assert_eq!(
                reason(verify_chain(c, &store, ROBOT, NOW)),
                "malformed",
                "{c:.60}"
            );
        }
        // Truncated DER and trailing bytes.
        let good = root.issue(&leaf_params(ROBOT), &p256());
        let der = pem::parse(&good).unwrap().into_contents();
        let short = pem::encode(&pem::Pem::new(
            "CERTIFICATE",
            der[..der.len() - 10].to_vec(),
        ));
        assert_eq!(
            reason(verify_chain(&short, &store, ROBOT, NOW)),
            "malformed"
        );
        let mut long = der.clone();
        long.push(0);
        let long = pem::encode(&pem::Pem::new("CERTIFICATE", long));
        assert_eq!(reason(verify_chain(&long, &store, ROBOT, NOW)), "malformed");

        // Trust store inputs.
        for bad in [&b""[..], b"garbage", p256().serialize_pem().as_bytes()] {
            assert_eq!(TrustStore::from_pem(bad).unwrap_err().reason(), "malformed");
        }
    }

    #[test]
    fn chain_too_long() {
        let root = TestCa::root("Fleet Root", p256());
        let store = store_of(&[&root.pem]);
        let leaf = root.issue(&leaf_params(ROBOT), &p256());
        let chain = leaf.repeat(MAX_CHAIN_LEN + 1);
        assert_eq!(
            reason(verify_chain(&chain, &store, ROBOT, NOW)),
            "chain_too_long"
        );
        // Exactly at the limit is parsed (and here found valid: the extra
        // copies are unused).
        let chain = leaf.repeat(MAX_CHAIN_LEN);
        verify_chain(&chain, &store, ROBOT, NOW).expect("at limit");
    }

    #[test]
    fn trust_store_and_serial_format() {
        let a = TestCa::root("Root A", p256());
        let b = TestCa::root(
            "Root B",
            KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap(),
        );
        let store = store_of(&[&a.pem, "\n", &b.pem]);
        assert_eq!(store.len(), 2);
        assert!(!store.is_empty());
        assert!(TrustStore::new().is_empty());
        assert_eq!(
            store.subjects().collect::<Vec<_>>(),
            vec!["CN=Root A", "CN=Root B"]
        );

        let mut p = leaf_params(ROBOT);
        p.serial_number = Some(SerialNumber::from_slice(&[0x00, 0x0a, 0xbc]));
        let chain = b.issue(&p, &p256());
        let vc = verify_chain(&chain, &store, ROBOT, NOW).expect("chain");
        assert_eq!(vc.serial_hex, "abc");
        assert_eq!(serial_hex(&[0x00]), "0");
        assert_eq!(serial_hex(&[]), "0");
        assert_eq!(serial_hex(&[0x00, 0xff, 0x01]), "ff01");
        assert_eq!(X509Error::Revoked.reason(), "revoked");
    }
}
