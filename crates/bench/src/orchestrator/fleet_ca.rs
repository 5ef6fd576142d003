//! A fleet's certificates for the X.509 login workload: a root the server trusts, an
//! intermediate (a factory's CA), and a client-auth leaf per robot, each chain presented
//! at register as a robot with a fleet certificate does (docs/security.md).

use std::path::Path;

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use time::{Duration, OffsetDateTime};

/// A CA's parameters and key, able to sign.
struct Authority {
    params: CertificateParams,
    key: KeyPair,
    pem: String,
}

impl Authority {
    fn issuer(&self) -> Issuer<'_, &KeyPair> {
        Issuer::from_params(&self.params, &self.key)
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

fn authority_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = OffsetDateTime::now_utc() - Duration::hours(1);
    params.not_after = OffsetDateTime::now_utc() + Duration::days(1);
    params.use_authority_key_identifier_extension = true;
    params
}

/// The root's PEM (the server's trust anchors) and each robot's chain (leaf, then the
/// intermediate), the leaves all for `robot_pkcs8` (a P-256 key, PKCS#8 DER).
pub struct FleetChains {
    pub root_pem: String,
    chains: Vec<String>,
    renewed: Vec<String>,
}

impl FleetChains {
    /// Chains for `{prefix}-0` … `{prefix}-{robots - 1}`.
    pub fn issue(prefix: &str, robots: usize, robot_pkcs8: &[u8]) -> anyhow::Result<Self> {
        let root_params = authority_params("Bench Fleet Root");
        let root_key = KeyPair::generate()?;
        let root_pem = root_params.self_signed(&root_key)?.pem();
        let root = Authority {
            params: root_params,
            key: root_key,
            pem: root_pem,
        };
        let factory_params = authority_params("Bench Factory");
        let factory_key = KeyPair::generate()?;
        let factory_pem = factory_params
            .signed_by(&factory_key, &root.issuer())?
            .pem();
        let factory = Authority {
            params: factory_params,
            key: factory_key,
            pem: factory_pem,
        };
        let robot_key = KeyPair::try_from(robot_pkcs8).context("the robots' P-256 key")?;
        let leaves = |serial_base: u64| {
            (0..robots)
                .map(|i| {
                    let mut params = CertificateParams::default();
                    params.distinguished_name = name(&format!("{prefix}-{i}"));
                    params.is_ca = IsCa::ExplicitNoCa;
                    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
                    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
                    params.not_before = OffsetDateTime::now_utc() - Duration::hours(1);
                    params.not_after = OffsetDateTime::now_utc() + Duration::days(1);
                    params.serial_number = Some(SerialNumber::from(serial_base + i as u64 + 1));
                    params.use_authority_key_identifier_extension = true;
                    let leaf = params.signed_by(&robot_key, &factory.issuer())?.pem();
                    Ok(format!("{leaf}{}", factory.pem))
                })
                .collect::<anyhow::Result<Vec<_>>>()
        };
        Ok(FleetChains {
            root_pem: root.pem.clone(),
            chains: leaves(0)?,
            renewed: leaves(1_000_000)?,
        })
    }

    /// Robot `i`'s chain.
    pub fn chain(&self, i: usize) -> &str {
        &self.chains[i % self.chains.len()]
    }

    /// Robot `i`'s chain with a renewed leaf: another serial, the same key.
    pub fn renewed_chain(&self, i: usize) -> &str {
        &self.renewed[i % self.renewed.len()]
    }

    /// Writes the trust anchors for `--trust-anchors`.
    pub fn write_anchors(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, &self.root_pem).context("writing the trust anchors")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_robot_gets_a_leaf_for_its_id_then_the_intermediate() {
        use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let fleet = FleetChains::issue("robot", 2, pkcs8.as_ref()).unwrap();
        let chain = fleet.chain(1);
        assert_eq!(chain.matches("BEGIN CERTIFICATE").count(), 2);
        let der: Vec<_> = ders(chain);
        let (_, leaf) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
        assert_eq!(leaf.subject().to_string(), "CN=robot-1");
        assert_eq!(leaf.issuer().to_string(), "CN=Bench Factory");
        let root_der = ders(&fleet.root_pem);
        let (_, root) = x509_parser::parse_x509_certificate(&root_der[0]).unwrap();
        assert_eq!(root.subject().to_string(), "CN=Bench Fleet Root");
        assert_eq!(
            fleet.chain(3),
            fleet.chain(1),
            "robots past the pool share leaves"
        );
        let renewed = ders(fleet.renewed_chain(1));
        let (_, renewed) = x509_parser::parse_x509_certificate(&renewed[0]).unwrap();
        assert_eq!(renewed.subject().to_string(), "CN=robot-1");
        assert_ne!(renewed.raw_serial(), leaf.raw_serial());
        assert_eq!(renewed.public_key().raw, leaf.public_key().raw);
    }

    /// The DER of each certificate of a PEM bundle.
    fn ders(pem: &str) -> Vec<Vec<u8>> {
        x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
            .map(|pem| pem.unwrap().contents)
            .collect()
    }
}
