//! Session messages the server relays (`offer`, `answer`, `ice_candidate`, `connected`,
//! `disconnected`), read in one pass and borrowed from the received text.
//!
//! The server forwards what it received instead of building a JSON tree and writing a new
//! message: [`Relayed::parse`] checks everything the spec says about the message (envelope
//! and payload, exactly as [`Envelope::parse`](crate::Envelope::parse) and
//! [`Envelope::body`](crate::Envelope::body) do) and keeps only what routing needs; the
//! forwarded text then gets the server's `meta` from [`Relayed::with_meta`].
//!
//! It vouches for a message only when the message is plain: no duplicate key and no field the
//! schemas do not name, at any level. Anything else gives `None` and goes through the full
//! parser, which gives the precise error or rebuilds the message. So the text forwarded is
//! exactly one top-level object with known fields, each once. A sender's own `meta` is never
//! passed on (the receiver learns who it talks to from the server alone): its value's exact
//! place in the text is known from the parser, not from a scan, and the server's `meta`
//! takes that place (or, when there is none, goes right after the opening brace); escapes,
//! nesting or repeated keys cannot move it.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::common::is_major_minor;
use crate::session::{Role, SESSION_META_KEY};
use crate::signalling::DisconnectReason;

/// What a relayed message is, with what its type needs for routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayedKind<'a> {
    Offer { robot_id: Cow<'a, str> },
    Answer,
    IceCandidate,
    Connected,
    Disconnected(DisconnectReason),
}

impl RelayedKind<'_> {
    /// The message's `type`.
    pub fn type_name(&self) -> &'static str {
        match self {
            RelayedKind::Offer { .. } => "signalling.offer",
            RelayedKind::Answer => "signalling.answer",
            RelayedKind::IceCandidate => "signalling.ice_candidate",
            RelayedKind::Connected => "signalling.connected",
            RelayedKind::Disconnected(_) => "signalling.disconnected",
        }
    }
}

/// A relayed session message the server may forward as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relayed<'a> {
    pub kind: RelayedKind<'a>,
    /// The message's `id`.
    pub id: Cow<'a, str>,
    /// `payload.connectionId`: the session.
    pub session: Cow<'a, str>,
    /// Where the sender's own `meta` value lies in the text, if it sent one.
    meta: Option<Range<usize>>,
}

impl<'a> Relayed<'a> {
    /// The message, if it is a spec-valid relayed session message in plain form (see the
    /// module docs); `None` for anything else, including every invalid message.
    pub fn parse(text: &'a str) -> Option<Relayed<'a>> {
        let header: Header<'a> = serde_json::from_str(text).ok()?;
        if !is_major_minor(&header.version) || !header.version.starts_with("0.") {
            return None;
        }
        OffsetDateTime::parse(&header.timestamp, &Rfc3339).ok()?;
        let mut p = header.payload;
        let kind = kind_of(&header.kind, &mut p)?;
        let meta = match header.meta {
            // The envelope schema wants an object; anything else is the parser's to refuse.
            // Checked as the parser reads it (numbers in range), not only for its syntax.
            Some(raw) if raw.get().starts_with('{') => {
                serde_json::from_str::<AnyValue>(raw.get()).ok()?;
                Some(span_in(text, raw.get())?)
            }
            Some(_) => return None,
            None => None,
        };
        Some(Relayed {
            kind,
            id: header.id.0,
            session: p.connection_id?.0,
            meta,
        })
    }

    /// Whether the sender put its own `meta` on the message (which must not be passed on).
    pub fn has_meta(&self) -> bool {
        self.meta.is_some()
    }

    /// The sender's own `meta` value, as it lies in `text` (the one this was parsed from).
    pub fn meta<'t>(&self, text: &'t str) -> Option<&'t str> {
        text.get(self.meta.clone()?)
    }

    /// `text` (the one this was parsed from) as the server forwards it to a robot: with
    /// `meta = {"session": {subject, role}}` in place of anything the sender put there.
    pub fn with_meta(&self, text: &str, subject: &str, role: Role) -> String {
        self.with_session(text, subject, role, None)
    }

    /// [`Relayed::with_meta`] with the server's signed ticket in `meta.session.ticket`
    /// (see [`crate::ticket`]).
    pub fn with_session(
        &self,
        text: &str,
        subject: &str,
        role: Role,
        ticket: Option<&str>,
    ) -> String {
        let extra = ticket.map_or(0, |t| t.len() + 16);
        let mut meta = String::with_capacity(subject.len() + 64 + extra);
        meta.push_str("{\"");
        meta.push_str(SESSION_META_KEY);
        meta.push_str("\":{\"subject\":");
        push_json_string(&mut meta, subject);
        meta.push_str(",\"role\":\"");
        meta.push_str(role.as_str());
        meta.push('"');
        if let Some(ticket) = ticket {
            meta.push_str(",\"");
            meta.push_str(crate::ticket::TICKET_META_KEY);
            meta.push_str("\":");
            push_json_string(&mut meta, ticket);
        }
        meta.push_str("}}");
        let mut out = String::with_capacity(text.len() + meta.len() + 8);
        match &self.meta {
            Some(span) => {
                out.push_str(&text[..span.start]);
                out.push_str(&meta);
                out.push_str(&text[span.end..]);
            }
            None => {
                let body = text.trim_start_matches([' ', '\t', '\n', '\r']);
                out.push_str("{\"meta\":");
                out.push_str(&meta);
                out.push(',');
                out.push_str(body.strip_prefix('{').unwrap_or(body));
            }
        }
        out
    }
}

/// An `arp.frame` (one ARP frame of a gateway session, from a robot) read in one pass,
/// borrowed from the text: the server passes the text on as received, so it needs only the
/// session (`payload.connectionId`) and the id.
///
/// Like [`Relayed`], it vouches for a message only when it is valid and plain: the envelope
/// exactly as [`Envelope::parse`](crate::Envelope::parse) checks it, with no field it does
/// not name and none twice; a string `payload.connectionId` once; every other member of the
/// payload (the frame) read the way the parser reads it. Anything else gives `None` and goes
/// through the full parser, which gives the precise error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArpFrameView<'a> {
    /// The message's `id`.
    pub id: Cow<'a, str>,
    /// `payload.connectionId`: the gateway session.
    pub session: Cow<'a, str>,
}

impl<'a> ArpFrameView<'a> {
    pub fn parse(text: &'a str) -> Option<ArpFrameView<'a>> {
        let header: ArpHeader<'a> = serde_json::from_str(text).ok()?;
        if &*header.kind != crate::arp::FRAME_TYPE
            || !is_major_minor(&header.version)
            || !header.version.starts_with("0.")
        {
            return None;
        }
        OffsetDateTime::parse(&header.timestamp, &Rfc3339).ok()?;
        Some(ArpFrameView {
            id: header.id.0,
            session: header.payload.connection_id?.0,
        })
    }
}

/// The envelope of an `arp.frame`, as [`ArpFrameView`] reads it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ArpHeader<'a> {
    #[serde(rename = "type", borrow)]
    kind: Text<'a>,
    #[serde(borrow)]
    version: Text<'a>,
    #[serde(borrow)]
    id: Text<'a>,
    #[serde(rename = "correlationId", default, deserialize_with = "present")]
    _correlation_id: Option<AnyString>,
    #[serde(borrow)]
    timestamp: Text<'a>,
    #[serde(borrow)]
    payload: ArpPayload<'a>,
    #[serde(rename = "meta", default, deserialize_with = "present")]
    _meta: Option<AnyObject>,
}

/// An `arp.frame`'s payload: its `connectionId` (a string, once), any other member read and
/// not kept.
struct ArpPayload<'a> {
    connection_id: Option<Text<'a>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for ArpPayload<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PayloadVisitor;
        impl<'de> Visitor<'de> for PayloadVisitor {
            type Value = ArpPayload<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut connection_id = None;
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    if &*key != "connectionId" {
                        map.next_value::<AnyValue>()?;
                    } else if connection_id.is_some() {
                        return Err(de::Error::duplicate_field("connectionId"));
                    } else {
                        connection_id = Some(map.next_value::<Text<'de>>()?);
                    }
                }
                Ok(ArpPayload { connection_id })
            }
        }
        deserializer.deserialize_map(PayloadVisitor)
    }
}

/// Where `part` (a slice of `text`, as the parser borrowed it) lies in `text`.
fn span_in(text: &str, part: &str) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= text.len() && text.get(start..end) == Some(part)).then_some(start..end)
}
/// What a relayed message of type `kind` is, if its payload has exactly the members the
/// spec gives that type (an offer's robot id is taken out of `p`).
fn kind_of<'a>(kind: &str, p: &mut Payload<'a>) -> Option<RelayedKind<'a>> {
    let kind = match kind {
        "signalling.offer" => {
            let only = p.robot_id.is_some()
                && p.sdp.is_some()
                && p.sdp_type.as_deref() == Some("offer")
                && p.candidate.is_none()
                && p.sdp_mid.is_none()
                && p.sdp_m_line_index.is_none()
                && p.username_fragment.is_none()
                && p.ice_connection_state.is_none()
                && p.data_channel_state.is_none()
                && p.reason.is_none()
                && p.details.is_none();
            RelayedKind::Offer {
                robot_id: only.then_some(p.robot_id.take()?)?.0,
            }
        }
        "signalling.answer" => {
            let only = p.sdp.is_some()
                && p.sdp_type.as_deref() == Some("answer")
                && p.robot_id.is_none()
                && p.ice_restart.is_none()
                && no_candidate_or_state(p);
            only.then_some(RelayedKind::Answer)?
        }
        "signalling.ice_candidate" => {
            let only = p.candidate.is_some()
                && p.sdp_mid.is_some()
                && p.sdp_m_line_index.is_some()
                && no_description(p)
                && p.ice_connection_state.is_none()
                && p.data_channel_state.is_none()
                && p.reason.is_none()
                && p.details.is_none();
            only.then_some(RelayedKind::IceCandidate)?
        }
        "signalling.connected" => {
            let state = p.ice_connection_state.as_deref();
            let only = matches!(state, Some("connected" | "completed"))
                && matches!(p.data_channel_state.as_deref(), None | Some("open"))
                && no_description(p)
                && no_candidate(p)
                && p.reason.is_none()
                && p.details.is_none();
            only.then_some(RelayedKind::Connected)?
        }
        "signalling.disconnected" => {
            let reason = match p.reason.as_deref()? {
                "closed" => DisconnectReason::Closed,
                "failed" => DisconnectReason::Failed,
                "timeout" => DisconnectReason::Timeout,
                _ => return None,
            };
            let only = no_description(p) && no_candidate(p) && p.data_channel_state.is_none();
            only.then_some(RelayedKind::Disconnected(reason))?
        }
        _ => return None,
    };
    Some(kind)
}

fn no_description(p: &Payload<'_>) -> bool {
    p.robot_id.is_none() && p.sdp.is_none() && p.sdp_type.is_none() && p.ice_restart.is_none()
}

fn no_candidate(p: &Payload<'_>) -> bool {
    p.candidate.is_none()
        && p.sdp_mid.is_none()
        && p.sdp_m_line_index.is_none()
        && p.username_fragment.is_none()
}

fn no_candidate_or_state(p: &Payload<'_>) -> bool {
    no_candidate(p)
        && p.ice_connection_state.is_none()
        && p.data_channel_state.is_none()
        && p.reason.is_none()
        && p.details.is_none()
}

fn push_json_string(out: &mut String, value: &str) {
    // Serialising a &str into a String cannot fail.
    if let Ok(quoted) = serde_json::to_string(value) {
        out.push_str(&quoted);
    }
}

/// The envelope of a relayed message. Unknown fields are refused: such a message is not
/// forwarded as received.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Header<'a> {
    #[serde(rename = "type", borrow)]
    kind: Text<'a>,
    #[serde(borrow)]
    version: Text<'a>,
    #[serde(borrow)]
    id: Text<'a>,
    #[serde(rename = "correlationId", default, deserialize_with = "present")]
    _correlation_id: Option<AnyString>,
    #[serde(borrow)]
    timestamp: Text<'a>,
    #[serde(borrow)]
    payload: Payload<'a>,
    /// Borrowed from the text: where the value lies is what counts.
    #[serde(borrow, default, deserialize_with = "present")]
    meta: Option<&'a RawValue>,
}

/// Every field a relayed payload may hold; which ones a type allows is checked after.
/// Fields are absent or of their schema type: `null` is refused like any wrong type.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Payload<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    robot_id: Option<Text<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    connection_id: Option<Text<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    sdp_type: Option<Text<'a>>,
    #[serde(default, deserialize_with = "present")]
    sdp: Option<AnyString>,
    #[serde(default, deserialize_with = "present")]
    ice_restart: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    candidate: Option<AnyString>,
    #[serde(default, deserialize_with = "present")]
    sdp_mid: Option<AnyString>,
    #[serde(rename = "sdpMLineIndex", default, deserialize_with = "present")]
    sdp_m_line_index: Option<u32>,
    #[serde(default, deserialize_with = "present")]
    username_fragment: Option<AnyString>,
    #[serde(borrow, default, deserialize_with = "present")]
    ice_connection_state: Option<Text<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    data_channel_state: Option<Text<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    reason: Option<Text<'a>>,
    #[serde(default, deserialize_with = "present")]
    details: Option<AnyObject>,
}

/// A field that is there must hold its type: unlike `Option`'s own impl, `null` is an error.
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// A JSON string, borrowed when it has no escapes.
struct Text<'a>(Cow<'a, str>);

impl std::ops::Deref for Text<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}

/// A JSON string whose value is not needed (an SDP, a candidate): checked, not kept.
///
/// Read as the raw text it spans, which serde_json checks without copying. Read as a
/// string, an SDP (its lines end in `\r\n` escapes) was unescaped into a fresh buffer,
/// grown step by step, for every message. The raw check accepts any `\u` escape, while the
/// full parser refuses a lone surrogate: a string with one is checked the strict way too.
struct AnyString;

impl<'de> Deserialize<'de> for AnyString {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(deserializer)?.get();
        if !raw.starts_with('"') {
            return Err(de::Error::invalid_type(
                de::Unexpected::Other(raw),
                &"a string",
            ));
        }
        if has_unicode_escape(raw) {
            serde_json::from_str::<String>(raw).map_err(de::Error::custom)?;
        }
        Ok(AnyString)
    }
}

/// Whether a raw JSON string may hold a `\u` escape. A `u` after an escaped backslash counts
/// too: that string is only checked once more. memchr's SIMD search: `str::contains` cost a
/// fifth of reading a 6 KB SDP.
fn has_unicode_escape(raw: &str) -> bool {
    memchr::memmem::find(raw.as_bytes(), b"\\u").is_some()
}

/// A JSON object whose content is free-form (`details`): checked to be an object.
struct AnyObject;

impl<'de> Deserialize<'de> for AnyObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AnyObjectVisitor;
        impl<'de> Visitor<'de> for AnyObjectVisitor {
            type Value = AnyObject;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AnyObject, A::Error> {
                while map.next_entry::<AnyValue, AnyValue>()?.is_some() {}
                Ok(AnyObject)
            }
        }
        deserializer.deserialize_map(AnyObjectVisitor)
    }
}

/// Any JSON value, read the way `serde_json::Value` reads it and not kept. `IgnoredAny`
/// checks the syntax only: a number out of `f64`'s range (`1e999`) passes it, while the full
/// parser refuses the message, and the view must never accept what the parser refuses.
struct AnyValue;

impl<'de> Deserialize<'de> for AnyValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AnyValueVisitor;
        impl<'de> Visitor<'de> for AnyValueVisitor {
            type Value = AnyValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<AnyValue, E> {
                Ok(AnyValue)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<AnyValue, E> {
                Ok(AnyValue)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<AnyValue, E> {
                Ok(AnyValue)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<AnyValue, E> {
                Ok(AnyValue)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<AnyValue, E> {
                Ok(AnyValue)
            }
            fn visit_unit<E: de::Error>(self) -> Result<AnyValue, E> {
                Ok(AnyValue)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<AnyValue, A::Error> {
                while seq.next_element::<AnyValue>()?.is_some() {}
                Ok(AnyValue)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AnyValue, A::Error> {
                while map.next_entry::<AnyValue, AnyValue>()?.is_some() {}
                Ok(AnyValue)
            }
        }
        deserializer.deserialize_any(AnyValueVisitor)
    }
}
