//! Robot identity: public keys, fleet CA trust, our own issuing CA and CRLs.
//!
//! Identity model: a robot is identified by its `robot_id`. It proves that
//! identity in one of two ways:
//!
//! * **Enrolled key** — a raw Ed25519 key or an SPKI PEM (Ed25519, ECDSA
//!   P-256/P-384, RSA ≥ 2048) registered for the robot; the robot signs a
//!   server challenge and we check it with [`PublicKey::verify`].
//! * **Certificate** — the robot presents a PEM chain (leaf first) that must
//!   lead to a configured fleet CA ([`TrustStore`]) or to our own CA
//!   ([`CertificateAuthority`], which signs robot CSRs). The leaf must name the
//!   robot (subject CN, or a SAN dNSName/URI equal to `robot_id`); its key is
//!   then used for the same challenge signature. Paths, signatures and CRLs are
//!   checked by rustls-webpki ([`verify_chain_with_crls`]); revocation is by
//!   issuer and serial ([`CertId`]), CRLs are loaded with [`load_crls`].
//!
//! Everything here fails closed: any input we cannot fully parse or check is
//! refused with a typed error whose `reason()` is a stable string code.

pub mod ca;
pub mod crl;
pub mod keys;
pub mod signing;
pub mod x509;

pub use ca::{generate_ca, CaError, CertificateAuthority, IssuedCertificate};
pub use crl::{load_crls, CrlError, RevocationList};
pub use keys::{decode_signature, KeyError, PublicKey};
pub use signing::{Jwk, Jwks, SigningKeyError, SigningKeys};
pub use x509::{
    cert_id, issuer_id, leaf_key_of_chain, serial_hex, verify_chain, verify_chain_with_crls,
    CertId, TrustStore, VerifiedChain, X509Error, MAX_CHAIN_LEN,
};

/// Test fixtures and rcgen helpers. Neither ring nor rcgen (ring backend)
/// can generate RSA keys or sign RSA-PSS certificates, so those paths use
/// material pre-generated with openssl. TEST-ONLY: never use these keys.
#[cfg(test)]
mod test_support {
    /// TEST-ONLY RSA-2048 private key (PKCS#8).
    pub(super) const RSA_2048_PKCS8_PEM: &str = "\
-----BEGIN PRIVATE KEY-----
MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQC1EodYqZP4NiVw
+CJyayIyCM461ry/FhJq8EY8d37F8rNMsA7aR48OVRGkXJ4ieWyNKJjcr7Vz1U0T
RbYbZMMC0KVSMh0EuYc6+t/YPYU58QoI33Uwj5E970ZW/zVuibqkrlLSY7+chf3z
cAFfPjG+VUsXcmAKPQErAoCrstEPDb3C3nosgl+73IoeRuPJfrppXRJsgC/E5Jrs
zQOtK+hJge28We5modo/u/D44odZ9A35KvTIHfE7MDqtQQY3pEstpUT832RRMlZ2
17cGOC4Y0VV3Of+kfr81UV9LGeknTZDYy3FSVQg6kOPxA8cw/Yhu7bVw+ZbLyZ9M
7yT/BtZvAgMBAAECggEAAPUUnxziaeULZKIDOJylZSNTx87b15zLwyH7FRXCp1RF
q2mg4nmPYZGEktxkf6UptENbL4uER5UAn9H2CQYK2+hzf1BBhAVhGCg8Z73Hhwtl
tK9NxNB1gaDSu+IEi82RnY5IZNFfMXop4hAdCb5f7/QuffS+Wj+BUpNkT8QVw+EZ
7EvJbqW38pyCc0JhJIQQqGtME0Fm4/CE5FVdpHQ/6M/FNuwnwzOFR3bVU7KHeHSB
FxL3x1a1yC3f1N3mwyrjmYkNOhBrj5R+/3wUoqjZyrBoGQjViDSADRlnXvraYlIK
B49U2LRp/C+GcUVqhIPtXXywDUkLDHuBH47HrFaSuQKBgQD1y8LWD9FPzpCxHQrV
OUx/7SoOhhEaBhfuz7KIX8+R++72GpB6dJi3T2scGK5qUiEhl4Z87n5kvFsZLaoT
IxsYk82lA4vzr2XcBI0Xg9WLi8UKj0n55YSSr+/7wokAqZ8M0NvRVcAtLlWp4+M3
K7pBmDLIm84KcmN1rGsg8NDgCQKBgQC8lugf6ZoWs7M8i+N4qSmaiwJB6/3wLswO
2sn37QZdpVxGivrRJG96IV0tJEfv+W+E46GfJnfu1wFzssPsArFEBNvdNcziCkya
9/WSCH2jQqZ+TBj6Q/C/12wfpfQClzpDT7Q4J/qsDy3VWnAkNDfpz6weuQZcTqWf
bCGVJU0wtwKBgQCAvjyMUPaqnaCuFG8zJfMK4pdvygs1HVH11TZHNiAL7/DHWTyp
116STXfl3IumxuPxq2NXFrh/XSU+N+voYC/2HJzPPN9WQV3R81RPp873a7tGf60Y
xn49Mwg5TzjhbvcPCGrK5+ZkA+v8s4+0uyOw7d5Ts0Aluqqb3Tazp09QuQKBgQCn
5Yne73A5id6mprvrLl9VsTBfVCSN8nvFNc/do+2o7ZELVKwcCl4c0xtLFyPcZ6t7
GdVIBU19G3m1cY+vzG3Y6qJ7fGxdSWIODXdZfams8aechU8vb9EkWjtuqaZlsBE0
3/7Ih/9Js3HQomV4Ne0ZgcPwzjT1dSdKmVAEomLoXQKBgFlw45I47bEJNTCAGaoM
6aJ6sSuo+JCU72QU3sXJrwBfhXDoqTfCSKa7KtBwNu0+dP1LBP0c47i4ZOWo0IDh
8LOFQ+XDrq1yR5N8IKKCXj7W03ln44+Wu4+2xqop6X2jM1R8RHX3Y+RAtyXC7Bho
Xe36CLprT2U/eaFIGCs9tSQb
-----END PRIVATE KEY-----
";

    /// TEST-ONLY RSA-1024 public key, too weak on purpose.
    pub(super) const RSA_1024_SPKI_PEM: &str = "\
-----BEGIN PUBLIC KEY-----
MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQDUyeOW++fGMqpRkF8r7eNsIW1W
xCvcfJPfjluPibR7GtCw7CMn6dYMyUqecxODFNXX0eMP5B+XaLpED+YmeDbc6me+
fp/LgrJbnMsrnweqOQwnOuAd0HTtBMqI5gL4DWFSJmMBdWDlg+33XlP9qVxtEvCH
p6Tqsjl0rQijA4wTzwIDAQAB
-----END PUBLIC KEY-----
";

    /// TEST-ONLY self-signed CA (RSA-2048 key above), signed with RSA-PSS SHA-256, salt 32.
    pub(super) const PSS_CA_CERT_PEM: &str = "\
-----BEGIN CERTIFICATE-----
MIIDVDCCAgigAwIBAgICEAEwQQYJKoZIhvcNAQEKMDSgDzANBglghkgBZQMEAgEF
AKEcMBoGCSqGSIb3DQEBCDANBglghkgBZQMEAgEFAKIDAgEgMBYxFDASBgNVBAMM
C1BTUyBUZXN0IENBMCAXDTI2MTEyMTA1NTk0MVoYDzIxMjYxMDI4MDU1OTQxWjAW
MRQwEgYDVQQDDAtQU1MgVGVzdCBDQTCCASIwDQYJKoZIhvcNAQEBBQADggEPADCC
AQoCggEBALUSh1ipk/g2JXD4InJrIjIIzjrWvL8WEmrwRjx3fsXys0ywDtpHjw5V
EaRcniJ5bI0omNyvtXPVTRNFthtkwwLQpVIyHQS5hzr639g9hTnxCgjfdTCPkT3v
Rlb/NW6JuqSuUtJjv5yF/fNwAV8+Mb5VSxdyYAo9ASsCgKuy0Q8NvcLeeiyCX7vc
ih5G48l+umldEmyAL8TkmuzNA60r6EmB7bxZ7mah2j+78Pjih1n0Dfkq9Mgd8Tsw
Oq1BBjekSy2lRPzfZFEyVnbXtwY4LhjRVXc5/6R+vzVRX0sZ6SdNkNjLcVJVCDqQ
4/EDxzD9iG7ttXD5lsvJn0zvJP8G1m8CAwEAAaNCMEAwDwYDVR0TAQH/BAUwAwEB
/zAOBgNVHQ8BAf8EBAMCAQYwHQYDVR0OBBYEFKBHSJkLYvH4CPVpsl1Tna7OOcb9
MEEGCSqGSIb3DQEBCjA0oA8wDQYJYIZIAWUDBAIBBQChHDAaBgkqhkiG9w0BAQgw
DQYJYIZIAWUDBAIBBQCiAwIBIAOCAQEASBUTSPQDIjoK29H/2WlAHwA/8mPb8QJn
YZOcuDEYq3R3zh03RhuwEjRMJWo27/T4ZgGmCYWAXxLUCzBoROuyMZif0f29k+Te
+vSTnUg+omV8ikICRmYYlBGxRUbEnOIB6sg2I1bA2edXkOTi8k4UtbX4HU59Uhgr
cwYCpBmBwFghfaKW7MTAhh5uu33JQAbQb63fkhgHia2LyF8EV4fjpkPLn+YH5qzE
onboIa3Non8DrbOHSkdRonIdwrm0RaNgBaqWvN4d/p95pOnmkolB/qvK/FTzcL1O
Pq3YikHRoV/iDjdoGhROSl9bH64gctpjt1mmKNPILb6PlgZ9wD2e0w==
-----END CERTIFICATE-----
";

    /// TEST-ONLY leaf "robot-pss" (P-256 key) issued by the PSS CA with RSA-PSS SHA-256.
    pub(super) const PSS_LEAF_CERT_PEM: &str = "\
-----BEGIN CERTIFICATE-----
MIIC0jCCAYagAwIBAgICIAIwQQYJKoZIhvcNAQEKMDSgDzANBglghkgBZQMEAgEF
AKEcMBoGCSqGSIb3DQEBCDANBglghkgBZQMEAgEFAKIDAgEgMBYxFDASBgNVBAMM
C1BTUyBUZXN0IENBMCAXDTI2MTEyMTA1NTk0MVoYDzIxMjYxMDI4MDU1OTQxWjAU
MRIwEAYDVQQDDAlyb2JvdC1wc3MwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAAQD
XQKBGBrqHS8w0SvDGMg5Wq+Kjtbvt6v5YYHMv+ZLCPWJIvxq1ggFYxi2BXnU05Q9
f5I7+ABdCcfuXIWrxvYGo4GMMIGJMAwGA1UdEwEB/wQCMAAwDgYDVR0PAQH/BAQD
AgeAMBMGA1UdJQQMMAoGCCsGAQUFBwMCMBQGA1UdEQQNMAuCCXJvYm90LXBzczAd
BgNVHQ4EFgQUnGdtSWWI38IC6lsxU3cn98YgG/kwHwYDVR0jBBgwFoAUoEdImQti
8fgI9WmyXVOdrs45xv0wQQYJKoZIhvcNAQEKMDSgDzANBglghkgBZQMEAgEFAKEc
MBoGCSqGSIb3DQEBCDANBglghkgBZQMEAgEFAKIDAgEgA4IBAQAM64rsnM2SfMq8
/XM81owGS0SyMaJlHTmxw2U+v+olqCA5CR+C4XvD31LH8X/DYf36pj695Tvbl3Qo
KdmpnmVIxPt3k5HypVYESxiuQMuc2QfEnb+wfo24lLEjLMhTs3WReKzpwzm71dIB
2Jsi8B3ct5DSLc9U2jgBaCk8Go1bghHrXahSlM/ELVaJySqOgaoldc/n5rbiAlau
ma/5AKxyiIjfF58/CbpNQSOlFpLfdD8AkDymNEZUb1VB7CiLF2nSBiQcV5kKQdtk
ssM5FI6mBhzsOjKX9gywf+8hLYqyu91FEasADLC+wElAs6EpNb4tRRIHmKwYrIeH
gVyN3o5T
-----END CERTIFICATE-----
";

    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
        IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData,
    };

    /// Fixed "now" for generated certificates, which are valid from
    /// `NOW - 3600` to `NOW + 86400`.
    pub(super) const NOW: i64 = 1_800_000_000;

    pub(super) fn at(unix: i64) -> time::OffsetDateTime {
        time::OffsetDateTime::from_unix_timestamp(unix).expect("timestamp")
    }

    pub(super) fn p256() -> KeyPair {
        KeyPair::generate().expect("P-256 key")
    }

    pub(super) fn rsa_key() -> KeyPair {
        KeyPair::from_pem(RSA_2048_PKCS8_PEM).expect("RSA test key")
    }

    /// Sign with rcgen's key (Ed25519, ECDSA DER, RSA PKCS#1 SHA-256).
    pub(super) fn sign_with(key: &KeyPair, msg: &[u8]) -> Vec<u8> {
        rcgen::SigningKey::sign(key, msg).expect("sign")
    }

    fn named(cn: &str) -> DistinguishedName {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        dn
    }

    pub(super) fn ca_params(cn: &str) -> CertificateParams {
        let mut p = CertificateParams::default();
        p.distinguished_name = named(cn);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p.not_before = at(NOW - 3600);
        p.not_after = at(NOW + 86_400);
        p.use_authority_key_identifier_extension = true;
        p
    }

    pub(super) fn leaf_params(cn: &str) -> CertificateParams {
        let mut p = CertificateParams::default();
        p.distinguished_name = named(cn);
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        p.not_before = at(NOW - 3600);
        p.not_after = at(NOW + 86_400);
        p.use_authority_key_identifier_extension = true;
        p
    }

    /// A test CA: its parameters, key and certificate PEM.
    pub(super) struct TestCa {
        pub(super) params: CertificateParams,
        pub(super) key: KeyPair,
        pub(super) pem: String,
    }

    impl TestCa {
        pub(super) fn root(cn: &str, key: KeyPair) -> TestCa {
            Self::root_with(ca_params(cn), key)
        }

        pub(super) fn root_with(mut params: CertificateParams, key: KeyPair) -> TestCa {
            params.use_authority_key_identifier_extension = false;
            let pem = params.self_signed(&key).expect("self-signed").pem();
            TestCa { params, key, pem }
        }

        pub(super) fn intermediate(&self, cn: &str, key: KeyPair) -> TestCa {
            self.intermediate_with(ca_params(cn), key)
        }

        pub(super) fn intermediate_with(&self, params: CertificateParams, key: KeyPair) -> TestCa {
            let pem = self.issue(&params, &key);
            TestCa { params, key, pem }
        }

        pub(super) fn issuer(&self) -> Issuer<'_, &KeyPair> {
            Issuer::from_params(&self.params, &self.key)
        }

        /// Issue a certificate for `subject_key`; returns its PEM.
        pub(super) fn issue(
            &self,
            params: &CertificateParams,
            subject_key: &impl PublicKeyData,
        ) -> String {
            params
                .signed_by(subject_key, &self.issuer())
                .expect("issue")
                .pem()
        }
    }

    /// A time inside the validity of the two PSS certificates (2030-03-17).
    pub(super) const PSS_NOW: i64 = 1_900_000_000;
}
