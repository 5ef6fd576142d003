//! A presented chain checked against the trust store: the cheap checks first, then
//! webpki's path validation with CRLs, then what webpki leaves to us (anchor bookkeeping).

use super::*;

/// Verify a robot's certificate chain (PEM, leaf first, then intermediates in any order)
/// against `store` at time `now_unix`, and check it names `robot_id`. No CRLs: see
/// [`verify_chain_with_crls`].
pub fn verify_chain(
    chain_pem: &str,
    store: &TrustStore,
    robot_id: &str,
    now_unix: i64,
) -> Result<VerifiedChain, X509Error> {
    verify_chain_with_crls(chain_pem, store, robot_id, now_unix, &[])
}

/// [`verify_chain`], and no certificate on the path may be listed by one of `crls` (which
/// webpki matches by issuer and serial, verifying each CRL's signature with the key of the
/// CA on the path that issued the certificate: anchors and intermediates alike).
pub fn verify_chain_with_crls(
    chain_pem: &str,
    store: &TrustStore,
    robot_id: &str,
    now_unix: i64,
    crls: &[&CertRevocationList<'_>],
) -> Result<VerifiedChain, X509Error> {
    let ders = split_chain_pem(chain_pem)?;
    let certs = ders
        .iter()
        .map(|d| parse_cert(d))
        .collect::<Result<Vec<_>, _>>()?;
    let leaf = certs
        .first()
        .ok_or_else(|| X509Error::Malformed("no certificate in chain".into()))?;

    let leaf_key = precheck(&certs, store, robot_id)?;

    let leaf_der = CertificateDer::from(ders[0].as_slice());
    let end_entity =
        EndEntityCert::try_from(&leaf_der).map_err(|e| map_webpki_error(&e, leaf, now_unix))?;
    let intermediates: Vec<CertificateDer<'_>> = ders[1..]
        .iter()
        .map(|d| CertificateDer::from(d.as_slice()))
        .collect();
    let revocation = revocation_options(crls);
    let time = UnixTime::since_unix_epoch(std::time::Duration::from_secs(
        u64::try_from(now_unix).unwrap_or(0),
    ));
    // Our own checks on a candidate path; the most specific failure is kept for the report.
    let refused: RefCell<Option<X509Error>> = RefCell::new(None);
    let check_path = |path: &webpki::VerifiedPath<'_>| -> Result<(), webpki::Error> {
        let result = anchor_bookkeeping(store, path, now_unix);
        match result {
            Ok(()) => Ok(()),
            Err(e) => {
                *refused.borrow_mut() = Some(e);
                // Any error makes webpki try other paths; ours is reported if none works.
                Err(webpki::Error::UnknownIssuer)
            }
        }
    };
    let path = end_entity
        .verify_for_usage(
            SIGNATURE_ALGS,
            &store.webpki,
            &intermediates,
            time,
            KeyUsage::client_auth(),
            revocation,
            Some(&check_path),
        )
        .map_err(|e| match refused.borrow_mut().take() {
            Some(ours) => ours,
            None => map_webpki_error(&e, leaf, now_unix),
        })?;

    let mut chain_ids = vec![CertId {
        issuer: issuer_id(end_entity.issuer()),
        serial: serial_hex(end_entity.serial()),
    }];
    let mut intermediates_der = Vec::new();
    for cert in path.intermediate_certificates() {
        chain_ids.push(CertId {
            issuer: issuer_id(cert.issuer()),
            serial: serial_hex(cert.serial()),
        });
        intermediates_der.push(cert.der().to_vec());
    }
    // The anchor is known to be in the store: `anchor_bookkeeping` accepted this path.
    let anchor_not_after = path_anchor(store, &path).map_or(i64::MIN, |a| a.not_after);
    let valid_until_unix = certs
        .iter()
        .map(|c| c.validity().not_after.timestamp())
        .fold(anchor_not_after, i64::min);
    Ok(VerifiedChain {
        valid_until_unix,
        leaf_key,
        serial_hex: serial_hex(leaf.raw_serial()),
        chain_serials: chain_ids.iter().map(|c| c.serial.clone()).collect(),
        chain_ids,
        intermediates: intermediates_der,
        not_after_unix: leaf.validity().not_after.timestamp(),
        subject_cn: single_common_name(leaf.subject()).map(str::to_string),
    })
}

/// The checks before any signature work: the leaf names the robot, is no CA, may sign, and
/// some anchor could have issued something on the chain. Returns the leaf's key.
fn precheck(
    certs: &[X509Certificate<'_>],
    store: &TrustStore,
    robot_id: &str,
) -> Result<PublicKey, X509Error> {
    let leaf = certs
        .first()
        .ok_or_else(|| X509Error::Malformed("no certificate in chain".into()))?;
    // Names and flags only: no public-key operation.
    if !names_robot(leaf, robot_id)? {
        return Err(X509Error::NameMismatch);
    }
    let (leaf_ca, _) = basic_constraints(leaf)?;
    if leaf_ca {
        return Err(X509Error::KeyUsage("leaf certificate is a CA".into()));
    }
    if key_usage(leaf)?.is_some_and(|k| !k.digital_signature()) {
        return Err(X509Error::KeyUsage("leaf lacks digitalSignature".into()));
    }
    let leaf_key = PublicKey::from_spki(leaf.public_key())?;
    let plausible = certs
        .iter()
        .any(|c| store.any_may_have_issued(c.issuer().as_raw(), authority_key_id(c.extensions())));
    if !plausible {
        return Err(X509Error::Untrusted);
    }
    Ok(leaf_key)
}

/// Revocation as we apply it: every certificate on the path, CRLs optional and never
/// stale for what they list (None without CRLs).
fn revocation_options<'a>(
    crls: &'a [&'a CertRevocationList<'a>],
) -> Option<webpki::RevocationOptions<'a>> {
    let builder = RevocationOptionsBuilder::new(crls).ok()?;
    Some(
        builder
            .with_depth(webpki::RevocationCheckDepth::Chain)
            // A certificate no CRL speaks for is fine: CRLs are optional.
            .with_status_policy(webpki::UnknownStatusPolicy::Allow)
            // A stale CRL still revokes what it lists; staleness is reported elsewhere.
            .with_expiration_policy(webpki::ExpirationPolicy::Ignore)
            .build(),
    )
}

/// The leaf of a chain and the key it certifies, without any verification: used to compare
/// a presented chain with a robot's stored credential before doing signature work.
pub fn leaf_key_of_chain(chain_pem: &str) -> Result<(PublicKey, CertId), X509Error> {
    let ders = split_chain_pem(chain_pem)?;
    let leaf = parse_cert(&ders[0])?;
    Ok((PublicKey::from_spki(leaf.public_key())?, cert_id(&ders[0])?))
}

/// PEM chain → DER certificates, with the size and count limits applied first.
fn split_chain_pem(chain_pem: &str) -> Result<Vec<Vec<u8>>, X509Error> {
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
    Ok(blocks.into_iter().map(pem::Pem::into_contents).collect())
}

/// What webpki does not check about a path it has verified: the anchor's own validity and
/// pathLenConstraint (webpki's anchors are name + key only) and keyCertSign on issuers.
fn anchor_bookkeeping(
    store: &TrustStore,
    path: &webpki::VerifiedPath<'_>,
    now_unix: i64,
) -> Result<(), X509Error> {
    let anchor = path_anchor(store, path).ok_or(X509Error::Untrusted)?;
    if now_unix < anchor.not_before {
        return Err(X509Error::NotYetValid("trust anchor"));
    }
    if now_unix > anchor.not_after {
        return Err(X509Error::Expired("trust anchor"));
    }
    let mut intermediates = 0usize;
    for cert in path.intermediate_certificates() {
        intermediates += 1;
        let der = cert.der();
        let parsed = parse_cert(der.as_ref())?;
        if key_usage(&parsed)?.is_some_and(|k| !k.key_cert_sign()) {
            return Err(X509Error::KeyUsage(format!(
                "{} lacks keyCertSign",
                parsed.subject()
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
    Ok(())
}

/// Our record of the anchor webpki ended `path` at.
fn path_anchor<'s>(store: &'s TrustStore, path: &webpki::VerifiedPath<'_>) -> Option<&'s Anchor> {
    store
        .webpki
        .iter()
        .position(|a| std::ptr::eq(a, path.anchor()))
        .and_then(|i| store.anchors.get(i))
}

/// webpki's verdict in our stable reasons. Validity errors do not say which certificate
/// failed; the leaf is checked here to tell "leaf" from "intermediate".
fn map_webpki_error(e: &webpki::Error, leaf: &X509Certificate<'_>, now: i64) -> X509Error {
    use webpki::Error as W;
    let which = || {
        let v = leaf.validity();
        if now < v.not_before.timestamp() || now > v.not_after.timestamp() {
            "leaf"
        } else {
            "intermediate"
        }
    };
    match e {
        W::CertExpired { .. } => X509Error::Expired(which()),
        W::CertNotValidYet { .. } => X509Error::NotYetValid(which()),
        W::UnknownIssuer | W::CertDistrusted => X509Error::Untrusted,
        W::InvalidSignatureForPublicKey => X509Error::BadSignature,
        W::UnsupportedSignatureAlgorithmContext(_)
        | W::UnsupportedSignatureAlgorithmForPublicKeyContext(_) => {
            X509Error::UnsupportedAlgorithm(format!("{e:?}"))
        }
        W::CaUsedAsEndEntity => X509Error::KeyUsage("leaf certificate is a CA".into()),
        W::EndEntityUsedAsCa => X509Error::NotCa("an issuer lacks basicConstraints CA:TRUE".into()),
        W::PathLenConstraintViolated
        | W::MaximumPathDepthExceeded
        | W::MaximumSignatureChecksExceeded
        | W::MaximumPathBuildCallsExceeded => X509Error::ChainTooLong(format!("{e:?}")),
        W::RequiredEkuNotFoundContext(_) | W::EmptyEkuExtension => {
            X509Error::KeyUsage("leaf extendedKeyUsage lacks clientAuth".into())
        }
        W::UnsupportedCriticalExtension => X509Error::UnsupportedExtension(format!("{e:?}")),
        W::NameConstraintViolation => X509Error::UnsupportedExtension(format!("{e:?}")),
        W::CertRevoked => X509Error::Revoked,
        // A CRL that cannot be checked against the path (bad signature, issuer not allowed
        // to sign CRLs, unsupported form): we cannot tell, so refuse.
        W::InvalidCrlSignatureForPublicKey
        | W::IssuerNotCrlSigner
        | W::UnsupportedCrlSignatureAlgorithmContext(_)
        | W::UnsupportedCrlSignatureAlgorithmForPublicKeyContext(_)
        | W::UnknownRevocationStatus => X509Error::Revoked,
        other => X509Error::Malformed(format!("{other:?}")),
    }
}
