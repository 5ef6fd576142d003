//! Certificates for the X.509 tests, made with rcgen: fleet roots, intermediates, client
//! leaves and CRLs, and files to point the server at.

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    RevocationReason, RevokedCertParams, SerialNumber,
};
use time::{Duration, OffsetDateTime};

pub struct Ca {
    params: CertificateParams,
    key: KeyPair,
    pub pem: String,
}

pub fn name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

fn ca_params(cn: &str, is_ca: bool) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(cn);
    params.is_ca = if is_ca {
        IsCa::Ca(BasicConstraints::Unconstrained)
    } else {
        IsCa::ExplicitNoCa
    };
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = OffsetDateTime::now_utc() - Duration::hours(1);
    params.not_after = OffsetDateTime::now_utc() + Duration::days(30);
    params
}

impl Ca {
    pub fn root(cn: &str) -> Ca {
        let params = ca_params(cn, true);
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Ca { params, key, pem }
    }

    pub fn intermediate(&self, cn: &str) -> Ca {
        self.intermediate_with(cn, true)
    }

    /// An intermediate; `is_ca: false` makes one that must not sign (for refusal tests).
    pub fn intermediate_with(&self, cn: &str, is_ca: bool) -> Ca {
        let mut params = ca_params(cn, is_ca);
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().unwrap();
        let pem = params.signed_by(&key, &self.issuer()).unwrap().pem();
        Ca { params, key, pem }
    }

    pub fn issuer(&self) -> Issuer<'_, &KeyPair> {
        Issuer::from_params(&self.params, &self.key)
    }

    /// A client-auth leaf for `cn` with `key`.
    pub fn leaf(&self, cn: &str, key: &KeyPair, serial: u64) -> String {
        self.leaf_with(cn, key, serial, |_| {})
    }

    /// A leaf for `cn` with `key`; `adjust` can break it.
    pub fn leaf_with(
        &self,
        cn: &str,
        key: &KeyPair,
        serial: u64,
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> String {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(cn);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = OffsetDateTime::now_utc() - Duration::hours(1);
        params.not_after = OffsetDateTime::now_utc() + Duration::days(1);
        params.serial_number = Some(SerialNumber::from(serial));
        params.use_authority_key_identifier_extension = true;
        adjust(&mut params);
        params.signed_by(key, &self.issuer()).unwrap().pem()
    }

    /// A CRL listing `serials`, issued `age` ago and valid for `validity` from then.
    pub fn crl_at(&self, serials: &[u64], age: Duration, validity: Duration) -> String {
        let this_update = OffsetDateTime::now_utc() - age;
        CertificateRevocationListParams {
            this_update,
            next_update: this_update + validity,
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|s| RevokedCertParams {
                    serial_number: SerialNumber::from(*s),
                    revocation_time: this_update,
                    reason_code: Some(RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&self.issuer())
        .unwrap()
        .pem()
        .unwrap()
    }

    pub fn crl(&self, serials: &[u64]) -> String {
        self.crl_at(serials, Duration::minutes(1), Duration::days(1))
    }
}

pub fn temp_file(name: &str, contents: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("{}-{name}", uuid::Uuid::new_v4()));
    std::fs::write(&path, contents).unwrap();
    path
}
