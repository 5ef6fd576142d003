//! `signalling.*` messages (spec `schemas/signalling/v0/`): registration,
//! PKI handshake, SDP/ICE exchange and connection state.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::common::{decode, encode, CapabilitiesPayload, ErrorPayload};
use crate::error::ProtocolError;

/// Payload of `signalling.register`, sent by a robot to announce itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterPayload {
    pub agent_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<RegisterCapabilities>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

/// Media capabilities a robot offers for session negotiation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterCapabilities {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub video_codecs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio_codecs: Option<Vec<String>>,
}

/// Payload of `signalling.welcome`, the server's greeting to a new socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WelcomePayload {
    pub connection_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ice_servers: Option<Vec<IceServer>>,
}

/// One STUN/TURN server entry, shaped like WebRTC's `RTCIceServer`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IceServer {
    pub urls: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

/// `sdpType` of an offer; the schema allows only `"offer"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OfferSdpType {
    #[default]
    #[serde(rename = "offer")]
    Offer,
}

/// `sdpType` of an answer; the schema allows only `"answer"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AnswerSdpType {
    #[default]
    #[serde(rename = "answer")]
    Answer,
}

/// Payload of `signalling.offer` (client → server → robot).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OfferPayload {
    pub robot_id: String,
    pub connection_id: String,
    pub sdp_type: OfferSdpType,
    pub sdp: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ice_restart: Option<bool>,
}

/// Payload of `signalling.answer` (robot → server → client).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnswerPayload {
    pub connection_id: String,
    pub sdp_type: AnswerSdpType,
    pub sdp: String,
}

/// Payload of `signalling.ice_candidate`, relayed in both directions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IceCandidatePayload {
    pub connection_id: String,
    pub candidate: String,
    pub sdp_mid: String,
    /// `integer, minimum 0` in the schema, hence unsigned.
    #[serde(rename = "sdpMLineIndex")]
    pub sdp_m_line_index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username_fragment: Option<String>,
}

/// ICE state reported by `signalling.connected`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectedIceState {
    Connected,
    Completed,
}

/// Data channel state reported by `signalling.connected`; only `"open"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataChannelState {
    #[default]
    Open,
}

/// Payload of `signalling.connected`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConnectedPayload {
    pub connection_id: String,
    pub ice_connection_state: ConnectedIceState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_channel_state: Option<DataChannelState>,
}

/// Why a peer connection ended, per `signalling.disconnected`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DisconnectReason {
    Closed,
    Failed,
    Timeout,
}

/// Payload of `signalling.disconnected`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DisconnectedPayload {
    pub connection_id: String,
    pub reason: DisconnectReason,
    /// Free-form in the schema (unlike `connected`), e.g. `"disconnected"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ice_connection_state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Map<String, Value>>,
}

/// Payload of `signalling.pki_challenge` (server → robot).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PkiChallengePayload {
    pub challenge: String,
}

/// Payload of `signalling.pki_response` (robot → server).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PkiResponsePayload {
    pub signature: String,
}

/// Payload of `signalling.pki_verified` (server → robot).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PkiVerifiedPayload {
    pub agent_id: String,
}

/// One variant per `signalling.*` message type.
#[derive(Debug, Clone, PartialEq)]
pub enum Signalling {
    Register(RegisterPayload),
    Welcome(WelcomePayload),
    Offer(OfferPayload),
    Answer(AnswerPayload),
    IceCandidate(IceCandidatePayload),
    Connected(ConnectedPayload),
    Disconnected(DisconnectedPayload),
    Error(ErrorPayload),
    Capabilities(CapabilitiesPayload),
    Ping,
    Pong,
    PkiChallenge(PkiChallengePayload),
    PkiResponse(PkiResponsePayload),
    PkiVerified(PkiVerifiedPayload),
}

impl Signalling {
    /// The `type` string on the wire, e.g. `"signalling.offer"`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Signalling::Register(_) => "signalling.register",
            Signalling::Welcome(_) => "signalling.welcome",
            Signalling::Offer(_) => "signalling.offer",
            Signalling::Answer(_) => "signalling.answer",
            Signalling::IceCandidate(_) => "signalling.ice_candidate",
            Signalling::Connected(_) => "signalling.connected",
            Signalling::Disconnected(_) => "signalling.disconnected",
            Signalling::Error(_) => "signalling.error",
            Signalling::Capabilities(_) => "signalling.capabilities",
            Signalling::Ping => "signalling.ping",
            Signalling::Pong => "signalling.pong",
            Signalling::PkiChallenge(_) => "signalling.pki_challenge",
            Signalling::PkiResponse(_) => "signalling.pki_response",
            Signalling::PkiVerified(_) => "signalling.pki_verified",
        }
    }

    /// Decodes the payload of a `signalling.*` type; `None` if the type is
    /// not one of them. Ping/pong payloads are ignored (the schema allows any
    /// object and gives it no meaning).
    pub(crate) fn decode(
        kind: &str,
        payload: Option<&Value>,
    ) -> Option<Result<Self, ProtocolError>> {
        let decoded = match kind {
            "signalling.register" => decode(kind, payload).map(Signalling::Register),
            "signalling.welcome" => decode(kind, payload).map(Signalling::Welcome),
            "signalling.offer" => decode(kind, payload).map(Signalling::Offer),
            "signalling.answer" => decode(kind, payload).map(Signalling::Answer),
            "signalling.ice_candidate" => decode(kind, payload).map(Signalling::IceCandidate),
            "signalling.connected" => decode(kind, payload).map(Signalling::Connected),
            "signalling.disconnected" => decode(kind, payload).map(Signalling::Disconnected),
            "signalling.error" => decode(kind, payload).map(Signalling::Error),
            "signalling.capabilities" => decode(kind, payload).map(Signalling::Capabilities),
            "signalling.ping" => Ok(Signalling::Ping),
            "signalling.pong" => Ok(Signalling::Pong),
            "signalling.pki_challenge" => decode(kind, payload).map(Signalling::PkiChallenge),
            "signalling.pki_response" => decode(kind, payload).map(Signalling::PkiResponse),
            "signalling.pki_verified" => decode(kind, payload).map(Signalling::PkiVerified),
            _ => return None,
        };
        Some(decoded)
    }

    /// The payload as JSON; `None` for ping/pong, which carry none.
    pub fn payload(&self) -> Option<Value> {
        Some(match self {
            Signalling::Register(p) => encode(p),
            Signalling::Welcome(p) => encode(p),
            Signalling::Offer(p) => encode(p),
            Signalling::Answer(p) => encode(p),
            Signalling::IceCandidate(p) => encode(p),
            Signalling::Connected(p) => encode(p),
            Signalling::Disconnected(p) => encode(p),
            Signalling::Error(p) => encode(p),
            Signalling::Capabilities(p) => encode(p),
            Signalling::Ping | Signalling::Pong => return None,
            Signalling::PkiChallenge(p) => encode(p),
            Signalling::PkiResponse(p) => encode(p),
            Signalling::PkiVerified(p) => encode(p),
        })
    }

    /// Schema rules serde cannot express: version patterns and the
    /// signalling subset of error codes.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        match self {
            Signalling::Capabilities(p) => p.validate(),
            Signalling::Error(p) if !p.code.is_signalling() => Err(ProtocolError::InvalidPayload(
                format!("code: {} is not a signalling error code", p.code),
            )),
            _ => Ok(()),
        }
    }
}
