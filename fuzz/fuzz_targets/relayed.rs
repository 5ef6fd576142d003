//! The relay's one-pass view and its `meta` splice: whatever the view accepts, the full
//! parser accepts as the same message, and the spliced text is that message with exactly the
//! server's `meta` (duplicate keys, escapes or nesting cannot move the splice).
#![no_main]

use libfuzzer_sys::fuzz_target;
use signalling_protocol::{Body, Envelope, Relayed, Role};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(view) = Relayed::parse(text) else {
        return;
    };
    let envelope = Envelope::parse(text).expect("the parser accepts what the view accepts");
    let Ok(Body::Signalling(_)) = envelope.body() else {
        panic!("the view accepted an invalid payload");
    };
    assert_eq!(envelope.kind, view.kind.type_name());
    assert_eq!(envelope.id, view.id);
    let session = envelope
        .payload
        .as_ref()
        .and_then(|p| p.get("connectionId"))
        .and_then(|c| c.as_str());
    assert_eq!(session, Some(&*view.session));

    let spliced = view.with_meta(text, "sub\"ject", Role::Operator);
    let forwarded = Envelope::parse(&spliced).expect("the spliced text parses");
    let meta = serde_json::Value::Object(forwarded.meta.clone().expect("meta is there"));
    assert_eq!(
        meta,
        serde_json::json!({"session": {"subject": "sub\"ject", "role": "operator"}})
    );
    assert_eq!(forwarded.payload, envelope.payload);
    assert_eq!(forwarded.kind, envelope.kind);
    assert_eq!(forwarded.id, envelope.id);
    assert_eq!(forwarded.correlation_id, envelope.correlation_id);
    assert_eq!(forwarded.timestamp, envelope.timestamp);
});
