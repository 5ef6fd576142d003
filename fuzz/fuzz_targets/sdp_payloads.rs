//! Offer, answer and ICE candidate payloads: fuzzed SDP / candidate text and ids inside an
//! otherwise valid envelope, plus the raw payload object, through parse and body decoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use signalling_protocol::Envelope;

const KINDS: [&str; 5] = [
    "signalling.offer",
    "signalling.answer",
    "signalling.ice_candidate",
    "signalling.connected",
    "signalling.disconnected",
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let kind = KINDS[usize::from(selector) % KINDS.len()];
    // The fuzzed text as the SDP/candidate of a well-formed payload...
    let mut parts = text.splitn(3, '\u{0}');
    let field = parts.next().unwrap_or_default();
    let id = parts.next().unwrap_or("c1");
    let extra = parts.next().unwrap_or_default();
    let payload = match kind {
        "signalling.offer" => {
            json!({"robotId": id, "connectionId": id, "sdpType": "offer", "sdp": field})
        }
        "signalling.answer" => json!({"connectionId": id, "sdpType": "answer", "sdp": field}),
        "signalling.ice_candidate" => json!({
            "connectionId": id, "candidate": field, "sdpMid": extra,
            "sdpMLineIndex": selector,
        }),
        _ => json!({"connectionId": id, "reason": field}),
    };
    check(kind, payload);
    // ...and as the whole payload object.
    if let Ok(raw @ Value::Object(_)) = serde_json::from_str::<Value>(&text) {
        check(kind, raw);
    }
});

fn check(kind: &str, payload: Value) {
    let message = json!({
        "type": kind,
        "version": "0.3",
        "id": "m1",
        "correlationId": "c0",
        "timestamp": "2026-01-06T12:00:00Z",
        "payload": payload,
    });
    if let Ok(envelope) = Envelope::parse(&message.to_string()) {
        let _ = envelope.body();
    }
}
