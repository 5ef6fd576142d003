//! Robot identity with X.509: fleet CA trust, just-in-time registration, CSR enrollment,
//! revocation by serial and by CRL. Certificates are made here with rcgen.

use crate::fleet_ca::{name, temp_file, Ca};
use crate::helpers::*;
use rcgen::{CertificateParams, KeyPair, SignatureAlgorithm};
use serde_json::json;
use time::{Duration, OffsetDateTime};

async fn fleet_server(ca: &Ca, auto_register: bool) -> TestServer {
    let anchors = temp_file("anchors.pem", &ca.pem);
    TestServer::start_with(move |c| {
        c.trust_anchors = Some(anchors);
        c.auto_register = auto_register;
    })
    .await
}

#[tokio::test]
async fn each_key_type_logs_in_with_a_fleet_certificate() {
    let ca = Ca::root("Fleet Root");
    let server = fleet_server(&ca, true).await;
    let algorithms: [(&str, &'static SignatureAlgorithm); 3] = [
        ("robot-ed", &rcgen::PKCS_ED25519),
        ("robot-p256", &rcgen::PKCS_ECDSA_P256_SHA256),
        ("robot-p384", &rcgen::PKCS_ECDSA_P384_SHA384),
    ];
    for (serial, (robot_id, algorithm)) in algorithms.into_iter().enumerate() {
        let key = KeyPair::generate_for(algorithm).unwrap();
        let chain = ca.leaf(robot_id, &key, 100 + serial as u64);
        let _robot = server
            .robot_login(robot_id, &Certified::new(&chain, &key))
            .await;
        let (_, record) = server
            .admin(
                reqwest::Method::GET,
                &format!("/v1/robots/{robot_id}"),
                None,
            )
            .await;
        assert_eq!(record["credential"], "x509");
        assert_eq!(record["online"], true);
    }
}

#[tokio::test]
async fn raw_r_s_ecdsa_signatures_are_accepted() {
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    let ca = Ca::root("Fleet Root");
    let server = fleet_server(&ca, true).await;
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let signer =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let key = KeyPair::try_from(pkcs8.as_ref()).unwrap();
    let chain = ca.leaf("robot-rs", &key, 7);
    // Fixed-width r‖s, not ASN.1 DER: 32 + 32 bytes for P-256.
    assert_eq!(signer.sign_challenge(b"anything").len(), 64);
    server
        .robot_login("robot-rs", &Certified::new(&chain, &signer))
        .await;
}

#[tokio::test]
async fn leaf_plus_intermediate_chain() {
    let root = Ca::root("Fleet Root");
    let intermediate = root.intermediate("Factory 7");
    let server = fleet_server(&root, true).await;
    let key = KeyPair::generate().unwrap();
    let chain = format!(
        "{}{}",
        intermediate.leaf("robot-1", &key, 1),
        intermediate.pem
    );
    server
        .robot_login("robot-1", &Certified::new(&chain, &key))
        .await;
    // Without the intermediate, the leaf does not chain to the anchor.
    let key = KeyPair::generate().unwrap();
    let lone_leaf = intermediate.leaf("robot-2", &key, 2);
    let (_robot, reply) = server
        .robot_attempt("robot-2", &Certified::new(&lone_leaf, &key))
        .await;
    assert_refused(&reply, "untrusted");
}

#[tokio::test]
async fn bad_certificates_are_refused_with_a_reason() {
    let root = Ca::root("Fleet Root");
    let stranger = Ca::root("Someone Else");
    let not_a_ca = root.intermediate_with("Not A CA", false);
    let server = fleet_server(&root, true).await;
    let key = KeyPair::generate().unwrap();
    let now = OffsetDateTime::now_utc();
    let cases: Vec<(String, &str)> = vec![
        (
            root.leaf_with("robot-x", &key, 1, |p| {
                p.not_before = now - Duration::days(10);
                p.not_after = now - Duration::days(1);
            }),
            "expired",
        ),
        (
            root.leaf_with("robot-x", &key, 2, |p| {
                p.not_before = now + Duration::days(1);
                p.not_after = now + Duration::days(10);
            }),
            "not_yet_valid",
        ),
        (stranger.leaf("robot-x", &key, 3), "untrusted"),
        (
            format!("{}{}", not_a_ca.leaf("robot-x", &key, 4), not_a_ca.pem),
            "not_ca",
        ),
        (root.leaf("robot-other", &key, 5), "name_mismatch"),
        (
            "-----BEGIN CERTIFICATE-----\nZ2FyYmFnZQ==\n-----END CERTIFICATE-----\n".into(),
            "malformed",
        ),
        ("not even PEM".into(), "malformed"),
    ];
    for (chain, reason) in cases {
        let (mut robot, reply) = server
            .robot_attempt("robot-x", &Certified::new(&chain, &key))
            .await;
        assert_refused(&reply, reason);
        robot.expect_close_with(1008).await;
    }
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("signalling_pki_results_total{result=\"expired\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("signalling_pki_results_total{result=\"name_mismatch\"} 1"));
}

#[tokio::test]
async fn valid_certificate_but_signature_by_another_key() {
    let root = Ca::root("Fleet Root");
    let server = fleet_server(&root, true).await;
    let key = KeyPair::generate().unwrap();
    let thief = KeyPair::generate().unwrap();
    let chain = root.leaf("robot-1", &key, 1);
    let (_robot, reply) = server
        .robot_attempt("robot-1", &Certified::new(&chain, &thief))
        .await;
    assert_refused(&reply, "bad_signature");
}

#[tokio::test]
async fn without_auto_register_unknown_robots_are_refused_even_with_a_good_chain() {
    let root = Ca::root("Fleet Root");
    let server = fleet_server(&root, false).await;
    let key = KeyPair::generate().unwrap();
    let chain = root.leaf("robot-1", &key, 1);
    let (_robot, reply) = server
        .robot_attempt("robot-1", &Certified::new(&chain, &key))
        .await;
    assert_refused(&reply, "unknown_robot");
    // Once the robot has a record, the same chain logs in.
    server.create_robot("robot-1").await;
    server
        .robot_login("robot-1", &Certified::new(&chain, &key))
        .await;
}

#[tokio::test]
async fn revoked_serial_closes_the_live_connection_and_stays_refused() {
    let root = Ca::root("Fleet Root");
    let server = fleet_server(&root, true).await;
    let key = KeyPair::generate().unwrap();
    let chain = root.leaf("robot-1", &key, 4242);
    let mut robot = server
        .robot_login("robot-1", &Certified::new(&chain, &key))
        .await;
    let (status, _) = server
        .admin(reqwest::Method::POST, "/v1/robots/robot-1/revoke", None)
        .await;
    assert_eq!(status, 200);
    let error = robot.expect_error("UNAUTHORIZED").await;
    assert_eq!(error["payload"]["details"]["reason"], "revoked");
    robot.expect_close_with(4003).await;
    let (_robot, reply) = server
        .robot_attempt("robot-1", &Certified::new(&chain, &key))
        .await;
    assert_refused(&reply, "revoked");
}

#[tokio::test]
async fn crl_listed_serials_are_refused_and_reloads_cut_off_live_robots() {
    let root = Ca::root("Fleet Root");
    let crl_path = temp_file("fleet.crl", &root.crl(&[1]));
    let anchors = temp_file("anchors.pem", &root.pem);
    let crl = crl_path.clone();
    let server = TestServer::start_with(move |c| {
        c.trust_anchors = Some(anchors);
        c.auto_register = true;
        c.crl = Some(crl);
    })
    .await;
    let key = KeyPair::generate().unwrap();
    let listed = root.leaf("robot-1", &key, 1);
    let (_robot, reply) = server
        .robot_attempt("robot-1", &Certified::new(&listed, &key))
        .await;
    assert_refused(&reply, "revoked");

    let other_key = KeyPair::generate().unwrap();
    let fine = root.leaf("robot-2", &other_key, 2);
    let mut robot = server
        .robot_login("robot-2", &Certified::new(&fine, &other_key))
        .await;
    // The CA publishes a new CRL listing serial 2: the live robot is cut off.
    let new_crl = temp_file("next.crl", &root.crl(&[1, 2]));
    std::fs::rename(&new_crl, &crl_path).unwrap();
    let error = robot.expect_error("UNAUTHORIZED").await;
    assert_eq!(error["payload"]["details"]["reason"], "revoked");
    robot.expect_close_with(4003).await;
    std::fs::remove_file(crl_path).ok();
}

#[tokio::test]
async fn a_crl_from_an_untrusted_issuer_stops_the_server_from_starting() {
    let root = Ca::root("Fleet Root");
    let stranger = Ca::root("Someone Else");
    let (database_url, _) = test_database().await;
    let mut config =
        signalling_server::Config::from_args(["s", "--listen", "127.0.0.1:0"]).unwrap();
    config.database_url = Some(database_url);
    config.trust_anchors = Some(temp_file("anchors.pem", &root.pem));
    config.crl = Some(temp_file("bad.crl", &stranger.crl(&[1])));
    let error = signalling_server::Server::bind(config)
        .await
        .err()
        .expect("refused");
    assert!(error.to_string().contains("bad.crl"), "{error}");
}

#[tokio::test]
async fn csr_enrollment_issues_a_certificate_that_then_logs_in() {
    let dir = std::env::temp_dir().join(format!("ca-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca_cert, ca_key) = signalling_server::pki::generate_ca("Test Fleet CA", 30).unwrap();
    let cert_path = dir.join("ca.pem");
    let key_path = dir.join("ca.key");
    std::fs::write(&cert_path, &ca_cert).unwrap();
    std::fs::write(&key_path, &ca_key).unwrap();
    let server = TestServer::start_with(move |c| {
        c.ca_cert = Some(cert_path);
        c.ca_key = Some(key_path);
    })
    .await;
    let token = server.create_robot("robot-1").await;
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name = name("robot-1");
    let csr = params.serialize_request(&key).unwrap().pem().unwrap();

    // A CSR naming another robot is refused.
    let mut other = CertificateParams::default();
    other.distinguished_name = name("robot-2");
    let wrong = other.serialize_request(&key).unwrap().pem().unwrap();
    let (status, _) = server
        .post(
            "/v1/enroll",
            json!({"robotId": "robot-1", "enrollmentToken": token, "csr": wrong}),
        )
        .await;
    assert_eq!(status, 422);
    let (status, _) = server
        .post(
            "/v1/enroll",
            json!({"robotId": "robot-1", "enrollmentToken": token, "csr": "garbage"}),
        )
        .await;
    assert_eq!(status, 422);

    let (status, body) = server
        .post(
            "/v1/enroll",
            json!({"robotId": "robot-1", "enrollmentToken": token, "csr": csr}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let chain = body["certificate"].as_str().unwrap();
    let blocks = pem::parse_many(chain).unwrap();
    assert_eq!(blocks.len(), 2, "leaf then CA");
    assert_eq!(
        blocks[1].contents(),
        pem::parse(&ca_cert).unwrap().contents()
    );

    // The robot logs in with the stored certificate: no chain in register.
    server.robot_login("robot-1", &key).await;
    let (_, record) = server
        .admin(reqwest::Method::GET, "/v1/robots/robot-1", None)
        .await;
    assert_eq!(record["credential"], "x509");
    // ...or presenting it, as a fleet robot would.
    server
        .robot_login("robot-1", &Certified::new(chain, &key))
        .await;
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn dev_pki_commands_make_a_ca_and_robot_certificates_that_log_in() {
    let dir = std::env::temp_dir().join(format!("certs-{}", uuid::Uuid::new_v4()));
    let binary = env!("CARGO_BIN_EXE_signalling-server");
    let run = |args: &[&str]| {
        let output = std::process::Command::new(binary)
            .args(args)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    };
    let out = dir.to_str().unwrap();
    run(&["pki", "init-ca", "--out", out]);
    run(&["pki", "issue", "robot-7", "--out", out]);
    // Never overwrite keys.
    let again = std::process::Command::new(binary)
        .args(["pki", "init-ca", "--out", out])
        .output()
        .unwrap();
    assert!(!again.status.success());
    #[cfg(unix)]
    for key in ["ca.key", "robot-7.key"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{key}");
    }
    let anchors = dir.join("ca.pem");
    let server = TestServer::start_with(move |c| {
        c.trust_anchors = Some(anchors);
        c.auto_register = true;
    })
    .await;
    let chain = std::fs::read_to_string(dir.join("robot-7.pem")).unwrap();
    let key =
        KeyPair::from_pem(&std::fs::read_to_string(dir.join("robot-7.key")).unwrap()).unwrap();
    server
        .robot_login("robot-7", &Certified::new(&chain, &key))
        .await;
    std::fs::remove_dir_all(dir).ok();
}
