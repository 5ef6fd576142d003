//! Robot public keys: parsing (enrollment, SPKI, storage form) and challenge
//! signature verification with ring.

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use ring::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
    OID_SIG_ED25519,
};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::RSAPublicKey;
use x509_parser::x509::SubjectPublicKeyInfo;

/// Upper bound on any textual key or signature input; real ones are far
/// smaller, and the cap keeps hostile input from costing memory/CPU.
const MAX_TEXT_INPUT: usize = 16 * 1024;
const MIN_RSA_BITS: usize = 2048;
/// ring refuses larger moduli anyway; refusing early gives a clearer error.
const MAX_RSA_BITS: usize = 8192;

/// Why a key or signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("malformed key or signature: {0}")]
    Malformed(String),
    #[error("unsupported key algorithm: {0}")]
    UnsupportedAlgorithm(String),
    #[error("key too weak (RSA keys must be at least 2048 bits)")]
    WeakKey,
    #[error("signature verification failed")]
    BadSignature,
}

impl KeyError {
    /// Stable machine-readable code.
    pub fn reason(&self) -> &'static str {
        match self {
            KeyError::Malformed(_) => "malformed",
            KeyError::UnsupportedAlgorithm(_) => "unsupported_algorithm",
            KeyError::WeakKey => "weak_key",
            KeyError::BadSignature => "bad_signature",
        }
    }
}

/// A robot public key in the form ring consumes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PublicKey {
    /// Raw 32-byte Ed25519 key.
    Ed25519([u8; 32]),
    /// Uncompressed SEC1 point (65 bytes).
    EcdsaP256(Vec<u8>),
    /// Uncompressed SEC1 point (97 bytes).
    EcdsaP384(Vec<u8>),
    /// PKCS#1 RSAPublicKey DER, at least 2048 bits.
    Rsa(Vec<u8>),
}

// Accept padded and unpadded input; trailing bits must still be zero so each
// value has exactly one accepted encoding per alphabet.
const LENIENT: GeneralPurposeConfig =
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
const B64_STANDARD: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, LENIENT);
const B64_URL_SAFE: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, LENIENT);

/// Decode base64 in the standard or URL-safe alphabet, padded or not, with
/// surrounding whitespace ignored.
fn decode_b64(input: &str) -> Result<Vec<u8>, KeyError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(KeyError::Malformed("empty base64 input".into()));
    }
    if s.len() > MAX_TEXT_INPUT {
        return Err(KeyError::Malformed("base64 input too long".into()));
    }
    let engine = if s.contains(['-', '_']) {
        &B64_URL_SAFE
    } else {
        &B64_STANDARD
    };
    engine
        .decode(s)
        .map_err(|e| KeyError::Malformed(format!("invalid base64: {e}")))
}

/// Decode a base64 signature (standard or URL-safe, padded or not).
pub fn decode_signature(b64: &str) -> Result<Vec<u8>, KeyError> {
    decode_b64(b64)
}

impl PublicKey {
    /// Parse a key submitted at enrollment: a raw 32-byte Ed25519 key in
    /// base64, or a PEM "PUBLIC KEY" (SubjectPublicKeyInfo).
    pub fn parse_enrollment(input: &str) -> Result<PublicKey, KeyError> {
        let s = input.trim();
        if s.len() > MAX_TEXT_INPUT {
            return Err(KeyError::Malformed("key input too long".into()));
        }
        if s.starts_with("-----BEGIN") {
            let blocks =
                pem::parse_many(s).map_err(|e| KeyError::Malformed(format!("invalid PEM: {e}")))?;
            let [block] = blocks.as_slice() else {
                return Err(KeyError::Malformed("expected exactly one PEM block".into()));
            };
            if block.tag() != "PUBLIC KEY" {
                return Err(KeyError::Malformed(format!(
                    "expected a PUBLIC KEY PEM block, got {:?}",
                    block.tag()
                )));
            }
            return Self::from_spki_der(block.contents());
        }
        let raw = decode_b64(s)?;
        let key: [u8; 32] = raw.as_slice().try_into().map_err(|_| {
            KeyError::Malformed(format!(
                "raw Ed25519 key must be 32 bytes, got {}",
                raw.len()
            ))
        })?;
        Ok(PublicKey::Ed25519(key))
    }

    /// Parse a DER SubjectPublicKeyInfo.
    pub fn from_spki_der(der: &[u8]) -> Result<PublicKey, KeyError> {
        let (rest, spki) = SubjectPublicKeyInfo::from_der(der)
            .map_err(|_| KeyError::Malformed("invalid SubjectPublicKeyInfo".into()))?;
        if !rest.is_empty() {
            return Err(KeyError::Malformed(
                "trailing data after SubjectPublicKeyInfo".into(),
            ));
        }
        Self::from_spki(&spki)
    }

    /// Convert an already parsed SPKI (certificates, CSRs).
    pub(super) fn from_spki(spki: &SubjectPublicKeyInfo<'_>) -> Result<PublicKey, KeyError> {
        if spki.subject_public_key.unused_bits != 0 {
            return Err(KeyError::Malformed(
                "public key bit string not byte aligned".into(),
            ));
        }
        let data: &[u8] = &spki.subject_public_key.data;
        let alg = &spki.algorithm;
        if alg.algorithm == OID_SIG_ED25519 {
            // RFC 8410: parameters MUST be absent.
            if alg.parameters.is_some() {
                return Err(KeyError::Malformed("Ed25519 key with parameters".into()));
            }
            let key: [u8; 32] = data
                .try_into()
                .map_err(|_| KeyError::Malformed("Ed25519 key must be 32 bytes".into()))?;
            Ok(PublicKey::Ed25519(key))
        } else if alg.algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY {
            let curve = alg
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .ok_or_else(|| KeyError::Malformed("EC key without named curve".into()))?;
            if curve == OID_EC_P256 {
                Ok(PublicKey::EcdsaP256(validate_ec_point(
                    EcCurve::P256,
                    data,
                )?))
            } else if curve == OID_NIST_EC_P384 {
                Ok(PublicKey::EcdsaP384(validate_ec_point(
                    EcCurve::P384,
                    data,
                )?))
            } else {
                Err(KeyError::UnsupportedAlgorithm(format!("EC curve {curve}")))
            }
        } else if alg.algorithm == OID_PKCS1_RSAENCRYPTION {
            // RFC 3279 says NULL parameters; tolerate absent, refuse anything else.
            if let Some(p) = &alg.parameters {
                if p.tag() != x509_parser::asn1_rs::Tag::Null {
                    return Err(KeyError::Malformed(
                        "RSA key with non-NULL parameters".into(),
                    ));
                }
            }
            Ok(PublicKey::Rsa(validate_rsa_pkcs1(data)?))
        } else {
            Err(KeyError::UnsupportedAlgorithm(format!(
                "public key algorithm {}",
                alg.algorithm
            )))
        }
    }

    /// Short algorithm name, also the prefix of the stored form.
    pub fn kind(&self) -> &'static str {
        match self {
            PublicKey::Ed25519(_) => "ed25519",
            PublicKey::EcdsaP256(_) => "ecdsa-p256",
            PublicKey::EcdsaP384(_) => "ecdsa-p384",
            PublicKey::Rsa(_) => "rsa",
        }
    }

    /// The key bytes as held in the variant (what ring verifies with).
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            PublicKey::Ed25519(k) => k,
            PublicKey::EcdsaP256(k) | PublicKey::EcdsaP384(k) | PublicKey::Rsa(k) => k,
        }
    }

    /// Compact text form for storage: `KIND:BASE64` (standard, padded).
    pub fn to_stored(&self) -> String {
        format!(
            "{}:{}",
            self.kind(),
            base64::engine::general_purpose::STANDARD.encode(self.bytes())
        )
    }

    /// Inverse of [`PublicKey::to_stored`]; re-validates the key so a
    /// tampered database row cannot smuggle in an invalid or weak key.
    pub fn from_stored(stored: &str) -> Result<PublicKey, KeyError> {
        let (kind, b64) = stored
            .trim()
            .split_once(':')
            .ok_or_else(|| KeyError::Malformed("stored key lacks KIND: prefix".into()))?;
        let raw = decode_b64(b64)?;
        match kind {
            "ed25519" => {
                let key: [u8; 32] = raw
                    .as_slice()
                    .try_into()
                    .map_err(|_| KeyError::Malformed("Ed25519 key must be 32 bytes".into()))?;
                Ok(PublicKey::Ed25519(key))
            }
            "ecdsa-p256" => Ok(PublicKey::EcdsaP256(validate_ec_point(
                EcCurve::P256,
                &raw,
            )?)),
            "ecdsa-p384" => Ok(PublicKey::EcdsaP384(validate_ec_point(
                EcCurve::P384,
                &raw,
            )?)),
            "rsa" => Ok(PublicKey::Rsa(validate_rsa_pkcs1(&raw)?)),
            other => Err(KeyError::UnsupportedAlgorithm(format!(
                "stored key kind {other:?}"
            ))),
        }
    }

    /// Lowercase hex SHA-256 of the key bytes (raw Ed25519 key, SEC1 point or
    /// PKCS#1 DER), stable across storage round trips.
    pub fn fingerprint(&self) -> String {
        hex_lower(ring::digest::digest(&ring::digest::SHA256, self.bytes()).as_ref())
    }

    /// Verify `signature` over `message`.
    ///
    /// Ed25519; ECDSA P-256/SHA-256 and P-384/SHA-384 as ASN.1 DER or fixed
    /// r||s; RSA PKCS#1 v1.5 or PSS with SHA-256 (≥ 2048 bits).
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> Result<(), KeyError> {
        let candidates: &[(&'static dyn VerificationAlgorithm, Option<usize>)] = match self {
            PublicKey::Ed25519(key) => return verify_ed25519(key, message, signature),
            PublicKey::EcdsaP256(_) => &[
                (&signature::ECDSA_P256_SHA256_ASN1, None),
                (&signature::ECDSA_P256_SHA256_FIXED, Some(64)),
            ],
            PublicKey::EcdsaP384(_) => &[
                (&signature::ECDSA_P384_SHA384_ASN1, None),
                (&signature::ECDSA_P384_SHA384_FIXED, Some(96)),
            ],
            PublicKey::Rsa(_) => &[
                (&signature::RSA_PKCS1_2048_8192_SHA256, None),
                (&signature::RSA_PSS_2048_8192_SHA256, None),
            ],
        };
        let ok = candidates.iter().any(|(alg, fixed_len)| {
            // Only try a fixed-size encoding when the length fits it.
            fixed_len.is_none_or(|n| n == signature.len())
                && UnparsedPublicKey::new(*alg, self.bytes())
                    .verify(message, signature)
                    .is_ok()
        });
        if ok {
            Ok(())
        } else {
            Err(KeyError::BadSignature)
        }
    }
}

/// Ed25519 by ed25519-dalek's strict verification rather than ring's: about 440,000
/// instructions per signature against ring's 580,000 (callgrind, one sitting; curve25519-dalek
/// takes its AVX2 code where the CPU has it), and a signature is most of a robot's login.
/// Strict also refuses what RFC 8032 leaves to the verifier and ring accepts: a small-order
/// key or R, with which one signature verifies for many messages or keys. No signer
/// following RFC 8032 produces those.
fn verify_ed25519(key: &[u8; 32], message: &[u8], signature: &[u8]) -> Result<(), KeyError> {
    let key = ed25519_dalek::VerifyingKey::from_bytes(key).map_err(|_| KeyError::BadSignature)?;
    let signature =
        ed25519_dalek::Signature::from_slice(signature).map_err(|_| KeyError::BadSignature)?;
    key.verify_strict(message, &signature)
        .map_err(|_| KeyError::BadSignature)
}

#[derive(Clone, Copy)]
enum EcCurve {
    P256,
    P384,
}

/// Check an uncompressed SEC1 point is a valid public key: both coordinates below the
/// field's prime, y² = x³ − 3x + b, not the identity. RustCrypto's curve arithmetic checks
/// that with field operations alone, a few thousand instructions. ring has no point check;
/// the ECDH with an ephemeral key used before cost two scalar multiplications
/// (~650,000 instructions, 38 % of a P-256 robot's login, three times per X.509 login).
fn validate_ec_point(curve: EcCurve, point: &[u8]) -> Result<Vec<u8>, KeyError> {
    let len = match curve {
        EcCurve::P256 => 65,
        EcCurve::P384 => 97,
    };
    if point.len() != len || point.first() != Some(&0x04) {
        return Err(KeyError::Malformed(
            "EC key must be an uncompressed point".into(),
        ));
    }
    let on_curve = match curve {
        EcCurve::P256 => p256::PublicKey::from_sec1_bytes(point).is_ok(),
        EcCurve::P384 => p384::PublicKey::from_sec1_bytes(point).is_ok(),
    };
    if !on_curve {
        return Err(KeyError::Malformed("EC point is not on the curve".into()));
    }
    Ok(point.to_vec())
}

/// Check a PKCS#1 RSAPublicKey: exact DER, positive modulus of 2048..=8192
/// bits, odd exponent ≥ 3.
fn validate_rsa_pkcs1(der: &[u8]) -> Result<Vec<u8>, KeyError> {
    let (rest, key) = RSAPublicKey::from_der(der)
        .map_err(|_| KeyError::Malformed("invalid RSAPublicKey".into()))?;
    if !rest.is_empty() {
        return Err(KeyError::Malformed(
            "trailing data after RSAPublicKey".into(),
        ));
    }
    if key.modulus.first().is_none_or(|b| b & 0x80 != 0) {
        return Err(KeyError::Malformed("RSA modulus not positive".into()));
    }
    let modulus = strip_leading_zeros(key.modulus);
    let bits = match modulus.first() {
        Some(first) => modulus.len() * 8 - first.leading_zeros() as usize,
        None => 0,
    };
    if bits < MIN_RSA_BITS {
        return Err(KeyError::WeakKey);
    }
    if bits > MAX_RSA_BITS {
        return Err(KeyError::UnsupportedAlgorithm(format!(
            "RSA key of {bits} bits (max {MAX_RSA_BITS})"
        )));
    }
    let e = key
        .try_exponent()
        .map_err(|_| KeyError::Malformed("invalid RSA exponent".into()))?;
    if e < 3 || e % 2 == 0 {
        return Err(KeyError::Malformed("invalid RSA exponent".into()));
    }
    Ok(der.to_vec())
}

fn strip_leading_zeros(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|&x| x != 0).unwrap_or(b.len());
    &b[start..]
}

pub(super) fn hex_lower(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    use rcgen::PublicKeyData as _;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair as _, RsaKeyPair};

    use super::super::test_support::{RSA_1024_SPKI_PEM, RSA_2048_PKCS8_PEM};

    const MSG: &[u8] = b"challenge:robot-7:nonce-123";

    fn ed25519() -> Ed25519KeyPair {
        let rng = SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng).expect("keygen");
        Ed25519KeyPair::from_pkcs8(doc.as_ref()).expect("parse")
    }

    fn ecdsa(alg: &'static signature::EcdsaSigningAlgorithm) -> EcdsaKeyPair {
        let rng = SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("keygen");
        EcdsaKeyPair::from_pkcs8(alg, doc.as_ref(), &rng).expect("parse")
    }

    fn rsa() -> RsaKeyPair {
        let der = pem::parse(RSA_2048_PKCS8_PEM).expect("pem");
        RsaKeyPair::from_pkcs8(der.contents()).expect("rsa")
    }

    /// SPKI PEM for a key, produced by rcgen from the same PKCS#8 document.
    fn spki_pem_from_pkcs8(pkcs8: &[u8]) -> String {
        let kp = rcgen::KeyPair::try_from(pkcs8).expect("rcgen key");
        kp.public_key_pem()
    }

    #[test]
    fn ed25519_raw_base64_variants_and_signature() {
        let kp = ed25519();
        let raw = kp.public_key().as_ref().to_vec();
        for text in [
            STANDARD.encode(&raw),
            URL_SAFE_NO_PAD.encode(&raw),
            format!("  \n{}\t ", STANDARD.encode(&raw)),
            STANDARD.encode(&raw).trim_end_matches('=').to_string(),
        ] {
            let key = PublicKey::parse_enrollment(&text).expect("parse");
            assert_eq!(key.kind(), "ed25519");
            let sig = kp.sign(MSG);
            key.verify(MSG, sig.as_ref()).expect("verify");
            let err = key.verify(b"other message", sig.as_ref()).unwrap_err();
            assert_eq!(err.reason(), "bad_signature");
        }
    }

    #[test]
    fn ed25519_spki_pem() {
        let rng = SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng).expect("keygen");
        let kp = Ed25519KeyPair::from_pkcs8(doc.as_ref()).expect("parse");
        let key = PublicKey::parse_enrollment(&spki_pem_from_pkcs8(doc.as_ref())).expect("pem");
        assert_eq!(
            key,
            PublicKey::Ed25519(kp.public_key().as_ref().try_into().unwrap())
        );
        key.verify(MSG, kp.sign(MSG).as_ref()).expect("verify");
    }

    fn check_ecdsa(
        asn1: &'static signature::EcdsaSigningAlgorithm,
        fixed: &'static signature::EcdsaSigningAlgorithm,
        kind: &str,
        raw_len: usize,
    ) {
        let rng = SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(asn1, &rng).expect("keygen");
        let kp_asn1 = EcdsaKeyPair::from_pkcs8(asn1, doc.as_ref(), &rng).expect("parse");
        let kp_fixed = EcdsaKeyPair::from_pkcs8(fixed, doc.as_ref(), &rng).expect("parse");
        let key = PublicKey::parse_enrollment(&spki_pem_from_pkcs8(doc.as_ref())).expect("pem");
        assert_eq!(key.kind(), kind);

        let der_sig = kp_asn1.sign(&rng, MSG).expect("sign");
        key.verify(MSG, der_sig.as_ref()).expect("DER signature");
        let raw_sig = kp_fixed.sign(&rng, MSG).expect("sign");
        assert_eq!(raw_sig.as_ref().len(), raw_len);
        key.verify(MSG, raw_sig.as_ref())
            .expect("raw r||s signature");

        // Base64 transport of the signature, both alphabets.
        let sig = decode_signature(&URL_SAFE_NO_PAD.encode(raw_sig.as_ref())).expect("b64");
        key.verify(MSG, &sig).expect("decoded");

        assert_eq!(
            key.verify(b"tampered", der_sig.as_ref())
                .unwrap_err()
                .reason(),
            "bad_signature"
        );
        assert_eq!(
            key.verify(b"tampered", raw_sig.as_ref())
                .unwrap_err()
                .reason(),
            "bad_signature"
        );
        let mut truncated = raw_sig.as_ref().to_vec();
        truncated.pop();
        assert_eq!(
            key.verify(MSG, &truncated).unwrap_err(),
            KeyError::BadSignature
        );
    }

    #[test]
    fn ecdsa_p256_der_and_raw() {
        check_ecdsa(
            &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            "ecdsa-p256",
            64,
        );
    }

    #[test]
    fn ecdsa_p384_der_and_raw() {
        check_ecdsa(
            &signature::ECDSA_P384_SHA384_ASN1_SIGNING,
            &signature::ECDSA_P384_SHA384_FIXED_SIGNING,
            "ecdsa-p384",
            96,
        );
    }

    #[test]
    fn ecdsa_other_key_refused() {
        let a = ecdsa(&signature::ECDSA_P256_SHA256_ASN1_SIGNING);
        let b = ecdsa(&signature::ECDSA_P256_SHA256_ASN1_SIGNING);
        let key = PublicKey::EcdsaP256(a.public_key().as_ref().to_vec());
        let sig = b.sign(&SystemRandom::new(), MSG).expect("sign");
        assert_eq!(
            key.verify(MSG, sig.as_ref()).unwrap_err().reason(),
            "bad_signature"
        );
    }

    #[test]
    fn rsa_pkcs1_and_pss() {
        let kp = rsa();
        let der = pem::parse(RSA_2048_PKCS8_PEM).expect("pem");
        let key = PublicKey::parse_enrollment(&spki_pem_from_pkcs8(der.contents())).expect("pem");
        assert_eq!(key.kind(), "rsa");
        assert_eq!(key, PublicKey::Rsa(kp.public().as_ref().to_vec()));
        let rng = SystemRandom::new();
        for enc in [
            &signature::RSA_PKCS1_SHA256 as &dyn signature::RsaEncoding,
            &signature::RSA_PSS_SHA256,
        ] {
            let mut sig = vec![0u8; kp.public().modulus_len()];
            kp.sign(enc, &rng, MSG, &mut sig).expect("sign");
            key.verify(MSG, &sig).expect("verify");
            assert_eq!(
                key.verify(b"x", &sig).unwrap_err().reason(),
                "bad_signature"
            );
        }
        // SHA-512 PKCS#1 is not an accepted challenge format.
        let mut sig = vec![0u8; kp.public().modulus_len()];
        kp.sign(&signature::RSA_PKCS1_SHA512, &rng, MSG, &mut sig)
            .expect("sign");
        assert_eq!(key.verify(MSG, &sig).unwrap_err().reason(), "bad_signature");
    }

    #[test]
    fn rsa_1024_is_weak() {
        let err = PublicKey::parse_enrollment(RSA_1024_SPKI_PEM).unwrap_err();
        assert_eq!(err, KeyError::WeakKey);
        assert_eq!(err.reason(), "weak_key");
    }

    #[test]
    fn stored_form_round_trip_and_fingerprint() {
        let p256 = ecdsa(&signature::ECDSA_P256_SHA256_ASN1_SIGNING);
        let p384 = ecdsa(&signature::ECDSA_P384_SHA384_ASN1_SIGNING);
        let keys = [
            PublicKey::Ed25519(ed25519().public_key().as_ref().try_into().unwrap()),
            PublicKey::EcdsaP256(p256.public_key().as_ref().to_vec()),
            PublicKey::EcdsaP384(p384.public_key().as_ref().to_vec()),
            PublicKey::Rsa(rsa().public().as_ref().to_vec()),
        ];
        for key in keys {
            let stored = key.to_stored();
            assert!(stored.starts_with(&format!("{}:", key.kind())));
            let back = PublicKey::from_stored(&stored).expect("round trip");
            assert_eq!(back, key);
            let fp = key.fingerprint();
            assert_eq!(fp.len(), 64);
            assert!(fp
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
            assert_eq!(fp, back.fingerprint());
        }
        // Known vector: SHA-256 of 32 zero bytes.
        assert_eq!(
            PublicKey::Ed25519([0; 32]).fingerprint(),
            "66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"
        );
    }

    #[test]
    fn stored_form_rejects_tampering() {
        for bad in [
            "",
            "ed25519",
            "ed25519:AAAA",
            "dsa:AAAA",
            "ecdsa-p256:BAAA",
            "rsa:MAA=",
            "ecdsa-p256:!!!",
        ] {
            let err = PublicKey::from_stored(bad).unwrap_err();
            assert!(
                matches!(err.reason(), "malformed" | "unsupported_algorithm"),
                "{bad}: {err}"
            );
        }
        // Point not on the curve (valid length and prefix).
        let mut point = vec![4u8; 65];
        point[1] = 1;
        let err = PublicKey::from_stored(&format!("ecdsa-p256:{}", STANDARD.encode(&point)));
        assert_eq!(err.unwrap_err().reason(), "malformed");
    }

    /// ring's verdict on an Ed25519 signature, the verifier used before ed25519-dalek's.
    fn ring_verifies_ed25519(key: &[u8], message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&signature::ED25519, key)
            .verify(message, signature)
            .is_ok()
    }

    /// The strict verifier takes what ring takes from real signers: every signature of a
    /// few keys over messages of several sizes, and refuses, as ring does, every
    /// single-bit change of the signature, the message's last byte and the key, and a
    /// signature of the wrong length.
    #[test]
    fn ed25519_signatures_are_judged_as_ring_judges_them() {
        let rng = SystemRandom::new();
        let mut judged = 0;
        for size in [0usize, 1, 32, 300, 2048] {
            let doc = Ed25519KeyPair::generate_pkcs8(&rng).expect("keygen");
            let pair = Ed25519KeyPair::from_pkcs8(doc.as_ref()).expect("key");
            let raw: [u8; 32] = pair.public_key().as_ref().try_into().expect("32 bytes");
            let key = PublicKey::Ed25519(raw);
            let message: Vec<u8> = (0..size).map(|i| (i * 7 + size) as u8).collect();
            let sig = pair.sign(&message).as_ref().to_vec();
            assert!(ring_verifies_ed25519(&raw, &message, &sig));
            key.verify(&message, &sig).expect("a real signature");
            for bit in 0..sig.len() * 8 {
                let mut bad = sig.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                assert!(!ring_verifies_ed25519(&raw, &message, &bad));
                assert_eq!(
                    key.verify(&message, &bad).unwrap_err().reason(),
                    "bad_signature",
                    "signature bit {bit}"
                );
                judged += 1;
            }
            for bit in 0..raw.len() * 8 {
                let mut other = raw;
                other[bit / 8] ^= 1 << (bit % 8);
                assert!(!ring_verifies_ed25519(&other, &message, &sig));
                assert!(PublicKey::Ed25519(other).verify(&message, &sig).is_err());
                judged += 1;
            }
            if let Some(last) = message.len().checked_sub(1) {
                let mut changed = message.clone();
                changed[last] ^= 1;
                assert!(key.verify(&changed, &sig).is_err());
            }
            assert!(key.verify(&message, &sig[..63]).is_err());
            assert!(key
                .verify(&message, &[sig.as_slice(), &[0]].concat())
                .is_err());
        }
        assert!(judged > 2500);
    }

    /// RFC 8032, 7.1, TEST 3: a known key, message and signature.
    #[test]
    fn ed25519_rfc8032_vector_verifies() {
        let key: [u8; 32] = hex("fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025")
            .try_into()
            .expect("32 bytes");
        let message = hex("af82");
        let sig = hex(
            "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac\
             18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
        );
        PublicKey::Ed25519(key)
            .verify(&message, &sig)
            .expect("RFC 8032 TEST 3");
        assert!(ring_verifies_ed25519(&key, &message, &sig));
    }

    /// A small-order key (here the identity point's encoding): ring accepts a signature
    /// (R = identity, S = 0) for any message; the strict verifier refuses it.
    #[test]
    fn a_small_order_ed25519_key_verifies_nothing() {
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let mut sig = [0u8; 64];
        sig[0] = 1;
        for message in [&b"anything"[..], b"at all"] {
            assert!(ring_verifies_ed25519(&identity, message, &sig));
            assert_eq!(
                PublicKey::Ed25519(identity)
                    .verify(message, &sig)
                    .unwrap_err()
                    .reason(),
                "bad_signature"
            );
        }
    }

    /// ring's own check of a peer point, the one `validate_ec_point` used before: an
    /// ECDH with an ephemeral key fails unless the point is valid on the curve.
    fn ring_accepts_point(curve: EcCurve, point: &[u8]) -> bool {
        let alg = match curve {
            EcCurve::P256 => &ring::agreement::ECDH_P256,
            EcCurve::P384 => &ring::agreement::ECDH_P384,
        };
        let rng = SystemRandom::new();
        let ephemeral =
            ring::agreement::EphemeralPrivateKey::generate(alg, &rng).expect("ephemeral key");
        ring::agreement::agree_ephemeral(
            ephemeral,
            &ring::agreement::UnparsedPublicKey::new(alg, point),
            |_| (),
        )
        .is_ok()
    }

    /// `prime − value`, big-endian, for `value` below `prime`.
    fn minus(prime: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; prime.len()];
        let mut borrow = 0i16;
        for i in (0..prime.len()).rev() {
            let mut d = i16::from(prime[i]) - i16::from(value[i]) - borrow;
            borrow = i16::from(d < 0);
            if d < 0 {
                d += 256;
            }
            out[i] = d as u8;
        }
        out
    }

    /// The field check accepts exactly the points ring's ECDH accepts: real keys and their
    /// negations (−P = (x, p − y), on the curve too), and refuses every single-bit
    /// corruption of a coordinate and coordinates not below the prime.
    #[test]
    fn ec_points_are_checked_as_ring_checks_them() {
        let rng = SystemRandom::new();
        let p256_prime = hex("ffffffff00000001000000000000000000000000ffffffffffffffffffffffff");
        let p384_prime = hex(
            "fffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffeffffffff0000000000000000ffffffff",
        );
        let curves = [
            (
                EcCurve::P256,
                &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
                &p256_prime,
                "ecdsa-p256",
            ),
            (
                EcCurve::P384,
                &signature::ECDSA_P384_SHA384_ASN1_SIGNING,
                &p384_prime,
                "ecdsa-p384",
            ),
        ];
        let mut checked = 0;
        for (curve, alg, prime, kind) in curves {
            let n = prime.len();
            for _ in 0..4 {
                let doc = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("keygen");
                let pair = EcdsaKeyPair::from_pkcs8(alg, doc.as_ref(), &rng).expect("key");
                let point = pair.public_key().as_ref().to_vec();
                let (x, y) = (&point[1..=n], &point[1 + n..]);

                assert!(validate_ec_point(curve, &point).is_ok());
                let stored = format!("{kind}:{}", STANDARD.encode(&point));
                assert!(PublicKey::from_stored(&stored).is_ok());

                let negated = [&[4u8][..], x, &minus(prime, y)].concat();
                assert!(ring_accepts_point(curve, &negated));
                assert!(validate_ec_point(curve, &negated).is_ok());

                for bit in 8..point.len() * 8 {
                    let mut bad = point.clone();
                    bad[bit / 8] ^= 1 << (bit % 8);
                    let ours = validate_ec_point(curve, &bad).is_ok();
                    assert_eq!(ours, ring_accepts_point(curve, &bad), "bit {bit}");
                    assert!(!ours, "a flipped bit {bit} left the point on the curve");
                    checked += 1;
                }
            }
            // x = p: a coordinate that is not a field element.
            let unreduced = [&[4u8][..], prime, &vec![0u8; n]].concat();
            assert!(validate_ec_point(curve, &unreduced).is_err());
            assert!(!ring_accepts_point(curve, &unreduced));
        }
        assert!(checked > 4000);
    }

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn enrollment_rejects_garbage() {
        let cases = [
            "",
            "   ",
            "not base64 at all!",
            "AAAA",                      // 3 bytes
            &STANDARD.encode([7u8; 33]), // wrong length
            "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            "-----BEGIN PUBLIC KEY-----\nAAAA",
        ];
        for c in cases {
            let err = PublicKey::parse_enrollment(c).unwrap_err();
            assert_eq!(err.reason(), "malformed", "{c:?}: {err}");
        }
        // Mixed alphabets are refused rather than guessed.
        let mixed = format!("{}-_", &STANDARD.encode([1u8; 30])[..38]);
        assert_eq!(
            PublicKey::parse_enrollment(&mixed).unwrap_err().reason(),
            "malformed"
        );
    }

    #[test]
    fn enrollment_rejects_unsupported_curve() {
        // A P-256 SPKI relabelled as prime239v3 (1.2.840.10045.3.1.6).
        let kp = rcgen::KeyPair::generate().expect("keygen");
        let mut der = kp.subject_public_key_info();
        let p256 = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
        let at = der
            .windows(p256.len())
            .position(|w| w == p256)
            .expect("curve OID");
        der[at + 7] = 0x06;
        let err = PublicKey::from_spki_der(&der).unwrap_err();
        assert_eq!(err.reason(), "unsupported_algorithm");
        // Trailing garbage after a valid SPKI.
        let mut der = kp.subject_public_key_info();
        der.push(0);
        assert_eq!(
            PublicKey::from_spki_der(&der).unwrap_err().reason(),
            "malformed"
        );
    }

    #[test]
    fn decode_signature_variants() {
        let bytes: Vec<u8> = (0u8..=255).collect();
        for text in [
            STANDARD.encode(&bytes),
            STANDARD.encode(&bytes).trim_end_matches('=').to_string(),
            base64::engine::general_purpose::URL_SAFE.encode(&bytes),
            URL_SAFE_NO_PAD.encode(&bytes),
            format!(" {} \n", STANDARD.encode(&bytes)),
        ] {
            assert_eq!(decode_signature(&text).expect("decode"), bytes);
        }
        for bad in ["", "@@@@", "AB+_", "A"] {
            assert_eq!(
                decode_signature(bad).unwrap_err().reason(),
                "malformed",
                "{bad}"
            );
        }
    }
}
