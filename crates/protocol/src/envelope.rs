//! The common message envelope (`schemas/common/v0/envelope.json`).

use serde::Serialize;
use serde_json::{Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::body::{requires_correlation_id, Body, MESSAGE_TYPES};
use crate::common::is_major_minor;
use crate::error::ProtocolError;

/// The header every message shares, with the payload still as raw JSON so a
/// relay (the signalling server) can forward messages it does not decode.
///
/// Field order is the serialisation order, matching the spec's examples.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Envelope {
    /// Fully-qualified message type, e.g. `signalling.offer`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Protocol version, `MAJOR.MINOR`.
    pub version: String,
    /// Unique message id.
    pub id: String,
    /// Id of the message this one answers.
    #[serde(rename = "correlationId", skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// RFC 3339 creation time, kept as sent.
    pub timestamp: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    /// Metadata outside protocol semantics (e.g. `source`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub meta: Option<Map<String, Value>>,
}

impl Envelope {
    /// Parses and checks the envelope of an incoming message.
    ///
    /// Unknown top-level fields are tolerated (and dropped) so that peers
    /// on a newer minor version are not cut off; everything else the
    /// envelope schema says is enforced, each failure mapped to the error
    /// code a receiver should answer with.
    pub fn parse(text: &str) -> Result<Envelope, ProtocolError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| ProtocolError::InvalidMessage(format!("not JSON: {e}")))?;
        let Value::Object(mut obj) = value else {
            return Err(ProtocolError::InvalidMessage(
                "message is not a JSON object".into(),
            ));
        };
        let kind = match obj.remove("type") {
            Some(Value::String(kind)) => kind,
            Some(_) => {
                return Err(ProtocolError::InvalidMessage(
                    "field `type` is not a string".into(),
                ))
            }
            None => return Err(ProtocolError::InvalidMessage("missing field `type`".into())),
        };

        // Version first: a different major may use a different envelope.
        let version = take_string(&mut obj, "version")?;
        check_version(&version)?;
        let id = take_string(&mut obj, "id")?;
        let timestamp = take_string(&mut obj, "timestamp")?;
        if OffsetDateTime::parse(&timestamp, &Rfc3339).is_err() {
            return Err(ProtocolError::ValidationFailed(format!(
                "field `timestamp` is not an RFC 3339 date-time: {timestamp:?}"
            )));
        }
        let correlation_id = match obj.remove("correlationId") {
            None => None,
            Some(Value::String(c)) => Some(c),
            Some(_) => {
                return Err(ProtocolError::ValidationFailed(
                    "field `correlationId` is not a string".into(),
                ))
            }
        };
        let payload = match obj.remove("payload") {
            None => None,
            Some(p @ Value::Object(_)) => Some(p),
            Some(_) => {
                return Err(ProtocolError::InvalidPayload(
                    "field `payload` is not an object".into(),
                ))
            }
        };
        let meta = match obj.remove("meta") {
            None => None,
            Some(Value::Object(m)) => Some(m),
            Some(_) => {
                return Err(ProtocolError::ValidationFailed(
                    "field `meta` is not an object".into(),
                ))
            }
        };

        Ok(Envelope {
            kind,
            version,
            id,
            correlation_id,
            timestamp,
            payload,
            meta,
        })
    }

    /// Decodes the payload according to `type`.
    ///
    /// Also checks the per-type rules: a required `correlationId`, the
    /// payload's shape and value constraints (see [`Body::validate`]).
    pub fn body(&self) -> Result<Body, ProtocolError> {
        let kind = self.kind.as_str();
        if !MESSAGE_TYPES.contains(&kind) {
            return Err(ProtocolError::UnsupportedType(self.kind.clone()));
        }
        if self.correlation_id.is_none() && requires_correlation_id(kind) {
            return Err(ProtocolError::ValidationFailed(format!(
                "{kind}: field `correlationId` is required"
            )));
        }
        Body::decode(kind, self.payload.as_ref())
    }

    /// Builds a new outgoing message with a fresh v4 id and the current time.
    ///
    /// Does not set `correlationId`; use [`Envelope::with_correlation`] for
    /// replies and for the types that require it.
    pub fn from_body(body: impl Into<Body>, version: &str) -> Envelope {
        let body = body.into();
        Envelope {
            kind: body.type_name().to_owned(),
            version: version.to_owned(),
            id: uuid::Uuid::new_v4().to_string(),
            correlation_id: None,
            timestamp: now_rfc3339(),
            payload: body.payload(),
            meta: None,
        }
    }

    /// A new message of a `type` outside the spec's (e.g. `arp.frame`): fresh
    /// v4 id, the current time, no payload yet.
    pub(crate) fn new_of_type(kind: &str, version: &str) -> Envelope {
        Envelope {
            kind: kind.to_owned(),
            version: version.to_owned(),
            id: uuid::Uuid::new_v4().to_string(),
            correlation_id: None,
            timestamp: now_rfc3339(),
            payload: None,
            meta: None,
        }
    }

    /// `timestamp` as milliseconds since the Unix epoch (UTC), in the
    /// sender's clock; `None` if it is not an RFC 3339 date-time (only
    /// possible for an envelope built by hand, [`Envelope::parse`] checks
    /// it) or is out of range.
    pub fn sent_at_unix_ms(&self) -> Option<i64> {
        let at = OffsetDateTime::parse(&self.timestamp, &Rfc3339).ok()?;
        i64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok()
    }

    /// Sets `correlationId`, e.g. to the id of the request being answered.
    pub fn with_correlation(mut self, id: impl Into<String>) -> Envelope {
        self.correlation_id = Some(id.into());
        self
    }

    /// Sets `meta`.
    pub fn with_meta(mut self, meta: Map<String, Value>) -> Envelope {
        self.meta = Some(meta);
        self
    }

    /// Serialises to compact JSON.
    pub fn to_json(&self) -> String {
        // Only strings and JSON values with string keys are involved, so
        // serialisation cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Whether `text` is the legacy `{"type":"ready"}` message that older
/// agents send before the versioned protocol; it has no envelope, so
/// [`Envelope::parse`] would reject it.
pub fn is_legacy_ready(text: &str) -> bool {
    matches!(
        serde_json::from_str::<Value>(text),
        Ok(Value::Object(obj)) if obj.get("type").and_then(Value::as_str) == Some("ready")
    )
}

fn take_string(obj: &mut Map<String, Value>, field: &str) -> Result<String, ProtocolError> {
    match obj.remove(field) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(ProtocolError::ValidationFailed(format!(
            "field `{field}` is not a string"
        ))),
        None => Err(ProtocolError::ValidationFailed(format!(
            "missing field `{field}`"
        ))),
    }
}

fn check_version(version: &str) -> Result<(), ProtocolError> {
    if !is_major_minor(version) {
        return Err(ProtocolError::ValidationFailed(format!(
            "field `version` is not MAJOR.MINOR: {version:?}"
        )));
    }
    let major = version.split('.').next().unwrap_or_default();
    if major.bytes().all(|b| b == b'0') {
        Ok(())
    } else {
        Err(ProtocolError::UnsupportedVersion(format!(
            "{version} (supported: 0.x)"
        )))
    }
}

/// Current UTC time as `YYYY-MM-DDTHH:MM:SS.mmmZ`, built by hand so it
/// cannot fail.
fn now_rfc3339() -> String {
    let now = OffsetDateTime::now_utc();
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
