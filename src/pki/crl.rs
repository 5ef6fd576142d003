//! Certificate revocation lists from fleet CAs or our own CA.

use std::borrow::Cow;

use x509_parser::oid_registry::{
    OID_X509_EXT_AUTHORITY_KEY_IDENTIFIER, OID_X509_EXT_CRL_NUMBER,
    OID_X509_EXT_DELTA_CRL_INDICATOR, OID_X509_EXT_INVALIDITY_DATE,
    OID_X509_EXT_ISSUER_DISTRIBUTION_POINT, OID_X509_EXT_REASON_CODE,
};

use super::ca::CertificateAuthority;
use super::x509::{self, Anchor, TrustStore, X509Error};

/// Large fleets produce big CRLs, but not this big.
const MAX_CRL_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CrlError {
    #[error("malformed CRL: {0}")]
    Malformed(String),
    #[error("CRL issuer is not a trusted CA")]
    Untrusted,
    #[error("CRL signature is invalid")]
    BadSignature,
    #[error("CRL issuer may not sign CRLs (keyUsage lacks cRLSign)")]
    KeyUsage,
    #[error("unsupported CRL algorithm: {0}")]
    UnsupportedAlgorithm(String),
    /// Delta CRLs, partitioned CRLs (issuing distribution point), indirect
    /// CRLs and unknown critical extensions: treating them as a complete
    /// list could silently drop revocations.
    #[error("unsupported CRL extension: {0}")]
    UnsupportedExtension(String),
}

impl CrlError {
    /// Stable machine-readable code.
    pub fn reason(&self) -> &'static str {
        match self {
            CrlError::Malformed(_) => "malformed",
            CrlError::Untrusted | CrlError::UnsupportedExtension(_) => "untrusted",
            CrlError::BadSignature => "bad_signature",
            CrlError::KeyUsage => "key_usage",
            CrlError::UnsupportedAlgorithm(_) => "unsupported_algorithm",
        }
    }
}

impl From<X509Error> for CrlError {
    fn from(e: X509Error) -> Self {
        match e {
            X509Error::Malformed(m) => CrlError::Malformed(m),
            X509Error::UnsupportedExtension(m) => CrlError::UnsupportedExtension(m),
            X509Error::UnsupportedAlgorithm(m) => CrlError::UnsupportedAlgorithm(m),
            X509Error::BadSignature => CrlError::BadSignature,
            X509Error::Untrusted => CrlError::Untrusted,
            other => CrlError::Malformed(other.to_string()),
        }
    }
}

/// A verified CRL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevocationList {
    /// Issuer DN, e.g. "CN=Fleet Root".
    pub issuer: String,
    /// Revoked serials, same format as [`super::VerifiedChain::serial_hex`].
    pub serials: Vec<String>,
    pub next_update_unix: Option<i64>,
}

impl RevocationList {
    pub fn contains(&self, serial_hex: &str) -> bool {
        self.serials.iter().any(|s| s == serial_hex)
    }
}

/// Parse a CRL (PEM "X509 CRL" or DER) and verify its signature against a
/// trust anchor in `store` or against `extra_issuer` (our CA), matched by
/// issuer DN and, when both sides have one, key identifier.
pub fn parse_crl(
    bytes: &[u8],
    store: &TrustStore,
    extra_issuer: Option<&CertificateAuthority>,
) -> Result<RevocationList, CrlError> {
    if bytes.len() > MAX_CRL_BYTES {
        return Err(CrlError::Malformed("CRL too large".into()));
    }
    let der: Cow<'_, [u8]> = if looks_like_pem(bytes) {
        let blocks =
            pem::parse_many(bytes).map_err(|e| CrlError::Malformed(format!("invalid PEM: {e}")))?;
        let [block] = blocks.as_slice() else {
            return Err(CrlError::Malformed("expected exactly one PEM block".into()));
        };
        if block.tag() != "X509 CRL" {
            return Err(CrlError::Malformed(format!(
                "expected X509 CRL, got {:?}",
                block.tag()
            )));
        }
        Cow::Owned(block.contents().to_vec())
    } else {
        Cow::Borrowed(bytes)
    };

    let (rest, crl) =
        x509_parser::parse_x509_crl(&der).map_err(|e| CrlError::Malformed(format!("CRL: {e}")))?;
    if !rest.is_empty() {
        return Err(CrlError::Malformed("trailing data after CRL".into()));
    }
    let tbs = &crl.tbs_cert_list;
    if tbs.signature != crl.signature_algorithm {
        return Err(CrlError::Malformed(
            "signature algorithm mismatch inside CRL".into(),
        ));
    }
    // Only CRL number and AKI are understood; delta-CRL indicator and
    // issuing distribution point are refused even though RFC 5280 marks
    // them critical, so a non-conforming issuer cannot sneak them past us.
    x509::check_extensions(
        tbs.extensions(),
        &[
            &OID_X509_EXT_CRL_NUMBER,
            &OID_X509_EXT_AUTHORITY_KEY_IDENTIFIER,
        ],
    )?;
    if let Some(ext) = tbs.extensions().iter().find(|e| {
        e.oid == OID_X509_EXT_DELTA_CRL_INDICATOR || e.oid == OID_X509_EXT_ISSUER_DISTRIBUTION_POINT
    }) {
        return Err(CrlError::UnsupportedExtension(ext.oid.to_id_string()));
    }
    // Per-entry: reason code and invalidity date only; certificateIssuer
    // (indirect CRL) is critical and therefore refused here.
    for entry in tbs.revoked_certificates.iter() {
        x509::check_extensions(
            entry.extensions(),
            &[&OID_X509_EXT_REASON_CODE, &OID_X509_EXT_INVALIDITY_DATE],
        )?;
    }

    let issuer_raw = tbs.issuer.as_raw();
    let aki = x509::authority_key_id(tbs.extensions());
    let ours = extra_issuer.map(CertificateAuthority::anchor);
    let candidates = store
        .candidates(issuer_raw, aki)
        .chain(ours.filter(|a| a.may_have_issued(issuer_raw, aki)));
    let issuer = find_signer(candidates, &crl)?;
    if !issuer.crl_sign {
        return Err(CrlError::KeyUsage);
    }

    Ok(RevocationList {
        issuer: tbs.issuer.to_string(),
        serials: tbs
            .revoked_certificates
            .iter()
            .map(|r| x509::serial_hex(r.raw_serial()))
            .collect(),
        next_update_unix: tbs.next_update.map(|t| t.timestamp()),
    })
}

fn find_signer<'s>(
    candidates: impl Iterator<Item = &'s Anchor>,
    crl: &x509_parser::revocation_list::CertificateRevocationList<'_>,
) -> Result<&'s Anchor, CrlError> {
    let mut bad_signature = false;
    for anchor in candidates {
        match x509::verify_signed_data(
            &anchor.key,
            &crl.signature_algorithm,
            crl.tbs_cert_list.as_ref(),
            &crl.signature_value,
        ) {
            Ok(()) => return Ok(anchor),
            Err(X509Error::BadSignature) => bad_signature = true,
            Err(e) => return Err(e.into()),
        }
    }
    Err(if bad_signature {
        CrlError::BadSignature
    } else {
        CrlError::Untrusted
    })
}

fn looks_like_pem(bytes: &[u8]) -> bool {
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    bytes[start..].starts_with(b"-----BEGIN")
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{generate_ca, CertificateAuthority};
    use super::*;
    use rcgen::{
        CertificateRevocationListParams, KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason,
        RevokedCertParams, SerialNumber,
    };

    fn crl_params(serials: &[&[u8]]) -> CertificateRevocationListParams {
        CertificateRevocationListParams {
            this_update: at(NOW - 60),
            next_update: at(NOW + 3600),
            crl_number: SerialNumber::from(7u64),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|s| RevokedCertParams {
                    serial_number: SerialNumber::from_slice(s),
                    revocation_time: at(NOW - 120),
                    reason_code: Some(RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        }
    }

    fn store_of(pem: &str) -> TrustStore {
        TrustStore::from_pem(pem.as_bytes()).expect("store")
    }

    #[test]
    fn crl_from_trust_anchor_pem_and_der() {
        let root = TestCa::root("Fleet Root", p256());
        let crl = crl_params(&[&[0x01, 0x02], &[0x00, 0xab, 0xcd], &[0x7f; 16]])
            .signed_by(&root.issuer())
            .expect("crl");
        let store = store_of(&root.pem);
        let expected = vec!["102".to_string(), "abcd".into(), "7f".repeat(16)];

        let list = parse_crl(crl.pem().unwrap().as_bytes(), &store, None).expect("pem");
        assert_eq!(list.issuer, "CN=Fleet Root");
        assert_eq!(list.serials, expected);
        assert_eq!(list.next_update_unix, Some(NOW + 3600));
        assert!(list.contains("abcd"));
        assert!(!list.contains("00abcd"));

        let list = parse_crl(crl.der(), &store, None).expect("der");
        assert_eq!(list.serials, expected);
    }

    #[test]
    fn crl_serials_match_issued_certificates() {
        let root = TestCa::root(
            "Fleet Root",
            KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap(),
        );
        let store = store_of(&root.pem);
        let chain = root.issue(&leaf_params("robot-7"), &p256());
        let vc = super::super::verify_chain(&chain, &store, "robot-7", NOW).expect("chain");
        let der = pem::parse(&chain).unwrap().into_contents();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let crl = crl_params(&[cert.raw_serial()])
            .signed_by(&root.issuer())
            .expect("crl");
        let list = parse_crl(crl.der(), &store, None).expect("crl");
        assert!(list.contains(&vc.serial_hex));
    }

    #[test]
    fn crl_from_our_ca() {
        let (cert, key) = generate_ca("Signalling CA", 1).expect("gen");
        let ca = CertificateAuthority::from_pem(&cert, &key).expect("ca");
        let key = KeyPair::from_pem(&key).unwrap();
        let issuer = rcgen::Issuer::from_ca_cert_pem(&cert, &key).expect("issuer");
        let crl = crl_params(&[&[0x42]]).signed_by(&issuer).expect("crl");

        let empty = TrustStore::new();
        let list = parse_crl(crl.der(), &empty, Some(&ca)).expect("ours");
        assert_eq!(list.serials, vec!["42"]);
        // Without our CA it is untrusted.
        let err = parse_crl(crl.der(), &empty, None).unwrap_err();
        assert_eq!(err.reason(), "untrusted");
    }

    #[test]
    fn crl_signed_by_untrusted_key_refused() {
        let root = TestCa::root("Fleet Root", p256());
        let store = store_of(&root.pem);

        // Different CA name altogether.
        let other = TestCa::root("Other Root", p256());
        let crl = crl_params(&[&[1]]).signed_by(&other.issuer()).unwrap();
        let err = parse_crl(crl.der(), &store, None).unwrap_err();
        assert_eq!(err, CrlError::Untrusted);
        assert_eq!(err.reason(), "untrusted");

        // Same name, different key, AKI matching nothing → untrusted.
        let impostor = TestCa::root("Fleet Root", p256());
        let crl = crl_params(&[&[1]]).signed_by(&impostor.issuer()).unwrap();
        let err = parse_crl(crl.der(), &store, None).unwrap_err();
        assert_eq!(err.reason(), "untrusted");

        // Same name, different key, no (empty) SKI on the anchor → the
        // signature check decides: bad signature.
        let mut p = ca_params("Fleet Root");
        p.key_identifier_method = KeyIdMethod::PreSpecified(Vec::new());
        let no_ski = TestCa::root_with(p, p256());
        let crl = crl_params(&[&[1]]).signed_by(&impostor.issuer()).unwrap();
        let err = parse_crl(crl.der(), &store_of(&no_ski.pem), None).unwrap_err();
        assert_eq!(err, CrlError::BadSignature);

        // Tampered CRL body.
        let good = crl_params(&[&[0x10]]).signed_by(&root.issuer()).unwrap();
        let mut der = good.der().to_vec();
        let pos = der
            .windows(3)
            .position(|w| w == [0x02, 0x01, 0x10])
            .expect("serial");
        der[pos + 2] = 0x11;
        let err = parse_crl(&der, &store, None).unwrap_err();
        assert_eq!(err, CrlError::BadSignature);
    }

    #[test]
    fn crl_issuer_without_crl_sign_refused() {
        let mut p = ca_params("Fleet Root");
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let root = TestCa::root_with(p.clone(), p256());
        let crl = crl_params(&[&[1]]).signed_by(&root.issuer()).unwrap();
        // Anchor certificate with the same key but no cRLSign.
        let mut p2 = p;
        p2.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let pem = p2.self_signed(&root.key).unwrap().pem();
        let err = parse_crl(crl.der(), &store_of(&pem), None).unwrap_err();
        assert_eq!(err.reason(), "key_usage");
    }

    #[test]
    fn garbage_crl_refused() {
        let root = TestCa::root("Fleet Root", p256());
        let store = store_of(&root.pem);
        for bad in [
            &b""[..],
            b"garbage",
            b"-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n",
            root.pem.as_bytes(),
        ] {
            assert_eq!(
                parse_crl(bad, &store, None).unwrap_err().reason(),
                "malformed"
            );
        }
        let crl = crl_params(&[&[1]]).signed_by(&root.issuer()).unwrap();
        let mut der = crl.der().to_vec();
        der.push(0);
        assert_eq!(
            parse_crl(&der, &store, None).unwrap_err().reason(),
            "malformed"
        );
    }
}
