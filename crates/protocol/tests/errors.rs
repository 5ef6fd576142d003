//! Rejection of malformed messages, each with the spec code a receiver
//! would answer with.

use serde_json::json;
use signalling_protocol::{
    is_legacy_ready, Agent, Body, Envelope, ErrorCode, MovementPayload, ProtocolError,
};

fn message(overrides: serde_json::Value) -> String {
    let mut base = json!({
        "type": "signalling.ping",
        "version": "0.5",
        "id": "m-1",
        "timestamp": "2026-01-06T12:00:00Z"
    });
    for (k, v) in overrides.as_object().expect("object").clone() {
        if v.is_null() {
            base.as_object_mut().expect("object").remove(&k);
        } else {
            base[k] = v;
        }
    }
    base.to_string()
}

fn parse_err(text: &str) -> ProtocolError {
    Envelope::parse(text).expect_err("must be rejected")
}

fn body_err(overrides: serde_json::Value) -> ProtocolError {
    Envelope::parse(&message(overrides))
        .expect("envelope is fine")
        .body()
        .expect_err("body must be rejected")
}

#[test]
fn not_json_is_invalid_message() {
    let err = parse_err("{\"type\": ");
    assert!(matches!(err, ProtocolError::InvalidMessage(_)), "{err:?}");
    assert_eq!(err.code(), ErrorCode::InvalidMessage);
    assert_eq!(err.code().as_str(), "INVALID_MESSAGE");
}

#[test]
fn non_object_or_typeless_is_invalid_message() {
    for text in [
        "[1,2]",
        "\"hello\"",
        "{}",
        r#"{"type": 7, "version": "0.5"}"#,
    ] {
        let err = parse_err(text);
        assert!(
            matches!(err, ProtocolError::InvalidMessage(_)),
            "{text}: {err:?}"
        );
    }
}

#[test]
fn missing_or_non_string_header_fields_fail_validation_naming_the_field() {
    for field in ["id", "version", "timestamp"] {
        let err = parse_err(&message(json!({ field: null })));
        match &err {
            ProtocolError::ValidationFailed(msg) => assert!(msg.contains(field), "{msg}"),
            other => panic!("{field}: {other:?}"),
        }
        assert_eq!(err.code(), ErrorCode::ValidationFailed);

        let err = parse_err(&message(json!({ field: 5 })));
        match &err {
            ProtocolError::ValidationFailed(msg) => assert!(msg.contains(field), "{msg}"),
            other => panic!("{field}: {other:?}"),
        }
    }
    let err = parse_err(&message(json!({ "correlationId": 1 })));
    assert!(matches!(err, ProtocolError::ValidationFailed(_)), "{err:?}");
    let err = parse_err(&message(json!({ "meta": [] })));
    assert!(matches!(err, ProtocolError::ValidationFailed(_)), "{err:?}");
}

#[test]
fn other_major_version_is_unsupported() {
    let err = parse_err(&message(json!({ "version": "1.0" })));
    assert_eq!(
        err,
        ProtocolError::UnsupportedVersion("1.0 (supported: 0.x)".into())
    );
    assert_eq!(err.code(), ErrorCode::UnsupportedVersion);
    // A later minor of major 0 is still understood.
    assert!(Envelope::parse(&message(json!({ "version": "0.9" }))).is_ok());
}

#[test]
fn malformed_version_fails_validation() {
    for version in ["1", "0.5.1", "v0.5", "0.", ".5", "0.x", ""] {
        let err = parse_err(&message(json!({ "version": version })));
        assert!(
            matches!(err, ProtocolError::ValidationFailed(_)),
            "{version}: {err:?}"
        );
    }
}

#[test]
fn non_rfc3339_timestamp_fails_validation() {
    for ts in [
        "yesterday",
        "2026-01-06 12:00:00",
        "2026-01-06T12:00:00",
        "1767700800",
    ] {
        let err = parse_err(&message(json!({ "timestamp": ts })));
        assert!(
            matches!(err, ProtocolError::ValidationFailed(_)),
            "{ts}: {err:?}"
        );
    }
    for ts in ["2026-01-06T12:00:00.123Z", "2026-01-06T13:00:00+01:00"] {
        assert!(
            Envelope::parse(&message(json!({ "timestamp": ts }))).is_ok(),
            "{ts}"
        );
    }
}

#[test]
fn non_object_payload_is_invalid_payload() {
    let err = parse_err(&message(json!({ "payload": [1] })));
    assert!(matches!(err, ProtocolError::InvalidPayload(_)), "{err:?}");
    assert_eq!(err.code(), ErrorCode::InvalidPayload);
}

#[test]
fn unknown_top_level_fields_are_ignored_and_dropped() {
    let env = Envelope::parse(&message(json!({ "extra": true }))).expect("lenient");
    assert_eq!(env.kind, "signalling.ping");
    assert!(!env.to_json().contains("extra"), "{}", env.to_json());
}

#[test]
fn unknown_type_is_unsupported() {
    let err = body_err(json!({ "type": "signalling.teleport" }));
    assert_eq!(
        err,
        ProtocolError::UnsupportedType("signalling.teleport".into())
    );
    assert_eq!(err.code(), ErrorCode::UnsupportedMessageType);
}

#[test]
fn payload_with_unknown_field_is_invalid_payload() {
    let err = body_err(json!({
        "type": "agent.movement",
        "payload": { "forward": 0.5, "turn": 0.0, "boost": true }
    }));
    match err {
        ProtocolError::InvalidPayload(msg) => assert!(msg.contains("boost"), "{msg}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn missing_required_payload_or_field_is_invalid_payload() {
    let err = body_err(json!({ "type": "signalling.offer" }));
    assert!(matches!(err, ProtocolError::InvalidPayload(_)), "{err:?}");
    let err = body_err(json!({
        "type": "signalling.offer",
        "payload": { "robotId": "r", "connectionId": "c", "sdpType": "answer", "sdp": "v=0" }
    }));
    assert!(matches!(err, ProtocolError::InvalidPayload(_)), "{err:?}");
    let err = body_err(json!({
        "type": "agent.config.update",
        "correlationId": "r-1",
        "payload": { "key": "image_format" }
    }));
    match err {
        ProtocolError::InvalidPayload(msg) => assert!(msg.contains("value"), "{msg}"),
        other => panic!("{other:?}"),
    }
    // location.list needs an object, and an empty one.
    let err = body_err(json!({ "type": "agent.location.list" }));
    assert!(matches!(err, ProtocolError::InvalidPayload(_)), "{err:?}");
    let err = body_err(json!({ "type": "agent.location.list", "payload": { "all": true } }));
    assert!(matches!(err, ProtocolError::InvalidPayload(_)), "{err:?}");
}

#[test]
fn closed_enums_reject_other_values() {
    let cases = [
        json!({ "type": "signalling.disconnected",
                "payload": { "connectionId": "c", "reason": "bored" } }),
        json!({ "type": "signalling.connected",
                "payload": { "connectionId": "c", "iceConnectionState": "new" } }),
        json!({ "type": "agent.navigation.response", "correlationId": "x",
                "payload": { "status": "paused", "name": "dock" } }),
        json!({ "type": "agent.location.response", "correlationId": "x",
                "payload": { "operation": "rename" } }),
        json!({ "type": "agent.error",
                "payload": { "code": "NOT_A_CODE", "message": "m" } }),
    ];
    for case in cases {
        let err = body_err(case.clone());
        assert!(
            matches!(err, ProtocolError::InvalidPayload(_)),
            "{case}: {err:?}"
        );
    }
}

#[test]
fn error_code_must_belong_to_the_message_family() {
    let err = body_err(json!({ "type": "agent.error",
                               "payload": { "code": "ICE_FAILED", "message": "m" } }));
    assert!(matches!(err, ProtocolError::InvalidPayload(_)), "{err:?}");
    let err = body_err(json!({ "type": "signalling.error",
                               "payload": { "code": "LOCATION_NOT_FOUND", "message": "m" } }));
    assert!(matches!(err, ProtocolError::InvalidPayload(_)), "{err:?}");
}

#[test]
fn movement_out_of_range_is_invalid_payload() {
    let movement = MovementPayload {
        forward: 1.5,
        turn: 0.0,
    };
    let err = movement.validate().expect_err("1.5 is out of range");
    assert!(matches!(err, ProtocolError::InvalidPayload(_)), "{err:?}");
    assert_eq!(err.code(), ErrorCode::InvalidPayload);

    for (forward, turn) in [(0.0, -1.0001), (f64::NAN, 0.0), (0.0, f64::INFINITY)] {
        let m = MovementPayload { forward, turn };
        assert!(m.validate().is_err(), "{forward} {turn}");
    }
    assert!(MovementPayload {
        forward: -1.0,
        turn: 1.0
    }
    .validate()
    .is_ok());

    // body() applies the same check to incoming messages.
    let err = body_err(json!({ "type": "agent.movement",
                               "payload": { "forward": 1.5, "turn": 0.0 } }));
    assert!(matches!(err, ProtocolError::InvalidPayload(_)), "{err:?}");
    assert!(Body::Agent(Agent::Movement(movement)).validate().is_err());
}

#[test]
fn location_list_response_requires_locations() {
    let err = body_err(
        json!({ "type": "agent.location.response", "correlationId": "x",
                               "payload": { "operation": "list" } }),
    );
    assert!(matches!(err, ProtocolError::InvalidPayload(_)), "{err:?}");
    let ok = Envelope::parse(&message(json!({ "type": "agent.location.response",
        "correlationId": "x", "payload": { "operation": "delete" } })))
    .expect("parses")
    .body();
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn capability_versions_must_be_major_minor() {
    let err = body_err(json!({ "type": "agent.capabilities",
                               "payload": { "versions": ["0.1", "latest"] } }));
    match err {
        ProtocolError::InvalidPayload(msg) => assert!(msg.contains("latest"), "{msg}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn replies_without_correlation_id_fail_validation() {
    let err = body_err(json!({ "type": "signalling.pki_response",
                               "payload": { "signature": "c2ln" } }));
    match &err {
        ProtocolError::ValidationFailed(msg) => assert!(msg.contains("correlationId"), "{msg}"),
        other => panic!("{other:?}"),
    }
    for kind in [
        "signalling.pki_verified",
        "signalling.pong",
        "agent.pong",
        "agent.location.response",
        "agent.navigation.response",
        "agent.config.update",
        "agent.config.response",
        "agent.config.get",
        "agent.config.get.response",
    ] {
        let err = body_err(json!({ "type": kind }));
        assert!(
            matches!(err, ProtocolError::ValidationFailed(_)),
            "{kind}: {err:?}"
        );
    }
    // Requests that do not need one.
    let ok = Envelope::parse(&message(json!({ "type": "agent.ping" }))).expect("parses");
    assert_eq!(ok.body(), Ok(Body::Agent(Agent::Ping)));
}

#[test]
fn error_codes_serialise_as_screaming_snake_and_split_by_family() {
    for code in ErrorCode::ALL {
        let wire = serde_json::to_value(code).expect("serialises");
        assert_eq!(wire, json!(code.as_str()));
        let back: ErrorCode = serde_json::from_value(wire).expect("deserialises");
        assert_eq!(back, *code);
        assert!(code.is_signalling() || code.is_agent(), "{code}");
    }
    assert_eq!(
        ErrorCode::ALL.iter().filter(|c| c.is_signalling()).count(),
        13
    );
    assert_eq!(ErrorCode::ALL.iter().filter(|c| c.is_agent()).count(), 15);
    assert!(ErrorCode::LocationStorageFull.is_agent());
    assert!(!ErrorCode::LocationStorageFull.is_signalling());
    assert!(ErrorCode::SdpInvalid.is_signalling() && !ErrorCode::SdpInvalid.is_agent());
    assert_eq!(
        ErrorCode::UnsupportedMessageType.as_str(),
        "UNSUPPORTED_MESSAGE_TYPE"
    );
}

#[test]
fn legacy_ready_is_recognised() {
    assert!(is_legacy_ready(r#"{"type":"ready"}"#));
    assert!(is_legacy_ready(r#"{"type":"ready","robotId":"r1"}"#));
    assert!(!is_legacy_ready(r#"{"type":"signalling.ping"}"#));
    assert!(!is_legacy_ready(r#"["ready"]"#));
    assert!(!is_legacy_ready("ready"));
}
