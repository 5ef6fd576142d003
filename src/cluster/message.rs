//! What nodes tell each other over the Redis bus, and its encoding.
//!
//! Relayed frames are by far the most frequent message, so they have their own compact
//! framing (`F`, sender and receiver ids and the session they belong to, then the frame's
//! text as it was; the receiving node checks the three against its own session table
//! before it delivers anything): no JSON escaping
//! of a JSON text on the hot path. The frames a node's writer has for one node at a time
//! travel together in one PUBLISH (`B`, each frame length-prefixed): Redis, and both nodes'
//! clients, pay per message, not per byte. Everything else is rarer and travels as JSON (`J`).

use axum::extract::ws::Utf8Bytes;
use serde::{Deserialize, Serialize};

use crate::delivery::{ConnId, Kick};
use crate::messages::{SessionKind, ViewerCap};
use crate::store::Role;

/// A session as the robot's node learns of it from the client's node, with the offer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MirrorSession {
    pub session_id: String,
    pub record_id: String,
    pub robot_id: String,
    pub robot_conn: String,
    pub client_conn: String,
    pub client_node: String,
    pub subject: String,
    pub role: Role,
    /// The offer's message id, so that a refusal can name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offer_id: Option<String>,
    /// Teleop (absent, from older nodes) or ARP. Not `kind` on the wire: that is the tag of
    /// the control message this travels in.
    #[serde(default, rename = "session_kind")]
    pub kind: SessionKind,
}

/// Why the robot's node refused a session.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    #[default]
    ConnectionIdInUse,
    TooManyViewers(ViewerCap),
    /// An ARP session with a robot that did not declare ARP when it registered.
    ArpUnsupported,
}

/// A control message between nodes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Control {
    /// Directed: the robot of this session is on the receiving node.
    Open(MirrorSession),
    /// Directed: the session ended on the sender's side; end the local copy and deliver
    /// `notice` to the local end (only if the copy still existed: no duplicate notices).
    End {
        session_id: String,
        notice: Option<String>,
    },
    /// Directed: the robot's node refused a session the receiver opened, because its id
    /// belongs to another session there (live or within its grace period). The receiver
    /// ends its side and tells its client FORBIDDEN, naming the offer.
    Refused {
        session_id: String,
        #[serde(default)]
        robot_id: String,
        offer_id: Option<String>,
        /// Why: `connection_id_in_use`, or `too_many_viewers` with `per`.
        #[serde(default)]
        reason: Refusal,
    },
    /// Directed: close one socket of the receiving node.
    Kick { conn: String, reason: Kick },
    /// Broadcast: close the robot's socket, wherever it is.
    KickRobot { robot_id: String, reason: Kick },
    /// Broadcast: close the sockets that logged in with this token.
    KickToken { token_id: String },
    /// Broadcast: an owner takes this robot over: the driving sessions with it end.
    Preempt { robot_id: String },
    /// Broadcast: the node of this robot e-stops it, on `subject`'s word.
    EmergencyStop { robot_id: String, subject: String },
    /// Broadcast: close robots that proved one of these revoked credentials.
    KickCredentials {
        credentials: Vec<String>,
        reason: Kick,
    },
    /// Broadcast: a grant changed (or was withdrawn: `allowed` None); end the sessions
    /// owned by the receiver above `allowed`.
    EndSessionsOf {
        robot_id: String,
        subject: String,
        allowed: Option<Role>,
    },
    /// Broadcast: the sender is draining (SIGTERM); its robots will reconnect elsewhere.
    NodeLeaving,
    /// Directed to the sender itself: measures the bus's lag.
    Probe { sent_unix_ms: i64 },
    /// Directed: the receiving node refused a frame from `conn` (a socket of the node this
    /// goes to) because that sender is over its share of the receiver's queue or its byte
    /// rate; `id` is the refused message's id. The sender is told `relay_throttled`.
    Throttled { conn: String, id: Option<String> },
}

impl Control {
    pub fn kind(&self) -> &'static str {
        match self {
            Control::Open(_) => "open",
            Control::End { .. } => "end",
            Control::Refused { .. } => "refused",
            Control::Kick { .. } => "kick",
            Control::KickRobot { .. } => "kick_robot",
            Control::KickToken { .. } => "kick_token",
            Control::EmergencyStop { .. } => "emergency_stop",
            Control::Preempt { .. } => "preempt",
            Control::KickCredentials { .. } => "kick_credentials",
            Control::EndSessionsOf { .. } => "end_sessions_of",
            Control::NodeLeaving => "node_leaving",
            Control::Probe { .. } => "probe",
            Control::Throttled { .. } => "throttled",
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Wrapped {
    origin: String,
    #[serde(flatten)]
    control: Control,
}

/// A relayed frame as the receiving node reads it.
#[derive(Debug, PartialEq, Eq)]
pub struct RelayedFrame {
    pub from: Option<ConnId>,
    pub to: ConnId,
    /// The session the sending node routed it by (empty: none, never delivered).
    pub session: String,
    pub text: String,
}

/// A message received from the bus.
#[derive(Debug, PartialEq, Eq)]
pub enum PeerMessage {
    /// One or more relayed frames, in the order they were sent.
    Frames(Vec<RelayedFrame>),
    Control {
        origin: String,
        control: Control,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed bus message: {0}")]
pub struct DecodeError(&'static str);

/// A relayed frame on its way to another node: `F{from}\n{to}\n{session}\n{frame as
/// received}`. It holds the received bytes (shared, not copied), which the bus writes to
/// Redis from where they lie (`resp::Outgoing`). Session ids hold no line break (offers
/// with one are refused), so the header reads back unambiguously.
#[derive(Debug, Clone)]
pub struct FrameOut {
    pub from: Option<ConnId>,
    pub to: ConnId,
    pub session: std::sync::Arc<str>,
    pub text: Utf8Bytes,
}

impl FrameOut {
    /// The length of its encoding.
    pub fn encoded_len(&self) -> usize {
        let from = self.from.as_deref().map_or(0, str::len);
        4 + from + self.to.len() + self.session.len() + self.text.len()
    }
}

pub fn encode_control(origin: &str, control: &Control) -> Vec<u8> {
    let wrapped = Wrapped {
        origin: origin.to_string(),
        control: control.clone(),
    };
    let mut out = vec![b'J'];
    // Serialising plain strings and enums into a Vec cannot fail.
    serde_json::to_writer(&mut out, &wrapped).unwrap_or_default();
    out
}

pub fn decode(bytes: &[u8]) -> Result<PeerMessage, DecodeError> {
    match bytes.split_first() {
        Some((b'B', mut rest)) => {
            let mut frames = Vec::new();
            while !rest.is_empty() {
                let (len, after) = rest
                    .split_first_chunk::<4>()
                    .ok_or(DecodeError("batch length"))?;
                let len = u32::from_be_bytes(*len) as usize;
                if after.len() < len {
                    return Err(DecodeError("batch truncated"));
                }
                let (frame, after) = after.split_at(len);
                match frame.split_first() {
                    Some((b'F', frame)) => frames.push(decode_frame(frame)?),
                    _ => return Err(DecodeError("batch item")),
                }
                rest = after;
            }
            if frames.is_empty() {
                return Err(DecodeError("empty batch"));
            }
            Ok(PeerMessage::Frames(frames))
        }
        // A single frame: what nodes of the previous version send (a rolling upgrade).
        Some((b'F', rest)) => Ok(PeerMessage::Frames(vec![decode_frame(rest)?])),
        Some((b'J', rest)) => {
            let wrapped: Wrapped =
                serde_json::from_slice(rest).map_err(|_| DecodeError("control JSON"))?;
            Ok(PeerMessage::Control {
                origin: wrapped.origin,
                control: wrapped.control,
            })
        }
        _ => Err(DecodeError("unknown tag")),
    }
}

/// `{from}\n{to}\n{session}\n{text}`: a frame's encoding after its `F`.
fn decode_frame(bytes: &[u8]) -> Result<RelayedFrame, DecodeError> {
    let text = std::str::from_utf8(bytes).map_err(|_| DecodeError("not UTF-8"))?;
    let mut parts = text.splitn(4, '\n');
    let (Some(from), Some(to), Some(session), Some(text)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(DecodeError("frame header"));
    };
    if to.is_empty() {
        return Err(DecodeError("frame without receiver"));
    }
    Ok(RelayedFrame {
        from: (!from.is_empty()).then(|| ConnId::from(from)),
        to: ConnId::from(to),
        session: session.to_string(),
        text: text.to_string(),
    })
}

/// The `id` of a relayed frame (for the error that names it), read only when the frame was
/// refused: no parse on the relay path.
pub fn frame_id(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Id {
        id: Option<String>,
    }
    serde_json::from_str::<Id>(text).ok()?.id
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::resp::{parse, Outgoing, Reply};

    /// The PUBLISH payload the bus writes for these frames.
    fn payload(frames: &[&FrameOut]) -> Vec<u8> {
        let mut out = Outgoing::new(Vec::new());
        out.publish_frames(&[b"p:node:n1"], frames);
        let written: Vec<u8> = out.io_slices().iter().flat_map(|s| s.to_vec()).collect();
        let Some((Reply::Array(items), _)) = parse(&written).unwrap() else {
            panic!("a command");
        };
        match items.as_slice() {
            [_, _, Reply::Bulk(Some(payload))] => payload.to_vec(),
            other => panic!("PUBLISH channel payload, not {other:?}"),
        }
    }

    fn encoded(from: Option<&ConnId>, to: &ConnId, text: &str) -> Vec<u8> {
        let frame = FrameOut {
            from: from.cloned(),
            to: to.clone(),
            session: "s1".into(),
            text: Utf8Bytes::from(text.to_string()),
        };
        payload(&[&frame])
    }

    #[test]
    fn a_batch_carries_its_frames_in_order() {
        let frames: Vec<FrameOut> = [
            (Some("c1"), "r1", "{\"a\":\"line\\nbreak\"}\n"),
            (None, "r2", ""),
            (Some("c3"), "r1", "{\"type\":\"x\"}"),
        ]
        .into_iter()
        .map(|(from, to, text)| FrameOut {
            from: from.map(ConnId::from),
            to: ConnId::from(to),
            session: "s\u{e9}1".into(),
            text: Utf8Bytes::from(text),
        })
        .collect();
        let refs: Vec<&FrameOut> = frames.iter().collect();
        let bytes = payload(&refs);
        assert_eq!(
            bytes.len(),
            1 + frames.iter().map(|f| 4 + f.encoded_len()).sum::<usize>()
        );
        let PeerMessage::Frames(decoded) = decode(&bytes).unwrap() else {
            panic!("frames");
        };
        let expected: Vec<RelayedFrame> = frames
            .iter()
            .map(|f| RelayedFrame {
                from: f.from.clone(),
                to: f.to.clone(),
                session: f.session.to_string(),
                text: f.text.as_str().into(),
            })
            .collect();
        assert_eq!(decoded, expected);

        // Damaged batches are refused whole, never read past their end.
        for cut in 1..bytes.len() {
            let damaged = decode(&bytes[..cut]);
            let at_boundary = [1 + 4 + frames[0].encoded_len()]
                .into_iter()
                .chain([1 + 8 + frames[0].encoded_len() + frames[1].encoded_len()])
                .any(|end| end == cut);
            assert_eq!(damaged.is_ok(), at_boundary, "cut at {cut}");
        }
        assert!(decode(b"B").is_err(), "an empty batch");
        assert!(
            decode(b"B\xff\xff\xff\xffFa\nb\nc").is_err(),
            "a length past the end"
        );
        assert!(
            decode(b"B\0\0\0\x01J").is_err(),
            "an item that is not a frame"
        );
        assert!(
            decode(b"B\0\0\0\x05F\n\ns\nx").is_err(),
            "a frame without a receiver"
        );
    }

    #[test]
    fn frames_round_trip() {
        let from = ConnId::from("c1");
        let to = ConnId::from("r1");
        let text = "{\"type\":\"signalling.answer\",\n\"x\":1}";
        let decoded = decode(&encoded(Some(&from), &to, text)).unwrap();
        assert_eq!(
            decoded,
            PeerMessage::Frames(vec![RelayedFrame {
                from: Some(from),
                to: to.clone(),
                session: "s1".into(),
                text: text.into()
            }])
        );
        assert!(matches!(
            decode(&encoded(None, &to, "x")).unwrap(),
            PeerMessage::Frames(frames) if frames[0].from.is_none()
        ));
        assert_eq!(
            frame_id(r#"{"type":"signalling.ice_candidate","id":"m1","payload":{}}"#),
            Some("m1".into())
        );
        assert_eq!(frame_id("not json"), None);
        assert_eq!(frame_id(r#"{"type":"x"}"#), None);
        assert!(decode(b"").is_err());
        assert!(decode(b"Fonly").is_err());
        assert!(decode(b"Fc1\nr1\nno session line").is_err());
        assert!(decode(b"J{").is_err());
    }

    #[test]
    fn controls_round_trip() {
        let control = Control::EndSessionsOf {
            robot_id: "r".into(),
            subject: "s".into(),
            allowed: Some(Role::Viewer),
        };
        assert_eq!(
            decode(&encode_control("n1", &control)).unwrap(),
            PeerMessage::Control {
                origin: "n1".into(),
                control
            }
        );
        // A session's kind travels beside the message's own `kind` tag, never in its place.
        let open = Control::Open(MirrorSession {
            session_id: "arp-1".into(),
            record_id: "rec".into(),
            robot_id: "r".into(),
            robot_conn: "rc".into(),
            client_conn: "arp-1".into(),
            client_node: "n1".into(),
            subject: "planner".into(),
            role: Role::Operator,
            offer_id: None,
            kind: SessionKind::Arp,
        });
        for control in [
            open,
            Control::Refused {
                session_id: "arp-1".into(),
                robot_id: "r".into(),
                offer_id: None,
                reason: Refusal::ArpUnsupported,
            },
            Control::Preempt {
                robot_id: "r".into(),
            },
            Control::EmergencyStop {
                robot_id: "r".into(),
                subject: "alice".into(),
            },
        ] {
            assert_eq!(
                decode(&encode_control("n1", &control)).unwrap(),
                PeerMessage::Control {
                    origin: "n1".into(),
                    control
                }
            );
        }
        let throttled = Control::Throttled {
            conn: "c1".into(),
            id: Some("m1".into()),
        };
        assert_eq!(
            decode(&encode_control("n2", &throttled)).unwrap(),
            PeerMessage::Control {
                origin: "n2".into(),
                control: throttled
            }
        );
    }

    #[test]
    fn kicks_round_trip_under_every_name() {
        for reason in [
            Kick::Replaced,
            Kick::Revoked,
            Kick::TokenRevoked,
            Kick::SlowConsumer,
            Kick::Shutdown,
        ] {
            let kick = Control::KickRobot {
                robot_id: "r".into(),
                reason,
            };
            assert!(matches!(
                decode(&encode_control("n1", &kick)).unwrap(),
                PeerMessage::Control { control, .. } if control == kick
            ));
        }
        // The names nodes of the previous version sent read the same.
        let named =
            br#"J{"origin":"n1","kind":"kick_robot","robot_id":"r","reason":"token_revoked"}"#;
        assert!(matches!(
            decode(named).unwrap(),
            PeerMessage::Control {
                control: Control::KickRobot {
                    reason: Kick::TokenRevoked,
                    ..
                },
                ..
            }
        ));
    }
}
