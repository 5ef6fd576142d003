//! The relay's one-pass view and its `meta` splice: whatever it accepts, the full parser
//! accepts the same way, and the forwarded text carries exactly the server's `meta`.

mod common;

use serde_json::{json, Value};
use signalling_protocol::{
    Body, DisconnectReason, Envelope, Relayed, RelayedKind, Role, Signalling,
};

const RELAYED: [&str; 5] = [
    "signalling/offer",
    "signalling/answer",
    "signalling/ice_candidate",
    "signalling/connected",
    "signalling/disconnected",
];

fn relayed_examples() -> Vec<String> {
    common::examples()
        .into_iter()
        .filter(|(path, _)| {
            let path = path.to_string_lossy();
            RELAYED.iter().any(|name| path.contains(name))
        })
        .map(|(_, text)| text)
        .collect()
}

/// The claim the server relies on: accepted ⇒ the full parser agrees on type, id and
/// session, and the spliced text is the same message with the server's meta.
fn check_agrees(text: &str) -> Option<Relayed<'_>> {
    let relayed = Relayed::parse(text)?;
    let envelope = Envelope::parse(text)
        .unwrap_or_else(|e| panic!("fast path accepted what the parser refuses ({e}): {text}"));
    let body = envelope
        .body()
        .unwrap_or_else(|e| panic!("fast path accepted an invalid payload ({e}): {text}"));
    assert_eq!(envelope.kind, relayed.kind.type_name(), "{text}");
    assert_eq!(envelope.id, relayed.id, "{text}");
    let Body::Signalling(message) = body else {
        panic!("not a signalling message: {text}")
    };
    let session = match (&message, &relayed.kind) {
        (Signalling::Offer(p), RelayedKind::Offer { robot_id }) => {
            assert_eq!(&p.robot_id, robot_id);
            &p.connection_id
        }
        (Signalling::Answer(p), RelayedKind::Answer) => &p.connection_id,
        (Signalling::IceCandidate(p), RelayedKind::IceCandidate) => &p.connection_id,
        (Signalling::Connected(p), RelayedKind::Connected) => &p.connection_id,
        (Signalling::Disconnected(p), RelayedKind::Disconnected(reason)) => {
            assert_eq!(&p.reason, reason);
            &p.connection_id
        }
        other => panic!("kinds disagree: {other:?} for {text}"),
    };
    assert_eq!(session, &relayed.session);

    let subject = "al\"ice\\ \u{e9} </script>";
    let spliced = relayed.with_meta(text, subject, Role::Operator);
    let forwarded = Envelope::parse(&spliced)
        .unwrap_or_else(|e| panic!("spliced text does not parse ({e}): {spliced}"));
    let meta = forwarded.meta.clone().expect("meta is there");
    assert_eq!(
        Value::Object(meta),
        json!({"session": {"subject": subject, "role": "operator"}})
    );
    assert_eq!(forwarded.payload, envelope.payload);
    assert_eq!(forwarded.kind, envelope.kind);
    assert_eq!(forwarded.id, envelope.id);
    assert_eq!(forwarded.timestamp, envelope.timestamp);
    assert_eq!(forwarded.correlation_id, envelope.correlation_id);
    #[cfg(feature = "schema")]
    signalling_protocol::schema::SchemaValidator::shared()
        .validate_str(&spliced)
        .unwrap_or_else(|e| panic!("spliced message breaks the schema ({e}): {spliced}"));
    Some(relayed)
}

#[test]
fn every_relayed_example_takes_the_fast_path() {
    let examples = relayed_examples();
    assert_eq!(examples.len(), RELAYED.len());
    for text in &examples {
        assert!(check_agrees(text).is_some(), "refused: {text}");
    }
}

#[test]
fn the_view_reads_routing_fields() {
    let text = r#" {"type":"signalling.disconnected","version":"0.3","id":"m\u0031",
        "timestamp":"2026-01-01T00:00:00Z",
        "payload":{"connectionId":"s-\"1","reason":"timeout","details":{"meta":{"x":[1,{}]}}}}"#;
    let relayed = check_agrees(text).expect("accepted");
    assert_eq!(
        relayed.kind,
        RelayedKind::Disconnected(DisconnectReason::Timeout)
    );
    assert_eq!(relayed.id, "m1");
    assert_eq!(relayed.session, "s-\"1");
}

/// Variants of a valid message, as (what changed, JSON text).
fn variants(text: &str) -> Vec<(String, String)> {
    let value: Value = serde_json::from_str(text).expect("example is JSON");
    let mut out = Vec::new();
    let mut with = |label: &str, f: &dyn Fn(&mut Value)| {
        let mut v = value.clone();
        f(&mut v);
        out.push((label.to_string(), v.to_string()));
    };
    with("meta", &|v| {
        v["meta"] = json!({"session": {"role": "owner"}})
    });
    with("meta null", &|v| v["meta"] = Value::Null);
    with("meta array", &|v| v["meta"] = json!([]));
    with("unknown field", &|v| v["extra"] = json!(1));
    with("unknown payload field", &|v| {
        v["payload"]["extra"] = json!(1)
    });
    with("null correlationId", &|v| v["correlationId"] = Value::Null);
    with("numeric id", &|v| v["id"] = json!(7));
    with("major 1", &|v| v["version"] = json!("1.0"));
    with("bad version", &|v| v["version"] = json!("0"));
    with("bad timestamp", &|v| v["timestamp"] = json!("yesterday"));
    with("no payload", &|v| {
        v.as_object_mut().unwrap().remove("payload");
    });
    with("payload array", &|v| v["payload"] = json!([]));
    with("no connectionId", &|v| {
        v["payload"].as_object_mut().unwrap().remove("connectionId");
    });
    with("null connectionId", &|v| {
        v["payload"]["connectionId"] = Value::Null
    });
    with("sdp number", &|v| v["payload"]["sdp"] = json!(1));
    with("sdpType swapped", &|v| {
        let swapped = match v["payload"]["sdpType"].as_str() {
            Some("offer") => "answer",
            _ => "offer",
        };
        v["payload"]["sdpType"] = json!(swapped);
    });
    with("iceRestart null", &|v| {
        v["payload"]["iceRestart"] = Value::Null
    });
    with("robotId added", &|v| v["payload"]["robotId"] = json!("r"));
    with("candidate added", &|v| {
        v["payload"]["candidate"] = json!("c")
    });
    with("negative index", &|v| {
        v["payload"]["sdpMLineIndex"] = json!(-1)
    });
    with("reason odd", &|v| v["payload"]["reason"] = json!("gone"));
    with("state odd", &|v| {
        v["payload"]["iceConnectionState"] = json!("new")
    });
    with("details string", &|v| v["payload"]["details"] = json!("x"));
    with("type agent", &|v| v["type"] = json!("agent.movement"));
    with("type welcome", &|v| v["type"] = json!("signalling.welcome"));
    with("correlationId", &|v| v["correlationId"] = json!("c-1"));
    with("escaped connectionId", &|v| {
        v["payload"]["connectionId"] = json!("a\"b\\c\u{1}")
    });
    out
}

#[test]
fn variants_are_either_refused_or_agreed_on() {
    let mut accepted = 0;
    let mut refused = 0;
    for text in relayed_examples() {
        for (label, variant) in variants(&text) {
            match check_agrees(&variant) {
                Some(_) => accepted += 1,
                None => {
                    refused += 1;
                    // Refused here means the full parser decides; it must not matter
                    // to anyone but the relay's speed.
                    let _ = label;
                }
            }
        }
    }
    // Both outcomes occur, so the test checks something either way.
    assert!(
        accepted > 5 && refused > 50,
        "accepted {accepted}, refused {refused}"
    );
}

#[test]
fn unknown_fields_and_nulls_never_take_the_fast_path() {
    for text in relayed_examples() {
        for (label, variant) in variants(&text) {
            if [
                "unknown field",
                "unknown payload field",
                "null correlationId",
                "meta null",
                "meta array",
            ]
            .contains(&label.as_str())
            {
                assert!(Relayed::parse(&variant).is_none(), "{label}: {variant}");
            }
        }
    }
}

#[test]
fn a_senders_meta_is_replaced_wherever_it_is() {
    let forged = r#"{"session":{"subject":"mallory","role":"owner"},"x":"\"}}"}"#;
    for text in relayed_examples() {
        let mut value: Value = serde_json::from_str(&text).unwrap();
        value.as_object_mut().unwrap().remove("meta");
        let bare = value.to_string();
        // First, last, or in the middle of the object, with an escaped key.
        let first = bare.replacen('{', &format!(r#"{{"meta":{forged},"#), 1);
        let last = format!(r#"{},"\u006deta" : {forged} }}"#, &bare[..bare.len() - 1]);
        let middle = bare.replacen(
            r#","timestamp""#,
            &format!(r#","meta":{forged},"timestamp""#),
            1,
        );
        for variant in [first, last, middle] {
            let relayed = check_agrees(&variant).unwrap_or_else(|| panic!("refused: {variant}"));
            assert!(relayed.has_meta());
            let spliced = relayed.with_meta(&variant, "bob", Role::Viewer);
            assert!(!spliced.contains("mallory"), "{spliced}");
        }
    }
}

#[test]
fn duplicate_keys_are_refused_at_any_level() {
    for text in relayed_examples() {
        let top = text.replacen('{', r#"{"type":"signalling.welcome","#, 1);
        assert!(Relayed::parse(&top).is_none(), "{top}");
        let payload = text.replacen(
            r#""connectionId""#,
            r#""connectionId":"other","connectionId""#,
            1,
        );
        assert_ne!(payload, text);
        assert!(Relayed::parse(&payload).is_none(), "{payload}");
    }
}

#[test]
fn the_splice_is_the_only_change() {
    let ours = r#"{"session":{"subject":"bob","role":"viewer"}}"#;
    for text in relayed_examples() {
        let mut value: Value = serde_json::from_str(&text).unwrap();
        value.as_object_mut().unwrap().remove("meta");
        let bare = format!("  {}", value);
        let relayed = Relayed::parse(&bare).expect("accepted");
        let spliced = relayed.with_meta(&bare, "bob", Role::Viewer);
        let prefix = format!(r#"{{"meta":{ours},"#);
        assert!(spliced.starts_with(&prefix), "{spliced}");
        assert_eq!(&spliced[prefix.len()..], &bare.trim_start()[1..]);

        // The examples carry the sender's own meta: only its value changes.
        let relayed = Relayed::parse(&text).expect("accepted");
        let spliced = relayed.with_meta(&text, "bob", Role::Viewer);
        let theirs =
            serde_json::to_string_pretty(&serde_json::from_str::<Value>(&text).unwrap()["meta"])
                .unwrap();
        let at = text.find("\"meta\": {").expect("examples have meta") + "\"meta\": ".len();
        assert_eq!(&spliced[..at], &text[..at]);
        assert!(spliced[at..].starts_with(ours), "{spliced}");
        let _ = theirs;
    }
}

#[test]
fn not_json_or_not_an_object_is_refused() {
    for text in [
        "",
        " ",
        "null",
        "[]",
        "{",
        "{}",
        "\"x\"",
        "{\"type\":1}",
        "\u{feff}{}",
    ] {
        assert!(Relayed::parse(text).is_none(), "{text:?}");
    }
}

/// Found by the `relayed` fuzz target: a number out of `f64`'s range inside `details` or
/// the sender's `meta` passed the view's syntax-only skip while the parser refuses it.
#[test]
fn numbers_the_parser_refuses_are_refused_everywhere() {
    let disconnected = |details: &str, meta: &str| {
        format!(
            r#"{{"type":"signalling.disconnected","version":"0.5","id":"m1","timestamp":"2026-01-05T15:25:00Z","payload":{{"connectionId":"c1","reason":"timeout","details":{details}}},"meta":{meta}}}"#
        )
    };
    for (details, meta) in [
        (r#"{"meta": 555477701931e35555555}"#, r#"{"source":"web"}"#),
        (
            r#"{"nested": [1, {"deep": -1e999}]}"#,
            r#"{"source":"web"}"#,
        ),
        (r#"{"ok": 1.5}"#, r#"{"n": 1e400}"#),
        (r#"{"ok": 1.5}"#, r#"{"a": {"b": [2e308]}}"#),
    ] {
        let text = disconnected(details, meta);
        assert!(Envelope::parse(&text).is_err(), "the parser refuses {text}");
        assert!(
            Relayed::parse(&text).is_none(),
            "the view must refuse {text}"
        );
    }
    // In range, the same shapes agree.
    let text = disconnected(r#"{"n": [1, -2, 3.5e10, {"x": null}]}"#, r#"{"n": 1e300}"#);
    assert!(check_agrees(&text).is_some(), "{text}");
}

/// SDPs and candidates are checked as raw JSON strings, not unescaped: the check must refuse
/// exactly the strings the full parser refuses.
#[test]
fn free_text_strings_are_checked_like_the_parser_checks_them() {
    let answer = |sdp: &str| {
        format!(
            r#"{{"type":"signalling.answer","version":"0.5","id":"m1","timestamp":"2026-01-05T15:25:00Z","payload":{{"connectionId":"c1","sdpType":"answer","sdp":{sdp}}}}}"#
        )
    };
    let candidate = |candidate: &str| {
        format!(
            r#"{{"type":"signalling.ice_candidate","version":"0.5","id":"m1","timestamp":"2026-01-05T15:25:00Z","payload":{{"connectionId":"c1","candidate":{candidate},"sdpMid":"0","sdpMLineIndex":0}}}}"#
        )
    };
    let accepted = [
        r#""v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\n""#,
        r#""\ud83d\ude00 \u00e9 \/ \" \\ \b\f\n\r\t""#,
        r#""\\u not an escape, an escaped backslash""#,
        r#""""#,
    ];
    let refused = [
        r#""\ud800 lone leading surrogate""#,
        r#""\udc00 lone trailing surrogate""#,
        r#""\ud83d\u0041 leading surrogate, then no trailing one""#,
        r#""\x bad escape""#,
        r#""\u12 short""#,
        "\"raw\ncontrol character\"",
        r#""unterminated"#,
        "42",
        "null",
        r#"["v=0"]"#,
        r#"{"sdp":"v=0"}"#,
        "true",
    ];
    for build in [&answer as &dyn Fn(&str) -> String, &candidate] {
        for value in accepted {
            let text = build(value);
            assert!(check_agrees(&text).is_some(), "the view must accept {text}");
        }
        for value in refused {
            let text = build(value);
            let parsed = Envelope::parse(&text).and_then(|e| e.body().map(|_| ()));
            assert!(parsed.is_err(), "the parser refuses {text}");
            assert!(
                Relayed::parse(&text).is_none(),
                "the view must refuse {text}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// `arp.frame`: the robot's ARP frames, passed on to the gateway as received.

fn arp_frame(extra_payload: &str, extra_top: &str) -> String {
    format!(
        r#"{{"type":"arp.frame","version":"0.5","id":"f-1","timestamp":"2026-01-01T00:00:00Z"{extra_top},"payload":{{"connectionId":"arp-1","frame":{{"jsonrpc":"2.0","id":3,"result":{{"state":"completed","n":[1,2.5,null]}}}}{extra_payload}}}}}"#
    )
}

/// Accepted ⇒ the full parser accepts it too, with the same id and session.
fn arp_agrees(text: &str) -> Option<signalling_protocol::ArpFrameView<'_>> {
    let view = signalling_protocol::ArpFrameView::parse(text)?;
    let envelope = Envelope::parse(text)
        .unwrap_or_else(|e| panic!("arp view accepted what the parser refuses ({e}): {text}"));
    assert_eq!(envelope.kind, "arp.frame");
    assert_eq!(envelope.id, view.id, "{text}");
    let session = envelope
        .payload
        .as_ref()
        .and_then(|p| p.get("connectionId"))
        .and_then(Value::as_str);
    assert_eq!(session, Some(&*view.session), "{text}");
    Some(view)
}

#[test]
fn an_arp_frame_is_read_in_one_pass_with_its_session() {
    let plain = arp_frame("", "");
    let view = arp_agrees(&plain).expect("a plain arp.frame");
    assert_eq!((&*view.id, &*view.session), ("f-1", "arp-1"));
    let with_meta = arp_frame("", r#","meta":{"ticketKey":"abc","signature":"x.y"}"#);
    assert!(arp_agrees(&with_meta).is_some());
    let correlated = arp_frame("", r#","correlationId":"c-1""#);
    assert!(arp_agrees(&correlated).is_some());
    let escaped = plain.replace(r#""arp-1""#, r#""arp-\u0031""#);
    assert_eq!(&*arp_agrees(&escaped).expect("escaped").session, "arp-1");
}

#[test]
fn an_arp_frame_the_view_does_not_vouch_for_goes_to_the_parser() {
    let refused = [
        // Not an arp.frame, or an envelope the parser refuses or reads differently.
        arp_frame("", "").replace("arp.frame", "arp.framed"),
        arp_frame("", "").replace(r#""version":"0.5""#, r#""version":"1.0""#),
        arp_frame("", "").replace(r#""version":"0.5""#, r#""version":"0.5.1""#),
        arp_frame("", "").replace("2026-01-01T00:00:00Z", "yesterday"),
        arp_frame("", "").replace(r#""id":"f-1""#, r#""id":7"#),
        arp_frame("", r#","meta":[1]"#),
        arp_frame("", r#","meta":null"#),
        arp_frame("", r#","correlationId":5"#),
        arp_frame("", r#","extra":1"#),
        arp_frame("", r#","id":"again""#),
        // The session: missing, not a string, twice.
        arp_frame("", "").replace(r#""connectionId":"arp-1","#, ""),
        arp_frame("", "").replace(r#""connectionId":"arp-1""#, r#""connectionId":1"#),
        arp_frame(r#","connectionId":"arp-2""#, ""),
        // Numbers the parser refuses, anywhere in the payload.
        arp_frame(r#","more":1e999"#, ""),
        arp_frame("", "").replace("2.5", "2e999"),
        // Not JSON, not one object.
        arp_frame("", "").trim_end_matches('}').to_string(),
        "[]".to_string(),
    ];
    for text in &refused {
        assert!(
            signalling_protocol::ArpFrameView::parse(text).is_none(),
            "the view vouched for {text}"
        );
    }
    // Unknown members of the payload are the frame's business: read, not refused.
    assert!(arp_agrees(&arp_frame(r#","note":{"a":[true]}"#, "")).is_some());
}
