//! Signed replies: sign and verify with both key types, what breaks a signature and what
//! does not, and a session's replies signed as they leave.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use signalling_protocol::ErrorCode;

use super::*;
use crate::controller;
use crate::driver::{DriverEnd, DriverEvent, DriverHandle};
use crate::identity::KeyType;
use crate::locations::LocationStore;
use crate::messages;
use crate::safety::{Role, SafetyLimits};
use crate::session::{Metrics, Session, Shared};
use crate::settings::Settings;
use crate::testutil::{client_now_ms, rfc3339_ms, validated, WAIT};
use crate::video::CameraStatus;

const ROBOT: &str = "robot-7";

fn signer(kind: KeyType) -> ReplySigner {
    let key = RobotKey::generate(kind).expect("key");
    ReplySigner::new(&key, ROBOT).expect("signer")
}

/// Messages of several shapes: meta already in use, no meta, floats and nested objects.
fn samples() -> Vec<Envelope> {
    let camera = CameraStatus {
        name: "front".into(),
        source: "exec",
        codec: "vp8",
        available: true,
        error: None,
    };
    vec![
        messages::capabilities(&[camera]),
        messages::pong("req-1"),
        messages::error(
            ErrorCode::MovementFailed,
            "stale command refused",
            Some(messages::details(
                "stale",
                &[("cause", json!("age")), ("limitMs", json!(1.5))],
            )),
            Some("req-2"),
        ),
    ]
}

fn header_of(envelope: &Envelope) -> Value {
    let jws = envelope.meta.as_ref().expect("meta")[SIGNATURE_META_KEY]
        .as_str()
        .expect("a string")
        .to_owned();
    let (header, _) = jws.split_once("..").expect("detached");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).expect("base64url")).expect("JSON")
}

#[test]
fn both_key_types_sign_and_verify() {
    for (kind, alg, sig_len) in [
        (KeyType::Ed25519, "EdDSA", 64),
        (KeyType::P256, "ES256", 64),
    ] {
        let signer = signer(kind);
        assert_eq!(signer.alg(), alg);
        for mut envelope in samples() {
            let before = envelope.clone();
            signer.sign(&mut envelope).expect("sign");
            assert_eq!(header_of(&envelope), json!({ "alg": alg, "kid": ROBOT }));
            let jws = envelope.meta.as_ref().expect("meta")[SIGNATURE_META_KEY]
                .as_str()
                .expect("string")
                .to_owned();
            let signature = URL_SAFE_NO_PAD
                .decode(jws.split_once("..").expect("detached").1)
                .expect("base64url");
            // ES256 as JWS wants it: r||s, not DER.
            assert_eq!(signature.len(), sig_len, "{alg}");
            // The signature is all that was added.
            assert_eq!(signed_content(&envelope), signed_content(&before));
            let header = verify(&envelope, &signer.jwk()).expect("verifies");
            assert_eq!(header.kid, ROBOT);
            // And it still is a spec message: `meta` is open in the envelope schema.
            validated(&envelope);
            // What the client gets is the text: parsed back, it still verifies.
            let received = Envelope::parse(&envelope.to_json()).expect("parses");
            verify(&received, &signer.jwk()).expect("verifies after the wire");
        }
    }
}

#[test]
fn a_message_without_meta_gets_one_and_loses_it_in_the_signed_content() {
    let signer = signer(KeyType::Ed25519);
    let mut pong = messages::pong("req-1");
    assert!(pong.meta.is_none());
    signer.sign(&mut pong).expect("sign");
    let meta = pong.meta.as_ref().expect("meta");
    assert_eq!(meta.len(), 1);
    assert!(!signed_content(&pong).contains("meta"));
}

#[test]
fn tampering_is_refused() {
    for kind in [KeyType::Ed25519, KeyType::P256] {
        let signer = signer(kind);
        let jwk = signer.jwk();
        let mut original = samples().remove(2);
        signer.sign(&mut original).expect("sign");

        let mut payload = original.clone();
        payload.payload.as_mut().expect("payload")["details"]["limitMs"] = json!(15);
        assert!(matches!(
            verify(&payload, &jwk),
            Err(ReplySigningError::BadSignature)
        ));

        let mut correlation = original.clone();
        correlation.correlation_id = Some("req-3".into());
        assert!(matches!(
            verify(&correlation, &jwk),
            Err(ReplySigningError::BadSignature)
        ));

        let mut meta = original.clone();
        meta.meta
            .as_mut()
            .expect("meta")
            .insert("injected".into(), json!(true));
        assert!(matches!(
            verify(&meta, &jwk),
            Err(ReplySigningError::BadSignature)
        ));

        let mut unsigned = original.clone();
        unsigned.meta = None;
        assert!(matches!(
            verify(&unsigned, &jwk),
            Err(ReplySigningError::Missing)
        ));

        let mut garbage = original.clone();
        garbage
            .meta
            .as_mut()
            .expect("meta")
            .insert(SIGNATURE_META_KEY.into(), json!("e30.e30.AAAA"));
        assert!(matches!(
            verify(&garbage, &jwk),
            Err(ReplySigningError::Malformed(_))
        ));

        // Another robot's key, of the same type.
        let other = self::signer(kind).jwk();
        assert!(matches!(
            verify(&original, &other),
            Err(ReplySigningError::BadSignature)
        ));
    }
}

#[test]
fn the_algorithm_is_the_keys_not_the_messages() {
    let ed = signer(KeyType::Ed25519);
    let mut message = messages::pong("req-1");
    ed.sign(&mut message).expect("sign");
    // Checked against a P-256 key, an EdDSA header is refused before any verification.
    let p256 = signer(KeyType::P256).jwk();
    assert!(matches!(
        verify(&message, &p256),
        Err(ReplySigningError::Algorithm(a)) if a == "EdDSA"
    ));
    // A header rewritten to another alg breaks the signature (the header is signed too).
    let jws = message.meta.as_ref().expect("meta")[SIGNATURE_META_KEY]
        .as_str()
        .expect("string")
        .to_owned();
    let forged_header = URL_SAFE_NO_PAD.encode(r#"{"alg":"EdDSA","kid":"robot-8"}"#);
    let forged = format!("{forged_header}..{}", jws.split_once("..").expect("jws").1);
    message
        .meta
        .as_mut()
        .expect("meta")
        .insert(SIGNATURE_META_KEY.into(), json!(forged));
    assert!(matches!(
        verify(&message, &ed.jwk()),
        Err(ReplySigningError::BadSignature)
    ));
}

#[test]
fn the_canonical_form_ignores_key_order_and_whitespace() {
    let signer = signer(KeyType::P256);
    let mut message = samples().remove(2);
    signer.sign(&mut message).expect("sign");
    // The same message as another program might write it: keys in another order at
    // every depth, spaces and newlines.
    let value: Value = serde_json::from_str(&message.to_json()).expect("JSON");
    let mut reordered = String::from("{\n");
    let object = value.as_object().expect("object");
    let mut keys: Vec<&String> = object.keys().collect();
    keys.sort();
    keys.reverse();
    for (i, key) in keys.iter().enumerate() {
        let inner = reverse_keys(&object[*key]);
        reordered.push_str(&format!(
            "{}  {:?} : {}",
            if i > 0 { ",\n" } else { "" },
            key,
            inner
        ));
    }
    reordered.push_str("\n}");
    assert_ne!(reordered, message.to_json());
    let received = Envelope::parse(&reordered).expect("parses");
    assert_eq!(signed_content(&received), signed_content(&message));
    verify(&received, &signer.jwk()).expect("verifies whatever the key order");
}

/// JSON text of `value` with every object's keys in reverse order.
fn reverse_keys(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            keys.reverse();
            let fields: Vec<String> = keys
                .iter()
                .map(|k| format!("{:?}: {}", k, reverse_keys(&map[*k])))
                .collect();
            format!("{{ {} }}", fields.join(", "))
        }
        Value::Array(items) => format!(
            "[{}]",
            items
                .iter()
                .map(reverse_keys)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

#[test]
fn jwks_carry_the_enrolled_key() {
    let ed = RobotKey::generate(KeyType::Ed25519).expect("key");
    let jwk = ReplySigner::new(&ed, ROBOT).expect("signer").jwk();
    assert_eq!(jwk["kty"], "OKP");
    assert_eq!(jwk["crv"], "Ed25519");
    let x = URL_SAFE_NO_PAD
        .decode(jwk["x"].as_str().expect("x"))
        .expect("base64url");
    assert_eq!(
        base64::engine::general_purpose::STANDARD.encode(x),
        ed.enrollment_public_key()
    );

    let p256 = RobotKey::generate(KeyType::P256).expect("key");
    let jwk = ReplySigner::new(&p256, ROBOT).expect("signer").jwk();
    assert_eq!(
        (jwk["kty"].as_str(), jwk["crv"].as_str()),
        (Some("EC"), Some("P-256"))
    );
    let spki = pem::parse(p256.enrollment_public_key()).expect("PEM");
    let point = &spki.contents()[26..];
    let mut from_jwk = vec![4u8];
    for c in ["x", "y"] {
        from_jwk.extend(
            URL_SAFE_NO_PAD
                .decode(jwk[c].as_str().expect("coordinate"))
                .expect("base64url"),
        );
    }
    assert_eq!(from_jwk, point);
}

/// A session whose replies are signed, as `run` wires it with `sign_replies = true`.
async fn signing_session(kind: KeyType, sign: bool) -> (Session, RobotKey, DriverEnd) {
    let key = RobotKey::generate(kind).expect("key");
    let signer = ReplySigner::new(&key, ROBOT).expect("signer");
    let limits = SafetyLimits::default();
    let (driver, end) = DriverHandle::channel();
    end.events.send(DriverEvent::Ready).await.expect("ready");
    let shared = Shared {
        controller: controller::spawn(limits.clone(), driver),
        locations: Arc::new(Mutex::new(LocationStore::in_memory(3))),
        settings: Arc::new(Mutex::new(Settings::defaults(&limits))),
        base_limits: limits,
        metrics: Arc::new(Metrics::default()),
        reply_signer: sign.then(|| Arc::new(signer)),
    };
    (Session::new("s1", Role::Operator, shared), key, end)
}

#[tokio::test]
async fn a_sessions_replies_verify_against_the_robots_key() {
    for kind in [KeyType::Ed25519, KeyType::P256] {
        let (mut session, key, _driver) = signing_session(kind, true).await;
        // The key a client gets from the server: the enrolled public key, as a JWK.
        let jwk = public_key_jwk(&key);
        for (kind, payload) in [
            ("agent.ping", None),
            ("agent.config.get", None),
            ("agent.location.list", None),
            ("agent.navigation.start", Some(json!({ "name": "nowhere" }))),
        ] {
            let mut request = json!({
                "type": kind,
                "version": "0.5",
                "id": format!("req-{kind}"),
                "timestamp": rfc3339_ms(client_now_ms()),
            });
            if let Some(p) = payload {
                request["payload"] = p;
            }
            let replies = tokio::time::timeout(WAIT, session.handle_text(&request.to_string()))
                .await
                .expect("answers");
            assert_eq!(replies.len(), 1, "{kind}: {replies:?}");
            let mut reply = replies.into_iter().next().expect("reply");
            assert!(reply.kind.starts_with("agent."));
            session.sign(&mut reply);
            let text = reply.to_json();
            let received = Envelope::parse(&text).expect("parses");
            let header = verify(&received, &jwk).expect("a signed reply verifies");
            assert_eq!(header.kid, ROBOT);
            validated(&received);
        }
    }
}

#[tokio::test]
async fn without_sign_replies_nothing_is_added() {
    let (mut session, _, _driver) = signing_session(KeyType::Ed25519, false).await;
    let request = json!({
        "type": "agent.ping",
        "version": "0.5",
        "id": "req-1",
        "timestamp": rfc3339_ms(client_now_ms()),
    });
    let mut replies = session.handle_text(&request.to_string()).await;
    assert_eq!(replies.len(), 1);
    session.sign(&mut replies[0]);
    assert!(replies[0].meta.is_none());
}

/// The enrolled public key (the form `POST /v1/enroll` took) as the JWK the server serves.
fn public_key_jwk(key: &RobotKey) -> Value {
    let enrolled = key.enrollment_public_key();
    let raw = match pem::parse(&enrolled) {
        Ok(spki) => spki.contents()[26..].to_vec(),
        Err(_) => base64::engine::general_purpose::STANDARD
            .decode(enrolled)
            .expect("base64"),
    };
    public_jwk(&raw)
}

#[test]
fn sign_replies_is_off_unless_the_config_file_says_so() {
    let key = RobotKey::generate(KeyType::P256).expect("key");
    // As `agent::run` wires it.
    let configured = |config: &crate::config::RunConfig, key: &RobotKey| {
        ReplySigner::configured(config.sign_replies, &config.robot_id, key)
    };
    let resolve = |toml: &str| {
        let dir = crate::testutil::temp_dir("sign-replies");
        std::fs::write(
            dir.join(crate::config::CONFIG_FILE),
            format!(
                "server = \"ws://127.0.0.1:1/ws\"\nrobot_id = \"r1\"\ndriver = \"sim\"\n{toml}"
            ),
        )
        .expect("write");
        crate::config::RunConfig::resolve(crate::config::RunFlags {
            config_dir: Some(dir),
            ..Default::default()
        })
        .expect("config")
    };
    assert!(configured(&resolve(""), &key).expect("ok").is_none());
    let off = resolve("sign_replies = false\n");
    assert!(configured(&off, &key).expect("ok").is_none());
    let on = resolve("sign_replies = true\n");
    let signer = configured(&on, &key).expect("ok").expect("a signer");
    assert_eq!(signer.alg(), "ES256");
    let mut pong = messages::pong("req-1");
    signer.sign(&mut pong).expect("sign");
    assert_eq!(verify(&pong, &signer.jwk()).expect("verifies").kid, "r1");
}

/// The SDK's tests check replies signed by this module (clients/js/test/fixtures, made by
/// `examples/signed_replies.rs`): they must still verify here, against the key served
/// with them, so the fixture cannot drift from what the agent signs.
#[test]
fn the_sdks_fixture_still_verifies() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../clients/js/test/fixtures/signed-replies.json"
    );
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the fixture")).expect("JSON");
    let robots = fixture["robots"].as_array().expect("robots");
    let mut algs: Vec<&str> = Vec::new();
    for robot in robots {
        let key = &robot["key"];
        let robot_id = key["robotId"].as_str().expect("robotId");
        let messages = robot["messages"].as_array().expect("messages");
        assert!(messages.len() >= 5, "{robot_id}");
        for text in messages {
            let text = text.as_str().expect("the text sent");
            let envelope = Envelope::parse(text).expect("an envelope");
            assert!(envelope.kind.starts_with("agent."));
            let header = verify(&envelope, &key["jwk"])
                .unwrap_or_else(|e| panic!("{robot_id}: {e}: {text}"));
            assert_eq!(header.kid, robot_id);
            assert_eq!(header.alg, key["jwk"]["alg"].as_str().expect("alg"));
            // The same text this module sends for that message (serde_json's form).
            assert_eq!(envelope.to_json(), text);
            algs.push(key["jwk"]["alg"].as_str().expect("alg"));
        }
        let nonce = robot["arp"]["nonce"].as_str().expect("arp.nonce");
        let frames = robot["arp"]["frames"].as_array().expect("arp.frames");
        assert!(frames.len() >= 4, "{robot_id}");
        for text in frames {
            let text = text.as_str().expect("the frame text");
            let frame: Value = serde_json::from_str(text).expect("JSON");
            let header = verify_arp_frame(&frame, &key["jwk"], nonce)
                .unwrap_or_else(|e| panic!("{robot_id}: {e}: {text}"));
            assert_eq!(header.kid, robot_id);
        }
    }
    algs.dedup();
    assert_eq!(algs, ["EdDSA", "ES256"]);
}

/// ARP frames of several shapes, as the robot answers through the gateway.
fn arp_samples() -> Vec<Value> {
    vec![
        json!({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": "0.1.0",
            "serverInfo": {"name": "robot-agent", "version": "0.1.0"}, "capabilities": {}}}),
        json!({"jsonrpc": "2.0", "id": "c-7", "result": {"callId": "call-1", "state": "completed",
            "result": {"x": 1.0, "tiny": 1e-7, "huge": 1e21, "label": "dock é \"A\" 😀"}}}),
        json!({"jsonrpc": "2.0", "method": "arp.toolProgress",
            "params": {"callId": "call-1", "progress": 0.5}}),
        json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -40003,
            "message": "speed over the limit", "data": {"reason": "safety"}}}),
    ]
}

/// `frame` with the signature `signer` makes, as the program receives it.
fn signed_frame(signer: &ArpFrameSigner, frame: &Value) -> Value {
    let mut signed = frame.clone();
    signed[signalling_protocol::arp::FRAME_SIGNATURE_KEY] =
        json!(signer.sign(frame).expect("sign"));
    signed
}

#[test]
fn arp_frames_are_signed_for_one_nonce_with_both_key_types() {
    const NONCE: &str = "n0nce-of-the-program_1";
    for kind in [KeyType::Ed25519, KeyType::P256] {
        let robot = Arc::new(signer(kind));
        let jwk = robot.jwk();
        let signer = robot.for_arp(NONCE);
        for frame in arp_samples() {
            let signed = signed_frame(&signer, &frame);
            let header = verify_arp_frame(&signed, &jwk, NONCE)
                .unwrap_or_else(|e| panic!("{kind:?}: {e}: {signed}"));
            assert_eq!(header.kid, ROBOT);
            assert_eq!(header.alg, robot.alg());
            assert_eq!(header.nonce.as_deref(), Some(NONCE));
            // Re-encoded with other key order and whitespace, it still verifies.
            let rewritten: Value = serde_json::from_str(&reverse_keys(&signed)).expect("JSON");
            assert!(verify_arp_frame(&rewritten, &jwk, NONCE).is_ok());

            // Signed for another connection's nonce: refused.
            assert!(matches!(
                verify_arp_frame(&signed, &jwk, "another-programs-nonce"),
                Err(ReplySigningError::Nonce)
            ));
            // Unsigned.
            assert!(matches!(
                verify_arp_frame(&frame, &jwk, NONCE),
                Err(ReplySigningError::Missing)
            ));
            // Anything changed.
            let mut tampered = signed.clone();
            tampered["id"] = json!(99);
            assert!(matches!(
                verify_arp_frame(&tampered, &jwk, NONCE),
                Err(ReplySigningError::BadSignature)
            ));
            // Another robot's key of the same type.
            let other = self::signer(kind).jwk();
            assert!(matches!(
                verify_arp_frame(&signed, &other, NONCE),
                Err(ReplySigningError::BadSignature)
            ));
        }
        // The header is signed too: another nonce written into it breaks the signature.
        let signed = signed_frame(&signer, &arp_samples()[1]);
        let jws = signed["signature"].as_str().expect("jws");
        let header = json!({"alg": robot.alg(), "kid": ROBOT, "nonce": "another-programs-nonce"});
        let forged_header = URL_SAFE_NO_PAD.encode(canonical_json(&header));
        let mut forged = signed.clone();
        forged["signature"] = json!(format!(
            "{forged_header}..{}",
            jws.split_once("..").expect("jws").1
        ));
        assert!(matches!(
            verify_arp_frame(&forged, &jwk, "another-programs-nonce"),
            Err(ReplySigningError::BadSignature)
        ));
    }
}

#[test]
fn agent_replies_keep_a_header_without_nonce() {
    let signer = signer(KeyType::Ed25519);
    let mut message = messages::pong("req-1");
    signer.sign(&mut message).expect("sign");
    assert_eq!(header_of(&message), json!({"alg": "EdDSA", "kid": ROBOT}));
}
