//! Every example of the spec parses into a typed body and is reproduced
//! exactly when rebuilt from that body.

mod common;

use std::collections::BTreeSet;

use serde_json::Value;
use signalling_protocol::{Envelope, MESSAGE_TYPES};

/// Number of example files shipped with the spec; guards against the walk
/// silently finding nothing.
const EXAMPLE_COUNT: usize = 33;

#[test]
fn examples_are_all_found() {
    assert_eq!(common::examples().len(), EXAMPLE_COUNT);
}

#[test]
fn every_example_round_trips_through_its_typed_body() {
    for (path, text) in common::examples() {
        let name = path.display();
        let original: Value = serde_json::from_str(&text).expect("example is JSON");
        let envelope = Envelope::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let body = envelope.body().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(body.type_name(), envelope.kind, "{name}");

        let rebuilt = Envelope {
            kind: body.type_name().to_owned(),
            version: envelope.version.clone(),
            id: envelope.id.clone(),
            correlation_id: envelope.correlation_id.clone(),
            timestamp: envelope.timestamp.clone(),
            payload: body.payload(),
            meta: envelope.meta.clone(),
        };
        let reparsed: Value = serde_json::from_str(&rebuilt.to_json()).expect("output is JSON");
        assert_eq!(reparsed, original, "{name}");
    }
}

#[test]
fn envelope_alone_round_trips_every_example() {
    for (path, text) in common::examples() {
        let original: Value = serde_json::from_str(&text).expect("example is JSON");
        let envelope = Envelope::parse(&text).expect("example parses");
        let value = serde_json::to_value(&envelope).expect("serialises");
        assert_eq!(value, original, "{}", path.display());
    }
}

#[test]
fn examples_cover_every_message_type() {
    let covered: BTreeSet<String> = common::examples()
        .iter()
        .map(|(_, text)| Envelope::parse(text).expect("example parses").kind)
        .collect();
    let all: BTreeSet<String> = MESSAGE_TYPES.iter().map(|t| t.to_string()).collect();
    assert_eq!(covered, all);
    assert_eq!(MESSAGE_TYPES.len(), 31);
}

#[test]
fn serialised_fields_follow_envelope_order() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/spec/examples/agent/movement.example.json"
    ))
    .expect("readable");
    let json = Envelope::parse(&text).expect("parses").to_json();
    let positions: Vec<usize> = [
        "\"type\"",
        "\"version\"",
        "\"id\"",
        "\"correlationId\"",
        "\"timestamp\"",
        "\"payload\"",
        "\"meta\"",
    ]
    .iter()
    .map(|key| {
        json.find(key)
            .unwrap_or_else(|| panic!("{key} missing in {json}"))
    })
    .collect();
    let mut sorted = positions.clone();
    sorted.sort();
    assert_eq!(positions, sorted, "{json}");
}
