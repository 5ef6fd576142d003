//! Fleet CA trust: certificate chain verification against configured anchors.
//!
//! Signatures are checked with ring through our own algorithm table rather
//! than x509-parser's, which also accepts SHA-1 and 1024-bit RSA.

use ring::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use x509_parser::asn1_rs::{BitString, Tag};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::{GeneralName, ParsedExtension, X509Extension};
use x509_parser::oid_registry::{
    Oid, OID_NIST_HASH_SHA256, OID_NIST_HASH_SHA384, OID_NIST_HASH_SHA512, OID_PKCS1_RSASSAPSS,
    OID_PKCS1_SHA256WITHRSA, OID_PKCS1_SHA384WITHRSA, OID_PKCS1_SHA512WITHRSA,
    OID_SIG_ECDSA_WITH_SHA256, OID_SIG_ECDSA_WITH_SHA384, OID_SIG_ED25519,
    OID_X509_EXT_AUTHORITY_KEY_IDENTIFIER, OID_X509_EXT_BASIC_CONSTRAINTS,
    OID_X509_EXT_EXTENDED_KEY_USAGE, OID_X509_EXT_KEY_USAGE, OID_X509_EXT_NAME_CONSTRAINTS,
    OID_X509_EXT_SUBJECT_ALT_NAME, OID_X509_EXT_SUBJECT_KEY_IDENTIFIER,
};
use x509_parser::signature_algorithm::RsaSsaPssParams;
use x509_parser::x509::{AlgorithmIdentifier, X509Name, X509Version};

use super::keys::{hex_lower, KeyError, PublicKey};

/// Most certificates accepted in one presented chain (leaf included).
pub const MAX_CHAIN_LEN: usize = 8;
/// A chain of 8 RSA-4096 certificates is ~20 KiB of PEM; this leaves room
/// while bounding parsing work on hostile input.
const MAX_CHAIN_PEM_BYTES: usize = 128 * 1024;
const MAX_TRUST_PEM_BYTES: usize = 4 * 1024 * 1024;
const OID_MGF1: &str = "1.2.840.113549.1.1.8";

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
    pub not_after_unix: i64,
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

/// A configured CA certificate, reduced to what verification needs.
#[derive(Debug, Clone)]
pub(super) struct Anchor {
    pub(super) subject_raw: Vec<u8>,
    pub(super) subject: String,
    pub(super) ski: Option<Vec<u8>>,
    pub(super) key: PublicKey,
    pub(super) not_before: i64,
    pub(super) not_after: i64,
    pub(super) path_len: Option<u32>,
    /// keyUsage absent or includes cRLSign.
    pub(super) crl_sign: bool,
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
        Ok(Anchor {
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
    /// (optional) authority key identifier.
    pub(super) fn may_have_issued(&self, issuer_raw: &[u8], aki: Option<&[u8]>) -> bool {
        self.subject_raw == issuer_raw && key_ids_match(aki, self.ski.as_deref())
    }
}

/// The fleet CAs whose robot certificates we accept.
#[derive(Debug, Clone, Default)]
pub struct TrustStore {
    anchors: Vec<Anchor>,
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
        self.anchors.push(Anchor::from_der(der)?);
        Ok(())
    }

    pub(super) fn push_anchor(&mut self, anchor: Anchor) {
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

    pub(super) fn candidates<'s>(
        &'s self,
        issuer_raw: &'s [u8],
        aki: Option<&'s [u8]>,
    ) -> impl Iterator<Item = &'s Anchor> + 's {
        self.anchors
            .iter()
            .filter(move |a| a.may_have_issued(issuer_raw, aki))
    }
}

/// Verify a robot's certificate chain (PEM, leaf first, then intermediates)
/// against `store` at time `now_unix`, and check it names `robot_id`.
///
/// Revocation is not checked here: compare [`VerifiedChain::chain_serials`]
/// with loaded CRLs and report [`X509Error::Revoked`].
pub fn verify_chain(
    chain_pem: &str,
    store: &TrustStore,
    robot_id: &str,
    now_unix: i64,
) -> Result<VerifiedChain, X509Error> {
    if chain_pem.len() > MAX_CHAIN_PEM_BYTES {
        return Err(X509Error::Malformed("certificate chain too large".into()));
    }
    let blocks = pem::parse_many(chain_pem)
        .map_err(|e| X509Error::Malformed(format!("invalid PEM: {e}")))?;
    if blocks.is_empty() {
        return Err(X509Error::Malformed("no certificate in chain".into()));
    }
    if blocks.len() > MAX_CHAIN_LEN {
        return Err(X509Error::ChainTooLong(format!(
            "{} certificates (max {MAX_CHAIN_LEN})",
            blocks.len()
        )));
    }
    if let Some(b) = blocks.iter().find(|b| b.tag() != "CERTIFICATE") {
        return Err(X509Error::Malformed(format!(
            "unexpected PEM block {:?} in chain",
            b.tag()
        )));
    }
    let certs = blocks
        .iter()
        .map(|b| parse_cert(b.contents()))
        .collect::<Result<Vec<_>, _>>()?;
    let leaf = certs
        .first()
        .ok_or_else(|| X509Error::Malformed("no certificate in chain".into()))?;

    let (path, anchor) = build_path(&certs, store)?;

    // Validity of every certificate used, exactly as stated (no skew).
    check_validity(leaf, now_unix, "leaf")?;
    for cert in path.iter().skip(1) {
        check_validity(cert, now_unix, "intermediate")?;
    }
    if now_unix < anchor.not_before {
        return Err(X509Error::NotYetValid("trust anchor"));
    }
    if now_unix > anchor.not_after {
        return Err(X509Error::Expired("trust anchor"));
    }

    // Issuer constraints. path[i] (i ≥ 1) has i-1 intermediates below it.
    let intermediates = path.len().saturating_sub(1);
    for (i, cert) in path.iter().enumerate().skip(1) {
        let (ca, path_len) = basic_constraints(cert)?;
        if !ca {
            return Err(X509Error::NotCa(format!(
                "{} lacks basicConstraints CA:TRUE",
                cert.subject()
            )));
        }
        if path_len.is_some_and(|n| (n as usize) < i.saturating_sub(1)) {
            return Err(X509Error::ChainTooLong(format!(
                "pathLenConstraint of {} exceeded",
                cert.subject()
            )));
        }
        if key_usage(cert)?.is_some_and(|k| !k.key_cert_sign()) {
            return Err(X509Error::KeyUsage(format!(
                "{} lacks keyCertSign",
                cert.subject()
            )));
        }
    }
    if anchor
        .path_len
        .is_some_and(|n| (n as usize) < intermediates)
    {
        return Err(X509Error::ChainTooLong(format!(
            "pathLenConstraint of {} exceeded",
            anchor.subject
        )));
    }

    // Leaf constraints.
    let (leaf_ca, _) = basic_constraints(leaf)?;
    if leaf_ca {
        return Err(X509Error::KeyUsage("leaf certificate is a CA".into()));
    }
    if key_usage(leaf)?.is_some_and(|k| !k.digital_signature()) {
        return Err(X509Error::KeyUsage("leaf lacks digitalSignature".into()));
    }
    // Robots authenticate as clients; a certificate restricted to other
    // purposes (e.g. serverAuth only) must not be usable for that.
    let eku = leaf
        .extended_key_usage()
        .map_err(|e| X509Error::Malformed(format!("extendedKeyUsage: {e}")))?;
    if eku.is_some_and(|e| !e.value.client_auth && !e.value.any) {
        return Err(X509Error::KeyUsage(
            "leaf extendedKeyUsage lacks clientAuth".into(),
        ));
    }

    if !names_robot(leaf, robot_id)? {
        return Err(X509Error::NameMismatch);
    }

    let leaf_key = PublicKey::from_spki(leaf.public_key())?;
    Ok(VerifiedChain {
        leaf_key,
        serial_hex: serial_hex(leaf.raw_serial()),
        chain_serials: path.iter().map(|c| serial_hex(c.raw_serial())).collect(),
        not_after_unix: leaf.validity().not_after.timestamp(),
        subject_cn: single_common_name(leaf.subject()).map(str::to_string),
    })
}

/// Walk from the leaf towards an anchor, checking each signature. At every
/// step an anchor that issued the current certificate ends the walk;
/// otherwise the next presented certificate must be its issuer.
fn build_path<'c, 'a>(
    certs: &'c [X509Certificate<'a>],
    store: &'c TrustStore,
) -> Result<(Vec<&'c X509Certificate<'a>>, &'c Anchor), X509Error> {
    let mut path: Vec<&X509Certificate<'a>> = Vec::with_capacity(certs.len());
    let mut current = certs
        .first()
        .ok_or_else(|| X509Error::Malformed("no certificate in chain".into()))?;
    // A name-matching issuer whose signature did not verify: report that
    // rather than "untrusted" if no other path is found.
    let mut bad_signature = false;
    loop {
        path.push(current);
        let issuer_raw = current.issuer().as_raw();
        let aki = authority_key_id(current.extensions());
        for anchor in store.candidates(issuer_raw, aki) {
            match verify_cert_signature(&anchor.key, current) {
                Ok(()) => return Ok((path, anchor)),
                Err(X509Error::BadSignature) => bad_signature = true,
                Err(e) => return Err(e),
            }
        }
        let Some(next) = certs.get(path.len()) else {
            break;
        };
        if next.subject().as_raw() != issuer_raw || !key_ids_match(aki, subject_key_id(next)) {
            break;
        }
        let next_key = PublicKey::from_spki(next.public_key())?;
        verify_cert_signature(&next_key, current)?;
        current = next;
    }
    Err(if bad_signature {
        X509Error::BadSignature
    } else {
        X509Error::Untrusted
    })
}

fn verify_cert_signature(
    issuer_key: &PublicKey,
    cert: &X509Certificate<'_>,
) -> Result<(), X509Error> {
    verify_signed_data(
        issuer_key,
        &cert.signature_algorithm,
        cert.tbs_certificate.as_ref(),
        &cert.signature_value,
    )
}

/// Verify an X.509-style signature (certificate, CRL or CSR) made by
/// `signer` over `data`.
pub(super) fn verify_signed_data(
    signer: &PublicKey,
    alg: &AlgorithmIdentifier<'_>,
    data: &[u8],
    sig: &BitString<'_>,
) -> Result<(), X509Error> {
    if sig.unused_bits != 0 {
        return Err(X509Error::Malformed(
            "signature bit string not byte aligned".into(),
        ));
    }
    let ring_alg = ring_algorithm(signer, alg)?;
    UnparsedPublicKey::new(ring_alg, signer.bytes())
        .verify(data, &sig.data)
        .map_err(|_| X509Error::BadSignature)
}

#[derive(Clone, Copy)]
enum SigFamily {
    Ed25519,
    EcdsaSha256,
    EcdsaSha384,
    RsaPkcs1(&'static dyn VerificationAlgorithm),
    RsaPss(&'static dyn VerificationAlgorithm),
}

/// Map a signature AlgorithmIdentifier plus the signer's key to a ring
/// algorithm. Unknown algorithms are unsupported; a known algorithm that
/// does not fit the signer's key type cannot have produced a valid
/// signature, so that is a bad signature.
fn ring_algorithm(
    signer: &PublicKey,
    alg: &AlgorithmIdentifier<'_>,
) -> Result<&'static dyn VerificationAlgorithm, X509Error> {
    let oid = &alg.algorithm;
    let params = alg.parameters.as_ref();
    let null_or_absent = params.is_none_or(|p| p.tag() == Tag::Null && p.data.is_empty());
    let family = if *oid == OID_SIG_ED25519 {
        SigFamily::Ed25519
    } else if *oid == OID_SIG_ECDSA_WITH_SHA256 {
        SigFamily::EcdsaSha256
    } else if *oid == OID_SIG_ECDSA_WITH_SHA384 {
        SigFamily::EcdsaSha384
    } else if *oid == OID_PKCS1_SHA256WITHRSA {
        SigFamily::RsaPkcs1(&signature::RSA_PKCS1_2048_8192_SHA256)
    } else if *oid == OID_PKCS1_SHA384WITHRSA {
        SigFamily::RsaPkcs1(&signature::RSA_PKCS1_2048_8192_SHA384)
    } else if *oid == OID_PKCS1_SHA512WITHRSA {
        SigFamily::RsaPkcs1(&signature::RSA_PKCS1_2048_8192_SHA512)
    } else if *oid == OID_PKCS1_RSASSAPSS {
        SigFamily::RsaPss(pss_algorithm(alg)?)
    } else {
        return Err(X509Error::UnsupportedAlgorithm(format!(
            "signature algorithm {oid}"
        )));
    };
    match family {
        // RFC 8410 / RFC 5758: parameters MUST be absent.
        SigFamily::Ed25519 | SigFamily::EcdsaSha256 | SigFamily::EcdsaSha384
            if params.is_some() =>
        {
            Err(X509Error::Malformed(
                "unexpected signature algorithm parameters".into(),
            ))
        }
        SigFamily::RsaPkcs1(_) if !null_or_absent => Err(X509Error::Malformed(
            "unexpected signature algorithm parameters".into(),
        )),
        SigFamily::Ed25519 => match signer {
            PublicKey::Ed25519(_) => Ok(&signature::ED25519),
            _ => Err(X509Error::BadSignature),
        },
        SigFamily::EcdsaSha256 => match signer {
            PublicKey::EcdsaP256(_) => Ok(&signature::ECDSA_P256_SHA256_ASN1),
            PublicKey::EcdsaP384(_) => Ok(&signature::ECDSA_P384_SHA256_ASN1),
            _ => Err(X509Error::BadSignature),
        },
        SigFamily::EcdsaSha384 => match signer {
            PublicKey::EcdsaP256(_) => Ok(&signature::ECDSA_P256_SHA384_ASN1),
            PublicKey::EcdsaP384(_) => Ok(&signature::ECDSA_P384_SHA384_ASN1),
            _ => Err(X509Error::BadSignature),
        },
        SigFamily::RsaPkcs1(a) | SigFamily::RsaPss(a) => match signer {
            PublicKey::Rsa(_) => Ok(a),
            _ => Err(X509Error::BadSignature),
        },
    }
}

/// RSASSA-PSS parameters ring can verify: SHA-256/384/512, MGF1 with the
/// same hash, salt length equal to the hash length, trailer field 1.
fn pss_algorithm(
    alg: &AlgorithmIdentifier<'_>,
) -> Result<&'static dyn VerificationAlgorithm, X509Error> {
    let params = alg
        .parameters
        .as_ref()
        .ok_or_else(|| X509Error::Malformed("RSASSA-PSS without parameters".into()))?;
    let params = RsaSsaPssParams::try_from(params)
        .map_err(|_| X509Error::Malformed("invalid RSASSA-PSS parameters".into()))?;
    let hash = params.hash_algorithm_oid();
    let (ring_alg, hash_len): (&'static dyn VerificationAlgorithm, u32) =
        if *hash == OID_NIST_HASH_SHA256 {
            (&signature::RSA_PSS_2048_8192_SHA256, 32)
        } else if *hash == OID_NIST_HASH_SHA384 {
            (&signature::RSA_PSS_2048_8192_SHA384, 48)
        } else if *hash == OID_NIST_HASH_SHA512 {
            (&signature::RSA_PSS_2048_8192_SHA512, 64)
        } else {
            return Err(X509Error::UnsupportedAlgorithm(format!(
                "RSASSA-PSS with hash {hash}"
            )));
        };
    let mgf = params
        .mask_gen_algorithm()
        .map_err(|_| X509Error::Malformed("invalid RSASSA-PSS mask generation".into()))?;
    if mgf.mgf.to_id_string() != OID_MGF1 || mgf.hash != *hash {
        return Err(X509Error::UnsupportedAlgorithm(
            "RSASSA-PSS mask generation must be MGF1 with the message hash".into(),
        ));
    }
    if params.salt_length() != hash_len || params.trailer_field() != 1 {
        return Err(X509Error::UnsupportedAlgorithm(
            "RSASSA-PSS salt length must equal the hash length".into(),
        ));
    }
    Ok(ring_alg)
}

/// Parse one DER certificate and check structure we rely on later.
fn parse_cert(der: &[u8]) -> Result<X509Certificate<'_>, X509Error> {
    let (rest, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| X509Error::Malformed(format!("certificate: {e}")))?;
    if !rest.is_empty() {
        return Err(X509Error::Malformed(
            "trailing data after certificate".into(),
        ));
    }
    // RFC 5280 4.1.1.2: the signed and unsigned algorithm fields must agree,
    // otherwise an attacker could steer which algorithm we check.
    if cert.tbs_certificate.signature != cert.signature_algorithm {
        return Err(X509Error::Malformed(
            "signature algorithm mismatch inside certificate".into(),
        ));
    }
    if !cert.extensions().is_empty() && cert.version() != X509Version::V3 {
        return Err(X509Error::Malformed(
            "extensions in a non-v3 certificate".into(),
        ));
    }
    check_extensions(
        cert.extensions(),
        &[
            &OID_X509_EXT_BASIC_CONSTRAINTS,
            &OID_X509_EXT_KEY_USAGE,
            &OID_X509_EXT_EXTENDED_KEY_USAGE,
            &OID_X509_EXT_SUBJECT_ALT_NAME,
            &OID_X509_EXT_SUBJECT_KEY_IDENTIFIER,
            &OID_X509_EXT_AUTHORITY_KEY_IDENTIFIER,
        ],
    )?;
    // Name constraints would restrict what an issuer may certify; we do not
    // enforce them, so refuse rather than silently ignore (even if marked
    // non-critical).
    if cert
        .extensions()
        .iter()
        .any(|e| e.oid == OID_X509_EXT_NAME_CONSTRAINTS)
    {
        return Err(X509Error::UnsupportedExtension("nameConstraints".into()));
    }
    Ok(cert)
}

/// Refuse duplicate or unparsable extensions, and critical extensions not
/// in `handled` (RFC 5280 4.2).
pub(super) fn check_extensions(
    exts: &[X509Extension<'_>],
    handled: &[&Oid<'static>],
) -> Result<(), X509Error> {
    for (i, ext) in exts.iter().enumerate() {
        if exts[..i].iter().any(|e| e.oid == ext.oid) {
            return Err(X509Error::Malformed(format!(
                "duplicate extension {}",
                ext.oid
            )));
        }
        if let ParsedExtension::ParseError { .. } = ext.parsed_extension() {
            return Err(X509Error::Malformed(format!(
                "invalid extension {}",
                ext.oid
            )));
        }
        if ext.critical && !handled.iter().any(|h| **h == ext.oid) {
            return Err(X509Error::UnsupportedExtension(format!(
                "critical extension {}",
                ext.oid
            )));
        }
    }
    Ok(())
}

/// (CA flag, pathLenConstraint); absent extension means not a CA.
fn basic_constraints(cert: &X509Certificate<'_>) -> Result<(bool, Option<u32>), X509Error> {
    let bc = cert
        .basic_constraints()
        .map_err(|e| X509Error::Malformed(format!("basicConstraints: {e}")))?;
    Ok(bc.map_or((false, None), |b| (b.value.ca, b.value.path_len_constraint)))
}

fn key_usage(
    cert: &X509Certificate<'_>,
) -> Result<Option<x509_parser::extensions::KeyUsage>, X509Error> {
    let ku = cert
        .key_usage()
        .map_err(|e| X509Error::Malformed(format!("keyUsage: {e}")))?;
    Ok(ku.map(|k| *k.value))
}

fn check_validity(
    cert: &X509Certificate<'_>,
    now: i64,
    what: &'static str,
) -> Result<(), X509Error> {
    let validity = cert.validity();
    if now < validity.not_before.timestamp() {
        return Err(X509Error::NotYetValid(what));
    }
    if now > validity.not_after.timestamp() {
        return Err(X509Error::Expired(what));
    }
    Ok(())
}

/// Empty key identifiers carry no information and are treated as absent.
pub(super) fn authority_key_id<'a>(exts: &'a [X509Extension<'_>]) -> Option<&'a [u8]> {
    exts.iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                aki.key_identifier.as_ref().map(|k| k.0)
            }
            _ => None,
        })
        .filter(|k| !k.is_empty())
}

fn subject_key_id<'a>(cert: &'a X509Certificate<'_>) -> Option<&'a [u8]> {
    cert.extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0),
            _ => None,
        })
        .filter(|k| !k.is_empty())
}

/// Key identifiers only disambiguate; when either side lacks one, the
/// signature check decides.
fn key_ids_match(aki: Option<&[u8]>, ski: Option<&[u8]>) -> bool {
    match (aki, ski) {
        (Some(a), Some(s)) => a == s,
        _ => true,
    }
}

/// The subject CN if there is exactly one and it is a text string; several
/// CNs are ambiguous and are not used for naming.
pub(super) fn single_common_name<'a>(name: &'a X509Name<'_>) -> Option<&'a str> {
    let mut cns = name.iter_common_name();
    let first = cns.next()?;
    if cns.next().is_some() {
        return None;
    }
    first.as_str().ok()
}

/// Exact match of `robot_id` against the subject CN or a SAN dNSName/URI.
pub(super) fn general_names_match(names: &[GeneralName<'_>], robot_id: &str) -> bool {
    names.iter().any(|n| match n {
        GeneralName::DNSName(s) | GeneralName::URI(s) => *s == robot_id,
        _ => false,
    })
}

fn names_robot(leaf: &X509Certificate<'_>, robot_id: &str) -> Result<bool, X509Error> {
    if robot_id.is_empty() {
        return Ok(false);
    }
    if single_common_name(leaf.subject()) == Some(robot_id) {
        return Ok(true);
    }
    let san = leaf
        .subject_alternative_name()
        .map_err(|e| X509Error::Malformed(format!("subjectAltName: {e}")))?;
    Ok(san.is_some_and(|s| general_names_match(&s.value.general_names, robot_id)))
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
        // Intermediates in the wrong order → untrusted.
        let inter2 = inter.intermediate("Fleet Sub", p256());
        let leaf2 = inter2.issue(&leaf_params(ROBOT), &p256());
        let good = format!("{leaf2}{}{}", inter2.pem, inter.pem);
        verify_chain(&good, &store, ROBOT, NOW).expect("two intermediates");
        let swapped = format!("{leaf2}{}{}", inter.pem, inter2.pem);
        assert_eq!(
            reason(verify_chain(&swapped, &store, ROBOT, NOW)),
            "untrusted"
        );
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
