//! `meta.session {subject, role}`: the server writes it, the robot reads it;
//! the wire shape is fixed and an unknown role never grants privilege.

use serde_json::{json, Map, Value};
use signalling_protocol::{Envelope, Role, SessionMeta, Signalling, PROTOCOL_VERSION};

fn meta(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

#[test]
fn wire_shape_is_session_subject_role() {
    let written = SessionMeta::new("alice", Role::Operator).to_meta();
    assert_eq!(
        Value::Object(written),
        json!({ "session": { "subject": "alice", "role": "operator" } })
    );
}

#[test]
fn round_trips_every_role_through_an_envelope() {
    for role in [Role::Viewer, Role::Operator, Role::Owner] {
        let sent = SessionMeta::new("subject-1", role);
        let text = Envelope::from_body(Signalling::Ping, PROTOCOL_VERSION)
            .with_meta(sent.to_meta())
            .to_json();
        let received = Envelope::parse(&text).expect("parses");
        assert_eq!(SessionMeta::from_meta(received.meta.as_ref()), Some(sent));
        assert_eq!(SessionMeta::role_of(received.meta.as_ref()), role);
    }
}

#[test]
fn role_text_round_trips_and_unknown_is_rejected_strictly() {
    for role in [Role::Viewer, Role::Operator, Role::Owner] {
        assert_eq!(Role::parse(role.as_str()), Some(role));
        assert_eq!(role.to_string(), role.as_str());
        let json = serde_json::to_value(role).expect("serialises");
        assert_eq!(json, Value::String(role.as_str().into()));
        assert_eq!(serde_json::from_value::<Role>(json).expect("parses"), role);
    }
    assert_eq!(Role::parse("admin"), None);
    assert_eq!(Role::parse("Operator"), None);
    assert!(serde_json::from_value::<Role>(json!("admin")).is_err());
}

#[test]
fn unknown_or_missing_role_is_least_privilege_on_the_robot() {
    let cases = [
        json!({ "session": { "subject": "a", "role": "admin" } }),
        json!({ "session": { "subject": "a", "role": 7 } }),
        json!({ "session": { "subject": "a" } }),
        json!({ "session": { "subject": "a", "role": "OWNER" } }),
    ];
    for case in cases {
        let m = meta(case.clone());
        assert_eq!(
            SessionMeta::from_meta(Some(&m)),
            Some(SessionMeta::new("a", Role::Viewer)),
            "{case}"
        );
        assert_eq!(SessionMeta::role_of(Some(&m)), Role::Viewer, "{case}");
    }
    assert_eq!(Role::parse_or_viewer(None), Role::Viewer);
    assert_eq!(Role::parse_or_viewer(Some("owner")), Role::Owner);
}

#[test]
fn no_vouched_subject_means_no_session_and_a_viewer() {
    for case in [
        json!({}),
        json!({ "session": "operator" }),
        json!({ "session": { "role": "owner" } }),
        json!({ "session": { "subject": 1, "role": "owner" } }),
        json!({ "source": "browser" }),
    ] {
        let m = meta(case.clone());
        assert_eq!(SessionMeta::from_meta(Some(&m)), None, "{case}");
        assert_eq!(SessionMeta::role_of(Some(&m)), Role::Viewer, "{case}");
    }
    assert_eq!(SessionMeta::from_meta(None), None);
    assert_eq!(SessionMeta::role_of(None), Role::Viewer);
}

#[test]
fn only_operators_and_owners_drive() {
    assert!(!Role::Viewer.may_drive());
    assert!(Role::Operator.may_drive());
    assert!(Role::Owner.may_drive());
}

#[test]
fn roles_are_ordered_by_privilege() {
    assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Owner);
}
