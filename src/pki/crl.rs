//! Certificate revocation lists from fleet CAs (roots or intermediates) or our own CA.
//!
//! webpki parses each CRL (refusing delta CRLs, indirect CRLs, unknown critical
//! extensions) and, at login, matches path certificates by issuer and serial. What it does
//! not offer is checking a CRL on its own when the file is loaded, before any robot shows
//! up: that is done here, with webpki's signature algorithms, against the CA the CRL names
//! as issuer (a trust anchor, our CA, or an intermediate certificate shipped in the same
//! file and itself chained to an anchor).

use std::borrow::Cow;
use std::sync::Arc;

use webpki::{CertRevocationList, OwnedCertRevocationList};

use super::ca::CertificateAuthority;
use super::x509::{self, Anchor, TrustStore, X509Error};

/// Large fleets produce big CRLs, but not this big.
const MAX_CRL_BYTES: usize = 16 * 1024 * 1024;
/// Intermediates shipped with CRLs: a handful is plenty.
const MAX_CRL_FILE_CERTS: usize = 16;

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
    /// Delta CRLs, partitioned CRLs, indirect CRLs and unknown critical extensions:
    /// treating them as a complete list could silently drop revocations.
    #[error("unsupported CRL extension: {0}")]
    UnsupportedExtension(String),
    /// thisUpdate lies in the future: a clock problem or a forged date; not applied.
    #[error("CRL is not valid yet (thisUpdate in the future)")]
    NotYetValid,
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
            CrlError::NotYetValid => "not_yet_valid",
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

fn from_webpki(e: webpki::Error) -> CrlError {
    use webpki::Error as W;
    match e {
        W::UnsupportedDeltaCrl
        | W::UnsupportedIndirectCrl
        | W::UnsupportedCrlIssuingDistributionPoint
        | W::UnsupportedRevocationReasonsPartitioning
        | W::UnsupportedCriticalExtension => CrlError::UnsupportedExtension(format!("{e:?}")),
        other => CrlError::Malformed(format!("{other:?}")),
    }
}

/// A verified CRL.
#[derive(Debug, Clone)]
pub struct RevocationList {
    /// Issuer DN, e.g. "CN=Fleet Root".
    pub issuer: String,
    /// [`x509::issuer_id`] of the issuer: with a serial, names a revoked certificate.
    pub issuer_id: String,
    /// Revoked serials, same format as [`super::VerifiedChain::serial_hex`].
    pub serials: Vec<String>,
    pub this_update_unix: i64,
    /// webpki requires nextUpdate, so every loaded CRL has one.
    pub next_update_unix: i64,
    /// The parsed CRL, handed to webpki at login.
    webpki: Arc<CertRevocationList<'static>>,
}

impl RevocationList {
    pub fn contains(&self, serial_hex: &str) -> bool {
        self.serials.iter().any(|s| s == serial_hex)
    }

    /// Past nextUpdate: the issuer should have published a newer list by now.
    pub fn is_stale(&self, now_unix: i64) -> bool {
        now_unix > self.next_update_unix
    }

    pub fn webpki(&self) -> &CertRevocationList<'static> {
        &self.webpki
    }

    /// Revocation entries `(issuer, serial)` this list stands for.
    pub fn ids(&self) -> impl Iterator<Item = x509::CertId> + '_ {
        self.serials.iter().map(|s| x509::CertId {
            issuer: self.issuer_id.clone(),
            serial: s.clone(),
        })
    }
}

/// Load a CRL file: one DER CRL, or PEM holding one or more "X509 CRL" blocks and,
/// optionally, the intermediate CA certificates that signed some of them. Each CRL must be
/// signed by a trust anchor in `store`, by `extra_issuer` (our CA) or by one of those
/// intermediates, which must chain to them; thisUpdate must not be in the future.
pub fn load_crls(
    bytes: &[u8],
    store: &TrustStore,
    extra_issuer: Option<&CertificateAuthority>,
    now_unix: i64,
) -> Result<Vec<RevocationList>, CrlError> {
    if bytes.len() > MAX_CRL_BYTES {
        return Err(CrlError::Malformed("CRL too large".into()));
    }
    let mut crls: Vec<Cow<'_, [u8]>> = Vec::new();
    let mut certs: Vec<Vec<u8>> = Vec::new();
    if looks_like_pem(bytes) {
        let blocks =
            pem::parse_many(bytes).map_err(|e| CrlError::Malformed(format!("invalid PEM: {e}")))?;
        for block in blocks {
            match block.tag() {
                "X509 CRL" => crls.push(Cow::Owned(block.into_contents())),
                "CERTIFICATE" => certs.push(block.into_contents()),
                other => {
                    return Err(CrlError::Malformed(format!(
                        "expected X509 CRL or CERTIFICATE, got {other:?}"
                    )))
                }
            }
        }
    } else {
        crls.push(Cow::Borrowed(bytes));
    }
    if crls.is_empty() {
        return Err(CrlError::Malformed("no CRL in the file".into()));
    }
    if certs.len() > MAX_CRL_FILE_CERTS {
        return Err(CrlError::Malformed(
            "too many certificates in the CRL file".into(),
        ));
    }

    let mut signers: Vec<Anchor> = store.anchors().to_vec();
    if let Some(ca) = extra_issuer {
        signers.push(ca.anchor().clone());
    }
    admit_intermediates(&mut signers, certs, now_unix)?;
    crls.iter()
        .map(|der| verify_one(der, &signers, now_unix))
        .collect()
}

/// Adds the file's intermediate CA certificates to `signers`, each only once it is signed
/// by a CA already there (in any order), is a CA allowed to sign certificates, and is
/// valid now. One that never chains is an error: the operator shipped something we cannot
/// trust, and silently skipping it would skip the CRLs it signed.
fn admit_intermediates(
    signers: &mut Vec<Anchor>,
    mut pending: Vec<Vec<u8>>,
    now_unix: i64,
) -> Result<(), CrlError> {
    while !pending.is_empty() {
        let before = pending.len();
        let mut still = Vec::new();
        for der in pending {
            let cert = x509::parse_cert(&der)?;
            let aki = x509::authority_key_id(cert.extensions());
            let issuer = cert.issuer().as_raw();
            let signed = signers
                .iter()
                .filter(|s| s.may_have_issued(issuer, aki))
                .any(|s| {
                    x509::parse_cert(&s.der).is_ok_and(|signer| {
                        x509::verify_signed_data(
                            signer.public_key(),
                            &cert.signature_algorithm,
                            cert.tbs_certificate.as_ref(),
                            &cert.signature_value,
                        )
                        .is_ok()
                    })
                });
            if !signed {
                still.push(der);
                continue;
            }
            let v = cert.validity();
            if now_unix < v.not_before.timestamp() || now_unix > v.not_after.timestamp() {
                return Err(CrlError::Malformed(format!(
                    "intermediate {} in the CRL file is outside its validity",
                    cert.subject()
                )));
            }
            drop(cert);
            signers.push(Anchor::from_der(&der)?);
        }
        if still.len() == before {
            return Err(CrlError::Untrusted);
        }
        pending = still;
    }
    Ok(())
}

fn verify_one(der: &[u8], signers: &[Anchor], now_unix: i64) -> Result<RevocationList, CrlError> {
    // webpki first: it refuses the forms we must not treat as a complete list.
    let owned = OwnedCertRevocationList::from_der(der).map_err(from_webpki)?;
    let (rest, crl) =
        x509_parser::parse_x509_crl(der).map_err(|e| CrlError::Malformed(format!("CRL: {e}")))?;
    if !rest.is_empty() {
        return Err(CrlError::Malformed("trailing data after CRL".into()));
    }
    let tbs = &crl.tbs_cert_list;
    if tbs.signature != crl.signature_algorithm {
        return Err(CrlError::Malformed(
            "signature algorithm mismatch inside CRL".into(),
        ));
    }
    let issuer_raw = tbs.issuer.as_raw();
    let aki = x509::authority_key_id(tbs.extensions());
    let mut bad_signature = false;
    let mut signer = None;
    for candidate in signers
        .iter()
        .filter(|s| s.may_have_issued(issuer_raw, aki))
    {
        let cert = x509::parse_cert(&candidate.der)?;
        match x509::verify_signed_data(
            cert.public_key(),
            &crl.signature_algorithm,
            tbs.as_ref(),
            &crl.signature_value,
        ) {
            Ok(()) => {
                signer = Some(candidate);
                break;
            }
            Err(X509Error::BadSignature) => bad_signature = true,
            Err(e) => return Err(e.into()),
        }
    }
    let Some(signer) = signer else {
        return Err(if bad_signature {
            CrlError::BadSignature
        } else {
            CrlError::Untrusted
        });
    };
    if !signer.crl_sign {
        return Err(CrlError::KeyUsage);
    }
    let this_update = tbs.this_update.timestamp();
    if this_update > now_unix {
        return Err(CrlError::NotYetValid);
    }
    let next_update = tbs
        .next_update
        .map(|t| t.timestamp())
        .ok_or_else(|| CrlError::Malformed("CRL without nextUpdate".into()))?;
    let webpki = CertRevocationList::from(owned);
    Ok(RevocationList {
        issuer: tbs.issuer.to_string(),
        issuer_id: x509::issuer_id(webpki.issuer()),
        serials: tbs
            .revoked_certificates
            .iter()
            .map(|r| x509::serial_hex(r.raw_serial()))
            .collect(),
        this_update_unix: this_update,
        next_update_unix: next_update,
        webpki: Arc::new(webpki),
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

    /// One CRL, checked at the fixed test time.
    fn parse_crl(
        bytes: &[u8],
        store: &TrustStore,
        ours: Option<&CertificateAuthority>,
    ) -> Result<RevocationList, CrlError> {
        let mut lists = load_crls(bytes, store, ours, NOW)?;
        assert_eq!(lists.len(), 1);
        Ok(lists.remove(0))
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
        assert_eq!(list.next_update_unix, NOW + 3600);
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

    #[test]
    fn crl_signed_by_an_intermediate_shipped_in_the_file() {
        let root = TestCa::root("Fleet Root", p256());
        let inter = root.intermediate("Factory 7", p256());
        let store = store_of(&root.pem);
        let crl = crl_params(&[&[5]]).signed_by(&inter.issuer()).unwrap();
        let crl_pem = crl.pem().unwrap();

        // Without the intermediate, nothing vouches for the CRL's issuer.
        assert_eq!(
            load_crls(crl_pem.as_bytes(), &store, None, NOW)
                .unwrap_err()
                .reason(),
            "untrusted"
        );
        let file = format!("{crl_pem}{}", inter.pem);
        let lists = load_crls(file.as_bytes(), &store, None, NOW).expect("with intermediate");
        assert_eq!(lists.len(), 1);
        assert_eq!(lists[0].issuer, "CN=Factory 7");
        assert_eq!(lists[0].serials, vec!["5"]);

        // An intermediate that does not chain to an anchor is refused, CRL or not.
        let stranger = TestCa::root("Stranger", p256()).intermediate("Factory 7", p256());
        let file = format!("{crl_pem}{}", stranger.pem);
        assert_eq!(
            load_crls(file.as_bytes(), &store, None, NOW)
                .unwrap_err()
                .reason(),
            "untrusted"
        );

        // Several CRLs in one file: the root's and the intermediate's.
        let root_crl = crl_params(&[&[9]]).signed_by(&root.issuer()).unwrap();
        let file = format!("{}{crl_pem}{}", root_crl.pem().unwrap(), inter.pem);
        let lists = load_crls(file.as_bytes(), &store, None, NOW).expect("two CRLs");
        assert_eq!(lists.len(), 2);
        assert_ne!(lists[0].issuer_id, lists[1].issuer_id);
    }

    #[test]
    fn crl_times_are_honoured() {
        let root = TestCa::root("Fleet Root", p256());
        let store = store_of(&root.pem);
        let crl = crl_params(&[&[1]]).signed_by(&root.issuer()).unwrap();
        // thisUpdate is NOW - 60: one second earlier the CRL is from the future.
        assert_eq!(
            load_crls(crl.der(), &store, None, NOW - 61)
                .unwrap_err()
                .reason(),
            "not_yet_valid"
        );
        let list = parse_crl(crl.der(), &store, None).expect("crl");
        assert_eq!(list.this_update_unix, NOW - 60);
        assert!(!list.is_stale(NOW + 3600));
        assert!(list.is_stale(NOW + 3601));
    }

    #[test]
    fn crl_entries_name_their_issuer() {
        let a = TestCa::root("Root A", p256());
        let b = TestCa::root("Root B", p256());
        let store = store_of(&format!("{}{}", a.pem, b.pem));
        let chain = b.issue(&leaf_params("robot-7"), &p256());
        let vc = super::super::verify_chain(&chain, &store, "robot-7", NOW).expect("chain");
        let der = pem::parse(&chain).unwrap().into_contents();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        // The same serial revoked by A does not name B's certificate.
        let from_a = crl_params(&[cert.raw_serial()])
            .signed_by(&a.issuer())
            .unwrap();
        let list = parse_crl(from_a.der(), &store, None).expect("crl");
        assert!(!list.ids().any(|id| id == vc.chain_ids[0]));
        let from_b = crl_params(&[cert.raw_serial()])
            .signed_by(&b.issuer())
            .unwrap();
        let list = parse_crl(from_b.der(), &store, None).expect("crl");
        assert!(list.ids().any(|id| id == vc.chain_ids[0]));
        // webpki enforces it on the path too.
        let err =
            super::super::verify_chain_with_crls(&chain, &store, "robot-7", NOW, &[list.webpki()])
                .unwrap_err();
        assert_eq!(err.reason(), "revoked");
        let other = parse_crl(from_a.der(), &store, None).expect("crl");
        super::super::verify_chain_with_crls(&chain, &store, "robot-7", NOW, &[other.webpki()])
            .expect("A's CRL does not speak for B's certificate");
    }
}
