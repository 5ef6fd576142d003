//! Messages built with `Envelope::from_body` have a well-formed header and
//! the payload the schemas expect.

use serde_json::{json, Map, Value};
use signalling_protocol::{
    Agent, Body, ConnectedIceState, ConnectedPayload, DataChannelState, Envelope, IceServer,
    MovementPayload, OfferPayload, OfferSdpType, Signalling, WelcomePayload, PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

#[test]
fn header_has_fresh_v4_id_and_utc_millisecond_timestamp() {
    let a = Envelope::from_body(Signalling::Ping, PROTOCOL_VERSION);
    let b = Envelope::from_body(Signalling::Ping, PROTOCOL_VERSION);
    assert_ne!(a.id, b.id);
    let id = uuid::Uuid::parse_str(&a.id).expect("uuid");
    assert_eq!(id.get_version_num(), 4);

    assert_eq!(a.version, "0.5");
    assert_eq!(
        a.timestamp.len(),
        "2026-01-06T12:00:00.000Z".len(),
        "{}",
        a.timestamp
    );
    assert!(a.timestamp.ends_with('Z'), "{}", a.timestamp);
    assert_eq!(&a.timestamp[19..20], ".", "{}", a.timestamp);
    let parsed = OffsetDateTime::parse(&a.timestamp, &Rfc3339).expect("rfc3339");
    let age = OffsetDateTime::now_utc() - parsed;
    assert!(age.whole_seconds().abs() < 60, "{age}");
}

#[test]
fn payload_less_types_omit_payload_unless_schema_requires_one() {
    let ping = Envelope::from_body(Signalling::Ping, "0.5");
    assert_eq!(ping.payload, None);
    assert!(!ping.to_json().contains("payload"));
    assert_eq!(Envelope::from_body(Agent::ConfigGet, "0.5").payload, None);
    assert_eq!(Envelope::from_body(Agent::Pong, "0.5").payload, None);
    assert_eq!(
        Envelope::from_body(Agent::LocationList, "0.5").payload,
        Some(json!({}))
    );
    assert_eq!(
        Envelope::from_body(Agent::NavigationCancel, "0.5").payload,
        Some(json!({}))
    );
}

#[test]
fn payload_uses_spec_field_names_and_skips_absent_options() {
    let offer = OfferPayload {
        robot_id: "robot-1".into(),
        connection_id: "conn-1".into(),
        sdp_type: OfferSdpType::Offer,
        sdp: "v=0".into(),
        ice_restart: None,
    };
    let env = Envelope::from_body(Signalling::Offer(offer), "0.5");
    assert_eq!(
        env.payload,
        Some(json!({ "robotId": "robot-1", "connectionId": "conn-1",
                     "sdpType": "offer", "sdp": "v=0" }))
    );

    let connected = ConnectedPayload {
        connection_id: "c".into(),
        ice_connection_state: ConnectedIceState::Completed,
        data_channel_state: Some(DataChannelState::Open),
    };
    let env = Envelope::from_body(Signalling::Connected(connected), "0.5");
    assert_eq!(
        env.payload,
        Some(
            json!({ "connectionId": "c", "iceConnectionState": "completed",
                     "dataChannelState": "open" })
        )
    );
}

#[test]
fn correlation_and_meta_builders_set_header_fields() {
    let mut meta = Map::new();
    meta.insert("source".into(), json!("robot"));
    let env = Envelope::from_body(Agent::Pong, "0.5")
        .with_correlation("ping-7")
        .with_meta(meta);
    let value: Value = serde_json::from_str(&env.to_json()).expect("json");
    assert_eq!(value["correlationId"], "ping-7");
    assert_eq!(value["meta"], json!({ "source": "robot" }));
    assert_eq!(value["type"], "agent.pong");
}

#[test]
fn built_messages_parse_back_to_the_same_body() {
    let bodies: Vec<Body> = vec![
        Signalling::Welcome(WelcomePayload {
            connection_id: "c-1".into(),
            ice_servers: Some(vec![IceServer {
                urls: vec!["turn:turn.example:3478".into()],
                username: Some("u".into()),
                credential: Some("p".into()),
            }]),
        })
        .into(),
        Agent::Movement(MovementPayload {
            forward: 0.25,
            turn: -1.0,
        })
        .into(),
        Agent::LocationList.into(),
        Agent::NavigationCancel.into(),
        Signalling::Ping.into(),
    ];
    for body in bodies {
        let env = Envelope::from_body(body.clone(), PROTOCOL_VERSION);
        let parsed = Envelope::parse(&env.to_json()).expect("parses");
        assert_eq!(parsed, env);
        assert_eq!(parsed.body().expect("decodes"), body);
    }
}

#[test]
fn version_constants_agree() {
    assert_eq!(SUPPORTED_VERSIONS.last(), Some(&PROTOCOL_VERSION));
    for v in SUPPORTED_VERSIONS {
        let env = Envelope::from_body(Signalling::Ping, v);
        assert!(Envelope::parse(&env.to_json()).is_ok(), "{v}");
    }
}

#[test]
fn sent_at_reads_the_timestamp_in_unix_milliseconds() {
    let text = r#"{"type":"signalling.ping","version":"0.5","id":"p","timestamp":"2026-01-06T12:00:00.250+01:00"}"#;
    let env = Envelope::parse(text).expect("parses");
    // 2026-01-06T11:00:00.250Z
    assert_eq!(env.sent_at_unix_ms(), Some(1_767_697_200_250));
    let mut broken = env.clone();
    broken.timestamp = "yesterday".into();
    assert_eq!(broken.sent_at_unix_ms(), None);
    let fresh = Envelope::from_body(Signalling::Ping, PROTOCOL_VERSION);
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("fits");
    let sent = fresh.sent_at_unix_ms().expect("own timestamp parses");
    assert!((now_ms - sent).abs() < 60_000, "{now_ms} vs {sent}");
}
