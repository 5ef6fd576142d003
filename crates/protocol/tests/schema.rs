//! The bundled JSON Schemas accept the spec's examples and the messages this
//! crate builds, and reject broken ones.
#![cfg(feature = "schema")]

mod common;

use serde_json::{json, Map, Value};
use signalling_protocol::schema::SchemaValidator;
use signalling_protocol::*;

fn validator() -> &'static SchemaValidator {
    SchemaValidator::shared()
}

#[test]
fn every_message_type_has_a_schema() {
    for kind in MESSAGE_TYPES {
        assert!(validator().has_schema(kind), "{kind}");
    }
    assert!(!validator().has_schema("signalling.teleport"));
}

#[test]
fn every_example_validates() {
    let examples = common::examples();
    assert!(!examples.is_empty());
    for (path, text) in examples {
        if let Err(e) = validator().validate_str(&text) {
            panic!("{}: {e}", path.display());
        }
    }
}

#[test]
fn invalid_messages_are_rejected_with_every_error() {
    let bad = json!({
        "type": "agent.movement",
        "version": "0.5",
        "id": "m",
        "timestamp": "not a time",
        "payload": { "forward": 1.5, "turn": 0.0, "extra": 1 }
    });
    let err = validator().validate(&bad).expect_err("invalid");
    assert!(err.contains("/timestamp"), "{err}");
    assert!(err.contains("/payload/forward"), "{err}");
    assert!(err.contains("extra"), "{err}");
    assert!(err.lines().count() >= 3, "{err}");
}

#[test]
fn date_time_format_is_asserted() {
    let msg = json!({
        "type": "signalling.ping", "version": "0.5", "id": "p",
        "timestamp": "2026-13-45T99:00:00Z"
    });
    let err = validator().validate(&msg).expect_err("bad date");
    assert!(err.contains("timestamp"), "{err}");
}

#[test]
fn required_correlation_id_and_unknown_types_are_rejected() {
    let msg = json!({
        "type": "signalling.pki_response", "version": "0.5", "id": "r",
        "timestamp": "2026-01-06T12:00:02Z", "payload": { "signature": "c2ln" }
    });
    let err = validator().validate(&msg).expect_err("needs correlationId");
    assert!(err.contains("correlationId"), "{err}");

    let err = validator()
        .validate(&json!({ "type": "signalling.teleport" }))
        .expect_err("unknown type");
    assert!(err.contains("signalling.teleport"), "{err}");
    assert!(validator().validate(&json!({ "id": "x" })).is_err());
    assert!(validator().validate_str("not json").is_err());
}

#[test]
fn refs_into_common_location_are_resolved() {
    let msg = json!({
        "type": "agent.location.create", "version": "0.5", "id": "l",
        "timestamp": "2026-01-06T12:00:02Z",
        "payload": { "name": "dock", "position": { "x": 1.0 } }
    });
    let err = validator()
        .validate(&msg)
        .expect_err("y is required by location.json");
    assert!(err.contains("\"y\""), "{err}");
}

fn location(name: &str) -> Location {
    Location {
        name: name.into(),
        position: Position {
            x: 1.0,
            y: 2.5,
            z: None,
        },
        orientation: Some(Orientation {
            yaw: Some(0.5),
            pitch: None,
            roll: None,
        }),
        metadata: None,
    }
}

/// Register, welcome, error, capabilities, ping/pong.
#[test]
fn built_signalling_connection_messages_validate() {
    let mut details = Map::new();
    details.insert("iceState".into(), json!("failed"));
    built_messages_validate(vec![
        (
            Signalling::Register(RegisterPayload {
                agent_id: "robot-1".into(),
                capabilities: Some(RegisterCapabilities {
                    video_codecs: Some(vec!["H264".into()]),
                    audio_codecs: None,
                }),
                metadata: None,
            })
            .into(),
            false,
        ),
        (
            Signalling::Welcome(WelcomePayload {
                connection_id: "c".into(),
                ice_servers: Some(vec![IceServer {
                    urls: vec!["stun:stun.example:3478".into()],
                    username: None,
                    credential: None,
                }]),
            })
            .into(),
            false,
        ),
        (
            Signalling::Error(ErrorPayload {
                code: ErrorCode::IceFailed,
                message: "ice failed".into(),
                details: Some(details),
            })
            .into(),
            false,
        ),
        (
            Signalling::Capabilities(CapabilitiesPayload {
                versions: vec!["0.5".into()],
            })
            .into(),
            false,
        ),
        (Signalling::Ping.into(), false),
        (Signalling::Pong.into(), true),
    ]);
}

/// A session's offer, answer, ICE candidates and end.
#[test]
fn built_signalling_session_messages_validate() {
    built_messages_validate(vec![
        (
            Signalling::Offer(OfferPayload {
                robot_id: "robot-1".into(),
                connection_id: "c".into(),
                sdp_type: OfferSdpType::Offer,
                sdp: "v=0".into(),
                ice_restart: Some(true),
            })
            .into(),
            false,
        ),
        (
            Signalling::Answer(AnswerPayload {
                connection_id: "c".into(),
                sdp_type: AnswerSdpType::Answer,
                sdp: "v=0".into(),
            })
            .into(),
            false,
        ),
        (
            Signalling::IceCandidate(IceCandidatePayload {
                connection_id: "c".into(),
                candidate: "candidate:1 1 UDP 1 10.0.0.1 1 typ host".into(),
                sdp_mid: "0".into(),
                sdp_m_line_index: 0,
                username_fragment: None,
            })
            .into(),
            false,
        ),
        (
            Signalling::Disconnected(DisconnectedPayload {
                connection_id: "c".into(),
                reason: DisconnectReason::Closed,
                ice_connection_state: None,
                details: None,
            })
            .into(),
            false,
        ),
    ]);
}

/// The robot login's challenge, response and verification.
#[test]
fn built_signalling_pki_messages_validate() {
    built_messages_validate(vec![
        (
            Signalling::PkiChallenge(PkiChallengePayload {
                challenge: "abc".into(),
            })
            .into(),
            false,
        ),
        (
            Signalling::PkiResponse(PkiResponsePayload {
                signature: "sig".into(),
            })
            .into(),
            true,
        ),
        (
            Signalling::PkiVerified(PkiVerifiedPayload {
                agent_id: "robot-1".into(),
            })
            .into(),
            true,
        ),
    ]);
}

/// Movement, errors and ping/pong between client and robot.
#[test]
fn built_agent_movement_and_error_messages_validate() {
    built_messages_validate(vec![
        (
            Agent::Movement(MovementPayload {
                forward: 0.5,
                turn: -0.5,
            })
            .into(),
            false,
        ),
        (
            Agent::Error(ErrorPayload::new(ErrorCode::LocationStorageFull, "full")).into(),
            false,
        ),
        (Agent::Ping.into(), false),
        (Agent::Pong.into(), true),
    ]);
}

/// Locations and navigation.
#[test]
fn built_agent_location_and_navigation_messages_validate() {
    built_messages_validate(vec![
        (Agent::LocationCreate(location("dock")).into(), false),
        (Agent::LocationList.into(), false),
        (
            Agent::LocationDelete(LocationDeletePayload {
                name: "dock".into(),
            })
            .into(),
            false,
        ),
        (
            Agent::LocationResponse(LocationResponsePayload {
                operation: LocationOperation::List,
                locations: Some(vec![location("a"), location("b")]),
            })
            .into(),
            true,
        ),
        (
            Agent::NavigationStart(NavigationStartPayload {
                name: "dock".into(),
            })
            .into(),
            false,
        ),
        (Agent::NavigationCancel.into(), false),
        (
            Agent::NavigationResponse(NavigationResponsePayload {
                status: NavigationStatus::Failed,
                name: "dock".into(),
                message: Some("blocked".into()),
            })
            .into(),
            true,
        ),
    ]);
}

/// Configuration.
#[test]
fn built_agent_config_messages_validate() {
    let mut config = Map::new();
    config.insert("image_format".into(), json!("Jpeg"));
    built_messages_validate(vec![
        (
            Agent::ConfigUpdate(ConfigUpdatePayload {
                key: "resolution".into(),
                value: json!("640x480"),
            })
            .into(),
            true,
        ),
        (
            Agent::ConfigResponse(ConfigResponsePayload {
                key: "resolution".into(),
                applied: true,
                restart_required: true,
            })
            .into(),
            true,
        ),
        (Agent::ConfigGet.into(), true),
        (
            Agent::ConfigGetResponse(ConfigGetResponsePayload { config }).into(),
            true,
        ),
    ]);
}

/// Each message, built by this crate, validates; one whose type needs a correlationId
/// (the `bool`) has it, and is rejected without it.
fn built_messages_validate(cases: Vec<(Body, bool)>) {
    for (body, needs_correlation) in cases {
        let kind = body.type_name();
        assert_eq!(requires_correlation_id(kind), needs_correlation, "{kind}");
        let mut env = Envelope::from_body(body, PROTOCOL_VERSION);
        if needs_correlation {
            env = env.with_correlation("req-1");
        }
        let value: Value = serde_json::from_str(&env.to_json()).expect("json");
        if let Err(e) = validator().validate(&value) {
            panic!("{kind}: {e}");
        }
        if needs_correlation {
            env.correlation_id = None;
            let value = serde_json::to_value(&env).expect("json");
            assert!(
                validator().validate(&value).is_err(),
                "{kind} without correlationId"
            );
        }
    }
}

#[test]
fn forwarded_offer_with_session_meta_validates() {
    let offer = Envelope::from_body(
        Signalling::Offer(OfferPayload {
            robot_id: "robot-1".into(),
            connection_id: "conn-1".into(),
            sdp_type: OfferSdpType::Offer,
            sdp: "v=0".into(),
            ice_restart: None,
        }),
        PROTOCOL_VERSION,
    )
    .with_meta(SessionMeta::new("alice", Role::Owner).to_meta());
    validator()
        .validate_str(&offer.to_json())
        .expect("meta.session is allowed by the envelope schema");
}
