//! The Autonomous Robot Protocol (ARP 0.1.0) as this project speaks it:
//! method names, error codes and limits shared by the robot agent, the
//! server's gateway and the tests. The message shapes are the JSON Schema
//! `schemas/arp/arp-0.1.0.schema.json` (checked with the `schema` feature,
//! [`crate::arp_schema`]); `arp-contract.md` fixes what the spec leaves open.
//!
//! Between the server's gateway and a robot, ARP frames travel on the robot's
//! signalling socket inside an `arp.frame` envelope ([`FRAME_TYPE`],
//! [`ArpFramePayload`]; docs/protocol.md, "ARP sessions"), and a robot declares
//! the ARP it serves in `register.metadata` ([`REGISTER_METADATA_KEY`]). One message,
//! typed, is a [`Message`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::envelope::Envelope;
use crate::error::ProtocolError;
use crate::session::SessionMeta;

mod message;

pub use message::{Body, Message, MessageError};

/// The protocol version this implementation speaks.
pub const ARP_VERSION: &str = "0.1.0";

/// Largest accepted frame (one JSON-RPC message).
pub const MAX_FRAME_BYTES: usize = 64 * 1024;

/// The JSON Schema of ARP messages, as text.
pub const SCHEMA: &str = include_str!("../schemas/arp/arp-0.1.0.schema.json");

/// Label of the WebRTC data channel that carries ARP.
pub const DATA_CHANNEL_LABEL: &str = "arp";

/// Method names (spec section 5).
pub mod method {
    pub const INITIALIZE: &str = "arp.initialize";
    pub const SHUTDOWN: &str = "arp.shutdown";
    pub const EMERGENCY_STOP: &str = "arp.emergencyStop";
    pub const LIST_TOOLS: &str = "arp.listTools";
    pub const CALL_TOOL: &str = "arp.callTool";
    pub const CANCEL_TOOL: &str = "arp.cancelTool";
    pub const TOOL_PROGRESS: &str = "arp.toolProgress";
    pub const LIST_CONTEXT: &str = "arp.listContext";
    pub const SUBSCRIBE_CONTEXT: &str = "arp.subscribeContext";
    pub const UNSUBSCRIBE_CONTEXT: &str = "arp.unsubscribeContext";
    pub const CONTEXT_UPDATE: &str = "arp.contextUpdate";
    pub const LIST_CONSTRAINTS: &str = "arp.listConstraints";
    pub const GET_CONSTRAINT: &str = "arp.getConstraint";
    pub const REQUEST_PLAN: &str = "arp.requestPlan";
    pub const SET_WORKSPACE: &str = "arp.setWorkspace";
    pub const REQUEST_CONFIRMATION: &str = "arp.requestConfirmation";

    /// Every method of section 5, in the spec's order.
    pub const ALL: &[&str] = &[
        INITIALIZE,
        SHUTDOWN,
        EMERGENCY_STOP,
        LIST_TOOLS,
        CALL_TOOL,
        CANCEL_TOOL,
        TOOL_PROGRESS,
        LIST_CONTEXT,
        SUBSCRIBE_CONTEXT,
        UNSUBSCRIBE_CONTEXT,
        CONTEXT_UPDATE,
        LIST_CONSTRAINTS,
        GET_CONSTRAINT,
        REQUEST_PLAN,
        SET_WORKSPACE,
        REQUEST_CONFIRMATION,
    ];
}

/// Error codes of spec section 6.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpCode {
    ParseError,
    InvalidRequest,
    MethodNotFound,
    InvalidParams,
    InternalError,
    SafetyViolation,
    PreconditionFailed,
    ToolNotFound,
    ToolBusy,
    ConfirmationTimeout,
    ConfirmationDenied,
    EmergencyStopped,
    ContextNotFound,
    NotInitialized,
}

impl ArpCode {
    pub const ALL: [ArpCode; 14] = [
        ArpCode::ParseError,
        ArpCode::InvalidRequest,
        ArpCode::MethodNotFound,
        ArpCode::InvalidParams,
        ArpCode::InternalError,
        ArpCode::SafetyViolation,
        ArpCode::PreconditionFailed,
        ArpCode::ToolNotFound,
        ArpCode::ToolBusy,
        ArpCode::ConfirmationTimeout,
        ArpCode::ConfirmationDenied,
        ArpCode::EmergencyStopped,
        ArpCode::ContextNotFound,
        ArpCode::NotInitialized,
    ];

    /// The number on the wire.
    pub fn code(self) -> i64 {
        match self {
            ArpCode::ParseError => -32700,
            ArpCode::InvalidRequest => -32600,
            ArpCode::MethodNotFound => -32601,
            ArpCode::InvalidParams => -32602,
            ArpCode::InternalError => -32603,
            ArpCode::SafetyViolation => -40001,
            ArpCode::PreconditionFailed => -40002,
            ArpCode::ToolNotFound => -40003,
            ArpCode::ToolBusy => -40004,
            ArpCode::ConfirmationTimeout => -40005,
            ArpCode::ConfirmationDenied => -40006,
            ArpCode::EmergencyStopped => -40007,
            ArpCode::ContextNotFound => -40008,
            ArpCode::NotInitialized => -40009,
        }
    }

    /// The spec's name of the code.
    pub fn name(self) -> &'static str {
        match self {
            ArpCode::ParseError => "Parse Error",
            ArpCode::InvalidRequest => "Invalid Request",
            ArpCode::MethodNotFound => "Method Not Found",
            ArpCode::InvalidParams => "Invalid Params",
            ArpCode::InternalError => "Internal Error",
            ArpCode::SafetyViolation => "Safety Violation",
            ArpCode::PreconditionFailed => "Precondition Failed",
            ArpCode::ToolNotFound => "Tool Not Found",
            ArpCode::ToolBusy => "Tool Busy",
            ArpCode::ConfirmationTimeout => "Confirmation Timeout",
            ArpCode::ConfirmationDenied => "Confirmation Denied",
            ArpCode::EmergencyStopped => "Emergency Stopped",
            ArpCode::ContextNotFound => "Context Not Found",
            ArpCode::NotInitialized => "Not Initialized",
        }
    }

    pub fn from_code(code: i64) -> Option<ArpCode> {
        ArpCode::ALL.into_iter().find(|c| c.code() == code)
    }
}

/// `data.reason` values this project adds to the spec's codes
/// (arp-contract.md).
pub mod reason {
    pub const FORBIDDEN: &str = "forbidden";
    pub const ROBOT_BUSY: &str = "robot_busy";
    pub const ROBOT_OFFLINE: &str = "robot_offline";
    pub const BAD_TICKET: &str = "bad_ticket";
    pub const RATE_LIMITED: &str = "rate_limited";
    /// The gateway's robot did not declare ARP in `register.metadata.arp`.
    pub const ARP_UNSUPPORTED: &str = "arp_unsupported";
    /// The robot serves no more gateway ARP sessions at once.
    pub const TOO_MANY_SESSIONS: &str = "too_many_sessions";
    /// A frame's `meta.session.role` is not the one its ARP session opened with.
    pub const ROLE_CHANGED: &str = "role_changed";
}

/// `type` of the envelope that carries one ARP frame on a robot's signalling
/// socket, both ways. Ours, not the Modulr spec's (it is not in
/// [`crate::MESSAGE_TYPES`], so [`Envelope::body`] refuses it: read it with
/// [`ArpFramePayload::from_envelope`]).
pub const FRAME_TYPE: &str = "arp.frame";

/// Key of `signalling.register`'s `payload.metadata` under which a robot
/// declares the ARP version it serves ([`ARP_VERSION`]). A robot without it
/// is never sent an `arp.frame`.
pub const REGISTER_METADATA_KEY: &str = "arp";

/// Query parameter of `/v1/robots/{robotId}/arp` by which a program asks for frames signed
/// by the robot: a nonce of its choosing ([`valid_signature_nonce`]). The server passes it
/// to the robot in `meta` of every `arp.frame` under [`SIGNATURE_NONCE_META_KEY`]; a robot
/// with `sign_replies` signs each frame it sends for that session, binding the nonce.
pub const SIGNED_QUERY: &str = "signed";

/// Key of an `arp.frame`'s `meta` (server to robot) holding the program's nonce.
pub const SIGNATURE_NONCE_META_KEY: &str = "signatureNonce";

/// Top-level member of a frame carrying the robot's signature, as the program receives it
/// (`../shared/design/agent-protocols.md`: the message carries a `signature`). Between robot
/// and server it travels in the `arp.frame`'s `meta` under the same key.
pub const FRAME_SIGNATURE_KEY: &str = "signature";

/// `meta` key of the robot's `arp.frame` that carries an `arp.requestConfirmation`: who
/// may answer it ([`ConfirmationPolicy`]; docs/arp.md, "Who confirms").
pub const CONFIRMATION_POLICY_META_KEY: &str = "confirmationPolicy";

/// Who may answer a robot's `arp.requestConfirmation` that comes through the gateway.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfirmationPolicy {
    /// A person with a driving grant on the robot, in the console (`/v1/confirmations`).
    /// What a robot gets when it says nothing, or anything else.
    #[default]
    Console,
    /// Also the program's host, if the program declared `capabilities.confirmation`
    /// (a host that asks its own person); the confirmer on record is the program's subject.
    Client,
}

impl ConfirmationPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfirmationPolicy::Console => "console",
            ConfirmationPolicy::Client => "client",
        }
    }

    /// The policy a robot's `meta` value names; anything but `"client"` is `console`
    /// (fail closed: people confirm).
    pub fn from_meta(value: Option<&Value>) -> ConfirmationPolicy {
        match value.and_then(Value::as_str) {
            Some("client") => ConfirmationPolicy::Client,
            _ => ConfirmationPolicy::Console,
        }
    }
}

/// A nonce a program may choose: 16 to 128 characters of base64url's alphabet.
pub fn valid_signature_nonce(nonce: &str) -> bool {
    (16..=128).contains(&nonce.len())
        && nonce
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The `payload` of an `arp.frame` envelope:
/// `{"connectionId": "arp-…", "frame": {"jsonrpc": "2.0", …}}`.
///
/// `connectionId` names the ARP session (one gateway connection); `frame` is
/// one ARP JSON-RPC object, passed on untouched. Who calls is never read from
/// `frame`: frames to the robot carry the server's `meta.session`
/// ([`SessionMeta`]), frames from the robot carry no `meta`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArpFramePayload {
    pub connection_id: String,
    pub frame: Value,
}

impl ArpFramePayload {
    pub fn new(connection_id: impl Into<String>, frame: Value) -> ArpFramePayload {
        ArpFramePayload {
            connection_id: connection_id.into(),
            frame,
        }
    }

    /// The `arp.frame` envelope: a fresh id and timestamp, `version` =
    /// [`crate::PROTOCOL_VERSION`], and `meta = {"session": …}` when `session`
    /// is given (the server, towards the robot; the robot passes `None`).
    pub fn to_envelope(&self, session: Option<&SessionMeta>) -> Envelope {
        let mut envelope = Envelope::new_of_type(FRAME_TYPE, crate::PROTOCOL_VERSION);
        // A struct of a string and a JSON value always serialises.
        envelope.payload = serde_json::to_value(self).ok();
        if let Some(session) = session {
            envelope = envelope.with_meta(session.to_meta());
        }
        envelope
    }

    /// Reads the payload of an `arp.frame` envelope (checked by
    /// [`Envelope::parse`]). Errors: `UnsupportedType` for another `type`;
    /// `InvalidPayload` for a missing payload, a missing, empty or non-string
    /// `connectionId`, a `frame` that is not a JSON object (ARP has no
    /// batches), or any other field. `meta` is not read here: see
    /// [`SessionMeta::from_meta`].
    pub fn from_envelope(envelope: &Envelope) -> Result<ArpFramePayload, ProtocolError> {
        if envelope.kind != FRAME_TYPE {
            return Err(ProtocolError::UnsupportedType(envelope.kind.clone()));
        }
        let payload = envelope
            .payload
            .as_ref()
            .ok_or_else(|| ProtocolError::InvalidPayload(format!("{FRAME_TYPE}: no payload")))?;
        let parsed = ArpFramePayload::deserialize(payload)
            .map_err(|e| ProtocolError::InvalidPayload(format!("{FRAME_TYPE}: {e}")))?;
        if parsed.connection_id.is_empty() {
            return Err(ProtocolError::InvalidPayload(format!(
                "{FRAME_TYPE}: connectionId is empty"
            )));
        }
        if !parsed.frame.is_object() {
            return Err(ProtocolError::InvalidPayload(format!(
                "{FRAME_TYPE}: frame is not a JSON object"
            )));
        }
        Ok(parsed)
    }
}

/// The ARP version a robot declared in its `register.metadata`, if any.
pub fn declared_version(metadata: Option<&Map<String, Value>>) -> Option<&str> {
    metadata?.get(REGISTER_METADATA_KEY)?.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for c in ArpCode::ALL {
            assert!(seen.insert(c.code()));
            assert_eq!(ArpCode::from_code(c.code()), Some(c));
        }
        assert_eq!(ArpCode::from_code(1), None);
        assert_eq!(method::ALL.len(), 16);
    }

    #[test]
    fn signature_nonces_are_base64url_of_a_sane_length() {
        assert!(valid_signature_nonce("AAAAAAAAAAAAAAAAAAAAAA"));
        assert!(valid_signature_nonce("abc-DEF_0123456789"));
        assert!(valid_signature_nonce(&"x".repeat(128)));
        assert!(!valid_signature_nonce("short"));
        assert!(!valid_signature_nonce(&"x".repeat(129)));
        assert!(!valid_signature_nonce("AAAAAAAAAAAAAAAA+/=="));
        assert!(!valid_signature_nonce("AAAAAAAAAAAAAAAA\"\"\"\""));
    }

    #[test]
    fn frames_round_trip_through_the_envelope() {
        let frame = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method::LIST_TOOLS});
        let session = SessionMeta::new("planner-7", crate::Role::Operator);
        let out = ArpFramePayload::new("arp-1", frame.clone()).to_envelope(Some(&session));
        let text = out.to_json();
        let value: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(value["type"], FRAME_TYPE);
        assert_eq!(value["payload"]["connectionId"], "arp-1");
        assert_eq!(value["meta"]["session"]["role"], "operator");
        let back = Envelope::parse(&text).expect("a valid envelope");
        let payload = ArpFramePayload::from_envelope(&back).expect("payload");
        assert_eq!(payload, ArpFramePayload::new("arp-1", frame.clone()));
        assert_eq!(SessionMeta::from_meta(back.meta.as_ref()), Some(session));
        // The robot's frames carry no meta.
        let robot = ArpFramePayload::new("arp-1", frame).to_envelope(None);
        assert!(robot.meta.is_none());
    }

    #[test]
    fn malformed_frame_payloads_are_invalid() {
        let mut e = ArpFramePayload::new("arp-1", serde_json::json!({})).to_envelope(None);
        for bad in [
            serde_json::json!({"connectionId": "a", "frame": [1]}),
            serde_json::json!({"connectionId": "a", "frame": "x"}),
            serde_json::json!({"connectionId": "", "frame": {}}),
            serde_json::json!({"connectionId": 3, "frame": {}}),
            serde_json::json!({"frame": {}}),
            serde_json::json!({"connectionId": "a", "frame": {}, "extra": 1}),
        ] {
            e.payload = Some(bad.clone());
            assert!(
                matches!(
                    ArpFramePayload::from_envelope(&e),
                    Err(ProtocolError::InvalidPayload(_))
                ),
                "{bad}"
            );
        }
        e.payload = None;
        assert!(ArpFramePayload::from_envelope(&e).is_err());
        e.kind = "signalling.offer".into();
        assert!(matches!(
            ArpFramePayload::from_envelope(&e),
            Err(ProtocolError::UnsupportedType(_))
        ));
    }

    #[test]
    fn the_declared_version_is_read_from_register_metadata() {
        let mut metadata = Map::new();
        assert_eq!(declared_version(Some(&metadata)), None);
        assert_eq!(declared_version(None), None);
        metadata.insert(
            REGISTER_METADATA_KEY.into(),
            Value::String(ARP_VERSION.into()),
        );
        assert_eq!(declared_version(Some(&metadata)), Some("0.1.0"));
    }
}
