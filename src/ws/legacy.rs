//! Modulr's older browser clients, translated at the socket's edge.
//!
//! The deployed Modulr teleop web app speaks a flat shape (`{"type":"offer","to":…}`), told
//! apart from the spec envelope by a `type` without a dot, the way Modulr's own backend
//! decides. Its frames become spec envelopes here and then take the same path as any other
//! message (token, grant, lock, sender checks, records); what goes back to such a socket is
//! rendered flat by its writer. `from` is never trusted: a legacy socket's session is its own
//! connection id. The oldest app sends its offer before any welcome with a `from` of its
//! own making ("browser1"): a `from` that names no session is ignored, one that names
//! another socket's live session is refused. Robots never speak this dialect: there is no
//! legacy robot login.

use serde::Deserialize;
use serde_json::{json, Value};
use signalling_protocol::{
    Envelope, IceCandidatePayload, OfferPayload, OfferSdpType, Signalling, PROTOCOL_VERSION,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LegacyError {
    #[error("legacy frame: {0}")]
    Malformed(String),
    #[error("`from` names another connection; a socket speaks for itself only")]
    ForeignFrom,
}

/// The candidate object of a flat frame.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FlatCandidate {
    candidate: String,
    #[serde(default)]
    sdp_mid: Option<String>,
    #[serde(default, rename = "sdpMLineIndex")]
    sdp_m_line_index: Option<u32>,
    #[serde(default)]
    username_fragment: Option<String>,
}

/// A flat frame from a legacy browser. Unknown fields (a `from`, app-specific extras) are
/// allowed: the app sends what it sends.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum Flat {
    #[serde(rename = "offer")]
    Offer {
        to: String,
        #[serde(default)]
        from: Option<String>,
        sdp: String,
    },
    #[serde(rename = "candidate", alias = "ice-candidate")]
    Candidate {
        #[serde(default)]
        from: Option<String>,
        candidate: FlatCandidate,
    },
}

/// Whether a frame is in the flat dialect: a JSON object whose `type` has no dot. Only
/// called for frames that are not spec envelopes, so the spec path pays nothing.
pub fn is_flat(value: &Value) -> bool {
    value
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|kind| !kind.contains('.'))
}

/// Translates a flat frame from the socket `conn` into the spec envelope it means;
/// `another_session` tells whether an id names a live session of another socket.
pub fn to_envelope(
    value: Value,
    conn: &str,
    another_session: impl Fn(&str) -> bool,
) -> Result<Envelope, LegacyError> {
    let flat: Flat =
        serde_json::from_value(value).map_err(|e| LegacyError::Malformed(e.to_string()))?;
    let own = |from: &Option<String>| match from.as_deref() {
        Some(from) if from != conn && another_session(from) => Err(LegacyError::ForeignFrom),
        _ => Ok(()),
    };
    let message = match flat {
        Flat::Offer { to, from, sdp } => {
            own(&from)?;
            Signalling::Offer(OfferPayload {
                robot_id: to,
                connection_id: conn.to_string(),
                sdp_type: OfferSdpType::Offer,
                sdp,
                ice_restart: None,
            })
        }
        Flat::Candidate { from, candidate } => {
            own(&from)?;
            Signalling::IceCandidate(IceCandidatePayload {
                connection_id: conn.to_string(),
                candidate: candidate.candidate,
                // The spec requires both; browsers accept an empty mid with the index.
                sdp_mid: candidate.sdp_mid.unwrap_or_default(),
                sdp_m_line_index: candidate.sdp_m_line_index.unwrap_or(0),
                username_fragment: candidate.username_fragment,
            })
        }
    };
    Ok(Envelope::from_body(message, PROTOCOL_VERSION))
}

/// The flat welcome the legacy app waits for before it sends anything.
pub fn welcome(conn: &str) -> String {
    json!({ "type": "welcome", "connectionId": conn }).to_string()
}

/// Renders a spec message for a legacy socket: answers, candidates, errors, welcomes and
/// session ends in the flat shape the app reads. A spec message with no flat counterpart
/// (`connected`, `pong`, `capabilities`) is not sent: a legacy socket hears only its dialect.
pub fn render(text: &str) -> Option<String> {
    let message = serde_json::from_str::<Value>(text).ok()?;
    let payload = &message["payload"];
    let flat = match message["type"].as_str() {
        Some("signalling.answer") => json!({ "type": "answer", "sdp": payload["sdp"] }),
        Some("signalling.ice_candidate") => json!({
            "type": "candidate",
            "candidate": {
                "candidate": payload["candidate"],
                "sdpMid": payload["sdpMid"],
                "sdpMLineIndex": payload["sdpMLineIndex"],
            },
        }),
        // The app shows its "robot busy" screen, with who holds it, only for this.
        Some("signalling.error") if payload["details"]["reason"] == "robot_busy" => json!({
            "type": "session-locked",
            "robotId": payload["details"]["robotId"],
            "lockedBy": payload["details"]["lockedBy"],
            "message": payload["message"],
        }),
        // The app reads a flat error's code from `error`; `code` is kept for others.
        Some("signalling.error") => json!({
            "type": "error",
            "error": payload["code"],
            "code": payload["code"],
            "message": payload["message"],
        }),
        Some("signalling.welcome") => {
            json!({ "type": "welcome", "connectionId": payload["connectionId"] })
        }
        Some("signalling.disconnected") => json!({
            "type": "disconnected",
            "connectionId": payload["connectionId"],
            "reason": payload["details"]["reason"].as_str().or(payload["reason"].as_str()),
        }),
        _ => return None,
    };
    Some(flat.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use signalling_protocol::Body;

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn offers_and_candidates_become_spec_messages_of_the_sockets_own_session() {
        let offer = parse(r#"{"type":"offer","to":"robot-1","from":"c1","sdp":"v=0"}"#);
        assert!(is_flat(&offer));
        let envelope = to_envelope(offer, "c1", |_| false).unwrap();
        match envelope.body().unwrap() {
            Body::Signalling(Signalling::Offer(p)) => {
                assert_eq!(
                    (p.robot_id.as_str(), p.connection_id.as_str()),
                    ("robot-1", "c1")
                );
            }
            other => panic!("{other:?}"),
        }
        for kind in ["candidate", "ice-candidate"] {
            let frame = json!({"type": kind, "to": "robot-1", "candidate":
                {"candidate": "candidate:1 1 udp 1 127.0.0.1 9 typ host", "sdpMid": "0", "sdpMLineIndex": 0}});
            let envelope = to_envelope(frame, "c1", |_| false).unwrap();
            assert_eq!(envelope.kind, "signalling.ice_candidate");
        }
    }

    #[test]
    fn a_foreign_from_and_bad_frames_are_refused() {
        let offer = parse(r#"{"type":"offer","to":"robot-1","from":"someone-else","sdp":"v=0"}"#);
        assert_eq!(
            to_envelope(offer.clone(), "c1", |id| id == "someone-else").err(),
            Some(LegacyError::ForeignFrom)
        );
        // A `from` that names no session is the app's own label: ignored.
        assert!(to_envelope(offer, "c1", |_| false).is_ok());
        let missing = parse(r#"{"type":"offer","from":"c1"}"#);
        assert!(matches!(
            to_envelope(missing, "c1", |_| false),
            Err(LegacyError::Malformed(_))
        ));
        let unknown = parse(r#"{"type":"hello"}"#);
        assert!(matches!(
            to_envelope(unknown, "c1", |_| false),
            Err(LegacyError::Malformed(_))
        ));
        assert!(!is_flat(&parse(r#"{"type":"signalling.offer"}"#)));
    }

    #[test]
    fn spec_replies_render_flat() {
        let answer = r#"{"type":"signalling.answer","version":"0.5","id":"a","timestamp":"2026-01-01T00:00:00Z","payload":{"connectionId":"c1","sdpType":"answer","sdp":"v=0"}}"#;
        assert_eq!(
            parse(&render(answer).unwrap()),
            json!({"type":"answer","sdp":"v=0"})
        );
        let error = r#"{"type":"signalling.error","version":"0.5","id":"e","timestamp":"2026-01-01T00:00:00Z","payload":{"code":"FORBIDDEN","message":"no"}}"#;
        assert_eq!(
            parse(&render(error).unwrap()),
            json!({"type":"error","error":"FORBIDDEN","code":"FORBIDDEN","message":"no"})
        );
        let busy = r#"{"type":"signalling.error","version":"0.5","id":"e","timestamp":"2026-01-01T00:00:00Z","payload":{"code":"FORBIDDEN","message":"busy","details":{"reason":"robot_busy","robotId":"r1","lockedBy":"alice"}}}"#;
        assert_eq!(
            parse(&render(busy).unwrap()),
            json!({"type":"session-locked","robotId":"r1","lockedBy":"alice","message":"busy"})
        );
        let connected = r#"{"type":"signalling.connected","version":"0.5","id":"c","timestamp":"2026-01-01T00:00:00Z","payload":{"connectionId":"c1","iceConnectionState":"connected"}}"#;
        assert_eq!(render(connected), None);
    }
}
