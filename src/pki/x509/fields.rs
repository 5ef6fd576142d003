//! The certificate fields our checks read (basic constraints, key usage, key identifiers,
//! names) and signatures checked by algorithm identifier through webpki's table.

use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::{GeneralName, ParsedExtension, X509Extension};
use x509_parser::oid_registry::OID_X509_EXT_NAME_CONSTRAINTS;
use x509_parser::x509::{AlgorithmIdentifier, X509Name};

use super::{X509Error, SIGNATURE_ALGS};

/// The DER contents of an AlgorithmIdentifier (OID and parameters), the form webpki's
/// algorithm table is keyed by.
pub(in crate::pki) fn algorithm_id_contents(
    alg: &AlgorithmIdentifier<'_>,
) -> Result<Vec<u8>, X509Error> {
    use x509_parser::asn1_rs::ToDer;
    let mut out = alg
        .algorithm
        .to_der_vec()
        .map_err(|_| X509Error::Malformed("algorithm identifier".into()))?;
    if let Some(params) = &alg.parameters {
        out.extend(
            params
                .to_der_vec()
                .map_err(|_| X509Error::Malformed("algorithm parameters".into()))?,
        );
    }
    Ok(out)
}

/// Verify a signature made by the key in `spki` (a parsed SubjectPublicKeyInfo) with the
/// algorithm named by `alg`, using webpki's algorithm table (CSRs, CRLs, CA certificates).
pub(in crate::pki) fn verify_signed_data(
    spki: &x509_parser::x509::SubjectPublicKeyInfo<'_>,
    alg: &AlgorithmIdentifier<'_>,
    data: &[u8],
    sig: &x509_parser::asn1_rs::BitString<'_>,
) -> Result<(), X509Error> {
    if sig.unused_bits != 0 || spki.subject_public_key.unused_bits != 0 {
        return Err(X509Error::Malformed("bit string not byte aligned".into()));
    }
    let sig_alg = algorithm_id_contents(alg)?;
    let key_alg = algorithm_id_contents(&spki.algorithm)?;
    let mut known = false;
    for candidate in SIGNATURE_ALGS
        .iter()
        .filter(|a| a.signature_alg_id().as_ref() == sig_alg.as_slice())
    {
        known = true;
        if candidate.public_key_alg_id().as_ref() != key_alg.as_slice() {
            continue;
        }
        if candidate
            .verify_signature(&spki.subject_public_key.data, data, &sig.data)
            .is_ok()
        {
            return Ok(());
        }
    }
    if known {
        // A known algorithm that fails, or that does not fit the key: no valid signature.
        Err(X509Error::BadSignature)
    } else {
        Err(X509Error::UnsupportedAlgorithm(format!(
            "signature algorithm {}",
            alg.algorithm
        )))
    }
}

/// Parse one DER certificate and check structure we rely on later.
pub(in crate::pki) fn parse_cert(der: &[u8]) -> Result<X509Certificate<'_>, X509Error> {
    let (rest, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| X509Error::Malformed(format!("certificate: {e}")))?;
    if !rest.is_empty() {
        return Err(X509Error::Malformed(
            "trailing data after certificate".into(),
        ));
    }
    // Name constraints would restrict what an issuer may certify, but not the CN our name
    // binding uses: refuse rather than half-enforce (even if marked non-critical).
    if cert
        .extensions()
        .iter()
        .any(|e| e.oid == OID_X509_EXT_NAME_CONSTRAINTS)
    {
        return Err(X509Error::UnsupportedExtension("nameConstraints".into()));
    }
    Ok(cert)
}

/// (CA flag, pathLenConstraint); absent extension means not a CA.
pub(in crate::pki) fn basic_constraints(
    cert: &X509Certificate<'_>,
) -> Result<(bool, Option<u32>), X509Error> {
    let bc = cert
        .basic_constraints()
        .map_err(|e| X509Error::Malformed(format!("basicConstraints: {e}")))?;
    Ok(bc.map_or((false, None), |b| (b.value.ca, b.value.path_len_constraint)))
}

pub(in crate::pki) fn key_usage(
    cert: &X509Certificate<'_>,
) -> Result<Option<x509_parser::extensions::KeyUsage>, X509Error> {
    let ku = cert
        .key_usage()
        .map_err(|e| X509Error::Malformed(format!("keyUsage: {e}")))?;
    Ok(ku.map(|k| *k.value))
}

/// Empty key identifiers carry no information and are treated as absent.
pub(in crate::pki) fn authority_key_id<'a>(exts: &'a [X509Extension<'_>]) -> Option<&'a [u8]> {
    exts.iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                aki.key_identifier.as_ref().map(|k| k.0)
            }
            _ => None,
        })
        .filter(|k| !k.is_empty())
}

pub(in crate::pki) fn subject_key_id<'a>(cert: &'a X509Certificate<'_>) -> Option<&'a [u8]> {
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
pub(in crate::pki) fn key_ids_match(aki: Option<&[u8]>, ski: Option<&[u8]>) -> bool {
    match (aki, ski) {
        (Some(a), Some(s)) => a == s,
        _ => true,
    }
}

/// The subject CN if there is exactly one and it is a text string; several
/// CNs are ambiguous and are not used for naming.
pub(in crate::pki) fn single_common_name<'a>(name: &'a X509Name<'_>) -> Option<&'a str> {
    let mut cns = name.iter_common_name();
    let first = cns.next()?;
    if cns.next().is_some() {
        return None;
    }
    first.as_str().ok()
}

/// Exact match of `robot_id` against the subject CN or a SAN dNSName/URI.
pub(in crate::pki) fn general_names_match(names: &[GeneralName<'_>], robot_id: &str) -> bool {
    names.iter().any(|n| match n {
        GeneralName::DNSName(s) | GeneralName::URI(s) => *s == robot_id,
        _ => false,
    })
}

pub(in crate::pki) fn names_robot(
    leaf: &X509Certificate<'_>,
    robot_id: &str,
) -> Result<bool, X509Error> {
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
