//! `robot-agent enroll`: creates the robot's key if there is none, enrolls
//! it with the server's single-use enrollment token, and stores what the
//! server returns (a certificate chain for CSR enrollment) next to the key.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::config::{self, ARP_TOKEN_FILE, CERT_FILE, CONFIG_FILE, KEY_FILE};
use crate::fsutil;
use crate::identity::{IdentityError, KeyType, RobotKey};
use crate::server_keys::{self, SERVER_KEYS_FILE};

#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("cannot reach {url}: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the server refused the enrollment ({status}): {message}")]
    Rejected { status: u16, message: String },
    #[error("the server's answer has no certificate")]
    NoCertificate,
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read CA file {path}: {message}")]
    CaFile { path: PathBuf, message: String },
    #[error(transparent)]
    ServerKeys(#[from] crate::server_keys::ServerKeyError),
    #[error("no randomness for the ARP token")]
    Random,
}

/// What `enroll` was asked to do.
#[derive(Debug, Clone)]
pub struct EnrollRequest {
    pub server: String,
    pub robot_id: String,
    pub token: String,
    pub key_type: KeyType,
    pub csr: bool,
    pub config_dir: PathBuf,
    pub ca_file: Option<PathBuf>,
}

/// What was done, for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnrollOutcome {
    pub key_file: PathBuf,
    pub key_created: bool,
    pub certificate_file: Option<PathBuf>,
    pub config_file: Option<PathBuf>,
    /// The local ARP socket's token, when this enrollment created it.
    pub arp_token_file: Option<PathBuf>,
    /// Ids of the server's signing keys now pinned (none from a server that signs no
    /// session tickets: the robot then checks none).
    pub server_keys: Vec<String>,
}

pub async fn enroll(request: &EnrollRequest) -> Result<EnrollOutcome, EnrollError> {
    std::fs::create_dir_all(&request.config_dir).map_err(|source| EnrollError::Write {
        path: request.config_dir.clone(),
        source,
    })?;
    let key_file = request.config_dir.join(KEY_FILE);
    let (key, key_created) = RobotKey::load_or_create(&key_file, request.key_type)?;
    let mut body = json!({
        "robotId": request.robot_id,
        "enrollmentToken": request.token,
    });
    if request.csr {
        body["csr"] = Value::String(key.csr(&request.robot_id)?);
    } else {
        body["publicKey"] = Value::String(key.enrollment_public_key());
    }

    let answer = post_enrollment(request, &body).await?;

    let certificate_file = keep_certificate(request, &answer)?;

    // The server that just enrolled us (over TLS, with a single-use token) is the one
    // whose session tickets we will believe: pin its keys, replacing any earlier ones.
    let pinned = server_keys::from_jwks(answer.get("signingKeys").unwrap_or(&Value::Null));
    if !pinned.is_empty() {
        server_keys::save(&request.config_dir.join(SERVER_KEYS_FILE), &pinned)?;
    }
    let config_file =
        write_config_if_missing(&request.config_dir, &request.server, &request.robot_id)?;
    let arp_token_file = write_arp_token_if_missing(&request.config_dir)?;
    Ok(EnrollOutcome {
        key_file,
        key_created,
        certificate_file,
        config_file,
        arp_token_file,
        server_keys: pinned.into_iter().map(|k| k.kid).collect(),
    })
}

/// POSTs the enrollment; the server's answer when it enrolled us (201).
async fn post_enrollment(request: &EnrollRequest, body: &Value) -> Result<Value, EnrollError> {
    let url = format!("{}/v1/enroll", config::http_base_url(&request.server));
    let mut client = reqwest::Client::builder().timeout(std::time::Duration::from_secs(30));
    if let Some(ca) = &request.ca_file {
        for cert in read_ca(ca)? {
            client = client.add_root_certificate(cert);
        }
    }
    let client = client.build().map_err(|source| EnrollError::Http {
        url: url.clone(),
        source,
    })?;
    let response = client
        .post(&url)
        .json(body)
        .send()
        .await
        .map_err(|source| EnrollError::Http {
            url: url.clone(),
            source,
        })?;
    let status = response.status().as_u16();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    if status != 201 {
        let message = answer
            .get("message")
            .and_then(Value::as_str)
            .or_else(|| answer.get("error").and_then(Value::as_str))
            .unwrap_or("no details")
            .to_owned();
        return Err(EnrollError::Rejected { status, message });
    }
    Ok(answer)
}

/// The certificate the server issued for our CSR, written; without a CSR,
/// a leftover certificate is moved aside.
fn keep_certificate(
    request: &EnrollRequest,
    answer: &Value,
) -> Result<Option<PathBuf>, EnrollError> {
    let cert_path = request.config_dir.join(CERT_FILE);
    if request.csr {
        let chain = answer
            .get("certificate")
            .and_then(Value::as_str)
            .ok_or(EnrollError::NoCertificate)?;
        write(&cert_path, chain.as_bytes())?;
        return Ok(Some(cert_path));
    }
    // The server now knows the bare key; a leftover certificate would be
    // presented at login and could be refused, so move it out of the way.
    if cert_path.exists() {
        let old = cert_path.with_extension("crt.old");
        std::fs::rename(&cert_path, &old)
            .map_err(|source| EnrollError::Write { path: old, source })?;
    }
    Ok(None)
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), EnrollError> {
    fsutil::write_atomic(path, bytes).map_err(|source| EnrollError::Write {
        path: path.to_owned(),
        source,
    })
}

/// A first `agent.toml`, so that `robot-agent run` works without flags.
fn write_config_if_missing(
    dir: &Path,
    server: &str,
    robot_id: &str,
) -> Result<Option<PathBuf>, EnrollError> {
    let path = dir.join(CONFIG_FILE);
    if path.exists() {
        return Ok(None);
    }
    let text = format!(
        "# Written by `robot-agent enroll`; see docs/robot-agent.md for every key.\n\
         server = {}\nrobot_id = {}\n# driver = \"sim\"   # or exec:COMMAND, rosbridge:WS_URL, serial:DEVICE[@BAUD]\n",
        toml_string(&config::websocket_url(server)),
        toml_string(robot_id),
    );
    write(&path, text.as_bytes())?;
    Ok(Some(path))
}

/// The local ARP socket's operator token (`--arp-listen` uses it): 256
/// random bits, mode 0600. An existing one is kept, so programs holding it
/// keep working after a re-enrollment.
fn write_arp_token_if_missing(dir: &Path) -> Result<Option<PathBuf>, EnrollError> {
    use base64::Engine;
    use ring::rand::SecureRandom;
    let path = dir.join(ARP_TOKEN_FILE);
    if path.exists() {
        return Ok(None);
    }
    let mut secret = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut secret)
        .map_err(|_| EnrollError::Random)?;
    let text = format!(
        "operator:{}\n",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
    );
    fsutil::write_new_private(&path, text.as_bytes()).map_err(|source| EnrollError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(Some(path))
}

fn toml_string(s: &str) -> String {
    // A TOML basic string has JSON's escaping rules for what we write here.
    Value::String(s.to_owned()).to_string()
}

/// Certificates of a PEM bundle, for `reqwest`.
fn read_ca(path: &Path) -> Result<Vec<reqwest::Certificate>, EnrollError> {
    let err = |message: String| EnrollError::CaFile {
        path: path.to_owned(),
        message,
    };
    let text = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&text).map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no certificate in file".into()));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A one-shot HTTP server: returns the request body it got, answers
    /// `status` with `answer`.
    async fn fake_server(status: u16, answer: Value) -> (String, tokio::task::JoinHandle<Value>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.expect("accept");
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let body = loop {
                let n = tcp.read(&mut chunk).await.expect("read");
                assert!(n > 0, "request ended early");
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    assert!(head.starts_with("POST /v1/enroll "), "{head}");
                    let length: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().expect("length"))
                        })
                        .expect("content-length");
                    if body.len() >= length {
                        break body[..length].to_owned();
                    }
                }
            };
            let payload = answer.to_string();
            let response = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{payload}",
                payload.len()
            );
            tcp.write_all(response.as_bytes()).await.expect("write");
            serde_json::from_str(&body).expect("JSON body")
        });
        (url, task)
    }

    fn request(server: String, dir: &Path, csr: bool) -> EnrollRequest {
        EnrollRequest {
            server,
            robot_id: "robot-7".into(),
            token: "tok".into(),
            key_type: KeyType::P256,
            csr,
            config_dir: dir.to_owned(),
            ca_file: None,
        }
    }

    #[tokio::test]
    async fn key_enrollment_sends_the_public_key_and_writes_a_config() {
        let dir = crate::testutil::temp_dir("enroll");
        let (url, server) = fake_server(201, json!({"robotId": "robot-7", "enrolled": true})).await;
        let outcome = enroll(&request(url.clone(), &dir, false))
            .await
            .expect("enrolls");
        let body = server.await.expect("server");
        assert_eq!(body["robotId"], "robot-7");
        assert_eq!(body["enrollmentToken"], "tok");
        assert!(body["publicKey"]
            .as_str()
            .expect("key")
            .starts_with("-----BEGIN PUBLIC KEY-----"));
        assert!(outcome.key_created);
        let config = std::fs::read_to_string(dir.join(CONFIG_FILE)).expect("config");
        assert!(config.contains(&format!("server = \"{}\"", config::websocket_url(&url))));
        assert!(config.contains("robot_id = \"robot-7\""));
    }

    /// Issue 41 #2: the local ARP socket has a token from the start: 256
    /// random bits, 0600, kept across re-enrollments.
    #[tokio::test]
    async fn enrollment_writes_a_private_random_arp_token_once() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::testutil::temp_dir("enroll-arp-token");
        let (url, _server) = fake_server(201, json!({"robotId": "robot-7"})).await;
        let outcome = enroll(&request(url, &dir, false)).await.expect("enrolls");
        let path = dir.join(ARP_TOKEN_FILE);
        assert_eq!(outcome.arp_token_file.as_deref(), Some(path.as_path()));
        let tokens = config::read_token_file(&path).expect("a token file run reads");
        assert_eq!(tokens.len(), 1);
        assert_eq!(tokens[0].role, crate::safety::Role::Operator);
        assert!(tokens[0].secret.len() >= 43, "256 bits in base64url");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let first = std::fs::read_to_string(&path).expect("read");

        let again = crate::testutil::temp_dir("enroll-arp-token-2");
        let (url, _server) = fake_server(201, json!({"robotId": "robot-7"})).await;
        enroll(&request(url.clone(), &again, false))
            .await
            .expect("enrolls");
        let other = std::fs::read_to_string(again.join(ARP_TOKEN_FILE)).expect("read");
        assert_ne!(first, other, "random per robot");
        let (url, _server) = fake_server(201, json!({"robotId": "robot-7"})).await;
        let outcome = enroll(&request(url, &dir, false))
            .await
            .expect("re-enrolls");
        assert_eq!(outcome.arp_token_file, None);
        assert_eq!(std::fs::read_to_string(&path).expect("read"), first, "kept");
    }

    #[tokio::test]
    async fn csr_enrollment_stores_the_certificate_privately() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::testutil::temp_dir("enroll-csr");
        let chain = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let (url, server) = fake_server(
            201,
            json!({"robotId": "robot-7", "enrolled": true, "certificate": chain}),
        )
        .await;
        let outcome = enroll(&request(url, &dir, true)).await.expect("enrolls");
        let body = server.await.expect("server");
        assert!(body["csr"]
            .as_str()
            .expect("csr")
            .contains("CERTIFICATE REQUEST"));
        assert!(body.get("publicKey").is_none());
        let cert = outcome.certificate_file.expect("certificate written");
        assert_eq!(std::fs::read_to_string(&cert).expect("read"), chain);
        let mode = std::fs::metadata(&cert).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[tokio::test]
    async fn the_servers_signing_keys_are_pinned_and_an_older_server_pins_none() {
        // RFC 8037's example key and its RFC 7638 thumbprint.
        let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
        let kid = "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k";
        let dir = crate::testutil::temp_dir("enroll-keys");
        let jwks = json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "use": "sig", "alg": "EdDSA"}]});
        let (url, _server) = fake_server(
            201,
            json!({"robotId": "robot-7", "enrolled": true, "signingKeys": jwks}),
        )
        .await;
        let outcome = enroll(&request(url, &dir, false)).await.expect("enrolls");
        assert_eq!(outcome.server_keys, vec![kid.to_owned()]);
        let pinned = server_keys::load(&dir.join(SERVER_KEYS_FILE)).expect("pinned");
        assert_eq!(pinned.len(), 1);
        assert_eq!(pinned[0].x, x);

        let older = crate::testutil::temp_dir("enroll-no-keys");
        let (url, _server) =
            fake_server(201, json!({"robotId": "robot-7", "enrolled": true})).await;
        let outcome = enroll(&request(url, &older, false)).await.expect("enrolls");
        assert!(outcome.server_keys.is_empty());
        assert!(!older.join(SERVER_KEYS_FILE).exists());
    }

    #[tokio::test]
    async fn refusals_are_reported() {
        let dir = crate::testutil::temp_dir("enroll-bad");
        let (url, _server) = fake_server(
            401,
            json!({"error": "UNAUTHORIZED", "message": "bad token"}),
        )
        .await;
        match enroll(&request(url, &dir, false)).await {
            Err(EnrollError::Rejected { status, message }) => {
                assert_eq!(status, 401);
                assert_eq!(message, "bad token");
            }
            other => panic!("unexpected {other:?}"),
        }
        // The key stays for the next attempt.
        assert!(dir.join(KEY_FILE).exists());
    }
}
