//! Messages the server itself originates, built from the protocol crate's typed payloads so
//! they always match the spec schemas.

use serde_json::{Map, Value};
use signalling_protocol::arp::{method, Message};
use signalling_protocol::{
    CapabilitiesPayload, DisconnectReason, DisconnectedPayload, Envelope, ErrorCode, ErrorPayload,
    IceServer, PkiChallengePayload, PkiVerifiedPayload, Role, SessionMeta, Signalling,
    WelcomePayload, PROTOCOL_VERSION, SUPPORTED_VERSIONS,
};

/// Now, as an envelope's `timestamp` (RFC 3339, UTC, milliseconds).
pub fn timestamp() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        now.millisecond()
    )
}

/// The envelope type that carries ARP frames on a robot's signalling socket.
pub const ARP_FRAME: &str = "arp.frame";

/// Key of `register.metadata` by which a robot declares the ARP version it serves.
pub const ARP_METADATA: &str = "arp";

/// An `arp.frame` for the robot: one ARP JSON-RPC frame of session `connection_id`, with
/// who calls in `meta.session` (docs/protocol.md, "ARP sessions").
/// `ticket`: the server's signed ticket for this frame (`meta.session.ticket`).
pub fn arp_frame(
    connection_id: &str,
    frame: &Message,
    session: ArpCaller<'_>,
    ticket: Option<&str>,
) -> String {
    // Written from borrowed parts: one frame per tool call, no map built for its `meta`.
    let meta = ArpMetaOut {
        session: ArpSessionOut {
            subject: session.subject,
            role: session.role.as_str(),
            ticket,
        },
        signature_nonce: session.signature_nonce,
    };
    let envelope = ArpFrameOut {
        kind: ARP_FRAME,
        version: PROTOCOL_VERSION,
        id: uuid::Uuid::new_v4().to_string(),
        timestamp: timestamp(),
        payload: ArpFrameOutPayload {
            connection_id,
            frame,
        },
        meta,
    };
    // Strings and JSON values always serialise.
    serde_json::to_string(&envelope).unwrap_or_default()
}

/// An `arp.frame` as the server writes it: the typed frame serialised once, in place.
#[derive(serde::Serialize)]
struct ArpFrameOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    version: &'static str,
    id: String,
    timestamp: String,
    payload: ArpFrameOutPayload<'a>,
    meta: ArpMetaOut<'a>,
}

/// An `arp.frame`'s `meta`: `session` as [`session_meta`] writes it, and the program's
/// nonce (`signalling_protocol::arp::SIGNATURE_NONCE_META_KEY`) when it asked for signed frames.
#[derive(serde::Serialize)]
struct ArpMetaOut<'a> {
    session: ArpSessionOut<'a>,
    #[serde(rename = "signatureNonce", skip_serializing_if = "Option::is_none")]
    signature_nonce: Option<&'a str>,
}

#[derive(serde::Serialize)]
struct ArpSessionOut<'a> {
    subject: &'a str,
    role: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ticket: Option<&'a str>,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ArpFrameOutPayload<'a> {
    connection_id: &'a str,
    frame: &'a Message,
}

/// Who calls in an ARP session, as the robot is told in each `arp.frame`'s `meta`.
#[derive(Debug, Clone, Copy)]
pub struct ArpCaller<'a> {
    pub subject: &'a str,
    pub role: Role,
    /// The program asked for frames signed by the robot, with this nonce.
    pub signature_nonce: Option<&'a str>,
}

/// A `session.ticket` for the robot: the fresh ticket of live teleop session
/// `connection_id`, in `meta.session` as on its offer (docs/protocol.md, "Session tickets").
pub fn ticket_renewal(connection_id: &str, subject: &str, role: Role, ticket: &str) -> String {
    serde_json::json!({
        "type": signalling_protocol::ticket::RENEW_TYPE,
        "version": PROTOCOL_VERSION,
        "id": uuid::Uuid::new_v4().to_string(),
        "timestamp": timestamp(),
        "payload": { "connectionId": connection_id },
        "meta": session_meta(subject, role, Some(ticket)),
    })
    .to_string()
}

/// A `session.signing_keys` for a robot: the current signing key endorsed by the
/// previous one (docs/protocol.md, "Session tickets").
pub fn key_endorsement(endorsement: &str) -> String {
    serde_json::json!({
        "type": signalling_protocol::ticket::KEYS_TYPE,
        "version": PROTOCOL_VERSION,
        "id": uuid::Uuid::new_v4().to_string(),
        "timestamp": timestamp(),
        "payload": { "endorsement": endorsement },
    })
    .to_string()
}

/// The frames that e-stop a robot outside any session (the API, a gateway program before its
/// `arp.initialize`), on `subject`'s word: an `arp.emergencyStop`
/// notification in a session of its own, then that session's end.
pub fn arp_emergency_stop(subject: &str) -> [String; 2] {
    let connection_id = format!("estop-{}", uuid::Uuid::new_v4());
    let params = serde_json::json!({ "reason": format!("emergency stop by {subject}") });
    let stop = Message::request(None, method::EMERGENCY_STOP, Some(params));
    [
        // Unsigned: a robot takes an e-stop from anyone (stopping is always safe).
        arp_frame(
            &connection_id,
            &stop,
            ArpCaller {
                subject,
                role: Role::Owner,
                signature_nonce: None,
            },
            None,
        ),
        disconnected(&connection_id, Some("closed")),
    ]
}

/// What a session carries: WebRTC signalling between a browser and the robot (teleop), or
/// the ARP frames of a program through the gateway (docs/protocol.md, "ARP sessions").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionKind {
    #[default]
    Teleop,
    Arp,
}

/// Which cap on viewing sessions an offer ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ViewerCap {
    PerSubject,
    PerRobot,
}

impl ViewerCap {
    /// Its name on the wire (`details.per`).
    pub fn as_str(self) -> &'static str {
        match self {
            ViewerCap::PerSubject => "per_subject",
            ViewerCap::PerRobot => "per_robot",
        }
    }
}

fn envelope(message: Signalling) -> Envelope {
    Envelope::from_body(message, PROTOCOL_VERSION)
}

pub fn welcome(connection_id: &str, ice_servers: Vec<IceServer>) -> String {
    envelope(Signalling::Welcome(WelcomePayload {
        connection_id: connection_id.to_string(),
        ice_servers: Some(ice_servers),
    }))
    .to_json()
}

/// `signalling.disconnected` with reason `closed`; `cause` says why the server ended it.
pub fn disconnected(session_id: &str, cause: Option<&str>) -> String {
    let details = cause.map(|c| {
        let mut details = Map::new();
        details.insert("reason".into(), Value::String(c.to_string()));
        details
    });
    envelope(Signalling::Disconnected(DisconnectedPayload {
        connection_id: session_id.to_string(),
        reason: DisconnectReason::Closed,
        ice_connection_state: None,
        details,
    }))
    .to_json()
}

pub fn pki_challenge(challenge_b64: String) -> Envelope {
    envelope(Signalling::PkiChallenge(PkiChallengePayload {
        challenge: challenge_b64,
    }))
}

pub fn pki_verified(agent_id: &str, response_id: &str) -> String {
    envelope(Signalling::PkiVerified(PkiVerifiedPayload {
        agent_id: agent_id.to_string(),
    }))
    .with_correlation(response_id)
    .to_json()
}

pub fn pong(ping_id: &str) -> String {
    envelope(Signalling::Pong)
        .with_correlation(ping_id)
        .to_json()
}

pub fn capabilities(request_id: &str) -> String {
    envelope(Signalling::Capabilities(CapabilitiesPayload {
        versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
    }))
    .with_correlation(request_id)
    .to_json()
}

pub fn error(
    code: ErrorCode,
    message: &str,
    details: Option<Map<String, Value>>,
    correlation_id: Option<&str>,
) -> String {
    let mut envelope = envelope(Signalling::Error(ErrorPayload {
        code,
        message: message.to_string(),
        details,
    }));
    if let Some(id) = correlation_id {
        envelope = envelope.with_correlation(id);
    }
    envelope.to_json()
}

/// `meta` the server puts on everything it forwards to a robot: who is on the other end.
/// Whatever `meta` the sender wrote is dropped, so a client cannot claim another role.
/// The shape is the protocol crate's [`SessionMeta`], which the robot agent reads back.
/// `role` is a [`Role`]'s text (callers hold the typed role); anything else would be a bug
/// here, and is sent as the least-privileged role rather than as an unknown word.
/// `ticket`: the server's signed ticket for the message (`meta.session.ticket`).
pub fn session_meta(subject: &str, role: Role, ticket: Option<&str>) -> Map<String, Value> {
    let session = SessionMeta::new(subject, role);
    match ticket {
        Some(ticket) => session.with_ticket(ticket),
        None => session,
    }
    .to_meta()
}

#[cfg(test)]
mod arp_frame_tests {
    use serde_json::{json, Value};
    use signalling_protocol::arp::SIGNATURE_NONCE_META_KEY;

    use super::*;

    /// The `meta` written from borrowed parts is the one `session_meta` describes, with the
    /// program's nonce beside it.
    #[test]
    fn an_arp_frames_meta_is_the_session_meta_and_the_nonce() {
        let frame = Message::request(Some(json!(1)), method::LIST_TOOLS, Some(json!({})));
        for (ticket, nonce) in [
            (None, None),
            (Some("t.k.n"), Some("nonce-0123456789abcdef")),
        ] {
            let caller = ArpCaller {
                subject: "al\"ice",
                role: Role::Operator,
                signature_nonce: nonce,
            };
            let text = arp_frame("arp-1", &frame, caller, ticket);
            let written: Value = serde_json::from_str(&text).unwrap();
            let mut meta = session_meta("al\"ice", Role::Operator, ticket);
            if let Some(nonce) = nonce {
                meta.insert(SIGNATURE_NONCE_META_KEY.into(), nonce.into());
            }
            assert_eq!(written["meta"], Value::Object(meta));
            assert_eq!(written["type"], ARP_FRAME);
            assert_eq!(written["payload"]["connectionId"], "arp-1");
            assert_eq!(
                written["payload"]["frame"],
                serde_json::to_value(&frame).unwrap()
            );
        }
    }
}
